// Package allowlist decides which BPF programs the agent agrees to load.
//
// The dispatcher pushes whole objects, so the agent does not trust them
// blindly: before anything is loaded, every program of the object must be of
// a type hoptrace attaches (SchedCLS for tc, XDP, Tracing as tp_btf/fentry/
// fexit, Kprobe, CGroupSKB, SockOps) and must not call a helper that reaches
// outside the network data path:
//
//   - writes to user memory: bpf_probe_write_user (the only helper that
//     writes another process's memory);
//   - changes to kernel control flow: bpf_override_return (error injection
//     on any ALLOW_ERROR_INJECTION function);
//   - signals: bpf_send_signal, bpf_send_signal_thread, and the
//     bpf_send_signal_task kfunc (Linux 6.13);
//   - reads of user memory: bpf_probe_read_user(_str), bpf_copy_from_user,
//     bpf_copy_from_user_task (and their kfunc cousins), and the legacy
//     bpf_probe_read(_str) that read user or kernel memory. These only read,
//     but hoptrace's programs look at packets and kernel structures, never at
//     a process's memory (keys, passwords); refusing them costs nothing and
//     keeps a compromised dispatcher from reading processes' memory directly.
//     bpf_probe_read_kernel stays (CO-RE reads need it), so this is least
//     privilege, not a confidentiality guarantee (docs/security.md).
//
// Tracing programs of attach type fmod_ret are refused too: they change the
// return value of the function they attach to, like bpf_override_return.
package allowlist

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
)

// programTypes are the program types hoptrace attaches (docs/design.md).
var programTypes = map[ebpf.ProgramType]string{
	ebpf.SchedCLS:  "sched_cls",
	ebpf.XDP:       "xdp",
	ebpf.Tracing:   "tracing",
	ebpf.Kprobe:    "kprobe",
	ebpf.CGroupSKB: "cgroup_skb",
	ebpf.SockOps:   "sock_ops",
}

// tracingAttach are the Tracing attach types that only observe.
var tracingAttach = map[ebpf.AttachType]bool{
	ebpf.AttachTraceRawTp:  true, // tp_btf
	ebpf.AttachTraceFEntry: true,
	ebpf.AttachTraceFExit:  true,
}

// forbiddenHelpers are refused wherever they appear, with the name errors use.
var forbiddenHelpers = map[asm.BuiltinFunc]string{
	asm.FnProbeWriteUser:   "bpf_probe_write_user",
	asm.FnOverrideReturn:   "bpf_override_return",
	asm.FnSendSignal:       "bpf_send_signal",
	asm.FnSendSignalThread: "bpf_send_signal_thread",
	asm.FnProbeReadUser:    "bpf_probe_read_user",
	asm.FnProbeReadUserStr: "bpf_probe_read_user_str",
	asm.FnCopyFromUser:     "bpf_copy_from_user",
	asm.FnCopyFromUserTask: "bpf_copy_from_user_task",
	asm.FnProbeRead:        "bpf_probe_read",
	asm.FnProbeReadStr:     "bpf_probe_read_str",
}

// forbiddenKfuncs are kernel functions (called by name, BTF) refused likewise.
var forbiddenKfuncs = map[string]bool{
	"bpf_send_signal_task":               true,
	"bpf_copy_from_user_str":             true,
	"bpf_copy_from_user_task_str":        true,
	"bpf_probe_read_user_dynptr":         true,
	"bpf_probe_read_user_str_dynptr":     true,
	"bpf_copy_from_user_dynptr":          true,
	"bpf_copy_from_user_str_dynptr":      true,
	"bpf_copy_from_user_task_dynptr":     true,
	"bpf_copy_from_user_task_str_dynptr": true,
}

// ErrNotAllowed is wrapped by every refusal.
var ErrNotAllowed = errors.New("not allowed")

// Check refuses the object if any of its programs is not allowed; the error
// names the program and the reason, e.g. "program hop_tc calls
// bpf_probe_write_user (not allowed)". Programs are checked in name order, so
// the error is the same every time.
func Check(spec *ebpf.CollectionSpec) error {
	names := make([]string, 0, len(spec.Programs))
	for name := range spec.Programs {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if err := CheckProgram(name, spec.Programs[name]); err != nil {
			return err
		}
	}
	return nil
}

// CheckProgram checks one program's type and every instruction (subprograms
// are linked into ProgramSpec.Instructions, so their calls count too).
func CheckProgram(name string, ps *ebpf.ProgramSpec) error {
	if _, ok := programTypes[ps.Type]; !ok {
		return fmt.Errorf("program %s has type %s (%w; allowed: %s)", name, ps.Type, ErrNotAllowed, allowedTypes())
	}
	if ps.Type == ebpf.Tracing && !tracingAttach[ps.AttachType] {
		return fmt.Errorf("program %s is a tracing program of attach type %s (%w; allowed: tp_btf, fentry, fexit)",
			name, ps.AttachType, ErrNotAllowed)
	}
	for _, ins := range ps.Instructions {
		switch {
		case ins.IsBuiltinCall():
			if helper, bad := forbiddenHelpers[asm.BuiltinFunc(ins.Constant)]; bad {
				return fmt.Errorf("program %s calls %s (%w)", name, helper, ErrNotAllowed)
			}
		case ins.IsKfuncCall():
			if kfunc := ins.Reference(); forbiddenKfuncs[kfunc] {
				return fmt.Errorf("program %s calls %s (%w)", name, kfunc, ErrNotAllowed)
			}
		}
	}
	return nil
}

func allowedTypes() string {
	var names []string
	for _, n := range programTypes {
		names = append(names, n)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}
