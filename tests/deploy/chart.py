"""Rendering the Helm chart offline (helm-python-sdk) and reading what a pod would get."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import helm_python
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "blackbox"
Manifest = dict[str, Any]


def render(values: dict[str, Any] | None = None, name: str = "bb") -> dict[str, str]:
    """Every template's output by path, as `helm template` would write it."""
    with helm_python.Chart.load(CHART) as chart:
        return chart.render(values or {}, name=name, namespace="blackbox")


def manifests(values: dict[str, Any] | None = None, name: str = "bb") -> list[Manifest]:
    """The Kubernetes objects the chart renders with these values."""
    rendered = render(values, name)
    texts = [text for path, text in rendered.items() if path.endswith((".yaml", ".yml"))]
    return [doc for text in texts for doc in yaml.safe_load_all(text) if doc]


def of_kind(docs: list[Manifest], kind: str) -> list[Manifest]:
    return [doc for doc in docs if doc["kind"] == kind]


def named(docs: list[Manifest], kind: str, name: str) -> Manifest:
    (found,) = [doc for doc in of_kind(docs, kind) if doc["metadata"]["name"] == name]
    return found


def container(deployment: Manifest) -> Manifest:
    (only,) = deployment["spec"]["template"]["spec"]["containers"]
    return only  # type: ignore[no-any-return]


def environment(docs: list[Manifest], deployment: Manifest) -> dict[str, str]:
    """The container's environment: envFrom ConfigMaps and Secrets, then its env entries.

    A Secret the chart does not render (an existing one) contributes nothing.
    """
    env: dict[str, str] = {}
    spec = container(deployment)
    for source in spec.get("envFrom", []):
        if "configMapRef" in source:
            env |= named(docs, "ConfigMap", source["configMapRef"]["name"]).get("data") or {}
        secrets = [s for s in of_kind(docs, "Secret") if "secretRef" in source
                   and s["metadata"]["name"] == source["secretRef"]["name"]]  # fmt: skip
        for secret in secrets:
            data = secret.get("data") or {}
            env |= {k: base64.b64decode(v).decode() for k, v in data.items()}
    env |= {e["name"]: e.get("value", "") for e in spec.get("env", [])}
    return env


def default_values() -> dict[str, Any]:
    """values.yaml as Helm reads it."""
    with helm_python.Chart.load(CHART) as chart:
        return chart.values
