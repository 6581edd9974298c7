// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * The application of the socket-read and uprobe tests: receives COUNT
 * messages of SIZE bytes on PORT (udp or tcp), checks each arrived
 * unchanged (byte i of message k is (k + i) & 0xff), hands it to
 * handle_request() (the uprobe's target) and answers with one byte so the
 * sender sends the next one only then (one message per TCP segment).
 * Prints "ready" once listening and "ok COUNT" at the end; exits 1 on any
 * mismatch. With "meminfo", each receive call also prints the socket's
 * receive queue and backlog bytes (SO_MEMINFO) just before it (once the data
 * is there) and just after: "mem RMEM_BEFORE BACKLOG_BEFORE RMEM_AFTER
 * BACKLOG_AFTER", the ground truth of the rmem and backlog fields. "burst"
 * is "meminfo" that first waits until the socket holds all COUNT messages
 * and nothing more arrives (a sender that sends them all before it reads the
 * answers).
 *
 * usage: reader udp|tcp PORT COUNT SIZE [meminfo|burst]
 */
#include <arpa/inet.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static unsigned long handled;

/* Not inlined: the uprobe test attaches here, after each recvfrom(). */
__attribute__((noinline)) int handle_request(const unsigned char *buf, long len)
{
	handled++;
	__asm__ volatile("" ::"r"(buf), "r"(len) : "memory");
	return (int)len;
}

/* The socket's receive queue and backlog bytes, as its sk_rmem_alloc and sk_backlog.len. */
static void meminfo(int fd, unsigned int *rmem, unsigned int *backlog)
{
	unsigned int mem[SK_MEMINFO_VARS] = {};
	socklen_t len = sizeof(mem);

	if (getsockopt(fd, SOL_SOCKET, SO_MEMINFO, mem, &len)) {
		perror("SO_MEMINFO");
		exit(1);
	}
	*rmem = mem[SK_MEMINFO_RMEM_ALLOC];
	*backlog = mem[SK_MEMINFO_BACKLOG];
}

static int check(const unsigned char *buf, long len, long size, long k)
{
	if (len != size)
		return -1;
	for (long i = 0; i < len; i++)
		if (buf[i] != (unsigned char)((k + i) & 0xff))
			return -1;
	return 0;
}

int main(int argc, char **argv)
{
	struct sockaddr_in addr = {.sin_family = AF_INET};
	struct sockaddr_in peer;
	socklen_t peer_len;
	unsigned char buf[65536];
	int tcp, fd, conn, one = 1, mem, burst;
	long count, size;

	if (argc != 5 &&
	    !(argc == 6 && (strcmp(argv[5], "meminfo") == 0 || strcmp(argv[5], "burst") == 0))) {
		fprintf(stderr, "usage: reader udp|tcp PORT COUNT SIZE [meminfo|burst]\n");
		return 2;
	}
	mem = argc == 6;
	burst = mem && strcmp(argv[5], "burst") == 0;
	tcp = strcmp(argv[1], "tcp") == 0;
	addr.sin_port = htons(atoi(argv[2]));
	count = atol(argv[3]);
	size = atol(argv[4]);
	if (size <= 0 || size > (long)sizeof(buf))
		return 2;
	fd = socket(AF_INET, tcp ? SOCK_STREAM : SOCK_DGRAM, 0);
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (fd < 0 || bind(fd, (struct sockaddr *)&addr, sizeof(addr)) || (tcp && listen(fd, 1))) {
		perror("socket");
		return 1;
	}
	printf("ready\n");
	fflush(stdout);
	conn = fd;
	if (tcp) {
		conn = accept(fd, NULL, NULL);
		if (conn < 0) {
			perror("accept");
			return 1;
		}
	}
	/* A datagram's share of rmem is its truesize, not its size, so "holds
	 * count * size bytes" can be true with part of the burst still on its
	 * way: wait until the queue has also stopped growing for 100 ms. */
	for (unsigned int waited_ms = 0, last = 0, still_ms = 0; burst; waited_ms++) {
		unsigned int rmem, backlog;

		meminfo(conn, &rmem, &backlog);
		still_ms = rmem == last ? still_ms + 1 : 0;
		last = rmem;
		if (rmem >= count * size && still_ms >= 100)
			break;
		if (waited_ms == 10000) {
			fprintf(stderr, "the burst did not arrive: %u bytes queued\n", rmem);
			return 1;
		}
		usleep(1000);
	}
	for (long k = 0; k < count; k++) {
		long got = 0, n;

		/* TCP is a stream: read until the whole message is here (the sender
		 * waits for the answer, so it arrives as one segment). */
		do {
			struct pollfd ready = {.fd = conn, .events = POLLIN};
			unsigned int rmem[2], backlog[2];

			if (mem) {
				if (poll(&ready, 1, 10000) != 1) {
					fprintf(stderr, "message %ld did not arrive\n", k);
					return 1;
				}
				meminfo(conn, &rmem[0], &backlog[0]);
			}
			peer_len = sizeof(peer);
			n = recvfrom(conn, buf + got, size - got, 0, (struct sockaddr *)&peer, &peer_len);
			if (n <= 0) {
				perror("recvfrom");
				return 1;
			}
			if (mem) {
				meminfo(conn, &rmem[1], &backlog[1]);
				printf("mem %u %u %u %u\n", rmem[0], backlog[0], rmem[1], backlog[1]);
			}
			got += n;
		} while (tcp && got < size);
		handle_request(buf, got);
		if (check(buf, got, size, k)) {
			fprintf(stderr, "message %ld changed on the way (%ld bytes)\n", k, got);
			return 1;
		}
		if (tcp ? send(conn, "k", 1, 0) != 1
			: sendto(fd, "k", 1, 0, (struct sockaddr *)&peer, peer_len) != 1) {
			perror("answer");
			return 1;
		}
	}
	printf("ok %lu\n", handled);
	return 0;
}
