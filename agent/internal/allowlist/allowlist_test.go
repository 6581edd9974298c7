package allowlist

import (
	"errors"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	"github.com/hoptrace/hoptrace/agent/internal/testutil"
)

func prog(t ebpf.ProgramType, body ...asm.Instruction) *ebpf.ProgramSpec {
	ins := append(asm.Instructions{asm.Mov.Imm(asm.R0, 0)}, body...)
	ins = append(ins, asm.Mov.Imm(asm.R0, 0), asm.Return())
	return &ebpf.ProgramSpec{Name: "p", Type: t, Instructions: ins, License: "GPL"}
}

func TestHoptraceObjectIsAllowed(t *testing.T) {
	spec := testutil.LoadSpec(t)
	if len(spec.Programs) < 5 {
		t.Fatalf("object has %d programs, want every hop program", len(spec.Programs))
	}
	if err := Check(spec); err != nil {
		t.Fatalf("hoptrace's own object refused: %v", err)
	}
}

func TestForbiddenHelpersAreRefusedByName(t *testing.T) {
	for fn, name := range forbiddenHelpers {
		t.Run(name, func(t *testing.T) {
			spec := &ebpf.CollectionSpec{Programs: map[string]*ebpf.ProgramSpec{
				"hop_tc": prog(ebpf.SchedCLS, fn.Call()),
			}}
			err := Check(spec)
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

func TestReadOnlyHelpersPass(t *testing.T) {
	for _, fn := range []asm.BuiltinFunc{asm.FnProbeReadKernel, asm.FnKtimeGetNs, asm.FnSkbStoreBytes,
		asm.FnRingbufReserve, asm.FnDPath, asm.FnMapLookupElem} {
		if err := CheckProgram("hop_tc", prog(ebpf.SchedCLS, fn.Call())); err != nil {
			t.Errorf("%s: %v", fn, err)
		}
	}
}

func TestProgramTypes(t *testing.T) {
	for _, typ := range []ebpf.ProgramType{ebpf.SchedCLS, ebpf.XDP, ebpf.Kprobe, ebpf.CGroupSKB, ebpf.SockOps} {
		if err := CheckProgram("p", prog(typ)); err != nil {
			t.Errorf("%s refused: %v", typ, err)
		}
	}
	for _, typ := range []ebpf.ProgramType{ebpf.LSM, ebpf.SocketFilter, ebpf.Syscall, ebpf.StructOps,
		ebpf.RawTracepoint, ebpf.CGroupSockopt, ebpf.Extension, ebpf.PerfEvent} {
		err := CheckProgram("p", prog(typ))
		if err == nil || !strings.Contains(err.Error(), "program p has type") {
			t.Errorf("%s: got %v, want a refusal naming the type", typ, err)
		}
	}
}

func TestTracingAttachTypes(t *testing.T) {
	for _, at := range []ebpf.AttachType{ebpf.AttachTraceRawTp, ebpf.AttachTraceFEntry, ebpf.AttachTraceFExit} {
		p := prog(ebpf.Tracing)
		p.AttachType = at
		if err := CheckProgram("hop_fentry", p); err != nil {
			t.Errorf("%s refused: %v", at, err)
		}
	}
	for _, at := range []ebpf.AttachType{ebpf.AttachModifyReturn, ebpf.AttachTraceIter, ebpf.AttachLSMMac} {
		p := prog(ebpf.Tracing)
		p.AttachType = at
		if err := CheckProgram("hop_fentry", p); !errors.Is(err, ErrNotAllowed) {
			t.Errorf("%s: got %v, want a refusal", at, err)
		}
	}
}

func kfuncCall(name string) asm.Instruction {
	ins := asm.Instruction{OpCode: asm.OpCode(asm.JumpClass).SetJumpOp(asm.Call), Src: asm.PseudoKfuncCall, Constant: -1}
	return ins.WithReference(name)
}

func TestKfuncs(t *testing.T) {
	err := CheckProgram("hop_tc", prog(ebpf.SchedCLS, kfuncCall("bpf_send_signal_task")))
	if err == nil || err.Error() != "program hop_tc calls bpf_send_signal_task (not allowed)" {
		t.Fatalf("got %v", err)
	}
	// hop.bpf.h reaches the skb through this one.
	if err := CheckProgram("hop_tc", prog(ebpf.SchedCLS, kfuncCall("bpf_cast_to_kern_ctx"))); err != nil {
		t.Fatalf("bpf_cast_to_kern_ctx refused: %v", err)
	}
}

func TestCheckNamesTheFirstBadProgramInNameOrder(t *testing.T) {
	spec := &ebpf.CollectionSpec{Programs: map[string]*ebpf.ProgramSpec{
		"hop_xdp": prog(ebpf.XDP, asm.FnSendSignal.Call()),
		"hop_tc":  prog(ebpf.SchedCLS, asm.FnOverrideReturn.Call()),
		"tag_tcp": prog(ebpf.SockOps),
	}}
	for range 5 {
		if err := Check(spec); err == nil || err.Error() != "program hop_tc calls bpf_override_return (not allowed)" {
			t.Fatalf("got %v", err)
		}
	}
}
