package preset

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/hoptrace/hoptrace/agent/internal/allowlist"
	"github.com/hoptrace/hoptrace/agent/internal/attach"
	"github.com/hoptrace/hoptrace/agent/internal/loader"
	"github.com/hoptrace/hoptrace/agent/internal/netns"
	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
	"github.com/hoptrace/hoptrace/agent/internal/record"
)

// Path discovery (hoptrace discover): tag the flow's packets where
// they leave the sender's namespace (the ordinary taggers), and record every
// device they cross in the namespaces this node owns
// (kernel-patch/include/discover.bpf.h). The dispatcher merges the nodes'
// crossings into paths.

// Crossing directions (enum hoptrace_direction, include/discover.h).
const (
	DirIngress = 1
	DirEgress  = 2
)

// CrossingSize is sizeof(struct hoptrace_crossing).
const CrossingSize = 32

// RawCrossing mirrors struct hoptrace_crossing (include/discover.h).
type RawCrossing struct {
	TsNs      uint64
	PacketID  uint32
	FlowHash  uint32
	Ifindex   uint32
	NetnsIno  uint32
	WireLen   uint32
	Direction uint8
	Pad       uint8
	Flags     uint16
}

// DecodeCrossing reads one ring buffer sample.
func DecodeCrossing(b []byte) (RawCrossing, error) {
	if len(b) < CrossingSize {
		return RawCrossing{}, fmt.Errorf("crossing: %d bytes, want %d", len(b), CrossingSize)
	}
	le := binary.LittleEndian
	return RawCrossing{TsNs: le.Uint64(b), PacketID: le.Uint32(b[8:]), FlowHash: le.Uint32(b[12:]),
		Ifindex: le.Uint32(b[16:]), NetnsIno: le.Uint32(b[20:]), WireLen: le.Uint32(b[24:]),
		Direction: b[28], Pad: b[29], Flags: le.Uint16(b[30:])}, nil
}

// Aligner maps a CLOCK_MONOTONIC timestamp of this node to the master's
// wall clock (ns) and says how far off that may be: the agent's own clock
// estimate against the collector's time service, as its records use.
type Aligner func(mono int64) (masterNs int64, boundNs int64, aligned bool)

// DiscoverConfig is one discovery run.
type DiscoverConfig struct {
	Node      string
	HostNetns string // the node's own netns ("" = the agent's)
	// Owned: the other namespaces of this host (/run/netns names), comma-separated;
	// "" = every /run/netns entry (a real host owns all of its namespaces).
	Owned    string
	Match    string // FlowMatch in protojson, from the dispatcher
	Duration time.Duration
	Packets  int // stop once this many tagged packets were seen (0 = run the duration)
	// Origin: the discovery's ID origin from the dispatcher (1..record.TraceOrigins), the same on every
	// node: the taggers write IDs of it and the crossing programs also take packets of it that an address
	// translation moved out of the flow's match. 0: the node's own origin, nothing followed.
	Origin uint
	// Follow: the ID origins of applied traces whose filters overlap the flow, comma-separated: their
	// taggers may have tagged the flow's packets before the discovery's could (a tagger never overwrites
	// an ID), and the crossing programs follow those IDs through a translation too. The dispatcher
	// keeps only the packets some crossing saw matching the flow.
	Follow string
	Object string
	Align  Aligner
}

// discoverSettle is how long the crossing programs run before the tagger
// starts, and run on after it stops: every node of the path is listening
// before the first tagged packet leaves, and the last one arrives before
// anyone stops listening.
const discoverSettle = 300 * time.Millisecond

// maxKeptPackets bounds the crossings a node reports (the result travels in one message).
const maxKeptPackets = 2000

// ownedNetns is one namespace this node owns, with its device names.
type ownedNetns struct {
	Name    string // "" = the node's own
	Path    string
	Ino     uint64
	Devices map[uint32]string
	Addrs   []net.IP
}

// DiscoveredCrossing is one crossing as the summary reports it.
type DiscoveredCrossing struct {
	PacketID  uint32 `json:"packet_id"`
	FlowHash  uint32 `json:"flow_hash"`
	MonoNs    uint64 `json:"mono_ns"`
	MasterNs  int64  `json:"master_ns"`
	Netns     string `json:"netns"`
	NetnsIno  uint32 `json:"netns_ino"`
	Dev       string `json:"dev"`
	Ifindex   uint32 `json:"ifindex"`
	Direction string `json:"direction"`
	WireLen   uint32 `json:"wire_len"`
	// Followed: the filter refused the packet here, its ID took it (an address translation before).
	Followed bool `json:"followed,omitempty"`
}

func ownedNamespaces(hostNetns, owned string) ([]ownedNetns, error) {
	names := []string{""}
	if strings.TrimSpace(owned) == "" {
		all, err := netns.Named()
		if err != nil {
			return nil, err
		}
		for _, n := range all {
			if n != hostNetns {
				names = append(names, n)
			}
		}
	} else {
		for _, n := range strings.Split(owned, ",") {
			if n = strings.TrimSpace(n); n != "" && n != hostNetns {
				names = append(names, n)
			}
		}
	}
	var out []ownedNetns
	inodes := map[uint64]bool{}
	for _, n := range names {
		path := netns.Path(n, hostNetns)
		ino, err := netns.Inode(path)
		if err != nil {
			return nil, fmt.Errorf("netns %s: %w", netns.Display(n, hostNetns), err)
		}
		// A name of the node's own namespace (a Kubernetes node's, when the agent runs in it
		// with hostNetwork), or a second name of another: one namespace, under its first name.
		if inodes[ino] {
			continue
		}
		inodes[ino] = true
		o := ownedNetns{Name: n, Path: path, Ino: ino, Devices: map[uint32]string{}}
		err = netns.Do(path, func() error {
			ifs, err := net.Interfaces()
			if err != nil {
				return err
			}
			for _, i := range ifs {
				o.Devices[uint32(i.Index)] = i.Name
				addrs, _ := i.Addrs()
				for _, a := range addrs {
					if ipn, ok := a.(*net.IPNet); ok {
						o.Addrs = append(o.Addrs, ipn.IP)
					}
				}
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("netns %s devices: %w", netns.Display(n, hostNetns), err)
		}
		out = append(out, o)
	}
	return out, nil
}

// senders are the owned namespaces holding an address the flow's source matches.
func senders(owned []ownedNetns, m *pb.FlowMatch) []ownedNetns {
	var out []ownedNetns
	for _, o := range owned {
		for _, ip := range o.Addrs {
			if addrMatches(ip, m.GetSrcAddr(), m.GetSrcMask()) {
				out = append(out, o)
				break
			}
		}
	}
	return out
}

func addrMatches(ip net.IP, want, mask []byte) bool {
	if v4 := ip.To4(); v4 != nil && len(want) == 4 {
		ip = v4
	} else {
		ip = ip.To16()
	}
	if len(ip) != len(want) || len(mask) != len(want) {
		return false
	}
	for i := range want {
		if ip[i]&mask[i] != want[i] {
			return false
		}
	}
	return true
}

// RunDiscover runs one discovery and writes its JSON lines ("ready", "summary").
func RunDiscover(ctx context.Context, cfg DiscoverConfig, w io.Writer) error {
	match := &pb.FlowMatch{}
	if err := protojson.Unmarshal([]byte(cfg.Match), match); err != nil {
		return fmt.Errorf("match: %w", err)
	}
	if len(match.GetSrcAddr()) == 0 {
		return errors.New("discover needs the flow's source address: packets are tagged in the namespace that sends them")
	}
	if match.GetIpProto() != 6 && match.GetIpProto() != 17 {
		return errors.New("discover needs protocol udp or tcp: the taggers write IDs into those")
	}
	filter, err := loader.FilterFromMatch(match)
	if err != nil {
		return err
	}
	owned, err := ownedNamespaces(cfg.HostNetns, cfg.Owned)
	if err != nil {
		return err
	}
	objPath, err := FindObject("hoptrace.bpf.o", cfg.Object)
	if err != nil {
		return err
	}
	spec, err := ebpf.LoadCollectionSpec(objPath)
	if err != nil {
		return fmt.Errorf("load %s: %w", objPath, err)
	}
	if err := allowlist.Check(spec, allowlist.Hops); err != nil {
		return fmt.Errorf("%s: %w", objPath, err)
	}
	// The taggers' own hop records go to a small ring nobody reads: only crossings matter here.
	records, err := loader.NewRecords(spec, 64<<10)
	if err != nil {
		return err
	}
	defer records.Close()
	idState, err := loader.NewIDState(spec)
	if err != nil {
		return err
	}
	defer idState.Close()
	base := loader.HopConfig{IDOrigin: loader.NodeOrigin(cfg.Node), Filter: filter}
	if cfg.Origin != 0 {
		if cfg.Origin > record.TraceOrigins {
			return fmt.Errorf("origin %d is not a discovery's (1..%d)", cfg.Origin, record.TraceOrigins)
		}
		base.IDOrigin, base.FollowOrigin = uint8(cfg.Origin), uint8(cfg.Origin)
	}
	env := attach.Env{Netns: cfg.HostNetns, Base: base,
		Load: loader.Options{Records: records, IDState: idState, Cache: btf.NewCache()}}

	// 1. The crossing programs, in every owned namespace (one map of inodes each).
	var watchers []*loader.Hop
	var links []link.Link
	var readers []*ringbuf.Reader
	defer func() {
		closeLinks(links)
		for _, r := range readers {
			r.Close()
		}
		for _, h := range watchers {
			h.Close()
		}
	}()
	follow, err := followOrigins(cfg.Follow)
	if err != nil {
		return err
	}
	if len(follow) > 0 && cfg.Origin == 0 {
		return errors.New("follow: only a discovery with its own origin follows IDs (--origin)")
	}
	for _, prog := range []string{loader.ProgDiscoverRecv, loader.ProgDiscoverQueue} {
		cfgHop := env.Base
		cfgHop.Name = "discover " + prog
		cfgHop.Program = prog
		h, err := loader.LoadHop(spec, cfgHop, env.Load)
		if err != nil {
			return err
		}
		watchers = append(watchers, h)
		for _, origin := range follow {
			if err := h.Collection.Maps["discover_origins"].Put(uint32(origin), uint8(1)); err != nil {
				return fmt.Errorf("%s: follow origin %d: %w", prog, origin, err)
			}
		}
		for _, o := range owned {
			if err := h.Collection.Maps["discover_netns"].Put(uint32(o.Ino), uint8(1)); err != nil {
				return fmt.Errorf("%s: owned netns %d: %w", prog, o.Ino, err)
			}
		}
		rd, err := ringbuf.NewReader(h.Collection.Maps["crossings"])
		if err != nil {
			return fmt.Errorf("%s: ring buffer reader: %w", prog, err)
		}
		readers = append(readers, rd)
		l, err := link.AttachTracing(link.TracingOptions{Program: h.Program})
		if err != nil {
			return fmt.Errorf("attach %s (%s): %w", prog, spec.Programs[loader.ProgramFor(spec, prog)].SectionName, err)
		}
		links = append(links, l)
	}

	align := cfg.Align
	if align == nil {
		align = func(mono int64) (int64, int64, bool) { return mono, 0, false }
	}
	// The time every crossing program listened, on the master's clock: the dispatcher keeps only packets
	// that crossed while every node listened, so none looks shorter for a node's later start.
	listenFrom, _, _ := align(monotonicNow())
	out := newLineWriter(w)
	start := time.Now()
	deadline := start.Add(cfg.Duration)
	var tagHops []*attach.Hop
	untag := func() {
		for _, h := range tagHops {
			h.Close()
		}
		tagHops = nil
	}
	defer untag()

	// 2. The taggers, after the settle time, in the namespaces that send the flow.
	from := senders(owned, match)
	var tagging []string
	settle := time.NewTimer(discoverSettle)
	select {
	case <-ctx.Done():
		settle.Stop()
		return ctx.Err()
	case <-settle.C:
	}
	for _, o := range from {
		if match.GetIpProto() == 17 {
			devs := make([]uint32, 0, len(o.Devices))
			for idx := range o.Devices {
				devs = append(devs, idx)
			}
			sort.Slice(devs, func(i, j int) bool { return devs[i] < devs[j] })
			for _, idx := range devs {
				if o.Devices[idx] == "lo" {
					continue
				}
				ha := &pb.HopAttach{Name: "discover-tag-" + o.Devices[idx], Kind: pb.AttachKind_ATTACH_KIND_TC_EGRESS,
					Program: loader.ProgTC, Dev: o.Devices[idx], Netns: o.Name, TagUdp: true}
				h, err := attach.AttachHop(spec, ha, env)
				if err != nil {
					return err
				}
				tagHops = append(tagHops, h)
				tagging = append(tagging, h.Describe)
			}
		} else {
			h, err := attach.AttachTCPTagging(spec, &pb.TcpTagging{Netns: o.Name, Program: loader.ProgTagTCP}, env)
			if err != nil {
				return err
			}
			tagHops = append(tagHops, h)
			tagging = append(tagging, h.Describe)
		}
	}
	if err := out.write(map[string]any{"type": "ready", "node": cfg.Node, "tagging": tagging}); err != nil {
		return err
	}

	// 3. Collect until the duration ends or enough packets were seen.
	// seen: the packets of the flow, as far as this node can tell (a crossing that matched the filter, or
	// an ID of the discovery's origin): they count for --packets and the bound. others: packets of a
	// followed trace's origin seen only after a translation, which another node may have seen matching;
	// bounded apart, so another flow of that trace crowds out none of the flow's.
	seen, others := map[uint32]bool{}, map[uint32]bool{}
	var kept []RawCrossing
	dropped := 0
	enoughAt := time.Time{}
	poll := func() {
		for _, rd := range readers {
			rd.SetDeadline(time.Now())
			for {
				rec, err := rd.Read()
				if err != nil {
					break
				}
				c, err := DecodeCrossing(rec.RawSample)
				if err != nil {
					continue
				}
				flow := c.Flags&record.FlagFollowed == 0 || uint(c.PacketID>>record.IDSeqBits) == cfg.Origin
				switch {
				case seen[c.PacketID]:
				case flow && len(seen) < maxKeptPackets:
					seen[c.PacketID] = true
				case !flow && (others[c.PacketID] || len(others) < maxKeptPackets):
					others[c.PacketID] = true
				default:
					dropped++
					continue
				}
				kept = append(kept, c)
			}
		}
	}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for done := false; !done; {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case now := <-tick.C:
			poll()
			if cfg.Packets > 0 && len(seen) >= cfg.Packets && enoughAt.IsZero() {
				enoughAt = now
				untag()
			}
			if now.After(deadline.Add(-discoverSettle)) {
				untag()
			}
			if now.After(deadline) || (!enoughAt.IsZero() && now.Sub(enoughAt) >= discoverSettle) {
				done = true
			}
		}
	}
	untag()
	listenUntil, _, _ := align(monotonicNow())
	closeLinks(links)
	links = nil
	poll()

	byIno := map[uint32]ownedNetns{}
	for _, o := range owned {
		byIno[uint32(o.Ino)] = o
	}
	crossings := make([]DiscoveredCrossing, 0, len(kept))
	aligned, bound := false, int64(0)
	for _, c := range kept {
		o := byIno[c.NetnsIno]
		dc := DiscoveredCrossing{PacketID: c.PacketID, FlowHash: c.FlowHash, MonoNs: c.TsNs, Netns: o.Name,
			NetnsIno: c.NetnsIno, Ifindex: c.Ifindex, WireLen: c.WireLen, Dev: o.Devices[c.Ifindex],
			Direction: "egress", Followed: c.Flags&record.FlagFollowed != 0}
		if dc.Dev == "" {
			dc.Dev = fmt.Sprintf("ifindex-%d", c.Ifindex) // created after discovery began
		}
		if c.Direction == DirIngress {
			dc.Direction = "ingress"
		}
		dc.MasterNs, bound, aligned = align(int64(c.TsNs))
		crossings = append(crossings, dc)
	}
	sort.SliceStable(crossings, func(i, j int) bool { return crossings[i].MonoNs < crossings[j].MonoNs })
	counters := map[string]uint64{}
	for i, h := range watchers {
		cs, err := h.ReadCounters()
		if err != nil {
			continue
		}
		prefix := []string{"recv", "queue"}[i]
		for _, c := range []record.Counter{record.CSeen, record.CMatched, record.CRecorded, record.CUntagged,
			record.CNotMatched, record.CRingbufFull, record.CParseTruncated, record.CParseMalformed} {
			counters[prefix+"_"+record.CounterKeys[c]] = cs[c]
		}
	}
	namespaces := []map[string]any{}
	for _, o := range owned {
		namespaces = append(namespaces, map[string]any{"name": o.Name, "inode": o.Ino})
	}
	return out.write(map[string]any{"type": "summary", "node": cfg.Node, "tagging": tagging,
		"namespaces": namespaces, "packets": len(seen), "packets_dropped": dropped,
		"crossings": crossings, "listen_from_ns": listenFrom, "listen_until_ns": listenUntil, "clock_aligned": aligned, "clock_bound_ns": bound,
		"duration_ms": time.Since(start).Milliseconds(), "counters": counters})
}

// followOrigins parses --follow: trace ID origins, 1..record.TraceOrigins.
func followOrigins(text string) ([]uint8, error) {
	var out []uint8
	for _, field := range strings.Split(text, ",") {
		if field = strings.TrimSpace(field); field == "" {
			continue
		}
		n, err := strconv.ParseUint(field, 10, 8)
		if err != nil || n == 0 || n > record.TraceOrigins {
			return nil, fmt.Errorf("follow: %q is not a trace's ID origin (1..%d)", field, record.TraceOrigins)
		}
		out = append(out, uint8(n))
	}
	return out, nil
}

// monotonicNow is CLOCK_MONOTONIC, the clock of bpf_ktime_get_ns().
func monotonicNow() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}
