"""The release running: the installed package's version, as pyproject.toml set it.

Read from the package's metadata, never written down a second time in the code. Semantic
versioning: what a version promises is in docs/upgrading.md, what each release
changed in CHANGELOG.md.
"""

from __future__ import annotations

from functools import cache
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as installed_version

DISTRIBUTION = "blackbox"
# A source tree run without installing it has no metadata to read.
UNKNOWN = "0+unknown"


@cache
def version() -> str:
    """This release's version, e.g. "0.2.0"."""
    try:
        return installed_version(DISTRIBUTION)
    except PackageNotFoundError:
        return UNKNOWN
