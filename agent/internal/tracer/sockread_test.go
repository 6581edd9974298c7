package tracer

import (
	"bufio"
	"context"
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
// function waits for it to end and returns its last line.
func startReader(t *testing.T, bin, ns, proto string) (*exec.Cmd, func() string) {
	t.Helper()
	// ip netns exec execs the reader itself: cmd's pid is the reader's.
	cmd := exec.Command("ip", "netns", "exec", ns, bin, proto, fmt.Sprint(readerPort),
		fmt.Sprint(readerCount), fmt.Sprint(readerSize))
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
	return cmd, func() string {
		last := ""
		for lines.Scan() {
			last = lines.Text()
		}
		if err := cmd.Wait(); err != nil {
			t.Fatalf("reader: %v: %s", err, stderr.String())
		}
		return last
	}
}

// sendMessages sends readerCount messages from nsA, each after the answer to
// the previous one (so each TCP message is one segment and one read).
func sendMessages(t *testing.T, ns, proto, addr string) {
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
			_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
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
			ipProto := map[string]uint32{"udp": 17, "tcp": 6}[proto]
			program := map[string]string{"udp": loader.ProgSockReadUDP, "tcp": loader.ProgSockReadTCP}[proto]
			pl := &pb.TracePlan{
				Trace: "sockread-" + proto, Generation: 1, ObjectPath: tu.ObjectPath(),
				Match: &pb.FlowMatch{IpProto: ipProto, DstPort: readerPort},
				Hops: []*pb.HopAttach{
					{HopIndex: 0, Name: "a-out", Kind: pb.AttachKind_ATTACH_KIND_TC_EGRESS, Program: loader.ProgTC,
						Dev: p.DevA, Netns: p.NsA, TagUdp: proto == "udp"},
					{HopIndex: 1, Name: "b-in", Kind: pb.AttachKind_ATTACH_KIND_TC_INGRESS, Program: loader.ProgTC,
						Dev: p.DevB, Netns: p.NsB},
					{HopIndex: 2, Name: "b-read", Kind: pb.AttachKind_ATTACH_KIND_SOCKET_READ, Program: program,
						Netns: p.NsB},
					{HopIndex: 3, Name: "b-handler", Kind: pb.AttachKind_ATTACH_KIND_UPROBE, Program: loader.ProgUprobe,
						Binary: bin, Function: "handle_request", Netns: p.NsB},
					// A process's netns: the binary is opened as /proc/PID/root/BINARY (its mount namespace).
					{HopIndex: 4, Name: "b-handled", Kind: pb.AttachKind_ATTACH_KIND_URETPROBE, Program: loader.ProgUprobe,
						Binary: bin, Function: "handle_request", Netns: fmt.Sprintf("/proc/%d/ns/net", os.Getpid())},
				},
			}
			if proto == "tcp" {
				pl.TcpTagging = &pb.TcpTagging{Netns: p.NsA, Program: loader.ProgTagTCP}
			}
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
			if last := wait(); last != fmt.Sprintf("ok %d", readerCount) {
				t.Fatalf("reader ended with %q, want ok %d", last, readerCount)
			}
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
		m, err := New(Config{Node: "n1", Queue: q, FlushEvery: 20 * time.Millisecond})
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
