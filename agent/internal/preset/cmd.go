package preset

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"
)

// Command runs `hoptrace-agent mace|iron ARGS`, writing JSON lines to w.
func Command(ctx context.Context, name string, args []string, w io.Writer) error {
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
	default:
		return fmt.Errorf("unknown preset %q", name)
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
