package loader

import (
	"fmt"
	"hash/fnv"
	"net/netip"
	"strings"

	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
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

// FilterFromPlan translates a trace's Filter into load-time constants.
// Addresses and masks are kept as network-order bytes (IPv4 in the first 4);
// the family comes from the addresses, and src and dst must agree.
func FilterFromPlan(f *pb.Filter) (FilterConstants, error) {
	var c FilterConstants
	if f == nil {
		return c, nil
	}
	switch strings.ToLower(strings.TrimSpace(f.GetProtocol())) {
	case "", "any":
	case "tcp":
		c.Proto = 6
	case "udp":
		c.Proto = 17
	default:
		return c, fmt.Errorf("filter protocol %q: want tcp, udp or empty", f.GetProtocol())
	}
	for _, p := range []struct {
		name string
		v    uint32
		out  *uint16
	}{{"src_port", f.GetSrcPort(), &c.Sport}, {"dst_port", f.GetDstPort(), &c.Dport}} {
		if p.v > 65535 {
			return c, fmt.Errorf("filter %s %d: out of range", p.name, p.v)
		}
		*p.out = uint16(p.v)
	}
	var fams []uint8
	for _, a := range []struct {
		name       string
		s          string
		addr, mask *[16]byte
	}{{"src", f.GetSrc(), &c.Src, &c.SrcMask}, {"dst", f.GetDst(), &c.Dst, &c.DstMask}} {
		if strings.TrimSpace(a.s) == "" {
			continue
		}
		fam, err := parsePrefix(a.s, a.addr, a.mask)
		if err != nil {
			return c, fmt.Errorf("filter %s: %w", a.name, err)
		}
		fams = append(fams, fam)
	}
	if len(fams) == 2 && fams[0] != fams[1] {
		return c, fmt.Errorf("filter src is IPv%d but dst is IPv%d", fams[0], fams[1])
	}
	if len(fams) > 0 {
		c.Family = fams[0]
	}
	return c, nil
}

// parsePrefix parses "ADDR" or "ADDR/BITS" into network-order address and
// mask bytes; the address is masked so the BPF side can compare (pkt & mask) == addr.
func parsePrefix(s string, addr, mask *[16]byte) (uint8, error) {
	s = strings.TrimSpace(s)
	var p netip.Prefix
	var err error
	if strings.Contains(s, "/") {
		p, err = netip.ParsePrefix(s)
	} else {
		var a netip.Addr
		a, err = netip.ParseAddr(s)
		if err == nil {
			p = netip.PrefixFrom(a, a.BitLen())
		}
	}
	if err != nil {
		return 0, fmt.Errorf("%q is not an address or CIDR: %w", s, err)
	}
	a := p.Addr()
	if a.Zone() != "" {
		return 0, fmt.Errorf("%q: zones are not supported", s)
	}
	// "::ffff:198.18.0.1" is an IPv4 packet on the wire.
	if a.Is4In6() {
		bits := p.Bits() - 96
		if bits < 0 {
			return 0, fmt.Errorf("%q: IPv4-mapped prefix shorter than /96", s)
		}
		p = netip.PrefixFrom(a.Unmap(), bits)
		a = p.Addr()
	}
	p = p.Masked()
	raw := p.Addr().AsSlice()
	copy(addr[:], raw)
	for i := 0; i < p.Bits(); i++ {
		mask[i/8] |= 0x80 >> (i % 8)
	}
	if a.Is4() {
		return 4, nil
	}
	return 6, nil
}

// NodeSalt maps a node name into 1..255 with FNV-1a (32 bit): the top 8
// bits of the IDs this node writes, so IDs of different origins differ.
func NodeSalt(node string) uint8 {
	h := fnv.New32a()
	h.Write([]byte(node))
	return uint8(h.Sum32()%255) + 1
}
