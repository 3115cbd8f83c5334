"""Each alert of the chart (and of docker-compose's Prometheus) links to its runbook, and the
site's runbooks page has a section for each."""

from __future__ import annotations

from typing import Any

import yaml

from tests.deploy.chart import ROOT, default_values, manifests, of_kind

RUNBOOKS = ROOT / "docs" / "runbooks.md"


def _rules(values: dict[str, Any]) -> list[dict[str, Any]]:
    docs = manifests({"metrics": {"prometheusRule": {"enabled": True}}} | values)
    (rule,) = of_kind(docs, "PrometheusRule")
    return rule["spec"]["groups"][0]["rules"]  # type: ignore[no-any-return]


def _sections() -> set[str]:
    """The anchors of the runbooks page's sections: an alert's name in lower case, as the
    site's table of contents makes it (the strict build checks the links to them)."""
    headings = [line[3:] for line in RUNBOOKS.read_text().splitlines() if line.startswith("## ")]
    return {heading.lower() for heading in headings if heading.isalnum()}


def test_each_alert_links_to_its_runbook_section() -> None:
    """An alert's `runbook_url` is the runbooks page's address and the alert's own section,
    which the page has."""
    base = default_values()["metrics"]["prometheusRule"]["runbookUrl"]
    sections = _sections()
    for rule in _rules({}):
        anchor = rule["alert"].lower()
        assert rule["annotations"]["runbook_url"] == f"{base}#{anchor}", rule["alert"]
        assert anchor in sections, rule["alert"]


def test_the_runbooks_address_is_a_value() -> None:
    """Where the site is served is the operator's: the value moves every link."""
    url = "https://docs.example.com/blackbox/runbooks/"
    values = {"metrics": {"prometheusRule": {"enabled": True, "runbookUrl": url}}}
    links = {r["annotations"]["runbook_url"] for r in _rules(values)}
    assert links == {f"{url}#{r['alert'].lower()}" for r in _rules(values)}


def test_compose_alerts_link_to_the_runbooks_too() -> None:
    """docker-compose's copy of the rules carries the same links."""
    groups = yaml.safe_load((ROOT / "compose" / "alerts.yml").read_text())["groups"]
    assert all("runbook_url" in r["annotations"] for r in groups[0]["rules"])
