package clock

import "math"

// Point is one round's offset at the node wall time it was measured.
type Point struct {
	At     int64 // node wall clock, ns since the epoch
	Offset int64 // node − master, ns
	Bound  int64 // the round's error bound of Offset, ns
}

// Fit is a drift fitted over rounds.
type Fit struct {
	PPM float64 // the slope: ns of offset per ms of node time
	// ErrPPM bounds |PPM − true drift| when every point's offset is within
	// its Bound: the least-squares slope is Σ wᵢ·offsetᵢ, so its error is at
	// most Σ |wᵢ|·Boundᵢ. A time t after the last round adds at most
	// ErrPPM·1e-6·t to the extrapolated offset's error.
	ErrPPM float64
}

// FitDrift fits offset = a + b·(t − t_last) by least squares over points.
// ok is false with fewer than two points or when they span less than
// minSpan ns (the slope would be all noise).
func FitDrift(points []Point, minSpan int64) (fit Fit, ok bool) {
	n := len(points)
	if n < 2 {
		return Fit{}, false
	}
	ref := points[n-1].At
	if ref-points[0].At < minSpan {
		return Fit{}, false
	}
	// Centred sums keep the float arithmetic well conditioned: t in
	// seconds relative to the last point, offsets in ns.
	var sx, sy float64
	for _, p := range points {
		sx += float64(p.At-ref) / 1e9
		sy += float64(p.Offset)
	}
	mx, my := sx/float64(n), sy/float64(n)
	var sxx, sxy, spread float64
	for _, p := range points {
		dx := float64(p.At-ref)/1e9 - mx
		sxx += dx * dx
		sxy += dx * (float64(p.Offset) - my)
		spread += math.Abs(dx) * float64(p.Bound)
	}
	if sxx == 0 || math.IsNaN(sxy) {
		return Fit{}, false
	}
	slope := sxy / sxx // ns per s = ppb
	return Fit{PPM: slope / 1e3, ErrPPM: spread / sxx / 1e3}, true
}
