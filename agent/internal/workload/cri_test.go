package workload

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/hoptrace/hoptrace/agent/internal/workload/crilab"
)

// A real containerd (Debian's 1.6, its CRI v1 plugin) run privately: two
// pods, a container in one; the inventory names both pods, the container,
// and puts each in the network namespace containerd made for its pod.
func TestCRIInventoryNamesTheRealRuntimesPodsAndContainers(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root: it runs containerd and pods (the tests run as root)")
	}
	if missing := crilab.Missing(); missing != "" {
		t.Fatal(missing)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	lab, err := crilab.Start(ctx, crilab.Config{Dir: t.TempDir(), Bridge: "htcrigo0", Subnet: "198.18.240.0/24"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := lab.Stop(); err != nil {
			t.Errorf("lab cleanup: %v", err)
		}
	})
	const ns, uidWeb, uidDB = "hoptrace-test", "6f0c0d5b-2a53-4e9e-9d38-000000000001", "6f0c0d5b-2a53-4e9e-9d38-000000000002"
	web, err := lab.RunPod(ctx, ns, "web-0", uidWeb)
	if err != nil {
		t.Fatal(err)
	}
	appID, err := lab.RunContainer(ctx, web, "app")
	if err != nil {
		t.Fatal(err)
	}
	db, err := lab.RunPod(ctx, ns, "db-0", uidDB)
	if err != nil {
		t.Fatal(err)
	}
	inodeOfPath := func(path string) uint64 {
		st, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		return inodeOf(st)
	}
	webIno, dbIno := inodeOfPath(web.Netns), inodeOfPath(db.Netns)
	if webIno == dbIno || !strings.HasPrefix(web.Netns, "/var/run/netns/cni-") {
		t.Fatalf("containerd's namespaces: web %s (%d), db %s (%d)", web.Netns, webIno, db.Netns, dbIno)
	}

	inv := &Inventory{Runtimes: []Runtime{NewCRI(lab.Socket)}}
	defer inv.Close()
	found, state := inv.Collect(ctx)
	if state.GetEndpoint() != lab.Socket || !strings.HasPrefix(state.GetVersion(), "containerd 1.") || state.GetError() != "" {
		t.Fatalf("runtime state = %v", state)
	}
	type want struct {
		id, image, pod, netns string
		ino                   uint64
	}
	wants := map[string]want{
		"k8s_POD_web-0_" + ns + "_" + uidWeb + "_0": {web.ID, crilab.Image, "web-0", web.Netns, webIno},
		"app": {appID, crilab.Image, "web-0", web.Netns, webIno},
		"k8s_POD_db-0_" + ns + "_" + uidDB + "_0": {db.ID, crilab.Image, "db-0", db.Netns, dbIno},
	}
	if len(found) != len(wants) {
		t.Fatalf("found %d workloads, want %d: %v", len(found), len(wants), found)
	}
	for _, f := range found {
		w, ok := wants[f.Workload.GetContainerName()]
		if !ok {
			t.Fatalf("unexpected workload %v", f.Workload)
		}
		if f.Workload.GetContainerId() != w.id || f.Workload.GetImage() != w.image ||
			f.Workload.GetPodNamespace() != ns || f.Workload.GetPodName() != w.pod ||
			f.NetnsPath != w.netns || f.NetnsInode != w.ino {
			t.Errorf("%s: got %v in %s (%d), want %+v", f.Workload.GetContainerName(), f.Workload, f.NetnsPath, f.NetnsInode, w)
		}
	}

	// A removed pod is gone from the next inventory; the other stays.
	if err := lab.RemovePod(ctx, db.ID); err != nil {
		t.Fatal(err)
	}
	found, state = inv.Collect(ctx)
	if state.GetError() != "" {
		t.Fatalf("runtime state after removal = %v", state)
	}
	var pods []string
	for _, f := range found {
		pods = append(pods, f.Workload.GetPodName()+"/"+f.Workload.GetContainerName())
	}
	if len(found) != 2 || found[0].Workload.GetPodName() != "web-0" || found[1].Workload.GetPodName() != "web-0" {
		t.Fatalf("after removing db-0: %v", pods)
	}
}
