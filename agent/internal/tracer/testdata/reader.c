// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * The application of the socket-read and uprobe tests: receives COUNT
 * messages of SIZE bytes on PORT (udp or tcp), checks each arrived
 * unchanged (byte i of message k is (k + i) & 0xff), hands it to
 * handle_request() (the uprobe's target) and answers with one byte so the
 * sender sends the next one only then (one message per TCP segment).
 * Prints "ready" once listening and "ok COUNT" at the end; exits 1 on any
 * mismatch.
 *
 * usage: reader udp|tcp PORT COUNT SIZE
 */
#include <arpa/inet.h>
#include <netinet/in.h>
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
	int tcp, fd, conn, one = 1;
	long count, size;

	if (argc != 5) {
		fprintf(stderr, "usage: reader udp|tcp PORT COUNT SIZE\n");
		return 2;
	}
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
	for (long k = 0; k < count; k++) {
		long got = 0, n;

		/* TCP is a stream: read until the whole message is here (the sender
		 * waits for the answer, so it arrives as one segment). */
		do {
			peer_len = sizeof(peer);
			n = recvfrom(conn, buf + got, size - got, 0, (struct sockaddr *)&peer, &peer_len);
			if (n <= 0) {
				perror("recvfrom");
				return 1;
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
