package loader_test

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/ringbuf"

	"github.com/hoptrace/hoptrace/agent/internal/attach"
	"github.com/hoptrace/hoptrace/agent/internal/loader"
	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
	"github.com/hoptrace/hoptrace/agent/internal/probe"
	"github.com/hoptrace/hoptrace/agent/internal/record"
	tu "github.com/hoptrace/hoptrace/agent/internal/testutil"
)

// harness loads hop_tc from the generic object with its own ring buffer and
// runs crafted packets through it with BPF_PROG_TEST_RUN.
type harness struct {
	spec    *ebpf.CollectionSpec
	records *ebpf.Map
	idState *ebpf.Map
	rd      *ringbuf.Reader
}

// kernelBTF is parsed once for all tests, as the agent does: parsing it per load takes seconds in a
// slow guest of the kernel matrix.
var kernelBTF = btf.NewCache()

func newHarness(t testing.TB) *harness {
	t.Helper()
	tu.RequireRoot(t)
	spec := tu.LoadSpec(t)
	// 256 KiB: a benchmark's chunk of runs of one packet, each with its record, values and addresses
	records, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.RingBuf, MaxEntries: 1 << 18})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { records.Close() })
	ids, err := loader.NewIDState(spec)
	if err != nil || ids == nil {
		t.Fatalf("id_state: %v", err)
	}
	t.Cleanup(func() { ids.Close() })
	rd, err := ringbuf.NewReader(records)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rd.Close() })
	return &harness{spec: spec, records: records, idState: ids, rd: rd}
}

func (h *harness) load(t testing.TB, cfg loader.HopConfig) *loader.Hop {
	t.Helper()
	if cfg.Program == "" {
		cfg.Program = loader.ProgTC
	}
	if cfg.Name == "" {
		cfg.Name = "test"
	}
	if cfg.IDOrigin == 0 {
		cfg.IDOrigin = 7
	}
	if cfg.TraceSlot == 0 {
		cfg.TraceSlot = 3
	}
	hop, err := loader.LoadHop(h.spec, cfg, loader.Options{Records: h.records, IDState: h.idState, Cache: kernelBTF})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hop.Close)
	return hop
}

// run sends pkt through the program and returns the output packet and the
// records it wrote.
func (h *harness) run(t testing.TB, hop *loader.Hop, pkt []byte) ([]byte, []record.Record) {
	t.Helper()
	out := make([]byte, len(pkt)+256)
	opts := &ebpf.RunOptions{Data: pkt, DataOut: out}
	ret, err := hop.Program.Run(opts)
	if err != nil {
		t.Fatalf("test run: %v", err)
	}
	if int32(ret) != -1 {
		t.Errorf("hop_tc returned %d, want TCX_NEXT (-1)", int32(ret))
	}
	return opts.DataOut, h.drain(t)
}

func (h *harness) drain(t testing.TB) []record.Record {
	t.Helper()
	var recs []record.Record
	for _, sample := range h.drainRaw(t) {
		var r record.Record
		if err := record.Decode(sample, &r); err != nil {
			t.Fatal(err)
		}
		recs = append(recs, r)
	}
	return recs
}

// drainRaw is drain with the records as the ring holds them: the record, then any values.
func (h *harness) drainRaw(t testing.TB) [][]byte {
	t.Helper()
	var samples [][]byte
	var rr ringbuf.Record
	h.rd.SetDeadline(time.Now())
	for {
		err := h.rd.ReadInto(&rr)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return samples
		}
		if err != nil {
			t.Fatal(err)
		}
		samples = append(samples, slices.Clone(rr.RawSample))
	}
}

func counters(t testing.TB, hop *loader.Hop) record.Counters {
	t.Helper()
	c, err := hop.ReadCounters()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

const (
	src4 = "198.18.0.1"
	dst4 = "198.18.1.2"
	src6 = "fd00::1"
	dst6 = "fd00:1::2"
)

func udp4(id uint32, tpids ...uint16) []byte {
	u := tu.UDP(40000, 5000, []byte("hello hoptrace"))
	return tu.Cat(tu.Ethernet(0x0800, tpids...), tu.IPv4(17, src4, dst4, nil, u, 4), tu.ID(id))
}

// One packet in ADDRESSES_EVERY (sequence 1 modulo it) carries the 5-tuple the hop saw, after the
// record and its values; the others carry neither the flag nor the bytes.
func TestAddressesDescribeOnePacketInN(t *testing.T) {
	h := newHarness(t)
	udp6 := func(id uint32) []byte {
		return tu.Cat(tu.Ethernet(0x86dd), tu.IPv6(17, src6, dst6, nil, tu.UDP(40001, 5001, []byte("v6")), 4), tu.ID(id))
	}
	every := uint32(record.AddressesEvery)
	cases := []struct {
		name    string
		pkt     []byte
		actions loader.Actions
		want    *record.Addresses
	}{
		{"ipv4 sequence 1", udp4(0x07000001), loader.Actions{},
			&record.Addresses{Src: netip.MustParseAddr(src4), Dst: netip.MustParseAddr(dst4), SrcPort: 40000, DstPort: 5000, Proto: 17}},
		{"ipv6 sequence 1+N", udp6(0x07000001 + every), loader.Actions{},
			&record.Addresses{Src: netip.MustParseAddr(src6), Dst: netip.MustParseAddr(dst6), SrcPort: 40001, DstPort: 5001, Proto: 17}},
		{"after values", udp4(0x07000001 + 2*every), loader.Actions{Record: [record.ValuesMax]record.ActionField{record.FieldLen}},
			&record.Addresses{Src: netip.MustParseAddr(src4), Dst: netip.MustParseAddr(dst4), SrcPort: 40000, DstPort: 5000, Proto: 17}},
		{"sequence 2", udp4(0x07000002), loader.Actions{}, nil},
		{"sequence 2 with values", udp4(0x07000002), loader.Actions{Record: [record.ValuesMax]record.ActionField{record.FieldLen}}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			hop := h.load(t, loader.HopConfig{HopIndex: 2, Actions: c.actions})
			if _, err := hop.Program.Run(&ebpf.RunOptions{Data: c.pkt, DataOut: make([]byte, len(c.pkt)+256)}); err != nil {
				t.Fatal(err)
			}
			samples := h.drainRaw(t)
			if len(samples) != 1 {
				t.Fatalf("%d samples, want 1", len(samples))
			}
			raw := samples[0]
			size := record.Size
			if record.HasValues(raw) {
				size += record.ValuesSize
			}
			if c.want == nil {
				if record.AddressesTrailer.On(raw) || len(raw) != size {
					t.Fatalf("flags %#x, %d bytes: want no addresses", binary.LittleEndian.Uint16(raw[record.OffsetFlags:]), len(raw))
				}
				return
			}
			if !record.AddressesTrailer.On(raw) || len(raw) != size+record.AddressesSize {
				t.Fatalf("flags %#x, %d bytes: want the addresses after %d", binary.LittleEndian.Uint16(raw[record.OffsetFlags:]), len(raw), size)
			}
			got, err := record.DecodeAddresses(raw[size:])
			if err != nil {
				t.Fatal(err)
			}
			if got != *c.want {
				t.Errorf("addresses %+v, want %+v", got, *c.want)
			}
		})
	}
}

func TestParserFindsIDs(t *testing.T) {
	h := newHarness(t)
	tcpOpts := tu.Cat(
		[]byte{2, 4, 0x05, 0xb4},              // MSS 1460
		[]byte{1, 1},                          // NOP NOP
		[]byte{4, 2},                          // SACK permitted
		[]byte{8, 10, 0, 0, 0, 1, 0, 0, 0, 2}, // timestamps
		[]byte{1, 1},
		tu.TCPIDOption(0x07000011),
	)
	inner4UDP := tu.Cat(tu.Ethernet(0x0800), tu.IPv4(17, src4, dst4, nil, tu.UDP(1000, 2000, []byte("inner")), 4), tu.ID(0x07000021))
	inner4TCP := tu.Cat(tu.Ethernet(0x0800), tu.IPv4(6, src4, dst4, nil, tu.TCP(1000, 2000, tcpOpts, []byte("x")), 0))
	outer := func(dport uint16, payload []byte) []byte {
		u := tu.UDP(55555, dport, payload)
		return tu.Cat(tu.Ethernet(0x0800), tu.IPv4(17, "198.18.9.1", "198.18.9.2", nil, u, 0))
	}
	genOpts := []byte{0x01, 0x02, 0x80, 0x01, 0xaa, 0xbb, 0xcc, 0xdd} // class, type, len=1 word, data

	cases := []struct {
		name  string
		pkt   []byte
		id    uint32
		flags uint16
	}{
		{"ipv4 udp surplus", udp4(0x07000001), 0x07000001, record.FlagUDP | record.FlagAddresses},
		{"802.1Q", udp4(0x07000002, 0x8100), 0x07000002, record.FlagUDP | record.FlagVLAN},
		{"QinQ", udp4(0x07000003, 0x88a8, 0x8100), 0x07000003, record.FlagUDP | record.FlagVLAN},
		{"ipv4 options", tu.Cat(tu.Ethernet(0x0800),
			tu.IPv4(17, src4, dst4, []byte{0x94, 4, 0, 0, 1, 1, 1, 0}, tu.UDP(1, 2, []byte("opts")), 4), tu.ID(0x07000004)),
			0x07000004, record.FlagUDP},
		{"ipv6 ext headers", tu.Cat(tu.Ethernet(0x86dd),
			tu.IPv6(17, src6, dst6, []tu.Ext{{Type: 0, Len: 8}, {Type: 43, Len: 24}, {Type: 60, Len: 16}},
				tu.UDP(1, 2, []byte("v6")), 4), tu.ID(0x07000005)),
			0x07000005, record.FlagUDP | record.FlagIPv6},
		{"tcp option 253", tu.Cat(tu.Ethernet(0x0800), tu.IPv4(6, src4, dst4, nil, tu.TCP(1, 2, tcpOpts, []byte("data")), 0)),
			0x07000011, record.FlagTCP},
		{"ipv6 tcp option 253", tu.Cat(tu.Ethernet(0x86dd), tu.IPv6(6, src6, dst6, nil, tu.TCP(1, 2, tcpOpts, nil), 0)),
			0x07000011, record.FlagTCP | record.FlagIPv6},
		{"vxlan udp", outer(4789, tu.VXLAN(42, inner4UDP)), 0x07000021, record.FlagUDP | record.FlagEncapVXLAN},
		{"vxlan tcp", outer(4789, tu.VXLAN(42, inner4TCP)), 0x07000011, record.FlagTCP | record.FlagEncapVXLAN},
		{"geneve udp", outer(6081, tu.Geneve(42, genOpts, inner4UDP)), 0x07000021, record.FlagUDP | record.FlagEncapGeneve},
		{"geneve tcp", outer(6081, tu.Geneve(42, genOpts, inner4TCP)), 0x07000011, record.FlagTCP | record.FlagEncapGeneve},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			hop := h.load(t, loader.HopConfig{HopIndex: 2})
			_, recs := h.run(t, hop, c.pkt)
			if len(recs) != 1 {
				t.Fatalf("%d records, want 1 (counters %v)", len(recs), counters(t, hop))
			}
			r := recs[0]
			if r.PacketID != c.id || r.Flags != c.flags {
				t.Errorf("packet_id %#x flags %#x, want %#x %#x", r.PacketID, r.Flags, c.id, c.flags)
			}
			if r.HopIndex != 2 || r.TraceSlot != 3 || r.WireLen != uint32(len(c.pkt)) || r.TsNs == 0 || r.FlowHash == 0 {
				t.Errorf("record %+v", r)
			}
			cn := counters(t, hop)
			if cn[record.CSeen] != 1 || cn[record.CMatched] != 1 || cn[record.CRecorded] != 1 || cn[record.CBytes] != uint64(len(c.pkt)) {
				t.Errorf("counters %v", cn)
			}
		})
	}
}

// A segment whose frame ends before 40 option bytes would (a short payload) in Linux's layouts, NOP NOP
// timestamps alone or with the ID: its ID is found, or it is counted untagged, never truncated. XDP
// before 5.18 (the floor, HOPTRACE_FLOOR=1) reads it without a helper, by a load of the layout's size.
func TestShortSegmentsInLinuxLayouts(t *testing.T) {
	h := newHarness(t)
	timestamps := []byte{1, 1, 8, 10, 0, 0, 0, 7, 0, 0, 0, 9}
	tagged := tu.Cat(tu.Ethernet(0x0800), tu.IPv4(6, src4, dst4, nil, tu.TCP(1, 2, tu.Cat(timestamps, tu.TCPIDOption(0x07000041)), []byte("ok")), 0))
	untagged := tu.Cat(tu.Ethernet(0x0800), tu.IPv4(6, src4, dst4, nil, tu.TCP(1, 2, timestamps, []byte("ok")), 0))
	for _, program := range []string{loader.ProgTC, loader.ProgXDP} {
		t.Run(program, func(t *testing.T) {
			hop := h.load(t, loader.HopConfig{Program: program})
			run := func(frame []byte) []record.Record {
				if _, ok := runOnly(t, hop, frame); !ok {
					t.Fatalf("%s refused the frame %x", program, frame)
				}
				return h.drain(t)
			}
			if recs := run(tagged); len(recs) != 1 || recs[0].PacketID != 0x07000041 {
				t.Fatalf("the tagged segment gave %+v, want its ID 0x07000041 (counters %v)", recs, counters(t, hop))
			}
			if recs := run(untagged); len(recs) != 0 {
				t.Fatalf("the untagged segment gave %+v", recs)
			}
			cn := counters(t, hop)
			if cn[record.CMatched] != 2 || cn[record.CUntagged] != 1 || cn[record.CParseTruncated] != 0 {
				t.Errorf("counters %v, want 2 matched, 1 untagged, none truncated", cn)
			}
		})
	}
}

func TestParserRejectsMalformed(t *testing.T) {
	h := newHarness(t)
	good := udp4(0x07000001)
	bigTotLen := append([]byte(nil), good...)
	binary.BigEndian.PutUint16(bigTotLen[14+2:], uint16(len(good)-14+40))
	ihl4 := append([]byte(nil), good...)
	ihl4[14] = 0x44
	tcpBad := tu.Cat(tu.Ethernet(0x0800), tu.IPv4(6, src4, dst4, nil,
		tu.TCP(1, 2, []byte{1, 1, 2, 4, 5, 0xb4, 8, 30}, nil), 0)) // timestamp option claims 30 bytes
	// An IPv4 packet whose length says it ends 4 bytes into the UDP header.
	udpTrunc := tu.Cat(tu.Ethernet(0x0800), tu.IPv4(17, src4, dst4, nil, []byte{0x9c, 0x40, 0x13, 0x88}, 0))
	arp := tu.Cat(tu.Ethernet(0x0806), make([]byte, 28))

	cases := []struct {
		name    string
		pkt     []byte
		counter record.Counter
	}{
		{"tot_len beyond frame", bigTotLen, record.CParseTruncated},
		{"ihl below 5", ihl4, record.CParseMalformed},
		{"tcp option past header", tcpBad, record.CParseMalformed},
		{"truncated udp", udpTrunc, record.CParseTruncated},
		{"non-ip ethertype", arp, record.CParseNonIP},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			hop := h.load(t, loader.HopConfig{})
			_, recs := h.run(t, hop, c.pkt)
			if len(recs) != 0 {
				t.Fatalf("%d records for a malformed packet: %+v", len(recs), recs)
			}
			cn := counters(t, hop)
			if cn[c.counter] != 1 || cn[record.CSeen] != 1 || cn[record.CRecorded] != 0 {
				t.Errorf("counters %v, want counter %d = 1", cn, c.counter)
			}
		})
	}
}

func TestTagUDP(t *testing.T) {
	h := newHarness(t)
	hop := h.load(t, loader.HopConfig{TagUDP: true, IDOrigin: 9})
	u := tu.UDP(40000, 5000, []byte("payload!"))
	pkt := tu.Cat(tu.Ethernet(0x0800), tu.IPv4(17, src4, dst4, nil, u, 0))

	out, recs := h.run(t, hop, pkt)
	if len(out) != len(pkt)+4 {
		t.Fatalf("output %d bytes, want %d", len(out), len(pkt)+4)
	}
	ip := out[14:34]
	if tl := binary.BigEndian.Uint16(ip[2:]); int(tl) != len(pkt)-14+4 {
		t.Errorf("tot_len %d, want %d", tl, len(pkt)-14+4)
	}
	if tu.Checksum(ip) != 0 {
		t.Errorf("IPv4 header checksum invalid: %x", ip[10:12])
	}
	if ul := binary.BigEndian.Uint16(out[34+4:]); int(ul) != len(u) {
		t.Errorf("UDP length changed to %d", ul)
	}
	id := binary.BigEndian.Uint32(out[len(out)-4:])
	if id>>24 != 9 || id&0xffffff != 1 {
		t.Errorf("written ID %#x, want salt 9 seq 1", id)
	}
	if len(recs) != 1 || recs[0].PacketID != id || recs[0].Flags&record.FlagTaggedHere == 0 || recs[0].WireLen != uint32(len(out)) {
		t.Fatalf("records %+v, want one with ID %#x and TAGGED_HERE", recs, id)
	}

	// The tagged packet passes the same hop again: not re-tagged.
	out2, recs := h.run(t, hop, out)
	if len(out2) != len(out) || string(out2) != string(out) {
		t.Errorf("already-tagged packet was changed")
	}
	if len(recs) != 1 || recs[0].PacketID != id || recs[0].Flags&record.FlagTaggedHere != 0 {
		t.Errorf("records %+v, want the same ID without TAGGED_HERE", recs)
	}
	if cn := counters(t, hop); cn[record.CTagged] != 1 || cn[record.CRecorded] != 2 {
		t.Errorf("counters %v", cn)
	}

	// The header checksum is updated, not recomputed (RFC 1624): right for every length,
	// whatever carries the one's complement sum takes.
	for n := 0; n < 300; n += 7 {
		p := tu.Cat(tu.Ethernet(0x0800), tu.IPv4(17, src4, dst4, nil, tu.UDP(40000, 5000, make([]byte, n)), 0))
		out, _ := h.run(t, hop, p)
		if len(out) != len(p)+4 || tu.Checksum(out[14:34]) != 0 ||
			int(binary.BigEndian.Uint16(out[16:])) != len(p)-14+4 {
			t.Fatalf("payload %d: tagged header % x", n, out[14:34])
		}
	}

	// IPv6: payload_len grows by 4.
	p6 := tu.Cat(tu.Ethernet(0x86dd), tu.IPv6(17, src6, dst6, nil, u, 0))
	out6, recs := h.run(t, hop, p6)
	if len(out6) != len(p6)+4 || binary.BigEndian.Uint16(out6[14+4:]) != uint16(len(u)+4) {
		t.Errorf("IPv6 tag: %d bytes, payload_len %d", len(out6), binary.BigEndian.Uint16(out6[14+4:]))
	}
	if len(recs) != 1 || recs[0].Flags&(record.FlagTaggedHere|record.FlagIPv6) != record.FlagTaggedHere|record.FlagIPv6 {
		t.Errorf("IPv6 records %+v", recs)
	}
}

func TestSampleEvery(t *testing.T) {
	h := newHarness(t)
	const n, every = 12, 4
	hop := h.load(t, loader.HopConfig{TagUDP: true, SampleEvery: every})
	pkt := tu.Cat(tu.Ethernet(0x0800), tu.IPv4(17, src4, dst4, nil, tu.UDP(1, 2, []byte("s")), 0))
	tagged := 0
	for i := 0; i < n; i++ {
		out, recs := h.run(t, hop, pkt)
		if len(out) == len(pkt)+4 {
			tagged++
			if len(recs) != 1 {
				t.Fatalf("tagged packet gave %d records", len(recs))
			}
		} else if len(recs) != 0 {
			t.Fatalf("untagged packet recorded: %+v", recs)
		}
	}
	if tagged != n/every {
		t.Fatalf("%d of %d tagged, want %d", tagged, n, n/every)
	}
	if cn := counters(t, hop); cn[record.CTagged] != n/every || cn[record.CUntagged] != n-n/every {
		t.Errorf("counters %v", cn)
	}
}

func TestFilterSelectsPackets(t *testing.T) {
	h := newHarness(t)
	fc, err := loader.FilterFromMatch(&pb.FlowMatch{IpProto: 17, Family: 4, DstAddr: []byte{198, 18, 1, 0}, DstMask: []byte{255, 255, 255, 0}, DstPort: 5000})
	if err != nil {
		t.Fatal(err)
	}
	hop := h.load(t, loader.HopConfig{Filter: fc})
	mk := func(proto uint8, dst string, dport uint16, id uint32) []byte {
		if proto == 6 {
			return tu.Cat(tu.Ethernet(0x0800), tu.IPv4(6, src4, dst, nil, tu.TCP(1, dport, tu.TCPIDOption(id), nil), 0))
		}
		return tu.Cat(tu.Ethernet(0x0800), tu.IPv4(17, src4, dst, nil, tu.UDP(1, dport, []byte("f")), 4), tu.ID(id))
	}
	pkts := []struct {
		pkt   []byte
		match bool
	}{
		{mk(17, "198.18.1.7", 5000, 0x07000001), true},
		{mk(17, "198.18.2.7", 5000, 0x07000002), false}, // other subnet
		{mk(17, "198.18.1.9", 5001, 0x07000003), false}, // other port
		{mk(6, "198.18.1.7", 5000, 0x07000004), false},  // TCP
		{mk(17, "198.18.1.255", 5000, 0x07000005), true},
		{tu.Cat(tu.Ethernet(0x86dd), tu.IPv6(17, src6, dst6, nil, tu.UDP(1, 5000, []byte("x")), 4), tu.ID(0x07000006)), false},
	}
	var want []uint32
	var got []uint32
	for _, p := range pkts {
		_, recs := h.run(t, hop, p.pkt)
		for _, r := range recs {
			got = append(got, r.PacketID)
		}
		if p.match {
			want = append(want, binary.BigEndian.Uint32(p.pkt[len(p.pkt)-4:]))
		}
	}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("recorded %x, want %x", got, want)
	}
	if cn := counters(t, hop); cn[record.CNotMatched] != 4 || cn[record.CMatched] != 2 {
		t.Errorf("counters %v", cn)
	}

	// IPv6 source prefix.
	fc6, err := loader.FilterFromMatch(&pb.FlowMatch{Family: 6, SrcAddr: []byte{0xfd, 0x00}, SrcMask: []byte{0xff, 0xff}})
	if err != nil {
		t.Fatal(err)
	}
	hop6 := h.load(t, loader.HopConfig{Filter: fc6})
	p6 := func(src string, id uint32) []byte {
		return tu.Cat(tu.Ethernet(0x86dd), tu.IPv6(17, src, dst6, nil, tu.UDP(1, 2, []byte("x")), 4), tu.ID(id))
	}
	if _, recs := h.run(t, hop6, p6("fd00:5::1", 0x07000010)); len(recs) != 1 {
		t.Errorf("fd00:5::1 not matched by fd00::/16")
	}
	if _, recs := h.run(t, hop6, p6("fd01::1", 0x07000011)); len(recs) != 0 {
		t.Errorf("fd01::1 matched by fd00::/16")
	}
	if _, recs := h.run(t, hop6, udp4(0x07000012)); len(recs) != 0 {
		t.Errorf("IPv4 packet matched an IPv6 filter")
	}
}

// Every program of the object passes the verifier the way the agent loads it.
// TestEveryProgramLoads loads every program of every object the agent loads, each alone as the agent
// does, enumerated from the objects (nothing listed by hand). A program this kernel refuses fails the
// test unless the refusal is a known one whose condition is checked here: fentry under kernel lockdown
// (integrity or confidentiality forbid reading kernel memory with BPF).
// TestFloorVariantsHaveNoCalls keeps 5.10 loading: before 6.3 a BPF-to-BPF call
// stops the verifier's precision backtracking (every scalar is marked precise),
// nothing prunes, and 5.10 never finishes verifying an unrolled parser. MACE's
// programs parse with the floor code everywhere, so they are held to it too.
func TestFloorVariantsHaveNoCalls(t *testing.T) {
	objects := map[string]func(name string) bool{
		"hoptrace.bpf.o": func(name string) bool { return strings.HasSuffix(name, loader.FloorSuffix) },
		"mace.bpf.o":     func(string) bool { return true },
		"iron.bpf.o":     func(string) bool { return true },
	}
	checked := 0
	for object, held := range objects {
		spec, err := ebpf.LoadCollectionSpec(filepath.Join(filepath.Dir(tu.ObjectPath()), object))
		if err != nil {
			t.Fatal(err)
		}
		for name, ps := range spec.Programs {
			if !held(name) {
				continue
			}
			checked++
			for _, ins := range ps.Instructions {
				if ins.IsFunctionCall() || ins.IsLoadOfFunctionPointer() {
					t.Errorf("%s/%s calls or references a BPF function (%v): inline it", object, name, ins)
				}
			}
		}
	}
	if checked < 20 {
		t.Fatalf("only %d programs checked", checked)
	}
}

func TestEveryProgramLoads(t *testing.T) {
	h := newHarness(t)
	floor, why := loader.NeedsFloor()
	t.Logf("floor variants: %v %s", floor, why)
	for _, name := range sortedPrograms(h.spec) {
		if strings.HasSuffix(name, loader.FloorSuffix) {
			continue // loaded below in place of its program, where this kernel needs it
		}
		ps := h.spec.Programs[loader.ProgramFor(h.spec, name)]
		cfg := loader.HopConfig{Program: name, Ifindex: 1, NetnsIno: 1, TagNetnsCookie: 1}
		if ps.Type == ebpf.CGroupSKB {
			cfg.AttachType = ebpf.AttachCGroupInetEgress
		}
		if ps.Type == ebpf.Tracing {
			_, cfg.AttachTo, _ = strings.Cut(ps.SectionName, "/")
		}
		t.Run("hoptrace.bpf.o/"+ps.Name, func(t *testing.T) {
			cfg.Name = name
			hop, err := loader.LoadHop(h.spec, cfg, loader.Options{Records: h.records, IDState: h.idState, Cache: kernelBTF})
			if err == nil {
				defer hop.Close()
				// The variant this kernel runs, not the _floor fallback LoadHop takes when the
				// verifier gives up on the full one (E2BIG): that is a safety net, not a plan.
				if want := loader.ProgramFor(h.spec, name); hop.ProgramName != want {
					t.Fatalf("%s loaded as %s, want %s (the verifier refused the full variant)", name, hop.ProgramName, want)
				}
				t.Logf("loaded variant %s", hop.ProgramName)
				return
			}
			if why := knownRefusal(ps, err); why != "" {
				t.Logf("refused, as this kernel must: %s", why)
				return
			}
			t.Fatalf("%s does not load: %v", name, err)
		})
	}
	for _, object := range []string{"mace.bpf.o", "iron.bpf.o"} {
		spec, err := ebpf.LoadCollectionSpec(filepath.Join(filepath.Dir(tu.ObjectPath()), object))
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range sortedPrograms(spec) {
			t.Run(object+"/"+name, func(t *testing.T) {
				alone := spec.Copy()
				for other := range alone.Programs {
					if other != name {
						delete(alone.Programs, other)
					}
				}
				coll, err := ebpf.NewCollectionWithOptions(alone, ebpf.CollectionOptions{Cache: kernelBTF})
				if err != nil {
					if why := knownRefusal(spec.Programs[name], err); why != "" {
						t.Logf("refused, as this kernel must: %s", why)
						return
					}
					t.Fatalf("%s does not load: %v", name, err)
				}
				coll.Close()
			})
		}
	}
}

func sortedPrograms(spec *ebpf.CollectionSpec) []string {
	names := make([]string, 0, len(spec.Programs))
	for name := range spec.Programs {
		names = append(names, name)
	}
	sort.Strings(names)
	if len(names) == 0 {
		panic("an object without programs")
	}
	return names
}

// knownRefusal says why this kernel refuses ps with err, when that is expected and verified here; "" when
// the refusal is a failure.
func knownRefusal(ps *ebpf.ProgramSpec, err error) string {
	// skb:kfree_skb's reason argument (the drop_reason field) exists from 5.17; the agent reports the field
	// unavailable where it is missing, so the dispatcher never asks for this program there.
	if ps.Type == ebpf.Tracing && ps.AttachTo == "kfree_skb" {
		if missing := probe.KfreeSkbReasonMissing(); missing != "" {
			return missing
		}
	}
	fentry := ps.Type == ebpf.Tracing && (ps.AttachType == ebpf.AttachTraceFEntry || ps.AttachType == ebpf.AttachTraceFExit)
	if fentry && errors.Is(err, os.ErrPermission) {
		if lockdown := attach.LockdownReason(); strings.HasPrefix(lockdown, "kernel lockdown (") {
			return "fentry needs a kernel without lockdown; this one has " + lockdown
		}
	}
	// socket-read's UDP queue pair attaches to sock:sk_data_ready (6.6) and
	// sock:sock_recv_length (6.2); the agent uses it only where both exist
	// (attach.socketReadProgram) and hop_sock_read_udp elsewhere.
	if event, ok := strings.CutPrefix(ps.SectionName, "tp_btf/"); ok && !loader.HasTracepoint(event) {
		return "tracepoint " + event + " is newer than this kernel"
	}
	return ""
}

// A hop following origin 7 takes a packet the filter refuses when it carries an ID of origin 7 (its
// addresses were translated after it was tagged: DNAT, SNAT), flagged FOLLOWED; one of another origin,
// or without an ID, stays refused. UDP and TCP, IPv4 and IPv6, through tc's and XDP's fast paths.
func TestFollowedThroughTranslation(t *testing.T) {
	h := newHarness(t)
	// The filter names the Service address the client sends to; the packets carry the backend's.
	fc, err := loader.FilterFromMatch(&pb.FlowMatch{IpProto: 17, Family: 4, DstAddr: []byte{198, 18, 99, 9},
		DstMask: []byte{255, 255, 255, 255}, DstPort: 8080})
	if err != nil {
		t.Fatal(err)
	}
	fcTCP6, err := loader.FilterFromMatch(&pb.FlowMatch{IpProto: 6, Family: 6,
		DstAddr: []byte{0xfd, 0, 0, 0x99, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9}, DstMask: bytesOf(16, 0xff), DstPort: 8080})
	if err != nil {
		t.Fatal(err)
	}
	udp := func(dst string, dport uint16, id uint32) []byte {
		p := tu.Cat(tu.Ethernet(0x0800), tu.IPv4(17, src4, dst, nil, tu.UDP(40000, dport, []byte("svc")), 4), tu.ID(id))
		if id == 0 {
			p = tu.Cat(tu.Ethernet(0x0800), tu.IPv4(17, src4, dst, nil, tu.UDP(40000, dport, []byte("svc")), 0))
		}
		return p
	}
	tcp6 := func(dst string, dport uint16, id uint32) []byte {
		opts := []byte{1, 1, 8, 10, 0, 0, 0, 7, 0, 0, 0, 9}
		if id != 0 {
			opts = tu.Cat(opts, tu.TCPIDOption(id))
		}
		return tu.Cat(tu.Ethernet(0x86dd), tu.IPv6(6, src6, dst, nil, tu.TCP(40000, dport, opts, []byte("svc")), 0))
	}
	cases := []struct {
		name     string
		filter   loader.FilterConstants
		pkt      []byte
		followed bool
	}{
		{"udp dnat, the trace's origin", fc, udp("198.18.2.2", 11111, 0x07000001), true},
		{"udp dnat, another origin", fc, udp("198.18.2.2", 11111, 0x08000001), false},
		{"udp dnat, no ID", fc, udp("198.18.2.2", 11111, 0), false},
		{"tcp6 dnat, the trace's origin", fcTCP6, tcp6(dst6, 11111, 0x07000002), true},
		{"tcp6 dnat, another origin", fcTCP6, tcp6(dst6, 11111, 0x09000002), false},
		{"tcp6 dnat, no ID", fcTCP6, tcp6(dst6, 11111, 0), false},
	}
	for _, program := range []string{loader.ProgTC, loader.ProgXDP} {
		for _, c := range cases {
			t.Run(program+" "+c.name, func(t *testing.T) {
				hop := h.load(t, loader.HopConfig{Program: program, Filter: c.filter, FollowOrigin: 7})
				if _, ok := runOnly(t, hop, c.pkt); !ok {
					t.Fatalf("%s refused the frame", program)
				}
				recs := h.drain(t)
				cn := counters(t, hop)
				if !c.followed {
					if len(recs) != 0 || cn[record.CNotMatched] != 1 || cn[record.CMatched] != 0 {
						t.Fatalf("records %+v, counters %v: want none, the packet not matched", recs, cn)
					}
					return
				}
				if len(recs) != 1 || recs[0].Flags&record.FlagFollowed == 0 || recs[0].PacketID>>record.IDSeqBits != 7 {
					t.Fatalf("records %+v, counters %v: want one FOLLOWED record of origin 7", recs, cn)
				}
				if cn[record.CMatched] != 1 || cn[record.CRecorded] != 1 {
					t.Errorf("counters %v", cn)
				}
			})
		}
	}

	// Without following (follow_origin 0), the filter alone decides, as before.
	hop := h.load(t, loader.HopConfig{Filter: fc})
	if _, recs := h.run(t, hop, udp("198.18.2.2", 11111, 0x07000003)); len(recs) != 0 {
		t.Errorf("a hop without following took a translated packet: %+v", recs)
	}
	// A packet that matches the filter is never FOLLOWED.
	hop = h.load(t, loader.HopConfig{Filter: fc, FollowOrigin: 7})
	if _, recs := h.run(t, hop, udp("198.18.99.9", 8080, 0x07000004)); len(recs) != 1 || recs[0].Flags&record.FlagFollowed != 0 {
		t.Errorf("records %+v, want one record without FOLLOWED", recs)
	}
}

func bytesOf(n int, b byte) []byte { return slices.Repeat([]byte{b}, n) }
