package agent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

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
