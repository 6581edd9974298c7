package tracer

import (
	"context"
	"math/bits"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/hoptrace/hoptrace/agent/internal/netns"
	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
	"github.com/hoptrace/hoptrace/agent/internal/record"
	tu "github.com/hoptrace/hoptrace/agent/internal/testutil"
)

// TestTracerActionsOnRealTraffic sends real datagrams through a veth pair
// with actions on three hops and checks the in-kernel results against what
// was sent and against the records' own values: a count by ifindex equals
// the datagrams, a count by cpu has only real CPUs, a histogram of len holds
// each record's wire_len, and the latency histogram at b-in holds exactly the
// gaps between the a-out and b-in timestamps of each packet. The same with the
// tc hops in the tc hook (the tagger, prev_ts, count and histogram there).
func TestTracerActionsOnRealTraffic(t *testing.T) {
	tu.RequireRoot(t)
	for _, mode := range []struct {
		name  string
		hooks bool
	}{{"programs", false}, {"tc hook", true}} {
		t.Run(mode.name, func(t *testing.T) {
			cfg := Config{}
			if mode.hooks {
				cfg.Hooks = testHooks(t)
			}
			actionsOnRealTraffic(t, cfg)
		})
	}
}

func actionsOnRealTraffic(t *testing.T, cfg Config) {
	p := tu.NewVethPair(t, "198.18.43")
	m, q := newTestManagerWith(t, cfg)
	pl := plan(p, 1)
	pl.Hops[0].TagUdp = true
	pl.Hops[0].Actions = &pb.HopActions{PrevTs: true}
	pl.Hops[1].Actions = &pb.HopActions{Count: true, CountBy: pb.Field_FIELD_IFINDEX, Histogram: pb.Field_FIELD_LATENCY}
	pl.Hops[2].Actions = &pb.HopActions{Count: true, CountBy: pb.Field_FIELD_CPU, Histogram: pb.Field_FIELD_LEN}
	applyAttached(t, m, pl)

	const sent = 20
	err := netns.Do(netns.Path(p.NsA, ""), func() error {
		// Unconnected: nothing listens on b, and its ICMP errors must not stop the sends.
		conn, err := net.ListenPacket("udp4", ":0")
		if err != nil {
			return err
		}
		defer conn.Close()
		to := &net.UDPAddr{IP: net.ParseIP(p.AddrB), Port: 5000}
		for i := 0; i < sent; i++ {
			if _, err := conn.WriteTo(make([]byte, 10+i*50), to); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("send: %v", err)
	}

	// Every packet's records at the three hops.
	seen := map[uint32]map[uint16]record.Record{}
	complete := 0
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for complete < sent {
		b := q.Pop(ctx)
		if b == nil {
			t.Fatalf("%d of %d packets seen at every hop", complete, sent)
		}
		for off := 0; off+record.Size <= len(b.Records); off += record.Size {
			var r record.Record
			if err := record.Decode(b.Records[off:], &r); err != nil {
				t.Fatal(err)
			}
			if seen[r.PacketID] == nil {
				seen[r.PacketID] = map[uint16]record.Record{}
			}
			seen[r.PacketID][r.HopIndex] = r
			if len(seen[r.PacketID]) == 3 {
				complete++
			}
		}
	}
	wantLatency := map[int]uint64{}
	wantLen := map[int]uint64{}
	var ifindexB uint32
	for _, hops := range seen {
		wantLatency[bits.Len64(hops[1].TsNs-hops[0].TsNs)]++
		wantLen[bits.Len64(uint64(hops[2].WireLen))]++
		ifindexB = hops[1].Ifindex
	}

	var in, rx *pb.HopActionValues
	for _, tc := range m.Counters() {
		for _, h := range tc.Hops {
			switch h.GetHopIndex() {
			case 0:
				if h.GetActions() != nil {
					t.Errorf("hop a-out has no count or histogram, sent %v", h.GetActions())
				}
			case 1:
				in = h.GetActions()
			case 2:
				rx = h.GetActions()
			}
		}
	}
	if in == nil || rx == nil {
		t.Fatalf("no action values: b-in %v, b-rx %v", in, rx)
	}
	if len(in.GetCounts()) != 1 || in.GetCounts()[uint64(ifindexB)] != sent {
		t.Errorf("b-in count by ifindex %v, want {%d: %d}", in.GetCounts(), ifindexB, sent)
	}
	checkBuckets(t, "b-in latency", in.GetBuckets(), wantLatency, sent)
	var byCPU uint64
	for cpu, n := range rx.GetCounts() {
		byCPU += n
		if cpu >= uint64(runtime.NumCPU()) {
			t.Errorf("b-rx count key %d is not a CPU (%d CPUs)", cpu, runtime.NumCPU())
		}
	}
	if byCPU != sent {
		t.Errorf("b-rx count by cpu %v sums to %d, want %d", rx.GetCounts(), byCPU, sent)
	}
	checkBuckets(t, "b-rx len", rx.GetBuckets(), wantLen, sent)
}

func checkBuckets(t *testing.T, what string, got []uint64, want map[int]uint64, total uint64) {
	t.Helper()
	var n uint64
	for b, c := range got {
		n += c
		if c != want[b] {
			t.Errorf("%s bucket %d (le %d): %d, want %d", what, b, uint64(1)<<b-1, c, want[b])
		}
	}
	if n != total {
		t.Errorf("%s histogram total %d, want %d", what, n, total)
	}
}
