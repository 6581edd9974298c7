// Package session is the agent's side of hoptrace.v1.AgentSession/Connect:
// register, heartbeat every 2 s, apply and remove trace plans pushed by the
// dispatcher and answer each with a TraceStatus. When the dispatcher goes
// away the traces keep running; the session reconnects with backoff forever
// and reports them in Register.running.
package session

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/hoptrace/hoptrace/agent/internal/backoff"
	"github.com/hoptrace/hoptrace/agent/internal/netns"
	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
	"github.com/hoptrace/hoptrace/agent/internal/signing"
	"github.com/hoptrace/hoptrace/agent/internal/workload"
)

// Tracer is what the session drives (tracer.Manager).
type Tracer interface {
	Apply(*pb.TracePlan) *pb.TraceStatus
	Remove(name string) *pb.TraceStatus
	Running() []*pb.TraceStatus
	// Check finds hops whose device or netns went away and returns the
	// statuses of the traces that changed (tracer.Manager.Check).
	Check() []*pb.TraceStatus
}

// PresetRunner runs one preset (mace, iron) with its flags without dashes and
// returns its summary as JSON (preset.Run).
type PresetRunner func(ctx context.Context, preset string, args map[string]string) (string, error)

// Session keeps one Connect stream to the dispatcher.
type Session struct {
	Addr         string
	Node         string
	Version      string
	Netns        string // --netns
	Capabilities *pb.Capabilities
	Tracer       Tracer
	// Presets answers RunPreset (nil = every RunPreset fails with an error).
	Presets PresetRunner
	// NetnsOwned is passed to discover as netns-owned (the agent's --netns-owned).
	NetnsOwned string
	// Workloads names namespaces by the containers and pods in them (nil =
	// none reported).
	Workloads   *workload.Inventory
	Heartbeat   time.Duration
	Log         *slog.Logger
	DialOptions []grpc.DialOption
	// Verifier checks the dispatcher's signature on every plan and preset
	// (nil = --insecure: unsigned ones are taken; docs/security.md).
	Verifier *signing.Verifier
	// Creds are the transport credentials when DialOptions is nil (nil =
	// plaintext, --insecure): mutual TLS from internal/tlsconf.
	Creds credentials.TransportCredentials
	// Backoff bounds (0 = defaults).
	MinBackoff, MaxBackoff time.Duration
	// Transport, when set, is sent with every heartbeat: where the records
	// go and what waits on the node (`hoptrace agents`).
	Transport func() *pb.TransportStatus

	registrations atomic.Uint64
	connected     atomic.Bool
}

// Registrations counts the sessions registered with the dispatcher (the
// first one and every reconnect).
func (s *Session) Registrations() uint64 { return s.registrations.Load() }

// Connected reports whether a session is registered right now.
func (s *Session) Connected() bool { return s.connected.Load() }

// Run keeps the session up until ctx ends.
func (s *Session) Run(ctx context.Context) error {
	if s.Log == nil {
		s.Log = slog.Default()
	}
	if s.Heartbeat <= 0 {
		s.Heartbeat = 2 * time.Second
	}
	opts := s.DialOptions
	if opts == nil {
		creds := s.Creds
		if creds == nil {
			creds = insecure.NewCredentials()
		}
		opts = []grpc.DialOption{grpc.WithTransportCredentials(creds)}
	}
	conn, err := grpc.NewClient(s.Addr, opts...)
	if err != nil {
		return fmt.Errorf("dispatcher %s: %w", s.Addr, err)
	}
	defer conn.Close()
	client := pb.NewAgentSessionClient(conn)
	bo := backoff.Backoff{Min: s.MinBackoff, Max: s.MaxBackoff}
	for {
		registered, err := s.connect(ctx, client)
		if ctx.Err() != nil {
			return nil
		}
		if registered {
			bo.Reset()
		}
		s.Log.Warn("dispatcher session ended, reconnecting", "addr", s.Addr, "err", err)
		if !bo.Sleep(ctx) {
			return nil
		}
	}
}

// Register builds the first message of a session.
func (s *Session) Register() *pb.Register {
	r := &pb.Register{
		Node:         s.Node,
		AgentVersion: s.Version,
		Capabilities: s.Capabilities,
		Running:      s.Tracer.Running(),
	}
	inv := s.Inventory(context.Background())
	r.Namespaces, r.Runtime = inv.GetNamespaces(), inv.GetRuntime()
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		r.KernelRelease = unix.ByteSliceToString(u.Release[:])
	}
	return r
}

// Inventory is the node's namespaces with their devices and workloads, and
// the container runtime's state.
func (s *Session) Inventory(ctx context.Context) *pb.Inventory {
	found, runtime := s.Workloads.Collect(ctx)
	return &pb.Inventory{Namespaces: WithWorkloads(Namespaces(s.Netns), found), Runtime: runtime}
}

// WithWorkloads puts each container into the namespace of the same inode,
// and lists a container's namespace that has no /run/netns name as
// /proc/PID/ns/net (its first process's), with its devices.
func WithWorkloads(namespaces []*pb.Namespace, found []workload.Found) []*pb.Namespace {
	byInode := map[uint64]*pb.Namespace{}
	for _, ns := range namespaces {
		if ns.GetInode() != 0 {
			byInode[ns.GetInode()] = ns
		}
	}
	for _, f := range found {
		ns := byInode[f.NetnsInode]
		if ns == nil {
			ns = &pb.Namespace{Name: f.NetnsPath, Inode: f.NetnsInode}
			devs, err := netns.Devices(f.NetnsPath)
			if err != nil {
				continue // the container exited meanwhile
			}
			for _, d := range devs {
				ns.Devices = append(ns.Devices, &pb.Device{Name: d.Name, Ifindex: d.Ifindex, Mtu: d.MTU, Kind: d.Kind})
			}
			namespaces = append(namespaces, ns)
			byInode[f.NetnsInode] = ns
		}
		f.Workload.Netns = ns.GetName()
		ns.Workloads = append(ns.Workloads, f.Workload)
	}
	return namespaces
}

// Namespaces lists the agent's own (--netns) namespace as "" and every
// /run/netns entry, with their devices.
func Namespaces(own string) []*pb.Namespace {
	var out []*pb.Namespace
	add := func(name, path string) {
		ns := &pb.Namespace{Name: name}
		if ino, err := netns.Inode(path); err == nil {
			ns.Inode = ino
		}
		devs, err := netns.Devices(path)
		if err != nil {
			return
		}
		for _, d := range devs {
			ns.Devices = append(ns.Devices, &pb.Device{Name: d.Name, Ifindex: d.Ifindex, Mtu: d.MTU, Kind: d.Kind})
		}
		out = append(out, ns)
	}
	add("", netns.Path("", own))
	names, _ := netns.Named()
	for _, n := range names {
		if n == own {
			continue
		}
		add(n, netns.Path(n, ""))
	}
	return out
}

func (s *Session) connect(ctx context.Context, client pb.AgentSessionClient) (bool, error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := client.Connect(sctx)
	if err != nil {
		return false, err
	}
	var sendMu sync.Mutex
	send := func(m *pb.AgentMessage) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		return st.Send(m)
	}
	s.Tracer.Check() // Register.running says what is attached now, not what was
	registration := s.Register()
	if err := send(&pb.AgentMessage{Body: &pb.AgentMessage_Register{Register: registration}}); err != nil {
		return false, fmt.Errorf("register: %w", err)
	}
	s.Log.Info("registered with dispatcher", "addr", s.Addr, "node", s.Node)
	s.registrations.Add(1)
	s.connected.Store(true)
	defer s.connected.Store(false)

	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(s.Heartbeat)
		defer t.Stop()
		said := &pb.Inventory{Namespaces: registration.GetNamespaces(), Runtime: registration.GetRuntime()}
		for {
			select {
			case <-sctx.Done():
				return
			case <-t.C:
				hb := &pb.Heartbeat{SentAt: timestamppb.Now()}
				if s.Transport != nil {
					hb.Transport = s.Transport()
				}
				// Devices and namespaces appear after the agent registered (a container
				// started later): the dispatcher validates specs against what it last heard.
				if now := s.Inventory(sctx); !proto.Equal(now, said) {
					hb.Inventory, said = now, now
				}
				if err := send(&pb.AgentMessage{Body: &pb.AgentMessage_Heartbeat{Heartbeat: hb}}); err != nil {
					cancel()
					return
				}
				// A hop whose device or netns went away is no longer attached: the
				// dispatcher hears it as the trace's status, as after an apply.
				for _, st := range s.Tracer.Check() {
					s.Log.Warn("trace lost a hop", "trace", st.GetTrace(), "generation", st.GetGeneration(),
						"active", st.GetActive(), "hops", lostHops(st))
					if err := send(&pb.AgentMessage{Body: &pb.AgentMessage_TraceStatus{TraceStatus: st}}); err != nil {
						cancel()
						return
					}
				}
			}
		}
	}()
	defer wg.Wait()
	defer cancel()

	// Commands are checked as they arrive, on a goroutine of their own, and
	// acted on in order here: a command's expiry covers its way to the agent,
	// not its wait behind slow applies before it.
	admitted := make(chan *command, 64)
	var recvErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(admitted)
		for {
			m, err := st.Recv()
			if err != nil {
				recvErr = err
				return
			}
			c, refusal := s.admit(m)
			if refusal != nil {
				if err := send(refusal); err != nil {
					recvErr = err
					cancel()
					return
				}
				continue
			}
			if c == nil {
				continue
			}
			select {
			case admitted <- c:
			case <-sctx.Done():
				recvErr = sctx.Err()
				return
			}
		}
	}()

	for c := range admitted {
		var status *pb.TraceStatus
		switch {
		case c.preset != nil:
			// A preset runs for its duration: on its own goroutine, so
			// applies and heartbeats go on meanwhile. It ends with the session.
			wg.Add(1)
			go func(req *pb.RunPreset) {
				defer wg.Done()
				res := s.runPreset(sctx, req)
				if err := send(&pb.AgentMessage{Body: &pb.AgentMessage_PresetResult{PresetResult: res}}); err != nil {
					cancel()
				}
			}(c.preset)
			continue
		case c.plan != nil:
			status = s.Tracer.Apply(c.plan)
			s.Log.Info("applied trace", "trace", status.GetTrace(), "generation", status.GetGeneration(),
				"active", status.GetActive(), "error", status.GetError())
		case c.remove != nil:
			status = s.Tracer.Remove(c.remove.GetTrace())
			s.Log.Info("removed trace", "trace", c.remove.GetTrace(), "generation", c.remove.GetGeneration(), "error", status.GetError())
		}
		if err := send(&pb.AgentMessage{Body: &pb.AgentMessage_TraceStatus{TraceStatus: status}}); err != nil {
			cancel()
			for range admitted { // the receiver ends with the stream
			}
			return true, err
		}
	}
	return true, recvErr
}

// command is what one dispatcher message asks, once admitted: one of plan,
// remove, preset.
type command struct {
	plan   *pb.TracePlan
	remove *pb.RemoveTrace
	preset *pb.RunPreset
}

// admit checks a message: with a Verifier only signed, fresh commands pass
// (docs/security.md, "Signed commands"); without one (--insecure) every
// command is taken as it comes. A refused command gets the answer that
// refuses it (nothing attached, removed or run); a message that asks nothing
// gets neither.
func (s *Session) admit(m *pb.DispatcherMessage) (*command, *pb.AgentMessage) {
	var c *pb.Command
	switch b := m.GetBody().(type) {
	case *pb.DispatcherMessage_Signed:
		if s.Verifier == nil {
			// No CA to check against: as good as unsigned, and taken like it.
			c = &pb.Command{}
			if err := proto.Unmarshal(b.Signed.GetPayload(), c); err != nil {
				s.Log.Warn("dropped a signed command that does not parse", "err", err)
				return nil, nil
			}
			break
		}
		var err error
		if c, err = s.Verifier.Command(s.Node, b.Signed); err != nil {
			// The payload's trace, generation or preset id only label the
			// answer (the dispatcher matches answers by them); nothing of it
			// is used.
			unchecked := &pb.Command{}
			_ = proto.Unmarshal(b.Signed.GetPayload(), unchecked)
			return nil, s.refusal(unchecked, err)
		}
	case *pb.DispatcherMessage_Apply:
		c = &pb.Command{Action: &pb.Command_Apply{Apply: b.Apply}}
	case *pb.DispatcherMessage_Remove:
		c = &pb.Command{Action: &pb.Command_Remove{Remove: b.Remove}}
	case *pb.DispatcherMessage_RunPreset:
		c = &pb.Command{Action: &pb.Command_RunPreset{RunPreset: b.RunPreset}}
	default:
		return nil, nil
	}
	if _, signed := m.GetBody().(*pb.DispatcherMessage_Signed); !signed && s.Verifier != nil {
		return nil, s.refusal(c, s.Verifier.Unsigned(signing.KindOfCommand(c)))
	}
	switch {
	case c.GetApply() != nil:
		return &command{plan: c.GetApply()}, nil
	case c.GetRemove() != nil:
		return &command{remove: c.GetRemove()}, nil
	case c.GetRunPreset() != nil:
		return &command{preset: c.GetRunPreset()}, nil
	}
	return nil, nil
}

// refusal is the answer to a refused command c (its fields only label it):
// a plan's or a removal's TraceStatus, a preset's PresetResult.
func (s *Session) refusal(c *pb.Command, err error) *pb.AgentMessage {
	reason := signing.ReasonOf(err)
	switch {
	case c.GetRunPreset() != nil:
		req := c.GetRunPreset()
		s.Log.Warn("refused a preset: nothing run", "preset", req.GetPreset(), "id", req.GetId(), "reason", reason, "err", err)
		return &pb.AgentMessage{Body: &pb.AgentMessage_PresetResult{PresetResult: &pb.PresetResult{Id: req.GetId(),
			Error: "preset refused, nothing run: " + err.Error()}}}
	case c.GetRemove() != nil:
		// The trace stays as it runs: the answer says so, with the refusal.
		name := c.GetRemove().GetTrace()
		st := &pb.TraceStatus{Trace: name}
		for _, r := range s.Tracer.Running() {
			if r.GetTrace() == name {
				st = r
			}
		}
		s.Log.Warn("refused a removal: nothing detached", "trace", name, "reason", reason, "err", err)
		st = proto.Clone(st).(*pb.TraceStatus)
		st.Error = "removal refused, nothing detached: " + err.Error()
		return &pb.AgentMessage{Body: &pb.AgentMessage_TraceStatus{TraceStatus: st}}
	default:
		plan := c.GetApply()
		s.Log.Warn("refused a plan: nothing attached", "trace", plan.GetTrace(), "generation", plan.GetGeneration(),
			"reason", reason, "err", err)
		return &pb.AgentMessage{Body: &pb.AgentMessage_TraceStatus{TraceStatus: &pb.TraceStatus{Trace: plan.GetTrace(),
			Generation: plan.GetGeneration(), Error: "plan refused, nothing attached: " + err.Error()}}}
	}
}

// lostHops are the errors of a status's hops that are not attached.
func lostHops(st *pb.TraceStatus) []string {
	var out []string
	for _, h := range st.GetHops() {
		if !h.GetAttached() {
			out = append(out, h.GetError())
		}
	}
	return out
}

func (s *Session) runPreset(ctx context.Context, req *pb.RunPreset) *pb.PresetResult {
	res := &pb.PresetResult{Id: req.GetId()}
	if s.Presets == nil {
		res.Error = "this agent does not run presets"
		return res
	}
	args := map[string]string{}
	for k, v := range req.GetArgs() {
		args[k] = v
	}
	// "The host" of a preset is this agent's own namespace: its --netns,
	// which need not be the one the process runs in.
	if _, ok := args["host-netns"]; !ok && s.Netns != "" {
		args["host-netns"] = s.Netns
	}
	if _, ok := args["netns-owned"]; !ok && s.NetnsOwned != "" && req.GetPreset() == "discover" {
		args["netns-owned"] = s.NetnsOwned
	}
	logged := map[string]string{}
	for k, v := range args {
		if k == "influx-token" {
			v = "***"
		}
		logged[k] = v
	}
	s.Log.Info("running preset", "preset", req.GetPreset(), "id", req.GetId(), "args", logged)
	summary, err := s.Presets(ctx, req.GetPreset(), args)
	if err != nil {
		res.Error = err.Error()
		s.Log.Warn("preset failed", "preset", req.GetPreset(), "id", req.GetId(), "err", err)
		return res
	}
	res.SummaryJson = summary
	return res
}
