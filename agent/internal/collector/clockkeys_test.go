package collector

import (
	"bytes"
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/hoptrace/hoptrace/agent/internal/clock"
	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
)

// keyServer hands key_id 1, 2, ... (the key's bytes all equal to it),
// each to be asked again after refresh; fail makes it answer an error.
type keyServer struct {
	pb.UnimplementedClockKeysServer
	mu      sync.Mutex
	next    uint32
	refresh time.Duration
	node    string
	fail    bool
}

func (s *keyServer) GetClockKey(_ context.Context, req *pb.GetClockKeyRequest) (*pb.ClockKey, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail {
		return nil, status.Error(codes.Unavailable, "down")
	}
	s.next++
	node := s.node
	if node == "" {
		node = req.GetNode()
	}
	return &pb.ClockKey{Node: node, KeyId: s.next, Key: bytes.Repeat([]byte{byte(s.next)}, 32),
		RefreshAfter: durationpb.New(s.refresh), ValidFor: durationpb.New(time.Minute)}, nil
}

func (s *keyServer) set(f func(*keyServer)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(s)
}

func currentID(r *clock.Keyring) uint32 {
	k, ok := r.Current()
	if !ok {
		return 0
	}
	return k.ID
}

// The agent keeps the collector's newest key, asks again when told to (a
// round found it refused) and when it rotates, and never takes a key for
// another node.
func TestClockKeysFollowsRotation(t *testing.T) {
	defer goleak.VerifyNone(t)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	ks := &keyServer{refresh: time.Hour}
	pb.RegisterClockKeysServer(srv, ks)
	go srv.Serve(lis)
	defer srv.Stop()
	conn, err := NewConn(lis.Addr().String(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	ring := clock.NewKeyring()
	c := &ClockKeys{Conn: conn, Node: "host-b", Keys: ring, MinRefresh: 20 * time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	ring.Wait(ctx, 5*time.Second)
	if k, ok := ring.Current(); !ok || k.ID != 1 || k.Node != "host-b" || !bytes.Equal(k.Secret, bytes.Repeat([]byte{1}, 32)) {
		t.Fatalf("first key %+v %v", k, ok)
	}
	// A refused round asks again (after MinRefresh).
	ring.AskRefresh()
	waitFor(t, "key 2 after a refresh request", func() bool { return currentID(ring) == 2 })
	// The collector rotates: the agent asks when it says.
	ks.set(func(s *keyServer) { s.refresh = 0 }) // MinRefresh apart
	ring.AskRefresh()
	waitFor(t, "keys following the rotation", func() bool { return currentID(ring) >= 5 })
	// A key for another node is not taken; the last good one stays.
	ks.set(func(s *keyServer) { s.node, s.refresh = "host-a", time.Hour })
	before := c.Fetched()
	waitFor(t, "a refused answer", func() bool { return c.Failures() > 0 })
	if k, ok := ring.Current(); !ok || k.Node != "host-b" || c.Fetched() != before {
		t.Errorf("after host-a's key: %+v %v", k, ok)
	}
}
