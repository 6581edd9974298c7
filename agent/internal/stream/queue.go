// Package stream moves records from the agent's one ring buffer to its
// consumers: a Reader routes raw records by trace_slot into per-trace
// batches (flushed at N records or after 100 ms), and a bounded Queue holds
// the batches until their consumer takes them: the collector stream or the
// Kafka producer, the standalone printer, or, through a Fanout, each of them
// from a queue of its own.
package stream

import (
	"context"
	"encoding/binary"
	"sync"
	"sync/atomic"

	"github.com/hoptrace/hoptrace/agent/internal/record"
)

// Trailers are what followed a batch's records in their samples, each kind in its own buffer.
type Trailers struct {
	// Values: one struct hoptrace_values (record.ValuesSize bytes) per record with
	// FlagValues, in the order of those records (the record action).
	Values []byte
	// Addresses: one struct hoptrace_addresses (record.AddressesSize bytes) per record with
	// FlagAddresses, in the order of those records.
	Addresses []byte
	// Captures: one struct hoptrace_capture (record.CaptureSize bytes, zero past its captured
	// bytes) per record with FlagCapture, in the order of those records (the capture action).
	Captures []byte
	// Functions names the kernel functions the values name by ID (record.FieldDropFunction:
	// the Reader gives the function's ID in place of the kernel's address); nil for none.
	// Shared, never written, once the batch is queued.
	Functions map[uint64]string
}

// TrailerBuffer is one kind of trailer and the buffer of a Trailers that holds them.
type TrailerBuffer struct {
	record.Trailer
	Buf *[]byte
}

// Buffers are tr's buffers with their trailer kinds, in the order the trailers follow a record.
func (tr *Trailers) Buffers() [3]TrailerBuffer {
	return [3]TrailerBuffer{{record.ValuesTrailer, &tr.Values}, {record.AddressesTrailer, &tr.Addresses},
		{record.CaptureTrailer, &tr.Captures}}
}

// Len is the bytes of every trailer in tr.
func (tr *Trailers) Len() int { return len(tr.Values) + len(tr.Addresses) + len(tr.Captures) }

// Batch is records of one trace, packed struct hoptrace_record bytes as they
// left the ring buffer.
type Batch struct {
	Trace      string
	Generation uint64
	Slot       uint16
	Records    []byte // len is a multiple of record.Size
	Trailers
	// Seq is the batch_seq once the batch was first sent; a batch resent
	// after a reconnect keeps it, so the collector can drop duplicates.
	Seq uint64
	// shares counts the sinks still holding this batch's records when a
	// Fanout gave each its own Batch over them; nil = one holder.
	shares *atomic.Int32
	// handover keeps the batch's records in the ring until every sink has
	// handed it off (Delivered); nil: nothing kept (a batch made elsewhere).
	handover  *handover
	delivered bool
}

// handover is a batch's hold on the ring, shared by the Batches a Fanout
// made of it: let go once the last sink delivered its own.
type handover struct {
	left    atomic.Int32
	hold    *hold
	handoff *handoff
}

// Delivered says the sink is done with the batch for good: it sent it (a gRPC
// Send returned, the Kafka client took it, the printer wrote it) or dropped it
// (counted). Once every sink has, its records may leave the ring buffer: a
// restarted agent does not read them again. A second call does nothing.
func (b *Batch) Delivered() {
	if b.delivered || b.handover == nil {
		return
	}
	b.delivered = true
	if b.handover.left.Add(-1) == 0 {
		b.handover.handoff.release(b.handover.hold)
	}
}

// OldestTs is the ts_ns of the oldest record waiting in the queue (the first
// record of its head batch: batches and their records are in arrival order).
func (q *Queue) OldestTs() (int64, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, b := range q.items[q.head:] {
		if len(b.Records) >= record.Size {
			return int64(binary.LittleEndian.Uint64(b.Records[:8])), true
		}
	}
	return 0, false
}

// recordBuffers are sent batches' record buffers, reused by later batches:
// fresh ones were half of what the agent allocated at 1 M records/s, and so
// of its garbage collections.
var recordBuffers sync.Pool

func newRecordBuffer(size int) []byte {
	if buf, ok := recordBuffers.Get().(*[]byte); ok && cap(*buf) >= size {
		return (*buf)[:0]
	}
	return make([]byte, 0, size)
}

// Release gives the batch's record buffer back for a later batch, once the
// batch is sent and no resend can need it (and, for a batch a Fanout shared,
// once every sink released its own); the batch is empty afterwards.
func (b *Batch) Release() {
	if b.shares != nil && b.shares.Add(-1) > 0 {
		b.Records = nil
		return
	}
	if cap(b.Records) > 0 {
		buf := b.Records[:0]
		recordBuffers.Put(&buf)
	}
	b.Records = nil
}

// Count is the number of records in the batch.
func (b *Batch) Count() int { return len(b.Records) / record.Size }

// Bytes is what the batch holds against the queue's bound: records and their trailers.
func (b *Batch) Bytes() int { return len(b.Records) + b.Trailers.Len() }

// Queue is a bounded FIFO of batches. When adding a batch would exceed the
// byte bound, the oldest batches are dropped and their records counted.
type Queue struct {
	mu      sync.Mutex
	items   []*Batch
	head    int
	bytes   int
	max     int
	dropped uint64
	closed  bool
	notify  chan struct{}
}

// NewQueue makes a queue holding at most maxBytes of record bytes.
func NewQueue(maxBytes int) *Queue {
	if maxBytes <= 0 {
		maxBytes = 256 << 20
	}
	return &Queue{max: maxBytes, notify: make(chan struct{}, 1)}
}

// Push appends b, dropping the oldest batches if the bound is reached.
// A single batch larger than the bound is dropped itself.
func (q *Queue) Push(b *Batch) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		// The agent is stopping: not delivered, a pinned ring keeps its records for the next agent.
		q.dropped += uint64(b.Count())
		return
	}
	if b.Bytes() > q.max {
		q.dropped += uint64(b.Count())
		b.Delivered()
		return
	}
	for q.bytes+b.Bytes() > q.max && q.head < len(q.items) {
		old := q.items[q.head]
		q.items[q.head] = nil
		q.head++
		q.bytes -= old.Bytes()
		q.dropped += uint64(old.Count())
		old.Delivered()
	}
	if q.head > 64 && q.head*2 > len(q.items) {
		q.items = append(q.items[:0], q.items[q.head:]...)
		q.head = 0
	}
	q.items = append(q.items, b)
	q.bytes += b.Bytes()
	select {
	case q.notify <- struct{}{}:
	default:
	}
}

// PushFront puts back a batch that could not be delivered, ahead of the
// others; it is dropped (and counted) if the queue has no room for it.
func (q *Queue) PushFront(b *Batch) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed || q.bytes+b.Bytes() > q.max {
		q.dropped += uint64(b.Count())
		if !q.closed { // closed: the agent is stopping, as in Push
			b.Delivered()
		}
		return
	}
	if q.head > 0 {
		q.head--
		q.items[q.head] = b
	} else {
		q.items = append([]*Batch{b}, q.items...)
	}
	q.bytes += b.Bytes()
	select {
	case q.notify <- struct{}{}:
	default:
	}
}

// TryPop returns the oldest batch, or nil when the queue is empty.
func (q *Queue) TryPop() *Batch {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.head == len(q.items) {
		return nil
	}
	b := q.items[q.head]
	q.items[q.head] = nil
	q.head++
	q.bytes -= b.Bytes()
	if q.head == len(q.items) {
		q.items = q.items[:0]
		q.head = 0
	}
	return b
}

// Pop waits for a batch; it returns nil when ctx ends or the queue is
// closed and empty.
func (q *Queue) Pop(ctx context.Context) *Batch {
	for {
		if b := q.TryPop(); b != nil {
			return b
		}
		q.mu.Lock()
		closed := q.closed
		q.mu.Unlock()
		if closed {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-q.notify:
		}
	}
}

// Close wakes waiters; batches already queued can still be popped.
func (q *Queue) Close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	select {
	case q.notify <- struct{}{}:
	default:
	}
}

// Closed reports whether Close was called and the queue is empty.
func (q *Queue) Closed() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.closed && q.head == len(q.items)
}

// Dropped is the number of records dropped since the queue was made.
func (q *Queue) Dropped() uint64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.dropped
}

// Max is the queue's byte bound.
func (q *Queue) Max() int { return q.max }

// Len returns the queued batches and bytes.
func (q *Queue) Len() (batches, bytes int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.items) - q.head, q.bytes
}
