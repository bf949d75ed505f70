/*
 * The RPC's framing spoken over a plain TCP socket, for tests that send what no client would
 * (include after cmocka.h).
 */
#ifndef PODEMU_TEST_RAW_FRAMES_H
#define PODEMU_TEST_RAW_FRAMES_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>

#include "rpc.h"

/* A TCP connection to the loopback port of url, whose reads and writes give up after seconds. */
static inline int raw_tcp_connect(const char *url, int seconds)
{
	const char *colon = strrchr(url, ':');
	assert_non_null(colon);
	struct sockaddr_in addr = {.sin_family = AF_INET,
	                           .sin_port = htons((uint16_t)atoi(colon + 1))};
	inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	assert_true(fd >= 0);
	struct timeval tv = {seconds, 0};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	assert_int_equal(connect(fd, (struct sockaddr *)&addr, sizeof(addr)), 0);
	return fd;
}

/* Sends len bytes of data as one frame; false when the connection took less. */
static inline bool raw_frame_send(int fd, const void *data, size_t len)
{
	uint8_t header[RPC_FRAME_HEADER_BYTES];
	rpc_frame_encode(header, (uint32_t)len);
	return send(fd, header, sizeof(header), MSG_NOSIGNAL) == (ssize_t)sizeof(header) &&
	       (len == 0 || send(fd, data, len, MSG_NOSIGNAL) == (ssize_t)len);
}

/* Reads one frame (of at most cap bytes) into buf: its length, or -1 when the connection ended. */
static inline int64_t raw_frame_recv(int fd, void *buf, size_t cap)
{
	uint8_t header[RPC_FRAME_HEADER_BYTES];
	if (recv(fd, header, sizeof(header), MSG_WAITALL) != (ssize_t)sizeof(header))
		return -1;
	int64_t len = rpc_frame_decode(header);
	assert_true(len >= 0 && (size_t)len <= cap);
	if (len > 0 && recv(fd, buf, (size_t)len, MSG_WAITALL) != (ssize_t)len)
		return -1;
	return len;
}

#endif
