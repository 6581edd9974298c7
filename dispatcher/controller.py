"""The dispatcher's desired state and how agents are brought to it.

`TraceController` owns the applied traces: apply validates, compiles, pushes a plan to every node of the spec
and waits for each node's TraceStatus; a failure anywhere rolls every node back (to the previous spec, or to
nothing) so no trace is ever half-applied. Reconnecting agents get the plans of their node, unless they
report the same generation already running.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import grpc

from hoptrace import kernel_abi
from hoptrace.common.timeouts import DEFAULT_ACK_TIMEOUT_S
from hoptrace.dispatcher.compile import (
    BpfCompiler,
    CompileError,
    build_plans,
    compile_spec,
    refused_action_fields,
)
from hoptrace.dispatcher.presets import PresetRunner
from hoptrace.dispatcher.registry import AgentConnection, AgentRegistry
from hoptrace.dispatcher.signing import MessageSigner
from hoptrace.dispatcher.state import StateStore, StoredTrace, now
from hoptrace.spec import CheckedSpec, FieldError, SpecError, check_spec, format_errors, validate_spec
from hoptrace.v1 import agent_pb2, api_pb2, trace_pb2

log = logging.getLogger(__name__)


class DispatcherError(Exception):
    """A request that cannot be done; `code` is the gRPC status the API answers with, `generation` the one
    an apply had reached when it failed (0: none; the audit trail says it)."""

    def __init__(self, code: grpc.StatusCode, message: str, generation: int = 0) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.generation = generation


def spec_nodes(spec: trace_pb2.TraceSpec) -> list[str]:
    """The spec's nodes in path order, each once, then the nodes of its events."""
    return list(dict.fromkeys([*(hop.node for hop in spec.hops), *(event.node for event in spec.events)]))


def status_failures(
    node: str,
    status: agent_pb2.TraceStatus,
    plan: agent_pb2.TracePlan | None,
    spec: trace_pb2.TraceSpec | None = None,
) -> list[str]:
    """Readable failures in one node's status, each naming the node and, when it is about one, the hop;
    with the spec, a hop whose actions the kernel's verifier refused is named by those actions' fields
    (``hops[2].actions[1]``)."""
    failures = []
    if status.error:
        failures.append(f"node {node}: {status.error}")
    for hop in status.hops:
        if hop.attached:
            continue
        reason = hop.error or "not attached"
        prefix = f"hop {hop.name}: "
        if reason.startswith(prefix):
            reason = reason[len(prefix) :]
        fields = []
        if spec is not None and hop.HasField("refused_actions"):
            fields = refused_action_fields(spec.hops, hop.hop_index, hop.refused_actions)
        if fields:
            failures.append(f"{', '.join(fields)}: hop {hop.name} on node {node}: {reason}")
        else:
            failures.append(f"hop {hop.name} (hops[{hop.hop_index}]) on node {node}: {reason}")
    for event in status.events:
        if not event.attached:
            # The agent's reason names the spec field (events[i].where[j]: ...).
            failures.append(f"event {event.name} on node {node}: {event.error or 'not attached'}")
    if plan is not None and not status.error:
        reported_events = {event.event_index for event in status.events}
        for event in plan.events:
            if event.event_index not in reported_events:
                failures.append(
                    f"event {event.name} (events[{event.event_index}]) on node {node}: no status reported"
                )
        reported = {hop.hop_index for hop in status.hops}
        for hop in plan.hops:
            if hop.hop_index not in reported:
                failures.append(f"hop {hop.name} (hops[{hop.hop_index}]) on node {node}: no status reported")
    if not failures and not status.active:
        failures.append(f"node {node}: trace not active")
    return failures


def _free_origin(taken: set[int], trace: str) -> int:
    """The lowest ID origin no applied trace has; raises DispatcherError when all are taken."""
    for origin in range(1, kernel_abi.TRACE_ORIGINS + 1):
        if origin not in taken:
            return origin
    raise DispatcherError(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        f"trace {trace}: {kernel_abi.TRACE_ORIGINS} traces are applied, as many as packet IDs can tell "
        "apart; delete one (hoptrace trace rm NAME) first",
    )


@dataclass
class _Trace:
    """One applied trace in memory: what is stored, the checked spec its plans are compiled from (lazily
    after a restart), and those plans."""

    stored: StoredTrace
    checked: CheckedSpec
    plans: dict[str, agent_pb2.TracePlan] | None = None
    nodes: list[str] = field(default_factory=list)


class _StatusBoard:
    """The latest TraceStatus per (trace, node), each with a sequence number so waiters see only new ones."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._sequence = 0
        self._latest: dict[tuple[str, str], tuple[int, agent_pb2.TraceStatus]] = {}

    def mark(self) -> int:
        """The current sequence number: statuses recorded after this are newer."""
        with self._condition:
            return self._sequence

    def record(self, node: str, status: agent_pb2.TraceStatus) -> None:
        with self._condition:
            self._sequence += 1
            self._latest[(status.trace, node)] = (self._sequence, status)
            self._condition.notify_all()

    def latest(self, trace: str, node: str) -> agent_pb2.TraceStatus | None:
        with self._condition:
            entry = self._latest.get((trace, node))
            return entry[1] if entry else None

    def forget(self, trace: str) -> None:
        with self._condition:
            for key in [key for key in self._latest if key[0] == trace]:
                del self._latest[key]

    def wait(
        self, trace: str, nodes: Iterable[str], after: int, accept, timeout: float
    ) -> dict[str, agent_pb2.TraceStatus | None]:
        """Per node, the first status newer than `after` that `accept(status)` takes; None on timeout."""
        deadline = time.monotonic() + timeout
        pending = set(nodes)
        found: dict[str, agent_pb2.TraceStatus | None] = dict.fromkeys(pending)
        with self._condition:
            while pending:
                for node in list(pending):
                    entry = self._latest.get((trace, node))
                    if entry and entry[0] > after and accept(entry[1]):
                        found[node] = entry[1]
                        pending.discard(node)
                remaining = deadline - time.monotonic()
                if not pending or remaining <= 0:
                    break
                self._condition.wait(remaining)
        return found


class TraceController:
    """Applies, deletes and reconciles traces across agents."""

    def __init__(
        self,
        registry: AgentRegistry,
        store: StateStore,
        compiler: BpfCompiler,
        ack_timeout: float = DEFAULT_ACK_TIMEOUT_S,
        signer: MessageSigner | None = None,
    ) -> None:
        self.registry = registry
        # Signs every plan and preset sent (an unsigning one when --insecure): docs/security.md.
        self.signer = signer or MessageSigner()
        self.store = store
        self.compiler = compiler
        self.ack_timeout = ack_timeout
        self._lock = threading.RLock()  # guards _traces
        self._apply_lock = threading.Lock()  # one apply/delete at a time
        self._traces: dict[str, _Trace] = {}
        self._discovery_origins: set[int] = set()  # held by running discoveries (discovery_origin)
        # Specs being pushed to their agents: WatchSpecs shows them already (see apply).
        self._applying: dict[str, trace_pb2.TraceSpec] = {}
        # Bumped on every change of the applied specs; watchers (WatchSpecs) wait on it.
        self._specs_version = 0
        self._specs_changed = threading.Condition(self._lock)
        self._statuses = _StatusBoard()
        # Presets (RunPreset) share the agents' sessions but no trace state.
        self.presets = PresetRunner(registry, signer=self.signer)
        for stored in store.load():
            try:
                checked = check_spec(stored.spec)
            except SpecError as error:
                log.error("stored trace %s no longer validates, not applied:\n%s", stored.spec.name, error)
                continue
            taken = {trace.stored.origin for trace in self._traces.values()}
            if not 0 < stored.origin <= kernel_abi.TRACE_ORIGINS or stored.origin in taken:
                # A state written before traces had origins (or a copied file): given one now, kept after.
                stored.origin = _free_origin(taken, stored.spec.name)
                store.save(stored)
            self._traces[stored.spec.name] = _Trace(stored, checked, nodes=spec_nodes(stored.spec))
        if self._traces:
            log.info("loaded %d trace(s) from %s", len(self._traces), store.state_dir)

    def _origins_taken(self) -> set[int]:
        """The ID origins applied traces and running discoveries hold (under the lock)."""
        return {trace.stored.origin for trace in self._traces.values()} | self._discovery_origins

    @contextmanager
    def discovery_origin(self) -> Iterator[int]:
        """An ID origin for one discovery, held while it runs: its taggers write IDs of it on every node and
        the crossing programs follow them through address translation, as a trace's hops do."""
        with self._lock:
            origin = _free_origin(self._origins_taken(), "discovery")
            self._discovery_origins.add(origin)
        try:
            yield origin
        finally:
            with self._lock:
                self._discovery_origins.discard(origin)

    # ---- queries ---------------------------------------------------------------------------------------

    def trace_filters(self) -> list[tuple[trace_pb2.Filter, int]]:
        """Each applied trace's filter and ID origin (a discovery follows those overlapping its flow)."""
        with self._lock:
            return [(trace.stored.spec.filter, trace.stored.origin) for trace in self._traces.values()]

    def validate(self, spec: trace_pb2.TraceSpec) -> list[FieldError]:
        """Problems in `spec`, checked against the registered agents; changes nothing."""
        return validate_spec(spec, self.registry.registrations())

    def trace_names(self) -> list[str]:
        with self._lock:
            return sorted(self._traces)

    def generation_of(self, name: str) -> int:
        """The generation trace `name` runs at (0 when it is not applied)."""
        with self._lock:
            trace = self._traces.get(name)
            return trace.stored.generation if trace else 0

    def spec_of(self, name: str) -> trace_pb2.TraceSpec | None:
        """The applied spec of trace `name`, or None."""
        with self._lock:
            trace = self._traces.get(name)
            return trace.stored.spec if trace else None

    def wait_specs(
        self, after_version: int, timeout_s: float
    ) -> tuple[int, list[trace_pb2.TraceSpec]] | None:
        """The applied specs, and those being applied, by name, and their version once it differs from
        `after_version`; None when nothing changed within `timeout_s`."""
        with self._specs_changed:
            if not self._specs_changed.wait_for(lambda: self._specs_version != after_version, timeout_s):
                return None
            specs = {name: trace.stored.spec for name, trace in self._traces.items()} | self._applying
            return self._specs_version, [specs[name] for name in sorted(specs)]

    def _set_applying(self, name: str, spec: trace_pb2.TraceSpec | None) -> None:
        """Show `spec` in WatchSpecs while it is being applied (None: no longer, the apply failed)."""
        with self._lock:
            if spec is None:
                self._applying.pop(name, None)
            else:
                self._applying[name] = spec
        self._specs_did_change()

    def _specs_did_change(self) -> None:
        with self._specs_changed:
            self._specs_version += 1
            self._specs_changed.notify_all()

    def get(self, name: str) -> api_pb2.Trace:
        """The API view of one trace; NOT_FOUND when it is not applied."""
        with self._lock:
            trace = self._traces.get(name)
        if trace is None:
            raise DispatcherError(grpc.StatusCode.NOT_FOUND, f"no trace named {name!r}")
        return self._trace_message(trace)

    def list(self) -> list[api_pb2.Trace]:
        """Every applied trace, by name."""
        with self._lock:
            traces = [self._traces[name] for name in sorted(self._traces)]
        return [self._trace_message(trace) for trace in traces]

    def _trace_message(self, trace: _Trace) -> api_pb2.Trace:
        stored = trace.stored
        message = api_pb2.Trace(generation=stored.generation)
        message.spec.CopyFrom(stored.spec)
        message.applied_at.FromDatetime(stored.applied_at)
        for node in trace.nodes:
            status = self._statuses.latest(stored.spec.name, node)
            if status is None or status.generation != stored.generation:
                waiting = "waiting for the agent" if self.registry.connection(node) else "agent not connected"
                status = agent_pb2.TraceStatus(
                    trace=stored.spec.name, generation=stored.generation, error=f"node {node}: {waiting}"
                )
            message.nodes.append(status)
        return message

    # ---- apply / delete --------------------------------------------------------------------------------

    def apply(self, spec: trace_pb2.TraceSpec) -> api_pb2.Trace:
        """Create or update a trace on every node of its spec, all or nothing; raises DispatcherError."""
        with self._apply_lock:
            try:
                checked = check_spec(spec, self.registry.registrations())
            except SpecError as error:
                raise DispatcherError(
                    grpc.StatusCode.INVALID_ARGUMENT, "invalid trace spec:\n" + format_errors(error.errors)
                ) from None
            # container:/pod: hops resolved now, once: the stored spec carries the typed workload.
            spec = checked.spec
            nodes = spec_nodes(spec)
            missing = [node for node in nodes if self.registry.connection(node) is None]
            if missing:
                raise DispatcherError(
                    grpc.StatusCode.UNAVAILABLE,
                    f"trace {spec.name}: no agent connected on node(s) {', '.join(missing)}; nothing changed",
                )
            with self._lock:
                previous = self._traces.get(spec.name)
                taken = self._origins_taken()
                origin = previous.stored.origin if previous else _free_origin(taken, spec.name)
            generation = self.store.next_generation()
            try:
                plans = compile_spec(checked, generation, self.compiler, origin)
            except CompileError as error:
                raise DispatcherError(
                    grpc.StatusCode.INTERNAL,
                    f"trace {spec.name}: compiling the BPF objects failed:\n{error}",
                    generation,
                ) from None
            # The collector gets the path before the agents attach: the packets in flight while the hops
            # attach one by one reach it before the apply returns, and are joined and named on this path.
            self._set_applying(spec.name, spec)
            try:
                failures = self._push_plans(spec.name, plans, spec)
            except BaseException:
                self._set_applying(spec.name, None)
                raise
            if failures:
                self._set_applying(spec.name, None)
                rollback_problems = self._roll_back(spec, previous)
                message = f"trace {spec.name} generation {generation} failed on its agents:\n"
                message += "\n".join(failures)
                message += (
                    f"\nrolled back to generation {previous.stored.generation}"
                    if previous
                    else "\nremoved from every node (nothing applied)"
                )
                if rollback_problems:
                    message += "\nrollback problems:\n" + "\n".join(rollback_problems)
                raise DispatcherError(grpc.StatusCode.FAILED_PRECONDITION, message, generation)
            stored = StoredTrace(spec=spec, generation=generation, applied_at=now(), origin=origin)
            self.store.save(stored)
            trace = _Trace(stored, checked, plans=plans, nodes=nodes)
            with self._lock:  # the set WatchSpecs shows is the same: the spec moves from applying to applied
                self._traces[spec.name] = trace
                self._applying.pop(spec.name, None)
            if previous is not None:
                dropped = [node for node in previous.nodes if node not in nodes]
                for problem in self._remove_from(spec.name, dropped):
                    log.warning("trace %s: %s", spec.name, problem)
            log.info("applied trace %s generation %d on %s", spec.name, generation, ", ".join(nodes))
            return self._trace_message(trace)

    def delete(self, name: str) -> list[str]:
        """Detach trace `name` everywhere and forget it; returns problems (nodes that did not acknowledge).

        Nodes that are disconnected are cleaned up when they reconnect (their Register lists the trace)."""
        with self._apply_lock:
            with self._lock:
                trace = self._traces.pop(name, None)
            if trace is None:
                raise DispatcherError(grpc.StatusCode.NOT_FOUND, f"no trace named {name!r}")
            self._specs_did_change()
            self.store.delete(name)
            problems = self._remove_from(name, trace.nodes)
            self._statuses.forget(name)
            for problem in problems:
                log.warning("trace %s: %s", name, problem)
            return problems

    def _push_plans(
        self, trace: str, plans: dict[str, agent_pb2.TracePlan], spec: trace_pb2.TraceSpec | None = None
    ) -> list[str]:
        """Send each node its plan and wait for the statuses; the failures, empty when all attached (named by
        `spec`'s fields when given)."""
        mark = self._statuses.mark()
        failures = []
        sent = []
        for node, plan in plans.items():
            connection = self.registry.connection(node)
            if connection is None or not self.signer.deliver(connection, node, apply=plan):
                failures.append(f"node {node}: agent disconnected")
            else:
                sent.append(node)
        generation = next(iter(plans.values())).generation if plans else 0
        statuses = self._statuses.wait(
            trace, sent, mark, lambda status: status.generation == generation, self.ack_timeout
        )
        for node in sent:
            status = statuses[node]
            if status is None:
                failures.append(f"node {node}: no status from the agent within {self.ack_timeout:g}s")
            else:
                failures.extend(status_failures(node, status, plans[node], spec))
        return failures

    def _remove_from(self, trace: str, nodes: Iterable[str]) -> list[str]:
        """Send RemoveTrace to `nodes` and wait for their (inactive) statuses; the problems."""
        mark = self._statuses.mark()
        problems = []
        sent = []
        remove = agent_pb2.RemoveTrace(trace=trace, generation=self.store.current_generation())
        for node in nodes:
            connection = self.registry.connection(node)
            if connection is None or not self.signer.deliver(connection, node, remove=remove):
                problems.append(f"node {node}: agent not connected; it is cleaned up when it reconnects")
            else:
                sent.append(node)
        statuses = self._statuses.wait(trace, sent, mark, lambda status: not status.active, self.ack_timeout)
        problems.extend(
            f"node {node}: removal not acknowledged within {self.ack_timeout:g}s"
            for node, status in statuses.items()
            if status is None
        )
        return problems

    def _roll_back(self, failed: trace_pb2.TraceSpec, previous: _Trace | None) -> list[str]:
        """Undo a failed apply: the previous spec again (as a new generation, so agents take it as newer),
        and removal from the nodes only the failed spec used."""
        failed_nodes = spec_nodes(failed)
        if previous is None:
            return self._remove_from(failed.name, failed_nodes)
        only_failed = [node for node in failed_nodes if node not in previous.nodes]
        problems = self._remove_from(failed.name, only_failed)
        generation = self.store.next_generation()
        try:
            plans = compile_spec(previous.checked, generation, self.compiler, previous.stored.origin)
        except CompileError as error:
            return [*problems, f"recompiling the previous spec failed: {error}"]
        problems.extend(self._push_plans(failed.name, plans))
        stored = StoredTrace(
            previous.stored.spec, generation, previous.stored.applied_at, origin=previous.stored.origin
        )
        self.store.save(stored)
        with self._lock:
            self._traces[failed.name] = _Trace(stored, previous.checked, plans=plans, nodes=previous.nodes)
        return problems

    # ---- agents ----------------------------------------------------------------------------------------

    def on_status(self, node: str, status: agent_pb2.TraceStatus) -> None:
        """Record a status an agent sent."""
        if status.generation:  # 0: the answer to a remove of a trace the agent did not run
            for failure in status_failures(node, status, None) if status.active or status.error else []:
                log.warning("trace %s generation %d: %s", status.trace, status.generation, failure)
        self._statuses.record(node, status)

    def _plan_for(self, trace: _Trace, node: str) -> agent_pb2.TracePlan:
        with self._lock:
            if trace.plans is None:
                trace.plans = build_plans(trace.checked, trace.stored.generation, trace.stored.origin)
            plan = trace.plans[node]
        if not plan.object:
            self.compiler.compile_plans({node: plan})
        return plan

    def on_agent_connected(self, connection: AgentConnection) -> None:
        """Bring a (re)connected agent to the desired state: push its node's plans, except those it already
        runs at the same generation, and remove traces it runs that are no longer wanted there."""
        node = connection.node
        running = {status.trace: status for status in connection.registration.running}
        with self._lock:
            wanted = [trace for trace in self._traces.values() if node in trace.nodes]
        wanted_names = {trace.stored.spec.name for trace in wanted}
        for trace in wanted:
            name = trace.stored.spec.name
            status = running.get(name)
            if status is not None and status.generation == trace.stored.generation and status.active:
                self._statuses.record(node, status)
                log.info("node %s already runs %s generation %d", node, name, status.generation)
                continue
            try:
                plan = self._plan_for(trace, node)
            except CompileError as error:
                log.error("trace %s: cannot compile the plan of node %s: %s", name, node, error)
                self._statuses.record(
                    node,
                    agent_pb2.TraceStatus(
                        trace=name, generation=trace.stored.generation, error=f"compile failed: {error}"
                    ),
                )
                continue
            log.info("pushing %s generation %d to node %s", name, plan.generation, node)
            self.signer.deliver(connection, node, apply=plan)
        for name in running:
            if name not in wanted_names:
                log.info("node %s runs %s, which is not applied there: removing", node, name)
                remove = agent_pb2.RemoveTrace(trace=name, generation=self.store.current_generation())
                self.signer.deliver(connection, node, remove=remove)
