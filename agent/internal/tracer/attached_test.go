package tracer

import (
	"testing"

	"github.com/hoptrace/hoptrace/agent/internal/clock"
	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
	tu "github.com/hoptrace/hoptrace/agent/internal/testutil"
)

// attachedTimes is each hop's HopCounters.attached_ns, by hop name.
func attachedTimes(t *testing.T, m *Manager) map[string]int64 {
	t.Helper()
	c := m.Counters()
	if len(c) != 1 {
		t.Fatalf("counters of %d traces, want 1", len(c))
	}
	out := map[string]int64{}
	for _, h := range c[0].Hops {
		out[h.GetHop()] = h.GetAttachedNs()
	}
	return out
}

// TestCountersSayWhenEachHopWasAttached: every hop's counters carry the
// CLOCK_MONOTONIC time its program was attached (records' clock: a packet
// recorded there is later), in attach order; a newer generation at the same
// places with the same filter keeps the older's times (the older watched
// until it was replaced), and one with another filter, or a hop at another
// place, starts anew.
func TestCountersSayWhenEachHopWasAttached(t *testing.T) {
	tu.RequireRoot(t)
	p := tu.NewVethPair(t, "198.18.43")
	m, q := newTestManager(t)

	before := clock.Monotonic()
	applyAttached(t, m, plan(p, 1))
	after := clock.Monotonic()
	first := attachedTimes(t, m)
	if len(first) != 3 {
		t.Fatalf("attach times %v, want 3 hops", first)
	}
	for name, at := range first {
		if at < before || at > after {
			t.Errorf("hop %s attached at %d, outside its apply [%d, %d]", name, at, before, after)
		}
	}
	if !(first["a-out"] <= first["b-in"] && first["b-in"] <= first["b-rx"]) {
		t.Errorf("attach times %v are not in plan order", first)
	}
	sendTaggedUDP(t, p.NsA, p.AddrA, p.AddrB, 0x2a000001)
	got := collect(t, q, 0x2a000001, 3)
	for i, name := range []string{"a-out", "b-in", "b-rx"} {
		if got[uint16(i)].TsNs <= uint64(first[name]) {
			t.Errorf("hop %s recorded at %d, before its attach time %d", name, got[uint16(i)].TsNs, first[name])
		}
	}

	applyAttached(t, m, plan(p, 2))
	if again := attachedTimes(t, m); !equalTimes(again, first) {
		t.Errorf("same hops and filter re-applied: attach times %v, want the first generation's %v", again, first)
	}

	changed := plan(p, 3)
	changed.Match = &pb.FlowMatch{IpProto: 17, DstPort: 5001}
	mid := clock.Monotonic()
	applyAttached(t, m, changed)
	for name, at := range attachedTimes(t, m) {
		if at < mid {
			t.Errorf("new filter: hop %s keeps attach time %d from before the apply at %d", name, at, mid)
		}
	}

	kept := attachedTimes(t, m)
	moved := plan(p, 4)
	moved.Match = changed.Match
	moved.Hops[2].TracepointEvent = "netif_rx"
	applyAttached(t, m, moved)
	last := attachedTimes(t, m)
	if last["a-out"] != kept["a-out"] || last["b-in"] != kept["b-in"] || last["b-rx"] <= kept["b-rx"] {
		t.Errorf("hop b-rx moved: attach times %v, want a-out and b-in kept from %v and b-rx later", last, kept)
	}
}

func equalTimes(a, b map[string]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
