package preset

import (
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
)

func TestSummarize(t *testing.T) {
	s := Summarize([]float64{5, 1, 4, 2, 3})
	if s.Count != 5 || s.MeanNs != 3 || s.P50Ns != 3 || s.P99Ns != 5 || s.MinNs != 1 || s.MaxNs != 5 {
		t.Fatalf("%+v", s)
	}
	if (Summarize(nil) != Stats{}) {
		t.Fatal("empty")
	}
}

func TestPairerCorrectsEchoes(t *testing.T) {
	p := NewMacePairer()
	req := KeyICMP | 8<<32 | 7<<16 | 3
	rep := KeyICMP | 0<<32 | 7<<16 | 3
	if _, e := p.Add(MaceEvent{Key: req, TsStartNs: 100, TsEndNs: 130, Direction: 1}); e != nil {
		t.Fatal("echo before its reply")
	}
	pk, e := p.Add(MaceEvent{Key: rep, TsStartNs: 500, TsEndNs: 510, Direction: 2})
	if e == nil || e.CorrectionNs != 40 || e.ID != 7 || e.Seq != 3 || pk.ICMP == nil || pk.OverheadNs != 10 {
		t.Fatalf("%+v %+v", pk, e)
	}
	eg, in := p.Summary([]uint64{mcEgressSeen: 2, mcEgressReported: 1, mcIngressSeen: 1, mcIngressReported: 1, mcMax - 1: 0})
	if eg.Coverage != 0.5 || in.Coverage != 1 || eg.Count != 1 {
		t.Fatalf("%+v %+v", eg, in)
	}
}

func TestAccountIron(t *testing.T) {
	caused := map[uint32]ironValue{10: {Ns: 900, Count: 9}}
	charged := map[ironChargedKey]ironValue{
		{CgroupID: 1, NetnsIno: 20, Tgid: 5, Kind: ironTask}:     {Ns: 700, Count: 3},
		{CgroupID: 1, NetnsIno: 10, Tgid: 6, Kind: ironTask}:     {Ns: 100, Count: 1},
		{CgroupID: 1, NetnsIno: 1, Tgid: 9, Kind: ironKsoftirqd}: {Ns: 50, Count: 1},
	}
	name := func(i uint32) string { return map[uint32]string{10: "nbr", 20: "victim"}[i] }
	acc := AccountIron(caused, charged, name, func(uint64) string { return "/" }, func(uint32) string { return "x" })
	if v := acc.Containers[20]; v.ChargedNs != 700 || v.DiffNs != 700 {
		t.Fatalf("victim %+v", v)
	}
	if n := acc.Containers[10]; n.CausedNs != 900 || n.DiffNs != -800 {
		t.Fatalf("neighbour %+v", n)
	}
	if _, ok := acc.Containers[1]; ok {
		t.Fatal("ksoftirqd time billed to a container")
	}
	lp := IronLineProtocol([]IronContainer{*acc.Containers[20]}, time.Unix(1, 0))
	if !strings.HasPrefix(lp, "net_cpu,container=victim,cgroup=/,node= caused_ns=0i,charged_ns=700i,diff_ns=700i") {
		t.Fatal(lp)
	}
}

// TestMaceEventLayout compares MaceEvent with struct mace_event in the object's BTF.
func TestMaceEventLayout(t *testing.T) {
	path, err := FindObject("mace.bpf.o", "")
	if err != nil {
		path = "../../../kernel-patch/build/mace.bpf.o"
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("%s missing: run make bpf", path)
	}
	spec, err := ebpf.LoadCollectionSpec(path)
	if err != nil {
		t.Fatal(err)
	}
	var st *btf.Struct
	if err := spec.Types.TypeByName("mace_event", &st); err != nil {
		t.Fatal(err)
	}
	rt := reflect.TypeOf(MaceEvent{})
	if st.Size != MaceEventSize || uintptr(st.Size) != rt.Size() || len(st.Members) != rt.NumField() {
		t.Fatalf("C %d bytes %d fields, Go %d bytes %d fields", st.Size, len(st.Members), rt.Size(), rt.NumField())
	}
	for i, m := range st.Members {
		if uint32(rt.Field(i).Offset) != m.Offset.Bytes() {
			t.Errorf("%s @%d, Go %s @%d", m.Name, m.Offset.Bytes(), rt.Field(i).Name, rt.Field(i).Offset)
		}
	}
}
