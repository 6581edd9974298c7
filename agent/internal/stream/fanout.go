package stream

import "sync/atomic"

// Sink takes the batches the Reader makes: a Queue, or a Fanout to several.
type Sink interface {
	Push(*Batch)
	Close()
}

// Fanout hands every batch to each sink's own bounded queue (the JSON
// printer's, the collector stream's or the Kafka producer's): a sink that
// falls behind fills its queue, which drops its oldest batches and counts
// them, and never holds back the others, as each exporter of an OpenTelemetry
// collector has its own sending queue.
type Fanout struct {
	queues []*Queue
}

// NewFanout hands batches to every one of queues.
func NewFanout(queues ...*Queue) *Fanout { return &Fanout{queues: queues} }

// Push gives b to every queue. Each gets a Batch of its own over b's records
// and values (read only, and Seq is per sink); the record buffer goes back to
// the pool once every sink has released its Batch.
func (f *Fanout) Push(b *Batch) {
	if len(f.queues) == 1 {
		f.queues[0].Push(b)
		return
	}
	shares := new(atomic.Int32)
	shares.Store(int32(len(f.queues)))
	if b.handover != nil {
		b.handover.left.Store(int32(len(f.queues))) // each sink delivers its own
	}
	for _, q := range f.queues {
		own := *b
		own.shares = shares
		q.Push(&own)
	}
}

// Close closes every queue: what they hold can still be popped.
func (f *Fanout) Close() {
	for _, q := range f.queues {
		q.Close()
	}
}
