package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/hoptrace/hoptrace/agent/internal/loader"
	"github.com/hoptrace/hoptrace/agent/internal/netns"
	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
	tu "github.com/hoptrace/hoptrace/agent/internal/testutil"
)

// TestMain turns the test binary into a whole agent (Run, standalone mode)
// for the tests that kill one when HTGO_AGENT_PLAN is set; it pins in
// HTGO_AGENT_PIN_DIR (none when unset).
func TestMain(m *testing.M) {
	if plan := os.Getenv("HTGO_AGENT_PLAN"); plan != "" {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM) // as main does
		err := Run(ctx, Config{Node: "killed", Plan: plan, AllowUnsignedPlan: true, Out: "-",
			PinDir: os.Getenv("HTGO_AGENT_PIN_DIR"), Log: slog.New(slog.NewTextHandler(os.Stderr, nil))})
		stop()
		fmt.Fprintln(os.Stderr, "agent child:", err)
		os.Exit(1)
	}
	goleak.VerifyTestMain(m)
}

// bpfLinkIDs are the BPF links a process holds, read from its fds' fdinfo.
func bpfLinkIDs(t *testing.T, pid int) []string {
	t.Helper()
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fdinfo", pid))
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, fd := range fds {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%s", pid, fd.Name()))
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			if rest, ok := strings.CutPrefix(l, "link_id:"); ok {
				ids = append(ids, strings.TrimSpace(rest))
			}
		}
	}
	return ids
}

func linkListed(t *testing.T, id string) bool {
	t.Helper()
	out, err := exec.Command("bpftool", "-j", "link", "show").Output()
	if err != nil {
		t.Fatalf("bpftool link show: %v", err)
	}
	var links []struct {
		ID json.Number `json:"id"`
	}
	if err := json.Unmarshal(out, &links); err != nil {
		t.Fatalf("bpftool output: %v", err)
	}
	for _, l := range links {
		if l.ID.String() == id {
			return true
		}
	}
	return false
}

func tcxPrograms(t *testing.T, ns, dev string) int {
	t.Helper()
	n := 0
	err := netns.Do(netns.Path(ns, ""), func() error {
		iface, err := net.InterfaceByName(dev)
		if err != nil {
			return err
		}
		for _, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
			r, err := link.QueryPrograms(link.QueryOptions{Target: iface.Index, Attach: at})
			if err != nil {
				return err
			}
			n += len(r.Programs)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("tcx query in %s: %v", ns, err)
	}
	return n
}

// A whole agent killed with SIGKILL while records flow leaves nothing
// attached: every attachment is an fd-based link, released with the
// process (nothing pinned in bpffs). Checked with `bpftool link show` and
// the devices' tcx lists.
func TestSIGKILLedAgentLeavesNothing(t *testing.T) {
	tu.RequireRoot(t)
	if _, err := exec.LookPath("bpftool"); err != nil {
		t.Fatal("bpftool is needed to check for left-over links")
	}
	p := tu.NewVethPair(t, "198.18.44")
	plan := &pb.TracePlan{
		Trace: "killme", Generation: 1, ObjectPath: tu.ObjectPath(),
		Match: &pb.FlowMatch{IpProto: 17, DstPort: 5000},
		Hops: []*pb.HopAttach{
			{HopIndex: 0, Name: "a-out", Kind: pb.AttachKind_ATTACH_KIND_TC_EGRESS, Program: loader.ProgTC, Dev: p.DevA, Netns: p.NsA},
			{HopIndex: 1, Name: "b-in", Kind: pb.AttachKind_ATTACH_KIND_TC_INGRESS, Program: loader.ProgTC, Dev: p.DevB, Netns: p.NsB},
			{HopIndex: 2, Name: "b-rx", Kind: pb.AttachKind_ATTACH_KIND_TRACEPOINT, TracepointGroup: "net", TracepointEvent: "netif_receive_skb", Program: loader.ProgTPBTF, Dev: p.DevB, Netns: p.NsB},
		},
	}
	planPath := filepath.Join(t.TempDir(), "plan.json")
	b, _ := protojson.Marshal(plan)
	if err := os.WriteFile(planPath, b, 0o644); err != nil {
		t.Fatal(err)
	}
	child := startChild(t, planPath, "") // pins nothing: its links go with it
	cmd, lines := child.cmd, child.lines

	// Mid-trace: wait for the attach status, then for records of our traffic.
	deadline := time.After(20 * time.Second)
	attached, records := false, 0
	id := uint32(0x43000001)
	for records < 3 {
		select {
		case m, ok := <-lines:
			if !ok {
				t.Fatal("agent child exited")
			}
			switch m["type"] {
			case "status":
				if m["active"] != true {
					t.Fatalf("trace not attached: %v", m)
				}
				attached = true
			case "record":
				records++
			}
		case <-time.After(50 * time.Millisecond):
			if attached {
				sendTaggedUDP(t, p.NsA, p.AddrA, p.AddrB, id)
				id++
			}
		case <-deadline:
			t.Fatalf("no records from the agent child (attached %v)", attached)
		}
	}
	ids := bpfLinkIDs(t, cmd.Process.Pid)
	if len(ids) < 3 {
		t.Fatalf("agent child holds links %v, want one per hop", ids)
	}
	for _, id := range ids {
		if !linkListed(t, id) {
			t.Fatalf("link %s not in bpftool link show while the agent runs", id)
		}
	}
	if n := tcxPrograms(t, p.NsA, p.DevA) + tcxPrograms(t, p.NsB, p.DevB); n != 2 {
		t.Fatalf("%d tcx programs while the agent runs, want 2", n)
	}

	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	// Links are released when the last fd closes; the kernel frees them
	// from a deferred context, so allow a moment.
	until := time.Now().Add(3 * time.Second)
	for _, id := range ids {
		for linkListed(t, id) && time.Now().Before(until) {
			time.Sleep(50 * time.Millisecond)
		}
		if linkListed(t, id) {
			t.Errorf("link %s survived the SIGKILLed agent", id)
		}
	}
	if n := tcxPrograms(t, p.NsA, p.DevA) + tcxPrograms(t, p.NsB, p.DevB); n != 0 {
		t.Errorf("%d tcx programs left after SIGKILL", n)
	}
}
