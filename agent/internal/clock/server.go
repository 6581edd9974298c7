package clock

import (
	"errors"
	"fmt"
	"net"
	"time"

	"golang.org/x/sys/unix"
)

// Server is a minimal NTP server whose clock is CLOCK_REALTIME + Skew: a
// stand-in for the collector's time service in tests and demos. Like the
// collector's, it reads T2 when the request is in and T3 just before the
// reply leaves.
type Server struct {
	Skew time.Duration
	fd   int
	addr string
	done chan struct{}
}

// StartServer listens on addr (IPv4 host:port, port 0 = any) and answers
// until Close.
func StartServer(addr string, skew time.Duration) (*Server, error) {
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
	s := &Server{Skew: skew, fd: fd, done: make(chan struct{}),
		addr: (&net.UDPAddr{IP: net.IP(g.Addr[:]), Port: g.Port}).String()}
	go s.serve()
	return s, nil
}

// Addr is the bound host:port.
func (s *Server) Addr() string { return s.addr }

func (s *Server) serve() {
	defer close(s.done)
	buf := make([]byte, 512)
	for {
		n, from, err := unix.Recvfrom(s.fd, buf, 0)
		t2 := Realtime() + int64(s.Skew)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || n == 0 || from == nil {
			return // Close shut the socket down
		}
		req, err := ParsePacket(buf[:n])
		if err != nil || req.Mode != modeClient {
			continue
		}
		reply := Packet{Version: req.Version, Mode: modeServer, Stratum: 1, Origin: req.Transmit, Receive: ToNTP(t2)}
		reply.Transmit = ToNTP(Realtime() + int64(s.Skew))
		_ = unix.Sendto(s.fd, reply.Marshal(), 0, from)
	}
}

// Close stops the server.
func (s *Server) Close() error {
	_ = unix.Shutdown(s.fd, unix.SHUT_RDWR)
	<-s.done
	return unix.Close(s.fd)
}
