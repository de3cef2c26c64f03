/* The control connection: one reliable ordered stream per session that
 * carries every control message (docs/protocol.md). A service thread owns
 * its reading side from the moment it is connected: it answers and sends
 * keep-alives whether or not the VMM is inside an lmt call, takes in the
 * peer's ERROR, notices a peer that went quiet or away, and queues every
 * other message for the engine, which takes them with lmt__ctrl_recv.
 * Room: control; may use: base, wire, session. */
#define _GNU_SOURCE
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bytes.h"
#include "error.h"
#include "peer.h"
#include "session.h"
#include "sync.h"
#include "control.h"

/* Messages queued beyond this many bytes wait in the socket: the peer is
 * then held back by TCP, however much it sends. */
#define INBOX_MAX_BYTES (2 * (size_t)LMT_PROTO_MAX_PAYLOAD)
/* A hang-up is looked for at most this often by lmt__peer_gone. */
#define PEER_CHECK_NS 10000000ull

struct ctrl_msg {
	struct ctrl_msg *next;
	/* unix: the descriptors that came with the message (SCM_RIGHTS) */
	int *fds;
	unsigned nfds;
	bool fds_overflow;
	struct lmt_msg_header h;
	uint8_t payload[];
};

struct lmt__ctrl {
	struct lmt_session *s;
	pthread_t thread;
	int wake_fd; /* eventfd: the thread is to stop */
	atomic_bool stop;
	pthread_mutex_t send_lock; /* one message at a time on the socket */
	pthread_mutex_t lock;      /* everything below */
	pthread_cond_t cond;       /* broadcast on every change */
	struct ctrl_msg *head, *tail;
	size_t queued; /* payload bytes in the inbox */
	int error;     /* -LMT_E* once the connection failed */
	char why[LMT_PROTO_MAX_TEXT + 96];
	bool closing; /* the peer may now close: no failure */
	bool told;    /* the failure is the peer's own ERROR */
	bool alone;   /* `why` says it all (the peer's ERROR, a stranger) */
	bool heard;   /* a whole message came: the peer speaks lmt */
	uint64_t last_rx_ns, last_tx_ns;
};

static const char *peer_name(const struct lmt_session *s)
{
	return s->role == LMT_ROLE_SOURCE ? "destination" : "source";
}

static uint64_t ping_interval(const struct lmt_session *s)
{
	uint64_t t = s->idle_timeout_ns / 4;
	return t < 1000000000ull ? t : 1000000000ull;
}

/* Whether the connection ended with the peer's own ERROR. */
static bool ctrl_told(struct lmt_session *s)
{
	struct lmt__ctrl *c = s->ctrl;
	if (!c)
		return false;
	pthread_mutex_lock(&c->lock);
	bool told = c->told;
	pthread_mutex_unlock(&c->lock);
	return told;
}

/* Gone, and every message it sent before was taken by the engine: a
 * message still queued may explain the departure better, unless the peer
 * said why itself (its ERROR). */
bool lmt__peer_gone(struct lmt_session *s)
{
	if (atomic_load(&s->peer_gone))
		return !lmt__ctrl_queued(s) || ctrl_told(s);
	/* While the service thread runs, only it says so (ctrl_failed), once it
	 * has read up to the hang-up and queued every message before it. A
	 * hang-up seen on the socket here may still have messages in front of
	 * it, unread or in the thread's hands. */
	if (s->ctrl)
		return false;
	uint64_t now = lmt__now(), last = atomic_load(&s->peer_checked_ns);
	int fd = s->ctrl_fd;
	if (fd < 0 || now - last < PEER_CHECK_NS ||
	    !atomic_compare_exchange_strong(&s->peer_checked_ns, &last, now))
		return false;
	struct pollfd p = {.fd = fd, .events = POLLRDHUP};
	if (poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)))
		atomic_store(&s->peer_gone, 1);
	return atomic_load(&s->peer_gone) && !lmt__ctrl_queued(s);
}

static int wait_cancelled(void *ctx)
{
	return lmt__is_cancelled(ctx);
}

struct lmt__wait lmt__wait_until(struct lmt_session *s, uint64_t deadline_ns)
{
	return (struct lmt__wait){
	        .deadline_ns = deadline_ns, .cancelled = wait_cancelled, .ctx = s};
}

/* The connection's bytes, through TLS with tls=on. */
static int ctrl_write(struct lmt_session *s, const void *buf, size_t len, const struct lmt__wait *w,
                      struct lmt__net_error *e)
{
	if (s->ctrl_tls)
		return lmt__tls_send_all(s->ctrl_tls, buf, len, w, e);
	return lmt__net_send_all(s->ctrl_fd, buf, len, w, e);
}

/* Over unix: (never inside TLS) `sink` keeps the descriptors passed. */
static int ctrl_read(struct lmt_session *s, void *buf, size_t len, const struct lmt__wait *w,
                     struct lmt__net_error *e, struct lmt__fd_sink *sink)
{
	if (s->ctrl_tls)
		return lmt__tls_recv_all(s->ctrl_tls, buf, len, w, e);
	return lmt__net_recv_fds(s->ctrl_fd, buf, len, s->ctrl_unix ? sink : NULL, w, e);
}

static void close_fds(int *fds, unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		close(fds[i]);
}

static void msg_free(struct ctrl_msg *m)
{
	if (!m)
		return;
	close_fds(m->fds, m->nfds);
	free(m->fds);
	free(m);
}

/* The descriptors of a message read, now the message's. */
static int attach_fds(struct ctrl_msg *m, struct lmt__fd_sink *sink)
{
	m->fds_overflow = sink->overflow;
	if (!sink->count)
		return 0;
	m->fds = malloc(sink->count * sizeof(int));
	if (!m->fds) {
		close_fds(sink->fds, sink->count);
		return -LMT_ENOMEM;
	}
	memcpy(m->fds, sink->fds, sink->count * sizeof(int));
	m->nfds = sink->count;
	return 0;
}

/* ---- the service thread ---- */

/* Record the connection's first failure (the thread's own wording). */
static void ctrl_failed(struct lmt__ctrl *c, int code, const char *fmt, ...) LMT_PRINTF(3, 4);

static void ctrl_failed(struct lmt__ctrl *c, int code, const char *fmt, ...)
{
	char why[sizeof(c->why)];
	pthread_mutex_lock(&c->lock);
	bool first = !c->error, orderly = c->closing;
	if (first) {
		c->error = -(code < 0 ? -code : code);
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(c->why, sizeof(c->why), fmt, ap);
		va_end(ap);
	}
	code = c->error;
	memcpy(why, c->why, sizeof(why));
	pthread_cond_broadcast(&c->cond);
	pthread_mutex_unlock(&c->lock);
	atomic_store(&c->s->peer_gone, 1);
	if (first && !orderly)
		lmt__session_async_failure(c->s, code, why);
}

static int send_locked(struct lmt__ctrl *c, const uint8_t *data, size_t len, uint64_t deadline_ns,
                       struct lmt__net_error *e)
{
	struct lmt__wait w = lmt__wait_until(c->s, deadline_ns);
	pthread_mutex_lock(&c->send_lock);
	int rc = ctrl_write(c->s, data, len, &w, e);
	pthread_mutex_unlock(&c->send_lock);
	if (!rc) {
		pthread_mutex_lock(&c->lock);
		c->last_tx_ns = lmt__now();
		pthread_mutex_unlock(&c->lock);
	}
	return rc;
}

static void send_keepalive(struct lmt__ctrl *c, uint16_t type)
{
	uint8_t msg[LMT_PROTO_HEADER_SIZE];
	struct lmt_buf b = {.data = msg, .cap = sizeof(msg)};
	struct lmt__net_error e;
	if (lmt__enc_empty(&b, type) == 0 &&
	    send_locked(c, msg, b.len, lmt__now() + c->s->idle_timeout_ns, &e))
		ctrl_failed(c, LMT_ECONN, "sending %s: control connection to the %s: %s",
		            lmt__msg_name(type), peer_name(c->s), e.msg);
}

static int thread_stopping(void *ctx)
{
	struct lmt__ctrl *c = ctx;
	return atomic_load(&c->stop);
}

/* The peer's ERROR: its reason becomes the connection's failure, by the
 * rule of peer.c. */
static void take_error(struct lmt__ctrl *c, const struct ctrl_msg *m)
{
	struct lmt_msg_status st;
	struct lmt_error err = {0};
	if (lmt__dec_status(m->payload, m->h.length, LMT_MSG_ERROR, &st, &err)) {
		ctrl_failed(c, LMT_EPROTO, "%s", err.message);
		return;
	}
	char why[sizeof(c->why)];
	int code = lmt__peer_ended(c->s, &st, why, sizeof(why));
	pthread_mutex_lock(&c->lock);
	c->told = c->alone = !c->error;
	pthread_mutex_unlock(&c->lock);
	ctrl_failed(c, code, "%s", why);
}

/* A header that does not decode: a peer that never sent a whole message
 * may not speak lmt at all, and is named with what it sent. */
static void bad_header(struct lmt__ctrl *c, const uint8_t *hdr, int code, const char *why)
{
	pthread_mutex_lock(&c->lock);
	bool heard = c->heard;
	pthread_mutex_unlock(&c->lock);
	if (heard || c->s->role != LMT_ROLE_SOURCE) {
		ctrl_failed(c, code, "%s", why);
		return;
	}
	char stranger[sizeof(c->why)];
	lmt__peer_not_lmt(c->s, c->s->ctrl_tls ? -1 : c->s->ctrl_fd, hdr, LMT_PROTO_HEADER_SIZE,
	                  stranger, sizeof(stranger));
	pthread_mutex_lock(&c->lock);
	c->alone = !c->error;
	pthread_mutex_unlock(&c->lock);
	ctrl_failed(c, LMT_EPROTO, "%s", stranger);
}

/* Read one whole message; NULL after recording why not. */
static struct ctrl_msg *read_message(struct lmt__ctrl *c)
{
	struct lmt_session *s = c->s;
	uint8_t hdr[LMT_PROTO_HEADER_SIZE];
	struct lmt__net_error e;
	struct lmt__wait w = {.deadline_ns = lmt__now() + s->idle_timeout_ns,
	                      .cancelled = thread_stopping,
	                      .ctx = c};
	int fds[LMT_NET_MAX_FDS];
	struct lmt__fd_sink sink = {.fds = fds, .cap = LMT_NET_MAX_FDS};
	int rc = ctrl_read(s, hdr, sizeof(hdr), &w, &e, &sink);
	struct lmt_msg_header h;
	struct lmt_error err = {0};
	if (!rc && (rc = lmt__dec_header(hdr, sizeof(hdr), &h, &err))) {
		close_fds(fds, sink.count);
		bad_header(c, hdr, rc, err.message);
		return NULL;
	}
	struct ctrl_msg *m = rc ? NULL : calloc(1, sizeof(*m) + h.length);
	if (!rc && !m) {
		close_fds(fds, sink.count);
		ctrl_failed(c, LMT_ENOMEM, "out of memory for a %u-byte %s", h.length,
		            lmt__msg_name(h.type));
		return NULL;
	}
	if (!rc) {
		m->h = h;
		w.deadline_ns = lmt__now() + s->idle_timeout_ns;
		rc = ctrl_read(s, m->payload, h.length, &w, &e, &sink);
	}
	if (!m)
		close_fds(fds, sink.count);
	else if (attach_fds(m, &sink) && !rc) {
		rc = -LMT_ENOMEM;
		snprintf(e.msg, sizeof(e.msg), "out of memory for the descriptors passed");
	}
	if (rc) {
		msg_free(m);
		pthread_mutex_lock(&c->lock);
		bool orderly = c->closing;
		pthread_mutex_unlock(&c->lock);
		if (rc == -LMT_ECANCELED)
			return NULL; /* stopping */
		if (orderly && rc == -LMT_ECONN)
			ctrl_failed(c, LMT_ECONN, "the %s closed the control connection",
			            peer_name(s));
		else if (rc == -LMT_ETIMEDOUT)
			ctrl_failed(c, rc, "the %s said nothing for too long", peer_name(s));
		else
			ctrl_failed(c, rc, "control connection to the %s: %s", peer_name(s), e.msg);
		return NULL;
	}
	pthread_mutex_lock(&c->lock);
	c->last_rx_ns = lmt__now();
	c->heard = true;
	pthread_mutex_unlock(&c->lock);
	return m;
}

/* Queue a message for the engine, holding back while the inbox is full. */
static void enqueue(struct lmt__ctrl *c, struct ctrl_msg *m)
{
	pthread_mutex_lock(&c->lock);
	while (c->queued && c->queued + m->h.length > INBOX_MAX_BYTES && !atomic_load(&c->stop))
		lmt__cond_wait_slice(&c->cond, &c->lock, UINT64_MAX);
	if (c->tail)
		c->tail->next = m;
	else
		c->head = m;
	c->tail = m;
	c->queued += m->h.length;
	if (m->h.type == LMT_MSG_COMPLETE_ACK)
		c->closing = true; /* the destination closes after it */
	pthread_cond_broadcast(&c->cond);
	pthread_mutex_unlock(&c->lock);
}

/* What to wait for next: the time until a ping is due, or the peer's
 * silence turns into a failure, whichever is sooner; at most 100 ms. */
static int poll_timeout_ms(struct lmt__ctrl *c)
{
	struct lmt_session *s = c->s;
	pthread_mutex_lock(&c->lock);
	uint64_t now = lmt__now();
	uint64_t ping_at = c->last_tx_ns + ping_interval(s);
	uint64_t quiet_at = c->last_rx_ns + s->idle_timeout_ns;
	pthread_mutex_unlock(&c->lock);
	uint64_t at = ping_at < quiet_at ? ping_at : quiet_at;
	uint64_t ms = at > now ? (at - now) / 1000000 + 1 : 0;
	return ms > 100 ? 100 : (int)ms;
}

static void *service(void *arg)
{
	struct lmt__ctrl *c = arg;
	struct lmt_session *s = c->s;
	while (!atomic_load(&c->stop)) {
		struct pollfd p[2] = {{.fd = s->ctrl_fd, .events = POLLIN},
		                      {.fd = c->wake_fd, .events = POLLIN}};
		/* Records OpenSSL already decrypted or read ahead are not seen
		 * by poll. */
		bool buffered = s->ctrl_tls && lmt__tls_pending(s->ctrl_tls);
		int n = buffered ? 1 : poll(p, 2, poll_timeout_ms(c));
		if (buffered)
			p[0].revents = POLLIN;
		if (atomic_load(&c->stop))
			break;
		pthread_mutex_lock(&c->lock);
		int failed = c->error;
		uint64_t quiet = lmt__now() - c->last_rx_ns;
		bool ping = lmt__now() - c->last_tx_ns >= ping_interval(s);
		pthread_mutex_unlock(&c->lock);
		if (failed)
			break;
		if (n > 0 && (p[0].revents & (POLLIN | POLLHUP | POLLERR))) {
			struct ctrl_msg *m = read_message(c);
			if (!m)
				break;
			if (m->h.type == LMT_MSG_PING) {
				send_keepalive(c, LMT_MSG_PONG);
				msg_free(m);
			} else if (m->h.type == LMT_MSG_PONG) {
				msg_free(m);
			} else if (m->h.type == LMT_MSG_ERROR) {
				take_error(c, m);
				msg_free(m);
				break;
			} else {
				enqueue(c, m);
			}
			continue;
		}
		if (quiet > s->idle_timeout_ns) {
			ctrl_failed(c, LMT_ETIMEDOUT, "the %s said nothing for %llu ms",
			            peer_name(s),
			            (unsigned long long)(s->idle_timeout_ns / 1000000));
			break;
		}
		if (ping)
			send_keepalive(c, LMT_MSG_PING);
	}
	return NULL;
}

int lmt__ctrl_start(struct lmt_session *s)
{
	struct lmt__ctrl *c = calloc(1, sizeof(*c));
	if (!c)
		return lmt__fail(s, LMT_ENOMEM, "out of memory");
	c->s = s;
	c->last_rx_ns = c->last_tx_ns = lmt__now();
	c->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	int rc = c->wake_fd < 0 ? -LMT_EIO : 0;
	if (!rc && pthread_mutex_init(&c->send_lock, NULL) == 0) {
		if (pthread_mutex_init(&c->lock, NULL) == 0) {
			if (lmt__cond_init(&c->cond) == 0) {
				s->ctrl = c;
				if (lmt__thread_start(&c->thread, service, c) == 0)
					return 0;
				s->ctrl = NULL;
				pthread_cond_destroy(&c->cond);
			}
			pthread_mutex_destroy(&c->lock);
		}
		pthread_mutex_destroy(&c->send_lock);
	}
	if (c->wake_fd >= 0)
		close(c->wake_fd);
	free(c);
	return lmt__fail(s, LMT_ENOMEM, "cannot start the control connection's thread");
}

void lmt__ctrl_expect_close(struct lmt_session *s)
{
	struct lmt__ctrl *c = s->ctrl;
	if (!c)
		return;
	pthread_mutex_lock(&c->lock);
	c->closing = true;
	pthread_mutex_unlock(&c->lock);
}

static void ctrl_stop(struct lmt_session *s)
{
	struct lmt__ctrl *c = s->ctrl;
	if (!c)
		return;
	atomic_store(&c->stop, true);
	uint64_t one = 1;
	if (write(c->wake_fd, &one, sizeof(one)) < 0) {
		/* The thread still sees `stop` within its poll slice. */
	}
	pthread_mutex_lock(&c->lock);
	pthread_cond_broadcast(&c->cond);
	pthread_mutex_unlock(&c->lock);
	pthread_join(c->thread, NULL);
	while (c->head) {
		struct ctrl_msg *m = c->head;
		c->head = m->next;
		msg_free(m);
	}
	close(c->wake_fd);
	pthread_cond_destroy(&c->cond);
	pthread_mutex_destroy(&c->lock);
	pthread_mutex_destroy(&c->send_lock);
	free(c);
	s->ctrl = NULL;
}

void lmt__ctrl_close(struct lmt_session *s)
{
	ctrl_stop(s);
	lmt__ctrl_drop_fds(s);
	lmt__tls_free(s->ctrl_tls);
	s->ctrl_tls = NULL;
	if (s->ctrl_fd >= 0) {
		shutdown(s->ctrl_fd, SHUT_RDWR);
		close(s->ctrl_fd);
		s->ctrl_fd = -1;
	}
}

/* ---- what the engines call ---- */

static int net_fail(struct lmt_session *s, int rc, const char *what, const struct lmt__net_error *e)
{
	if (rc == -LMT_ECANCELED)
		return lmt__fail(s, rc, "%s: cancelled", what);
	if (rc == -LMT_ETIMEDOUT)
		return lmt__fail(s, rc, "%s: the %s said nothing for too long", what, peer_name(s));
	return lmt__fail(s, rc, "%s: control connection to the %s: %s", what, peer_name(s), e->msg);
}

/* The connection's failure, as the session's. Called with c->lock held. */
static int connection_failed(struct lmt_session *s, const char *what)
{
	struct lmt__ctrl *c = s->ctrl;
	if (c->told && c->error == -LMT_EPEER)
		return lmt__fail_peer(s, c->why);
	if (c->alone)
		return lmt__fail(s, c->error, "%s", c->why);
	return lmt__fail(s, c->error, "%s: %s", what, c->why);
}

int lmt__ctrl_send(struct lmt_session *s)
{
	return lmt__ctrl_send_by(s, lmt__now() + s->idle_timeout_ns);
}

int lmt__ctrl_send_by(struct lmt_session *s, uint64_t deadline)
{
	struct lmt__net_error e;
	uint16_t type = lmt__get16(s->out.data);
	int rc;
	if (s->ctrl) {
		rc = send_locked(s->ctrl, s->out.data, s->out.len, deadline, &e);
	} else {
		struct lmt__wait w = lmt__wait_until(s, deadline);
		rc = ctrl_write(s, s->out.data, s->out.len, &w, &e);
	}
	return rc ? net_fail(s, rc, lmt__msg_name(type), &e) : 0;
}

int lmt__ctrl_send_raw(struct lmt_session *s, const struct lmt_buf *b, uint64_t deadline)
{
	struct lmt__net_error e;
	return s->ctrl ? send_locked(s->ctrl, b->data, b->len, deadline, &e) : -LMT_ESTATE;
}

int lmt__ctrl_send_fds(struct lmt_session *s, const int *fds, unsigned count)
{
	struct lmt__ctrl *c = s->ctrl;
	struct lmt__net_error e;
	if (!c || !s->ctrl_unix || s->ctrl_tls)
		return lmt__fail(s, LMT_ESTATE,
		                 "passing descriptors: not over a plain unix socket");
	struct lmt__wait w = lmt__wait_until(s, lmt__now() + s->idle_timeout_ns);
	pthread_mutex_lock(&c->send_lock);
	int rc = lmt__net_send_fds(s->ctrl_fd, s->out.data, s->out.len, fds, count, &w, &e);
	pthread_mutex_unlock(&c->send_lock);
	return rc ? net_fail(s, rc, lmt__msg_name(lmt__get16(s->out.data)), &e) : 0;
}

int lmt__ctrl_send_empty(struct lmt_session *s, uint16_t type)
{
	int rc = lmt__enc_empty(&s->out, type);
	return rc ? lmt__fail(s, rc, "encoding %s", lmt__msg_name(type)) : lmt__ctrl_send(s);
}

void lmt__ctrl_send_error(struct lmt_session *s, const struct lmt_msg_status *st)
{
	if (s->ctrl_fd < 0 || lmt__enc_status(&s->out, LMT_MSG_ERROR, st))
		return;
	/* Best effort and brief: the session is over either way. */
	struct lmt__net_error e;
	uint64_t deadline = lmt__now_ns() + 200 * 1000000ull;
	if (s->ctrl) {
		send_locked(s->ctrl, s->out.data, s->out.len, deadline, &e);
	} else {
		struct lmt__wait w = {.deadline_ns = deadline};
		ctrl_write(s, s->out.data, s->out.len, &w, &e);
	}
}

void lmt__ctrl_drop_fds(struct lmt_session *s)
{
	close_fds(s->in_fds, s->in_nfds);
	free(s->in_fds);
	s->in_fds = NULL;
	s->in_nfds = 0;
}

/* Descriptors come with FD_HANDOVER only, and go to the engine with it;
 * anywhere else they are closed and the message refused. */
static int take_fds(struct lmt_session *s, struct ctrl_msg *m)
{
	lmt__ctrl_drop_fds(s);
	bool passed = m->nfds || m->fds_overflow;
	if (passed && m->h.type != LMT_MSG_FD_HANDOVER) {
		unsigned n = m->nfds;
		uint16_t type = m->h.type;
		msg_free(m);
		return lmt__fail(s, LMT_EPROTO, "the %s passed %u descriptor(s) with %s",
		                 peer_name(s), n, lmt__msg_name(type));
	}
	if (m->fds_overflow) {
		msg_free(m);
		return lmt__fail(s, LMT_EPROTO,
		                 "FD_HANDOVER: the %s passed more than %u descriptors",
		                 peer_name(s), LMT_NET_MAX_FDS);
	}
	s->in_fds = m->fds;
	s->in_nfds = m->nfds;
	m->fds = NULL;
	m->nfds = 0;
	msg_free(m);
	return 0;
}

/* A wait for `what` that reached its deadline, `waited` ns after it
 * began: said as it was, silence or keep-alives only. Called with c->lock
 * held. */
static int recv_expired(struct lmt_session *s, const char *what, uint64_t waited)
{
	struct lmt__ctrl *c = s->ctrl;
	uint64_t quiet = lmt__now() - c->last_rx_ns;
	unsigned long long ms = (waited + 500000) / 1000000;
	if (quiet >= waited)
		return lmt__fail(s, LMT_ETIMEDOUT,
		                 "waiting for %s: the %s said nothing for %llu ms", what,
		                 peer_name(s), (unsigned long long)(quiet / 1000000));
	return lmt__fail(s, LMT_ETIMEDOUT,
	                 "waiting for %s: the %s sent nothing but keep-alives for %llu ms", what,
	                 peer_name(s), ms);
}

static int recv_until(struct lmt_session *s, struct lmt_msg_header *h, uint64_t deadline_ns,
                      const char *what)
{
	struct lmt__ctrl *c = s->ctrl;
	if (!c)
		return lmt__fail(s, LMT_ESTATE, "waiting for %s: not connected", what);
	uint64_t began = lmt__now();
	pthread_mutex_lock(&c->lock);
	while (!c->head && !c->error) {
		if (lmt__is_cancelled(s)) {
			pthread_mutex_unlock(&c->lock);
			return lmt__fail(s, LMT_ECANCELED, "waiting for %s: cancelled", what);
		}
		if (lmt__now() >= deadline_ns) {
			int rc = recv_expired(s, what,
			                      deadline_ns > began ? deadline_ns - began : 0);
			pthread_mutex_unlock(&c->lock);
			return rc;
		}
		lmt__cond_wait_slice(&c->cond, &c->lock, deadline_ns);
	}
	struct ctrl_msg *m = c->head;
	if (!m) {
		char where[64];
		snprintf(where, sizeof(where), "waiting for %s", what);
		int rc = connection_failed(s, where);
		pthread_mutex_unlock(&c->lock);
		return rc;
	}
	c->head = m->next;
	if (!c->head)
		c->tail = NULL;
	c->queued -= m->h.length;
	pthread_cond_broadcast(&c->cond);
	pthread_mutex_unlock(&c->lock);
	*h = m->h;
	memcpy(s->in, m->payload, m->h.length);
	return take_fds(s, m);
}

int lmt__ctrl_recv(struct lmt_session *s, struct lmt_msg_header *h, uint64_t deadline_ns)
{
	return recv_until(s, h, deadline_ns, "a control message");
}

int lmt__ctrl_expect(struct lmt_session *s, uint16_t want, uint64_t deadline_ns,
                     struct lmt_msg_header *h)
{
	int rc = recv_until(s, h, deadline_ns, lmt__msg_name(want));
	if (rc || h->type == want)
		return rc;
	return lmt__fail(s, LMT_EPROTO, "expected %s from the %s, got %s", lmt__msg_name(want),
	                 peer_name(s), lmt__msg_name(h->type));
}

bool lmt__ctrl_wait(struct lmt_session *s, uint64_t deadline_ns)
{
	struct lmt__ctrl *c = s->ctrl;
	if (!c)
		return false;
	pthread_mutex_lock(&c->lock);
	while (!c->head && !c->error && !lmt__is_cancelled(s) && lmt__now() < deadline_ns)
		lmt__cond_wait_slice(&c->cond, &c->lock, deadline_ns);
	bool pending = c->head != NULL || c->error != 0;
	pthread_mutex_unlock(&c->lock);
	return pending;
}

/* Bytes the service thread has not read yet, in the socket (encrypted
 * ones with tls=on: what OpenSSL already holds, the thread takes at once,
 * and only the thread may touch its SSL object). */
static bool unread(struct lmt_session *s)
{
	int n = 0;
	return ioctl(s->ctrl_fd, FIONREAD, &n) == 0 && n > 0;
}

void lmt__ctrl_settle(struct lmt_session *s, uint64_t quiet_ns, uint64_t deadline_ns)
{
	struct lmt__ctrl *c = s->ctrl;
	if (!c)
		return;
	/* The peer sends its ERROR before it tears its transport down, so by
	 * the time a channel broke here the ERROR has come, or is about to:
	 * wait for the thread to read what came, and a little for what is on
	 * its way over a network (`quiet_ns`), no longer. */
	uint64_t quiet = lmt__now() + quiet_ns;
	pthread_mutex_lock(&c->lock);
	while (!c->error && lmt__now() < deadline_ns) {
		if (lmt__now() >= quiet && !unread(s))
			break;
		lmt__cond_wait_slice(&c->cond, &c->lock, lmt__deadline(1000000));
	}
	if (c->told && c->error == -LMT_EPEER)
		lmt__fail_peer(s, c->why);
	pthread_mutex_unlock(&c->lock);
}

uint64_t lmt__ctrl_last_heard(struct lmt_session *s)
{
	struct lmt__ctrl *c = s->ctrl;
	if (!c)
		return 0;
	pthread_mutex_lock(&c->lock);
	uint64_t at = c->last_rx_ns;
	pthread_mutex_unlock(&c->lock);
	return at;
}

bool lmt__ctrl_queued(struct lmt_session *s)
{
	struct lmt__ctrl *c = s->ctrl;
	if (!c)
		return false;
	pthread_mutex_lock(&c->lock);
	bool queued = c->head != NULL;
	pthread_mutex_unlock(&c->lock);
	return queued;
}

bool lmt__ctrl_pending(struct lmt_session *s)
{
	struct lmt__ctrl *c = s->ctrl;
	if (!c)
		return false;
	pthread_mutex_lock(&c->lock);
	bool pending = c->head != NULL || c->error != 0;
	pthread_mutex_unlock(&c->lock);
	return pending;
}

int lmt__ctrl_failure(struct lmt_session *s)
{
	struct lmt__ctrl *c = s->ctrl;
	if (!c)
		return 0;
	pthread_mutex_lock(&c->lock);
	int rc = c->error ? connection_failed(s, "control connection") : 0;
	pthread_mutex_unlock(&c->lock);
	return rc;
}

int lmt__ctrl_check(struct lmt_session *s)
{
	struct lmt__ctrl *c = s->ctrl;
	if (!c)
		return 0;
	pthread_mutex_lock(&c->lock);
	int rc = c->error && !c->head ? connection_failed(s, "control connection") : 0;
	pthread_mutex_unlock(&c->lock);
	return rc;
}
