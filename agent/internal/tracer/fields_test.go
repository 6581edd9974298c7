package tracer

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/cilium/ebpf/btf"
	"golang.org/x/sys/unix"

	"github.com/hoptrace/hoptrace/agent/internal/attach"
	"github.com/hoptrace/hoptrace/agent/internal/loader"
	"github.com/hoptrace/hoptrace/agent/internal/netns"
	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
	"github.com/hoptrace/hoptrace/agent/internal/probe"
	"github.com/hoptrace/hoptrace/agent/internal/record"
	tu "github.com/hoptrace/hoptrace/agent/internal/testutil"
)

// dropReason is the value of enum skb_drop_reason's name in this kernel's BTF (the values move between
// kernels: never hard-coded).
func dropReason(t *testing.T, name string) uint64 {
	t.Helper()
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		t.Fatal(err)
	}
	var e *btf.Enum
	if err := spec.TypeByName("skb_drop_reason", &e); err != nil {
		t.Fatal(err)
	}
	for _, v := range e.Values {
		if v.Name == name {
			return v.Value
		}
	}
	t.Fatalf("enum skb_drop_reason has no %s", name)
	return 0
}

// TestTracerNewFieldsOnRealTraffic sends datagrams with a chosen TTL to a port nothing listens on: the
// sender's egress counts them by ttl, and skb:kfree_skb on the receiver counts them by drop reason (each
// is dropped by UDP for want of a socket). Untagged: UDP trims a tagged packet's ID (the surplus area)
// before it drops it, so at kfree_skb its IP length no longer fits and the parser counts it truncated.
func TestTracerNewFieldsOnRealTraffic(t *testing.T) {
	tu.RequireRoot(t)
	if why := probe.KfreeSkbReasonMissing(); why != "" {
		t.Fatalf("this test needs skb:kfree_skb's reason argument (Linux 5.17+): %s", why)
	}
	p := tu.NewVethPair(t, "198.18.44")
	m, _ := newTestManager(t)
	const ttl, sent = 29, 15
	pl := &pb.TracePlan{
		Trace: "t-fields", Generation: 1, ObjectPath: tu.ObjectPath(),
		Match: &pb.FlowMatch{IpProto: 17, DstPort: 5000},
		Hops: []*pb.HopAttach{
			{HopIndex: 0, Name: "a-out", Kind: pb.AttachKind_ATTACH_KIND_TC_EGRESS, Program: loader.ProgTC,
				Dev: p.DevA, Netns: p.NsA,
				Actions: &pb.HopActions{Count: true, CountBy: pb.Field_FIELD_TTL}},
			{HopIndex: 1, Name: "b-drop", Kind: pb.AttachKind_ATTACH_KIND_TRACEPOINT, TracepointGroup: "skb",
				TracepointEvent: "kfree_skb", Program: loader.ProgTPBTFKfree, Dev: p.DevB, Netns: p.NsB,
				Actions: &pb.HopActions{Count: true, CountBy: pb.Field_FIELD_DROP_REASON}},
		},
	}
	applyAttached(t, m, pl)
	err := netns.Do(netns.Path(p.NsA, ""), func() error {
		conn, err := net.ListenPacket("udp4", ":0")
		if err != nil {
			return err
		}
		defer conn.Close()
		raw, err := conn.(*net.UDPConn).SyscallConn()
		if err != nil {
			return err
		}
		var serr error
		if err := raw.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_TTL, ttl) }); err != nil {
			return err
		}
		if serr != nil {
			return serr
		}
		to := &net.UDPAddr{IP: net.ParseIP(p.AddrB), Port: 5000}
		for i := 0; i < sent; i++ {
			if _, err := conn.WriteTo(make([]byte, 20+i*30), to); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("send: %v", err)
	}

	noSocket := dropReason(t, "SKB_DROP_REASON_NO_SOCKET")
	var out, drop *pb.HopActionValues
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		for _, tc := range m.Counters() {
			for _, h := range tc.Hops {
				switch h.GetHopIndex() {
				case 0:
					out = h.GetActions()
				case 1:
					drop = h.GetActions()
				}
			}
		}
		if out.GetCounts()[ttl] == sent && drop.GetCounts()[noSocket] == sent {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(out.GetCounts()) != 1 || out.GetCounts()[ttl] != sent {
		t.Errorf("a-out count by ttl %v, want {%d: %d}", out.GetCounts(), ttl, sent)
	}
	if len(drop.GetCounts()) != 1 || drop.GetCounts()[noSocket] != sent {
		t.Errorf("b-drop count by drop_reason %v, want {%d (SKB_DROP_REASON_NO_SOCKET): %d}", drop.GetCounts(), noSocket, sent)
	}
}

// TestTracerPIDAtCgroupEgress: a child process in a cgroup of its own sends datagrams; the cgroup-egress
// hop on that cgroup counts them by pid, all under the child's own PID (the sending task runs the program).
func TestTracerPIDAtCgroupEgress(t *testing.T) {
	tu.RequireRoot(t)
	if why := probe.FieldRefusal(record.FieldPID); why != "" {
		t.Fatalf("pid needs bpf_get_current_pid_tgid in cgroup_skb programs: %s", why)
	}
	p := tu.NewVethPair(t, "198.18.45")
	mount, err := attach.Cgroup2Mount()
	if err != nil {
		t.Fatal(err)
	}
	rel := "hoptrace-test-" + tu.Name()
	dir := filepath.Join(mount, rel)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(dir) })

	m, _ := newTestManager(t)
	pl := &pb.TracePlan{
		Trace: "t-pid", Generation: 1, ObjectPath: tu.ObjectPath(),
		Match: &pb.FlowMatch{IpProto: 17, DstPort: 5000},
		Hops: []*pb.HopAttach{{HopIndex: 0, Name: "app-out", Kind: pb.AttachKind_ATTACH_KIND_CGROUP_EGRESS,
			Program: loader.ProgCgroupSKB, Cgroup: rel, Actions: &pb.HopActions{Count: true, CountBy: pb.Field_FIELD_PID}}},
	}
	st := m.Apply(pl)
	if !st.GetActive() || st.GetError() != "" || !st.GetHops()[0].GetAttached() {
		t.Fatalf("status %v", st)
	}

	// The child waits for a line on stdin (sent once it is in the cgroup), then sends from netns A.
	const sent = 12
	script := fmt.Sprintf("import socket,sys\nsys.stdin.readline()\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n"+
		"[s.sendto(b'x'*(i+1),(%q,5000)) for i in range(%d)]\n", p.AddrB, sent)
	child := exec.Command("ip", "netns", "exec", p.NsA, "python3", "-c", script)
	stdin, err := child.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	// ip netns exec execs python3 in place: the PID is the sender's.
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(child.Process.Pid)), 0o644); err != nil {
		_ = child.Process.Kill()
		t.Fatal(err)
	}
	if _, err := stdin.Write([]byte("go\n")); err != nil {
		t.Fatal(err)
	}
	stdin.Close()
	if err := child.Wait(); err != nil {
		t.Fatalf("sender: %v", err)
	}

	var counts map[uint64]uint64
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		for _, tc := range m.Counters() {
			for _, h := range tc.Hops {
				counts = h.GetActions().GetCounts()
			}
		}
		if counts[uint64(child.Process.Pid)] == sent {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(counts) != 1 || counts[uint64(child.Process.Pid)] != sent {
		t.Errorf("count by pid %v, want {%d (the sender): %d}", counts, child.Process.Pid, sent)
	}
}
