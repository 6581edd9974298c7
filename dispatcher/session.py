"""The agents' side of the dispatcher: the `AgentSession.Connect` stream.

The first message must be Register. The dispatcher then pushes the node's plans (see
TraceController.on_agent_connected) and later applies/removes down the same stream; the agent answers with
TraceStatus messages, PresetResults (dispatcher/presets.py) and heartbeats, read on a thread of their own.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import grpc

from hoptrace.dispatcher.controller import TraceController
from hoptrace.dispatcher.registry import AgentConnection, AgentRegistry
from hoptrace.v1 import agent_pb2, agent_pb2_grpc

log = logging.getLogger(__name__)


class AgentSessionServicer(agent_pb2_grpc.AgentSessionServicer):
    """Serves `hoptrace.v1.AgentSession`: one long-lived Connect stream per agent."""

    def __init__(self, registry: AgentRegistry, controller: TraceController) -> None:
        self.registry = registry
        self.controller = controller

    def Connect(  # noqa: N802 (gRPC method name)
        self, request_iterator: Iterator[agent_pb2.AgentMessage], context: grpc.ServicerContext
    ) -> Iterator[agent_pb2.DispatcherMessage]:
        """Register the agent, push its plans, then relay plans down and statuses up until one side ends."""
        try:
            first = next(request_iterator)
        except StopIteration:
            return
        if first.WhichOneof("body") != "register" or not first.register.node:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "a session's first message must be Register with a node"
            )
        registration = first.register
        connection = self.registry.connect(registration)
        context.add_callback(connection.close)
        log.info(
            "agent %s connected (kernel %s, agent %s, %d namespace(s), %d running trace(s))",
            registration.node,
            registration.kernel_release,
            registration.agent_version,
            len(registration.namespaces),
            len(registration.running),
        )
        reader = threading.Thread(
            target=self._read_agent_messages,
            args=(request_iterator, connection),
            name=f"agent-{registration.node}",
            daemon=True,
        )
        reader.start()
        try:
            self.controller.on_agent_connected(connection)
            yield from connection.outgoing()
        finally:
            self.registry.disconnect(connection)
            log.info("agent %s disconnected", registration.node)

    def _read_agent_messages(
        self, request_iterator: Iterator[agent_pb2.AgentMessage], connection: AgentConnection
    ) -> None:
        try:
            for message in request_iterator:
                kind = message.WhichOneof("body")
                if kind == "heartbeat":
                    beat = message.heartbeat
                    inventory = beat.inventory if beat.HasField("inventory") else None
                    transport = beat.transport if beat.HasField("transport") else None
                    self.registry.heartbeat(connection.node, inventory, transport)
                elif kind == "trace_status":
                    self.registry.heartbeat(connection.node)
                    self.controller.on_status(connection.node, message.trace_status)
                elif kind == "preset_result":
                    self.registry.heartbeat(connection.node)
                    self.controller.presets.on_result(connection.node, message.preset_result)
                elif kind == "register":
                    log.warning("agent %s sent Register again mid-session: ignored", connection.node)
        except grpc.RpcError as error:
            log.info("agent %s stream ended: %s", connection.node, error)
        except Exception:  # a reader thread must never die silently
            log.exception("agent %s: reading the stream failed", connection.node)
        finally:
            connection.close()
