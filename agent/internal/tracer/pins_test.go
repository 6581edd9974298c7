package tracer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/hoptrace/hoptrace/agent/internal/attach"
	"github.com/hoptrace/hoptrace/agent/internal/loader"
	"github.com/hoptrace/hoptrace/agent/internal/netns"
	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
	"github.com/hoptrace/hoptrace/agent/internal/record"
	"github.com/hoptrace/hoptrace/agent/internal/stream"
	tu "github.com/hoptrace/hoptrace/agent/internal/testutil"
)

// testPinDir is a pin directory of the test's own in bpffs, removed (so unpinned) afterwards.
func testPinDir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(bpffsMount, "hoptrace-test-"+tu.Name())
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// newPinnedManager is a Manager of node n1 pinning in dir.
func newPinnedManager(t *testing.T, dir string) (*Manager, *stream.Queue) {
	t.Helper()
	q := stream.NewQueue(0)
	m, err := New(Config{Node: "n1", Out: q, FlushEvery: 20 * time.Millisecond, PinDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	return m, q
}

// sendUDP sends n untagged datagrams from the pair's A end to B (port 5000): the first hop tags them.
func sendUDP(t *testing.T, p *tu.VethPair, n int) {
	t.Helper()
	err := netns.Do(netns.Path(p.NsA, ""), func() error {
		// Not connected: B's port unreachable replies would fail the next write.
		conn, err := net.ListenPacket("udp4", p.AddrA+":0")
		if err != nil {
			return err
		}
		defer conn.Close()
		to := &net.UDPAddr{IP: net.ParseIP(p.AddrB), Port: 5000}
		for i := 0; i < n; i++ {
			if _, err := conn.WriteTo([]byte("hoptrace"), to); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("send: %v", err)
	}
}

// tracedPackets pops batches until n packets have a record from each of hops hops; their IDs. It
// delivers each batch, as a sink does: their records leave the ring.
func tracedPackets(t *testing.T, q *stream.Queue, n, hops int) []uint32 {
	t.Helper()
	_, complete := packetRecords(t, q, n, hops, 0)
	return complete
}

// packetRecords is tracedPackets, then the records that come within settle after: every record by
// packet ID and hop index, and the IDs of the packets seen at every hop, in order. A packet recorded
// twice at a hop fails the test.
func packetRecords(t *testing.T, q *stream.Queue, n, hops int, settle time.Duration) (map[uint32]map[uint16]record.Record, []uint32) {
	t.Helper()
	seen := map[uint32]map[uint16]record.Record{}
	var complete []uint32
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		if len(complete) >= n {
			if settle <= 0 {
				break
			}
			cancel()
			ctx, cancel = context.WithTimeout(context.Background(), settle)
			defer cancel()
			settle = 0
		}
		b := q.Pop(ctx)
		if b == nil {
			if len(complete) >= n {
				break // settled
			}
			t.Fatalf("%d of %d packets traced at every hop (records: %v)", len(complete), n, seen)
		}
		for off := 0; off+record.Size <= len(b.Records); off += record.Size {
			var r record.Record
			if err := record.Decode(b.Records[off:], &r); err != nil {
				t.Fatal(err)
			}
			if seen[r.PacketID] == nil {
				seen[r.PacketID] = map[uint16]record.Record{}
			}
			if _, twice := seen[r.PacketID][r.HopIndex]; twice {
				t.Errorf("packet %#x twice at hop %d", r.PacketID, r.HopIndex)
			}
			seen[r.PacketID][r.HopIndex] = r
			if len(seen[r.PacketID]) == hops {
				complete = append(complete, r.PacketID)
			}
		}
		b.Delivered()
	}
	return seen, complete
}

// tcPrograms counts the programs on the pair's tc hooks: its tcx links where the kernel has tcx (6.6,
// e420bed02507), and its clsact filters (tc hops on a kernel without tcx, or with HOPTRACE_TC=clsact).
func tcPrograms(t *testing.T, p *tu.VethPair) int {
	t.Helper()
	n := 0
	if kernelAtLeast(t, 6, 6) {
		n = tcxCount(t, p)
	}
	for _, x := range [][2]string{{p.NsA, p.DevA}, {p.NsB, p.DevB}} {
		path := netns.Path(x[0], "")
		var ifindex int
		err := netns.Do(path, func() error {
			iface, err := net.InterfaceByName(x[1])
			if err == nil {
				ifindex = iface.Index
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, ingress := range []bool{true, false} {
			filters, err := attach.ClsactFilters(path, ifindex, ingress)
			if err != nil {
				t.Fatalf("clsact filters of %s in %s: %v", x[1], x[0], err)
			}
			n += len(filters)
		}
	}
	return n
}

func attachTimes(m *Manager) map[string]int64 {
	out := map[string]int64{}
	for _, tc := range m.Counters() {
		for _, h := range tc.Hops {
			out[h.GetHop()] = h.GetAttachedNs()
		}
	}
	return out
}

// A trace pinned by one agent outlives it: with no agent, its hops go on tracing into the pinned
// ring buffer; the next agent of the node takes it over (the same programs, attach times and ID
// sequence, no attach again), reads what was recorded meanwhile and goes on; a removal detaches
// and unpins it. As tcx links, and as clsact filters (a kernel without tcx).
func TestTakeOverKeepsTheTrace(t *testing.T) {
	tu.RequireRoot(t)
	for _, tc := range []struct{ name, env string }{{"tcx", ""}, {"clsact", "clsact"}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("HOPTRACE_TC", tc.env)
			if why := attach.TCXUnsupported(); tc.env == "" && why != "" {
				if kernelAtLeast(t, 6, 6) {
					t.Fatalf("tcx is in Linux 6.6, yet tc hops attach as clsact filters: %s", why)
				}
				// The agent falls back to clsact filters, as subtest clsact asks for.
				t.Skipf("tc hops attach as clsact filters before Linux 6.6 (%s): subtest clsact is the case", why)
			}
			p := tu.NewVethPair(t, "198.18.47")
			dir := testPinDir(t)
			pl := plan(p, 1)
			pl.Hops[0].TagUdp = true
			m1, q1 := newPinnedManager(t, dir)
			st := applyAttached(t, m1, pl)
			for _, h := range st.GetHops() {
				if h.GetNotKept() != "" {
					t.Errorf("hop %s not kept: %s", h.GetName(), h.GetNotKept())
				}
			}
			if st.GetNotKept() != "" {
				t.Errorf("trace not kept: %s", st.GetNotKept())
			}
			// Root only (docs/security.md): the directories 0700, the pins 0600.
			for path, want := range map[string]os.FileMode{dir: 0o700 | os.ModeDir, filepath.Join(dir, "n1"): 0o700 | os.ModeDir,
				filepath.Join(dir, "n1", pinRecords): 0o600} {
				if st, err := os.Stat(path); err != nil || st.Mode() != want {
					t.Errorf("%s: mode %v (%v), want %v", path, st.Mode(), err, want)
				}
			}
			sendUDP(t, p, 5)
			before := tracedPackets(t, q1, 5, 3)
			times := attachTimes(m1)
			if err := m1.Release(); err != nil {
				t.Fatal(err)
			}

			// No agent: the hops stay and record.
			if n := tcPrograms(t, p); n != 2 {
				t.Fatalf("%d tc programs with no agent, want the 2 pinned ones", n)
			}
			sendUDP(t, p, 5)

			m2, q2 := newPinnedManager(t, dir)
			closed := false
			t.Cleanup(func() {
				if !closed {
					m2.Close()
				}
			})
			running := m2.Running()
			if len(running) != 1 || !running[0].GetActive() || running[0].GetGeneration() != 1 {
				t.Fatalf("running after the takeover: %v", running)
			}
			while := tracedPackets(t, q2, 5, 3)
			last := before[0]
			for _, id := range before {
				last = max(last, id)
			}
			for _, id := range while {
				if id <= last {
					t.Errorf("packet ID %#x after the takeover, the sequence was at %#x: reused", id, last)
				}
			}
			if got := attachTimes(m2); !equalTimes(got, times) {
				t.Errorf("attach times %v after the takeover, were %v", got, times)
			}
			// The plan again (a dispatcher pushes it to a new agent): nothing is attached again.
			if again := m2.Apply(pl); !again.GetActive() || again.GetError() != "" {
				t.Fatalf("the plan again: %v", again)
			}
			if n := tcPrograms(t, p); n != 2 {
				t.Fatalf("%d tc programs after the plan again, want 2", n)
			}
			sendUDP(t, p, 3)
			tracedPackets(t, q2, 3, 3)

			if st := m2.Remove("t1"); st.GetActive() {
				t.Fatalf("removed: %v", st)
			}
			if n := tcPrograms(t, p); n != 0 {
				t.Errorf("%d tc programs after the removal", n)
			}
			if _, err := os.Stat(filepath.Join(dir, "n1", "t1")); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the trace's pins are left after its removal: %v", err)
			}
			closed = true
			if err := m2.Close(); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the node's pins (or the pin directory) are left after Close: %v", err)
			}
		})
	}
}

// A trace taken over without one of its hops (its pins gone: a hop its kernel could not keep) is not
// active and says why; its plan attaches the hop again, in the same slot and ID sequence. A
// generation left without meta (an agent killed while attaching it) is removed; a second agent of
// the node is refused.
func TestTakeOverWaitsForThePlan(t *testing.T) {
	tu.RequireRoot(t)
	p := tu.NewVethPair(t, "198.18.48")
	dir := testPinDir(t)
	pl := plan(p, 1)
	pl.Hops[0].TagUdp = true
	m1, _ := newPinnedManager(t, dir)
	applyAttached(t, m1, pl)
	if _, err := New(Config{Node: "n1", PinDir: dir}); err == nil || !strings.Contains(err.Error(), "another hoptrace-agent runs for node n1") {
		t.Errorf("a second agent of the node: %v", err)
	}
	if err := m1.Release(); err != nil {
		t.Fatal(err)
	}
	trace := filepath.Join(dir, "n1", "t1")
	slots, _ := filepath.Glob(filepath.Join(trace, "slot*"))
	if len(slots) != 1 {
		t.Fatalf("generation directories %v", slots)
	}
	if err := os.RemoveAll(filepath.Join(slots[0], "hop1")); err != nil {
		t.Fatal(err)
	}
	half := filepath.Join(trace, "slot999")
	if err := os.Mkdir(half, 0o700); err != nil {
		t.Fatal(err)
	}

	m2, q2 := newPinnedManager(t, dir)
	t.Cleanup(func() { m2.Close() })
	if _, err := os.Stat(half); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a generation without meta is left: %v", err)
	}
	running := m2.Running()
	if len(running) != 1 || running[0].GetActive() || !strings.Contains(running[0].GetError(), "waiting for its plan") {
		t.Fatalf("a trace taken over without a hop: %v", running)
	}
	if hs := running[0].GetHops()[1]; hs.GetAttached() || !strings.Contains(hs.GetError(), "not kept across the agent's restart") {
		t.Errorf("the hop not taken over: %v", hs)
	}
	// The link whose pins went is released from a deferred context: allow a moment.
	for until := time.Now().Add(3 * time.Second); tcPrograms(t, p) != 1 && time.Now().Before(until); {
		time.Sleep(50 * time.Millisecond)
	}
	if n := tcPrograms(t, p); n != 1 {
		t.Fatalf("%d tc programs, want the one left pinned", n)
	}
	st := m2.Apply(pl)
	if !st.GetActive() || st.GetError() != "" || !st.GetHops()[1].GetAttached() {
		t.Fatalf("the plan of the trace taken over: %v", st)
	}
	if n := tcPrograms(t, p); n != 2 {
		t.Fatalf("%d tc programs after the plan, want 2", n)
	}
	sendUDP(t, p, 3)
	tracedPackets(t, q2, 3, 3)
	// Its maps, and its link where it is one (tcx; a clsact filter is none).
	again := []string{loader.MapCounters}
	if attach.TCXUnsupported() == "" {
		again = append(again, "link0")
	}
	for _, name := range again {
		if _, err := os.Stat(filepath.Join(slots[0], "hop1", name)); err != nil {
			t.Errorf("the hop attached again is not pinned: %v", err)
		}
	}

	// A newer generation replaces the one taken over: its pins go, the new one's come.
	if st := m2.Apply(plan(p, 2)); !st.GetActive() || st.GetGeneration() != 2 {
		t.Fatalf("generation 2: %v", st)
	}
	if _, err := os.Stat(slots[0]); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("generation 1's pins are left: %v", err)
	}
	if now, _ := filepath.Glob(filepath.Join(trace, "slot*", "meta")); len(now) != 1 {
		t.Errorf("pinned generations %v, want generation 2's", now)
	}
}

// Without a pin directory the status says the trace goes with the agent.
func TestNotKeptWithoutPinDir(t *testing.T) {
	tu.RequireRoot(t)
	p := tu.NewVethPair(t, "198.18.49")
	m, _ := newTestManager(t)
	st := applyAttached(t, m, plan(p, 1))
	if !strings.Contains(st.GetNotKept(), "pins nothing") {
		t.Errorf("not_kept %q", st.GetNotKept())
	}
}

// Every attach kind this kernel attaches is pinned, and taken over by the next agent with the same
// links: tc (tcx links, or clsact filters before 6.6), XDP, cgroup_skb, tp_btf, socket-read (tracing links), uprobe and uretprobe
// (perf_event links), the sock_ops tagger and a tracepoint event probe; fentry, fexit, kprobe and
// kretprobe where the kernel attaches them (this one's lockdown refuses fentry and fexit, and it
// has no kprobe_events). Nothing is left once the trace is removed.
func TestEveryAttachKindIsKept(t *testing.T) {
	tu.RequireRoot(t)
	bin := buildReader(t)
	p := tu.NewVethPair(t, "198.18.50")
	mount, err := attach.Cgroup2Mount()
	if err != nil {
		t.Fatal(err)
	}
	rel := "ht-pin-" + tu.Name()
	if err := os.Mkdir(filepath.Join(mount, rel), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(filepath.Join(mount, rel)) })
	pl := readerPlan("kinds", p, "tcp", nil, nil,
		&pb.HopAttach{HopIndex: 3, Name: "b-xdp", Kind: pb.AttachKind_ATTACH_KIND_XDP, Program: loader.ProgXDP,
			Dev: p.DevB, Netns: p.NsB},
		&pb.HopAttach{HopIndex: 4, Name: "b-rx", Kind: pb.AttachKind_ATTACH_KIND_TRACEPOINT, TracepointGroup: "net",
			TracepointEvent: "netif_receive_skb", Program: loader.ProgTPBTF, Dev: p.DevB, Netns: p.NsB},
		&pb.HopAttach{HopIndex: 5, Name: "app-in", Kind: pb.AttachKind_ATTACH_KIND_CGROUP_INGRESS,
			Program: loader.ProgCgroupSKB, Cgroup: rel},
		&pb.HopAttach{HopIndex: 6, Name: "b-handler", Kind: pb.AttachKind_ATTACH_KIND_UPROBE,
			Program: loader.ProgUprobe, Binary: bin, Function: "handle_request", Netns: p.NsB},
		&pb.HopAttach{HopIndex: 7, Name: "b-handled", Kind: pb.AttachKind_ATTACH_KIND_URETPROBE,
			Program: loader.ProgUprobe, Binary: bin, Function: "handle_request", Netns: p.NsB})
	for i, k := range []struct {
		kind    pb.AttachKind
		program string
		fn      string
	}{
		{pb.AttachKind_ATTACH_KIND_FENTRY, loader.ProgFentry, "netif_receive_skb"},
		{pb.AttachKind_ATTACH_KIND_FEXIT, loader.ProgFexit, returnHopFunction},
		{pb.AttachKind_ATTACH_KIND_KPROBE, loader.ProgKprobe, "netif_receive_skb"},
		{pb.AttachKind_ATTACH_KIND_KRETPROBE, loader.ProgKretprobe, returnHopFunction},
	} {
		if why := attach.KernelFunctionRefusal(k.kind); why != "" {
			t.Logf("not on this kernel: %s", why)
			continue
		}
		pl.Hops = append(pl.Hops, &pb.HopAttach{HopIndex: uint32(8 + i), Name: "fn" + fmt.Sprint(i), Kind: k.kind,
			Program: k.program, Function: k.fn, Netns: p.NsB})
	}
	pl.Events = []*pb.EventAttach{{EventIndex: 0, Name: "kills", TracepointGroup: "syscalls",
		TracepointEvent: "sys_enter_kill", Program: loader.ProgEventTP, Count: true}}
	// A perf_event link (kprobes, uprobes, tracepoint events) can be pinned from 5.15 (b89fbfbb854c):
	// before, those hops and probes are not kept, say so, and wait for the plan after a takeover.
	perfLinks := kernelAtLeast(t, 5, 15)
	perfKind := map[pb.AttachKind]bool{pb.AttachKind_ATTACH_KIND_KPROBE: true, pb.AttachKind_ATTACH_KIND_KRETPROBE: true,
		pb.AttachKind_ATTACH_KIND_UPROBE: true, pb.AttachKind_ATTACH_KIND_URETPROBE: true}
	kept := map[string]bool{"kills": perfLinks, "tcp-tagging": true}
	for _, h := range pl.Hops {
		kept[h.Name] = perfLinks || !perfKind[h.Kind]
	}
	notKept := func(name, why string) {
		switch {
		case kept[name] && why != "":
			t.Errorf("%s not kept: %s", name, why)
		case !kept[name] && !strings.Contains(why, "cannot be pinned on this kernel"):
			t.Errorf("%s: not_kept %q, want why its link cannot be pinned before 5.15", name, why)
		}
	}
	dir := testPinDir(t)
	m1, _ := newPinnedManager(t, dir)
	st := applyAttached(t, m1, pl)
	for _, h := range st.GetHops() {
		notKept(h.GetName(), h.GetNotKept())
	}
	if !st.GetEvents()[0].GetAttached() {
		t.Fatalf("event not attached: %v", st)
	}
	notKept("kills", st.GetEvents()[0].GetNotKept())
	if st.GetNotKept() != "" {
		t.Errorf("trace not kept: %s", st.GetNotKept())
	}
	before := attachedIDs(t, m1)
	if err := m1.Release(); err != nil {
		t.Fatal(err)
	}
	// What is kept stays attached with no agent, its links and programs; the rest goes with the agent.
	for name, ids := range before.links {
		for _, id := range ids {
			if linkExists(id) != kept[name] {
				t.Errorf("%s's link %d: still there %v after its agent, want %v", name, id, !kept[name], kept[name])
			}
		}
	}
	for name, ids := range before.progs {
		for _, id := range ids {
			if !eventually(func() bool { return programExists(id) == kept[name] }) {
				t.Errorf("%s's program %d: still there %v after its agent, want %v", name, id, !kept[name], kept[name])
			}
		}
	}
	m2, _ := newPinnedManager(t, dir)
	t.Cleanup(func() { m2.Close() })
	running := m2.Running()
	if len(running) != 1 || running[0].GetActive() != perfLinks {
		t.Fatalf("running after the takeover: %v (perf_event links pinned: %v)", running, perfLinks)
	}
	after := attachedIDs(t, m2)
	for name := range before.progs {
		if kept[name] && (!slices.Equal(after.links[name], before.links[name]) || !slices.Equal(after.progs[name], before.progs[name])) {
			t.Errorf("%s's links %v, programs %v after the takeover, were %v, %v", name, after.links[name],
				after.progs[name], before.links[name], before.progs[name])
		}
		if !kept[name] && len(after.links[name])+len(after.progs[name]) != 0 {
			t.Errorf("%s not kept, yet taken over with links %v, programs %v", name, after.links[name], after.progs[name])
		}
	}
	if !perfLinks {
		if st := m2.Apply(pl); !st.GetActive() || st.GetError() != "" {
			t.Fatalf("the plan of the trace taken over: %v", st)
		}
	}
	if c := m2.Counters(); len(c) != 1 || len(c[0].Hops) != len(pl.Hops) || len(c[0].Events) != 1 {
		t.Errorf("counters after the takeover: %v", c)
	}
	m2.Remove("kinds")
	for name, ids := range before.links {
		for _, id := range ids {
			if linkExists(id) {
				t.Errorf("%s's link %d left after the removal", name, id)
			}
		}
	}
	for name, ids := range before.progs {
		for _, id := range ids {
			if !eventually(func() bool { return !programExists(id) }) {
				t.Errorf("%s's program %d left after the removal", name, id)
			}
		}
	}
}

// kernelAtLeast says whether the running kernel's release is major.minor or later.
func kernelAtLeast(t *testing.T, major, minor int) bool {
	t.Helper()
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		t.Fatal(err)
	}
	var ma, mi int
	if _, err := fmt.Sscanf(unix.ByteSliceToString(u.Release[:]), "%d.%d", &ma, &mi); err != nil {
		t.Fatalf("kernel release %q: %v", u.Release, err)
	}
	return ma > major || ma == major && mi >= minor
}

// attached are the IDs of what a trace attached, by the name of its hop, tagger ("tcp-tagging") or
// event probe, sorted: the programs of each, and their links. A kprobe or uprobe set on its perf
// event by ioctl (before 5.15: no bpf_link) has no link ID; it is known by its program.
type attached struct{ links, progs map[string][]uint32 }

func attachedIDs(t *testing.T, m *Manager) attached {
	t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	out := attached{links: map[string][]uint32{}, progs: map[string][]uint32{}}
	add := func(ids map[string][]uint32, name string, id uint32) {
		ids[name] = append(ids[name], id)
		slices.Sort(ids[name])
	}
	addProgram := func(name string, p *ebpf.Program) {
		info, err := p.Info()
		if err != nil {
			t.Fatal(err)
		}
		id, ok := info.ID()
		if !ok {
			t.Fatalf("%s: the kernel reports no program ID", name)
		}
		add(out.progs, name, uint32(id))
	}
	addLink := func(name string, l link.Link) {
		info, err := l.Info()
		if errors.Is(err, link.ErrNotSupported) && !kernelAtLeast(t, 5, 15) {
			return // a perf event's program set by ioctl
		}
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		add(out.links, name, uint32(info.ID))
	}
	for _, tr := range m.traces {
		for _, h := range append(tr.Hops, tr.Tagger) {
			if h != nil {
				addProgram(h.Name, h.Loaded.Program)
				for _, l := range h.Links() {
					addLink(h.Name, l)
				}
			}
		}
		for _, e := range tr.Events {
			addProgram(e.Name, e.Loaded.Program)
			addLink(e.Name, e.Link)
		}
	}
	return out
}

func programExists(id uint32) bool {
	return exec.Command("bpftool", "prog", "show", "id", fmt.Sprint(id)).Run() == nil
}

// eventually says whether cond holds within 3 s: a program goes when the last reference to it does,
// some from a deferred context.
func eventually(cond func() bool) bool {
	for until := time.Now().Add(3 * time.Second); !cond(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(until) {
			return false
		}
	}
	return true
}

// Pins of another record layout (an upgrade across a change of hoptrace.h) are not taken over: the
// new agent would misread their records. They are removed, hops detached, and a ring of its own made.
func TestTakeOverRefusesAnotherLayout(t *testing.T) {
	tu.RequireRoot(t)
	p := tu.NewVethPair(t, "198.18.52")
	dir := testPinDir(t)
	m1, _ := newPinnedManager(t, dir)
	applyAttached(t, m1, plan(p, 1))
	if err := m1.Release(); err != nil {
		t.Fatal(err)
	}
	gens, _ := filepath.Glob(filepath.Join(dir, "n1", "t1", "slot*"))
	if len(gens) != 1 {
		t.Fatalf("generation directories %v", gens)
	}
	meta, err := readMeta(gens[0])
	if err != nil {
		t.Fatal(err)
	}
	meta.Layout = "record 40 values 40 addresses 40 capture 136"
	if err := writeMeta(gens[0], meta); err != nil {
		t.Fatal(err)
	}
	m2, _ := newPinnedManager(t, dir)
	t.Cleanup(func() { m2.Close() })
	if running := m2.Running(); len(running) != 0 {
		t.Fatalf("traces of another layout taken over: %v", running)
	}
	if _, err := os.Stat(filepath.Join(dir, "n1", "t1")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the refused trace is still pinned: %v", err)
	}
	for until := time.Now().Add(3 * time.Second); tcPrograms(t, p) != 0 && time.Now().Before(until); {
		time.Sleep(50 * time.Millisecond)
	}
	if n := tcPrograms(t, p); n != 0 {
		t.Errorf("%d tc programs of the refused trace left attached", n)
	}
	applyAttached(t, m2, plan(p, 1)) // its plan attaches it again, with the new agent's ring
}
