"""The collector's knowledge of each trace's path: hop names and nodes by hop index.

The dispatcher feeds it (`set_trace`, `set_spec`); a JSON/YAML file can preload it (`load_file`); and as a
fallback the collector learns hop names from the `HopCounters.hop` of incoming batches (`learn_hop`). A path
set explicitly is authoritative: learned names never override it.

A collector that follows a dispatcher knows no path until the dispatcher's first set of specs has come
(`awaiting_paths`, `catalog_sync.py`): a restarted one can get the agents' backlog before that, and the join
holds it meanwhile instead of joining it without its path (`join.HopJoiner`).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hoptrace import kernel_abi
from hoptrace.v1 import trace_pb2

# A path longer than this is refused (hoptrace.h: keeps per-packet join state bounded).
MAX_HOPS = kernel_abi.MAX_HOPS


@dataclass(frozen=True, slots=True)
class DropSite:
    """A drop hop of a trace with ``drops: true`` (`trace_pb2.DropHop`): the skb:kfree_skb hop of one node
    and namespace, whose records are the trace's packets the kernel dropped there, with the reason's value
    in its kernel's enum skb_drop_reason, named by `reasons`."""

    hop_index: int
    node: str
    name: str
    reasons: Mapping[int, str] = field(default_factory=dict)

    def reason_name(self, value: int) -> str:
        """The reason's name on this node's kernel ("NETFILTER_DROP"); `reason<N>` when it has none."""
        return self.reasons.get(value) or f"reason{value}"


@dataclass(frozen=True, slots=True)
class TracePath:
    """A trace's hops in path order. `known` is False when it was only learned from counters."""

    name: str
    hop_names: tuple[str, ...]
    hop_nodes: tuple[str, ...]
    known: bool
    version: int
    # Per hop: the container and pod ("namespace/name") its netns belongs to, as the dispatcher resolved a
    # `netns: container:NAME` / `pod:NS/NAME` (`HopSpec.workload`); "" for other hops. Empty: none known.
    hop_workloads: tuple[tuple[str, str], ...] = ()
    # The drop hops (`drops: true`), whose indexes follow the path's: not part of the path.
    drop_hops: tuple[DropSite, ...] = ()

    def hop_name(self, index: int) -> str:
        """Name of hop `index` (a drop hop's too), or a placeholder `hop<index>` when not known."""
        if index < len(self.hop_names) and self.hop_names[index]:
            return self.hop_names[index]
        drop = self.drop_site(index)
        return drop.name if drop is not None else f"hop{index}"

    def hop_node(self, index: int) -> str:
        """Node of hop `index` (a drop hop's too), or "" when not known."""
        if index < len(self.hop_nodes):
            return self.hop_nodes[index]
        drop = self.drop_site(index)
        return drop.node if drop is not None else ""

    def drop_site(self, index: int) -> DropSite | None:
        """The drop hop whose records carry hop index `index`, or None."""
        position = index - len(self.hop_names)
        if 0 <= position < len(self.drop_hops) and self.drop_hops[position].hop_index == index:
            return self.drop_hops[position]
        return next((drop for drop in self.drop_hops if drop.hop_index == index), None)

    def hop_workload(self, index: int) -> tuple[str, str]:
        """(container, pod) of hop `index`: ("", "") when it was not given by a workload."""
        return self.hop_workloads[index] if index < len(self.hop_workloads) else ("", "")


class TraceCatalog:
    """Thread-safe map trace name -> `TracePath`; every change bumps that trace's `version`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._paths: dict[str, TracePath] = {}
        self._specs: dict[str, trace_pb2.TraceSpec] = {}  # as the dispatcher gave them (set_spec)
        self._version = 0
        self._awaiting = False

    @property
    def awaiting_paths(self) -> bool:
        """True from `expect_paths` until `paths_synced`: the paths are on their way (the dispatcher's first
        set of specs), so a trace not known yet may well be one."""
        return self._awaiting

    def expect_paths(self) -> None:
        """The paths come from elsewhere (a dispatcher being followed) and have not come yet."""
        self._awaiting = True

    def paths_synced(self) -> None:
        """Every path the source had has been set (its first whole set of specs)."""
        self._awaiting = False

    def set_trace(
        self,
        name: str,
        hop_names: Sequence[str],
        hop_nodes: Sequence[str] | None = None,
        hop_workloads: Sequence[tuple[str, str]] | None = None,
        drop_hops: Sequence[DropSite] = (),
    ) -> None:
        """Set the path of trace `name`: `hop_names[i]` is hop i; `hop_nodes[i]` its node and
        `hop_workloads[i]` its (container, pod) (both optional); `drop_hops` its drop hops."""
        if not name:
            raise ValueError("trace name is empty")
        if not hop_names or len(hop_names) > MAX_HOPS:
            raise ValueError(f"trace {name}: a path has 1..{MAX_HOPS} hops, got {len(hop_names)}")
        if len(set(hop_names)) != len(hop_names):
            raise ValueError(f"trace {name}: hop names must be unique")
        nodes = tuple(hop_nodes) if hop_nodes is not None else ("",) * len(hop_names)
        if len(nodes) != len(hop_names):
            raise ValueError(f"trace {name}: {len(hop_names)} hop names but {len(nodes)} hop nodes")
        workloads = tuple(hop_workloads) if hop_workloads is not None else ()
        if workloads and len(workloads) != len(hop_names):
            raise ValueError(f"trace {name}: {len(hop_names)} hop names but {len(workloads)} hop workloads")
        drops = tuple(drop_hops)
        if len(hop_names) + len(drops) > MAX_HOPS or any(d.hop_index < len(hop_names) for d in drops):
            raise ValueError(f"trace {name}: drop hops must follow the path's, within {MAX_HOPS} hops")
        with self._lock:
            old = self._paths.get(name)
            if (
                old
                and old.known
                and old.hop_names == tuple(hop_names)
                and old.hop_nodes == nodes
                and old.hop_workloads == workloads
                and old.drop_hops == drops
            ):
                return
            self._version += 1
            self._paths[name] = TracePath(
                name, tuple(hop_names), nodes, True, self._version, workloads, drops
            )

    def set_spec(self, spec: trace_pb2.TraceSpec) -> None:
        """Set a trace's path from its `TraceSpec` (hop_index = position in `spec.hops`)."""
        self._specs[spec.name] = spec
        workloads = [
            (
                h.workload.container_name,
                f"{h.workload.pod_namespace}/{h.workload.pod_name}" if h.workload.pod_name else "",
            )
            for h in spec.hops
        ]
        self.set_trace(
            spec.name,
            [h.name for h in spec.hops],
            [h.node for h in spec.hops],
            workloads if any(c or pod for c, pod in workloads) else None,
            [DropSite(d.hop_index, d.node, d.name, dict(d.reasons)) for d in spec.drop_hops],
        )

    def remove_trace(self, name: str) -> None:
        """Forget a trace (deleted by the user)."""
        with self._lock:
            self._paths.pop(name, None)
            self._specs.pop(name, None)

    def learn_hop(self, trace: str, hop_index: int, hop_name: str, node: str) -> None:
        """Fallback: record a hop name seen in `HopCounters`, unless the trace's path is set explicitly."""
        if not trace or hop_index >= MAX_HOPS:
            return
        with self._lock:
            old = self._paths.get(trace)
            if old is not None and old.known:
                return
            names = list(old.hop_names) if old else []
            nodes = list(old.hop_nodes) if old else []
            if hop_index < len(names) and names[hop_index] == hop_name and nodes[hop_index] == node:
                return
            while len(names) <= hop_index:
                names.append("")
                nodes.append("")
            names[hop_index] = hop_name
            nodes[hop_index] = node
            self._version += 1
            self._paths[trace] = TracePath(trace, tuple(names), tuple(nodes), False, self._version)

    def get(self, name: str) -> TracePath | None:
        """The path of trace `name`, or None."""
        return self._paths.get(name)

    def spec(self, name: str) -> trace_pb2.TraceSpec | None:
        """The spec of trace `name` as `set_spec` had it (its hops' attach points, devices, namespaces and
        its flow filter), or None (a path from a file or learned from counters)."""
        return self._specs.get(name)

    def names(self) -> list[str]:
        """Names of all traces in the catalog."""
        return sorted(self._paths)

    def nodes(self) -> set[str]:
        """Every node some known trace path runs on (the agents the join should hear from)."""
        with self._lock:
            return {node for path in self._paths.values() if path.known for node in path.hop_nodes if node}

    def load_file(self, path: str | Path) -> None:
        """Load traces from a JSON or YAML file.

        Accepted shapes: a TraceSpec (`{"name", "hops": [{"name", "node"}, ...]}`), a list of them, or
        `{"traces": [...]}`.
        """
        text = Path(path).read_text()
        data: Any
        if str(path).endswith((".yaml", ".yml")):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
        if isinstance(data, dict) and "traces" in data:
            data = data["traces"]
        if isinstance(data, dict):
            data = [data]
        if not isinstance(data, list):
            raise ValueError(f"{path}: expected a trace spec, a list of them, or {{traces: [...]}}")
        for spec in data:
            hops = spec.get("hops") or []
            self.set_trace(spec["name"], [h["name"] for h in hops], [h.get("node", "") for h in hops])
