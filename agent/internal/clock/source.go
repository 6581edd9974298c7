// Package clock aligns this node's timestamps with the collector's master
// clock. Records carry bpf_ktime_get_ns (CLOCK_MONOTONIC); the agent reports
// with every batch how they map to the node's wall clock
// (monotonic_to_realtime_ns) and how that wall clock differs from the master
// (offset_ns, bound_ns, drift_ppm), measured with Cristian's algorithm over
// NTP packets (vNetTracer, section III-C; RFC 5905 for the arithmetic).
package clock

import (
	"time"

	"golang.org/x/sys/unix"
)

// Source is the node's clock as the agent sees it: CLOCK_REALTIME, plus a
// simulated error for tests and demos on one machine (--clock-offset,
// --clock-drift-ppm). The error at monotonic time m is
//
//	skew(m) = Offset + DriftPPM·1e-6·(m − start)
//
// and is applied everywhere the agent reads the wall clock: the
// monotonic→realtime mapping sent with records and T1/T4 of the time
// exchange, so the collector sees one consistent, skewed host.
type Source struct {
	Offset   time.Duration
	DriftPPM float64
	startNs  int64 // CLOCK_MONOTONIC when the source was made
}

// NewSource returns a source whose simulated error starts at offset and
// grows by driftPPM from now on. NewSource(0, 0) is the plain host clock.
func NewSource(offset time.Duration, driftPPM float64) *Source {
	return &Source{Offset: offset, DriftPPM: driftPPM, startNs: Monotonic()}
}

// Simulated reports whether the source adds an error to the host clock.
func (s *Source) Simulated() bool { return s != nil && (s.Offset != 0 || s.DriftPPM != 0) }

// SkewAt is the simulated error (ns) at CLOCK_MONOTONIC time mono.
func (s *Source) SkewAt(mono int64) int64 {
	if s == nil {
		return 0
	}
	skew := int64(s.Offset)
	if s.DriftPPM != 0 {
		skew += int64(s.DriftPPM * 1e-6 * float64(mono-s.startNs))
	}
	return skew
}

// Now is the node's wall clock in ns since the epoch: CLOCK_REALTIME plus
// the simulated error. T1 and T4 of the time exchange are read here.
func (s *Source) Now() int64 {
	if !s.Simulated() {
		return Realtime()
	}
	if s.DriftPPM == 0 {
		return Realtime() + int64(s.Offset)
	}
	m := Monotonic()
	return Realtime() + s.SkewAt(m)
}

// At is the node's wall clock at a host CLOCK_REALTIME instant rt taken a
// moment ago (a kernel timestamp): rt plus the simulated error now.
func (s *Source) At(rt int64) int64 {
	if !s.Simulated() {
		return rt
	}
	return rt + s.SkewAt(Monotonic())
}

// Realtime is CLOCK_REALTIME in ns (the same clock Go's time.Now reads, but
// without the monotonic reading Go attaches).
func Realtime() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_REALTIME, &ts)
	return ts.Nano()
}

// Monotonic is CLOCK_MONOTONIC in ns, the clock of bpf_ktime_get_ns().
func Monotonic() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

// Pair is one reading of CLOCK_REALTIME − CLOCK_MONOTONIC (host clock, no
// simulated error).
type Pair struct {
	// MonotonicToRealtime = realtime − midpoint of the two monotonic reads.
	MonotonicToRealtime int64
	// Gap between the two monotonic reads: the uncertainty of the pair.
	Gap int64
	// Mono is the midpoint monotonic time of the pair.
	Mono int64
}

// SamplePair reads monotonic, realtime, monotonic `tries` times and keeps
// the tightest triple: a preemption between the reads widens the gap, so the
// smallest gap is the reading least disturbed.
func SamplePair(tries int) Pair {
	return samplePair(tries, func(id int32) int64 {
		var ts unix.Timespec
		_ = unix.ClockGettime(id, &ts)
		return ts.Nano()
	})
}

func samplePair(tries int, read func(int32) int64) Pair {
	if tries < 1 {
		tries = 1
	}
	best := Pair{Gap: -1}
	for range tries {
		m1 := read(unix.CLOCK_MONOTONIC)
		r := read(unix.CLOCK_REALTIME)
		m2 := read(unix.CLOCK_MONOTONIC)
		gap := m2 - m1
		if best.Gap < 0 || gap < best.Gap {
			mid := m1 + gap/2
			best = Pair{MonotonicToRealtime: r - mid, Gap: gap, Mono: mid}
		}
	}
	return best
}
