// Command hoptrace-agent loads and attaches hoptrace's hop programs on one
// node and ships their records. See docs/design.md.
//
//	hoptrace-agent --node N --dispatcher ADDR --collector ADDR [--netns NS]
//	hoptrace-agent --node N --dispatcher ADDR --kafka-brokers B1,B2 --kafka-topic T --clock-server ADDR
//	hoptrace-agent run --plan FILE --ca CA | --allow-unsigned-plan --out - [--node N] [--netns NS] [--duration D]
//	hoptrace-agent probe
//	hoptrace-agent mace --container NS [--path inner-dev|max-dev|syscalls] [--duration D]
//	hoptrace-agent iron [--duration D] [--influx-url URL]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/hoptrace/hoptrace/agent/internal/agent"
	"github.com/hoptrace/hoptrace/agent/internal/kafka"
	"github.com/hoptrace/hoptrace/agent/internal/loader"
	"github.com/hoptrace/hoptrace/agent/internal/memlimit"
	"github.com/hoptrace/hoptrace/agent/internal/preset"
	"github.com/hoptrace/hoptrace/agent/internal/signing"
	"github.com/hoptrace/hoptrace/agent/internal/workload"
)

func main() {
	// A soft memory limit a little above what the agent keeps: the GC works harder before a burst
	// of records grows it, and no harder for the traces it holds (GOMEMLIMIT overrides).
	if _, set := os.LookupEnv("GOMEMLIMIT"); !set {
		go memlimit.Follow(context.Background(), memoryFloor, memoryHeadroom, 2*time.Second)
	}
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "hoptrace-agent:", err)
		os.Exit(1)
	}
}

// The soft memory limit: at least memoryFloor, and memoryHeadroom above what the agent keeps.
const (
	memoryFloor    = 16 << 20
	memoryHeadroom = 4 << 20
)

// kernelBTFEnv names the --kernel-btf file for every mode, the presets' included.
const kernelBTFEnv = "HOPTRACE_KERNEL_BTF"

// DefaultPinDir is --pin-dir's default: below bpffs' usual mount point.
const DefaultPinDir = "/sys/fs/bpf/hoptrace"

func run(args []string) error {
	// Kernels before 5.11 charge BPF maps and programs to RLIMIT_MEMLOCK (often 64 KiB).
	if err := loader.AllowLockedMemory(); err != nil {
		if errors.Is(err, os.ErrPermission) {
			// The probe behind it creates a map: EPERM means no BPF at all, not a low limit.
			return fmt.Errorf("BPF not permitted: the agent needs CAP_SYS_ADMIN (or CAP_BPF with CAP_PERFMON and "+
				"CAP_NET_ADMIN, from 5.8), and CAP_SYS_RESOURCE before 5.11 (RLIMIT_MEMLOCK): %w", err)
		}
		return fmt.Errorf("lift RLIMIT_MEMLOCK for BPF: %w", err)
	}
	if len(args) > 0 && (args[0] == "mace" || args[0] == "iron" || args[0] == "discover") {
		if err := loader.UseKernelBTF(os.Getenv(kernelBTFEnv)); err != nil {
			return err
		}
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		return preset.Command(ctx, args[0], args[1:], os.Stdout)
	}
	mode := "daemon"
	if len(args) > 0 && (args[0] == "run" || args[0] == "probe") {
		mode, args = args[0], args[1:]
	}
	if mode == "probe" {
		return agent.Probe(os.Stdout)
	}

	fs := flag.NewFlagSet("hoptrace-agent "+mode, flag.ContinueOnError)
	var cfg agent.Config
	var kernelBTF string
	fs.StringVar(&kernelBTF, "kernel-btf", os.Getenv(kernelBTFEnv), "BTF of this kernel for a kernel without "+loader.KernelBTFPath+
		" (e.g. BTFHub's file for its release; $"+kernelBTFEnv+")")
	var ring uint
	fs.StringVar(&cfg.Node, "node", "", "node name (default: hostname)")
	fs.StringVar(&cfg.Netns, "netns", "", "the emulated host's network namespace (/run/netns name or path); hops without netns run there")
	fs.StringVar(&cfg.NetnsOwned, "netns-owned", "", "the host's other namespaces, /run/netns names comma-separated (default: every /run/netns entry): discover attributes a device crossing to this node only in --netns and these (emulated hosts share one kernel)")
	fs.StringVar(&cfg.DockerSocket, "docker-socket", dockerSocketDefault(), `Docker Engine API socket the namespaces' containers and pods are named from (default: $DOCKER_HOST if unix://, else `+workload.DefaultSocket+`; "" = none). No socket there: no containers reported`)
	fs.StringVar(&cfg.CRISocket, "cri-socket", workload.DefaultCRISocket(), `Kubernetes CRI runtime socket (containerd, CRI-O) the namespaces' pods and containers are named from (default: the first of `+strings.Join(workload.CRISockets, ", ")+` that exists; "" = none). Asked besides --docker-socket: a pod both report is listed once`)
	fs.StringVar(&cfg.Plan, "plan", "", "plan file to run: a plan signed by a dispatcher certificate of --ca (hoptrace plan sign), or a bare TracePlan in protojson with --allow-unsigned-plan")
	fs.BoolVar(&cfg.AllowUnsignedPlan, "allow-unsigned-plan", false, "run a --plan file no dispatcher signed (root's own debugging: whoever can write the file chooses what is loaded); logs a WARNING")
	fs.StringVar(&cfg.Out, "out", "", `write JSON lines here ("-" = stdout)`)
	fs.StringVar(&cfg.Dispatcher, "dispatcher", "", "dispatcher gRPC address (host:port)")
	fs.StringVar(&cfg.Collector, "collector", "", "collector gRPC address (host:port)")
	fs.DurationVar(&cfg.Duration, "duration", 0, "exit after this long (0 = until SIGINT/SIGTERM)")
	fs.IntVar(&cfg.BufferBytes, "buffer-bytes", 256<<20, "bound of the in-memory record queue toward the collector")
	// 8 MiB: hop programs force a wakeup at 1 MiB pending and the reader drains every 100 ms, so this is
	// 8x headroom at 1 M records/s; the kernel maps the data area twice (wrap-around), so RSS shows 16 MiB.
	fs.UintVar(&ring, "ringbuf-bytes", 8<<20, "size of the records ring buffer (power of two)")
	fs.StringVar(&cfg.ClockServer, "clock-server", "", `collector's NTP time service host:port (default: the --collector host, port `+agent.DefaultClockPort+`; "off" = no clock rounds)`)
	fs.DurationVar(&cfg.ClockInterval, "clock-interval", 10*time.Second, "time between clock rounds (Cristian's algorithm against --clock-server)")
	fs.IntVar(&cfg.ClockProbes, "clock-probes", 100, "NTP probes per clock round; the one with the smallest delay wins")
	fs.StringVar(&cfg.ClockAuth, "clock-auth", "auto", "authenticate the clock rounds (HMAC-SHA256 and a nonce per probe): on (no key: no rounds, the clock stays unknown), off, or auto (on when a key is to be had: --clock-key-file, or mutual TLS to a --collector, which hands one)")
	fs.StringVar(&cfg.ClockKeyFile, "clock-key-file", "", "shared secret (32+ bytes, raw or hex) the collector's --clock-key-file holds too: authenticated rounds without the collector's mutual TLS (Kafka, --insecure labs)")
	fs.DurationVar(&cfg.ClockOffset, "clock-offset", 0, "SIMULATION (tests/demos on one machine): act as a host whose wall clock is off by this much (e.g. 3.7ms, -1ms), in record timestamps and clock rounds alike")
	fs.Float64Var(&cfg.ClockDriftPPM, "clock-drift-ppm", 0, "SIMULATION (tests/demos on one machine): and whose clock error grows by this many ppm from the agent's start")
	fs.StringVar(&cfg.TLS.CA, "ca", "", "CA certificate (PEM) the dispatcher's and collector's certificates must chain to")
	fs.StringVar(&cfg.TLS.Cert, "cert", "", "this agent's certificate (PEM; its CN must be --node): `hoptrace certs --agent NODE`")
	fs.StringVar(&cfg.TLS.Key, "key", "", "this agent's private key (PEM)")
	fs.StringVar(&cfg.TLS.CRL, "crl", "", "the CA's certificate revocation list, PEM or DER (hoptrace revoke): a dispatcher or collector certificate on it is refused, and so is a command it signed; re-read when the file changes")
	fs.DurationVar(&cfg.MaxClockSkew, "max-clock-skew", signing.DefaultMaxClockSkew, "how far the dispatcher's clock may be from this node's: a signed command is taken until its expiry plus this, and refused when signed further ahead")
	fs.BoolVar(&cfg.Insecure, "insecure", false, "talk to the dispatcher and collector in plaintext, unauthenticated (loopback demos and tests only)")
	var kcfg kafka.Config
	var kafkaBrokers, kafkaCA, kafkaCert, kafkaKey, kafkaPasswordFile string
	var kafkaTLS bool
	fs.StringVar(&kafkaBrokers, "kafka-brokers", "", "publish records to Kafka instead of --collector: bootstrap brokers host:port[,host:port...] (docs/operations.md, Kafka)")
	fs.StringVar(&kcfg.Topic, "kafka-topic", "hoptrace-records", "Kafka topic of the records (it must exist; its partitions spread packets over the collectors)")
	fs.IntVar(&kcfg.MaxBufferedBytes, "kafka-buffer-bytes", 64<<20, "bound of what the Kafka client holds unacknowledged; beyond it --buffer-bytes holds (drop-oldest, counted)")
	fs.BoolVar(&kafkaTLS, "kafka-tls", false, "TLS toward the brokers (verified against --kafka-ca, or the system's roots)")
	fs.StringVar(&kafkaCA, "kafka-ca", "", "CA certificate (PEM) of the brokers; implies --kafka-tls")
	fs.StringVar(&kafkaCert, "kafka-cert", "", "client certificate (PEM) for brokers that require one; implies --kafka-tls")
	fs.StringVar(&kafkaKey, "kafka-key", "", "its private key (PEM)")
	fs.StringVar(&kcfg.SASLMechanism, "kafka-sasl-mechanism", "", "SASL toward the brokers: plain, scram-sha-256 or scram-sha-512 (use with TLS)")
	fs.StringVar(&kcfg.SASLUser, "kafka-sasl-user", "", "SASL user name")
	fs.StringVar(&kafkaPasswordFile, "kafka-sasl-password-file", "", "file holding the SASL password (never on the command line)")
	fs.StringVar(&cfg.PinDir, "pin-dir", DefaultPinDir, `where the traces are pinned in bpffs (a root-only directory per node below it) so that they outlive the agent: a killed agent's hops go on recording into the pinned ring buffer, and the next agent of the node takes them over without a gap ("" = pin nothing: the traces go with the agent's process)`)
	fs.StringVar(&cfg.CommandState, "command-state", "", `with --pin-dir "": a root-only file where the agent keeps the sequences of the signed commands it took, so that a restarted agent refuses one played again ("" = nowhere: only the commands' expiry bounds a replay after a restart); with a --pin-dir they are pinned there`)
	fs.BoolVar(&cfg.KeepOnExit, "keep-on-exit", false, "on SIGTERM or SIGINT (or at the end of --duration) leave the pinned traces running for the next agent of this node, a restart or an upgrade, instead of detaching them; a killed agent (SIGKILL, the OOM killer, a crash) always leaves them")
	fs.BoolVar(&cfg.Hooks, "hooks", false, "run every trace's tc hops in one program per device and direction, its tracepoint hops (skb:kfree_skb's with its drop reason aside) in one per device and event, and its TCP tagger in one sock_ops program per cgroup (hook.bpf.o, from $HOPTRACE_BPF_DIR, kernel-patch/build or /usr/lib/hoptrace/bpf), instead of a program each: a device crossed by many traces then costs about what one costs, a hook holds 256 traces (tcx takes 63 programs a device and direction, a cgroup 64 sock_ops programs); their hops are not pinned (a restarted agent attaches them again from their plans)")
	fs.StringVar(&cfg.MetricsListen, "metrics-listen", "127.0.0.1:9172", `serve Prometheus /metrics and /healthz here ("" = off; several agents on one machine need distinct ports)`)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage of hoptrace-agent %s:\n", mode)
		fs.PrintDefaults()
		fmt.Fprintln(fs.Output(), "\nFlags marked SIMULATION skew this agent's clock on purpose, to test clock alignment on one machine; never set them in production.")
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if err := loader.UseKernelBTF(kernelBTF); err != nil {
		return err
	}
	cfg.RingBytes = uint32(ring)
	if kafkaBrokers != "" {
		if cfg.Collector != "" {
			return fmt.Errorf("--kafka-brokers and --collector exclude each other: records go one way")
		}
		kcfg.Brokers = strings.Split(kafkaBrokers, ",")
		if kafkaTLS || kafkaCA != "" || kafkaCert != "" {
			tlsCfg, err := kafka.TLSConfig(kafkaCA, kafkaCert, kafkaKey)
			if err != nil {
				return err
			}
			kcfg.TLS = tlsCfg
		}
		if kafkaPasswordFile != "" {
			b, err := os.ReadFile(kafkaPasswordFile)
			if err != nil {
				return fmt.Errorf("--kafka-sasl-password-file: %w", err)
			}
			kcfg.SASLPassword = strings.TrimSpace(string(b))
		}
		if err := kcfg.Validate(); err != nil {
			return err
		}
		cfg.Kafka = &kcfg
	}
	if mode == "run" {
		if cfg.Plan == "" {
			return fmt.Errorf("run needs --plan")
		}
		if cfg.Out == "" && cfg.Collector == "" && cfg.Kafka == nil {
			cfg.Out = "-"
		}
	} else if cfg.Dispatcher == "" && !((cfg.Collector != "" || cfg.Kafka != nil) && cfg.Plan != "") {
		return fmt.Errorf("need --dispatcher, or --collector (or --kafka-brokers) with --plan")
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return agent.Run(ctx, cfg)
}

// dockerSocketDefault is $DOCKER_HOST when it names a unix socket, else
// Docker's default socket.
func dockerSocketDefault() string {
	if h := os.Getenv("DOCKER_HOST"); strings.HasPrefix(h, "unix://") {
		return strings.TrimPrefix(h, "unix://")
	}
	return workload.DefaultSocket
}
