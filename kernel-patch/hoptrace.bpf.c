// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * hoptrace's generic object: every hop program, for standalone agents and
 * tests. The dispatcher builds per-node objects from the same library
 * (include/hop.bpf.h) with only the programs a node needs.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_tracing.h>

#include "hop.bpf.h"
#include "discover.bpf.h"
#include "event.bpf.h"

HOPTRACE_PROG_TC
HOPTRACE_PROG_XDP
HOPTRACE_PROG_CGROUP_SKB
HOPTRACE_PROG_TP_BTF
HOPTRACE_PROG_TP_BTF_XMIT
HOPTRACE_PROG_TP_BTF_KFREE
HOPTRACE_PROG_SOCK_READ_UDP
HOPTRACE_PROG_SOCK_READ_TCP
HOPTRACE_PROG_UPROBE
HOPTRACE_PROG_FENTRY
HOPTRACE_PROG_KPROBE
HOPTRACE_PROG_FEXIT
HOPTRACE_PROG_KRETPROBE
HOPTRACE_PROG_TAG_TCP
HOPTRACE_PROG_DISCOVER
HOPTRACE_PROG_EVENT_TP
HOPTRACE_PROG_EVENT_KPROBE
HOPTRACE_PROG_EVENT_FENTRY

/* BTF anchors: enums whose constants alone are used never reach BTF; these
 * read-only globals put their types there for agent/cmd/vocabgen. */
const volatile enum hoptrace_wire hoptrace_btf_wire = 0;
const volatile enum hoptrace_record_flag hoptrace_btf_record_flag = 0;
const volatile enum hoptrace_counter hoptrace_btf_counter = 0;
const volatile enum hoptrace_field hoptrace_btf_field = 0;
const volatile enum hoptrace_event_op hoptrace_btf_event_op = 0;
const volatile enum hoptrace_event_key hoptrace_btf_event_key = 0;

char LICENSE[] SEC("license") = "Dual BSD/GPL";
