package preset

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cilium/ebpf"

	"github.com/hoptrace/hoptrace/agent/internal/allowlist"
	"github.com/hoptrace/hoptrace/agent/internal/attach"
	"github.com/hoptrace/hoptrace/agent/internal/loader"
	"github.com/hoptrace/hoptrace/agent/internal/netns"
)

// IronConfig is `hoptrace-agent iron`.
type IronConfig struct {
	Node                                            string
	HostNetns                                       string
	Duration                                        time.Duration
	Object                                          string
	InfluxURL, InfluxBucket, InfluxOrg, InfluxToken string
}

// Iron victim kinds (enum iron_victim_kind).
const (
	ironTask      = 0
	ironIdle      = 1
	ironKsoftirqd = 2
)

// ironChargedKey mirrors struct iron_charged_key (include/iron.h).
type ironChargedKey struct {
	CgroupID uint64
	NetnsIno uint32
	Tgid     uint32
	Kind     uint32
	Pad      uint32
}

// ironValue mirrors struct iron_caused and struct iron_charged (two u64).
type ironValue struct {
	Ns    uint64
	Count uint64
}

// IronContainer is one container's line: what its traffic caused and what it was charged.
type IronContainer struct {
	Type      string   `json:"type"` // "container"
	Node      string   `json:"node"`
	Container string   `json:"container"`
	NetnsIno  uint32   `json:"netns_ino"`
	Cgroups   []string `json:"cgroups"`
	CausedNs  uint64   `json:"caused_ns"`
	Packets   uint64   `json:"packets"`
	ChargedNs uint64   `json:"charged_ns"`
	Softirqs  uint64   `json:"softirqs"`
	DiffNs    int64    `json:"diff_ns"` // charged - caused: > 0 pays for others
}

// IronTask is one interrupted task's line.
type IronTask struct {
	Type      string `json:"type"` // "task"
	Tgid      uint32 `json:"tgid"`
	Comm      string `json:"comm"`
	Kind      string `json:"kind"` // task, idle, ksoftirqd
	Container string `json:"container"`
	Cgroup    string `json:"cgroup"`
	ChargedNs uint64 `json:"charged_ns"`
	Softirqs  uint64 `json:"softirqs"`
}

// IronAccount folds the kernel's maps into per-container lines.
type IronAccount struct {
	Containers map[uint32]*IronContainer
	Tasks      []IronTask
}

// AccountIron joins caused (by netns) and charged (by task) per container.
// name resolves a netns inode, cgroup a cgroup id, comm a tgid.
func AccountIron(caused map[uint32]ironValue, charged map[ironChargedKey]ironValue,
	name func(uint32) string, cgroup func(uint64) string, comm func(uint32) string) IronAccount {
	acc := IronAccount{Containers: map[uint32]*IronContainer{}}
	get := func(ino uint32) *IronContainer {
		c := acc.Containers[ino]
		if c == nil {
			c = &IronContainer{Type: "container", Container: name(ino), NetnsIno: ino, Cgroups: []string{}}
			acc.Containers[ino] = c
		}
		return c
	}
	for ino, v := range caused {
		c := get(ino)
		c.CausedNs += v.Ns
		c.Packets += v.Count
	}
	for k, v := range charged {
		kind := map[uint32]string{ironTask: "task", ironIdle: "idle", ironKsoftirqd: "ksoftirqd"}[k.Kind]
		t := IronTask{Type: "task", Tgid: k.Tgid, Comm: comm(k.Tgid), Kind: kind, Container: name(k.NetnsIno),
			Cgroup: cgroup(k.CgroupID), ChargedNs: v.Ns, Softirqs: v.Count}
		acc.Tasks = append(acc.Tasks, t)
		if k.Kind != ironTask {
			continue // idle and ksoftirqd time is billed to no container
		}
		c := get(k.NetnsIno)
		c.ChargedNs += v.Ns
		c.Softirqs += v.Count
		if !contains(c.Cgroups, t.Cgroup) {
			c.Cgroups = append(c.Cgroups, t.Cgroup)
		}
	}
	for _, c := range acc.Containers {
		sort.Strings(c.Cgroups)
		c.DiffNs = int64(c.ChargedNs) - int64(c.CausedNs)
	}
	sort.Slice(acc.Tasks, func(i, j int) bool { return acc.Tasks[i].ChargedNs > acc.Tasks[j].ChargedNs })
	return acc
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// netnsNames names namespaces: 0 = "host (unattributed)", the host's, /run/netns entries, else a PID in it.
func netnsNames(hostIno uint32) func(uint32) string {
	names := map[uint32]string{0: "unattributed", hostIno: "host"}
	if ents, err := netns.Named(); err == nil {
		for _, n := range ents {
			if ino, err := netns.Inode(filepath.Join(netns.RunDir, n)); err == nil {
				if _, ok := names[uint32(ino)]; !ok {
					names[uint32(ino)] = n
				}
			}
		}
	}
	return func(ino uint32) string {
		if n, ok := names[ino]; ok {
			return n
		}
		procs, _ := filepath.Glob("/proc/[0-9]*/ns/net")
		for _, p := range procs {
			if i, err := netns.Inode(p); err == nil && uint32(i) == ino {
				n := fmt.Sprintf("netns:%d (pid %s)", ino, strings.Split(p, "/")[2])
				names[ino] = n
				return n
			}
		}
		n := fmt.Sprintf("netns:%d", ino)
		names[ino] = n
		return n
	}
}

// cgroupNames maps cgroup v2 ids (the cgroup directory's inode) to paths.
func cgroupNames() func(uint64) string {
	paths := map[uint64]string{}
	if mnt, err := attach.Cgroup2Mount(); err == nil {
		filepath.WalkDir(mnt, func(p string, d fs.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return nil
			}
			var st syscall.Stat_t
			if syscall.Stat(p, &st) == nil {
				rel, _ := filepath.Rel(mnt, p)
				paths[st.Ino] = "/" + strings.TrimPrefix(rel, ".")
			}
			return nil
		})
	}
	return func(id uint64) string {
		if p, ok := paths[id]; ok {
			return p
		}
		return "cgroup:" + strconv.FormatUint(id, 10)
	}
}

func commOf(tgid uint32) string {
	if tgid == 0 {
		return "swapper"
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", tgid))
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(b))
}

// RunIron accounts for the duration (or until ctx ends), then writes
// "task" lines, "container" lines and a "summary" line.
func RunIron(ctx context.Context, cfg IronConfig, w io.Writer) error {
	hostNs := "/proc/self/ns/net"
	if cfg.HostNetns != "" {
		hostNs = NetnsPath(cfg.HostNetns)
	}
	hostIno, err := netns.Inode(hostNs)
	if err != nil {
		return err
	}
	objPath, err := FindObject("iron.bpf.o", cfg.Object)
	if err != nil {
		return err
	}
	spec, err := ebpf.LoadCollectionSpec(objPath)
	if err != nil {
		return fmt.Errorf("load %s: %w", objPath, err)
	}
	if err := allowlist.Check(spec, allowlist.Iron); err != nil {
		return fmt.Errorf("%s: %w", objPath, err)
	}
	if err := setVariables(spec, map[string]any{"host_netns_ino": uint32(hostIno)}); err != nil {
		return err
	}
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{Programs: loader.ProgramOptions(0)})
	if err != nil {
		return fmt.Errorf("load iron programs: %w", err)
	}
	defer coll.Close()
	links, err := attachAll(spec, coll)
	if err != nil {
		return err
	}
	out := newLineWriter(w)
	start := time.Now()
	if err := out.write(map[string]any{"type": "ready"}); err != nil {
		closeLinks(links)
		return err
	}
	if cfg.Duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.Duration)
		defer cancel()
	}
	<-ctx.Done()
	closeLinks(links)
	seconds := time.Since(start).Seconds()

	caused := map[uint32]ironValue{}
	var ck uint32
	var cv ironValue
	it := coll.Maps["iron_caused"].Iterate()
	for it.Next(&ck, &cv) {
		caused[ck] = cv
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read iron_caused: %w", err)
	}
	charged := map[ironChargedKey]ironValue{}
	var hk ironChargedKey
	it = coll.Maps["iron_charged"].Iterate()
	for it.Next(&hk, &cv) {
		charged[hk] = cv
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read iron_charged: %w", err)
	}
	var pendingNs uint64
	var pk, pv uint64
	it = coll.Maps["iron_pending"].Iterate()
	for it.Next(&pk, &pv) {
		pendingNs += pv
	}
	// Host-side time of skbs that never reached a container: the host's own traffic.
	if pendingNs > 0 {
		v := caused[uint32(hostIno)]
		v.Ns += pendingNs
		caused[uint32(hostIno)] = v
	}

	node := cfg.Node
	if node == "" {
		node, _ = os.Hostname()
	}
	acc := AccountIron(caused, charged, netnsNames(uint32(hostIno)), cgroupNames(), commOf)
	for _, t := range acc.Tasks {
		if err := out.write(t); err != nil {
			return err
		}
	}
	inos := make([]uint32, 0, len(acc.Containers))
	for ino := range acc.Containers {
		inos = append(inos, ino)
	}
	sort.Slice(inos, func(i, j int) bool { return inos[i] < inos[j] })
	var lines []IronContainer
	for _, ino := range inos {
		c := acc.Containers[ino]
		c.Node = node
		lines = append(lines, *c)
		if err := out.write(c); err != nil {
			return err
		}
	}
	influx := ""
	if cfg.InfluxURL != "" {
		if err := WriteIronInflux(ctx, cfg, lines, time.Now()); err != nil {
			influx = err.Error()
		} else {
			influx = "ok"
		}
	}
	return out.write(map[string]any{"type": "summary", "node": node, "seconds": seconds,
		"containers": len(lines), "tasks": len(acc.Tasks), "influx": influx})
}

// IronLineProtocol renders the net_cpu measurement (tags container, cgroup, node).
func IronLineProtocol(lines []IronContainer, at time.Time) string {
	esc := strings.NewReplacer(",", `\,`, " ", `\ `, "=", `\=`)
	var b strings.Builder
	for _, c := range lines {
		cg := strings.Join(c.Cgroups, ";")
		if cg == "" {
			cg = "-"
		}
		fmt.Fprintf(&b, "net_cpu,container=%s,cgroup=%s,node=%s caused_ns=%di,charged_ns=%di,diff_ns=%di,packets=%di %d\n",
			esc.Replace(c.Container), esc.Replace(cg), esc.Replace(c.Node), c.CausedNs, c.ChargedNs, c.DiffNs, c.Packets, at.UnixNano())
	}
	return b.String()
}

// WriteIronInflux posts the lines to InfluxDB's v2 write API (1.8 serves it too).
func WriteIronInflux(ctx context.Context, cfg IronConfig, lines []IronContainer, at time.Time) error {
	q := url.Values{"bucket": {cfg.InfluxBucket}, "org": {cfg.InfluxOrg}, "precision": {"ns"}}
	u := strings.TrimRight(cfg.InfluxURL, "/") + "/api/v2/write?" + q.Encode()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewBufferString(IronLineProtocol(lines, at)))
	if err != nil {
		return err
	}
	if cfg.InfluxToken != "" {
		req.Header.Set("Authorization", "Token "+cfg.InfluxToken)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("influx write: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("influx write: %s: %s", resp.Status, strings.TrimSpace(string(body)))
	}
	return nil
}
