"""Test helpers shared by the tiers: an InfluxDB server, the standalone agent as a subprocess.

Fixtures that use these live in ``conftest.py``; the helpers themselves have no pytest dependency so the demo
and benchmarks can use them too.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from hoptrace.common.timeouts import scaled
from hoptrace.lab.lifecycle import dies_with_parent

REPO_ROOT = Path(__file__).resolve().parents[1]
INFLUXD_BINARY = REPO_ROOT / ".tools" / "bin" / "influxd"
AGENT_BINARY = REPO_ROOT / "agent" / "bin" / "hoptrace-agent"
INFLUX_DATABASE = "hoptrace"
_INFLUXD_ENV = {**os.environ, "INFLUXDB_DATA_QUERY_LOG_ENABLED": "false"}  # no line per query in its log


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now, below the kernel's ephemeral range.

    The kernel's choice for port 0 comes from the ephemeral range, where every outgoing connection takes its
    local port too: one of them took a dispatcher's port between this call and its bind (a rehearsal,
    2026-11-27). The kernel never hands out a port below that range on its own.
    """
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    first = max(1024, low // 2)
    for _ in range(200 if first < low else 0):
        port = random.randrange(first, low)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    # No room below the range (it starts low) or none free there: the kernel's choice.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _tail(path: Path, lines: int = 30) -> str:
    """The last lines of a log file, for failure messages."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


# ---- traffic between roles of a topology -----------------------------------------------------------------

IP_MTU_DISCOVER, IP_PMTUDISC_DO = 10, 2  # linux/in.h: set DF, never fragment locally
IPV6_MTU_DISCOVER = 23


def udp_transfer(
    topo: Any,
    src: str,
    dst: str,
    payloads: Iterable[bytes],
    family: int = 4,
    port: int = 5555,
    gap_s: float = 0.0,
    timeout_s: float = 2.0,
) -> list[bytes]:
    """Send each payload as one UDP datagram (DF set) from role ``src`` to the main address of role ``dst``.

    Returns the datagrams ``dst`` received, in arrival order (stops ``timeout_s`` after the last one).
    ``topo`` is a TwoHostTopology.
    """
    af = socket.AF_INET if family == 4 else socket.AF_INET6
    receiver = topo.socket(dst, af, socket.SOCK_DGRAM)
    sender = topo.socket(src, af, socket.SOCK_DGRAM)
    with receiver, sender:
        receiver.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        receiver.bind((topo.addr(dst, family), port))
        if family == 4:
            sender.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO)
        else:
            sender.setsockopt(socket.IPPROTO_IPV6, IPV6_MTU_DISCOVER, IP_PMTUDISC_DO)
        target = (topo.addr(dst, family), port)
        for payload in payloads:
            sender.sendto(payload, target)
            if gap_s:
                time.sleep(gap_s)
        received: list[bytes] = []
        receiver.settimeout(timeout_s)
        with contextlib.suppress(TimeoutError):
            while True:
                received.append(receiver.recv(65535))
        return received


# ---- InfluxDB 1.8 ----------------------------------------------------------------------------------------


@dataclass
class InfluxServer:
    """A running influxd: what influxdb-client needs to talk to it (v2 API compatibility of 1.8)."""

    url: str
    bucket: str = f"{INFLUX_DATABASE}/autogen"  # 1.8's v2 API: bucket = "database/retention-policy"
    token: str = ""  # no auth: empty token
    org: str = "-"  # ignored by 1.8
    database: str = INFLUX_DATABASE
    workdir: Path = field(default_factory=Path)
    process: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        """influxd's own log (stderr)."""
        return self.workdir / "influxd.log"

    def query_v1(self, q: str, method: str = "POST") -> dict[str, Any]:
        """Run an InfluxQL statement through the 1.x ``/query`` endpoint and return the JSON answer."""
        params = urllib.parse.urlencode({"q": q, "db": self.database})
        if method == "GET":
            request = urllib.request.Request(f"{self.url}/query?{params}")
        else:
            request = urllib.request.Request(f"{self.url}/query", data=params.encode(), method="POST")
            request.add_header("Content-Type", "application/x-www-form-urlencoded")
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def stop_process(self) -> None:
        """Stop influxd (SIGTERM: it closes its WAL cleanly), keeping its data directory and port."""
        proc = self.process
        assert proc is not None and proc.poll() is None
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def restart(self, timeout_s: float = 60.0) -> None:
        """Start influxd again with the same config (data directory, HTTP port) and wait for /ping."""
        assert self.process is not None
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.process.args,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=_INFLUXD_ENV,  # type: ignore[arg-type]
            )
        assert wait_http_ok(f"{self.url}/ping", timeout_s, self.process), "influxd did not restart"

    def stop(self) -> None:
        """Stop influxd (SIGTERM, then SIGKILL after 10 s) and remove its data directory."""
        if self.process is not None:
            if self.process.poll() is None:
                self.process.terminate()
                try:
                    self.process.wait(10)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait()
            self.process = None
        shutil.rmtree(self.workdir, ignore_errors=True)


def _influxd_config(workdir: Path, http_port: int, rpc_port: int) -> str:
    return f"""\
reporting-disabled = true
bind-address = "127.0.0.1:{rpc_port}"

[meta]
  dir = "{workdir}/meta"
  logging-enabled = false

[data]
  dir = "{workdir}/data"
  wal-dir = "{workdir}/wal"
  query-log-enabled = false
  wal-fsync-delay = "0s"

[monitor]
  store-enabled = false

[subscriber]
  enabled = false

[retention]
  enabled = false

[continuous_queries]
  enabled = false

[http]
  enabled = true
  bind-address = "127.0.0.1:{http_port}"
  auth-enabled = false
  flux-enabled = true
  log-enabled = false
  pprof-enabled = false

[logging]
  level = "warn"
  suppress-logo = true
"""


def wait_http_ok(url: str, timeout_s: float, proc: subprocess.Popen[Any] | None = None) -> bool:
    """Poll ``url`` until it answers 2xx; False on timeout or if ``proc`` exits meanwhile."""
    deadline = time.monotonic() + scaled(timeout_s)
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return False
        with (
            contextlib.suppress(urllib.error.URLError, ConnectionError, TimeoutError),
            urllib.request.urlopen(url, timeout=1) as response,
        ):
            if 200 <= response.status < 300:
                return True
        time.sleep(0.1)
    return False


def start_influxd(binary: Path = INFLUXD_BINARY, timeout_s: float = 60.0, attempts: int = 3) -> InfluxServer:
    """Start influxd with all state in a temporary directory and loopback-only listeners on free ports.

    Waits for ``/ping``, creates the ``hoptrace`` database, and returns the server; call ``stop()``.
    Raises RuntimeError with influxd's log if it does not come up.
    """
    if not binary.exists():
        raise RuntimeError(
            f"{binary} is missing: run `make setup` (it builds InfluxDB 1.8.10 into .tools/bin)"
        )
    error = ""
    for _ in range(attempts):  # a "free" port can be taken between free_port() and influxd's bind
        workdir = Path(tempfile.mkdtemp(prefix="hoptrace-influxd-"))
        http_port, rpc_port = free_port(), free_port()
        config = workdir / "influxdb.conf"
        config.write_text(_influxd_config(workdir, http_port, rpc_port))
        server = InfluxServer(url=f"http://127.0.0.1:{http_port}", workdir=workdir)
        with open(server.log_path, "wb") as log:
            server.process = subprocess.Popen(
                dies_with_parent([str(binary), "run", "-config", str(config)]),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=_INFLUXD_ENV,
            )
        if wait_http_ok(f"{server.url}/ping", timeout_s, server.process):
            server.query_v1(f"CREATE DATABASE {INFLUX_DATABASE}")
            return server
        error = _tail(server.log_path)
        server.stop()
    raise RuntimeError(f"influxd did not answer /ping after {attempts} attempts; its log:\n{error}")


# ---- the standalone agent --------------------------------------------------------------------------------


class AgentProcess:
    """``hoptrace-agent run --plan FILE --allow-unsigned-plan --out - --node N [--netns NS]`` as a subprocess.

    A reader thread parses its JSON lines (design.md, "Standalone agent") into ``statuses``, ``records`` and
    ``counters``; anything that is not JSON goes to ``other_lines``, stderr to a file (``stderr_text()``).
    """

    def __init__(
        self,
        binary: str | os.PathLike[str],
        plan: dict[str, Any] | str | os.PathLike[str],
        node: str,
        netns: str | None = None,
        extra_args: Iterable[str] = (),
    ) -> None:
        """Describe the run; ``plan`` is a TracePlan as a dict (written as protojson) or a file path."""
        self.binary = os.fspath(binary)
        self.node = node
        self.netns = netns
        self.extra_args = list(extra_args)
        self._tmpdir = Path(tempfile.mkdtemp(prefix=f"hoptrace-agent-{node}-"))
        if isinstance(plan, dict):
            self.plan_path = self._tmpdir / "plan.json"
            self.plan_path.write_text(json.dumps(plan, indent=2))
        else:
            self.plan_path = Path(plan)
        self.stderr_path = self._tmpdir / "stderr.log"
        self.lines: list[dict[str, Any]] = []
        self.statuses: list[dict[str, Any]] = []
        self.records: list[dict[str, Any]] = []
        self.counters: list[dict[str, Any]] = []
        self.other_lines: list[str] = []
        self.proc: subprocess.Popen[str] | None = None
        self._cond = threading.Condition()
        self._reader: threading.Thread | None = None
        self._eof = False
        self._stderr: IO[str] | None = None

    @property
    def command(self) -> list[str]:
        """The agent's command line."""
        # The lab writes its own plans (object files by path): unsigned, said so explicitly. It pins nothing
        # in bpffs (as LocalCluster's agents): a killed agent leaves nothing attached.
        cmd = [self.binary, "run", "--plan", str(self.plan_path), "--allow-unsigned-plan", "--out", "-"]
        cmd += ["--node", self.node, "--pin-dir="]
        if self.netns:
            cmd += ["--netns", self.netns]
        return cmd + self.extra_args

    def start(self) -> AgentProcess:
        """Start the agent and the reader thread."""
        self._stderr = open(self.stderr_path, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            dies_with_parent(self.command),
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            bufsize=1,
        )
        self._reader = threading.Thread(target=self._read, name=f"agent-{self.node}-reader", daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                obj = None
            with self._cond:
                if isinstance(obj, dict):
                    self.lines.append(obj)
                    kind = obj.get("type")
                    if kind == "status":
                        self.statuses.append(obj)
                    elif kind == "record":
                        self.records.append(obj)
                    elif kind == "counters":
                        self.counters.append(obj)
                else:
                    self.other_lines.append(line)
                self._cond.notify_all()
        with self._cond:
            self._eof = True
            self._cond.notify_all()

    def stderr_text(self) -> str:
        """What the agent wrote to stderr so far."""
        return self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""

    def _describe(self) -> str:
        rc = self.proc.poll() if self.proc else None
        return f"agent {self.node} (exit {rc}); stderr:\n{self.stderr_text()[-4000:]}"

    def wait_for(self, predicate: Callable[[], Any], timeout_s: float, what: str) -> Any:
        """Wait until ``predicate()`` (called under the lock) is truthy and return its value.

        Raises AssertionError naming ``what`` and showing the agent's stderr on timeout or agent exit.
        """
        deadline = time.monotonic() + scaled(timeout_s)
        with self._cond:
            while True:
                value = predicate()
                if value:
                    return value
                left = deadline - time.monotonic()
                if self._eof:
                    raise AssertionError(f"{what}: the agent's output ended; {self._describe()}")
                if left <= 0:
                    raise AssertionError(f"{what}: not within {timeout_s} s; {self._describe()}")
                self._cond.wait(left)

    def wait_status(self, timeout_s: float = 30.0) -> dict[str, Any]:
        """The first ``status`` line (the agent attached, or failed: check ``error`` and ``hops``)."""
        return self.wait_for(lambda: self.statuses[0] if self.statuses else None, timeout_s, "status line")

    def wait_records(
        self, count: int, timeout_s: float = 10.0, predicate: Callable[[dict[str, Any]], bool] | None = None
    ) -> list[dict[str, Any]]:
        """Wait for at least ``count`` records (matching ``predicate``); return all that match."""

        def matching() -> list[dict[str, Any]] | None:
            found = [r for r in self.records if predicate is None or predicate(r)]
            return found if len(found) >= count else None

        return self.wait_for(matching, timeout_s, f"{count} records")

    def wait_counters(self, timeout_s: float = 5.0) -> list[dict[str, Any]]:
        """Wait for the first ``counters`` line and return all so far."""
        return self.wait_for(lambda: list(self.counters) or None, timeout_s, "counters line")

    def stop(self, timeout_s: float = 15.0, check: bool = True) -> int:
        """SIGINT, wait for exit and the end of its output; return the exit code.

        With ``check`` assert it exited 0 on its own (final counters are then in ``counters``).
        """
        if self.proc is None:
            return 0
        killed = False
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                killed = True
        if self._reader is not None:
            self._reader.join(5)
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None
        rc = self.proc.returncode
        if check:
            assert not killed, f"agent did not exit within {timeout_s} s of SIGINT; {self._describe()}"
            assert rc == 0, f"agent exited with {rc} after SIGINT; {self._describe()}"
        return rc

    def cleanup(self) -> None:
        """Kill the agent if it still runs and remove its temporary files."""
        if self.proc is not None and self.proc.poll() is None:
            self.stop(timeout_s=5, check=False)
        shutil.rmtree(self._tmpdir, ignore_errors=True)

    def __enter__(self) -> AgentProcess:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if self.proc is not None:
                self.stop(check=exc_type is None)
        finally:
            self.cleanup()
