"""The Helm chart (deploy/helm/hoptrace) as helm itself renders it (`make helm` builds helm): `helm lint
--strict` accepts it, every object it renders validates strictly against the API's schemas of the oldest and
newest Kubernetes minor supported (kubernetes-validate, as the plain manifests), and the objects carry what
the manifests carry: the agent's host namespaces, mounts and exact capabilities (not privileged), the CRI
socket as a value, mounted read-only; the control plane without capabilities, as the "restricted" Pod
Security Standard asks; each component sees only its own certificate files; secrets only by name; the Kafka
values wire the agents to the brokers and the collectors into one group as the kustomize overlay does. The
chart runs on a real cluster in tests/k8s/test_helm.py."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_manifests import AGENT_CAPABILITIES, AGENT_MOUNTS, K8S_VERSIONS, by_kind, flag, kafka_overlay

from hoptrace.lab.kubernetes import helm_binary

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "hoptrace"
RELEASE, NAMESPACE = "hoptrace", "tracing"
CRI_SOCKET = "/run/k3s/containerd/containerd.sock"
KAFKA = {"kafka": {"brokers": "kafka-0.kafka:9092,kafka-1.kafka:9092"}}
# The control plane's files of `hoptrace certs`, each pod's own (ca.key and the admin's in none).
OWN_CERT_FILES = {
    "hoptrace-dispatcher": {"ca.pem", "dispatcher.pem", "dispatcher.key", "tokens"},
    "hoptrace-collector": {"ca.pem", "collector.pem", "collector.key", "collector.token"},
    "hoptrace-web": {"ca.pem", "web.pem", "web.key", "web.token"},
}


def helm(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    """helm with its configuration, cache and data under `home` (nothing of the user's is read or written)."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home)}
    for kind in ("CONFIG", "CACHE", "DATA"):
        env[f"HELM_{kind}_HOME"] = str(home / kind.lower())
    return subprocess.run(
        [str(helm_binary()), *args], capture_output=True, text=True, timeout=120, env=env, check=False
    )


def render(tmp_path: Path, values: dict[str, Any] | None = None) -> dict[tuple[str, str], dict[str, Any]]:
    """`helm template` of the chart with `values`: the objects by (kind, name)."""
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(values or {}))
    result = helm("template", RELEASE, str(CHART), "-n", NAMESPACE, "-f", str(values_file), home=tmp_path)
    assert result.returncode == 0, result.stderr
    documents = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    objects = {(doc["kind"], doc["metadata"]["name"]): doc for doc in documents}
    assert len(objects) == len(documents), "two objects of one kind and name"
    return objects


def pod_of(objects: dict[tuple[str, str], dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return objects[(kind, name)]["spec"]["template"]["spec"]


def agent_container(objects: dict[tuple[str, str], dict[str, Any]]) -> dict[str, Any]:
    (container,) = pod_of(objects, "DaemonSet", "hoptrace-agent")["containers"]
    return container


@pytest.mark.parametrize(
    "values", [{}, KAFKA, {"agent": {"criSocket": CRI_SOCKET}}], ids=["default", "kafka", "cri"]
)
def test_helm_lint_accepts_the_chart(tmp_path: Path, values: dict[str, Any]):
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    result = helm("lint", "--strict", str(CHART), "-f", str(values_file), home=tmp_path)
    assert result.returncode == 0 and "1 chart(s) linted, 0 chart(s) failed" in result.stdout, (
        result.stdout + result.stderr
    )


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_rendered_objects_validate_against_the_api_schemas(tmp_path: Path, version: str):
    """Strict, as the manifests: a field the API does not have is an error. Every variant: the defaults,
    Kafka, and the lab's (fixed ClusterIPs, no persistence, a CRI socket, the local images)."""
    import kubernetes_validate

    variants = [{}, KAFKA, lab_values()]
    for values in variants:
        objects = render(tmp_path, values)
        assert len(objects) >= 9, sorted(objects)
        for document in objects.values():
            kubernetes_validate.validate(document, version, strict=True)


def lab_values() -> dict[str, Any]:
    """Values like the k8s tier's (tests/k8s/test_helm.py): local images, fixed ClusterIPs, no volumes."""
    return {
        "images": {name: {"repository": f"hoptrace/{name}", "tag": "local"} for name in ("agent", "python")},
        "agent": {"criSocket": CRI_SOCKET},
        "dispatcher": {
            "host": "198.19.128.70",
            "service": {"clusterIP": "198.19.128.70"},
            "persistence": {"enabled": False},
        },
        "collector": {"host": "198.19.128.71", "service": {"clusterIP": "198.19.128.71"}},
        "influxdb": {"persistence": {"enabled": False}, "setup": False},
    }


def test_agent_daemonset_has_the_manifests_host_namespaces_mounts_and_exactly_its_capabilities(
    tmp_path: Path,
):
    objects = render(tmp_path)
    pod = pod_of(objects, "DaemonSet", "hoptrace-agent")
    assert pod["hostNetwork"] is True and pod["hostPID"] is True
    assert pod["automountServiceAccountToken"] is False  # it never calls the Kubernetes API
    container = agent_container(objects)
    security = container["securityContext"]
    assert security["privileged"] is False and security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert set(security["capabilities"]["add"]) == AGENT_CAPABILITIES
    manifest = by_kind("DaemonSet")["hoptrace-agent"]["spec"]["template"]["spec"]["containers"][0]
    assert security == manifest["securityContext"]
    mounts = {mount["mountPath"]: mount for mount in container["volumeMounts"]}
    assert set(mounts) >= AGENT_MOUNTS, mounts
    assert set(mounts) == {mount["mountPath"] for mount in manifest["volumeMounts"]}
    host_paths = {volume["hostPath"]["path"] for volume in pod["volumes"] if "hostPath" in volume}
    assert host_paths >= AGENT_MOUNTS, host_paths
    # no socket given: both runtimes' socket directories, read-only, as the manifests; no --cri-socket flag
    runtime_dirs = {"/run/containerd", "/var/run/crio"}
    assert runtime_dirs <= host_paths and all(mounts[d]["readOnly"] for d in runtime_dirs)
    assert flag(container["args"], "cri-socket") is None
    text = (CHART / "templates" / "agent-daemonset.yaml").read_text()
    for capability in AGENT_CAPABILITIES:  # each one justified in a comment right above it
        assert re.search(rf"# CAP_{capability}: .+\n(\s+#.*\n)*\s+- {capability}\n", text), capability


def test_cri_socket_value_mounts_its_directory_read_only_and_names_it(tmp_path: Path):
    objects = render(tmp_path, {"agent": {"criSocket": CRI_SOCKET}})
    pod = pod_of(objects, "DaemonSet", "hoptrace-agent")
    container = agent_container(objects)
    assert flag(container["args"], "cri-socket") == CRI_SOCKET
    directory = str(Path(CRI_SOCKET).parent)
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == directory]
    assert mount["readOnly"] is True and mount["mountPropagation"] == "HostToContainer"
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["hostPath"] == {"path": directory, "type": "Directory"}
    host_paths = {v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert not host_paths & {"/run/containerd", "/var/run/crio"}


def test_hooks_value_adds_the_agent_flag(tmp_path: Path):
    assert "--hooks" not in agent_container(render(tmp_path))["args"]
    assert "--hooks" in agent_container(render(tmp_path, {"agent": {"hooks": True}}))["args"]


def test_control_plane_runs_without_capabilities_as_restricted_asks(tmp_path: Path):
    """Every pod but the agent: non-root, no capability, no privilege escalation, the runtime's seccomp
    profile; the one hostPath is the dispatcher's BTF, read-only (it generates vmlinux.h from it)."""
    objects = render(tmp_path)
    workloads = [key for key in objects if key[0] in ("Deployment", "StatefulSet")]
    assert sorted(name for _, name in workloads) == [
        "hoptrace-collector",
        "hoptrace-dispatcher",
        "hoptrace-influxdb",
        "hoptrace-web",
    ]
    for kind, name in workloads:
        pod = pod_of(objects, kind, name)
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["runAsUser"] > 0, name
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        assert "hostNetwork" not in pod and "hostPID" not in pod, name
        for container in pod["containers"]:
            security = container["securityContext"]
            assert security["capabilities"] == {"drop": ["ALL"]}, name
            assert security["allowPrivilegeEscalation"] is False, name
        host_paths = [v for v in pod["volumes"] if "hostPath" in v] if "volumes" in pod else []
        if name == "hoptrace-dispatcher":
            (btf,) = host_paths
            assert btf["hostPath"]["path"] == "/sys/kernel/btf"
            (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == btf["name"]]
            assert mount["readOnly"] is True
        else:
            assert not host_paths, name


def test_secrets_are_mounted_by_name_and_each_component_sees_only_its_own_files(tmp_path: Path):
    objects = render(tmp_path)
    assert not [key for key in objects if key[0] == "Secret"]  # the chart makes none: they are the user's
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def secret_values(node: Any, path: str = "") -> list[str]:
        if isinstance(node, dict):
            return [hit for key, value in node.items() for hit in secret_values(value, f"{path}.{key}")]
        leaf = path.rsplit(".", 1)[-1].lower()
        return [path] if re.search(r"password|token|key$", leaf) and node else []

    assert secret_values(values) == [], "a secret in values.yaml's defaults"
    for name, own in OWN_CERT_FILES.items():
        pod = pod_of(objects, "Deployment", name)
        (certs,) = [v for v in pod["volumes"] if v["name"] == "certs"]
        assert certs["secret"]["secretName"] == "hoptrace-certs"
        assert {item["key"] for item in certs["secret"]["items"]} == own, name
    agent = pod_of(objects, "DaemonSet", "hoptrace-agent")
    (certs,) = [v for v in agent["volumes"] if v["name"] == "certs"]
    assert certs["secret"] == {"secretName": "hoptrace-certs", "defaultMode": 0o400}
    separate = render(tmp_path, {"secrets": {"agentCerts": "hoptrace-agent-certs"}})
    (certs,) = [v for v in pod_of(separate, "DaemonSet", "hoptrace-agent")["volumes"] if v["name"] == "certs"]
    assert certs["secret"]["secretName"] == "hoptrace-agent-certs"
    influx = pod_of(objects, "StatefulSet", "hoptrace-influxdb")["containers"][0]
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in influx["env"] if "valueFrom" in e}
    assert refs["DOCKER_INFLUXDB_INIT_PASSWORD"] == {"name": "hoptrace-influxdb", "key": "admin-password"}


def test_components_reach_each_other_at_one_address_each(tmp_path: Path):
    """By default the Services' DNS names in the release's namespace; with `host` values, those (the lab
    has no cluster DNS). The agent, the collector and the web UI name the same dispatcher."""
    for values, dispatcher, collector in (
        ({}, f"hoptrace-dispatcher.{NAMESPACE}.svc", f"hoptrace-collector.{NAMESPACE}.svc"),
        (lab_values(), "198.19.128.70", "198.19.128.71"),
    ):
        objects = render(tmp_path, values)
        agent = agent_container(objects)["args"]
        collector_args = pod_of(objects, "Deployment", "hoptrace-collector")["containers"][0]["args"]
        web = pod_of(objects, "Deployment", "hoptrace-web")["containers"][0]["args"]
        for args in (agent, collector_args, web):
            assert flag(args, "dispatcher") == f"{dispatcher}:7070", args
        assert flag(agent, "collector") == f"{collector}:7071"
        assert flag(agent, "clock-server") == f"{collector}:7123"
        assert flag(collector_args, "dispatcher-token-file") == "/etc/hoptrace/certs/collector.token"
        for name in ("dispatcher", "collector"):
            service = objects[("Service", f"hoptrace-{name}")]
            assert service["spec"].get("clusterIP") == values.get(name, {}).get("service", {}).get(
                "clusterIP"
            )
        influx_url = f"http://hoptrace-influxdb.{NAMESPACE}.svc:8086"
        assert flag(collector_args, "influx-url") == influx_url


def test_persistence_off_uses_empty_dirs(tmp_path: Path):
    values = {
        "dispatcher": {"persistence": {"enabled": False}},
        "influxdb": {"persistence": {"enabled": False}},
    }
    objects = render(tmp_path, values)
    assert ("PersistentVolumeClaim", "hoptrace-dispatcher-state") not in objects
    assert "volumeClaimTemplates" not in objects[("StatefulSet", "hoptrace-influxdb")]["spec"]
    for kind, name, volume in (
        ("Deployment", "hoptrace-dispatcher", "state"),
        ("StatefulSet", "hoptrace-influxdb", "data"),
    ):
        (state,) = [v for v in pod_of(objects, kind, name)["volumes"] if v["name"] == volume]
        assert state["emptyDir"] == {}, (name, state)
    with_volumes = render(tmp_path)
    assert ("PersistentVolumeClaim", "hoptrace-dispatcher-state") in with_volumes


def test_kafka_values_wire_agents_to_the_brokers_and_collectors_into_one_group(tmp_path: Path):
    """What the kustomize overlay (deploy/kubernetes-kafka) does, from values: the agents publish to the
    brokers instead of a collector's stream, the collectors are replicas of one consumer group, each its own
    instance, ready on /metrics, and the collector Service keeps each agent's clock rounds on one replica."""
    objects = render(tmp_path, KAFKA)
    overlay = kafka_overlay()
    agent = agent_container(objects)["args"]
    assert flag(agent, "collector") is None
    assert flag(agent, "kafka-brokers") == KAFKA["kafka"]["brokers"]
    assert flag(agent, "clock-server") == f"hoptrace-collector.{NAMESPACE}.svc:7123"
    assert set(agent_container(objects)["securityContext"]["capabilities"]["add"]) == AGENT_CAPABILITIES
    collector = objects[("Deployment", "hoptrace-collector")]
    overlay_collector = overlay[("Deployment", "hoptrace-collector")]
    assert collector["spec"]["replicas"] == overlay_collector["spec"]["replicas"] == 3
    (container,) = collector["spec"]["template"]["spec"]["containers"]
    (overlay_container,) = overlay_collector["spec"]["template"]["spec"]["containers"]
    for name in ("kafka-topic", "kafka-group", "instance"):
        assert flag(container["args"], name) == flag(overlay_container["args"], name), name
    assert flag(container["args"], "kafka-brokers") == KAFKA["kafka"]["brokers"]
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in container["env"]
    assert container["readinessProbe"]["httpGet"] == overlay_container["readinessProbe"]["httpGet"]
    service = objects[("Service", "hoptrace-collector")]
    assert service["spec"]["sessionAffinity"] == "ClientIP"
    plain = render(tmp_path)
    assert "sessionAffinity" not in plain[("Service", "hoptrace-collector")]["spec"]
    assert plain[("Deployment", "hoptrace-collector")]["spec"]["replicas"] == 1
