"""The local compose stack (deploy/local/): the Docker engine, the Debian base image, the images, the stack.

On a machine that reaches no image registry every image is built from a base made here
(`debootstrap --variant=minbase` + `docker import`) and from artifacts the Makefile already built (the
agent's static binary, influxd, wheels of the Python package, web/node_modules, kernel-patch/), staged into
one build context.

The engine: `DockerEngine.ensure()` starts `dockerd` when none answers, with its default bridge and address
pool inside 198.18.0.0/15 and `--iptables=false` (measured: containers on one compose bridge talk to each
other, published ports work through docker-proxy, and the root namespace's FORWARD policy and ip_forward
stay as they were); `stop()` stops only a dockerd it started, and removes the docker0 bridge it left.

    python -m hoptrace.lab.compose base      # the base image (about a minute, once)
    python -m hoptrace.lab.compose images    # base + stage + docker-compose build
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from hoptrace.lab.bpfstate import remove_agent_state

REPO = Path(os.environ.get("HOPTRACE_REPO") or Path(__file__).resolve().parent.parent)
COMPOSE_FILE = REPO / "deploy" / "local" / "docker-compose.yml"
KAFKA_OVERRIDE = COMPOSE_FILE.parent / "docker-compose.kafka.yml"  # agents -> Kafka -> a collector group
DOCKERFILE = REPO / "deploy" / "local" / "Dockerfile"
STATE = REPO / ".tools" / "compose"  # this tier's tool state: base rootfs, build context, dockerd log
CONTEXT = STATE / "context"
KAFKA_LIBS = REPO / ".tools" / "kafka" / "libs"  # `make kafka`
MARKER = STATE / "dockerd.json"  # the dockerd this module started: PID, start time, the host's settings
# Debian's docker-compose (1.29.2 on docker-py 5): the PyPI one in .tools/compose-venv validates files,
# but docker-py 7 there no longer talks to an engine with compose 1.29 (kwargs_from_env lost ssl_version).
DOCKER_COMPOSE = Path("/usr/bin/docker-compose")
PROJECT = "hoptrace-local"
BASE_IMAGE = "hoptrace/debian:bookworm"
IMAGES = (
    "hoptrace/influxd:local",
    "hoptrace/python:local",
    "hoptrace/dispatcher:local",
    "hoptrace/agent:local",
)

# dockerd's own networks, inside the benchmarking range 198.18.0.0/15 (RFC 2544) like every test network
# here; the compose file's networks are 198.19.249.0/24 (control) and 198.19.250.0/24 (apps).
DOCKERD_FLAGS = (
    "--bip=198.19.248.1/24",
    "--default-address-pool=base=198.19.252.0/22,size=24",
    # No NAT or FORWARD rules: with iptables on, dockerd sets the root namespace's FORWARD policy to DROP,
    # which other tests forwarding through the root namespace would feel.
    "--iptables=false",
    "--ip-forward=false",
    "--ip-masq=false",
)


class ComposeError(RuntimeError):
    """A docker, dockerd, debootstrap or docker-compose step failed; the message has its own output."""


def run(
    argv: Sequence[str], timeout_s: float = 600.0, check: bool = True, **kwargs
) -> subprocess.CompletedProcess[str]:
    """Run a command, capture its output; ComposeError with the output's tail when `check` and it fails."""
    try:
        result = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s, **kwargs)
    except FileNotFoundError as error:
        raise ComposeError(f"{argv[0]} is missing: run `make setup`") from error
    except subprocess.TimeoutExpired as error:
        raise ComposeError(f"{' '.join(map(str, argv))} took longer than {timeout_s:.0f} s") from error
    if check and result.returncode != 0:
        output = (result.stdout + result.stderr)[-4000:]
        raise ComposeError(f"{' '.join(map(str, argv))} exited with {result.returncode}:\n{output}")
    return result


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


# The root namespace's settings dockerd could change; `HostState` compares them before and after.
HOST_SETTINGS = (
    "/proc/sys/net/ipv4/ip_forward",
    "/proc/sys/net/ipv6/conf/all/forwarding",
    "/proc/sys/net/bridge/bridge-nf-call-iptables",
    "/proc/sys/net/bridge/bridge-nf-call-ip6tables",
)


@dataclass
class HostState:
    """The root namespace's forwarding sysctls and iptables filter FORWARD policy, to restore and compare."""

    sysctls: dict[str, str]
    forward_policy: str

    @classmethod
    def capture(cls) -> HostState:
        """The settings as they are now."""
        return cls({path: _read(path) for path in HOST_SETTINGS}, _forward_policy())

    def restore(self) -> list[str]:
        """Put back every setting that differs; returns what was put back."""
        changed = []
        for path, value in self.sysctls.items():
            if value and _read(path) != value:
                Path(path).write_text(value)
                changed.append(f"{path}={value}")
        if self.forward_policy and _forward_policy() != self.forward_policy:
            run(["iptables", "-P", "FORWARD", self.forward_policy], check=False)
            changed.append(f"iptables FORWARD policy {self.forward_policy}")
        return changed


def _forward_policy() -> str:
    """The filter table's FORWARD policy ('' when iptables is absent or has no filter table)."""
    if shutil.which("iptables") is None:
        return ""
    result = run(["iptables", "-S", "FORWARD"], check=False, timeout_s=30)
    for line in result.stdout.splitlines():
        if line.startswith("-P FORWARD "):
            return line.split()[2]
    return ""


@dataclass
class DockerEngine:
    """dockerd: used as it is when it answers, else started here (and then stopped by `stop`)."""

    log_path: Path = STATE / "dockerd.log"
    process: subprocess.Popen[bytes] | None = None
    pid: int | None = None
    host_state: HostState | None = None
    had_docker0: bool = True
    started_s: float = 0.0

    def answers(self) -> bool:
        """Whether a Docker engine answers on the default socket."""
        return (
            run(["docker", "info", "--format", "{{.ServerVersion}}"], check=False, timeout_s=30).returncode
            == 0
        )

    def ensure(self, timeout_s: float = 60.0) -> DockerEngine:
        """Start dockerd unless one answers; wait until it does. An engine a killed run of this module
        started (its marker file says so) is taken over, to be stopped by `stop`."""
        if self.answers():
            self._adopt()
            return self
        if shutil.which("dockerd") is None:
            raise ComposeError("dockerd is missing: run `make setup` (Debian package docker.io)")
        self.host_state = HostState.capture()
        self.had_docker0 = Path("/sys/class/net/docker0").exists()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        start = time.monotonic()
        with open(self.log_path, "ab") as log:
            # Its own session: a Ctrl-C to the tests must not stop it before the stack is down.
            self.process = subprocess.Popen(
                ["dockerd", *DOCKERD_FLAGS], stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.pid = self.process.pid
        MARKER.write_text(
            json.dumps(
                {
                    "pid": self.pid,
                    "start": _start_time(self.pid),
                    "had_docker0": self.had_docker0,
                    "sysctls": self.host_state.sysctls,
                    "forward_policy": self.host_state.forward_policy,
                }
            )
        )
        deadline = time.monotonic() + timeout_s
        while not self.answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                tail = self.log_path.read_text(errors="replace")[-3000:]
                self.stop()
                raise ComposeError(f"dockerd did not start; its log ({self.log_path}):\n{tail}")
            time.sleep(0.2)
        self.started_s = time.monotonic() - start
        return self

    def _adopt(self) -> None:
        """Take over the running dockerd if the marker names it (same PID and start time)."""
        with contextlib.suppress(OSError, ValueError, KeyError):
            marker = json.loads(MARKER.read_text())
            if marker["start"] and _start_time(marker["pid"]) == marker["start"]:
                self.pid = marker["pid"]
                self.had_docker0 = marker["had_docker0"]
                self.host_state = HostState(marker["sysctls"], marker["forward_policy"])

    @property
    def started_here(self) -> bool:
        """Whether `ensure` started the engine, or took over one a killed run started (`stop` stops it)."""
        return self.pid is not None

    def stop(self, timeout_s: float = 30.0) -> list[str]:
        """Stop the dockerd started here (nothing else), remove its docker0 bridge, restore the host's
        forwarding settings; returns the settings that had to be restored."""
        if self.pid is None:
            return []
        if self.process is not None:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGTERM)
                try:
                    self.process.wait(timeout_s)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait(10)
        else:  # taken over: not our child, so wait for its /proc entry to go
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout_s
            while Path(f"/proc/{self.pid}").exists() and time.monotonic() < deadline:
                time.sleep(0.2)
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        self.process = None
        self.pid = None
        MARKER.unlink(missing_ok=True)
        if not self.had_docker0 and Path("/sys/class/net/docker0").exists():
            run(["ip", "link", "del", "docker0"], check=False, timeout_s=30)
        return self.host_state.restore() if self.host_state else []


def _start_time(pid: int) -> str:
    """The start time of process `pid` (field 22 of /proc/PID/stat): with the PID, names one process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[19]


def image_exists(name: str) -> bool:
    """Whether the engine has image `name`."""
    return run(["docker", "image", "inspect", name], check=False, timeout_s=60).returncode == 0


def debian_mirror() -> str:
    """The Debian archive URI this machine's apt uses (deb822 sources or one-line lists)."""
    sources = sorted(Path("/etc/apt/sources.list.d").glob("*")) + [Path("/etc/apt/sources.list")]
    for path in sources:
        text = _read(str(path))
        for line in text.splitlines():
            words = line.split()
            if words[:1] == ["URIs:"] and len(words) > 1 and "security" not in words[1]:
                return words[1]
            if words[:1] == ["deb"] and len(words) > 2 and "security" not in line:
                uri = next(w for w in words[1:] if "://" in w)
                return uri
    raise ComposeError("no Debian mirror in /etc/apt/sources.list.d or /etc/apt/sources.list")


def build_base_image(name: str = BASE_IMAGE, suite: str = "bookworm") -> bool:
    """debootstrap a minimal Debian into STATE/rootfs and `docker import` it as `name`, unless the engine
    has it; True when it was built."""
    if image_exists(name):
        return False
    rootfs = STATE / "rootfs"
    shutil.rmtree(rootfs, ignore_errors=True)
    rootfs.parent.mkdir(parents=True, exist_ok=True)
    mirror = debian_mirror()
    print(f"debootstrap --variant=minbase {suite} from {mirror} (about a minute, once)", flush=True)
    run(["debootstrap", "--variant=minbase", suite, str(rootfs), mirror], timeout_s=1200)
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    try:
        run(["docker", "import", "-", name], stdin=tar.stdout, timeout_s=600)
    finally:
        if tar.stdout:
            tar.stdout.close()
        tar.wait()
    shutil.rmtree(rootfs, ignore_errors=True)
    return True


KAFKA_IMAGE = "hoptrace/kafka:local"


def build_kafka_image() -> float:
    """The Kafka override's broker image (deploy/local/Dockerfile, targets base and kafka: Debian's headless
    Java 17 and the jars of `make kafka`), from a context of just those; returns the seconds it took. Its own
    context: Debian's Docker (no buildx) builds every stage before the target, and the others need the whole
    staged context (`make compose-images`)."""
    if not (KAFKA_LIBS / ".stamp").exists():
        raise ComposeError(f"{KAFKA_LIBS} is missing: run `make kafka`")
    start = time.monotonic()
    build_base_image()
    stages = DOCKERFILE.read_text().split("\nFROM ")
    kept = [
        stages[0],
        *(st for st in stages[1:] if st.startswith(("${BASE_IMAGE} AS base", "base AS kafka"))),
    ]
    if len(kept) != 3:
        raise ComposeError(f"{DOCKERFILE}: no base and kafka stages")
    with tempfile.TemporaryDirectory(prefix="hoptrace-kafka-image-") as context:
        (Path(context) / "Dockerfile").write_text("\nFROM ".join(kept))
        shutil.copytree(KAFKA_LIBS, Path(context) / "kafka-libs", ignore=shutil.ignore_patterns(".stamp"))
        shutil.copy2(REPO / "deploy" / "local" / "kafka-broker.sh", Path(context) / "kafka-broker.sh")
        base = os.environ.get("HOPTRACE_BASE_IMAGE", BASE_IMAGE)
        build = [
            "docker",
            "build",
            "--network",
            "host",
            "--target",
            "kafka",
            "--build-arg",
            f"BASE_IMAGE={base}",
        ]
        run([*build, "-t", KAFKA_IMAGE, context], timeout_s=900)
    return time.monotonic() - start


# The generic CO-RE objects the agent's presets load (discover, mace, iron; `make bpf`): in the agent image.
AGENT_OBJECTS = [REPO / "kernel-patch" / "build" / f"{name}.bpf.o" for name in ("hoptrace", "mace", "iron")]


def stage_context(python: str = sys.executable) -> Path:
    """The build context of deploy/local/Dockerfile: the Dockerfile, the agent binary and its preset objects
    (bpf/), influxd, wheels of
    hoptrace and its dependencies, web/node_modules, kernel-patch/ sources, influxdb.conf; for the Kafka
    override's broker image, the jars of `make kafka` (kafka-libs/) and kafka-broker.sh when they exist."""
    agent = REPO / "agent" / "bin" / "hoptrace-agent"
    influxd = REPO / ".tools" / "bin" / "influxd"
    node_modules = REPO / "web" / "node_modules"
    needs = [(agent, "make agent"), (influxd, "make setup"), (node_modules, "make setup")]
    needs += [(obj, "make bpf") for obj in AGENT_OBJECTS]
    for needed, make in needs:
        if not needed.exists():
            raise ComposeError(f"{needed} is missing: run `{make}`")
    CONTEXT.mkdir(parents=True, exist_ok=True)
    for name in (
        "hoptrace-agent",
        "influxd",
        "node_modules",
        "kernel-patch",
        "kafka-libs",
        "kafka-broker.sh",
        "bpf",
    ):
        target = CONTEXT / name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        else:
            target.unlink(missing_ok=True)
    shutil.copy2(DOCKERFILE, CONTEXT / "Dockerfile")
    shutil.copy2(REPO / "deploy" / "local" / "influxdb.conf", CONTEXT / "influxdb.conf")
    shutil.copy2(agent, CONTEXT / "hoptrace-agent")
    (CONTEXT / "bpf").mkdir()
    for obj in AGENT_OBJECTS:
        shutil.copy2(obj, CONTEXT / "bpf" / obj.name)
    shutil.copy2(influxd.resolve(), CONTEXT / "influxd")
    shutil.copytree(node_modules, CONTEXT / "node_modules", symlinks=False)
    # Sources only: vmlinux.h comes from the BTF of the kernel the dispatcher runs on.
    shutil.copytree(REPO / "kernel-patch", CONTEXT / "kernel-patch", ignore=shutil.ignore_patterns("build"))
    if KAFKA_LIBS.is_dir():
        shutil.copytree(KAFKA_LIBS, CONTEXT / "kafka-libs", ignore=shutil.ignore_patterns(".stamp"))
        shutil.copy2(REPO / "deploy" / "local" / "kafka-broker.sh", CONTEXT / "kafka-broker.sh")
    wheels = CONTEXT / "wheels"
    shutil.rmtree(wheels, ignore_errors=True)
    # The source tree's wheel and its dependencies' (cached by pip; the PyPI index at first).
    run([python, "-m", "pip", "wheel", "-q", "--wheel-dir", str(wheels), str(REPO)], cwd=REPO, timeout_s=900)
    return CONTEXT


def compose_command(*args: str, kafka: bool = False, project: str = PROJECT) -> list[str]:
    """docker-compose on the local compose file, project hoptrace-local (or `project`); with `kafka`, its
    Kafka override (deploy/local/docker-compose.kafka.yml) on top."""
    if not DOCKER_COMPOSE.exists():
        raise ComposeError(f"{DOCKER_COMPOSE} is missing: run `make setup` (Debian package docker-compose)")
    # docker-compose checks every service's build path on any command, `down` too; a clean clone whose
    # images are cached (same engine, same inputs) has not staged the context.
    CONTEXT.mkdir(parents=True, exist_ok=True)
    files = ["-f", str(COMPOSE_FILE), *(["-f", str(KAFKA_OVERRIDE)] if kafka else [])]
    return [str(DOCKER_COMPOSE), *files, "-p", project, *args]


def compose_env(**settings: str) -> dict[str, str]:
    """The environment docker-compose reads the file's ${HOPTRACE_*} settings from."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("HOPTRACE_")}
    env.update(settings)
    return env


# What goes into the images besides the base: a digest of it labels them, so an unchanged tree rebuilds
# nothing (not even the staging).
INPUT_LABEL = "org.hoptrace.inputs"
PYTHON_SOURCES = (
    "pyproject.toml",
    "README.md",
    "proto/gen/python",
    "cli",
    "common",
    "dispatcher",
    "lab",
    "collector",
    "results",
    "spec",
    "web",
)


def inputs_digest() -> str:
    """sha256 over the Dockerfile, influxdb.conf, the agent and influxd binaries, the agent's preset objects,
    the Python package's sources, web/node_modules and kernel-patch/ sources."""
    paths = [DOCKERFILE, COMPOSE_FILE.parent / "influxdb.conf", REPO / "agent" / "bin" / "hoptrace-agent"]
    paths += AGENT_OBJECTS
    paths.append((REPO / ".tools" / "bin" / "influxd").resolve())
    for top in (*PYTHON_SOURCES, "kernel-patch"):
        root = REPO / top
        if root.is_file():
            paths.append(root)
            continue
        for path in sorted(root.rglob("*")):
            parts = set(path.relative_to(REPO).parts)
            if path.is_file() and not parts & {"__pycache__", "build", ".pytest_cache"}:
                paths.append(path)
    digest = hashlib.sha256()
    for path in paths:
        digest.update(str(path.relative_to(REPO) if path.is_relative_to(REPO) else path.name).encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:32]


def image_label(image: str, label: str) -> str:
    """The value of `label` on `image` ('' when the image or the label is absent)."""
    result = run(
        ["docker", "image", "inspect", "-f", f'{{{{index .Config.Labels "{label}"}}}}', image], check=False
    )
    return result.stdout.strip() if result.returncode == 0 else ""


def build_images() -> float:
    """Base image, staged context, `docker-compose build` of every image, unless every image already
    carries the digest of today's inputs; returns the seconds it took."""
    start = time.monotonic()
    build_base_image()
    digest = inputs_digest()
    if all(image_label(image, INPUT_LABEL) == digest for image in IMAGES):
        return time.monotonic() - start
    stage_context()
    base = os.environ.get("HOPTRACE_BASE_IMAGE", BASE_IMAGE)
    run(
        compose_command("build"),
        env=compose_env(HOPTRACE_NODE="build", HOPTRACE_BASE_IMAGE=base, HOPTRACE_INPUTS_DIGEST=digest),
        timeout_s=1800,
    )
    stale = [image for image in IMAGES if image_label(image, INPUT_LABEL) != digest]
    if stale:
        raise ComposeError(f"docker-compose build did not make {stale} from today's inputs")
    return time.monotonic() - start


# ---- the stack --------------------------------------------------------------------------------------------

CONTROL_SERVICES = ("influxdb", "dispatcher", "collector", "web")
APP_SERVICES = ("app-a", "app-b")
APP_ADDRESSES = {"app-a": "198.19.250.10", "app-b": "198.19.250.11"}  # deploy/local/docker-compose.yml
APPS_BRIDGE = "ht-apps0"
WEB_UID = 10001  # the images' hoptrace user: it reads the mounted certificates


def _free_port(kind: int = socket.SOCK_STREAM) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mount_kernel_filesystems() -> None:
    """bpffs and tracefs where the agent's container expects the host's (idempotent), and /run/netns."""
    for fstype, target in (("bpf", "/sys/fs/bpf"), ("tracefs", "/sys/kernel/tracing")):
        if run(["mountpoint", "-q", target], check=False, timeout_s=30).returncode != 0:
            run(["mount", "-t", fstype, fstype, target], timeout_s=30)
    Path("/run/netns").mkdir(parents=True, exist_ok=True)


def bpf_ids_held_by(pid: int) -> tuple[set[int], set[int]]:
    """(link IDs, program IDs) of the BPF fds process `pid` holds (its /proc/PID/fdinfo)."""
    links, programs = set(), set()
    for info in Path(f"/proc/{pid}/fdinfo").glob("*"):
        with contextlib.suppress(OSError):
            for line in info.read_text().splitlines():
                key, _, value = line.partition(":")
                if key == "link_id":
                    links.add(int(value))
                elif key == "prog_id":
                    programs.add(int(value))
    return links, programs


def bpf_ids_alive() -> tuple[set[int], set[int]]:
    """(link IDs, program IDs) the kernel has now."""
    links = json.loads(run(["bpftool", "-j", "link", "show"], timeout_s=60).stdout or "[]")
    programs = json.loads(run(["bpftool", "-j", "prog", "show"], timeout_s=60).stdout or "[]")
    return {link["id"] for link in links}, {prog["id"] for prog in programs}


def netns_inodes_in_use() -> set[int]:
    """Inodes of every network namespace a process is in."""
    inodes = set()
    for ns in Path("/proc").glob("[0-9]*/ns/net"):
        with contextlib.suppress(OSError):
            inodes.add(ns.stat().st_ino)
    return inodes


@dataclass
class ComposeStack:
    """The local compose stack for one node: certificates, free loopback ports, up, down, and what it
    left behind. Every port is published on 127.0.0.1 only."""

    workdir: Path
    node: str = "compose-node"
    web_password: str = field(default_factory=lambda: secrets.token_urlsafe(12))
    ports: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.certs = self.workdir / "certs"
        self.ports = self.ports or {
            "HOPTRACE_DISPATCHER_PORT": str(_free_port()),
            "HOPTRACE_COLLECTOR_PORT": str(_free_port()),
            "HOPTRACE_CLOCK_PORT": str(_free_port(socket.SOCK_DGRAM)),
            "HOPTRACE_WEB_PORT": str(_free_port()),
            "HOPTRACE_INFLUX_PORT": str(_free_port()),
            "HOPTRACE_AGENT_METRICS": f"127.0.0.1:{_free_port()}",
        }

    @property
    def dispatcher(self) -> str:
        """The dispatcher's published address."""
        return f"127.0.0.1:{self.ports['HOPTRACE_DISPATCHER_PORT']}"

    @property
    def web_url(self) -> str:
        """The web UI's published URL."""
        return f"http://127.0.0.1:{self.ports['HOPTRACE_WEB_PORT']}"

    def env(self) -> dict[str, str]:
        """docker-compose's environment for this stack."""
        return compose_env(HOPTRACE_NODE=self.node, HOPTRACE_CERTS_DIR=str(self.certs), **self.ports)

    def compose(
        self, *args: str, timeout_s: float = 300.0, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """docker-compose ARGS (profile apps included) for this stack."""
        return run(
            compose_command("--profile", "apps", *args), env=self.env(), timeout_s=timeout_s, check=check
        )

    def write_secrets(self) -> None:
        """`hoptrace certs` material (dispatcher and collector also as their compose service names), the web
        UI's one user (admin) and session key; readable by the images' hoptrace user."""
        from werkzeug.security import generate_password_hash

        from hoptrace.common.certs import create_bundle

        create_bundle(self.certs, hosts=["dispatcher", "collector"], agents=[self.node])
        (self.certs / "web-users").write_text(f"admin:{generate_password_hash(self.web_password)}\n")
        (self.certs / "web-secret-key").write_text(secrets.token_hex(32))
        # Certificates are public (0644); a key or token is readable by its user only: the agent runs as
        # root without CAP_DAC_OVERRIDE, every other service as the images' hoptrace user.
        self.certs.chmod(0o711)
        for path in self.certs.iterdir():
            if path.suffix == ".pem":
                path.chmod(0o644)
                continue
            os.chown(path, 0 if path.name.startswith(("agent-", "ca.")) else WEB_UID, 0)
            path.chmod(0o600)

    def client_env(self) -> dict[str, str]:
        """Environment of a `hoptrace` client of this stack: admin certificate and token."""
        from hoptrace.common.grpcutil import CA_ENV, CERT_ENV, KEY_ENV, TOKEN_ENV

        return {
            **{key: value for key, value in os.environ.items() if not key.startswith("HOPTRACE_")},
            "HOPTRACE_DISPATCHER": self.dispatcher,
            CA_ENV: str(self.certs / "ca.pem"),
            CERT_ENV: str(self.certs / "admin.pem"),
            KEY_ENV: str(self.certs / "admin.key"),
            TOKEN_ENV: (self.certs / "admin.token").read_text().strip(),
        }

    def up(self) -> None:
        """The control plane and the two application containers, then the agent: it reports the devices
        it sees when it registers, so the applications' veths exist by then."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.write_secrets()
        mount_kernel_filesystems()
        self.compose("up", "-d", *CONTROL_SERVICES, *APP_SERVICES)
        self.compose("up", "-d", "--no-deps", "agent")

    def container(self, service: str) -> str:
        """The container name of `service` (compose v1: PROJECT_SERVICE_1)."""
        return f"{PROJECT}_{service}_1"

    def inspect(self, service: str, template: str) -> str:
        """`docker inspect -f TEMPLATE` of `service`'s container."""
        return run(
            ["docker", "inspect", "-f", template, self.container(service)], timeout_s=60
        ).stdout.strip()

    def inspect_container(self, container: str, template: str) -> str:
        """`docker inspect -f TEMPLATE CONTAINER`."""
        return run(["docker", "inspect", "-f", template, container], timeout_s=60).stdout.strip()

    def pid(self, service: str) -> int:
        """The host PID of `service`'s main process."""
        return int(self.inspect(service, "{{.State.Pid}}"))

    def exec(self, service: str, *argv: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run ARGV in `service`'s container."""
        return run(["docker", "exec", self.container(service), *argv], timeout_s=timeout_s)

    def host_veth(self, service: str) -> str:
        """The host side of `service`'s eth0: the host device whose ifindex is eth0's iflink."""
        peer = int(self.exec(service, "cat", "/sys/class/net/eth0/iflink").stdout)
        for device in Path("/sys/class/net").iterdir():
            with contextlib.suppress(OSError, ValueError):
                if int((device / "ifindex").read_text()) == peer:
                    return device.name
        raise ComposeError(f"no host device with ifindex {peer} ({service}'s eth0 peer)")

    def run_agent_with(self, capabilities: Sequence[str], name: str) -> str:
        """Run the compose file's agent (image, command, mounts, host namespaces) as container `name` with
        only `capabilities`, labelled as part of the project; returns the container's name."""
        agent = yaml.safe_load(self.compose("config").stdout)["services"]["agent"]
        argv = ["docker", "run", "-d", "--name", name, "--label", f"com.docker.compose.project={PROJECT}"]
        argv += ["--network", "host", "--pid", "host", "--cap-drop", "ALL"]
        for capability in capabilities:
            argv += ["--cap-add", capability]
        for volume in agent["volumes"]:
            if isinstance(volume, str):
                argv += ["-v", volume]
            else:
                readonly = ",readonly" if volume.get("read_only") else ""
                argv += [
                    "--mount",
                    f"type=bind,source={volume['source']},target={volume['target']}{readonly}",
                ]
        run([*argv, agent["image"], *agent["command"]], timeout_s=120)
        return name

    def logs(self) -> str:
        """The last lines of every service's log."""
        return self.compose("logs", "--no-color", "--tail", "40", check=False).stdout[-8000:]

    def down(self) -> None:
        """Stop and remove every container, network and volume of the project, and what its agent kept
        in the host's bpffs for a next agent."""
        self.compose("down", "--volumes", "--remove-orphans", "--timeout", "10", timeout_s=180)
        remove_agent_state(self.node)

    def project_objects(self) -> dict[str, list[str]]:
        """The project's containers and networks the engine still has."""
        label = f"label=com.docker.compose.project={PROJECT}"
        containers = run(["docker", "ps", "-a", "-q", "--filter", label], timeout_s=60).stdout.split()
        networks = run(["docker", "network", "ls", "-q", "--filter", label], timeout_s=60).stdout.split()
        volumes = run(["docker", "volume", "ls", "-q", "--filter", label], timeout_s=60).stdout.split()
        return {"containers": containers, "networks": networks, "volumes": volumes}


def main(argv: Sequence[str] | None = None) -> int:
    """`base`, `images` or `kafka-image`, starting (and then stopping) the engine when none runs."""
    parser = argparse.ArgumentParser(
        prog="python -m hoptrace.lab.compose", description=__doc__.split("\n")[0]
    )
    parser.add_argument("what", choices=("base", "images", "kafka-image"))
    args = parser.parse_args(argv)
    engine = DockerEngine()
    try:
        engine.ensure()
        if args.what == "base":
            print(f"{BASE_IMAGE}: {'built' if build_base_image() else 'already there'}")
        elif args.what == "kafka-image":
            print(f"{KAFKA_IMAGE} built in {build_kafka_image():.0f} s")
        else:
            print(f"images {', '.join(IMAGES)} built in {build_images():.0f} s")
    except ComposeError as error:
        print(f"hoptrace.lab.compose: {error}", file=sys.stderr)
        return 1
    finally:
        engine.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
