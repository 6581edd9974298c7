package stream

import (
	"container/heap"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// ring is the records ring buffer mapped into the agent as libbpf's ring_buffer and cilium/ebpf's
// ringbuf map it (kernel/bpf/ringbuf.c: the consumer position's page read-write, then the producer
// position's page and the data pages, mapped twice in a row so that a record never wraps, read
// only). Unlike theirs, reading does not move the kernel's consumer position: the reader moves it
// (commit) past records only once they are handed off, so what the agent has read and not sent yet
// is still in a pinned ring for the next agent when this one is killed. The producer reserves only
// below the consumer position plus the ring's size (ringbuf_reserve: -ENOSPC beyond), so a record
// stays where it is until the consumer position passes it.
type ring struct {
	cons, prod []byte   // the two mappings
	consPos    *uintptr // the kernel's consumer position (ours to move)
	prodPos    *uintptr
	data       []byte
	mask       uintptr
	pos        uintptr // the next record to read: at or past the consumer position
}

// Record header (struct bpf_ringbuf_hdr): its length word's top bits say busy (reserved, not
// submitted yet) and discard.
const (
	ringHeaderSize = 8
	ringBusyBit    = 1 << 31
	ringDiscardBit = 1 << 30
)

func openRing(m *ebpf.Map) (*ring, error) {
	if m.Type() != ebpf.RingBuf {
		return nil, fmt.Errorf("map %s is a %s, not a ring buffer", m, m.Type())
	}
	size := int(m.MaxEntries())
	if size == 0 || size&(size-1) != 0 {
		return nil, fmt.Errorf("ring buffer size %d is not a power of two", size)
	}
	page := os.Getpagesize()
	cons, err := unix.Mmap(m.FD(), 0, page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mmap the ring buffer's consumer page: %w", err)
	}
	prod, err := unix.Mmap(m.FD(), int64(page), page+2*size, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		_ = unix.Munmap(cons)
		return nil, fmt.Errorf("mmap the ring buffer's data: %w", err)
	}
	r := &ring{cons: cons, prod: prod, consPos: (*uintptr)(unsafe.Pointer(&cons[0])),
		prodPos: (*uintptr)(unsafe.Pointer(&prod[0])), data: prod[page:], mask: uintptr(size - 1)}
	r.pos = atomic.LoadUintptr(r.consPos)
	return r, nil
}

// size is the ring's data size in bytes.
func (r *ring) size() uint64 { return uint64(r.mask) + 1 }

// next returns the next submitted record's sample and its position (of its header), without
// copying: the sample stays valid until the consumer position passes it. ok is false when none is
// submitted yet (the next one is busy, or the producer is where the reader is).
func (r *ring) next() (sample []byte, at uint64, ok bool, err error) {
	prod := atomic.LoadUintptr(r.prodPos)
	for r.pos != prod {
		if prod-r.pos < ringHeaderSize {
			return nil, 0, false, fmt.Errorf("ring buffer: %d bytes left of a record header", prod-r.pos)
		}
		start := r.pos & r.mask
		// The length word is read atomically: the kernel's xchg that clears the busy bit orders the
		// sample's bytes before it.
		l := atomic.LoadUint32((*uint32)(unsafe.Pointer(&r.data[start])))
		if l&ringBusyBit != 0 {
			return nil, 0, false, nil
		}
		n := uintptr(l &^ (ringBusyBit | ringDiscardBit))
		at := r.pos
		r.pos += ringHeaderSize + (n+7)&^7
		if l&ringDiscardBit != 0 {
			continue
		}
		off := start + ringHeaderSize
		return r.data[off : off+n : off+n], uint64(at), true, nil
	}
	return nil, 0, false, nil
}

// read is where the reader is: every record before it has been read.
func (r *ring) read() uint64 { return uint64(r.pos) }

// commit moves the kernel's consumer position forward to pos (never back): the producer may use the
// space before it again.
func (r *ring) commit(pos uint64) {
	if uintptr(pos) > atomic.LoadUintptr(r.consPos) {
		atomic.StoreUintptr(r.consPos, uintptr(pos))
	}
}

// committed is the kernel's consumer position.
func (r *ring) committed() uint64 { return uint64(atomic.LoadUintptr(r.consPos)) }

func (r *ring) close() error {
	err := errors.Join(unix.Munmap(r.prod), unix.Munmap(r.cons))
	r.cons, r.prod, r.data = nil, nil, nil
	return err
}

// handoff keeps the ring's records until they are handed off: each batch, and each route's records
// not in a batch yet, holds the position of its first record, and the consumer position follows the
// oldest hold (or, with none, the reader). A hold is let go when every sink has handed its batch off
// (Batch.Delivered: sent, or dropped and counted), or when the holds would keep more than half the
// ring from the producer (a collector away for long: the queue holds those records then, as it
// always did, and a killed agent loses them).
type handoff struct {
	mu     sync.Mutex
	ring   *ring // nil once unmapped: nothing more is committed
	holds  holdHeap
	readTo uint64 // where the reader is (ring.read as of its last advance)
	maxLag uint64
	// letGo counts holds let go before their records were handed off.
	letGo atomic.Uint64
}

// hold is the position of the first record of a batch, or of a route's pending records.
type hold struct {
	pos      uint64
	released bool
	index    int
}

func newHandoff(r *ring) *handoff { return &handoff{ring: r, readTo: r.read(), maxLag: r.size() / 2} }

// take holds the ring from pos on. Called with the reader's lock held.
func (h *handoff) take(pos uint64) *hold {
	if h == nil {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	hd := &hold{pos: pos}
	heap.Push(&h.holds, hd)
	return hd
}

// release lets a hold go (once), and commits what no hold keeps.
func (h *handoff) release(hd *hold) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if hd.released {
		return
	}
	hd.released = true
	heap.Remove(&h.holds, hd.index)
	h.commitLocked()
}

// advance commits after a read up to readTo (where the reader is): what no hold keeps; and lets the
// oldest holds go while they keep more than maxLag of the ring.
func (h *handoff) advance(readTo uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.readTo = readTo
	for len(h.holds) > 0 && h.readTo-h.holds[0].pos > h.maxLag {
		hd := heap.Pop(&h.holds).(*hold)
		hd.released = true
		h.letGo.Add(1)
	}
	h.commitLocked()
}

func (h *handoff) commitLocked() {
	if h.ring == nil {
		return
	}
	to := h.readTo
	if len(h.holds) > 0 && h.holds[0].pos < to {
		to = h.holds[0].pos
	}
	h.ring.commit(to)
}

// unmap stops committing and unmaps the ring: what is still held stays in the ring for its next
// reader.
func (h *handoff) unmap() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ring == nil {
		return nil
	}
	err := h.ring.close()
	h.ring = nil
	return err
}

// holdHeap orders holds by position (container/heap).
type holdHeap []*hold

func (q holdHeap) Len() int           { return len(q) }
func (q holdHeap) Less(i, j int) bool { return q[i].pos < q[j].pos }
func (q holdHeap) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].index, q[j].index = i, j
}
func (q *holdHeap) Push(x any) {
	hd := x.(*hold)
	hd.index = len(*q)
	*q = append(*q, hd)
}
func (q *holdHeap) Pop() any {
	old := *q
	hd := old[len(old)-1]
	old[len(old)-1] = nil
	*q = old[:len(old)-1]
	return hd
}
