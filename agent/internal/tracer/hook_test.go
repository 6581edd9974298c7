package tracer

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/hoptrace/hoptrace/agent/internal/attach"
	"github.com/hoptrace/hoptrace/agent/internal/loader"
	"github.com/hoptrace/hoptrace/agent/internal/netns"
	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
	"github.com/hoptrace/hoptrace/agent/internal/record"
	"github.com/hoptrace/hoptrace/agent/internal/stream"
	tu "github.com/hoptrace/hoptrace/agent/internal/testutil"
	"golang.org/x/sys/unix"
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

// More traces than tcx holds on a device and direction (63) put their tc hops on one veth pair, and
// their net:netif_receive_skb hops on its second device: with hooks the two devices run one tc
// program each, and the tracepoint one hook program. Datagrams of one trace's flow are recorded at
// its three hops and by no other trace; each trace's counters at the hooks count what was sent
// (matched and recorded by its trace, seen and not matched by the others). The hooks stay while a
// trace uses them, and go with the last.
func TestHooksHoldManyTraces(t *testing.T) {
	tu.RequireRoot(t)
	p := tu.NewVethPair(t, "198.18.44")
	hooks := testHooks(t)
	m, q := newTestManagerWith(t, Config{Hooks: hooks})
	const others = 70
	for i := range others {
		pl := plan(p, 1)
		pl.Trace = fmt.Sprintf("other%d", i)
		pl.Match = &pb.FlowMatch{IpProto: 17, DstPort: uint32(20000 + i)}
		applyAttached(t, m, pl)
	}
	st := applyAttached(t, m, plan(p, 1))
	for _, hs := range st.GetHops() {
		if hs.GetNotKept() != "" {
			t.Errorf("hop %s: not kept %q, but the test agent pins nothing", hs.GetName(), hs.GetNotKept())
		}
	}
	if n := tcPrograms(t, p); n != 2 {
		t.Fatalf("%d tc programs on the pair, want 2 (a hook each device and direction)", n)
	}
	if n := tracingPrograms(t, loader.ProgTPBTF, loader.HookTPProgram); n != 1 {
		t.Fatalf("%d programs at net:netif_receive_skb, want 1 (the hook of b's device)", n)
	}
	if n, overflow := hooks.Stats(); n != 3 || overflow != 0 {
		t.Errorf("hooks report %d attached, %d bodies not run; want 3, 0", n, overflow)
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
			case tc.Trace == "t1":
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
	if n := tracingPrograms(t, loader.ProgTPBTF, loader.HookTPProgram); n != 0 {
		t.Errorf("%d programs at net:netif_receive_skb after the last trace left, want none", n)
	}
	if n, _ := hooks.Stats(); n != 0 {
		t.Errorf("hooks report %d attached after the last trace left", n)
	}
}

// A tracepoint hop runs at its plan's event: two traces whose hops are on one device at two events
// (net:netif_receive_skb, and net:netif_rx, which a veth's peer fires first) are two hooks, and each
// trace records each datagram at its own event.
func TestTracepointHooksKeepTheirEvents(t *testing.T) {
	tu.RequireRoot(t)
	p := tu.NewVethPair(t, "198.18.46")
	hooks := testHooks(t)
	m, q := newTestManagerWith(t, Config{Hooks: hooks})
	rx := plan(p, 1)
	applyAttached(t, m, rx)
	netifRx := plan(p, 1)
	netifRx.Trace = "t2"
	netifRx.Hops[2].TracepointEvent = "netif_rx"
	applyAttached(t, m, netifRx)
	if n := tracingPrograms(t, loader.HookTPProgram); n != 2 {
		t.Fatalf("%d tracepoint hooks, want 2: one for each event", n)
	}
	m.mu.Lock()
	slots := map[uint16]string{m.traces["t1"].Slot: "t1", m.traces["t2"].Slot: "t2"}
	m.mu.Unlock()

	const sent = 5
	ids := map[uint32]bool{}
	for i := range uint32(sent) {
		ids[0x2a000300+i] = true
		sendTaggedUDP(t, p.NsA, p.AddrA, p.AddrB, 0x2a000300+i)
	}
	recorded := map[string]map[uint32]bool{"t1": {}, "t2": {}}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for len(recorded["t1"]) < sent || len(recorded["t2"]) < sent {
		b := q.Pop(ctx)
		if b == nil {
			t.Fatalf("records at the tracepoint hops of %d and %d of %d datagrams (t1, t2)", len(recorded["t1"]),
				len(recorded["t2"]), sent)
		}
		for off := 0; off+record.Size <= len(b.Records); off += record.Size {
			var r record.Record
			if err := record.Decode(b.Records[off:], &r); err != nil {
				t.Fatal(err)
			}
			if trace, ok := slots[r.TraceSlot]; ok && r.HopIndex == 2 && ids[r.PacketID] {
				if recorded[trace][r.PacketID] {
					t.Errorf("%s recorded %#x twice at its tracepoint hop", trace, r.PacketID)
				}
				recorded[trace][r.PacketID] = true
			}
		}
		b.Delivered()
	}
}

// A hop in a hook is not pinned, and its status says so. An agent that leaves its pinned traces
// running takes its hooks with it; the next agent takes the trace over without them and waits for
// the plan, which puts the hops in its own hooks again.
func TestHookHopsComeBackWithThePlan(t *testing.T) {
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
		if !strings.Contains(hs.GetNotKept(), attach.HookNotKept) {
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
	if st := m2.Apply(pl); !st.GetActive() || st.GetError() != "" {
		t.Fatalf("the plan of the trace taken over: %v", st)
	} else {
		for _, hs := range st.GetHops() {
			if !hs.GetAttached() {
				t.Fatalf("hop %s of the trace taken over not attached: %v", hs.GetName(), st)
			}
		}
	}
	if n := tcPrograms(t, p); n != 2 {
		t.Fatalf("%d tc programs after the plan, want the 2 hooks", n)
	}
	if n := tracingPrograms(t, loader.ProgTPBTF, loader.HookTPProgram); n != 1 {
		t.Fatalf("%d programs at net:netif_receive_skb after the plan, want its hook", n)
	}
	sendUDP(t, p, 3)
	tracedPackets(t, q2, 3, 3)
}

// More traces tag TCP in one cgroup than it takes sock_ops programs (64): with hooks their taggers are
// slots of one sock_ops hook, and a connection's segments carry the matching trace's IDs alone. Every
// segment the client sent (tcpi_segs_out) is tagged once, and recorded with its ID at the two tc hops,
// for that trace.
func TestSockOpsHookTagsPastTheCgroupsCap(t *testing.T) {
	tu.RequireRoot(t)
	p := tu.NewVethPair(t, "198.18.43")
	hooks := testHooks(t)
	m, q := newTestManagerWith(t, Config{Hooks: hooks})
	tcpPlan := func(trace string, dport uint32) *pb.TracePlan {
		pl := plan(p, 1)
		pl.Trace = trace
		pl.Match = &pb.FlowMatch{IpProto: 6, DstPort: dport}
		pl.Hops = pl.Hops[:2] // the two tc hops
		pl.TcpTagging = &pb.TcpTagging{Netns: p.NsA, Program: loader.ProgTagTCP}
		return pl
	}
	const others = 70
	for i := range others {
		applyAttached(t, m, tcpPlan(fmt.Sprintf("other%d", i), uint32(30000+i)))
	}
	applyAttached(t, m, tcpPlan("t1", readerPort))
	if n, overflow := hooks.Stats(); n != 3 || overflow != 0 {
		t.Fatalf("hooks report %d attached, %d bodies not run; want 3 (two tc, one sock_ops), 0", n, overflow)
	}
	m.mu.Lock()
	slot, tagger := m.traces["t1"].Slot, m.traces["t1"].Tagger
	m.mu.Unlock()

	segsOut := echoTCP(t, p, readerPort, 20)
	t.Logf("the client sent %d segments", segsOut)
	c, err := tagger.ReadCounters()
	if err != nil {
		t.Fatal(err)
	}
	if c[record.CTagged] != uint64(segsOut) || c[record.CTagFailed] != 0 {
		t.Fatalf("t1's tagger tagged %d, failed %d; the client sent %d segments", c[record.CTagged], c[record.CTagFailed], segsOut)
	}
	byID, _ := packetRecords(t, q, int(segsOut), 2, 200*time.Millisecond)
	if len(byID) != int(segsOut) {
		t.Errorf("records of %d packets, want the %d segments sent", len(byID), segsOut)
	}
	for id, hops := range byID {
		for i, r := range hops {
			if r.TraceSlot != slot {
				t.Errorf("packet %#x at hop %d recorded for trace slot %d, want t1's %d", id, i, r.TraceSlot, slot)
			}
		}
	}
	m.mu.Lock()
	for name, tr := range m.traces {
		if name == "t1" {
			continue
		}
		if c, err := tr.Tagger.ReadCounters(); err != nil || c[record.CMatched] != 0 || c[record.CTagged] != 0 {
			t.Errorf("%s's tagger: %v, %v; it takes another port", name, c, err)
		}
	}
	m.mu.Unlock()
	for i := range others {
		m.Remove(fmt.Sprintf("other%d", i))
	}
	m.Remove("t1")
	if n, _ := hooks.Stats(); n != 0 {
		t.Errorf("hooks report %d attached after the last trace left", n)
	}
}

// echoTCP connects from p's A side to a server on its B side at port, sends messages of 100 bytes
// one at a time, each answered by a byte, closes, and returns the segments the client sent.
func echoTCP(t *testing.T, p *tu.VethPair, port, messages int) uint32 {
	t.Helper()
	var ln net.Listener
	if err := netns.Do(netns.Path(p.NsB, ""), func() (err error) {
		ln, err = net.Listen("tcp4", net.JoinHostPort(p.AddrB, fmt.Sprint(port)))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 100)
		for {
			if _, err := io.ReadFull(c, buf); err != nil {
				return
			}
			if _, err := c.Write([]byte{1}); err != nil {
				return
			}
		}
	}()
	var segs uint32
	err := netns.Do(netns.Path(p.NsA, ""), func() error {
		conn, err := net.Dial("tcp4", net.JoinHostPort(p.AddrB, fmt.Sprint(port)))
		if err != nil {
			return err
		}
		tc := conn.(*net.TCPConn)
		defer tc.Close()
		answer := make([]byte, 1)
		for range messages {
			if _, err := tc.Write(make([]byte, 100)); err != nil {
				return err
			}
			_ = tc.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := io.ReadFull(tc, answer); err != nil {
				return err
			}
		}
		_ = tc.CloseWrite()
		if _, err := io.ReadAll(tc); err != nil { // the server's FIN, which the client ACKs
			return err
		}
		raw, err := tc.SyscallConn()
		if err != nil {
			return err
		}
		var info *unix.TCPInfo
		var ierr error
		if err := raw.Control(func(fd uintptr) { info, ierr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) }); err != nil {
			return err
		}
		if ierr != nil {
			return ierr
		}
		segs = info.Segs_out
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return segs
}

// tracingPrograms counts this process's links whose program is named one of names or their floor
// variants (the kernel's name is its first 15 bytes; cilium/ebpf gives the whole one where BTF has it): the agent under test holds every link of its hops and hooks, and the
// other test binaries' programs of the same names are not counted.
func tracingPrograms(t *testing.T, names ...string) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fdinfo")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, fd := range fds {
		b, err := os.ReadFile(filepath.Join("/proc/self/fdinfo", fd.Name()))
		if err != nil || !strings.Contains(string(b), "link_id:") {
			continue
		}
		var id uint32
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "prog_id:"); ok {
				fmt.Sscan(strings.TrimSpace(v), &id)
			}
		}
		if id == 0 {
			continue
		}
		prog, err := ebpf.NewProgramFromID(ebpf.ProgramID(id))
		if err != nil {
			continue // detached meanwhile
		}
		info, err := prog.Info()
		prog.Close()
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range names {
			for _, variant := range []string{name, name + loader.FloorSuffix} {
				if info.Name == variant || info.Name == variant[:min(len(variant), 15)] {
					n++
				}
			}
		}
	}
	return n
}
