/* A crowd of strangers (see flood.h). */
#define _GNU_SOURCE
#include "flood.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define RING 1024u               /* connections one thread holds at most */
#define IN_FLIGHT 256u           /* connects not yet answered, per thread */
#define BURST 64u                /* connects per turn, at most */
#define GIVE_UP_NS 1000000000ull /* a connect not answered by then failed */
#define SWEEP_NS 5000000ull

struct conn {
	int fd;
	uint32_t gen;
	bool waiting;     /* for the connection to be made, to say something */
	bool established; /* made (a silent one learns it only at its end) */
	size_t sent;
	uint64_t started_ns, next_ns;
};

struct worker {
	struct flood *f;
	unsigned index;
	pthread_t thread;
	int ep;
	struct conn ring[RING];
	unsigned head, count, in_flight;
	uint32_t gen;
	_Atomic uint64_t attempts, established, failed, dropped;
};

struct flood {
	struct flood_spec spec;
	atomic_bool stop;
	uint64_t started_ns;
	unsigned nworkers;
	struct worker *w;
};

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* This side ends it: with a reset, so that no TIME_WAIT socket is left. */
static void conn_close(struct worker *w, struct conn *c)
{
	if (c->fd < 0)
		return;
	struct linger lg = {.l_onoff = 1, .l_linger = 0};
	setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
	close(c->fd);
	c->fd = -1;
	if (c->waiting)
		w->in_flight--;
}

/* The port's side ended it (or refused it): nothing to send. */
static void conn_gone(struct worker *w, struct conn *c)
{
	close(c->fd);
	c->fd = -1;
	if (c->waiting)
		w->in_flight--;
}

/* Forget closed connections at the head of the ring. */
static void ring_trim(struct worker *w)
{
	while (w->count && w->ring[w->head].fd < 0) {
		w->head = (w->head + 1) % RING;
		w->count--;
	}
}

/* Send the next `n` bytes of what this kind sends: 1 when sent (or
 * nothing was left), 0 when the connection is not made yet, -1 when it
 * failed. */
static int say(struct worker *w, struct conn *c, size_t n)
{
	const struct flood_spec *sp = &w->f->spec;
	if (c->sent + n > sp->len)
		n = sp->len - c->sent;
	if (!n)
		return 1;
	ssize_t k = send(c->fd, sp->bytes + c->sent, n, MSG_NOSIGNAL | MSG_DONTWAIT);
	if (k > 0) {
		c->sent += (size_t)k;
		return 1;
	}
	return errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOTCONN ? 0 : -1;
}

/* The connection is made: count it, and do what this kind does first. */
static void made(struct worker *w, struct conn *c)
{
	const struct flood_spec *sp = &w->f->spec;
	if (c->waiting)
		w->in_flight--;
	c->waiting = false;
	c->established = true;
	atomic_fetch_add(&w->established, 1);
	if (sp->kind == FLOOD_OPEN_CLOSE)
		conn_close(w, c);
	else if (sp->kind == FLOOD_DRIBBLE)
		c->next_ns = now_ns() + (uint64_t)sp->dribble_ms * 1000000ull;
}

/* A silent connection sends nothing: it is counted made when it is
 * writable. Others send at once, which on loopback the connection is
 * usually made for when connect() returns, or wait to be writable. */
static void open_one(struct worker *w)
{
	const struct flood_spec *sp = &w->f->spec;
	ring_trim(w);
	if (w->count == RING) {
		struct conn *old = &w->ring[w->head];
		if (old->waiting)
			atomic_fetch_add(&w->failed, 1);
		conn_close(w, old);
		ring_trim(w);
	}
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return;
	struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons(sp->port)};
	to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	atomic_fetch_add(&w->attempts, 1);
	if (connect(fd, (struct sockaddr *)&to, sizeof(to)) != 0 && errno != EINPROGRESS) {
		atomic_fetch_add(&w->failed, 1);
		close(fd);
		return;
	}
	unsigned slot = (w->head + w->count++) % RING;
	struct conn *c = &w->ring[slot];
	*c = (struct conn){.fd = fd, .gen = ++w->gen, .started_ns = now_ns()};
	uint32_t events = EPOLLIN | EPOLLRDHUP | EPOLLET;
	if (sp->kind == FLOOD_SILENT) {
		c->waiting = true; /* for EPOLLOUT, only to count it made */
		w->in_flight++;
		events |= EPOLLOUT;
	} else {
		int r = sp->kind == FLOOD_OPEN_CLOSE
		                ? 0
		                : say(w, c, sp->kind == FLOOD_PART ? sp->part : 1);
		if (r < 0) {
			atomic_fetch_add(&w->failed, 1);
			conn_gone(w, c);
			return;
		}
		if (r > 0) {
			made(w, c);
			if (c->fd < 0)
				return;
		} else {
			c->waiting = true;
			w->in_flight++;
			events |= EPOLLOUT;
		}
	}
	struct epoll_event ev = {.events = events, .data.u64 = slot | (uint64_t)c->gen << 32};
	epoll_ctl(w->ep, EPOLL_CTL_ADD, fd, &ev);
}

static void on_event(struct worker *w, const struct epoll_event *ev)
{
	const struct flood_spec *sp = &w->f->spec;
	unsigned slot = (unsigned)(ev->data.u64 & 0xffffffffu);
	struct conn *c = &w->ring[slot];
	if (c->fd < 0 || c->gen != (uint32_t)(ev->data.u64 >> 32))
		return; /* closed meanwhile */
	if (c->waiting && (ev->events & EPOLLOUT) && !(ev->events & (EPOLLERR | EPOLLHUP))) {
		if (sp->kind != FLOOD_OPEN_CLOSE && sp->kind != FLOOD_SILENT &&
		    say(w, c, sp->kind == FLOOD_PART ? sp->part : 1) < 0) {
			atomic_fetch_add(&w->failed, 1);
			conn_gone(w, c);
			return;
		}
		made(w, c);
		if (c->fd < 0)
			return;
	}
	if (!(ev->events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)))
		return;
	char buf[2048];
	for (;;) {
		ssize_t n = recv(c->fd, buf, sizeof(buf), MSG_DONTWAIT);
		if (n > 0)
			continue; /* what the port says to a stranger is of no interest */
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return;
		/* Closed or reset by the port, which took it; refused, it never
		 * did. */
		if (n < 0 && errno == ECONNREFUSED) {
			atomic_fetch_add(&w->failed, 1);
		} else {
			if (!c->established) { /* made and closed before this thread looked */
				c->established = true;
				atomic_fetch_add(&w->established, 1);
			}
			atomic_fetch_add(&w->dropped, 1);
		}
		conn_gone(w, c);
		return;
	}
}

/* Dribble what is due, and give up on connects the port never answered. */
static void sweep(struct worker *w, uint64_t now)
{
	const struct flood_spec *sp = &w->f->spec;
	for (unsigned k = 0; k < w->count; k++) {
		struct conn *c = &w->ring[(w->head + k) % RING];
		if (c->fd < 0)
			continue;
		if (c->waiting && now - c->started_ns > GIVE_UP_NS) {
			atomic_fetch_add(&w->failed, 1);
			conn_close(w, c);
		} else if (c->established && sp->kind == FLOOD_DRIBBLE && now >= c->next_ns) {
			say(w, c, 1);
			c->next_ns = now + (uint64_t)sp->dribble_ms * 1000000ull;
		}
	}
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	struct flood *f = w->f;
	double per_ns = (double)f->spec.rate / f->nworkers / 1e9;
	uint64_t issued = 0, swept = 0;
	struct epoll_event ev[256];
	while (!atomic_load(&f->stop)) {
		uint64_t now = now_ns();
		uint64_t due = (uint64_t)((double)(now - f->started_ns) * per_ns);
		for (unsigned b = 0; issued < due && b < BURST && w->in_flight < IN_FLIGHT; b++) {
			open_one(w);
			issued++;
		}
		/* Behind (this thread waited for a core): catch up, but never by
		 * more than a tenth of a second's worth. */
		uint64_t most = (uint64_t)(per_ns * 1e8);
		if (issued + most < due)
			issued = due - most;
		int n = epoll_wait(w->ep, ev, 256, 1);
		for (int i = 0; i < n; i++)
			on_event(w, &ev[i]);
		now = now_ns();
		if (now - swept >= SWEEP_NS) {
			sweep(w, now);
			swept = now;
		}
	}
	for (unsigned k = 0; k < w->count; k++)
		conn_close(w, &w->ring[(w->head + k) % RING]);
	close(w->ep);
	return NULL;
}

struct flood *flood_start(const struct flood_spec *spec)
{
	struct flood *f = calloc(1, sizeof(*f));
	if (!f)
		return NULL;
	f->spec = *spec;
	if (!f->spec.threads)
		f->spec.threads = 3;
	if (!f->spec.dribble_ms)
		f->spec.dribble_ms = 50;
	f->nworkers = f->spec.threads;
	f->w = calloc(f->nworkers, sizeof(*f->w));
	if (!f->w) {
		free(f);
		return NULL;
	}
	f->started_ns = now_ns();
	for (unsigned i = 0; i < f->nworkers; i++) {
		struct worker *w = &f->w[i];
		w->f = f;
		w->index = i;
		w->ep = epoll_create1(EPOLL_CLOEXEC);
		for (unsigned k = 0; k < RING; k++)
			w->ring[k].fd = -1;
		if (w->ep < 0 || pthread_create(&w->thread, NULL, worker_main, w) != 0) {
			fprintf(stderr, "flood: cannot start thread %u: %s\n", i, strerror(errno));
			atomic_store(&f->stop, true);
			for (unsigned j = 0; j < i; j++)
				pthread_join(f->w[j].thread, NULL);
			if (w->ep >= 0)
				close(w->ep);
			free(f->w);
			free(f);
			return NULL;
		}
	}
	return f;
}

struct flood_count flood_count(struct flood *f)
{
	uint64_t now = now_ns();
	struct flood_count c = {.ns = now - f->started_ns, .at_ns = now};
	for (unsigned i = 0; i < f->nworkers; i++) {
		c.attempts += atomic_load(&f->w[i].attempts);
		c.established += atomic_load(&f->w[i].established);
		c.failed += atomic_load(&f->w[i].failed);
		c.dropped += atomic_load(&f->w[i].dropped);
	}
	return c;
}

struct flood_count flood_stop(struct flood *f)
{
	atomic_store(&f->stop, true);
	for (unsigned i = 0; i < f->nworkers; i++)
		pthread_join(f->w[i].thread, NULL);
	struct flood_count c = flood_count(f);
	free(f->w);
	free(f);
	return c;
}

double flood_rate(const struct flood_count *from, const struct flood_count *to)
{
	uint64_t n = to->established - from->established;
	return to->ns > from->ns ? (double)n * 1e9 / (double)(to->ns - from->ns) : 0;
}
