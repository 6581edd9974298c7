package clock

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"testing"
	"time"

	"go.uber.org/goleak"
)

type ntpServer struct{ addr string }

// startNTPServer runs a Server whose clock is CLOCK_REALTIME + skew.
func startNTPServer(t *testing.T, skew time.Duration) *ntpServer {
	t.Helper()
	s, err := StartServer("127.0.0.1:0", skew)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return &ntpServer{addr: s.Addr()}
}

func within(t *testing.T, what string, got, want, tol int64) {
	t.Helper()
	if d := got - want; d > tol || d < -tol {
		t.Errorf("%s = %d ns, want %d ± %d (off by %d)", what, got, want, tol, d)
	}
}

// The Cristian estimate finds an injected skew of either side, within a
// few µs on loopback.
func TestCristianFindsInjectedSkew(t *testing.T) {
	for _, tc := range []struct {
		name         string
		node, master time.Duration
	}{
		{"node ahead (simulated --clock-offset)", 3700 * time.Microsecond, 0},
		{"node behind", -2500 * time.Microsecond, 0},
		{"master ahead", 0, 1200 * time.Microsecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := startNTPServer(t, tc.master)
			m, err := Measure(context.Background(), srv.addr, 100, time.Second, NewSource(tc.node, 0), nil)
			if err != nil {
				t.Fatal(err)
			}
			want := int64(tc.node - tc.master) // node − master
			t.Logf("offset %d ns (want %d), bound %d ns, delay %d ns, %d/%d probes",
				m.OffsetNs, want, m.BoundNs, m.DelayNs, m.Probes, m.Sent)
			if m.Probes < 90 || m.BoundNs <= 0 {
				t.Errorf("probes %d bound %d", m.Probes, m.BoundNs)
			}
			// The bound holds by construction; on loopback it is a few µs.
			within(t, "offset", m.OffsetNs, want, max(m.BoundNs, 10_000))
		})
	}
}

// Error of the estimate on this machine: the node and the master share
// CLOCK_REALTIME, so everything but the injected offset is error.
// HOPTRACE_CLOCK_SERVER=HOST:PORT measures against a running collector's
// time service instead of the in-process server.
func TestCristianLoopbackError(t *testing.T) {
	addr := os.Getenv("HOPTRACE_CLOCK_SERVER")
	if addr == "" {
		addr = startNTPServer(t, 0).addr
	}
	const inject = 3700 * time.Microsecond
	src := NewSource(inject, 0)
	var errs []float64
	for range 20 {
		m, err := Measure(context.Background(), addr, 100, time.Second, src, nil)
		if err != nil {
			t.Fatal(err)
		}
		errs = append(errs, math.Abs(float64(m.OffsetNs-int64(inject))))
		if len(errs) == 1 {
			t.Logf("first round: offset error %d ns, bound %d ns, delay %d ns", m.OffsetNs-int64(inject), m.BoundNs, m.DelayNs)
		}
	}
	sort.Float64s(errs)
	t.Logf("server %s, 20 rounds x 100 probes: |offset error| median %.0f ns, max %.0f ns", addr, errs[len(errs)/2], errs[len(errs)-1])
	if errs[len(errs)/2] > 10_000 {
		t.Errorf("median offset error %.0f ns over the 10 µs target", errs[len(errs)/2])
	}
}

// The drift fit recovers an injected drift over simulated rounds.
func TestDriftFitRecoversInjectedPPM(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, ppm := range []float64{0, 25, -40.5, 500} {
		n := NewNode(Config{Server: "unused", FitRounds: 10})
		start := int64(1_800_000_000) * 1e9
		const off0 = 3_700_000
		for i := range 30 {
			at := start + int64(i)*10e9 + rng.Int64N(1e6) // every ~10 s
			noise := rng.Int64N(4000) - 2000              // ±2 µs of estimation error
			off := off0 + int64(ppm*1e-6*float64(at-start)) + noise
			n.Record(Measurement{OffsetNs: off, BoundNs: 3000, DelayNs: 6000, SampledAt: at}, nil)
		}
		st := n.Stats()
		if !st.DriftValid || math.Abs(st.DriftPPM-ppm) > 0.1 {
			t.Errorf("injected %.1f ppm: fitted %.3f (valid %v)", ppm, st.DriftPPM, st.DriftValid)
		}
		c := n.NodeClock(0)
		if c.GetDriftPpm() != st.DriftPPM || c.GetSampledAtNs() != st.Last.SampledAt || c.GetOffsetNs() != st.Last.OffsetNs {
			t.Errorf("NodeClock %v vs stats %+v", c, st)
		}
	}
	// One round, or rounds too close together: no drift.
	n := NewNode(Config{Server: "unused"})
	n.Record(Measurement{OffsetNs: 5, SampledAt: 1e18}, nil)
	n.Record(Measurement{OffsetNs: 900, SampledAt: 1e18 + 1e6}, nil)
	if st := n.Stats(); st.DriftValid {
		t.Errorf("drift from 1 ms of history: %+v", st)
	}
	// A failed round keeps the previous estimate.
	n.Record(Measurement{}, errors.New("down"))
	if st := n.Stats(); st.RoundFailures != 1 || st.Last.OffsetNs != 900 {
		t.Errorf("after a failure: %+v", st)
	}
}

// A step of the clock restarts the fit instead of bending it.
func TestDriftFitRestartsAfterStep(t *testing.T) {
	n := NewNode(Config{Server: "unused"})
	start := int64(1_800_000_000) * 1e9
	for i := range 5 {
		n.Record(Measurement{OffsetNs: int64(10 * i * 10000), BoundNs: 2000, SampledAt: start + int64(i)*10e9}, nil)
	}
	if st := n.Stats(); math.Abs(st.DriftPPM-10) > 0.01 {
		t.Fatalf("drift %v", st.DriftPPM)
	}
	n.Record(Measurement{OffsetNs: 50e6, BoundNs: 2000, SampledAt: start + 50e9}, nil) // stepped by 50 ms
	if st := n.Stats(); st.DriftValid {
		t.Errorf("fit kept across a step: %+v", st)
	}
}

// Live rounds against a node whose clock drifts (--clock-drift-ppm): the
// fit sees it.
func TestDriftLiveRounds(t *testing.T) {
	srv := startNTPServer(t, 0)
	const ppm = 2000
	n := NewNode(Config{Server: srv.addr, Probes: 50, Source: NewSource(time.Millisecond, ppm)})
	for i := range 5 {
		if i > 0 {
			time.Sleep(250 * time.Millisecond)
		}
		if _, err := n.Round(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	st := n.Stats()
	t.Logf("injected %d ppm, fitted %.2f ppm over 1 s", ppm, st.DriftPPM)
	if !st.DriftValid || math.Abs(st.DriftPPM-ppm) > 50 {
		t.Errorf("fitted %.2f ppm, want %d ± 50", st.DriftPPM, ppm)
	}
}

func TestSamplePairKeepsTightest(t *testing.T) {
	// Reads: mono, real, mono per try. Try 1 is preempted (gap 900),
	// try 2 is tight (gap 40).
	reads := []int64{1000, 5_000_000, 1900, 3000, 5_002_020, 3040}
	i := 0
	p := samplePair(2, func(int32) int64 { v := reads[i]; i++; return v })
	if p.Gap != 40 || p.Mono != 3020 || p.MonotonicToRealtime != 5_002_020-3020 {
		t.Fatalf("pair %+v", p)
	}
	// The host's own pair: realtime − monotonic, read tightly.
	h := SamplePair(5)
	want := Realtime() - Monotonic()
	if h.Gap < 0 || h.Gap > int64(time.Millisecond) || math.Abs(float64(h.MonotonicToRealtime-want)) > 1e6 {
		t.Fatalf("host pair %+v, want m2r ~%d", h, want)
	}
}

// The simulation flags skew the mapping and the exchange's clock alike.
func TestSimulatedSourceSkewsMappingAndNow(t *testing.T) {
	src := NewSource(3700*time.Microsecond, 100)
	n := NewNode(Config{Source: src})
	mono := Monotonic()
	later := mono + 10e9 // 10 s on: +1 ms from 100 ppm
	if got := src.SkewAt(later) - src.SkewAt(mono); got != 1_000_000 {
		t.Errorf("skew grew by %d ns in 10 s at 100 ppm", got)
	}
	host := SamplePair(5).MonotonicToRealtime
	within(t, "skewed mapping", n.MonotonicToRealtime(mono), host+src.SkewAt(mono), 100_000)
	// The mapped wall clock of a record taken now ≈ the skewed Now().
	within(t, "mapped record vs Source.Now", mono+n.MonotonicToRealtime(mono), src.Now(), 200_000)
	within(t, "Source.Now vs host realtime", src.Now()-Realtime(), int64(3700*time.Microsecond), 200_000)
	if c := n.NodeClock(later); c.GetMonotonicToRealtimeNs() != n.MonotonicToRealtime(later) || c.GetSampledAtNs() != 0 {
		t.Errorf("NodeClock before any round %v", c)
	}
	if NewSource(0, 0).Simulated() || !src.Simulated() {
		t.Error("Simulated()")
	}
}

// Run does its first round at once and stops with ctx.
func TestRunFirstRoundAndStop(t *testing.T) {
	srv := startNTPServer(t, 0)
	n := NewNode(Config{Server: srv.addr, Probes: 20, MapEvery: 10 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { n.Run(ctx); close(done) }()
	if !n.WaitFirst(ctx, 5*time.Second) {
		t.Fatal("no estimate after the first round")
	}
	if c := n.NodeClock(0); c.GetSampledAtNs() == 0 || c.GetBoundNs() <= 0 {
		t.Errorf("clock %v", c)
	}
	cancel()
	<-done

	// No server: WaitFirst returns at once with no estimate; the round fails.
	dead := NewNode(Config{Server: "127.0.0.1:1", Probes: 5, Timeout: 50 * time.Millisecond})
	if _, err := dead.Round(context.Background()); err == nil {
		t.Error("round against a closed port succeeded")
	}
	if dead.WaitFirst(context.Background(), time.Second) || dead.Stats().RoundFailures != 1 {
		t.Errorf("dead server: %+v", dead.Stats())
	}
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Whenever every round's offset is within its bound, the fitted drift is
// within Fit.ErrPPM of the true one: also in the worst case, offsets pushed
// to their bounds against the slope.
func TestDriftErrorBoundHolds(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	start := int64(1_800_000_000) * 1e9
	for trial := range 400 {
		truePPM := rng.Float64()*100 - 50
		var pts []Point
		for i := range 2 + trial%9 {
			at := start + int64(i)*1e9 + rng.Int64N(1e8)
			bound := 20 + rng.Int64N(500)
			noise := rng.Int64N(2*bound+1) - bound
			if trial%2 == 0 { // the worst case: early rounds high, late ones low
				noise = bound
				if i > 4 {
					noise = -bound
				}
			}
			trueOffset := int64(math.Round(truePPM * 1e-6 * float64(at-start)))
			pts = append(pts, Point{At: at, Offset: trueOffset + noise, Bound: bound})
		}
		fit, ok := FitDrift(pts, 5e8)
		if !ok {
			t.Fatalf("trial %d: no fit over %d points", trial, len(pts))
		}
		// Rounding the true offsets to ns moves each by 0.5 ns more, at
		// most 0.5/20 of the smallest bound.
		if d := math.Abs(fit.PPM - truePPM); d > fit.ErrPPM*(1+0.5/20) {
			t.Errorf("trial %d: fitted %.4f ppm, true %.4f: off by %.4f, bound %.4f", trial, fit.PPM, truePPM, d, fit.ErrPPM)
		}
	}
}

// The bound sent with records adds the drift's error over their distance
// from the round: two rounds 1 s apart within 100 ns leave the slope within
// 0.2 ppm, so records 10 s later carry 100 + 2000 ns.
func TestNodeClockBoundGrowsWithAge(t *testing.T) {
	n := NewNode(Config{Server: "unused"})
	start := int64(1_800_000_000) * 1e9
	n.Record(Measurement{OffsetNs: 0, BoundNs: 100, SampledAt: start}, nil)
	n.Record(Measurement{OffsetNs: 0, BoundNs: 100, SampledAt: start + 1e9}, nil)
	if st := n.Stats(); !st.DriftValid || math.Abs(st.DriftErrPPM-0.2) > 1e-9 {
		t.Fatalf("stats %+v", st)
	}
	m2r := n.MonotonicToRealtime(0)
	for _, tc := range []struct{ age, bound int64 }{{0, 100}, {10e9, 2100}, {-10e9, 2100}} {
		if got := n.NodeClock(start + 1e9 + tc.age - m2r).GetBoundNs(); got != tc.bound {
			t.Errorf("%d ns after the round: bound %d, want %d", tc.age, got, tc.bound)
		}
	}
}

func TestRoundsSpreadOutToTheInterval(t *testing.T) {
	var gaps []time.Duration
	for done := 1; done <= 8; done++ {
		gaps = append(gaps, nextRound(done, 10*time.Second))
	}
	want := []time.Duration{time.Second, time.Second, time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 10 * time.Second, 10 * time.Second}
	if !slices.Equal(gaps, want) {
		t.Errorf("gaps %v, want %v", gaps, want)
	}
	if g := nextRound(1, 500*time.Millisecond); g != 500*time.Millisecond {
		t.Errorf("a short interval is kept: %v", g)
	}
}

// A step of the wall clock after a round (the host's CLOCK_REALTIME −
// CLOCK_MONOTONIC moved) moves the reported offset and its sample time by
// as much; the mapping's own reading noise does not.
func TestStepAfterRoundIsCarriedOver(t *testing.T) {
	n := NewNode(Config{Server: "unused"})
	n.Record(Measurement{OffsetNs: 1000, BoundNs: 50, SampledAt: 1_800_000_000e9}, nil)
	if c := n.NodeClock(0); c.GetOffsetNs() != 1000 || c.GetSampledAtNs() != 1_800_000_000e9 {
		t.Fatalf("no step: %v", c)
	}
	const step = 50_000_000 // settimeofday 50 ms ahead
	n.m2r.Add(step)
	c := n.NodeClock(0)
	if c.GetOffsetNs() != 1000+step || c.GetSampledAtNs() != 1_800_000_000e9+step {
		t.Errorf("after a 50 ms step: offset %d sampled_at %d", c.GetOffsetNs(), c.GetSampledAtNs())
	}
	// The next round measures the stepped clock: nothing to carry over.
	n.Record(Measurement{OffsetNs: 1000 + step, BoundNs: 50, SampledAt: 1_800_000_010e9 + step}, nil)
	n.m2r.Add(stepFoldNs / 2) // within a reading's noise (and a real host's m2r is the same again)
	if c := n.NodeClock(0); c.GetOffsetNs() != 1000+step {
		t.Errorf("after the next round: %v", c)
	}
}
