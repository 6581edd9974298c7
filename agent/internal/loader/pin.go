package loader

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
)

// PinProgram is the name a hop's or event's program is pinned under in its directory; its maps keep
// their object names (MapCounters, MapCountKeys, ...). bpffs refuses names with a dot.
const PinProgram = "program"

// pinAll pins each non-nil object of objs in dir under its name; on an error it unpins what it pinned.
func pinAll(dir string, objs map[string]interface{ Pin(string) error }) error {
	var done []string
	for name, o := range objs {
		if err := o.Pin(filepath.Join(dir, name)); err != nil {
			for _, d := range done {
				_ = os.Remove(filepath.Join(dir, d))
			}
			return fmt.Errorf("pin %s: %w", name, err)
		}
		done = append(done, name)
	}
	return nil
}

// pinnable collects the objects a restarted agent reads back: the program and the maps whose
// values the agent reports (a nil one is left out).
func pinnable(prog *ebpf.Program, maps map[string]*ebpf.Map) map[string]interface{ Pin(string) error } {
	out := map[string]interface{ Pin(string) error }{}
	if prog != nil {
		out[PinProgram] = prog
	}
	for name, m := range maps {
		if m != nil {
			out[name] = m
		}
	}
	return out
}

// Pin pins the hop's program and the maps the agent reads (counters, count and histogram) in dir,
// which exists: what a restarted agent needs to report the hop (LoadPinnedHop). The links that keep
// the program attached are pinned beside them by the caller.
func (h *Hop) Pin(dir string) error {
	return pinAll(dir, pinnable(h.Program, map[string]*ebpf.Map{MapCounters: h.Counters, MapCountKeys: h.CountKeys,
		MapHistBuckets: h.Hist}))
}

// LoadPinnedHop loads what Hop.Pin pinned in dir: the program (named programName, the variant that
// was loaded) and its maps. The hop's other maps live on with its program, held by its links.
func LoadPinnedHop(dir, programName string, actions Actions) (*Hop, error) {
	coll, err := loadPinned(dir, programName, MapCounters, MapCountKeys, MapHistBuckets)
	if err != nil {
		return nil, err
	}
	return &Hop{Collection: coll, Program: coll.Programs[programName], ProgramName: programName,
		Counters: coll.Maps[MapCounters], CountKeys: coll.Maps[MapCountKeys], Hist: coll.Maps[MapHistBuckets],
		Actions: actions}, nil
}

// Pin pins the event's program and the maps the agent reads (as Hop.Pin) in dir, which exists.
func (e *Event) Pin(dir string) error {
	return pinAll(dir, pinnable(e.Program, map[string]*ebpf.Map{MapCounters: e.Counters, MapCountKeys: e.CountKeys,
		MapHistBuckets: e.Hist, MapEventStats: e.Stats}))
}

// LoadPinnedEvent loads what Event.Pin pinned in dir; cfg is the configuration it was loaded with.
func LoadPinnedEvent(dir string, cfg EventConfig) (*Event, error) {
	coll, err := loadPinned(dir, cfg.Program, MapCounters, MapCountKeys, MapHistBuckets, MapEventStats)
	if err != nil {
		return nil, err
	}
	return &Event{Collection: coll, Program: coll.Programs[cfg.Program], Counters: coll.Maps[MapCounters],
		CountKeys: coll.Maps[MapCountKeys], Hist: coll.Maps[MapHistBuckets], Stats: coll.Maps[MapEventStats],
		Config: cfg}, nil
}

// loadPinned loads dir's program (required, as program) and those of maps that are pinned there
// (counters required) into a Collection, so that Close releases them all.
func loadPinned(dir, program string, maps ...string) (*ebpf.Collection, error) {
	coll := &ebpf.Collection{Programs: map[string]*ebpf.Program{}, Maps: map[string]*ebpf.Map{}}
	prog, err := ebpf.LoadPinnedProgram(filepath.Join(dir, PinProgram), nil)
	if err != nil {
		return nil, fmt.Errorf("load pinned program: %w", err)
	}
	coll.Programs[program] = prog
	for _, name := range maps {
		m, err := ebpf.LoadPinnedMap(filepath.Join(dir, name), nil)
		if errors.Is(err, os.ErrNotExist) && name != MapCounters {
			continue
		}
		if err != nil {
			coll.Close()
			return nil, fmt.Errorf("load pinned %s: %w", name, err)
		}
		coll.Maps[name] = m
	}
	return coll, nil
}

// LoadPinnedMap loads the map pinned at path; nil, and no error, when nothing is pinned there.
func LoadPinnedMap(path string) (*ebpf.Map, error) {
	m, err := ebpf.LoadPinnedMap(path, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("load pinned map %s: %w", path, err)
	}
	return m, nil
}
