package memlimit

import (
	"runtime"
	"runtime/debug"
	"testing"
)

func TestLimitKeepsTheFloorAndTheHeadroom(t *testing.T) {
	if got := Limit(4<<20, 16<<20, 4<<20); got != 16<<20 {
		t.Errorf("kept 4 MiB: limit %d, want the 16 MiB floor", got)
	}
	if got := Limit(30<<20, 16<<20, 4<<20); got != 34<<20 {
		t.Errorf("kept 30 MiB: limit %d, want 34 MiB", got)
	}
}

// A process that keeps more than the floor gets its headroom above what it keeps, and the
// floor back once it lets go.
func TestSetFollowsWhatTheProcessKeeps(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	const floor, headroom = 16 << 20, 4 << 20
	held := make([]byte, 64<<20)
	for i := range held {
		held[i] = byte(i)
	}
	runtime.GC()
	kept := Kept()
	if kept < 64<<20 {
		t.Fatalf("kept %d bytes while holding 64 MiB", kept)
	}
	// within a MiB of it: the runtime allocates a little between the two reads
	if got := Set(floor, headroom); got < kept+headroom-1<<20 || got > kept+headroom+1<<20 ||
		debug.SetMemoryLimit(-1) != got {
		t.Errorf("limit %d (runtime %d), want %d kept + %d", got, debug.SetMemoryLimit(-1), kept, headroom)
	}
	runtime.KeepAlive(held) // the last use: the collection below frees it
	runtime.GC()
	debug.FreeOSMemory()
	if got := Set(floor, headroom); got >= 64<<20 {
		t.Errorf("limit %d after the 64 MiB went, want it back near the floor", got)
	}
}
