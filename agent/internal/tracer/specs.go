package tracer

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/cilium/ebpf"

	"github.com/hoptrace/hoptrace/agent/internal/loader"
	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
)

// specKeep is how long a parsed plan object is kept after its last use: a burst of applies (a trace
// per Service, a benchmark's hundreds) parses its object once, and an idle agent holds none. Parsing
// hoptrace.bpf.o is most of an apply whose hops join running hooks (73 of 75 ms here).
const specKeep = 10 * time.Second

// specCache holds the objects of recent plans, parsed, by what they are: an inline object by its
// digest, an object file by its path, size and modification time. Loads copy what they change
// (loader.LoadHop, LoadHook, the events'), so a cached spec is shared read-only.
type specCache struct {
	mu      sync.Mutex
	entries map[string]*cachedSpec
}

type cachedSpec struct {
	spec  *ebpf.CollectionSpec
	timer *time.Timer
}

// load is plan's object, parsed: from the cache, or parsed now and kept specKeep.
func (c *specCache) load(plan *pb.TracePlan, baseDir string) (*ebpf.CollectionSpec, error) {
	key := specKey(plan, baseDir)
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.entries[key]; ok && key != "" {
		e.timer.Reset(specKeep)
		return e.spec, nil
	}
	spec, err := loader.LoadSpec(plan, baseDir)
	if err != nil || key == "" {
		return spec, err
	}
	if c.entries == nil {
		c.entries = map[string]*cachedSpec{}
	}
	c.entries[key] = &cachedSpec{spec: spec, timer: time.AfterFunc(specKeep, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		delete(c.entries, key)
	})}
	return spec, nil
}

// specKey names plan's object as the cache keeps it; "" when it cannot (a file not found, which
// loader.LoadSpec then reports).
func specKey(plan *pb.TracePlan, baseDir string) string {
	if obj := plan.GetObject(); len(obj) > 0 {
		sum := sha256.Sum256(obj)
		return "object:" + hex.EncodeToString(sum[:])
	}
	for _, c := range loader.ObjectCandidates(plan.GetObjectPath(), baseDir) {
		if fi, err := os.Stat(c); err == nil && fi.Mode().IsRegular() {
			abs, err := filepath.Abs(c)
			if err != nil {
				return ""
			}
			return fmt.Sprintf("file:%s:%d:%d", abs, fi.Size(), fi.ModTime().UnixNano())
		}
	}
	return ""
}
