package clock

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"math"
	"sync"
	"sync/atomic"
	"time"

	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
)

// Config of a Node's clock synchronization.
type Config struct {
	// Server is the collector's time service (host:port); "" = no Cristian
	// rounds, only the monotonic→realtime mapping.
	Server   string
	Interval time.Duration // between rounds (default 10 s)
	Probes   int           // per round (default 100)
	Timeout  time.Duration // per probe (default 500 ms)
	// FitRounds is how many recent rounds the drift fit uses (default 10).
	FitRounds int
	// MapEvery refreshes the monotonic→realtime mapping (default 1 s): NTP
	// steps CLOCK_REALTIME, never CLOCK_MONOTONIC.
	MapEvery time.Duration
	Source   *Source
	// Keys, when set, authenticate every round (auth.go): a round runs only
	// with a current key, and takes only the server's authentic answers;
	// without one the clock stays unknown (or keeps its last authentic
	// estimate), never falling back to plain NTP. nil = plain NTP.
	Keys *Keyring
	Log  *slog.Logger
}

// Stats are the clock's counters for /metrics.
type Stats struct {
	Rounds, RoundFailures uint64
	Last                  Measurement
	DriftPPM              float64
	DriftErrPPM           float64 // the drift's error bound (Fit.ErrPPM)
	DriftValid            bool
	MapGapNs              int64
	// Authenticated: rounds need a key (Config.Keys); KeyValid: one is
	// current; Refused: replies refused, by reason (Refused* constants).
	Authenticated, KeyValid bool
	Refused                 map[string]uint64
}

// Node is this node's clock as reported to the collector.
type Node struct {
	cfg Config

	m2r    atomic.Int64 // host CLOCK_REALTIME − CLOCK_MONOTONIC, no simulated error
	mapGap atomic.Int64

	mu       sync.Mutex
	est      *Measurement
	estM2R   int64 // host m2r when est was taken: a step of CLOCK_REALTIME since moves est with it
	drift    float64
	driftErr float64 // ppm: Fit.ErrPPM of drift
	driftOK  bool
	history  []Point
	rounds   uint64
	failures uint64
	refused  map[string]uint64
	first    chan struct{}
	once     sync.Once
}

// warmupRounds run one second apart after the first, so drift is known
// early; then the gaps double up to Interval. The drift's error bound
// shrinks as the rounds span longer, while the time it is extrapolated over
// (up to the next round) grows no faster, so what it adds to the bound
// stays near a round's own bound instead of jumping tenfold at the first
// 10 s gap.
const warmupRounds = 3

// nextRound is the gap after the done-th round.
func nextRound(done int, interval time.Duration) time.Duration {
	gap := time.Second
	if done > warmupRounds {
		gap <<= min(done-warmupRounds, 30)
	}
	return min(gap, interval)
}

// NewNode samples the mapping once; Run keeps it and the offset fresh.
func NewNode(cfg Config) *Node {
	if cfg.Interval <= 0 {
		cfg.Interval = 10 * time.Second
	}
	if cfg.Probes <= 0 {
		cfg.Probes = 100
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 500 * time.Millisecond
	}
	if cfg.FitRounds < 2 {
		cfg.FitRounds = 10
	}
	if cfg.MapEvery <= 0 {
		cfg.MapEvery = time.Second
	}
	if cfg.Source == nil {
		cfg.Source = NewSource(0, 0)
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	n := &Node{cfg: cfg, first: make(chan struct{}), refused: map[string]uint64{}}
	n.refreshMapping()
	return n
}

// Source is the node clock this Node reads.
func (n *Node) Source() *Source { return n.cfg.Source }

func (n *Node) refreshMapping() {
	p := SamplePair(5)
	n.m2r.Store(p.MonotonicToRealtime)
	n.mapGap.Store(p.Gap)
}

// MonotonicToRealtime maps CLOCK_MONOTONIC time mono to the node's wall
// clock: wall = mono + MonotonicToRealtime(mono). With a simulated clock the
// error at mono is included, so records are skewed like the T1/T4 of the
// exchange.
func (n *Node) MonotonicToRealtime(mono int64) int64 {
	return n.m2r.Load() + n.cfg.Source.SkewAt(mono)
}

// NodeClock is the clock to send with a batch whose records were taken
// around CLOCK_MONOTONIC time mono (0 = now).
func (n *Node) NodeClock(mono int64) *pb.NodeClock {
	if mono == 0 {
		mono = Monotonic()
	}
	c := &pb.NodeClock{MonotonicToRealtimeNs: n.MonotonicToRealtime(mono)}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.est != nil {
		c.OffsetNs = n.est.OffsetNs
		c.BoundNs = n.est.BoundNs
		c.DelayNs = n.est.DelayNs
		c.SampledAtNs = n.est.SampledAt
		// CLOCK_REALTIME − CLOCK_MONOTONIC changes only when the wall clock
		// is stepped (settimeofday, an NTP step, a leap second; slewing moves
		// both clocks alike). A step since the round moved the node's offset
		// and the round's wall time by as much: carry them over, so records
		// after a step are mapped right before the next round, and the
		// collector sees the step in the mapping and the offset alike.
		if step := n.m2r.Load() - n.estM2R; step > stepFoldNs || step < -stepFoldNs {
			c.OffsetNs += step
			c.SampledAtNs += step
		}
		if n.driftOK {
			c.DriftPpm = n.drift
			// The collector extrapolates the offset with the drift from
			// the round to these records; the fit's error grows with that.
			age := mono + c.MonotonicToRealtimeNs - n.est.SampledAt
			c.BoundNs += int64(math.Ceil(n.driftErr * 1e-6 * math.Abs(float64(age))))
		}
	}
	return c
}

// Stats returns the counters and the last estimate.
func (n *Node) Stats() Stats {
	n.mu.Lock()
	defer n.mu.Unlock()
	s := Stats{Rounds: n.rounds, RoundFailures: n.failures, DriftPPM: n.drift, DriftErrPPM: n.driftErr, DriftValid: n.driftOK,
		MapGapNs: n.mapGap.Load(), Authenticated: n.cfg.Keys != nil, Refused: maps.Clone(n.refused)}
	if n.cfg.Keys != nil {
		_, s.KeyValid = n.cfg.Keys.Current()
	}
	if n.est != nil {
		s.Last = *n.est
	}
	return s
}

// WaitFirst waits until the first round ended (or failed), ctx ends, or
// max passes; it reports whether an estimate is there.
func (n *Node) WaitFirst(ctx context.Context, max time.Duration) bool {
	t := time.NewTimer(max)
	defer t.Stop()
	select {
	case <-n.first:
	case <-ctx.Done():
	case <-t.C:
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.est != nil
}

// Round runs one Cristian round and records its result.
func (n *Node) Round(ctx context.Context) (Measurement, error) {
	auth, err := n.auth(ctx)
	if err != nil {
		n.Record(Measurement{}, err)
		return Measurement{}, err
	}
	m, err := Measure(ctx, n.cfg.Server, n.cfg.Probes, n.cfg.Timeout, n.cfg.Source, auth)
	if err != nil && auth != nil {
		// No authentic answer at all: the collector may hold another key
		// now (restarted, or rotated past ours) and drops our requests.
		n.cfg.Keys.AskRefresh()
	}
	n.Record(m, err)
	return m, err
}

// keyWait is how long a round waits for a first key (the collector's
// answer over gRPC) before it fails.
const keyWait = 3 * time.Second

// errNoKey: authenticated rounds without a current key do not run.
var errNoKey = errors.New("no current clock key: rounds are authenticated, and none was run (the clock stays unknown)")

// auth is the round's authentication: nil for plain NTP, else the current
// key; errNoKey when there is none.
func (n *Node) auth(ctx context.Context) (*Auth, error) {
	if n.cfg.Keys == nil {
		return nil, nil
	}
	k, ok := n.cfg.Keys.Current()
	if !ok {
		n.cfg.Keys.AskRefresh()
		n.cfg.Keys.Wait(ctx, keyWait)
		if k, ok = n.cfg.Keys.Current(); !ok {
			return nil, errNoKey
		}
	}
	return &Auth{Key: k, Refused: n.countRefused}, nil
}

func (n *Node) countRefused(reason string) {
	n.mu.Lock()
	n.refused[reason]++
	n.mu.Unlock()
}

// Record takes one round's result: the newest offset, and the drift fitted
// over the last FitRounds rounds.
func (n *Node) Record(m Measurement, err error) {
	defer n.once.Do(func() { close(n.first) })
	n.mu.Lock()
	defer n.mu.Unlock()
	if err != nil {
		n.failures++
		return
	}
	n.rounds++
	// A jump far outside what the fit predicts is a step of the node's
	// clock (or of the master's): older rounds would bend the fit.
	if n.driftOK && len(n.history) > 0 {
		last := n.history[len(n.history)-1]
		pred := float64(last.Offset) + n.drift*1e-6*float64(m.SampledAt-last.At)
		if d := float64(m.OffsetNs) - pred; d > stepNs+float64(10*m.BoundNs) || -d > stepNs+float64(10*m.BoundNs) {
			n.history = n.history[:0]
			n.driftOK = false
		}
	}
	n.history = append(n.history, Point{At: m.SampledAt, Offset: m.OffsetNs, Bound: m.BoundNs})
	if len(n.history) > n.cfg.FitRounds {
		n.history = append(n.history[:0], n.history[len(n.history)-n.cfg.FitRounds:]...)
	}
	if fit, ok := FitDrift(n.history, int64(500*time.Millisecond)); ok {
		n.drift, n.driftErr, n.driftOK = fit.PPM, fit.ErrPPM, true
	}
	mm := m
	n.est = &mm
	// The mapping read now, with the estimate: both after any step that
	// came before the round.
	n.refreshMapping()
	n.estM2R = n.m2r.Load()
}

// stepFoldNs: a change of the host's CLOCK_REALTIME − CLOCK_MONOTONIC
// beyond this is a step of the wall clock (a reading's own uncertainty is
// its pair's gap, well under a microsecond).
const stepFoldNs = 10_000

// stepNs: an offset this far from the fit's prediction restarts the fit.
const stepNs = 1e6

// Run refreshes the mapping every MapEvery and runs a round at start, then
// more as nextRound spaces them, until ctx ends.
func (n *Node) Run(ctx context.Context) {
	mapTick := time.NewTicker(n.cfg.MapEvery)
	defer mapTick.Stop()
	round := time.NewTimer(0)
	defer round.Stop()
	if n.cfg.Server == "" {
		round.Stop()
		n.once.Do(func() { close(n.first) })
	}
	done := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-mapTick.C:
			n.refreshMapping()
		case <-round.C:
			m, err := n.Round(ctx)
			if err != nil {
				n.cfg.Log.Warn("clock round failed", "server", n.cfg.Server, "err", err)
			} else {
				n.cfg.Log.Debug("clock round", "offset_ns", m.OffsetNs, "bound_ns", m.BoundNs, "probes", m.Probes)
			}
			done++
			round.Reset(nextRound(done, n.cfg.Interval))
		}
	}
}
