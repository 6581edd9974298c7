"""What the kernel holds of hoptrace: BPF programs, links and maps by process, tcx attachments per device,
a program's counters (`bpftool` and BPF_PROG_QUERY). The e2e tests and the benchmarks read the kernel's
side with these, never the agent's word for it."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

from hoptrace import kernel_abi
from hoptrace.lab.topology import TwoHostTopology

HOPTRACE_PROGS = frozenset(kernel_abi.PROGRAMS)

# The agent's default --pin-dir: a directory of pins per node, and each node's signed-command sequences
# beside it (agent/internal/signing StatePath).
AGENT_PIN_ROOT = Path("/sys/fs/bpf/hoptrace")


def remove_agent_state(node: str, root: Path = AGENT_PIN_ROOT) -> None:
    """Remove what a stopped agent of `node` keeps in bpffs on purpose, for the next agent of the node:
    its signed-command sequences and, after --keep-on-exit or a kill, its pins. A lab's teardown calls it
    once its agents are gone. The lab's node names need none of the agent's escaping of bpffs names."""
    (root / f"commands-{node}").unlink(missing_ok=True)
    shutil.rmtree(root / node, ignore_errors=True)
    with contextlib.suppress(OSError):
        root.rmdir()  # only when no other node's state is left


def bpftool_json(*args: str, netns: str | None = None) -> Any:
    """``bpftool -j ARGS`` (inside ``netns`` when given), parsed."""
    cmd = ["bpftool", "-j", *args]
    if netns:
        cmd = ["ip", "netns", "exec", netns, *cmd]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
    except FileNotFoundError as exc:
        raise AssertionError("bpftool not found: install it (apt-get install bpftool)") from exc
    assert proc.returncode == 0, f"{' '.join(cmd)}: exit {proc.returncode}: {proc.stderr}"
    return json.loads(proc.stdout or "null")


def hoptrace_links() -> list[dict[str, Any]]:
    """Every BPF link in the system whose program is one of hoptrace's (by program name)."""
    names = {p["id"]: p.get("name", "") for p in bpftool_json("prog", "show") or []}
    links = bpftool_json("link", "show") or []
    return [
        dict(link, prog_name=names.get(link.get("prog_id")))
        for link in links
        if names.get(link.get("prog_id")) in HOPTRACE_PROGS
    ]


def bpf_fds(pid: int) -> dict[str, set[int]]:
    """The BPF link and program IDs a process holds, from /proc/PID/fdinfo: {"link": ..., "prog": ...}."""
    out: dict[str, set[int]] = {"link": set(), "prog": set()}
    for fd in os.listdir(f"/proc/{pid}/fdinfo"):
        try:
            text = Path(f"/proc/{pid}/fdinfo/{fd}").read_text()
        except OSError:
            continue
        info = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
        info = {k.strip(): v.strip() for k, v in info.items()}
        if "link_id" in info:
            out["link"].add(int(info["link_id"]))
        elif "prog_id" in info:
            out["prog"].add(int(info["prog_id"]))
    return out


def held_link_ids() -> set[int]:
    """IDs of the BPF links some live process holds an fd of."""
    held: set[int] = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                held |= bpf_fds(int(entry))["link"]
            except OSError:
                continue
    return held


_SYS_BPF = 321  # x86_64
_BPF_OBJ_GET = 7
_BPF_PROG_QUERY = 16
_BPF_RAW_TRACEPOINT_OPEN = 17
BPF_TCX_INGRESS, BPF_TCX_EGRESS = 46, 47
_libc = ctypes.CDLL(None, use_errno=True)


class _QueryAttr(ctypes.Structure):
    """The BPF_PROG_QUERY member of union bpf_attr (include/uapi/linux/bpf.h)."""

    _fields_ = [
        ("target_ifindex", ctypes.c_uint32),
        ("attach_type", ctypes.c_uint32),
        ("query_flags", ctypes.c_uint32),
        ("attach_flags", ctypes.c_uint32),
        ("prog_ids", ctypes.c_uint64),
        ("count", ctypes.c_uint32),
        ("_pad", ctypes.c_uint32),
        ("prog_attach_flags", ctypes.c_uint64),
        ("link_ids", ctypes.c_uint64),
        ("link_attach_flags", ctypes.c_uint64),
        ("revision", ctypes.c_uint64),
        ("_tail", ctypes.c_uint8 * 64),  # the union is larger: zero the rest
    ]


class _ObjGetAttr(ctypes.Structure):
    """The BPF_OBJ_GET member of union bpf_attr."""

    _fields_ = [
        ("pathname", ctypes.c_uint64),
        ("bpf_fd", ctypes.c_uint32),
        ("file_flags", ctypes.c_uint32),
        ("path_fd", ctypes.c_int32),
        ("_tail", ctypes.c_uint8 * 64),
    ]


class _RawTracepointAttr(ctypes.Structure):
    """The BPF_RAW_TRACEPOINT_OPEN member of union bpf_attr."""

    _fields_ = [
        ("name", ctypes.c_uint64),
        ("prog_fd", ctypes.c_uint32),
        ("_pad", ctypes.c_uint32),
        ("cookie", ctypes.c_uint64),
        ("_tail", ctypes.c_uint8 * 64),
    ]


def _bpf(cmd: int, attr: ctypes.Structure, what: str) -> int:
    """The bpf(2) syscall; its result (0 or an fd), or OSError naming `what` and the errno."""
    rc = _libc.syscall(_SYS_BPF, cmd, ctypes.byref(attr), ctypes.sizeof(attr))
    if rc < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {errno.errorcode.get(err)}")
    return rc


def attach_pinned_tracing(pinned: str) -> int:
    """Attach a pinned tp_btf or fentry program where it was loaded for (BPF_RAW_TRACEPOINT_OPEN, which
    bpftool 7.1 cannot do); returns the link's fd: closing it detaches the program."""
    path = ctypes.create_string_buffer(pinned.encode())
    prog_fd = _bpf(_BPF_OBJ_GET, _ObjGetAttr(pathname=ctypes.addressof(path)), f"BPF_OBJ_GET {pinned}")
    try:
        return _bpf(_BPF_RAW_TRACEPOINT_OPEN, _RawTracepointAttr(prog_fd=prog_fd), f"attach {pinned}")
    finally:
        os.close(prog_fd)


def tcx_programs(netns_path: str, ifindex: int) -> dict[str, list[int]]:
    """Program IDs attached with tcx to a device: {"ingress": [...], "egress": [...]}.

    bpftool 7.1's ``net show`` predates tcx (Linux 6.6) and lists nothing for it, so this asks the kernel
    directly: BPF_PROG_QUERY on the device, from a thread that entered the device's namespace.
    """
    result: dict[str, Any] = {}

    def query() -> None:
        try:
            with open(netns_path, "rb") as nsfile:
                if _libc.setns(nsfile.fileno(), 0x40000000) != 0:
                    raise OSError(ctypes.get_errno(), f"setns {netns_path}")
            for name, attach_type in (("ingress", BPF_TCX_INGRESS), ("egress", BPF_TCX_EGRESS)):
                ids = (ctypes.c_uint32 * 64)()
                attr = _QueryAttr(target_ifindex=ifindex, attach_type=attach_type, count=64)
                attr.prog_ids = ctypes.addressof(ids)
                _bpf(_BPF_PROG_QUERY, attr, f"BPF_PROG_QUERY ifindex {ifindex} {name}")
                result[name] = list(ids[: attr.count])
        except BaseException as exc:  # handed to the caller's thread
            result["error"] = exc

    thread = threading.Thread(target=query, name="tcx-query")
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result


def tcx_attachments(topo: TwoHostTopology) -> dict[str, list[int]]:
    """Every tcx program on every device of the topology: {"role/dev/direction": [prog ids]}, if any."""
    found: dict[str, list[int]] = {}
    for role in topo.roles:
        out = topo.run(role, "ip", "-j", "link", "show").stdout
        for link in json.loads(out):
            progs = tcx_programs(topo.netns_path(role), int(link["ifindex"]))
            for direction, ids in progs.items():
                if ids:
                    found[f"{role}/{link['ifname']}/{direction}"] = ids
    return found


def program_counters(pid: int, prog_name: str) -> dict[str, int]:
    """The ``counters`` map of the program ``prog_name`` that process ``pid`` holds, summed over CPUs.

    For the TCP tagger (``tag_tcp``), whose counters the agent does not print: it is not a hop of the plan.
    """
    for prog_id in bpf_fds(pid)["prog"]:
        info = bpftool_json("prog", "show", "id", str(prog_id))
        if info.get("name") != prog_name:
            continue
        for map_id in info.get("map_ids", []):
            if bpftool_json("map", "show", "id", str(map_id)).get("name") != "counters":
                continue
            entries = bpftool_json("map", "dump", "id", str(map_id))
            sums = {e["formatted"]["key"]: sum(v["value"] for v in e["formatted"]["values"]) for e in entries}
            return {name: sums.get(i, 0) for i, name in enumerate(kernel_abi.COUNTERS)}
    raise AssertionError(f"process {pid} holds no program {prog_name} with a counters map")
