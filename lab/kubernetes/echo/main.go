// Command echo is the lab cluster's test image (hoptrace.lab.kubernetes): it
// sends back every TCP byte and every UDP datagram it receives on one port,
// so a test can check a Service's path byte for byte. With --relay ADDR it is
// the client instead: its standard input goes to a TCP connection to ADDR and
// what comes back to its standard output (`kubectl exec -i` in a client pod).
// With --udp-send ADDR it sends --count numbered UDP datagrams to ADDR and
// prints, as one JSON line, how many it sent (the kernel took each one) and
// how many came back: the ground truth of a traced flow. With --tcp-send ADDR
// it writes --count messages of --size bytes, --gap apart, over one TCP
// connection to ADDR (no Nagle: each write its own segment), closes its
// sending side and prints how many it wrote and how many bytes came back.
// Static, with no dependencies: the image is this binary alone (no registry
// is reachable).
package main

import (
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"time"
)

func main() {
	port := flag.Int("port", 7007, "TCP and UDP port to echo on")
	relayTo := flag.String("relay", "", "HOST:PORT: relay standard input and output over TCP instead")
	udpTo := flag.String("udp-send", "", "HOST:PORT: send --count UDP datagrams there instead")
	tcpTo := flag.String("tcp-send", "", "HOST:PORT: write --count messages over one TCP connection there instead")
	count := flag.Int("count", 100, "datagrams (messages) to send with --udp-send (--tcp-send)")
	size := flag.Int("size", 64, "bytes of each datagram or message (at least 4: its number)")
	gap := flag.Duration("gap", time.Millisecond, "pause between two datagrams or messages")
	flag.Parse()
	if *tcpTo != "" {
		result, err := tcpSend(*tcpTo, *count, *size, *gap)
		if err != nil {
			log.Fatal(err)
		}
		_ = json.NewEncoder(os.Stdout).Encode(result)
		return
	}
	if *udpTo != "" {
		result, err := udpSend(*udpTo, *count, *size, *gap)
		if err != nil {
			log.Fatal(err)
		}
		_ = json.NewEncoder(os.Stdout).Encode(result)
		return
	}
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

// udpResult is what --udp-send prints.
type udpResult struct {
	Sent   int `json:"sent"`
	Echoed int `json:"echoed"`
}

// udpSend sends count datagrams of size bytes (each starting with its
// number) to addr, gap apart, and counts the distinct ones echoed back
// until a second after the last went out.
func udpSend(addr string, count, size int, gap time.Duration) (udpResult, error) {
	var result udpResult
	if size < 4 {
		return result, fmt.Errorf("--size %d: at least 4", size)
	}
	conn, err := net.Dial("udp", addr)
	if err != nil {
		return result, err
	}
	defer conn.Close()
	echoed := make(chan int, 1)
	go func() {
		seen := make(map[uint32]bool)
		buf := make([]byte, 65536)
		for {
			n, err := conn.Read(buf)
			if err != nil { // the deadline set after the last send
				echoed <- len(seen)
				return
			}
			if n >= 4 {
				seen[binary.BigEndian.Uint32(buf)] = true
			}
		}
	}()
	payload := make([]byte, size)
	for i := 0; i < count; i++ {
		binary.BigEndian.PutUint32(payload, uint32(i))
		if _, err := conn.Write(payload); err != nil {
			return result, fmt.Errorf("datagram %d: %w", i, err)
		}
		result.Sent++
		time.Sleep(gap)
	}
	_ = conn.SetReadDeadline(time.Now().Add(time.Second))
	result.Echoed = <-echoed
	return result, nil
}

// tcpResult is what --tcp-send prints.
type tcpResult struct {
	Writes int `json:"writes"`
	Bytes  int `json:"bytes"`
	Echoed int `json:"echoed"`
}

// tcpSend writes count messages of size bytes (each starting with its
// number) over one TCP connection to addr, gap apart, each its own segment
// (Go sets TCP_NODELAY), then closes its sending side and counts the bytes
// echoed until the peer closes.
func tcpSend(addr string, count, size int, gap time.Duration) (tcpResult, error) {
	var result tcpResult
	if size < 4 {
		return result, fmt.Errorf("--size %d: at least 4", size)
	}
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		return result, err
	}
	defer conn.Close()
	echoed := make(chan int, 1)
	go func() {
		n, _ := io.Copy(io.Discard, conn)
		echoed <- int(n)
	}()
	payload := make([]byte, size)
	for i := 0; i < count; i++ {
		binary.BigEndian.PutUint32(payload, uint32(i))
		if _, err := conn.Write(payload); err != nil {
			return result, fmt.Errorf("message %d: %w", i, err)
		}
		result.Writes++
		result.Bytes += size
		time.Sleep(gap)
	}
	if err := conn.(*net.TCPConn).CloseWrite(); err != nil {
		return result, err
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	result.Echoed = <-echoed
	return result, nil
}
