#!/bin/bash
# A guest as a host of its own (lab/guests.py): run in a virtme-ng guest sharing this checkout read-only.
#
#   guest_host.sh boot CONFIG    bring up the NIC, start this host's agent and receivers, then serve
#                                the lab's commands on the control port (one command per connection)
#   guest_host.sh control        one command from stdin (busybox nc -e runs this per connection)
#   guest_host.sh discard        read a TCP connection to its "end" line (the TCP flow's receiving socket)
#
# Only bash, coreutils, iproute2, nft and busybox run here (Python takes seconds to start under TCG; it
# runs once, for the clock step).
set -uo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)

boot() {
	# shellcheck source=/dev/null
	source "$1" # ADDR PREFIX_LEN CONTROL_PORT UDP_PORT TCP_PORT AGENT_LOG AGENT (an array)
	mount -t bpf bpf /sys/fs/bpf 2>/dev/null
	mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null
	mountpoint -q /sys/fs/cgroup || mount -t cgroup2 cgroup2 /sys/fs/cgroup
	modprobe virtio_net
	local nic=""
	# The NIC appears once virtio_net probed it (udev does not run here): wait for that event.
	for _ in $(seq 200); do
		nic=$(ls /sys/class/net | grep -v '^lo$' | head -n1)
		[ -n "$nic" ] && break
		sleep 0.05
	done
	[ -n "$nic" ] || { echo "hoptrace-guest failed: no NIC"; exit 1; }
	ip link set lo up
	ip addr add "$ADDR/$PREFIX_LEN" dev "$nic"
	ip link set "$nic" up
	"${AGENT[@]}" >"$AGENT_LOG" 2>&1 &
	# The flows' receiving sockets: UDP (sockperf's server reads and drops what it cannot parse) and TCP.
	sockperf server -i 0.0.0.0 -p "$UDP_PORT" >/dev/null 2>&1 &
	busybox nc -ll -p "$TCP_PORT" -e "$HERE/guest_host.sh" discard &
	echo "hoptrace-guest ready nic=$nic kernel=$(uname -r)"
	exec busybox nc -ll -p "$CONTROL_PORT" -e "$HERE/guest_host.sh" control
}

is_number() { [[ $1 =~ ^[0-9]+$ ]]; }
is_address() { [[ $1 =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ ]]; }

# Packets this guest's kernel sent to DST:PORT over PROTO, counted at the IP output hook (nftables): the
# ground truth of a flow, retransmits and handshake included.
count_rule() {
	local proto=$1 dst=$2 port=$3
	nft delete table ip hoptrace_lab 2>/dev/null
	nft add table ip hoptrace_lab
	nft add chain ip hoptrace_lab out '{ type filter hook output priority 0; policy accept; }'
	nft add rule ip hoptrace_lab out ip daddr "$dst" "$proto" dport "$port" counter
}

counted() {
	nft list table ip hoptrace_lab | sed -n 's/.*counter packets \([0-9]*\).*/\1/p'
}

# udp DST PORT COUNT: COUNT datagrams of 64 bytes from one socket, 5 ms apart.
send_udp() {
	local dst=$1 port=$2 count=$3
	count_rule udp "$dst" "$port"
	exec 3>"/dev/udp/$dst/$port" || return 1
	for i in $(seq "$count"); do
		printf '%064d' "$i" >&3 # one write, one datagram
		sleep 0.005
	done
	exec 3>&-
	echo "sent $(counted)"
}

# tcp DST PORT COUNT: one connection, COUNT writes of 64 bytes 10 ms apart and an "end" line; the receiver
# closes first, then this side. (Had this side closed first, its last ACK would leave from a TIME-WAIT
# socket, which sock_ops programs never see: that ACK would carry no ID.) Answers once the connection is
# gone, so the count is final.
send_tcp() {
	local dst=$1 port=$2 count=$3
	count_rule tcp "$dst" "$port"
	exec 4<>"/dev/tcp/$dst/$port" || return 1
	for i in $(seq "$count"); do
		printf '%063d\n' "$i" >&4
		sleep 0.01
	done
	printf 'end\n' >&4
	cat <&4 >/dev/null # until the receiver's FIN
	exec 4>&-
	for _ in $(seq 200); do
		[ -z "$(ss -Htn state last-ack dst "$dst" dport = :"$port")" ] && break
		sleep 0.05
	done
	echo "sent $(counted)"
}

control() {
	local command a b c
	read -r command a b c || exit 0
	case "$command" in
	udp | tcp)
		if is_address "$a" && is_number "$b" && is_number "$c"; then
			"send_$command" "$a" "$b" "$c"
		else
			echo "error: $command DST PORT COUNT"
		fi
		;;
	clock-shift-ms)
		# Steps CLOCK_REALTIME only (a real second clock): CLOCK_MONOTONIC and so the packets' stamps
		# stay; the agent's clock rounds must see the new offset. Read and set in one process, one
		# microsecond apart: `date -s` reads "now", then loads its locale and zone files over 9p, and
		# under TCG its step came out 15-120 ms short.
		if is_number "$a" && ((10#$a < 1000)); then
			# Answers the step made: CLOCK_REALTIME - CLOCK_MONOTONIC after minus before (ns).
			python3 -I -S -c "import time; r, m = time.CLOCK_REALTIME, time.CLOCK_MONOTONIC
gap = lambda: time.clock_gettime_ns(r) - time.clock_gettime_ns(m)
before = gap(); time.clock_settime_ns(r, time.clock_gettime_ns(r) + $((10#$a)) * 1_000_000)
print('shifted', gap() - before)"
		else
			echo "error: clock-shift-ms MS (0-999)"
		fi
		;;
	*) echo "error: unknown command ${command@Q}" ;;
	esac
}

case "${1:-}" in
boot) boot "$2" ;;
control) control ;;
discard) sed -n '/^end$/q' ;; # read to the sender's last line, then close first
*)
	echo "usage: $0 boot CONFIG | control | discard" >&2
	exit 2
	;;
esac
