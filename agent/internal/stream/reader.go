package stream

import (
	"encoding/binary"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"

	"github.com/hoptrace/hoptrace/agent/internal/clock"
	"github.com/hoptrace/hoptrace/agent/internal/kallsyms"
	"github.com/hoptrace/hoptrace/agent/internal/record"
)

// Defaults of the batching.
const (
	DefaultBatchRecords = 1024
	DefaultFlushEvery   = 100 * time.Millisecond
)

type route struct {
	trace      string
	generation uint64
	buf        []byte
	trailers   Trailers // what followed buf's records in their samples
	since      time.Time
	hold       *hold // the ring from buf's first record on (nil while buf is empty)
}

// Reader reads the agent's ring buffer and routes records by trace_slot. The
// ring's consumer position moves past records only once they are handed off
// (ring.go): until then a pinned ring keeps them for the next agent.
type Reader struct {
	ring       *ring
	handoff    *handoff // nil: nothing held (a Reader made without a ring, in tests)
	at         uint64   // the ring position of the record addLocked adds
	out        Sink
	maxRecords int
	flushEvery time.Duration

	mu     sync.Mutex
	routes map[uint16]*route
	// Drain callers waiting for the read loop to reach their flush point.
	drained []chan struct{}

	// Functions names the kernel addresses of drop_function values (kallsyms.Kernel unless set
	// before Start).
	Functions FunctionNamer

	read     atomic.Uint64
	unrouted atomic.Uint64
	// readUpTo: CLOCK_MONOTONIC when the last completed pass over the ring began: every record committed
	// before it has been read (into a route's batch, or the queue).
	readUpTo atomic.Int64
	started  atomic.Bool
	wake     chan struct{} // a Drain is waiting: read now, not at the next tick
	closing  chan struct{}
	closed   sync.Once
	done     chan struct{}
	runErr   error
}

// FunctionNamer names the kernel function holding an address (kallsyms.Namer).
type FunctionNamer interface {
	Function(addr uint64) kallsyms.Function
}

// NewReader opens a reader on the records ring buffer, at the kernel's
// consumer position (a ring taken over: where the last reader left it);
// batches go to out.
func NewReader(records *ebpf.Map, out Sink, maxRecords int, flushEvery time.Duration) (*Reader, error) {
	rg, err := openRing(records)
	if err != nil {
		return nil, err
	}
	if maxRecords <= 0 {
		maxRecords = DefaultBatchRecords
	}
	if flushEvery <= 0 {
		flushEvery = DefaultFlushEvery
	}
	r := &Reader{ring: rg, handoff: newHandoff(rg), out: out, maxRecords: maxRecords, flushEvery: flushEvery,
		routes: map[uint16]*route{}, wake: make(chan struct{}, 1), closing: make(chan struct{}),
		done: make(chan struct{}), Functions: kallsyms.Kernel}
	r.readUpTo.Store(clock.Monotonic())
	return r, nil
}

// Unqueued is the earliest CLOCK_MONOTONIC time a record not in the queue yet may carry: the oldest one
// read into a route's batch, or, for those still in the ring, when the last completed pass over it
// began. Behind the reader (a stopped agent, SIGSTOP) records pile up in the ring; until it has read
// them, this stays where it stopped.
func (r *Reader) Unqueued() int64 {
	upTo := r.readUpTo.Load()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rt := range r.routes {
		if len(rt.buf) >= record.Size {
			if ts := int64(binary.LittleEndian.Uint64(rt.buf)); ts < upTo {
				upTo = ts
			}
		}
	}
	return upTo
}

// Behind says, before Start, that the ring buffer holds records since CLOCK_MONOTONIC time since
// that no reader has read yet (a ring taken over from a previous agent): Unqueued says so until the
// first pass over the ring has read them.
func (r *Reader) Behind(since int64) {
	if since < r.readUpTo.Load() {
		r.readUpTo.Store(since)
	}
}

// AddRoute sends records of slot to the batches of (trace, generation).
func (r *Reader) AddRoute(slot uint16, trace string, generation uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.routes[slot] = &route{trace: trace, generation: generation}
}

// RemoveRoute flushes the slot's pending records, then forgets the slot.
func (r *Reader) RemoveRoute(slot uint16) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if rt, ok := r.routes[slot]; ok {
		r.flushLocked(slot, rt)
		delete(r.routes, slot)
	}
}

// Read counts the records taken from the ring buffer.
func (r *Reader) Read() uint64 { return r.read.Load() }

// Unrouted counts records whose trace_slot had no route (a detached trace).
func (r *Reader) Unrouted() uint64 { return r.unrouted.Load() }

// LetGo counts the batches whose records left the ring before they were
// handed off (the queue held more than half the ring's worth): a killed
// agent loses those, as it loses anything in its queue.
func (r *Reader) LetGo() uint64 { return r.handoff.letGo.Load() }

// Start runs the read loop in its own goroutine until Close.
func (r *Reader) Start() {
	if r.started.Swap(true) {
		return
	}
	go func() {
		r.runErr = r.run()
		close(r.done)
	}()
}

// A pass that read busyBytes reads again at once: the ring fills faster than
// the ticks drain it. One that read a quarter of it comes back after
// busyPoll, so the ring (8 MiB by default) holds 10 ms of records, not 100,
// while busy. The hop programs never wake the reader (hop.bpf.h).
const (
	busyBytes = 1 << 20
	busyPoll  = 10 * time.Millisecond
)

// run reads until Close: it takes what the ring holds without blocking, then
// sleeps on a Go timer (flushEvery, shorter while busy). Not a blocking read: a
// thread parked for 100 ms in epoll_wait outside Go's netpoller makes the
// runtime's sysmon retake its P and poll every 20 us, which was most of an
// idle agent's CPU. Records are appended from the mapped ring to the slot's
// batch buffer without a copy or an allocation of their own.
func (r *Reader) run() error {
	timer := time.NewTimer(r.flushEvery)
	defer timer.Stop()
	for {
		// Drains that asked before this pass are answered after it; later ones wait for the next.
		r.mu.Lock()
		waiting := r.drained
		r.drained = nil
		r.mu.Unlock()
		passStart := clock.Monotonic()
		n, err := r.readAvailable()
		if err != nil {
			r.FlushAll()
			return err
		}
		r.readUpTo.Store(passStart)
		for _, ch := range waiting {
			close(ch)
		}
		r.flushOld(time.Now())
		switch {
		case n >= busyBytes:
			continue
		case n >= busyBytes/4:
			timer.Reset(busyPoll)
		default:
			timer.Reset(r.flushEvery)
		}
		select {
		case <-timer.C:
		case <-r.wake:
		case <-r.closing:
			r.FlushAll()
			return nil
		}
	}
}

// readAvailable takes every record submitted to the ring now; the bytes read.
// After each chunk the consumer position follows what is not held.
func (r *Reader) readAvailable() (int, error) {
	n := 0
	for {
		got, more, err := r.readChunk()
		n += got
		r.handoff.advance(r.ring.read())
		if err != nil || !more {
			return n, err
		}
	}
}

// chunkRecords is how many records a read takes under one hold of the lock: a route change waits
// for at most that many.
const chunkRecords = 256

// readChunk reads up to chunkRecords records into their routes' batches; the bytes read, and
// whether the ring may hold more. The lock and the route lookup once per record were half the
// agent's CPU per record (perf, agent_records).
func (r *Reader) readChunk() (int, bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var last routeCache
	n, records := 0, uint64(0)
	defer func() { r.read.Add(records) }()
	for range chunkRecords {
		sample, at, ok, err := r.ring.next()
		if err != nil || !ok {
			return n, false, err
		}
		n += len(sample)
		r.at = at
		if r.addLocked(sample, &last) {
			records++
		}
	}
	return n, true, nil
}

// routeCache is the route of the slot a chunk's last record had: a chunk's records are mostly of
// one trace.
type routeCache struct {
	valid bool
	slot  uint16
	route *route // nil: the slot has no route
}

// addLocked appends a record (at ring position r.at) to its route's batch; false for a sample too
// short to be one.
func (r *Reader) addLocked(raw []byte, last *routeCache) bool {
	if len(raw) < record.Size {
		return false
	}
	slot := record.TraceSlot(raw)
	if !last.valid || last.slot != slot {
		*last = routeCache{valid: true, slot: slot, route: r.routes[slot]}
	}
	rt := last.route
	if rt == nil {
		r.unrouted.Add(1)
		return true
	}
	if rt.buf == nil {
		rt.buf = newRecordBuffer(r.maxRecords * record.Size)
		rt.since = time.Now()
	}
	if rt.hold == nil {
		rt.hold = r.handoff.take(r.at)
	}
	rt.buf = append(rt.buf, raw[:record.Size]...)
	off := record.Size
	for _, tb := range rt.trailers.Buffers() {
		*tb.Buf, off = appendTrailer(*tb.Buf, raw, off, tb.Trailer)
	}
	if record.ValuesTrailer.On(raw) {
		r.nameFunctions(&rt.trailers, rt.trailers.Values[len(rt.trailers.Values)-record.ValuesSize:])
	}
	if len(rt.buf) >= r.maxRecords*record.Size {
		r.flushLocked(slot, rt)
	}
	return true
}

// nameFunctions gives the drop_function values of one struct hoptrace_values (a drop hop's: where
// the kernel freed the packet) their function's ID in place of the kernel's address, which never
// leaves the node (KASLR), and the name beside it in tr.Functions; an address no function holds
// becomes 0 (unknown).
func (r *Reader) nameFunctions(tr *Trailers, values []byte) {
	for i := range record.ValuesMax {
		if record.ActionField(values[i]) != record.FieldDropFunction {
			continue
		}
		at := 8 + 8*i // struct hoptrace_values: field[ValuesMax], count (u32), value[ValuesMax]
		f := r.Functions.Function(binary.LittleEndian.Uint64(values[at:]))
		binary.LittleEndian.PutUint64(values[at:], f.ID)
		if f.ID != 0 {
			if tr.Functions == nil {
				tr.Functions = map[uint64]string{}
			}
			tr.Functions[f.ID] = f.Name
		}
	}
}

// appendTrailer appends the trailer t of the raw sample, found at off, when its record has it;
// returns the buffer and the offset past it.
func appendTrailer(buf, raw []byte, off int, t record.Trailer) ([]byte, int) {
	if !t.On(raw) {
		return buf, off
	}
	if len(raw) >= off+t.Size {
		buf = append(buf, raw[off:off+t.Size]...)
		if t == record.CaptureTrailer {
			record.ScrubCapture(buf[len(buf)-t.Size:])
		}
		return buf, off + t.Size
	}
	// cannot happen: the hop reserved them all; keep the pairing right
	return append(buf, make([]byte, t.Size)...), off + t.Size
}

func (r *Reader) flushLocked(slot uint16, rt *route) {
	if len(rt.buf) == 0 {
		return
	}
	b := &Batch{Trace: rt.trace, Generation: rt.generation, Slot: slot, Records: rt.buf, Trailers: rt.trailers}
	if rt.hold != nil {
		b.handover = &handover{hold: rt.hold, handoff: r.handoff}
		b.handover.left.Store(1)
	}
	r.out.Push(b)
	rt.buf, rt.trailers, rt.hold = nil, Trailers{}, nil
}

func (r *Reader) flushOld(now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for slot, rt := range r.routes {
		if len(rt.buf) > 0 && now.Sub(rt.since) >= r.flushEvery {
			r.flushLocked(slot, rt)
		}
	}
}

// FlushAll pushes every pending batch now.
func (r *Reader) FlushAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for slot, rt := range r.routes {
		r.flushLocked(slot, rt)
	}
}

// drainTimeout bounds Drain when the read loop cannot answer (it stopped).
const drainTimeout = time.Second

// Drain has the read loop take every record in the ring buffer now, then
// flushes the batches: used before detaching, so no record is left behind.
// It waits for the loop to finish a pass that started after the call.
func (r *Reader) Drain() {
	if r.started.Load() {
		reached := make(chan struct{})
		r.mu.Lock()
		r.drained = append(r.drained, reached)
		r.mu.Unlock()
		select {
		case r.wake <- struct{}{}:
		default: // a wake-up is already pending
		}
		select {
		case <-reached:
		case <-r.done:
		case <-time.After(drainTimeout):
		}
	}
	r.FlushAll()
}

// Close stops the read loop, which flushes what it holds to the batches. The
// ring stays mapped: the consumer position follows the batches as their
// sinks hand them off, until Unmap.
func (r *Reader) Close() error {
	r.closed.Do(func() { close(r.closing) })
	if r.started.Load() {
		<-r.done
		return r.runErr
	}
	r.FlushAll()
	return nil
}

// Unmap stops moving the consumer position and unmaps the ring (after Close):
// records not handed off by now stay in a pinned ring for the next agent's
// reader (which reads on from the consumer position).
func (r *Reader) Unmap() error { return r.handoff.unmap() }
