package tracer

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/timestamppb"

	attachpkg "github.com/hoptrace/hoptrace/agent/internal/attach"
	"github.com/hoptrace/hoptrace/agent/internal/loader"
	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
	"github.com/hoptrace/hoptrace/agent/internal/record"
	"github.com/hoptrace/hoptrace/agent/internal/tracefs"
)

// Event is one attached event probe of a trace.
type Event struct {
	Index  uint32
	Name   string
	Loaded *loader.Event
	Link   link.Link
	// CountBy names the count's key on the wire: "cpu", an argument, "".
	CountBy string
	Hist    string
	// RecordArgs names the record action's arguments, in order.
	RecordArgs []string
	pinDir     string // where Pin pinned it ("" = not pinned)
}

// Close detaches the probe (unpinned first), then releases its program and maps.
func (e *Event) Close() {
	e.unpin()
	if e.Link != nil {
		e.Link.Close()
	}
	e.Loaded.Close()
}

// Pin pins the probe in dir (made here): its link, program and maps, as attach.Hop.Pin pins a
// hop. notKept says why it cannot be kept on this kernel (a tracepoint's or kprobe's perf_event
// link before 5.15), with nothing of it left pinned.
func (e *Event) Pin(dir string) (notKept string, err error) {
	if err := os.Mkdir(dir, 0o700); err != nil {
		return "", err
	}
	e.pinDir = dir
	if err := e.Loaded.Pin(dir); err != nil {
		e.unpin()
		return "", err
	}
	if err := e.Link.Pin(filepath.Join(dir, eventLinkPin)); err != nil {
		e.unpin()
		if errors.Is(err, link.ErrNotSupported) {
			return fmt.Sprintf("event %s: its link cannot be pinned on this kernel (%v): it goes with its agent, "+
				"and a restarted agent attaches it again", e.Name, err), nil
		}
		return "", fmt.Errorf("pin event %s: %w", e.Name, err)
	}
	return "", nil
}

// eventLinkPin is the name of an event probe's link in its directory.
const eventLinkPin = "link0"

func (e *Event) unpin() {
	if e.pinDir == "" {
		return
	}
	if e.Link != nil {
		_ = e.Link.Unpin()
	}
	_ = os.RemoveAll(e.pinDir)
	e.pinDir = ""
}

// Release closes the agent's handles on the probe; pinned, it stays attached for the next agent,
// else it is detached (Close).
func (e *Event) Release() {
	if e.pinDir == "" {
		e.Close()
		return
	}
	if e.Link != nil {
		e.Link.Close()
	}
	e.Loaded.Close()
}

// loadPinnedEvent takes over the probe p an agent pinned in dir.
func loadPinnedEvent(dir string, p pinnedEvent) (*Event, error) {
	loaded, err := loader.LoadPinnedEvent(dir, p.Config)
	if err != nil {
		return nil, err
	}
	l, err := link.LoadPinnedLink(filepath.Join(dir, eventLinkPin), nil)
	if err != nil {
		loaded.Close()
		return nil, fmt.Errorf("load pinned link: %w", err)
	}
	return &Event{Index: p.Index, Name: p.Name, Loaded: loaded, Link: l, CountBy: p.CountBy, Hist: p.Hist,
		RecordArgs: p.RecordArgs, pinDir: dir}, nil
}

// AttachEvent resolves an event's arguments against this kernel's tracefs
// format, loads the event program with them and attaches it to the
// tracepoint. Errors name the spec field (events[i]...).
func AttachEvent(spec *ebpf.CollectionSpec, ea *pb.EventAttach, opts loader.Options) (*Event, error) {
	field := fmt.Sprintf("events[%d]", ea.GetEventIndex())
	var (
		args   loader.EventArgs
		attach func(*ebpf.Program) (link.Link, error)
		where  = field + ".tracepoint"
		target = "tracepoint " + ea.GetTracepointGroup() + ":" + ea.GetTracepointEvent()
	)
	switch ea.GetKind() {
	case pb.AttachKind_ATTACH_KIND_KPROBE, pb.AttachKind_ATTACH_KIND_FENTRY:
		fn, kprobe := ea.GetFunction(), ea.GetKind() == pb.AttachKind_ATTACH_KIND_KPROBE
		where, target = field+".fentry", "fentry "+fn
		if kprobe {
			where, target = field+".kprobe", "kprobe "+fn
			if why := attachpkg.KprobeUnsupported(); why != "" {
				return nil, &loader.FieldError{Field: where, Reason: why}
			}
		}
		params, known := loader.FunctionArgs(fn)
		switch {
		case known:
			args = loader.FunctionEventArgs{Args: params}
		case kprobe: // a function BTF does not describe: its argument registers, u64 each
			args = loader.UnknownFunctionArgs(record.EventFunctionArgs)
		default:
			return nil, &loader.FieldError{Field: where, Reason: fmt.Sprintf("this kernel's BTF has no function %q", fn)}
		}
		attach = func(p *ebpf.Program) (link.Link, error) {
			if kprobe {
				return link.Kprobe(fn, p, nil)
			}
			return link.AttachTracing(link.TracingOptions{Program: p})
		}
	default:
		format, err := tracefs.ReadFormat(ea.GetTracepointGroup(), ea.GetTracepointEvent())
		if err != nil {
			return nil, &loader.FieldError{Field: where, Reason: err.Error()}
		}
		args = format
		attach = func(p *ebpf.Program) (link.Link, error) {
			return link.Tracepoint(ea.GetTracepointGroup(), ea.GetTracepointEvent(), p, nil)
		}
	}
	cfg, err := loader.ResolveEvent(ea, args)
	if err != nil {
		return nil, err
	}
	loaded, err := loader.LoadEvent(spec, cfg, opts)
	if err != nil {
		if cfg.Source == record.EventSourceFentry && errors.Is(err, unix.EPERM) {
			return nil, &loader.FieldError{Field: where, Reason: "fentry not permitted: " + attachpkg.LockdownReason()}
		}
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	l, err := attach(loaded.Program)
	if err != nil {
		loaded.Close()
		return nil, fmt.Errorf("%s: attach %s: %w", where, target, err)
	}
	e := &Event{Index: ea.GetEventIndex(), Name: ea.GetName(), Loaded: loaded, Link: l, Hist: ea.GetHistogramArg(),
		RecordArgs: ea.GetRecordArgs()}
	if cfg.Latency {
		e.Hist = LatencyHistogram
	}
	switch cfg.Key {
	case record.EventKeyCPU:
		e.CountBy = "cpu"
	case record.EventKeyArg:
		e.CountBy = ea.GetCountByArg()
	}
	return e, nil
}

// LatencyHistogram is EventValues.histogram of an event-to-event latency.
const LatencyHistogram = "latency"

// EventValues reads an event's results as the wire message.
func EventValues(e *Event, at *timestamppb.Timestamp) (*pb.EventValues, error) {
	c, v, err := e.Loaded.Read()
	if err != nil {
		return nil, fmt.Errorf("event %s: %w", e.Name, err)
	}
	cfg := &e.Loaded.Config
	out := &pb.EventValues{EventIndex: e.Index, Event: e.Name, At: at, Count: cfg.Count,
		CountBy: e.CountBy, Counts: v.Counts, Histogram: e.Hist,
		Seen: c[record.CSeen], Matched: c[record.CMatched], LatencyMissed: c[record.CLatencyMiss]}
	if cfg.Hist || cfg.Latency {
		out.Buckets = append([]uint64(nil), v.Buckets[:]...)
	}
	if len(cfg.Record) > 0 {
		stats, err := e.Loaded.ReadStats()
		if err != nil {
			return nil, fmt.Errorf("event %s: %w", e.Name, err)
		}
		for i, st := range stats {
			signed := cfg.Record[i].Signed
			sum := float64(st.Sum)
			if signed {
				sum = float64(int64(st.Sum))
			}
			out.Recorded = append(out.Recorded, &pb.EventRecorded{Arg: e.RecordArgs[i], Count: st.Count, Sum: sum,
				Min: int64(st.Min), Max: int64(st.Max), Last: int64(st.Last), Signed: signed})
		}
	}
	return out, nil
}
