package agent

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hoptrace/hoptrace/agent/internal/netns"
	tu "github.com/hoptrace/hoptrace/agent/internal/testutil"
)

// child is a whole agent in a process of its own (TestMain), running a plan file and pinning in a
// directory; its JSON lines are read as they come.
type child struct {
	cmd   *exec.Cmd
	lines chan map[string]any
}

func startChild(t *testing.T, plan, pinDir string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "HTGO_AGENT_PLAN="+plan, "HTGO_AGENT_PIN_DIR="+pinDir)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	c := &child{cmd: cmd, lines: make(chan map[string]any, 1<<16)}
	go func() {
		defer close(c.lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) == nil {
				c.lines <- m
			}
		}
	}()
	return c
}

// status waits for the child's status line and fails the test unless the trace is active.
func (c *child) status(t *testing.T) map[string]any {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		select {
		case m, ok := <-c.lines:
			if !ok {
				t.Fatal("agent child exited")
			}
			if m["type"] == "status" {
				if m["active"] != true {
					t.Fatalf("trace not active: %v", m)
				}
				return m
			}
		case <-deadline:
			t.Fatal("no status line from the agent child")
		}
	}
}

// packets collects a child's records: hops seen per packet ID, and records of a hop seen twice.
type packets struct {
	mu    sync.Mutex
	hops  map[uint32]map[float64]bool
	twice int
}

func (p *packets) read(c *child) {
	for m := range c.lines {
		if m["type"] != "record" {
			continue
		}
		id, hop := uint32(m["packet_id"].(float64)), m["hop_index"].(float64)
		p.mu.Lock()
		if p.hops[id] == nil {
			p.hops[id] = map[float64]bool{}
		}
		if p.hops[id][hop] {
			p.twice++
		}
		p.hops[id][hop] = true
		p.mu.Unlock()
	}
}

func (p *packets) complete(hops int) (n int, twice int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, seen := range p.hops {
		if len(seen) == hops {
			n++
		}
	}
	return n, p.twice
}

// A whole agent SIGKILLed while a flow runs, and started again on its node: the hops it pinned go
// on recording while no agent runs, the next agent takes them over, and every datagram sent before,
// during and after the outage is traced at both hops once, each under an ID of its own (the ID
// sequence goes on). An agent started with a plan that no longer names the trace removes it; one
// that stops (SIGTERM, without --keep-on-exit) leaves nothing pinned or attached.
func TestSIGKILLedAgentIsTakenOverWithoutAGap(t *testing.T) {
	tu.RequireRoot(t)
	p := tu.NewVethPair(t, "198.18.51")
	planPath, plan := vethPlan(t, p, "kept", 1)
	plan.Hops[0].TagUdp = true
	writePlan(t, planPath, plan)
	pinDir := filepath.Join("/sys/fs/bpf", "hoptrace-test-"+tu.Name())
	t.Cleanup(func() { _ = os.RemoveAll(pinDir) })

	var conn net.PacketConn
	err := netns.Do(netns.Path(p.NsA, ""), func() error {
		var err error
		conn, err = net.ListenPacket("udp4", p.AddrA+":0") // the socket stays in NsA
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	got := &packets{hops: map[uint32]map[float64]bool{}}
	first := startChild(t, planPath, pinDir)
	first.status(t)
	go got.read(first)

	var sent atomic.Int64
	stop := make(chan struct{})
	sending := make(chan struct{})
	go func() {
		defer close(sending)
		to := &net.UDPAddr{IP: net.ParseIP(p.AddrB), Port: 5000}
		for {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
			if _, err := conn.WriteTo([]byte("hoptrace"), to); err == nil {
				sent.Add(1)
			}
		}
	}()
	stopSending := sync.OnceFunc(func() { close(stop); <-sending })
	defer stopSending()

	time.Sleep(300 * time.Millisecond) // the flow before the kill (pacing)
	if err := first.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = first.cmd.Wait()
	killedAt := sent.Load()
	time.Sleep(300 * time.Millisecond) // no agent runs (the outage tested)

	second := startChild(t, planPath, pinDir)
	second.status(t)
	go got.read(second)
	if held := bpfLinkIDs(t, second.cmd.Process.Pid); len(held) != 2 {
		t.Errorf("the agent that took over holds links %v, want its 2 hops'", held)
	}
	time.Sleep(300 * time.Millisecond) // the flow after the restart (pacing)
	stopSending()
	total := int(sent.Load())
	if total-int(killedAt) < 50 || killedAt < 50 {
		t.Fatalf("%d datagrams before the kill and %d after: too few to tell", killedAt, total-int(killedAt))
	}
	deadline := time.Now().Add(10 * time.Second)
	n, twice := got.complete(2)
	for n < total && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		n, twice = got.complete(2)
	}
	if n != total || twice != 0 {
		got.mu.Lock()
		only := map[string]int{}
		var minID, maxID uint32 = ^uint32(0), 0
		for id, seen := range got.hops {
			minID, maxID = min(minID, id), max(maxID, id)
			if len(seen) == 1 {
				for h := range seen {
					only[fmt.Sprint(h)]++
				}
			}
		}
		got.mu.Unlock()
		t.Fatalf("%d of %d datagrams traced at both hops, %d records twice (at one hop only: %v; IDs %#x..%#x)",
			n, total, twice, only, minID, maxID)
	}
	if ids := len(got.hops); ids != total {
		t.Errorf("%d packet IDs for %d datagrams: an ID was reused or a packet tagged twice", ids, total)
	}

	// A plan that no longer names the trace: it is removed, the plan's own runs.
	otherPath, other := vethPlan(t, p, "other", 1)
	other.Hops = other.Hops[:1]
	writePlan(t, otherPath, other)
	if err := second.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = second.cmd.Wait()
	third := startChild(t, otherPath, pinDir)
	third.status(t)
	if n := tcxPrograms(t, p.NsA, p.DevA) + tcxPrograms(t, p.NsB, p.DevB); n != 1 {
		t.Errorf("%d tcx programs, want the other plan's one", n)
	}
	if _, err := os.Stat(filepath.Join(pinDir, "killed", "kept")); !os.IsNotExist(err) {
		t.Errorf("the trace the plan no longer names is still pinned: %v", err)
	}
	if err := third.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	_ = third.cmd.Wait()
	if n := tcxPrograms(t, p.NsA, p.DevA) + tcxPrograms(t, p.NsB, p.DevB); n != 0 {
		t.Errorf("%d tcx programs after a SIGTERM without --keep-on-exit", n)
	}
	if _, err := os.Stat(filepath.Join(pinDir, "killed")); !os.IsNotExist(err) {
		t.Errorf("pins left after a SIGTERM without --keep-on-exit: %v", err)
	}
}
