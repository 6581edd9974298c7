"""The agents the dispatcher knows: what each registered (namespaces, devices, capabilities, kernel), whether
it is connected, when it last sent a heartbeat, and the live stream to push plans down."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from hoptrace.v1 import agent_pb2, api_pb2


class AgentConnection:
    """One open Connect stream of one agent: the messages queued for it, closed when the stream ends."""

    def __init__(self, registration: agent_pb2.Register) -> None:
        self.node = registration.node
        self.registration = registration
        self.connected_at = time.time()
        self._outgoing: queue.Queue[agent_pb2.DispatcherMessage | None] = queue.Queue()
        self._closed = threading.Event()

    @property
    def closed(self) -> bool:
        """True once the stream ended (agent gone, replaced by a newer stream, or server stopping)."""
        return self._closed.is_set()

    def send(self, message: agent_pb2.DispatcherMessage) -> bool:
        """Queue `message` for the agent; False when the stream is already closed."""
        if self._closed.is_set():
            return False
        self._outgoing.put(message)
        return True

    def close(self) -> None:
        """End the stream (idempotent)."""
        if not self._closed.is_set():
            self._closed.set()
            self._outgoing.put(None)

    def outgoing(self) -> Iterator[agent_pb2.DispatcherMessage]:
        """The messages to write to the stream, until close()."""
        while True:
            message = self._outgoing.get()
            if message is None or self._closed.is_set():
                return
            yield message


@dataclass
class AgentEntry:
    """What the registry holds for one node; kept after a disconnect so the node stays known."""

    registration: agent_pb2.Register
    connection: AgentConnection | None
    last_heartbeat: float
    lost_records: int = 0
    # The record transport as the agent's last heartbeat said (None before one).
    transport: agent_pb2.TransportStatus | None = None

    @property
    def connected(self) -> bool:
        return self.connection is not None and not self.connection.closed


class AgentRegistry:
    """Thread-safe registry of agents by node name."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, AgentEntry] = {}

    def connect(self, registration: agent_pb2.Register) -> AgentConnection:
        """Record a Register and open its connection; an older stream of the same node is closed."""
        connection = AgentConnection(registration)
        with self._lock:
            previous = self._entries.get(registration.node)
            self._entries[registration.node] = AgentEntry(registration, connection, time.time())
        if previous is not None and previous.connection is not None:
            previous.connection.close()
        return connection

    def disconnect(self, connection: AgentConnection) -> None:
        """Mark the node disconnected if `connection` is still its current stream."""
        connection.close()
        with self._lock:
            entry = self._entries.get(connection.node)
            if entry is not None and entry.connection is connection:
                entry.connection = None

    def heartbeat(
        self,
        node: str,
        inventory: agent_pb2.Inventory | None = None,
        transport: agent_pb2.TransportStatus | None = None,
    ) -> None:
        """Note that `node` is alive now; an `inventory` replaces the namespaces (devices, workloads) and
        the container runtime it registered with (a container started after the agent), so specs are
        validated against what is there now; a `transport` replaces what the node last said of its
        records' way out (buffered, dropped)."""
        with self._lock:
            entry = self._entries.get(node)
            if entry is not None:
                entry.last_heartbeat = time.time()
                if transport is not None:
                    entry.transport = transport
                if inventory is not None:
                    registration = agent_pb2.Register()
                    registration.CopyFrom(entry.registration)
                    del registration.namespaces[:]
                    registration.namespaces.extend(inventory.namespaces)
                    registration.runtime.CopyFrom(inventory.runtime)
                    entry.registration = registration

    def connection(self, node: str) -> AgentConnection | None:
        """The node's open stream, or None when it is not connected."""
        with self._lock:
            entry = self._entries.get(node)
            return entry.connection if entry is not None and entry.connected else None

    def registrations(self) -> dict[str, agent_pb2.Register]:
        """Every known node's last Register (connected or not), for spec validation."""
        with self._lock:
            return {node: entry.registration for node, entry in self._entries.items()}

    def close_all(self) -> None:
        """End every open stream (server shutdown)."""
        with self._lock:
            connections = [entry.connection for entry in self._entries.values() if entry.connection]
        for connection in connections:
            connection.close()

    def agent(self, node: str) -> api_pb2.Agent | None:
        """The API view of one node, or None when it never registered."""
        with self._lock:
            entry = self._entries.get(node)
            return _agent_message(entry) if entry is not None else None

    def agents(self) -> list[api_pb2.Agent]:
        """The API view of every known node, sorted by name."""
        with self._lock:
            return [_agent_message(self._entries[node]) for node in sorted(self._entries)]


def _agent_message(entry: AgentEntry) -> api_pb2.Agent:
    agent = api_pb2.Agent(connected=entry.connected, lost_records=entry.lost_records)
    agent.registration.CopyFrom(entry.registration)
    agent.last_heartbeat.FromNanoseconds(int(entry.last_heartbeat * 1e9))
    if entry.transport is not None:
        agent.transport.CopyFrom(entry.transport)
    return agent  # its clock is the collector's measurement: the API adds it (HoptraceServicer)
