package loader_test

import (
	"sort"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"golang.org/x/sys/unix"

	"github.com/hoptrace/hoptrace/agent/internal/loader"
	"github.com/hoptrace/hoptrace/agent/internal/record"
)

// actionCostChunk runs per BPF_PROG_TEST_RUN call: the ring buffer (64 KiB, 40 bytes
// a record with its header) holds them all, so every run reserves and submits a
// record as on the real path, never the cheaper "ring full" branch.
const actionCostChunk = 1000

// BenchmarkActionCost is bench/action_cost.py's measurement: the kernel's run time
// per packet of the tc hop with each action, side by side with the timestamp-only
// hop. Each of b.N rounds runs every hop once (actionCostChunk repeats of one tagged
// UDP packet; the order rotates so no hop always runs first) and the reported
// metric of a hop is the median over rounds of the kernel's ns per run
// from bpf_stats (run_time_ns / run_cnt growth: fractions of a ns, where the test
// run's own duration is whole ns). Run with -benchtime=Nx for N rounds.
func BenchmarkActionCost(b *testing.B) {
	h := newHarness(b)
	stats, err := ebpf.EnableStats(unix.BPF_STATS_RUN_TIME)
	if err != nil {
		b.Fatalf("enable bpf_stats: %v", err)
	}
	defer stats.Close()
	prev, err := loader.NewPrevTS(h.spec)
	if err != nil || prev == nil {
		b.Fatalf("prev_ts: %v", err)
	}
	b.Cleanup(func() { prev.Close() })
	load := func(index uint16, actions loader.Actions, filter ...loader.FilterConstants) *loader.Hop {
		cfg := loader.HopConfig{Program: loader.ProgTC, Name: "cost", IDOrigin: 7, TraceSlot: 3, HopIndex: index, Actions: actions}
		if len(filter) > 0 {
			cfg.Filter = filter[0]
		}
		hop, err := loader.LoadHop(h.spec, cfg, loader.Options{Records: h.records, IDState: h.idState, PrevTS: prev, Cache: kernelBTF})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(hop.Close)
		return hop
	}
	pkt := udp4(0x07000001)
	// The latency hop finds the packet's timestamp of an earlier hop on this node
	// (prev_ts keeps it): every run is a hit, as for a packet seen at both hops.
	h.run(b, load(0, loader.Actions{PrevTS: true}), pkt)

	prog := func(hop *loader.Hop) *ebpf.Program { return hop.Program }
	hops := []struct {
		name string
		prog *ebpf.Program
	}{
		{"timestamp", prog(load(1, loader.Actions{}))},
		{"count", prog(load(1, loader.Actions{Count: true}))},
		{"count_by_cpu", prog(load(1, loader.Actions{Count: true, CountBy: record.FieldCPU}))},
		{"count_by_mark", prog(load(1, loader.Actions{Count: true, CountBy: record.FieldMark}))},
		{"histogram_len", prog(load(1, loader.Actions{Histogram: record.FieldLen}))},
		{"histogram_latency", prog(load(1, loader.Actions{Histogram: record.FieldLatency}))},
		// The same packet at a hop whose filter names another port: parsed, not matched, no record.
		{"non_matching", prog(load(1, loader.Actions{}, loader.FilterConstants{Proto: 17, Dport: 5001}))},
		// What the measurement costs by itself: a tc program that only returns.
		{"empty", emptyTCProgram(b)},
	}
	perRun := make([][]float64, len(hops))
	b.ResetTimer()
	for round := 0; round < b.N; round++ {
		for k := range hops {
			i := (round + k) % len(hops)
			before := runStats(b, hops[i].prog)
			opts := &ebpf.RunOptions{Data: pkt, Repeat: actionCostChunk, Context: skbCtx{Mark: 0x10}}
			if _, err := hops[i].prog.Run(opts); err != nil {
				b.Fatalf("%s: test run: %v", hops[i].name, err)
			}
			after := runStats(b, hops[i].prog)
			perRun[i] = append(perRun[i], float64(after.ns-before.ns)/float64(after.runs-before.runs))
			// A test run a signal interrupts is run again whole (cilium/ebpf retries EINTR):
			// its first runs' records come on top, and bpf_stats counted those runs too.
			got, records := len(h.drain(b)), hops[i].name != "non_matching" && hops[i].name != "empty"
			if !records && got != 0 || records && got < actionCostChunk {
				b.Fatalf("%s: %d records from %d runs", hops[i].name, got, actionCostChunk)
			}
		}
	}
	b.StopTimer()
	for i, hop := range hops {
		b.ReportMetric(median(perRun[i]), hop.name+"-ns/pkt")
	}
	// The traced, non-matching and empty programs timed by BPF_PROG_TEST_RUN itself with
	// bpf_stats off: its per-repeat duration carries no accounting of its own (bpf_stats
	// reads the clock twice a run, which above is part of every hop's ns).
	stats.Close()
	for _, i := range []int{0, len(hops) - 2, len(hops) - 1} {
		var durations []float64
		for round := 0; round < min(b.N, 200); round++ {
			_, d, err := hops[i].prog.Benchmark(pkt, actionCostChunk, nil)
			if err != nil {
				b.Fatalf("%s: test run: %v", hops[i].name, err)
			}
			h.drain(b)
			durations = append(durations, float64(d.Nanoseconds()))
		}
		b.ReportMetric(median(durations), hops[i].name+"_testrun-ns/pkt")
	}
}

// emptyTCProgram is a tc program that returns TCX_NEXT and does nothing else: its ns per run
// is what the test run and bpf_stats cost without any of hoptrace's work.
func emptyTCProgram(b *testing.B) *ebpf.Program {
	b.Helper()
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:         ebpf.SchedCLS,
		License:      "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, -1), asm.Return()},
	})
	if err != nil {
		b.Fatalf("empty tc program: %v", err)
	}
	b.Cleanup(func() { prog.Close() })
	return prog
}

type progStats struct{ ns, runs uint64 }

// runStats is the program's bpf_stats now (kernel.bpf_stats_enabled or BPF_ENABLE_STATS).
func runStats(b *testing.B, prog *ebpf.Program) progStats {
	b.Helper()
	stats, err := prog.Stats()
	if err != nil {
		b.Fatalf("program stats: %v", err)
	}
	return progStats{ns: uint64(stats.Runtime.Nanoseconds()), runs: stats.RunCount}
}

func median(values []float64) float64 {
	sorted := append([]float64(nil), values...)
	sort.Float64s(sorted)
	n := len(sorted)
	if n%2 == 1 {
		return sorted[n/2]
	}
	return (sorted[n/2-1] + sorted[n/2]) / 2
}
