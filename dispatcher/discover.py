"""Path discovery (`Hoptrace.Discover`, `hoptrace discover`): which devices a flow's packets cross, in order.

The dispatcher runs the agents' ``discover`` preset on every node at once (RunPreset down each session):
each agent tags the flow in the namespace that sends it (the ordinary taggers: tc egress for UDP, sock_ops
for TCP) and records every device crossing of a tagged packet in the namespaces it owns (its ``--netns``
plus ``--netns-owned``), each with its timestamp on the master's clock (the agent's own Cristian estimate
against the collector's time service, as its records are aligned). Here the nodes' crossings are merged per
packet into paths:

* within a node, crossings keep the order of their own CLOCK_MONOTONIC timestamps (exact);
* across nodes, each node's crossings form one run, and runs are ordered by their first aligned timestamp
  (a wire is faster than clocks agree, so single crossings are never interleaved by time); a run splits
  where the packet clearly left the node and came back (order_packet);
* packets that took exactly the same crossings form one path; each path is reported with its share (ECMP, a
  changed route, packets lost on the way).
* each step from one crossing to the next that some packets made is an edge of the path graph
  (DiscoverResult.segments), with the median and p99 of those packets' step times: one node's own clock
  within a node, the aligned clocks across nodes.
* a packet whose addresses a node translates (a Service's DNAT, a masquerade) is followed by its ID: the
  crossings after the translation are flagged ``followed`` (the filter refused the packet there), and the
  step into the first of them is the segment marked ``translated``. The IDs followed are the discovery's
  own origin's and those of applied traces whose filter overlaps the flow (their taggers may tag the
  flow's packets first, and a tagger never overwrites an ID); a packet no crossing saw matching the
  filter is another flow of such a trace, and is left out.

Each crossing becomes a hop at ``tc-egress`` / ``tc-ingress`` of its device, named
``NODE-[NETNS-]DEV-out|in`` with the common prefixes of node and namespace names left out (``a-veth-c1-in``).
"""

from __future__ import annotations

import ipaddress
import itertools
import json
import queue
import re
import statistics
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace

import grpc
from google.protobuf import json_format

from hoptrace.common.stats import quantile
from hoptrace.dispatcher.compile import flow_match
from hoptrace.dispatcher.presets import MAX_DURATION_S, PresetError, PresetRunner
from hoptrace.spec import FieldError, at_spelling, format_errors, validate_filter
from hoptrace.spec import workloads as workloads_mod
from hoptrace.spec.spec import NAME_PATTERN
from hoptrace.v1 import agent_pb2, api_pb2, trace_pb2

DEFAULT_DURATION_MS = 5000
DEFAULT_NAME = "discovered"
PROGRESS_EVERY_S = 1.0
# A node's crossings of one packet are split into two visits only around another node's crossings that lie
# this far inside the gap: well above clock bounds between hosts (tens of microseconds at worst on a LAN).
SPLIT_TOLERANCE_NS = 50_000


@dataclass(frozen=True)
class Crossing:
    """One device crossing of one packet, as a node's agent reported it."""

    node: str
    # The packet's ID, of the discovery's own origin: the flow's address and ports may change on the way
    # (a Service's DNAT), its ID does not; only the sender's namespace tags, so IDs do not repeat.
    packet: int
    mono_ns: int
    master_ns: int
    netns: str
    dev: str
    direction: str  # "ingress" or "egress"
    # The filter refused the packet here and its ID took it: its addresses were translated before.
    followed: bool = False

    @property
    def place(self) -> tuple[str, str, str, str]:
        """Where the crossing happened: (node, netns, dev, direction)."""
        return (self.node, self.netns, self.dev, self.direction)


def validate_request(request: api_pb2.DiscoverRequest, connected: Iterable[str]) -> list[FieldError]:
    """The request's problems, each naming its field."""
    errors: list[FieldError] = []
    validate_filter(trace_pb2.TraceSpec(filter=request.filter), errors)
    if request.filter.protocol not in ("udp", "tcp"):
        errors.append(FieldError("filter.protocol", "required: udp or tcp (the tagger depends on it)"))
    if not request.filter.src:
        errors.append(
            FieldError("filter.src", "required: packets are tagged in the namespace that sends them")
        )
    if request.duration_ms and not 0 < request.duration_ms <= MAX_DURATION_S * 1000:
        errors.append(FieldError("duration_ms", f"{request.duration_ms}: want 0 < duration <= 1h"))
    if request.name and not NAME_PATTERN.match(request.name):
        errors.append(FieldError("name", f"{request.name!r}: want [a-z0-9-]+"))
    known = set(connected)
    for index, node in enumerate(request.nodes):
        if node not in known:
            errors.append(FieldError(f"nodes[{index}]", f"no agent connected for node {node!r}"))
    return errors


def _overlap(a: str, b: str) -> bool:
    """Whether two filter address fields (address or CIDR, "" = any) may take the same address."""
    if not a or not b:
        return True
    try:
        return ipaddress.ip_network(a, strict=False).overlaps(ipaddress.ip_network(b, strict=False))
    except (ValueError, TypeError):  # another family, or not an address: no common address
        return False


def overlapping_origins(flow: trace_pb2.Filter, traces: Iterable[tuple[trace_pb2.Filter, int]]) -> list[int]:
    """The ID origins of the traces (filter, origin) whose filter may take packets of `flow`: their taggers
    may tag the flow's packets before the discovery's, so the discovery follows their IDs too."""
    origins = set()
    for flt, origin in traces:
        if flt.protocol and flow.protocol and flt.protocol != flow.protocol:
            continue
        if any(x and y and x != y for x, y in ((flt.src_port, flow.src_port), (flt.dst_port, flow.dst_port))):
            continue
        if _overlap(flt.src, flow.src) and _overlap(flt.dst, flow.dst):
            origins.add(origin)
    return sorted(origins)


def crossings_of(node: str, summary: dict) -> list[Crossing]:
    """The crossings of one node's discover summary."""
    return [
        Crossing(
            node=node,
            packet=int(c["packet_id"]),
            mono_ns=int(c["mono_ns"]),
            master_ns=int(c["master_ns"]),
            netns=c["netns"],
            dev=c["dev"],
            direction=c["direction"],
            followed=bool(c.get("followed")),
        )
        for c in summary.get("crossings") or []
    ]


def order_packet(crossings: Sequence[Crossing]) -> list[Crossing]:
    """One packet's crossings in path order.

    Within a node, the node's own monotonic clock orders them (exact). Across nodes, aligned clocks are only
    good to their bounds, and a wire between two emulated hosts takes less than that: ordering single
    crossings by aligned time would swap a sender's last egress with the receiver's first ingress. So each
    node's crossings stay together as one run, and runs are ordered by their first crossing; a run is split
    only where another node's crossings fall inside its gap by more than SPLIT_TOLERANCE_NS on both sides
    (the packet left the node and came back)."""
    per_node: dict[str, list[Crossing]] = defaultdict(list)
    for crossing in crossings:
        per_node[crossing.node].append(crossing)
    segments: list[list[Crossing]] = []
    for node, run in per_node.items():
        run.sort(key=lambda c: c.mono_ns)
        elsewhere = [c.master_ns for c in crossings if c.node != node]
        segment = [run[0]]
        for previous, current in itertools.pairwise(run):
            low, high = previous.master_ns + SPLIT_TOLERANCE_NS, current.master_ns - SPLIT_TOLERANCE_NS
            if low < high and any(low < t < high for t in elsewhere):
                segments.append(segment)
                segment = []
            segment.append(current)
        segments.append(segment)
    segments.sort(key=lambda segment: segment[0].master_ns)
    return [crossing for segment in segments for crossing in segment]


def _common_prefix(names: Sequence[str]) -> str:
    """The common prefix of `names` up to and including its last '-' (empty with fewer than two names)."""
    names = sorted(set(names))
    if len(names) < 2:
        return ""
    first, last = names[0], names[-1]
    size = 0
    while size < min(len(first), len(last)) and first[size] == last[size]:
        size += 1
    return first[: first.rfind("-", 0, size) + 1]


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "x"


class HopNamer:
    """Readable, unique hop names: ``a-veth-c1-in`` for veth-c1 of node host-a receiving."""

    def __init__(self, nodes: Sequence[str], namespaces: Sequence[str]) -> None:
        self.node_prefix = _common_prefix(nodes)
        self.netns_prefix = _common_prefix([ns for ns in namespaces if ns])
        self.used: set[str] = set()

    def name(self, node: str, netns: str, dev: str, direction: str) -> str:
        """The name of one crossing's hop, unique among those this namer gave."""
        parts = [node.removeprefix(self.node_prefix) or node]
        if netns:  # a pod's name, a container's, or the namespace's last path element
            label = netns.rsplit("/", 1)[-1].removeprefix(workloads_mod.CONTAINER_PREFIX)
            parts.append(label.removeprefix(self.netns_prefix))
        parts += [dev, "in" if direction == "ingress" else "out"]
        base = _slug("-".join(parts))
        name, suffix = base, 2
        while name in self.used:
            name, suffix = f"{base}-{suffix}", suffix + 1
        self.used.add(name)
        return name


def build_paths(
    crossings: Sequence[Crossing], window: tuple[int, int] | None = None
) -> list[api_pb2.DiscoveredPath]:
    """Every path the packets took, most packets first, with generated hop names. With `window` (master
    time in which every node listened), only packets that crossed everything inside it count: a node that
    started listening later, or stopped earlier, would otherwise cut paths short."""
    return build_graph(crossings, window)[0]


def _step_ns(before: Crossing, after: Crossing) -> int:
    """Time from one crossing of a packet to its next: the node's own clock when both are on one node
    (exact), the aligned clocks across nodes."""
    if before.node == after.node:
        return after.mono_ns - before.mono_ns
    return after.master_ns - before.master_ns


def build_graph(
    crossings: Sequence[Crossing], window: tuple[int, int] | None = None
) -> tuple[list[api_pb2.DiscoveredPath], list[api_pb2.DiscoveredSegment]]:
    """The paths (as build_paths) and the path graph's edges: each step some packets made from one
    crossing to the next, with its packets, share and the median and p99 of those packets' own step
    times, in the order the steps first appear along the paths (most common path first)."""
    by_packet: dict[int, list[Crossing]] = defaultdict(list)
    for crossing in crossings:
        by_packet[crossing.packet].append(crossing)
    # A packet followed everywhere (a trace's, by its ID) that no crossing saw matching the filter is
    # another flow of that trace. A packet of the flow matched at least where it was sent.
    ordered = {
        packet: order_packet(cs) for packet, cs in by_packet.items() if not all(c.followed for c in cs)
    }
    if window is not None:
        ordered = {
            packet: path
            for packet, path in ordered.items()
            if window[0] <= min(c.master_ns for c in path) and max(c.master_ns for c in path) <= window[1]
        }
    counts: Counter[tuple[tuple[str, str, str, str], ...]] = Counter()
    offsets: dict[tuple, list[list[int]]] = defaultdict(list)
    steps: dict[tuple, list[int]] = defaultdict(list)
    translated: set[tuple] = set()
    for path in ordered.values():
        key = tuple(c.place for c in path)
        counts[key] += 1
        since = [0]
        for before, after in itertools.pairwise(path):
            step = _step_ns(before, after)
            steps[(before.place, after.place)].append(step)
            if after.followed and not before.followed:
                translated.add((before.place, after.place))
            # A packet does not arrive before it left: a step across nodes that aligned clocks make
            # negative is within their bound, and would show the path going back in time.
            since.append(since[-1] + max(step, 0))
        offsets[key].append(since)
    total = sum(counts.values())
    nodes = sorted({c.node for c in crossings})
    namespaces = sorted({c.netns for c in crossings})
    result = []
    segments: dict[tuple, api_pb2.DiscoveredSegment] = {}
    for key, count in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
        namer = HopNamer(nodes, namespaces)
        hops = [
            trace_pb2.HopSpec(
                name=namer.name(node, netns, dev, direction),
                node=node,
                at=at_spelling(
                    trace_pb2.ATTACH_KIND_TC_INGRESS
                    if direction == "ingress"
                    else trace_pb2.ATTACH_KIND_TC_EGRESS
                ),
                dev=dev,
                netns=netns,
            )
            for node, netns, dev, direction in key
        ]
        since_first = [int(statistics.median(column)) for column in zip(*offsets[key], strict=True)]
        result.append(
            api_pb2.DiscoveredPath(packets=count, share=count / total, hops=hops, since_first_ns=since_first)
        )
        for index, step in enumerate(itertools.pairwise(key)):
            if step in segments:
                continue
            times = sorted(steps[step])
            segments[step] = api_pb2.DiscoveredSegment(
                from_hop=hops[index],
                to_hop=hops[index + 1],
                packets=len(times),
                share=len(times) / total,
                median_ns=quantile(times, 0.5),
                p99_ns=quantile(times, 0.99),
                translated=step in translated,
            )
    return result, list(segments.values())


def workload_netns(netns: str, namespace: agent_pb2.Namespace | None) -> str:
    """How a hop names the namespace a crossing was in: ``pod:NAMESPACE/NAME`` when the node reported one pod
    there, ``container:NAME`` for one container outside pods, else the namespace's own name (a pod's is a
    runtime's random name, and changes when the pod is made again)."""
    workloads = list(namespace.workloads) if namespace is not None else []
    pods = {(w.pod_namespace, w.pod_name) for w in workloads if w.pod_name}
    if len(pods) == 1 and all(w.pod_name for w in workloads):
        pod_namespace, pod_name = pods.pop()
        return f"{workloads_mod.POD_PREFIX}{pod_namespace}/{pod_name}"
    if len(workloads) == 1 and workloads[0].container_name:
        return f"{workloads_mod.CONTAINER_PREFIX}{workloads[0].container_name}"
    return netns


def name_workloads(
    crossings: list[Crossing], registrations: Mapping[str, agent_pb2.Register]
) -> list[Crossing]:
    """The crossings, each namespace named by its workload where its node reported one (workload_netns)."""
    namespaces = {
        (node, ns.name): ns for node, registration in registrations.items() for ns in registration.namespaces
    }
    # A node's own namespace (the agent's, "") may also have a name, and hold host-network pods (the
    # agent's own): it is the node's, never a pod's.
    own = {
        (node, ns.inode)
        for node, registration in registrations.items()
        for ns in registration.namespaces
        if not ns.name
    }

    def named(c: Crossing) -> str:
        namespace = namespaces.get((c.node, c.netns))
        if not c.netns or (namespace is not None and (c.node, namespace.inode) in own):
            return c.netns
        return workload_netns(c.netns, namespace)

    return [replace(c, netns=named(c)) for c in crossings]


def build_result(
    request: api_pb2.DiscoverRequest,
    summaries: dict[str, dict],
    duration_ms: int,
    registrations: Mapping[str, agent_pb2.Register] | None = None,
) -> api_pb2.DiscoverResult:
    """The result of the nodes' summaries: every path, and a spec of the most common one; namespaces named
    by their pod or container where `registrations` (the nodes' latest) say."""
    crossings = [c for node, summary in summaries.items() for c in crossings_of(node, summary)]
    crossings = name_workloads(crossings, registrations or {})
    window = None
    if summaries and all("listen_from_ns" in s for s in summaries.values()):
        window = (
            max(int(s["listen_from_ns"]) for s in summaries.values()),
            min(int(s["listen_until_ns"]) for s in summaries.values()),
        )
    paths, segments = build_graph(crossings, window)
    spec = trace_pb2.TraceSpec(name=request.name or DEFAULT_NAME, filter=request.filter)
    nodes = sorted(summaries)
    result = api_pb2.DiscoverResult(
        spec=spec, paths=paths, packets=sum(p.packets for p in paths), nodes=nodes, segments=segments
    )
    if paths:
        result.spec.hops.extend(paths[0].hops)
    else:
        result.message = (
            f"no packet of the flow was seen in {duration_ms / 1000:g}s on {', '.join(nodes)}: "
            "is it sending, and does the source address belong to a namespace of one of these nodes?"
        )
    return result


def run_discovery(
    presets: PresetRunner,
    connected: Sequence[str],
    request: api_pb2.DiscoverRequest,
    origin: int,
    traces: Iterable[tuple[trace_pb2.Filter, int]] = (),
) -> Iterator[api_pb2.DiscoverEvent]:
    """Run discover on the nodes at once; progress events as nodes finish, then the result. `origin` is the
    discovery's own ID origin (Controller.discovery_origin): every node tags with it and follows it;
    `traces` are the applied traces' filters and origins (Controller.trace_filters): the nodes also follow
    the IDs of those that overlap the flow (overlapping_origins).
    Raises PresetError (with the status to answer) for a bad request or a failed node."""
    errors = validate_request(request, connected)
    if errors:
        raise PresetError(grpc.StatusCode.INVALID_ARGUMENT, format_errors(errors))
    nodes = list(dict.fromkeys(request.nodes)) or sorted(connected)
    if not nodes:
        raise PresetError(grpc.StatusCode.FAILED_PRECONDITION, "no agent is connected")
    duration_ms = request.duration_ms or DEFAULT_DURATION_MS
    args = {
        "match": json_format.MessageToJson(flow_match(request.filter), indent=None),
        "duration": f"{duration_ms / 1000:g}s",
        "packets": str(request.packets),
        "origin": str(origin),
    }
    follow = [o for o in overlapping_origins(request.filter, traces) if o != origin]
    if follow:  # only then: an agent without --follow still runs a discovery no trace overlaps
        args["follow"] = ",".join(map(str, follow))
    done: queue.Queue[tuple[str, dict | None, PresetError | None]] = queue.Queue()

    def run(node: str) -> None:
        try:
            result = presets.run(node, "discover", args)
            done.put((node, json.loads(result.summary_json), None))
        except PresetError as error:
            done.put((node, None, error))
        except Exception as error:  # a thread must always answer, or the stream waits forever
            done.put((node, None, PresetError(grpc.StatusCode.INTERNAL, f"node {node}: {error}")))

    for node in nodes:
        threading.Thread(target=run, args=(node,), name=f"discover-{node}", daemon=True).start()
    yield api_pb2.DiscoverEvent(
        progress=api_pb2.DiscoverProgress(
            message=f"looking on {', '.join(nodes)} for up to {duration_ms / 1000:g}s",
            nodes_pending=len(nodes),
        )
    )
    summaries: dict[str, dict] = {}
    failures: list[PresetError] = []
    started = time.monotonic()
    for pending in range(len(nodes) - 1, -1, -1):
        while True:
            try:
                node, summary, error = done.get(timeout=PROGRESS_EVERY_S)
                break
            except queue.Empty:
                # While the agents look: a heartbeat the user sees, and that keeps the stream alive.
                left = duration_ms / 1000 - (time.monotonic() - started)
                text = f"{left:.0f}s left" if left > 0 else "waiting for the agents' answers"
                yield api_pb2.DiscoverEvent(
                    progress=api_pb2.DiscoverProgress(message=f"looking: {text}", nodes_pending=pending + 1)
                )
        if error is not None:
            failures.append(error)
            message = error.message
            packets = 0
        else:
            summaries[node] = summary
            packets = int(summary.get("packets", 0))
            crossings = len(summary.get("crossings") or [])
            tagging = summary.get("tagging") or []
            message = f"{node}: {packets} packets, {crossings} crossings" + (
                f"; tagged with {', '.join(tagging)}" if tagging else ""
            )
        yield api_pb2.DiscoverEvent(
            progress=api_pb2.DiscoverProgress(
                message=message, node=node, packets=packets, nodes_pending=pending
            )
        )
    if failures:
        # Half a path would look like a whole one: fail, naming each node and its reason.
        raise PresetError(failures[0].code, "; ".join(f.message for f in failures))
    yield api_pb2.DiscoverEvent(
        result=build_result(request, summaries, duration_ms, presets.registry.registrations())
    )
