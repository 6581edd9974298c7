package testutil

import (
	"encoding/binary"
	"net/netip"
)

// Ethernet builds a header; tpids are VLAN tags in order (0x8100 or 0x88a8),
// each followed by VID 100+i, before the final ethertype.
func Ethernet(ethertype uint16, tpids ...uint16) []byte {
	b := []byte{0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1}
	for i, tp := range tpids {
		b = binary.BigEndian.AppendUint16(b, tp)
		b = binary.BigEndian.AppendUint16(b, uint16(100+i))
	}
	return binary.BigEndian.AppendUint16(b, ethertype)
}

// Checksum is the Internet checksum (RFC 1071).
func Checksum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}

// IPv4 builds a header (with options, padded to 4 bytes) followed by
// payload; tot_len covers header + payload + extra (the caller appends the
// extra bytes, e.g. a UDP surplus ID).
func IPv4(proto uint8, src, dst string, opts []byte, payload []byte, extra int) []byte {
	for len(opts)%4 != 0 {
		opts = append(opts, 0)
	}
	hl := 20 + len(opts)
	h := make([]byte, hl)
	h[0] = 0x40 | byte(hl/4)
	binary.BigEndian.PutUint16(h[2:], uint16(hl+len(payload)+extra))
	binary.BigEndian.PutUint16(h[4:], 0x1234)
	h[8] = 64
	h[9] = proto
	s, d := netip.MustParseAddr(src).As4(), netip.MustParseAddr(dst).As4()
	copy(h[12:], s[:])
	copy(h[16:], d[:])
	copy(h[20:], opts)
	binary.BigEndian.PutUint16(h[10:], Checksum(h))
	return append(h, payload...)
}

// Ext is an IPv6 extension header: its next-header value is filled in.
type Ext struct {
	Type uint8 // 0 hop-by-hop, 43 routing, 60 destination options
	Len  int   // total bytes, a multiple of 8
}

// IPv6 builds a header, extension headers, then payload (proto is the
// payload's protocol); payload_len covers exts + payload + extra.
func IPv6(proto uint8, src, dst string, exts []Ext, payload []byte, extra int) []byte {
	var eb []byte
	for i, e := range exts {
		next := proto
		if i+1 < len(exts) {
			next = exts[i+1].Type
		}
		x := make([]byte, e.Len)
		x[0] = next
		x[1] = byte(e.Len/8 - 1)
		if e.Type == 43 {
			x[2] = 4 // routing type (any; segments left 0)
		} else {
			x[2], x[3] = 1, byte(e.Len-4) // PadN filling the rest
		}
		eb = append(eb, x...)
	}
	first := proto
	if len(exts) > 0 {
		first = exts[0].Type
	}
	h := make([]byte, 40)
	h[0] = 0x60
	binary.BigEndian.PutUint16(h[4:], uint16(len(eb)+len(payload)+extra))
	h[6] = first
	h[7] = 64
	s, d := netip.MustParseAddr(src).As16(), netip.MustParseAddr(dst).As16()
	copy(h[8:], s[:])
	copy(h[24:], d[:])
	h = append(h, eb...)
	return append(h, payload...)
}

// UDP builds a header and payload; the length covers only those.
func UDP(sport, dport uint16, payload []byte) []byte {
	b := make([]byte, 8, 8+len(payload))
	binary.BigEndian.PutUint16(b[0:], sport)
	binary.BigEndian.PutUint16(b[2:], dport)
	binary.BigEndian.PutUint16(b[4:], uint16(8+len(payload)))
	return append(b, payload...)
}

// TCP builds a header with opts (padded with NOPs... then EOL to 4 bytes) and payload.
func TCP(sport, dport uint16, opts []byte, payload []byte) []byte {
	for len(opts)%4 != 0 {
		opts = append(opts, 0)
	}
	b := make([]byte, 20, 20+len(opts)+len(payload))
	binary.BigEndian.PutUint16(b[0:], sport)
	binary.BigEndian.PutUint16(b[2:], dport)
	b[12] = byte((20+len(opts))/4) << 4
	b[13] = 0x18 // PSH ACK
	binary.BigEndian.PutUint16(b[14:], 65535)
	b = append(b, opts...)
	return append(b, payload...)
}

// TCPIDOption is RFC 6994 option 253, len 8, ExID 0x4854, then the ID.
func TCPIDOption(id uint32) []byte {
	return binary.BigEndian.AppendUint32([]byte{253, 8, 0x48, 0x54}, id)
}

// ID is a packet ID as the 4 surplus bytes of a UDP packet.
func ID(id uint32) []byte { return binary.BigEndian.AppendUint32(nil, id) }

// VXLAN wraps an inner Ethernet frame in a VXLAN header (RFC 7348).
func VXLAN(vni uint32, inner []byte) []byte {
	h := []byte{0x08, 0, 0, 0, byte(vni >> 16), byte(vni >> 8), byte(vni), 0}
	return append(h, inner...)
}

// Geneve wraps an inner Ethernet frame (protocol 0x6558) with opts (a
// multiple of 4 bytes) in a Geneve header (RFC 8926).
func Geneve(vni uint32, opts []byte, inner []byte) []byte {
	h := []byte{byte(len(opts) / 4), 0, 0x65, 0x58, byte(vni >> 16), byte(vni >> 8), byte(vni), 0}
	h = append(h, opts...)
	return append(h, inner...)
}

// Cat concatenates byte slices.
func Cat(parts ...[]byte) []byte {
	var b []byte
	for _, p := range parts {
		b = append(b, p...)
	}
	return b
}
