package probe

import (
	"fmt"
	"strings"

	"github.com/cilium/ebpf/btf"

	"github.com/hoptrace/hoptrace/agent/internal/loader"
)

// dropReasonPrefix starts every enumerator of enum skb_drop_reason (include/net/dropreason-core.h).
const dropReasonPrefix = "SKB_DROP_REASON_"

// DropReasons is this kernel's enum skb_drop_reason from its BTF, value -> name without
// SKB_DROP_REASON_ (3 -> "NO_SOCKET"): skb:kfree_skb's reason argument (5.17+) is the enum's value,
// and the values move between kernels as reasons are added in the middle ("net: dropreason: ..."),
// so only the node that recorded a value can name it. The agent reports the table once, with its
// capabilities at registration: the dispatcher holds every node's registration already and puts
// the table in the specs it sends the collector, which writes names, never numbers.
// Empty where the kernel has no such enum (before 5.17) or no BTF.
func DropReasons() (map[uint32]string, error) {
	spec := loader.ProgramOptions(0).KernelTypes // --kernel-btf, when given
	if spec == nil {
		var err error
		if spec, err = btf.LoadKernelSpec(); err != nil {
			return nil, fmt.Errorf("kernel BTF: %w", err)
		}
	}
	var enum *btf.Enum
	if err := spec.TypeByName("skb_drop_reason", &enum); err != nil {
		return nil, nil // before 5.17: skb:kfree_skb has no reason
	}
	return dropReasonNames(enum), nil
}

// dropReasonNames is an enum skb_drop_reason's table. Its first two are SKB_NOT_DROPPED_YET and
// SKB_CONSUMED (named NOT_DROPPED_YET, CONSUMED: not drops, which the collector leaves out);
// SKB_DROP_REASON_MAX is a bound, not a reason; values past 16 bits are the subsystem-qualified
// reasons (SKB_DROP_REASON_SUBSYS_MASK, 6.4+), which have no name of their own here.
func dropReasonNames(enum *btf.Enum) map[uint32]string {
	names := make(map[uint32]string, len(enum.Values))
	for _, v := range enum.Values {
		name, ok := strings.CutPrefix(v.Name, dropReasonPrefix)
		if !ok {
			name, ok = strings.CutPrefix(v.Name, "SKB_")
		}
		if !ok || name == "MAX" || v.Value > 0xffff {
			continue
		}
		if _, dup := names[uint32(v.Value)]; !dup {
			names[uint32(v.Value)] = name
		}
	}
	return names
}
