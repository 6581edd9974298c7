/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Event probes (a spec's events:): one generic program (a classic
 * tracepoint's, a kprobe's or an fentry's: event_tp, event_kprobe,
 * event_fentry), loaded once per event with its own load-time constants, that
 * counts the hits passing a where: predicate on the arguments, keyed by CPU
 * or an argument, keeps a log2 histogram of an argument or of the time since
 * another event (event_marks), and statistics of arguments (event_stats).
 * It shares hop.bpf.h's action maps and helpers (count_keys, hist_buckets,
 * counters), so results travel and are stored like hop actions.
 *
 * Argument offsets, sizes and signedness come from the node's tracefs format
 * file (a function's: its BTF), read by the agent at apply time. .rodata is frozen before load, so
 * the verifier knows every setting: unused terms are dead branches it never
 * walks. The offsets are only known at load time, so they cannot be the
 * constant instruction offsets a direct ctx load needs ("dereference of
 * modified ctx ptr"): arguments are read with bpf_probe_read_kernel (5.5).
 * No BPF-to-BPF calls, no helper newer than 5.10: the _floor variant is the
 * same code.
 */
#ifndef __HOPTRACE_EVENT_BPF_H
#define __HOPTRACE_EVENT_BPF_H

#include "hop.bpf.h"

/* One argument of the tracepoint's record: byte offset (common fields
 * included, as tracefs lists it), size 1/2/4/8, signed or not. */
#define EVENT_ARG_SETTINGS(prefix)                                                                 \
	const volatile __u16 prefix##_off = 0;                                                     \
	const volatile __u8 prefix##_size = 0;                                                     \
	const volatile __u8 prefix##_signed = 0;

/* HOPTRACE_EVENT_SOURCE_*: a tracepoint's record, or a kprobe's or an fentry's function arguments.
 */
const volatile __u8 ev_source = HOPTRACE_EVENT_SOURCE_TRACEPOINT;

/* where: up to HOPTRACE_EVENT_TERMS terms, ANDed; ev_term_op NONE = unused. */
const volatile __u16 ev_term_off[HOPTRACE_EVENT_TERMS] = {};
const volatile __u8 ev_term_size[HOPTRACE_EVENT_TERMS] = {};
const volatile __u8 ev_term_signed[HOPTRACE_EVENT_TERMS] = {};
const volatile __u8 ev_term_op[HOPTRACE_EVENT_TERMS] = {}; /* enum hoptrace_event_op */
const volatile __u8 ev_term_nvalues[HOPTRACE_EVENT_TERMS] = {};
const volatile __u64 ev_term_values[HOPTRACE_EVENT_TERMS][HOPTRACE_EVENT_IN_VALUES] = {};
/* A term on a string argument: HOPTRACE_EVENT_TEXT_* (0 = an integer term), and its text,
 * NUL-padded to 16 bytes (two words, compared as such). */
const volatile __u8 ev_term_text_kind[HOPTRACE_EVENT_TERMS] = {};
const volatile __u64 ev_term_text[HOPTRACE_EVENT_TERMS][2] = {};
/* count (act_count of hop.bpf.h), keyed by enum hoptrace_event_key. */
const volatile __u8 ev_key = 0;
EVENT_ARG_SETTINGS(ev_key)
/* histogram of an argument (1 = on). */
const volatile __u8 ev_hist = 0;
EVENT_ARG_SETTINGS(ev_hist)
/* record: [ARGS]: statistics of up to HOPTRACE_VALUES_MAX arguments (event_stats). */
const volatile __u8 ev_record_n = 0;
const volatile __u16 ev_record_off[HOPTRACE_VALUES_MAX] = {};
const volatile __u8 ev_record_size[HOPTRACE_VALUES_MAX] = {};
const volatile __u8 ev_record_signed[HOPTRACE_VALUES_MAX] = {};
/* Event-to-event latency (histogram: latency, since: EVENT): the marking
 * event remembers its time under (its index, its key argument's value); the
 * later event takes that entry out and histograms the time since in ns. */
const volatile __u8 ev_mark = 0;
const volatile __u32 ev_mark_index = 0;
EVENT_ARG_SETTINGS(ev_mark)
const volatile __u8 ev_latency = 0;
const volatile __u32 ev_latency_since = 0; /* events[i] of the marking event */
EVENT_ARG_SETTINGS(ev_latency)

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, HOPTRACE_VALUES_MAX);
	__type(key, __u32);
	__type(value, struct hoptrace_event_stat);
} event_stats SEC(".maps");

/* One per trace per node (the agent's MapReplacements), shared by its events. Per-CPU LRU free
 * lists (no common list, no shared lock on every update); entries are still seen from every CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, HOPTRACE_EVENT_MARKS);
	__uint(map_flags, BPF_F_NO_COMMON_LRU);
	__type(key, struct hoptrace_event_mark_key);
	__type(value, __u64);
} event_marks SEC(".maps");

const struct hoptrace_event_stat *unused_event_stat_type __attribute__((unused));

/* A kernel function's argument `index`: a kprobe's argument register, or an fentry's
 * argument slot. Read with bpf_probe_read_kernel at ctx + its offset: `index` is a load-time
 * constant, and a ctx load needs its offset in the instruction (clang computes it instead:
 * "dereference of modified ctx ptr"). */
static __always_inline __u64 event_function_arg(void *ctx, __u16 index)
{
	__u32 off = index * sizeof(__u64); /* fentry: one u64 per argument */
	__u64 v = 0;

	if (ev_source == HOPTRACE_EVENT_SOURCE_KPROBE) {
		switch (index) {
		case 0:
			off = __builtin_offsetof(struct pt_regs, __PT_PARM1_REG);
			break;
		case 1:
			off = __builtin_offsetof(struct pt_regs, __PT_PARM2_REG);
			break;
		case 2:
			off = __builtin_offsetof(struct pt_regs, __PT_PARM3_REG);
			break;
		case 3:
			off = __builtin_offsetof(struct pt_regs, __PT_PARM4_REG);
			break;
		case 4:
			off = __builtin_offsetof(struct pt_regs, __PT_PARM5_REG);
			break;
		default:
			return 0;
		}
	} else if (index >= HOPTRACE_EVENT_FUNCTION_ARGS) {
		return 0;
	}
	bpf_probe_read_kernel(&v, sizeof(v), (char *)ctx + off);
	return v;
}

/* The argument at `off` of the tracepoint record, sign-extended if signed; a function's argument
 * `off`; or the current task's process id (HOPTRACE_EVENT_ARG_PID). */
static __always_inline __u64 event_arg(void *ctx, __u16 off, __u8 size, __u8 is_signed)
{
	__u64 v = 0;
	__u32 shift;

	if (size == 0 || size > sizeof(v))
		return 0;
	if (off == HOPTRACE_EVENT_ARG_PID)
		return bpf_get_current_pid_tgid() >> 32;
	if (ev_source != HOPTRACE_EVENT_SOURCE_TRACEPOINT) {
		/* A register or argument slot holds a narrower argument in its low bytes; the rest
		 * is not defined (an int's upper half is whatever the register held). */
		v = event_function_arg(ctx, off);
		if (size < sizeof(v))
			v &= (1ULL << (8 * size)) - 1;
	} else {
		/* Little-endian (x86, arm64): the argument fills v's low bytes. */
		bpf_probe_read_kernel(&v, size, (char *)ctx + off);
	}
	if (is_signed && size < sizeof(v)) {
		shift = 64 - 8 * size;
		v = (__u64)((__s64)(v << shift) >> shift);
	}
	return v;
}

static __always_inline bool event_less(__u64 a, __u64 b, __u8 is_signed)
{
	return is_signed ? (__s64)a < (__s64)b : a < b;
}

/* Does the string argument of term t equal its text? Read with one character
 * more than a text can have, so a longer string never equals its prefix. */
static __always_inline bool event_text_equal(void *ctx, int t)
{
	__u64 chars[3] = {};
	const char *str = (const char *)ctx + ev_term_off[t];
	__u32 loc = 0;

	if (ev_term_text_kind[t] != HOPTRACE_EVENT_TEXT_ARRAY) {
		if (bpf_probe_read_kernel(&loc, sizeof(loc), str))
			return false;
		str = (const char *)ctx + (loc & 0xffff);
		if (ev_term_text_kind[t] == HOPTRACE_EVENT_TEXT_REL_LOC)
			str += ev_term_off[t] + sizeof(loc);
	}
	if (bpf_probe_read_kernel_str(chars, HOPTRACE_EVENT_TEXT_MAX + 2, str) < 0)
		return false;
	return chars[0] == ev_term_text[t][0] && chars[1] == ev_term_text[t][1];
}

/* Does term t hold? Every branch tests a load-time constant but the value. */
static __always_inline bool event_term(void *ctx, int t)
{
	__u64 v, want = ev_term_values[t][0];
	int i;

	if (ev_term_text_kind[t]) {
		bool equal = event_text_equal(ctx, t);

		return ev_term_op[t] == HOPTRACE_EVENT_OP_NE ? !equal : equal;
	}
	v = event_arg(ctx, ev_term_off[t], ev_term_size[t], ev_term_signed[t]);
	switch (ev_term_op[t]) {
	case HOPTRACE_EVENT_OP_EQ:
		return v == want;
	case HOPTRACE_EVENT_OP_NE:
		return v != want;
	case HOPTRACE_EVENT_OP_LT:
		return event_less(v, want, ev_term_signed[t]);
	case HOPTRACE_EVENT_OP_GT:
		return event_less(want, v, ev_term_signed[t]);
	case HOPTRACE_EVENT_OP_BIT:
		return (v & want) != 0;
	case HOPTRACE_EVENT_OP_IN:
#pragma unroll
		for (i = 0; i < HOPTRACE_EVENT_IN_VALUES; i++) {
			if (i < ev_term_nvalues[t] && v == ev_term_values[t][i])
				return true;
		}
		return false;
	}
	return true;
}

/* record: argument i's statistics on this CPU; now: this hit's time. */
static __always_inline void event_record(void *ctx, __u32 i, __u64 now)
{
	struct hoptrace_event_stat *st;
	/* The lookup's own key: `i` stays a constant for the settings arrays, where a value
	 * reloaded from the key's stack slot after the call would be unknown to 5.10's verifier (it
	 * does not track 32-bit spills). */
	__u32 key = i;
	__u64 v;

	if (i >= HOPTRACE_VALUES_MAX)
		return;
	st = bpf_map_lookup_elem(&event_stats, &key);
	if (!st)
		return;
	v = event_arg(ctx, ev_record_off[i], ev_record_size[i], ev_record_signed[i]);
	if (st->count == 0 || event_less(v, st->min, ev_record_signed[i]))
		st->min = v;
	if (st->count == 0 || event_less(st->max, v, ev_record_signed[i]))
		st->max = v;
	st->count++;
	st->sum += v;
	st->last = v;
	st->last_ns = now;
}

/* Remember this event's time, or histogram the time since the marking event. */
static __always_inline void event_latency(void *ctx, __u64 now)
{
	struct hoptrace_event_mark_key key = {};
	__u64 *then;

	if (ev_mark) {
		key.event_index = ev_mark_index;
		key.value = event_arg(ctx, ev_mark_off, ev_mark_size, ev_mark_signed);
		bpf_map_update_elem(&event_marks, &key, &now, BPF_ANY);
	}
	if (!ev_latency)
		return;
	key.event_index = ev_latency_since;
	key.value = event_arg(ctx, ev_latency_off, ev_latency_size, ev_latency_signed);
	then = bpf_map_lookup_elem(&event_marks, &key);
	if (!then) {
		count(HOPTRACE_C_LATENCY_MISS, 1);
		return;
	}
	/* Read before the delete: the entry's memory may be reused after it. */
	__u64 since = *then;
	bpf_map_delete_elem(&event_marks, &key);
	hist_add(now > since ? now - since : 0);
}

static __always_inline int event_run(void *ctx)
{
	__u64 now;
	int t;

	count(HOPTRACE_C_SEEN, 1);
#pragma unroll
	for (t = 0; t < HOPTRACE_EVENT_TERMS; t++) {
		if (ev_term_op[t] != HOPTRACE_EVENT_OP_NONE && !event_term(ctx, t)) {
			count(HOPTRACE_C_NOT_MATCHED, 1);
			return 0;
		}
	}
	count(HOPTRACE_C_MATCHED, 1);
	if (act_count) {
		__u64 key = 0;

		if (ev_key == HOPTRACE_EVENT_KEY_CPU)
			key = bpf_get_smp_processor_id();
		else if (ev_key == HOPTRACE_EVENT_KEY_ARG)
			key = event_arg(ctx, ev_key_off, ev_key_size, ev_key_signed);
		count_by_key(key);
	}
	if (ev_hist)
		hist_add(event_arg(ctx, ev_hist_off, ev_hist_size, ev_hist_signed));
	if (!ev_record_n && !ev_mark && !ev_latency)
		return 0;
	/* One clock read serves the record's last_ns and the latency. */
	now = bpf_ktime_get_ns();
	/* Constant indexes: each call's settings loads are constant offsets (event_record). */
	if (ev_record_n > 0)
		event_record(ctx, 0, now);
	if (ev_record_n > 1)
		event_record(ctx, 1, now);
	if (ev_record_n > 2)
		event_record(ctx, 2, now);
	if (ev_record_n > 3)
		event_record(ctx, 3, now);
	if (ev_mark || ev_latency)
		event_latency(ctx, now);
	return 0;
}

/* The event program; which tracepoint it attaches to is the agent's choice
 * (link.Tracepoint), so the section names none. */
#define HOPTRACE_PROG_EVENT_TP                                                                     \
	SEC("tracepoint") int event_tp(void *ctx)                                                  \
	{                                                                                          \
		return event_run(ctx);                                                             \
	}                                                                                          \
	SEC("tracepoint") int event_tp_floor(void *ctx)                                            \
	{                                                                                          \
		return event_run(ctx);                                                             \
	}

/* Kernel-function events: the agent attaches them to the event's function (a kprobe's
 * link.Kprobe; an fentry's AttachTo, set before load), so the sections' function is a
 * placeholder. */
#define HOPTRACE_PROG_EVENT_KPROBE                                                                 \
	SEC("kprobe/netif_receive_skb") int event_kprobe(struct pt_regs *ctx)                      \
	{                                                                                          \
		return event_run(ctx);                                                             \
	}                                                                                          \
	SEC("kprobe/netif_receive_skb") int event_kprobe_floor(struct pt_regs *ctx)                \
	{                                                                                          \
		return event_run(ctx);                                                             \
	}

#define HOPTRACE_PROG_EVENT_FENTRY                                                                 \
	SEC("fentry/netif_receive_skb") int event_fentry(__u64 *ctx)                               \
	{                                                                                          \
		return event_run(ctx);                                                             \
	}                                                                                          \
	SEC("fentry/netif_receive_skb") int event_fentry_floor(__u64 *ctx)                         \
	{                                                                                          \
		return event_run(ctx);                                                             \
	}

#endif /* __HOPTRACE_EVENT_BPF_H */
