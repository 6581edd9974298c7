package loader_test

import (
	"net"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/hoptrace/hoptrace/agent/internal/loader"
	"github.com/hoptrace/hoptrace/agent/internal/netns"
	"github.com/hoptrace/hoptrace/agent/internal/record"
	tu "github.com/hoptrace/hoptrace/agent/internal/testutil"
)

// dropsPerRound are the packets a round of BenchmarkDropHop drops: UDP datagrams to a port nothing
// listens on, which the receiving namespace frees with SKB_DROP_REASON_NO_SOCKET.
const dropsPerRound = 200

// BenchmarkDropHop is what a trace's drop hop (drops: true: skb:kfree_skb with its reason, recording
// drop_reason and drop_function, as the dispatcher plans it) costs per freed packet, by bpf_stats
// (run_time_ns / run_cnt growth) on real drops over a veth pair: a traced packet (its ID read, a record
// with the reason and the location), the same recording the reason alone (what the location adds), an
// untraced one in the hop's namespace (parsed, no ID), and a drop in another namespace (the namespace
// check alone), each round the median over b.N rounds. The tracepoint runs for every packet any
// namespace of the machine frees with a reason, so the last is what every other drop on the node pays.
//
//	go test -run '^$' -bench DropHop -benchtime 20x ./internal/loader
func BenchmarkDropHop(b *testing.B) {
	h := newHarness(b)
	p := tu.NewVethPair(b, "198.18.78")
	inoB, err := netns.Inode(netns.Path(p.NsB, ""))
	if err != nil {
		b.Fatal(err)
	}
	inoA, err := netns.Inode(netns.Path(p.NsA, ""))
	if err != nil {
		b.Fatal(err)
	}
	shown := strings.Fields(tu.Ip(b, "-n", p.NsB, "-br", "link", "show", p.DevB)) // NAME STATE MAC FLAGS
	if len(shown) < 3 {
		b.Fatalf("%s: %q", p.DevB, shown)
	}
	dst, err := net.ParseMAC(shown[2])
	if err != nil {
		b.Fatalf("%s's MAC: %v", p.DevB, err)
	}
	frame := func(id uint32) []byte {
		pkt := tu.Cat(tu.Ethernet(0x0800), tu.IPv4(17, p.AddrA, p.AddrB, nil, tu.UDP(40000, 9, make([]byte, 64)), 4), tu.ID(id))
		if id == 0 { // no ID: the datagram ends at its payload
			pkt = tu.Cat(tu.Ethernet(0x0800), tu.IPv4(17, p.AddrA, p.AddrB, nil, tu.UDP(40000, 9, make([]byte, 64)), 0))
		}
		copy(pkt[0:6], dst)
		return pkt
	}
	fields := [record.ValuesMax]record.ActionField{record.FieldDropReason, record.FieldDropFunction}
	reasonOnly := [record.ValuesMax]record.ActionField{record.FieldDropReason}
	cases := []struct {
		name   string
		ino    uint64
		id     uint32
		fields [record.ValuesMax]record.ActionField
	}{
		{"traced", inoB, 0x07000002, fields},
		{"traced_reason_only", inoB, 0x07000002, reasonOnly},
		{"untraced", inoB, 0, fields},
		{"other_netns", inoA, 0x07000002, fields},
	}
	stats, err := ebpf.EnableStats(unix.BPF_STATS_RUN_TIME)
	if err != nil {
		b.Fatalf("enable bpf_stats: %v", err)
	}
	defer stats.Close()
	for _, c := range cases {
		hop := h.load(b, loader.HopConfig{Program: loader.ProgTPBTFKfree, AttachTo: "kfree_skb", NetnsIno: uint32(c.ino),
			HopIndex: 9, Actions: loader.Actions{Record: c.fields}})
		l, err := link.AttachTracing(link.TracingOptions{Program: hop.Program})
		if err != nil {
			b.Fatalf("%s: attach: %v", c.name, err)
		}
		var perRun []float64
		for round := 0; round < b.N; round++ {
			before := runStats(b, hop.Program)
			for i := 0; i < dropsPerRound; i++ {
				sendFrame(b, p.NsA, p.DevA, frame(c.id+uint32(i)*uint32(min(c.id, 1))))
			}
			after := runStats(b, hop.Program)
			if after.runs < before.runs+dropsPerRound {
				b.Fatalf("%s: %d runs for %d drops", c.name, after.runs-before.runs, dropsPerRound)
			}
			perRun = append(perRun, float64(after.ns-before.ns)/float64(after.runs-before.runs))
			recorded := len(h.drain(b))
			if want := map[bool]int{true: dropsPerRound, false: 0}[c.id != 0 && c.ino == inoB]; recorded != want {
				b.Fatalf("%s: %d records of %d drops, want %d", c.name, recorded, dropsPerRound, want)
			}
		}
		l.Close()
		b.ReportMetric(median(perRun), c.name+"-ns/drop")
	}
}
