package clock

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// A small NTP codec (RFC 5905 section 7.3) for the client side of the
// collector's time service. github.com/beevik/ntp was the first choice, but
// it puts a random value in the request's transmit timestamp and rejects any
// reply whose origin timestamp is not that exact value; the collector's
// server (ntplib's codec) carries timestamps as Python floats, which keep
// only ~53 of the 64 bits, so the echo would never match. Here the request
// carries the real T1 and the echo is matched within originSlack.

// PacketSize is the NTP header without extensions or MAC.
const PacketSize = 48

// ntpEpochOffset is 1900-01-01 to 1970-01-01 in seconds (RFC 5905 figure 4).
const ntpEpochOffset = 2208988800

// NTP modes (RFC 5905 figure 10).
const (
	modeClient = 3
	modeServer = 4
)

// ToNTP encodes ns since the Unix epoch as a 64-bit NTP timestamp (32.32
// fixed point seconds since 1900). Times from 2036 on wrap into era 1.
func ToNTP(unixNs int64) uint64 {
	sec := unixNs / 1e9
	nsec := unixNs % 1e9
	if nsec < 0 {
		sec--
		nsec += 1e9
	}
	frac := (uint64(nsec)<<32 + 5e8) / 1e9 // rounded
	s := uint64(sec + ntpEpochOffset)
	if frac >= 1<<32 {
		frac -= 1 << 32
		s++
	}
	return s<<32 | frac
}

// FromNTP decodes a 64-bit NTP timestamp to ns since the Unix epoch. A
// seconds field with its top bit clear is taken as era 1 (2036-2104), as
// RFC 4330 section 3 suggests, so the codec keeps working past 2036.
func FromNTP(ts uint64) int64 {
	sec := int64(ts >> 32)
	if sec&(1<<31) == 0 {
		sec += 1 << 32
	}
	frac := ts & 0xffffffff
	nsec := int64((frac*1e9 + 1<<31) >> 32)
	return (sec-ntpEpochOffset)*1e9 + nsec
}

// Packet is the part of the NTP header the client uses.
type Packet struct {
	Leap, Version, Mode uint8
	Stratum             uint8
	Origin              uint64 // T1 as the client sent it, echoed by the server
	Receive             uint64 // T2: server's clock when the request arrived
	Transmit            uint64 // T3 (server) or T1 (client)
}

// Request encodes a client request (mode 3) carrying t1 as its transmit
// timestamp, as ntplib's client does.
func Request(t1UnixNs int64) []byte {
	b := make([]byte, PacketSize)
	b[0] = 0<<6 | 4<<3 | modeClient // LI 0, version 4
	binary.BigEndian.PutUint64(b[40:], ToNTP(t1UnixNs))
	return b
}

// Marshal encodes p (used by the test server).
func (p *Packet) Marshal() []byte {
	b := make([]byte, PacketSize)
	b[0] = p.Leap<<6 | p.Version<<3 | p.Mode
	b[1] = p.Stratum
	binary.BigEndian.PutUint64(b[24:], p.Origin)
	binary.BigEndian.PutUint64(b[32:], p.Receive)
	binary.BigEndian.PutUint64(b[40:], p.Transmit)
	return b
}

// ParsePacket decodes the header of b.
func ParsePacket(b []byte) (*Packet, error) {
	if len(b) < PacketSize {
		return nil, fmt.Errorf("ntp: short packet (%d bytes)", len(b))
	}
	return &Packet{
		Leap: b[0] >> 6, Version: b[0] >> 3 & 7, Mode: b[0] & 7, Stratum: b[1],
		Origin:   binary.BigEndian.Uint64(b[24:]),
		Receive:  binary.BigEndian.Uint64(b[32:]),
		Transmit: binary.BigEndian.Uint64(b[40:]),
	}, nil
}

// originSlack is how far the echoed origin may be from the T1 we sent:
// a float64 holds an NTP time of this era to ~0.5 µs; replies to older
// probes are at least a probe apart.
const originSlack = 4_000 // ns

var errStale = errors.New("ntp: reply to another request")

// parseReply checks that b answers the request sent at t1 and returns T2, T3.
// Stratum and leap are not checked: the collector is the reference by
// definition, whether or not it is itself synchronized (ntplib's packet
// defaults to stratum 0).
func parseReply(b []byte, t1 int64) (t2, t3 int64, err error) {
	p, err := ParsePacket(b)
	if err != nil {
		return 0, 0, err
	}
	if p.Mode != modeServer {
		return 0, 0, fmt.Errorf("ntp: reply mode %d, want %d", p.Mode, modeServer)
	}
	if p.Receive == 0 || p.Transmit == 0 {
		return 0, 0, errors.New("ntp: reply without receive/transmit timestamps")
	}
	if d := FromNTP(p.Origin) - t1; d > originSlack || d < -originSlack {
		return 0, 0, errStale
	}
	return FromNTP(p.Receive), FromNTP(p.Transmit), nil
}
