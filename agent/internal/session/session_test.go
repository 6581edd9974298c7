package session

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
	"github.com/hoptrace/hoptrace/agent/internal/signing"
	"github.com/hoptrace/hoptrace/agent/internal/testutil"
)

// fakeTracer stands in for tracer.Manager: the session's job is the
// protocol, the kernel side is tested in package tracer.
type fakeTracer struct {
	mu      sync.Mutex
	running map[string]*pb.TraceStatus
	lost    []*pb.TraceStatus // Check's answer, once
}

func (f *fakeTracer) Check() []*pb.TraceStatus {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := f.lost
	f.lost = nil
	return out
}

func (f *fakeTracer) Apply(p *pb.TracePlan) *pb.TraceStatus {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := &pb.TraceStatus{Trace: p.GetTrace(), Generation: p.GetGeneration(), Active: true,
		Hops: []*pb.HopStatus{{Name: "h0", Attached: true}}}
	f.running[p.GetTrace()] = st
	return st
}

func (f *fakeTracer) Remove(name string) *pb.TraceStatus {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.running, name)
	return &pb.TraceStatus{Trace: name}
}

func (f *fakeTracer) Running() []*pb.TraceStatus {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*pb.TraceStatus
	for _, s := range f.running {
		out = append(out, s)
	}
	return out
}

// dispatcher is an in-process AgentSession server; each session runs the
// script given for it.
type dispatcher struct {
	pb.UnimplementedAgentSessionServer
	sessions chan pb.AgentSession_ConnectServer
	done     chan struct{}
}

func (d *dispatcher) Connect(st pb.AgentSession_ConnectServer) error {
	d.sessions <- st
	select {
	case <-d.done:
	case <-st.Context().Done():
	}
	return nil
}

func startDispatcher(t *testing.T, addr string) (*grpc.Server, *dispatcher, string) {
	t.Helper()
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	d := &dispatcher{sessions: make(chan pb.AgentSession_ConnectServer, 4), done: make(chan struct{})}
	pb.RegisterAgentSessionServer(srv, d)
	go srv.Serve(lis)
	return srv, d, lis.Addr().String()
}

func recvSession(t *testing.T, d *dispatcher) pb.AgentSession_ConnectServer {
	t.Helper()
	select {
	case st := <-d.sessions:
		return st
	case <-time.After(5 * time.Second):
		t.Fatal("agent did not connect")
		return nil
	}
}

func TestSessionAppliesAndReconnects(t *testing.T) {
	defer goleak.VerifyNone(t)

	srv, d, addr := startDispatcher(t, "127.0.0.1:0")
	ft := &fakeTracer{running: map[string]*pb.TraceStatus{}}
	s := &Session{Addr: addr, Node: "n1", Version: "test", Tracer: ft, Heartbeat: 50 * time.Millisecond,
		MinBackoff: 20 * time.Millisecond, MaxBackoff: 100 * time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()

	st := recvSession(t, d)
	m, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	reg := m.GetRegister()
	if reg.GetNode() != "n1" || reg.GetKernelRelease() == "" || len(reg.GetNamespaces()) == 0 || len(reg.GetRunning()) != 0 {
		t.Fatalf("register %v", reg)
	}
	if err := st.Send(&pb.DispatcherMessage{Body: &pb.DispatcherMessage_Apply{Apply: &pb.TracePlan{Trace: "t1", Generation: 4}}}); err != nil {
		t.Fatal(err)
	}
	heartbeats := 0
	var status *pb.TraceStatus
	for status == nil || heartbeats < 2 {
		m, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if m.GetHeartbeat() != nil {
			heartbeats++
		}
		if m.GetTraceStatus() != nil {
			status = m.GetTraceStatus()
		}
	}
	if status.GetTrace() != "t1" || status.GetGeneration() != 4 || !status.GetActive() {
		t.Fatalf("status %v", status)
	}

	// The dispatcher goes away; traces keep running; the agent comes back
	// and reports them.
	close(d.done)
	srv.Stop()
	time.Sleep(100 * time.Millisecond)
	srv2, d2, _ := startDispatcher(t, addr)
	defer srv2.Stop()
	st = recvSession(t, d2)
	m, err = st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if r := m.GetRegister().GetRunning(); len(r) != 1 || r[0].GetTrace() != "t1" || r[0].GetGeneration() != 4 {
		t.Fatalf("running after reconnect %v", r)
	}
	if err := st.Send(&pb.DispatcherMessage{Body: &pb.DispatcherMessage_Remove{Remove: &pb.RemoveTrace{Trace: "t1"}}}); err != nil {
		t.Fatal(err)
	}
	for {
		m, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if s := m.GetTraceStatus(); s != nil {
			if s.GetTrace() != "t1" || s.GetActive() {
				t.Fatalf("remove status %v", s)
			}
			break
		}
	}
	if len(ft.Running()) != 0 {
		t.Fatal("trace still running after remove")
	}

	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	close(d2.done)
}

// TestSessionReportsLostHops: a hop the tracer finds gone (its device or
// netns deleted) reaches the dispatcher as the trace's status, unasked.
func TestSessionReportsLostHops(t *testing.T) {
	defer goleak.VerifyNone(t)

	srv, d, addr := startDispatcher(t, "127.0.0.1:0")
	defer srv.Stop()
	ft := &fakeTracer{running: map[string]*pb.TraceStatus{}}
	s := &Session{Addr: addr, Node: "n1", Version: "test", Tracer: ft, Heartbeat: 20 * time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	st := recvSession(t, d)
	if m, err := st.Recv(); err != nil || m.GetRegister() == nil {
		t.Fatalf("register %v %v", m, err)
	}
	lost := &pb.TraceStatus{Trace: "t1", Generation: 4, Active: false,
		Hops: []*pb.HopStatus{{Name: "a-veth-in", Error: "hop a-veth-in: device veth-c1 is gone from netns c1"}}}
	ft.mu.Lock()
	ft.lost = []*pb.TraceStatus{lost}
	ft.mu.Unlock()
	for {
		m, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if got := m.GetTraceStatus(); got != nil {
			if !proto.Equal(got, lost) {
				t.Fatalf("status %v, want %v", got, lost)
			}
			break
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	close(d.done)
}

func TestSessionRunsPresets(t *testing.T) {
	defer goleak.VerifyNone(t)

	srv, d, addr := startDispatcher(t, "127.0.0.1:0")
	defer srv.Stop()
	ft := &fakeTracer{running: map[string]*pb.TraceStatus{}}
	presets := func(ctx context.Context, name string, args map[string]string) (string, error) {
		if name != "mace" {
			return "", fmt.Errorf("unknown preset %q", name)
		}
		return fmt.Sprintf(`{"type":"summary","container":%q}`, args["container"]), nil
	}
	s := &Session{Addr: addr, Node: "n1", Version: "test", Tracer: ft, Presets: presets, Heartbeat: time.Hour}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()

	st := recvSession(t, d)
	if _, err := st.Recv(); err != nil { // Register
		t.Fatal(err)
	}
	for _, req := range []*pb.RunPreset{
		{Id: "1", Preset: "mace", Args: map[string]string{"container": "c1"}},
		{Id: "2", Preset: "nope"},
	} {
		if err := st.Send(&pb.DispatcherMessage{Body: &pb.DispatcherMessage_RunPreset{RunPreset: req}}); err != nil {
			t.Fatal(err)
		}
	}
	got := map[string]*pb.PresetResult{}
	for len(got) < 2 {
		m, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if r := m.GetPresetResult(); r != nil {
			got[r.GetId()] = r
		}
	}
	if r := got["1"]; r.GetError() != "" || r.GetSummaryJson() != `{"type":"summary","container":"c1"}` {
		t.Fatalf("mace result %v", r)
	}
	if r := got["2"]; r.GetSummaryJson() != "" || r.GetError() != `unknown preset "nope"` {
		t.Fatalf("unknown preset result %v", r)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	close(d.done)
}

// TestSessionVerifiesSignatures: with a Verifier, only commands the
// dispatcher signed for this node, fresh and not taken before, reach the
// tracer and the preset runner; everything else is answered with a refusal
// naming the reason, and counted.
func TestSessionVerifiesSignatures(t *testing.T) {
	defer goleak.VerifyNone(t)

	ca := testutil.NewPKI(t)
	dispatcherCert := ca.Issue(t, "dispatcher", "dispatcher", nil, nil)
	collectorCert := ca.Issue(t, "collector", "collector", nil, nil)
	v, err := signing.NewVerifier(ca.PEM)
	if err != nil {
		t.Fatal(err)
	}
	srv, d, addr := startDispatcher(t, "127.0.0.1:0")
	defer srv.Stop()
	ft := &fakeTracer{running: map[string]*pb.TraceStatus{}}
	var presetRuns sync.Map
	presets := func(ctx context.Context, name string, args map[string]string) (string, error) {
		presetRuns.Store(args["container"], true)
		return `{"type":"summary"}`, nil
	}
	s := &Session{Addr: addr, Node: "n1", Version: "test", Tracer: ft, Presets: presets, Heartbeat: time.Hour, Verifier: v}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	st := recvSession(t, d)
	if _, err := st.Recv(); err != nil { // Register
		t.Fatal(err)
	}
	var sequence uint64
	signed := func(by testutil.Leaf, node string, c *pb.Command) *pb.DispatcherMessage {
		if c.Sequence == 0 {
			sequence++
			c.Sequence = sequence
		}
		if c.SignedAt == nil {
			c.SignedAt, c.ExpiresAt = timestamppb.Now(), timestamppb.New(time.Now().Add(time.Minute))
		}
		sm, err := signing.SignCommand(by.Key, by.DER, node, c)
		if err != nil {
			t.Fatal(err)
		}
		return &pb.DispatcherMessage{Body: &pb.DispatcherMessage_Signed{Signed: sm}}
	}
	apply := func(p *pb.TracePlan) *pb.Command { return &pb.Command{Action: &pb.Command_Apply{Apply: p}} }
	status := func() *pb.TraceStatus {
		for {
			m, err := st.Recv()
			if err != nil {
				t.Fatal(err)
			}
			if s := m.GetTraceStatus(); s != nil {
				return s
			}
		}
	}
	tampered := signed(dispatcherCert, "n1", apply(&pb.TracePlan{Trace: "t3", Generation: 3, Object: []byte("obj")}))
	tampered.GetSigned().Payload[len(tampered.GetSigned().Payload)-1] ^= 1
	expired := apply(&pb.TracePlan{Trace: "t4", Generation: 4})
	expired.SignedAt, expired.ExpiresAt = timestamppb.New(time.Now().Add(-2*time.Hour)), timestamppb.New(time.Now().Add(-2*time.Hour+time.Minute))
	for _, tc := range []struct {
		msg  *pb.DispatcherMessage
		want string
	}{
		{&pb.DispatcherMessage{Body: &pb.DispatcherMessage_Apply{Apply: &pb.TracePlan{Trace: "t1", Generation: 1}}},
			"plan refused, nothing attached: not signed: this agent trusts a CA and takes only plans signed by a dispatcher certificate"},
		{signed(collectorCert, "n1", apply(&pb.TracePlan{Trace: "t2", Generation: 2})),
			`plan refused, nothing attached: signer certificate "collector" has role [collector], not dispatcher`},
		{tampered, `plan refused, nothing attached: signature by "dispatcher" does not match the command's bytes`},
		{signed(dispatcherCert, "n1", expired), "plan refused, nothing attached: signed command expired at "},
	} {
		if err := st.Send(tc.msg); err != nil {
			t.Fatal(err)
		}
		got := status()
		if got.GetActive() || !strings.HasPrefix(got.GetError(), tc.want) {
			t.Fatalf("status %v, want an error starting %q", got, tc.want)
		}
		if len(ft.Running()) != 0 {
			t.Fatalf("a refused plan reached the tracer: %v", ft.Running())
		}
	}
	// The refusals name the trace and generation the dispatcher waits for.
	ok := signed(dispatcherCert, "n1", apply(&pb.TracePlan{Trace: "ok", Generation: 9}))
	if err := st.Send(ok); err != nil {
		t.Fatal(err)
	}
	if got := status(); got.GetTrace() != "ok" || got.GetGeneration() != 9 || !got.GetActive() || got.GetError() != "" {
		t.Fatalf("signed plan: status %v", got)
	}
	// The same signed message again is a replay: refused, the trace runs on.
	if err := st.Send(ok); err != nil {
		t.Fatal(err)
	}
	if got := status(); !strings.HasPrefix(got.GetError(), "plan refused, nothing attached: replayed plan command: sequence") {
		t.Fatalf("replayed plan: status %v", got)
	}
	// Removals: unsigned or replayed ones leave the trace running and say
	// so; the dispatcher's removes it.
	removal := signed(dispatcherCert, "n1", &pb.Command{Action: &pb.Command_Remove{Remove: &pb.RemoveTrace{Trace: "ok", Generation: 9}}})
	for _, tc := range []struct {
		msg  *pb.DispatcherMessage
		want string
	}{
		{&pb.DispatcherMessage{Body: &pb.DispatcherMessage_Remove{Remove: &pb.RemoveTrace{Trace: "ok"}}},
			"removal refused, nothing detached: not signed: this agent trusts a CA and takes only removals signed by a dispatcher certificate"},
		{signed(dispatcherCert, "n1", &pb.Command{Action: &pb.Command_Remove{Remove: &pb.RemoveTrace{Trace: "ok", Generation: 8}}}),
			`removal refused, nothing detached: replayed remove command: generation 8 of trace "ok" is older than generation 9`},
	} {
		if err := st.Send(tc.msg); err != nil {
			t.Fatal(err)
		}
		got := status()
		if !got.GetActive() || got.GetGeneration() != 9 || !strings.HasPrefix(got.GetError(), tc.want) {
			t.Fatalf("status %v, want the running trace and an error starting %q", got, tc.want)
		}
		if len(ft.Running()) != 1 {
			t.Fatalf("a refused removal reached the tracer: %v", ft.Running())
		}
	}
	if err := st.Send(removal); err != nil {
		t.Fatal(err)
	}
	if got := status(); got.GetActive() || got.GetError() != "" || len(ft.Running()) != 0 {
		t.Fatalf("signed removal: status %v, running %v", got, ft.Running())
	}
	if err := st.Send(removal); err != nil {
		t.Fatal(err)
	}
	if got := status(); !strings.Contains(got.GetError(), "replayed remove command") {
		t.Fatalf("replayed removal: status %v", got)
	}

	// Presets: an unsigned one and one signed by the collector are refused
	// with their ids; the dispatcher's runs.
	preset := func(id, container string) *pb.RunPreset {
		return &pb.RunPreset{Id: id, Preset: "mace", Args: map[string]string{"container": container}}
	}
	for _, m := range []*pb.DispatcherMessage{
		{Body: &pb.DispatcherMessage_RunPreset{RunPreset: preset("p1", "unsigned")}},
		signed(collectorCert, "n1", &pb.Command{Action: &pb.Command_RunPreset{RunPreset: preset("p2", "collector")}}),
		signed(dispatcherCert, "n1", &pb.Command{Action: &pb.Command_RunPreset{RunPreset: preset("p3", "dispatcher")}}),
	} {
		if err := st.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	got := map[string]*pb.PresetResult{}
	for len(got) < 3 {
		m, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if r := m.GetPresetResult(); r != nil {
			got[r.GetId()] = r
		}
	}
	if r := got["p1"]; !strings.HasPrefix(r.GetError(), "preset refused, nothing run: not signed") {
		t.Fatalf("unsigned preset: %v", r)
	}
	if r := got["p2"]; !strings.Contains(r.GetError(), `has role [collector], not dispatcher`) {
		t.Fatalf("preset signed by the collector: %v", r)
	}
	if r := got["p3"]; r.GetError() != "" || r.GetSummaryJson() != `{"type":"summary"}` {
		t.Fatalf("signed preset: %v", r)
	}
	if _, ran := presetRuns.Load("unsigned"); ran {
		t.Fatal("the unsigned preset ran")
	}
	if _, ran := presetRuns.Load("collector"); ran {
		t.Fatal("the preset signed by the collector ran")
	}
	counts := map[string]uint64{}
	for _, r := range v.Refusals() {
		counts[r.Type+"/"+string(r.Reason)] = r.Count
	}
	want := map[string]uint64{"plan/unsigned": 1, "plan/role": 1, "plan/signature": 1, "plan/expired": 1, "plan/replayed": 1,
		"remove/unsigned": 1, "remove/replayed": 2, "preset/unsigned": 1, "preset/role": 1}
	for _, r := range v.Refusals() {
		k := r.Type + "/" + string(r.Reason)
		if counts[k] != want[k] {
			t.Fatalf("refusals %v, want %v", counts, want)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	close(d.done)
}
