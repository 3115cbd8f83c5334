"""docker-compose.yml: valid against the compose specification, and everything it names exists.

No Docker engine is needed: check-jsonschema validates offline against its bundled copy of
the compose specification, and the references are checked here.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from blackbox.settings import VARIABLES, kafka_config
from tests.deploy.chart import ROOT

COMPOSE = ROOT / "docker-compose.yml"


def _compose() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return document


def _services() -> dict[str, dict[str, Any]]:
    services: dict[str, dict[str, Any]] = _compose()["services"]
    return services


def test_matches_the_compose_specification() -> None:
    """check-jsonschema accepts the file against the compose specification it bundles."""
    checker = Path(sys.executable).with_name("check-jsonschema")
    result = subprocess.run(
        [checker, "--builtin-schema", "vendor.compose-spec", COMPOSE],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_depends_on_names_services_with_health_checks() -> None:
    """Every depends_on target is a service; a `service_healthy` target has a health check
    and a `service_completed_successfully` one does not restart."""
    services = _services()
    for name, service in services.items():
        for target, condition in service.get("depends_on", {}).items():
            assert target in services, f"{name} depends on unknown {target}"
            if condition["condition"] == "service_healthy":
                assert "healthcheck" in services[target], f"{target} has no health check"
            if condition["condition"] == "service_completed_successfully":
                assert services[target].get("restart", "no") == "no"


def test_blackbox_starts_after_its_dependencies_and_topics() -> None:
    """blackbox waits for a healthy Kafka and Redis and for the topics to exist."""
    depends = _services()["blackbox"]["depends_on"]
    assert depends == {
        "kafka": {"condition": "service_healthy"},
        "redis": {"condition": "service_healthy"},
        "create-topics": {"condition": "service_completed_successfully"},
    }
    assert _services()["create-topics"]["command"][0] == "create-topics"


def test_named_volumes_and_config_files_exist() -> None:
    """Each named volume a service mounts is declared, and each config file is in the
    repository; the Grafana dashboard is the file the Helm chart ships."""
    compose = _compose()
    declared = set(compose.get("volumes", {}))
    for service in compose["services"].values():
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if not source.startswith((".", "/")):
                assert source in declared, source
            else:
                assert (ROOT / source).exists(), source
        for config in service.get("configs", []):
            assert config["source"] in compose["configs"], config["source"]
    for config in compose["configs"].values():
        assert (ROOT / config["file"]).is_file(), config["file"]
    dashboard = compose["configs"]["blackbox-dashboard"]["file"]
    assert (
        ROOT / dashboard
    ).resolve() == ROOT / "helm" / "blackbox" / "dashboards" / "blackbox.json"


def test_redis_persists_append_only_and_never_evicts() -> None:
    """Redis keeps an append-only file on a volume and refuses writes rather than evict
    schedules when full."""
    redis = _services()["redis"]
    command = " ".join(redis["command"])
    assert "--appendonly yes" in command
    assert "--maxmemory-policy noeviction" in command
    assert any(v.endswith(":/data") for v in redis["volumes"])


def test_blackbox_environment_points_at_the_compose_services() -> None:
    """blackbox reaches Kafka and Redis by their service names and knows each variable it is
    given; Prometheus scrapes it on the port it serves."""
    services = _services()
    env = services["blackbox"]["environment"]
    known = {var.name for var in VARIABLES}
    assert {k for k in env if not k.startswith("KAFKA_")} <= known
    assert kafka_config(env)["bootstrap.servers"].split(":")[0] in services
    assert env["REDIS_URL"].split("//")[1].split(":")[0] in services
    prometheus = yaml.safe_load((ROOT / "compose" / "prometheus.yml").read_text())
    (job,) = prometheus["scrape_configs"]
    assert job["job_name"] == "blackbox"  # the alerts' BlackboxTargetDown matches this job
    assert job["static_configs"][0]["targets"] == ["blackbox:8080"]
    assert "8080:8080" in services["blackbox"]["ports"]
