"""Spec -> per-node plans and CO-RE objects, with the real clang and the lead's hop library."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from spec_fixtures import CONTRACT_SPEC

from hoptrace import kernel_abi
from hoptrace.dispatcher.compile import (
    ALL_PROGRAMS,
    DISCOVERY_PROGRAMS,
    EVENT_PROGRAMS,
    KFREE_TRACEPOINT_PROGRAM,
    KRETPROBE_ENTRY_PROGRAM,
    PROGRAM_FOR_KIND,
    PROGRAM_SECTIONS,
    SOCKET_READ_PROGRAMS,
    SOCKET_READ_UDP_QUEUE_PROGRAMS,
    TCP_TAGGER_PROGRAM,
    XMIT_TRACEPOINT_PROGRAM,
    BpfCompiler,
    CompileError,
    Toolchain,
    build_plans,
    compile_spec,
    elf_sections,
    flow_match,
    generate_source,
    programs_for_plan,
)
from hoptrace.spec import check_spec, load_spec
from hoptrace.spec.attach import KIND_FAMILY
from hoptrace.v1 import agent_pb2, trace_pb2

ALL_KINDS_SPEC = """
name: all-kinds
filter: {protocol: tcp}
hops:
  - {name: out, node: n1, at: cgroup-egress, cgroup: /hoptrace/c1}
  - {name: tc, node: n2, at: tc-ingress, dev: wire0}
  - {name: xdp, node: n2, at: xdp, dev: wire0}
  - {name: tp, node: n2, at: "tracepoint:net:netif_receive_skb"}
  - {name: f, node: n2, at: "fentry:ip_rcv"}
  - {name: k, node: n2, at: "kprobe:ip_rcv"}
  - {name: fx, node: n2, at: "fexit:ip_route_input_noref"}
  - {name: kr, node: n2, at: "kretprobe:ip_route_input_noref"}
"""


@pytest.fixture(scope="module")
def compiler(tmp_path_factory: pytest.TempPathFactory) -> BpfCompiler:
    toolchain = Toolchain.default()
    if not (toolchain.include_dir / "hop.bpf.h").exists():
        pytest.fail(f"{toolchain.include_dir}/hop.bpf.h is missing: run `make bpf`", pytrace=False)
    return BpfCompiler(toolchain, cache_dir=tmp_path_factory.mktemp("bpf-cache"))


def _symbols(elf: bytes, tmp_path: Path) -> dict[str, str]:
    """Global function symbols -> the section they live in, read with readelf."""
    path = tmp_path / "object.o"
    path.write_bytes(elf)
    sections = elf_sections(elf)
    symbols = {}
    output = subprocess.run(["readelf", "-sW", str(path)], capture_output=True, text=True, check=True).stdout
    for line in output.splitlines():
        fields = line.split()
        # Num: Value Size Type Bind Vis Ndx Name
        if len(fields) == 8 and fields[3] == "FUNC" and fields[4] == "GLOBAL":
            symbols[fields[7]] = sections[int(fields[6])]
    return symbols


def test_plans_split_by_node_with_global_hop_indexes() -> None:
    plans = build_plans(check_spec(load_spec(CONTRACT_SPEC)), generation=7)
    assert list(plans) == ["host-a", "host-b"]
    host_a, host_b = plans["host-a"], plans["host-b"]
    assert [(hop.hop_index, hop.name) for hop in host_a.hops] == [
        (0, "a-c1-out"),
        (1, "a-br-in"),
        (2, "a-wire-out"),
    ]
    assert [(hop.hop_index, hop.name) for hop in host_b.hops] == [(3, "b-wire-in"), (4, "b-c2-in")]
    assert [hop.tag_udp for hop in host_a.hops] == [True, False, False]
    assert not any(hop.tag_udp for hop in host_b.hops)
    assert host_a.generation == host_b.generation == 7
    assert host_a.sample == 1 and host_a.match.dst_port == 11111 and host_b.match.ip_proto == 17
    assert not host_a.HasField("tcp_tagging") and not host_b.HasField("tcp_tagging")
    assert host_a.hops[0].netns == "c1" and host_a.hops[1].dev == "veth-c1"
    assert programs_for_plan(host_a) == ("hop_tc", "hop_tp_btf")
    assert programs_for_plan(host_b) == ("hop_tc",)


def test_plans_carry_typed_attach_points_and_programs() -> None:
    """The agent gets the kind, target and program as fields: it never parses the user's `at`."""
    plans = build_plans(check_spec(load_spec(ALL_KINDS_SPEC)), generation=1)
    by_name = {hop.name: hop for plan in plans.values() for hop in plan.hops}
    kinds = trace_pb2.AttachKind
    out = by_name["out"]
    assert out.kind == kinds.ATTACH_KIND_CGROUP_EGRESS and out.program == "hop_cgroup_skb"
    assert by_name["tc"].kind == kinds.ATTACH_KIND_TC_INGRESS and by_name["tc"].program == "hop_tc"
    assert by_name["xdp"].kind == kinds.ATTACH_KIND_XDP and by_name["xdp"].program == "hop_xdp"
    tp = next(hop for hop in by_name.values() if hop.kind == kinds.ATTACH_KIND_TRACEPOINT)
    assert (tp.tracepoint_group, tp.program) == ("net", "hop_tp_btf") and tp.tracepoint_event
    fentry = next(hop for hop in by_name.values() if hop.kind == kinds.ATTACH_KIND_FENTRY)
    assert fentry.function == "ip_rcv" and fentry.program == "hop_fentry"
    assert (by_name["fx"].kind, by_name["fx"].function, by_name["fx"].program) == (
        kinds.ATTACH_KIND_FEXIT,
        "ip_route_input_noref",
        "hop_fexit",
    )
    assert (by_name["kr"].kind, by_name["kr"].function, by_name["kr"].program) == (
        kinds.ATTACH_KIND_KRETPROBE,
        "ip_route_input_noref",
        "hop_kretprobe",
    )
    assert plans["n1"].tcp_tagging.program == TCP_TAGGER_PROGRAM


def test_every_attach_kind_has_a_family_and_every_program_exists() -> None:
    """One list of kinds (trace.proto) and of programs (hop.bpf.h, via kernel_abi): the tables here are
    checked against both."""
    kinds = set(trace_pb2.AttachKind.values()) - {trace_pb2.AttachKind.ATTACH_KIND_UNSPECIFIED}
    assert set(KIND_FAMILY) == kinds
    # socket-read's program follows the filter's protocol (SOCKET_READ_PROGRAMS)
    assert {family for family, _ in KIND_FAMILY.values()} == {*PROGRAM_FOR_KIND, "socket_read"}
    used = {
        *PROGRAM_FOR_KIND.values(),
        XMIT_TRACEPOINT_PROGRAM,
        KFREE_TRACEPOINT_PROGRAM,
        TCP_TAGGER_PROGRAM,
        *EVENT_PROGRAMS,
        *SOCKET_READ_PROGRAMS.values(),
        *SOCKET_READ_UDP_QUEUE_PROGRAMS,
        KRETPROBE_ENTRY_PROGRAM,
    }
    assert used == set(ALL_PROGRAMS) == set(kernel_abi.PROGRAMS) - set(DISCOVERY_PROGRAMS)


@pytest.mark.parametrize(
    ("filter_", "expected"),
    [
        (
            {"protocol": "udp", "src": "198.18.1.0/24", "dst": "198.18.2.3", "src_port": 1, "dst_port": 5000},
            {"ip_proto": 17, "family": 4, "src_addr": bytes([198, 18, 1, 0]),
             "src_mask": bytes([255, 255, 255, 0]), "dst_addr": bytes([198, 18, 2, 3]),
             "dst_mask": b"\xff" * 4, "src_port": 1, "dst_port": 5000},
        ),
        (
            {"protocol": "tcp", "dst": "fd00:1::/33"},
            {"ip_proto": 6, "family": 6, "dst_addr": bytes([0xFD, 0, 0, 1] + [0] * 12),
             "dst_mask": bytes([0xFF] * 4 + [0x80] + [0] * 11)},
        ),
        ({"src": "::ffff:198.18.0.1"},
         {"family": 4, "src_addr": bytes([198, 18, 0, 1]), "src_mask": b"\xff" * 4}),
        ({}, {}),
    ],
)  # fmt: skip
def test_flow_match_is_the_filter_as_the_programs_compare_it(filter_: dict, expected: dict) -> None:
    assert flow_match(trace_pb2.Filter(**filter_)) == agent_pb2.FlowMatch(**expected)


def test_tcp_tagging_goes_to_the_first_hops_node_and_netns() -> None:
    spec = load_spec(CONTRACT_SPEC.replace("protocol: udp", "protocol: tcp"))
    plans = build_plans(check_spec(spec), generation=1)
    assert plans["host-a"].tcp_tagging.netns == "c1"
    assert not plans["host-b"].HasField("tcp_tagging")
    assert not any(hop.tag_udp for plan in plans.values() for hop in plan.hops)
    assert programs_for_plan(plans["host-a"]) == ("hop_tc", "hop_tp_btf", "tag_tcp")


def test_protocol_absent_tags_both() -> None:
    spec = load_spec(CONTRACT_SPEC.replace("  protocol: udp                  # udp | tcp\n", ""))
    plans = build_plans(check_spec(spec), generation=1)
    assert plans["host-a"].hops[0].tag_udp
    assert plans["host-a"].tcp_tagging.netns == "c1"


def test_cgroup_egress_first_hop_narrows_sock_ops_to_its_cgroup() -> None:
    plans = build_plans(check_spec(load_spec(ALL_KINDS_SPEC)), generation=1)
    assert plans["n1"].tcp_tagging.cgroup == "/hoptrace/c1"
    assert programs_for_plan(plans["n1"]) == ("hop_cgroup_skb", "tag_tcp")


def test_generated_source_instantiates_only_the_needed_programs() -> None:
    source = generate_source(("hop_tc", "tag_tcp"), Toolchain.default().kernel_patch_dir)
    assert '#include "hop.bpf.h"' in source
    assert "HOPTRACE_PROG_TC\n" in source and "HOPTRACE_PROG_TAG_TCP\n" in source
    assert "HOPTRACE_PROG_XDP" not in source and "hoptrace.bpf.c" not in source


def test_objects_hold_exactly_the_nodes_programs(compiler: BpfCompiler, tmp_path: Path) -> None:
    plans = compile_spec(check_spec(load_spec(ALL_KINDS_SPEC)), 3, compiler)

    def with_floor_twins(*programs: str) -> dict[str, str]:
        # each program comes with its variant for kernels 5.10-5.17 (hop.bpf.h); the agent picks one
        return {
            name: PROGRAM_SECTIONS[program] for program in programs for name in (program, f"{program}_floor")
        }

    assert _symbols(plans["n1"].object, tmp_path) == with_floor_twins("hop_cgroup_skb", "tag_tcp")
    # hop_kretprobe's macro brings its entry kprobe (the agent attaches both)
    expected = ("hop_tc", "hop_xdp", "hop_tp_btf", "hop_fentry", "hop_kprobe", "hop_fexit", "hop_kretprobe")
    expected += (KRETPROBE_ENTRY_PROGRAM,)
    assert _symbols(plans["n2"].object, tmp_path) == with_floor_twins(*expected)
    for plan in plans.values():
        sections = elf_sections(plan.object)
        assert {".maps", "license", ".BTF"} <= set(sections)


def test_compile_is_cached(compiler: BpfCompiler) -> None:
    """Objects depend only on the set of programs: a new generation, or a new dispatcher on the same cache
    directory, runs clang for nothing. (How fast a compile is, is measured in bench/dispatcher.py.)"""
    spec = check_spec(load_spec(CONTRACT_SPEC))
    compiler.warm_up()
    before = compiler.clang_runs  # the fixture's compiler may have built these sets for another test
    first = compile_spec(spec, 1, compiler)
    assert compiler.clang_runs - before <= 2  # host-a and host-b need different program sets
    runs = compiler.clang_runs
    second = compile_spec(spec, 2, compiler)
    assert compiler.clang_runs == runs
    assert first["host-a"].object == second["host-a"].object
    assert first["host-a"].object != first["host-b"].object
    again = BpfCompiler(compiler.toolchain, cache_dir=compiler.cache_dir)
    assert compile_spec(spec, 3, again)["host-b"].object == first["host-b"].object
    assert again.clang_runs == 0


def test_clang_errors_come_back_readable(tmp_path: Path) -> None:
    kernel_patch = tmp_path / "kernel-patch"
    (kernel_patch / "include").mkdir(parents=True)
    real = Toolchain.default()
    (kernel_patch / "include" / "hop.bpf.h").write_text(
        "#define HOPTRACE_PROG_TC int hop_tc(void) { return undefined_symbol_here; }\n"
    )
    broken = BpfCompiler(Toolchain(kernel_patch, real.build_dir), cache_dir=tmp_path / "cache")
    with pytest.raises(CompileError) as caught:
        broken.compile_programs(("hop_tc",))
    message = str(caught.value)
    assert "clang failed compiling the object for programs hop_tc" in message
    assert "undefined_symbol_here" in message and "error" in message
