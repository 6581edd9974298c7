package probe

import (
	"fmt"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/hoptrace/hoptrace/agent/internal/record"
	tu "github.com/hoptrace/hoptrace/agent/internal/testutil"
)

// The facts of /work/shared/ENVIRONMENT.md, measured: a kernel that lacks
// tcx or tp_btf fails here instead of skipping.
func TestCapabilities(t *testing.T) {
	tu.RequireRoot(t)
	c := Capabilities()
	if !c.GetBtf() || !c.GetRingBuffer() || !c.GetTcpHeaderOptions() {
		t.Errorf("btf %v ring %v tcp options %v", c.GetBtf(), c.GetRingBuffer(), c.GetTcpHeaderOptions())
	}
	for _, k := range []string{"tc", "tcx", "xdp", "tp_btf", "raw_tp", "cgroup_skb", "sock_ops"} {
		if s := c.GetAttach()[k]; !s.GetSupported() {
			t.Errorf("%s unsupported: %s", k, s.GetReason())
		}
	}
	for _, k := range []string{"fentry", "kprobe"} {
		s := c.GetAttach()[k]
		if s == nil {
			t.Fatalf("%s not probed", k)
		}
		if !s.GetSupported() && !strings.HasPrefix(s.GetReason(), k+" not") {
			t.Errorf("%s reason %q", k, s.GetReason())
		}
		t.Logf("%s: supported=%v %s", k, s.GetSupported(), s.GetReason())
	}
}

// Each catalogue field is either reported or refused with a reason, never both; drop_reason follows the
// kernel: skb:kfree_skb has its reason argument from 5.17.
func TestFieldCapabilities(t *testing.T) {
	tu.RequireRoot(t)
	c := Capabilities()
	reported := map[string]bool{}
	for _, f := range c.GetActionFields() {
		reported[record.FieldKeys[f]] = true
	}
	for f := record.ActionField(1); f < record.FieldMax; f++ {
		name := record.FieldKeys[f]
		why, refused := c.GetUnavailableFields()[name]
		if reported[name] == refused || (refused && why == "") {
			t.Errorf("field %s: reported %v, refused %v (%q)", name, reported[name], refused, why)
		}
	}
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		t.Fatal(err)
	}
	var major, minor int
	if _, err := fmt.Sscanf(unix.ByteSliceToString(uts.Release[:]), "%d.%d", &major, &minor); err != nil {
		t.Fatal(err)
	}
	hasReason := major > 5 || (major == 5 && minor >= 17)
	for _, name := range []string{"drop_reason", "drop_function"} {
		if reported[name] != hasReason {
			t.Errorf("kernel %d.%d: %s reported %v, want %v (%s)", major, minor, name, reported[name],
				hasReason, c.GetUnavailableFields()[name])
		}
	}
	// What a kernel of the matrix may lack: kfree_skb's reason (before 5.17) and, in cgroup_skb
	// programs, the current task's pid (5.10). Any other field refused is a probe gone wrong.
	mayLack := map[string]bool{"drop_reason": true, "drop_function": true, "pid": true}
	for name, why := range c.GetUnavailableFields() {
		if !mayLack[name] {
			t.Errorf("field %s refused on kernel %d.%d: %s", name, major, minor, why)
		}
	}
	t.Logf("kernel %d.%d: %d fields, unavailable: %v", major, minor, len(c.GetActionFields()), c.GetUnavailableFields())
}
