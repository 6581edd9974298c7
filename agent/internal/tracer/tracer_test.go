package tracer

import (
	"bufio"
	"context"
	"fmt"
	"go.uber.org/goleak"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"
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

// sendTaggedUDP sends, from inside nsA, an IPv4 UDP packet whose IP length
// covers 4 surplus bytes after the UDP datagram: the packet ID (RFC 9868).
func sendTaggedUDP(t *testing.T, nsA, src, dst string, id uint32) {
	t.Helper()
	pkt := tu.Cat(tu.IPv4(17, src, dst, nil, tu.UDP(40000, 5000, []byte("hoptrace")), 4), tu.ID(id))
	err := netns.Do(netns.Path(nsA, ""), func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_RAW)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		sa := &unix.SockaddrInet4{Addr: netip.MustParseAddr(dst).As4()}
		return unix.Sendto(fd, pkt, 0, sa)
	})
	if err != nil {
		t.Fatalf("send: %v", err)
	}
}

func plan(p *tu.VethPair, gen uint64) *pb.TracePlan {
	return &pb.TracePlan{
		Trace: "t1", Generation: gen, ObjectPath: tu.ObjectPath(),
		Match: &pb.FlowMatch{IpProto: 17, DstPort: 5000},
		Hops: []*pb.HopAttach{
			{HopIndex: 0, Name: "a-out", Kind: pb.AttachKind_ATTACH_KIND_TC_EGRESS, Program: loader.ProgTC, Dev: p.DevA, Netns: p.NsA},
			{HopIndex: 1, Name: "b-in", Kind: pb.AttachKind_ATTACH_KIND_TC_INGRESS, Program: loader.ProgTC, Dev: p.DevB, Netns: p.NsB},
			{HopIndex: 2, Name: "b-rx", Kind: pb.AttachKind_ATTACH_KIND_TRACEPOINT, TracepointGroup: "net", TracepointEvent: "netif_receive_skb", Program: loader.ProgTPBTF, Dev: p.DevB, Netns: p.NsB},
		},
	}
}

// collect pops batches until every hop index in want has a record of id.
func collect(t *testing.T, q *stream.Queue, id uint32, hops int) map[uint16]record.Record {
	t.Helper()
	got := map[uint16]record.Record{}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	for len(got) < hops {
		b := q.Pop(ctx)
		if b == nil {
			t.Fatalf("records of hops %v only", got)
		}
		for off := 0; off < len(b.Records); off += record.Size {
			var r record.Record
			if err := record.Decode(b.Records[off:], &r); err != nil {
				t.Fatal(err)
			}
			if r.PacketID == id {
				got[r.HopIndex] = r
			}
		}
	}
	return got
}

// tcxCount is how many tcx programs are attached to the devices of the
// pair (bpftool 7.1 predates tcx, so ask the kernel with BPF_PROG_QUERY).
func tcxCount(t *testing.T, p *tu.VethPair) int {
	t.Helper()
	n := 0
	for _, x := range [][2]string{{p.NsA, p.DevA}, {p.NsB, p.DevB}} {
		err := netns.Do(netns.Path(x[0], ""), func() error {
			iface, err := net.InterfaceByName(x[1])
			if err != nil {
				return err
			}
			for _, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
				r, err := link.QueryPrograms(link.QueryOptions{Target: iface.Index, Attach: at})
				if err != nil {
					return err
				}
				n += len(r.Programs)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("query tcx in %s: %v", x[0], err)
		}
	}
	return n
}

func linkExists(id uint32) bool {
	return exec.Command("bpftool", "link", "show", "id", fmt.Sprint(id)).Run() == nil
}

func linkIDs(t *testing.T, m *Manager) []uint32 {
	t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	var ids []uint32
	for _, tr := range m.traces {
		for _, h := range tr.Hops {
			if len(h.Links()) == 0 {
				t.Fatalf("hop %s (%s) has no link", h.Name, h.Describe)
			}
			for _, l := range h.Links() {
				info, err := l.Info()
				if err != nil {
					t.Fatal(err)
				}
				ids = append(ids, uint32(info.ID))
			}
		}
	}
	return ids
}

func TestAttachRecordsAndDetach(t *testing.T) {
	tu.RequireRoot(t)
	p := tu.NewVethPair(t, "198.18.40")
	q := stream.NewQueue(0)
	m, err := New(Config{Node: "n1", Out: q, FlushEvery: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			m.Close()
		}
	})

	st := m.Apply(plan(p, 1))
	if !st.GetActive() || st.GetError() != "" {
		t.Fatalf("status %v", st)
	}
	for _, h := range st.GetHops() {
		if !h.GetAttached() {
			t.Fatalf("hop %s: %s", h.GetName(), h.GetError())
		}
	}
	if n := tcxCount(t, p); n != 2 {
		t.Fatalf("%d tcx programs attached, want 2", n)
	}

	sendTaggedUDP(t, p.NsA, p.AddrA, p.AddrB, 0x2a000001)
	got := collect(t, q, 0x2a000001, 3)
	for i, r := range got {
		if r.Flags&record.FlagUDP == 0 || r.TraceSlot == 0 {
			t.Errorf("hop %d record %+v", i, r)
		}
	}
	if !(got[0].TsNs <= got[1].TsNs) {
		t.Errorf("egress at %d after ingress at %d", got[0].TsNs, got[1].TsNs)
	}

	// A newer generation replaces the old one: old links go away.
	old := linkIDs(t, m)
	st = m.Apply(plan(p, 2))
	if !st.GetActive() || st.GetGeneration() != 2 {
		t.Fatalf("generation 2: %v", st)
	}
	for _, id := range old {
		if linkExists(id) {
			t.Errorf("link %d of generation 1 still exists", id)
		}
	}
	if n := tcxCount(t, p); n != 2 {
		t.Fatalf("%d tcx programs after replace, want 2", n)
	}
	sendTaggedUDP(t, p.NsA, p.AddrA, p.AddrB, 0x2a000002)
	if g := collect(t, q, 0x2a000002, 3); g[0].TraceSlot == got[0].TraceSlot {
		t.Errorf("generation 2 reuses slot %d", g[0].TraceSlot)
	}

	c := m.Counters()
	if len(c) != 1 || len(c[0].Hops) != 3 || c[0].Hops[1].GetValues()[record.CRecorded] == 0 || c[0].Hops[1].GetValues()[record.CSeen] == 0 {
		t.Errorf("counters %v", c)
	}

	ids := linkIDs(t, m)
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	closed = true
	for _, id := range ids {
		if linkExists(id) {
			t.Errorf("link %d still exists after Close", id)
		}
	}
	if n := tcxCount(t, p); n != 0 {
		t.Errorf("%d tcx programs left after Close", n)
	}
}

// TestTracerStreamsRealTraffic is what the kernel matrix runs in each guest: the
// agent's own Apply, on whatever attach mode and program variant this kernel
// gets (tcx or a clsact filter, full or _floor), tags a real packet, and every
// hop's record of it reaches the stream in path order.
func TestTracerStreamsRealTraffic(t *testing.T) {
	tu.RequireRoot(t)
	p := tu.NewVethPair(t, "198.18.41")
	floor, why := loader.NeedsFloor()
	t.Logf("floor variants: %v %s", floor, why)
	mode := "tcx"
	if attach.TCXUnsupported() != "" {
		mode = "clsact"
	}
	t.Logf("tc attach: %s", mode) // the kernel matrix's table reads this line
	got := traceOneDatagram(t, p, plan(p, 1))
	for i, r := range got {
		if r.Flags&record.FlagUDP == 0 || r.TraceSlot == 0 {
			t.Errorf("hop %d record %+v", i, r)
		}
	}
	// Egress on one end before the other end's receive (netif_receive_skb fires before tc ingress).
	if !(got[0].TsNs <= got[2].TsNs && got[2].TsNs <= got[1].TsNs) {
		t.Errorf("records out of path order: %+v", got)
	}
}

// TestKernelFunctionHops attaches a kprobe and an fentry hop at ip_rcv (every
// IPv4 packet a device hands up passes it, after tc ingress; netif_receive_skb
// itself is not on a veth's path, which delivers through the backlog). Where
// the kernel cannot (this host: no kprobe_events, fentry refused by lockdown),
// the refusal names the hop and the reason, and nothing stays attached; the
// kernel matrix requires the records in Debian's kernels, which allow both.
func TestKernelFunctionHops(t *testing.T) {
	tu.RequireRoot(t)
	for _, kind := range []pb.AttachKind{pb.AttachKind_ATTACH_KIND_KPROBE, pb.AttachKind_ATTACH_KIND_FENTRY} {
		t.Run(spelling(kind), func(t *testing.T) {
			p := tu.NewVethPair(t, "198.18.42")
			pl := plan(p, 1)
			program := map[pb.AttachKind]string{pb.AttachKind_ATTACH_KIND_KPROBE: loader.ProgKprobe,
				pb.AttachKind_ATTACH_KIND_FENTRY: loader.ProgFentry}[kind]
			pl.Hops[2] = &pb.HopAttach{HopIndex: 2, Name: "b-ip-rcv", Kind: kind, Function: "ip_rcv",
				Program: program, Dev: p.DevB, Netns: p.NsB}
			refusal := attach.KernelFunctionRefusal(kind)
			if refusal != "" {
				q := stream.NewQueue(0)
				m, err := New(Config{Node: "n1", Out: q, FlushEvery: 20 * time.Millisecond})
				if err != nil {
					t.Fatal(err)
				}
				defer m.Close()
				// The agent reports each hop's outcome; the dispatcher rolls the whole trace back.
				hop := m.Apply(pl).GetHops()[2]
				if hop.GetAttached() || !strings.Contains(hop.GetError(), "hop b-ip-rcv") || !strings.Contains(hop.GetError(), refusal) {
					t.Fatalf("want a refusal naming hop b-ip-rcv and %q, got %v", refusal, hop)
				}
				if err := m.Close(); err != nil {
					t.Fatal(err)
				}
				if n := tcxCount(t, p); n != 0 {
					t.Fatalf("%d tc programs left attached", n)
				}
				t.Logf("refused, as this kernel must: %s", hop.GetError())
				return
			}
			got := traceOneDatagram(t, p, pl)
			rcv := got[2]
			if rcv.Flags&record.FlagUDP == 0 || rcv.Ifindex == 0 || rcv.Ifindex != got[1].Ifindex {
				t.Errorf("ip_rcv record %+v, tc ingress record %+v", rcv, got[1])
			}
			if !(got[0].TsNs <= got[1].TsNs && got[1].TsNs <= rcv.TsNs) {
				t.Errorf("records out of path order: %+v", got)
			}
			t.Logf("recorded by %s ip_rcv: packet %#x, %d ns after tc ingress", spelling(kind), rcv.PacketID, rcv.TsNs-got[1].TsNs)
		})
	}
}

// returnHopFunction takes the skb and hands it back to its caller unfreed
// (ip_rcv and netif_receive_skb free or queue it before they return), is
// called for every IPv4 packet routed on receive that no connected socket's
// early demux routed first, and is a global function, not inlined, from 5.10
// (it is exported) to 6.18.
const returnHopFunction = "ip_route_input_noref"

// TestKernelFunctionReturnHops attaches a function's entry hop and its return
// hop (kprobe with kretprobe, fentry with fexit) at returnHopFunction and
// sends datagrams to B: each one has a record of both, the return's no
// earlier than the entry's, joined by ID to the tc hops. Where the kernel
// refuses them (this host) the refusal names the hop and the reason.
func TestKernelFunctionReturnHops(t *testing.T) {
	tu.RequireRoot(t)
	const sent = 20
	pairs := [][2]pb.AttachKind{
		{pb.AttachKind_ATTACH_KIND_KPROBE, pb.AttachKind_ATTACH_KIND_KRETPROBE},
		{pb.AttachKind_ATTACH_KIND_FENTRY, pb.AttachKind_ATTACH_KIND_FEXIT},
	}
	program := map[pb.AttachKind]string{
		pb.AttachKind_ATTACH_KIND_KPROBE: loader.ProgKprobe, pb.AttachKind_ATTACH_KIND_KRETPROBE: loader.ProgKretprobe,
		pb.AttachKind_ATTACH_KIND_FENTRY: loader.ProgFentry, pb.AttachKind_ATTACH_KIND_FEXIT: loader.ProgFexit,
	}
	for _, pair := range pairs {
		entry, ret := pair[0], pair[1]
		t.Run(spelling(ret), func(t *testing.T) {
			p := tu.NewVethPair(t, "198.18.43")
			pl := plan(p, 1)
			pl.Hops[0].TagUdp = true
			pl.Hops[2] = &pb.HopAttach{HopIndex: 2, Name: "b-route-in", Kind: entry, Function: returnHopFunction,
				Program: program[entry], Dev: p.DevB, Netns: p.NsB}
			pl.Hops = append(pl.Hops, &pb.HopAttach{HopIndex: 3, Name: "b-route-out", Kind: ret,
				Function: returnHopFunction, Program: program[ret], Dev: p.DevB, Netns: p.NsB})
			refusal := attach.KernelFunctionRefusal(ret)
			if refusal != "" {
				m, _ := newTestManager(t)
				hop := m.Apply(pl).GetHops()[3]
				if hop.GetAttached() || !strings.Contains(hop.GetError(), "hop b-route-out") || !strings.Contains(hop.GetError(), refusal) {
					t.Fatalf("want a refusal naming hop b-route-out and %q, got %v", refusal, hop)
				}
				if err := m.Close(); err != nil {
					t.Fatal(err)
				}
				if n := tcxCount(t, p); n != 0 {
					t.Fatalf("%d tc programs left attached", n)
				}
				t.Logf("refused, as this kernel must: %s", hop.GetError())
				return
			}
			m, q := newTestManager(t)
			applyAttached(t, m, pl)
			// A receiver, so no datagram draws a port unreachable; unconnected, so its early demux
			// routes none of them (the route lookup is returnHopFunction).
			var receiver net.PacketConn
			err := netns.Do(netns.Path(p.NsB, ""), func() error {
				var err error
				receiver, err = net.ListenPacket("udp4", net.JoinHostPort(p.AddrB, "5000"))
				return err
			})
			if err != nil {
				t.Fatalf("listen: %v", err)
			}
			defer receiver.Close()
			err = netns.Do(netns.Path(p.NsA, ""), func() error {
				conn, err := net.ListenPacket("udp4", net.JoinHostPort(p.AddrA, "0"))
				if err != nil {
					return err
				}
				defer conn.Close()
				to := &net.UDPAddr{IP: net.ParseIP(p.AddrB), Port: 5000}
				for i := 0; i < sent; i++ {
					if _, err := conn.WriteTo([]byte("hoptrace"), to); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				t.Fatalf("send: %v", err)
			}
			byHop := map[uint16]int{}
			complete := map[uint32]map[uint16]record.Record{}
			done := 0
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			for done < sent {
				b := q.Pop(ctx)
				if b == nil {
					t.Fatalf("%d of %d datagrams have a record from every hop; records per hop %v", done, sent, byHop)
				}
				for off := 0; off < len(b.Records); off += record.Size {
					var r record.Record
					if err := record.Decode(b.Records[off:], &r); err != nil {
						t.Fatal(err)
					}
					if r.PacketID == 0 {
						continue
					}
					byHop[r.HopIndex]++
					if complete[r.PacketID] == nil {
						complete[r.PacketID] = map[uint16]record.Record{}
					}
					complete[r.PacketID][r.HopIndex] = r
					if len(complete[r.PacketID]) == len(pl.Hops) {
						done++
					}
				}
			}
			for id, got := range complete {
				if len(got) != len(pl.Hops) {
					t.Errorf("packet %#x: records of hops %v only", id, got)
					continue
				}
				if !(got[1].TsNs <= got[2].TsNs && got[2].TsNs <= got[3].TsNs) {
					t.Errorf("packet %#x: tc ingress %d, entry %d, return %d: out of order", id, got[1].TsNs, got[2].TsNs, got[3].TsNs)
				}
				if got[3].Ifindex != got[1].Ifindex || got[3].Flags&record.FlagUDP == 0 {
					t.Errorf("packet %#x: return record %+v, tc ingress record %+v", id, got[3], got[1])
				}
			}
			if len(complete) != sent || byHop[2] != sent || byHop[3] != sent {
				t.Fatalf("sent %d datagrams: %d traced, records per hop %v", sent, len(complete), byHop)
			}
			t.Logf("recorded by %s %s: %d of %d datagrams, each after %s", spelling(ret), returnHopFunction,
				byHop[3], sent, spelling(entry))
		})
	}
}

// spelling is the spec's name of an attach kind (ATTACH_KIND_KPROBE: kprobe).
func spelling(k pb.AttachKind) string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(k.String(), "ATTACH_KIND_")), "_", "-")
}

// traceOneDatagram applies pl (hop 0 tags UDP), sends one datagram from the
// pair's A end to B, and returns the records of the first packet that has one
// from every hop of the plan.
func traceOneDatagram(t *testing.T, p *tu.VethPair, pl *pb.TracePlan) map[uint16]record.Record {
	t.Helper()
	m, q := newTestManager(t)
	pl.Hops[0].TagUdp = true
	applyAttached(t, m, pl)
	// An untagged datagram: the first hop tags it, the others read the ID it wrote.
	err := netns.Do(netns.Path(p.NsA, ""), func() error {
		conn, err := net.Dial("udp4", net.JoinHostPort(p.AddrB, "5000"))
		if err != nil {
			return err
		}
		defer conn.Close()
		_, err = conn.Write([]byte("hoptrace"))
		return err
	})
	if err != nil {
		t.Fatalf("send: %v", err)
	}
	seen := map[uint32]map[uint16]record.Record{}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		b := q.Pop(ctx)
		if b == nil {
			t.Fatalf("no packet has a record from every hop: %v", seen)
		}
		for off := 0; off < len(b.Records); off += record.Size {
			var r record.Record
			if err := record.Decode(b.Records[off:], &r); err != nil {
				t.Fatal(err)
			}
			if r.PacketID == 0 {
				continue
			}
			if seen[r.PacketID] == nil {
				seen[r.PacketID] = map[uint16]record.Record{}
			}
			seen[r.PacketID][r.HopIndex] = r
			if got := seen[r.PacketID]; len(got) == len(pl.Hops) {
				if got[0].Flags&record.FlagTaggedHere == 0 {
					t.Errorf("the first hop did not tag: %+v", got[0])
				}
				return got
			}
		}
	}
}

func TestAttachErrorsNameTheHop(t *testing.T) {
	tu.RequireRoot(t)
	p := tu.NewVethPair(t, "198.18.41")
	m, err := New(Config{Node: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	pl := &pb.TracePlan{Trace: "t2", Generation: 1, ObjectPath: tu.ObjectPath(), Hops: []*pb.HopAttach{
		{HopIndex: 0, Name: "ok", Kind: pb.AttachKind_ATTACH_KIND_TC_INGRESS, Program: loader.ProgTC, Dev: p.DevB, Netns: p.NsB},
		{HopIndex: 1, Name: "nodev", Kind: pb.AttachKind_ATTACH_KIND_TC_INGRESS, Program: loader.ProgTC, Dev: "eth9", Netns: p.NsB},
		{HopIndex: 2, Name: "fe", Kind: pb.AttachKind_ATTACH_KIND_FENTRY, Function: "netif_receive_skb", Program: loader.ProgFentry},
		{HopIndex: 3, Name: "kp", Kind: pb.AttachKind_ATTACH_KIND_KPROBE, Function: "netif_receive_skb", Program: loader.ProgKprobe},
		{HopIndex: 4, Name: "bad", Program: loader.ProgTC},
		{HopIndex: 5, Name: "noprog", Kind: pb.AttachKind_ATTACH_KIND_XDP, Dev: p.DevB, Netns: p.NsB},
	}}
	st := m.Apply(pl)
	want := map[string]string{
		"ok":     "",
		"nodev":  "hop nodev: device eth9 not found in netns " + p.NsB,
		"fe":     "hop fe: fentry not permitted: kernel lockdown",
		"kp":     "hop kp: kprobe not supported: kernel has no kprobe_events",
		"bad":    "hop bad: unknown attach kind 0",
		"noprog": "hop noprog: plan names no program for the xdp hop",
	}
	for _, h := range st.GetHops() {
		w := want[h.GetName()]
		if w == "" && !h.GetAttached() {
			t.Errorf("hop %s: %s", h.GetName(), h.GetError())
		}
		if w != "" && (h.GetAttached() || !strings.HasPrefix(h.GetError(), w)) {
			t.Errorf("hop %s error %q, want prefix %q", h.GetName(), h.GetError(), w)
		}
	}
}

// A killed agent leaves nothing attached: links are fd-based, never pinned.
func TestKilledAgentLeavesNothing(t *testing.T) {
	tu.RequireRoot(t)
	p := tu.NewVethPair(t, "198.18.42")
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "HTGO_CHILD=1", "HTGO_NS_A="+p.NsA, "HTGO_NS_B="+p.NsB)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	var ids []uint32
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, "LINKS "); ok {
			for _, f := range strings.Fields(rest) {
				var id uint32
				fmt.Sscan(f, &id)
				ids = append(ids, id)
			}
			break
		}
	}
	if len(ids) != 3 {
		t.Fatalf("child reported links %v", ids)
	}
	for _, id := range ids {
		if !linkExists(id) {
			t.Fatalf("link %d not there while the child runs", id)
		}
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	deadline := time.Now().Add(3 * time.Second)
	for _, id := range ids {
		for linkExists(id) && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if linkExists(id) {
			t.Errorf("link %d survived the killed agent", id)
		}
	}
	if n := tcxCount(t, p); n != 0 {
		t.Errorf("%d tcx programs left after kill", n)
	}
}

// TestMain turns the test binary into the agent child of
// TestKilledAgentLeavesNothing when HTGO_CHILD is set; otherwise it runs the
// tests and checks that no reader loop or queue waiter outlived them.
func TestMain(m *testing.M) {
	if os.Getenv("HTGO_CHILD") != "" {
		childAgent()
		return
	}
	goleak.VerifyTestMain(m)
}

func childAgent() {
	p := &tu.VethPair{NsA: os.Getenv("HTGO_NS_A"), NsB: os.Getenv("HTGO_NS_B"), DevA: "vha", DevB: "vhb"}
	m, err := New(Config{Node: "child"})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if st := m.Apply(plan(p, 1)); !st.GetActive() {
		fmt.Fprintln(os.Stderr, st)
		os.Exit(1)
	}
	var s []string
	m.mu.Lock()
	for _, tr := range m.traces {
		for _, h := range tr.Hops {
			for _, l := range h.Links() {
				if info, err := l.Info(); err == nil {
					s = append(s, fmt.Sprint(info.ID))
				}
			}
		}
	}
	m.mu.Unlock()
	fmt.Println("LINKS " + strings.Join(s, " "))
	os.Stdout.Sync()
	time.Sleep(time.Minute)
	os.Exit(1)
}

// newTestManager is a tracer for one test, closed (and the close checked) when the test ends.
func newTestManager(t *testing.T) (*Manager, *stream.Queue) {
	t.Helper()
	return newTestManagerWith(t, Config{})
}

// newTestManagerWith is newTestManager with cfg's settings (its node, queue and flush are the test's).
func newTestManagerWith(t *testing.T, cfg Config) (*Manager, *stream.Queue) {
	t.Helper()
	q := stream.NewQueue(0)
	cfg.Node, cfg.Out, cfg.FlushEvery = "n1", q, 20*time.Millisecond
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return m, q
}

// applyAttached applies the plan and fails the test unless the trace and every hop of it attached.
func applyAttached(t *testing.T, m *Manager, pl *pb.TracePlan) *pb.TraceStatus {
	t.Helper()
	st := m.Apply(pl)
	if !st.GetActive() || st.GetError() != "" {
		t.Fatalf("status %v", st)
	}
	for _, h := range st.GetHops() {
		if !h.GetAttached() {
			t.Fatalf("hop %s: %s", h.GetName(), h.GetError())
		}
	}
	return st
}
