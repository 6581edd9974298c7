// Package testutil holds helpers shared by the agent's tests: the path of
// the generic BPF object, crafted packets, and throwaway network namespaces.
package testutil

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/rlimit"
)

// ObjectPath is kernel-patch/build/hoptrace.bpf.o, built by `make bpf`.
func ObjectPath() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..", "kernel-patch", "build", "hoptrace.bpf.o")
}

// LoadSpec loads the generic object; a missing object fails the test.
func LoadSpec(t testing.TB) *ebpf.CollectionSpec {
	t.Helper()
	p := ObjectPath()
	if _, err := os.Stat(p); errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s missing: run make bpf", p)
	}
	spec, err := ebpf.LoadCollectionSpec(p)
	if err != nil {
		t.Fatalf("load %s: %v", p, err)
	}
	return spec
}

// RequireRoot fails (never skips) when the test cannot load BPF programs.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test loads BPF programs: run it as root")
	}
	// Kernels before 5.11 charge BPF memory to RLIMIT_MEMLOCK.
	if err := rlimit.RemoveMemlock(); err != nil {
		t.Fatalf("lift RLIMIT_MEMLOCK: %v", err)
	}
}
