"""The deployment files are accepted by their own tools: docker-compose parses and resolves the compose file,
the Kubernetes manifests validate against the API's own schemas (kubernetes-validate, schemas bundled in the
package: nothing is fetched) and carry the agent's host namespaces, mounts and exact capabilities, and
systemd-analyze verifies the units. (No cluster or systemd host runs them here; the local compose stack runs
in tests/deploy/test_compose.py.)"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
COMPOSE_VENV = REPO / ".tools" / "compose-venv"
COMPOSE = COMPOSE_VENV / "bin" / "docker-compose"
AGENT_CAPABILITIES = {"BPF", "PERFMON", "NET_ADMIN", "SYS_ADMIN", "SYS_PTRACE"}
AGENT_MOUNTS = {"/sys/fs/bpf", "/sys/kernel/btf", "/sys/kernel/tracing", "/run/netns", "/sys/fs/cgroup"}
COMPOSE_ENV = {
    "INFLUX_ADMIN_PASSWORD": "test-password",
    "INFLUX_TOKEN": "test-token",
    "GRAFANA_ADMIN_PASSWORD": "test-grafana",
    "HOPTRACE_NODE": "node-1",
    "HOPTRACE_WEB_TOKEN": "test-web-token",
}


def ensure_compose() -> Path:
    """docker-compose (PyPI, v1) in its own venv: it pins PyYAML 5.x, which needs Cython < 3 to build."""
    if COMPOSE.exists():
        return COMPOSE
    pip = [str(COMPOSE_VENV / "bin" / "pip"), "install", "-q"]
    steps = [
        [sys.executable, "-m", "venv", str(COMPOSE_VENV)],
        [*pip, "cython<3", "wheel", "setuptools<70"],
        [*pip, "--no-build-isolation", "PyYAML==5.4.1"],
        [*pip, "docker-compose==1.29.2"],
    ]
    for step in steps:
        result = subprocess.run(step, capture_output=True, text=True, timeout=600)
        if result.returncode != 0:
            pytest.fail(
                f"installing docker-compose failed at {step}:\n{result.stderr[-3000:]}", pytrace=False
            )
    return COMPOSE


def volume_target(volume: dict[str, Any] | str) -> str:
    """The container path of a compose volume, long ({target: ...}) or short (SRC:TARGET[:MODE]) form."""
    return volume["target"] if isinstance(volume, dict) else volume.split(":")[1]


def compose_config(*extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ensure_compose()), "-f", str(DEPLOY / "docker-compose.yml"), "config", *extra],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", **COMPOSE_ENV},
    )


def test_docker_compose_accepts_the_compose_file():
    result = compose_config()
    assert result.returncode == 0, result.stderr
    config = yaml.safe_load(result.stdout)
    services = config["services"]
    assert set(services) == {"influxdb", "grafana", "collector", "dispatcher", "web", "agent"}
    agent = services["agent"]
    assert "privileged" not in agent and agent["network_mode"] == "host" and agent["pid"] == "host"
    assert agent["cap_drop"] == ["ALL"] and set(agent["cap_add"]) == AGENT_CAPABILITIES
    targets = {volume_target(volume) for volume in agent["volumes"]}
    assert targets >= AGENT_MOUNTS, targets
    grafana_targets = {volume_target(volume) for volume in services["grafana"]["volumes"]}
    assert "/etc/grafana/provisioning/datasources" in grafana_targets
    assert "/etc/grafana/provisioning/dashboards/hoptrace" in grafana_targets
    influx_env = services["influxdb"]["environment"]
    assert influx_env["DOCKER_INFLUXDB_INIT_MODE"] == "setup"
    assert influx_env["DOCKER_INFLUXDB_INIT_BUCKET"] == "hoptrace/autogen"
    for name in ("Dockerfile.python", "Dockerfile.dispatcher", "Dockerfile.agent"):
        assert (DEPLOY / "docker" / name).is_file()
    assert {services[s]["build"]["dockerfile"] for s in ("agent", "dispatcher", "collector")} == {
        "deploy/docker/Dockerfile.agent",
        "deploy/docker/Dockerfile.dispatcher",
        "deploy/docker/Dockerfile.python",
    }
    # A secret left unset is an error, not an empty password.
    missing = subprocess.run(
        [str(COMPOSE), "-f", str(DEPLOY / "docker-compose.yml"), "config", "-q"],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert missing.returncode != 0 and "INFLUX_ADMIN_PASSWORD" in missing.stderr


def test_dockerfiles_build_what_each_image_needs():
    dispatcher = (DEPLOY / "docker" / "Dockerfile.dispatcher").read_text()
    for package in ("clang", "libbpf-dev", "bpftool"):
        assert package in dispatcher
    agent = (DEPLOY / "docker" / "Dockerfile.agent").read_text()
    assert agent.count("FROM ") == 2 and "go build" in agent and "CGO_ENABLED=0" in agent
    python = (DEPLOY / "docker" / "Dockerfile.python").read_text()
    assert "npm ci" in python and "pip install ." in python


def k8s_documents() -> list[dict[str, Any]]:
    documents = []
    for path in sorted((DEPLOY / "kubernetes").glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        documents.extend(doc for doc in yaml.safe_load_all(path.read_text()) if doc)
    return documents


def by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for doc in k8s_documents() if doc["kind"] == kind}


def test_kubernetes_manifests_parse_and_name_every_part():
    kustomization = yaml.safe_load((DEPLOY / "kubernetes" / "kustomization.yaml").read_text())
    listed = set(kustomization["resources"])
    files = {p.name for p in (DEPLOY / "kubernetes").glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == files
    assert set(by_kind("Deployment")) == {"hoptrace-dispatcher", "hoptrace-collector", "hoptrace-web"}
    assert set(by_kind("Service")) == {
        "hoptrace-dispatcher",
        "hoptrace-collector",
        "hoptrace-web",
        "hoptrace-influxdb",
    }
    assert "hoptrace-influxdb" in by_kind("StatefulSet")
    for doc in k8s_documents():
        assert doc["apiVersion"] and doc["metadata"]["name"]


# The oldest and the newest Kubernetes minor whose schemas kubernetes-validate bundles and we support.
K8S_VERSIONS = ("1.29.0", "1.37.0")


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_kubernetes_manifests_validate_against_the_api_schemas(version: str):
    """Strict: a field the API does not have (a typo, a wrong indentation) is an error, not ignored."""
    import kubernetes_validate

    documents = k8s_documents()
    assert len(documents) >= 10
    for document in documents:
        kubernetes_validate.validate(document, version, strict=True)
    # The validator does reject what the API would: a misspelt field and a wrong type.
    daemonset = by_kind("DaemonSet")["hoptrace-agent"]
    for broken in (
        {**daemonset, "spec": {**daemonset["spec"], "updateStrategyy": {}}},
        {**daemonset, "spec": 3},
    ):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(broken, version, strict=True)


def test_agent_daemonset_has_host_namespaces_mounts_and_exactly_its_capabilities():
    agent = by_kind("DaemonSet")["hoptrace-agent"]
    pod = agent["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True and pod["hostPID"] is True
    (container,) = pod["containers"]
    security = container["securityContext"]
    assert security["privileged"] is False and security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert set(security["capabilities"]["add"]) == AGENT_CAPABILITIES
    mounts = {mount["mountPath"] for mount in container["volumeMounts"]}
    assert mounts >= AGENT_MOUNTS, mounts
    host_paths = {volume["hostPath"]["path"] for volume in pod["volumes"] if "hostPath" in volume}
    assert host_paths >= AGENT_MOUNTS, host_paths
    # the CRI runtimes' socket directories (pods by name), read-only, at the host's paths
    runtime_dirs = {"/run/containerd", "/var/run/crio"}
    assert runtime_dirs <= host_paths, host_paths
    assert {m["mountPath"] for m in container["volumeMounts"] if m.get("readOnly")} >= runtime_dirs
    text = (DEPLOY / "kubernetes" / "agent-daemonset.yaml").read_text()
    for capability in AGENT_CAPABILITIES:  # each one justified in a comment right above it
        assert re.search(rf"# CAP_{capability}: .+\n(\s+#.*\n)*\s+- {capability}\n", text), capability


def test_collector_follows_the_dispatcher_with_its_own_token():
    """The dispatcher refuses a user API call without a token (--tokens): the collector's is the viewer token
    `hoptrace certs` writes, from the mounted certificates Secret."""
    (container,) = by_kind("Deployment")["hoptrace-collector"]["spec"]["template"]["spec"]["containers"]
    assert flag(container["args"], "dispatcher") == "hoptrace-dispatcher.hoptrace.svc:7070"
    assert flag(container["args"], "dispatcher-token-file") == "/etc/hoptrace/certs/collector.token"


def test_control_plane_pods_run_without_capabilities():
    for name, deployment in by_kind("Deployment").items():
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            assert container["securityContext"]["capabilities"]["drop"] == ["ALL"], name
            assert "add" not in container["securityContext"]["capabilities"], name


def test_systemd_units_verify(tmp_path: Path):
    """systemd-analyze verify on copies whose binaries point at stand-ins (the real ones are not
    installed here)."""
    systemd_analyze = shutil.which("systemd-analyze")
    assert systemd_analyze, "systemd-analyze is missing (Debian package systemd)"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("hoptrace", "hoptrace-agent"):
        stand_in = bin_dir / name
        stand_in.write_text("#!/bin/sh\n")
        stand_in.chmod(0o755)
    units = sorted((DEPLOY / "systemd").glob("*.service"))
    assert [unit.name for unit in units] == [
        "hoptrace-agent.service",
        "hoptrace-collector.service",
        "hoptrace-dispatcher.service",
        "hoptrace-web.service",
    ]
    copies = []
    for unit in units:
        copy = tmp_path / unit.name
        copy.write_text(unit.read_text().replace("/usr/local/bin/", f"{bin_dir}/"))
        copies.append(str(copy))
    result = subprocess.run(
        [systemd_analyze, "verify", "--man=no", *copies], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0 and not result.stderr.strip(), result.stderr
    agent = (DEPLOY / "systemd" / "hoptrace-agent.service").read_text()
    bounding = re.search(r"^CapabilityBoundingSet=(.*)$", agent, re.M).group(1).split()
    assert {cap.removeprefix("CAP_") for cap in bounding} == AGENT_CAPABILITIES


# ---- Kafka: the compose override and the Kubernetes overlay ----------------------------------------------

KAFKA_OVERLAY = DEPLOY / "kubernetes-kafka"  # an overlay of deploy/kubernetes (kustomize: not inside it)


def json_patch(document: Any, operations: list[dict[str, Any]]) -> Any:
    """RFC 6902 add/replace/test, what the overlay's patches use, on a copy of `document` (kustomize applies
    the same operations; a path that does not exist fails, as it does there)."""
    import copy

    document = copy.deepcopy(document)
    for operation in operations:
        *parents, last = [
            part.replace("~1", "/").replace("~0", "~") for part in operation["path"][1:].split("/")
        ]
        target = document
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        op, value = operation["op"], operation.get("value")
        if isinstance(target, list):
            index = len(target) if last == "-" else int(last)
            if op == "add":
                target.insert(index, value)
            elif op == "replace":
                target[index] = value
            else:
                assert op == "test" and target[index] == value, operation
        elif op == "test":
            assert target[last] == value, operation
        else:
            assert op == "add" or last in target, f"replace of a missing {operation['path']}"
            target[last] = value
    return document


def kafka_overlay() -> dict[tuple[str, str], dict[str, Any]]:
    """The overlay rendered as kustomize would: the base, its own resources, its patches; by (kind, name)."""
    kustomization = yaml.safe_load((KAFKA_OVERLAY / "kustomization.yaml").read_text())
    assert kustomization["resources"][0] == "../kubernetes"
    documents = {(doc["kind"], doc["metadata"]["name"]): doc for doc in k8s_documents()}
    for resource in kustomization["resources"][1:]:
        for doc in yaml.safe_load_all((KAFKA_OVERLAY / resource).read_text()):
            documents[(doc["kind"], doc["metadata"]["name"])] = doc
    for patch in kustomization["patches"]:
        key = (patch["target"]["kind"], patch["target"]["name"])
        documents[key] = json_patch(
            documents[key], yaml.safe_load((KAFKA_OVERLAY / patch["path"]).read_text())
        )
    return documents


def flag(args: list[str], name: str) -> str | None:
    """The value of --name=VALUE in `args` (None when absent)."""
    values = [arg.split("=", 1)[1] for arg in args if arg.startswith(f"--{name}=")]
    assert len(values) <= 1, (name, args)
    return values[0] if values else None


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_kubernetes_kafka_overlay_validates_and_wires_agents_to_a_consumer_group(version: str):
    """The Kafka overlay, rendered: every object valid for the API (strict); the agents publish to the
    broker Service instead of the collector, the collector is one Deployment of 3 replicas in one group, the
    topic has partitions for every replica and the KRaft quorum names every broker pod."""
    import kubernetes_validate

    documents = kafka_overlay()
    for document in documents.values():
        kubernetes_validate.validate(document, version, strict=True)

    agent = documents[("DaemonSet", "hoptrace-agent")]["spec"]["template"]["spec"]["containers"][0]
    assert flag(agent["args"], "collector") is None, agent["args"]
    bootstrap = flag(agent["args"], "kafka-brokers")
    assert bootstrap == "hoptrace-kafka.hoptrace.svc:9092"
    assert (
        set(agent["securityContext"]["capabilities"]["add"]) == AGENT_CAPABILITIES
    )  # unchanged by the patch
    broker_service = documents[("Service", "hoptrace-kafka")]
    assert [p["port"] for p in broker_service["spec"]["ports"]] == [9092]

    collector = documents[("Deployment", "hoptrace-collector")]
    (container,) = collector["spec"]["template"]["spec"]["containers"]
    assert collector["spec"]["replicas"] == 3
    assert flag(container["args"], "kafka-brokers") == bootstrap
    assert flag(container["args"], "kafka-topic") == flag(agent["args"], "kafka-topic") == "hoptrace-records"
    assert flag(container["args"], "kafka-group") == "hoptrace-collectors"
    assert flag(container["args"], "instance") == "$(POD_NAME)"
    assert any(env["name"] == "POD_NAME" for env in container["env"])
    assert documents[("Service", "hoptrace-collector")]["spec"]["sessionAffinity"] == "ClientIP"

    topic = documents[("Job", "hoptrace-kafka-topic")]["spec"]["template"]["spec"]["containers"][0]
    assert flag(topic["command"], "topic") == "hoptrace-records"
    assert int(flag(topic["command"], "partitions")) >= collector["spec"]["replicas"]
    kafka = documents[("StatefulSet", "hoptrace-kafka")]
    env = {e["name"]: e.get("value") for e in kafka["spec"]["template"]["spec"]["containers"][0]["env"]}
    voters = env["KAFKA_CONTROLLER_QUORUM_VOTERS"].split(",")
    assert len(voters) == kafka["spec"]["replicas"] == 3
    assert int(flag(topic["command"], "replication-factor")) == 3 and env["KAFKA_MIN_INSYNC_REPLICAS"] == "2"
    # The overlay's patch files document the TLS/SASL flags of both sides.
    assert "--kafka-sasl-password-file" in (KAFKA_OVERLAY / "agent-kafka.yaml").read_text()
    assert "--kafka-security-protocol=SASL_SSL" in (KAFKA_OVERLAY / "collector-kafka.yaml").read_text()


def test_json_patch_fails_like_kustomize_on_a_stale_patch():
    """The overlay's renderer refuses what kustomize refuses: a `test` that no longer holds (the agent's args
    moved) and a replace of a field that is not there."""
    daemonset = by_kind("DaemonSet")["hoptrace-agent"]
    with pytest.raises(AssertionError):
        json_patch(
            daemonset, [{"op": "test", "path": "/spec/template/spec/containers/0/args/2", "value": "x"}]
        )
    with pytest.raises(AssertionError):
        json_patch(daemonset, [{"op": "replace", "path": "/spec/replicas", "value": 3}])


def compose_kafka_config() -> dict[str, Any]:
    result = subprocess.run(
        [
            str(ensure_compose()),
            *("-f", str(DEPLOY / "docker-compose.yml"), "-f", str(DEPLOY / "docker-compose.kafka.yml")),
            "config",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", **COMPOSE_ENV, "KAFKA_CLUSTER_ID": "aG9wdHJhY2UtdGVzdC0xMg"},
    )
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def test_docker_compose_kafka_override_wires_agent_broker_and_collector_group():
    """deploy/docker-compose.kafka.yml over the production file: a KRaft broker, the topic made before the
    collectors start, two collectors of one group with distinct instances, the agent on --kafka-brokers (no
    --collector) and its capabilities unchanged."""
    services = compose_kafka_config()["services"]
    assert {"kafka", "kafka-topic", "collector", "collector-2"} <= set(services)
    kafka_env = services["kafka"]["environment"]
    assert kafka_env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert "EXTERNAL://127.0.0.1:9092" in kafka_env["KAFKA_ADVERTISED_LISTENERS"]
    assert "127.0.0.1:9092:9094/tcp" in str(services["kafka"]["ports"]) or any(
        str(p.get("target")) == "9094" and str(p.get("published")) == "9092"
        for p in services["kafka"]["ports"]
    )
    collectors = [services["collector"], services["collector-2"]]
    for collector in collectors:
        assert flag(collector["command"], "kafka-brokers") == "kafka:9092"
        assert flag(collector["command"], "kafka-group") == "hoptrace-collectors"
        assert collector["depends_on"]["kafka-topic"]["condition"] == "service_completed_successfully"
    assert len({flag(c["command"], "instance") for c in collectors}) == 2
    partitions = int(flag(services["kafka-topic"]["entrypoint"], "partitions"))
    assert partitions >= len(collectors)
    agent = services["agent"]
    assert flag(agent["command"], "collector") is None
    assert flag(agent["command"], "kafka-brokers") == "127.0.0.1:9092"
    assert flag(agent["command"], "kafka-topic") == flag(collectors[0]["command"], "kafka-topic")
    assert agent["cap_drop"] == ["ALL"] and set(agent["cap_add"]) == AGENT_CAPABILITIES
    missing = subprocess.run(
        [
            str(COMPOSE),
            *("-f", str(DEPLOY / "docker-compose.yml"), "-f", str(DEPLOY / "docker-compose.kafka.yml")),
            "config",
            "-q",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", **COMPOSE_ENV},
    )
    assert missing.returncode != 0 and "KAFKA_CLUSTER_ID" in missing.stderr
