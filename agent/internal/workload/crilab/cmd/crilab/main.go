// Command crilab runs the CRI lab (package crilab) for tests in other
// languages: a private containerd or CRI-O with the pods named on the
// command line.
// It prints one JSON line (the socket, each pod's id and network namespace,
// each container's id), then keeps everything until SIGTERM, SIGINT or the
// end of its standard input, removes it all and exits (1 when something
// could not be removed, said on standard error).
//
//	crilab --dir DIR --bridge NAME --subnet 198.18.241.0/24 --pod shop/web-0/app --pod shop/db-0
//	crilab --runtime cri-o --crio-dir .tools/crio/VERSION --dir DIR ...
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/hoptrace/hoptrace/agent/internal/workload/crilab"
)

type podFlags []string

func (p *podFlags) String() string     { return strings.Join(*p, ",") }
func (p *podFlags) Set(v string) error { *p = append(*p, v); return nil }

type podOut struct {
	Namespace  string            `json:"namespace"`
	Name       string            `json:"name"`
	UID        string            `json:"uid"`
	ID         string            `json:"id"`
	Netns      string            `json:"netns"`
	Containers map[string]string `json:"containers"` // name -> id
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "crilab:", err)
		os.Exit(1)
	}
}

func run() (err error) {
	var cfg crilab.Config
	var pods podFlags
	flag.StringVar(&cfg.Runtime, "runtime", crilab.Containerd, "the CRI runtime: "+crilab.Containerd+" or "+crilab.CRIO)
	flag.StringVar(&cfg.CRIODir, "crio-dir", "", "where make crio put crio, pinns and importimage (--runtime "+crilab.CRIO+")")
	flag.StringVar(&cfg.Dir, "dir", "", "the lab's directory (removed at exit)")
	flag.StringVar(&cfg.Bridge, "bridge", "", "the CNI bridge's name")
	flag.StringVar(&cfg.Subnet, "subnet", "", "the pods' subnet, inside 198.18.0.0/15")
	flag.StringVar(&cfg.Pause, "pause", "", "a static pause binary (default: go build it)")
	flag.Var(&pods, "pod", "NAMESPACE/NAME[/CONTAINER...]: a pod to run, with containers of the pause image (repeatable)")
	flag.Parse()
	if cfg.Dir == "" || cfg.Bridge == "" || cfg.Subnet == "" {
		return fmt.Errorf("need --dir, --bridge and --subnet")
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); stop <- syscall.SIGHUP }()

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	lab, err := crilab.Start(ctx, cfg)
	if err != nil {
		return err
	}
	defer func() {
		if stopErr := lab.Stop(); stopErr != nil {
			err = errors.Join(err, fmt.Errorf("stop: %w", stopErr))
		}
	}()
	out := struct {
		Socket string   `json:"socket"`
		Pods   []podOut `json:"pods"`
	}{Socket: lab.Socket}
	for i, p := range pods {
		parts := strings.Split(p, "/")
		if len(parts) < 2 {
			return fmt.Errorf("--pod %q: NAMESPACE/NAME[/CONTAINER...]", p)
		}
		uid := fmt.Sprintf("00000000-0000-4000-8000-%012d", i+1)
		pod, err := lab.RunPod(ctx, parts[0], parts[1], uid)
		if err != nil {
			return err
		}
		po := podOut{Namespace: parts[0], Name: parts[1], UID: uid, ID: pod.ID, Netns: pod.Netns, Containers: map[string]string{}}
		for _, name := range parts[2:] {
			id, err := lab.RunContainer(ctx, pod, name)
			if err != nil {
				return err
			}
			po.Containers[name] = id
		}
		out.Pods = append(out.Pods, po)
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		return err
	}
	<-stop
	return nil
}
