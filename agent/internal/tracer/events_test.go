package tracer_test

import (
	"errors"
	"fmt"
	"math/bits"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/hoptrace/hoptrace/agent/internal/attach"
	"github.com/hoptrace/hoptrace/agent/internal/loader"
	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
	tu "github.com/hoptrace/hoptrace/agent/internal/testutil"
	"github.com/hoptrace/hoptrace/agent/internal/tracer"
)

// Event probes on the real kernel: syscalls:sys_enter_kill fires once per
// kill(2), so the test knows exactly how many hits pass its where: terms.

func killEvent(where ...*pb.EventTerm) *pb.EventAttach {
	return &pb.EventAttach{EventIndex: 0, Name: "kills", TracepointGroup: "syscalls", TracepointEvent: "sys_enter_kill",
		Program: loader.ProgEventTP, Where: where, Count: true}
}

// bothVariants runs test on the full programs and on the _floor variants
// (5.10's), as the agent picks them (HOPTRACE_FLOOR).
func bothVariants(t *testing.T, test func(t *testing.T)) {
	for _, floor := range []bool{false, true} {
		name := "full"
		if floor {
			name = "floor"
		}
		t.Run(name, func(t *testing.T) {
			if floor {
				t.Setenv("HOPTRACE_FLOOR", "1")
			}
			test(t)
		})
	}
}

func objectSpec(t *testing.T) *ebpf.CollectionSpec {
	t.Helper()
	tu.RequireRoot(t)
	return tu.LoadSpec(t)
}

func TestEventCountsWhereTermsHold(t *testing.T) {
	bothVariants(t, func(t *testing.T) {
		me := int64(os.Getpid())
		ea := killEvent(
			&pb.EventTerm{Arg: "pid", Op: pb.EventOp_EVENT_OP_EQ, Values: []int64{me}},
			&pb.EventTerm{Arg: "sig", Op: pb.EventOp_EVENT_OP_IN, Values: []int64{7, 0, 9}},
			&pb.EventTerm{Arg: "pid", Op: pb.EventOp_EVENT_OP_GT, Values: []int64{me - 1}},
			&pb.EventTerm{Arg: "sig", Op: pb.EventOp_EVENT_OP_LT, Values: []int64{1}},
		)
		ea.CountBy, ea.CountByArg, ea.HistogramArg = pb.EventKey_EVENT_KEY_ARG, "sig", "pid"
		e, err := tracer.AttachEvent(objectSpec(t), ea, loader.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		const sent = 37
		for i := 0; i < sent; i++ {
			if err := unix.Kill(int(me), 0); err != nil {
				t.Fatal(err)
			}
		}
		// Not matched: another signal number, another pid (1 exists, signal 0 only checks).
		_ = unix.Kill(int(me), unix.SIGWINCH)
		_ = unix.Kill(1, 0)
		v, err := tracer.EventValues(e, nil)
		if err != nil {
			t.Fatal(err)
		}
		if v.GetCounts()[0] != sent || len(v.GetCounts()) != 1 {
			t.Fatalf("counts by sig = %v, want {0: %d}", v.GetCounts(), sent)
		}
		if v.GetMatched() != sent || v.GetSeen() < sent+2 {
			t.Fatalf("matched %d seen %d, want %d and >= %d", v.GetMatched(), v.GetSeen(), sent, sent+2)
		}
		b := bits.Len64(uint64(me))
		if v.GetBuckets()[b] != sent {
			t.Fatalf("histogram bucket %d (le %d) = %d, want %d (buckets %v)", b, uint64(1)<<b-1, v.GetBuckets()[b], sent, v.GetBuckets())
		}
	})
}

func TestEventBitTermAndCountByCPU(t *testing.T) {
	me := int64(os.Getpid())
	ea := killEvent(
		&pb.EventTerm{Arg: "pid", Op: pb.EventOp_EVENT_OP_EQ, Values: []int64{me}},
		&pb.EventTerm{Arg: "sig", Op: pb.EventOp_EVENT_OP_BIT, Values: []int64{1 << 3}}, // SIGFPE = 8: bit 3
		&pb.EventTerm{Arg: "sig", Op: pb.EventOp_EVENT_OP_NE, Values: []int64{0}},
	)
	ea.CountBy = pb.EventKey_EVENT_KEY_CPU
	e, err := tracer.AttachEvent(objectSpec(t), ea, loader.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	// SIGWINCH (28) has bit 3 and is ignored; SIGURG (23) has not; signal 0 fails both terms.
	const matched = 6
	for i := 0; i < matched; i++ {
		if err := unix.Kill(int(me), unix.SIGWINCH); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 3; i++ {
		_ = unix.Kill(int(me), unix.SIGURG)
		_ = unix.Kill(int(me), 0)
	}
	v, err := tracer.EventValues(e, nil)
	if err != nil {
		t.Fatal(err)
	}
	var total uint64
	for cpu, n := range v.GetCounts() {
		if cpu >= uint64(runtime.NumCPU()) {
			t.Fatalf("key %d is no CPU of this machine (%d CPUs)", cpu, runtime.NumCPU())
		}
		total += n
	}
	if total != matched || v.GetMatched() != matched || v.GetCountBy() != "cpu" {
		t.Fatalf("counts by %q %v (matched %d), want %d in all", v.GetCountBy(), v.GetCounts(), v.GetMatched(), matched)
	}
}

func TestEventBadInputNamesTheField(t *testing.T) {
	spec := objectSpec(t)
	for _, c := range []struct {
		name  string
		ea    *pb.EventAttach
		field string
		words string
	}{
		{"unknown tracepoint", &pb.EventAttach{EventIndex: 2, TracepointGroup: "net", TracepointEvent: "no_such_event", Program: loader.ProgEventTP, Count: true},
			"events[2].tracepoint", "no such tracepoint"},
		{"unknown argument", killEvent(&pb.EventTerm{Arg: "signal", Op: pb.EventOp_EVENT_OP_EQ, Values: []int64{1}}),
			"events[0].where[0]", `no argument "signal" (arguments: __syscall_nr, pid, sig)`},
		{"string argument", &pb.EventAttach{TracepointGroup: "net", TracepointEvent: "net_dev_xmit", Program: loader.ProgEventTP, Count: true,
			Where: []*pb.EventTerm{{Arg: "len", Op: pb.EventOp_EVENT_OP_GT, Values: []int64{0}}, {Arg: "name", Op: pb.EventOp_EVENT_OP_EQ, Values: []int64{1}}}},
			"events[0].where[1]", "string"},
		{"bad operator", killEvent(&pb.EventTerm{Arg: "sig", Op: pb.EventOp(42), Values: []int64{1}}),
			"events[0].where[0]", "operator 42"},
		{"histogram of a string", &pb.EventAttach{TracepointGroup: "net", TracepointEvent: "net_dev_xmit", Program: loader.ProgEventTP, HistogramArg: "name"},
			"events[0].actions", "string"},
		{"text for an integer", killEvent(&pb.EventTerm{Arg: "sig", Op: pb.EventOp_EVENT_OP_EQ, Text: "9"}),
			"events[0].where[0]", "argument sig of syscalls:sys_enter_kill is an integer (int), not a string"},
		{"text with <", &pb.EventAttach{TracepointGroup: "net", TracepointEvent: "net_dev_xmit", Program: loader.ProgEventTP, Count: true,
			Where: []*pb.EventTerm{{Arg: "name", Op: pb.EventOp_EVENT_OP_LT, Text: "eth0"}}},
			"events[0].where[0]", "compared with == or != only"},
		{"text too long", &pb.EventAttach{TracepointGroup: "task", TracepointEvent: "task_rename", Program: loader.ProgEventTP, Count: true,
			Where: []*pb.EventTerm{{Arg: "newcomm", Op: pb.EventOp_EVENT_OP_EQ, Text: "0123456789abcdef"}}},
			"events[0].where[0]", "1 to 15 bytes, no NUL (newcomm of task:task_rename holds 15 characters)"},
		{"text and values", &pb.EventAttach{TracepointGroup: "net", TracepointEvent: "net_dev_xmit", Program: loader.ProgEventTP, Count: true,
			Where: []*pb.EventTerm{{Arg: "name", Op: pb.EventOp_EVENT_OP_EQ, Text: "eth0", Values: []int64{1}}}},
			"events[0].where[0]", "a text or values, not both"},
	} {
		t.Run(c.name, func(t *testing.T) {
			e, err := tracer.AttachEvent(spec, c.ea, loader.Options{})
			if err == nil {
				e.Close()
				t.Fatal("attached")
			}
			var fe *loader.FieldError
			if !errors.As(err, &fe) || fe.Field != c.field || !strings.Contains(err.Error(), c.words) {
				t.Fatalf("error %q, want field %s with %q", err, c.field, c.words)
			}
		})
	}
}

// Where terms on string arguments, both layouts a tracepoint record keeps
// them in: task:task_rename's char newcomm[16] (this thread renamed with
// prctl) and sched:sched_process_exec's __data_loc filename (a path of this
// test's own, executed). Equal to the text counts exactly those; a text that
// is only the string's prefix counts none; != counts the others.
func TestEventTextTerms(t *testing.T) {
	bothVariants(t, func(t *testing.T) {
		spec := objectSpec(t)
		attach := func(index uint32, group, event string, where ...*pb.EventTerm) *tracer.Event {
			ea := &pb.EventAttach{EventIndex: index, Name: fmt.Sprintf("text-%d", index), TracepointGroup: group,
				TracepointEvent: event, Program: loader.ProgEventTP, Where: where, Count: true}
			e, err := tracer.AttachEvent(spec, ea, loader.Options{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(e.Close)
			return e
		}
		text := func(arg string, op pb.EventOp, value string) *pb.EventTerm {
			return &pb.EventTerm{Arg: arg, Op: op, Text: value}
		}
		eq, ne := pb.EventOp_EVENT_OP_EQ, pb.EventOp_EVENT_OP_NE

		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		tid := int64(unix.Gettid())
		thisThread := &pb.EventTerm{Arg: "pid", Op: eq, Values: []int64{tid}}
		renamedA := attach(0, "task", "task_rename", thisThread, text("newcomm", eq, "ht-rename-a"))
		renamedOther := attach(1, "task", "task_rename", thisThread, text("newcomm", ne, "ht-rename-a"))
		renamedPrefix := attach(2, "task", "task_rename", thisThread, text("newcomm", eq, "ht-rename"))

		dir := fmt.Sprintf("/tmp/ht%04x", os.Getpid()&0xffff) // short: a text holds 15 bytes
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(dir)
		path := filepath.Join(dir, "t")
		truePath, err := exec.LookPath("true")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(truePath, path); err != nil {
			t.Fatal(err)
		}
		executed := attach(3, "sched", "sched_process_exec", text("filename", eq, path))
		executedPrefix := attach(4, "sched", "sched_process_exec", text("filename", eq, path[:len(path)-1]))

		const renames, runs = 9, 5
		var old [16]byte
		if err := unix.Prctl(unix.PR_GET_NAME, uintptr(unsafe.Pointer(&old[0])), 0, 0, 0); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < renames; i++ {
			for _, comm := range []string{"ht-rename-a", "ht-rename-b", "ht-rename-a-lo"} {
				b := append([]byte(comm), 0)
				if err := unix.Prctl(unix.PR_SET_NAME, uintptr(unsafe.Pointer(&b[0])), 0, 0, 0); err != nil {
					t.Fatal(err)
				}
			}
		}
		_ = unix.Prctl(unix.PR_SET_NAME, uintptr(unsafe.Pointer(&old[0])), 0, 0, 0)
		for i := 0; i < runs; i++ {
			if out, err := exec.Command(path).CombinedOutput(); err != nil {
				t.Fatalf("%s: %v %s", path, err, out)
			}
		}
		for _, c := range []struct {
			what string
			e    *tracer.Event
			want uint64
		}{
			{`newcomm == "ht-rename-a"`, renamedA, renames},
			// ht-rename-b, ht-rename-a-lo and the rename back to the thread's own name
			{`newcomm != "ht-rename-a"`, renamedOther, 2*renames + 1},
			{`newcomm == "ht-rename"`, renamedPrefix, 0},
			{"filename == " + path, executed, runs},
			{"filename == " + path[:len(path)-1], executedPrefix, 0},
		} {
			v, err := tracer.EventValues(c.e, nil)
			if err != nil {
				t.Fatal(err)
			}
			if v.GetMatched() != c.want || v.GetCounts()[0] != c.want {
				t.Errorf("%s: matched %d (counts %v), want %d", c.what, v.GetMatched(), v.GetCounts(), c.want)
			}
		}
	})
}

// record: [ARGS] keeps exact statistics, and a latency pairs two events by
// their key arguments through the trace's event_marks map: kill(me, 0)
// marks, kill(me, SIGWINCH) a millisecond later measures; a SIGWINCH with no
// mark before it is missed.
func TestEventRecordAndLatencyPairs(t *testing.T) {
	spec := objectSpec(t)
	marks, err := loader.NewSharedMap(spec, loader.MapEventMarks)
	if err != nil || marks == nil {
		t.Fatalf("event_marks: %v", err)
	}
	defer marks.Close()
	opts := loader.Options{EventMarks: marks}
	me := int64(os.Getpid())
	start := killEvent(&pb.EventTerm{Arg: "pid", Op: pb.EventOp_EVENT_OP_EQ, Values: []int64{me}},
		&pb.EventTerm{Arg: "sig", Op: pb.EventOp_EVENT_OP_EQ, Values: []int64{0}})
	start.MarkArg, start.RecordArgs = "pid", []string{"sig", "pid"}
	end := killEvent(&pb.EventTerm{Arg: "pid", Op: pb.EventOp_EVENT_OP_EQ, Values: []int64{me}},
		&pb.EventTerm{Arg: "sig", Op: pb.EventOp_EVENT_OP_EQ, Values: []int64{int64(unix.SIGWINCH)}})
	end.EventIndex, end.Name, end.LatencyArg, end.LatencySince = 1, "kills-later", "pid", 0
	s, err := tracer.AttachEvent(spec, start, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	e, err := tracer.AttachEvent(spec, end, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()

	const pairs = 20
	_ = unix.Kill(int(me), unix.SIGWINCH) // no mark yet: missed
	for i := 0; i < pairs; i++ {
		_ = unix.Kill(int(me), 0)
		time.Sleep(time.Millisecond)
		_ = unix.Kill(int(me), unix.SIGWINCH)
	}
	sv, err := tracer.EventValues(s, nil)
	if err != nil {
		t.Fatal(err)
	}
	rec := sv.GetRecorded()
	if len(rec) != 2 || rec[0].GetArg() != "sig" || rec[1].GetArg() != "pid" {
		t.Fatalf("recorded %v, want sig and pid", rec)
	}
	if r := rec[0]; r.GetCount() != pairs || r.GetSum() != 0 || r.GetMin() != 0 || r.GetMax() != 0 || r.GetSigned() {
		t.Fatalf("sig recorded %v, want %d zeros (syscall arguments are unsigned longs in tracefs)", r, pairs)
	}
	if r := rec[1]; r.GetCount() != pairs || r.GetSum() != float64(pairs*me) || r.GetMin() != me || r.GetMax() != me || r.GetLast() != me {
		t.Fatalf("pid recorded %v, want %d times %d", r, pairs, me)
	}
	ev, err := tracer.EventValues(e, nil)
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for b, c := range ev.GetBuckets() {
		// Each latency spans a 1 ms sleep: bucket of >= 2^19 ns, under a second.
		if c != 0 && (b < bits.Len64(uint64(time.Millisecond))-1 || b > bits.Len64(uint64(time.Second))) {
			t.Fatalf("latency bucket %d (le %d ns) has %d: not 1 ms..1 s (buckets %v)", b, uint64(1)<<b-1, c, ev.GetBuckets())
		}
		n += c
	}
	if n != pairs || ev.GetLatencyMissed() != 1 || ev.GetHistogram() != tracer.LatencyHistogram {
		t.Fatalf("%d latencies (histogram %q), %d missed; want %d and 1", n, ev.GetHistogram(), ev.GetLatencyMissed(), pairs)
	}
}

// Kernel-function events: a kprobe and an fentry on do_send_sig_info(sig,
// info, task, type) count exactly this process's kill(me, SIGWINCH) calls
// (where pid == me and arg0 == 28: the function events' pid and first
// argument) and record the signal; where the kernel refuses kprobes or fentry
// (this host: no kprobe_events, lockdown), the refusal names the spec field
// and the reason, and nothing stays loaded.
func TestEventKernelFunctions(t *testing.T) {
	spec := objectSpec(t)
	me := int64(os.Getpid())
	const fn = "do_send_sig_info"
	names := map[pb.AttachKind]string{pb.AttachKind_ATTACH_KIND_KPROBE: "kprobe", pb.AttachKind_ATTACH_KIND_FENTRY: "fentry"}
	for _, kind := range []pb.AttachKind{pb.AttachKind_ATTACH_KIND_KPROBE, pb.AttachKind_ATTACH_KIND_FENTRY} {
		t.Run(names[kind], func(t *testing.T) {
			program := map[pb.AttachKind]string{pb.AttachKind_ATTACH_KIND_KPROBE: loader.ProgEventKprobe,
				pb.AttachKind_ATTACH_KIND_FENTRY: loader.ProgEventFentry}[kind]
			ea := &pb.EventAttach{EventIndex: 2, Name: "sigwinch", Kind: kind, Function: fn, Program: program,
				Where: []*pb.EventTerm{{Arg: "pid", Op: pb.EventOp_EVENT_OP_EQ, Values: []int64{me}},
					{Arg: "arg0", Op: pb.EventOp_EVENT_OP_EQ, Values: []int64{int64(unix.SIGWINCH)}}},
				Count: true, CountBy: pb.EventKey_EVENT_KEY_CPU, RecordArgs: []string{"arg0", "pid"}}
			e, err := tracer.AttachEvent(spec, ea, loader.Options{})
			refusal := attach.KernelFunctionRefusal(kind)
			if refusal != "" {
				field := "events[2]." + names[kind] + ": "
				if err == nil || !strings.HasPrefix(err.Error(), field) || !strings.Contains(err.Error(), refusal) {
					t.Fatalf("want a refusal naming %q and %q, got %v", field, refusal, err)
				}
				t.Logf("refused, as this kernel must: %v", err)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			const calls = 25
			for i := 0; i < calls; i++ {
				if err := unix.Kill(int(me), unix.SIGWINCH); err != nil {
					t.Fatal(err)
				}
				_ = unix.Kill(int(me), unix.SIGURG) // another signal of this process: not counted
			}
			v, err := tracer.EventValues(e, nil)
			if err != nil {
				t.Fatal(err)
			}
			var n uint64
			for _, c := range v.GetCounts() {
				n += c
			}
			if n != calls || v.GetMatched() != calls {
				t.Fatalf("%s %s: counted %d (matched %d of %d hits), want %d; recorded %v", names[kind], fn, n, v.GetMatched(), v.GetSeen(), calls, v.GetRecorded())
			}
			rec := v.GetRecorded()
			sig := int64(unix.SIGWINCH)
			if len(rec) != 2 || rec[0].GetCount() != calls || rec[0].GetMin() != sig || rec[0].GetMax() != sig ||
				rec[1].GetMin() != me || rec[1].GetMax() != me {
				t.Fatalf("recorded %v: want arg0 = %d and pid = %d, %d times", rec, sig, me, calls)
			}
			t.Logf("%s %s: %d calls counted by CPU %v, recorded %v", names[kind], fn, n, v.GetCounts(), rec)
		})
	}
	t.Run("bad-argument", func(t *testing.T) {
		ea := &pb.EventAttach{EventIndex: 0, Name: "x", Kind: pb.AttachKind_ATTACH_KIND_KPROBE, Function: "__x64_sys_getppid",
			Program: loader.ProgEventKprobe, Where: []*pb.EventTerm{{Arg: "arg3", Op: pb.EventOp_EVENT_OP_EQ, Values: []int64{1}}}, Count: true}
		_, err := loader.ResolveEvent(ea, loader.UnknownFunctionArgs(1))
		if err == nil || !strings.Contains(err.Error(), `events[0].where[0]: function __x64_sys_getppid has no argument "arg3" (arguments: arg0, pid)`) {
			t.Fatalf("want the missing argument named with the function's arguments, got %v", err)
		}
	})
}
