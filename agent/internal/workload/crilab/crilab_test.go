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
