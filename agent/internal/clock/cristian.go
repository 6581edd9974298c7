package clock

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"time"

	"golang.org/x/sys/unix"
)

// Sample is one probe of the time exchange, all in ns since the Unix epoch.
// T1 and T4 are the node's wall clock (Source.Now), T2 and T3 the master's.
type Sample struct {
	T1, T2, T3, T4 int64
}

// Delay is the round trip minus the server's hold time: (T4−T1) − (T3−T2).
func (s Sample) Delay() int64 { return (s.T4 - s.T1) - (s.T3 - s.T2) }

// Offset is node wall clock − master clock (positive when the node is
// ahead), the convention of NodeClock.offset_ns and of the collector's
// clocksync.measure_offset. RFC 5905's θ = ((T2−T1) + (T3−T4))/2 is master −
// node, so this is −θ.
func (s Sample) Offset() int64 { return -((s.T2 - s.T1) + (s.T3 - s.T4)) / 2 }

// Bound is the error bound of Offset: the true offset lies within ±delay/2
// of it whatever the split of the delay between the two directions.
func (s Sample) Bound() int64 { return (s.Delay() + 1) / 2 }

// Measurement is the result of one round: the min-delay sample.
type Measurement struct {
	OffsetNs  int64 // node − master
	BoundNs   int64
	DelayNs   int64
	SampledAt int64 // node wall clock at the sample (midpoint of T1 and T4)
	Probes    int   // answered probes
	Sent      int   // probes sent
}

// Best returns the measurement of the sample with the smallest delay: the
// one least disturbed by queueing and scheduling (Cristian's algorithm).
func Best(samples []Sample) (Measurement, error) {
	if len(samples) == 0 {
		return Measurement{}, errors.New("no probe answered")
	}
	best := samples[0]
	for _, s := range samples[1:] {
		if s.Delay() < best.Delay() {
			best = s
		}
	}
	return Measurement{
		OffsetNs: best.Offset(), BoundNs: best.Bound(), DelayNs: best.Delay(),
		SampledAt: best.T1 + (best.T4-best.T1)/2, Probes: len(samples), Sent: len(samples),
	}, nil
}

// Auth authenticates a round's probes (auth.go): each request carries a
// tag under Key and a fresh nonce, and only the server's authentic answer
// to that very request is taken. Every other reply is passed to Refused.
type Auth struct {
	Key     Key
	Refused func(reason string)
}

// Exchange sends n probes, one after the other, to the NTP server at addr
// and returns the answered ones; it gives up after maxMisses probes in a
// row get no answer, or when ctx ends. T1 and T4 come from src. The socket is a
// plain blocking one (not Go's netpoller): the receiving thread wakes
// straight from the kernel, which keeps the scheduling noise out of T4.
// With auth (nil = plain NTP), replies that are not the authentic answer to
// the probe are refused and counted, and the probe waits on for its own
// until its timeout.
func Exchange(ctx context.Context, addr string, n int, timeout time.Duration, src *Source, auth *Auth) ([]Sample, error) {
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, fmt.Errorf("clock server %s: %w", addr, err)
	}
	var sa unix.Sockaddr
	family := unix.AF_INET
	if ip4 := ua.IP.To4(); ip4 != nil {
		sa = &unix.SockaddrInet4{Port: ua.Port, Addr: [4]byte(ip4)}
	} else {
		family = unix.AF_INET6
		sa = &unix.SockaddrInet6{Port: ua.Port, Addr: [16]byte(ua.IP.To16())}
	}
	fd, err := unix.Socket(family, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("clock socket: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Connect(fd, sa); err != nil {
		return nil, fmt.Errorf("clock server %s: %w", addr, err)
	}
	if timeout <= 0 {
		timeout = 500 * time.Millisecond
	}
	tv := unix.NsecToTimeval(timeout.Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return nil, fmt.Errorf("clock socket timeout: %w", err)
	}
	kernelStamps := enableKernelStamps(fd)
	buf := make([]byte, 512)
	oob := make([]byte, 512)
	var samples []Sample
	var lastErr, lastRefusal error
	misses := 0
	for range n {
		if ctx.Err() != nil || misses >= maxMisses {
			break
		}
		misses++
		t1 := src.Now()
		req := Request(t1)
		var nonce [nonceSize]byte
		if auth != nil {
			nonce = newNonce()
			if req, err = AuthRequest(t1, auth.Key, nonce); err != nil {
				return nil, err
			}
		}
		// A stream of replies that are not this probe's answer (late ones,
		// forged ones) must not hold the probe beyond its timeout: each
		// would start SO_RCVTIMEO afresh.
		deadline := time.Now().Add(timeout)
		if _, err := unix.Write(fd, req); err != nil {
			lastErr = err
			continue
		}
		// The request carries t1 for matching; the sample uses the kernel's
		// own send time when it has one, like the server's T2 and T3.
		sent := t1
		if kernelStamps {
			if rt := txStamp(fd, oob); rt != 0 {
				sent = src.At(rt)
			}
		}
		for {
			k, oobn, _, _, err := unix.Recvmsg(fd, buf, oob, 0)
			t4 := src.Now()
			if err == nil && kernelStamps {
				if rt := rxStamp(oob[:oobn]); rt != 0 {
					t4 = src.At(rt)
				}
			}
			if err != nil {
				if !errors.Is(err, unix.EINTR) {
					lastErr = err // EAGAIN: timed out; ECONNREFUSED: no server
					break
				}
				continue
			}
			var t2, t3 int64
			if auth != nil {
				t2, t3, err = parseAuthReply(buf[:k], auth.Key, nonce[:])
				if refusal := (*RefusedError)(nil); errors.As(err, &refusal) {
					if auth.Refused != nil {
						auth.Refused(refusal.Reason)
					}
					lastRefusal = err
					if time.Now().After(deadline) {
						break
					}
					continue // never used; this probe's own answer may still come
				}
			} else {
				t2, t3, err = parseReply(buf[:k], t1)
				if errors.Is(err, errStale) {
					if time.Now().After(deadline) {
						break
					}
					continue // a late answer to an earlier probe
				}
			}
			if err != nil {
				lastErr = err
				break
			}
			sample := Sample{T1: sent, T2: t2, T3: t3, T4: t4}
			if sample.Delay() < 0 {
				break // impossible: a timestamp was off; this probe tells nothing
			}
			samples = append(samples, sample)
			misses = 0
			break
		}
	}
	if len(samples) == 0 {
		if lastRefusal != nil {
			lastErr = lastRefusal // what the answers there were said: more than a timeout
		}
		if lastErr == nil {
			lastErr = errors.New("no answer")
		}
		return nil, fmt.Errorf("clock server %s: %w", addr, lastErr)
	}
	return samples, nil
}

// maxMisses unanswered probes in a row end a round: the server is away.
const maxMisses = 3

// enableKernelStamps asks the kernel for software timestamps of the probes:
// when a request leaves (the driver's TX stamp) and when a reply arrives
// (SO_TIMESTAMPNS). User-space reads around write/read include syscall and
// wake-up time on one leg only, which biases the offset by half of it.
func enableKernelStamps(fd int) bool {
	const flags = unix.SOF_TIMESTAMPING_TX_SOFTWARE | unix.SOF_TIMESTAMPING_SOFTWARE |
		unix.SOF_TIMESTAMPING_OPT_TSONLY
	if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1) != nil {
		return false
	}
	return unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TIMESTAMPING, flags) == nil
}

// txStamp reads the software TX stamp (CLOCK_REALTIME ns) of the datagram
// just written from the error queue; 0 when there is none.
func txStamp(fd int, oob []byte) int64 {
	var one [1]byte
	for {
		_, oobn, _, _, err := unix.Recvmsg(fd, one[:], oob, unix.MSG_ERRQUEUE|unix.MSG_DONTWAIT)
		if err != nil {
			return 0
		}
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil {
			return 0
		}
		for _, m := range msgs {
			if m.Header.Level == unix.SOL_SOCKET && m.Header.Type == unix.SO_TIMESTAMPING && len(m.Data) >= 16 {
				if ts := timespecNs(m.Data); ts != 0 { // the first of three: software
					return ts
				}
			}
		}
	}
}

// rxStamp is the SO_TIMESTAMPNS receive time in a control message, or 0.
func rxStamp(oob []byte) int64 {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return 0
	}
	for _, m := range msgs {
		if m.Header.Level == unix.SOL_SOCKET && m.Header.Type == unix.SO_TIMESTAMPNS && len(m.Data) >= 16 {
			return timespecNs(m.Data)
		}
	}
	return 0
}

func timespecNs(b []byte) int64 {
	sec := int64(binary.NativeEndian.Uint64(b[0:8]))
	nsec := int64(binary.NativeEndian.Uint64(b[8:16]))
	return sec*1_000_000_000 + nsec
}

// Measure runs one round: n probes, then the min-delay sample.
func Measure(ctx context.Context, addr string, n int, timeout time.Duration, src *Source, auth *Auth) (Measurement, error) {
	samples, err := Exchange(ctx, addr, n, timeout, src, auth)
	if err != nil {
		return Measurement{}, err
	}
	m, err := Best(samples)
	m.Sent = n
	return m, err
}
