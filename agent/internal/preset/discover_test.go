package preset

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"reflect"
	"sort"
	"testing"
	"time"

	"github.com/cilium/ebpf/btf"

	"github.com/hoptrace/hoptrace/agent/internal/netns"
	tu "github.com/hoptrace/hoptrace/agent/internal/testutil"
)

// The Go mirror of struct hoptrace_crossing (include/discover.h) has its
// fields at the offsets the object's BTF says, and the directions their values.
func TestCrossingLayoutMatchesBTF(t *testing.T) {
	f, err := os.Open(tu.ObjectPath())
	if err != nil {
		t.Fatalf("%v: run make bpf", err)
	}
	defer f.Close()
	spec, err := btf.LoadSpecFromReader(f)
	if err != nil {
		t.Fatal(err)
	}
	var st *btf.Struct
	if err := spec.TypeByName("hoptrace_crossing", &st); err != nil {
		t.Fatal(err)
	}
	if st.Size != CrossingSize {
		t.Fatalf("sizeof(struct hoptrace_crossing) = %d, Go says %d", st.Size, CrossingSize)
	}
	goType := reflect.TypeOf(RawCrossing{})
	if goType.NumField() != len(st.Members) {
		t.Fatalf("C has %d members, Go %d fields", len(st.Members), goType.NumField())
	}
	for i, m := range st.Members {
		field := goType.Field(i)
		size, err := btf.Sizeof(m.Type)
		if err != nil {
			t.Fatal(err)
		}
		if uint32(field.Offset) != m.Offset.Bytes() || int(field.Type.Size()) != size {
			t.Errorf("%s: C offset %d size %d, Go %s offset %d size %d", m.Name, m.Offset.Bytes(), size,
				field.Name, field.Offset, field.Type.Size())
		}
	}
	var dir *btf.Enum
	if err := spec.TypeByName("hoptrace_direction", &dir); err != nil {
		t.Fatal(err)
	}
	want := map[string]uint64{"HOPTRACE_DIR_INGRESS": DirIngress, "HOPTRACE_DIR_EGRESS": DirEgress}
	for _, v := range dir.Values {
		if want[v.Name] != v.Value {
			t.Errorf("%s = %d in C, %d in Go", v.Name, v.Value, want[v.Name])
		}
	}
	b := make([]byte, CrossingSize)
	b[0], b[8], b[16], b[20], b[24], b[28], b[30] = 9, 7, 3, 5, 60, DirEgress, 4
	c, err := DecodeCrossing(b)
	if err != nil || c.TsNs != 9 || c.PacketID != 7 || c.Ifindex != 3 || c.NetnsIno != 5 || c.WireLen != 60 ||
		c.Direction != DirEgress || c.Flags != 4 {
		t.Fatalf("%+v %v", c, err)
	}
}

// Real packets rather than BPF_PROG_TEST_RUN: a tp_btf program's context is
// the event's raw arguments, here a struct sk_buff pointer, and no skb can be
// crafted in kernel memory from user space (this kernel answers EFAULT). The
// parser they share with the hop programs is covered by loader/prog_test.go's
// crafted frames.
//
// Real packets on a veth pair between two namespaces of one "host": the
// tagger in the sender's netns tags them, and every packet is seen leaving
// vha in netns a and arriving on vhb in netns b, in that order, with the
// devices named. A namespace not owned is not reported. Runs the _floor
// variants with HOPTRACE_FLOOR=1.
func TestDiscoverVethPair(t *testing.T) {
	tu.RequireRoot(t)
	for _, proto := range []string{"udp", "tcp"} {
		t.Run(proto, func(t *testing.T) {
			pair := tu.NewVethPair(t, map[string]string{"udp": "198.18.61", "tcp": "198.18.62"}[proto])
			stop := make(chan struct{})
			defer close(stop)
			go sendFlow(t, proto, pair, stop)

			ipProto := map[string]int{"udp": 17, "tcp": 6}[proto]
			match := fmt.Sprintf(`{"ipProto":%d,"family":4,"srcAddr":%q,"srcMask":"/////w==","dstAddr":%q,"dstMask":"/////w==","dstPort":7777}`,
				ipProto, b64(pair.AddrA), b64(pair.AddrB))
			var out bytes.Buffer
			cfg := DiscoverConfig{Node: "n1", HostNetns: pair.NsA, Owned: pair.NsB, Match: match,
				Duration: 5 * time.Second, Packets: 5, Object: tu.ObjectPath()}
			if err := RunDiscover(context.Background(), cfg, &out); err != nil {
				t.Fatal(err)
			}
			summary := lastSummary(t, out.Bytes())
			if summary.Packets < 5 {
				t.Fatalf("saw %d packets, want >= 5: %s", summary.Packets, out.String())
			}
			byPacket := map[uint32][]DiscoveredCrossing{}
			for _, c := range summary.Crossings {
				byPacket[c.PacketID] = append(byPacket[c.PacketID], c)
			}
			complete := 0
			for id, cs := range byPacket {
				sort.SliceStable(cs, func(i, j int) bool { return cs[i].MonoNs < cs[j].MonoNs })
				got := ""
				for _, c := range cs {
					got += fmt.Sprintf("%s/%s/%s ", c.Netns, c.Dev, c.Direction)
				}
				want := fmt.Sprintf("/vha/egress %s/vhb/ingress ", pair.NsB)
				if got == want {
					complete++
				} else if len(cs) > 2 {
					t.Errorf("packet %#x: %s, want %s", id, got, want)
				}
			}
			if complete < 5 {
				t.Fatalf("%d packets crossed vha then vhb, want >= 5: %+v", complete, byPacket)
			}
		})
	}
}

func b64(addr string) string { return base64.StdEncoding.EncodeToString(net.ParseIP(addr).To4()) }

type discoverSummary struct {
	Packets   int                  `json:"packets"`
	Crossings []DiscoveredCrossing `json:"crossings"`
}

func lastSummary(t *testing.T, out []byte) discoverSummary {
	t.Helper()
	var s discoverSummary
	found := false
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	for sc.Scan() {
		var head struct {
			Type string `json:"type"`
		}
		if json.Unmarshal(sc.Bytes(), &head) == nil && head.Type == "summary" {
			if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
				t.Fatal(err)
			}
			found = true
		}
	}
	if !found {
		t.Fatalf("no summary in %s", out)
	}
	return s
}

// sendFlow sends the flow a -> b:7777 until stop: UDP datagrams, or new TCP
// connections (sock_ops tags connections that start while discovery runs).
func sendFlow(t *testing.T, proto string, pair *tu.VethPair, stop chan struct{}) {
	var ln net.Listener
	if proto == "tcp" {
		_ = netns.Do(netns.Path(pair.NsB, ""), func() (err error) {
			ln, err = net.Listen("tcp", pair.AddrB+":7777")
			return err
		})
		if ln == nil {
			t.Error("listen in netns b failed")
			return
		}
		defer ln.Close()
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() { buf := make([]byte, 4096); _, _ = c.Read(buf); c.Close() }()
			}
		}()
	}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		var conn net.Conn
		_ = netns.Do(netns.Path(pair.NsA, ""), func() (err error) {
			conn, err = net.DialTimeout(proto, pair.AddrB+":7777", time.Second)
			return err
		})
		if conn != nil {
			_, _ = conn.Write([]byte("hoptrace discover test"))
			conn.Close()
		}
	}
}

// --follow takes trace ID origins only: 1..record.TraceOrigins, comma-separated.
func TestFollowOrigins(t *testing.T) {
	got, err := followOrigins(" 3,17 ,, 239")
	if err != nil || len(got) != 3 || got[0] != 3 || got[1] != 17 || got[2] != 239 {
		t.Fatalf("followOrigins: %v, %v", got, err)
	}
	if got, err := followOrigins(""); err != nil || len(got) != 0 {
		t.Fatalf("empty: %v, %v", got, err)
	}
	for _, bad := range []string{"0", "240", "256", "x", "-1"} {
		if _, err := followOrigins(bad); err == nil {
			t.Errorf("followOrigins(%q): no error", bad)
		}
	}
}
