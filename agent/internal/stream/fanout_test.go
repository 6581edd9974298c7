package stream

import (
	"context"
	"testing"
	"time"

	"github.com/hoptrace/hoptrace/agent/internal/record"
)

// A sink that never takes anything fills its own queue, which drops its
// oldest batches and counts them; the other sink gets every batch, in order,
// while the stalled one still holds its newest.
func TestFanoutSlowSinkDropsItsOwn(t *testing.T) {
	fast := NewQueue(0)
	stalled := NewQueue(8 * record.Size)
	f := NewFanout(fast, stalled)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	got := make(chan []string, 1)
	go func() {
		var traces []string
		for b := fast.Pop(ctx); b != nil; b = fast.Pop(ctx) {
			traces = append(traces, b.Trace)
			b.Release()
		}
		got <- traces
	}()
	const batches = 10
	for i := range batches {
		f.Push(batch(string(rune('a'+i)), 4))
	}
	f.Close()
	traces := <-got
	if len(traces) != batches || traces[0] != "a" || traces[batches-1] != "j" {
		t.Errorf("the taking sink got %v, want all %d batches in order", traces, batches)
	}
	if fast.Dropped() != 0 {
		t.Errorf("the taking sink's queue dropped %d records", fast.Dropped())
	}
	if n, _ := stalled.Len(); n != 2 || stalled.Dropped() != (batches-2)*4 {
		t.Errorf("the stalled sink holds %d batches, dropped %d records; want 2 held, %d dropped", n, stalled.Dropped(), (batches-2)*4)
	}
	if b := stalled.TryPop(); b == nil || b.Trace != "i" {
		t.Errorf("the stalled sink's oldest kept batch %v, want i", b)
	}
}

// Each sink has a Batch of its own over the same records: its Seq is its own,
// and the record buffer is given back only when the last sink releases it.
func TestFanoutSinksShareRecordsUntilLastRelease(t *testing.T) {
	q1, q2 := NewQueue(0), NewQueue(0)
	in := batch("t", 2)
	in.Records[0] = 7
	NewFanout(q1, q2).Push(in)
	b1, b2 := q1.TryPop(), q2.TryPop()
	if b1 == nil || b2 == nil || b1 == b2 {
		t.Fatalf("sinks got %p and %p, want a Batch each", b1, b2)
	}
	b1.Seq = 42
	if b2.Seq != 0 {
		t.Errorf("one sink's batch_seq %d leaked into the other's", b2.Seq)
	}
	b1.Release()
	if b1.Records != nil || len(b2.Records) != 2*record.Size || b2.Records[0] != 7 {
		t.Fatalf("after the first release: %d and %d record bytes, want 0 and %d intact", len(b1.Records), len(b2.Records), 2*record.Size)
	}
	if left := b2.shares.Load(); left != 1 {
		t.Errorf("%d holders left after one release, want 1", left)
	}
	b2.Release()
	if left := b2.shares.Load(); left != 0 || b2.Records != nil {
		t.Errorf("%d holders left after the last release, want 0", left)
	}
}

// With one sink the batch goes straight to its queue, unshared.
func TestFanoutOfOne(t *testing.T) {
	q := NewQueue(0)
	in := batch("t", 1)
	NewFanout(q).Push(in)
	if b := q.TryPop(); b != in || b.shares != nil {
		t.Errorf("got %p (shares %v), want the pushed batch itself", b, b.shares)
	}
}
