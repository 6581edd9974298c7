package loader

import (
	"fmt"
	"hash/fnv"

	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
	"github.com/hoptrace/hoptrace/agent/internal/record"
)

// FilterConstants are the filter_* const volatile variables of docs/design.md.
type FilterConstants struct {
	Proto   uint8 // 0 any, 6 TCP, 17 UDP
	Family  uint8 // 0 any, 4, 6
	Src     [16]byte
	SrcMask [16]byte
	Dst     [16]byte
	DstMask [16]byte
	Sport   uint16 // host order
	Dport   uint16
}

// FilterFromMatch copies a plan's FlowMatch, which the dispatcher parsed and
// validated from the user's Filter, into load-time constants. It only checks
// that the values fit: the agent never parses the user's strings.
func FilterFromMatch(m *pb.FlowMatch) (FilterConstants, error) {
	var c FilterConstants
	if m == nil {
		return c, nil
	}
	switch m.GetIpProto() {
	case 0, 6, 17:
		c.Proto = uint8(m.GetIpProto())
	default:
		return c, fmt.Errorf("match ip_proto %d: want 0, 6 or 17", m.GetIpProto())
	}
	switch m.GetFamily() {
	case 0, 4, 6:
		c.Family = uint8(m.GetFamily())
	default:
		return c, fmt.Errorf("match family %d: want 0, 4 or 6", m.GetFamily())
	}
	for _, p := range []struct {
		name string
		v    uint32
		out  *uint16
	}{{"src_port", m.GetSrcPort(), &c.Sport}, {"dst_port", m.GetDstPort(), &c.Dport}} {
		if p.v > 65535 {
			return c, fmt.Errorf("match %s %d: out of range", p.name, p.v)
		}
		*p.out = uint16(p.v)
	}
	for _, b := range []struct {
		name string
		in   []byte
		out  *[16]byte
	}{{"src_addr", m.GetSrcAddr(), &c.Src}, {"src_mask", m.GetSrcMask(), &c.SrcMask},
		{"dst_addr", m.GetDstAddr(), &c.Dst}, {"dst_mask", m.GetDstMask(), &c.DstMask}} {
		if len(b.in) > len(b.out) {
			return c, fmt.Errorf("match %s: %d bytes, at most 16", b.name, len(b.in))
		}
		copy(b.out[:], b.in)
	}
	return c, nil
}

// NodeOrigin maps a node name into the origins above the dispatcher's
// (HOPTRACE_TRACE_ORIGINS+1..255) with FNV-1a (32 bit): the top 8 bits of the
// IDs of presets and standalone plans on this node, which no hop following an
// applied trace's IDs takes for its own.
func NodeOrigin(node string) uint8 {
	h := fnv.New32a()
	h.Write([]byte(node))
	spread := uint32(255 - record.TraceOrigins)
	return uint8(h.Sum32()%spread) + record.TraceOrigins + 1
}
