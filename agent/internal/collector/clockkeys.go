package collector

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"github.com/hoptrace/hoptrace/agent/internal/backoff"
	"github.com/hoptrace/hoptrace/agent/internal/clock"
	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
)

// ClockKeys keeps Keys filled with this node's clock key from the
// collector (hoptrace.v1.ClockKeys/GetClockKey), asked over the agent's
// mutual-TLS connection to it: the key comes from the peer the agent
// already authenticates, so there is no secret to deploy. It asks again
// when the collector says (it rotates its keys), and at once when a round
// found the key refused (Keyring.AskRefresh: the collector restarted).
type ClockKeys struct {
	Conn grpc.ClientConnInterface
	Node string
	Keys *clock.Keyring
	Log  *slog.Logger
	// MinRefresh bounds how often the agent asks (a refused key, a
	// rotation due at once); 0 = a second.
	MinRefresh time.Duration

	fetched, failures atomic.Uint64
}

// Run asks for keys until ctx ends.
func (c *ClockKeys) Run(ctx context.Context) {
	if c.Log == nil {
		c.Log = slog.Default()
	}
	if c.MinRefresh <= 0 {
		c.MinRefresh = time.Second
	}
	client := pb.NewClockKeysClient(c.Conn)
	bo := backoff.Backoff{Max: 30 * time.Second}
	logged := ""
	for {
		wait, err := c.fetch(ctx, client)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			c.failures.Add(1)
			if msg := err.Error(); msg != logged { // once per distinct error, not every retry
				c.Log.Warn("no clock key from the collector: clock rounds wait (the clock stays unknown)", "err", err)
				logged = msg
			}
			if !bo.Sleep(ctx) {
				return
			}
			continue
		}
		bo.Reset()
		logged = ""
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C:
		case <-c.Keys.Refresh():
			timer.Stop()
			select { // a round that failed at once asks again at most every MinRefresh
			case <-ctx.Done():
				return
			case <-time.After(c.MinRefresh):
			}
		}
	}
}

// fetch asks once and takes the key; it returns when to ask again.
func (c *ClockKeys) fetch(ctx context.Context, client pb.ClockKeysClient) (time.Duration, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	k, err := client.GetClockKey(cctx, &pb.GetClockKeyRequest{Node: c.Node})
	if err != nil {
		return 0, fmt.Errorf("GetClockKey: %w", err)
	}
	if k.GetNode() != c.Node || len(k.GetKey()) != 32 || k.GetValidFor().AsDuration() <= 0 {
		return 0, fmt.Errorf("GetClockKey: a key for node %q of %d bytes valid for %v (want %q, 32 bytes)",
			k.GetNode(), len(k.GetKey()), k.GetValidFor().AsDuration(), c.Node)
	}
	c.Keys.Set(clock.Key{ID: k.GetKeyId(), Secret: k.GetKey(), Node: c.Node}, k.GetValidFor().AsDuration())
	c.fetched.Add(1)
	return max(k.GetRefreshAfter().AsDuration(), c.MinRefresh), nil
}

// Fetched and Failures count the answers taken and the calls that failed.
func (c *ClockKeys) Fetched() uint64  { return c.fetched.Load() }
func (c *ClockKeys) Failures() uint64 { return c.failures.Load() }
