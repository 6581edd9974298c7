package attach

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/hoptrace/hoptrace/agent/internal/loader"
	"github.com/hoptrace/hoptrace/agent/internal/netns"
	"github.com/hoptrace/hoptrace/agent/internal/record"
	tu "github.com/hoptrace/hoptrace/agent/internal/testutil"
)

// A tc hop on a kernel without tcx: the clsact filter sees the device's packets, lets them all
// through, and is gone after Close. This kernel has tcx, so the fallback is called directly.
func TestClsactFallback(t *testing.T) {
	tu.RequireRoot(t)
	spec := tu.LoadSpec(t)
	pair := tu.NewVethPair(t, "198.18.91")
	hop, err := loader.LoadHop(spec, loader.HopConfig{Name: "clsact", Program: loader.ProgTC}, loader.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer hop.Close()
	nsPath := netns.Path(pair.NsA, "")
	ifindex, err := netns.Ifindex(nsPath, pair.DevA)
	if err != nil {
		t.Fatal(err)
	}
	filter, err := attachClsact(nsPath, ifindex, hop.Program, false)
	if err != nil {
		t.Fatal(err)
	}
	shown := tu.Ip(t, "netns", "exec", pair.NsA, "tc", "filter", "show", "dev", pair.DevA, "egress")
	if !strings.Contains(shown, "direct-action") {
		t.Fatalf("no direct-action filter on %s egress: %q", pair.DevA, shown)
	}
	// Datagrams to a port nobody listens on: the filter must see each one.
	const sent = 5
	for i := 0; i < sent; i++ {
		out, err := exec.Command("ip", "netns", "exec", pair.NsA, "bash", "-c",
			"echo x > /dev/udp/"+pair.AddrB+"/9").CombinedOutput()
		if err != nil {
			t.Fatalf("send: %v %s", err, out)
		}
	}
	counters, err := hop.ReadCounters()
	if err != nil {
		t.Fatal(err)
	}
	if seen := counters[record.CSeen]; seen < sent {
		t.Errorf("the clsact filter saw %d packets, want >= %d", seen, sent)
	}
	if err := filter.Close(); err != nil {
		t.Fatal(err)
	}
	if shown := tu.Ip(t, "netns", "exec", pair.NsA, "tc", "filter", "show", "dev", pair.DevA, "egress"); strings.TrimSpace(shown) != "" {
		t.Errorf("filter left after Close: %q", shown)
	}
}
