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

// The hook program (kernel-patch/include/hook.bpf.h): one tc program that runs every trace of a
// device from its maps. These mirror kernel-patch/include/hook.h; their sizes are checked against
// the object's map specs when a hook loads.
const (
	hookSlots   = 256
	hookMatched = 8 // HOPTRACE_HOOK_MATCHED
	hookMaxC    = int(record.CMax)
)

type hookFilter struct {
	Src, SrcMask, Dst, DstMask [16]byte
	Sport, Dport               uint16
	Proto, Family              uint8
	_                          [2]uint8
}

type hookSettings struct {
	Slot, HopIndex, TraceSlot                            uint16
	TagUDP, IDOrigin, FollowOrigin, Count, CountBy, Hist uint8
	Record                                               [record.ValuesMax]uint8
	PrevTS, Capture                                      uint8
	_                                                    [2]uint8
	SampleEvery                                          uint32
}

type traceSet [4]uint64

func (s *traceSet) add(slot uint32) { s[slot/64] |= 1 << (slot % 64) }

// hookTrace is one trace of a hook: its slot, filter and hop settings, as the agent will write them.
type hookTrace struct {
	slot     uint32
	filter   loader.FilterConstants
	settings hookSettings
}

// hookObjectPath is kernel-patch/build/hook.bpf.o of this checkout, built by `make bpf`.
func hookObjectPath() string {
	return filepath.Join(filepath.Dir(tu.ObjectPath()), "hook.bpf.o")
}

// loadHook loads the hook program of this kernel (hook_tc, or hook_tc_floor where the kernel needs
// it) writing records into h's ring buffer, with traces in its maps.
func loadHook(t testing.TB, h *harness, traces []hookTrace) *ebpf.Collection {
	t.Helper()
	return loadHookLogged(t, h, traces, 0)
}

func loadHookLogged(t testing.TB, h *harness, traces []hookTrace, level ebpf.LogLevel) *ebpf.Collection {
	t.Helper()
	spec, err := ebpf.LoadCollectionSpec(hookObjectPath())
	if err != nil {
		t.Fatalf("%s: %v (run make bpf)", hookObjectPath(), err)
	}
	prog := loader.ProgramFor(spec, "hook_tc")
	for name := range spec.Programs {
		if name != prog {
			delete(spec.Programs, name)
		}
	}
	for name, size := range map[string]int{"filters": binary.Size(hookFilter{}), "settings": binary.Size(hookSettings{})} {
		if got := int(spec.Maps[name].ValueSize); got != size {
			t.Fatalf("%s: value of %d bytes in the object, %d here", name, got, size)
		}
	}
	spec.Maps[loader.MapRecords].MaxEntries = h.records.MaxEntries()
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{
		MapReplacements: map[string]*ebpf.Map{loader.MapRecords: h.records},
		Programs:        loader.ProgramOptions(level),
		Cache:           kernelBTF,
	})
	if err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			t.Fatalf("load %s: %+v", prog, ve) // the whole log: a kernel of the matrix refused it
		}
		t.Fatalf("load %s: %v", prog, err)
	}
	t.Cleanup(func() { coll.Close() })
	coll.Programs["hook"] = coll.Programs[prog]
	setHookTraces(t, coll, traces)
	return coll
}

// setHookTraces writes traces into a hook's maps: each one's filter and settings at its slot, then
// its bits in the sets that find it (entries of earlier traces are cleared).
func setHookTraces(t testing.TB, coll *ebpf.Collection, traces []hookTrace) {
	t.Helper()
	var (
		proto        [256]traceSet
		sport, dport = map[uint32]*traceSet{}, map[uint32]*traceSet{}
		wild         struct{ Sport, Dport, Follow traceSet }
		origins      [256]traceSet
	)
	put := func(m string, key, value any) {
		if err := coll.Maps[m].Put(key, value); err != nil {
			t.Fatalf("%s: %v", m, err)
		}
	}
	for _, tr := range traces {
		f := tr.filter
		put("filters", tr.slot, hookFilter{Src: f.Src, SrcMask: f.SrcMask, Dst: f.Dst, DstMask: f.DstMask,
			Sport: f.Sport, Dport: f.Dport, Proto: f.Proto, Family: f.Family})
		s := tr.settings
		s.Slot = uint16(tr.slot)
		put("settings", tr.slot, s)
		for p := range proto {
			if f.Proto == 0 || int(f.Proto) == p {
				proto[p].add(tr.slot)
			}
		}
		for _, side := range []struct {
			port uint16
			sets map[uint32]*traceSet
			any  *traceSet
		}{{f.Sport, sport, &wild.Sport}, {f.Dport, dport, &wild.Dport}} {
			if side.port == 0 {
				side.any.add(tr.slot)
				continue
			}
			if side.sets[uint32(side.port)] == nil {
				side.sets[uint32(side.port)] = new(traceSet)
			}
			side.sets[uint32(side.port)].add(tr.slot)
		}
		if s.FollowOrigin != 0 {
			origins[s.FollowOrigin].add(tr.slot)
			wild.Follow.add(tr.slot)
		}
	}
	for p := range proto {
		put("by_proto", uint32(p), proto[p])
		put("origin_slots", uint32(p), origins[p])
	}
	put("wildcards", uint32(0), wild)
	// The port sets: every entry written (65536 each), so a hook reconfigured keeps no old bits.
	for _, side := range []struct {
		m    string
		sets map[uint32]*traceSet
	}{{"by_sport", sport}, {"by_dport", dport}} {
		keys := make([]uint32, 65536)
		values := make([]traceSet, 65536)
		for k := range keys {
			keys[k] = uint32(k)
			if s := side.sets[uint32(k)]; s != nil {
				values[k] = *s
			}
		}
		if _, err := coll.Maps[side.m].BatchUpdate(keys, values, nil); err != nil {
			for k := range keys { // kernels before 5.6: one update each
				put(side.m, keys[k], values[k])
			}
		}
	}
}

// hookSlotCounters sums a trace's counters at the hook (its slot's range of counters).
func hookSlotCounters(t testing.TB, coll *ebpf.Collection, slot uint32) record.Counters {
	t.Helper()
	var out record.Counters
	for c := range out {
		var per []uint64
		if err := coll.Maps["counters"].Lookup(slot*uint32(hookMaxC)+uint32(c), &per); err != nil {
			t.Fatal(err)
		}
		for _, v := range per {
			out[c] += v
		}
	}
	return out
}

// hookCounters sums the hook's own counters (SEEN, NOT_MATCHED, PARSE_*, and the overflow after
// them).
func hookCounters(t testing.TB, coll *ebpf.Collection) []uint64 {
	t.Helper()
	out := make([]uint64, coll.Maps["hook_counters"].MaxEntries())
	for c := range out {
		var per []uint64
		if err := coll.Maps["hook_counters"].Lookup(uint32(c), &per); err != nil {
			t.Fatal(err)
		}
		for _, v := range per {
			out[c] += v
		}
	}
	return out
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
		s := hookSettings{HopIndex: 2, TraceSlot: uint16(100 + i), IDOrigin: 9, SampleEvery: 1}
		if i%7 == 0 {
			s.FollowOrigin = 9
		}
		out = append(out, hookTrace{slot: slot, filter: f, settings: s})
		i++
	}
	return out
}

func settingsOf(cfg loader.HopConfig) hookSettings {
	s := hookSettings{HopIndex: cfg.HopIndex, TraceSlot: cfg.TraceSlot, IDOrigin: cfg.IDOrigin, FollowOrigin: cfg.FollowOrigin,
		SampleEvery: cfg.SampleEvery, CountBy: uint8(cfg.Actions.CountBy), Hist: uint8(cfg.Actions.Histogram), Capture: cfg.Actions.Capture}
	if cfg.TagUDP {
		s.TagUDP = 1
	}
	if cfg.Actions.Count {
		s.Count = 1
	}
	if cfg.Actions.PrevTS {
		s.PrevTS = 1
	}
	for i, f := range cfg.Actions.Record {
		s.Record[i] = uint8(f)
	}
	return s
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
				traces := []hookTrace{{slot: slot, filter: cfg.Filter, settings: settingsOf(cfg)}}
				if n > 1 {
					traces = append(traces, otherTraces(n-1, slot)...)
				}
				setHookTraces(t, hook, traces)
				// the trace's ID sequence at the hook where hop_tc's is: a tagger takes the same ID
				seq := make([]byte, h.idState.ValueSize())
				if err := h.idState.Lookup(uint32(0), seq); err != nil {
					t.Fatal(err)
				}
				if err := hook.Maps["id_state"].Put(uint32(slot), seq); err != nil {
					t.Fatal(err)
				}
				wantOut, _ := runRaw(t, hop.Program, bytes.Clone(c.pkt))
				want := h.drainRaw(t)
				if len(want) != 1 {
					t.Fatalf("hop_tc: %d records, want 1", len(want))
				}
				before, hookBefore := hookSlotCounters(t, hook, slot), hookCounters(t, hook)
				gotOut, ret := runRaw(t, hook.Programs["hook"], bytes.Clone(c.pkt))
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

// The hook verifies on this kernel; its verifier figures are logged: the instructions the verifier
// walked (its body included, checked once as a global function) from its log, and verified_insns
// (5.16+).
func TestHookVerifierCost(t *testing.T) {
	h := newHarness(t)
	hook := loadHookLogged(t, h, nil, ebpf.LogLevelStats)
	prog := hook.Programs["hook"]
	log := prog.VerifierLog
	at := strings.LastIndex(log, "processed ")
	if at < 0 {
		t.Fatalf("no figures in the verifier's log: %q", log)
	}
	line, _, _ := strings.Cut(log[at:], "\n")
	info, err := prog.Info()
	if err != nil {
		t.Fatal(err)
	}
	name := info.Name
	if n, ok := info.VerifiedInstructions(); ok {
		t.Logf("%s: %s; verified_insns %d", name, line, n)
	} else {
		t.Logf("%s: %s", name, line)
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
	hook := loadHook(t, h, otherTraces(200, hookSlots))
	pkt := udp4(0x07000002)
	before := hookCounters(t, hook)
	if _, ret := runRaw(t, hook.Programs["hook"], pkt); ret != -1 {
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
		all = append(all, hookTrace{slot: 60 + i, filter: loader.FilterConstants{Proto: 17, Dport: 5000},
			settings: hookSettings{HopIndex: 1, TraceSlot: uint16(i), IDOrigin: 7, SampleEvery: 1}})
	}
	setHookTraces(t, hook, all)
	before = hookCounters(t, hook)
	runRaw(t, hook.Programs["hook"], pkt)
	after = hookCounters(t, hook)
	recs := h.drain(t)
	if len(recs) != hookMatched {
		t.Errorf("%d records, want %d", len(recs), hookMatched)
	}
	if got := after[hookMaxC] - before[hookMaxC]; got != 10-hookMatched {
		t.Errorf("overflow counted %d, want %d", got, 10-hookMatched)
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
