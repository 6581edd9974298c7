package crilab

import (
	"strings"
	"testing"
)

// Without containerd the lab says what is missing and how to install it
// (the tests that need it fail with this, not skip).
func TestMissingNamesTheProgramsAndTheInstallCommand(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	got := Missing()
	for _, want := range []string{"containerd, containerd-shim-runc-v2, runc, ctr", AptPackages} {
		if !strings.Contains(got, want) {
			t.Fatalf("Missing() = %q, want it to name %q", got, want)
		}
	}
}

// Without CRI-O's build the lab says what is missing: make crio's programs
// in the directory given, and the Debian packages beside them.
func TestMissingCRIONamesTheBuildAndThePackages(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	dir := t.TempDir()
	got := MissingCRIO(dir)
	for _, want := range []string{dir + "/crio, " + dir + "/pinns, " + dir + "/importimage, conmon, runc", "make crio", CRIOAptPackages} {
		if !strings.Contains(got, want) {
			t.Fatalf("MissingCRIO() = %q, want it to name %q", got, want)
		}
	}
}
