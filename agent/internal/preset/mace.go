package preset

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"

	"github.com/hoptrace/hoptrace/agent/internal/allowlist"
	"github.com/hoptrace/hoptrace/agent/internal/loader"
)

// MACE event paths (include/mace.h enum mace_path).
const (
	PathInnerDev = "inner-dev"
	PathMaxDev   = "max-dev"
	PathSyscalls = "syscalls"
)

var maceCPath = map[string]uint32{PathInnerDev: 0, PathMaxDev: 1, PathSyscalls: 2}

// Programs each path needs (mace.bpf.c).
var macePrograms = map[string][]string{
	PathInnerDev: {"mace_dev_xmit", "mace_receive_skb"},
	PathMaxDev:   {"mace_dev_queue", "mace_dev_xmit", "mace_receive_skb", "mace_gro_receive", "mace_netif_rx"},
	PathSyscalls: {"mace_dev_queue", "mace_dev_xmit", "mace_receive_skb", "mace_copy_datagram",
		"mace_enter_sendto", "mace_enter_sendmsg", "mace_exit_sendto", "mace_exit_sendmsg",
		"mace_exit_recvfrom", "mace_exit_recvmsg", "mace_exit_recvmmsg"},
}

// MaceEvent mirrors struct mace_event (include/mace.h): 32 bytes.
type MaceEvent struct {
	Key       uint64
	TsStartNs uint64
	TsEndNs   uint64
	Tid       uint32
	Direction uint8
	Proto     uint8
	CPU       uint16
}

// MaceEventSize is sizeof(struct mace_event).
const MaceEventSize = 32

// DecodeMaceEvent reads one ring buffer sample.
func DecodeMaceEvent(b []byte) (MaceEvent, error) {
	if len(b) < MaceEventSize {
		return MaceEvent{}, fmt.Errorf("mace event: %d bytes, want %d", len(b), MaceEventSize)
	}
	le := binary.LittleEndian
	return MaceEvent{Key: le.Uint64(b), TsStartNs: le.Uint64(b[8:]), TsEndNs: le.Uint64(b[16:]),
		Tid: le.Uint32(b[24:]), Direction: b[28], Proto: b[29], CPU: le.Uint16(b[30:])}, nil
}

// Key bits (include/mace.h).
const (
	KeyICMP   = uint64(1) << 63
	KeyICMPv6 = uint64(1) << 40
)

// ICMPEcho is the decoded key of an ICMP echo packet.
type ICMPEcho struct {
	V6   bool   `json:"v6"`
	Type uint8  `json:"type"`
	ID   uint16 `json:"id"`
	Seq  uint16 `json:"seq"`
}

// DecodeICMPKey returns the echo fields of an ICMP key.
func DecodeICMPKey(key uint64) (ICMPEcho, bool) {
	if key&KeyICMP == 0 {
		return ICMPEcho{}, false
	}
	return ICMPEcho{V6: key&KeyICMPv6 != 0, Type: uint8(key >> 32), ID: uint16(key >> 16), Seq: uint16(key)}, true
}

// IsRequest says whether an echo is a request (ICMP 8, ICMPv6 128).
func (e ICMPEcho) IsRequest() bool { return e.Type == 8 || e.Type == 128 }

// MACE counters (enum mace_counter).
const (
	mcEgressSeen = iota
	mcEgressReported
	mcEgressCollision
	mcIngressSeen
	mcIngressReported
	mcIngressCollision
	mcOuterEgress
	mcOuterIngress
	mcParseError
	mcRingbufFull
	mcLinkLocal
	mcMax
)

// MaceCounterNames name enum mace_counter in order.
var MaceCounterNames = []string{"egress_seen", "egress_reported", "egress_collision", "ingress_seen",
	"ingress_reported", "ingress_collision", "outer_egress", "outer_ingress", "parse_error", "ringbuf_full", "link_local"}

// MaceConfig is `hoptrace-agent mace`.
type MaceConfig struct {
	Container string // netns name, path, or PID
	HostNetns string // "" = the agent's
	Inner     string
	Outer     string
	Peer      string
	Path      string
	Node      string
	Duration  time.Duration
	Object    string
	Packets   bool // print one line per packet
}

// Validate checks the flags.
func (c *MaceConfig) Validate() error {
	if c.Container == "" {
		return fmt.Errorf("%w: --container is required", errUsage)
	}
	if _, ok := maceCPath[c.Path]; !ok {
		return fmt.Errorf("%w: --path must be inner-dev, max-dev or syscalls, not %q", errUsage, c.Path)
	}
	return nil
}

// MacePacket is one per-packet line.
type MacePacket struct {
	Type       string    `json:"type"` // "packet"
	Direction  string    `json:"direction"`
	OverheadNs uint64    `json:"overhead_ns"`
	StartNs    uint64    `json:"start_ns"`
	EndNs      uint64    `json:"end_ns"`
	Tid        uint32    `json:"tid"`
	CPU        uint16    `json:"cpu"`
	Proto      uint8     `json:"proto"`
	Key        string    `json:"key"`
	ICMP       *ICMPEcho `json:"icmp,omitempty"`
}

// MaceEcho is one ICMP echo whose request left and whose reply came back
// through the container: what to take off the RTT a ping inside it measured.
type MaceEcho struct {
	Type         string `json:"type"` // "echo"
	V6           bool   `json:"v6"`
	ID           uint16 `json:"id"`
	Seq          uint16 `json:"seq"`
	EgressNs     uint64 `json:"egress_ns"`
	IngressNs    uint64 `json:"ingress_ns"`
	CorrectionNs uint64 `json:"correction_ns"`
}

// DirectionSummary is one direction of the final summary.
type DirectionSummary struct {
	Stats
	Seen          uint64  `json:"seen"`
	Reported      uint64  `json:"reported"`
	Coverage      float64 `json:"coverage"`
	Collisions    uint64  `json:"collisions"`
	CollisionRate float64 `json:"collision_rate"`
}

// MaceSummary is the final line.
type MaceSummary struct {
	Type      string            `json:"type"` // "summary"
	Node      string            `json:"node"`
	Path      string            `json:"path"`
	Container string            `json:"container"`
	Inner     Device            `json:"inner"`
	Outer     Device            `json:"outer"`
	Seconds   float64           `json:"seconds"`
	Egress    DirectionSummary  `json:"egress"`
	Ingress   DirectionSummary  `json:"ingress"`
	Echoes    int               `json:"echoes"`
	Counters  map[string]uint64 `json:"counters"`
}

// MacePollInterval is how often the agent drains the ring buffer: the BPF
// side does not wake it per record (mace.bpf.c, emit), only when the ring is
// half full.
const MacePollInterval = 50 * time.Millisecond

// MacePairer turns events into per-packet lines, echo corrections and statistics.
type MacePairer struct {
	egress, ingress []float64
	halfEchoes      map[[3]uint32]*MaceEcho
	Echoes          int
}

// NewMacePairer returns an empty pairer.
func NewMacePairer() *MacePairer { return &MacePairer{halfEchoes: map[[3]uint32]*MaceEcho{}} }

// Add takes one event; it returns the packet line and, when this event
// completes an echo (request egress + reply ingress), the echo line.
func (p *MacePairer) Add(ev MaceEvent) (MacePacket, *MaceEcho) {
	pk := MacePacket{Type: "packet", StartNs: ev.TsStartNs, EndNs: ev.TsEndNs, Tid: ev.Tid, CPU: ev.CPU,
		Proto: ev.Proto, Key: fmt.Sprintf("%#016x", ev.Key)}
	if ev.TsEndNs > ev.TsStartNs {
		pk.OverheadNs = ev.TsEndNs - ev.TsStartNs
	}
	egress := ev.Direction == 1
	if egress {
		pk.Direction = "egress"
		p.egress = append(p.egress, float64(pk.OverheadNs))
	} else {
		pk.Direction = "ingress"
		p.ingress = append(p.ingress, float64(pk.OverheadNs))
	}
	echo, ok := DecodeICMPKey(ev.Key)
	if !ok {
		return pk, nil
	}
	pk.ICMP = &echo
	// A request leaving and its reply coming back belong to one ping.
	if egress != echo.IsRequest() {
		return pk, nil
	}
	v6 := uint32(0)
	if echo.V6 {
		v6 = 1
	}
	k := [3]uint32{v6, uint32(echo.ID), uint32(echo.Seq)}
	e := p.halfEchoes[k]
	if e == nil {
		e = &MaceEcho{Type: "echo", V6: echo.V6, ID: echo.ID, Seq: echo.Seq}
		p.halfEchoes[k] = e
	}
	if egress {
		e.EgressNs = pk.OverheadNs
	} else {
		e.IngressNs = pk.OverheadNs
	}
	if e.EgressNs > 0 && e.IngressNs > 0 {
		e.CorrectionNs = e.EgressNs + e.IngressNs
		delete(p.halfEchoes, k)
		p.Echoes++
		return pk, e
	}
	return pk, nil
}

// Summary combines the statistics with the kernel's counters.
func (p *MacePairer) Summary(counters []uint64) (DirectionSummary, DirectionSummary) {
	dir := func(values []float64, seen, reported, coll uint64) DirectionSummary {
		d := DirectionSummary{Stats: Summarize(values), Seen: seen, Reported: reported, Collisions: coll}
		if seen > 0 {
			d.Coverage = float64(min(reported, seen)) / float64(seen)
			d.CollisionRate = float64(coll) / float64(seen)
		}
		return d
	}
	return dir(p.egress, counters[mcEgressSeen], counters[mcEgressReported], counters[mcEgressCollision]),
		dir(p.ingress, counters[mcIngressSeen], counters[mcIngressReported], counters[mcIngressCollision])
}

// RunMace traces until ctx ends or the duration passes, writing JSON lines:
// {"type":"ready"}, then "packet" (with Packets) and "echo" lines, then "summary".
func RunMace(ctx context.Context, cfg MaceConfig, w io.Writer) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	containerNs := NetnsPath(cfg.Container)
	hostNs := NetnsPath(cfg.HostNetns)
	if cfg.HostNetns == "" {
		hostNs = "/proc/self/ns/net"
	}
	for _, p := range []string{containerNs, hostNs} {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("netns %s: %w", p, err)
		}
	}
	inner, outer, err := ResolveDevices(containerNs, hostNs, cfg.Inner, cfg.Outer, cfg.Peer)
	if err != nil {
		return err
	}
	objPath, err := FindObject("mace.bpf.o", cfg.Object)
	if err != nil {
		return err
	}
	spec, err := ebpf.LoadCollectionSpec(objPath)
	if err != nil {
		return fmt.Errorf("load %s: %w", objPath, err)
	}
	if err := allowlist.Check(spec, allowlist.MACE); err != nil {
		return fmt.Errorf("%s: %w", objPath, err)
	}
	if err := keepPrograms(spec, macePrograms[cfg.Path]); err != nil {
		return err
	}
	if err := setVariables(spec, map[string]any{
		"mace_path":       maceCPath[cfg.Path],
		"inner_ifindex":   inner.Ifindex,
		"inner_netns_ino": uint32(inner.NetnsIno),
		"outer_ifindex":   outer.Ifindex,
		"outer_netns_ino": uint32(outer.NetnsIno),
	}); err != nil {
		return err
	}
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{Programs: loader.ProgramOptions(0)})
	if err != nil {
		return fmt.Errorf("load mace programs: %w", err)
	}
	defer coll.Close()
	rd, err := ringbuf.NewReader(coll.Maps["mace_events"])
	if err != nil {
		return fmt.Errorf("ring buffer reader: %w", err)
	}
	defer rd.Close()
	links, err := attachAll(spec, coll)
	if err != nil {
		return err
	}
	detached := false
	detach := func() {
		if !detached {
			closeLinks(links)
			detached = true
		}
	}
	defer detach()

	out := newLineWriter(w)
	start := time.Now()
	if err := out.write(map[string]any{"type": "ready", "path": cfg.Path, "inner": inner, "outer": outer}); err != nil {
		return err
	}
	if cfg.Duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.Duration)
		defer cancel()
	}

	pairer := NewMacePairer()
	var rec ringbuf.Record
	handle := func() error {
		ev, err := DecodeMaceEvent(rec.RawSample)
		if err != nil {
			return err
		}
		pk, echo := pairer.Add(ev)
		if cfg.Packets {
			if err := out.write(pk); err != nil {
				return err
			}
		}
		if echo != nil {
			return out.write(echo)
		}
		return nil
	}
	for ctx.Err() == nil {
		// mace.bpf.c submits without waking us (a wakeup per record would
		// preempt the measured application): each deadline ends a poll, and
		// ReadInto then returns what accumulated before ErrDeadlineExceeded.
		rd.SetDeadline(time.Now().Add(MacePollInterval))
		if err := rd.ReadInto(&rec); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				continue
			}
			return fmt.Errorf("read ring buffer: %w", err)
		}
		if err := handle(); err != nil {
			return err
		}
	}
	// Stop the events first, then take what is left in the ring buffer.
	detach()
	rd.SetDeadline(time.Now())
	for {
		if err := rd.ReadInto(&rec); err != nil {
			break
		}
		if err := handle(); err != nil {
			return err
		}
	}
	counters, err := readPercpuCounters(coll.Maps["mace_counters"], mcMax)
	if err != nil {
		return err
	}
	named := map[string]uint64{}
	for i, n := range MaceCounterNames {
		named[n] = counters[i]
	}
	eg, in := pairer.Summary(counters)
	node := cfg.Node
	if node == "" {
		node, _ = os.Hostname()
	}
	return out.write(MaceSummary{Type: "summary", Node: node, Path: cfg.Path, Container: cfg.Container,
		Inner: inner, Outer: outer, Seconds: time.Since(start).Seconds(), Egress: eg, Ingress: in,
		Echoes: pairer.Echoes, Counters: named})
}
