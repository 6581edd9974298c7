// Command echo is the lab cluster's test image (hoptrace.lab.kubernetes): it
// sends back every TCP byte and every UDP datagram it receives on one port,
// so a test can check a Service's path byte for byte. Static, with no
// dependencies: the image is this binary alone (no registry is reachable).
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
	flag.Parse()
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
