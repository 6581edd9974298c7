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
	"strings"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/hoptrace/hoptrace/agent/internal/attach"
	"github.com/hoptrace/hoptrace/agent/internal/clock"
	"github.com/hoptrace/hoptrace/agent/internal/collector"
	"github.com/hoptrace/hoptrace/agent/internal/kafka"
	"github.com/hoptrace/hoptrace/agent/internal/loader"
	"github.com/hoptrace/hoptrace/agent/internal/metrics"
	"github.com/hoptrace/hoptrace/agent/internal/output"
	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
	"github.com/hoptrace/hoptrace/agent/internal/preset"
	"github.com/hoptrace/hoptrace/agent/internal/probe"
	"github.com/hoptrace/hoptrace/agent/internal/session"
	"github.com/hoptrace/hoptrace/agent/internal/signing"
	"github.com/hoptrace/hoptrace/agent/internal/stream"
	"github.com/hoptrace/hoptrace/agent/internal/tlsconf"
	"github.com/hoptrace/hoptrace/agent/internal/tracer"
	"github.com/hoptrace/hoptrace/agent/internal/transport"
	"github.com/hoptrace/hoptrace/agent/internal/workload"
)

// Version of the agent, reported in Register.
var Version = "0.1.0"

// Config is the parsed command line.
type Config struct {
	Node  string
	Netns string
	// NetnsOwned: the host's other namespaces (/run/netns names), for
	// discover's attribution of crossings; empty = every /run/netns entry.
	NetnsOwned string
	// CRISocket is the CRI runtime's socket (containerd, CRI-O) pods and
	// containers are named from ("" = none).
	CRISocket string
	// DockerSocket is the Docker Engine API socket containers are named from
	// ("" = none).
	DockerSocket string
	Plan         string // plan file (protojson SignedMessage of a TracePlan, or a TracePlan)
	// AllowUnsignedPlan runs a Plan file that is a bare TracePlan, with a
	// warning; without it only a plan signed by a dispatcher certificate of
	// --ca runs (docs/security.md).
	AllowUnsignedPlan bool
	Out               string // "-" = stdout, else a file; "" = no JSON lines
	Dispatcher        string
	Collector         string
	// Kafka, when set, publishes records to a topic instead of streaming
	// them to Collector (internal/kafka); the clock server is then named
	// by ClockServer.
	Kafka       *kafka.Config
	Duration    time.Duration
	BufferBytes int
	RingBytes   uint32
	// Clock alignment: the collector's time service ("" = the collector's
	// host, port DefaultClockPort; "off" = none), rounds and probes.
	ClockServer   string
	ClockInterval time.Duration
	ClockProbes   int
	// ClockAuth: "on" (rounds authenticated, or none run), "off" (plain
	// NTP), "auto"/"" (on when there is a key: ClockKeyFile, or mutual TLS to
	// a gRPC Collector, which hands the key). ClockKeyFile: a shared secret
	// the collector's --clock-key-file holds too (Kafka, or --insecure labs).
	ClockAuth    string
	ClockKeyFile string
	// SIMULATION (tests and demos on one machine): behave like a host whose
	// wall clock is off by ClockOffset + ClockDriftPPM·(t − start).
	ClockOffset   time.Duration
	ClockDriftPPM float64
	// MetricsListen serves /metrics and /healthz ("" = off).
	MetricsListen string
	// PinDir is where the traces are pinned in bpffs so that they outlive
	// the agent, and where the agent takes over its predecessor's ("" = pin
	// nothing: the traces go with the process). KeepOnExit leaves them
	// pinned and running on a graceful exit too (a restart or upgrade);
	// without it the agent detaches and unpins them on its way out.
	PinDir     string
	KeepOnExit bool
	// Hooks runs the traces' tc hops in one program per device and
	// direction, and their TCP taggers in one per cgroup (hook.bpf.o, found
	// as the presets' objects are), instead of a program each: a device many
	// traces cross costs about what one costs.
	Hooks bool
	// CommandState is where the sequences of the signed commands taken are
	// kept when PinDir is "" ("" = nowhere: after a restart only the
	// commands' expiry bounds a replay); with a PinDir they are pinned
	// there (signing.StatePath).
	CommandState string
	// TLS: mutual TLS toward the dispatcher and the collector
	// (docs/security.md); Insecure = plaintext instead, said explicitly.
	// TLS.CRL also refuses revoked signers of commands and plan files.
	TLS      tlsconf.Files
	Insecure bool
	// MaxClockSkew is how far the dispatcher's clock may be from this
	// node's when a signed command's expiry is checked (0 = the default).
	MaxClockSkew time.Duration

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

// ReadPlan reads a plan file: a signed plan (a SignedMessage in protojson,
// checked by v for node) or, only with allowUnsigned, a bare TracePlan.
func ReadPlan(path, node string, v *signing.Verifier, allowUnsigned bool, log *slog.Logger) (*pb.TracePlan, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read plan: %w", err)
	}
	signed := &pb.SignedMessage{}
	if protojson.Unmarshal(b, signed) == nil && len(signed.GetPayload()) > 0 {
		if v == nil {
			return nil, fmt.Errorf("plan %s is signed: pass --ca with the CA of the dispatcher that signed it", path)
		}
		plan, err := v.Plan(node, signed)
		if err != nil {
			return nil, fmt.Errorf("plan %s refused, nothing attached: %w", path, err)
		}
		return plan, nil
	}
	plan := &pb.TracePlan{}
	if err := protojson.Unmarshal(b, plan); err != nil {
		return nil, fmt.Errorf("plan %s: %w", path, err)
	}
	if !allowUnsigned {
		if v != nil {
			v.Count(signing.KindPlan, signing.ReasonUnsigned)
		}
		return nil, fmt.Errorf("plan %s is not signed: sign it (`hoptrace plan sign`) and pass --ca, "+
			"or pass --allow-unsigned-plan to run what the file says", path)
	}
	log.Warn("WARNING: --allow-unsigned-plan: running a plan no dispatcher signed; whoever can write "+
		"the file (and the object it names) chooses what this agent loads", "plan", path)
	return plan, nil
}

// Run runs the agent until ctx ends (or Duration passes): it applies the
// plan if given, prints JSON lines if Out is set, and talks to the
// dispatcher and collector if their addresses are set. On the way out it
// flushes records, prints final counters, and detaches everything.
//
// Its goroutines run in three stages, started in this order and stopped in
// the reverse one: aux (the clock and /metrics, which the other stages read),
// records (the JSON printer and the collector stream, which drain the
// queue), plans (the dispatcher session, which changes what is attached).
func Run(ctx context.Context, cfg Config) error {
	cfg = cfg.withDefaults()
	if cfg.Duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.Duration)
		defer cancel()
	}
	a, err := start(cfg)
	if err != nil {
		return err
	}
	defer a.close()

	a.startAux()
	a.startRecords()
	if err := a.applyPlan(); err != nil {
		a.shutdown()
		return err
	}
	a.startPlans(ctx)
	<-ctx.Done() // the printer writes the counters every second meanwhile
	return a.shutdown()
}

func (cfg Config) withDefaults() Config {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	if cfg.Stdout == nil {
		cfg.Stdout = os.Stdout
	}
	if cfg.Node == "" {
		cfg.Node, _ = os.Hostname()
	}
	return cfg
}

// stage is a group of goroutines stopped together.
type stage struct {
	g      errgroup.Group
	ctx    context.Context
	cancel context.CancelFunc
}

func newStage() *stage {
	s := &stage{}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s
}

// stop cancels the stage and waits for its goroutines.
func (s *stage) stop() error {
	s.cancel()
	return s.g.Wait()
}

// wait waits for the goroutines to end by themselves, and cancels them after timeout.
func (s *stage) wait(timeout time.Duration) (inTime bool) {
	done := make(chan struct{})
	go func() { s.g.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(timeout):
		s.cancel()
		<-done
		return false
	}
}

// running is one agent between start and shutdown.
type running struct {
	cfg        Config
	plan       *pb.TracePlan
	out        *output.Writer
	outFile    *os.File
	metricsLis net.Listener
	mgr        *tracer.Manager
	mgrClosed  bool
	// printQueue feeds the JSON printer, sendQueue the collector stream or
	// the Kafka producer: each sink takes every batch from a queue of its own.
	printQueue, sendQueue          *stream.Queue
	nodeClock                      *clock.Node
	client                         *collector.Client
	collectorConn                  *grpc.ClientConn
	clockKeys                      *collector.ClockKeys
	producer                       *kafka.Producer
	sess                           *session.Session
	dispatcherCreds, collectorCred credentials.TransportCredentials
	verifier                       *signing.Verifier
	aux, records, plans            *stage
}

// start opens what the agent needs: credentials, the plan file, the output,
// the /metrics listener, the tracer and its queues. Nothing runs yet.
func start(cfg Config) (*running, error) {
	a := &running{cfg: cfg, aux: newStage(), records: newStage(), plans: newStage()}
	var err error
	if a.dispatcherCreds, a.collectorCred, err = transportCredentials(cfg); err != nil {
		return nil, err
	}
	// With a CA, every command (and a plan file) must carry a dispatcher's
	// signature, and commands must be fresh.
	if !cfg.Insecure && cfg.TLS.CA != "" {
		if a.verifier, err = signing.LoadVerifier(cfg.TLS.CA); err != nil {
			return nil, err
		}
		if cfg.MaxClockSkew > 0 {
			a.verifier.MaxClockSkew = cfg.MaxClockSkew
		}
		if cfg.TLS.CRL != "" {
			if a.verifier.CRL, err = tlsconf.LoadRevocationList(cfg.TLS.CRL, cfg.TLS.CA, cfg.Log); err != nil {
				return nil, err
			}
		}
		state := cfg.CommandState
		if cfg.PinDir != "" {
			state = signing.StatePath(cfg.PinDir, cfg.Node)
		}
		if state != "" {
			if err := a.verifier.Persist(state); err != nil {
				return nil, err
			}
		}
	}
	baseDir := ""
	if cfg.Plan != "" {
		if a.plan, err = ReadPlan(cfg.Plan, cfg.Node, a.verifier, cfg.AllowUnsignedPlan, cfg.Log); err != nil {
			return nil, err
		}
		baseDir = filepath.Dir(cfg.Plan)
	}
	switch cfg.Out {
	case "":
	case "-":
		a.out = output.NewWriter(cfg.Stdout)
	default:
		if a.outFile, err = os.Create(cfg.Out); err != nil {
			return nil, fmt.Errorf("open --out: %w", err)
		}
		a.out = output.NewWriter(a.outFile)
	}
	if a.out != nil {
		a.out.Node, a.out.Describe = cfg.Node, a.describe
	}
	if cfg.MetricsListen != "" {
		// Not fatal: tracing matters more than its metrics, and a second
		// agent on the same machine may have left the default port taken.
		if a.metricsLis, err = metrics.Listen(cfg.MetricsListen); err != nil {
			cfg.Log.Warn("no /metrics (pass a free --metrics-listen, or \"\" to turn it off)", "err", err)
		}
	}
	// The batches fan out to every sink's queue: a sink that falls behind
	// drops (and counts) from its own queue and never holds back the others.
	var sinks []*stream.Queue
	if a.out != nil {
		a.printQueue = stream.NewQueue(cfg.BufferBytes)
		sinks = append(sinks, a.printQueue)
	}
	if cfg.Collector != "" || cfg.Kafka != nil || a.out == nil {
		// Without any sink nothing takes from it: it fills, and drops its
		// oldest batches, counted, as /metrics shows.
		a.sendQueue = stream.NewQueue(cfg.BufferBytes)
		sinks = append(sinks, a.sendQueue)
	}
	if cfg.KeepOnExit && cfg.PinDir == "" {
		a.close()
		return nil, errors.New(`--keep-on-exit needs a --pin-dir: with --pin-dir "" nothing outlives the agent`)
	}
	var hooks *attach.Hooks
	if cfg.Hooks {
		path, err := preset.FindObject(loader.HookObject, "")
		if err == nil {
			hooks, err = attach.NewHooks(path)
		}
		if err != nil {
			a.close()
			return nil, fmt.Errorf("--hooks: %w", err)
		}
	}
	a.mgr, err = tracer.New(tracer.Config{Node: cfg.Node, Netns: cfg.Netns, BaseDir: baseDir, RingBytes: cfg.RingBytes,
		Out: stream.NewFanout(sinks...), PinDir: cfg.PinDir, Hooks: hooks, Log: cfg.Log})
	if err != nil {
		a.close()
		return nil, err
	}
	// The node's clock: the monotonic->realtime mapping always, Cristian
	// rounds against the collector's time service when there is one,
	// authenticated when a key is to be had (clockAuth).
	keys, err := a.clockAuth()
	if err != nil {
		a.close()
		return nil, err
	}
	a.nodeClock = clock.NewNode(clock.Config{Server: cfg.ClockServerAddr(), Interval: cfg.ClockInterval,
		Probes: cfg.ClockProbes, Source: clock.NewSource(cfg.ClockOffset, cfg.ClockDriftPPM), Keys: keys, Log: cfg.Log})
	if a.nodeClock.Source().Simulated() {
		cfg.Log.Warn("SIMULATED clock error", "offset", cfg.ClockOffset, "drift_ppm", cfg.ClockDriftPPM)
	}
	batcher := transport.Batcher{Node: cfg.Node, Queue: a.sendQueue, Counters: a.mgr.Counters, Clock: a.nodeClock.NodeClock, Unqueued: a.mgr.Unqueued}
	if cfg.Kafka != nil {
		if cfg.ClockServer == "" {
			cfg.Log.Warn("no --clock-server with --kafka-brokers: records carry no clock offset; name a collector's time service (host:7123)")
		}
		a.producer = &kafka.Producer{Config: *cfg.Kafka, Batcher: batcher, Log: cfg.Log}
	} else if cfg.Collector != "" {
		a.client = &collector.Client{Addr: cfg.Collector, Batcher: batcher, Log: cfg.Log, Creds: a.collectorCred,
			Conn: a.collectorConn}
	}
	if cfg.Dispatcher != "" {
		a.sess = &session.Session{Addr: cfg.Dispatcher, Node: cfg.Node, Version: Version, Netns: cfg.Netns,
			Capabilities: probe.Capabilities(), Tracer: a.mgr, Presets: a.runPreset, NetnsOwned: cfg.NetnsOwned, Workloads: workload.NewInventory(cfg.DockerSocket, cfg.CRISocket, cfg.Log), Log: cfg.Log, Creds: a.dispatcherCreds,
			Verifier: a.verifier}
		p := a.parts()
		a.sess.Transport = func() *pb.TransportStatus { return transportStatus(p) }
	}
	return a, nil
}

// close releases what start opened (after shutdown, or on a failed start).
func (a *running) close() {
	if a.mgr != nil && !a.mgrClosed {
		a.mgr.Close()
	}
	if a.metricsLis != nil {
		a.metricsLis.Close()
	}
	if a.outFile != nil {
		a.outFile.Close()
	}
	if a.collectorConn != nil {
		a.collectorConn.Close()
	}
}

// clockAuth decides how the clock rounds are authenticated (Config.
// ClockAuth) and returns their keyring: nil for plain NTP. With mutual TLS
// to a gRPC collector it opens the collector connection (shared with the
// record stream) and the ClockKeys that fills the ring over it.
func (a *running) clockAuth() (*clock.Keyring, error) {
	cfg := a.cfg
	mode := cfg.ClockAuth
	switch mode {
	case "", "auto", "on", "off":
	default:
		return nil, fmt.Errorf("--clock-auth %q: want auto, on or off", mode)
	}
	if mode == "off" && cfg.ClockKeyFile != "" {
		return nil, errors.New("--clock-auth off and --clock-key-file exclude each other")
	}
	if cfg.ClockServerAddr() == "" {
		return nil, nil // no rounds
	}
	if cfg.ClockKeyFile != "" {
		master, err := clock.ReadKeyFile(cfg.ClockKeyFile)
		if err != nil {
			return nil, err
		}
		return clock.StaticKeyring(clock.DeriveKey(master, cfg.Node, 0)), nil
	}
	fromCollector := cfg.Collector != "" && cfg.Kafka == nil && !cfg.Insecure
	if mode != "off" && fromCollector {
		conn, err := collector.NewConn(cfg.Collector, a.collectorCred, nil)
		if err != nil {
			return nil, err
		}
		a.collectorConn = conn
		keys := clock.NewKeyring()
		a.clockKeys = &collector.ClockKeys{Conn: conn, Node: cfg.Node, Keys: keys, Log: cfg.Log}
		return keys, nil
	}
	if mode == "on" {
		return nil, errors.New("--clock-auth on: no clock key to be had: give --clock-key-file, or mutual TLS (--ca --cert --key) to a --collector, which hands one")
	}
	why := "--clock-auth off"
	if mode != "off" {
		why = "no key: neither --clock-key-file nor mutual TLS to a --collector"
	}
	cfg.Log.Warn("WARNING: clock rounds are NOT authenticated ("+why+"): anyone on the path to the time service can shift this node's offset, and every cross-node latency with it (docs/security.md)",
		"server", cfg.ClockServerAddr())
	return nil, nil
}

// parts are what /metrics and the heartbeat's transport status read.
func (a *running) parts() parts {
	var queues []*stream.Queue
	for _, q := range []*stream.Queue{a.printQueue, a.sendQueue} {
		if q != nil {
			queues = append(queues, q)
		}
	}
	return parts{mgr: a.mgr, queues: queues, outQueue: queues[len(queues)-1], clock: a.nodeClock,
		client: a.client, producer: a.producer, session: a.sess, clockSync: a.cfg.ClockServerAddr() != "", verifier: a.verifier}
}

// startAux runs the clock and /metrics: they live until the very end.
func (a *running) startAux() {
	a.aux.g.Go(func() error { a.nodeClock.Run(a.aux.ctx); return nil })
	if a.clockKeys != nil {
		a.aux.g.Go(func() error { a.clockKeys.Run(a.aux.ctx); return nil })
	}
	if a.metricsLis == nil {
		return
	}
	reg := newRegistry(a.parts())
	a.aux.g.Go(func() error {
		metrics.Serve(a.aux.ctx, a.metricsLis, metrics.Handler(reg, nil), a.cfg.Log)
		return nil
	})
}

// startRecords runs the sinks, the printer and the collector stream (or the
// Kafka producer): each takes records from its own queue until the queue is
// closed and drained (or the stage is cancelled).
func (a *running) startRecords() {
	ctx := a.records.ctx
	if a.out != nil {
		a.records.g.Go(func() error { a.printRecords(ctx); return nil })
	}
	if a.client != nil {
		a.records.g.Go(func() error {
			// Records wait (in the queue) for the first clock round, so the
			// first batches already carry an offset; bounded, as the time
			// service may be away.
			if a.cfg.ClockServerAddr() != "" && !a.nodeClock.WaitFirst(ctx, 3*time.Second) {
				a.cfg.Log.Warn("no clock estimate yet; sending records without an offset", "server", a.cfg.ClockServerAddr())
			}
			if err := a.client.Run(ctx); err != nil {
				a.cfg.Log.Error("collector", "err", err)
			}
			return nil
		})
	}
	if a.producer != nil {
		a.records.g.Go(func() error {
			if a.cfg.ClockServerAddr() != "" && !a.nodeClock.WaitFirst(ctx, 3*time.Second) {
				a.cfg.Log.Warn("no clock estimate yet; publishing records without an offset", "server", a.cfg.ClockServerAddr())
			}
			if err := a.producer.Run(ctx); err != nil {
				a.cfg.Log.Error("kafka", "err", err)
			}
			return nil
		})
	}
}

// printRecords writes the printer's queue to the JSON lines as the collector
// stream sends it (the same transport.Batcher): each batch's records with
// the node's clock, and every second a heartbeat, each trace's counters and
// events with the watermark of what the output holds, so that `hoptrace
// import` can join and place the records as a collector does. It returns once
// the queue is closed and written, or the stage is cancelled.
func (a *running) printRecords(ctx context.Context) {
	beat := transport.Batcher{Node: a.cfg.Node, Queue: a.printQueue, Counters: a.mgr.Counters, Clock: a.nodeClock.NodeClock, Unqueued: a.mgr.Unqueued}
	// As the collector stream does: the first records wait for the first
	// clock round (bounded), so they are placed with an offset.
	if a.cfg.ClockServerAddr() != "" {
		a.nodeClock.WaitFirst(ctx, 3*time.Second)
	}
	hopName := func(trace string) func(uint16) string {
		return func(i uint16) string { return a.mgr.HopName(trace, i) }
	}
	next := time.Now().Add(beat.Every())
	for {
		b := beat.Pop(ctx, next)
		if b != nil {
			if err := a.out.Batch(beat.Message(b.Trace, b.Generation, b.Records, b.Trailers, 0), hopName(b.Trace)); err != nil {
				a.cfg.Log.Error("write records", "err", err)
			}
			b.Delivered()
			b.Release()
		}
		if ctx.Err() != nil || b == nil && a.printQueue.Closed() {
			return
		}
		if !time.Now().Before(next) {
			for _, m := range beat.Heartbeats() {
				if err := a.out.Heartbeat(m); err != nil {
					a.cfg.Log.Error("write counters", "err", err)
				}
			}
			next = time.Now().Add(beat.Every())
		}
	}
}

// dropHopPrefix begins the name of every drop hop the dispatcher plans
// (spec/drops.py, drops: true): skb:kfree_skb recording drop_reason.
const dropHopPrefix = "drops@"

// describe is the status of a running trace (nil when it is not) and, when
// it has drop hops, this kernel's names of the reasons they record.
func (a *running) describe(trace string) (*pb.TraceStatus, map[uint32]string) {
	for _, st := range a.mgr.Running() {
		if st.GetTrace() != trace {
			continue
		}
		for _, h := range st.GetHops() {
			if strings.HasPrefix(h.GetName(), dropHopPrefix) {
				reasons, err := probe.DropReasons()
				if err != nil {
					a.cfg.Log.Warn("drop reasons of this kernel unknown: an import names them by number", "err", err)
				}
				return st, reasons
			}
		}
		return st, nil
	}
	return nil, nil
}

// applyPlan applies the standalone plan, if any; a plan that does not
// become active is an error. Traces a previous agent of the node left pinned
// that the plan does not name are removed: the plan says what runs.
func (a *running) applyPlan() error {
	if a.plan == nil {
		return nil
	}
	for _, st := range a.mgr.Running() {
		if st.GetTrace() != a.plan.GetTrace() {
			a.cfg.Log.Info("removing a trace taken over from bpffs that the plan does not name", "trace", st.GetTrace(),
				"generation", st.GetGeneration())
			a.mgr.Remove(st.GetTrace())
		}
	}
	st := a.mgr.Apply(a.plan)
	if a.out != nil {
		if err := a.out.Status(st); err != nil {
			return err
		}
	}
	if !st.GetActive() {
		return fmt.Errorf("trace %s: %s", st.GetTrace(), st.GetError())
	}
	for _, h := range st.GetHops() {
		if h.GetError() != "" {
			a.cfg.Log.Warn("hop not attached", "err", h.GetError())
		}
	}
	return nil
}

// startPlans runs the dispatcher session until ctx ends or shutdown stops it.
func (a *running) startPlans(ctx context.Context) {
	if a.sess == nil {
		return
	}
	sessCtx, cancel := context.WithCancel(ctx)
	stageCancel := a.plans.cancel
	a.plans.cancel = func() { cancel(); stageCancel() }
	a.plans.g.Go(func() error {
		if err := a.sess.Run(sessCtx); err != nil {
			a.cfg.Log.Error("dispatcher session", "err", err)
		}
		return nil
	})
}

func (a *running) printCounters() {
	if a.out == nil {
		return
	}
	for _, tc := range a.mgr.Counters() {
		if err := a.out.Counters(tc.Trace, tc.Generation, tc.Hops); err != nil {
			a.cfg.Log.Error("write counters", "err", err)
		}
		if err := a.out.Events(tc.Trace, tc.Events); err != nil {
			a.cfg.Log.Error("write events", "err", err)
		}
	}
}

// shutdown stops taking plans, flushes the records and the final counters,
// detaches everything (or, with KeepOnExit, leaves the pinned traces for the
// next agent), lets the printer and the collector take what is left
// (bounded), then stops the clock and /metrics.
func (a *running) shutdown() error {
	a.plans.stop()
	a.mgr.Flush()
	a.printCounters()
	var err error
	if a.cfg.KeepOnExit {
		err = a.mgr.Stop() // stops reading, flushes the reader, closes the queue; the traces run on
	} else {
		err = a.mgr.Close() // detaches, unpins, flushes the reader, closes the queue
		a.mgrClosed = true
	}
	if a.out == nil && a.client == nil && a.producer == nil {
		a.records.cancel() // nothing drains the queue
	}
	if !a.records.wait(5 * time.Second) {
		a.cfg.Log.Warn("collector did not take the last batches in time")
	}
	if a.cfg.KeepOnExit {
		// What the sinks did not send stays in the pinned ring for the next agent.
		err = errors.Join(err, a.mgr.Release())
		a.mgrClosed = true
	}
	if a.out != nil {
		a.out.Flush()
	}
	a.aux.stop()
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
		cfg.Log.Warn("WARNING: --insecure: plans and records travel in plaintext, the dispatcher is not authenticated and its plans and presets are taken unsigned; loopback demos and tests only")
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

// runPreset runs a preset for the dispatcher; discover's timestamps go out
// on the master's clock, through this agent's clock estimate (as its records
// are mapped by the collector: ts + monotonic_to_realtime - offset).
func (a *running) runPreset(ctx context.Context, name string, args map[string]string) (string, error) {
	return preset.RunAligned(ctx, name, args, func(mono int64) (int64, int64, bool) {
		c := a.nodeClock.NodeClock(mono)
		return mono + c.GetMonotonicToRealtimeNs() - c.GetOffsetNs(), c.GetBoundNs(), c.GetSampledAtNs() != 0
	})
}
