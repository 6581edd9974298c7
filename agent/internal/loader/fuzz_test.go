package loader_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"slices"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/hoptrace/hoptrace/agent/internal/loader"
	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
	"github.com/hoptrace/hoptrace/agent/internal/record"
	tu "github.com/hoptrace/hoptrace/agent/internal/testutil"
)

// Native Go fuzzing of the BPF parser through BPF_PROG_TEST_RUN: arbitrary frames go through hop_tc in the
// kernel. `go test` runs the seeds; `make fuzz` (and, briefly, `make test`) explores.

// fuzzSeeds are frames the parser handles in every way: IDs in UDP and TCP, tunnels, VLANs, and breakage.
func fuzzSeeds(f *testing.F) {
	inner := tu.Cat(tu.Ethernet(0x0800), tu.IPv4(17, src4, dst4, nil, tu.UDP(1000, 2000, []byte("in")), 4), tu.ID(0x07000021))
	for _, frame := range [][]byte{
		udp4(0x07000001),
		udp4(0x07000002, 0x8100),
		udp4(0x07000003, 0x88a8, 0x8100),
		tu.Cat(tu.Ethernet(0x86dd), tu.IPv6(17, src6, dst6, nil, tu.UDP(1, 2, []byte("six")), 4), tu.ID(0x07000005)),
		tu.Cat(tu.Ethernet(0x0800), tu.IPv4(6, src4, dst4, nil, tu.TCP(1, 2, tu.TCPIDOption(0x07000011), []byte("t")), 0)),
		tu.Cat(tu.Ethernet(0x0800), tu.IPv4(17, src4, dst4, nil, tu.UDP(5, 4789, tu.VXLAN(42, inner)), 0)),
		udp4(0x07000001)[:30],
		{},
		bytes.Repeat([]byte{0xff}, 64),
	} {
		f.Add(frame)
	}
}

// runFrame runs frame through hop like harness.run; ok is false when the kernel will not build an skb of
// it (BPF_PROG_TEST_RUN refuses an IP ethertype whose IP header is cut short with EINVAL: such a frame
// never reaches tc).
func runFrame(t *testing.T, h *harness, hop *loader.Hop, frame []byte) (out []byte, recs []record.Record, ok bool) {
	t.Helper()
	if out, ok = runOnly(t, hop, frame); ok {
		recs = h.drain(t)
	}
	return out, recs, ok
}

// runFrameRaw is runFrame with the records as the ring holds them: the record, then any values.
func runFrameRaw(t *testing.T, h *harness, hop *loader.Hop, frame []byte) (out []byte, samples [][]byte, ok bool) {
	t.Helper()
	if out, ok = runOnly(t, hop, frame); ok {
		samples = h.drainRaw(t)
	}
	return out, samples, ok
}

// runOnly runs frame through hop once and checks that the packet goes on.
func runOnly(t *testing.T, hop *loader.Hop, frame []byte) (out []byte, ok bool) {
	t.Helper()
	opts := &ebpf.RunOptions{Data: frame, DataOut: make([]byte, len(frame)+256)}
	ret, err := hop.Program.Run(opts)
	if errors.Is(err, unix.EINVAL) {
		return nil, false
	}
	if err != nil {
		t.Fatalf("test run: %v", err)
	}
	// Each kind's "let the packet go on": TCX_NEXT, XDP_PASS, SK_PASS.
	want := map[ebpf.ProgramType]int32{ebpf.SchedCLS: -1, ebpf.XDP: 2, ebpf.CGroupSKB: 1}[hop.Program.Type()]
	if int32(ret) != want {
		t.Fatalf("%s returned %d, want %d, for %x", hop.Program, int32(ret), want, frame)
	}
	return opts.DataOut, true
}

// idIn reports whether id's four bytes (network order) occur in frame: the only place a parser may take
// an ID from.
func idIn(frame []byte, id uint32) bool {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], id)
	return bytes.Contains(frame, b[:])
}

// FuzzRecordingHop: a hop that only records never changes or drops a frame, counts it exactly once, and
// records only an ID the frame carries.
func FuzzRecordingHop(f *testing.F) {
	fuzzSeeds(f)
	h := newHarness(f)
	hop := h.load(f, loader.HopConfig{})
	f.Fuzz(func(t *testing.T, frame []byte) {
		if len(frame) < 14 || len(frame) > 9000 {
			return // BPF_PROG_TEST_RUN wants an Ethernet header and at most a jumbo frame
		}
		before := counters(t, hop)
		out, recs, ok := runFrame(t, h, hop, frame)
		if !ok {
			return
		}
		after := counters(t, hop)
		d := func(c record.Counter) uint64 { return after[c] - before[c] }

		if !bytes.Equal(out[:len(frame)], frame) || len(out) != len(frame) {
			t.Fatalf("a recording hop changed the frame:\nin  %x\nout %x", frame, out)
		}
		if d(record.CSeen) != 1 {
			t.Fatalf("seen +%d, want +1", d(record.CSeen))
		}
		outcomes := d(record.CParseTruncated) + d(record.CParseMalformed) + d(record.CParseNonIP) +
			d(record.CNotMatched) + d(record.CMatched)
		if outcomes != 1 {
			t.Fatalf("one frame counted in %d outcomes: %v", outcomes, after)
		}
		if d(record.CMatched) == 1 && d(record.CUntagged)+d(record.CRecorded)+d(record.CRingbufFull) != 1 {
			t.Fatalf("a matched frame neither untagged, recorded nor lost: %v", after)
		}
		if uint64(len(recs)) != d(record.CRecorded) {
			t.Fatalf("%d records for recorded +%d", len(recs), d(record.CRecorded))
		}
		for _, r := range recs {
			if r.PacketID == 0 || !idIn(frame, r.PacketID) {
				t.Fatalf("recorded ID %#x, which the frame does not carry: %x", r.PacketID, frame)
			}
			if r.WireLen != uint32(len(frame)) || r.HopIndex != 0 {
				t.Fatalf("record %+v for a %d-byte frame", r, len(frame))
			}
		}
	})
}

// FuzzTaggingHop: a tagging hop grows a frame by the 4-byte ID or not at all, never drops it, and a
// frame it grew carries an ID of this node (salt 7) in the record and at the end of the UDP payload.
func FuzzTaggingHop(f *testing.F) {
	fuzzSeeds(f)
	f.Add(tu.Cat(tu.Ethernet(0x0800), tu.IPv4(17, src4, dst4, nil, tu.UDP(40000, 5000, []byte("untagged")), 0)))
	h := newHarness(f)
	hop := h.load(f, loader.HopConfig{TagUDP: true})
	f.Fuzz(func(t *testing.T, frame []byte) {
		if len(frame) < 14 || len(frame) > 9000 {
			return
		}
		before := counters(t, hop)
		out, recs, ok := runFrame(t, h, hop, frame)
		if !ok {
			return
		}
		after := counters(t, hop)
		grew := len(out) - len(frame)
		tagged := after[record.CTagged] - before[record.CTagged]
		switch {
		case grew == 0 && tagged == 0:
		case grew == record.UDPIDLen && tagged == 1:
			if len(recs) != 1 || recs[0].PacketID>>24 != 7 || recs[0].Flags&record.FlagTaggedHere == 0 {
				t.Fatalf("tagged, but the record is %+v", recs)
			}
			if !idIn(out, recs[0].PacketID) {
				t.Fatalf("the ID %#x is not in the tagged frame %x", recs[0].PacketID, out)
			}
		default:
			t.Fatalf("frame grew by %d bytes with tagged +%d", grew, tagged)
		}
	})
}

// loadGeneralOnly loads a hop like h.load whose every packet takes the general parser (hop_general_only):
// the reference the fast path is checked against.
func (h *harness) loadGeneralOnly(t testing.TB, cfg loader.HopConfig) *loader.Hop {
	t.Helper()
	general := h.spec.Copy()
	v, ok := general.Variables["hop_general_only"]
	if !ok {
		t.Fatal("the object has no hop_general_only")
	}
	if err := v.Set(uint8(1)); err != nil {
		t.Fatal(err)
	}
	return (&harness{spec: general, records: h.records, idState: h.idState, rd: h.rd}).load(t, cfg)
}

// fastPathSeeds are frames at every edge of what the fast path decides (hop.bpf.h's hop_fast_refuses):
// the common frame of the filters' flow and of others, VXLAN inside, and each header it leaves to the
// general parser.
func fastPathSeeds(f *testing.F) {
	fuzzSeeds(f)
	vxlan := func(inner []byte) []byte {
		return tu.Cat(tu.Ethernet(0x0800), tu.IPv4(17, src4, dst4, nil, tu.UDP(5, 4789, tu.VXLAN(42, inner)), 0))
	}
	innerUDP := func(dport uint16) []byte {
		return tu.Cat(tu.Ethernet(0x0800), tu.IPv4(17, src4, dst4, nil, tu.UDP(1000, dport, []byte("in")), 4), tu.ID(0x07000031))
	}
	// TCP from port 1 (a filter takes it) with these options: parse_tcp_id's common layouts and their edges
	tcpOpts := func(opts ...[]byte) []byte {
		return tu.Cat(tu.Ethernet(0x0800), tu.IPv4(6, src4, dst4, nil, tu.TCP(1, 6000, tu.Cat(opts...), []byte("ts")), 0))
	}
	timestamps := []byte{1, 1, 8, 10, 0, 0, 0, 7, 0, 0, 0, 9}
	otherOption := []byte{254, 8, 0x48, 0x54, 7, 0, 0, 0x36}
	// udp4 with a byte changed: IPv4 from offset 14, UDP from 34
	changed := func(mutate func(b []byte)) []byte {
		frame := udp4(0x07000032)
		mutate(frame)
		return frame
	}
	// the timestamps past the IP packet's end (its total length 50 of the 54 the headers need)
	optionsPastIP := tcpOpts(timestamps)
	optionsPastIP[16], optionsPastIP[17] = 0, 50
	for _, frame := range [][]byte{
		vxlan(innerUDP(5000)),
		vxlan(innerUDP(6000)),
		vxlan(tu.Cat(tu.Ethernet(0x0800), tu.IPv4(6, src4, dst4, nil, tu.TCP(1, 5000, tu.TCPIDOption(0x07000033), nil), 0))),
		vxlan(tu.Cat(tu.Ethernet(0x86dd), tu.IPv6(17, src6, dst6, nil, tu.UDP(1, 5000, []byte("six")), 4), tu.ID(0x07000034))),
		tu.Cat(tu.Ethernet(0x0800), tu.IPv4(17, src4, dst4, nil, tu.UDP(5, 6081, []byte{0, 0, 0x65, 0x58, 0, 0, 42, 0}), 0)),
		tu.Cat(tu.Ethernet(0x0800), tu.IPv4(6, src4, dst4, nil, tu.TCP(1, 6000, nil, []byte("t")), 0)),
		tu.Cat(tu.Ethernet(0x0800), tu.IPv4(1, src4, dst4, nil, []byte{8, 0, 0, 0, 0, 1, 0, 1}, 0)),
		tu.Cat(tu.Ethernet(0x0800), tu.IPv4(17, src4, dst4, []byte{1, 1, 1, 1}, tu.UDP(1, 6000, []byte("opt")), 0)),
		changed(func(b []byte) { b[20] = 0x20 }),              // first of several fragments
		changed(func(b []byte) { b[21] = 0x08 }),              // a later fragment
		changed(func(b []byte) { b[16], b[17] = 0x0f, 0xff }), // longer than the frame
		changed(func(b []byte) { b[16], b[17] = 0, 19 }),      // shorter than its header
		changed(func(b []byte) { b[38], b[39] = 0, 7 }),       // UDP length < 8
		changed(func(b []byte) { b[38], b[39] = 0x0f, 0xff }), // UDP longer than its IP packet
		changed(func(b []byte) { b[14] = 0x65 }),              // version 6 in an IPv4 frame
		tu.Cat(tu.Ethernet(0x86dd), tu.IPv6(6, src6, dst6, nil, tu.TCP(1, 6000, nil, []byte("t6")), 0)),
		tu.Cat(tu.Ethernet(0x86dd), tu.IPv6(17, src6, dst6, []tu.Ext{{Type: 0, Len: 8}}, tu.UDP(1, 5000, []byte("ext")), 0)),
		tu.Cat(tu.Ethernet(0x86dd), tu.IPv6(17, src6, dst6, nil, tu.UDP(1, 6000, []byte("long")), 4000)),
		tu.Cat(tu.Ethernet(0x86dd), tu.IPv6(17, src6, dst6, nil, tu.UDP(5, 4789, tu.VXLAN(42, innerUDP(5000))), 0)),
		tu.Cat(tu.Ethernet(0x86dd), tu.IPv6(17, src6, dst6, nil, tu.UDP(1, 2, []byte("six")), 0))[:60], // UDP cut short
		tcpOpts(timestamps),                                                 // timestamps alone
		tcpOpts(timestamps, tu.TCPIDOption(0x07000036)),                     // timestamps, then the ID
		tcpOpts(timestamps, otherOption),                                    // timestamps, then another option
		tcpOpts(timestamps, []byte{253, 8, 0x48, 0x55, 7, 0, 0, 0x37}),      // another ExID
		tcpOpts(timestamps, []byte{253, 9, 0x48, 0x54, 7, 0, 0, 0x38}),      // the ID's length wrong
		tcpOpts([]byte{1, 1, 8, 11}, timestamps[4:]),                        // a timestamps length wrong
		tcpOpts(tu.TCPIDOption(0x07000039), timestamps),                     // the ID first
		tcpOpts(timestamps, tu.TCPIDOption(0x0700003a), []byte{1, 1, 1, 1}), // and 4 NOPs after
		tcpOpts([]byte{1, 1, 8, 10}),                                        // timestamps cut by the data offset
		vxlan(tcpOpts(timestamps)),                                          // an inner segment without an ID
		optionsPastIP,                                                       // malformed, not untagged
		udp4(0x07000035)[:40],                                               // UDP header cut short
		vxlan(innerUDP(5000))[:60],                                          // inner Ethernet cut short
	} {
		f.Add(frame)
	}
}

// FuzzFastPathAgrees: for every frame and filter, a tc, XDP or cgroup_skb hop's counters and records are
// those of the same hop whose every packet takes the general parser. The fast path may only refuse what
// the general parser refuses, and count it the same way; a packet it lets through is parsed alike.
func FuzzFastPathAgrees(f *testing.F) {
	fastPathSeeds(f)
	h := newHarness(f)
	type pair struct {
		filter        int
		fast, general *loader.Hop
	}
	var pairs []pair
	for i, m := range []*pb.FlowMatch{
		{IpProto: 17, DstPort: 5000},
		{IpProto: 6, SrcPort: 1},
		{Family: 4, DstAddr: []byte{198, 18, 1, 0}, DstMask: []byte{255, 255, 255, 0}, DstPort: 2000},
		{Family: 6},
		{Family: 6, DstAddr: []byte{0xfd, 0, 0, 1}, DstMask: []byte{0xff, 0xff, 0xff, 0xff}, DstPort: 5000},
		{Family: 4, SrcAddr: []byte{198, 18, 0, 1}, SrcMask: []byte{255, 255, 255, 255}},
	} {
		fc, err := loader.FilterFromMatch(m)
		if err != nil {
			f.Fatal(err)
		}
		// Header fields in every record, so that the records compare what the parsers read too.
		headers := loader.Actions{Record: [record.ValuesMax]record.ActionField{record.FieldTOS, record.FieldTTL, record.FieldIPID, record.FieldTCPSeq}}
		for _, cfg := range []loader.HopConfig{
			{Filter: fc, Actions: headers},
			{Filter: fc, Program: loader.ProgXDP, Actions: headers},
			{Filter: fc, Program: loader.ProgCgroupSKB, AttachType: ebpf.AttachCGroupInetIngress, Actions: headers},
		} {
			pairs = append(pairs, pair{i, h.load(f, cfg), h.loadGeneralOnly(f, cfg)})
		}
	}
	f.Fuzz(func(t *testing.T, frame []byte) {
		if len(frame) < 14 || len(frame) > 9000 {
			return
		}
		for _, p := range pairs {
			var deltas [2]record.Counters
			var recs [2][][]byte
			for j, hop := range []*loader.Hop{p.fast, p.general} {
				before := counters(t, hop)
				_, samples, ok := runFrameRaw(t, h, hop, frame)
				if !ok {
					return
				}
				after := counters(t, hop)
				for c := range after {
					deltas[j][c] = after[c] - before[c]
				}
				for _, sample := range samples {
					clear(sample[0:8])   // ts_ns
					clear(sample[28:30]) // cpu
					recs[j] = append(recs[j], sample)
				}
			}
			if deltas[0] != deltas[1] || !slices.EqualFunc(recs[0], recs[1], bytes.Equal) {
				t.Fatalf("%s, filter %d: the fast path counted %v and recorded %x, the general parser %v and %x, for %x",
					p.fast.Program, p.filter, deltas[0], recs[0], deltas[1], recs[1], frame)
			}
		}
	})
}
