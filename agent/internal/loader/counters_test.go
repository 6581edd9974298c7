package loader

import (
	"testing"

	"github.com/cilium/ebpf"

	"github.com/hoptrace/hoptrace/agent/internal/record"
)

// countersMap is a hop's counters map of entries counters, counter i on
// CPU c holding 1000*i + c + 1.
func countersMap(t testing.TB, entries uint32) (*ebpf.Map, int) {
	t.Helper()
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.PerCPUArray, KeySize: 4, ValueSize: 8, MaxEntries: entries})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		t.Fatal(err)
	}
	for i := range entries {
		per := make([]uint64, cpus)
		for c := range per {
			per[c] = uint64(1000*i) + uint64(c) + 1
		}
		if err := m.Put(i, per); err != nil {
			t.Fatal(err)
		}
	}
	return m, cpus
}

func TestReadCountersSumsEveryCPU(t *testing.T) {
	for _, entries := range []uint32{uint32(record.CMax), 5, uint32(record.CMax) + 3} {
		m, cpus := countersMap(t, entries)
		got, err := ReadCounters(m)
		if err != nil {
			t.Fatal(err)
		}
		var want record.Counters
		for i := range min(entries, uint32(record.CMax)) {
			for c := range cpus {
				want[i] += uint64(1000*i) + uint64(c) + 1
			}
		}
		if got != want {
			t.Fatalf("%d entries: got %v, want %v", entries, got, want)
		}
		all, err := readPerCPUOneByOne(m, min(entries, uint32(record.CMax)))
		var one record.Counters
		copy(one[:], all)
		if err != nil || one != want {
			t.Fatalf("%d entries, one by one: got %v (%v), want %v", entries, one, err, want)
		}
	}
}

// BenchmarkReadCounters: one hop's counters as the idle agent reads them
// each second (go test -run '^$' -bench ReadCounters ./internal/loader).
func BenchmarkReadCounters(b *testing.B) {
	m, _ := countersMap(b, uint32(record.CMax))
	b.Run("batch", func(b *testing.B) {
		for b.Loop() {
			if _, err := ReadCounters(m); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("one_by_one", func(b *testing.B) {
		for b.Loop() {
			if _, err := readPerCPUOneByOne(m, uint32(record.CMax)); err != nil {
				b.Fatal(err)
			}
		}
	})
}
