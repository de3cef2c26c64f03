/* Admission of connections that have yet to show who they are (see
 * admit.h). */
#define _GNU_SOURCE
#include "admit.h"
#include "sync.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#define NONE UINT_MAX
#define LISTENER UINT64_MAX
#define LOG_BURST 4 /* drops logged on their own line each second */
#define LOG_WINDOW_NS 1000000000ull
#define TLS_RECORD_MAX 16384u       /* a TLSPlaintext fragment, 2^14 */
#define ACCEPT_PAUSE_NS 10000000ull /* accept failing with nothing to close */

struct slot {
	int fd; /* -1: free */
	uint8_t level;
	bool want_write;
	bool hup; /* the peer closed (its side), seen by lmt__admit_wait */
	uint64_t accepted_ns;
	unsigned prev, next; /* in its level's list, or the free list (next) */
};

struct list {
	unsigned head, tail, n;
};

/* Closing a connection is most of what a crowd costs (the socket's
 * teardown, its reset to the peer: more than half the time a silent
 * stranger takes, accept a sixth): a thread of the admission's own does it
 * for the strangers pushed out, so that the thread that reads the real
 * peer gets a core's share of its own. The queue is bounded; past it, or
 * without the thread, the closes are made in place. */
struct closer {
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool running, stop;
	unsigned head, n, cap;
	int *fds;
};

struct lmt__admit {
	int ep, listen_fd;
	struct lmt__admit_limits lim;
	unsigned cap, count, free_head;
	struct list at[LMT_ADMIT_LEVELS];
	uint64_t next_due;     /* the earliest deadline, or later (UINT64_MAX: none) */
	uint64_t paused_until; /* the listener is out of the epoll set until then */
	struct lmt__admit_counts counts;
	uint64_t log_since;
	unsigned logged;
	uint64_t unlogged;
	struct closer closer;
	struct slot slot[];
};

unsigned lmt__admit_fit(unsigned max, unsigned floor)
{
	struct rlimit r;
	if (max > LMT_ADMIT_MAX)
		max = LMT_ADMIT_MAX;
	if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur != RLIM_INFINITY &&
	    r.rlim_cur / 4 < max)
		max = (unsigned)(r.rlim_cur / 4);
	return max < floor ? floor : max;
}

/* ---- the level lists ---- */

static void unlink_slot(struct lmt__admit *a, unsigned id)
{
	struct slot *s = &a->slot[id];
	struct list *l = &a->at[s->level];
	if (s->prev != NONE)
		a->slot[s->prev].next = s->next;
	else
		l->head = s->next;
	if (s->next != NONE)
		a->slot[s->next].prev = s->prev;
	else
		l->tail = s->prev;
	l->n--;
}

static void append(struct lmt__admit *a, unsigned id, enum lmt__admit_level level)
{
	struct slot *s = &a->slot[id];
	struct list *l = &a->at[level];
	s->level = (uint8_t)level;
	s->prev = l->tail;
	s->next = NONE;
	if (l->tail != NONE)
		a->slot[l->tail].next = id;
	else
		l->head = id;
	l->tail = id;
	l->n++;
}

/* ---- the closer ---- */

static void *closer_main(void *arg)
{
	struct closer *c = arg;
	int batch[64];
	pthread_mutex_lock(&c->lock);
	for (;;) {
		while (!c->n && !c->stop)
			pthread_cond_wait(&c->cond, &c->lock);
		if (!c->n)
			break;
		unsigned k = 0;
		for (; k < c->n && k < 64; k++)
			batch[k] = c->fds[(c->head + k) % c->cap];
		c->head = (c->head + k) % c->cap;
		c->n -= k;
		pthread_mutex_unlock(&c->lock);
		for (unsigned i = 0; i < k; i++)
			close(batch[i]);
		pthread_mutex_lock(&c->lock);
	}
	pthread_mutex_unlock(&c->lock);
	return NULL;
}

static void closer_start(struct closer *c, unsigned cap)
{
	c->cap = cap;
	c->fds = malloc(cap * sizeof(int));
	if (!c->fds)
		return;
	pthread_mutex_init(&c->lock, NULL);
	pthread_cond_init(&c->cond, NULL);
	c->running = lmt__thread_start(&c->thread, closer_main, c) == 0;
	if (!c->running) {
		pthread_cond_destroy(&c->cond);
		pthread_mutex_destroy(&c->lock);
		free(c->fds);
		c->fds = NULL;
	}
}

/* Close fd abortively (SO_LINGER 0 is set), on the closer's thread when it
 * can take it. */
static void close_later(struct closer *c, int fd)
{
	if (c->running) {
		pthread_mutex_lock(&c->lock);
		bool queued = c->n < c->cap;
		if (queued) {
			c->fds[(c->head + c->n++) % c->cap] = fd;
			if (c->n == 1)
				pthread_cond_signal(&c->cond);
		}
		pthread_mutex_unlock(&c->lock);
		if (queued)
			return;
	}
	close(fd);
}

/* Everything queued is closed once it returns. */
static void closer_stop(struct closer *c)
{
	if (!c->running)
		return;
	pthread_mutex_lock(&c->lock);
	c->stop = true;
	pthread_cond_signal(&c->cond);
	pthread_mutex_unlock(&c->lock);
	pthread_join(c->thread, NULL);
	pthread_cond_destroy(&c->cond);
	pthread_mutex_destroy(&c->lock);
	free(c->fds);
	c->running = false;
}

/* ---- making and freeing room ---- */

static void forget(struct lmt__admit *a, unsigned id)
{
	struct slot *s = &a->slot[id];
	unlink_slot(a, id);
	s->fd = -1;
	s->next = a->free_head;
	a->free_head = id;
	a->count--;
}

/* A stranger's connection ends with a reset: no FIN handshake to wait
 * for, no TIME_WAIT socket left behind for each one of a crowd. Accepted
 * sockets inherit it from the listener; the owner's own closes and the
 * connection it keeps go back to an orderly close. */
static void set_linger(int fd, bool abortive)
{
	struct linger lg = {.l_onoff = abortive, .l_linger = 0};
	setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
}

/* What the owner sent goes before the FIN. */
static void close_in_order(int fd)
{
	set_linger(fd, false);
	shutdown(fd, SHUT_RDWR);
	close(fd);
}

static void evict(struct lmt__admit *a, unsigned id, enum lmt__admit_why why)
{
	int fd = a->slot[id].fd;
	if (why == LMT_ADMIT_CROWDED)
		a->counts.crowded++;
	else
		a->counts.timed_out++;
	bool told = a->lim.drop(a->lim.ctx, id, why);
	forget(a, id);
	if (told)
		close_in_order(fd);
	else
		close_later(&a->closer, fd); /* abortive: SO_LINGER 0 */
}

/* Push out the connection of least progress to make room for a newcomer:
 * the oldest silent one (one found with bytes waiting is moved up instead:
 * its owner has not read them yet), else the oldest partial one. Never one
 * that sent a whole first message. */
static bool make_room(struct lmt__admit *a)
{
	unsigned id;
	while ((id = a->at[LMT_ADMIT_SILENT].head) != NONE) {
		if (lmt__admit_inq(a->slot[id].fd) > 0) {
			unlink_slot(a, id);
			append(a, id, LMT_ADMIT_PARTIAL);
			continue;
		}
		evict(a, id, LMT_ADMIT_CROWDED);
		return true;
	}
	if ((id = a->at[LMT_ADMIT_PARTIAL].head) != NONE) {
		evict(a, id, LMT_ADMIT_CROWDED);
		return true;
	}
	return false;
}

static unsigned take_slot(struct lmt__admit *a, int fd)
{
	unsigned id = a->free_head;
	struct slot *s = &a->slot[id];
	a->free_head = s->next;
	*s = (struct slot){.fd = fd, .accepted_ns = lmt__now_ns()};
	append(a, id, LMT_ADMIT_SILENT);
	a->count++;
	/* Every deadline is accepted_ns + timeout: a newcomer's is the latest. */
	if (a->next_due == UINT64_MAX)
		a->next_due = s->accepted_ns + a->lim.timeout_ns;
	return id;
}

static int watch(struct lmt__admit *a, unsigned id, int op)
{
	struct slot *s = &a->slot[id];
	struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | EPOLLET |
	                                   (s->want_write ? EPOLLOUT : 0),
	                         .data.u64 = id};
	return epoll_ctl(a->ep, op, s->fd, &ev);
}

/* A connected socket into the table, when there is room. */
static int admit_fd(struct lmt__admit *a, int fd, unsigned *id)
{
	if (a->count == a->cap && !make_room(a)) {
		a->counts.refused++;
		close_later(&a->closer, fd);
		return -LMT_EOVERFLOW;
	}
	*id = take_slot(a, fd);
	if (watch(a, *id, EPOLL_CTL_ADD) != 0) {
		forget(a, *id);
		close(fd);
		return -LMT_EIO;
	}
	a->counts.accepted++;
	return 0;
}

/* ---- the table ---- */

int lmt__admit_new(struct lmt__admit **out, int listen_fd, const struct lmt__admit_limits *lim,
                   struct lmt__net_error *e)
{
	unsigned cap = lim->max < 1 ? 1 : lim->max > LMT_ADMIT_MAX ? LMT_ADMIT_MAX : lim->max;
	struct lmt__admit *a = calloc(1, sizeof(*a) + cap * sizeof(struct slot));
	if (!a) {
		snprintf(e->msg, sizeof(e->msg), "out of memory");
		return -LMT_ENOMEM;
	}
	a->lim = *lim;
	a->cap = cap;
	a->listen_fd = listen_fd;
	a->next_due = UINT64_MAX;
	if (listen_fd >= 0)
		set_linger(listen_fd, true);
	for (int l = 0; l < LMT_ADMIT_LEVELS; l++)
		a->at[l] = (struct list){NONE, NONE, 0};
	for (unsigned i = 0; i < cap; i++) {
		a->slot[i].fd = -1;
		a->slot[i].next = i + 1 < cap ? i + 1 : NONE;
	}
	a->ep = epoll_create1(EPOLL_CLOEXEC);
	struct epoll_event ev = {.events = EPOLLIN, .data.u64 = LISTENER};
	if (a->ep < 0 || (listen_fd >= 0 && epoll_ctl(a->ep, EPOLL_CTL_ADD, listen_fd, &ev) != 0)) {
		snprintf(e->msg, sizeof(e->msg), "epoll: %s", strerror(errno));
		if (a->ep >= 0)
			close(a->ep);
		free(a);
		return -LMT_EIO;
	}
	closer_start(&a->closer, cap / 2 > 16 ? cap / 2 : 16);
	*out = a;
	return 0;
}

void lmt__admit_free(struct lmt__admit *a)
{
	if (!a)
		return;
	closer_stop(&a->closer);
	for (unsigned i = 0; i < a->cap; i++)
		if (a->slot[i].fd >= 0)
			close(a->slot[i].fd);
	close(a->ep);
	free(a);
}

unsigned lmt__admit_capacity(const struct lmt__admit *a)
{
	return a->cap;
}

unsigned lmt__admit_count(const struct lmt__admit *a)
{
	return a->count;
}

int lmt__admit_add(struct lmt__admit *a, int fd, unsigned *id)
{
	lmt__net_set_nonblock(fd, 1);
	set_linger(fd, true);
	return admit_fd(a, fd, id);
}

int lmt__admit_wait(struct lmt__admit *a, int timeout_ms, unsigned *ready, unsigned max,
                    bool *listener)
{
	*listener = false;
	uint64_t now = lmt__now_ns(), due = a->next_due;
	if (a->paused_until && now >= a->paused_until && a->listen_fd >= 0) {
		struct epoll_event lev = {.events = EPOLLIN, .data.u64 = LISTENER};
		epoll_ctl(a->ep, EPOLL_CTL_ADD, a->listen_fd, &lev);
		a->paused_until = 0;
	}
	if (a->paused_until && a->paused_until < due)
		due = a->paused_until;
	if (due != UINT64_MAX) {
		uint64_t left_ms = due > now ? (due - now) / 1000000 + 1 : 0;
		if (left_ms < (uint64_t)timeout_ms)
			timeout_ms = (int)left_ms;
	}
	struct epoll_event ev[64];
	int room = max + 1 < 64 ? (int)max + 1 : 64;
	int n = epoll_wait(a->ep, ev, room, timeout_ms);
	if (n < 0)
		return errno == EINTR ? 0 : -LMT_EIO;
	unsigned k = 0;
	for (int i = 0; i < n; i++) {
		if (ev[i].data.u64 == LISTENER) {
			*listener = true;
		} else if (k < max) {
			ready[k] = (unsigned)ev[i].data.u64;
			if (ev[i].events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR))
				a->slot[ready[k]].hup = true;
			k++;
		}
	}
	return (int)k;
}

int lmt__admit_accept(struct lmt__admit *a, unsigned *ids, unsigned max, struct lmt__net_error *e)
{
	unsigned k = 0;
	while (k < max && a->listen_fd >= 0) {
		int fd = accept4(a->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				break;
			snprintf(e->msg, sizeof(e->msg), "accept: %s", strerror(errno));
			/* Out of descriptors, say: make room rather than spin, and
			 * when there is none to make, leave the listener alone a
			 * while. */
			bool made = make_room(a);
			if (!made && a->at[LMT_ADMIT_OPENED].head != NONE) {
				evict(a, a->at[LMT_ADMIT_OPENED].head, LMT_ADMIT_CROWDED);
				made = true;
			}
			if (!made && !a->paused_until) {
				epoll_ctl(a->ep, EPOLL_CTL_DEL, a->listen_fd, NULL);
				a->paused_until = lmt__now_ns() + ACCEPT_PAUSE_NS;
			}
			return -LMT_EIO;
		}
		if (admit_fd(a, fd, &ids[k]) == 0)
			k++;
	}
	return (int)k;
}

void lmt__admit_unlisten(struct lmt__admit *a)
{
	if (a->listen_fd >= 0 && !a->paused_until)
		epoll_ctl(a->ep, EPOLL_CTL_DEL, a->listen_fd, NULL);
	a->listen_fd = -1;
	a->paused_until = 0;
}

void lmt__admit_expire(struct lmt__admit *a, uint64_t now_ns)
{
	if (now_ns < a->next_due)
		return;
	a->next_due = UINT64_MAX;
	for (unsigned i = 0; i < a->cap; i++) {
		if (a->slot[i].fd < 0)
			continue;
		uint64_t due = a->slot[i].accepted_ns + a->lim.timeout_ns;
		if (now_ns >= due)
			evict(a, i, LMT_ADMIT_TIMED_OUT);
		else if (due < a->next_due)
			a->next_due = due;
	}
}

int lmt__admit_fd(const struct lmt__admit *a, unsigned id)
{
	return id < a->cap ? a->slot[id].fd : -1;
}

enum lmt__admit_level lmt__admit_level(const struct lmt__admit *a, unsigned id)
{
	return (enum lmt__admit_level)a->slot[id].level;
}

uint64_t lmt__admit_accepted_ns(const struct lmt__admit *a, unsigned id)
{
	return a->slot[id].accepted_ns;
}

void lmt__admit_promote(struct lmt__admit *a, unsigned id, enum lmt__admit_level level)
{
	struct slot *s = &a->slot[id];
	if (s->fd < 0 || level <= s->level)
		return;
	unsigned most = level == LMT_ADMIT_OPENED   ? a->lim.opened_max
	                : level == LMT_ADMIT_PROVEN ? a->lim.proven_max
	                                            : a->cap;
	if (most < 1)
		most = 1;
	/* That level is full: its oldest had its time. */
	while (a->at[level].n >= most)
		evict(a, a->at[level].head, LMT_ADMIT_CROWDED);
	unlink_slot(a, id);
	append(a, id, level);
}

void lmt__admit_want_write(struct lmt__admit *a, unsigned id, bool on)
{
	struct slot *s = &a->slot[id];
	if (s->fd < 0 || s->want_write == on)
		return;
	s->want_write = on;
	watch(a, id, EPOLL_CTL_MOD);
}

void lmt__admit_close(struct lmt__admit *a, unsigned id, bool in_order)
{
	int fd = a->slot[id].fd;
	if (fd < 0)
		return;
	forget(a, id);
	if (in_order)
		close_in_order(fd);
	else
		close_later(&a->closer, fd);
}

int lmt__admit_release(struct lmt__admit *a, unsigned id)
{
	int fd = a->slot[id].fd;
	if (fd < 0)
		return -1;
	epoll_ctl(a->ep, EPOLL_CTL_DEL, fd, NULL);
	forget(a, id);
	set_linger(fd, false);
	return fd;
}

int lmt__admit_pending(struct lmt__admit *a, unsigned id, ssize_t got)
{
	if (got < 0)
		return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
	errno = 0;
	/* Closed, before anything or in the middle of a message. */
	if (!got || a->slot[id].hup)
		return -1;
	lmt__admit_promote(a, id, LMT_ADMIT_PARTIAL);
	return 0;
}

ssize_t lmt__admit_peek(int fd, void *buf, size_t len)
{
	ssize_t n;
	do
		n = recv(fd, buf, len, MSG_PEEK | MSG_DONTWAIT);
	while (n < 0 && errno == EINTR);
	return n;
}

size_t lmt__admit_inq(int fd)
{
	int n = 0;
	return ioctl(fd, FIONREAD, &n) == 0 && n > 0 ? (size_t)n : 0;
}

size_t lmt__admit_client_hello(const uint8_t head[LMT_ADMIT_TLS_HEAD])
{
	/* content type handshake, legacy version 3.x, a fragment's length,
	 * then the first handshake message: ClientHello (1). */
	size_t len = (size_t)head[3] << 8 | head[4];
	if (head[0] != 0x16 || head[1] != 3 || len < 4 || len > TLS_RECORD_MAX || head[5] != 1)
		return 0;
	return 5 + len;
}

bool lmt__admit_log_this(struct lmt__admit *a, uint64_t now_ns)
{
	if (!a->unlogged && now_ns - a->log_since >= LOG_WINDOW_NS) {
		a->log_since = now_ns;
		a->logged = 0;
	}
	if (a->logged < LOG_BURST) {
		a->logged++;
		return true;
	}
	a->unlogged++;
	return false;
}

uint64_t lmt__admit_unlogged(struct lmt__admit *a, uint64_t now_ns)
{
	if (!a->unlogged || now_ns - a->log_since < LOG_WINDOW_NS)
		return 0;
	uint64_t n = a->unlogged;
	a->unlogged = 0;
	a->log_since = now_ns;
	a->logged = 0;
	return n;
}

struct lmt__admit_counts lmt__admit_counts(const struct lmt__admit *a)
{
	return a->counts;
}
