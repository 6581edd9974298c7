package loader_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/hoptrace/hoptrace/agent/internal/loader"
	"github.com/hoptrace/hoptrace/agent/internal/record"
	tu "github.com/hoptrace/hoptrace/agent/internal/testutil"
)

// hookTrace is one trace's hop in a hook: its slot and configuration, as the agent writes them.
type hookTrace struct {
	slot uint32
	cfg  loader.HopConfig
}

// hookObjectPath is kernel-patch/build/hook.bpf.o of this checkout, built by `make bpf`.
func hookObjectPath() string {
	return filepath.Join(filepath.Dir(tu.ObjectPath()), loader.HookObject)
}

// loadHook loads the hook program of this kernel (hook_tc, or hook_tc_floor where the kernel needs
// it) writing records into h's ring buffer, with traces in its maps.
func loadHook(t testing.TB, h *harness, traces []hookTrace) *loader.Hook {
	t.Helper()
	return loadHookLogged(t, h, loader.HookTCProgram, traces, 0)
}

// loadHookLogged loads the hook program `program` (loader.HookTCProgram, HookSockOpsProgram) with the
// verifier's log at level.
func loadHookLogged(t testing.TB, h *harness, program string, traces []hookTrace, level ebpf.LogLevel) *loader.Hook {
	t.Helper()
	spec, err := ebpf.LoadCollectionSpec(hookObjectPath())
	if err != nil {
		t.Fatalf("%s: %v (run make bpf)", hookObjectPath(), err)
	}
	hook, err := loader.LoadHook(spec, program, loader.HookTarget{}, loader.Options{Records: h.records, Cache: kernelBTF, LogLevel: level})
	if err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			t.Fatalf("%+v", ve) // the whole log: a kernel of the matrix refused it
		}
		t.Fatal(err)
	}
	t.Cleanup(hook.Close)
	setHookTraces(t, hook, traces)
	return hook
}

// setHookTraces puts traces in a hook, in place of those it held.
func setHookTraces(t testing.TB, hook *loader.Hook, traces []hookTrace) {
	t.Helper()
	for _, s := range hook.Slots() {
		if err := hook.Clear(s); err != nil {
			t.Fatal(err)
		}
	}
	for _, tr := range traces {
		if err := hook.Set(tr.slot, tr.cfg, 0); err != nil {
			t.Fatal(err)
		}
	}
}

// hookSlotCounters are a trace's counters at the hook, read now.
func hookSlotCounters(t testing.TB, hook *loader.Hook, slot uint32) record.Counters {
	t.Helper()
	c, err := hook.SlotCounters(slot, 0)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// hookCounters are the hook's own counters.
func hookCounters(t testing.TB, hook *loader.Hook) []uint64 {
	t.Helper()
	c, err := hook.HookCounters()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// otherTraces are n traces that take none of the test's packets: each its own destination port (UDP
// or TCP), one in five any port of another destination (candidates for every packet of their
// protocol, refused by their whole filter), and one in seven following IDs of another origin.
func otherTraces(n int, skip uint32) []hookTrace { return otherTracesAnyPort(n, skip, 5) }

// otherTracesAnyPort is otherTraces with one trace in anyPortEvery taking any port (0: none).
func otherTracesAnyPort(n int, skip uint32, anyPortEvery int) []hookTrace {
	var out []hookTrace
	for i, slot := 0, uint32(0); i < n; slot++ {
		if slot == skip {
			continue
		}
		f := loader.FilterConstants{Proto: 17, Dport: uint16(20000 + i)}
		if i%2 == 1 {
			f.Proto = 6
		}
		if anyPortEvery > 0 && i%anyPortEvery == 0 {
			f = loader.FilterConstants{Proto: f.Proto, Family: 4, Dst: addr16(fmt.Sprintf("198.19.%d.%d", i/256, i%256)), DstMask: mask32}
		}
		cfg := loader.HopConfig{Filter: f, HopIndex: 2, TraceSlot: uint16(100 + i), IDOrigin: 9, SampleEvery: 1}
		if i%7 == 0 {
			cfg.FollowOrigin = 9
		}
		out = append(out, hookTrace{slot: slot, cfg: cfg})
		i++
	}
	return out
}

// comparable is a sample with what may differ between two runs of one packet cleared: the
// timestamp, the CPU, and the capture's bytes past those it captured (the ring's earlier contents).
func comparable(t testing.TB, sample []byte) []byte {
	t.Helper()
	b := bytes.Clone(sample)
	clear(b[record.OffsetTsNs : record.OffsetTsNs+8])
	clear(b[28:30]) // cpu
	if binary.LittleEndian.Uint16(b[record.OffsetFlags:])&record.FlagCapture != 0 {
		off := len(b) - 136 // struct hoptrace_capture, last in the sample
		captured := int(binary.LittleEndian.Uint16(b[off+4:]))
		clear(b[off+8+captured:])
	}
	return b
}

// A packet through the hook, with one trace in its maps and with 200 (one of them the packet's),
// gives the record (its values, addresses and capture) today's hop_tc gives with the same trace's
// constants, field for field; the trace's counters count what the hop's count; the packet leaves
// both the same (the UDP tagger's ID included).
func TestHookRecordsAsHop(t *testing.T) {
	h := newHarness(t)
	const slot = 137 // in the third word of the sets
	tcp := tu.Cat(tu.Ethernet(0x0800), tu.IPv4(6, src4, dst4, nil, tu.TCP(40000, 5000, tu.Cat([]byte{1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2}, tu.TCPIDOption(0x07000005)), []byte("payload")), 0))
	vxlan := tu.Cat(tu.Ethernet(0x0800), tu.IPv4(17, src4, dst4, nil, tu.UDP(5, 4789, tu.VXLAN(42, udp4(0x07000041))), 0))
	untagged := tu.Cat(tu.Ethernet(0x0800), tu.IPv4(17, src4, dst4, nil, tu.UDP(40000, 5000, []byte("hello hoptrace")), 0))
	host := loader.FilterConstants{Proto: 6, Family: 4, Dst: addr16(dst4), DstMask: mask32, Dport: 5000}
	udp5000 := loader.FilterConstants{Proto: 17, Dport: 5000}
	udp6 := tu.Cat(tu.Ethernet(0x86dd), tu.IPv6(17, src6, dst6, nil, tu.UDP(40001, 5001, []byte("v6")), 4), tu.ID(0x07000002))
	dst6b := netip.MustParseAddr(dst6).As16()
	host6 := loader.FilterConstants{Proto: 17, Family: 6, Dst: dst6b, DstMask: [16]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
		0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}}
	cases := []struct {
		name  string
		pkt   []byte
		cfg   loader.HopConfig
		flags uint16 // flags the record must have
	}{
		{"udp", udp4(0x07000002), loader.HopConfig{Filter: udp5000}, record.FlagUDP},
		{"udp any filter, addresses", udp4(0x07000001), loader.HopConfig{}, record.FlagUDP | record.FlagAddresses},
		{"tcp host filter", tcp, loader.HopConfig{Filter: host}, record.FlagTCP},
		{"ipv6 host filter", udp6, loader.HopConfig{Filter: host6}, record.FlagUDP | record.FlagIPv6},
		{"vxlan inner", vxlan, loader.HopConfig{Filter: udp5000}, record.FlagUDP | record.FlagEncapVXLAN | record.FlagAddresses},
		{"udp tagged here", untagged, loader.HopConfig{Filter: udp5000, TagUDP: true}, record.FlagUDP | record.FlagTaggedHere},
		{"followed", udp4(0x07000003), loader.HopConfig{Filter: loader.FilterConstants{Proto: 17, Dport: 8080}, FollowOrigin: 7}, record.FlagUDP | record.FlagFollowed},
		{"values and capture", udp4(0x07000002), loader.HopConfig{Filter: udp5000, Actions: loader.Actions{
			Count: true, CountBy: record.FieldTTL, Histogram: record.FieldLen, Capture: 64,
			Record: [record.ValuesMax]record.ActionField{record.FieldLen, record.FieldTTL, record.FieldIPID, record.FieldMark}}},
			record.FlagUDP | record.FlagValues | record.FlagCapture},
	}
	for _, n := range []int{1, 200} {
		hook := loadHook(t, h, nil)
		for _, c := range cases {
			t.Run(fmt.Sprintf("%d traces/%s", n, c.name), func(t *testing.T) {
				cfg := c.cfg
				cfg.HopIndex, cfg.IDOrigin, cfg.TraceSlot, cfg.SampleEvery = 1, 7, 3, 1
				hop := h.load(t, cfg)
				traces := []hookTrace{{slot: slot, cfg: cfg}}
				if n > 1 {
					traces = append(traces, otherTraces(n-1, slot)...)
				}
				// the trace's ID sequence at the hook where hop_tc's is: a tagger takes the same ID
				seq := make([]byte, h.idState.ValueSize())
				if err := h.idState.Lookup(uint32(0), seq); err != nil {
					t.Fatal(err)
				}
				setHookTraces(t, hook, traces[1:])
				if err := hook.Set(slot, cfg, binary.NativeEndian.Uint64(seq)); err != nil {
					t.Fatal(err)
				}
				wantOut, _ := runRaw(t, hop.Program, bytes.Clone(c.pkt))
				want := h.drainRaw(t)
				if len(want) != 1 {
					t.Fatalf("hop_tc: %d records, want 1", len(want))
				}
				before, hookBefore := hookSlotCounters(t, hook, slot), hookCounters(t, hook)
				gotOut, ret := runRaw(t, hook.Program, bytes.Clone(c.pkt))
				if ret != -1 {
					t.Errorf("hook returned %d, want TCX_NEXT (-1)", ret)
				}
				got := h.drainRaw(t)
				if len(got) != 1 {
					t.Fatalf("hook: %d records, want 1", len(got))
				}
				var r record.Record
				if err := record.Decode(got[0], &r); err != nil {
					t.Fatal(err)
				}
				// the addresses come with one ID in 64 (here the tagger's first), as hop_tc's
				if r.Flags&^record.FlagAddresses != c.flags&^record.FlagAddresses || r.TraceSlot != 3 || r.HopIndex != 1 || r.PacketID == 0 {
					t.Errorf("hook's record %+v: flags %#x, want %#x, trace slot 3, hop 1", r, r.Flags, c.flags)
				}
				if g, w := comparable(t, got[0]), comparable(t, want[0]); !bytes.Equal(g, w) {
					t.Errorf("hook's sample differs from hop_tc's:\n got %x\nwant %x", g, w)
				}
				if !bytes.Equal(gotOut, wantOut) {
					t.Errorf("the packet leaves the hook as\n%x\nand hop_tc as\n%x", gotOut, wantOut)
				}
				after, hookAfter := hookSlotCounters(t, hook, slot), hookCounters(t, hook)
				hopC := counters(t, hop)
				for _, k := range []record.Counter{record.CMatched, record.CRecorded, record.CBytes, record.CTagged, record.CUntagged} {
					if got, want := after[k]-before[k], hopC[k]; got != want {
						t.Errorf("counter %d: hook's trace %d, hop_tc %d a run", k, got, want)
					}
				}
				if seen := hookAfter[record.CSeen] - hookBefore[record.CSeen]; seen != 1 {
					t.Errorf("hook counted %d seen, want 1", seen)
				}
				if nm := hookAfter[record.CNotMatched] - hookBefore[record.CNotMatched]; nm != 0 {
					t.Errorf("hook counted %d not matched", nm)
				}
			})
		}
	}
}

// The hooks verify on this kernel; their verifier figures are logged: the instructions the verifier
// walked (the tc hook's body included, checked once as a global function) from its log, and
// verified_insns (5.16+).
func TestHookVerifierCost(t *testing.T) {
	h := newHarness(t)
	for _, program := range []string{loader.HookTCProgram, loader.HookSockOpsProgram, loader.HookTPProgram, loader.HookTPXmitProgram} {
		prog := loadHookLogged(t, h, program, nil, ebpf.LogLevelStats).Program
		log := prog.VerifierLog
		at := strings.LastIndex(log, "processed ")
		if at < 0 {
			t.Fatalf("%s: no figures in the verifier's log: %q", program, log)
		}
		line, _, _ := strings.Cut(log[at:], "\n")
		info, err := prog.Info()
		if err != nil {
			t.Fatal(err)
		}
		if n, ok := info.VerifiedInstructions(); ok {
			t.Logf("%s: %s; verified_insns %d", info.Name, line, n)
		} else {
			t.Logf("%s: %s", info.Name, line)
		}
	}
}

// runRaw runs pkt through prog once: the packet it leaves and its return value.
func runRaw(t testing.TB, prog *ebpf.Program, pkt []byte) ([]byte, int32) {
	t.Helper()
	out := make([]byte, len(pkt)+256)
	opts := &ebpf.RunOptions{Data: pkt, DataOut: out}
	ret, err := prog.Run(opts)
	if err != nil {
		t.Fatalf("test run: %v", err)
	}
	return opts.DataOut, int32(ret)
}

// A packet no trace takes: counted once at the hook, in no trace; more matched traces than the hook
// runs bodies for: the rest counted, never run.
func TestHookNotMatchedAndOverflow(t *testing.T) {
	h := newHarness(t)
	hook := loadHook(t, h, otherTraces(200, loader.HookSlots))
	pkt := udp4(0x07000002)
	before := hookCounters(t, hook)
	if _, ret := runRaw(t, hook.Program, pkt); ret != -1 {
		t.Errorf("hook returned %d", ret)
	}
	after := hookCounters(t, hook)
	if after[record.CSeen]-before[record.CSeen] != 1 || after[record.CNotMatched]-before[record.CNotMatched] != 1 {
		t.Errorf("seen %d, not matched %d: want 1 and 1", after[record.CSeen]-before[record.CSeen], after[record.CNotMatched]-before[record.CNotMatched])
	}
	if recs := h.drainRaw(t); len(recs) != 0 {
		t.Errorf("%d records of a packet no trace takes", len(recs))
	}
	// 10 traces take the packet: 8 bodies run, 2 counted
	var all []hookTrace
	for i := range uint32(10) {
		all = append(all, hookTrace{slot: 60 + i, cfg: loader.HopConfig{Filter: loader.FilterConstants{Proto: 17, Dport: 5000},
			HopIndex: 1, TraceSlot: uint16(i), IDOrigin: 7, SampleEvery: 1}})
	}
	setHookTraces(t, hook, all)
	before = hookCounters(t, hook)
	runRaw(t, hook.Program, pkt)
	after = hookCounters(t, hook)
	recs := h.drain(t)
	if len(recs) != loader.HookMatched {
		t.Errorf("%d records, want %d", len(recs), loader.HookMatched)
	}
	if got := after[loader.HookCounterOverflow] - before[loader.HookCounterOverflow]; got != 10-loader.HookMatched {
		t.Errorf("overflow counted %d, want %d", got, 10-loader.HookMatched)
	}
}

// mask32 is an IPv4 /32 mask in a filter's 16 bytes.
var mask32 = [16]byte{255, 255, 255, 255}

// addr16 is an IPv4 address in a filter's 16 bytes (network order, the first word).
func addr16(s string) [16]byte {
	var b [16]byte
	a := netip.MustParseAddr(s).As4()
	copy(b[:], a[:])
	return b
}
