package probe

import (
	"strings"
	"testing"

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
