package clock

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"time"

	"golang.org/x/sys/unix"
)

// Server is a minimal NTP server whose clock is CLOCK_REALTIME + Skew: a
// stand-in for the collector's time service in tests and demos. Like the
// collector's, it reads T2 when the request is in and T3 just before the
// reply leaves.
type Server struct {
	Skew  time.Duration
	keyOf func(node string, id uint32) []byte
	fd    int
	addr  string
	done  chan struct{}
}

// StartServer listens on addr (IPv4 host:port, port 0 = any) and answers
// until Close.
func StartServer(addr string, skew time.Duration) (*Server, error) {
	return StartAuthServer(addr, skew, nil)
}

// StartAuthServer is StartServer that also answers authenticated requests
// (auth.go) whose key keyOf knows, as the collector's time service does;
// requests that fail the check get no answer.
func StartAuthServer(addr string, skew time.Duration, keyOf func(node string, id uint32) []byte) (*Server, error) {
	ua, err := net.ResolveUDPAddr("udp4", addr)
	if err != nil {
		return nil, err
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	sa := &unix.SockaddrInet4{Port: ua.Port}
	copy(sa.Addr[:], ua.IP.To4())
	if err := unix.Bind(fd, sa); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("ntp server %s: %w", addr, err)
	}
	got, _ := unix.Getsockname(fd)
	g := got.(*unix.SockaddrInet4)
	s := &Server{Skew: skew, keyOf: keyOf, fd: fd, done: make(chan struct{}),
		addr: (&net.UDPAddr{IP: net.IP(g.Addr[:]), Port: g.Port}).String()}
	go s.serve()
	return s, nil
}

// Addr is the bound host:port.
func (s *Server) Addr() string { return s.addr }

func (s *Server) serve() {
	defer close(s.done)
	buf := make([]byte, 512)
	oob := make([]byte, 512)
	// Like the collector's time service: T2 is the kernel's receive stamp, T3 the clock read plus the
	// smallest recent lag to the reply's own kernel TX stamp, so both legs are timed at the same layer as
	// the client's kernel-stamped T1 and T4.
	kernel := enableKernelStamps(s.fd)
	var lags []int64
	for {
		n, oobn, _, from, err := unix.Recvmsg(s.fd, buf, oob, 0)
		t2 := Realtime()
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || n == 0 || from == nil {
			return // Close shut the socket down
		}
		if kernel {
			if rt := rxStamp(oob[:oobn]); rt != 0 {
				t2 = rt
			}
		}
		req, err := ParsePacket(buf[:n])
		if err != nil || req.Mode != modeClient {
			continue
		}
		var key Key
		var nonce []byte
		if n > PacketSize && s.keyOf != nil { // else a plain server: what follows the header is ignored
			if key, nonce, err = ParseAuthRequest(buf[:n], s.keyOf); err != nil {
				continue
			}
		}
		reply := Packet{Version: req.Version, Mode: modeServer, Stratum: 1, Origin: req.Transmit,
			Receive: ToNTP(t2 + int64(s.Skew))}
		read := Realtime()
		lag := int64(0)
		if len(lags) >= minLagSamples {
			lag = slices.Min(lags)
		}
		reply.Transmit = ToNTP(read + lag + int64(s.Skew))
		out := reply.Marshal()
		if nonce != nil {
			out = SignReply(out, key, nonce)
		}
		_ = unix.Sendto(s.fd, out, 0, from)
		if kernel {
			if tx := txStamp(s.fd, oob); tx != 0 {
				if lags = append(lags, tx-read); len(lags) > lagWindow {
					lags = lags[1:]
				}
			}
		}
	}
}

// The T3 correction: the minimum TX lag of the last lagWindow replies, once there are minLagSamples.
const (
	lagWindow     = 256
	minLagSamples = 16
)

// Close stops the server.
func (s *Server) Close() error {
	_ = unix.Shutdown(s.fd, unix.SHUT_RDWR)
	<-s.done
	return unix.Close(s.fd)
}
