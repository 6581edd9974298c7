package loader

import (
	"testing"

	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
	"github.com/hoptrace/hoptrace/agent/internal/record"
)

func TestFilterFromMatch(t *testing.T) {
	m := &pb.FlowMatch{IpProto: 17, Family: 4, SrcAddr: []byte{198, 18, 1, 0}, SrcMask: []byte{255, 255, 255, 0},
		DstAddr: []byte{198, 18, 2, 3}, DstMask: []byte{255, 255, 255, 255}, SrcPort: 1, DstPort: 5000}
	c, err := FilterFromMatch(m)
	if err != nil {
		t.Fatal(err)
	}
	if c.Proto != 17 || c.Family != 4 || c.Sport != 1 || c.Dport != 5000 {
		t.Fatalf("%+v", c)
	}
	if c.Src != [16]byte{198, 18, 1, 0} || c.SrcMask != [16]byte{255, 255, 255, 0} || c.Dst != [16]byte{198, 18, 2, 3} {
		t.Errorf("%+v", c)
	}
	if c, err := FilterFromMatch(nil); err != nil || c != (FilterConstants{}) {
		t.Errorf("nil match: %+v %v", c, err)
	}
	for _, bad := range []*pb.FlowMatch{
		{IpProto: 1},
		{Family: 5},
		{DstPort: 70000},
		{SrcAddr: make([]byte, 17)},
	} {
		if _, err := FilterFromMatch(bad); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}

func TestNodeOriginIsAboveTheTraces(t *testing.T) {
	seen := map[uint8]bool{}
	for _, n := range []string{"", "a", "b", "node-1", "node-2", "host-with-a-long-name"} {
		o := NodeOrigin(n)
		if o <= record.TraceOrigins {
			t.Errorf("origin of %q is %d, one the dispatcher gives traces (1..%d)", n, o, record.TraceOrigins)
		}
		seen[o] = true
		if NodeOrigin(n) != o {
			t.Error("not deterministic")
		}
	}
	// FNV-1a("a") = 0xe40c292c.
	if got, want := NodeOrigin("a"), uint8(0xe40c292c%(255-record.TraceOrigins))+record.TraceOrigins+1; got != want {
		t.Errorf("NodeOrigin(a) = %d, want %d", got, want)
	}
	if len(seen) < 4 {
		t.Errorf("origins collide too much: %v", seen)
	}
}
