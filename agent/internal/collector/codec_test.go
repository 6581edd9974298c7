package collector

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"google.golang.org/protobuf/proto"

	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
	"github.com/hoptrace/hoptrace/agent/internal/record"
	"github.com/hoptrace/hoptrace/agent/internal/stream"
)

// A full batch, with and without values, marshals to proto's bytes, into a
// buffer of a tier that fits it (gRPC's default pool gave it 1 MiB), and
// reads back as the same message; a small one takes proto's own path.
func TestBatchCodecMarshalsAsProto(t *testing.T) {
	codec := newBatchCodec()
	full := func(values bool) *pb.RecordBatch {
		b := &pb.RecordBatch{Node: "host-a", Trace: "t", Generation: 3, BatchSeq: 9,
			Records: make([]byte, stream.DefaultBatchRecords*record.Size), RecordSize: record.Size}
		for i := range b.Records {
			b.Records[i] = byte(rand.Uint32())
		}
		if values {
			b.Values = bytes.Repeat([]byte{7}, stream.DefaultBatchRecords*record.ValuesSize)
			b.ValueSize = record.ValuesSize
		}
		return b
	}
	cases := map[string]struct {
		batch  *pb.RecordBatch
		maxCap int
		pooled bool
	}{
		"records":     {full(false), 64 << 10, true},
		"with values": {full(true), 128 << 10, true},
		"counters":    {&pb.RecordBatch{Node: "host-a", Trace: "t", AgentDropped: 5}, 0, false},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			want, err := proto.Marshal(tc.batch)
			if err != nil {
				t.Fatal(err)
			}
			for range 3 { // again from the buffers the earlier rounds gave back
				out, err := codec.Marshal(tc.batch)
				if err != nil {
					t.Fatal(err)
				}
				if got := out.Materialize(); !bytes.Equal(got, want) {
					t.Fatalf("marshalled %d bytes, proto.Marshal %d: they differ", len(got), len(want))
				}
				if tc.pooled {
					if c := cap(out[0].ReadOnlyData()); c < len(want) || c > tc.maxCap {
						t.Fatalf("a %d-byte batch in a %d-byte buffer, want at most %d", len(want), c, tc.maxCap)
					}
				}
				var back pb.RecordBatch
				if err := codec.Unmarshal(out, &back); err != nil {
					t.Fatal(err)
				}
				if !proto.Equal(&back, tc.batch) {
					t.Fatal("unmarshalled batch differs from the one sent")
				}
				out.Free()
			}
		})
	}
}
