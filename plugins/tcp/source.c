/* Source side of a TCP channel: connect to the destination, queue writes, send
 * them from a sender thread, turn acknowledgements into completions. */
#define _GNU_SOURCE
#include "source.h"

#include "channel_tls.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#define SEND_BATCH 32 /* writes gathered into one sendmsg */
/* Bytes per sendmsg call, at most: a kernel built without preemption
 * (PREEMPT_NONE) lets no other thread of the core run until a call
 * returns, and a call that copies megabytes (with loopback, the
 * receiver's side too) kept the VMM's thread waiting for its core for
 * milliseconds (docs/tcp.md). */
#define SEND_SLICE (256u << 10)
#define ACK_BUFFER 64 /* acknowledgements read per recv */
/* A connection the destination dropped before its hello is made again,
 * this long after, doubling, within the call's deadline. */
#define DIAL_BACKOFF_FIRST_NS 20000000ull
#define DIAL_BACKOFF_MAX_NS 500000000ull

int tcp_source_ep_open(lmt_endpoint *ep, struct lmt_blob *addr)
{
	struct lmt_instance *inst = ep->inst;
	ep->ring = calloc(TCP_QUEUE_DEPTH, sizeof(*ep->ring));
	if (!ep->ring)
		return putil_error(&inst->base, LMT_ENOMEM, "tcp: out of memory");
	if (pthread_mutex_init(&ep->lock, NULL) == 0) {
		if (lmt__cond_init(&ep->cond) == 0) {
			ep->sync_ready = true;
			tcp_src_addr_encode(ep->channel, addr);
			return 0;
		}
		pthread_mutex_destroy(&ep->lock);
	}
	free(ep->ring);
	return putil_error(&inst->base, LMT_ENOMEM, "tcp: cannot create locks");
}

/* Mark the channel down with its first error, and wake both threads.
 * Called with ep->lock held. An error while closing is not reported. */
static void fail_locked(lmt_endpoint *ep, int code, const char *fmt, ...) LMT_PRINTF(3, 4);

static void fail_locked(lmt_endpoint *ep, int code, const char *fmt, ...)
{
	if (ep->broken)
		return;
	if (atomic_load(&ep->stopping)) {
		ep->broken = -LMT_ECANCELED;
	} else {
		char msg[256];
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(msg, sizeof(msg), fmt, ap);
		va_end(ap);
		ep->broken =
		        putil_error(&ep->inst->base, code, "tcp channel %u: %s", ep->channel, msg);
	}
	shutdown(ep->fd, SHUT_RDWR);
	pthread_cond_broadcast(&ep->cond);
}

/* Send every byte of iov[0..count); 0 or an errno value. `shared_at` is
 * the sender's putil_share_core mark. */
static int send_iov(int fd, struct iovec *iov, size_t count, uint64_t *shared_at)
{
	struct msghdr msg = {.msg_iov = iov, .msg_iovlen = count};
	for (;;) {
		while (msg.msg_iovlen && msg.msg_iov->iov_len == 0) {
			msg.msg_iov++;
			msg.msg_iovlen--;
		}
		if (!msg.msg_iovlen)
			return 0;
		/* At most SEND_SLICE bytes: the buffers that reach it, the
		 * last cut short for this call and restored after it. */
		struct msghdr part = msg;
		size_t total = 0, cut = 0;
		part.msg_iovlen = 0;
		while (part.msg_iovlen < msg.msg_iovlen && total < SEND_SLICE)
			total += msg.msg_iov[part.msg_iovlen++].iov_len;
		struct iovec *last = &msg.msg_iov[part.msg_iovlen - 1];
		if (total > SEND_SLICE) {
			cut = total - SEND_SLICE;
			last->iov_len -= cut;
		}
		ssize_t n = sendmsg(fd, &part, MSG_NOSIGNAL);
		last->iov_len += cut;
		putil_share_core(shared_at);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return n < 0 ? errno : EPIPE;
		size_t left = (size_t)n;
		while (left && left >= msg.msg_iov->iov_len) {
			left -= msg.msg_iov->iov_len;
			msg.msg_iov++;
			msg.msg_iovlen--;
		}
		if (left) {
			msg.msg_iov->iov_base = (char *)msg.msg_iov->iov_base + left;
			msg.msg_iov->iov_len -= left;
		}
	}
}

/* The same through TLS: each buffer in records of up to 16 KiB, encrypted
 * from where it lies. A shutdown of the socket ends the wait. */
static int send_iov_tls(lmt_endpoint *ep, const struct iovec *iov, size_t count,
                        uint64_t *shared_at)
{
	struct lmt__net_error e;
	for (size_t i = 0; i < count; i++) {
		int rc = lmt__tls_send_all(ep->tls, iov[i].iov_base, iov[i].iov_len, NULL, &e);
		putil_share_core(shared_at);
		if (rc)
			return rc == -LMT_ECONN ? EPIPE : EIO;
	}
	return 0;
}

static void send_bye(lmt_endpoint *ep)
{
	uint8_t h[TCP_HEADER_LEN];
	tcp_header_encode(&(struct tcp_header){.magic = TCP_MAGIC_BYE, .seq = ep->head}, h);
	if (ep->tls) {
		struct lmt__wait w = {.deadline_ns = lmt__now_ns() + 100000000ull};
		struct lmt__net_error e;
		(void)lmt__tls_send_all(ep->tls, h, sizeof(h), &w, &e); /* best effort */
		return;
	}
	ssize_t n = send(ep->fd, h, sizeof(h), MSG_NOSIGNAL | MSG_DONTWAIT);
	(void)n; /* best effort: without it the destination sees a broken stream */
}

static void *source_sender(void *arg)
{
	lmt_endpoint *ep = arg;
	uint8_t headers[SEND_BATCH][TCP_HEADER_LEN];
	struct iovec iov[2 * SEND_BATCH];
	uint64_t shared_at = 0;
	pthread_mutex_lock(&ep->lock);
	for (;;) {
		while (ep->taken == ep->head && !atomic_load(&ep->stopping) && !ep->broken)
			pthread_cond_wait(&ep->cond, &ep->lock);
		if (ep->broken)
			break;
		if (atomic_load(&ep->stopping)) {
			if (ep->taken == ep->head)
				send_bye(ep);
			break;
		}
		size_t n = 0;
		for (unsigned i = 0; i < SEND_BATCH && ep->taken < ep->head; i++, ep->taken++) {
			const struct tcp_slot *slot = &ep->ring[ep->taken % TCP_QUEUE_DEPTH];
			memcpy(headers[i], slot->header, TCP_HEADER_LEN);
			iov[n].iov_base = headers[i];
			iov[n++].iov_len = TCP_HEADER_LEN;
			iov[n].iov_base = (void *)slot->local;
			iov[n++].iov_len = slot->len;
		}
		ep->sending = true;
		pthread_mutex_unlock(&ep->lock);
		int err = ep->tls ? send_iov_tls(ep, iov, n, &shared_at)
		                  : send_iov(ep->fd, iov, n, &shared_at);
		pthread_mutex_lock(&ep->lock);
		ep->sending = false;
		if (err) {
			fail_locked(ep, LMT_ECONN, "send: %s", strerror(err));
			break;
		}
	}
	ep->sender_done = true;
	pthread_cond_broadcast(&ep->cond);
	pthread_mutex_unlock(&ep->lock);
	return NULL;
}

/* Another channel failed, so the session is over: take this one down with
 * `status` unless it is down already. Called under the channel table's
 * lock. */
static void break_channel(void *arg, int status)
{
	lmt_endpoint *ep = arg;
	pthread_mutex_lock(&ep->lock);
	if (!ep->broken) {
		ep->broken = status;
		shutdown(ep->fd, SHUT_RDWR);
		pthread_cond_broadcast(&ep->cond);
	}
	pthread_mutex_unlock(&ep->lock);
}

/* Queue completions for writes [from, to); a non-zero status also settles
 * the channel with it. */
static void complete_range(lmt_endpoint *ep, uint64_t from, uint64_t to, int status)
{
	struct putil_channels *c = &ep->inst->channels;
	pthread_mutex_lock(&c->lock);
	for (uint64_t seq = from; seq < to; seq++)
		putil_channels_complete_locked(c, ep->channel,
		                               ep->ring[seq % TCP_QUEUE_DEPTH].cookie, status);
	if (status)
		putil_channels_settle_locked(c, ep->channel, status);
	pthread_mutex_unlock(&c->lock);
}

/* Read acknowledgement records until the stream ends or breaks; completes
 * acknowledged writes as it goes. Returns 0 after an orderly BYE, or an
 * LMT_E* code with its reason in `why`. */
static int read_acks(lmt_endpoint *ep, uint64_t *acked, char *why, size_t size)
{
	uint8_t buf[ACK_BUFFER * TCP_ACK_LEN];
	size_t have = 0;
	for (;;) {
		ssize_t n;
		if (ep->tls) {
			struct lmt__net_error e;
			n = lmt__tls_recv_wait(ep->tls, buf + have, sizeof(buf) - have, NULL, &e);
			if (n <= 0) {
				snprintf(why, size, "%.190s", e.msg);
				return LMT_ECONN;
			}
		} else {
			n = recv(ep->fd, buf + have, sizeof(buf) - have, 0);
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			snprintf(why, size, "%s",
			         n ? strerror(errno) : "connection closed by peer");
			return LMT_ECONN;
		}
		have += (size_t)n;
		uint64_t count = *acked;
		bool bye = false;
		size_t off = 0;
		for (; have - off >= TCP_ACK_LEN && !bye; off += TCP_ACK_LEN) {
			struct tcp_ack a;
			tcp_ack_decode(buf + off, &a);
			if (a.magic == TCP_MAGIC_ERROR) {
				snprintf(why, size, "the destination failed the channel (error %d)",
				         a.code);
				return a.code > 0 && a.code < LMT_ERRC_COUNT ? a.code : LMT_EPROTO;
			}
			if (a.magic != TCP_MAGIC_ACK && a.magic != TCP_MAGIC_BYE) {
				snprintf(why, size, "bad acknowledgement magic 0x%08x", a.magic);
				return LMT_EPROTO;
			}
			if (a.count < count) {
				snprintf(why, size, "acknowledgement went back from %llu to %llu",
				         (unsigned long long)count, (unsigned long long)a.count);
				return LMT_EPROTO;
			}
			count = a.count;
			bye = a.magic == TCP_MAGIC_BYE;
		}
		memmove(buf, buf + off, have - off);
		have -= off;
		if (count > *acked) {
			pthread_mutex_lock(&ep->lock);
			uint64_t head = ep->head;
			pthread_mutex_unlock(&ep->lock);
			if (count > head) {
				snprintf(why, size, "%llu writes acknowledged, %llu posted",
				         (unsigned long long)count, (unsigned long long)head);
				return LMT_EPROTO;
			}
			complete_range(ep, *acked, count, 0);
			*acked = count;
		}
		if (bye)
			return 0;
	}
}

static void *source_acker(void *arg)
{
	lmt_endpoint *ep = arg;
	uint64_t acked = 0;
	char why[200];
	int code = read_acks(ep, &acked, why, sizeof(why));

	pthread_mutex_lock(&ep->lock);
	/* An orderly close with writes still unacknowledged lost them. */
	if (!code && acked < ep->head) {
		code = LMT_ECONN;
		snprintf(why, sizeof(why), "connection closed by peer");
	}
	if (code) {
		fail_locked(ep, code, "%s", why);
	} else if (!ep->broken) {
		ep->broken = -LMT_ECONN;
		shutdown(ep->fd, SHUT_RDWR);
		pthread_cond_broadcast(&ep->cond);
	}
	while (!ep->sender_done)
		pthread_cond_wait(&ep->cond, &ep->lock);
	uint64_t head = ep->head;
	int status = ep->broken;
	bool failed = code && !atomic_load(&ep->stopping);
	pthread_mutex_unlock(&ep->lock);

	if (failed)
		putil_channels_fail(&ep->inst->channels, status, break_channel);
	/* The sender is gone: the rest of the ring can be failed safely. */
	complete_range(ep, acked, head, status);
	return NULL;
}

static socklen_t to_sockaddr(const struct tcp_dst_addr *a, struct sockaddr_storage *ss)
{
	memset(ss, 0, sizeof(*ss));
	if (a->family == TCP_FAMILY_IPV4) {
		struct sockaddr_in *in = (struct sockaddr_in *)ss;
		in->sin_family = AF_INET;
		in->sin_port = htons(a->port);
		memcpy(&in->sin_addr, a->ip, 4);
		return sizeof(*in);
	}
	struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;
	in6->sin6_family = AF_INET6;
	in6->sin6_port = htons(a->port);
	memcpy(&in6->sin6_addr, a->ip, 16);
	return sizeof(*in6);
}

static int start_threads(lmt_endpoint *ep)
{
	if (lmt__thread_start(&ep->sender, source_sender, ep))
		return -LMT_ENOMEM;
	if (lmt__thread_start(&ep->acker, source_acker, ep) == 0) {
		ep->threads_started = true;
		return 0;
	}
	pthread_mutex_lock(&ep->lock);
	ep->broken = -LMT_ECANCELED;
	pthread_cond_broadcast(&ep->cond);
	pthread_mutex_unlock(&ep->lock);
	pthread_join(ep->sender, NULL);
	return -LMT_ENOMEM;
}

/* Connect, TLS with tls=on, and the hello: 0 with ep->fd (and ep->tls)
 * set, or an error with the reason in why (nothing reported yet).
 * -LMT_ECONN: the destination closed the connection before the hello went
 * out (a crowded data port can), which may be tried again. */
static int dial(lmt_endpoint *ep, const struct tcp_dst_addr *a, const struct sockaddr *to,
                socklen_t len, const struct lmt__wait *w, char *why, size_t size)
{
	struct lmt_instance *inst = ep->inst;
	struct lmt__net_error e = {{0}};
	int fd;
	int rc = lmt__net_connect(to, len, w, &fd, &e);
	if (rc) {
		snprintf(why, size, "%s", e.msg);
		return rc;
	}
	lmt__net_tune(fd, inst->nodelay, inst->buffer_size);
	ep->fd = fd;
	const char *step = "TLS handshake";
	if (ep->tls_ctx)
		rc = tcp_tls_connect(ep, w, &e);
	if (rc == -LMT_EAUTH) /* "the destination did not prove the pre-shared key ..." */
		step = "tls";
	if (!rc) {
		uint8_t hello[TCP_HELLO_LEN];
		tcp_hello_encode(ep->channel, a->token, hello);
		step = "sending hello";
		rc = ep->tls ? lmt__tls_send_all(ep->tls, hello, sizeof(hello), w, &e)
		             : lmt__net_send_all(fd, hello, sizeof(hello), w, &e);
	}
	if (rc) {
		snprintf(why, size, "%s: %s", step, e.msg);
		lmt__tls_free(ep->tls); /* the channel's context stays, for another try */
		ep->tls = NULL;
		close(fd);
		ep->fd = -1;
	}
	return rc;
}

int tcp_source_ep_connect(lmt_endpoint *ep, const struct lmt_blob *peer_addr)
{
	struct lmt_instance *inst = ep->inst;
	struct tcp_dst_addr a;
	const char *why = tcp_dst_addr_decode(peer_addr, &a);
	if (!why && a.channel != ep->channel)
		why = "address of another channel";
	if (why)
		return putil_error(&inst->base, LMT_EPROTO,
		                   "tcp channel %u: bad address blob from the destination: %s",
		                   ep->channel, why);
	if (ep->connected)
		return putil_error(&inst->base, LMT_ESTATE, "tcp channel %u: already connected",
		                   ep->channel);

	struct sockaddr_storage ss;
	socklen_t len = to_sockaddr(&a, &ss);
	uint64_t deadline = putil_call_deadline(&inst->base);
	struct lmt__wait w = putil_wait(&inst->base, deadline);
	uint64_t backoff = DIAL_BACKOFF_FIRST_NS;
	char why_not[320];
	int rc;
	for (unsigned attempt = 1;; attempt++) {
		rc = dial(ep, &a, (struct sockaddr *)&ss, len, &w, why_not, sizeof(why_not));
		if (rc != -LMT_ECONN || lmt__now_ns() + backoff >= deadline ||
		    (w.cancelled && w.cancelled(w.ctx)))
			break;
		putil_log(&inst->base, LMT_LOG_WARN,
		          "tcp channel %u: the destination dropped the connection before its "
		          "hello (%s); connecting again in %llu ms (attempt %u)",
		          ep->channel, why_not, (unsigned long long)(backoff / 1000000),
		          attempt + 1);
		putil_nap(backoff);
		backoff = backoff * 2 < DIAL_BACKOFF_MAX_NS ? backoff * 2 : DIAL_BACKOFF_MAX_NS;
	}
	if (rc)
		return putil_error(&inst->base, -rc, "tcp channel %u: %s", ep->channel, why_not);
	int fd = ep->fd;
	ep->connected = true;
	if (start_threads(ep)) {
		ep->connected = false;
		ep->fd = -1;
		close(fd);
		return putil_error(&inst->base, LMT_ENOMEM, "tcp channel %u: cannot start threads",
		                   ep->channel);
	}
	putil_channels_go_live(&inst->channels, ep->channel, break_channel);
	char name[80];
	lmt__net_format((struct sockaddr *)&ss, name, sizeof(name));
	putil_log(&inst->base, LMT_LOG_DEBUG, "tcp channel %u: connected to %s", ep->channel, name);
	return 0;
}

int tcp_source_write(lmt_endpoint *ep, const void *local, size_t len, lmt_rkey *rkey,
                     uint64_t offset, uint64_t cookie)
{
	pthread_mutex_lock(&ep->lock);
	if (!ep->connected || ep->broken) {
		int code = ep->connected ? -ep->broken : LMT_ESTATE;
		pthread_mutex_unlock(&ep->lock);
		return putil_error(&ep->inst->base, code, "tcp channel %u: %s", ep->channel,
		                   code == LMT_ESTATE ? "not connected" : "channel is down");
	}
	struct tcp_slot *slot = &ep->ring[ep->head % TCP_QUEUE_DEPTH];
	struct tcp_header h = {.magic = TCP_MAGIC_WRITE,
	                       .region = rkey->region,
	                       .offset = offset,
	                       .len = len,
	                       .seq = ep->head};
	tcp_header_encode(&h, slot->header);
	slot->local = local;
	slot->len = len;
	slot->cookie = cookie;
	ep->head++;
	pthread_cond_broadcast(&ep->cond);
	pthread_mutex_unlock(&ep->lock);
	return 0;
}

void tcp_source_ep_close(lmt_endpoint *ep)
{
	if (ep->threads_started) {
		/* An idle channel says BYE; a busy one is cut, since the peer
		 * may never drain what is queued. A send whose writes were all
		 * acknowledged is only about to return. */
		struct putil_channels *c = &ep->inst->channels;
		pthread_mutex_lock(&c->lock);
		uint64_t acked = c->ch[ep->channel].reported;
		pthread_mutex_unlock(&c->lock);
		pthread_mutex_lock(&ep->lock);
		atomic_store(&ep->stopping, true);
		bool busy = ep->taken != ep->head || (ep->sending && acked < ep->taken);
		pthread_cond_broadcast(&ep->cond);
		pthread_mutex_unlock(&ep->lock);
		if (busy)
			shutdown(ep->fd, SHUT_RDWR);
		pthread_join(ep->sender, NULL);
		shutdown(ep->fd, SHUT_RDWR);
		pthread_join(ep->acker, NULL);
	}
	if (ep->fd >= 0)
		close(ep->fd);
	if (ep->sync_ready) {
		pthread_cond_destroy(&ep->cond);
		pthread_mutex_destroy(&ep->lock);
	}
	free(ep->ring);
}
