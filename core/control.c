/* The control connection: one reliable ordered stream per session that
 * carries every control message (docs/protocol.md), keep-alives both ways,
 * and the peer's ERROR message turned into the session's error. */
#define _GNU_SOURCE
#include <poll.h>

#include "bytes.h"
#include "error.h"
#include "session.h"

static const char *peer_name(const struct lmt_session *s)
{
	return s->role == LMT_ROLE_SOURCE ? "destination" : "source";
}

/* A hang-up is looked for at most this often. */
#define PEER_CHECK_NS 10000000ull

bool lmt__peer_gone(struct lmt_session *s)
{
	if (atomic_load(&s->peer_gone))
		return true;
	uint64_t now = lmt__now(), last = atomic_load(&s->peer_checked_ns);
	int fd = s->ctrl_fd;
	if (fd < 0 || now - last < PEER_CHECK_NS ||
	    !atomic_compare_exchange_strong(&s->peer_checked_ns, &last, now))
		return false;
	struct pollfd p = {.fd = fd, .events = POLLRDHUP};
	if (poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)))
		atomic_store(&s->peer_gone, 1);
	return atomic_load(&s->peer_gone) != 0;
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

static int net_fail(struct lmt_session *s, int rc, const char *what, const struct lmt__net_error *e)
{
	if (rc == -LMT_ECANCELED)
		return lmt__fail(s, rc, "%s: cancelled", what);
	if (rc == -LMT_ETIMEDOUT)
		return lmt__fail(s, rc, "%s: the %s said nothing for too long", what, peer_name(s));
	return lmt__fail(s, rc, "%s: control connection to the %s: %s", what, peer_name(s), e->msg);
}

int lmt__ctrl_send(struct lmt_session *s)
{
	struct lmt__net_error e;
	struct lmt__wait w = lmt__wait_until(s, lmt__now() + s->idle_timeout_ns);
	uint16_t type = lmt__get16(s->out.data);
	int rc = lmt__net_send_all(s->ctrl_fd, s->out.data, s->out.len, &w, &e);
	if (rc)
		return net_fail(s, rc, lmt__msg_name(type), &e);
	s->last_tx_ns = lmt__now();
	return 0;
}

int lmt__ctrl_send_empty(struct lmt_session *s, uint16_t type)
{
	int rc = lmt__enc_empty(&s->out, type);
	return rc ? lmt__fail(s, rc, "encoding %s", lmt__msg_name(type)) : lmt__ctrl_send(s);
}

/* An ERROR message: the peer failed, and says why. */
static int peer_failed(struct lmt_session *s, const struct lmt_msg_header *h)
{
	struct lmt_msg_status st;
	struct lmt_error err = {0};
	int rc = lmt__dec_status(s->in, h->length, LMT_MSG_ERROR, &st, &err);
	if (rc)
		return lmt__fail(s, rc, "%s", err.message);
	return lmt__fail(s, st.code ? st.code : -LMT_EPROTO, "the %s failed: %s", peer_name(s),
	                 st.text);
}

int lmt__ctrl_recv(struct lmt_session *s, struct lmt_msg_header *h, uint64_t deadline_ns)
{
	uint8_t hdr[LMT_PROTO_HEADER_SIZE];
	struct lmt__net_error e;
	struct lmt__wait w = lmt__wait_until(s, deadline_ns);
	int rc = lmt__net_recv_all(s->ctrl_fd, hdr, sizeof(hdr), &w, &e);
	if (rc)
		return net_fail(s, rc, "waiting for a control message", &e);
	struct lmt_error err = {0};
	rc = lmt__dec_header(hdr, sizeof(hdr), h, &err);
	if (rc)
		return lmt__fail(s, rc, "%s", err.message);
	w.deadline_ns = lmt__now() + s->idle_timeout_ns;
	rc = lmt__net_recv_all(s->ctrl_fd, s->in, h->length, &w, &e);
	if (rc)
		return net_fail(s, rc, lmt__msg_name(h->type), &e);
	s->last_rx_ns = lmt__now();
	return h->type == LMT_MSG_ERROR ? peer_failed(s, h) : 0;
}

int lmt__ctrl_expect(struct lmt_session *s, uint16_t want, uint64_t deadline_ns,
                     struct lmt_msg_header *h)
{
	for (;;) {
		int rc = lmt__ctrl_recv(s, h, deadline_ns);
		if (rc)
			return rc;
		if (h->type == want)
			return 0;
		if (h->type == LMT_MSG_PING && (rc = lmt__ctrl_send_empty(s, LMT_MSG_PONG)))
			return rc;
		if (h->type != LMT_MSG_PING && h->type != LMT_MSG_PONG)
			return lmt__fail(s, LMT_EPROTO, "expected %s from the %s, got %s",
			                 lmt__msg_name(want), peer_name(s), lmt__msg_name(h->type));
	}
}

static bool readable(const struct lmt_session *s)
{
	struct pollfd p = {.fd = s->ctrl_fd, .events = POLLIN};
	return poll(&p, 1, 0) > 0;
}

static uint64_t ping_interval(const struct lmt_session *s)
{
	uint64_t t = s->idle_timeout_ns / 4;
	return t < 1000000000ull ? t : 1000000000ull;
}

int lmt__ctrl_keepalive(struct lmt_session *s)
{
	if (lmt__now() - s->last_tx_ns >= ping_interval(s)) {
		int rc = lmt__ctrl_send_empty(s, LMT_MSG_PING);
		if (rc)
			return rc;
	}
	while (readable(s)) {
		struct lmt_msg_header h;
		int rc = lmt__ctrl_recv(s, &h, lmt__now() + s->idle_timeout_ns);
		if (!rc && h.type == LMT_MSG_PING)
			rc = lmt__ctrl_send_empty(s, LMT_MSG_PONG);
		else if (!rc && h.type != LMT_MSG_PONG)
			rc = lmt__fail(s, LMT_EPROTO, "unexpected %s from the %s",
			               lmt__msg_name(h.type), peer_name(s));
		if (rc)
			return rc;
	}
	if (lmt__now() - s->last_rx_ns > s->idle_timeout_ns)
		return lmt__fail(s, LMT_ETIMEDOUT, "the %s said nothing for %llu ms", peer_name(s),
		                 (unsigned long long)(s->idle_timeout_ns / 1000000));
	return 0;
}
