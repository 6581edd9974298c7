package preset

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"time"
)

// Command runs `hoptrace-agent mace|iron ARGS`, writing JSON lines to w.
func Command(ctx context.Context, name string, args []string, w io.Writer) error {
	fs, run, err := flagSet(ctx, name, w, nil)
	if err != nil {
		return err
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%s: unexpected arguments %v", name, fs.Args())
	}
	return run()
}

// flagSet declares the flags of one preset; run runs it with what was set.
func flagSet(ctx context.Context, name string, w io.Writer, align Aligner) (*flag.FlagSet, func() error, error) {
	fs := flag.NewFlagSet("hoptrace-agent "+name, flag.ContinueOnError)
	var run func() error
	switch name {
	case "mace":
		var c MaceConfig
		fs.StringVar(&c.Container, "container", "", "the container: netns name (/run/netns), netns path, or a PID in it")
		fs.StringVar(&c.Path, "path", PathInnerDev, "event path: inner-dev, max-dev or syscalls (MACE)")
		fs.StringVar(&c.HostNetns, "host-netns", "", "netns of the container's host (default: the agent's)")
		fs.StringVar(&c.Inner, "inner", "", "container-side device in the container netns (default: its default route's device)")
		fs.StringVar(&c.Outer, "outer", "", "host device toward the wire (default: the host's route to --peer, or its default route; tunnels followed to their underlay)")
		fs.StringVar(&c.Peer, "peer", "", "an address the container talks to, to find the outer device")
		fs.StringVar(&c.Node, "node", "", "node name in the summary (default: hostname)")
		fs.DurationVar(&c.Duration, "duration", 0, "stop after this long (0 = until SIGINT/SIGTERM)")
		fs.StringVar(&c.Object, "object", "", "mace.bpf.o (default: searched, see $"+ObjectDirEnv+")")
		fs.BoolVar(&c.Packets, "packets", false, "print one line per packet")
		run = func() error { return RunMace(ctx, c, w) }
	case "iron":
		var c IronConfig
		fs.StringVar(&c.Node, "node", "", "node name (default: hostname)")
		fs.StringVar(&c.HostNetns, "host-netns", "", "the host's netns: packets on its devices wait for the container they reach (default: the agent's)")
		fs.DurationVar(&c.Duration, "duration", 10*time.Second, "how long to account (0 = until SIGINT/SIGTERM)")
		fs.StringVar(&c.Object, "object", "", "iron.bpf.o (default: searched, see $"+ObjectDirEnv+")")
		fs.StringVar(&c.InfluxURL, "influx-url", "", "write the net_cpu measurement to this InfluxDB (v2 write API)")
		fs.StringVar(&c.InfluxBucket, "influx-bucket", "hoptrace/autogen", "InfluxDB bucket (1.8: db/retention-policy)")
		fs.StringVar(&c.InfluxOrg, "influx-org", "-", "InfluxDB organization")
		fs.StringVar(&c.InfluxToken, "influx-token", "", "InfluxDB token (1.8: USER:PASSWORD)")
		run = func() error { return RunIron(ctx, c, w) }
	case "discover":
		c := DiscoverConfig{Align: align}
		fs.StringVar(&c.Node, "node", "", "node name in the summary (default: hostname)")
		fs.StringVar(&c.HostNetns, "host-netns", "", "this host's own netns (default: the agent's)")
		fs.StringVar(&c.Owned, "netns-owned", "", "the host's other namespaces (/run/netns names, comma-separated; default: every /run/netns entry)")
		fs.StringVar(&c.Match, "match", "", "the flow: a FlowMatch in protojson (the dispatcher sends it), e.g. {\"ipProto\":17,\"family\":4,\"srcAddr\":\"xhIBAg==\",\"srcMask\":\"/////w==\"}")
		fs.DurationVar(&c.Duration, "duration", 5*time.Second, "how long to look")
		fs.IntVar(&c.Packets, "packets", 0, "stop once this many tagged packets were seen (0 = run the duration)")
		fs.UintVar(&c.Origin, "origin", 0, "the discovery's ID origin (the dispatcher gives one, 1..239): its taggers write IDs of it and every node follows them through address translation; 0 = this node's own, not followed")
		fs.StringVar(&c.Follow, "follow", "", "ID origins of applied traces whose packets to follow through address translation too (comma-separated, 1..239): a trace of an overlapping flow may have tagged the flow's packets first")
		fs.StringVar(&c.Object, "object", "", "hoptrace.bpf.o (default: searched, see $"+ObjectDirEnv+")")
		run = func() error {
			if c.Node == "" {
				c.Node, _ = os.Hostname()
			}
			return RunDiscover(ctx, c, w)
		}
	default:
		return nil, nil, fmt.Errorf("unknown preset %q", name)
	}
	return fs, run, nil
}

// localOnly are flags a remote run (RunPreset from the dispatcher) may not
// set: which object file to load as BPF, and where a node's root agent sends
// data. Only whoever runs hoptrace-agent on the node chooses those.
var localOnly = map[string]bool{
	"object": true, "influx-url": true, "influx-bucket": true, "influx-org": true, "influx-token": true,
}

// RemoteDefaultDuration bounds a preset run for the dispatcher when its args
// give no duration: a remote run must end on its own.
const RemoteDefaultDuration = 10 * time.Second

// Run runs a preset once for the dispatcher (AgentSession RunPreset): args
// are its flags without dashes; the result is the final summary object as
// JSON. Iron's summary also lists its "container" lines (per_container) and
// "task" lines (per_task), which a remote caller cannot read otherwise.
func Run(ctx context.Context, name string, args map[string]string) (string, error) {
	return RunAligned(ctx, name, args, nil)
}

// RunAligned is Run with the agent's clock: discover reports its crossings'
// timestamps on the master's clock through align.
func RunAligned(ctx context.Context, name string, args map[string]string, align Aligner) (string, error) {
	var buf bytes.Buffer
	fs, run, err := flagSet(ctx, name, &buf, align)
	if err != nil {
		return "", err
	}
	keys := make([]string, 0, len(args))
	for k := range args {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if fs.Lookup(k) == nil {
			return "", fmt.Errorf("%s: unknown argument %q", name, k)
		}
		if localOnly[k] {
			return "", fmt.Errorf("%s: argument %s is for local runs only (hoptrace-agent %s --%s)", name, k, name, k)
		}
		if err := fs.Set(k, args[k]); err != nil {
			return "", fmt.Errorf("%s: argument %s: %w", name, k, err)
		}
	}
	d, _ := time.ParseDuration(fs.Lookup("duration").Value.String())
	if _, ok := args["duration"]; !ok {
		d = RemoteDefaultDuration
		fs.Set("duration", d.String())
	}
	if d <= 0 {
		return "", fmt.Errorf("%s: argument duration: must be > 0 for a remote run", name)
	}
	if err := run(); err != nil {
		return "", err
	}
	return summaryOf(buf.Bytes())
}

// summaryOf picks the summary line out of a preset's JSON lines and folds
// Iron's container and task lines into it.
func summaryOf(out []byte) (string, error) {
	var summary map[string]any
	containers, tasks := []json.RawMessage{}, []json.RawMessage{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	for sc.Scan() {
		line := append([]byte(nil), sc.Bytes()...)
		var head struct {
			Type string `json:"type"`
		}
		if json.Unmarshal(line, &head) != nil {
			continue
		}
		switch head.Type {
		case "summary":
			if err := json.Unmarshal(line, &summary); err != nil {
				return "", fmt.Errorf("decode summary: %w", err)
			}
		case "container":
			containers = append(containers, line)
		case "task":
			tasks = append(tasks, line)
		}
	}
	if summary == nil {
		return "", errors.New("the preset ended without a summary")
	}
	if _, iron := summary["tasks"]; iron {
		summary["per_container"] = containers
		summary["per_task"] = tasks
	}
	b, err := json.Marshal(summary)
	return string(b), err
}
