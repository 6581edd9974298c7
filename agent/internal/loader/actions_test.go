package loader_test

import (
	"errors"
	"math/bits"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/hoptrace/hoptrace/agent/internal/loader"
	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
	"github.com/hoptrace/hoptrace/agent/internal/record"
	tu "github.com/hoptrace/hoptrace/agent/internal/testutil"
)

// Hop actions (count, count by FIELD, histogram: FIELD, the latency field)
// through BPF_PROG_TEST_RUN: every value is compared with what the test sent.

// log2Bucket is hop.bpf.h's bucket of v: floor(log2(v)) + 1, 0 for 0.
func log2Bucket(v uint64) int { return bits.Len64(v) }

// skbCtx is the head of struct __sk_buff up to priority: BPF_PROG_TEST_RUN
// lets a test set mark and priority (bpf_ctx_init in net/bpf/test_run.c).
type skbCtx struct {
	Len, PktType, Mark, QueueMapping, Protocol, VlanPresent, VlanTCI, VlanProto, Priority uint32
}

func (h *harness) runCtx(t testing.TB, hop *loader.Hop, pkt []byte, ctx *skbCtx) []record.Record {
	t.Helper()
	opts := &ebpf.RunOptions{Data: pkt, DataOut: make([]byte, len(pkt)+256)}
	if ctx != nil {
		opts.Context = *ctx
	}
	if _, err := hop.Program.Run(opts); err != nil {
		t.Fatalf("test run: %v", err)
	}
	return h.drain(t)
}

// runCtxAny runs pkt with any ctx value (a struct in struct __sk_buff's layout).
func (h *harness) runCtxAny(t testing.TB, hop *loader.Hop, pkt []byte, ctx any) []record.Record {
	t.Helper()
	opts := &ebpf.RunOptions{Data: pkt, DataOut: make([]byte, len(pkt)+256), Context: ctx}
	if _, err := hop.Program.Run(opts); err != nil {
		t.Fatalf("test run: %v", err)
	}
	return h.drain(t)
}

func actions(t testing.TB, hop *loader.Hop) loader.ActionValues {
	t.Helper()
	v, err := hop.ReadActions()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func sum(m map[uint64]uint64) (n uint64) {
	for _, v := range m {
		n += v
	}
	return n
}

func TestActionCountEqualsMatchedPackets(t *testing.T) {
	h := newHarness(t)
	fc, err := loader.FilterFromMatch(&pb.FlowMatch{IpProto: 17, DstPort: 5000})
	if err != nil {
		t.Fatal(err)
	}
	hop := h.load(t, loader.HopConfig{Filter: fc, Actions: loader.Actions{Count: true}})
	const matched, other = 25, 7
	for i := 0; i < matched; i++ {
		h.run(t, hop, udp4(0)) // untagged packets count too: count sees every matched packet
	}
	for i := 0; i < other; i++ {
		h.run(t, hop, tu.Cat(tu.Ethernet(0x0800), tu.IPv4(17, src4, dst4, nil, tu.UDP(1, 6000, []byte("x")), 0)))
	}
	v := actions(t, hop)
	if len(v.Counts) != 1 || v.Counts[0] != matched {
		t.Fatalf("counts %v, want {0: %d} (matched packets only)", v.Counts, matched)
	}
	if cn := counters(t, hop); cn[record.CMatched] != matched || cn[record.CNotMatched] != other {
		t.Errorf("counters %v", cn)
	}
}

// Segments of the filter's flow that carry no ID in Linux's layouts leave the fast path early
// (hop.bpf.h's hop_fast_untagged); counted as the general parser counts them, and still seen by
// count and histogram actions, which read every matched packet.
func TestUntaggedTCPSegmentsCountAlike(t *testing.T) {
	h := newHarness(t)
	fc, err := loader.FilterFromMatch(&pb.FlowMatch{IpProto: 6, DstPort: 5000})
	if err != nil {
		t.Fatal(err)
	}
	timestamps := []byte{1, 1, 8, 10, 0, 0, 0, 7, 0, 0, 0, 9}
	segments := [][]byte{
		tu.Cat(tu.Ethernet(0x0800), tu.IPv4(6, src4, dst4, nil, tu.TCP(40000, 5000, nil, []byte("bare")), 0)),
		tu.Cat(tu.Ethernet(0x0800), tu.IPv4(6, src4, dst4, nil, tu.TCP(40000, 5000, timestamps, []byte("ts")), 0)),
		tu.Cat(tu.Ethernet(0x86dd), tu.IPv6(6, src6, dst6, nil, tu.TCP(40000, 5000, timestamps, []byte("six")), 0)),
	}
	var wireBytes uint64
	for _, s := range segments {
		wireBytes += uint64(len(s))
	}
	for _, actionsCase := range []loader.Actions{{}, {Count: true, CountBy: record.FieldTCPFlags}, {Histogram: record.FieldLen}} {
		cfg := loader.HopConfig{Filter: fc, Actions: actionsCase}
		for _, hop := range []*loader.Hop{h.load(t, cfg), h.loadGeneralOnly(t, cfg)} {
			for _, s := range segments {
				if _, recs := h.run(t, hop, s); len(recs) != 0 {
					t.Fatalf("%+v: an untagged segment recorded: %+v", actionsCase, recs)
				}
			}
			cn := counters(t, hop)
			n := uint64(len(segments))
			if cn[record.CSeen] != n || cn[record.CMatched] != n || cn[record.CUntagged] != n || cn[record.CBytes] != wireBytes {
				t.Errorf("%+v: counters %v, want %d seen, matched and untagged, %d bytes", actionsCase, cn, n, wireBytes)
			}
			v := actions(t, hop)
			if actionsCase.Count && sum(v.Counts) != n {
				t.Errorf("%+v: count sums to %d, want %d: %v", actionsCase, sum(v.Counts), n, v.Counts)
			}
			var held uint64
			for _, c := range v.Buckets {
				held += c
			}
			if actionsCase.Histogram != record.FieldNone && held != n {
				t.Errorf("%+v: histogram holds %d, want %d: %v", actionsCase, held, n, v.Buckets)
			}
		}
	}
}

func TestActionCountByCPUAndMark(t *testing.T) {
	h := newHarness(t)
	byCPU := h.load(t, loader.HopConfig{Actions: loader.Actions{Count: true, CountBy: record.FieldCPU}})
	const n = 40
	for i := 0; i < n; i++ {
		h.run(t, byCPU, udp4(0x07000001))
	}
	v := actions(t, byCPU)
	if sum(v.Counts) != n {
		t.Fatalf("count by cpu sums to %d, want %d: %v", sum(v.Counts), n, v.Counts)
	}
	for cpu := range v.Counts {
		if cpu >= uint64(runtime.NumCPU()) {
			t.Errorf("key %d is not a CPU of this machine (%d CPUs)", cpu, runtime.NumCPU())
		}
	}

	byMark := h.load(t, loader.HopConfig{Actions: loader.Actions{Count: true, CountBy: record.FieldMark}})
	marks := map[uint32]uint64{0x10: 3, 0x2000: 5, 0: 2}
	for mark, times := range marks {
		for i := uint64(0); i < times; i++ {
			h.runCtx(t, byMark, udp4(0), &skbCtx{Mark: mark})
		}
	}
	v = actions(t, byMark)
	if len(v.Counts) != len(marks) {
		t.Fatalf("count by mark %v, want %v", v.Counts, marks)
	}
	for mark, times := range marks {
		if v.Counts[uint64(mark)] != times {
			t.Errorf("mark %#x counted %d, want %d (%v)", mark, v.Counts[uint64(mark)], times, v.Counts)
		}
	}
}

func TestActionHistogramOfLen(t *testing.T) {
	h := newHarness(t)
	hop := h.load(t, loader.HopConfig{Actions: loader.Actions{Histogram: record.FieldLen}})
	want := map[int]uint64{}
	total := 0
	for _, payload := range []int{1, 10, 100, 700, 1400, 100, 10} {
		pkt := tu.Cat(tu.Ethernet(0x0800), tu.IPv4(17, src4, dst4, nil, tu.UDP(1, 2, make([]byte, payload)), 0))
		recs := h.runCtx(t, hop, pkt, nil)
		if len(recs) != 0 {
			t.Fatalf("untagged packet recorded")
		}
		want[log2Bucket(uint64(len(pkt)))]++
		total++
	}
	v := actions(t, hop)
	var got uint64
	for b, c := range v.Buckets {
		got += c
		if c != want[b] {
			t.Errorf("bucket %d (le %d): %d, want %d", b, uint64(1)<<b-1, c, want[b])
		}
	}
	if got != uint64(total) {
		t.Errorf("histogram total %d, want %d matched packets", got, total)
	}
	if cn := counters(t, hop); cn[record.CMatched] != uint64(total) {
		t.Errorf("counters %v", cn)
	}
}

// Two hops of one trace on one node share prev_ts: the second hop's latency
// histogram holds exactly the gaps between the two hops' record timestamps.
func TestActionLatencyFromPreviousHop(t *testing.T) {
	h := newHarness(t)
	prev, err := loader.NewPrevTS(h.spec)
	if err != nil || prev == nil {
		t.Fatalf("prev_ts: %v", err)
	}
	t.Cleanup(func() { prev.Close() })
	load := func(cfg loader.HopConfig) *loader.Hop {
		cfg.Program, cfg.Name, cfg.IDOrigin, cfg.TraceSlot = loader.ProgTC, "latency", 7, 3
		hop, err := loader.LoadHop(h.spec, cfg, loader.Options{Records: h.records, IDState: h.idState, PrevTS: prev, Cache: kernelBTF})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(hop.Close)
		return hop
	}
	first := load(loader.HopConfig{HopIndex: 0, Actions: loader.Actions{PrevTS: true}})
	second := load(loader.HopConfig{HopIndex: 1, Actions: loader.Actions{Histogram: record.FieldLatency}})

	want := map[int]uint64{}
	const n = 12
	for i := 0; i < n; i++ {
		pkt := udp4(0x07000100 + uint32(i))
		_, a := h.run(t, first, pkt)
		_, b := h.run(t, second, pkt)
		if len(a) != 1 || len(b) != 1 {
			t.Fatalf("records %v %v, want one at each hop", a, b)
		}
		want[log2Bucket(b[0].TsNs-a[0].TsNs)]++
	}
	// A packet the first hop never saw: a miss, not a bucket.
	h.run(t, second, udp4(0x07000fff))
	// An untagged packet carries no latency at all.
	h.run(t, second, udp4(0))

	v := actions(t, second)
	var total uint64
	for b, c := range v.Buckets {
		total += c
		if c != want[b] {
			t.Errorf("bucket %d: %d, want %d (from the records' timestamps)", b, c, want[b])
		}
	}
	if total != n {
		t.Errorf("latency histogram total %d, want %d packets seen at both hops", total, n)
	}
	if cn := counters(t, second); cn[record.CLatencyMiss] != 1 {
		t.Errorf("latency_miss %d, want 1 (counters %v)", cn[record.CLatencyMiss], cn)
	}
	if cn := counters(t, first); cn[record.CLatencyMiss] != 0 {
		t.Errorf("first hop counted misses: %v", cn)
	}
}

// A hop without actions keeps its action maps untouched: nothing on the hot path.
func TestNoActionsTouchNothing(t *testing.T) {
	h := newHarness(t)
	hop := h.load(t, loader.HopConfig{})
	for i := 0; i < 5; i++ {
		h.run(t, hop, udp4(0x07000001))
	}
	var k, val uint64
	if hop.CountKeys.Iterate().Next(&k, &val) {
		t.Errorf("count_keys has key %d without a count action", k)
	}
	hop.Actions = loader.Actions{Histogram: record.FieldLen} // read the buckets anyway
	for b, c := range actions(t, hop).Buckets {
		if c != 0 {
			t.Errorf("bucket %d = %d without a histogram action", b, c)
		}
	}
}

// The verifier's cost of every action at once stays far from its 1M-instruction limit, on the floor variants
// (the ones 5.10's verifier walks) and the full ones; a hop without actions costs what it did before them
// (their branches are constant-false and never walked). verified_insns is reported from 5.16.
func TestActionsVerifierCost(t *testing.T) {
	h := newHarness(t)
	all := loader.Actions{Count: true, CountBy: record.FieldMark, Histogram: record.FieldLatency, PrevTS: true,
		Record:  [record.ValuesMax]record.ActionField{record.FieldLen, record.FieldTTL, record.FieldTCPFlags, record.FieldCPU},
		Capture: record.CaptureMax}
	for _, program := range []string{loader.ProgTC, loader.ProgTPBTF, loader.ProgXDP} {
		cost := map[bool]uint32{}
		for _, with := range []bool{false, true} {
			cfg := loader.HopConfig{Program: program}
			if with {
				cfg.Actions = all
				if program == loader.ProgXDP {
					cfg.Actions.CountBy = record.FieldCPU // XDP has no mark
				}
			}
			hop := h.load(t, cfg)
			info, err := hop.Program.Info()
			if err != nil {
				t.Fatal(err)
			}
			n, ok := info.VerifiedInstructions()
			if !ok {
				t.Skip("verified_insns needs Linux 5.16")
			}
			cost[with] = n
		}
		t.Logf("%s (%s): %d verified instructions without actions, %d with all of them", program,
			loader.ProgramFor(h.spec, program), cost[false], cost[true])
		if cost[true] >= 1_000_000 || cost[true] > cost[false]+cost[false]/10 {
			t.Errorf("%s with every action: %d verified instructions (%d without): want under 1M and at most 10 %% more",
				program, cost[true], cost[false])
		}
	}
}

// refusingObject compiles hop_tc with HOPTRACE_TEST_REFUSED_HISTOGRAM: its
// histogram action leaves out a null check, so the kernel's verifier
// refuses that action, and only it.
func refusingObject(t *testing.T) *ebpf.CollectionSpec {
	t.Helper()
	dir := t.TempDir()
	src := filepath.Join(dir, "refusing.bpf.c")
	text := strings.Join([]string{`#include "vmlinux.h"`, "#include <bpf/bpf_helpers.h>",
		"#include <bpf/bpf_core_read.h>", "#include <bpf/bpf_endian.h>", "#include <bpf/bpf_tracing.h>",
		`#include "hop.bpf.h"`, "HOPTRACE_PROG_TC", `char LICENSE[] SEC("license") = "Dual BSD/GPL";`, ""}, "\n")
	if err := os.WriteFile(src, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	kp := filepath.Join(filepath.Dir(tu.ObjectPath()), "..")
	obj := filepath.Join(dir, "refusing.bpf.o")
	out, err := exec.Command("clang", "-O2", "-g", "-Wall", "-target", "bpf", "-D__TARGET_ARCH_x86",
		"-DHOPTRACE_TEST_REFUSED_HISTOGRAM", "-I"+filepath.Join(kp, "build"), "-I"+filepath.Join(kp, "include"),
		"-c", src, "-o", obj).CombinedOutput()
	if err != nil {
		t.Fatalf("clang: %v: %s", err, out)
	}
	spec, err := ebpf.LoadCollectionSpec(obj)
	if err != nil {
		t.Fatal(err)
	}
	return spec
}

// A hop the verifier refuses only for one of its actions names that action
// (the dispatcher turns it into hops[i].actions[j]), and the same hop with
// its other actions loads.
func TestRefusedActionIsNamed(t *testing.T) {
	h := newHarness(t)
	h.spec = refusingObject(t)
	others := loader.Actions{Count: true, CountBy: record.FieldCPU, Record: [record.ValuesMax]record.ActionField{record.FieldLen}}
	hop := h.load(t, loader.HopConfig{Actions: others})
	h.run(t, hop, udp4(0))
	if got := sum(actions(t, hop).Counts); got != 1 {
		t.Fatalf("count without the histogram: %d packets, want 1", got)
	}

	all := others
	all.Histogram = record.FieldLen
	_, err := loader.LoadHop(h.spec, loader.HopConfig{Name: "refused", Program: loader.ProgTC, Actions: all},
		loader.Options{Records: h.records, IDState: h.idState, Cache: kernelBTF})
	t.Logf("refusal: %v", err)
	var refused *loader.ActionsRefusedError
	if !errors.As(err, &refused) {
		t.Fatalf("load with the histogram: %v, want an ActionsRefusedError", err)
	}
	if want := (loader.Actions{Histogram: record.FieldLen}); refused.Refused != want {
		t.Fatalf("refused %+v, want only the histogram %+v", refused.Refused, want)
	}
	if msg := err.Error(); !strings.Contains(msg, "hop refused: the kernel's verifier refuses its histogram action") ||
		!strings.Contains(msg, "invalid mem access") {
		t.Fatalf("error %q does not name the action and the verifier's reason", msg)
	}
	if p := refused.Refused.Proto(); p.GetHistogram() != pb.Field_FIELD_LEN || p.GetCount() || len(p.GetRecord()) != 0 {
		t.Fatalf("proto of the refused actions: %v", p)
	}
}
