#!/bin/bash
# A guest as a host of its own (lab/guests.py): run in a virtme-ng guest sharing this checkout read-only.
#
#   guest_host.sh boot CONFIG    bring up the NIC, start this host's agent and receivers, then serve
#                                the lab's commands on the control port (one command per connection)
#   guest_host.sh control        one command from stdin (busybox nc -e runs this per connection)
#   guest_host.sh discard        read a TCP connection to its "end" line (the TCP flow's receiving socket)
#   guest_host.sh send udp|tcp DST PORT COUNT
#                                send a flow from the current network namespace (ip netns exec ... for a VM's)
#
# Only bash, coreutils, iproute2, nft and busybox run here (Python takes seconds to start under TCG; it
# runs for the clock step and the bulk TCP flow only).
set -uo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)

boot() {
	# shellcheck source=/dev/null
	source "$1" # ADDR PREFIX_LEN CONTROL_PORT UDP_PORT TCP_PORT AGENT_LOG AGENT (an array)
	export UDP_PORT TCP_PORT # for the control commands (a process per connection)
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

# tcp-bulk DST PORT KIB: one connection, KIB KiB written at once (64-byte lines, then "end") so that TCP
# hands the NIC TSO skbs of many segments; this side shuts its sending half, reads to the receiver's FIN
# and waits for the connection to end. Answers "segments N": every segment this socket sent (tcpi_segs_out:
# a TSO skb counts its segments; handshake, FIN and last ACK included), read from the socket once it is
# closed, so the count is final. (Python: bash cannot shut half a socket nor read TCP_INFO.)
send_tcp_bulk() {
	python3 -I -S -c "import socket, time
s = socket.create_connection(('$1', $2))
s.sendall((b'0' * 63 + b'\\n') * ($3 * 16) + b'end\\n')
s.shutdown(socket.SHUT_WR)
while s.recv(65536):
    pass
for _ in range(600):
    info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 144)
    if info[0] == 7:  # TCP_CLOSE: the last segment is out
        break
    time.sleep(0.05)
print('segments', int.from_bytes(info[136:140], 'little'))  # struct tcp_info's tcpi_segs_out"
}

# Open vSwitch in this guest (its kernel has the module; the hypervisor's may not), with three "VMs":
# namespaces vm1..vm3 whose eth0 is a veth whose other end, vmN-port, is a port of the OVS bridge ovsbr
# (in place of a VM's tap). vm2 runs the receivers: sockperf's server on UDP_PORT (the traced flow's
# reading application) and an iperf3 server per loading VM, vmN's on port 5200+N (the load). Daemons and
# database under /run.
OVS_NET=198.19.241 # /24, inside 198.18.0.0/15
export OVS_RUNDIR=/run/openvswitch OVS_DBDIR=/run/openvswitch OVS_LOGDIR=/run/openvswitch

# Runs a command; if it fails, answers what it said and fails.
step() {
	local out
	out=$("$@" 2>&1) || {
		echo "error: $*: ${out//$'\n'/ }"
		return 1
	}
}

ovs_setup() {
	step modprobe openvswitch || return
	mkdir -p "$OVS_RUNDIR"
	step ovsdb-tool create "$OVS_DBDIR/conf.db" /usr/share/openvswitch/vswitch.ovsschema || return
	step ovsdb-server "$OVS_DBDIR/conf.db" --remote="punix:$OVS_RUNDIR/db.sock" --pidfile --detach \
		--log-file || return
	step ovs-vsctl --no-wait init || return
	step ovs-vswitchd --pidfile --detach --log-file || return
	step ovs-vsctl add-br ovsbr || return
	ip link set ovsbr up
	local i
	for i in 1 2 3; do
		step ip netns add "vm$i" || return
		step ip link add "vm$i-port" type veth peer name eth0 netns "vm$i" || return
		step ovs-vsctl add-port ovsbr "vm$i-port" || return
		ip link set "vm$i-port" up
		ip -n "vm$i" link set lo up
		ip -n "vm$i" addr add "$OVS_NET.$i/24" dev eth0
		ip -n "vm$i" link set eth0 up
	done
	ip netns exec vm2 sockperf server -i "$OVS_NET.2" -p "$UDP_PORT" >/dev/null 2>&1 &
	step ip netns exec vm2 iperf3 -s -D -p 5201 || return
	step ip netns exec vm2 iperf3 -s -D -p 5203 || return
	# Every VM reaches vm2 (also resolves the neighbours before a trace starts).
	for i in 1 3; do
		step ip netns exec "vm$i" busybox ping -c 1 -W 5 "$OVS_NET.2" || return
	done
	echo "ovs ready $(ovs-vsctl --version | head -n1)"
}

# ovs-load VMS MBPS SECONDS: from each VM of VMS (vm1, vm3 or vm1,vm3) an iperf3 UDP flow of MBPS Mbit/s
# to its iperf3 server in vm2 for SECONDS, counted where vm2 receives them (nftables). VMS none stops the
# flows and answers what vm2 received of them: "delivered BYTES SECONDS".
ovs_load() {
	local vms=$1 mbps=$2 seconds=$3 vm
	pkill -f "iperf3 -c" 2>/dev/null
	if [ "$vms" = none ]; then
		local bytes start
		bytes=$(ip netns exec vm2 nft list table ip hoptrace_load 2>/dev/null |
			sed -n 's/.*counter packets [0-9]* bytes \([0-9]*\).*/\1/p')
		start=$(cat /run/hoptrace-load-start 2>/dev/null || date +%s.%N)
		awk -v bytes="${bytes:-0}" -v start="$start" -v now="$(date +%s.%N)" \
			'BEGIN { printf "delivered %d %.3f\n", bytes, now - start }'
		ip netns exec vm2 nft delete table ip hoptrace_load 2>/dev/null
		rm -f /run/hoptrace-load-start
		return
	fi
	ip netns exec vm2 nft delete table ip hoptrace_load 2>/dev/null
	ip netns exec vm2 nft add table ip hoptrace_load
	ip netns exec vm2 nft add chain ip hoptrace_load in '{ type filter hook input priority 0; policy accept; }'
	ip netns exec vm2 nft add rule ip hoptrace_load in udp dport 5201-5203 counter
	date +%s.%N >/run/hoptrace-load-start
	for vm in ${vms//,/ }; do
		ip netns exec "$vm" iperf3 -c "$OVS_NET.2" -p "$((5200 + ${vm#vm}))" -u -b "${mbps}M" -l 1400 \
			-t "$seconds" >/dev/null 2>&1 </dev/null &
	done
	echo "load $vms ${mbps}M"
}

control() {
	local command a b c
	read -r command a b c || exit 0
	case "$command" in
	ovs-setup) ovs_setup ;;
	ovs-load)
		if [[ $a =~ ^(none|vm1|vm3|vm1,vm3)$ ]] && is_number "$b" && is_number "$c"; then
			ovs_load "$a" "$b" "$c"
		else
			echo "error: ovs-load none|vm1|vm3|vm1,vm3 MBPS SECONDS"
		fi
		;;
	ovs-udp)
		# COUNT datagrams from vm1 to vm2's sockperf server, counted in vm1's namespace.
		if is_number "$a"; then
			ip netns exec vm1 "$HERE/guest_host.sh" send udp "$OVS_NET.2" "$UDP_PORT" "$a"
		else
			echo "error: ovs-udp COUNT"
		fi
		;;
	ovs-police)
		# ovs-police VMS KBPS: OVS ingress policing on each VM's port (0: off), burst a tenth of the rate.
		if [[ $a =~ ^vm[1-3](,vm[1-3])*$ ]] && is_number "$b"; then
			local vm
			for vm in ${a//,/ }; do
				step ovs-vsctl set interface "$vm-port" ingress_policing_rate="$b" \
					ingress_policing_burst="$((b / 10))" || return
			done
			echo "police $a $b"
		else
			echo "error: ovs-police VMS KBPS"
		fi
		;;
	udp | tcp)
		if is_address "$a" && is_number "$b" && is_number "$c"; then
			"send_$command" "$a" "$b" "$c"
		else
			echo "error: $command DST PORT COUNT"
		fi
		;;
	tcp-bulk)
		if is_address "$a" && is_number "$b" && is_number "$c"; then
			send_tcp_bulk "$a" "$b" "$c"
		else
			echo "error: tcp-bulk DST PORT KIB"
		fi
		;;
	clock-shift-ms)
		# Steps CLOCK_REALTIME only (a real second clock): CLOCK_MONOTONIC and so the packets' stamps
		# stay; the agent's clock rounds must see the new offset. Read and set in one process: `date -s`
		# reads "now", then loads its locale and zone files over 9p, and under TCG its step came out
		# 15-120 ms short. Even in one process a vCPU descheduled between the read and the set loses
		# that time from the step (CI saw 4.2 of 10 ms), so the step is measured and topped up.
		if is_number "$a" && ((10#$a < 1000)); then
			# Answers the step made: CLOCK_REALTIME - CLOCK_MONOTONIC after minus before (ns). A gap
			# read is the largest of three: a pause between its two reads only makes it smaller.
			python3 -I -S -c "import time; r, m = time.CLOCK_REALTIME, time.CLOCK_MONOTONIC
gap = lambda: max(time.clock_gettime_ns(r) - time.clock_gettime_ns(m) for _ in range(3))
want = $((10#$a)) * 1_000_000; before = gap(); made = 0
for _ in range(5):
    time.clock_settime_ns(r, time.clock_gettime_ns(r) + want - made)
    made = gap() - before
    if abs(want - made) < 100_000: break
print('shifted', made)"
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
send) [[ $2 =~ ^(udp|tcp)$ ]] && "send_$2" "$3" "$4" "$5" ;;
discard) sed -n '/^end$/q' ;; # read to the sender's last line, then close first
*)
	echo "usage: $0 boot CONFIG | control | discard" >&2
	exit 2
	;;
esac
