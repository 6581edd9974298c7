// Package record mirrors the kernel/user shapes of kernel-patch/include/hoptrace.h:
// struct hoptrace_record (one timestamp of one packet at one hop) and
// enum hoptrace_counter (per-hop counters). TestRecordLayoutMatchesBTF keeps
// the two sides equal by comparing them with the object's BTF.
package record

import (
	"encoding/binary"
	"fmt"
)

// Size is sizeof(struct hoptrace_record): 32 bytes, no padding.
const Size = 32

// Record is struct hoptrace_record, decoded from its little-endian bytes.
type Record struct {
	TsNs      uint64 // bpf_ktime_get_ns(): CLOCK_MONOTONIC of the node
	PacketID  uint32 // never 0 in a record
	FlowHash  uint32 // hash of the innermost 5-tuple
	Ifindex   uint32 // device the packet was seen on (its own netns)
	WireLen   uint32 // skb/frame length at this hop
	HopIndex  uint16
	TraceSlot uint16
	CPU       uint16
	Flags     uint16
}

// Field describes one member of struct hoptrace_record as the Go side reads it.
type Field struct {
	Name   string // C member name
	Offset uint32 // bytes
	Size   uint32 // bytes
}

// Fields is the layout Decode relies on, in C declaration order.
var Fields = []Field{
	{"ts_ns", 0, 8},
	{"packet_id", 8, 4},
	{"flow_hash", 12, 4},
	{"ifindex", 16, 4},
	{"wire_len", 20, 4},
	{"hop_index", 24, 2},
	{"trace_slot", 26, 2},
	{"cpu", 28, 2},
	{"flags", 30, 2},
}

// Decode fills r from one ring buffer sample without allocating.
func Decode(b []byte, r *Record) error {
	if len(b) < Size {
		return fmt.Errorf("record: %d bytes, want %d", len(b), Size)
	}
	le := binary.LittleEndian
	r.TsNs = le.Uint64(b[0:])
	r.PacketID = le.Uint32(b[8:])
	r.FlowHash = le.Uint32(b[12:])
	r.Ifindex = le.Uint32(b[16:])
	r.WireLen = le.Uint32(b[20:])
	r.HopIndex = le.Uint16(b[24:])
	r.TraceSlot = le.Uint16(b[26:])
	r.CPU = le.Uint16(b[28:])
	r.Flags = le.Uint16(b[30:])
	return nil
}

// Encode writes r into b (len >= Size); the inverse of Decode, for tests and tools.
func Encode(b []byte, r *Record) {
	le := binary.LittleEndian
	le.PutUint64(b[0:], r.TsNs)
	le.PutUint32(b[8:], r.PacketID)
	le.PutUint32(b[12:], r.FlowHash)
	le.PutUint32(b[16:], r.Ifindex)
	le.PutUint32(b[20:], r.WireLen)
	le.PutUint16(b[24:], r.HopIndex)
	le.PutUint16(b[26:], r.TraceSlot)
	le.PutUint16(b[28:], r.CPU)
	le.PutUint16(b[30:], r.Flags)
}

// TraceSlot reads only the trace_slot of a raw record, for routing.
func TraceSlot(b []byte) uint16 { return binary.LittleEndian.Uint16(b[26:]) }

// HopIndex reads only the hop_index of a raw record.
func HopIndex(b []byte) uint16 { return binary.LittleEndian.Uint16(b[24:]) }

// Flags: enum hoptrace_record_flag.
const (
	FlagIPv6        = 1 << 0
	FlagTCP         = 1 << 1
	FlagUDP         = 1 << 2
	FlagEncapVXLAN  = 1 << 3
	FlagEncapGeneve = 1 << 4
	FlagTaggedHere  = 1 << 5
	FlagVLAN        = 1 << 6
)

// FlagNames maps enum hoptrace_record_flag member names to their values.
var FlagNames = map[string]uint16{
	"HOPTRACE_F_IPV6":         FlagIPv6,
	"HOPTRACE_F_TCP":          FlagTCP,
	"HOPTRACE_F_UDP":          FlagUDP,
	"HOPTRACE_F_ENCAP_VXLAN":  FlagEncapVXLAN,
	"HOPTRACE_F_ENCAP_GENEVE": FlagEncapGeneve,
	"HOPTRACE_F_TAGGED_HERE":  FlagTaggedHere,
	"HOPTRACE_F_VLAN":         FlagVLAN,
}

// Counter is enum hoptrace_counter: the index into a hop's percpu counters map.
type Counter uint32

const (
	CSeen Counter = iota
	CMatched
	CRecorded
	CTagged
	CUntagged
	CTooBig
	CGSOSkipped
	CNotMatched
	CParseTruncated
	CParseMalformed
	CParseNonIP
	CRingbufFull
	CBytes
	CTagFailed
	CMax
)

// CounterNames maps enum hoptrace_counter member names to their values.
var CounterNames = map[string]Counter{
	"HOPTRACE_C_SEEN":            CSeen,
	"HOPTRACE_C_MATCHED":         CMatched,
	"HOPTRACE_C_RECORDED":        CRecorded,
	"HOPTRACE_C_TAGGED":          CTagged,
	"HOPTRACE_C_UNTAGGED":        CUntagged,
	"HOPTRACE_C_TOO_BIG":         CTooBig,
	"HOPTRACE_C_GSO_SKIPPED":     CGSOSkipped,
	"HOPTRACE_C_NOT_MATCHED":     CNotMatched,
	"HOPTRACE_C_PARSE_TRUNCATED": CParseTruncated,
	"HOPTRACE_C_PARSE_MALFORMED": CParseMalformed,
	"HOPTRACE_C_PARSE_NON_IP":    CParseNonIP,
	"HOPTRACE_C_RINGBUF_FULL":    CRingbufFull,
	"HOPTRACE_C_BYTES":           CBytes,
	"HOPTRACE_C_TAG_FAILED":      CTagFailed,
	"HOPTRACE_C_MAX":             CMax,
}

// Counters holds one hop's counters summed over CPUs, indexed by Counter.
type Counters [CMax]uint64
