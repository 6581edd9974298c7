"""All of hoptrace on one machine: influxd, collector, dispatcher and one agent per emulated host.

`make demo` and the full-system tests run the real components as separate processes, exactly as they run on
real hosts, on loopback ports chosen at start. Each agent represents one host: `--netns` is that host's
namespace.

Secure by default, as in production: `hoptrace certs` material in `<workdir>/certs` (a CA, one certificate per
component and per agent node), mutual TLS on every connection, a token for the user API. `secure=False` runs
everything with --insecure (plaintext on loopback) and says so with a WARNING.
"""

from __future__ import annotations

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
from typing import Any

import grpc

from hoptrace.common.certs import CertBundle, add_agent, create_bundle
from hoptrace.common.grpcutil import (
    CA_ENV,
    CERT_ENV,
    DISPATCHER_ENV,
    KEY_ENV,
    TOKEN_ENV,
    TOKEN_FILE_ENV,
    TLSFiles,
    api_channel,
)
from hoptrace.common.timeouts import scaled
from hoptrace.dispatcher.compile import BpfCompiler, Toolchain, compile_spec
from hoptrace.lab.lifecycle import dies_with_parent
from hoptrace.spec import check_spec
from hoptrace.v1 import api_pb2, api_pb2_grpc, trace_pb2

# The checkout this runs from (editable install), or $HOPTRACE_REPO: demo and tests use its topology.
REPO = Path(os.environ.get("HOPTRACE_REPO") or Path(__file__).resolve().parent.parent)
AGENT_BINARY = Path(os.environ.get("HOPTRACE_AGENT") or REPO / "agent" / "bin" / "hoptrace-agent")
HOPTRACE = [sys.executable, "-m", "hoptrace.cli.main"]
# Compiled BPF objects kept between runs (the dispatcher's --bpf-cache-dir) by `make demo` and the case
# studies. An object depends on the sources, vmlinux.h and clang's flags, not on the kernel it loads on
# (CO-RE), so a guest that shares this checkout (lab/vm.py) uses the objects compiled here.
BPF_CACHE_DIR = REPO / ".tools" / "bpf-cache"


def writable_bpf_cache(directory: Path = BPF_CACHE_DIR) -> Path | None:
    """`directory`, made if missing, when this process can write there; else None (a guest's read-only
    share): the dispatcher then caches in its state directory, as it does by default."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return directory if os.access(directory, os.W_OK | os.X_OK) else None


def compile_spec_objects(spec: trace_pb2.TraceSpec, cache_dir: Path) -> int:
    """Compile the BPF objects a dispatcher's apply of `spec` needs into `cache_dir`, through the dispatcher's
    own path (check_spec, then compile_spec with its default toolchain), so that a dispatcher started with
    --bpf-cache-dir `cache_dir` finds them; returns how many clang compiled (0: all were there)."""
    compiler = BpfCompiler(Toolchain.default(), cache_dir=cache_dir)
    compile_spec(check_spec(spec), 1, compiler)  # objects do not depend on the generation
    return compiler.clang_runs


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    """A loopback port (TCP, or UDP with SOCK_DGRAM) nobody uses right now."""
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Component:
    """One running process of the cluster, with its log file."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log_tail(self, lines: int = 30) -> str:
        """The last `lines` lines of the component's log."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 10.0) -> int | None:
        """Signal the process and wait; kill it if it does not exit in time."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        return self.process.returncode


@dataclass
class LocalCluster:
    """Starts and stops hoptrace's components for one InfluxDB server (url, bucket)."""

    influx_url: str
    influx_bucket: str = "hoptrace/autogen"
    # Logs, certificates, state, spool. None: a temporary one of its own, removed when the cluster's `with`
    # block ends without an error (kept after one, for its logs); one given is the caller's to remove.
    workdir: Path = None  # type: ignore[assignment]
    dispatcher_addr: str = ""
    collector_addr: str = ""
    clock_addr: str = ""
    metrics_addrs: dict[str, str] = field(default_factory=dict)
    components: dict[str, Component] = field(default_factory=dict)
    secure: bool = True
    certs: CertBundle | None = None
    # The dispatcher's --bpf-cache-dir (e.g. BPF_CACHE_DIR); None: its default, in the workdir.
    bpf_cache_dir: Path | None = None

    def __post_init__(self) -> None:
        self._owns_workdir = self.workdir is None
        if self._owns_workdir:
            self.workdir = Path(tempfile.mkdtemp(prefix="hoptrace-cluster-"))
        self.dispatcher_addr = self.dispatcher_addr or f"127.0.0.1:{free_port()}"
        self.collector_addr = self.collector_addr or f"127.0.0.1:{free_port()}"
        self.clock_addr = self.clock_addr or f"127.0.0.1:{free_port(socket.SOCK_DGRAM)}"
        self._channel: grpc.Channel | None = None
        if self.secure and self.certs is None:
            self.certs = create_bundle(self.workdir / "certs")
        if not self.secure:
            print(
                "WARNING: local cluster without TLS or tokens (--insecure), on loopback only", file=sys.stderr
            )

    def _tls_flags(self, files: TLSFiles | None) -> list[str]:
        """--ca/--cert/--key of `files`, or --insecure for an insecure cluster."""
        if files is None:
            return ["--insecure"]
        return ["--ca", str(files.ca), "--cert", str(files.cert), "--key", str(files.key)]

    def client_env(self) -> dict[str, str]:
        """Environment for a `hoptrace` client of this cluster: the admin certificate and token."""
        if self.certs is None:
            return {}
        admin = self.certs.files("admin")
        return {
            CA_ENV: str(admin.ca),
            CERT_ENV: str(admin.cert),
            KEY_ENV: str(admin.key),
            TOKEN_ENV: self.certs.token("admin"),
        }

    def client_exports(self) -> dict[str, str]:
        """What a user's shell needs to run `hoptrace` against this cluster, as environment variables the CLI
        reads: the dispatcher's address, the admin certificate and key, the CA, and the token's file (not
        the token: a file keeps it out of shell history). PATH first, for the `hoptrace` of this checkout."""
        exports = {"PATH": f"{Path(sys.executable).parent}:$PATH", DISPATCHER_ENV: self.dispatcher_addr}
        if self.certs is not None:
            admin = self.certs.files("admin")
            exports |= {
                CA_ENV: str(admin.ca),
                CERT_ENV: str(admin.cert),
                KEY_ENV: str(admin.key),
                TOKEN_FILE_ENV: str(self.certs.token_file("admin")),
            }
        return exports

    def metrics_addr(self, name: str) -> str:
        """The /metrics address of component `name` (a fresh port per component, kept across restarts)."""
        return self.metrics_addrs.setdefault(name, f"127.0.0.1:{free_port()}")

    # ---- processes ------------------------------------------------------------------------------------

    def _spawn(self, name: str, argv: list[str]) -> Component:
        log_path = self.workdir / f"{name}.log"
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                dies_with_parent(argv), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        component = Component(name, process, log_path)
        self.components[name] = component
        return component

    def start_web(self, password: str, *extra: str) -> tuple[Component, str]:
        """Run `hoptrace web` for this cluster with one user, admin/`password`; returns it and its URL."""
        from werkzeug.security import generate_password_hash

        users = self.workdir / "web-users"
        users.write_text(f"admin:{generate_password_hash(password)}\n")
        users.chmod(0o600)
        secret = self.workdir / "web-secret"
        secret.write_text(secrets.token_hex(32))
        secret.chmod(0o600)
        address = f"127.0.0.1:{free_port()}"
        if self.certs is None:
            client = ["--insecure"]
        else:
            files = self.certs.files("web")
            client = ["--ca", str(files.ca), "--cert", str(files.cert), "--key", str(files.key)]
            client += ["--token-file", str(self.certs.out / "web.token")]
        component = self._spawn(
            "web",
            [
                *HOPTRACE,
                "web",
                "--listen",
                address,
                "--dispatcher",
                self.dispatcher_addr,
                *client,
                "--users-file",
                str(users),
                "--secret-key-file",
                str(secret),
                *extra,
            ],
        )
        return component, f"http://{address}"

    def wait_http(self, url: str, timeout_s: float = 30.0) -> None:
        """Wait until `url` answers (any HTTP status), checking that no component died meanwhile."""
        import urllib.error
        import urllib.request

        deadline = time.monotonic() + scaled(timeout_s)
        while True:
            self.check_running()
            try:
                urllib.request.urlopen(url, timeout=2).close()
                return
            except urllib.error.HTTPError:
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{url} did not answer within {timeout_s} s") from None
                time.sleep(0.2)

    def start_dispatcher(self, *extra: str) -> Component:
        """Run `hoptrace dispatcher` with its state under the cluster's workdir."""
        return self._spawn(
            "dispatcher",
            [
                *HOPTRACE,
                "dispatcher",
                "--listen",
                self.dispatcher_addr,
                "--state-dir",
                str(self.workdir / "dispatcher"),
                "--influx-url",
                self.influx_url,
                "--influx-bucket",
                self.influx_bucket,
                *self._tls_flags(self.certs and self.certs.files("dispatcher")),
                *(["--tokens", str(self.certs.tokens)] if self.certs else []),
                *(["--bpf-cache-dir", str(self.bpf_cache_dir)] if self.bpf_cache_dir else []),
                *extra,
            ],
        )

    def start_collector(self, *extra: str) -> Component:
        """Run `hoptrace collector`, following the dispatcher's trace paths."""
        return self._spawn(
            "collector",
            [
                *HOPTRACE,
                "collector",
                "--listen",
                self.collector_addr,
                "--influx-url",
                self.influx_url,
                "--influx-bucket",
                self.influx_bucket,
                "--dispatcher",
                self.dispatcher_addr,
                "--clock-listen",
                self.clock_addr,
                "--metrics-listen",
                self.metrics_addr("collector"),
                "--spool-dir",
                str(self.workdir / "spool"),
                *self._tls_flags(self.certs and self.certs.files("collector")),
                *(["--dispatcher-token-file", str(self.certs.out / "collector.token")] if self.certs else []),
                *extra,
            ],
        )

    def start_agent(
        self, node: str, netns: str, *extra: str, records_to: Sequence[str] | None = None
    ) -> Component:
        """Run `hoptrace-agent` for the emulated host `node` whose own namespace is `netns`; its records go
        to this cluster's collector, or where `records_to` says (e.g. ``["--kafka-brokers", B, ...]``).
        It pins nothing in bpffs (``--pin-dir ""``): a killed lab leaves nothing attached; `extra` may
        give a --pin-dir (tests/faults)."""
        if not AGENT_BINARY.exists():
            raise RuntimeError(f"{AGENT_BINARY} is missing: run `make agent`")
        files = add_agent(self.certs.out, node) if self.certs else None
        return self._spawn(
            f"agent-{node}",
            [
                str(AGENT_BINARY),
                "--node",
                node,
                "--netns",
                netns,
                "--dispatcher",
                self.dispatcher_addr,
                *(["--collector", self.collector_addr] if records_to is None else records_to),
                "--clock-server",
                self.clock_addr,
                "--metrics-listen",
                self.metrics_addr(f"agent-{node}"),
                "--pin-dir=",
                *self._tls_flags(files),
                *extra,
            ],
        )

    def wait_listening(self, timeout_s: float = 30.0, addrs: Sequence[str] | None = None) -> None:
        """Wait until the dispatcher and collector (or `addrs`) accept connections (agents then connect at
        once)."""
        deadline = time.monotonic() + scaled(timeout_s)
        for addr in addrs if addrs is not None else (self.dispatcher_addr, self.collector_addr):
            host, _, port = addr.rpartition(":")
            while True:
                self.check_running()
                try:
                    with socket.create_connection((host, int(port)), timeout=1):
                        break
                except OSError:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"nothing listens on {addr} after {timeout_s} s") from None
                    time.sleep(0.1)

    def stop(self) -> None:
        """Stop agents first (they detach), then collector (it flushes), then dispatcher."""
        order = sorted(self.components, key=lambda n: (not n.startswith("agent-"), n != "collector"))
        for name in order:
            self.components[name].stop()

    def check_running(self) -> None:
        """Raise with the component's log when one of them has exited."""
        for component in self.components.values():
            if component.process.poll() is not None:
                raise RuntimeError(
                    f"{component.name} exited with {component.process.returncode}:\n{component.log_tail()}"
                )

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        self.stop()
        if self._owns_workdir and exc_type is None:
            shutil.rmtree(self.workdir, ignore_errors=True)

    # ---- API ------------------------------------------------------------------------------------------

    def channel(self) -> grpc.Channel:
        """The user API channel (admin certificate and token when secure), made once."""
        if self._channel is None:
            if self.certs is None:
                self._channel = api_channel(self.dispatcher_addr, insecure=True)
            else:
                admin = self.certs.files("admin")
                self._channel = api_channel(
                    self.dispatcher_addr,
                    ca=admin.ca,
                    cert=admin.cert,
                    key=admin.key,
                    token=self.certs.token("admin"),
                )
        return self._channel

    def api(self) -> api_pb2_grpc.HoptraceStub:
        """A stub of the user API on the dispatcher."""
        return api_pb2_grpc.HoptraceStub(self.channel())

    def start_on(
        self, topo: Any, collector_args: Sequence[str] = (), agent_args: dict[str, list[str]] | None = None
    ) -> LocalCluster:
        """Dispatcher, collector and one agent per emulated host of `topo` (host-a, host-b), all up and
        registered; `agent_args` adds flags per node."""
        agent_args = agent_args or {}
        self.start_dispatcher()
        self.start_collector(*collector_args)
        self.wait_listening()
        # Each emulated host owns its own namespace and its container's, as a real host would: discover
        # attributes a device crossing to exactly one node (all agents' tracepoints see every netns).
        self.start_agent("host-a", topo.host_a, "--netns-owned", topo.c1, *agent_args.get("host-a", []))
        self.start_agent("host-b", topo.host_b, "--netns-owned", topo.c2, *agent_args.get("host-b", []))
        self.wait_agents(["host-a", "host-b"])
        return self

    def wait_agents(self, nodes: list[str], timeout_s: float = 30.0) -> list[api_pb2.Agent]:
        """Wait until every node in `nodes` is registered and connected."""
        deadline = time.monotonic() + scaled(timeout_s)
        last_error = ""
        while time.monotonic() < deadline:
            self.check_running()
            try:
                agents = self.api().ListAgents(api_pb2.ListAgentsRequest(), timeout=2).agents
                connected = {a.registration.node for a in agents if a.connected}
                if set(nodes) <= connected:
                    return list(agents)
                last_error = f"connected: {sorted(connected)}"
            except grpc.RpcError as err:
                last_error = err.code().name
            time.sleep(0.2)
        raise TimeoutError(f"agents {nodes} did not connect within {timeout_s} s ({last_error})")

    def apply(self, spec: trace_pb2.TraceSpec, timeout_s: float = 30.0) -> api_pb2.Trace:
        """Apply a trace through the API; raises grpc.RpcError with the dispatcher's message on failure."""
        return self.api().ApplyTrace(api_pb2.ApplyTraceRequest(spec=spec), timeout=scaled(timeout_s))

    def hoptrace(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run the `hoptrace` CLI against this cluster's dispatcher."""
        return subprocess.run(
            [*HOPTRACE, "--dispatcher", self.dispatcher_addr, *([] if self.certs else ["--insecure"]), *args],
            capture_output=True,
            text=True,
            check=check,
            timeout=scaled(90),  # beyond the CLI's own deadlines
            env={**os.environ, "PYTHONUNBUFFERED": "1", **self.client_env()},
        )
