package clock

import "math"

// Point is one round's offset at the node wall time it was measured.
type Point struct {
	At     int64 // node wall clock, ns since the epoch
	Offset int64 // node − master, ns
}

// FitDrift fits offset = a + b·(t − t_last) by least squares over points
// and returns the slope b in ppm (ns of offset per ms of node time) and the
// fitted offset at the last point. ok is false with fewer than two points or
// when they span less than minSpan ns (the slope would be all noise).
func FitDrift(points []Point, minSpan int64) (ppm float64, offsetAtLast float64, ok bool) {
	n := len(points)
	if n < 2 {
		return 0, 0, false
	}
	ref := points[n-1].At
	if ref-points[0].At < minSpan {
		return 0, 0, false
	}
	// Centred sums keep the float arithmetic well conditioned: t in
	// seconds relative to the last point, offsets in ns.
	var sx, sy float64
	for _, p := range points {
		sx += float64(p.At-ref) / 1e9
		sy += float64(p.Offset)
	}
	mx, my := sx/float64(n), sy/float64(n)
	var sxx, sxy float64
	for _, p := range points {
		dx := float64(p.At-ref)/1e9 - mx
		sxx += dx * dx
		sxy += dx * (float64(p.Offset) - my)
	}
	if sxx == 0 || math.IsNaN(sxy) {
		return 0, 0, false
	}
	slope := sxy / sxx // ns per s = ppb
	return slope / 1e3, my - slope*mx, true
}
