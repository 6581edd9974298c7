package clock

import (
	"testing"
	"time"
)

func TestNTPTimestampRoundTrip(t *testing.T) {
	for _, ns := range []int64{
		0, 1, 999_999_999, 1_700_000_000_123_456_789, Realtime(),
		// 2036-02-07T06:28:16Z is the end of era 0; after it the seconds wrap.
		(1<<32-ntpEpochOffset)*1e9 + 5, (1<<32-ntpEpochOffset)*1e9 - 5,
	} {
		got := FromNTP(ToNTP(ns))
		if d := got - ns; d > 1 || d < -1 {
			t.Errorf("%d -> %#x -> %d (off by %d ns)", ns, ToNTP(ns), got, d)
		}
	}
	// RFC 5905 figure 4: the Unix epoch is NTP second 2208988800.
	if got := ToNTP(0) >> 32; got != 2208988800 {
		t.Errorf("NTP seconds of the Unix epoch = %d", got)
	}
	// Half a second is 0x80000000 in the fraction.
	if got := ToNTP(5e8) & 0xffffffff; got != 0x80000000 {
		t.Errorf("fraction of 0.5 s = %#x", got)
	}
}

func TestParseReplyChecksModeAndOrigin(t *testing.T) {
	t1 := Realtime()
	req, err := ParsePacket(Request(t1))
	if err != nil || req.Mode != modeClient || req.Version != 4 || FromNTP(req.Transmit) != t1 {
		t.Fatalf("request %+v %v", req, err)
	}
	reply := Packet{Version: 4, Mode: modeServer, Origin: req.Transmit, Receive: ToNTP(t1 + 10), Transmit: ToNTP(t1 + 20)}
	t2, t3, err := parseReply(reply.Marshal(), t1)
	if err != nil || t2 != t1+10 || t3 != t1+20 {
		t.Fatalf("reply: %d %d %v", t2-t1, t3-t1, err)
	}
	// ntplib echoes the origin through a float64: a few hundred ns off.
	reply.Origin = ToNTP(t1 + 400)
	if _, _, err := parseReply(reply.Marshal(), t1); err != nil {
		t.Errorf("origin echoed through a float: %v", err)
	}
	reply.Origin = ToNTP(t1 - int64(time.Millisecond))
	if _, _, err := parseReply(reply.Marshal(), t1); err != errStale {
		t.Errorf("reply to another probe: %v", err)
	}
	reply.Origin, reply.Mode = req.Transmit, modeClient
	if _, _, err := parseReply(reply.Marshal(), t1); err == nil {
		t.Error("mode 3 reply accepted")
	}
	if _, _, err := parseReply(make([]byte, 20), t1); err == nil {
		t.Error("short reply accepted")
	}
}

func TestSampleArithmetic(t *testing.T) {
	// Node 5 µs ahead of the master, 10 µs each way, server holds 3 µs.
	const ahead, oneWay, hold = 5000, 10000, 3000
	master := int64(1_000_000_000)
	s := Sample{T1: master + ahead}
	s.T2 = master + oneWay
	s.T3 = s.T2 + hold
	s.T4 = s.T3 + oneWay + ahead
	if s.Delay() != 2*oneWay || s.Offset() != ahead || s.Bound() != oneWay {
		t.Fatalf("delay %d offset %d bound %d", s.Delay(), s.Offset(), s.Bound())
	}
	m, err := Best([]Sample{{T1: 0, T2: 50000, T3: 50000, T4: 200000}, s})
	if err != nil || m.OffsetNs != ahead || m.DelayNs != 2*oneWay || m.SampledAt != s.T1+(s.T4-s.T1)/2 {
		t.Fatalf("best %+v %v", m, err)
	}
}
