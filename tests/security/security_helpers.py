"""What the security tests share: certificate bundles, a daemon agent with chosen credentials, raw TLS
clients of the agent-facing services, and BPF objects that call forbidden helpers."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc

from hoptrace.common.grpcutil import TLSFiles, channel_credentials
from hoptrace.lab.localcluster import AGENT_BINARY
from hoptrace.v1 import agent_pb2, agent_pb2_grpc, records_pb2, records_pb2_grpc

# Helper numbers of include/uapi/linux/bpf.h (enum bpf_func_id): stable ABI.
HELPER_IDS = {
    "": 0,  # none
    "bpf_clone_redirect": 13,
    "bpf_redirect": 23,
    "bpf_probe_write_user": 36,
    "bpf_override_return": 58,
    "bpf_send_signal": 109,
}

EVIL_SOURCE = """
/* A tc program that calls one helper the agent must refuse. No vmlinux.h: only the ELF matters. */
#define SEC(name) __attribute__((section(name), used))
typedef unsigned int __u32;
static long (*helper)(void *a, const void *b, __u32 c) = (void *)HELPER_ID;
SEC("tc") int hop_tc(void *ctx)
{
#if HELPER_ID
    char buf[4] = {};
    helper(buf, buf, sizeof(buf));
#endif
    return VERDICT;
}
char LICENSE[] SEC("license") = "GPL";
"""


def build_evil_object(workdir: Path, helper: str, verdict: int = 0) -> Path:
    """Compile (clang -target bpf) a tc program `hop_tc` that calls `helper` ("": none) and returns
    `verdict`; returns the object's path."""
    source = workdir / f"evil-{helper}-{verdict}.c"
    source.write_text(EVIL_SOURCE)
    obj = workdir / f"evil-{helper}-{verdict}.o"
    subprocess.run(
        [
            "clang",
            "-O2",
            "-target",
            "bpf",
            f"-DHELPER_ID={HELPER_IDS[helper]}",
            f"-DVERDICT={verdict}",
            "-c",
            str(source),
            "-o",
            str(obj),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return obj


@dataclass
class DaemonAgent:
    """`hoptrace-agent --node N --dispatcher D --collector C` with the given TLS flags, its log in a file."""

    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        """Everything the agent logged so far."""
        return self.log_path.read_text(errors="replace")

    def wait_log(self, needle: str, timeout_s: float = 15.0) -> str:
        """Wait until the log contains `needle`; returns the log (AssertionError with it otherwise)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if needle in self.log():
                return self.log()
            time.sleep(0.2)
        raise AssertionError(f"agent log never said {needle!r}:\n{self.log()[-3000:]}")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it lingers."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


def start_daemon_agent(
    workdir: Path,
    node: str,
    dispatcher: str,
    collector: str,
    tls_args: list[str],
    metrics_listen: str = "",
    default_pins: bool = False,
) -> DaemonAgent:
    """Start a daemon agent in the host's namespace (no clock rounds; /metrics only on `metrics_listen`).
    It pins nothing and keeps the signed commands' sequences in `workdir`, which the test's teardown
    removes; with `default_pins`, under the default --pin-dir as a user's agent does (the caller removes
    what it leaves there: bpfstate.remove_agent_state)."""
    log_path = workdir / f"agent-{node}-{time.monotonic_ns()}.log"
    argv = [
        str(AGENT_BINARY),
        "--node", node, "--dispatcher", dispatcher, "--collector", collector,
        "--clock-server", "off", "--metrics-listen", metrics_listen, *tls_args,
    ]  # fmt: skip
    if not default_pins:
        argv += ["--pin-dir=", f"--command-state={workdir / f'commands-{node}'}"]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    return DaemonAgent(process, log_path)


def tls_args(files: TLSFiles, ca: Path | None = None) -> list[str]:
    """--ca/--cert/--key of `files` (the CA replaced by `ca` if given)."""
    return ["--ca", str(ca or files.ca), "--cert", str(files.cert), "--key", str(files.key)]


def _channel(address: str, ca: Path | None, files: TLSFiles | None) -> grpc.Channel:
    if ca is None:
        return grpc.insecure_channel(address)
    cert, key = (files.cert, files.key) if files else (None, None)
    return grpc.secure_channel(address, channel_credentials(ca, cert, key))


def register_as(
    address: str, node: str, ca: Path | None, files: TLSFiles | None
) -> tuple[grpc.StatusCode, str]:
    """Open AgentSession/Connect as `node` with client certificate `files` (None: none; ca None: plaintext).
    Returns how the dispatcher ended it: (OK, "") if it kept the session open."""
    with _channel(address, ca, files) as channel:

        def messages():
            yield agent_pb2.AgentMessage(register=agent_pb2.Register(node=node))
            time.sleep(3)

        try:
            for _ in agent_pb2_grpc.AgentSessionStub(channel).Connect(messages(), timeout=1.5):
                pass
        except grpc.RpcError as error:
            if error.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                return grpc.StatusCode.OK, ""  # accepted: the session stayed open until our deadline
            return error.code(), error.details() or ""
    return grpc.StatusCode.OK, ""


def stream_as(
    address: str, node: str, ca: Path | None, files: TLSFiles | None
) -> tuple[grpc.StatusCode, str]:
    """Stream one (empty) RecordBatch of `node` to the collector with client certificate `files`."""
    batch = records_pb2.RecordBatch(node=node, trace="sec", generation=1, batch_seq=1, record_size=32)
    with _channel(address, ca, files) as channel:
        try:
            records_pb2_grpc.CollectorStub(channel).StreamRecords(iter([batch]), timeout=5)
        except grpc.RpcError as error:
            return error.code(), error.details() or ""
    return grpc.StatusCode.OK, ""


def never(condition: Callable[[], bool], seconds: float) -> bool:
    """True if `condition` stays false for `seconds` (polled)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return False
        time.sleep(0.2)
    return True
