"""Attach points: a hop's `at` value (``tc-egress``, ``tracepoint:net:netif_receive_skb``,
``uprobe:/usr/sbin/nginx:ngx_recv``, ...) parsed once into an `AttachPoint`.

This is the one parser of `at`: validation keeps each hop's `AttachPoint` (`hoptrace.spec.CheckedSpec`) and
compilers read those typed fields. The attach kinds themselves are trace.proto's `AttachKind`; a spec spells
each one as `at_spelling` says.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hoptrace.v1 import agent_pb2, trace_pb2

SYMBOL_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")
TRACEPOINT_GROUPS = ("net", "skb")

# Receive-side events: a packet seen there was not sent by this node, so such a hop cannot be where the
# sender's packets get their ID. Transmit-side and unknown events are accepted.
RECEIVE_TRACEPOINTS = frozenset(
    {
        "netif_receive_skb",
        "netif_receive_skb_entry",
        "netif_receive_skb_list_entry",
        "netif_rx",
        "netif_rx_entry",
        "napi_gro_receive_entry",
        "napi_gro_frags_entry",
    }
)


@dataclass(frozen=True)
class AttachPoint:
    """A parsed `at` value.

    attach is the `trace_pb2.AttachKind`; kind is its program family (``tc``, ``xdp``, ``cgroup_skb``,
    ``tp_btf``, ``fentry``, ``fexit``, ``kprobe``, ``kretprobe``, ``socket_read``); direction is
    ``ingress``/``egress`` for tc and cgroup hops (and ``ingress`` for socket-read); group and target are the
    tracepoint's group and event, or the function.
    """

    attach: int
    kind: str
    direction: str = ""
    group: str = ""
    target: str = ""
    binary: str = ""  # uprobe/uretprobe: the executable (target is the symbol)

    @property
    def is_egress(self) -> bool:
        """True when the hop sees packets leaving through it (so the node sent or forwarded them)."""
        return self.direction == "egress"

    @property
    def is_receive_side(self) -> bool:
        """True when the hop only sees received packets (xdp, *-ingress, receive tracepoints)."""
        if self.kind in ("xdp", "socket_read", "uprobe") or self.direction == "ingress":
            return True
        return self.kind == "tp_btf" and self.target in RECEIVE_TRACEPOINTS


# The capability key (Register.capabilities.attach) each attach kind needs; tc accepts either tcx or tc.
CAPABILITY_KEYS: dict[str, tuple[str, ...]] = {
    "tc": ("tcx", "tc"),
    "xdp": ("xdp",),
    "cgroup_skb": ("cgroup_skb",),
    "tp_btf": ("tp_btf",),
    "fentry": ("fentry",),
    "fexit": ("fexit",),
    "kprobe": ("kprobe",),
    "kretprobe": ("kretprobe",),
    "sock_ops": ("sock_ops",),
    "socket_read": ("tp_btf",),  # tp_btf programs on the receive path's events
    "uprobe": ("uprobe",),
}


def attach_refusal(registration: agent_pb2.Register, kind: str) -> str | None:
    """Why the node cannot attach program family `kind` (None when it can or did not say)."""
    attach = registration.capabilities.attach
    keys = [key for key in CAPABILITY_KEYS.get(kind, (kind,)) if key in attach]
    if not keys or any(attach[key].supported for key in keys):
        return None
    reasons = [attach[key].reason for key in keys if attach[key].reason]
    return reasons[0] if reasons else "not supported by this node's kernel"


_K = trace_pb2.AttachKind
# Program family and direction of every attach kind (the kinds themselves are trace.proto's AttachKind;
# tests check this table covers each).
KIND_FAMILY: dict[int, tuple[str, str]] = {
    _K.ATTACH_KIND_TC_INGRESS: ("tc", "ingress"),
    _K.ATTACH_KIND_TC_EGRESS: ("tc", "egress"),
    _K.ATTACH_KIND_XDP: ("xdp", "ingress"),
    _K.ATTACH_KIND_CGROUP_INGRESS: ("cgroup_skb", "ingress"),
    _K.ATTACH_KIND_CGROUP_EGRESS: ("cgroup_skb", "egress"),
    _K.ATTACH_KIND_TRACEPOINT: ("tp_btf", ""),
    _K.ATTACH_KIND_FENTRY: ("fentry", ""),
    _K.ATTACH_KIND_KPROBE: ("kprobe", ""),
    _K.ATTACH_KIND_SOCKET_READ: ("socket_read", "ingress"),
    _K.ATTACH_KIND_UPROBE: ("uprobe", ""),
    _K.ATTACH_KIND_URETPROBE: ("uprobe", ""),
    _K.ATTACH_KIND_FEXIT: ("fexit", ""),
    _K.ATTACH_KIND_KRETPROBE: ("kretprobe", ""),
}
# Kinds whose `at` carries a target after a colon, and the target's form.
TARGET_FORMS: dict[int, str] = {
    _K.ATTACH_KIND_TRACEPOINT: "GROUP:EVENT",
    _K.ATTACH_KIND_FENTRY: "FUNCTION",
    _K.ATTACH_KIND_KPROBE: "FUNCTION",
    _K.ATTACH_KIND_FEXIT: "FUNCTION",
    _K.ATTACH_KIND_KRETPROBE: "FUNCTION",
    _K.ATTACH_KIND_UPROBE: "BINARY:SYMBOL",
    _K.ATTACH_KIND_URETPROBE: "BINARY:SYMBOL",
}
# A uprobe's BINARY: an absolute path, no '..', no whitespace or ':' (it ends at the last ':').
BINARY_PATTERN = re.compile(r"^/[^\s:]*$")
MAX_BINARY_LEN = 4095  # PATH_MAX - 1


def at_spelling(kind: int) -> str:
    """A spec's spelling of an attach kind: ATTACH_KIND_TC_EGRESS is ``tc-egress``."""
    return _K.Name(kind).removeprefix("ATTACH_KIND_").lower().replace("_", "-")


_SIMPLE_KINDS = {at_spelling(kind): kind for kind in KIND_FAMILY if kind not in TARGET_FORMS}
_TARGET_KINDS = {at_spelling(kind): kind for kind in TARGET_FORMS}
AT_FORMS = ", ".join(
    [*_SIMPLE_KINDS, *(f"{spelling}:{TARGET_FORMS[kind]}" for spelling, kind in _TARGET_KINDS.items())]
)


def parse_attach_point(at: str) -> AttachPoint:
    """Parse a hop's `at` value; raises ValueError with the reason when it is not one of the known forms."""
    if at in _SIMPLE_KINDS:
        kind = _SIMPLE_KINDS[at]
        return AttachPoint(kind, *KIND_FAMILY[kind])
    prefix, _, rest = at.partition(":")
    kind = _TARGET_KINDS.get(prefix)
    if kind == _K.ATTACH_KIND_TRACEPOINT:
        group, sep, event = rest.partition(":")
        if not sep or not group or not event:
            raise ValueError(
                f"{at!r}: expected tracepoint:GROUP:EVENT, e.g. tracepoint:net:netif_receive_skb"
            )
        if group not in TRACEPOINT_GROUPS:
            raise ValueError(
                f"{at!r}: tracepoint group must be net or skb (events whose first argument is an skb)"
            )
        if not SYMBOL_PATTERN.match(event):
            raise ValueError(f"{at!r}: {event!r} is not a tracepoint event name")
        return AttachPoint(kind, KIND_FAMILY[kind][0], group=group, target=event)
    if kind in (_K.ATTACH_KIND_UPROBE, _K.ATTACH_KIND_URETPROBE):
        binary, sep, symbol = rest.rpartition(":")
        if not sep or not binary or not symbol:
            raise ValueError(
                f"{at!r}: expected {prefix}:BINARY:SYMBOL, e.g. {prefix}:/usr/sbin/nginx:ngx_recv"
            )
        if (
            not BINARY_PATTERN.match(binary)
            or ".." in binary.split("/")
            or len(binary) > MAX_BINARY_LEN
            or binary.endswith("/")
        ):
            raise ValueError(
                f"{at!r}: the binary {binary!r} must be an absolute file path without '..', whitespace "
                "or ':' (resolved in the mount namespace of the process whose netns the hop names as "
                "/proc/PID/ns/net)"
            )
        if not SYMBOL_PATTERN.match(symbol):
            raise ValueError(f"{at!r}: {symbol!r} is not a symbol name")
        return AttachPoint(kind, KIND_FAMILY[kind][0], target=symbol, binary=binary)
    if kind is not None:
        if not rest:
            raise ValueError(f"{at!r}: expected {prefix}:FUNCTION")
        if not SYMBOL_PATTERN.match(rest):
            raise ValueError(f"{at!r}: {rest!r} is not a kernel function name")
        return AttachPoint(kind, KIND_FAMILY[kind][0], target=rest)
    raise ValueError(f"unknown attach point {at!r}; expected one of {AT_FORMS}")
