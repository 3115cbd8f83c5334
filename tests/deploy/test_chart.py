"""The Helm chart, rendered offline: lint, Kubernetes schemas, every setting, probes, security.

No cluster is needed: helm-python-sdk renders and lints with Helm's own library, and
kubernetes-validate checks each object against the bundled Kubernetes schemas.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import SchemaNotFoundError
from prometheus_client.utils import floatToGoString

from blackbox.api import tokens
from blackbox.api.app import probes_app
from blackbox.api.server import Endpoints
from blackbox.cli import main as cli
from blackbox.errors import SettingsError
from blackbox.health import Health
from blackbox.intake import policy
from blackbox.metrics import LATENESS_BUCKETS, Metrics
from blackbox.settings import VARIABLES, Settings
from tests.deploy.chart import (
    CHART,
    ROOT,
    container,
    default_values,
    environment,
    manifests,
    named,
    of_kind,
    render,
)

# The chart's floor (Chart.yaml kubeVersion) and the newest release kubernetes-validate knows.
KUBE_VERSIONS = ("1.25.0", "1.37.0")
# Prometheus Operator kinds: no Kubernetes schema; checked by the tests below instead.
OPERATOR_KINDS = {"ServiceMonitor", "PrometheusRule"}
TMP = "/tmp"  # noqa: S108 - the container's one writable directory, an emptyDir
EXISTING = {"secret": {"existingSecret": "blackbox-credentials"}}
MONITORING = {
    "metrics": {
        "serviceMonitor": {"enabled": True},
        "prometheusRule": {"enabled": True},
        "dashboard": {"enabled": True},
    }
}
TWO_ROLES = {
    "run": {"enabled": False, "args": ["run"]},
    "intake": {"enabled": True, "args": ["run", "--role", "intake"], "replicas": 3},
    "dispatch": {
        "enabled": True,
        "args": ["run", "--role", "dispatch"],
        "replicas": 2,
        "autoscaling": {"enabled": True, "maxReplicas": 4},
        "podDisruptionBudget": {"minAvailable": 1},
    },
}
VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "three replicas": {"roles": {"run": {"enabled": True, "args": ["run"], "replicas": 3}}},
    "existing secret": EXISTING,
    "monitoring": MONITORING,
    "autoscaling": {"autoscaling": {"enabled": True}},
    "two roles": {"roles": TWO_ROLES},
    "everything": {
        **MONITORING,
        "autoscaling": {"enabled": True},
        "createTopics": {"enabled": True},
        "policy": {"default": {"topics": []}, "callers": {"billing": {"topics": ["invoices"]}}},
        "apiTokens": [{"name": "ops", "sha256": "0" * 64, "callers": ["*"]}],
        "kafka": {"KAFKA_BOOTSTRAP_SERVERS": "kafka:9092", "KAFKA_SECURITY_PROTOCOL": "SASL_SSL"},
        "secret": {"values": {"KAFKA_SASL_PASSWORD": "pw", "KAFKA_SASL_USERNAME": "bb"}},
        "extraEnv": [{"name": "KAFKA_SASL_MECHANISM", "value": "SCRAM-SHA-512"}],
    },
}
SECURE_CONTAINER = {
    "runAsNonRoot": True,
    "readOnlyRootFilesystem": True,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def _deployment(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (only,) = of_kind(docs, "Deployment")
    return only


def _secret_names() -> list[str]:
    values: dict[str, str] = default_values()["secret"]["values"]
    return list(values)


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=list(VALUE_SETS))
def test_lint_strict_finds_nothing(values: dict[str, Any]) -> None:
    """`helm lint --strict` passes with no error and no warning for each value set."""
    for version in KUBE_VERSIONS:
        report = helm_python.lint(CHART, values, strict=True, kube_version=f"v{version}")
        assert report["errors"] == []
        assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=list(VALUE_SETS))
def test_every_manifest_validates_strictly(values: dict[str, Any]) -> None:
    """Each rendered object matches its Kubernetes schema, unknown fields rejected."""
    docs = manifests(values)
    for doc in docs:
        for version in KUBE_VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except SchemaNotFoundError:
                assert doc["kind"] in OPERATOR_KINDS


def test_every_setting_reaches_the_container() -> None:
    """Every variable blackbox/settings.py reads is in the pod's environment (ConfigMap or
    Secret): a setting added to the code but not to the chart fails here."""
    secrets = {name: "set" for name in _secret_names()}
    docs = manifests({"secret": {"values": secrets}})
    env = environment(docs, _deployment(docs))
    assert [var.name for var in VARIABLES if var.name not in env] == []


# Settings the chart sets otherwise than the code, and why: a plain process keeps one port,
# a pod serves its probes apart (they must answer whatever API clients do).
CHART_OWN_DEFAULTS = {"BLACKBOX_PROBE_PORT": "8081"}


def test_settings_default_as_in_the_code() -> None:
    """The chart's default for each setting is the code's default, but for those
    CHART_OWN_DEFAULTS names; a secret left empty is left out, which means the same as its
    empty default."""
    docs = manifests()
    env = environment(docs, _deployment(docs))
    secrets = default_values()["secret"]["values"]
    for var in VARIABLES:
        if var.name in CHART_OWN_DEFAULTS:
            assert env[var.name] == CHART_OWN_DEFAULTS[var.name]
        elif var.name in env:
            assert (var.name, env[var.name]) == (var.name, var.default)
        else:
            assert (var.name, secrets.get(var.name), var.default) == (var.name, "", "")


def test_schema_and_values_name_the_same_settings() -> None:
    """values.yaml's `config` and the schema's list of settings agree, every BLACKBOX_*
    variable of the code is in one of `config` or `secret.values`, and neither names a
    variable the code does not read."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    config = default_values()["config"]
    assert set(schema["properties"]["config"]["properties"]) == set(config)
    code = {var.name for var in VARIABLES if var.name.startswith("BLACKBOX_")}
    assert code <= set(config) | set(_secret_names())
    assert set(config) <= code
    every = {var.name for var in VARIABLES}
    assert [n for n in _secret_names() if n not in every and not n.startswith("KAFKA_")] == []


def test_rendered_environment_loads_as_settings() -> None:
    """The environment the chart renders is accepted by Settings.from_env, numbers included
    (whole numbers written without a fraction or exponent)."""
    values = {
        "config": {"BLACKBOX_MAX_COUNTDOWN": 315576000, "BLACKBOX_POLL_INTERVAL": 0.25,
                   "BLACKBOX_BATCH_LIMIT": 2000},
        "kafka": {"KAFKA_BOOTSTRAP_SERVERS": "kafka:9092", "KAFKA_CONSUMER_FETCH_WAIT_MAX_MS": 5},
    }  # fmt: skip
    docs = manifests(values)
    loaded = Settings.from_env(environment(docs, _deployment(docs)))
    assert loaded.max_countdown == 315576000
    assert loaded.poll_interval == 0.25
    assert loaded.batch_limit == 2000
    assert loaded.kafka["bootstrap.servers"] == "kafka:9092"
    assert loaded.kafka_consumer == {"fetch.wait.max.ms": "5"}


# The windows of milliseconds, 0 (off) to 1,000, as settings.py reads them.
WINDOWS_MS = ("BLACKBOX_INTAKE_WINDOW_MS", "BLACKBOX_FIRE_AHEAD_MS", "BLACKBOX_FIRE_COALESCE_MS")


@pytest.mark.parametrize("name", WINDOWS_MS)
@pytest.mark.parametrize("value", ["0", 0, "1000", 1000, "25"])
def test_the_chart_takes_every_window_the_service_takes(name: str, value: str | int) -> None:
    """0 turns a window off (docs/configuration.md): the chart renders it, and the
    environment it renders loads."""
    docs = manifests({"config": {name: value}})
    loaded = Settings.from_env(environment(docs, _deployment(docs)))
    (var,) = (v for v in VARIABLES if v.name == name)
    assert getattr(loaded, var.attribute) == int(value)


@pytest.mark.parametrize("name", WINDOWS_MS)
@pytest.mark.parametrize("value", ["1001", 1001, "-1", -1, "5000", "007", "2.5"])
def test_the_chart_refuses_a_window_the_service_refuses(name: str, value: str | int) -> None:
    """What the service would refuse at start (exit code 2) is refused at install."""
    if value != "007":  # the service reads 7; the chart asks for the plain form
        with pytest.raises(SettingsError):
            Settings.from_env({name: str(value)})
    with pytest.raises(helm_python.HelmValuesError):
        render({"config": {name: value}})


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=list(VALUE_SETS))
def test_pods_get_no_service_links(values: dict[str, Any]) -> None:
    """Guarantee 4: no pod of the chart is given the namespace's Service variables
    (KAFKA_PORT=tcp://… from a Service named `kafka` broke the start)."""
    docs = manifests(values)
    pods = [d["spec"]["template"]["spec"] for d in docs if d["kind"] in ("Deployment", "Job")]
    assert pods
    assert [p.get("enableServiceLinks") for p in pods] == [False] * len(pods)


def test_a_kafka_service_beside_the_chart_still_loads_settings() -> None:
    """Guarantee 4: the chart's environment plus what a Service named `kafka` injects (as a
    cluster that ignores enableServiceLinks would) loads with the chart's own Kafka address."""
    docs = manifests({"kafka": {"KAFKA_BOOTSTRAP_SERVERS": "kafka:9092"}})
    injected = {"KAFKA_SERVICE_HOST": "10.96.0.12", "KAFKA_SERVICE_PORT": "9092",
                "KAFKA_PORT": "tcp://10.96.0.12:9092", "KAFKA_PORT_9092_TCP": "tcp://10.96.0.12:9092",
                "KAFKA_PORT_9092_TCP_PROTO": "tcp", "KAFKA_PORT_9092_TCP_PORT": "9092",
                "KAFKA_PORT_9092_TCP_ADDR": "10.96.0.12"}  # fmt: skip
    loaded = Settings.from_env({**injected, **environment(docs, _deployment(docs))})
    assert loaded.kafka == {"bootstrap.servers": "kafka:9092"}


@pytest.fixture
def endpoints() -> Iterator[Endpoints]:
    metrics = Metrics()
    server = Endpoints("127.0.0.1", 0, probes_app(Health({}, metrics), metrics))
    server.start()
    yield server
    server.stop()


def _status(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as e:
        return e.code


def _probes(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {kind: spec[kind]["httpGet"] for kind in
            ("startupProbe", "livenessProbe", "readinessProbe")}  # fmt: skip


def test_probes_and_scrapes_go_to_the_probe_port() -> None:
    """By default the probes and the ServiceMonitor use the container port `probes`, which
    is BLACKBOX_PROBE_PORT (the probes' own listener, apart from the API's connections);
    the Service names it too. With BLACKBOX_PROBE_PORT off they use `http`."""
    docs = manifests({**MONITORING, "config": {"BLACKBOX_PROBE_PORT": 9001}})
    spec = container(_deployment(docs))
    ports = {p["name"]: p["containerPort"] for p in spec["ports"]}
    env = environment(docs, _deployment(docs))
    assert str(ports["probes"]) == env["BLACKBOX_PROBE_PORT"] == "9001"
    assert {p["port"] for p in _probes(spec).values()} == {"probes"}
    (monitor,) = of_kind(docs, "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["port"] == "probes"
    (service,) = of_kind(docs, "Service")
    assert {p["name"]: p["targetPort"] for p in service["spec"]["ports"]}["probes"] == "probes"
    off = manifests({**MONITORING, "config": {"BLACKBOX_PROBE_PORT": "off"}})
    spec = container(_deployment(off))
    assert [p["name"] for p in spec["ports"]] == ["http"]
    assert {p["port"] for p in _probes(spec).values()} == {"http"}
    assert of_kind(off, "ServiceMonitor")[0]["spec"]["endpoints"][0]["port"] == "http"


def test_probes_hit_the_service_endpoints(endpoints: Endpoints) -> None:
    """Startup, liveness and readiness probes name the container's port, which is
    BLACKBOX_HTTP_PORT with the probe port off, and paths the real endpoints answer (200,
    not 404)."""
    docs = manifests({"config": {"BLACKBOX_HTTP_PORT": 9000, "BLACKBOX_PROBE_PORT": "off"}})
    spec = container(_deployment(docs))
    (port,) = spec["ports"]
    env = environment(docs, _deployment(docs))
    assert str(port["containerPort"]) == env["BLACKBOX_HTTP_PORT"] == "9000"
    probes = _probes(spec)
    assert {p["port"] for p in probes.values()} == {port["name"]}
    assert probes["livenessProbe"]["path"] == "/live"
    assert probes["readinessProbe"]["path"] == "/ready"
    for probe in probes.values():
        assert _status(endpoints.port, probe["path"]) == 200
    assert _status(endpoints.port, "/nothing-here") == 404


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=list(VALUE_SETS))
def test_security_context_is_strict(values: dict[str, Any]) -> None:
    """Every pod runs as non-root with a read-only root, no escalation, no capabilities and
    the runtime's seccomp profile; /tmp is the one writable place."""
    docs = manifests(values)
    pods = [d["spec"]["template"]["spec"] for d in docs if d["kind"] in ("Deployment", "Job")]
    assert pods
    for pod in pods:
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert pod["automountServiceAccountToken"] is False
        for spec in pod["containers"]:
            context = spec["securityContext"]
            assert {key: context.get(key) for key in SECURE_CONTAINER} == SECURE_CONTAINER
            assert {m["mountPath"] for m in spec["volumeMounts"]} >= {TMP}


@pytest.mark.parametrize(
    "values",
    [
        {"replicas": 3},
        {"roles": {"run": {"enabled": True, "args": ["run"], "replicas": "three"}}},
        {"config": {"BLACKBOX_BATCH_LIMIT": "many"}},
        {"config": {"BLACKBOX_POLL_INTERVLA": "2"}},
        {"config": {"BLACKBOX_LOG_LEVEL": "loud"}},
        {"kafka": {"bootstrap.servers": "kafka:9092"}},
        {"podDisruptionBudget": {"enabled": "yes"}},
    ],
    ids=[
        "unknown top-level key",
        "replicas not a number",
        "batch limit not a number",
        "misspelt setting",
        "log level not a level",
        "kafka key not a variable",
        "flag not a boolean",
    ],
)
def test_schema_rejects_bad_values(values: dict[str, Any]) -> None:
    """values.schema.json refuses unknown top-level keys, wrong types and unknown settings."""
    with pytest.raises(helm_python.HelmValuesError):
        render(values)


def test_grace_period_shorter_than_the_drain_is_refused() -> None:
    """Rendering fails when SIGTERM's drain could outlast terminationGracePeriodSeconds."""
    with pytest.raises(helm_python.HelmRenderError, match="terminationGracePeriodSeconds"):
        render({"terminationGracePeriodSeconds": 20})
    render({"terminationGracePeriodSeconds": 20, "config": {"BLACKBOX_DELIVERY_TIMEOUT": "4"}})


def test_a_release_without_any_role_is_refused() -> None:
    """Rendering fails when every role is disabled, rather than installing nothing."""
    with pytest.raises(helm_python.HelmRenderError, match="enable at least one role"):
        render({"roles": {"run": {"enabled": False, "args": ["run"]}}})


@pytest.mark.parametrize("values", [{}, {"roles": TWO_ROLES}], ids=["one role", "two roles"])
def test_notes_tell_how_to_send_a_first_message(values: dict[str, Any]) -> None:
    """NOTES.txt sends a first message through a Deployment the release really has."""
    notes = render(values)["blackbox/templates/NOTES.txt"]
    names = {d["metadata"]["name"] for d in of_kind(manifests(values), "Deployment")}
    used = set(re.findall(r"exec deploy/(\S+) -- \\\n\s+blackbox send --topic", notes))
    assert used
    assert used <= names


def test_defaults_one_replica_disruption_budget_no_autoscaler() -> None:
    """By default: one Deployment, a PodDisruptionBudget on the same pods, no HPA, no hooks."""
    docs = manifests()
    deployment = _deployment(docs)
    (budget,) = of_kind(docs, "PodDisruptionBudget")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert deployment["spec"]["replicas"] == 1
    assert of_kind(docs, "HorizontalPodAutoscaler") == of_kind(docs, "Job") == []
    assert deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] >= 32


def test_autoscaling_hands_replicas_to_the_autoscaler() -> None:
    """With autoscaling on, the HPA targets the Deployment, which no longer sets replicas."""
    docs = manifests({"autoscaling": {"enabled": True, "minReplicas": 3}})
    deployment = _deployment(docs)
    (hpa,) = of_kind(docs, "HorizontalPodAutoscaler")
    assert "replicas" not in deployment["spec"]
    assert hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert hpa["spec"]["minReplicas"] == 3


def test_existing_secret_replaces_the_charts() -> None:
    """With existingSecret, the chart renders no Secret and the pod reads the named one."""
    docs = manifests(EXISTING)
    assert of_kind(docs, "Secret") == []
    refs = [s["secretRef"]["name"] for s in container(_deployment(docs))["envFrom"]
            if "secretRef" in s]  # fmt: skip
    assert refs == ["blackbox-credentials"]


def test_a_second_role_is_a_values_change() -> None:
    """Two roles render two Deployments with disjoint pods, their own arguments, replicas,
    autoscaler and budget; the Service still reaches both."""
    docs = manifests({"roles": TWO_ROLES})
    deployments = {d["metadata"]["name"]: d for d in of_kind(docs, "Deployment")}
    assert set(deployments) == {"bb-blackbox-intake", "bb-blackbox-dispatch"}
    assert container(deployments["bb-blackbox-intake"])["args"] == ["run", "--role", "intake"]
    assert deployments["bb-blackbox-intake"]["spec"]["replicas"] == 3
    (hpa,) = of_kind(docs, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == "bb-blackbox-dispatch"
    assert "replicas" not in deployments["bb-blackbox-dispatch"]["spec"]
    budgets = {b["metadata"]["name"]: b["spec"] for b in of_kind(docs, "PodDisruptionBudget")}
    assert budgets["bb-blackbox-dispatch"]["minAvailable"] == 1
    assert budgets["bb-blackbox-intake"]["maxUnavailable"] == 1
    (service,) = of_kind(docs, "Service")
    for deployment in deployments.values():
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert service["spec"]["selector"].items() <= labels.items()


def test_each_roles_args_name_that_role_to_the_command() -> None:
    """The two-role value set runs `blackbox run --role intake` and `--role dispatch`, and
    the command's own parser reads them as those roles (a misspelt role fails here)."""
    docs = manifests({"roles": TWO_ROLES})
    deployments = {d["metadata"]["name"]: d for d in of_kind(docs, "Deployment")}
    for role in ("intake", "dispatch"):
        args = container(deployments[f"bb-blackbox-{role}"])["args"]
        assert cli._parser().parse_args(args).role == role


def test_policy_is_mounted_where_the_setting_points() -> None:
    """A `policy` value becomes a mounted file that BLACKBOX_POLICY_FILE names and that the
    service's own policy loader accepts."""
    document = {"default": {"topics": []}, "callers": {"billing": {"topics": ["invoices"]}}}
    docs = manifests({"policy": document})
    deployment = _deployment(docs)
    path = environment(docs, deployment)["BLACKBOX_POLICY_FILE"]
    (mount,) = [m for m in container(deployment)["volumeMounts"] if m["name"] == "policy"]
    assert path.startswith(mount["mountPath"] + "/")
    text = named(docs, "ConfigMap", "bb-blackbox-policy")["data"][path.rsplit("/", 1)[1]]
    base = policy.open_policy(60.0, 1000)
    assert policy.from_document(yaml.safe_load(text), base).rule_for(b"billing").allows("invoices")


def test_api_tokens_are_mounted_from_a_secret_where_the_setting_points(tmp_path: Path) -> None:
    """Guarantee 7: `apiTokens` become a Secret mounted where BLACKBOX_API_TOKENS_FILE
    points, holding hashes only, and the service's own loader accepts it."""
    entry = {"name": "billing", "sha256": hashlib.sha256(b"billing-token").hexdigest(),
             "callers": ["billing"], "scopes": ["read"]}  # fmt: skip
    docs = manifests({"apiTokens": [entry]})
    deployment = _deployment(docs)
    path = environment(docs, deployment)["BLACKBOX_API_TOKENS_FILE"]
    (mount,) = [m for m in container(deployment)["volumeMounts"] if m["name"] == "api-tokens"]
    assert path.startswith(mount["mountPath"] + "/")
    data = named(docs, "Secret", "bb-blackbox-api-tokens")["data"][path.rsplit("/", 1)[1]]
    written = tmp_path / "api-tokens.yaml"
    written.write_bytes(base64.b64decode(data))
    grant = tokens.tokens_of("", str(written)).grant_for("billing-token")
    assert grant is not None and (grant.callers, grant.read, grant.write) == (
        frozenset({"billing"}), True, False)  # fmt: skip
    assert "billing-token" not in written.read_text()


def test_topics_job_runs_create_topics_after_its_config() -> None:
    """The topic Job (off by default) is a post-install/upgrade hook running create-topics
    with the release's settings."""
    docs = manifests({"createTopics": {"enabled": True, "partitions": 12}})
    (job,) = of_kind(docs, "Job")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"
    spec = job["spec"]["template"]["spec"]["containers"][0]
    assert spec["args"] == ["create-topics", "--partitions", "12"]
    assert spec["envFrom"] == container(_deployment(docs))["envFrom"]


def test_topics_job_passes_the_replication_asked_for() -> None:
    """createTopics.replicationFactor and minInsyncReplicas reach create-topics as its
    options; left null, the command takes the cluster's plan."""
    values = {"enabled": True, "replicationFactor": 3, "minInsyncReplicas": 2}
    (job,) = of_kind(manifests({"createTopics": values}), "Job")
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args == ["create-topics", "--partitions", "6", "--replication-factor", "3",
                    "--min-insync-replicas", "2"]  # fmt: skip
    with pytest.raises(helm_python.HelmRenderError, match=r"more than createTopics\.replication"):
        manifests({"createTopics": {**values, "minInsyncReplicas": 4}})


def _metric_names() -> set[str]:
    """Every sample name the service can export (counters, histograms, gauges, infos)."""
    metrics = Metrics()
    Health({}, metrics)
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_count", "_sum"], "gauge": [""],
                "info": ["_info"]}  # fmt: skip
    return {
        family.name + suffix
        for family in metrics.registry.collect()
        for suffix in suffixes[family.type]
    }


def _rule_groups() -> dict[str, Any]:
    docs = manifests(MONITORING, name="blackbox")
    (rule,) = of_kind(docs, "PrometheusRule")
    return rule["spec"]  # type: ignore[no-any-return]


def test_alerts_use_metrics_the_service_exports() -> None:
    """Each alert the issue names exists, and every blackbox_* series its expression reads
    is one the service exports (a renamed metric fails here); the overdue alert's bucket
    bound is one of the histogram's, written as the client writes it."""
    rules = _rule_groups()["groups"][0]["rules"]
    assert {r["alert"] for r in rules} == {
        "BlackboxDispatcherStalled", "BlackboxDependencyDown", "BlackboxLatenessHigh",
        "BlackboxOverdueBacklogGrowing", "BlackboxDeadLettersRising", "BlackboxTargetDown",
        "BlackboxRedisMemoryHigh", "BlackboxRedisFull", "BlackboxRedisLostData",
        "BlackboxStoreRecordMissing",
    }  # fmt: skip
    known = _metric_names()
    for rule in rules:
        used = set(re.findall(r"\bblackbox_[a-z_]+", rule["expr"]))
        assert used <= known, rule["alert"]
    bounds = re.findall(r'le="([^"]+)"', json.dumps(rules).replace('\\"', '"'))
    assert bounds
    assert set(bounds) <= {floatToGoString(b) for b in LATENESS_BUCKETS}  # type: ignore[no-untyped-call]


def test_compose_prometheus_loads_the_charts_alerts() -> None:
    """docker-compose's alert file is the chart's PrometheusRule at its defaults."""
    assert yaml.safe_load((ROOT / "compose" / "alerts.yml").read_text()) == _rule_groups()


def test_service_monitor_scrapes_the_metrics_port() -> None:
    """The ServiceMonitor selects the chart's Service and scrapes its named port at /metrics."""
    docs = manifests(MONITORING)
    (monitor,) = of_kind(docs, "ServiceMonitor")
    (service,) = of_kind(docs, "Service")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"


def test_dashboard_is_the_shipped_json_on_real_metrics() -> None:
    """The dashboard ConfigMap carries dashboards/blackbox.json as is, and its queries read
    only metrics the service exports."""
    docs = manifests(MONITORING)
    config_map = named(docs, "ConfigMap", "bb-blackbox-dashboard")
    shipped = (CHART / "dashboards" / "blackbox.json").read_text()
    assert json.loads(config_map["data"]["blackbox.json"]) == json.loads(shipped)
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    used = set(re.findall(r"\bblackbox_[a-z_]+", shipped))
    assert used
    assert used <= _metric_names()


@pytest.mark.parametrize(
    "values",
    [
        {"roles": {"run": {"args": ["run"], "replicas": 17}}},
        {"roles": {"run": {"args": ["run"], "replicas": 5}}, "config": {"BLACKBOX_SHARDS": 4}},
        {"autoscaling": {"enabled": True, "maxReplicas": 20}},
        {
            "roles": {
                "run": {"enabled": False},
                "dispatch": {"args": ["run", "--role", "dispatch"], "replicas": 3},
                "all": {"args": ["run"], "replicas": 2},
            },
            "config": {"BLACKBOX_SHARDS": "4"},
        },
    ],
    ids=["17 on the default 16", "5 on 4", "autoscaled to 20", "two firing roles, 5 on 4"],
)
def test_more_firing_replicas_than_shards_is_refused(values: dict[str, Any]) -> None:
    """Guarantee 3 (replicas share the work): rendering fails when more replicas fire than
    there are shards, an autoscaler counted at its maximum, naming BLACKBOX_SHARDS."""
    with pytest.raises(helm_python.HelmRenderError, match="BLACKBOX_SHARDS"):
        render(values)


def test_intake_replicas_need_no_shard() -> None:
    """Replicas run with `--role intake` fire nothing and are not counted against shards."""
    roles = {"run": {"enabled": False},
             "intake": {"args": ["run", "--role", "intake"], "replicas": 8},
             "dispatch": {"args": ["run", "--role=dispatch"], "replicas": 4}}  # fmt: skip
    docs = manifests({"roles": roles, "config": {"BLACKBOX_SHARDS": 4}})
    assert {d["spec"]["replicas"] for d in of_kind(docs, "Deployment")} == {8, 4}


def test_a_role_scaled_to_zero_renders_zero_replicas() -> None:
    """`replicas: 0` (every replica stopped, as a shard-count change needs) is kept as 0."""
    docs = manifests({"roles": {"run": {"args": ["run"], "replicas": 0}}})
    assert _deployment(docs)["spec"]["replicas"] == 0


def test_otel_variables_reach_every_role_and_only_otel_names_pass() -> None:
    """The chart can turn spans on (README "Tracing"): `otel` entries land in each role's
    environment as given; a name that is not an OTEL_* variable is refused."""
    otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_SERVICE_NAME": "bb"}
    docs = manifests({"otel": otel, "roles": TWO_ROLES})
    for deployment in of_kind(docs, "Deployment"):
        env = environment(docs, deployment)
        assert {name: env[name] for name in otel} == otel
    assert not any(
        n.startswith("OTEL_") for n in environment(manifests(), _deployment(manifests()))
    )
    with pytest.raises(helm_python.HelmValuesError):
        render({"otel": {"KAFKA_BOOTSTRAP_SERVERS": "x"}})
