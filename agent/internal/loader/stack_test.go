package loader_test

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	tu "github.com/hoptrace/hoptrace/agent/internal/testutil"
)

// maxCombinedStack is MAX_BPF_STACK: what a program and the functions it calls (bpf_loop's
// callback included) may use together.
const maxCombinedStack = 512

// TestEveryProgramFitsOlderVerifiersStack checks each program's stack as the 6.1 verifier counts
// it: each frame rounded up to 32 bytes, the frames of its deepest chain of calls at most 512.
// Newer kernels count a bpf_loop callback apart, so a program 8 bytes over loads here and is
// refused there; the kernel matrix's guests would find it, this finds it in a second.
func TestEveryProgramFitsOlderVerifiersStack(t *testing.T) {
	objects := []string{tu.ObjectPath()}
	for _, preset := range []string{"mace.bpf.o", "iron.bpf.o", "hook.bpf.o"} {
		objects = append(objects, filepath.Join(filepath.Dir(tu.ObjectPath()), preset))
	}
	checked := 0
	for _, object := range objects {
		spec, err := ebpf.LoadCollectionSpec(object)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range sortedPrograms(spec) {
			frames := stackFrames(spec.Programs[name].Instructions)
			combined, chain := frames.combined(frames.order[0])
			if combined > maxCombinedStack {
				t.Errorf("%s %s: %d bytes of stack through %s, over %d: 6.1's verifier refuses it",
					filepath.Base(object), name, combined, strings.Join(chain, " -> "), maxCombinedStack)
			}
			checked++
		}
	}
	if checked == 0 {
		t.Fatal("no program checked")
	}
}

type stackFrame struct {
	depth   int      // the deepest byte below r10 the function reaches
	callees []string // the functions it calls or passes as callbacks
}

// functionFrames are a program's functions by name, the program's own first in order.
type functionFrames struct {
	order []string
	by    map[string]*stackFrame
}

// stackFrames splits a program's instructions into its functions and finds each one's stack
// depth from its accesses through r10 and the stack pointers it takes (rX = r10; rX += -n), and
// the functions it calls (BPF-to-BPF calls, bpf_loop's callbacks).
func stackFrames(insns asm.Instructions) functionFrames {
	frames := functionFrames{by: map[string]*stackFrame{}}
	var frame *stackFrame
	for i, ins := range insns {
		if sym := ins.Symbol(); sym != "" || i == 0 {
			frame = &stackFrame{}
			frames.order = append(frames.order, sym)
			frames.by[sym] = frame
		}
		depth := 0
		switch class := ins.OpCode.Class(); {
		case class.IsLoad() && ins.Src == asm.R10:
			depth = -int(ins.Offset)
		case class.IsStore() && ins.Dst == asm.R10:
			depth = -int(ins.Offset)
		case class.IsALU() && ins.OpCode.ALUOp() == asm.Add && ins.OpCode.Source() == asm.ImmSource &&
			i > 0 && isStackPointerCopy(insns[i-1], ins.Dst):
			depth = -int(ins.Constant)
		case ins.IsFunctionCall() || ins.IsLoadOfFunctionPointer():
			frame.callees = append(frame.callees, ins.Reference())
		}
		frame.depth = max(frame.depth, depth)
	}
	return frames
}

// combined is the deepest chain of frames from name, each rounded as the verifier rounds it, and
// the chain's functions.
func (f functionFrames) combined(name string) (int, []string) {
	frame := f.by[name]
	if frame == nil {
		return 0, nil
	}
	deepest, chain := 0, []string(nil)
	for _, callee := range frame.callees {
		if callee == name {
			continue
		}
		if d, c := f.combined(callee); d > deepest {
			deepest, chain = d, c
		}
	}
	return roundFrame(frame.depth) + deepest, append([]string{fmt.Sprintf("%s (%d)", name, frame.depth)}, chain...)
}

func isStackPointerCopy(ins asm.Instruction, dst asm.Register) bool {
	return ins.OpCode.Class().IsALU() && ins.OpCode.ALUOp() == asm.Mov &&
		ins.OpCode.Source() == asm.RegSource && ins.Src == asm.R10 && ins.Dst == dst
}

// roundFrame is the verifier's round_up(max(depth, 1), 32).
func roundFrame(depth int) int {
	return (max(depth, 1) + 31) / 32 * 32
}
