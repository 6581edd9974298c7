package loader_test

import (
	"encoding/binary"
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"

	"github.com/hoptrace/hoptrace/agent/internal/loader"
	"github.com/hoptrace/hoptrace/agent/internal/record"
	tu "github.com/hoptrace/hoptrace/agent/internal/testutil"
)

// The field catalogue's header and sk_buff fields through BPF_PROG_TEST_RUN: each hop counts crafted
// packets by one field, and every key must equal what the crafted packets carry, packet for packet.

// headerValues are what a crafted packet carries in the fields the parser keeps.
type headerValues struct {
	tos, ttl, tcpFlags uint8
	ipID, window       uint16
	seq, ack           uint32
}

const ethLen = 14

// tcp4With is an Ethernet + IPv4 + TCP frame carrying v.
func tcp4With(v headerValues) []byte {
	pkt := tu.Cat(tu.Ethernet(0x0800), tu.IPv4(6, src4, dst4, nil, tu.TCP(40000, 5000, nil, []byte("payload")), 0))
	ip := pkt[ethLen:]
	ip[1] = v.tos
	binary.BigEndian.PutUint16(ip[4:], v.ipID)
	ip[8] = v.ttl
	binary.BigEndian.PutUint16(ip[10:], 0)
	binary.BigEndian.PutUint16(ip[10:], tu.Checksum(ip[:20]))
	tcp := ip[20:]
	binary.BigEndian.PutUint32(tcp[4:], v.seq)
	binary.BigEndian.PutUint32(tcp[8:], v.ack)
	tcp[13] = v.tcpFlags
	binary.BigEndian.PutUint16(tcp[14:], v.window)
	return pkt
}

// udp6With is an Ethernet + IPv6 + UDP frame with traffic class tos and hop limit ttl (RFC 8200: the
// traffic class is the 8 bits after the version).
func udp6With(tos, ttl uint8) []byte {
	pkt := tu.Cat(tu.Ethernet(0x86dd), tu.IPv6(17, src6, dst6, nil, tu.UDP(40000, 5000, []byte("v6")), 0))
	ip := pkt[ethLen:]
	ip[0] = 0x60 | tos>>4
	ip[1] = tos<<4 | ip[1]&0x0f
	ip[7] = ttl
	return pkt
}

// countBy loads a tc hop counting by field and returns its counts after running every packet.
func countBy(t *testing.T, h *harness, field record.ActionField, pkts [][]byte, ctxs []*skbCtxFull) map[uint64]uint64 {
	t.Helper()
	hop := h.load(t, loader.HopConfig{Actions: loader.Actions{Count: true, CountBy: field}})
	for i, pkt := range pkts {
		var ctx *skbCtxFull
		if ctxs != nil {
			ctx = ctxs[i]
		}
		h.runFull(t, hop, pkt, ctx)
	}
	if cn := counters(t, hop); cn[record.CMatched] != uint64(len(pkts)) {
		t.Fatalf("%s: matched %d of %d crafted packets (counters %v)", record.FieldKeys[field],
			cn[record.CMatched], len(pkts), cn)
	}
	return actions(t, hop).Counts
}

func wantCounts(t *testing.T, field record.ActionField, got, want map[uint64]uint64) {
	t.Helper()
	t.Logf("count by %s: %v", record.FieldKeys[field], got)
	if len(got) != len(want) {
		t.Errorf("count by %s: %v, want %v", record.FieldKeys[field], got, want)
		return
	}
	for k, n := range want {
		if got[k] != n {
			t.Errorf("count by %s: key %d counted %d, want %d (all: %v)", record.FieldKeys[field], k, got[k], n, got)
		}
	}
}

func TestFieldsFromIPAndTCPHeaders(t *testing.T) {
	h := newHarness(t)
	sent := []headerValues{
		{tos: 0xb8, ttl: 64, ipID: 0x1234, tcpFlags: 0x02, window: 64240, seq: 0xfffffff0},          // EF DSCP, SYN
		{tos: 0xb8, ttl: 63, ipID: 0x1235, tcpFlags: 0x12, window: 65160, seq: 7, ack: 0xfffffff1},  // SYN ACK
		{tos: 0x00, ttl: 64, ipID: 0x1236, tcpFlags: 0x10, window: 502, seq: 0xfffffff1, ack: 8},    // ACK
		{tos: 0x01, ttl: 1, ipID: 0xffff, tcpFlags: 0x18, window: 502, seq: 0xfffffff1, ack: 8},     // ECT(1), PSH ACK
		{tos: 0x00, ttl: 255, ipID: 0, tcpFlags: 0x11, window: 0, seq: 0x01020304, ack: 0x0a0b0c0d}, // FIN ACK, zero window
	}
	pkts := make([][]byte, len(sent))
	for i, v := range sent {
		pkts[i] = tcp4With(v)
	}
	fields := map[record.ActionField]func(headerValues) uint64{
		record.FieldTOS:       func(v headerValues) uint64 { return uint64(v.tos) },
		record.FieldTTL:       func(v headerValues) uint64 { return uint64(v.ttl) },
		record.FieldIPID:      func(v headerValues) uint64 { return uint64(v.ipID) },
		record.FieldTCPFlags:  func(v headerValues) uint64 { return uint64(v.tcpFlags) },
		record.FieldTCPWindow: func(v headerValues) uint64 { return uint64(v.window) },
		record.FieldTCPSeq:    func(v headerValues) uint64 { return uint64(v.seq) },
		record.FieldTCPAck:    func(v headerValues) uint64 { return uint64(v.ack) },
	}
	for field, of := range fields {
		want := map[uint64]uint64{}
		for _, v := range sent {
			want[of(v)]++
		}
		wantCounts(t, field, countBy(t, h, field, pkts, nil), want)
	}

	// IPv6: traffic class and hop limit; a UDP packet has no TCP flags (key 0).
	v6 := [][]byte{udp6With(0x28, 64), udp6With(0x28, 3), udp6With(0xff, 64)}
	wantCounts(t, record.FieldTOS, countBy(t, h, record.FieldTOS, v6, nil), map[uint64]uint64{0x28: 2, 0xff: 1})
	wantCounts(t, record.FieldTTL, countBy(t, h, record.FieldTTL, v6, nil), map[uint64]uint64{64: 2, 3: 1})
	wantCounts(t, record.FieldTCPFlags, countBy(t, h, record.FieldTCPFlags, v6, nil), map[uint64]uint64{0: 3})

	// A VXLAN packet: the fields are the innermost packet's, as the flow is.
	inner := tcp4With(headerValues{tos: 0x48, ttl: 17, ipID: 77, tcpFlags: 0x04, window: 9, seq: 5, ack: 6})
	outer := tu.Cat(tu.Ethernet(0x0800), tu.IPv4(17, "198.18.9.1", "198.18.9.2", nil,
		tu.UDP(50000, 4789, tu.VXLAN(42, inner)), 0))
	for field, want := range map[record.ActionField]uint64{
		record.FieldTOS: 0x48, record.FieldTTL: 17, record.FieldIPID: 77, record.FieldTCPFlags: 0x04, record.FieldTCPWindow: 9,
		record.FieldTCPSeq: 5, record.FieldTCPAck: 6,
	} {
		wantCounts(t, field, countBy(t, h, field, [][]byte{outer}, nil), map[uint64]uint64{want: 1})
	}
}

// skbCtxFull is struct __sk_buff up to gso_size (UAPI layout: offsets in the comments), for the fields
// BPF_PROG_TEST_RUN lets a test set (convert___skb_to_skb in net/bpf/test_run.c).
type skbCtxFull struct {
	Len, PktType, Mark, QueueMapping, Protocol uint32 // 0..20
	VlanPresent, VlanTCI, VlanProto, Priority  uint32 // 20..36
	IngressIfindex, Ifindex, TCIndex           uint32 // 36..48
	CB                                         [5]uint32
	Hash, TCClassid, Data, DataEnd, NapiID     uint32 // 68..88
	Family, RemoteIP4, LocalIP4                uint32 // 88..100
	RemoteIP6, LocalIP6                        [4]uint32
	RemotePort, LocalPort, DataMeta            uint32 // 132..144
	FlowKeys, Tstamp                           uint64 // 144..160
	WireLen, GSOSegs                           uint32 // 160..168
	Sk                                         uint64 // 168..176
	GSOSize                                    uint32 // 176..180
	Pad                                        uint32 // 8-byte aligned size
}

func (h *harness) runFull(t testing.TB, hop *loader.Hop, pkt []byte, ctx *skbCtxFull) {
	t.Helper()
	if ctx == nil {
		h.runCtx(t, hop, pkt, nil)
		return
	}
	h.runCtxAny(t, hop, pkt, *ctx)
}

func TestFieldsFromSkb(t *testing.T) {
	h := newHarness(t)
	// GSO: the segment count and size an offloaded packet carries (skb_shinfo), as BPF_PROG_TEST_RUN sets them.
	gso := []skbCtxFull{{GSOSegs: 4, GSOSize: 1448}, {GSOSegs: 4, GSOSize: 1448}, {GSOSegs: 2, GSOSize: 1200}, {}}
	pkts := make([][]byte, len(gso))
	ctxs := make([]*skbCtxFull, len(gso))
	for i := range gso {
		pkts[i], ctxs[i] = udp4(0), &gso[i]
	}
	wantCounts(t, record.FieldGSOSegs, countBy(t, h, record.FieldGSOSegs, pkts, ctxs), map[uint64]uint64{4: 2, 2: 1, 0: 1})
	wantCounts(t, record.FieldGSOSize, countBy(t, h, record.FieldGSOSize, pkts, ctxs), map[uint64]uint64{1448: 2, 1200: 1, 0: 1})

	// netns: BPF_PROG_TEST_RUN runs the packet on this network namespace's loopback.
	var st syscall.Stat_t
	if err := syscall.Stat("/proc/self/ns/net", &st); err != nil {
		t.Fatal(err)
	}
	three := [][]byte{udp4(0), udp4(0), tcp4With(headerValues{ttl: 9})}
	wantCounts(t, record.FieldNetns, countBy(t, h, record.FieldNetns, three, nil), map[uint64]uint64{st.Ino: 3})
	if st.Ino == 0 {
		t.Fatal("netns inode 0")
	}
}

// rawSamples drains the ring buffer's samples as they are (record, then values with FlagValues).
func (h *harness) rawSamples(t testing.TB) [][]byte {
	t.Helper()
	var out [][]byte
	var rr ringbuf.Record
	h.rd.SetDeadline(time.Now())
	for {
		err := h.rd.ReadInto(&rr)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, append([]byte(nil), rr.RawSample...))
	}
}

// record: [len, ttl, mark] carries each traced packet's own values with its record; a hop without the
// action emits the 32-byte record alone.
func TestRecordActionCarriesValues(t *testing.T) {
	h := newHarness(t)
	fields := [record.ValuesMax]record.ActionField{record.FieldLen, record.FieldTTL, record.FieldMark}
	hop := h.load(t, loader.HopConfig{Actions: loader.Actions{Record: fields}})
	type sent struct {
		len      int
		ttl      uint8
		mark, id uint32
	}
	var want []sent
	for i, payload := range []int{1, 100, 1000, 37} {
		u := tu.UDP(40000, 5000, make([]byte, payload))
		pkt := tu.Cat(tu.Ethernet(0x0800), tu.IPv4(17, src4, dst4, nil, u, 4), tu.ID(0))
		want = append(want, sent{len(pkt), uint8(10 + i), uint32(0x100 * (i + 1)), uint32(0x07000202 + i)})
	}
	h.runCtxAny(t, hop, udp4(0), skbCtxFull{}) // untagged: counted, no record, no values
	if recs := h.rawSamples(t); len(recs) != 0 {
		t.Fatalf("an untagged packet left %d samples", len(recs))
	}
	samples := [][]byte{}
	for i, payload := range []int{1, 100, 1000, 37} {
		id := uint32(0x07000202 + i)
		u := tu.UDP(40000, 5000, make([]byte, payload))
		pkt := tu.Cat(tu.Ethernet(0x0800), tu.IPv4(17, src4, dst4, nil, u, 4), tu.ID(id))
		pkt[ethLen+8] = want[i].ttl
		opts := &ebpf.RunOptions{Data: pkt, DataOut: make([]byte, len(pkt)+256), Context: skbCtxFull{Mark: want[i].mark}}
		if _, err := hop.Program.Run(opts); err != nil {
			t.Fatal(err)
		}
		samples = append(samples, h.rawSamples(t)...)
	}
	if len(samples) != len(want) {
		t.Fatalf("%d samples, want %d (one per traced packet)", len(samples), len(want))
	}
	for i, raw := range samples {
		var r record.Record
		if err := record.Decode(raw, &r); err != nil {
			t.Fatal(err)
		}
		if !record.HasValues(raw) || len(raw) != record.Size+record.ValuesSize {
			t.Fatalf("sample %d: %d bytes, flags %#x: want a record with values", i, len(raw), r.Flags)
		}
		v, err := record.DecodeValues(raw[record.Size:])
		if err != nil {
			t.Fatal(err)
		}
		got := []uint64{uint64(want[i].len), uint64(want[i].ttl), uint64(want[i].mark)}
		if r.PacketID != want[i].id || len(v.Fields) != 3 || v.Fields[0] != record.FieldLen ||
			v.Fields[1] != record.FieldTTL || v.Fields[2] != record.FieldMark {
			t.Fatalf("sample %d: id %#x fields %v", i, r.PacketID, v.Fields)
		}
		for j := range got {
			if v.Values[j] != got[j] {
				t.Errorf("packet %#x: %s = %d, want %d", r.PacketID, record.FieldKeys[v.Fields[j]], v.Values[j], got[j])
			}
		}
		if uint64(r.WireLen) != got[0] {
			t.Errorf("record wire_len %d, recorded len %d", r.WireLen, got[0])
		}
	}

	plain := h.load(t, loader.HopConfig{})
	h.run(t, plain, udp4(0x07000300)) // drains: use a fresh run for the raw sample
	opts := &ebpf.RunOptions{Data: udp4(0x07000302), DataOut: make([]byte, 512)}
	if _, err := plain.Program.Run(opts); err != nil {
		t.Fatal(err)
	}
	raw := h.rawSamples(t)
	if len(raw) != 1 || len(raw[0]) != record.Size || record.HasValues(raw[0]) {
		t.Fatalf("a hop without record: samples %d, first %d bytes; want one %d-byte record", len(raw), len(raw[0]), record.Size)
	}
}

// Every new field's code in the floor variants (the ones 5.10 up to 5.17 run: no bpf_cast_to_kern_ctx, CO-RE
// probe reads from the ctx) passes this kernel's verifier, with count, histogram and record all reading, and
// the capture action beside them.
// Not in the kernel matrix: it loads the full variants and pid/drop_reason too, which older kernels refuse
// by design (their agents report those fields unavailable).
func TestFloorVariantsLoadWithEveryField(t *testing.T) {
	h := newHarness(t)
	skbFields := [record.ValuesMax]record.ActionField{record.FieldNetns, record.FieldQueueMapping, record.FieldGSOSegs, record.FieldGSOSize}
	headers := [record.ValuesMax]record.ActionField{record.FieldTOS, record.FieldTTL, record.FieldIPID, record.FieldTCPWindow}
	for _, c := range []struct {
		program string
		actions loader.Actions
	}{
		{loader.ProgTC, loader.Actions{Count: true, CountBy: record.FieldCgroup, Histogram: record.FieldTCPFlags, Record: skbFields, Capture: 128}},
		{loader.ProgTC, loader.Actions{Count: true, CountBy: record.FieldMark, Histogram: record.FieldPriority, Record: headers}},
		{loader.ProgCgroupSKB, loader.Actions{Count: true, CountBy: record.FieldPID, Histogram: record.FieldCgroup, Record: skbFields, Capture: 128}},
		{loader.ProgTPBTF, loader.Actions{Count: true, CountBy: record.FieldNetns, Histogram: record.FieldGSOSize, Record: skbFields, Capture: 128}},
		{loader.ProgTPBTFKfree, loader.Actions{Count: true, CountBy: record.FieldDropReason, Record: headers, Capture: 128}},
		{loader.ProgXDP, loader.Actions{Count: true, CountBy: record.FieldTTL, Histogram: record.FieldLen, Record: headers, Capture: 128}},
		{loader.ProgKretprobe, loader.Actions{Count: true, CountBy: record.FieldMark, Record: skbFields, Capture: 128}},
	} {
		for _, program := range []string{c.program, c.program + loader.FloorSuffix} {
			cfg := loader.HopConfig{Program: program, Name: program, IDOrigin: 7, TraceSlot: 3, Actions: c.actions}
			ps := h.spec.Programs[program]
			if ps.Type == ebpf.CGroupSKB {
				cfg.AttachType = ebpf.AttachCGroupInetEgress
			}
			if ps.Type == ebpf.Tracing {
				_, cfg.AttachTo, _ = strings.Cut(ps.SectionName, "/")
			}
			hop, err := loader.LoadHop(h.spec, cfg, loader.Options{Records: h.records, IDState: h.idState, Cache: kernelBTF})
			if err != nil {
				t.Errorf("%s with %+v: %v", program, c.actions, err)
				continue
			}
			// The variant asked for is the one loaded (cilium/ebpf names it in full from BTF), or its
			// floor twin where the kernel (or HOPTRACE_FLOOR=1) needs it.
			want := program
			if floor, _ := loader.NeedsFloor(); floor {
				want = strings.TrimSuffix(program, loader.FloorSuffix) + loader.FloorSuffix
			}
			if info, err := hop.Program.Info(); err != nil || info.Name != want {
				t.Errorf("loaded %q for %s, want %q (%v)", info.Name, program, want, err)
			}
			hop.Close()
		}
	}
}
