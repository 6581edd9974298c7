package loader_test

import (
	"testing"

	"github.com/cilium/ebpf"

	"github.com/hoptrace/hoptrace/agent/internal/loader"
	"github.com/hoptrace/hoptrace/agent/internal/record"
	tu "github.com/hoptrace/hoptrace/agent/internal/testutil"
)

// BenchmarkHopTCActions: hop_tc's run time per traced packet (BPF_PROG_TEST_RUN, the kernel's own timing)
// without actions, with a count by a header field, and with a record of four fields. The ring buffer is
// large enough that no record is refused during a run (a refused reserve would be cheaper).
//
//	go test ./internal/loader/ -run '^$' -bench BenchmarkHopTCActions
func BenchmarkHopTCActions(b *testing.B) {
	tu.RequireRoot(b)
	spec := tu.LoadSpec(b)
	ids, err := loader.NewIDState(spec)
	if err != nil {
		b.Fatal(err)
	}
	defer ids.Close()
	pkt := udp4(0x07000001)
	for _, c := range []struct {
		name    string
		actions loader.Actions
	}{
		{"none", loader.Actions{}},
		{"count-by-ttl", loader.Actions{Count: true, CountBy: record.FieldTTL}},
		{"record-len-ttl-tcp_flags-cpu", loader.Actions{Record: [record.ValuesMax]record.ActionField{
			record.FieldLen, record.FieldTTL, record.FieldTCPFlags, record.FieldCPU}}},
	} {
		b.Run(c.name, func(b *testing.B) {
			records, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.RingBuf, MaxEntries: 1 << 28})
			if err != nil {
				b.Fatal(err)
			}
			defer records.Close()
			hop, err := loader.LoadHop(spec, loader.HopConfig{Program: loader.ProgTC, Name: c.name, IDOrigin: 7,
				TraceSlot: 3, Actions: c.actions}, loader.Options{Records: records, IDState: ids, Cache: kernelBTF})
			if err != nil {
				b.Fatal(err)
			}
			defer hop.Close()
			b.ResetTimer()
			_, per, err := hop.Program.Benchmark(pkt, b.N, nil)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(per.Nanoseconds()), "ns/packet")
			if c := counters(b, hop); c[record.CRingbufFull] != 0 {
				b.Fatalf("%d records refused: the timing includes a full ring buffer", c[record.CRingbufFull])
			}
		})
	}
}
