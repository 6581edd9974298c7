package tracer

import (
	"bytes"
	"context"
	"encoding/binary"
	"testing"
	"time"

	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
	"github.com/hoptrace/hoptrace/agent/internal/record"
	"github.com/hoptrace/hoptrace/agent/internal/stream"
	tu "github.com/hoptrace/hoptrace/agent/internal/testutil"
)

// A plan's capture action reaches the stream: each hop's records of a datagram carry its first bytes in
// the batch's Captures, one per record that announces it, with the bytes past the captured ones zeroed
// (the hop leaves whatever the ring held there).
func TestCaptureReachesTheStream(t *testing.T) {
	tu.RequireRoot(t)
	p := tu.NewVethPair(t, "198.18.43")
	m, q := newTestManager(t)
	pl := plan(p, 1)
	for i, n := range []uint32{64, 96, 128} {
		pl.Hops[i].Actions = &pb.HopActions{Capture: n}
	}
	applyAttached(t, m, pl)
	const id = 0x2a000005
	sendTaggedUDP(t, p.NsA, p.AddrA, p.AddrB, id)

	captures := map[uint16]record.Capture{}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for len(captures) < 3 {
		b := q.Pop(ctx)
		if b == nil {
			t.Fatalf("captures of hops %v only", captures)
		}
		for i, c := range capturesOf(t, b) {
			if binary.LittleEndian.Uint32(b.Records[i*record.Size+record.OffsetPacketID:]) == id {
				captures[record.HopIndex(b.Records[i*record.Size:])] = c
			}
		}
	}
	// What was sent: IPv4 from the egress tc hop on (Ethernet, 14 bytes, in front); the tracepoint and
	// the ingress hop see the same frame.
	ip := tu.Cat(tu.IPv4(17, p.AddrA, p.AddrB, nil, tu.UDP(40000, 5000, []byte("hoptrace")), 4), tu.ID(id))
	for hop, n := range map[uint16]int{0: 64, 1: 96, 2: 128} {
		c := captures[hop]
		frame := len(ip) + 14
		want := min(n, frame)
		if int(c.WireLen) != frame || len(c.Bytes) != want || c.LinkType != record.CaptureLinkEthernet ||
			!bytes.Equal(c.Bytes[14:], ip[:want-14]) || !bytes.Equal(c.Bytes[12:14], []byte{0x08, 0x00}) {
			t.Errorf("hop %d: wire_len %d, link type %d, %d bytes %x; want %d of the %d-byte frame of %x",
				hop, c.WireLen, c.LinkType, len(c.Bytes), c.Bytes, want, frame, ip)
		}
	}
}

// capturesOf decodes a batch's captures by record index, checking each is zero past its bytes.
func capturesOf(t *testing.T, b *stream.Batch) map[int]record.Capture {
	t.Helper()
	out := map[int]record.Capture{}
	next := 0
	for i := 0; i*record.Size < len(b.Records); i++ {
		if !record.CaptureTrailer.On(b.Records[i*record.Size:]) {
			continue
		}
		raw := b.Captures[next : next+record.CaptureSize]
		next += record.CaptureSize
		c, err := record.DecodeCapture(raw)
		if err != nil {
			t.Fatal(err)
		}
		if tail := raw[8+len(c.Bytes):]; !bytes.Equal(tail, make([]byte, len(tail))) {
			t.Fatalf("capture of %d bytes: not zero past them: %x", len(c.Bytes), tail)
		}
		out[i] = c
	}
	if next != len(b.Captures) {
		t.Fatalf("%d capture bytes, %d announced by the records", len(b.Captures), next)
	}
	return out
}
