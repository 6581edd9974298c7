"""A one-node Kubernetes cluster on this host, for tests of hoptrace where users run it.

The node lives in a network namespace of its own (NODE_NETNS): etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, the kubelet, kube-proxy (iptables mode) and the private containerd 1.6 of
`hoptrace.lab.containerd` all run in it, in the host's mount and cgroup namespaces. So the Service rules
kube-proxy writes, the CNI bridge, the node's address and its routes are that namespace's and go with it;
the host's own iptables, FORWARD policy and ip_forward are never touched. Addresses (all inside
198.18.0.0/15, nothing routes out):

    NODE_IP        198.18.244.1   the node's InternalIP (on its lo), where the API server listens
    POD_SUBNET     198.18.242.0/24  the CNI bridge's pods; the bridge holds .1, their gateway to ClusterIPs
    SERVICE_RANGE  198.19.128.0/20  ClusterIPs (the API server's `kubernetes` Service is .1)

The Kubernetes commands come from `make k8s-tools` (.tools/k8s/VERSION, built from the Go module proxy at the
version lab/kubernetes/go.mod pins). No image registry is reachable: every image (containerd's pause image,
ECHO_IMAGE) is a static binary written here as an OCI image layout and imported with `ctr`; pods use
`imagePullPolicy: Never`.

`KubernetesLab.stop()` removes everything, also after a failed start: the processes, the pods (through the
CRI), kubelet's mounts, the namespace, the temporary directory, the cgroups and /var/log/containers links the
pods left, and the kernel settings the kubelet changes (kernel.panic and others, which are not per namespace)
are set back. `sweep_leftovers()` does the same for a run that was killed before it could.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import datetime
import fcntl
import hashlib
import io
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from hoptrace.common.certs import alt_names, new_ca
from hoptrace.common.netns import socket_in_netns
from hoptrace.common.timeouts import scaled
from hoptrace.lab.containerd import PrivateContainerd
from hoptrace.lab.waiting import wait_until

REPO = Path(os.environ.get("HOPTRACE_REPO") or Path(__file__).resolve().parent.parent)
MODULE_DIR = REPO / "lab" / "kubernetes"
NODE_NETNS = "hoptrace-k8s"
NODE_NAME = "hoptrace-lab-node"
NODE_IP = "198.18.244.1"
POD_SUBNET = "198.18.242.0/24"
SERVICE_RANGE = "198.19.128.0/20"
BRIDGE = "hk8s-br0"
ECHO_IMAGE = "localhost/hoptrace-echo:lab"
ECHO_PORT = 7007
TMP_PREFIX = "hoptrace-k8s-"
# Held while a cluster lives: its names and addresses are fixed, so one runs per host at a time.
LOCK_FILE = Path("/run/hoptrace-k8s.lock")
HELM_VERSION = "v3.22.0"  # helm.sh/helm/v3, built by `make helm` (lab/kubernetes/build-helm.sh)
COMMANDS = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubelet",
    "kube-proxy",
    "kubectl",
)

# Kernel settings the kubelet sets at start (pkg/kubelet/cm: setupKernelTunables) that are the host's, not a
# network namespace's: read before, written back after.
KUBELET_SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)
BPFFS = "/sys/fs/bpf"
CONTAINER_LOG_LINKS = Path("/var/log/containers")  # the kubelet's fixed directory of log links
_CLONE_NEWNET = 0x40000000
_PR_SET_PDEATHSIG = 1


class KubernetesLabError(RuntimeError):
    """The cluster could not be built, started or removed; the message says why."""


def k8s_version() -> str:
    """The k8s.io/kubernetes version lab/kubernetes/go.mod pins (the one `make k8s-tools` builds)."""
    match = re.search(r"^\s*k8s\.io/kubernetes (v\S+)", (MODULE_DIR / "go.mod").read_text(), re.M)
    if match is None:
        raise KubernetesLabError(f"{MODULE_DIR / 'go.mod'} does not require k8s.io/kubernetes")
    return match.group(1)


def tools_dir(version: str | None = None) -> Path:
    """Where `make k8s-tools` puts the commands of `version` (default: the pinned one)."""
    return REPO / ".tools" / "k8s" / (version or k8s_version())


def helm_binary(version: str = HELM_VERSION) -> Path:
    """The helm `make helm` builds into .tools/helm/VERSION; KubernetesLabError when it is not built."""
    helm = REPO / ".tools" / "helm" / version / "helm"
    if not helm.is_file():
        raise KubernetesLabError(f"{helm} is not built: run `make helm`")
    return helm


def missing_tools(version: str | None = None) -> list[str]:
    """The cluster's commands that are not built yet (empty: all there)."""
    return [c for c in COMMANDS if not (tools_dir(version) / c).is_file()]


# ---- certificates ---------------------------------------------------------------------------------------


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )


@dataclass
class ClusterPki:
    """The cluster's CA and every certificate its components use, as kubeadm makes them: Kubernetes takes a
    client certificate's CN as the user and its O as the groups, which RBAC's bootstrap roles name."""

    out: Path
    ca_cert: x509.Certificate = field(init=False)
    ca_key: ec.EllipticCurvePrivateKey = field(init=False)

    def __post_init__(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "hoptrace-lab-kubernetes-ca")])
        self.ca_cert, self.ca_key = new_ca(name, datetime.timedelta(days=2))
        self.ca.write_bytes(self.ca_cert.public_bytes(serialization.Encoding.PEM))

    @property
    def ca(self) -> Path:
        """The CA certificate every component trusts."""
        return self.out / "ca.pem"

    def issue(
        self, name: str, user: str, groups: Sequence[str] = (), hosts: Sequence[str] = ()
    ) -> tuple[Path, Path]:
        """A certificate for `user` in `groups`; with `hosts` also a server's (SANs). Returns (cert, key)."""
        key = ec.generate_private_key(ec.SECP256R1())
        subject = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
        subject.append(x509.NameAttribute(NameOID.COMMON_NAME, user))
        usages = [ExtendedKeyUsageOID.CLIENT_AUTH] + ([ExtendedKeyUsageOID.SERVER_AUTH] if hosts else [])
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(subject))
            .issuer_name(self.ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(_now() - datetime.timedelta(minutes=5))
            .not_valid_after(_now() + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.ca_key.public_key()), critical=False
            )
        )
        if hosts:
            builder = builder.add_extension(x509.SubjectAlternativeName(alt_names(hosts)), critical=False)
        cert = builder.sign(self.ca_key, hashes.SHA256())
        cert_path, key_path = self.out / f"{name}.pem", self.out / f"{name}.key"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_path.touch(mode=0o600)
        key_path.write_bytes(_pem_key(key))
        return cert_path, key_path

    def service_account_key(self) -> tuple[Path, Path]:
        """The key that signs service account tokens (controller-manager, API server) and its public half."""
        key = ec.generate_private_key(ec.SECP256R1())
        private, public = self.out / "sa.key", self.out / "sa.pub"
        private.touch(mode=0o600)
        private.write_bytes(_pem_key(key))
        public.write_bytes(
            key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        return private, public

    def kubeconfig(self, name: str, user: str, groups: Sequence[str] = ()) -> Path:
        """A kubeconfig for `user` that reaches the API server at NODE_IP."""
        cert, key = self.issue(name, user, groups)
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "lab",
                    "cluster": {"server": f"https://{NODE_IP}:6443", "certificate-authority": str(self.ca)},
                }
            ],
            "users": [{"name": user, "user": {"client-certificate": str(cert), "client-key": str(key)}}],
            "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": user}}],
            "current-context": "lab",
        }
        path = self.out / f"{name}.kubeconfig"
        path.write_text(json.dumps(config, indent=1))  # YAML's superset: kubectl reads it as it is
        return path


# ---- images ---------------------------------------------------------------------------------------------


def _tar(files: dict[str, tuple[bytes, int]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs: set[str] = set()
        for name in sorted(files):
            parts = name.split("/")[:-1]
            for depth in range(1, len(parts) + 1):
                directory = "/".join(parts[:depth])
                if directory not in dirs:
                    dirs.add(directory)
                    info = tarfile.TarInfo(directory)
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(info)
            data, mode = files[name]
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def oci_archive(image: str, binary: bytes, entrypoint: Sequence[str]) -> bytes:
    """A tar of an OCI image layout (oci-layout, index.json, blobs) holding one image named `image`: one
    layer with `binary` as /NAME (NAME = entrypoint's first word's base name), `entrypoint` its command."""
    blobs: dict[str, bytes] = {}

    def descriptor(media_type: str, data: bytes) -> dict[str, object]:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return {"mediaType": media_type, "digest": digest, "size": len(data)}

    layer = descriptor(
        "application/vnd.oci.image.layer.v1.tar", _tar({os.path.basename(entrypoint[0]): (binary, 0o755)})
    )
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": list(entrypoint)},
        "rootfs": {"type": "layers", "diff_ids": [layer["digest"]]},
    }
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": descriptor("application/vnd.oci.image.config.v1+json", json.dumps(config).encode()),
        "layers": [layer],
    }
    manifest_descriptor = descriptor(
        "application/vnd.oci.image.manifest.v1+json", json.dumps(manifest).encode()
    )
    manifest_descriptor["annotations"] = {
        "io.containerd.image.name": image,
        "org.opencontainers.image.ref.name": image.rsplit(":", 1)[1],
    }
    files = {
        "oci-layout": (b'{"imageLayoutVersion":"1.0.0"}', 0o644),
        "index.json": (json.dumps({"schemaVersion": 2, "manifests": [manifest_descriptor]}).encode(), 0o644),
    }
    for digest, data in blobs.items():
        files["blobs/sha256/" + digest.removeprefix("sha256:")] = (data, 0o644)
    return _tar(files)


def _docker_reference(image: str) -> str:
    """`image` as containerd (and the kubelet) name it: Docker Hub's short names made full."""
    name = image if ":" in image.rsplit("/", 1)[-1] else f"{image}:latest"
    first = name.split("/", 1)[0]
    if "/" not in name:
        return f"docker.io/library/{name}"
    if "." in first or ":" in first or first == "localhost":
        return name
    return f"docker.io/{name}"


# ---- processes in the node's namespace ------------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)


def _setns(path: str) -> None:
    with open(path, "rb") as ns:
        if _libc.setns(ns.fileno(), _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns {path}: {os.strerror(err)}")


@contextlib.contextmanager
def _thread_in_netns(path: str) -> Iterator[None]:
    """Run the block with this thread in the network namespace at `path` (setns(2) moves only the calling
    thread; processes it starts are born there); back in its own namespace afterwards, whatever happens."""
    with open("/proc/thread-self/ns/net", "rb") as own:
        _setns(path)
        try:
            yield
        finally:
            if _libc.setns(own.fileno(), _CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns back to the caller's network namespace")


def _die_with_parent() -> None:
    # A test process killed with SIGKILL takes the cluster's processes with it (sweep_leftovers() removes
    # what they leave on disk).
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _run(
    argv: Sequence[str],
    what: str,
    timeout_s: float = 60.0,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> str:
    result = subprocess.run(
        list(argv), capture_output=True, text=True, timeout=scaled(timeout_s), cwd=cwd, env=env
    )
    if result.returncode != 0:
        raise KubernetesLabError(
            f"{what} failed ({result.returncode}): {' '.join(argv)}\n{result.stderr[-3000:]}"
        )
    return result.stdout


def _ip(*args: str) -> None:
    _run(["ip", "-n", NODE_NETNS, *args], f"ip {' '.join(args)}")


# ---- what a run leaves behind -----------------------------------------------------------------------


def _mounts_under(prefixes: Sequence[str]) -> list[str]:
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4]
        if any(point == p or point.startswith(p.rstrip("/") + "/") for p in prefixes):
            points.append(point)
    return sorted(set(points), key=len, reverse=True)


def _unmount_under(prefixes: Sequence[str]) -> list[str]:
    failed = []
    for point in _mounts_under(prefixes):
        result = subprocess.run(["umount", "-l", point], capture_output=True, text=True)
        if result.returncode != 0 and "not mounted" not in result.stderr:
            failed.append(f"umount {point}: {result.stderr.strip()}")
    return failed


def _mount_propagation(point: str) -> str | None:
    """'shared', 'slave' or 'private' for the mount at `point` (the topmost one there); None when nothing is
    mounted there."""
    found = None
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == point:
            optional = fields[6 : fields.index("-")]
            found = "private"
            if any(o.startswith("shared:") for o in optional):
                found = "shared"
            elif any(o.startswith("master:") for o in optional):
                found = "slave"
    return found


def _cgroup_roots() -> list[Path]:
    """The mount point of every cgroup hierarchy (v1 controllers and v2; a hybrid host has both)."""
    roots = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[fields.index("-") + 1] in ("cgroup", "cgroup2"):
            roots.append(Path(fields[4]))
    return roots


def _remove_cgroups(ids: set[str], parents_before: set[Path]) -> list[str]:
    """Remove the cgroups runc made for the containers `ids` (containerd's CRI puts them under k8s.io/ when
    the kubelet runs without per-QoS cgroups), and a k8s.io/ parent made meanwhile once it is empty (another
    containerd of the lab may still use it: then it stays)."""
    failed = []
    for root in _cgroup_roots():
        for directory in root.glob("*/*"):
            if directory.name in ids and directory.is_dir():
                try:
                    directory.rmdir()
                except OSError as err:
                    failed.append(f"cgroup {directory}: {err}")
        parent = root / "k8s.io"
        if parent.is_dir() and parent not in parents_before:
            with contextlib.suppress(OSError):
                parent.rmdir()
    return failed


def _pids_in_netns() -> list[int]:
    result = subprocess.run(["ip", "netns", "pids", NODE_NETNS], capture_output=True, text=True)
    return [int(p) for p in result.stdout.split()] if result.returncode == 0 else []


def sweep_leftovers() -> None:
    """Remove what a killed earlier run left: processes in NODE_NETNS, mounts and directories under
    /tmp/hoptrace-k8s-*, the namespace and the node's agent's pins. A run that ended normally leaves
    nothing for it."""
    for pid in _pids_in_netns():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    old = [str(p) for p in Path(tempfile.gettempdir()).glob(TMP_PREFIX + "*")]
    _unmount_under(old)
    for directory in old:
        shutil.rmtree(directory, ignore_errors=True)
    if Path(f"/run/netns/{NODE_NETNS}").exists():
        subprocess.run(["ip", "netns", "del", NODE_NETNS], capture_output=True)
    remove_node_pins()


def node_pins() -> list[Path]:
    """What an agent of the node (hoptrace installed on the cluster) pins in bpffs at its default
    --pin-dir and leaves there when it is killed: its pin directory and its signed-command state beside it
    (agent/internal/signing.StatePath; the node's name needs no escaping)."""
    pin_dir = Path(BPFFS, "hoptrace")
    return [p for p in (pin_dir / NODE_NAME, pin_dir / f"commands-{NODE_NAME}") if p.exists()]


def remove_node_pins() -> None:
    """Unpin node_pins(): the node goes with the cluster."""
    for path in node_pins():
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


# ---- the cluster ----------------------------------------------------------------------------------------


@dataclass
class Component:
    """One of the cluster's processes, its output in a log file."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def tail(self, size: int = 3000) -> str:
        """The last `size` bytes of its output."""
        data = self.log.read_bytes() if self.log.exists() else b""
        return data[-size:].decode(errors="replace")


@dataclass
class KubernetesLab:
    """A one-node cluster: `start()` brings it up and waits until the node is Ready, `stop()` removes it."""

    version: str = ""
    # Images of the Docker engine that start() imports into the node's containerd (`docker save`, while the
    # control plane starts): hoptrace's own, as the compose tier builds them.
    docker_images: Sequence[str] = ()
    timings: dict[str, float] = field(default_factory=dict)  # seconds each step of start() took
    dir: Path | None = None
    _components: list[Component] = field(default_factory=list, repr=False)
    _containerd: PrivateContainerd | None = field(default=None, repr=False)
    _sysctls: dict[str, str] = field(default_factory=dict, repr=False)
    _cgroup_parents_before: set[Path] = field(default_factory=set, repr=False)
    _container_ids: set[str] = field(default_factory=set, repr=False)
    # The links /var/log/containers held before start (None: no such directory); unset: not read yet.
    _log_links_before: set[str] | None = field(default=None, repr=False)
    _log_links_read: bool = field(default=False, repr=False)
    _pki: ClusterPki | None = field(default=None, repr=False)
    _lock: int | None = field(default=None, repr=False)
    # start() made the host's bpffs mount shared (it was private): stop() makes it private again.
    _bpffs_shared_here: bool = field(default=False, repr=False)

    @property
    def bin(self) -> Path:
        """The directory of the cluster's commands."""
        return tools_dir(self.version)

    @property
    def netns_path(self) -> str:
        """The node's network namespace."""
        return f"/run/netns/{NODE_NETNS}"

    @property
    def admin_kubeconfig(self) -> Path:
        """A kubeconfig of a cluster admin (system:masters)."""
        assert self.dir is not None
        return self.dir / "pki" / "admin.kubeconfig"

    # -- start ---------------------------------------------------------------------------------------

    def start(self, timeout_s: float = 240.0) -> KubernetesLab:
        """Bring the cluster up; on any failure remove what was made and raise KubernetesLabError."""
        self.version = self.version or k8s_version()
        missing = missing_tools(self.version)
        if missing:
            raise KubernetesLabError(f"{', '.join(missing)} not built in {self.bin}: run `make k8s-tools`")
        lock = os.open(LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock)
            raise KubernetesLabError(
                f"another lab cluster runs on this host ({LOCK_FILE} is locked)"
            ) from None
        self._lock = lock
        sweep_leftovers()  # only with the lock: what is left then is a killed run's
        try:
            self._start(timeout_s)
        except BaseException:
            with contextlib.suppress(KubernetesLabError):
                self.stop()
            raise
        return self

    def _step(self, name: str, started: float) -> None:
        self.timings[name] = round(time.monotonic() - started, 2)

    def _start(self, timeout_s: float) -> None:
        started = time.monotonic()
        self._sysctls = {k: Path("/proc/sys", k).read_text().strip() for k in KUBELET_SYSCTLS}
        self._cgroup_parents_before = {r / "k8s.io" for r in _cgroup_roots() if (r / "k8s.io").is_dir()}
        self._log_links_before = (
            {p.name for p in CONTAINER_LOG_LINKS.iterdir()} if CONTAINER_LOG_LINKS.is_dir() else None
        )
        self._log_links_read = True
        self.dir = Path(tempfile.mkdtemp(prefix=TMP_PREFIX))
        self._share_node_mounts()
        echo = self.dir / "echo"
        _run(
            ["go", "build", "-trimpath", "-o", str(echo), "./echo"],
            "go build of the echo image's binary",
            timeout_s=300,
            cwd=MODULE_DIR,
            env={**os.environ, "CGO_ENABLED": "0"},
        )
        self._make_node_netns()
        self._write_pki()
        self._step("prepare", started)

        step = time.monotonic()
        with _thread_in_netns(self.netns_path):
            # Its directory inside the cluster's (a shared mount): a pod may mount the CRI socket's
            # directory with HostToContainer propagation, as hoptrace's agent does.
            self._containerd = PrivateContainerd(
                pods=[], bridge=BRIDGE, subnet=POD_SUBNET, parent=str(self.dir)
            ).start()
        self._write_cni_config()
        # The node's side of the pod bridge: the CNI bridge plugin adopts a bridge of its name as it is.
        _ip("link", "add", BRIDGE, "type", "bridge")
        bridge_ip = str(ipaddress.ip_network(POD_SUBNET)[1])
        _ip("addr", "add", f"{bridge_ip}/{ipaddress.ip_network(POD_SUBNET).prefixlen}", "dev", BRIDGE)
        _ip("link", "set", BRIDGE, "up")
        # ClusterIPs need a route for a connect() from the node to reach kube-proxy's DNAT; there is no
        # default route: nothing leaves the node's namespace.
        _ip("route", "add", SERVICE_RANGE, "dev", BRIDGE, "src", bridge_ip)
        archive = self.dir / "echo-image.tar"
        archive.write_bytes(oci_archive(ECHO_IMAGE, echo.read_bytes(), ["/echo"]))
        self.ctr("images", "import", str(archive))
        self._step("containerd", step)

        # The Docker images go in beside the control plane's start (disk and one core against its CPU).
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="docker-images") as importer:
            imported = (
                importer.submit(self.import_docker_images, self.docker_images) if self.docker_images else None
            )
            step = time.monotonic()
            self._start_control_plane()
            self._step("control plane", step)

            step = time.monotonic()
            self._start_node()
            wait_until(self._node_ready, f"node {NODE_NAME} Ready", timeout_s)
            wait_until(
                lambda: "-N KUBE-SERVICES" in self.node_iptables_nat(),
                "kube-proxy's first Service rules",
                timeout_s,
            )
            self._step("node ready", step)
            if imported is not None:  # on a failure above, the pool's exit waits for it before stop()
                self.timings["docker images"] = round(imported.result(), 2)
        self._step("total", started)

    def _share_node_mounts(self) -> None:
        """What a systemd host's mounts are and this VM's are not: shared. The kubelet refuses a pod's
        hostPath with mountPropagation HostToContainer whose source is on a private mount ('is mounted on "/"
        but it is not a shared or slave mount'). The cluster's directory (containerd's root, state and
        socket, the kubelet's) becomes a shared mount of its own; bpffs is mounted if it is not, and made
        shared while the cluster runs. /run/netns is shared already (ip netns makes it so)."""
        assert self.dir is not None
        _run(["mount", "--bind", str(self.dir), str(self.dir)], "mount --bind of the cluster's directory")
        _run(["mount", "--make-rshared", str(self.dir)], "mount --make-rshared of the cluster's directory")
        propagation = _mount_propagation(BPFFS)
        if propagation is None:
            _run(["mount", "-t", "bpf", "bpf", BPFFS], "mount of bpffs")
            propagation = _mount_propagation(BPFFS)
        if propagation == "private":
            _run(["mount", "--make-shared", BPFFS], "mount --make-shared of bpffs")
            self._bpffs_shared_here = True

    def _make_node_netns(self) -> None:
        _run(["ip", "netns", "add", NODE_NETNS], "ip netns add")
        _ip("link", "set", "lo", "up")
        # The node's address on its loopback device (this kernel has no dummy links); not a 127/8 one, which
        # the kubelet refuses as a node IP.
        _ip("addr", "add", f"{NODE_IP}/32", "dev", "lo")
        with _thread_in_netns(self.netns_path):
            Path("/proc/sys/net/ipv4/ip_forward").write_text("1\n")
            bridge_nf = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")
            if bridge_nf.exists():  # pod -> ClusterIP -> pod on one bridge passes kube-proxy's rules
                bridge_nf.write_text("1\n")

    def _write_cni_config(self) -> None:
        """The pods' network: the CRI lab's bridge and subnet, with the bridge's .1 as the pods' gateway for
        the Service range only, so a pod reaches a ClusterIP through kube-proxy's rules in the node's
        namespace (there is no default route). containerd uses the first file of its CNI directory (the CRI
        lab's DIR/cni) and reloads it when it changes; this one sorts before the CRI lab's own."""
        assert self._containerd is not None and self.dir is not None
        gateway = str(ipaddress.ip_network(POD_SUBNET)[1])
        config = {
            "cniVersion": "0.4.0",
            "name": "hoptrace-k8s-lab",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": True,
                    "ipMasq": False,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": POD_SUBNET, "gateway": gateway}]],
                        "routes": [{"dst": SERVICE_RANGE}],
                        "dataDir": str(self.dir / "cni-ipam"),
                    },
                }
            ],
        }
        conf_dir = Path(self._containerd.socket).parent / "cni"
        (conf_dir / "05-hoptrace-k8s-lab.conflist").write_text(json.dumps(config, indent=1))

    def _write_pki(self) -> None:
        assert self.dir is not None
        pki = self._pki = ClusterPki(self.dir / "pki")
        service_ip = str(ipaddress.ip_network(SERVICE_RANGE)[1])
        pki.issue(
            "apiserver",
            "kube-apiserver",
            hosts=[
                NODE_IP,
                service_ip,
                "127.0.0.1",
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ],
        )
        pki.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client", ["system:masters"])
        pki.issue("kubelet-serving", f"system:node:{NODE_NAME}", ["system:nodes"], hosts=[NODE_IP, NODE_NAME])
        pki.service_account_key()
        pki.kubeconfig("admin", "kubernetes-admin", ["system:masters"])
        pki.kubeconfig("controller-manager", "system:kube-controller-manager")
        pki.kubeconfig("scheduler", "system:kube-scheduler")
        pki.kubeconfig("kubelet", f"system:node:{NODE_NAME}", ["system:nodes"])
        pki.kubeconfig("kube-proxy", "system:kube-proxy")

    def _spawn(self, name: str, argv: Sequence[str]) -> Component:
        assert self.dir is not None
        log = self.dir / "logs" / f"{name}.log"
        log.parent.mkdir(exist_ok=True)
        with open(log, "wb") as out, _thread_in_netns(self.netns_path):
            process = subprocess.Popen(
                [str(self.bin / name), *argv],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C to the tests' process group must not skip stop()
                preexec_fn=_die_with_parent,
            )
        component = Component(name, process, log)
        self._components.append(component)
        return component

    def _alive(self, component: Component) -> None:
        if component.process.poll() is not None:
            raise KubernetesLabError(
                f"{component.name} exited with {component.process.returncode}:\n{component.tail()}"
            )

    def _start_control_plane(self) -> None:
        assert self.dir is not None
        d, pki = self.dir, self.dir / "pki"
        etcd = self._spawn(
            "etcd",
            [
                *("--name", "lab", "--data-dir", str(d / "etcd")),
                *(
                    "--listen-client-urls",
                    "http://127.0.0.1:2379",
                    "--advertise-client-urls",
                    "http://127.0.0.1:2379",
                ),
                *("--listen-peer-urls", "http://127.0.0.1:2380"),
                *("--initial-advertise-peer-urls", "http://127.0.0.1:2380"),
                *("--initial-cluster", "lab=http://127.0.0.1:2380", "--log-level", "warn"),
            ],
        )
        apiserver = self._spawn(
            "kube-apiserver",
            [
                "--etcd-servers=http://127.0.0.1:2379",
                f"--bind-address={NODE_IP}",
                f"--advertise-address={NODE_IP}",
                "--secure-port=6443",
                f"--service-cluster-ip-range={SERVICE_RANGE}",
                f"--client-ca-file={pki / 'ca.pem'}",
                f"--tls-cert-file={pki / 'apiserver.pem'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.pem'}",
                f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
                f"--kubelet-certificate-authority={pki / 'ca.pem'}",
                "--kubelet-preferred-address-types=InternalIP",  # the node's name resolves nowhere
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",
                "--allow-privileged=true",
                f"--cert-dir={d / 'apiserver'}",
                "--profiling=false",
            ],
        )

        def api_ready() -> bool:
            self._alive(etcd)
            self._alive(apiserver)
            result = self.kubectl_run(["get", "--raw", "/readyz"], check=False)
            return result.returncode == 0 and result.stdout.strip() == "ok"

        wait_until(api_ready, "kube-apiserver /readyz", 120)
        for name, extra in (
            (
                "kube-controller-manager",
                [
                    f"--service-account-private-key-file={pki / 'sa.key'}",
                    f"--root-ca-file={pki / 'ca.pem'}",
                    "--use-service-account-credentials=true",
                    f"--service-cluster-ip-range={SERVICE_RANGE}",
                ],
            ),
            ("kube-scheduler", []),
        ):
            kubeconfig = pki / f"{name.removeprefix('kube-')}.kubeconfig"
            self._spawn(
                name,
                [
                    f"--kubeconfig={kubeconfig}",
                    f"--authentication-kubeconfig={kubeconfig}",
                    f"--authorization-kubeconfig={kubeconfig}",
                    "--leader-elect=false",
                    "--bind-address=127.0.0.1",
                    *extra,
                ],
            )

    def _start_node(self) -> None:
        assert self.dir is not None and self._containerd is not None
        d, pki = self.dir, self.dir / "pki"
        kubelet_config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": NODE_IP,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": str(pki / "ca.pem")},
            },
            "authorization": {"mode": "AlwaysAllow"},
            "tlsCertFile": str(pki / "kubelet-serving.pem"),
            "tlsPrivateKeyFile": str(pki / "kubelet-serving.key"),
            "containerRuntimeEndpoint": f"unix://{self._containerd.socket}",
            # containerd 1.6 here runs runc with cgroupfs paths (no systemd on this host); the per-QoS
            # hierarchy and node-allocatable enforcement are off: a lab node, not one to share with
            # other workloads.
            "cgroupDriver": "cgroupfs",
            "cgroupsPerQOS": False,
            "enforceNodeAllocatable": ["none"],
            "failSwapOn": False,
            "makeIPTablesUtilChains": False,
            "podLogsDir": str(d / "pod-logs"),
            "podCIDR": POD_SUBNET,
            "clusterDomain": "cluster.local",
            "resolvConf": "",
            "registerNode": True,
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
            "serializeImagePulls": False,
        }
        config = d / "kubelet.yaml"
        config.write_text(json.dumps(kubelet_config, indent=1))
        self._spawn(
            "kubelet",
            [
                f"--config={config}",
                f"--kubeconfig={pki / 'kubelet.kubeconfig'}",
                f"--root-dir={d / 'kubelet'}",
                f"--hostname-override={NODE_NAME}",
                f"--node-ip={NODE_IP}",
            ],
        )
        proxy_config = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(pki / "kube-proxy.kubeconfig")},
            "mode": "iptables",
            "hostnameOverride": NODE_NAME,
            "bindAddress": NODE_IP,
            "clusterCIDR": POD_SUBNET,
            "healthzBindAddress": "127.0.0.1:10256",
            "metricsBindAddress": "127.0.0.1:10249",
            # 0: leave the host's conntrack table sizes and timeouts as they are.
            "conntrack": {
                "maxPerCore": 0,
                "min": 0,
                "tcpEstablishedTimeout": "0s",
                "tcpCloseWaitTimeout": "0s",
            },
            "iptables": {"localhostNodePorts": False},  # else it sets route_localnet
        }
        config = d / "kube-proxy.yaml"
        config.write_text(json.dumps(proxy_config, indent=1))
        self._spawn("kube-proxy", [f"--config={config}"])

    def _node_ready(self) -> bool:
        for component in self._components:
            self._alive(component)
        result = self.kubectl_run(
            ["get", "node", NODE_NAME, "-o", 'jsonpath={.status.conditions[?(@.type=="Ready")].status}'],
            check=False,
        )
        return result.stdout.strip() == "True"

    # -- using it ------------------------------------------------------------------------------------

    def kubectl_run(
        self, args: Sequence[str], input: str | None = None, check: bool = True, timeout_s: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        """kubectl as the cluster's admin, run in the node's namespace (where the API server listens)."""
        with _thread_in_netns(self.netns_path):
            result = subprocess.run(
                [str(self.bin / "kubectl"), f"--kubeconfig={self.admin_kubeconfig}", *args],
                input=input,
                capture_output=True,
                text=True,
                timeout=scaled(timeout_s),
            )
        if check and result.returncode != 0:
            raise KubernetesLabError(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
        return result

    def exec_in_pod(
        self, namespace: str, pod: str, argv: Sequence[str], stdin: bytes, timeout_s: float = 60.0
    ) -> bytes:
        """`kubectl exec -i` of `argv` in `pod` with `stdin`: its standard output, byte for byte."""
        with _thread_in_netns(self.netns_path):
            result = subprocess.run(
                [
                    str(self.bin / "kubectl"),
                    f"--kubeconfig={self.admin_kubeconfig}",
                    "-n",
                    namespace,
                    "exec",
                    "-i",
                    pod,
                    "--",
                    *argv,
                ],
                input=stdin,
                capture_output=True,
                timeout=scaled(timeout_s),
            )
        if result.returncode != 0:
            raise KubernetesLabError(
                f"kubectl exec {pod} -- {' '.join(argv)}: {result.stderr.decode(errors='replace')}"
            )
        return result.stdout

    def kubectl(self, *args: str, input: str | None = None) -> str:
        """kubectl's output; KubernetesLabError with its message when it fails."""
        return self.kubectl_run(args, input=input).stdout

    def apply(self, manifest: dict[str, object] | list[dict[str, object]]) -> str:
        """`kubectl apply` of one object or a list of them."""
        items = manifest if isinstance(manifest, list) else [manifest]
        return self.kubectl(
            "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
        )

    def ctr(self, *args: str) -> str:
        """`ctr` on the private containerd, in the CRI's namespace (k8s.io)."""
        assert self._containerd is not None
        return _run(["ctr", "--address", self._containerd.socket, "-n", "k8s.io", *args], "ctr")

    @property
    def cri_socket(self) -> str:
        """The node's CRI socket (the private containerd's): what a node's agent names pods through."""
        assert self._containerd is not None
        return self._containerd.socket

    def import_docker_images(self, images: Sequence[str], timeout_s: float = 300.0) -> float:
        """`docker save` of `images` from the Docker engine (the compose tier builds hoptrace's) streamed into
        `ctr images import` on the node's containerd: how images reach the cluster without a registry. Pods
        name them as Docker does (hoptrace/agent:local is docker.io/hoptrace/agent:local to both). Returns
        the seconds it took."""
        assert self._containerd is not None
        started = time.monotonic()
        save = subprocess.Popen(
            ["docker", "save", *images],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            result = subprocess.run(
                ["ctr", "--address", self._containerd.socket, "-n", "k8s.io", "images", "import", "-"],
                stdin=save.stdout,
                capture_output=True,
                text=True,
                timeout=scaled(timeout_s),
            )
        finally:
            assert save.stdout is not None and save.stderr is not None
            save.stdout.close()
            try:
                save.wait(timeout=scaled(timeout_s))
            except subprocess.TimeoutExpired:
                save.kill()
                save.wait()
            saved = save.stderr.read().decode(errors="replace")
            save.stderr.close()
        if save.returncode != 0:
            raise KubernetesLabError(f"docker save {' '.join(images)} failed ({save.returncode}): {saved}")
        if result.returncode != 0:
            raise KubernetesLabError(
                f"ctr images import failed ({result.returncode}): {result.stderr[-3000:]}"
            )
        listed = set(self.ctr("images", "list", "--quiet").split())
        missing = [i for i in images if _docker_reference(i) not in listed]
        if missing:
            raise KubernetesLabError(
                f"ctr images import did not make {missing}; containerd has {sorted(listed)}"
            )
        return time.monotonic() - started

    def helm(self, *args: str, timeout_s: float = 300.0) -> str:
        """helm (`make helm`) as the cluster's admin, in the node's namespace, its configuration, cache and
        data in the cluster's directory; its output, KubernetesLabError with its message when it fails."""
        assert self.dir is not None
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.dir)}
        for kind in ("CONFIG", "CACHE", "DATA"):
            env[f"HELM_{kind}_HOME"] = str(self.dir / "helm" / kind.lower())
        argv = [str(helm_binary()), f"--kubeconfig={self.admin_kubeconfig}", *args]
        with _thread_in_netns(self.netns_path):
            result = subprocess.run(argv, capture_output=True, text=True, timeout=scaled(timeout_s), env=env)
        if result.returncode != 0:
            raise KubernetesLabError(
                f"helm {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}"
            )
        return result.stdout

    def run_on_node(
        self, argv: Sequence[str], env: dict[str, str] | None = None, timeout_s: float = 120.0
    ) -> subprocess.CompletedProcess[str]:
        """A command in the node's network namespace (a client there reaches ClusterIPs and pod IPs)."""
        with _thread_in_netns(self.netns_path):
            return subprocess.run(
                list(argv), capture_output=True, text=True, timeout=scaled(timeout_s), env=env, check=False
            )

    def node_socket(self, family: int, type_: int) -> socket.socket:
        """A socket in the node's network namespace (a client on the node, as kube-proxy's rules see it)."""
        return socket_in_netns(self.netns_path, family, type_)

    def node_iptables_nat(self) -> str:
        """`iptables -t nat -S` in the node's namespace: kube-proxy's Service rules."""
        return _run(["ip", "netns", "exec", NODE_NETNS, "iptables", "-t", "nat", "-S"], "iptables -t nat -S")

    def sysctls_before(self) -> dict[str, str]:
        """The host's kernel settings the kubelet changes, as before start (stop() restores them)."""
        return dict(self._sysctls)

    def logs(self) -> str:
        """The last lines of every component's output, for a failed test's message."""
        return "\n".join(f"--- {c.name} ---\n{c.tail(1500)}" for c in self._components)

    # -- stop ----------------------------------------------------------------------------------------

    def stop(self, timeout_s: float = 60.0) -> None:
        """Remove everything the cluster made; KubernetesLabError naming what could not be removed."""
        problems: list[str] = []
        # The node first (its pods go with containerd below), the control plane last.
        order = ["kube-proxy", "kubelet", "kube-scheduler", "kube-controller-manager"]
        for name in order:
            for component in [c for c in self._components if c.name == name]:
                problems += self._terminate(component, timeout_s)
        if self._containerd is not None:
            # Every sandbox and container id, to find their cgroups once containerd is gone.
            with contextlib.suppress(KubernetesLabError):
                self._container_ids.update(self.ctr("containers", "list", "--quiet").split())
            try:
                self._containerd.stop()
            except Exception as err:  # noqa: BLE001 - reported with everything else that failed
                problems.append(str(err))
            self._containerd = None
        for component in reversed([c for c in self._components if c.name not in order]):
            problems += self._terminate(component, timeout_s)
        self._components.clear()
        for pid in _pids_in_netns():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self.dir is not None:
            problems += _unmount_under([str(self.dir)])
            shutil.rmtree(self.dir, ignore_errors=True)
            if self.dir.exists():
                problems.append(f"{self.dir} not removed")
            self.dir = None
        if Path(self.netns_path).exists():
            result = subprocess.run(["ip", "netns", "del", NODE_NETNS], capture_output=True, text=True)
            if result.returncode != 0:
                problems.append(f"ip netns del {NODE_NETNS}: {result.stderr.strip()}")
        problems += _remove_cgroups(self._container_ids, self._cgroup_parents_before)
        self._container_ids = set()
        problems += self._remove_log_links()
        for key, value in self._sysctls.items():
            try:
                Path("/proc/sys", key).write_text(value + "\n")
            except OSError as err:
                problems.append(f"sysctl {key}={value}: {err}")
        self._sysctls = {}
        remove_node_pins()  # an agent killed with the node leaves its pins
        problems += [f"{path} not unpinned" for path in node_pins()]
        if self._bpffs_shared_here:
            result = subprocess.run(["mount", "--make-private", BPFFS], capture_output=True, text=True)
            if result.returncode != 0:
                problems.append(f"mount --make-private {BPFFS}: {result.stderr.strip()}")
            self._bpffs_shared_here = False
        if self._lock is not None:
            os.close(self._lock)  # the lock goes with it
            self._lock = None
        if problems:
            raise KubernetesLabError("the lab cluster was not removed completely:\n" + "\n".join(problems))

    def _terminate(self, component: Component, timeout_s: float) -> list[str]:
        process = component.process
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=scaled(timeout_s) / 4)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        # Whatever it started in its session (a kubelet's mount helpers) goes with it.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        return []

    def _remove_log_links(self) -> list[str]:
        if not self._log_links_read or not CONTAINER_LOG_LINKS.is_dir():
            return []
        self._log_links_read = False
        before = self._log_links_before
        for link in CONTAINER_LOG_LINKS.iterdir():
            if (before is None or link.name not in before) and link.is_symlink():
                link.unlink()
        if before is None:
            try:
                CONTAINER_LOG_LINKS.rmdir()
            except OSError as err:
                return [f"{CONTAINER_LOG_LINKS}: {err}"]
        return []

    def __enter__(self) -> KubernetesLab:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
