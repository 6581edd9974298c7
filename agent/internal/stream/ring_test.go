package stream

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	"github.com/hoptrace/hoptrace/agent/internal/record"
	tu "github.com/hoptrace/hoptrace/agent/internal/testutil"
)

// writer is a program that submits one record of trace slot 3 to rb each run, as a hop does.
func writer(t *testing.T, rb *ebpf.Map) func(n int) {
	t.Helper()
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SocketFilter, License: "GPL",
		Instructions: asm.Instructions{
			asm.Mov.Imm(asm.R1, 0),
			asm.StoreMem(asm.RFP, -32, asm.R1, asm.DWord),
			asm.StoreMem(asm.RFP, -24, asm.R1, asm.DWord),
			asm.StoreMem(asm.RFP, -16, asm.R1, asm.DWord),
			asm.StoreMem(asm.RFP, -8, asm.R1, asm.DWord),
			asm.Mov.Imm(asm.R1, 3),
			asm.StoreMem(asm.RFP, -32+record.OffsetTraceSlot, asm.R1, asm.Half),
			asm.LoadMapPtr(asm.R1, rb.FD()),
			asm.Mov.Reg(asm.R2, asm.RFP),
			asm.Add.Imm(asm.R2, -32),
			asm.Mov.Imm(asm.R3, record.Size),
			asm.Mov.Imm(asm.R4, 0),
			asm.FnRingbufOutput.Call(),
			asm.Mov.Imm(asm.R0, 0),
			asm.Return(),
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { prog.Close() })
	return func(n int) {
		t.Helper()
		if _, err := prog.Run(&ebpf.RunOptions{Data: make([]byte, 14), Repeat: uint32(n)}); err != nil {
			t.Fatal(err)
		}
	}
}

func newRing(t *testing.T, size uint32) *ebpf.Map {
	t.Helper()
	rb, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.RingBuf, MaxEntries: size})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rb.Close() })
	return rb
}

// popRecords pops batches until n records came; the batches.
func popRecords(t *testing.T, q *Queue, n int) []*Batch {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var out []*Batch
	for got := 0; got < n; {
		b := q.Pop(ctx)
		if b == nil {
			t.Fatalf("%d of %d records", got, n)
		}
		out = append(out, b)
		got += b.Count()
	}
	return out
}

// The ring's consumer position stays before the records the reader read until their batches are
// delivered; a reader that stopped without delivering them (a killed agent) leaves them to the next
// reader of the ring, which reads them again, and only those.
func TestRingKeepsWhatIsNotDelivered(t *testing.T) {
	tu.RequireRoot(t)
	rb := newRing(t, 1<<16)
	write := writer(t, rb)

	q1 := NewQueue(0)
	r1, err := NewReader(rb, q1, 4, time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	r1.AddRoute(3, "t", 1)
	start := r1.ring.committed()
	r1.Start()
	write(10)
	batches := popRecords(t, q1, 10)
	if got := r1.ring.committed(); got != start {
		t.Fatalf("consumer position moved %d bytes before any batch was delivered", got-start)
	}
	batches[0].Delivered()
	if got := r1.ring.committed(); got != start+uint64(batches[0].Count())*(record.Size+ringHeaderSize) {
		t.Errorf("consumer position %d after the first batch of %d records, want %d", got-start,
			batches[0].Count(), uint64(batches[0].Count())*(record.Size+ringHeaderSize))
	}
	delivered := batches[0].Count()
	if err := r1.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r1.Unmap(); err != nil {
		t.Fatal(err)
	}
	batches[1].Delivered() // after Unmap: commits nothing

	q2 := NewQueue(0)
	r2, err := NewReader(rb, q2, 1024, time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	r2.AddRoute(3, "t", 1)
	r2.Start()
	defer func() { r2.Close(); r2.Unmap() }()
	write(5)
	again := popRecords(t, q2, 10-delivered+5)
	n := 0
	for _, b := range again {
		n += b.Count()
		b.Delivered()
	}
	if n != 10-delivered+5 {
		t.Errorf("the next reader read %d records, want the %d not delivered and the 5 new", n, 10-delivered)
	}
	if got, want := r2.ring.committed(), r2.ring.read(); got != want {
		t.Errorf("consumer position %d, want the reader's %d once everything is delivered", got, want)
	}
}

// Batches that are not delivered (a collector away) keep at most half the ring from the producer:
// past that the oldest are let go, counted, and the producer goes on writing.
func TestRingLetsGoPastHalf(t *testing.T) {
	tu.RequireRoot(t)
	rb := newRing(t, 1<<12)
	write := writer(t, rb)
	q := NewQueue(0)
	r, err := NewReader(rb, q, 8, time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	r.AddRoute(3, "t", 1)
	r.Start()
	defer func() { r.Close(); r.Unmap() }()
	// 4 KiB hold 102 records of 40 bytes: write three rings' worth, 40 (a third of one) at a time,
	// each once the reader has let go of what it holds past half the ring (it does so in its own
	// time: a write before would find the ring full on a loaded machine).
	held := func() uint64 { return uint64(atomic.LoadUintptr(r.ring.prodPos)) - r.ring.committed() }
	for i := 0; i < 8; i++ {
		for deadline := time.Now().Add(5 * time.Second); held() > r.ring.size()/2; {
			if time.Now().After(deadline) {
				t.Fatalf("write %d: %d bytes held after 5 s, more than half the ring", i, held())
			}
			time.Sleep(time.Millisecond)
		}
		write(40)
		popRecords(t, q, 40)
	}
	if r.LetGo() == 0 {
		t.Errorf("no hold let go with three rings' worth undelivered")
	}
	// the last write's hold too, in the reader's own time
	lag := func() uint64 { return r.ring.read() - r.ring.committed() }
	for deadline := time.Now().Add(5 * time.Second); lag() > r.ring.size()/2; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d bytes held after 5 s, more than half the ring", lag())
		}
	}
}
