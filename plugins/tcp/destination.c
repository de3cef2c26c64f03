/* Destination side of a TCP channel: listen, accept the source's connection
 * (checked by token), and place incoming writes straight into registered
 * regions from a receiver thread that acknowledges them. */
#define _GNU_SOURCE
#include "destination.h"

#include "admit.h"
#include "channel_tls.h"
#include "region.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#define HELLO_TIMEOUT_NS 2000000000ull /* a connection that says nothing is dropped */
#define PENDING_MAX 256                /* connections waited on for a hello at once */
#define PENDING_MIN 16                 /* ... whatever RLIMIT_NOFILE says */
#define PENDING_OPENED_MAX 16          /* tls=on: handshakes under way at once */
#define PENDING_ACCEPTS_PER_TURN 32    /* then the connections already in are read */
#define PENDING_READY_PER_TURN 64
#define IDLE_BACKLOG 8          /* the kernel's queue of a port not yet served */
#define DATA_BACKLOG 512        /* ... and of the port being served */
#define ACK_EVERY 16            /* placed writes per acknowledgement, at most */
#define ACK_BYTES (256u << 10)  /* placed bytes per acknowledgement, at most */
#define RECV_CHUNK (256u << 10) /* bytes per recv call, as SEND_SLICE */

/* Fill in the family, IP and port the source should connect to. */
static int advertise(lmt_endpoint *ep, struct tcp_dst_addr *a)
{
	struct lmt_instance *inst = ep->inst;
	struct sockaddr_storage ss = {0};
	socklen_t len = sizeof(ss);
	if (getsockname(ep->listen_fd, (struct sockaddr *)&ss, &len) != 0)
		return putil_error(&inst->base, LMT_EIO, "tcp channel %u: getsockname: %s",
		                   ep->channel, strerror(errno));
	bool wildcard;
	if (ss.ss_family == AF_INET) {
		struct sockaddr_in *in = (struct sockaddr_in *)&ss;
		a->family = TCP_FAMILY_IPV4;
		a->port = ntohs(in->sin_port);
		wildcard = in->sin_addr.s_addr == htonl(INADDR_ANY) &&
		           inet_pton(AF_INET, inst->base.local_host, &in->sin_addr) != 1;
		memcpy(a->ip, &in->sin_addr, 4);
	} else {
		struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
		a->family = TCP_FAMILY_IPV6;
		a->port = ntohs(in6->sin6_port);
		wildcard = IN6_IS_ADDR_UNSPECIFIED(&in6->sin6_addr) &&
		           inet_pton(AF_INET6, inst->base.local_host, &in6->sin6_addr) != 1;
		memcpy(a->ip, &in6->sin6_addr, 16);
	}
	if (wildcard)
		return putil_error(&inst->base, LMT_EINVAL,
		                   "tcp channel %u: listening on a wildcard address, and no local "
		                   "address of that family to advertise",
		                   ep->channel);
	return 0;
}

int tcp_dest_ep_open(lmt_endpoint *ep, struct lmt_blob *addr)
{
	struct lmt_instance *inst = ep->inst;
	char uri[sizeof(inst->bind_host) + 8];
	if (strchr(inst->bind_host, ':') && inst->bind_host[0] != '[')
		snprintf(uri, sizeof(uri), "[%s]:0", inst->bind_host);
	else
		snprintf(uri, sizeof(uri), "%s:0", inst->bind_host);
	struct sockaddr_storage ss;
	socklen_t len;
	struct lmt__net_error e;
	int rc = lmt__net_parse(uri, &ss, &len, &e);
	if (rc)
		return putil_error(&inst->base, -rc, "tcp channel %u: %s", ep->channel, e.msg);
	rc = lmt__net_listen((struct sockaddr *)&ss, len, IDLE_BACKLOG, &ep->listen_fd, &e);
	if (rc)
		return putil_error(&inst->base, -rc, "tcp channel %u: %s", ep->channel, e.msg);
	/* Accepted connections inherit the buffers, before the handshake
	 * fixes the window scale. */
	lmt__net_tune(ep->listen_fd, inst->nodelay, inst->buffer_size);
	struct tcp_dst_addr a = {.channel = ep->channel};
	rc = advertise(ep, &a);
	if (!rc && getrandom(&ep->token, sizeof(ep->token), 0) != (ssize_t)sizeof(ep->token))
		rc = putil_error(&inst->base, LMT_EIO, "tcp channel %u: getrandom: %s", ep->channel,
		                 strerror(errno));
	if (rc) {
		close(ep->listen_fd);
		ep->listen_fd = -1;
		return rc;
	}
	a.token = ep->token;
	tcp_dst_addr_encode(&a, addr);
	lmt__net_format((struct sockaddr *)&ss, uri, sizeof(uri));
	putil_log(&inst->base, LMT_LOG_DEBUG, "tcp channel %u: listening on %s, port %u",
	          ep->channel, uri, a.port);
	return 0;
}

/* ---- Receiver ------------------------------------------------------------ */

struct rx {
	lmt_endpoint *ep;
	uint64_t placed;        /* writes placed in memory */
	uint64_t acked;         /* writes acknowledged to the source */
	uint64_t unacked_bytes; /* bytes placed since the last acknowledgement */
	bool boundary;          /* between two messages */
	uint64_t shared_at;     /* putil_share_core's mark */
	char why[320];          /* what failed */
};

static int rx_stopping(void *arg)
{
	lmt_endpoint *ep = arg;
	return atomic_load(&ep->stopping);
}

/* Send an acknowledgement record carrying the placed count; gives up when
 * the endpoint is closing. 0 or an LMT_E* code. */
static int send_ack(struct rx *rx, uint32_t magic, int code)
{
	uint8_t rec[TCP_ACK_LEN];
	tcp_ack_encode(&(struct tcp_ack){.magic = magic, .code = code, .count = rx->placed}, rec);
	struct lmt__wait w = {.cancelled = rx_stopping, .ctx = rx->ep};
	struct lmt__net_error e;
	int rc = rx->ep->tls ? lmt__tls_send_all(rx->ep->tls, rec, sizeof(rec), &w, &e)
	                     : lmt__net_send_all(rx->ep->fd, rec, sizeof(rec), &w, &e);
	if (rc) {
		snprintf(rx->why, sizeof(rx->why), "sending acknowledgement: %s", e.msg);
		return -rc;
	}
	rx->acked = rx->placed;
	rx->unacked_bytes = 0;
	return 0;
}

/* Through TLS: records are decrypted straight into buf, a page of guest
 * RAM or a header. A closing endpoint stops mid-message, as below. */
static int recv_exact_tls(struct rx *rx, void *buf, uint64_t len)
{
	struct lmt__wait w = {.cancelled = rx_stopping, .ctx = rx->ep};
	struct lmt__net_error e;
	int rc = lmt__tls_recv_all(rx->ep->tls, buf, len, &w, &e);
	putil_share_core(&rx->shared_at);
	if (!rc)
		return 0;
	snprintf(rx->why, sizeof(rx->why), "%s",
	         rc == -LMT_ECANCELED ? "connection closed by peer" : e.msg);
	return LMT_ECONN;
}

/* Receive exactly len bytes: 0, or LMT_ECONN with the reason in rx->why. */
static int recv_exact(struct rx *rx, void *buf, uint64_t len)
{
	if (rx->ep->tls)
		return recv_exact_tls(rx, buf, len);
	uint8_t *p = buf;
	while (len) {
		size_t chunk = len < RECV_CHUNK ? (size_t)len : RECV_CHUNK;
		ssize_t n = recv(rx->ep->fd, p, chunk, MSG_WAITALL);
		putil_share_core(&rx->shared_at);
		if (n > 0) {
			p += n;
			len -= (uint64_t)n;
			/* A closing endpoint stops mid-message: the source may
			 * keep sending after shutdown(SHUT_RD). */
			if (len && atomic_load(&rx->ep->stopping))
				break;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			snprintf(rx->why, sizeof(rx->why), "recv: %s", strerror(errno));
			return LMT_ECONN;
		}
		break;
	}
	if (!len)
		return 0;
	snprintf(rx->why, sizeof(rx->why), "connection closed by peer");
	return LMT_ECONN;
}

/* Read the next header. When none is waiting yet, acknowledge what was
 * placed first: the source may be waiting for exactly that. */
static int recv_header(struct rx *rx, uint8_t *header)
{
	ssize_t n;
	if (rx->ep->tls) {
		struct lmt__net_error e;
		n = lmt__tls_recv_some(rx->ep->tls, header, TCP_HEADER_LEN, &e);
		if (n == -LMT_EAGAIN) {
			n = -1;
			errno = EAGAIN;
		} else if (n < 0) {
			snprintf(rx->why, sizeof(rx->why), "%s", e.msg);
			return LMT_ECONN;
		}
	} else {
		do
			n = recv(rx->ep->fd, header, TCP_HEADER_LEN, MSG_DONTWAIT);
		while (n < 0 && errno == EINTR);
	}
	if (n == TCP_HEADER_LEN) {
		rx->boundary = false;
		return 0;
	}
	if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
		snprintf(rx->why, sizeof(rx->why), "recv: %s", strerror(errno));
		return LMT_ECONN;
	}
	if (n == 0) {
		snprintf(rx->why, sizeof(rx->why), "connection closed by peer");
		return LMT_ECONN;
	}
	size_t got = n > 0 ? (size_t)n : 0;
	rx->boundary = got == 0;
	if (rx->placed > rx->acked) {
		int rc = send_ack(rx, TCP_MAGIC_ACK, 0);
		if (rc)
			return rc;
	}
	int rc = recv_exact(rx, header + got, TCP_HEADER_LEN - got);
	if (rc)
		return rc;
	rx->boundary = false;
	return 0;
}

/* Place writes until the source says BYE (0) or something fails (an
 * LMT_E* code, the reason in rx->why). */
static int receive_loop(struct rx *rx)
{
	for (;;) {
		rx->boundary = true;
		if (atomic_load(&rx->ep->stopping))
			return LMT_ECANCELED;
		uint8_t raw[TCP_HEADER_LEN];
		int rc = recv_header(rx, raw);
		if (rc)
			return rc;
		struct tcp_header h;
		tcp_header_decode(raw, &h);
		if (h.magic == TCP_MAGIC_BYE)
			return 0;
		if (h.magic != TCP_MAGIC_WRITE) {
			snprintf(rx->why, sizeof(rx->why), "bad header magic 0x%08x", h.magic);
			return LMT_EPROTO;
		}
		if (h.seq != rx->placed) {
			snprintf(rx->why, sizeof(rx->why),
			         "write %llu out of sequence, expected %llu",
			         (unsigned long long)h.seq, (unsigned long long)rx->placed);
			return LMT_EPROTO;
		}
		struct lmt_mr *mr = tcp_region_claim(rx->ep, h.region, h.offset, h.len, rx->why,
		                                     sizeof(rx->why));
		if (!mr)
			return LMT_EPROTO;
		rc = recv_exact(rx, mr->addr + h.offset, h.len);
		tcp_region_release(rx->ep, mr);
		if (rc)
			return rc;
		rx->placed++;
		rx->unacked_bytes += h.len;
		if (rx->placed - rx->acked >= ACK_EVERY || rx->unacked_bytes >= ACK_BYTES) {
			rc = send_ack(rx, TCP_MAGIC_ACK, 0);
			if (rc)
				return rc;
		}
	}
}

static void *dest_receiver(void *arg)
{
	lmt_endpoint *ep = arg;
	struct rx rx = {.ep = ep};
	int code = receive_loop(&rx);
	if (atomic_load(&ep->stopping)) {
		/* Closed by us between messages: an orderly end for the source. */
		if (rx.boundary && code != LMT_EPROTO)
			send_ack(&rx, TCP_MAGIC_BYE, 0);
		return NULL;
	}
	if (code == 0) {
		if (rx.placed > rx.acked)
			send_ack(&rx, TCP_MAGIC_ACK, 0);
		putil_log(&ep->inst->base, LMT_LOG_DEBUG,
		          "tcp channel %u: closed by the source after %llu "
		          "writes",
		          ep->channel, (unsigned long long)rx.placed);
		return NULL;
	}
	(void)putil_error(&ep->inst->base, code, "tcp channel %u: %s", ep->channel, rx.why);
	if (code == LMT_EPROTO)
		send_ack(&rx, TCP_MAGIC_ERROR, code);
	shutdown(ep->fd, SHUT_RDWR);
	putil_channels_set_fatal(&ep->inst->channels, -code);
	return NULL;
}

/* ---- Connection ---------------------------------------------------------- */

/* The data port takes anyone's connections until one says hello with this
 * channel and token. Their admission (common/admit.c) keeps a bounded
 * number at once and pushes out the one of least progress for a newcomer,
 * so that squatters and strangers who dribble bytes, send half a hello or
 * close at once only ever displace one another. Each connection has
 * HELLO_TIMEOUT_NS from its accept. A plaintext hello is read once it is
 * whole in the socket; with tls=on a connection gets its OpenSSL object
 * once a whole ClientHello is waiting, which a stranger without the
 * channel's key cannot get past. */

struct pending {
	lmt__tls *tls; /* tls=on: the hello comes after the handshake */
	bool tls_done;
	size_t got;
	uint8_t hello[TCP_HELLO_LEN]; /* through TLS, as it comes */
};

struct waiting {
	lmt_endpoint *ep;
	struct lmt__admit *admit;
	struct pending *p; /* by admission id */
	char last_why[300];
};

/* Log a dropped connection: the first few each second, the rest summed up. */
static void note_drop(struct waiting *wt, unsigned id, const char *why)
{
	lmt_endpoint *ep = wt->ep;
	snprintf(wt->last_why, sizeof(wt->last_why), "%s", why);
	if (!lmt__admit_log_this(wt->admit, lmt__now_ns()))
		return;
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);
	char name[80] = "?";
	if (getpeername(lmt__admit_fd(wt->admit, id), (struct sockaddr *)&ss, &len) == 0)
		lmt__net_format((struct sockaddr *)&ss, name, sizeof(name));
	putil_log(&ep->inst->base, LMT_LOG_WARN, "tcp channel %u: dropped a connection from %s: %s",
	          ep->channel, name, why);
}

static void log_unlogged(struct waiting *wt, uint64_t now)
{
	uint64_t n = lmt__admit_unlogged(wt->admit, now);
	if (n)
		putil_log(&wt->ep->inst->base, LMT_LOG_WARN,
		          "tcp channel %u: dropped %llu more connections without a hello (the "
		          "last: %s)",
		          wt->ep->channel, (unsigned long long)n, wt->last_why);
}

static void pending_free(struct pending *p)
{
	lmt__tls_free(p->tls);
	*p = (struct pending){0};
}

static void drop_pending(struct waiting *wt, unsigned id, const char *why)
{
	note_drop(wt, id, why);
	pending_free(&wt->p[id]);
	lmt__admit_close(wt->admit, id, false);
}

/* The admission closes connection id: its time is up, or room was needed.
 * Nothing is said to it. */
static bool pending_evicted(void *ctx, unsigned id, enum lmt__admit_why why)
{
	struct waiting *wt = ctx;
	char text[160];
	if (why == LMT_ADMIT_TIMED_OUT)
		snprintf(text, sizeof(text), "no hello within %llu s",
		         (unsigned long long)(HELLO_TIMEOUT_NS / 1000000000ull));
	else
		snprintf(text, sizeof(text),
		         "too many connections without a hello (%u at once), and this one had "
		         "made the least progress",
		         lmt__admit_capacity(wt->admit));
	note_drop(wt, id, text);
	pending_free(&wt->p[id]);
	return false;
}

/* Nothing whole is waiting from connection id (a peek found `got`). 0. */
static int wait_for_more(struct waiting *wt, unsigned id, ssize_t got)
{
	if (lmt__admit_pending(wt->admit, id, got) == 0)
		return 0;
	drop_pending(wt, id, errno ? strerror(errno) : "closed before its hello");
	return 0;
}

/* tls=on: drive connection id's handshake once a whole ClientHello came.
 * 1 once done, 0 to wait (or when it was dropped). */
static int handshake_pending(struct waiting *wt, unsigned id)
{
	struct pending *p = &wt->p[id];
	int fd = lmt__admit_fd(wt->admit, id);
	char why[300];
	struct lmt__net_error e = {{0}};
	if (!p->tls) {
		uint8_t head[LMT_ADMIT_TLS_HEAD];
		ssize_t n = lmt__admit_peek(fd, head, sizeof(head));
		if (n > 0 && head[0] != LMT_TLS_RECORD_HANDSHAKE) {
			drop_pending(wt, id, "it does not speak TLS, and this session has tls=on");
			return 0;
		}
		if (n < (ssize_t)sizeof(head))
			return wait_for_more(wt, id, n);
		size_t whole = lmt__admit_client_hello(head);
		if (!whole) {
			drop_pending(wt, id, "tls: its first bytes are not a ClientHello");
			return 0;
		}
		size_t inq = lmt__admit_inq(fd);
		if (inq < whole)
			return wait_for_more(wt, id, (ssize_t)inq);
		int rc = lmt__tls_new(wt->ep->tls_ctx, fd, &p->tls, &e);
		if (rc) {
			snprintf(why, sizeof(why), "tls: %s", e.msg);
			drop_pending(wt, id, why);
			return 0;
		}
	}
	short events = 0;
	int rc = lmt__tls_handshake_step(p->tls, &events, &e);
	if (rc == -LMT_EAGAIN) {
		lmt__admit_promote(wt->admit, id, LMT_ADMIT_OPENED);
		lmt__admit_want_write(wt->admit, id, events & POLLOUT);
		return 0;
	}
	if (rc) {
		snprintf(why, sizeof(why), "TLS handshake: %s", e.msg);
		drop_pending(wt, id, why);
		return 0;
	}
	p->tls_done = true;
	lmt__admit_want_write(wt->admit, id, false);
	lmt__admit_promote(wt->admit, id, LMT_ADMIT_PROVEN);
	return 1;
}

/* Read what connection id sent: 1 when its hello is right, 0 to wait for
 * more (or when it was dropped). */
static int read_pending(struct waiting *wt, unsigned id)
{
	lmt_endpoint *ep = wt->ep;
	struct pending *p = &wt->p[id];
	int fd = lmt__admit_fd(wt->admit, id);
	if (ep->tls_ctx && !p->tls_done && !handshake_pending(wt, id))
		return 0;
	if (!p->tls) {
		ssize_t n = lmt__admit_peek(fd, p->hello, sizeof(p->hello));
		if (n < (ssize_t)sizeof(p->hello))
			return wait_for_more(wt, id, n);
		ssize_t r;
		do
			r = recv(fd, p->hello, sizeof(p->hello), MSG_DONTWAIT);
		while (r < 0 && errno == EINTR);
		if (r != (ssize_t)sizeof(p->hello)) {
			drop_pending(wt, id, r < 0 ? strerror(errno) : "short read of its hello");
			return 0;
		}
		p->got = sizeof(p->hello);
	}
	while (p->got < sizeof(p->hello)) {
		struct lmt__net_error e = {{0}};
		ssize_t r = lmt__tls_recv_some(p->tls, p->hello + p->got, sizeof(p->hello) - p->got,
		                               &e);
		if (r == -LMT_EAGAIN)
			return 0;
		if (r < 0) {
			char why[300];
			snprintf(why, sizeof(why), "tls: %s", e.msg);
			drop_pending(wt, id, why);
			return 0;
		}
		p->got += (size_t)r;
	}
	const char *why = tcp_hello_check(p->hello, ep->channel, ep->token);
	if (!why)
		return 1;
	drop_pending(wt, id, why);
	return 0;
}

static void accept_pending(struct waiting *wt)
{
	unsigned ids[PENDING_ACCEPTS_PER_TURN];
	struct lmt__net_error e;
	int n = lmt__admit_accept(wt->admit, ids, PENDING_ACCEPTS_PER_TURN, &e);
	if (n < 0 && lmt__admit_log_this(wt->admit, lmt__now_ns()))
		putil_log(&wt->ep->inst->base, LMT_LOG_WARN, "tcp channel %u: %s", wt->ep->channel,
		          e.msg);
	for (int i = 0; i < n; i++)
		wt->p[ids[i]] = (struct pending){0};
}

/* Turn by turn until a connection says hello, the call's deadline passes
 * or the instance is cancelled: its descriptor (and TLS) in *out. */
static int wait_for_hello(struct waiting *wt, int *out)
{
	lmt_endpoint *ep = wt->ep;
	struct lmt_instance *inst = ep->inst;
	uint64_t deadline = putil_call_deadline(&inst->base);
	struct lmt__wait w = putil_wait(&inst->base, deadline);
	for (;;) {
		uint64_t now = lmt__now_ns();
		lmt__admit_expire(wt->admit, now);
		log_unlogged(wt, now);
		if (w.cancelled && w.cancelled(w.ctx))
			return putil_error(&inst->base, LMT_ECANCELED, "tcp channel %u: cancelled",
			                   ep->channel);
		if (now >= deadline)
			return putil_error(&inst->base, LMT_ETIMEDOUT,
			                   "tcp channel %u: waiting for the source: timed out",
			                   ep->channel);
		uint64_t ms = (deadline - now) / 1000000 + 1;
		unsigned ready[PENDING_READY_PER_TURN];
		bool incoming = false;
		int n = lmt__admit_wait(wt->admit, ms > 100 ? 100 : (int)ms, ready,
		                        PENDING_READY_PER_TURN, &incoming);
		if (n < 0)
			return putil_error(&inst->base, LMT_EIO, "tcp channel %u: epoll: %s",
			                   ep->channel, strerror(errno));
		for (int k = 0; k < n; k++) {
			unsigned id = ready[k];
			if (lmt__admit_fd(wt->admit, id) < 0 || !read_pending(wt, id))
				continue;
			ep->tls = wt->p[id].tls;
			wt->p[id].tls = NULL;
			*out = lmt__admit_release(wt->admit, id);
			if (!ep->tls)
				lmt__net_set_nonblock(*out, 0); /* TLS stays non-blocking */
			return 0;
		}
		/* Every turn: see the core's lobby (a listener's readiness can
		 * come behind a crowd's stream of events). */
		accept_pending(wt);
	}
}

/* Accept connections until one says hello with this channel and token. */
static int accept_source(lmt_endpoint *ep, int *out)
{
	struct lmt_instance *inst = ep->inst;
	struct waiting wt = {.ep = ep};
	struct lmt__admit_limits lim = {
	        .max = lmt__admit_fit(PENDING_MAX, PENDING_MIN),
	        .opened_max = PENDING_OPENED_MAX,
	        .proven_max = PENDING_OPENED_MAX,
	        .timeout_ns = HELLO_TIMEOUT_NS,
	        .drop = pending_evicted,
	        .ctx = &wt,
	};
	struct lmt__net_error e = {{0}};
	*out = -1;
	lmt__net_set_nonblock(ep->listen_fd, 1);
	/* Deep enough now that a crowd does not fill it between two turns
	 * (which would drop the source's SYN for a second); shallow while the
	 * port waited its turn, since every queued connection is the
	 * kernel's memory. */
	listen(ep->listen_fd, DATA_BACKLOG);
	int rc = lmt__admit_new(&wt.admit, ep->listen_fd, &lim, &e);
	if (rc)
		return putil_error(&inst->base, -rc, "tcp channel %u: %s", ep->channel, e.msg);
	wt.p = calloc(lmt__admit_capacity(wt.admit), sizeof(*wt.p));
	rc = wt.p ? wait_for_hello(&wt, out)
	          : putil_error(&inst->base, LMT_ENOMEM, "tcp channel %u: out of memory",
	                        ep->channel);
	log_unlogged(&wt, UINT64_MAX);
	unsigned left = 0;
	for (unsigned i = 0; wt.p && i < lmt__admit_capacity(wt.admit); i++)
		if (lmt__admit_fd(wt.admit, i) >= 0) {
			pending_free(&wt.p[i]);
			left++;
		}
	if (left)
		putil_log(&inst->base, LMT_LOG_WARN,
		          "tcp channel %u: closed %u other connection%s without a hello",
		          ep->channel, left, left == 1 ? "" : "s");
	lmt__admit_free(wt.admit);
	free(wt.p);
	return rc;
}

int tcp_dest_ep_connect(lmt_endpoint *ep, const struct lmt_blob *peer_addr)
{
	struct lmt_instance *inst = ep->inst;
	uint32_t channel;
	const char *why = tcp_src_addr_decode(peer_addr, &channel);
	if (!why && channel != ep->channel)
		why = "address of another channel";
	if (why)
		return putil_error(&inst->base, LMT_EPROTO,
		                   "tcp channel %u: bad address blob from the source: %s",
		                   ep->channel, why);
	if (ep->listen_fd < 0)
		return putil_error(&inst->base, LMT_ESTATE, "tcp channel %u: not listening",
		                   ep->channel);
	int fd = -1;
	int rc = accept_source(ep, &fd);
	if (rc)
		return rc;
	close(ep->listen_fd);
	ep->listen_fd = -1;
	lmt__net_tune(fd, inst->nodelay, inst->buffer_size);
	ep->fd = fd;
	if (lmt__thread_start(&ep->receiver, dest_receiver, ep)) {
		close(fd);
		ep->fd = -1;
		return putil_error(&inst->base, LMT_ENOMEM,
		                   "tcp channel %u: cannot start the receiver", ep->channel);
	}
	ep->receiver_started = true;
	putil_log(&inst->base, LMT_LOG_DEBUG, "tcp channel %u: source connected", ep->channel);
	if (ep->tls) {
		char how[160];
		lmt__tls_describe(ep->tls, how, sizeof(how));
		putil_log(&inst->base, LMT_LOG_INFO, "tcp channel %u: %s", ep->channel, how);
	}
	return 0;
}

void tcp_dest_ep_close(lmt_endpoint *ep)
{
	atomic_store(&ep->stopping, true);
	if (ep->receiver_started) {
		/* Wakes a receiver blocked in recv; it says BYE if idle. */
		shutdown(ep->fd, SHUT_RD);
		pthread_join(ep->receiver, NULL);
	}
	if (ep->fd >= 0)
		close(ep->fd);
	if (ep->listen_fd >= 0)
		close(ep->listen_fd);
}
