package loader_test

import (
	"flag"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/hoptrace/hoptrace/agent/internal/loader"
	tu "github.com/hoptrace/hoptrace/agent/internal/testutil"
)

var abObject = flag.String("ab-object", "",
	"BenchmarkObjectAB: another build of hoptrace.bpf.o to measure this one against")

// BenchmarkObjectAB measures this build's tc hop against another build of the
// object (-ab-object PATH, e.g. the last commit's), side by side in one
// process: every round runs each (object, packet) pair once, in an order that
// rotates, and each pair reports the median ns per run by the test run's own
// clock. A BPF change's cost is then a difference within one run; across
// invocations the same object varies by a third on a VM. An empty tc
// program runs in the same rounds: what any program costs there. Without
// -ab-object it measures this build alone.
//
//	go test -run '^$' -bench ObjectAB -benchtime 300x ./internal/loader -ab-object /tmp/old.bpf.o
func BenchmarkObjectAB(b *testing.B) {
	h := newHarness(b)
	objects := []struct {
		name string
		spec *ebpf.CollectionSpec
	}{{"this", h.spec}}
	if *abObject != "" {
		spec, err := ebpf.LoadCollectionSpec(*abObject)
		if err != nil {
			b.Fatalf("-ab-object: %v", err)
		}
		objects = append(objects, struct {
			name string
			spec *ebpf.CollectionSpec
		}{"other", spec})
	}
	tsOpts := []byte{1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2} // NOP NOP timestamps, as Linux sends them
	vxlan4 := func(inner []byte) []byte {
		return tu.Cat(tu.Ethernet(0x0800), tu.IPv4(17, src4, dst4, nil, tu.UDP(5, 4789, tu.VXLAN(42, inner)), 0))
	}
	tcp := func(opts []byte) []byte {
		return tu.Cat(tu.Ethernet(0x0800), tu.IPv4(6, src4, dst4, nil, tu.TCP(40000, 5000, opts, []byte("payload")), 0))
	}
	udpUntagged := tu.Cat(tu.Ethernet(0x0800), tu.IPv4(17, src4, dst4, nil, tu.UDP(40000, 5000, []byte("hello hoptrace")), 0))
	service := loader.FilterConstants{Proto: 17, Dport: 8080} // a Service's port: the packets were translated
	// iperf3's datagrams as bench/udp_tag_floor.py sends them (1400 bytes), its filter a destination
	toDst := loader.FilterConstants{Family: 4, Dst: addr16(dst4), DstMask: mask32}
	datagram := make([]byte, 1400)
	udpFull := tu.Cat(tu.Ethernet(0x0800), tu.IPv4(17, src4, dst4, nil, tu.UDP(40000, 5000, datagram), 0))
	udpFullTagged := tu.Cat(tu.Ethernet(0x0800), tu.IPv4(17, src4, dst4, nil, tu.UDP(40000, 5000, datagram), 4), tu.ID(0x07000002))
	packets := []struct {
		name   string
		data   []byte
		filter loader.FilterConstants
		traced bool
		tagUDP bool  // a tagging hop (which a packet of another flow leaves untagged)
		follow uint8 // follow_origin: the hop also takes IDs of this origin the filter refuses
		// capture: N, in this build only: the other runs the packet without it (a build from before
		// the action has no act_capture), so this - other is what the action costs
		capture uint8
	}{
		{"udp_traced", udp4(0x07000002), loader.FilterConstants{}, true, false, 0, 0},
		{"udp_traced_capture", udp4(0x07000002), loader.FilterConstants{}, true, false, 0, 96},
		// one packet in 64 (its sequence 1 modulo 64) carries the addresses the hop saw
		{"udp_traced_describing", udp4(0x07000001), loader.FilterConstants{}, true, false, 0, 0},
		{"vxlan_traced", vxlan4(udp4(0x07000001)), loader.FilterConstants{Proto: 17, Dport: 5000}, true, false, 0, 0},
		{"vxlan_non_matching", vxlan4(udp4(0x07000001)), loader.FilterConstants{Proto: 17, Dport: 5001}, false, false, 0, 0},
		{"udp_non_matching", udp4(0x07000001), loader.FilterConstants{Proto: 17, Dport: 5001}, false, false, 0, 0},
		{"udp_tagger_non_matching", udp4(0x07000001), loader.FilterConstants{Proto: 17, Dport: 5001}, false, true, 0, 0},
		// The ID after the timestamps, where the kernel writes a sock_ops option.
		{"tcp_traced", tcp(tu.Cat(tsOpts, tu.TCPIDOption(0x07000002))), loader.FilterConstants{}, true, false, 0, 0},
		{"tcp_untagged", tcp(tsOpts), loader.FilterConstants{}, false, false, 0, 0}, // a sampled-out segment
		// the same, of the filter's flow: hop.bpf.h's hop_fast_untagged
		{"tcp_untagged_filtered", tcp(tsOpts), loader.FilterConstants{Proto: 6, Dport: 5000}, false, false, 0, 0},
		{"tcp_non_matching", tcp(tu.Cat(tsOpts, tu.TCPIDOption(0x07000002))), loader.FilterConstants{Proto: 6, Dport: 5001}, false, false, 0, 0},
		// Following IDs through an address translation (follow_origin 7): a translated packet of the
		// trace, taken by its ID; another trace's tagged packet, its ID read and refused; an untagged
		// packet of another flow, refused by the fast path as without following.
		{"udp_translated_followed", udp4(0x07000001), service, true, false, 7, 0},
		{"udp_other_origin_follow", udp4(0x08000001), service, false, false, 7, 0},
		{"udp_untagged_follow", udpUntagged, service, false, false, 7, 0},
		{"udp_untagged_non_matching", udpUntagged, service, false, false, 0, 0},
		{"tcp_translated_followed", tcp(tu.Cat(tsOpts, tu.TCPIDOption(0x07000002))), loader.FilterConstants{Proto: 6, Dport: 8080}, true, false, 7, 0},
		{"tcp_other_origin_follow", tcp(tu.Cat(tsOpts, tu.TCPIDOption(0x08000002))), loader.FilterConstants{Proto: 6, Dport: 8080}, false, false, 7, 0},
		{"tcp_untagged_follow", tcp(tsOpts), loader.FilterConstants{Proto: 6, Dport: 8080}, false, false, 7, 0},
		// every datagram tagged at the first hop (each run on a fresh copy: see testRunPair.once) and
		// recorded by its ID at the next
		{"udp_tagging", udpFull, toDst, true, true, 0, 0},
		{"udp_tagged_recorded", udpFullTagged, toDst, true, false, 0, 0},
	}
	var pairs []testRunPair
	for _, obj := range objects {
		ids, err := loader.NewIDState(obj.spec)
		if err != nil || ids == nil {
			b.Fatalf("%s: id_state: %v", obj.name, err)
		}
		b.Cleanup(func() { ids.Close() })
		for _, pkt := range packets {
			cfg := loader.HopConfig{Program: loader.ProgTC, Name: "ab", IDOrigin: 7, TraceSlot: 3, HopIndex: 1, Filter: pkt.filter, TagUDP: pkt.tagUDP, FollowOrigin: pkt.follow}
			if obj.name == "this" {
				cfg.Actions.Capture = pkt.capture
			}
			hop, err := loader.LoadHop(obj.spec, cfg, loader.Options{Records: h.records, IDState: ids, Cache: kernelBTF})
			if err != nil {
				b.Fatalf("%s: %v", obj.name, err)
			}
			b.Cleanup(hop.Close)
			pairs = append(pairs, testRunPair{name: obj.name + "_" + pkt.name, prog: hop.Program, data: pkt.data, traced: pkt.traced, once: pkt.tagUDP && pkt.traced})
		}
	}
	// What the test run costs by itself, in the same rounds.
	pairs = append(pairs, testRunPair{name: "empty", prog: emptyTCProgram(b), data: packets[0].data})
	perRun := runPairsInRounds(b, h, pairs)
	for i, p := range pairs {
		b.ReportMetric(median(perRun[i]), p.name+"-ns/pkt")
	}
	if len(objects) == 2 && b.N > 1 {
		for k, pkt := range packets {
			this, other := perRun[k], perRun[len(packets)+k]
			b.Logf("%s: this %.1f ns, other %.1f ns, this - other %s", pkt.name, median(this), median(other), roundDiffs(this, other))
		}
	}
}

// roundDiffs is the median and the middle 80 % of this - other, round by round.
func roundDiffs(this, other []float64) string {
	d := make([]float64, len(this))
	for i := range this {
		d[i] = this[i] - other[i]
	}
	sort.Float64s(d)
	return fmt.Sprintf("%+.1f ns (%+.1f..%+.1f)", d[len(d)/2], d[len(d)/10], d[len(d)*9/10])
}

// testRunPair is a program and the packet a benchmark runs it on; traced: each run records.
type testRunPair struct {
	name   string
	prog   *ebpf.Program
	data   []byte
	traced bool
	// once: one run per test run, each on a fresh copy of data. A test run's repeats share one skb,
	// so a program that changes the packet (a UDP tagger) would see its own output from the second
	// repeat on. Each run's time then includes the test run's two clock reads.
	once bool
}

// runPairsInRounds runs every pair b.N rounds of actionCostChunk test runs, in an order that turns
// each round, so load that changes over time weighs on all alike; per pair, ns a run of each round.
func runPairsInRounds(b *testing.B, h *harness, pairs []testRunPair) [][]float64 {
	perRun := make([][]float64, len(pairs))
	b.ResetTimer()
	for round := 0; round < b.N; round++ {
		for k := range pairs {
			i := (round + k) % len(pairs)
			d, err := pairs[i].run()
			if err != nil {
				b.Fatalf("%s: test run: %v", pairs[i].name, err)
			}
			// A test run a signal interrupts is run again whole: its first runs' records come on top.
			if got := len(h.drain(b)); pairs[i].traced && got < actionCostChunk || !pairs[i].traced && got != 0 {
				b.Fatalf("%s: %d records from %d runs", pairs[i].name, got, actionCostChunk)
			}
			perRun[i] = append(perRun[i], float64(d.Nanoseconds()))
		}
	}
	b.StopTimer()
	return perRun
}

// run is actionCostChunk runs of the pair's program; their mean time.
func (p testRunPair) run() (time.Duration, error) {
	if !p.once {
		_, d, err := p.prog.Benchmark(p.data, actionCostChunk, nil)
		return d, err
	}
	var total time.Duration
	for range actionCostChunk {
		_, d, err := p.prog.Benchmark(p.data, 1, nil)
		if err != nil {
			return 0, err
		}
		total += d
	}
	return total / actionCostChunk, nil
}
