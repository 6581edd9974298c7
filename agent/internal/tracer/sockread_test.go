package tracer

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/hoptrace/hoptrace/agent/internal/attach"
	"github.com/hoptrace/hoptrace/agent/internal/loader"
	"github.com/hoptrace/hoptrace/agent/internal/netns"
	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
	"github.com/hoptrace/hoptrace/agent/internal/record"
	"github.com/hoptrace/hoptrace/agent/internal/stream"
	tu "github.com/hoptrace/hoptrace/agent/internal/testutil"
)

const (
	readerPort  = 5000
	readerCount = 50
	readerSize  = 200
)

// buildReader compiles testdata/reader.c (the traced application) with clang.
func buildReader(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "reader")
	out, err := exec.Command("clang", "-O2", "-g", "-Wall", "-o", bin, "testdata/reader.c").CombinedOutput()
	if err != nil {
		t.Fatalf("clang reader.c: %v: %s", err, out)
	}
	return bin
}

// startReader runs the reader in nsB and waits for its "ready"; the returned
// function waits for it to end and returns the lines it printed after that
// (the last is "ok COUNT").
func startReader(t *testing.T, bin, ns, proto string, extra ...string) (*exec.Cmd, func() []string) {
	t.Helper()
	// ip netns exec execs the reader itself: cmd's pid is the reader's.
	args := append([]string{"netns", "exec", ns, bin, proto, fmt.Sprint(readerPort),
		fmt.Sprint(readerCount), fmt.Sprint(readerSize)}, extra...)
	cmd := exec.Command("ip", args...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() || lines.Text() != "ready" {
		t.Fatalf("reader did not start: %q %s", lines.Text(), stderr.String())
	}
	return cmd, func() []string {
		var out []string
		for lines.Scan() {
			out = append(out, lines.Text())
		}
		if err := cmd.Wait(); err != nil {
			t.Fatalf("reader: %v: %s", err, stderr.String())
		}
		if len(out) == 0 || out[len(out)-1] != fmt.Sprintf("ok %d", readerCount) {
			t.Fatalf("reader ended with %q, want ok %d", out, readerCount)
		}
		return out
	}
}

// sendMessages sends readerCount messages from nsA, each after the answer to
// the previous one (so each TCP message is one segment and one read); with
// burst, all of them first and then the answers.
func sendMessages(t *testing.T, ns, proto, addr string, burst ...bool) {
	t.Helper()
	err := netns.Do(netns.Path(ns, ""), func() error {
		conn, err := net.Dial(proto+"4", net.JoinHostPort(addr, fmt.Sprint(readerPort)))
		if err != nil {
			return err
		}
		defer conn.Close()
		msg := make([]byte, readerSize)
		answer := make([]byte, 1)
		for k := 0; k < readerCount; k++ {
			for i := range msg {
				msg[i] = byte(k + i)
			}
			if _, err := conn.Write(msg); err != nil {
				return err
			}
			if len(burst) == 0 || !burst[0] {
				_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
				if _, err := conn.Read(answer); err != nil {
					return fmt.Errorf("answer to message %d: %w", k, err)
				}
			}
		}
		for k := 0; len(burst) > 0 && burst[0] && k < readerCount; k++ {
			_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
			if _, err := conn.Read(answer); err != nil {
				return fmt.Errorf("answer to message %d: %w", k, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("send: %v", err)
	}
}

// recordsByPacket pops batches until `last` has `want` distinct packets (or
// the time is up) and returns every record by packet ID and hop index.
func recordsByPacket(t *testing.T, q *stream.Queue, last uint16, want int) map[uint32]map[uint16][]record.Record {
	t.Helper()
	byID := map[uint32]map[uint16][]record.Record{}
	atLast := map[uint32]bool{}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for len(atLast) < want {
		b := q.Pop(ctx)
		if b == nil {
			break
		}
		for off := 0; off < len(b.Records); off += record.Size {
			var r record.Record
			if err := record.Decode(b.Records[off:], &r); err != nil {
				t.Fatal(err)
			}
			if byID[r.PacketID] == nil {
				byID[r.PacketID] = map[uint16][]record.Record{}
			}
			byID[r.PacketID][r.HopIndex] = append(byID[r.PacketID][r.HopIndex], r)
			if r.HopIndex == last {
				atLast[r.PacketID] = true
			}
		}
	}
	return byID
}

// readerPlan traces proto's flow to the reader from nsA's device out to nsB's device in and the
// reader's read (b-in and b-read with these actions), then the hops in `after`.
func readerPlan(trace string, p *tu.VethPair, proto string, in, read *pb.HopActions, after ...*pb.HopAttach) *pb.TracePlan {
	pl := &pb.TracePlan{
		Trace: trace, Generation: 1, ObjectPath: tu.ObjectPath(),
		Match: &pb.FlowMatch{IpProto: map[string]uint32{"udp": 17, "tcp": 6}[proto], DstPort: readerPort},
		Hops: append([]*pb.HopAttach{
			{HopIndex: 0, Name: "a-out", Kind: pb.AttachKind_ATTACH_KIND_TC_EGRESS, Program: loader.ProgTC,
				Dev: p.DevA, Netns: p.NsA, TagUdp: proto == "udp"},
			{HopIndex: 1, Name: "b-in", Kind: pb.AttachKind_ATTACH_KIND_TC_INGRESS, Program: loader.ProgTC,
				Dev: p.DevB, Netns: p.NsB, Actions: in},
			{HopIndex: 2, Name: "b-read", Kind: pb.AttachKind_ATTACH_KIND_SOCKET_READ,
				Program: map[string]string{"udp": loader.ProgSockReadUDP, "tcp": loader.ProgSockReadTCP}[proto],
				Netns:   p.NsB, Actions: read},
		}, after...),
	}
	if proto == "tcp" {
		pl.TcpTagging = &pb.TcpTagging{Netns: p.NsA, Program: loader.ProgTagTCP}
	}
	return pl
}

// TestSocketReadHop traces a UDP and a TCP flow between two namespaces
// through the sender's device, the receiver's device, the receiving
// application's read and its handler function (uprobe and uretprobe on a
// real binary, compiled here): every message the application read has
// exactly one socket-read record, after its device record, carrying the
// reader's pid, then one record at the handler's entry and one at its
// return, joined to the same packet; and the application got its bytes
// unchanged (the reader checks each).
func TestSocketReadHop(t *testing.T) {
	tu.RequireRoot(t)
	bin := buildReader(t)
	for i, proto := range []string{"udp", "tcp"} {
		t.Run(proto, func(t *testing.T) {
			p := tu.NewVethPair(t, fmt.Sprintf("198.18.%d", 46+i))
			pl := readerPlan("sockread-"+proto, p, proto, nil, nil,
				&pb.HopAttach{HopIndex: 3, Name: "b-handler", Kind: pb.AttachKind_ATTACH_KIND_UPROBE,
					Program: loader.ProgUprobe, Binary: bin, Function: "handle_request", Netns: p.NsB},
				// A process's netns: the binary is opened as /proc/PID/root/BINARY (its mount namespace).
				&pb.HopAttach{HopIndex: 4, Name: "b-handled", Kind: pb.AttachKind_ATTACH_KIND_URETPROBE,
					Program: loader.ProgUprobe, Binary: bin, Function: "handle_request",
					Netns: fmt.Sprintf("/proc/%d/ns/net", os.Getpid())})
			m, q := newTestManager(t)
			applyAttached(t, m, pl) // every hop, or the test stops naming the one that failed
			m.mu.Lock()
			d := m.traces[pl.Trace].Hops[4].Describe
			m.mu.Unlock()
			if !strings.Contains(d, fmt.Sprintf("/proc/%d/root%s", os.Getpid(), bin)) {
				t.Errorf("uretprobe hop opened %q, want the binary under /proc/%d/root", d, os.Getpid())
			}
			reader, wait := startReader(t, bin, p.NsB, proto)
			sendMessages(t, p.NsA, proto, p.AddrB)
			wait()
			byID := recordsByPacket(t, q, 4, readerCount)

			reads := 0
			var inToRead, readToHandler []uint64
			for id, hops := range byID {
				readRecs := hops[2]
				if len(readRecs) == 0 {
					continue
				}
				reads++
				if len(readRecs) != 1 {
					t.Errorf("packet %#x: %d socket-read records, want 1", id, len(readRecs))
				}
				rd := readRecs[0]
				if rd.Flags&record.FlagTask == 0 || int(rd.Ifindex) != reader.Process.Pid {
					t.Errorf("packet %#x: socket-read record %+v, want the reader's pid %d", id, rd, reader.Process.Pid)
				}
				if rd.WireLen != uint32(14+20+readerSize)+map[string]uint32{"udp": 8 + 4, "tcp": 32 + 8}[proto] {
					t.Errorf("packet %#x: socket-read wire_len %d", id, rd.WireLen)
				}
				in := hops[1]
				if len(in) != 1 || len(hops[0]) != 1 {
					t.Errorf("packet %#x: %d device-in and %d device-out records, want 1 each", id, len(in), len(hops[0]))
					continue
				}
				if !(hops[0][0].TsNs <= in[0].TsNs && in[0].TsNs <= rd.TsNs) {
					t.Errorf("packet %#x: out %d, in %d, read %d: not in path order", id, hops[0][0].TsNs, in[0].TsNs, rd.TsNs)
				}
				// The handler the application called after the read: one record per request, of this
				// packet, after the read, entry before return.
				entry, ret := hops[3], hops[4]
				if len(entry) != 1 || len(ret) != 1 {
					t.Errorf("packet %#x: %d uprobe and %d uretprobe records, want 1 each", id, len(entry), len(ret))
					continue
				}
				for _, u := range []record.Record{entry[0], ret[0]} {
					if u.Flags&record.FlagTask == 0 || int(u.Ifindex) != reader.Process.Pid || u.FlowHash != rd.FlowHash ||
						u.WireLen != rd.WireLen {
						t.Errorf("packet %#x: handler record %+v, socket-read record %+v", id, u, rd)
					}
				}
				inToRead = append(inToRead, rd.TsNs-in[0].TsNs)
				readToHandler = append(readToHandler, entry[0].TsNs-rd.TsNs)
				if !(rd.TsNs <= entry[0].TsNs && entry[0].TsNs <= ret[0].TsNs) {
					t.Errorf("packet %#x: read %d, handler entry %d, return %d: not in order", id, rd.TsNs, entry[0].TsNs, ret[0].TsNs)
				}
			}
			// Every message the application read, and nothing else (TCP's ACK-only segments are never read).
			if reads != readerCount {
				t.Logf("counters %v", m.Counters())
				t.Fatalf("%d packets recorded at socket-read, want the %d messages read", reads, readerCount)
			}
			t.Logf("%s: tc ingress -> socket-read p50 %d ns, socket-read -> handler entry p50 %d ns (%d messages)",
				proto, median(inToRead), median(readToHandler), len(inToRead))
			c := m.Counters()
			if len(c) != 1 {
				t.Fatalf("counters of %d traces", len(c))
			}
			for _, hop := range c[0].Hops[2:] {
				if got := hop.GetValues()[record.CRecorded]; got != readerCount {
					t.Errorf("hop %s recorded %d, want %d", hop.GetHop(), got, readerCount)
				}
			}
		})
	}
}

// TestUprobeBadTargets: a binary that does not exist and a symbol that is not
// in the binary are refused naming the hop and the reason, and nothing of the
// trace stays attached (the dispatcher rolls back on any hop's error).
func TestUprobeBadTargets(t *testing.T) {
	tu.RequireRoot(t)
	bin := buildReader(t)
	p := tu.NewVethPair(t, "198.18.48")
	cases := []struct{ binary, symbol, want string }{
		{"/nonexistent/reader", "handle_request", "uprobe binary /nonexistent/reader: stat /nonexistent/reader: no such file or directory"},
		{bin, "no_such_handler", "symbol no_such_handler is not in " + bin},
		{"relative/reader", "handle_request", `uprobe binary "relative/reader": not an absolute path`},
	}
	for _, c := range cases {
		q := stream.NewQueue(0)
		m, err := New(Config{Node: "n1", Out: q, FlushEvery: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		pl := &pb.TracePlan{
			Trace: "bad-uprobe", Generation: 1, ObjectPath: tu.ObjectPath(),
			Match: &pb.FlowMatch{IpProto: 17, DstPort: readerPort},
			Hops: []*pb.HopAttach{
				{HopIndex: 0, Name: "a-out", Kind: pb.AttachKind_ATTACH_KIND_TC_EGRESS, Program: loader.ProgTC,
					Dev: p.DevA, Netns: p.NsA, TagUdp: true},
				{HopIndex: 1, Name: "b-handler", Kind: pb.AttachKind_ATTACH_KIND_UPROBE, Program: loader.ProgUprobe,
					Binary: c.binary, Function: c.symbol, Netns: p.NsB},
			},
		}
		hop := m.Apply(pl).GetHops()[1]
		if hop.GetAttached() || !strings.Contains(hop.GetError(), "hop b-handler: ") || !strings.Contains(hop.GetError(), c.want) {
			t.Errorf("want a refusal naming hop b-handler and %q, got %v", c.want, hop)
		}
		if err := m.Close(); err != nil {
			t.Fatal(err)
		}
		if attach.TCXUnsupported() == "" {
			if n := tcxCount(t, p); n != 0 {
				t.Fatalf("%d tc programs left attached", n)
			}
		} else if out, err := exec.Command("ip", "netns", "exec", p.NsA, "tc", "filter", "show", "dev", p.DevA,
			"egress").CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "" {
			t.Fatalf("clsact filters left on %s: %s %v", p.DevA, out, err) // before tcx (6.6)
		}
	}
}

func median(v []uint64) uint64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]uint64(nil), v...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

// commKey is a task name as the comm field's value: its first 8 bytes, little-endian.
func commKey(name string) uint64 {
	var b [8]byte
	copy(b[:], name)
	return binary.LittleEndian.Uint64(b[:])
}

// TestSocketReadFields: the reader's fields at socket-read and uprobe hops, each against its ground truth.
// The reader prints its socket's SO_MEMINFO around every receive call; a TCP socket-read hop runs before the
// copy (so its rmem and backlog are the ones just before the call, once the data is there), a UDP one at
// the end of the call (the ones just after). count by comm is the reader's name for every message, pid
// its pid; the latency histograms hold every message (device -> read, read -> handler).
func TestSocketReadFields(t *testing.T) {
	tu.RequireRoot(t)
	bin := buildReader(t)
	queuePair := loader.HasTracepoint("sk_data_ready") && loader.HasTracepoint("sock_recv_length")
	for i, proto := range []string{"udp", "tcp"} {
		t.Run(proto, func(t *testing.T) {
			p := tu.NewVethPair(t, fmt.Sprintf("198.18.%d", 56+i))
			readActions := &pb.HopActions{Count: true, CountBy: pb.Field_FIELD_COMM, Histogram: pb.Field_FIELD_LATENCY,
				PrevTs: true, Record: []pb.Field{pb.Field_FIELD_PID, pb.Field_FIELD_RMEM, pb.Field_FIELD_BACKLOG, pb.Field_FIELD_LEN}}
			pl := readerPlan("sockfields-"+proto, p, proto, &pb.HopActions{PrevTs: true}, readActions,
				&pb.HopAttach{HopIndex: 3, Name: "b-handler", Kind: pb.AttachKind_ATTACH_KIND_UPROBE,
					Program: loader.ProgUprobe, Binary: bin, Function: "handle_request", Netns: p.NsB,
					Actions: &pb.HopActions{Count: true, CountBy: pb.Field_FIELD_PID, Histogram: pb.Field_FIELD_LATENCY,
						Record: []pb.Field{pb.Field_FIELD_COMM, pb.Field_FIELD_LEN}}})
			m, q := newTestManager(t)
			if proto == "udp" && !queuePair {
				// Before 6.6 a UDP read has no socket: the hop is refused, naming the field and why.
				hop := m.Apply(pl).GetHops()[2]
				if hop.GetAttached() || !strings.Contains(hop.GetError(), "hop b-read: field rmem at a UDP socket-read hop needs") {
					t.Fatalf("want b-read refused for rmem, got %v", hop)
				}
				return
			}
			applyAttached(t, m, pl)
			// UDP: a burst, so that each read leaves the rest of it queued (TCP would coalesce one).
			mode := map[string]string{"udp": "burst", "tcp": "meminfo"}[proto]
			reader, wait := startReader(t, bin, p.NsB, proto, mode)
			sendMessages(t, p.NsA, proto, p.AddrB, proto == "udp")
			lines := wait()
			var mem [][4]uint64 // per receive call: rmem, backlog before; rmem, backlog after
			for _, line := range lines[:len(lines)-1] {
				var v [4]uint64
				if _, err := fmt.Sscanf(line, "mem %d %d %d %d", &v[0], &v[1], &v[2], &v[3]); err != nil {
					t.Fatalf("reader line %q: %v", line, err)
				}
				mem = append(mem, v)
			}
			if len(mem) != readerCount {
				t.Fatalf("%d receive calls, want one per message (%d)", len(mem), readerCount)
			}

			// The socket-read records in read order, with their values.
			var reads []record.Values
			var handler []record.Values
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			for len(handler) < readerCount {
				b := q.Pop(ctx)
				if b == nil {
					break
				}
				vals := b.Values
				for off := 0; off < len(b.Records); off += record.Size {
					var r record.Record
					if err := record.Decode(b.Records[off:], &r); err != nil {
						t.Fatal(err)
					}
					if r.Flags&record.FlagValues == 0 {
						continue
					}
					v, err := record.DecodeValues(vals)
					if err != nil {
						t.Fatal(err)
					}
					vals = vals[record.ValuesSize:]
					switch r.HopIndex {
					case 2:
						reads = append(reads, v)
					case 3:
						handler = append(handler, v)
					}
				}
			}
			if len(reads) != readerCount || len(handler) != readerCount {
				t.Fatalf("%d socket-read and %d handler records with values, want %d each", len(reads), len(handler), readerCount)
			}
			pid := uint64(reader.Process.Pid)
			wireLen := uint64(14+20+readerSize) + map[string]uint64{"udp": 8 + 4, "tcp": 32 + 8}[proto]
			for k, v := range reads {
				want := mem[k][2:] // UDP: at the end of the call
				if proto == "tcp" {
					want = mem[k][:2] // TCP: before the copy
				}
				got := v.Values
				if got[0] != pid || got[1] != want[0] || got[2] != want[1] || got[3] != wireLen {
					t.Errorf("read %d: pid, rmem, backlog, len = %v, want %d, %d, %d, %d (SO_MEMINFO %v)",
						k, got, pid, want[0], want[1], wireLen, mem[k])
				}
				// What is still queued: TCP the message being read, UDP the rest of the burst.
				if queued := map[string]int{"udp": readerCount - 1 - k, "tcp": 1}[proto]; got[1] < uint64(queued*readerSize) {
					t.Errorf("read %d: rmem %d, less than the %d messages still queued", k, got[1], queued)
				}
			}
			t.Logf("%s: read 0 pid, rmem, backlog, len %v (SO_MEMINFO %v); handler 0 %v", proto, reads[0].Values, mem[0], handler[0].Values)
			for k, v := range handler {
				if v.Values[0] != commKey("reader") || v.Values[1] != wireLen {
					t.Errorf("handler %d: comm, len = %v, want %#x (reader), %d", k, v.Values, commKey("reader"), wireLen)
				}
			}
			c := m.Counters()
			byHop := map[string]*pb.HopActionValues{}
			for _, h := range c[0].Hops {
				byHop[h.GetHop()] = h.GetActions()
			}
			read, handled := byHop["b-read"], byHop["b-handler"]
			if got := read.GetCounts(); len(got) != 1 || got[commKey("reader")] != readerCount {
				t.Errorf("b-read count by comm %v, want {%#x (reader): %d}", got, commKey("reader"), readerCount)
			}
			if got := handled.GetCounts(); len(got) != 1 || got[pid] != readerCount {
				t.Errorf("b-handler count by pid %v, want {%d: %d}", got, pid, readerCount)
			}
			for name, h := range map[string]*pb.HopActionValues{"b-read": read, "b-handler": handled} {
				total := uint64(0)
				for _, n := range h.GetBuckets() {
					total += n
				}
				if total != readerCount {
					t.Errorf("%s latency histogram holds %d, want every message (%d): %v", name, total, readerCount, h.GetBuckets())
				}
			}
		})
	}
}
