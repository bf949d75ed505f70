/* Data-plane streams: closing ordered with operations, frames written in order, exact reads. */
#include "dp_internal.h"

#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

static void ds_init(struct dp_stream *ds, nng_stream *s)
{
	ds->s = s;
	ds->closed = false;
	pthread_mutex_init(&ds->lock, NULL);
}

void ds_close(struct dp_stream *ds)
{
	pthread_mutex_lock(&ds->lock);
	ds->closed = true;
	nng_stream_close(ds->s);
	pthread_mutex_unlock(&ds->lock);
}

static void ds_io(struct dp_stream *ds, nng_aio *aio, bool send)
{
	pthread_mutex_lock(&ds->lock);
	if (ds->closed)
		nng_sleep_aio(0, aio);
	else if (send)
		nng_stream_send(ds->s, aio);
	else
		nng_stream_recv(ds->s, aio);
	pthread_mutex_unlock(&ds->lock);
}

static void ds_fini(struct dp_stream *ds)
{
	nng_stream_free(ds->s);
	pthread_mutex_destroy(&ds->lock);
}

/* ---- Writing frames to a stream in order, each whole before the next ---- */

static void writer_send(struct dp_writer *w, struct dp_frame *f)
{
	nng_aio_set_iov(w->aio, f->niov, f->iov);
	ds_io(w->ds, w->aio, true);
}

/* Drops the first n bytes of f's vector. */
static void frame_advance(struct dp_frame *f, size_t n)
{
	unsigned k = 0;
	while (k < f->niov && n >= f->iov[k].iov_len)
		n -= f->iov[k++].iov_len;
	if (k < f->niov) {
		f->iov[k].iov_buf = (char *)f->iov[k].iov_buf + n;
		f->iov[k].iov_len -= n;
	}
	memmove(f->iov, f->iov + k, (f->niov - k) * sizeof(f->iov[0]));
	f->niov -= k;
}

/*
 * Writes what the socket takes of f now, without waiting: 0 when all of it is written, 1 when
 * some is left (f is advanced past what was), or an nng error. An nng send completes on one of
 * nng's threads, and each such hand-off costs more than a small frame's write, so a frame
 * nothing waits before goes straight to the socket (the descriptor stays nng's, and it is
 * only written while no nng send is under way on it). w->lock held, nothing queued.
 */
static int write_now(struct dp_writer *w, struct dp_frame *f)
{
	struct iovec iov[4];
	for (unsigned i = 0; i < f->niov; i++)
		iov[i] = (struct iovec){f->iov[i].iov_buf, f->iov[i].iov_len};
	struct msghdr m = {.msg_iov = iov, .msg_iovlen = f->niov};
	pthread_mutex_lock(&w->ds->lock);
	bool closed = w->ds->closed;
	ssize_t n = closed ? -1 : sendmsg(w->fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
	int e = errno;
	pthread_mutex_unlock(&w->ds->lock);
	if (closed)
		return NNG_ECLOSED;
	if (n < 0)
		return e == EAGAIN || e == EWOULDBLOCK || e == EINTR ? 1 : NNG_ECONNSHUT;
	frame_advance(f, (size_t)n);
	return f->niov > 0 ? 1 : 0;
}

void writer_enqueue(struct dp_writer *w, struct dp_frame *f)
{
	f->next = NULL;
	pthread_mutex_lock(&w->lock);
	if (w->error != 0) {
		int e = w->error;
		pthread_mutex_unlock(&w->lock);
		f->done(f, e);
		return;
	}
	if (w->head == NULL && w->fd >= 0) {
		int rv = write_now(w, f);
		if (rv != 1) { /* written, or the stream broke: later frames fail at once */
			if (rv != 0)
				w->error = rv;
			pthread_mutex_unlock(&w->lock);
			if (rv != 0)
				ds_close(w->ds);
			f->done(f, rv);
			return;
		}
	}
	bool start = w->head == NULL;
	if (start)
		w->head = f;
	else
		w->tail->next = f;
	w->tail = f;
	pthread_mutex_unlock(&w->lock);
	if (start)
		writer_send(w, f);
}

/* Fails every queued frame; the stream is broken. */
void writer_fail(struct dp_writer *w, int rv)
{
	pthread_mutex_lock(&w->lock);
	if (w->error == 0)
		w->error = rv;
	struct dp_frame *list = w->head;
	w->head = w->tail = NULL;
	pthread_mutex_unlock(&w->lock);
	while (list != NULL) {
		struct dp_frame *next = list->next;
		list->done(list, rv);
		list = next;
	}
}

static void writer_cb(void *arg)
{
	struct dp_writer *w = arg;
	int rv = nng_aio_result(w->aio);
	size_t n = nng_aio_count(w->aio);
	if (rv == 0 && n == 0)
		rv = NNG_ECLOSED;
	if (rv != 0) {
		ds_close(w->ds);
		writer_fail(w, rv);
		return;
	}
	pthread_mutex_lock(&w->lock);
	struct dp_frame *f = w->head;
	if (f == NULL) { /* failed meanwhile */
		pthread_mutex_unlock(&w->lock);
		return;
	}
	frame_advance(f, n);
	if (f->niov > 0) {
		pthread_mutex_unlock(&w->lock);
		writer_send(w, f);
		return;
	}
	w->head = f->next;
	if (w->head == NULL)
		w->tail = NULL;
	struct dp_frame *next = w->head;
	pthread_mutex_unlock(&w->lock);
	f->done(f, 0);
	if (next != NULL)
		writer_send(w, next);
}

static int writer_init(struct dp_writer *w, struct dp_stream *ds)
{
	pthread_mutex_init(&w->lock, NULL);
	w->ds = ds;
	w->fd = -1;
	return nng_aio_alloc(&w->aio, writer_cb, w);
}

/* ---- Reading exactly n bytes ---- */

/*
 * Takes what the socket already holds of the read now, without waiting: 0 (bytes or none),
 * or -1 when the stream is closed or failed (*err). Only while no nng read is under way (the
 * descriptor stays nng's).
 */
static int read_now(struct dp_reader *r, int *err)
{
	if (r->fd < 0 || r->got == r->want)
		return 0;
	pthread_mutex_lock(&r->ds->lock);
	bool closed = r->ds->closed;
	ssize_t n = closed ? -1 : recv(r->fd, r->buf + r->got, r->want - r->got, MSG_DONTWAIT);
	int e = errno;
	pthread_mutex_unlock(&r->ds->lock);
	if (n > 0) {
		r->got += (size_t)n;
		return 0;
	}
	if (!closed && n < 0 && (e == EAGAIN || e == EWOULDBLOCK || e == EINTR))
		return 0;
	*err = closed ? NNG_ECLOSED : NNG_ECONNSHUT; /* closed here, by the peer, or broken */
	return -1;
}

/*
 * Goes on with the read: 1 when it is complete now, 0 when the reactor (or an nng read) waits
 * for the rest and then calls the callback, -1 when the stream is closed or failed (*err).
 */
static int reader_more(struct dp_reader *r, int *err)
{
	if (read_now(r, err) < 0)
		return -1;
	if (r->got == r->want)
		return 1;
	/*
	 * Woken when what is left (up to DP_RCVLOWAT) is there. Never more than is still to come:
	 * a peer that sends no more would leave the reader asleep.
	 */
	if (r->fd >= 0) {
		size_t left = r->want - r->got;
		int mark = left < DP_RCVLOWAT ? (int)left : (int)DP_RCVLOWAT;
		if (mark != r->lowat &&
		    setsockopt(r->fd, SOL_SOCKET, SO_RCVLOWAT, &mark, sizeof(mark)) == 0)
			r->lowat = mark;
	}
	if (r->re != NULL) {
		if (dp_reactor_arm(r->re, r) != 0) {
			*err = NNG_ENOMEM;
			return -1;
		}
		return 0;
	}
	nng_iov iov = {r->buf + r->got, r->want - r->got};
	nng_aio_set_iov(r->aio, 1, &iov);
	ds_io(r->ds, r->aio, false);
	return 0;
}

int reader_read(struct dp_reader *r, void *buf, size_t want)
{
	r->buf = buf;
	r->want = want;
	r->got = 0;
	int err = 0;
	int rv = reader_more(r, &err);
	if (rv >= 0)
		return rv;
	/* Failed at once: the callback learns it, as from a read that failed. */
	r->err = err;
	nng_sleep_aio(0, r->aio);
	return 0;
}

/* In the reader's callback: 1 when the bytes are all there, 0 when it reads on, or -1. */
int reader_step(struct dp_reader *r, int *err)
{
	if (r->err != 0) {
		*err = r->err;
		return -1;
	}
	if (r->re == NULL) { /* an nng read completed */
		int rv = nng_aio_result(r->aio);
		size_t n = nng_aio_count(r->aio);
		if (rv == 0 && n == 0)
			rv = NNG_ECONNSHUT;
		if (rv != 0) {
			*err = rv;
			return -1;
		}
		r->got += n;
	}
	int rv = reader_more(r, err);
	if (rv < 0)
		r->err = *err;
	return rv;
}

void link_use_socket(struct dp_writer *w, struct dp_reader *r, nng_stream *s, struct dp_reactor *re)
{
	w->fd = r->fd = stream_socket(s);
	r->re = r->fd >= 0 ? re : NULL;
}

void reader_stop(struct dp_reader *r)
{
	if (r->re != NULL)
		dp_reactor_forget(r->re, r);
	nng_aio_stop(r->aio);
}

/*
 * Both ends of a connection: the stream, a writer and a reader whose callback is cb(arg).
 * On failure nothing is left allocated but the stream, which stays the caller's.
 */
int link_init(struct dp_stream *ds, struct dp_writer *w, struct dp_reader *r, nng_stream *s,
              void (*cb)(void *), void *arg)
{
	/* Acknowledgements and headers are small writes that must not wait for Nagle's timer. */
	nng_stream_set_bool(s, NNG_OPT_TCP_NODELAY, true);
	ds_init(ds, s);
	r->ds = ds;
	r->fd = -1;
	r->re = NULL;
	r->registered = false;
	r->err = 0;
	r->cb = cb;
	r->arg = arg;
	r->lowat = 1;
	if (writer_init(w, ds) != 0) {
		pthread_mutex_destroy(&w->lock);
		pthread_mutex_destroy(&ds->lock);
		return -1;
	}
	if (nng_aio_alloc(&r->aio, cb, arg) != 0) {
		nng_aio_free(w->aio);
		pthread_mutex_destroy(&w->lock);
		pthread_mutex_destroy(&ds->lock);
		return -1;
	}
	return 0;
}

/* Closes and frees a link. Never from one of its own callbacks. */
void link_fini(struct dp_stream *ds, struct dp_writer *w, struct dp_reader *r)
{
	ds_close(ds);
	reader_stop(r);
	nng_aio_free(r->aio);
	nng_aio_free(w->aio);
	writer_fail(w, NNG_ECLOSED); /* frames never started */
	ds_fini(ds);
	pthread_mutex_destroy(&w->lock);
}
