package loader_test

import (
	"fmt"
	"testing"

	"github.com/hoptrace/hoptrace/agent/internal/loader"
	tu "github.com/hoptrace/hoptrace/agent/internal/testutil"
)

// BenchmarkHookAB measures the hook program (one per device and direction, the traces in its maps)
// against today's one program per trace, side by side in one process as BenchmarkObjectAB does:
// every round runs each (program, packet) pair once in a rotating order, and each pair reports the
// median ns per run by the test run's clock. The hook holds N traces' filters, the last of them the
// packet's ("match") or none ("none"): "ports", each its own destination port; "mixed", one in five
// any port of another host (a candidate for every packet of its protocol) and one in seven following
// another origin's IDs. Today's N programs are reported as
// what their test runs add up to: the matching hop_tc and N - 1 refusing ones, or N refusing ones
// (tcx's loop between them is not in it).
//
//	go test -run '^$' -bench HookAB -benchtime 200x ./internal/loader
func BenchmarkHookAB(b *testing.B) {
	h := newHarness(b)
	tsOpts := []byte{1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2}
	udp := func(dport uint16) []byte {
		return tu.Cat(tu.Ethernet(0x0800), tu.IPv4(17, src4, dst4, nil, tu.UDP(40000, dport, []byte("hello hoptrace")), 4), tu.ID(0x07000002))
	}
	tcp := func(dport uint16) []byte {
		return tu.Cat(tu.Ethernet(0x0800), tu.IPv4(6, src4, dst4, nil, tu.TCP(40000, dport, tu.Cat(tsOpts, tu.TCPIDOption(0x07000002)), []byte("payload")), 0))
	}
	protocols := []struct {
		name        string
		proto       uint8
		match, none []byte
	}{
		{"udp", 17, udp(5000), udp(5001)},
		{"tcp", 6, tcp(5000), tcp(5001)},
	}
	var pairs []testRunPair
	for _, p := range protocols {
		for _, f := range []struct {
			name   string
			filter loader.FilterConstants
			traced bool
		}{{"hop_tc_matching", loader.FilterConstants{Proto: p.proto, Dport: 5000}, true}, {"hop_tc_refusing", loader.FilterConstants{Proto: p.proto, Dport: 20000}, false}} {
			hop := h.load(b, loader.HopConfig{HopIndex: 1, IDOrigin: 7, TraceSlot: 3, Filter: f.filter})
			pairs = append(pairs, testRunPair{name: p.name + "_" + f.name, prog: hop.Program, data: p.match, traced: f.traced})
		}
	}
	counts := []int{1, 10, 50, 200}
	mixes := []struct {
		name         string
		anyPortEvery int
	}{{"ports", 0}, {"mixed", 5}}
	for _, mix := range mixes {
		for _, n := range counts {
			slot := uint32(n - 1)
			traces := append(otherTracesAnyPort(n-1, slot, mix.anyPortEvery), hookTrace{slot: slot, cfg: loader.HopConfig{Filter: loader.FilterConstants{Proto: 17, Dport: 5000},
				HopIndex: 1, TraceSlot: 3, IDOrigin: 7, SampleEvery: 1}})
			if n > 1 {
				// the TCP packet's trace: one of the others takes TCP port 5000 instead of its own
				traces[0].cfg.Filter = loader.FilterConstants{Proto: 6, Dport: 5000}
			} else {
				traces = append(traces, hookTrace{slot: 1, cfg: loader.HopConfig{Filter: loader.FilterConstants{Proto: 6, Dport: 5000},
					HopIndex: 1, TraceSlot: 4, IDOrigin: 7, SampleEvery: 1}})
			}
			hook := loadHook(b, h, traces)
			for _, p := range protocols {
				pairs = append(pairs,
					testRunPair{name: fmt.Sprintf("%s_hook_%s_%d_match", p.name, mix.name, n), prog: hook.Program, data: p.match, traced: true},
					testRunPair{name: fmt.Sprintf("%s_hook_%s_%d_none", p.name, mix.name, n), prog: hook.Program, data: p.none})
			}
		}
	}
	pairs = append(pairs, testRunPair{name: "empty", prog: emptyTCProgram(b), data: protocols[0].match})
	perRun := runPairsInRounds(b, h, pairs)
	ns := map[string]float64{}
	for i, p := range pairs {
		ns[p.name] = median(perRun[i])
		b.ReportMetric(ns[p.name], p.name+"-ns/pkt")
	}
	if b.N == 1 {
		return // the benchmark's first, single round: its figures are not the ones to read
	}
	for _, p := range protocols {
		match, refuse := ns[p.name+"_hop_tc_matching"], ns[p.name+"_hop_tc_refusing"]
		for _, mix := range mixes {
			line := fmt.Sprintf("%s %s (hop_tc %.0f ns matching, %.0f refusing):", p.name, mix.name, match, refuse)
			for _, n := range counts {
				hm, hn := ns[fmt.Sprintf("%s_hook_%s_%d_match", p.name, mix.name, n)], ns[fmt.Sprintf("%s_hook_%s_%d_none", p.name, mix.name, n)]
				line += fmt.Sprintf(" | %d: hook %.0f/%.0f, today %.0f/%.0f, x%.2f/x%.2f", n, hm, hn, match+float64(n-1)*refuse, float64(n)*refuse, hm/match, hn/refuse)
			}
			b.Log(line) // one line each: a benchmark's log keeps 10
		}
	}
}
