package tracer

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hoptrace/hoptrace/agent/internal/loader"
	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
	tu "github.com/hoptrace/hoptrace/agent/internal/testutil"
)

// hopStates is each hop of a status as "name: attached" or "name: error".
func hopStates(st *pb.TraceStatus) map[string]string {
	out := map[string]string{}
	for _, h := range st.GetHops() {
		if h.GetAttached() {
			out[h.GetName()] = "attached"
		} else {
			out[h.GetName()] = h.GetError()
		}
	}
	return out
}

// TestCheckFindsVanishedDevicesAndNamespaces: a hop whose device is deleted,
// and hops whose netns is deleted (its veth peer going with it), are found
// by Check, detached, and named in the trace's status; the others stay.
func TestCheckFindsVanishedDevicesAndNamespaces(t *testing.T) {
	tu.RequireRoot(t)
	p := tu.NewVethPair(t, "198.18.43")
	tu.Ip(t, "-n", p.NsA, "link", "add", "vhx", "type", "veth", "peer", "name", "vhy")
	tu.Ip(t, "-n", p.NsA, "link", "set", "vhx", "up")
	tu.Ip(t, "-n", p.NsA, "link", "set", "vhy", "up")
	m, _ := newTestManager(t)
	tc := func(name string, kind pb.AttachKind, dev, ns string, index uint32) *pb.HopAttach {
		return &pb.HopAttach{HopIndex: index, Name: name, Kind: kind, Program: loader.ProgTC, Dev: dev, Netns: ns}
	}
	applyAttached(t, m, &pb.TracePlan{Trace: "t1", Generation: 1, ObjectPath: tu.ObjectPath(),
		Match: &pb.FlowMatch{IpProto: 17, DstPort: 5000},
		Hops: []*pb.HopAttach{
			tc("a-out", pb.AttachKind_ATTACH_KIND_TC_EGRESS, p.DevA, p.NsA, 0),
			tc("x-in", pb.AttachKind_ATTACH_KIND_TC_INGRESS, "vhx", p.NsA, 1),
			tc("b-in", pb.AttachKind_ATTACH_KIND_TC_INGRESS, p.DevB, p.NsB, 2),
		}})
	if got := m.Check(); got != nil {
		t.Fatalf("nothing went away, Check says %v", got)
	}

	tu.Ip(t, "-n", p.NsA, "link", "del", "vhx")
	changed := m.Check()
	if len(changed) != 1 || !changed[0].GetActive() {
		t.Fatalf("after deleting vhx: %v", changed)
	}
	want := map[string]string{"a-out": "attached", "b-in": "attached",
		"x-in": fmt.Sprintf("hop x-in: device vhx is gone from netns %s", p.NsA)}
	if got := hopStates(changed[0]); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("hops %v, want %v", got, want)
	}
	if again := m.Check(); again != nil {
		t.Fatalf("a loss is reported once, then %v", again)
	}
	if running := m.Running(); len(running) != 1 || hopStates(running[0])["x-in"] != want["x-in"] {
		t.Fatalf("Running (a reconnect's Register) %v", running)
	}
	if n := len(m.traces["t1"].Hops); n != 2 {
		t.Fatalf("%d hops still held, want 2 (x-in released)", n)
	}

	// Deleting b's netns takes its veth end with it, and a's peer end (as
	// the kernel tears the namespace down, asynchronously).
	tu.Ip(t, "netns", "del", p.NsB)
	var last *pb.TraceStatus
	deadline := time.Now().Add(10 * time.Second)
	for last == nil || last.GetActive() {
		for _, st := range m.Check() {
			last = st
		}
		if time.Now().After(deadline) {
			t.Fatalf("still active after deleting netns %s: %v", p.NsB, last)
		}
		time.Sleep(20 * time.Millisecond)
	}
	got := hopStates(last)
	if got["b-in"] != fmt.Sprintf("hop b-in: netns %s is gone", p.NsB) ||
		!strings.HasPrefix(got["a-out"], fmt.Sprintf("hop a-out: device %s is gone from netns %s", p.DevA, p.NsA)) {
		t.Fatalf("after deleting netns %s: %v", p.NsB, got)
	}
	if st := m.Remove("t1"); st.GetActive() || st.GetError() != "" {
		t.Fatalf("remove %v", st)
	}
}
