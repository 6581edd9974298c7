package signing

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/hoptrace/hoptrace/agent/internal/bpffs"
)

// The taken sequences outlive the agent's process in a state file
// (Verifier.Persist), so that a restarted agent refuses a command it took
// before the restart, captured and played again within the command's expiry:
// every command it took is at or below its signer's sequence for the trace.
// The generations stay in memory: a dispatcher numbers them from its state
// directory, so one started afresh counts from 1 again, and a persisted
// generation would refuse its traces until the old entries expired.
// On bpffs (the agent's --pin-dir) no regular file can be made: there the state
// is an array map of one value holding the JSON, pinned root-only (0600) like
// the traces' meta; elsewhere (--command-state) a 0600 file. Either is written
// under a new name and renamed over the old, so a killed agent leaves one or
// the other, whole.

// savedState is the state file's JSON.
type savedState struct {
	Sequences []savedSequence `json:"sequences"`
}

type savedSequence struct {
	Signer   string `json:"signer"` // the signer certificate's SHA-256, hex
	Trace    string `json:"trace"`
	Sequence uint64 `json:"sequence"`
	At       int64  `json:"at_ns"`
}

// Persist makes the verifier keep the sequences it takes in the state file
// at path: it loads those a previous agent took (entries older than any command can
// live are dropped), and from then on writes the file before a command it
// takes is returned, so before the command takes effect.
func (v *Verifier) Persist(path string) error {
	b, err := readState(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("signed-command state %s: %w", path, err)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	v.statePath = path
	if err != nil {
		return nil
	}
	var s savedState
	if err := json.Unmarshal(bytes.TrimRight(b, "\x00"), &s); err != nil {
		return fmt.Errorf("signed-command state %s: %w", path, err)
	}
	for _, q := range s.Sequences {
		var key sequenceKey
		if h, err := hex.DecodeString(q.Signer); err != nil || len(h) != len(key.signer) {
			return fmt.Errorf("signed-command state %s: signer %q is no SHA-256", path, q.Signer)
		} else {
			copy(key.signer[:], h)
		}
		key.trace = q.Trace
		v.sequences[key] = taken{q.Sequence, time.Unix(0, q.At)}
	}
	v.forget(v.now())
	return nil
}

// save writes what the verifier holds to its state file, if it has one. The
// caller holds mu.
func (v *Verifier) save() error {
	if v.statePath == "" {
		return nil
	}
	s := savedState{Sequences: []savedSequence{}}
	for k, t := range v.sequences {
		s.Sequences = append(s.Sequences, savedSequence{hex.EncodeToString(k.signer[:]), k.trace, t.value, t.at.UnixNano()})
	}
	b, err := json.Marshal(s)
	if err != nil {
		return err
	}
	if err := writeState(v.statePath, b); err != nil {
		return fmt.Errorf("signed-command state %s: %w", v.statePath, err)
	}
	return nil
}

func onBPFFS(dir string) (bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return false, err
	}
	return st.Type == unix.BPF_FS_MAGIC, nil
}

func readState(path string) ([]byte, error) {
	bpffs, err := onBPFFS(filepath.Dir(path))
	if err != nil {
		return nil, err // ENOENT: no directory, no state
	}
	if !bpffs {
		return os.ReadFile(path)
	}
	m, err := ebpf.LoadPinnedMap(path, &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return nil, err
	}
	defer m.Close()
	b := make([]byte, m.ValueSize())
	if err := m.Lookup(uint32(0), &b); err != nil {
		return nil, err
	}
	return b, nil
}

func writeState(path string, b []byte) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	bpffs, err := onBPFFS(dir)
	if err != nil {
		return err
	}
	// bpffs refuses names with a '.' (kernel/bpf/inode.c, bpf_lookup).
	tmp := filepath.Join(dir, filepath.Base(path)+"_new")
	_ = os.Remove(tmp)
	if bpffs {
		size := (len(b) + 7) &^ 7
		m, err := ebpf.NewMap(&ebpf.MapSpec{Name: "ht_cmd_state", Type: ebpf.Array, KeySize: 4, ValueSize: uint32(size),
			MaxEntries: 1, Flags: unix.BPF_F_RDONLY_PROG})
		if err != nil {
			return err
		}
		defer m.Close()
		if err := m.Put(uint32(0), append(b, make([]byte, size-len(b))...)); err != nil {
			return err
		}
		// A pin is made 0600 (less the umask): only root opens it.
		if err := m.Pin(tmp); err != nil {
			return err
		}
	} else {
		f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		_, err = f.Write(b)
		if err == nil {
			err = f.Sync()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			_ = os.Remove(tmp)
			return err
		}
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	if !bpffs {
		// The rename is durable once the directory is synced.
		if d, err := os.Open(dir); err == nil {
			_ = d.Sync()
			d.Close()
		}
	}
	return nil
}

// StatePath is where an agent of node with --pin-dir pinDir keeps what it
// took: beside the node's directory, not in it, since a stopped agent
// removes that directory with its traces while a restarted one must still
// refuse the commands taken before.
func StatePath(pinDir, node string) string {
	return filepath.Join(pinDir, "commands-"+bpffs.Name(node))
}
