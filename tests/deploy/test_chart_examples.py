"""Every values example the documentation and values.yaml show renders as the chart's documents.

A user pastes the docs' "Several roles" block or a values.yaml comment into their values
file: the schema must accept it and the chart render what the text says it does.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from tests.deploy.chart import CHART, ROOT, default_values, manifests, of_kind

_FENCE = re.compile(r"^```yaml\n(.*?)^```", re.MULTILINE | re.DOTALL)
# values.yaml shows an example as "# Example:" then the values, indented, as comments.
_EXAMPLE = re.compile(r"^# Example:\n((?:#   .*\n)+)", re.MULTILINE)


def _readme_examples() -> list[dict[str, Any]]:
    """The YAML blocks of the README and the site's pages: chart values, or a policy
    document (the `policy` value)."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    blocks = [yaml.safe_load(m) for page in pages for m in _FENCE.findall(page.read_text())]
    top = set(default_values())
    return [block if set(block) <= top else {"policy": block} for block in blocks]


def _values_examples() -> list[dict[str, Any]]:
    """values.yaml's commented examples, each a values document of its own."""
    text = (CHART / "values.yaml").read_text()
    found = ["\n".join(line[4:] for line in m.splitlines()) for m in _EXAMPLE.findall(text)]
    return [yaml.safe_load(block) for block in found]


EXAMPLES = {f"README #{i + 1}": v for i, v in enumerate(_readme_examples())} | {
    f"values.yaml #{i + 1}": v for i, v in enumerate(_values_examples())
}


def test_the_examples_were_found() -> None:
    """The README's roles and policy blocks and values.yaml's examples are all here (a
    changed fence or comment style would otherwise leave them untested)."""
    assert len([k for k in EXAMPLES if k.startswith("README")]) >= 2
    assert len([k for k in EXAMPLES if k.startswith("values.yaml")]) >= 2


@pytest.mark.parametrize("values", EXAMPLES.values(), ids=list(EXAMPLES))
def test_every_example_renders(values: dict[str, Any]) -> None:
    """The schema accepts each example and the chart renders at least one Deployment."""
    assert of_kind(manifests(values), "Deployment")


def test_the_several_roles_example_runs_the_roles_it_names() -> None:
    """The README's "Several roles" block, as written, runs intake and dispatch apart with
    the replicas it names, and no `run` Deployment (a role without `enabled` is on)."""
    (roles,) = [v for v in EXAMPLES.values() if "roles" in v and "intake" in v["roles"]][:1]
    deployments = {d["metadata"]["name"]: d for d in of_kind(manifests(roles), "Deployment")}
    assert {n: d["spec"]["replicas"] for n, d in deployments.items()} == {
        "bb-blackbox-intake": 3,
        "bb-blackbox-dispatch": 2,
    }
