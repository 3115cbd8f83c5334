"""The package's folders draw the data path (README "Code map"): nothing below imports
what stands above it, and no module imports itself back through others."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "blackbox"
# What each folder may import of the others (besides the shared top-level modules).
ALLOWED = {
    "storage": set(),
    "kafka": set(),
    "dev": set(),
    "intake": {"storage", "kafka", "firing"},  # firing: only the nudge it sends
    "firing": {"storage", "kafka"},
    "api": {"storage", "kafka", "intake", "firing"},
    "spark": {"kafka", "intake", "dev", "cli"},  # cli: only submit.py, spark-submit's file
    "cli": {"storage", "kafka", "intake", "firing", "api", "dev", "spark"},
}
# Top-level modules that assemble the folders (the rest import none of them but storage).
ASSEMBLERS = {"service", "client", "__main__"}


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> Iterator[str]:
    """The blackbox modules `path` imports (a name imported from a package counts as the
    module of that name where there is one)."""
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("blackbox"):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                is_module = (PACKAGE.parent / full.replace(".", "/")).with_suffix(".py").exists()
                yield full if is_module else node.module
        elif isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.startswith("blackbox"))


GRAPH = {_module(p): set(_imports(p)) for p in PACKAGE.rglob("*.py")}


def _folder(module: str) -> str | None:
    """The folder a module is in; None for a top-level module."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ALLOWED else None


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_a_module_imports_only_what_stands_below_it(module: str) -> None:
    """Each folder imports only the folders below it on the data path; the shared top-level
    modules import no folder but `storage` (settings reads shard limits and masks URLs)."""
    mine = _folder(module)
    for imported in GRAPH[module]:
        theirs = _folder(imported)
        if theirs is None or theirs == mine:
            continue
        if mine is None:
            name = module.rsplit(".", maxsplit=1)[-1]
            assert name in ASSEMBLERS or theirs == "storage", f"{module} imports {imported}"
        else:
            assert theirs in ALLOWED[mine], f"{module} imports {imported}"


def test_no_import_cycles() -> None:
    """No module imports itself back through others (each folder's move stays possible)."""
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, " -> ".join((*path, module))
        if module in done:
            return
        for imported in GRAPH.get(module, ()):
            visit(imported, (*path, module))
        done.add(module)

    for module in sorted(GRAPH):
        visit(module, ())
