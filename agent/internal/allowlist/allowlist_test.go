package allowlist

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	"github.com/hoptrace/hoptrace/agent/internal/testutil"
)

// verdictFor is a pass verdict of each traffic program type, and 0 for the others.
var verdictFor = map[ebpf.ProgramType]int64{ebpf.SchedCLS: -1, ebpf.XDP: 2, ebpf.CGroupSKB: 1, ebpf.SockOps: 1}

// prog is a program of type t that runs body and returns a pass verdict.
func prog(t ebpf.ProgramType, body ...asm.Instruction) *ebpf.ProgramSpec {
	return progReturning(t, verdictFor[t], body...)
}

// attachFor is the attach type the shipped objects give each program type.
var attachFor = map[ebpf.ProgramType]ebpf.AttachType{
	ebpf.XDP: ebpf.AttachXDP, ebpf.SockOps: ebpf.AttachCGroupSockOps, ebpf.Tracing: ebpf.AttachTraceRawTp,
}

func progReturning(t ebpf.ProgramType, ret int64, body ...asm.Instruction) *ebpf.ProgramSpec {
	ins := append(asm.Instructions{asm.Mov.Imm(asm.R0, 0).WithSymbol("p")}, body...)
	ins = append(ins, asm.Mov.Imm(asm.R0, int32(ret)), asm.Return())
	return &ebpf.ProgramSpec{Name: "p", Type: t, AttachType: attachFor[t], Instructions: ins, License: "GPL"}
}

func TestShippedObjectsAreAllowedForTheirKindOnly(t *testing.T) {
	dir := filepath.Dir(testutil.ObjectPath())
	objects := map[Object]string{Hops: "hoptrace.bpf.o", MACE: "mace.bpf.o", Iron: "iron.bpf.o"}
	for kind, file := range objects {
		spec, err := ebpf.LoadCollectionSpec(filepath.Join(dir, file))
		if err != nil {
			t.Fatal(err)
		}
		if err := Check(spec, kind); err != nil {
			t.Errorf("hoptrace's own %s refused as %s: %v", file, kind, err)
		}
	}
	// A preset must not load any object it is given: objects are checked as what they claim to be.
	hops, err := ebpf.LoadCollectionSpec(testutil.ObjectPath())
	if err != nil {
		t.Fatal(err)
	}
	if err := Check(hops, Iron); !errors.Is(err, ErrNotAllowed) {
		t.Errorf("the hop programs passed as an Iron object: %v", err)
	}
}

func TestHelpersNoShippedProgramCallsAreRefusedByName(t *testing.T) {
	for fn, name := range map[asm.BuiltinFunc]string{
		asm.FnProbeWriteUser:   "bpf_probe_write_user",
		asm.FnOverrideReturn:   "bpf_override_return",
		asm.FnSendSignal:       "bpf_send_signal",
		asm.FnSendSignalThread: "bpf_send_signal_thread",
		asm.FnProbeReadUser:    "bpf_probe_read_user",
		asm.FnProbeRead:        "bpf_probe_read",
		asm.FnCopyFromUser:     "bpf_copy_from_user",
		asm.FnRedirect:         "bpf_redirect",
		asm.FnCloneRedirect:    "bpf_clone_redirect",
		asm.FnRedirectPeer:     "bpf_redirect_peer",
		asm.FnRedirectNeigh:    "bpf_redirect_neigh",
		asm.FnSkbChangeType:    "bpf_skb_change_type",
	} {
		t.Run(name, func(t *testing.T) {
			spec := &ebpf.CollectionSpec{Programs: map[string]*ebpf.ProgramSpec{
				"hop_tc": prog(ebpf.SchedCLS, fn.Call()),
			}}
			err := Check(spec, Hops)
			want := "program hop_tc calls " + name + " (not allowed)"
			if err == nil || err.Error() != want {
				t.Fatalf("got %v, want %q", err, want)
			}
			if !errors.Is(err, ErrNotAllowed) {
				t.Fatalf("%v does not wrap ErrNotAllowed", err)
			}
		})
	}
}

func TestHelpersTheHopProgramsUsePass(t *testing.T) {
	for _, fn := range []asm.BuiltinFunc{asm.FnKtimeGetNs, asm.FnSkbStoreBytes, asm.FnRingbufReserve,
		asm.FnMapLookupElem, asm.FnSkbChangeTail} {
		if err := CheckProgram("hop_tc", prog(ebpf.SchedCLS, fn.Call()), Hops); err != nil {
			t.Errorf("%s: %v", fn, err)
		}
	}
}

func TestProgramAndAttachTypes(t *testing.T) {
	for _, typ := range []ebpf.ProgramType{ebpf.SchedCLS, ebpf.XDP, ebpf.Kprobe, ebpf.CGroupSKB} {
		if err := CheckProgram("p", prog(typ), Hops); err != nil {
			t.Errorf("%s refused: %v", typ, err)
		}
	}
	for _, typ := range []ebpf.ProgramType{ebpf.LSM, ebpf.SocketFilter, ebpf.Syscall, ebpf.StructOps,
		ebpf.RawTracepoint, ebpf.CGroupSockopt, ebpf.Extension, ebpf.PerfEvent} {
		err := CheckProgram("p", prog(typ), Hops)
		if err == nil || !strings.Contains(err.Error(), "program p has type") {
			t.Errorf("%s: got %v, want a refusal naming the type", typ, err)
		}
	}
	for _, at := range []ebpf.AttachType{ebpf.AttachModifyReturn, ebpf.AttachTraceIter, ebpf.AttachLSMMac} {
		p := prog(ebpf.Tracing)
		p.AttachType = at
		if err := CheckProgram("hop_fentry", p, Hops); !errors.Is(err, ErrNotAllowed) {
			t.Errorf("%s: got %v, want a refusal", at, err)
		}
	}
}

func kfuncCall(name string) asm.Instruction {
	ins := asm.Instruction{OpCode: asm.OpCode(asm.JumpClass).SetJumpOp(asm.Call), Src: asm.PseudoKfuncCall, Constant: -1}
	return ins.WithReference(name)
}

func TestKfuncs(t *testing.T) {
	err := CheckProgram("hop_tc", prog(ebpf.SchedCLS, kfuncCall("bpf_send_signal_task")), Hops)
	if err == nil || err.Error() != "program hop_tc calls bpf_send_signal_task (not allowed)" {
		t.Fatalf("got %v", err)
	}
	for kfunc := range shipped[Hops][ebpf.SchedCLS].kfuncs {
		if err := CheckProgram("hop_tc", prog(ebpf.SchedCLS, kfuncCall(kfunc)), Hops); err != nil {
			t.Errorf("%s, which the hop programs use, refused: %v", kfunc, err)
		}
	}
}

// A hop program that decides a packet's fate (TC_ACT_SHOT, a redirect) could take a namespace to
// 100 % loss: such verdicts are refused.
func TestVerdictsThatDropOrRedirectAreRefused(t *testing.T) {
	for _, c := range []struct {
		typ  ebpf.ProgramType
		ret  int64
		want string
	}{
		{ebpf.SchedCLS, 2, "returns 2, which is not TC_ACT_OK or TC_ACT_UNSPEC"}, // TC_ACT_SHOT
		{ebpf.SchedCLS, 7, "returns 7"},                                          // TC_ACT_REDIRECT
		{ebpf.XDP, 1, "returns 1, which is not XDP_PASS"},                        // XDP_DROP
		{ebpf.XDP, 4, "returns 4"},                                               // XDP_REDIRECT
		{ebpf.CGroupSKB, 0, "returns 0"},                                         // deny
	} {
		err := CheckProgram("p", progReturning(c.typ, c.ret), Hops)
		if !errors.Is(err, ErrNotAllowed) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s returning %d: got %v, want %q", c.typ, c.ret, err, c.want)
		}
	}
	for _, ret := range []int64{-1, 0} {
		if err := CheckProgram("p", progReturning(ebpf.SchedCLS, ret), Hops); err != nil {
			t.Errorf("tc returning %d refused: %v", ret, err)
		}
	}
	// 64-bit load of 0xffffffff, as clang writes `return TC_ACT_UNSPEC`
	p := prog(ebpf.SchedCLS)
	p.Instructions[len(p.Instructions)-2] = asm.LoadImm(asm.R0, 0xffffffff, asm.DWord)
	if err := CheckProgram("p", p, Hops); err != nil {
		t.Errorf("r0 = 0xffffffff ll refused: %v", err)
	}
}

func TestComputedVerdictsAreRefused(t *testing.T) {
	computed := &ebpf.ProgramSpec{Name: "p", Type: ebpf.SchedCLS, License: "GPL", Instructions: asm.Instructions{
		asm.Mov.Reg(asm.R0, asm.R1).WithSymbol("p"),
		asm.Return(),
	}}
	// The exit is a jump target: the verdict depends on the path taken.
	jumped := &ebpf.ProgramSpec{Name: "p", Type: ebpf.SchedCLS, License: "GPL", Instructions: asm.Instructions{
		asm.Mov.Imm(asm.R0, 2).WithSymbol("p"),
		asm.JEq.Imm(asm.R1, 0, "out"),
		asm.Mov.Imm(asm.R0, -1),
		asm.Return().WithSymbol("out"),
	}}
	for name, p := range map[string]*ebpf.ProgramSpec{"computed": computed, "jumped": jumped} {
		err := CheckProgram("p", p, Hops)
		if !errors.Is(err, ErrNotAllowed) || !strings.Contains(err.Error(), "computed verdict") {
			t.Errorf("%s: got %v", name, err)
		}
	}
}

func TestSubprogramReturnsAreNotVerdicts(t *testing.T) {
	p := &ebpf.ProgramSpec{Name: "p", Type: ebpf.SchedCLS, License: "GPL", Instructions: asm.Instructions{
		asm.Call.Label("sub").WithSymbol("p"),
		asm.Mov.Imm(asm.R0, -1),
		asm.Return(),
		asm.Mov.Imm(asm.R0, 2).WithSymbol("sub"), // a bpf_loop callback's "stop" value, say
		asm.Return(),
	}}
	if err := CheckProgram("p", p, Hops); err != nil {
		t.Fatalf("a subprogram's return value was taken for a verdict: %v", err)
	}
}

func TestCheckNamesTheFirstBadProgramInNameOrder(t *testing.T) {
	spec := &ebpf.CollectionSpec{Programs: map[string]*ebpf.ProgramSpec{
		"hop_xdp": prog(ebpf.XDP, asm.FnSendSignal.Call()),
		"hop_tc":  prog(ebpf.SchedCLS, asm.FnOverrideReturn.Call()),
		"tag_tcp": prog(ebpf.SockOps),
	}}
	for range 5 {
		if err := Check(spec, Hops); err == nil || err.Error() != "program hop_tc calls bpf_override_return (not allowed)" {
			t.Fatalf("got %v", err)
		}
	}
}
