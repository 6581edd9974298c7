package loader_test

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hoptrace/hoptrace/agent/internal/loader"
	tu "github.com/hoptrace/hoptrace/agent/internal/testutil"
)

// A kernel without /sys/kernel/btf/vmlinux runs hoptrace with the BTF of its
// release from a file (BTFHub's are raw BTF, as the kernel's own file is):
// every hop program relocates against it and loads; a file that is not a
// kernel's is refused with its name and the reason.
func TestKernelBTFFromAFile(t *testing.T) {
	tu.RequireRoot(t)
	t.Cleanup(func() { _ = loader.UseKernelBTF("") })
	dir := t.TempDir()
	file := filepath.Join(dir, "vmlinux.btf")
	copyFile(t, loader.KernelBTFPath, file)
	if err := loader.UseKernelBTF(file); err != nil {
		t.Fatal(err)
	}
	if loader.ProgramOptions(0).KernelTypes == nil {
		t.Fatal("the file's types are not what loads relocate against")
	}
	h := newHarness(t)
	for _, program := range []string{loader.ProgTC, loader.ProgTPBTF, loader.ProgXDP} {
		hop := h.load(t, loader.HopConfig{Program: program})
		hop.Close()
	}

	for _, bad := range []struct{ file, says string }{
		{filepath.Join(dir, "missing.btf"), "no such file"},
		{"/etc/hostname", "not BTF of a kernel"},
		{tu.ObjectPath(), "not the BTF of a kernel"}, // BTF, but a BPF object's
	} {
		err := loader.UseKernelBTF(bad.file)
		if err == nil || !strings.Contains(err.Error(), bad.file) || !strings.Contains(err.Error(), bad.says) {
			t.Errorf("UseKernelBTF(%s) = %v, want an error naming the file and %q", bad.file, err, bad.says)
		}
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.Create(to)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
}
