package loader_test

import (
	"bytes"
	"encoding/binary"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/hoptrace/hoptrace/agent/internal/loader"
	"github.com/hoptrace/hoptrace/agent/internal/netns"
	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
	"github.com/hoptrace/hoptrace/agent/internal/record"
	tu "github.com/hoptrace/hoptrace/agent/internal/testutil"
)

// The capture action (capture: N): each traced packet's first min(N, its length) bytes ride with its
// record, exactly as the hop saw them, with the packet's length and what its first byte begins.

// udp4Sized is a traced UDP frame of payload bytes, the payload's bytes counting up from seed, so
// that every captured byte is told from its neighbours.
func udp4Sized(id uint32, payload int, seed byte) []byte {
	p := make([]byte, payload)
	for i := range p {
		p[i] = seed + byte(i)
	}
	return tu.Cat(tu.Ethernet(0x0800), tu.IPv4(17, src4, dst4, nil, tu.UDP(40000, 5000, p), 4), tu.ID(id))
}

// udp4Untagged is a UDP frame without an ID, for a hop to tag.
func udp4Untagged(payload int) []byte {
	return tu.Cat(tu.Ethernet(0x0800), tu.IPv4(17, src4, dst4, nil, tu.UDP(40000, 5000, make([]byte, payload)), 0))
}

// captureOf checks a raw sample carries a capture after its other trailers and returns it.
func captureOf(t *testing.T, raw []byte) record.Capture {
	t.Helper()
	off := record.Size
	for _, tr := range []record.Trailer{record.ValuesTrailer, record.AddressesTrailer} {
		if tr.On(raw) {
			off += tr.Size
		}
	}
	if !record.CaptureTrailer.On(raw) || len(raw) != off+record.CaptureSize {
		t.Fatalf("flags %#x, %d bytes: want a capture at %d", binary.LittleEndian.Uint16(raw[record.OffsetFlags:]), len(raw), off)
	}
	c, err := record.DecodeCapture(raw[off:])
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// tc, XDP and cgroup hops through BPF_PROG_TEST_RUN: frames shorter and longer than N, after the
// record's values and addresses, and at a tc hop that tags the packet (its bytes with the ID it
// wrote, its length with it).
func TestCaptureActionKeepsFirstBytes(t *testing.T) {
	h := newHarness(t)
	every := uint32(record.AddressesEvery)
	lenValues := [record.ValuesMax]record.ActionField{record.FieldLen}
	cases := []struct {
		name    string
		program string
		actions loader.Actions
		pkt     []byte
		tag     bool
		link    uint16
		from    int // the capture starts at this byte of the frame: cgroup programs see the IP packet
	}{
		{"tc 96 of 200", loader.ProgTC, loader.Actions{Capture: 96}, udp4Sized(0x07000002, 154, 1), false, record.CaptureLinkEthernet, 0},
		{"tc 96 of 50", loader.ProgTC, loader.Actions{Capture: 96}, udp4Sized(0x07000003, 4, 2), false, record.CaptureLinkEthernet, 0},
		{"tc 128 of 1000", loader.ProgTC, loader.Actions{Capture: 128}, udp4Sized(0x07000004, 954, 3), false, record.CaptureLinkEthernet, 0},
		{"tc 1 of 100", loader.ProgTC, loader.Actions{Capture: 1}, udp4Sized(0x07000005, 54, 4), false, record.CaptureLinkEthernet, 0},
		{"tc after values and addresses", loader.ProgTC, loader.Actions{Capture: 64, Record: lenValues},
			udp4Sized(0x07000001+every, 100, 5), false, record.CaptureLinkEthernet, 0},
		{"tc tagging", loader.ProgTC, loader.Actions{Capture: 128}, udp4Untagged(40), true, record.CaptureLinkEthernet, 0},
		{"xdp 96 of 300", loader.ProgXDP, loader.Actions{Capture: 96, Record: lenValues}, udp4Sized(0x07000006, 254, 7), false, record.CaptureLinkEthernet, 0},
		{"xdp 96 of 60", loader.ProgXDP, loader.Actions{Capture: 96}, udp4Sized(0x07000007, 14, 8), false, record.CaptureLinkEthernet, 0},
		{"cgroup 96 of 200", loader.ProgCgroupSKB, loader.Actions{Capture: 96}, udp4Sized(0x07000008, 154, 9), false, record.CaptureLinkRaw, 14},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := loader.HopConfig{Program: c.program, TagUDP: c.tag, Actions: c.actions}
			if c.program == loader.ProgCgroupSKB {
				cfg.AttachType = ebpf.AttachCGroupInetEgress
			}
			hop := h.load(t, cfg)
			out, ok := runOnly(t, hop, c.pkt)
			if !ok {
				t.Fatalf("%s refused the frame", c.program)
			}
			samples := h.drainRaw(t)
			if len(samples) != 1 {
				t.Fatalf("%d samples, want 1 (counters %v)", len(samples), counters(t, hop))
			}
			seen := c.pkt[c.from:] // what the hop saw
			if c.tag {
				seen = out[:len(c.pkt)+record.UDPIDLen] // with the ID it wrote
				if bytes.Equal(seen[len(c.pkt):], make([]byte, record.UDPIDLen)) {
					t.Fatalf("the tc hop did not tag: %x", seen)
				}
			}
			got := captureOf(t, samples[0])
			n := min(len(seen), int(c.actions.Capture))
			if int(got.WireLen) != len(seen) || len(got.Bytes) != n || got.LinkType != c.link {
				t.Fatalf("capture of %d bytes (wire_len %d, link type %d), want %d of %d (link type %d)",
					len(got.Bytes), got.WireLen, got.LinkType, n, len(seen), c.link)
			}
			if !bytes.Equal(got.Bytes, seen[:n]) {
				t.Fatalf("captured\n%x\nwant\n%x", got.Bytes, seen[:n])
			}
		})
	}
	// Without the action: the record alone, no flag.
	plain := h.load(t, loader.HopConfig{})
	if _, ok := runOnly(t, plain, udp4Sized(0x07000009, 100, 1)); !ok {
		t.Fatal("refused")
	}
	if raw := h.drainRaw(t); len(raw) != 1 || len(raw[0]) != record.Size || record.CaptureTrailer.On(raw[0]) {
		t.Fatalf("a hop without capture: %d samples, want one %d-byte record", len(raw), record.Size)
	}
}

// sendFrame writes an Ethernet frame on dev in namespace ns (AF_PACKET): the peer receives it as it is.
func sendFrame(t testing.TB, ns, dev string, frame []byte) {
	t.Helper()
	err := netns.Do(netns.Path(ns, ""), func() error {
		iface, err := net.InterfaceByName(dev)
		if err != nil {
			return err
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return unix.Sendto(fd, frame, 0, &unix.SockaddrLinklayer{Ifindex: iface.Index, Halen: 6})
	})
	if err != nil {
		t.Fatalf("send on %s in %s: %v", dev, ns, err)
	}
}

// A kernel hop (tp_btf net:netif_receive_skb) captures from the skb's MAC header, through the copy of
// its head the parser made: real frames over a veth pair, each compared with what was sent.
func TestCaptureAtKernelHop(t *testing.T) {
	h := newHarness(t)
	p := tu.NewVethPair(t, "198.18.77")
	ifindex, err := netns.Ifindex(netns.Path(p.NsB, ""), p.DevB)
	if err != nil {
		t.Fatal(err)
	}
	ino, err := netns.Inode(netns.Path(p.NsB, ""))
	if err != nil {
		t.Fatal(err)
	}
	hop := h.load(t, loader.HopConfig{Program: loader.ProgTPBTF, AttachTo: "netif_receive_skb",
		Ifindex: uint32(ifindex), NetnsIno: uint32(ino), Actions: loader.Actions{Capture: 96}})
	l, err := link.AttachTracing(link.TracingOptions{Program: hop.Program})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()

	sent := map[uint32][]byte{}
	for i, payload := range []int{200, 30, 1200, 51} {
		id := uint32(0x07000010 + i)
		frame := udp4Sized(id, payload, byte(16*i))
		copy(frame[0:6], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
		sent[id] = frame
		sendFrame(t, p.NsA, p.DevA, frame)
	}
	got := map[uint32]record.Capture{}
	deadline := time.Now().Add(3 * time.Second)
	for len(got) < len(sent) && time.Now().Before(deadline) {
		for _, raw := range h.drainRaw(t) {
			var r record.Record
			if err := record.Decode(raw, &r); err != nil {
				t.Fatal(err)
			}
			got[r.PacketID] = captureOf(t, raw)
		}
	}
	if len(got) != len(sent) {
		t.Fatalf("captures of %d packets, want %d (counters %v)", len(got), len(sent), counters(t, hop))
	}
	for id, frame := range sent {
		c, n := got[id], min(len(frame), 96)
		if int(c.WireLen) != len(frame) || c.LinkType != record.CaptureLinkEthernet || !bytes.Equal(c.Bytes, frame[:n]) {
			t.Errorf("packet %#x: wire_len %d, link type %d, captured\n%x\nwant %d bytes of %d\n%x",
				id, c.WireLen, c.LinkType, c.Bytes, n, len(frame), frame[:n])
		}
	}
	t.Logf("%d packets captured at netif_receive_skb on %s", len(got), p.DevB)
}

// A plan's capture reaches the hop's constant within the bound, and a refusal names it as the spec does.
func TestCaptureFromPlan(t *testing.T) {
	a, err := loader.ActionsFromPlan(&pb.HopActions{Capture: 96, Count: true})
	if err != nil || a.Capture != 96 || !a.Count {
		t.Fatalf("capture 96: %+v, %v", a, err)
	}
	if _, err := loader.ActionsFromPlan(&pb.HopActions{Capture: record.CaptureMax + 1}); err == nil ||
		!strings.Contains(err.Error(), "capture of 129 bytes, at most 128") {
		t.Fatalf("capture 129: %v", err)
	}
	refused := loader.Actions{Capture: 64}
	if names := refused.Names(); len(names) != 1 || names[0] != "capture action" || refused.Proto().GetCapture() != 64 {
		t.Fatalf("refused capture: names %v, proto %v", names, refused.Proto())
	}
}
