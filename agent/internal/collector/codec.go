package collector

import (
	"fmt"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// batchBuffers hold the stream's marshalled messages. gRPC's default pool
// has no tier between 32 KiB and 1 MiB, so a batch of 1024 records (32 KiB
// and its framing) took and zeroed a 1 MiB buffer, and allocated one
// whenever a GC had emptied the pool: under the agent's soft heap limit that
// made most of its garbage and a collection every few batches. These tiers
// fit a batch of records (64 KiB) and one with values (128 KiB).
var batchBuffers = func() mem.BufferPool {
	pool, err := mem.NewBinaryTieredBufferPool(8, 12, 14, 15, 16, 17, 20)
	if err != nil {
		panic(fmt.Sprintf("collector: buffer pool tiers: %v", err))
	}
	return pool
}()

// batchCodec is gRPC's proto codec with the marshalled message in a buffer
// from batchBuffers; gRPC frees it back there once the message is written.
type batchCodec struct {
	encoding.CodecV2 // the proto codec: Unmarshal, Name
}

func newBatchCodec() batchCodec {
	return batchCodec{encoding.GetCodecV2("proto")}
}

func (c batchCodec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(proto.Message)
	size := 0
	if ok {
		size = proto.Size(m)
	}
	if !ok || mem.IsBelowBufferPoolingThreshold(size) {
		return c.CodecV2.Marshal(v)
	}
	buf := batchBuffers.Get(size)
	// UseCachedSize: the Size just computed; the message is not changed meanwhile (it is being sent).
	out, err := proto.MarshalOptions{UseCachedSize: true}.MarshalAppend((*buf)[:0], m)
	if err != nil {
		batchBuffers.Put(buf)
		return nil, err
	}
	*buf = out
	return mem.BufferSlice{mem.NewBuffer(buf, batchBuffers)}, nil
}
