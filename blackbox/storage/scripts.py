"""The Lua scripts Redis runs for blackbox, shipped in `lua/` beside this module."""

from __future__ import annotations

from importlib import resources


def source(name: str) -> str:
    """The text of `lua/<name>.lua`, read from the package (a checkout or an installed wheel)."""
    return resources.files("blackbox.storage").joinpath("lua", f"{name}.lua").read_text("utf-8")
