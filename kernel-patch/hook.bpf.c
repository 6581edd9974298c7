// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * hoptrace's hook object: one tc program per device and direction and one tp_btf program per device
 * and event that run every trace crossing it, and one sock_ops program per cgroup that tags for
 * every trace there (include/hook.bpf.h), the hop body of include/hop.bpf.h with its settings from
 * a map.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_tracing.h>

#define HOPTRACE_HOOK 1
#include "hop.bpf.h"
#include "hook.bpf.h"

HOPTRACE_HOOK_TC
HOPTRACE_HOOK_TP
HOPTRACE_HOOK_SOCK_OPS

char LICENSE[] SEC("license") = "Dual BSD/GPL";
