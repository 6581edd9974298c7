package workload

import (
	"regexp"
	"strings"
)

// The kubelet's labels on every container it starts through a CRI runtime
// (dockershim and cri-dockerd keep them on the Docker container).
const (
	LabelPodNamespace = "io.kubernetes.pod.namespace"
	LabelPodName      = "io.kubernetes.pod.name"
	LabelPodUID       = "io.kubernetes.pod.uid"
)

// The kubelet's pod cgroups (pkg/kubelet/cm): with the cgroupfs driver
// /kubepods[/burstable|/besteffort]/pod<UID>/<container>, with the systemd
// driver /kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<UID with
// '_' for '-'>.slice/<runtime>-<container>.scope.
var (
	cgroupfsPod = regexp.MustCompile(`(?:^|/)kubepods(?:/[a-z]+)?/pod([0-9a-fA-F-]{36})(?:/|$)`)
	systemdPod  = regexp.MustCompile(`(?:^|/)kubepods(?:-[a-z]+)?-pod([0-9a-fA-F_]{36})\.slice(?:/|$)`)
)

// PodUIDFromCgroup is the pod UID in a kubepods cgroup path ("" when the
// path is not a pod's).
func PodUIDFromCgroup(path string) string {
	if m := cgroupfsPod.FindStringSubmatch(path); m != nil {
		return strings.ToLower(m[1])
	}
	if m := systemdPod.FindStringSubmatch(path); m != nil {
		return strings.ToLower(strings.ReplaceAll(m[1], "_", "-"))
	}
	return ""
}

// Pod is a Kubernetes pod's namespace and name.
type Pod struct{ Namespace, Name string }

// podOf names the pod of container c: its own kubelet labels, else the
// labels of another container of the same pod UID (the UID from c's labels
// or its cgroup path; the pod's sandbox container always carries them).
func podOf(c Container, cgroup string, byUID map[string]Pod) Pod {
	if ns, name := c.Labels[LabelPodNamespace], c.Labels[LabelPodName]; ns != "" && name != "" {
		return Pod{ns, name}
	}
	uid := c.Labels[LabelPodUID]
	if uid == "" {
		uid = PodUIDFromCgroup(cgroup)
	}
	return byUID[strings.ToLower(uid)]
}

// podsByUID indexes the pods named by containers' labels by pod UID.
func podsByUID(cs []Container) map[string]Pod {
	out := map[string]Pod{}
	for _, c := range cs {
		uid, ns, name := c.Labels[LabelPodUID], c.Labels[LabelPodNamespace], c.Labels[LabelPodName]
		if uid != "" && ns != "" && name != "" {
			out[strings.ToLower(uid)] = Pod{ns, name}
		}
	}
	return out
}
