package stream

import (
	"context"
	"go.uber.org/goleak"
	"testing"
	"time"

	"github.com/hoptrace/hoptrace/agent/internal/record"
)

func batch(trace string, n int) *Batch {
	return &Batch{Trace: trace, Records: make([]byte, n*record.Size)}
}

func TestQueueDropsOldest(t *testing.T) {
	q := NewQueue(10 * record.Size)
	q.Push(batch("a", 4))
	q.Push(batch("b", 4))
	q.Push(batch("c", 4)) // 12 > 10: "a" goes
	if q.Dropped() != 4 {
		t.Fatalf("dropped %d, want 4", q.Dropped())
	}
	if n, bytes := q.Len(); n != 2 || bytes != 8*record.Size {
		t.Fatalf("len %d %d", n, bytes)
	}
	q.Push(batch("huge", 11)) // larger than the bound: dropped itself
	if q.Dropped() != 15 {
		t.Fatalf("dropped %d, want 15", q.Dropped())
	}
	if b := q.TryPop(); b.Trace != "b" {
		t.Fatalf("popped %s, want b", b.Trace)
	}
	q.PushFront(batch("b2", 1))
	if b := q.TryPop(); b.Trace != "b2" {
		t.Fatalf("popped %s, want b2", b.Trace)
	}
	if b := q.TryPop(); b.Trace != "c" {
		t.Fatalf("popped %s, want c", b.Trace)
	}
	if q.TryPop() != nil {
		t.Fatal("queue not empty")
	}
}

func TestQueuePopWaitsAndCloses(t *testing.T) {
	q := NewQueue(0)
	go func() {
		time.Sleep(20 * time.Millisecond)
		q.Push(batch("x", 1))
	}()
	if b := q.Pop(context.Background()); b == nil || b.Trace != "x" {
		t.Fatalf("pop %v", b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if q.Pop(ctx) != nil {
		t.Fatal("pop on empty queue returned a batch")
	}
	q.Push(batch("y", 1))
	q.Close()
	if b := q.Pop(context.Background()); b == nil || b.Trace != "y" {
		t.Fatal("closed queue lost a batch")
	}
	if q.Pop(context.Background()) != nil || !q.Closed() {
		t.Fatal("closed empty queue")
	}
}

func TestQueueManyBatchesKeepsBound(t *testing.T) {
	q := NewQueue(100 * record.Size)
	for i := 0; i < 10000; i++ {
		q.Push(batch("t", 3))
	}
	if _, bytes := q.Len(); bytes > 100*record.Size {
		t.Fatalf("%d bytes queued", bytes)
	}
	if n, _ := q.Len(); q.Dropped() != uint64(30000-3*n) {
		t.Fatalf("dropped %d with %d batches left", q.Dropped(), n)
	}
}

// The queue's waiters and the reader's loop must not outlive their users.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
