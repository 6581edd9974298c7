"""Test doubles for the dispatcher tests: a fake agent speaking AgentSession over a real gRPC channel (a
stand-in for the Go agent), registering as spec_fixtures' example agents do."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator

import grpc
from spec_fixtures import NODE_NAMESPACES, make_registration

from hoptrace.v1 import agent_pb2, agent_pb2_grpc


class FakeAgent:
    """Connects to a dispatcher, registers, answers each apply with a TraceStatus (hops in `fail_hops`
    report an attach error) and each remove with an inactive status; records what it received."""

    def __init__(
        self,
        address: str,
        node: str,
        *,
        fail_hops: dict[str, str] | None = None,
        running: list[agent_pb2.TraceStatus] | None = None,
        reply: bool = True,
    ) -> None:
        self.node = node
        self.fail_hops = dict(fail_hops or {})
        self.reply = reply
        self.registration = make_registration(node, NODE_NAMESPACES.get(node, {"": ["lo"]}), running)
        self.received: list[agent_pb2.DispatcherMessage] = []
        self.running: dict[str, agent_pb2.TraceStatus] = {status.trace: status for status in running or []}
        self._outgoing: queue.Queue[agent_pb2.AgentMessage | None] = queue.Queue()
        self._condition = threading.Condition()
        self._channel = grpc.insecure_channel(address)
        self._stream = None
        self._thread: threading.Thread | None = None
        self.ended = threading.Event()

    def _messages(self) -> Iterator[agent_pb2.AgentMessage]:
        yield agent_pb2.AgentMessage(register=self.registration)
        while True:
            message = self._outgoing.get()
            if message is None:
                return
            yield message

    def start(self) -> FakeAgent:
        stub = agent_pb2_grpc.AgentSessionStub(self._channel)
        self._stream = stub.Connect(self._messages())
        self._thread = threading.Thread(target=self._serve, name=f"fake-agent-{self.node}", daemon=True)
        self._thread.start()
        return self

    def _serve(self) -> None:
        try:
            for message in self._stream:
                with self._condition:
                    self.received.append(message)
                    self._condition.notify_all()
                if self.reply:
                    self._outgoing.put(agent_pb2.AgentMessage(trace_status=self._status_for(message)))
        except grpc.RpcError:
            pass
        finally:
            self.ended.set()

    def _status_for(self, message: agent_pb2.DispatcherMessage) -> agent_pb2.TraceStatus:
        if message.WhichOneof("body") == "remove":
            previous = self.running.pop(message.remove.trace, None)
            return agent_pb2.TraceStatus(
                trace=message.remove.trace, generation=previous.generation if previous else 0, active=False
            )
        plan = message.apply
        status = agent_pb2.TraceStatus(trace=plan.trace, generation=plan.generation, active=True)
        for hop in plan.hops:
            error = self.fail_hops.get(hop.name, "")
            status.hops.add(
                hop_index=hop.hop_index,
                name=hop.name,
                attached=not error,
                error=f"hop {hop.name}: {error}" if error else "",
            )
        if any(not hop.attached for hop in status.hops):
            status.active = False
            self.running.pop(plan.trace, None)
        else:
            self.running[plan.trace] = status
        return status

    def send_heartbeat(self) -> None:
        message = agent_pb2.AgentMessage()
        message.heartbeat.sent_at.GetCurrentTime()
        self._outgoing.put(message)

    def wait_for(
        self, predicate: Callable[[list[agent_pb2.DispatcherMessage]], bool], timeout: float = 10.0
    ) -> list[agent_pb2.DispatcherMessage]:
        """Block until `predicate(received)` holds; returns the messages received so far."""
        deadline = time.monotonic() + timeout
        with self._condition:
            while not predicate(self.received):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"{self.node}: condition not met; received {self.kinds()}")
                self._condition.wait(remaining)
            return list(self.received)

    def kinds(self) -> list[str]:
        """What arrived, e.g. ["apply udp-a-to-b g1", "remove udp-a-to-b"]."""
        with self._condition:
            return [
                f"apply {m.apply.trace} g{m.apply.generation}"
                if m.WhichOneof("body") == "apply"
                else f"remove {m.remove.trace}"
                for m in self.received
            ]

    def stop(self) -> None:
        """Close the stream like an agent that exits."""
        self._outgoing.put(None)
        if self._stream is not None:
            self._stream.cancel()
        self.ended.wait(5)
        self._channel.close()
