package loader

import (
	"testing"

	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
)

func TestFilterFromPlan(t *testing.T) {
	c, err := FilterFromPlan(&pb.Filter{Protocol: "UDP", Src: "198.18.1.77/24", Dst: "198.18.2.3", SrcPort: 1, DstPort: 5000})
	if err != nil {
		t.Fatal(err)
	}
	if c.Proto != 17 || c.Family != 4 || c.Sport != 1 || c.Dport != 5000 {
		t.Fatalf("%+v", c)
	}
	if c.Src != [16]byte{198, 18, 1, 0} || c.SrcMask != [16]byte{255, 255, 255, 0} {
		t.Errorf("src %v mask %v", c.Src, c.SrcMask)
	}
	if c.Dst != [16]byte{198, 18, 2, 3} || c.DstMask != [16]byte{255, 255, 255, 255} {
		t.Errorf("dst %v mask %v", c.Dst, c.DstMask)
	}

	c, err = FilterFromPlan(&pb.Filter{Protocol: "tcp", Dst: "fd00:1::/33"})
	if err != nil {
		t.Fatal(err)
	}
	if c.Proto != 6 || c.Family != 6 || c.Dst[0] != 0xfd || c.Dst[3] != 1 || c.DstMask[3] != 0xff || c.DstMask[4] != 0x80 || c.SrcMask != [16]byte{} {
		t.Errorf("%+v", c)
	}

	c, err = FilterFromPlan(&pb.Filter{Src: "::ffff:198.18.0.1"})
	if err != nil || c.Family != 4 || c.Src != [16]byte{198, 18, 0, 1} {
		t.Errorf("v4-mapped: %+v %v", c, err)
	}
	if c, err := FilterFromPlan(nil); err != nil || c != (FilterConstants{}) {
		t.Errorf("nil filter: %+v %v", c, err)
	}
	if c, err := FilterFromPlan(&pb.Filter{}); err != nil || c.Family != 0 {
		t.Errorf("empty filter: %+v %v", c, err)
	}

	for _, bad := range []*pb.Filter{
		{Protocol: "icmp"},
		{Src: "198.18.0.1", Dst: "fd00::1"},
		{Dst: "198.18.0.0/33"},
		{Src: "host.example"},
		{DstPort: 70000},
	} {
		if _, err := FilterFromPlan(bad); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}

func TestNodeSalt(t *testing.T) {
	seen := map[uint8]bool{}
	for _, n := range []string{"", "a", "b", "node-1", "node-2", "host-with-a-long-name"} {
		s := NodeSalt(n)
		if s == 0 {
			t.Errorf("salt of %q is 0", n)
		}
		seen[s] = true
		if NodeSalt(n) != s {
			t.Error("not deterministic")
		}
	}
	// FNV-1a("a") = 0xe40c292c; 0xe40c292c % 255 + 1.
	if got, want := NodeSalt("a"), uint8(0xe40c292c%255+1); got != want {
		t.Errorf("NodeSalt(a) = %d, want %d", got, want)
	}
	if len(seen) < 5 {
		t.Errorf("salts collide too much: %v", seen)
	}
}
