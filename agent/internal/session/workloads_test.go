package session

import (
	"testing"

	pb "github.com/hoptrace/hoptrace/agent/internal/pb/hoptracev1"
	"github.com/hoptrace/hoptrace/agent/internal/workload"
)

// A container in a namespace the agent already lists (same inode: a
// /run/netns name, or its own) joins that entry; one in a namespace of its
// own is listed as /proc/PID/ns/net with its devices.
func TestWithWorkloadsPlacesContainersByNetnsInode(t *testing.T) {
	namespaces := Namespaces("")
	if len(namespaces) == 0 || namespaces[0].GetName() != "" || namespaces[0].GetInode() == 0 {
		t.Fatalf("own namespace missing: %v", namespaces)
	}
	own := namespaces[0].GetInode()
	const unseen = 1 // no nsfs inode is 1
	out := WithWorkloads(namespaces, []workload.Found{
		{Workload: &pb.Workload{ContainerName: "host-net"}, NetnsPath: "/proc/self/ns/net", NetnsInode: own},
		{Workload: &pb.Workload{ContainerName: "web"}, NetnsPath: "/proc/self/ns/net", NetnsInode: unseen},
		{Workload: &pb.Workload{ContainerName: "web-sidecar"}, NetnsPath: "/proc/self/ns/net", NetnsInode: unseen},
	})
	if len(out) != len(namespaces)+1 {
		t.Fatalf("want one namespace added, got %d -> %d", len(namespaces), len(out))
	}
	if ws := out[0].GetWorkloads(); len(ws) != 1 || ws[0].GetContainerName() != "host-net" || ws[0].GetNetns() != "" {
		t.Fatalf("own namespace's workloads: %v", ws)
	}
	added := out[len(out)-1]
	if added.GetName() != "/proc/self/ns/net" || added.GetInode() != unseen || len(added.GetDevices()) == 0 {
		t.Fatalf("added namespace: %v", added)
	}
	names := []string{}
	for _, w := range added.GetWorkloads() {
		if w.GetNetns() != "/proc/self/ns/net" {
			t.Fatalf("workload %s netns %q", w.GetContainerName(), w.GetNetns())
		}
		names = append(names, w.GetContainerName())
	}
	if len(names) != 2 || names[0] != "web" || names[1] != "web-sidecar" {
		t.Fatalf("containers sharing a namespace: %v", names)
	}
}
