package loader

import (
	"os"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/rlimit"
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

// FunctionArgCount is how many parameters kernel function `name` takes by
// this kernel's BTF; ok is false when BTF does not describe it (then a
// kprobe may still attach, an fentry not).
func FunctionArgCount(name string) (n int, ok bool) {
	spec := kernelTypes.Load()
	if spec == nil {
		var err error
		if spec, err = btf.LoadKernelSpec(); err != nil {
			return 0, false
		}
	}
	var fn *btf.Func
	if spec.TypeByName(name, &fn) != nil {
		return 0, false
	}
	proto, isProto := fn.Type.(*btf.FuncProto)
	if !isProto {
		return 0, false
	}
	return len(proto.Params), true
}
