package loader

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"golang.org/x/sys/unix"
)

// KernelBTFPath is where a kernel built with CONFIG_DEBUG_INFO_BTF (5.2+)
// publishes its own types, which CO-RE relocates against.
const KernelBTFPath = "/sys/kernel/btf/vmlinux"

// kernelTypes replaces the kernel's own BTF in every load when it has none
// (--kernel-btf); nil: cilium/ebpf reads KernelBTFPath.
var kernelTypes atomic.Pointer[btf.Spec]

// UseKernelBTF decides what CO-RE relocates against, once at start: file
// (raw BTF, e.g. BTFHub's for this release, or an ELF vmlinux) when given,
// else the kernel's own, and a kernel without either is an error that says
// what to do.
func UseKernelBTF(file string) error {
	if file == "" {
		kernelTypes.Store(nil)
		if _, err := os.Stat(KernelBTFPath); err != nil {
			return fmt.Errorf("this kernel (%s) publishes no BTF at %s (CONFIG_DEBUG_INFO_BTF): give --kernel-btf FILE, "+
				"the BTF of exactly this release (BTFHub has them for distribution kernels)", release(), KernelBTFPath)
		}
		return nil
	}
	spec, err := btf.LoadSpec(file)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("--kernel-btf %s: no such file", file)
		}
		return fmt.Errorf("--kernel-btf %s: not BTF of a kernel: %w", file, err)
	}
	// A BPF object has BTF too, with struct sk_buff even: a kernel's has its functions.
	var fn *btf.Func
	if err := spec.TypeByName("netif_rx", &fn); err != nil {
		return fmt.Errorf("--kernel-btf %s: no function netif_rx in it: not the BTF of a kernel", file)
	}
	kernelTypes.Store(spec)
	return nil
}

// ProgramOptions are the options of every program hoptrace loads: the kernel
// types chosen by UseKernelBTF and the verifier's log level.
func ProgramOptions(level ebpf.LogLevel) ebpf.ProgramOptions {
	return ebpf.ProgramOptions{KernelTypes: kernelTypes.Load(), LogLevel: level}
}

func release() string {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return "unknown release"
	}
	return unix.ByteSliceToString(u.Release[:])
}
