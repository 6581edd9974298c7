package session

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"

	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
)

// fakeTracer stands in for tracer.Manager: the session's job is the
// protocol, the kernel side is tested in package tracer.
type fakeTracer struct {
	mu      sync.Mutex
	running map[string]*pb.TraceStatus
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
