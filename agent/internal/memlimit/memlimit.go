// Package memlimit keeps the Go runtime's soft memory limit a fixed headroom above what the
// process keeps (its live heap and the runtime's own memory), and never below a floor.
//
// A fixed limit makes the agent's RSS small under a burst of records, but the more traces a node
// runs, the more the agent keeps for good (their programs' specs, maps and counters): with 200
// traces it kept about the 16 MiB the limit allowed, and Go's garbage collector ran five times a
// second, most of an idle agent's CPU. Following what is kept lets garbage grow by the headroom
// before a collection, whatever the number of traces.
package memlimit

import (
	"context"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

// The runtime's figures the limit is taken from (runtime/metrics). The limit counts what the
// runtime maps less what it released (runtime/debug.SetMemoryLimit); of that, the heap's free pages
// may go back to the system, and of its objects only those the last collection found live stay.
var samples = []string{
	"/memory/classes/total:bytes",
	"/memory/classes/heap/released:bytes",
	"/memory/classes/heap/free:bytes",
	"/memory/classes/heap/objects:bytes",
	"/gc/heap/live:bytes",
}

// Kept is the memory the process would hold right after a collection that gave its free pages
// back: what the runtime maps, less what it released or may release and the heap objects that are
// garbage.
func Kept() int64 {
	s := make([]metrics.Sample, len(samples))
	for i, name := range samples {
		s[i].Name = name
	}
	metrics.Read(s)
	v := func(i int) int64 {
		if s[i].Value.Kind() != metrics.KindUint64 {
			return 0
		}
		return int64(s[i].Value.Uint64())
	}
	total, released, free, objects, live := v(0), v(1), v(2), v(3), v(4)
	return total - released - free - objects + live
}

// Limit is the soft memory limit for a process that keeps kept bytes.
func Limit(kept, floor, headroom int64) int64 { return max(floor, kept+headroom) }

// Set sets the limit from what the process keeps now; the limit set.
func Set(floor, headroom int64) int64 {
	limit := Limit(Kept(), floor, headroom)
	debug.SetMemoryLimit(limit)
	return limit
}

// Follow sets the limit every period until ctx ends.
func Follow(ctx context.Context, floor, headroom int64, every time.Duration) {
	Set(floor, headroom)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			Set(floor, headroom)
		}
	}
}
