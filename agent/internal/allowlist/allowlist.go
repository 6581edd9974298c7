// Package allowlist decides which BPF programs the agent agrees to load.
//
// The dispatcher pushes whole objects and presets load objects from disk, so
// the agent trusts neither blindly: before anything of an object is loaded,
// every program must be something hoptrace's own programs of that kind of
// object are (policy_gen.go, generated from the objects hoptrace ships by
// `make vocab`):
//
//   - a program and attach type they use (tc, XDP, tp_btf, cgroup_skb,
//     sock_ops, ... for trace plans; tracepoints for MACE);
//   - only helpers and kfuncs they call: a program that writes user memory,
//     sends signals, overrides return values or redirects packets
//     (bpf_redirect, bpf_clone_redirect, ...) is refused because none of
//     hoptrace's programs does;
//   - where the return value decides a packet's fate (tc, XDP, cgroup_skb,
//     sock_ops), every exit returns a constant that lets the packet go on
//     (TC_ACT_UNSPEC/TC_ACT_OK, XDP_PASS, 1): a program that drops
//     (TC_ACT_SHOT), redirects (XDP_REDIRECT) or computes its verdict is
//     refused.
package allowlist

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"unicode"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
)

//go:generate sh -c "cd ../../.. && make vocab"

// Object is what an object is for; each kind has its own policy.
type Object string

// The kinds of objects the agent loads.
const (
	Hops Object = "hops" // trace plans: the hop programs and the TCP tagger
	MACE Object = "mace" // hoptrace mace
	Iron Object = "iron" // hoptrace iron
	Hook Object = "hook" // the tc hook that runs many traces' tc hops (hook.bpf.o)
)

type typePolicy struct {
	attach  map[ebpf.AttachType]bool
	helpers map[asm.BuiltinFunc]bool
	kfuncs  map[string]bool
}

func set[K comparable](keys ...K) map[K]bool {
	m := make(map[K]bool, len(keys))
	for _, k := range keys {
		m[k] = true
	}
	return m
}

// passVerdicts are the return values that let a packet go on, for the
// program types whose return value decides the packet's fate.
var passVerdicts = map[ebpf.ProgramType]map[int32]string{
	ebpf.SchedCLS:  {-1: "TC_ACT_UNSPEC", 0: "TC_ACT_OK"},
	ebpf.XDP:       {2: "XDP_PASS"},
	ebpf.CGroupSKB: {1: "1 (allow)"},
	ebpf.SockOps:   {1: "1"},
}

// ErrNotAllowed is wrapped by every refusal.
var ErrNotAllowed = errors.New("not allowed")

// Check refuses the object if any of its programs is not what hoptrace's own
// programs of that kind are; the error names the program and the reason,
// e.g. "program hop_tc calls bpf_probe_write_user (not allowed)". Programs
// are checked in name order, so the error is the same every time.
func Check(spec *ebpf.CollectionSpec, kind Object) error {
	names := make([]string, 0, len(spec.Programs))
	for name := range spec.Programs {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if err := CheckProgram(name, spec.Programs[name], kind); err != nil {
			return err
		}
	}
	return nil
}

// CheckProgram checks one program's types, every call (subprograms are linked
// into ProgramSpec.Instructions, so their calls count too) and its verdicts.
func CheckProgram(name string, ps *ebpf.ProgramSpec, kind Object) error {
	policies, ok := shipped[kind]
	if !ok {
		return fmt.Errorf("program %s: unknown kind of object %q (%w)", name, kind, ErrNotAllowed)
	}
	pol, ok := policies[ps.Type]
	if !ok {
		return fmt.Errorf("program %s has type %s (%w in %s objects; allowed: %s)",
			name, ps.Type, ErrNotAllowed, kind, allowedTypes(policies))
	}
	if !pol.attach[ps.AttachType] {
		return fmt.Errorf("program %s of type %s has attach type %s (%w in %s objects)",
			name, ps.Type, ps.AttachType, ErrNotAllowed, kind)
	}
	for _, ins := range ps.Instructions {
		switch {
		case ins.IsBuiltinCall():
			if fn := asm.BuiltinFunc(ins.Constant); !pol.helpers[fn] {
				return fmt.Errorf("program %s calls %s (%w)", name, HelperName(fn), ErrNotAllowed)
			}
		case ins.IsKfuncCall():
			if kfunc := ins.Reference(); !pol.kfuncs[kfunc] {
				return fmt.Errorf("program %s calls %s (%w)", name, kfunc, ErrNotAllowed)
			}
		}
	}
	if verdicts, ok := passVerdicts[ps.Type]; ok {
		if err := checkVerdicts(ps, verdicts); err != nil {
			return fmt.Errorf("program %s %w (%w)", name, err, ErrNotAllowed)
		}
	}
	return nil
}

// checkVerdicts requires every exit of the program's own body (not of its
// subprograms, whose return values are not verdicts) to be reached only by
// falling through from a load of a constant verdict into R0: the shape clang
// gives `return TC_ACT_UNSPEC;`. An exit that is a jump target, or follows
// anything else, returns a computed value, which is refused.
func checkVerdicts(ps *ebpf.ProgramSpec, verdicts map[int32]string) error {
	// Raw offsets (a 64-bit load takes two slots) of each instruction and of every jump target; a jump
	// names its target by label until the program is marshalled, by offset after.
	offsets := make([]int, len(ps.Instructions))
	symbols := map[string]int{}
	raw := 0
	for i, ins := range ps.Instructions {
		offsets[i] = raw
		if ins.Symbol() != "" {
			symbols[ins.Symbol()] = raw
		}
		raw += int(ins.Size() / asm.InstructionSize)
	}
	targets := map[int]bool{}
	jumpLabels := map[string]bool{}
	for i, ins := range ps.Instructions {
		if op := ins.OpCode.JumpOp(); op == asm.InvalidJumpOp || op == asm.Call || op == asm.Exit {
			continue
		}
		jumpLabels[ins.Reference()] = true
		if at, ok := symbols[ins.Reference()]; ok && ins.Reference() != "" {
			targets[at] = true
		} else {
			targets[offsets[i]+1+int(ins.Offset)] = true
		}
	}
	for i, ins := range ps.Instructions {
		if i > 0 && ins.Symbol() != "" && !jumpLabels[ins.Symbol()] {
			break // the subprograms (called, or passed to bpf_loop) follow the body
		}
		if ins.OpCode.JumpOp() != asm.Exit {
			continue
		}
		if i == 0 || targets[offsets[i]] {
			return errors.New("returns a computed verdict")
		}
		prev := ps.Instructions[i-1]
		isConstLoad := prev.Dst == asm.R0 && (prev.OpCode.IsDWordLoad() ||
			(prev.OpCode.ALUOp() == asm.Mov && prev.OpCode.Source() == asm.ImmSource))
		if !isConstLoad {
			return errors.New("returns a computed verdict")
		}
		if _, ok := verdicts[int32(uint32(prev.Constant))]; !ok {
			return fmt.Errorf("returns %d, which is not %s", int32(uint32(prev.Constant)), verdictNames(verdicts))
		}
	}
	return nil
}

// HelperName is the C name of a helper: FnProbeWriteUser is bpf_probe_write_user.
func HelperName(fn asm.BuiltinFunc) string {
	var b strings.Builder
	b.WriteString("bpf")
	for _, r := range strings.TrimPrefix(fn.String(), "Fn") {
		if unicode.IsUpper(r) {
			b.WriteByte('_')
		}
		b.WriteRune(unicode.ToLower(r))
	}
	return b.String()
}

func allowedTypes(policies map[ebpf.ProgramType]typePolicy) string {
	var names []string
	for t := range policies {
		names = append(names, t.String())
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

func verdictNames(verdicts map[int32]string) string {
	var names []string
	for _, n := range verdicts {
		names = append(names, n)
	}
	sort.Strings(names)
	return strings.Join(names, " or ")
}
