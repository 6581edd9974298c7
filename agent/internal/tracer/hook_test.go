package tracer

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hoptrace/hoptrace/agent/internal/attach"
	"github.com/hoptrace/hoptrace/agent/internal/loader"
	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
	"github.com/hoptrace/hoptrace/agent/internal/record"
	"github.com/hoptrace/hoptrace/agent/internal/stream"
	tu "github.com/hoptrace/hoptrace/agent/internal/testutil"
)

// testHooks are tc hooks of this checkout's hook.bpf.o (make bpf), detached when the test ends.
func testHooks(t *testing.T) *attach.Hooks {
	t.Helper()
	hs, err := attach.NewHooks(filepath.Join(filepath.Dir(tu.ObjectPath()), loader.HookObject))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hs.Close)
	return hs
}

// More traces than tcx holds on a device and direction (63) put their tc hops on one veth pair: with
// the tc hook the two devices run one program each. Datagrams of one trace's flow are recorded at its
// three hops and by no other trace; each trace's counters at the hook count what was sent (matched
// and recorded by its trace, seen and not matched by the others). The hooks stay while a trace uses
// them, and go with the last.
func TestTCHookHoldsManyTraces(t *testing.T) {
	tu.RequireRoot(t)
	p := tu.NewVethPair(t, "198.18.44")
	hooks := testHooks(t)
	m, q := newTestManagerWith(t, Config{Hooks: hooks})
	const others = 70
	for i := range others {
		pl := plan(p, 1)
		pl.Trace = fmt.Sprintf("other%d", i)
		pl.Match = &pb.FlowMatch{IpProto: 17, DstPort: uint32(20000 + i)}
		pl.Hops = pl.Hops[:2] // the two tc hops
		applyAttached(t, m, pl)
	}
	st := applyAttached(t, m, plan(p, 1))
	for _, hs := range st.GetHops() {
		if hs.GetName() != "b-rx" && hs.GetNotKept() != "" {
			t.Errorf("hop %s: not kept %q, but the test agent pins nothing", hs.GetName(), hs.GetNotKept())
		}
	}
	if n := tcPrograms(t, p); n != 2 {
		t.Fatalf("%d tc programs on the pair, want 2 (a hook each device and direction)", n)
	}
	if n, overflow := hooks.Stats(); n != 2 || overflow != 0 {
		t.Errorf("hooks report %d attached, %d bodies not run; want 2, 0", n, overflow)
	}
	m.mu.Lock()
	slot := m.traces["t1"].Slot
	m.mu.Unlock()

	const sent = 10
	for i := range uint32(sent) {
		sendTaggedUDP(t, p.NsA, p.AddrA, p.AddrB, 0x2a000100+i)
	}
	// then a flush more: a record of another trace would come with them
	byID, _ := packetRecords(t, q, sent, 3, 200*time.Millisecond)
	if len(byID) != sent {
		t.Errorf("records of %d packets, want %d", len(byID), sent)
	}
	for id, hops := range byID {
		for i, r := range hops {
			if r.TraceSlot != slot {
				t.Errorf("packet %#x at hop %d recorded for trace slot %d, want t1's %d", id, i, r.TraceSlot, slot)
			}
		}
	}

	for _, tc := range m.Counters() {
		for _, h := range tc.Hops {
			v := h.GetValues()
			switch {
			case tc.Trace == "t1" && h.GetHopIndex() < 2:
				if v[record.CMatched] != sent || v[record.CRecorded] != sent || v[record.CSeen] < sent {
					t.Errorf("t1 %s: matched %d, recorded %d, seen %d; sent %d", h.GetHop(), v[record.CMatched],
						v[record.CRecorded], v[record.CSeen], sent)
				}
			case tc.Trace != "t1":
				if v[record.CMatched] != 0 || v[record.CRecorded] != 0 || v[record.CNotMatched] < sent {
					t.Errorf("%s %s: matched %d, recorded %d, not matched %d; sent %d of another flow", tc.Trace,
						h.GetHop(), v[record.CMatched], v[record.CRecorded], v[record.CNotMatched], sent)
				}
			}
		}
	}

	for i := range others {
		if st := m.Remove(fmt.Sprintf("other%d", i)); st.GetError() != "" {
			t.Fatal(st.GetError())
		}
	}
	if n := tcPrograms(t, p); n != 2 {
		t.Fatalf("%d tc programs with t1 alone, want 2", n)
	}
	sendTaggedUDP(t, p.NsA, p.AddrA, p.AddrB, 0x2a000200)
	collect(t, q, 0x2a000200, 3)
	m.Remove("t1")
	if n := tcPrograms(t, p); n != 0 {
		t.Errorf("%d tc programs after the last trace left, want none", n)
	}
	if n, _ := hooks.Stats(); n != 0 {
		t.Errorf("hooks report %d attached after the last trace left", n)
	}
}

// A hop in a tc hook is not pinned, and its status says so. An agent that leaves its pinned traces
// running takes its hooks with it; the next agent takes the trace over without them (its tracepoint
// hop goes on) and waits for the plan, which puts the tc hops in its own hooks again.
func TestTCHookHopsComeBackWithThePlan(t *testing.T) {
	tu.RequireRoot(t)
	p := tu.NewVethPair(t, "198.18.45")
	dir := testPinDir(t)
	pl := plan(p, 1)
	pl.Hops[0].TagUdp = true
	m1, err := New(Config{Node: "n1", FlushEvery: 20 * time.Millisecond, PinDir: dir, Hooks: testHooks(t)})
	if err != nil {
		t.Fatal(err)
	}
	st := applyAttached(t, m1, pl)
	for _, hs := range st.GetHops() {
		inHook := hs.GetName() != "b-rx"
		if got := strings.Contains(hs.GetNotKept(), attach.HookNotKept); got != inHook {
			t.Errorf("hop %s: not kept %q", hs.GetName(), hs.GetNotKept())
		}
	}
	if err := m1.Release(); err != nil {
		t.Fatal(err)
	}
	if n := tcPrograms(t, p); n != 0 {
		t.Fatalf("%d tc programs after the agent left, want none: its hooks go with it", n)
	}

	q2 := stream.NewQueue(0)
	m2, err := New(Config{Node: "n1", Out: q2, FlushEvery: 20 * time.Millisecond, PinDir: dir, Hooks: testHooks(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m2.Close() })
	running := m2.Running()
	if len(running) != 1 || running[0].GetActive() || !strings.Contains(running[0].GetError(), "waiting for its plan") {
		t.Fatalf("a trace taken over without its hooks' hops: %v", running)
	}
	if st := m2.Apply(pl); !st.GetActive() || st.GetError() != "" || !st.GetHops()[0].GetAttached() || !st.GetHops()[1].GetAttached() {
		t.Fatalf("the plan of the trace taken over: %v", st)
	}
	if n := tcPrograms(t, p); n != 2 {
		t.Fatalf("%d tc programs after the plan, want the 2 hooks", n)
	}
	sendUDP(t, p, 3)
	tracedPackets(t, q2, 3, 3)
}
