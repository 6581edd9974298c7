package loader

import (
	"fmt"
	"os"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"

	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/rlimit"
	"github.com/hoptrace/hoptrace/agent/internal/tracefs"
)

// KernelFeature is one thing the programs' full variants use that older
// kernels lack; without any of them the agent loads the _floor variants.
type KernelFeature struct {
	Name      string // as users know it: "bpf_loop"
	MinKernel string // the first mainline release with it
	Present   bool
}

// KernelFeatures probes this kernel once (cilium/ebpf's features package).
var KernelFeatures = sync.OnceValue(func() []KernelFeature {
	helper := func(pt ebpf.ProgramType, fn asm.BuiltinFunc) bool {
		return features.HaveProgramHelper(pt, fn) == nil
	}
	return []KernelFeature{
		{"bpf_loop", "5.17", helper(ebpf.SchedCLS, asm.FnLoop)},
		{"bpf_check_mtu and fetching atomics", "5.12", helper(ebpf.SchedCLS, asm.FnCheckMtu)},
		{"bpf_get_netns_cookie in sock_ops", "5.15", helper(ebpf.SockOps, asm.FnGetNetnsCookie)},
		{"bpf_xdp_get_buff_len", "5.18", helper(ebpf.XDP, asm.FnXdpGetBuffLen)},
	}
})

// NeedsFloor says whether this kernel runs only the _floor variants, and why. HOPTRACE_FLOOR=1
// asks for them on any kernel (the tests prove them on a fast kernel this way).
func NeedsFloor() (bool, string) {
	if os.Getenv("HOPTRACE_FLOOR") == "1" {
		return true, "HOPTRACE_FLOOR=1"
	}
	var missing []string
	for _, f := range KernelFeatures() {
		if !f.Present {
			missing = append(missing, f.Name+" ("+f.MinKernel+")")
		}
	}
	if len(missing) == 0 {
		return false, ""
	}
	return true, "kernel lacks " + strings.Join(missing, ", ")
}

// ProgramFor is the program of spec that runs `name` on this kernel: its
// _floor variant where the kernel needs it and the object has it.
func ProgramFor(spec *ebpf.CollectionSpec, name string) string {
	if floor, _ := NeedsFloor(); floor {
		if _, ok := spec.Programs[name+FloorSuffix]; ok {
			return name + FloorSuffix
		}
	}
	return name
}

// AllowLockedMemory lifts RLIMIT_MEMLOCK where the kernel charges BPF memory
// to it (before 5.11); a no-op on newer kernels.
func AllowLockedMemory() error {
	return rlimit.RemoveMemlock()
}

// HasTracepoint says whether this kernel has the tracepoint `event` for
// tp_btf programs (its btf_trace_EVENT type), against the kernel types the
// loads use (UseKernelBTF).
func HasTracepoint(event string) bool {
	spec := kernelTypes.Load()
	if spec == nil {
		var err error
		if spec, err = btf.LoadKernelSpec(); err != nil {
			return false
		}
	}
	var typedef *btf.Typedef
	return spec.TypeByName("btf_trace_"+event, &typedef) == nil
}

// FunctionArgs are kernel function `name`'s parameters by this kernel's BTF,
// as event arguments arg0..: each its integer width and signedness (8
// bytes for pointers; Unsupported for what is no integer, a struct passed by
// value); ok is false when BTF does not describe the function (then a kprobe
// may still attach, an fentry not).
func FunctionArgs(name string) (args []tracefs.Arg, ok bool) {
	spec := kernelTypes.Load()
	if spec == nil {
		var err error
		if spec, err = btf.LoadKernelSpec(); err != nil {
			return nil, false
		}
	}
	var fn *btf.Func
	if spec.TypeByName(name, &fn) != nil {
		return nil, false
	}
	proto, isProto := fn.Type.(*btf.FuncProto)
	if !isProto {
		return nil, false
	}
	for i, p := range proto.Params {
		a := tracefs.Arg{Name: fmt.Sprintf("arg%d", i), Offset: uint16(i), Size: 8}
		switch t := btf.UnderlyingType(p.Type).(type) {
		case *btf.Int:
			a.Size, a.Signed = uint8(t.Size), t.Encoding&btf.Signed != 0
		case *btf.Enum:
			a.Size, a.Signed = uint8(t.Size), t.Signed
		case *btf.Pointer:
		default:
			a.Unsupported = fmt.Sprintf("a %T (%s)", t, p.Name)
		}
		if a.Size != 1 && a.Size != 2 && a.Size != 4 && a.Size != 8 && a.Unsupported == "" {
			a.Unsupported = fmt.Sprintf("%d bytes wide", a.Size)
		}
		args = append(args, a)
	}
	return args, true
}
