package kafka

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/hoptrace/hoptrace/agent/internal/record"
	"github.com/hoptrace/hoptrace/agent/internal/stream"
	"github.com/hoptrace/hoptrace/agent/internal/transport"
)

func packed(ids []uint32) []byte {
	out := make([]byte, 0, len(ids)*record.Size)
	for i, id := range ids {
		r := make([]byte, record.Size)
		binary.LittleEndian.PutUint64(r, uint64(1000+i))
		binary.LittleEndian.PutUint32(r[record.OffsetPacketID:], id)
		out = append(out, r...)
	}
	return out
}

// Every record lands in the partition PartitionOf names, in order, none lost
// or doubled; two nodes' records of one packet meet.
func TestSplitByPartition(t *testing.T) {
	ids := make([]uint32, 1024)
	for i := range ids {
		ids[i] = 0x2a000000 | uint32(i*7)
	}
	recs := packed(ids)
	const parts = 6
	split := SplitByPartition("udp-a-to-b", recs, parts)
	total, used := 0, 0
	for p, part := range split {
		if len(part)%record.Size != 0 {
			t.Fatalf("partition %d: %d bytes, not whole records", p, len(part))
		}
		if len(part) > 0 {
			used++
		}
		last := uint64(0)
		for off := 0; off < len(part); off += record.Size {
			id := binary.LittleEndian.Uint32(part[off+record.OffsetPacketID:])
			if got := PartitionOf("udp-a-to-b", id, parts); got != int32(p) {
				t.Fatalf("packet %#x in partition %d, PartitionOf says %d", id, p, got)
			}
			ts := binary.LittleEndian.Uint64(part[off:])
			if ts <= last {
				t.Fatalf("partition %d: order lost", p)
			}
			last = ts
			if !bytes.Equal(part[off:off+record.Size], recs[int(ts-1000)*record.Size:int(ts-1000+1)*record.Size]) {
				t.Fatalf("record bytes changed")
			}
			total++
		}
	}
	if total != len(ids) || used != parts {
		t.Fatalf("%d records in %d partitions, want %d in %d", total, used, len(ids), parts)
	}
	// the same packet from another trace may go elsewhere, from another node never
	if PartitionOf("t", 42, 12) != PartitionOf("t", 42, 12) {
		t.Fatal("not deterministic")
	}
}

// The trailers (record-action values, addresses, captures) follow their records into the same
// partition, in order; records without them take none.
func TestSplitTrailersByPartition(t *testing.T) {
	ids := make([]uint32, 300)
	for i := range ids {
		ids[i] = 0x2a000000 | uint32(i*13)
	}
	recs := packed(ids)
	tr := stream.Trailers{Functions: map[uint64]string{7: "nft_do_chain"}}
	for i := range ids {
		off := i * record.Size
		var flags uint16
		if i%3 != 0 { // else no record action at this record's hop
			flags |= record.FlagValues
			v := make([]byte, record.ValuesSize)
			v[0], v[record.ValuesMax] = byte(record.FieldLen), 1
			binary.LittleEndian.PutUint64(v[8:], uint64(ids[i])) // the value names its packet
			tr.Values = append(tr.Values, v...)
		}
		if i%4 == 0 { // a packet that carries its addresses
			flags |= record.FlagAddresses
			a := make([]byte, record.AddressesSize)
			binary.LittleEndian.PutUint32(a[0:], ids[i]) // the source address names its packet
			a[37] = 4
			tr.Addresses = append(tr.Addresses, a...)
		}
		if i%5 < 2 { // a hop with the capture action
			flags |= record.FlagCapture
			c := make([]byte, record.CaptureSize)
			binary.LittleEndian.PutUint16(c[4:], 4)
			binary.BigEndian.PutUint32(c[8:], ids[i]) // the captured bytes name their packet
			tr.Captures = append(tr.Captures, c...)
		}
		binary.LittleEndian.PutUint16(recs[off+record.OffsetFlags:], flags)
	}
	const parts = 5
	recParts := SplitByPartition("t", recs, parts)
	trParts := SplitTrailersByPartition("t", recs, tr, parts)
	withValues, withAddrs, withCaptures := 0, 0, 0
	for p := range parts {
		nextValues, nextAddrs, nextCaptures := 0, 0, 0
		for off := 0; off < len(recParts[p]); off += record.Size {
			rec := recParts[p][off:]
			id := binary.LittleEndian.Uint32(rec[record.OffsetPacketID:])
			if record.HasValues(rec) {
				v, err := record.DecodeValues(trParts[p].Values[nextValues:])
				if err != nil {
					t.Fatal(err)
				}
				if len(v.Values) != 1 || v.Values[0] != uint64(id) || v.Fields[0] != record.FieldLen {
					t.Fatalf("partition %d: record %#x paired with values %+v", p, id, v)
				}
				nextValues += record.ValuesSize
				withValues++
			}
			if record.AddressesTrailer.On(rec) {
				a := trParts[p].Addresses[nextAddrs:]
				if got := binary.LittleEndian.Uint32(a); got != id {
					t.Fatalf("partition %d: record %#x paired with the addresses of %#x", p, id, got)
				}
				nextAddrs += record.AddressesSize
				withAddrs++
			}
			if record.CaptureTrailer.On(rec) {
				c, err := record.DecodeCapture(trParts[p].Captures[nextCaptures:])
				if err != nil {
					t.Fatal(err)
				}
				if got := binary.BigEndian.Uint32(c.Bytes); got != id {
					t.Fatalf("partition %d: record %#x paired with the capture of %#x", p, id, got)
				}
				nextCaptures += record.CaptureSize
				withCaptures++
			}
		}
		if len(trParts[p].Values) > 0 && trParts[p].Functions[7] != "nft_do_chain" {
			t.Fatalf("partition %d: functions %v, want the batch's", p, trParts[p].Functions)
		}
		if nextCaptures != len(trParts[p].Captures) {
			t.Fatalf("partition %d: %d capture bytes, %d used by its records", p, len(trParts[p].Captures), nextCaptures)
		}
		if nextValues != len(trParts[p].Values) || nextAddrs != len(trParts[p].Addresses) {
			t.Fatalf("partition %d: %d value and %d address bytes, %d and %d used by its records", p,
				len(trParts[p].Values), len(trParts[p].Addresses), nextValues, nextAddrs)
		}
	}
	if withCaptures != 2*len(ids)/5 {
		t.Fatalf("%d records paired with captures, want %d", withCaptures, 2*len(ids)/5)
	}
	if withValues != len(ids)-(len(ids)+2)/3 || withAddrs != (len(ids)+3)/4 {
		t.Fatalf("%d records paired with values, %d with addresses, want %d and %d", withValues, withAddrs,
			len(ids)-(len(ids)+2)/3, (len(ids)+3)/4)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []Config{{}, {Brokers: []string{"b:9092"}}, {Brokers: []string{"b:9092"}, Topic: "t", SASLMechanism: "gssapi"},
		{Brokers: []string{"b:9092"}, Topic: "t", SASLMechanism: "plain"}} {
		if c.Validate() == nil {
			t.Errorf("%+v: accepted", c)
		}
	}
	if err := (Config{Brokers: []string{"b:9092"}, Topic: "t", SASLMechanism: "scram-sha-512", SASLUser: "u"}).Validate(); err != nil {
		t.Error(err)
	}
	if _, err := TLSConfig("", "cert.pem", ""); err == nil {
		t.Error("a certificate without its key accepted")
	}
}

// The cost of keying by packet: splitting a full 1,024-record batch.
func BenchmarkSplitByPartition(b *testing.B) {
	ids := make([]uint32, 1024)
	for i := range ids {
		ids[i] = uint32(i)
	}
	recs := packed(ids)
	for _, parts := range []int{1, 3, 12} {
		b.Run(string(rune('0'+parts/10))+string(rune('0'+parts%10))+"-partitions", func(b *testing.B) {
			b.SetBytes(int64(len(recs)))
			for b.Loop() {
				SplitByPartition("udp-a-to-b", recs, parts)
			}
		})
	}
}

// Brokers that never answer: Run keeps the records queued (nothing
// dropped, partitions unknown, not up) and returns when its context ends,
// leaving no goroutine of franz-go behind.
func TestUnreachableBrokersQueueAndStopClean(t *testing.T) {
	defer goleak.VerifyNone(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now: connection refused
	q := stream.NewQueue(1 << 20)
	q.Push(&stream.Batch{Trace: "t", Records: packed([]uint32{1, 2, 3})})
	p := &Producer{Config: Config{Brokers: []string{addr}, Topic: "t"}, Batcher: transport.Batcher{Node: "n", Queue: q},
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	if err := p.Run(ctx); err != nil {
		t.Fatal(err)
	}
	st := p.Stats()
	if st.Partitions != 0 || st.Up || st.RecordsSent != 0 {
		t.Errorf("stats %+v", st)
	}
	if n, _ := q.Len(); n != 1 || q.Dropped() != 0 {
		t.Errorf("queue holds %d batches, dropped %d; want the batch kept", n, q.Dropped())
	}
}
