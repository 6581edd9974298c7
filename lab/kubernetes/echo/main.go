// Command echo is the lab cluster's test image (hoptrace.lab.kubernetes): it
// sends back every TCP byte and every UDP datagram it receives on one port,
// so a test can check a Service's path byte for byte. With --relay ADDR it is
// the client instead: its standard input goes to a TCP connection to ADDR and
// what comes back to its standard output (`kubectl exec -i` in a client pod).
// Static, with no dependencies: the image is this binary alone (no registry
// is reachable).
package main

import (
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
)

func main() {
	port := flag.Int("port", 7007, "TCP and UDP port to echo on")
	relayTo := flag.String("relay", "", "HOST:PORT: relay standard input and output over TCP instead")
	flag.Parse()
	if *relayTo != "" {
		if err := relay(*relayTo); err != nil {
			log.Fatal(err)
		}
		return
	}
	addr := fmt.Sprintf(":%d", *port)
	tcp, err := net.Listen("tcp", addr)
	if err != nil {
		log.Fatal(err)
	}
	udp, err := net.ListenPacket("udp", addr)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Fprintf(os.Stderr, "echo: TCP and UDP on %s\n", addr)
	go func() {
		buf := make([]byte, 65536)
		for {
			n, from, err := udp.ReadFrom(buf)
			if err != nil {
				log.Fatal(err)
			}
			_, _ = udp.WriteTo(buf[:n], from)
		}
	}()
	for {
		conn, err := tcp.Accept()
		if err != nil {
			log.Fatal(err)
		}
		go func() {
			defer conn.Close()
			_, _ = io.Copy(conn, conn)
		}()
	}
}

// relay copies standard input to a TCP connection to addr, closes its
// sending side at the input's end, and copies what comes back to standard
// output until the peer closes.
func relay(addr string) error {
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	sent := make(chan error, 1)
	go func() {
		_, err := io.Copy(conn, os.Stdin)
		if err == nil {
			err = conn.(*net.TCPConn).CloseWrite()
		}
		sent <- err
	}()
	if _, err := io.Copy(os.Stdout, conn); err != nil {
		return err
	}
	return <-sent
}
