/* The data plane over real sockets: chunking, windows, parking, errors, unreachable peers. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <dirent.h>
#include <netinet/in.h>
#include <nng/nng.h>
#include <sys/eventfd.h>
#include <sys/socket.h>

#include "dataplane.h"

/* A receiver that copies chunks into a buffer, or parks them while "not ready". */
struct sink {
	pthread_mutex_t lock;
	unsigned char buf[4 << 20];
	uint64_t bytes;
	int chunks;
	int lasts;
	int ready;
	int refuse;
	struct dp_request *parked[64];
	int num_parked;
	uint64_t step; /* != 0: chunks of other steps (a former test's, late) are refused */
	int place;     /* hand the data plane sink.buf as the place for payloads */
	int placed;    /* chunks delivered in place */
	int unplaced;  /* chunks given up after their place was handed out */
	int hold;      /* admit: hold chunks unread */
	struct dp_request *held[4];
	int num_held;
	pthread_t holder; /* with holding: chunks delivered on this thread are counted */
	int holding;
	int by_holder;
};

static int deliver(void *arg, struct dp_request *req, const struct dp_header *h,
                   const void *payload, struct status *st)
{
	struct sink *s = arg;
	pthread_mutex_lock(&s->lock);
	if (s->step != 0 && h->step_id != s->step) {
		pthread_mutex_unlock(&s->lock);
		return status_set(st, ST_INVALID_ARGUMENT, "a late chunk of step %llu",
		                  (unsigned long long)h->step_id);
	}
	if (s->refuse) {
		pthread_mutex_unlock(&s->lock);
		return status_set(st, ST_INVALID_ARGUMENT, "refused chunk at %llu",
		                  (unsigned long long)h->offset);
	}
	if (!s->ready) {
		s->parked[s->num_parked++] = req;
		pthread_mutex_unlock(&s->lock);
		return DP_PARKED;
	}
	if (payload == s->buf + h->offset && h->length > 0)
		s->placed++;
	else
		memcpy(s->buf + h->offset, payload, h->length);
	s->bytes += h->length;
	s->chunks++;
	s->by_holder += s->holding && pthread_equal(pthread_self(), s->holder);
	s->lasts += (h->flags & DP_FLAG_LAST) != 0;
	pthread_mutex_unlock(&s->lock);
	return ST_OK;
}

static void *place(void *arg, struct dp_request *req, const struct dp_header *h)
{
	struct sink *s = arg;
	(void)req;
	if (!s->place || h->offset + h->length > sizeof(s->buf))
		return NULL;
	return s->buf + h->offset;
}

static void unplace(void *arg, struct dp_request *req)
{
	struct sink *s = arg;
	(void)req;
	pthread_mutex_lock(&s->lock);
	s->unplaced++;
	pthread_mutex_unlock(&s->lock);
}

static int admit(void *arg, struct dp_request *req, const struct dp_header *h, struct status *st)
{
	struct sink *s = arg;
	(void)h, (void)st;
	pthread_mutex_lock(&s->lock);
	int rv = ST_OK;
	if (s->hold && s->num_held < 4) {
		s->held[s->num_held++] = req;
		rv = DP_PARKED;
	}
	pthread_mutex_unlock(&s->lock);
	return rv;
}

static struct sink sink;
static struct dataplane *rx, *tx;

static char rx_url[256], tx_url[256];

static int setup(void **state)
{
	struct status st;
	pthread_mutex_init(&sink.lock, NULL);
	const struct dp_handlers handlers = {deliver, place, unplace, admit, &sink};
	if (dp_start(&rx, "tcp://127.0.0.1:0", rx_url, &handlers, &st) != ST_OK)
		return -1;
	if (dp_start(&tx, "tcp://127.0.0.1:0", tx_url, &handlers, &st) != ST_OK)
		return -1;
	return 0;
}

static int teardown(void **state)
{
	dp_stop(tx);
	dp_stop(rx);
	return 0;
}

/*
 * Each test starts from an empty sink and no pod token, whatever the one before it left
 * (a chunk of its step still in flight is refused once the test names its own step).
 */
static void reset_sink(int ready)
{
	pthread_mutex_lock(&sink.lock);
	memset(sink.buf, 0, sizeof(sink.buf));
	sink.bytes = 0;
	sink.chunks = sink.lasts = sink.num_parked = sink.refuse = 0;
	sink.place = sink.placed = sink.unplaced = 0;
	sink.hold = sink.num_held = 0;
	sink.holding = sink.by_holder = 0;
	sink.step = 0;
	sink.ready = ready;
	pthread_mutex_unlock(&sink.lock);
	dp_set_token(rx, NULL);
	dp_set_token(tx, NULL);
}

static void test_chunks_arrive_whole(void **state)
{
	reset_sink(1);
	static unsigned char data[1000003];
	for (size_t i = 0; i < sizeof(data); i++)
		data[i] = (unsigned char)(i * 7 + 3);
	const char *peers[] = {rx_url};
	struct dp_header h = {.step_id = 1};
	struct status st;
	assert_int_equal(dp_send(tx, peers, 1, &h, data, sizeof(data), 65536, 4, 5000, &st), ST_OK);
	assert_int_equal(sink.bytes, sizeof(data));
	assert_int_equal(sink.chunks, (sizeof(data) + 65535) / 65536);
	assert_int_equal(sink.lasts, 1);
	assert_memory_equal(sink.buf, data, sizeof(data));
	/* Without data only a header travels, still marked last. */
	reset_sink(1);
	assert_int_equal(dp_send(tx, peers, 1, &h, NULL, 12345, 65536, 4, 5000, &st), ST_OK);
	assert_int_equal(sink.chunks, 1);
	assert_int_equal(sink.bytes, 0);
	assert_int_equal(sink.lasts, 1);
}

struct sender {
	const char *peer;
	uint64_t step; /* 0: 2 */
	int rv;
	struct status st;
	unsigned char data[4096];
};

static void *send_thread(void *arg)
{
	struct sender *s = arg;
	const char *peers[] = {s->peer};
	struct dp_header h = {.step_id = s->step ? s->step : 2};
	s->rv = dp_send(tx, peers, 1, &h, s->data, sizeof(s->data), 1024, 2, 5000, &s->st);
	return NULL;
}

/* Waits up to a second for the receiver to hold n chunks; how many it holds. */
static int wait_held(int n)
{
	int held = 0;
	for (int i = 0; i < 100 && held < n; i++) {
		pthread_mutex_lock(&sink.lock);
		held = sink.num_held;
		pthread_mutex_unlock(&sink.lock);
		if (held < n)
			usleep(10000);
	}
	return held;
}

/*
 * A chunk its receiver holds (a step not prepared yet) is not read, nor anything behind it on
 * its stream, until it is resumed: read on, or refused with its payload skipped.
 */
static void test_held_chunks_are_read_only_when_resumed(void **state)
{
	reset_sink(1);
	sink.hold = 1;
	static struct sender s;
	s = (struct sender){.peer = rx_url, .step = 20};
	for (size_t i = 0; i < sizeof(s.data); i++)
		s.data[i] = (unsigned char)(i * 13 + 1);
	pthread_t t;
	pthread_create(&t, NULL, send_thread, &s);
	assert_int_equal(wait_held(1), 1);
	usleep(50000); /* the second chunk (window 2) is on the stream, not read */
	pthread_mutex_lock(&sink.lock);
	assert_int_equal(sink.num_held, 1);
	assert_int_equal(sink.chunks, 0);
	sink.hold = 0;
	struct dp_request *req = sink.held[0];
	pthread_mutex_unlock(&sink.lock);
	dp_resume(req, ST_OK, NULL);
	pthread_join(t, NULL);
	assert_int_equal(s.rv, ST_OK);
	assert_int_equal(sink.chunks, 4);
	assert_memory_equal(sink.buf, s.data, sizeof(s.data));

	/* Refused: the sender hears why, and the stream still frames what comes next. */
	reset_sink(1);
	sink.hold = 1;
	s = (struct sender){.peer = rx_url, .step = 21};
	pthread_create(&t, NULL, send_thread, &s);
	assert_int_equal(wait_held(1), 1);
	pthread_mutex_lock(&sink.lock);
	sink.hold = 0;
	sink.step = 22; /* the chunk behind the refused one is late, then */
	req = sink.held[0];
	pthread_mutex_unlock(&sink.lock);
	dp_resume(req, ST_ABORTED, "its step was aborted");
	pthread_join(t, NULL);
	assert_int_equal(s.rv, ST_ABORTED);
	assert_non_null(strstr(s.st.message, "its step was aborted"));
	unsigned char data[8] = {9, 8, 7, 6, 5, 4, 3, 2};
	const char *peers[] = {rx_url};
	struct dp_header h = {.step_id = 22};
	struct status st;
	assert_int_equal(dp_send(tx, peers, 1, &h, data, sizeof(data), 64, 2, 5000, &st), ST_OK);
	assert_memory_equal(sink.buf, data, sizeof(data));
}

static int sink_chunks(void)
{
	pthread_mutex_lock(&sink.lock);
	int n = sink.chunks;
	pthread_mutex_unlock(&sink.lock);
	return n;
}

/*
 * A thread that holds the receiving data plane reads its chunks itself, in its dp_poll; its
 * wake eventfd ends a poll; once it lets go, the reactor thread reads again.
 */
static void test_a_holder_reads_on_its_own_thread(void **state)
{
	reset_sink(1);
	int wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK), other = eventfd(0, EFD_CLOEXEC);
	assert_true(wake >= 0 && other >= 0);
	assert_true(dp_hold(rx, wake));
	assert_false(dp_hold(rx, other)); /* one holder at a time */
	pthread_mutex_lock(&sink.lock);
	sink.holder = pthread_self();
	sink.holding = 1;
	pthread_mutex_unlock(&sink.lock);

	for (int i = 0; i < 10 && dp_poll(rx, 0) == 1; i++)
		; /* what rang before: the hold itself stops the reactor thread's wait */
	assert_int_equal(dp_poll(rx, 20), 0); /* nothing comes: it times out */
	static struct sender s;
	s = (struct sender){.peer = rx_url, .step = 30};
	for (size_t i = 0; i < sizeof(s.data); i++)
		s.data[i] = (unsigned char)(i * 5 + 2);
	pthread_t t;
	pthread_create(&t, NULL, send_thread, &s);
	for (int i = 0; i < 1000 && sink_chunks() < 4; i++)
		assert_true(dp_poll(rx, 1000) >= 0);
	pthread_join(t, NULL);
	assert_int_equal(s.rv, ST_OK);
	assert_int_equal(sink.chunks, 4);
	assert_int_equal(sink.by_holder, 4);
	assert_memory_equal(sink.buf, s.data, sizeof(s.data));

	uint64_t one = 1;
	assert_int_equal(write(wake, &one, sizeof(one)), sizeof(one));
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	assert_int_equal(dp_poll(rx, 5000), 1);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	assert_true(t1.tv_sec - t0.tv_sec < 2);

	dp_release(rx);
	assert_true(dp_hold(rx, other)); /* free again */
	dp_release(rx);
	reset_sink(1);
	s = (struct sender){.peer = rx_url, .step = 31};
	pthread_create(&t, NULL, send_thread, &s);
	pthread_join(t, NULL); /* answered without anyone polling here */
	assert_int_equal(s.rv, ST_OK);
	assert_int_equal(sink.chunks, 4);
	close(wake);
	close(other);
}

static void test_parked_chunks_wait_for_the_receiver(void **state)
{
	reset_sink(0);
	static struct sender s;
	s.peer = rx_url;
	memset(s.data, 0x5a, sizeof(s.data));
	pthread_t t;
	pthread_create(&t, NULL, send_thread, &s);
	/* With a window of 2 the sender stops after two unacknowledged chunks. */
	for (int i = 0; i < 100; i++) {
		pthread_mutex_lock(&sink.lock);
		int n = sink.num_parked;
		pthread_mutex_unlock(&sink.lock);
		if (n == 2)
			break;
		usleep(10000);
	}
	usleep(50000);
	pthread_mutex_lock(&sink.lock);
	assert_int_equal(sink.num_parked, 2);
	sink.ready = 1;
	for (int i = 0; i < sink.num_parked; i++) {
		const struct dp_header *h = dp_request_header(sink.parked[i]);
		memcpy(sink.buf + h->offset, dp_request_payload(sink.parked[i]), h->length);
		sink.bytes += h->length;
		dp_complete(sink.parked[i], ST_OK, NULL);
	}
	pthread_mutex_unlock(&sink.lock);
	pthread_join(t, NULL);
	assert_int_equal(s.rv, ST_OK);
	assert_int_equal(sink.bytes, sizeof(s.data));
	assert_memory_equal(sink.buf, s.data, sizeof(s.data));
}

static void test_receiver_errors_reach_the_sender(void **state)
{
	reset_sink(1);
	sink.refuse = 1;
	unsigned char data[100] = {0};
	const char *peers[] = {rx_url};
	struct dp_header h = {.step_id = 3};
	struct status st;
	assert_int_equal(dp_send(tx, peers, 1, &h, data, sizeof(data), 64, 2, 5000, &st),
	                 ST_INVALID_ARGUMENT);
	/* Either chunk may be answered first; the first refusal is the one reported. */
	assert_non_null(strstr(st.message, "refused chunk at "));
}

static void test_chunks_need_the_pod_token(void **state)
{
	reset_sink(1);
	sink.step = 5; /* the refused chunks of step 3 may still arrive */
	dp_set_token(rx, "secret");
	unsigned char data[8] = {1, 2, 3, 4, 5, 6, 7, 8};
	const char *peers[] = {rx_url};
	struct dp_header h = {.step_id = 5};
	struct status st;
	assert_int_equal(dp_send(tx, peers, 1, &h, data, sizeof(data), 64, 2, 5000, &st),
	                 ST_UNAUTHENTICATED);
	assert_int_equal(sink.chunks, 0);
	dp_set_token(tx, "secret");
	assert_int_equal(dp_send(tx, peers, 1, &h, data, sizeof(data), 64, 2, 5000, &st), ST_OK);
	assert_int_equal(sink.chunks, 1);
	dp_set_token(rx, NULL);
	dp_set_token(tx, NULL);
}

/* A raw stream to the receiver with bytes already sent on it (the aio is free to use). */
static nng_stream *raw_send(nng_aio *aio, const void *bytes, size_t len)
{
	nng_stream_dialer *d;
	assert_int_equal(nng_stream_dialer_alloc(&d, rx_url), 0);
	nng_aio_set_timeout(aio, 5000);
	nng_stream_dialer_dial(d, aio);
	nng_aio_wait(aio);
	assert_int_equal(nng_aio_result(aio), 0);
	nng_stream *s = nng_aio_get_output(aio, 0);
	nng_stream_dialer_free(d);
	nng_iov iov = {(void *)bytes, len};
	nng_aio_set_iov(aio, 1, &iov);
	nng_stream_send(s, aio);
	nng_aio_wait(aio);
	assert_int_equal(nng_aio_result(aio), 0);
	assert_int_equal(nng_aio_count(aio), len);
	return s;
}

/* Sends one raw header on a fresh stream and reads the acknowledgement the receiver writes. */
static struct dp_ack raw_frame(const struct dp_header *h, char *message, size_t cap)
{
	nng_aio *aio;
	assert_int_equal(nng_aio_alloc(&aio, NULL, NULL), 0);
	nng_stream *s = raw_send(aio, h, sizeof(*h));
	struct dp_ack a;
	char buf[sizeof(a) + 512];
	size_t got = 0;
	/* The acknowledgement, then the receiver closes the stream. */
	for (;;) {
		nng_iov in = {buf + got, sizeof(buf) - got};
		nng_aio_set_iov(aio, 1, &in);
		nng_stream_recv(s, aio);
		nng_aio_wait(aio);
		if (nng_aio_result(aio) != 0 || nng_aio_count(aio) == 0)
			break;
		got += nng_aio_count(aio);
	}
	assert_true(got >= sizeof(a));
	memcpy(&a, buf, sizeof(a));
	assert_int_equal(got, sizeof(a) + a.len);
	snprintf(message, cap, "%.*s", (int)a.len, buf + sizeof(a));
	nng_aio_free(aio);
	nng_stream_free(s);
	return a;
}

static void test_malformed_frames_are_answered(void **state)
{
	reset_sink(1);
	char message[512];
	/* Not a chunk header: refused, and the stream is closed (its framing is lost). */
	struct dp_header h = {.magic = 0x12345678, .chan = 7, .slot = 1};
	struct dp_ack a = raw_frame(&h, message, sizeof(message));
	assert_int_equal(a.magic, DP_ACK_MAGIC);
	assert_int_equal(a.code, ST_INVALID_ARGUMENT);
	assert_int_equal(a.chan, 7);
	assert_int_equal(a.slot, 1);
	assert_true(a.flags & DP_ACK_CLOSING);
	assert_string_equal(message, "malformed data-plane chunk header");
	/* A payload larger than any chunk is refused before a byte of it is read. */
	h = (struct dp_header){.magic = DP_MAGIC, .length = 1ull << 40};
	a = raw_frame(&h, message, sizeof(message));
	assert_int_equal(a.code, ST_INVALID_ARGUMENT);
	assert_int_equal(sink.chunks, 0);
	/* The receiver still takes well-formed chunks. */
	unsigned char data[10] = {9};
	const char *peers[] = {rx_url};
	struct dp_header ok = {.step_id = 6};
	struct status st;
	assert_int_equal(dp_send(tx, peers, 1, &ok, data, sizeof(data), 64, 2, 5000, &st), ST_OK);
	assert_int_equal(sink.chunks, 1);
}

static void test_payloads_are_read_into_place(void **state)
{
	reset_sink(1);
	sink.place = 1;
	static unsigned char data[300000];
	for (size_t i = 0; i < sizeof(data); i++)
		data[i] = (unsigned char)(i * 13 + 1);
	const char *peers[] = {rx_url};
	struct dp_header h = {.step_id = 7};
	struct status st;
	assert_int_equal(dp_send(tx, peers, 1, &h, data, sizeof(data), 65536, 4, 5000, &st), ST_OK);
	assert_int_equal(sink.chunks, 5);
	assert_int_equal(sink.placed, 5); /* nothing was copied by the receiver */
	assert_memory_equal(sink.buf, data, sizeof(data));
}

static void test_a_payload_cut_short_is_given_up(void **state)
{
	reset_sink(1);
	sink.place = 1;
	nng_aio *aio;
	assert_int_equal(nng_aio_alloc(&aio, NULL, NULL), 0);
	/* A header announcing 1000 bytes, then half of them, then the sender is gone. */
	static unsigned char frame[sizeof(struct dp_header) + 500];
	struct dp_header h = {.magic = DP_MAGIC, .step_id = 8, .length = 1000, .covered = 1000};
	memcpy(frame, &h, sizeof(h));
	nng_stream_free(raw_send(aio, frame, sizeof(frame)));
	nng_aio_free(aio);
	int unplaced = 0;
	for (int i = 0; i < 200 && unplaced == 0; i++) {
		usleep(10000);
		pthread_mutex_lock(&sink.lock);
		unplaced = sink.unplaced;
		pthread_mutex_unlock(&sink.lock);
	}
	assert_int_equal(unplaced, 1);
	assert_int_equal(sink.chunks, 0);
}

/*
 * A peer that ignores its window: the receiver holds its credit's worth of chunks (parked
 * here, as for a core that has not got to them) and refuses the next one, closing the stream,
 * so that a peer cannot make it buffer without limit.
 */
static void test_a_peer_past_its_credit_is_cut_off(void **state)
{
	reset_sink(0);
	dp_set_credit(rx, 2, 2 * 64);
	enum { CHUNKS = 4, LEN = 64 };
	static unsigned char frames[CHUNKS * (sizeof(struct dp_header) + LEN)];
	for (int i = 0; i < CHUNKS; i++) {
		struct dp_header h = {.magic = DP_MAGIC,
		                      .step_id = 9,
		                      .offset = (uint64_t)i * LEN,
		                      .length = LEN,
		                      .covered = LEN,
		                      .slot = (uint32_t)i};
		memcpy(frames + i * (sizeof(h) + LEN), &h, sizeof(h));
	}
	nng_aio *aio;
	assert_int_equal(nng_aio_alloc(&aio, NULL, NULL), 0);
	nng_stream *s = raw_send(aio, frames, sizeof(frames));
	struct dp_ack a;
	char buf[sizeof(a) + 512];
	size_t got = 0;
	while (got < sizeof(a)) {
		nng_iov in = {buf + got, sizeof(buf) - got};
		nng_aio_set_iov(aio, 1, &in);
		nng_stream_recv(s, aio);
		nng_aio_wait(aio);
		assert_int_equal(nng_aio_result(aio), 0);
		got += nng_aio_count(aio);
	}
	memcpy(&a, buf, sizeof(a));
	assert_int_equal(a.code, ST_RESOURCE_EXHAUSTED);
	assert_int_equal(a.slot, 2); /* the third chunk */
	assert_true(a.flags & DP_ACK_CLOSING);
	pthread_mutex_lock(&sink.lock);
	assert_int_equal(sink.num_parked, 2);
	struct dp_request *parked[2] = {sink.parked[0], sink.parked[1]};
	sink.num_parked = 0;
	pthread_mutex_unlock(&sink.lock);
	for (int i = 0; i < 2; i++)
		dp_complete(parked[i], ST_OK, NULL);
	nng_stream_free(s);
	nng_aio_free(aio);
	dp_set_credit(rx, 0, 0);
	/* Within its credit a peer is served as before. */
	reset_sink(1);
	dp_set_credit(rx, 2, 2 * 64);
	unsigned char data[1000] = {5};
	const char *peers[] = {rx_url};
	struct dp_header ok = {.step_id = 10};
	struct status st;
	assert_int_equal(dp_send(tx, peers, 1, &ok, data, sizeof(data), 64, 2, 5000, &st), ST_OK);
	assert_int_equal(sink.bytes, sizeof(data));
	dp_set_credit(rx, 0, 0);
}

/* The receive low-water mark of the receiver's end of its connection from tx; -1: none. */
static int receiver_lowat(void)
{
	int port = atoi(strrchr(rx_url, ':') + 1), mark = -1;
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	while (d != NULL && (e = readdir(d)) != NULL) {
		int fd = atoi(e->d_name);
		struct sockaddr_in a, b;
		socklen_t al = sizeof(a), bl = sizeof(b), ml = sizeof(mark);
		if (getsockname(fd, (struct sockaddr *)&a, &al) == 0 && a.sin_family == AF_INET &&
		    ntohs(a.sin_port) == port &&
		    getpeername(fd, (struct sockaddr *)&b, &bl) == 0) /* not the listener */
			getsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &mark, &ml);
	}
	if (d != NULL)
		closedir(d);
	return mark;
}

/*
 * A reader is woken once what it waits for is in, not for every segment: the mark follows each
 * read down to the next header (never above what is still to come, or the reader would stall).
 */
static void test_readers_wait_for_what_they_read(void **state)
{
	reset_sink(1);
	static unsigned char data[3 << 20];
	const char *peers[] = {rx_url};
	struct dp_header h = {.step_id = 9};
	struct status st;
	assert_int_equal(dp_send(tx, peers, 1, &h, data, sizeof(data), 2 << 20, 4, 5000, &st),
	                 ST_OK);
	assert_int_equal(sink.chunks, 2);
	usleep(20000); /* the reader goes on to the next header after the last delivery */
	assert_int_equal(receiver_lowat(), (int)sizeof(struct dp_header));
}

static void test_unreachable_peer_fails_within_the_deadline(void **state)
{
	const char *peers[] = {"tcp://127.0.0.1:1"};
	struct dp_header h = {.step_id = 4};
	unsigned char data[10] = {0};
	struct status st;
	int rv = dp_send(tx, peers, 1, &h, data, sizeof(data), 64, 2, 300, &st);
	assert_true(rv == ST_DEADLINE_EXCEEDED || rv == ST_UNAVAILABLE);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_chunks_arrive_whole),
	    cmocka_unit_test(test_parked_chunks_wait_for_the_receiver),
	    cmocka_unit_test(test_held_chunks_are_read_only_when_resumed),
	    cmocka_unit_test(test_a_holder_reads_on_its_own_thread),
	    cmocka_unit_test(test_receiver_errors_reach_the_sender),
	    cmocka_unit_test(test_chunks_need_the_pod_token),
	    cmocka_unit_test(test_malformed_frames_are_answered),
	    cmocka_unit_test(test_payloads_are_read_into_place),
	    cmocka_unit_test(test_a_payload_cut_short_is_given_up),
	    cmocka_unit_test(test_a_peer_past_its_credit_is_cut_off),
	    cmocka_unit_test(test_readers_wait_for_what_they_read),

	    cmocka_unit_test(test_unreachable_peer_fails_within_the_deadline),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
