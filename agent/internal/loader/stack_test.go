package loader_test

import (
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	tu "github.com/hoptrace/hoptrace/agent/internal/testutil"
)

// maxCombinedStack is MAX_BPF_STACK: what a program and the functions it calls (bpf_loop's
// callback included) may use together.
const maxCombinedStack = 512

// TestEveryProgramFitsOlderVerifiersStack checks each program's stack as the 6.1 verifier counts
// it: each frame rounded up to 32 bytes, the program's frame plus its deepest callee's at most 512.
// Newer kernels count a bpf_loop callback apart, so a program 8 bytes over loads here and is
// refused there; the kernel matrix's guests would find it, this finds it in a second.
func TestEveryProgramFitsOlderVerifiersStack(t *testing.T) {
	objects := []string{tu.ObjectPath()}
	for _, preset := range []string{"mace.bpf.o", "iron.bpf.o"} {
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
			combined, deepest := roundFrame(frames[0].depth), ""
			for _, callee := range frames[1:] {
				if d := roundFrame(frames[0].depth) + roundFrame(callee.depth); d > combined {
					combined, deepest = d, callee.name
				}
			}
			if combined > maxCombinedStack {
				t.Errorf("%s %s: %d bytes of stack with %s (%d of its own), over %d: 6.1's verifier refuses it",
					filepath.Base(object), name, combined, deepest, frames[0].depth, maxCombinedStack)
			}
			checked++
		}
	}
	if checked == 0 {
		t.Fatal("no program checked")
	}
}

type stackFrame struct {
	name  string
	depth int // the deepest byte below r10 the function reaches
}

// stackFrames splits a program's instructions into its functions (the program first) and finds
// each one's stack depth from its accesses through r10 and the stack pointers it takes
// (rX = r10; rX += -n).
func stackFrames(insns asm.Instructions) []stackFrame {
	var frames []stackFrame
	for i, ins := range insns {
		if sym := ins.Symbol(); sym != "" || i == 0 {
			frames = append(frames, stackFrame{name: sym})
		}
		frame := &frames[len(frames)-1]
		depth := 0
		switch class := ins.OpCode.Class(); {
		case class.IsLoad() && ins.Src == asm.R10:
			depth = -int(ins.Offset)
		case class.IsStore() && ins.Dst == asm.R10:
			depth = -int(ins.Offset)
		case class.IsALU() && ins.OpCode.ALUOp() == asm.Add && ins.OpCode.Source() == asm.ImmSource &&
			i > 0 && isStackPointerCopy(insns[i-1], ins.Dst):
			depth = -int(ins.Constant)
		}
		frame.depth = max(frame.depth, depth)
	}
	return frames
}

func isStackPointerCopy(ins asm.Instruction, dst asm.Register) bool {
	return ins.OpCode.Class().IsALU() && ins.OpCode.ALUOp() == asm.Mov &&
		ins.OpCode.Source() == asm.RegSource && ins.Src == asm.R10 && ins.Dst == dst
}

// roundFrame is the verifier's round_up(max(depth, 1), 32).
func roundFrame(depth int) int {
	return (max(depth, 1) + 31) / 32 * 32
}
