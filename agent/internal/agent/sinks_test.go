package agent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hoptrace/hoptrace/agent/internal/clock"
	"github.com/hoptrace/hoptrace/agent/internal/loader"
	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
	"github.com/hoptrace/hoptrace/agent/internal/record"
	tu "github.com/hoptrace/hoptrace/agent/internal/testutil"
)

// stalledOutput holds every write of record lines until released: a printer
// whose output (a pipe nobody reads, a full disk) has stopped.
type stalledOutput struct {
	release chan struct{}
	mu      sync.Mutex
	buf     bytes.Buffer
}

func (w *stalledOutput) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte(`"type":"record"`)) {
		<-w.release
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}

func (w *stalledOutput) recordIDs(t *testing.T) map[uint32]bool {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	ids := map[uint32]bool{}
	sc := bufio.NewScanner(bytes.NewReader(w.buf.Bytes()))
	for sc.Scan() {
		var line struct {
			Type     string `json:"type"`
			PacketID uint32 `json:"packet_id"`
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		if line.Type == "record" {
			ids[line.PacketID] = true
		}
	}
	return ids
}

// The printer and the collector stream are each a consumer of the one batch
// stream: while the printer is stalled, the collector still gets every
// record; once the printer moves again it prints every one too.
func TestStalledPrinterHoldsNoSinkBack(t *testing.T) {
	tu.RequireRoot(t)
	p := tu.NewVethPair(t, "198.18.46")
	planPath := filepath.Join(t.TempDir(), "plan.json")
	plan := &pb.TracePlan{
		Trace: "fan", Generation: 1, ObjectPath: tu.ObjectPath(),
		Match: &pb.FlowMatch{IpProto: 17, DstPort: 5000},
		Hops: []*pb.HopAttach{
			{HopIndex: 0, Name: "a-out", Kind: pb.AttachKind_ATTACH_KIND_TC_EGRESS, Program: loader.ProgTC, Dev: p.DevA, Netns: p.NsA},
		},
	}
	writePlan(t, planPath, plan)
	s, collectorAddr := serveCollector(t)

	out := &stalledOutput{release: make(chan struct{})}
	released := false
	release := func() {
		if !released {
			close(out.release)
			released = true
		}
	}
	defer release()
	cfg := Config{Node: "host-a", Plan: planPath, AllowUnsignedPlan: true, Out: "-", Stdout: out,
		Collector: collectorAddr, Insecure: true, ClockServer: "off", MetricsListen: "", BufferBytes: 1 << 20,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg) }()

	const packets = 20
	sent := map[uint32]bool{}
	collected := func() map[uint32]bool {
		ids := map[uint32]bool{}
		for _, bt := range s.recordBatches() {
			raw := bt.GetRecords()
			var r record.Record
			for i := 0; i+record.Size <= len(raw); i += record.Size {
				if err := record.Decode(raw[i:i+record.Size], &r); err != nil {
					t.Fatal(err)
				}
				ids[r.PacketID] = true
			}
		}
		return ids
	}
	hasAll := func(ids map[uint32]bool) bool {
		for id := range sent {
			if !ids[id] {
				return false
			}
		}
		return true
	}
	// The plan attaches once Run has read it: send until the first record
	// reaches the collector, then the counted packets.
	deadline := time.Now().Add(10 * time.Second)
	for id := uint32(0x46000000); len(collected()) == 0; id++ {
		if time.Now().After(deadline) {
			t.Fatal("no record reached the collector")
		}
		sendTaggedUDP(t, p.NsA, p.AddrA, p.AddrB, id)
		time.Sleep(20 * time.Millisecond)
	}
	for id := uint32(0x46000100); id < 0x46000100+packets; id++ {
		sendTaggedUDP(t, p.NsA, p.AddrA, p.AddrB, id)
		sent[id] = true
	}
	for !hasAll(collected()) {
		if time.Now().After(deadline) {
			t.Fatalf("the collector got %d of the %d packets while the printer was stalled", len(collected()), packets)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if printed := out.recordIDs(t); len(printed) != 0 {
		t.Fatalf("the stalled printer wrote %d record lines", len(printed))
	}

	release()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if printed := out.recordIDs(t); !hasAll(printed) {
		t.Errorf("the printer wrote %d packets' records, want all %d sent", len(printed), packets)
	}
}

// The JSON lines carry what the collector stream carries, so that an import
// places every record where the collector does: each record the collector
// got is in the file, mapped through the clock line in force before it to
// the collector's time of it within the clock's own step; the trace line
// comes first and names the node and its hops; heartbeats carry a watermark.
func TestPrintedLinesPlaceRecordsAsTheCollector(t *testing.T) {
	tu.RequireRoot(t)
	p := tu.NewVethPair(t, "198.18.47")
	planPath, _ := vethPlan(t, p, "both", 2)
	ntp, err := clock.StartServer("127.0.0.1:0", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer ntp.Close()
	s, collectorAddr := serveCollector(t)
	outPath := filepath.Join(t.TempDir(), "host-b.jsonl")
	cfg := Config{Node: "host-b", Plan: planPath, AllowUnsignedPlan: true, Out: outPath, Collector: collectorAddr,
		Insecure: true, ClockServer: ntp.Addr(), ClockInterval: 300 * time.Millisecond, ClockProbes: 20,
		ClockOffset: 3700 * time.Microsecond, BufferBytes: 1 << 20, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg) }()

	// Until the collector has 50 packets' records, two clock rounds went by and a heartbeat with a
	// watermark is in the file (a loaded machine may take the rest before the first heartbeat).
	deadline := time.Now().Add(15 * time.Second)
	watermarked := regexp.MustCompile(`"type":"counters".*"watermark_ns":[1-9]`)
	rounds := map[int64]bool{}
	for id := uint32(0x47000001); ; id++ {
		if time.Now().After(deadline) {
			t.Fatalf("the collector got %d batches, %d clock rounds", len(s.recordBatches()), len(rounds))
		}
		sendTaggedUDP(t, p.NsA, p.AddrA, p.AddrB, id)
		time.Sleep(10 * time.Millisecond)
		records := 0
		for _, bt := range s.recordBatches() {
			records += len(bt.GetRecords()) / record.Size
			rounds[bt.GetClock().GetSampledAtNs()] = true
		}
		if records >= 100 && len(rounds) >= 2 {
			if b, err := os.ReadFile(outPath); err == nil && watermarked.Match(b) {
				break
			}
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// The collector's time of every record it got, by (hop, packet).
	type key struct {
		hop uint16
		id  uint32
	}
	collected := map[key]int64{}
	for _, bt := range s.recordBatches() {
		raw := bt.GetRecords()
		var r record.Record
		for i := 0; i+record.Size <= len(raw); i += record.Size {
			if err := record.Decode(raw[i:i+record.Size], &r); err != nil {
				t.Fatal(err)
			}
			collected[key{r.HopIndex, r.PacketID}] = toMaster(r.TsNs, bt.GetClock())
		}
	}
	b, err := os.ReadFile(outPath)
	if err != nil {
		t.Fatal(err)
	}
	var clk *pb.NodeClock
	found, watermarks, clockLines := 0, 0, 0
	var worst int64
	for n, text := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var line struct {
			Type       string
			Node       string
			Generation uint64
			Hops       []struct {
				HopIndex uint32 `json:"hop_index"`
				Name     string
			}
			HopIndex              uint16  `json:"hop_index"`
			PacketID              uint32  `json:"packet_id"`
			TsNs                  uint64  `json:"ts_ns"`
			MonotonicToRealtimeNs int64   `json:"monotonic_to_realtime_ns"`
			OffsetNs              int64   `json:"offset_ns"`
			DriftPPM              float64 `json:"drift_ppm"`
			SampledAtNs           int64   `json:"sampled_at_ns"`
			WatermarkNs           int64   `json:"watermark_ns"`
		}
		if strings.HasPrefix(text, `{"type":"status",`) {
			continue // protojson: its generation is a string
		}
		if err := json.Unmarshal([]byte(text), &line); err != nil {
			t.Fatalf("line %d %q: %v", n+1, text, err)
		}
		switch line.Type {
		case "trace":
			if found > 0 || line.Node != "host-b" || line.Generation != 2 || len(line.Hops) != 2 || line.Hops[1].Name != "b-in" {
				t.Errorf("line %d: trace line %s (after %d records)", n+1, text, found)
			}
		case "clock":
			clockLines++
			clk = &pb.NodeClock{MonotonicToRealtimeNs: line.MonotonicToRealtimeNs, OffsetNs: line.OffsetNs,
				DriftPpm: line.DriftPPM, SampledAtNs: line.SampledAtNs}
		case "record":
			if clk == nil {
				t.Fatalf("line %d: a record before any clock line", n+1)
			}
			want, ok := collected[key{line.HopIndex, line.PacketID}]
			if !ok {
				continue // a record the collector did not get before it closed
			}
			found++
			d := toMaster(line.TsNs, clk) - want
			if d < 0 {
				d = -d
			}
			worst = max(worst, d)
		case "counters":
			if line.WatermarkNs != 0 {
				watermarks++
			}
		}
	}
	if found < len(collected)*9/10 || found < 100 {
		t.Errorf("%d of the collector's %d records are in the file", found, len(collected))
	}
	// The clock line in force differs from a batch's clock by less than its
	// step (1 us), and a batch's clock is taken at its middle, the line's at
	// the batch that wrote it: the simulated offset has no drift here.
	if worst > 2000 {
		t.Errorf("records in the file map %d ns from where the collector put them", worst)
	}
	if clockLines < 2 || clockLines > found {
		t.Errorf("%d clock lines for %d records: one per round, not one per batch", clockLines, found)
	}
	if watermarks == 0 {
		t.Error("no heartbeat's counters carry a watermark")
	}
	t.Logf("%d records, %d clock lines, worst %d ns", found, clockLines, worst)
}
