package probe

import (
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/features"

	"github.com/hoptrace/hoptrace/agent/internal/record"
)

// FieldRefusal says why this kernel cannot give an action field, "" when it can. Most fields are read
// with CO-RE or from the ctx on every kernel from 5.10; these need a helper or an event argument that
// arrived later.
func FieldRefusal(f record.ActionField) string {
	switch f {
	case record.FieldDropReason, record.FieldDropFunction: // the same program, skb:kfree_skb with its reason
		return KfreeSkbReasonMissing()
	case record.FieldPID:
		if err := features.HaveProgramHelper(ebpf.CGroupSKB, asm.FnGetCurrentPidTgid); err != nil {
			return fmt.Sprintf("cgroup_skb programs cannot call bpf_get_current_pid_tgid on this kernel: %v", err)
		}
	case record.FieldCgroup:
		for _, pt := range []ebpf.ProgramType{ebpf.SchedCLS, ebpf.CGroupSKB} {
			if err := features.HaveProgramHelper(pt, asm.FnSkbCgroupId); err != nil {
				return fmt.Sprintf("%s programs cannot call bpf_skb_cgroup_id on this kernel: %v", pt, err)
			}
		}
	}
	return ""
}

// KfreeSkbReasonMissing says why skb:kfree_skb has no drop reason argument here ("" when it has one):
// TP_PROTO(skb, location, reason) from 5.17 ("net: skb: introduce kfree_skb_reason()"), (skb, location) before. The raw
// tracepoint's BTF type btf_trace_kfree_skb is func(void *ctx, args...).
func KfreeSkbReasonMissing() string {
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		return fmt.Sprintf("no kernel BTF to find skb:kfree_skb's arguments: %v", err)
	}
	var td *btf.Typedef
	if err := spec.TypeByName("btf_trace_kfree_skb", &td); err != nil {
		return fmt.Sprintf("no skb:kfree_skb tracepoint in the kernel BTF: %v", err)
	}
	ptr, ok := td.Type.(*btf.Pointer)
	if !ok {
		return "btf_trace_kfree_skb is not a function pointer"
	}
	proto, ok := ptr.Target.(*btf.FuncProto)
	if !ok {
		return "btf_trace_kfree_skb is not a function pointer"
	}
	if len(proto.Params) < 4 {
		return "skb:kfree_skb has no reason argument before Linux 5.17"
	}
	return ""
}
