"""The dispatcher process: the user API and the agent sessions on one gRPC port."""

from __future__ import annotations

import logging
import threading
from concurrent import futures
from pathlib import Path

import grpc

from hoptrace.common.grpcutil import (
    AGENT_CONNECT_METHOD,
    AgentIdentityInterceptor,
    TLSFiles,
    TokenAuthInterceptor,
    TokenFile,
    insecure_warning,
    register_node,
    server_credentials,
)
from hoptrace.common.revocation import revocation_interceptors
from hoptrace.common.timeouts import DEFAULT_ACK_TIMEOUT_S
from hoptrace.dispatcher.api import (
    ClockProvider,
    HoptraceServicer,
    PacketsProvider,
    ReportProvider,
    WindowProvider,
)
from hoptrace.dispatcher.compile import BpfCompiler, Toolchain
from hoptrace.dispatcher.controller import TraceController
from hoptrace.dispatcher.registry import AgentRegistry
from hoptrace.dispatcher.session import AgentSessionServicer
from hoptrace.dispatcher.signing import DEFAULT_COMMAND_TTL_S, MessageSigner
from hoptrace.dispatcher.state import StateStore
from hoptrace.v1 import agent_pb2_grpc, api_pb2_grpc

log = logging.getLogger(__name__)

DEFAULT_LISTEN = "127.0.0.1:7070"
DEFAULT_STATE_DIR = "/var/lib/hoptrace/dispatcher"
MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # plans carry objects (up to ~1 MB each with BTF)

SERVER_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # Notice dead agents even when they are idle, and accept the agents' own keepalive pings.
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    ("grpc.http2.max_pings_without_data", 0),
]


class DispatcherServer:
    """A running dispatcher: `port` is the bound port (useful with listen "127.0.0.1:0").

    With `tls`, the port is mutual TLS (every client needs a certificate of `tls.ca`) and an agent may only
    register as the node its certificate names; without, it is plaintext (a WARNING is logged). With
    `tokens_file`, user API calls need a bearer token of that file (docs/security.md). Commands to agents
    (plans, removals, presets) are signed by `signer`, by default with `tls`'s certificate and key and valid
    for `command_ttl_s` (unsigned without `tls`). Compiled BPF
    objects are cached by content hash in `bpf_cache_dir` (default `<state_dir>/cache`), which dispatchers
    of the same sources may share.
    """

    def __init__(
        self,
        listen: str,
        state_dir: str | Path,
        *,
        report_provider: ReportProvider | None = None,
        window_provider: WindowProvider | None = None,
        clock_provider: ClockProvider | None = None,
        packets_provider: PacketsProvider | None = None,
        compiler: BpfCompiler | None = None,
        ack_timeout: float = DEFAULT_ACK_TIMEOUT_S,
        max_agents: int = 256,
        tls: TLSFiles | None = None,
        tokens_file: str | Path | None = None,
        signer: MessageSigner | None = None,
        bpf_cache_dir: str | Path | None = None,
        command_ttl_s: float = DEFAULT_COMMAND_TTL_S,
    ) -> None:
        self.listen = listen
        self.tls = tls
        self.tokens = TokenFile(tokens_file) if tokens_file else None
        # A revoked client certificate is refused first, whatever else it brings.
        interceptors: list[grpc.ServerInterceptor] = (
            revocation_interceptors(tls.crl, tls.ca) if tls is not None else []
        )
        if self.tokens is not None:
            interceptors.append(TokenAuthInterceptor(self.tokens))
        if tls is not None:
            interceptors.append(AgentIdentityInterceptor({AGENT_CONNECT_METHOD: register_node}))
        self.store = StateStore(state_dir)
        self.registry = AgentRegistry()
        cache_dir = Path(bpf_cache_dir) if bpf_cache_dir else self.store.state_dir / "cache"
        self.compiler = compiler or BpfCompiler(Toolchain.default(), cache_dir=cache_dir)
        if signer is None:
            signer = (
                MessageSigner.from_files(tls.cert, tls.key, ttl_s=command_ttl_s)
                if tls is not None
                else MessageSigner(ttl_s=command_ttl_s)
            )
        # Command sequences continue above the last one signed, across restarts.
        signer.sequence = self.store.next_sequence
        self.controller = TraceController(
            self.registry, self.store, self.compiler, ack_timeout=ack_timeout, signer=signer
        )
        # Every connected agent holds one worker for its stream; leave room for user calls.
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=max_agents + 32, thread_name_prefix="dispatcher"),
            options=SERVER_OPTIONS,
            interceptors=interceptors,
        )
        api_pb2_grpc.add_HoptraceServicer_to_server(
            HoptraceServicer(
                self.controller,
                self.registry,
                report_provider,
                window_provider,
                clock_provider,
                packets_provider,
                audit=self.store.audit,
                tokens=self.tokens,
            ),
            self._server,
        )
        agent_pb2_grpc.add_AgentSessionServicer_to_server(
            AgentSessionServicer(self.registry, self.controller), self._server
        )
        self.port = 0

    def start(self) -> DispatcherServer:
        """Bind and serve; prepares the BPF toolchain in the background so the first apply is fast."""
        if self.tls is None:
            log.warning(insecure_warning("dispatcher", self.listen))
            self.port = self._server.add_insecure_port(self.listen)
        else:
            self.port = self._server.add_secure_port(self.listen, server_credentials(self.tls))
        if self.tokens is None:
            log.warning("WARNING: the user API on %s takes no token (no --tokens)", self.listen)
        if self.port == 0:
            raise OSError(f"cannot listen on {self.listen}")
        self._server.start()
        signer = self.controller.signer
        if signer.signs:
            log.info("commands to agents are signed by %s, valid for %gs", signer.subject, signer.ttl_s)
        else:
            log.warning("WARNING: commands to agents go unsigned: only agents run with --insecure take them")
        threading.Thread(target=self.compiler.warm_up, name="bpf-warm-up", daemon=True).start()
        log.info("dispatcher listening on %s (state in %s)", self.address, self.store.state_dir)
        return self

    @property
    def address(self) -> str:
        """HOST:PORT clients can dial."""
        host = self.listen.rsplit(":", 1)[0]
        return f"{host}:{self.port}"

    def stop(self, grace: float | None = 1.0) -> None:
        """End agent streams and stop serving."""
        self.registry.close_all()
        self._server.stop(grace).wait()

    def wait_for_termination(self) -> None:
        """Block until the server stops."""
        self._server.wait_for_termination()


def serve(
    listen: str = DEFAULT_LISTEN,
    state_dir: str | Path = DEFAULT_STATE_DIR,
    *,
    report_provider: ReportProvider | None = None,
    window_provider: WindowProvider | None = None,
    compiler: BpfCompiler | None = None,
    ack_timeout: float = 5.0,
    tls: TLSFiles | None = None,
    tokens_file: str | Path | None = None,
) -> DispatcherServer:
    """Start a dispatcher serving `hoptrace.v1.Hoptrace` and `hoptrace.v1.AgentSession` on `listen`."""
    return DispatcherServer(
        listen,
        state_dir,
        report_provider=report_provider,
        window_provider=window_provider,
        compiler=compiler,
        ack_timeout=ack_timeout,
        tls=tls,
        tokens_file=tokens_file,
    ).start()
