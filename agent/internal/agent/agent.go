// Package agent wires the parts of hoptrace-agent together for its modes:
// standalone (a plan file, JSON lines out), daemon (dispatcher session and
// collector stream), and probe.
package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/hoptrace/hoptrace/agent/internal/clock"
	"github.com/hoptrace/hoptrace/agent/internal/collector"
	"github.com/hoptrace/hoptrace/agent/internal/metrics"
	"github.com/hoptrace/hoptrace/agent/internal/output"
	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
	"github.com/hoptrace/hoptrace/agent/internal/preset"
	"github.com/hoptrace/hoptrace/agent/internal/probe"
	"github.com/hoptrace/hoptrace/agent/internal/session"
	"github.com/hoptrace/hoptrace/agent/internal/stream"
	"github.com/hoptrace/hoptrace/agent/internal/tlsconf"
	"github.com/hoptrace/hoptrace/agent/internal/tracer"
)

// Version of the agent, reported in Register.
var Version = "0.1.0"

// Config is the parsed command line.
type Config struct {
	Node        string
	Netns       string
	Plan        string // plan file (protojson TracePlan)
	Out         string // "-" = stdout, else a file; "" = no JSON lines
	Dispatcher  string
	Collector   string
	Duration    time.Duration
	BufferBytes int
	RingBytes   uint32
	// Clock alignment: the collector's time service ("" = the collector's
	// host, port DefaultClockPort; "off" = none), rounds and probes.
	ClockServer   string
	ClockInterval time.Duration
	ClockProbes   int
	// SIMULATION (tests and demos on one machine): behave like a host whose
	// wall clock is off by ClockOffset + ClockDriftPPM·(t − start).
	ClockOffset   time.Duration
	ClockDriftPPM float64
	// MetricsListen serves /metrics and /healthz ("" = off).
	MetricsListen string
	// TLS: mutual TLS toward the dispatcher and the collector
	// (docs/security.md); Insecure = plaintext instead, said explicitly.
	TLS      tlsconf.Files
	Insecure bool

	Log    *slog.Logger
	Stdout io.Writer
}

// DefaultClockPort is the collector's time service port (--clock-listen).
const DefaultClockPort = "7123"

// ClockServerAddr is where the Cristian rounds go: cfg.ClockServer, or the
// collector's host with DefaultClockPort; "" when there is none.
func (cfg Config) ClockServerAddr() string {
	switch cfg.ClockServer {
	case "off":
		return ""
	case "":
		if cfg.Collector == "" {
			return ""
		}
		host, _, err := net.SplitHostPort(cfg.Collector)
		if err != nil {
			host = cfg.Collector
		}
		return net.JoinHostPort(host, DefaultClockPort)
	}
	return cfg.ClockServer
}

// ReadPlan reads a protojson TracePlan.
func ReadPlan(path string) (*pb.TracePlan, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read plan: %w", err)
	}
	plan := &pb.TracePlan{}
	if err := protojson.Unmarshal(b, plan); err != nil {
		return nil, fmt.Errorf("plan %s: %w", path, err)
	}
	return plan, nil
}

// Run runs the agent until ctx ends (or Duration passes): it applies the
// plan if given, prints JSON lines if Out is set, and talks to the
// dispatcher and collector if their addresses are set. On the way out it
// flushes records, prints final counters, and detaches everything.
func Run(ctx context.Context, cfg Config) error {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	if cfg.Stdout == nil {
		cfg.Stdout = os.Stdout
	}
	if cfg.Node == "" {
		h, _ := os.Hostname()
		cfg.Node = h
	}
	if cfg.Duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.Duration)
		defer cancel()
	}

	dispatcherCreds, collectorCreds, err := transportCredentials(cfg)
	if err != nil {
		return err
	}

	var plan *pb.TracePlan
	baseDir := ""
	if cfg.Plan != "" {
		var err error
		if plan, err = ReadPlan(cfg.Plan); err != nil {
			return err
		}
		baseDir = filepath.Dir(cfg.Plan)
	}

	var out *output.Writer
	switch cfg.Out {
	case "":
	case "-":
		out = output.NewWriter(cfg.Stdout)
	default:
		f, err := os.Create(cfg.Out)
		if err != nil {
			return fmt.Errorf("open --out: %w", err)
		}
		defer f.Close()
		out = output.NewWriter(f)
	}

	var metricsLis net.Listener
	if cfg.MetricsListen != "" {
		// Not fatal: tracing matters more than its metrics, and a second
		// agent on the same machine may have left the default port taken.
		if lis, err := metrics.Listen(cfg.MetricsListen); err != nil {
			cfg.Log.Warn("no /metrics (pass a free --metrics-listen, or \"\" to turn it off)", "err", err)
		} else {
			metricsLis = lis
			defer lis.Close()
		}
	}

	queue := stream.NewQueue(cfg.BufferBytes)
	mgr, err := tracer.New(tracer.Config{Node: cfg.Node, Netns: cfg.Netns, BaseDir: baseDir, RingBytes: cfg.RingBytes, Queue: queue})
	if err != nil {
		return err
	}
	closed := false
	defer func() {
		if !closed {
			mgr.Close()
		}
	}()

	// When both a printer and a collector want the records, the printer
	// consumes the queue and forwards to the collector's own queue.
	collectorQueue := queue
	if out != nil && cfg.Collector != "" {
		collectorQueue = stream.NewQueue(cfg.BufferBytes)
	}

	var wg sync.WaitGroup
	bg, stopBG := context.WithCancel(context.Background())
	defer stopBG()

	if out != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				b := queue.Pop(bg)
				if b == nil {
					if collectorQueue != queue {
						collectorQueue.Close()
					}
					return
				}
				if err := out.Records(b.Trace, b.Records, func(i uint16) string { return mgr.HopName(b.Trace, i) }); err != nil {
					cfg.Log.Error("write records", "err", err)
				}
				if collectorQueue != queue {
					collectorQueue.Push(b)
				}
			}
		}()
	}
	// The node's clock: the monotonic→realtime mapping always, Cristian
	// rounds against the collector's time service when there is one.
	nodeClock := clock.NewNode(clock.Config{Server: cfg.ClockServerAddr(), Interval: cfg.ClockInterval,
		Probes: cfg.ClockProbes, Source: clock.NewSource(cfg.ClockOffset, cfg.ClockDriftPPM), Log: cfg.Log})
	if nodeClock.Source().Simulated() {
		cfg.Log.Warn("SIMULATED clock error", "offset", cfg.ClockOffset, "drift_ppm", cfg.ClockDriftPPM)
	}
	// Clock and /metrics live until Run returns (aux), after the records
	// have gone out.
	var aux sync.WaitGroup
	auxCtx, stopAux := context.WithCancel(context.Background())
	defer func() { stopAux(); aux.Wait() }()
	aux.Add(1)
	go func() { defer aux.Done(); nodeClock.Run(auxCtx) }()

	collectorDone := make(chan struct{})
	var client *collector.Client
	if cfg.Collector != "" {
		client = &collector.Client{Addr: cfg.Collector, Node: cfg.Node, Queue: collectorQueue, Counters: mgr.Counters,
			Clock: nodeClock.NodeClock, Log: cfg.Log, Creds: collectorCreds}
		go func() {
			defer close(collectorDone)
			// Records wait (in the queue) for the first clock round, so
			// the first batches already carry an offset; bounded, as the
			// time service may be away.
			if cfg.ClockServerAddr() != "" && !nodeClock.WaitFirst(bg, 3*time.Second) {
				cfg.Log.Warn("no clock estimate yet; sending records without an offset", "server", cfg.ClockServerAddr())
			}
			if err := client.Run(bg); err != nil {
				cfg.Log.Error("collector", "err", err)
			}
		}()
	} else {
		close(collectorDone)
	}

	if plan != nil {
		st := mgr.Apply(plan)
		if out != nil {
			if err := out.Status(st); err != nil {
				return err
			}
		}
		if !st.GetActive() {
			return fmt.Errorf("trace %s: %s", st.GetTrace(), st.GetError())
		}
		for _, h := range st.GetHops() {
			if h.GetError() != "" {
				cfg.Log.Warn("hop not attached", "err", h.GetError())
			}
		}
	}

	sessCtx, stopSess := context.WithCancel(ctx)
	defer stopSess()
	sessDone := make(chan struct{})
	var sess *session.Session
	if cfg.Dispatcher != "" {
		sess = &session.Session{Addr: cfg.Dispatcher, Node: cfg.Node, Version: Version, Netns: cfg.Netns,
			Capabilities: probe.Capabilities(), Tracer: mgr, Presets: preset.Run, Log: cfg.Log, Creds: dispatcherCreds}
		s := sess
		go func() {
			defer close(sessDone)
			if err := s.Run(sessCtx); err != nil {
				cfg.Log.Error("dispatcher session", "err", err)
			}
		}()
	} else {
		close(sessDone)
	}

	if metricsLis != nil {
		queues := []*stream.Queue{queue}
		if collectorQueue != queue {
			queues = append(queues, collectorQueue)
		}
		reg := newRegistry(parts{mgr: mgr, queues: queues, outQueue: collectorQueue, clock: nodeClock,
			client: client, session: sess, clockSync: cfg.ClockServerAddr() != ""})
		aux.Add(1)
		go func() { defer aux.Done(); metrics.Serve(auxCtx, metricsLis, metrics.Handler(reg, nil), cfg.Log) }()
	}

	printCounters := func() {
		if out == nil {
			return
		}
		for _, tc := range mgr.Counters() {
			if err := out.Counters(tc.Trace, tc.Hops); err != nil {
				cfg.Log.Error("write counters", "err", err)
			}
		}
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-tick.C:
			printCounters()
		}
	}

	// Shutdown: stop taking plans, flush records, final counters, detach.
	stopSess()
	<-sessDone
	mgr.Flush()
	printCounters()
	err = mgr.Close() // detaches, flushes the reader, closes the queue
	closed = true
	if out == nil && cfg.Collector == "" {
		stopBG()
	}
	// Let the printer and the collector take what is left (bounded wait).
	waitDone := make(chan struct{})
	go func() { wg.Wait(); <-collectorDone; close(waitDone) }()
	select {
	case <-waitDone:
	case <-time.After(5 * time.Second):
		cfg.Log.Warn("collector did not take the last batches in time")
		stopBG()
		<-waitDone
	}
	if out != nil {
		out.Flush()
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// transportCredentials are the credentials toward the dispatcher and the
// collector: mutual TLS from cfg.TLS, or nil (plaintext) with cfg.Insecure.
// Either is needed once the agent talks to one of them.
func transportCredentials(cfg Config) (dispatcher, collector credentials.TransportCredentials, err error) {
	if cfg.Dispatcher == "" && cfg.Collector == "" {
		return nil, nil, nil
	}
	if cfg.Insecure {
		if !cfg.TLS.Empty() {
			return nil, nil, errors.New("--insecure and --ca/--cert/--key exclude each other")
		}
		cfg.Log.Warn("WARNING: --insecure: plans and records travel in plaintext and the dispatcher is not authenticated; loopback demos and tests only")
		return nil, nil, nil
	}
	dispatcher, _, err = tlsconf.Credentials(cfg.TLS, tlsconf.RoleDispatcher)
	if err != nil {
		return nil, nil, err
	}
	collector, _, err = tlsconf.Credentials(cfg.TLS, tlsconf.RoleCollector)
	if err != nil {
		return nil, nil, err
	}
	if err := tlsconf.SelfCheck(cfg.TLS, cfg.Node); err != nil {
		// The servers decide; say early why they will refuse.
		cfg.Log.Warn("the dispatcher and collector will refuse this agent's certificate", "err", err)
	}
	return dispatcher, collector, nil
}

// Probe prints the kernel's capabilities as JSON.
func Probe(w io.Writer) error {
	b, err := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true, Multiline: true}.Marshal(probe.Capabilities())
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(w, string(b))
	return err
}
