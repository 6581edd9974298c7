package agent

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/hoptrace/hoptrace/agent/internal/clock"
	"github.com/hoptrace/hoptrace/agent/internal/loader"
	"github.com/hoptrace/hoptrace/agent/internal/netns"
	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
	"github.com/hoptrace/hoptrace/agent/internal/record"
	tu "github.com/hoptrace/hoptrace/agent/internal/testutil"
)

type sink struct {
	pb.UnimplementedCollectorServer
	mu      sync.Mutex
	batches []*pb.RecordBatch
}

func (s *sink) StreamRecords(st pb.Collector_StreamRecordsServer) error {
	for {
		b, err := st.Recv()
		if err == io.EOF {
			return st.SendAndClose(&pb.StreamSummary{})
		}
		if err != nil {
			return err
		}
		s.mu.Lock()
		s.batches = append(s.batches, b)
		s.mu.Unlock()
	}
}

func (s *sink) recordBatches() []*pb.RecordBatch {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*pb.RecordBatch
	for _, b := range s.batches {
		if len(b.GetRecords()) > 0 {
			out = append(out, b)
		}
	}
	return out
}

// serveCollector runs a collector that keeps every batch until the test ends.
func serveCollector(t *testing.T) (*sink, string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	s := &sink{}
	pb.RegisterCollectorServer(srv, s)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return s, lis.Addr().String()
}

// writePlan writes plan where Run reads its --plan.
// vethPlan writes a plan file of trace `trace` at generation `gen`: UDP to port 5000 from tc egress of the
// pair's "a" end (hop 0, a-out) to tc ingress of its "b" end (hop 1, b-in); returns its path and the plan.
func vethPlan(t *testing.T, p *tu.VethPair, trace string, gen uint64) (string, *pb.TracePlan) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "plan.json")
	plan := &pb.TracePlan{
		Trace: trace, Generation: gen, ObjectPath: tu.ObjectPath(),
		Match: &pb.FlowMatch{IpProto: 17, DstPort: 5000},
		Hops: []*pb.HopAttach{
			{HopIndex: 0, Name: "a-out", Kind: pb.AttachKind_ATTACH_KIND_TC_EGRESS, Program: loader.ProgTC, Dev: p.DevA, Netns: p.NsA},
			{HopIndex: 1, Name: "b-in", Kind: pb.AttachKind_ATTACH_KIND_TC_INGRESS, Program: loader.ProgTC, Dev: p.DevB, Netns: p.NsB},
		},
	}
	writePlan(t, path, plan)
	return path, plan
}

func writePlan(t *testing.T, path string, plan *pb.TracePlan) {
	t.Helper()
	b, err := protojson.Marshal(plan)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func sendTaggedUDP(t *testing.T, nsA, src, dst string, id uint32) {
	t.Helper()
	pkt := tu.Cat(tu.IPv4(17, src, dst, nil, tu.UDP(40000, 5000, []byte("hoptrace")), 4), tu.ID(id))
	err := netns.Do(netns.Path(nsA, ""), func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_RAW)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return unix.Sendto(fd, pkt, 0, &unix.SockaddrInet4{Addr: netip.MustParseAddr(dst).As4()})
	})
	if err != nil {
		t.Fatalf("send: %v", err)
	}
}

// toMaster is the collector's correction (collector/clock.py):
// wall = ts + monotonic_to_realtime_ns; master = wall − offset(wall).
func toMaster(ts uint64, c *pb.NodeClock) int64 {
	wall := int64(ts) + c.GetMonotonicToRealtimeNs()
	off := float64(c.GetOffsetNs())
	if c.GetSampledAtNs() != 0 {
		off += c.GetDriftPpm() * 1e-6 * float64(wall-c.GetSampledAtNs())
	}
	return wall - int64(off)
}

// An agent run with the SIMULATION flags skews its records and its clock
// rounds alike: after the collector's correction the records land where an
// unskewed agent's would (here the master is this machine's own clock, so
// "unskewed" is ts + the host's monotonic→realtime). /metrics shows the run.
func TestSimulatedSkewIsCorrectedAndMetricsServed(t *testing.T) {
	tu.RequireRoot(t)
	p := tu.NewVethPair(t, "198.18.43")
	planPath, _ := vethPlan(t, p, "sim", 1)

	ntp, err := clock.StartServer("127.0.0.1:0", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer ntp.Close()
	s, collectorAddr := serveCollector(t)

	const offset, ppm = 3700 * time.Microsecond, 50.0
	metricsAddr := freePort(t)
	cfg := Config{Node: "host-b", Plan: planPath, AllowUnsignedPlan: true, Collector: collectorAddr, Insecure: true, ClockServer: ntp.Addr(),
		ClockInterval: 300 * time.Millisecond, ClockProbes: 50, ClockOffset: offset, ClockDriftPPM: ppm,
		MetricsListen: metricsAddr, BufferBytes: 1 << 20,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	started := time.Now()
	go func() { done <- Run(ctx, cfg) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()

	// Traffic for a few clock rounds, so the drift fit has a span, until the
	// collector has the records checked below: the first packets may leave
	// before Run has attached the plan.
	deadline := time.Now().Add(15 * time.Second)
	id := uint32(0x42000001)
	for time.Now().Before(deadline) {
		sendTaggedUDP(t, p.NsA, p.AddrA, p.AddrB, id)
		id++
		time.Sleep(20 * time.Millisecond)
		if batches := s.recordBatches(); id-0x42000001 >= 100 && len(batches) > 0 {
			received := 0
			for _, bt := range batches {
				received += len(bt.GetRecords()) / record.Size
			}
			if batches[len(batches)-1].GetClock().GetDriftPpm() != 0 && received >= 60 {
				break
			}
		}
	}
	batches := s.recordBatches()
	if len(batches) == 0 {
		t.Fatal("no record batches reached the collector")
	}
	host := clock.SamplePair(5).MonotonicToRealtime
	var worst int64
	checked, hop1 := 0, 0
	for _, bt := range batches {
		c := bt.GetClock()
		if c.GetSampledAtNs() == 0 {
			t.Errorf("batch %d without a clock estimate: %v", bt.GetBatchSeq(), c)
			continue
		}
		if skew := c.GetMonotonicToRealtimeNs() - host; skew < int64(offset)-100_000 {
			t.Errorf("mapping not skewed: %d ns", skew)
		}
		raw := bt.GetRecords()
		var r record.Record
		for i := 0; i+record.Size <= len(raw); i += record.Size {
			if err := record.Decode(raw[i:i+record.Size], &r); err != nil {
				t.Fatal(err)
			}
			truth := int64(r.TsNs) + host
			d := toMaster(r.TsNs, c) - truth
			worst = max(worst, d, -d)
			checked++
			if r.HopIndex == 1 {
				hop1++
			}
		}
	}
	last := batches[len(batches)-1].GetClock()
	t.Logf("%d records in %d batches; worst |corrected − unskewed| = %d ns; last clock: offset %d ns, bound %d ns, drift %.2f ppm",
		checked, len(batches), worst, last.GetOffsetNs(), last.GetBoundNs(), last.GetDriftPpm())
	if checked < 50 || worst > 20_000 {
		t.Errorf("%d records, worst error %d ns (want ≤ 20 µs)", checked, worst)
	}

	// /metrics and /healthz.
	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	text := string(body)
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain; version=0.0.4") {
		t.Errorf("content type %q", ct)
	}
	value := func(series string) float64 {
		for _, l := range strings.Split(text, "\n") {
			if rest, ok := strings.CutPrefix(l, series+" "); ok {
				v, err := strconv.ParseFloat(rest, 64)
				if err == nil {
					return v
				}
			}
		}
		t.Errorf("no series %s in:\n%s", series, text)
		return -1
	}
	if v := value("hoptrace_agent_records_read_total"); v < float64(checked) {
		t.Errorf("records read %v < %d sent", v, checked)
	}
	if v := value("hoptrace_agent_records_sent_total"); v < float64(checked) {
		t.Errorf("records sent %v", v)
	}
	if v := value("hoptrace_agent_batches_sent_total"); v < float64(len(batches)) {
		t.Errorf("batches sent %v", v)
	}
	if v := value(`hoptrace_agent_records_dropped_total{reason="queue_full"}`); v != 0 {
		t.Errorf("queue drops %v", v)
	}
	// The simulated clock drifts 50 ppm from the agent's start: the offset grows 50 us per second of the
	// run (longer on a loaded machine), within the 20 us the records are held to.
	grown := ppm * 1e-6 * time.Since(started).Seconds()
	if v := value("hoptrace_agent_clock_offset_seconds"); v < offset.Seconds()-20e-6 || v > offset.Seconds()+grown+20e-6 {
		t.Errorf("clock offset %v s, simulated 3.7 ms + 50 ppm over %.1f s", v, grown/(ppm*1e-6))
	}
	if v := value("hoptrace_agent_clock_drift_ppm"); v < 30 || v > 70 {
		t.Errorf("drift %v ppm, simulated %v", v, ppm)
	}
	if v := value("hoptrace_agent_traces_active"); v != 1 {
		t.Errorf("traces active %v", v)
	}
	if v := value(`hoptrace_agent_hop_events_total{trace="sim",hop="b-in",hop_index="1",counter="recorded"}`); v < float64(hop1) {
		t.Errorf("hop b-in recorded %v", v)
	}
	value(`hoptrace_agent_connected{peer="collector"}`)
	value(`hoptrace_agent_reconnects_total{peer="collector"}`)
	for _, name := range []string{"hoptrace_agent_queue_bytes", "hoptrace_agent_queue_fill_ratio",
		`hoptrace_agent_records_dropped_total{reason="ringbuf_full"}`, "hoptrace_agent_clock_bound_seconds"} {
		value(name)
	}
	resp, err = http.Get("http://" + metricsAddr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	hb, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || strings.TrimSpace(string(hb)) != "ok" {
		t.Errorf("healthz %d %q", resp.StatusCode, hb)
	}
}

func TestClockServerAddr(t *testing.T) {
	for _, tc := range []struct{ server, collector, want string }{
		{"", "10.0.0.5:7071", "10.0.0.5:7123"},
		{"", "[fd00::1]:7071", "[fd00::1]:7123"},
		{"", "", ""},
		{"off", "10.0.0.5:7071", ""},
		{"127.0.0.1:9999", "10.0.0.5:7071", "127.0.0.1:9999"},
	} {
		if got := (Config{ClockServer: tc.server, Collector: tc.collector}).ClockServerAddr(); got != tc.want {
			t.Errorf("server %q collector %q: %q, want %q", tc.server, tc.collector, got, tc.want)
		}
	}
}
