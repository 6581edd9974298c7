// Package backoff is the reconnect delay of the agent's gRPC clients:
// exponential with jitter, capped, reset after a good connection.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff yields growing delays between Min and Max.
type Backoff struct {
	Min, Max time.Duration
	cur      time.Duration
}

// Next returns the next delay.
func (b *Backoff) Next() time.Duration {
	if b.Min <= 0 {
		b.Min = 200 * time.Millisecond
	}
	if b.Max <= 0 {
		b.Max = 5 * time.Second
	}
	if b.cur == 0 {
		b.cur = b.Min
	} else {
		b.cur *= 2
	}
	if b.cur > b.Max {
		b.cur = b.Max
	}
	// +-20% so many agents do not reconnect in lockstep.
	j := time.Duration(rand.Int64N(int64(b.cur)/5 + 1))
	return b.cur - b.cur/10 + j
}

// Reset starts again from Min.
func (b *Backoff) Reset() { b.cur = 0 }

// Sleep waits the next delay; false when ctx ended first.
func (b *Backoff) Sleep(ctx context.Context) bool {
	t := time.NewTimer(b.Next())
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
