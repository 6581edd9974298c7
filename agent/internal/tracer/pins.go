package tracer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/hoptrace/hoptrace/agent/internal/attach"
	"github.com/hoptrace/hoptrace/agent/internal/bpffs"
	"github.com/hoptrace/hoptrace/agent/internal/loader"
	"github.com/hoptrace/hoptrace/agent/internal/record"
)

// A Manager with a PinDir keeps its traces in bpffs, so that they outlive the agent: a killed
// agent's hops go on recording into the pinned ring buffer, and the next agent of the node takes
// the ring, the traces' programs, links and maps over (New) and reads on where its predecessor
// stopped. The node's directory, root-only (0700; pins are 0600):
//
//	<PinDir>/<node>/records               the ring buffer
//	<PinDir>/<node>/prev_ts, sock_read_last   the agent's shared maps
//	<PinDir>/<node>/<trace>/id_state      the trace's ID sequence, shared by its generations
//	<PinDir>/<node>/<trace>/slot<N>/      one generation, by its trace slot:
//	    meta                              what the agent needs to take it over (traceMeta, JSON)
//	    hop<I>/, tagger/, event<I>/       each with its links, program and the maps the agent reads
//	    event_marks
//
// A generation is taken over only once its meta is pinned, which Apply does last: one without
// (an agent killed while attaching it) is removed, and so are the older generations of a trace
// whose newer one is complete (an agent killed while replacing it). Names are escaped (pinName):
// bpffs refuses names with a dot.

// bpffsMount is where bpffs is mounted when the pin directory is on no bpffs.
const bpffsMount = "/sys/fs/bpf"

// Pin names in the node's and a trace's directories.
const (
	pinRecords = "records"
	pinIDState = "id_state"
	pinMeta    = "meta"
	pinMetaNew = "meta_new"
	pinMarks   = "event_marks"
	pinTagger  = "tagger"
)

func hopPin(index uint32) string   { return fmt.Sprintf("hop%d", index) }
func eventPin(index uint32) string { return fmt.Sprintf("event%d", index) }
func slotPin(slot uint16) string   { return fmt.Sprintf("slot%d", slot) }

// errNodeLocked: another agent of the node holds its pin directory.
var errNodeLocked = errors.New("pin directory locked")

// pinRoot is the node's directory in bpffs, locked while this agent runs: two agents of one node
// would read one ring and detach each other's hops.
type pinRoot struct {
	dir  string
	lock *os.File
}

// openPinRoot makes (0700) and locks <base>/<node>, mounting bpffs at /sys/fs/bpf first when base is
// on no bpffs and below that mount point.
func openPinRoot(base, node string) (*pinRoot, error) {
	if !filepath.IsAbs(base) {
		return nil, fmt.Errorf("pin directory %q is not an absolute path", base)
	}
	if err := ensureBPFFS(base); err != nil {
		return nil, err
	}
	dir := filepath.Join(base, bpffs.Name(node))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("pin directory: %w", err)
	}
	// Only root reads and writes the node's pins (bpf_obj_get checks the pin's inode permissions).
	for _, d := range []string{dir, base} {
		if d == bpffsMount {
			continue
		}
		if err := os.Chmod(d, 0o700); err != nil {
			return nil, fmt.Errorf("pin directory: %w", err)
		}
	}
	f, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("pin directory: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: another hoptrace-agent runs for node %s (%s is locked)", errNodeLocked, node, dir)
		}
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	return &pinRoot{dir: dir, lock: f}, nil
}

// ensureBPFFS checks that path (or the nearest directory above it that exists) is on bpffs, and
// mounts bpffs at /sys/fs/bpf when that is where path would be and nothing is mounted there yet
// (bpffs is not always mounted at boot).
func ensureBPFFS(path string) error {
	onBPFFS := func() (bool, error) {
		p := path
		for {
			var st unix.Statfs_t
			err := unix.Statfs(p, &st)
			if err == nil {
				return st.Type == unix.BPF_FS_MAGIC, nil
			}
			if !errors.Is(err, unix.ENOENT) || p == "/" {
				return false, fmt.Errorf("statfs %s: %w", p, err)
			}
			p = filepath.Dir(p)
		}
	}
	ok, err := onBPFFS()
	if err != nil || ok {
		return err
	}
	if path != bpffsMount && !strings.HasPrefix(path, bpffsMount+"/") {
		return fmt.Errorf("pin directory %s is not on a bpffs (mount -t bpf bpf DIR)", path)
	}
	if err := unix.Mount("bpf", bpffsMount, "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("mount bpffs at %s: %w", bpffsMount, err)
	}
	if ok, err = onBPFFS(); err != nil || !ok {
		return fmt.Errorf("pin directory %s is not on a bpffs after mounting one at %s (%v)", path, bpffsMount, err)
	}
	return nil
}

func (r *pinRoot) path(name string) string { return filepath.Join(r.dir, name) }

func (r *pinRoot) traceDir(trace string) string { return filepath.Join(r.dir, bpffs.Name(trace)) }

// unlock lets another agent of the node take the directory over.
func (r *pinRoot) unlock() {
	if r != nil && r.lock != nil {
		r.lock.Close()
		r.lock = nil
	}
}

// remove unpins everything of the node and removes its directory (unlocking it), and --pin-dir when no
// other node's is left in it.
func (r *pinRoot) remove() error {
	err := os.RemoveAll(r.dir)
	r.unlock()
	if base := filepath.Dir(r.dir); base != bpffsMount {
		_ = os.Remove(base) // fails while another node's directory is there
	}
	return err
}

// pinMap pins m at path unless something is pinned there already (the same map, taken over).
func pinMap(m *ebpf.Map, path string) error {
	if m == nil {
		return nil
	}
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	if err := m.Pin(path); err != nil {
		return fmt.Errorf("pin %s: %w", filepath.Base(path), err)
	}
	return nil
}

// traceMeta is what a restarted agent needs to take a generation of a trace over, besides its
// pins: pinned last (saveMeta), it marks the generation complete.
type traceMeta struct {
	// Layout is the record layout the trace's programs write (recordLayout): an agent of another
	// layout (an upgrade across a change of hoptrace.h) cannot read them and takes nothing over.
	Layout     string             `json:"layout"`
	Trace      string             `json:"trace"`
	Generation uint64             `json:"generation"`
	Slot       uint16             `json:"slot"`
	Digest     string             `json:"digest"`
	Match      []byte             `json:"match"`  // FlowMatch, protobuf
	Status     []byte             `json:"status"` // TraceStatus, protobuf
	Committed  int64              `json:"committed_ns"`
	HopNames   map[uint16]string  `json:"hop_names"`
	AttachedNs map[uint32]int64   `json:"attached_ns"`
	Hops       []attach.PinnedHop `json:"hops"`
	Tagger     *attach.PinnedHop  `json:"tagger,omitempty"`
	Events     []pinnedEvent      `json:"events"`
	EventMarks bool               `json:"event_marks"`
}

// recordLayout names the sizes of the record and its trailers this agent reads.
var recordLayout = fmt.Sprintf("record %d values %d addresses %d capture %d", record.Size, record.ValuesSize,
	record.AddressesSize, record.CaptureSize)

// pinnedEvent is an event probe as a restarted agent takes it over.
type pinnedEvent struct {
	Index      uint32             `json:"index"`
	Name       string             `json:"name"`
	Config     loader.EventConfig `json:"config"`
	CountBy    string             `json:"count_by"`
	Hist       string             `json:"hist"`
	RecordArgs []string           `json:"record_args"`
}

// writeMeta pins meta in dir as an array map of one value holding its JSON: under a new name, then
// renamed over the old one, so a killed agent leaves one or the other, whole.
func writeMeta(dir string, meta *traceMeta) error {
	b, err := json.Marshal(meta)
	if err != nil {
		return err
	}
	size := (len(b) + 7) &^ 7
	m, err := ebpf.NewMap(&ebpf.MapSpec{Name: "ht_meta", Type: ebpf.Array, KeySize: 4, ValueSize: uint32(size),
		MaxEntries: 1, Flags: unix.BPF_F_RDONLY_PROG})
	if err != nil {
		return fmt.Errorf("trace meta (%d bytes): %w", len(b), err)
	}
	defer m.Close()
	if err := m.Put(uint32(0), append(b, make([]byte, size-len(b))...)); err != nil {
		return fmt.Errorf("trace meta: %w", err)
	}
	tmp := filepath.Join(dir, pinMetaNew)
	_ = os.Remove(tmp)
	if err := m.Pin(tmp); err != nil {
		return fmt.Errorf("pin trace meta: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, pinMeta)); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("pin trace meta: %w", err)
	}
	return nil
}

// readMeta reads the meta pinned in dir; os.ErrNotExist when there is none.
func readMeta(dir string) (*traceMeta, error) {
	m, err := ebpf.LoadPinnedMap(filepath.Join(dir, pinMeta), nil)
	if err != nil {
		return nil, err
	}
	defer m.Close()
	b := make([]byte, m.ValueSize())
	if err := m.Lookup(uint32(0), &b); err != nil {
		return nil, fmt.Errorf("trace meta: %w", err)
	}
	meta := &traceMeta{}
	if err := json.Unmarshal(bytes.TrimRight(b, "\x00"), meta); err != nil {
		return nil, fmt.Errorf("trace meta: %w", err)
	}
	return meta, nil
}
