/* The destination's lobby: every connection to the control port until a
 * source authenticates (without a key: sends an acceptable HELLO), read
 * side by side without blocking on any. How many are kept and which one a
 * newcomer pushes out is the admission's (common/admit.c): the least
 * progress first, so that a crowd of silent, dribbling or closing
 * strangers only ever displaces its own kind. Here each connection's
 * bytes are read and answered: the TLS handshake, HELLO, AUTH. A
 * connection that closes, sends anything else, is refused or fails
 * authentication is logged and dropped; each has connect-timeout from its
 * accept, which nothing it sends extends. The first to authenticate
 * becomes the control connection and the others are closed.
 *
 * What a connection costs here until it proves something: an admission
 * entry and a candidate (below), and its descriptor. A plaintext message
 * is read only once it is whole in the socket (into one buffer of the
 * lobby's); a TLS connection gets its OpenSSL object only once a whole
 * ClientHello is waiting. docs/security.md has the bounds.
 * Room: engines; may use: every room below it. */
#define _GNU_SOURCE
#include "lobby.h"

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "admit.h"
#include "auth.h"
#include "error.h"
#include "session.h"
#include "tls_session.h"

#define LOBBY_MAX 256             /* connections in their handshake at once */
#define LOBBY_MIN 16              /* ... whatever RLIMIT_NOFILE says */
#define LOBBY_OPENED_MAX 16       /* TLS handshakes under way at once */
#define LOBBY_PROVEN_MAX 16       /* past TLS, or answered and owing AUTH */
#define LOBBY_MSG_MAX (24u << 10) /* a HELLO of 64 options of the longest fits */
#define LOBBY_KEEPALIVES_MAX 32   /* PINGs and PONGs before authenticating */
#define LOBBY_ACCEPTS_PER_TURN 32 /* then the connections already in are read */
#define LOBBY_READY_PER_TURN 64

struct candidate {
	struct lmt_msg_header h;
	bool have_header;
	bool hello_ok; /* HELLO accepted: its AUTH is awaited */
	bool tls_done; /* tls=on: its handshake finished */
	unsigned messages, keepalives;
	/* Through TLS only: the header, then the payload, as they come. */
	uint8_t header[LMT_PROTO_HEADER_SIZE];
	size_t got;
	uint8_t *payload;
	uint8_t source_nonce[LMT_PROTO_NONCE];
	uint8_t nonce[LMT_PROTO_NONCE];
	lmt__tls *tls; /* tls=on: once a whole ClientHello came */
};

struct lobby {
	struct lmt_session *s;
	struct lmt__admit *admit;
	struct candidate *c; /* by admission id */
	uint8_t *msg;        /* a whole plaintext message */
	unsigned refused;
	int last_code;
	char last_why[LMT_PROTO_MAX_TEXT + 160];
	char last_peer[80];
	struct lmt_buf out;
	struct lmt_msg_hello hello; /* decoded in place */
};

static void peer_name(int fd, char *buf, size_t size)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);
	struct ucred cred;
	socklen_t clen = sizeof(cred);
	snprintf(buf, size, "?"); /* a peer that reset the connection has no name */
	if (getsockname(fd, (struct sockaddr *)&ss, &len) != 0)
		return;
	if (ss.ss_family == AF_UNIX) {
		if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) == 0)
			snprintf(buf, size, "pid %d (uid %u)", (int)cred.pid, (unsigned)cred.uid);
		return;
	}
	len = sizeof(ss);
	if (getpeername(fd, (struct sockaddr *)&ss, &len) == 0)
		lmt__net_format((struct sockaddr *)&ss, buf, size);
}

static void candidate_free(struct candidate *c)
{
	lmt__tls_free(c->tls);
	free(c->payload);
	*c = (struct candidate){0};
}

/* Keep why candidate id goes for the final error, and log it (a crowd's
 * drops are counted, and summed up once a second). */
static void note_drop(struct lobby *l, unsigned id, int code, const char *fmt, ...)
        LMT_PRINTF(4, 5);

static void note_drop(struct lobby *l, unsigned id, int code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(l->last_why, sizeof(l->last_why), fmt, ap);
	va_end(ap);
	l->last_code = code;
	l->refused++;
	l->last_peer[0] = '\0'; /* looked up only for a drop logged on its own */
	if (!lmt__admit_log_this(l->admit, lmt__now()))
		return;
	peer_name(lmt__admit_fd(l->admit, id), l->last_peer, sizeof(l->last_peer));
	lmt__session_log(l->s, LMT_LOG_WARN, "destination: dropped the connection from %s: %s",
	                 l->last_peer, l->last_why);
}

static void log_unlogged(struct lobby *l, uint64_t now)
{
	uint64_t n = lmt__admit_unlogged(l->admit, now);
	if (n)
		lmt__session_log(l->s, LMT_LOG_WARN,
		                 "destination: dropped %llu more connections in their handshake "
		                 "(the last: %s)",
		                 (unsigned long long)n, l->last_why);
}

/* Drop candidate id: log why, keep the reason for the final error. */
static void lobby_drop(struct lobby *l, unsigned id, int code, const char *fmt, ...)
        LMT_PRINTF(4, 5);

/* ... closed in order when it was told why (its reason goes first), else
 * with a reset. */
static void drop_told(struct lobby *l, unsigned id, bool told, int code, const char *why)
{
	note_drop(l, id, code, "%s", why);
	candidate_free(&l->c[id]);
	lmt__admit_close(l->admit, id, told);
}

static void lobby_drop(struct lobby *l, unsigned id, int code, const char *fmt, ...)
{
	char why[sizeof(l->last_why)];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	drop_told(l, id, false, code, why);
}

/* Send what l->out holds without waiting: a candidate that does not read
 * is not waited for. */
static bool lobby_send(struct lobby *l, unsigned id)
{
	struct candidate *c = &l->c[id];
	if (c->tls_done) {
		/* A few hundred bytes: the socket takes them at once. */
		struct lmt__wait w = {.deadline_ns = lmt__now() + 100000000ull};
		struct lmt__net_error e;
		return lmt__tls_send_all(c->tls, l->out.data, l->out.len, &w, &e) == 0;
	}
	ssize_t n;
	do
		n = send(lmt__admit_fd(l->admit, id), l->out.data, l->out.len,
		         MSG_DONTWAIT | MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	return n == (ssize_t)l->out.len;
}

/* Tell a candidate why it is dropped: in the HELLO_REPLY it waits for, or
 * in an ERROR once its HELLO was answered. Best effort, and never into a
 * TLS handshake under way. Whether it was told. */
static bool lobby_tell(struct lobby *l, unsigned id, int code, const char *why)
{
	struct candidate *c = &l->c[id];
	struct lmt_msg_status st = {.version = LMT_PROTO_VERSION, .code = -code};
	if (c->tls && !c->tls_done)
		return false;
	snprintf(st.text, sizeof(st.text), "%s", why);
	return !lmt__enc_status(&l->out, c->hello_ok ? LMT_MSG_ERROR : LMT_MSG_HELLO_REPLY, &st) &&
	       lobby_send(l, id);
}

static void lobby_refuse(struct lobby *l, unsigned id, int code, const char *why)
{
	drop_told(l, id, lobby_tell(l, id, code, why), code, why);
}

/* The admission closes candidate id: its time is up, or a newcomer (or one
 * of its level) needed its place. Whether it was told why. */
static bool lobby_evicted(void *ctx, unsigned id, enum lmt__admit_why why)
{
	struct lobby *l = ctx;
	struct candidate *c = &l->c[id];
	unsigned n = lmt__admit_capacity(l->admit);
	bool told = false;
	if (why == LMT_ADMIT_TIMED_OUT) {
		const char *text = c->hello_ok ? "no AUTH within connect-timeout of connecting"
		                               : "no HELLO within connect-timeout of connecting";
		told = lobby_tell(l, id, LMT_ETIMEDOUT, text);
		note_drop(l, id, LMT_ETIMEDOUT, "%s", text);
	} else {
		switch (lmt__admit_level(l->admit, id)) {
		case LMT_ADMIT_SILENT:
		case LMT_ADMIT_PARTIAL:
			note_drop(
			        l, id, LMT_EOVERFLOW,
			        "crowded out: %u connections were in their handshake at once, and "
			        "this one had sent %s",
			        n,
			        lmt__admit_level(l->admit, id) == LMT_ADMIT_SILENT
			                ? "nothing yet"
			                : "no whole message");
			break;
		case LMT_ADMIT_OPENED:
			note_drop(l, id, LMT_EOVERFLOW,
			          "crowded out: the oldest of %u TLS handshakes under way at once",
			          LOBBY_OPENED_MAX);
			break;
		default:
			/* Past TLS or answered: it can be told to try again. */
			told = lobby_tell(l, id, LMT_EAGAIN,
			                  "crowded out by other connections past their first "
			                  "message: connect again");
			note_drop(l, id, LMT_EOVERFLOW,
			          "crowded out: the oldest of %u connections past their first "
			          "message at once",
			          LOBBY_PROVEN_MAX);
			break;
		}
	}
	candidate_free(c);
	return told;
}

/* ---- HELLO and AUTH ---- */

/* Answer an acceptable HELLO: "ok", with the destination's nonce and proof
 * when it holds a key. 1 when the candidate is the source (no key). */
static int lobby_accept_hello(struct lobby *l, unsigned id)
{
	struct lmt_session *s = l->s;
	struct candidate *c = &l->c[id];
	struct lmt_msg_status st = {.version = LMT_PROTO_VERSION, .auth = s->auth.bytes != NULL};
	snprintf(st.text, sizeof(st.text), "ok");
	if (st.auth) {
		memcpy(c->source_nonce, l->hello.nonce, LMT_PROTO_NONCE);
		if (lmt__auth_nonce(st.nonce) ||
		    lmt__auth_proof(&s->auth, LMT_AUTH_LABEL_DESTINATION, c->source_nonce, st.nonce,
		                    st.proof)) {
			lobby_refuse(l, id, LMT_EIO, "computing the authentication proof failed");
			return 0;
		}
		memcpy(c->nonce, st.nonce, LMT_PROTO_NONCE);
	}
	if (lmt__enc_status(&l->out, LMT_MSG_HELLO_REPLY, &st) || !lobby_send(l, id)) {
		lobby_drop(l, id, LMT_ECONN, "cannot send HELLO_REPLY");
		return 0;
	}
	c->hello_ok = true;
	if (!st.auth)
		return 1;
	lmt__admit_promote(l->admit, id, LMT_ADMIT_PROVEN);
	return 0;
}

static int lobby_auth(struct lobby *l, unsigned id, const uint8_t *payload)
{
	struct lmt_session *s = l->s;
	struct candidate *c = &l->c[id];
	struct lmt_error err = {0};
	uint8_t got[LMT_AUTH_PROOF], want[LMT_AUTH_PROOF];
	if (lmt__dec_auth(payload, c->h.length, got, &err)) {
		lobby_refuse(l, id, LMT_EPROTO, err.message);
		return 0;
	}
	int rc = lmt__auth_proof(&s->auth, LMT_AUTH_LABEL_SOURCE, c->nonce, c->source_nonce, want);
	bool ok = !rc && lmt__auth_equal(want, got);
	explicit_bzero(want, sizeof(want));
	if (ok)
		return 1;
	lobby_refuse(l, id, rc ? LMT_EIO : LMT_EAUTH,
	             rc ? "computing the authentication proof failed"
	                : "authentication failed: the source does not hold this key");
	return 0;
}

/* One whole message from candidate id (its header in c->h): 1 when it is
 * the source, else 0 (it may have been dropped). */
static int lobby_message(struct lobby *l, unsigned id, const uint8_t *payload)
{
	struct candidate *c = &l->c[id];
	struct lmt_error err = {0};
	char why[LMT_PROTO_MAX_TEXT + 1];
	uint16_t want = c->hello_ok ? LMT_MSG_AUTH : LMT_MSG_HELLO;
	c->messages++;
	switch (c->h.type) {
	case LMT_MSG_PING:
	case LMT_MSG_PONG:
		if (++c->keepalives > LOBBY_KEEPALIVES_MAX) {
			lobby_refuse(l, id, LMT_EPROTO,
			             "too many keep-alives before authenticating");
			return 0;
		}
		if (c->h.type == LMT_MSG_PING &&
		    (lmt__enc_empty(&l->out, LMT_MSG_PONG) || !lobby_send(l, id)))
			lobby_drop(l, id, LMT_ECONN, "cannot answer its PING");
		return 0;
	case LMT_MSG_ERROR: {
		struct lmt_msg_status st;
		if (lmt__dec_status(payload, c->h.length, LMT_MSG_ERROR, &st, &err))
			lobby_drop(l, id, LMT_EPROTO, "%s", err.message);
		else
			lobby_drop(l, id, st.code ? -st.code : LMT_EPROTO, "the source failed: %s",
			           st.text);
		return 0;
	}
	default:
		break;
	}
	if (c->h.type != want) {
		snprintf(why, sizeof(why), "expected %s from the source, got %s",
		         lmt__msg_name(want), lmt__msg_name(c->h.type));
		lobby_refuse(l, id, LMT_EPROTO, why);
		return 0;
	}
	if (want == LMT_MSG_AUTH)
		return lobby_auth(l, id, payload);
	if (lmt__dec_hello(payload, c->h.length, &l->hello, &err)) {
		lobby_refuse(l, id, LMT_EPROTO, err.message);
		return 0;
	}
	int rc = lmt__hello_verdict(l->s, &l->hello, why, sizeof(why));
	if (rc) {
		lobby_refuse(l, id, rc, why);
		return 0;
	}
	return lobby_accept_hello(l, id);
}

/* A decoded header: 0 when a message of that size may follow. */
static int check_header(struct lobby *l, unsigned id)
{
	struct candidate *c = &l->c[id];
	struct lmt_error err = {0};
	if (lmt__dec_header(c->header, sizeof(c->header), &c->h, &err)) {
		lobby_drop(l, id, LMT_EPROTO, "%s", err.message);
		return -1;
	}
	if (c->h.length > LOBBY_MSG_MAX) {
		lobby_drop(l, id, LMT_EPROTO, "a %u-byte %s before authenticating (at most %u)",
		           c->h.length, lmt__msg_name(c->h.type), LOBBY_MSG_MAX);
		return -1;
	}
	c->have_header = true;
	return 0;
}

/* ---- reading ---- */

/* Nothing whole is waiting from candidate id (a peek found `got`): drop it
 * if it closed, else wait for more. 0. */
static int wait_for_more(struct lobby *l, unsigned id, ssize_t got)
{
	const char *before = l->c[id].hello_ok ? "authenticating" : "a HELLO";
	if (lmt__admit_pending(l->admit, id, got) == 0)
		return 0;
	if (errno)
		lobby_drop(l, id, LMT_ECONN, "recv: %s", strerror(errno));
	else
		lobby_drop(l, id, LMT_ECONN, "connection closed by peer %sbefore %s",
		           got > 0 ? "in a message, " : "", before);
	return 0;
}

/* Without TLS: each message is read once it is whole in the socket, and
 * never past it (what follows the handshake is the service thread's). 1
 * when candidate id is the source, else 0. */
static int read_plain(struct lobby *l, unsigned id)
{
	struct candidate *c = &l->c[id];
	int fd = lmt__admit_fd(l->admit, id);
	for (;;) {
		if (!c->have_header) {
			ssize_t n = lmt__admit_peek(fd, c->header, sizeof(c->header));
			if (n > 0 && !c->messages && c->header[0] == LMT_TLS_RECORD_HANDSHAKE) {
				lobby_refuse(l, id, LMT_EMISMATCH,
				             LMT_TLS_MISMATCH_DESTINATION_OFF);
				return 0;
			}
			if (n < (ssize_t)sizeof(c->header))
				return wait_for_more(l, id, n);
			if (check_header(l, id))
				return 0;
		}
		size_t whole = LMT_PROTO_HEADER_SIZE + c->h.length, got = 0;
		size_t inq = lmt__admit_inq(fd);
		if (inq < whole)
			return wait_for_more(l, id, (ssize_t)inq);
		while (got < whole) {
			ssize_t n = recv(fd, l->msg + got, whole - got, MSG_DONTWAIT);
			if (n <= 0 && !(n < 0 && errno == EINTR)) {
				lobby_drop(l, id, LMT_ECONN, "recv: %s",
				           n ? strerror(errno) : "connection closed by peer");
				return 0;
			}
			got += n > 0 ? (size_t)n : 0;
		}
		c->have_header = false;
		int rc = lobby_message(l, id, l->msg + LMT_PROTO_HEADER_SIZE);
		if (rc || lmt__admit_fd(l->admit, id) != fd)
			return rc; /* the source, or dropped */
	}
}

/* tls=on: nothing until a whole ClientHello is waiting, then the handshake
 * without blocking. 1 once it is done, 0 to wait (or when dropped). */
static int lobby_tls(struct lobby *l, unsigned id)
{
	struct candidate *c = &l->c[id];
	int fd = lmt__admit_fd(l->admit, id);
	struct lmt__net_error e = {{0}};
	if (!c->tls) {
		uint8_t head[LMT_ADMIT_TLS_HEAD];
		ssize_t n = lmt__admit_peek(fd, head, sizeof(head));
		if (n > 0 && head[0] != LMT_TLS_RECORD_HANDSHAKE) {
			lobby_refuse(l, id, LMT_EMISMATCH, LMT_TLS_MISMATCH_DESTINATION_ON);
			return 0;
		}
		if (n < (ssize_t)sizeof(head))
			return wait_for_more(l, id, n);
		size_t whole = lmt__admit_client_hello(head);
		if (!whole) {
			lobby_drop(l, id, LMT_EPROTO, "tls: its first bytes are not a ClientHello");
			return 0;
		}
		size_t inq = lmt__admit_inq(fd);
		if (inq < whole)
			return wait_for_more(l, id, (ssize_t)inq);
		int rc = lmt__tls_new(l->s->tls_ctx, fd, &c->tls, &e);
		if (rc) {
			lobby_drop(l, id, -rc, "tls: %s", e.msg);
			return 0;
		}
	}
	short events = 0;
	int rc = lmt__tls_handshake_step(c->tls, &events, &e);
	if (rc == -LMT_EAGAIN) {
		lmt__admit_promote(l->admit, id, LMT_ADMIT_OPENED);
		lmt__admit_want_write(l->admit, id, events & POLLOUT);
		return 0;
	}
	if (rc) {
		lobby_drop(l, id, rc == -LMT_EAUTH ? LMT_EAUTH : -rc,
		           "tls (%s): handshake with the source failed: %s",
		           lmt__tls_session_mode(l->s), e.msg);
		return 0;
	}
	c->tls_done = true;
	lmt__admit_want_write(l->admit, id, false);
	lmt__admit_promote(l->admit, id, LMT_ADMIT_PROVEN);
	return 1;
}

/* Bytes from candidate id's TLS without waiting: > 0, 0 when none is
 * ready, or -1 after dropping it. */
static ssize_t tls_recv(struct lobby *l, unsigned id, void *to, size_t want)
{
	struct candidate *c = &l->c[id];
	struct lmt__net_error e = {{0}};
	ssize_t n = lmt__tls_recv_some(c->tls, to, want, &e);
	if (n > 0 || n == -LMT_EAGAIN)
		return n > 0 ? n : 0;
	if (n == -LMT_ECONN && strcmp(e.msg, "connection closed by peer") == 0)
		lobby_drop(l, id, LMT_ECONN, "connection closed by peer before %s",
		           c->hello_ok ? "authenticating" : "a HELLO");
	else
		lobby_drop(l, id, (int)-n, "tls: %s", e.msg);
	return -1;
}

/* Through TLS (done): every message as its bytes come, until none is
 * ready; its payload is held only past the handshake, which a stranger
 * does not get through. 1 when candidate id is the source, else 0. */
static int read_tls(struct lobby *l, unsigned id)
{
	struct candidate *c = &l->c[id];
	int fd = lmt__admit_fd(l->admit, id);
	for (;;) {
		uint8_t *to = c->have_header ? c->payload + c->got : c->header + c->got;
		size_t want = (c->have_header ? c->h.length : sizeof(c->header)) - c->got;
		ssize_t n = want ? tls_recv(l, id, to, want) : 0;
		if (n < 0 || (want && n == 0))
			return 0;
		c->got += (size_t)n;
		if (!c->have_header) {
			if (c->got < sizeof(c->header))
				continue;
			if (check_header(l, id))
				return 0;
			c->got = 0;
			c->payload = malloc(c->h.length ? c->h.length : 1);
			if (!c->payload) {
				lobby_drop(l, id, LMT_ENOMEM, "out of memory");
				return 0;
			}
		}
		if (c->got < c->h.length)
			continue;
		c->have_header = false;
		c->got = 0;
		int rc = lobby_message(l, id, c->payload);
		if (lmt__admit_fd(l->admit, id) != fd)
			return 0; /* dropped (and freed) */
		free(c->payload);
		c->payload = NULL;
		if (rc)
			return rc;
	}
}

static int lobby_read(struct lobby *l, unsigned id)
{
	struct candidate *c = &l->c[id];
	if (!l->s->tls)
		return read_plain(l, id);
	if (!c->tls_done && !lobby_tls(l, id))
		return 0;
	return read_tls(l, id);
}

/* ---- the wait ---- */

static int lobby_give_up(struct lobby *l, bool listened, uint64_t waited_ns)
{
	struct lmt_session *s = l->s;
	unsigned long long ms = waited_ns / 1000000;
	if (!l->refused)
		return lmt__fail(s, LMT_ETIMEDOUT,
		                 "no source connected within idle-timeout (%llu ms)", ms);
	if (!listened)
		return lmt__fail(s, l->last_code, "%s", l->last_why);
	return lmt__fail(s, l->last_code,
	                 "%s (%s%s%sno source was accepted within idle-timeout, %llu ms, and %u "
	                 "connection%s dropped)",
	                 l->last_why, l->last_peer[0] ? "from " : "", l->last_peer,
	                 l->last_peer[0] ? "; " : "", ms, l->refused,
	                 l->refused == 1 ? " was" : "s were");
}

static void lobby_accept(struct lobby *l)
{
	unsigned ids[LOBBY_ACCEPTS_PER_TURN];
	struct lmt__net_error e;
	int n = lmt__admit_accept(l->admit, ids, LOBBY_ACCEPTS_PER_TURN, &e);
	if (n < 0 && lmt__admit_log_this(l->admit, lmt__now()))
		lmt__session_log(l->s, LMT_LOG_WARN, "destination: %s", e.msg);
	for (int i = 0; i < n; i++)
		l->c[ids[i]] = (struct candidate){0};
}

/* Until a source is accepted (its descriptor in *fd) or the wait ends:
 * accept on listen_fd (when >= 0) until wait_ns is over, and serve every
 * connection in its handshake until its own deadline. */
static int lobby_run(struct lobby *l, int listen_fd, uint64_t wait_ns, int *fd, lmt__tls **tls,
                     uint64_t *accepted_ns)
{
	struct lmt_session *s = l->s;
	uint64_t wait_deadline = lmt__now() + wait_ns;
	bool listening = listen_fd >= 0;
	for (;;) {
		if (lmt__is_cancelled(s))
			return lmt__fail(s, LMT_ECANCELED, "waiting for the source: cancelled");
		uint64_t now = lmt__now();
		lmt__admit_expire(l->admit, now);
		log_unlogged(l, now);
		if (listening && now >= wait_deadline) {
			listening = false;
			lmt__admit_unlisten(l->admit);
		}
		if (!listening && !lmt__admit_count(l->admit))
			return lobby_give_up(l, listen_fd >= 0, wait_ns);
		uint64_t ms = listening ? (wait_deadline - now) / 1000000 + 1 : 100;
		unsigned ready[LOBBY_READY_PER_TURN];
		bool incoming = false;
		int n = lmt__admit_wait(l->admit, ms > 100 ? 100 : (int)ms, ready,
		                        LOBBY_READY_PER_TURN, &incoming);
		if (n < 0)
			return lmt__fail(s, LMT_EIO, "waiting for the source: epoll: %s",
			                 strerror(errno));
		for (int k = 0; k < n; k++) {
			unsigned id = ready[k];
			if (lmt__admit_fd(l->admit, id) < 0)
				continue; /* dropped meanwhile */
			if (lobby_read(l, id)) {
				struct candidate *c = &l->c[id];
				*accepted_ns = lmt__admit_accepted_ns(l->admit, id);
				*fd = lmt__admit_release(l->admit, id);
				*tls = c->tls;
				c->tls = NULL;
				candidate_free(c);
				return 0;
			}
		}
		/* Every turn, whether or not epoll said so: a listener reported
		 * behind a crowd's stream of events (each dribbled byte is one)
		 * would wait its turn while its queue fills, and the real source's
		 * SYN be dropped. accept4 says EAGAIN at once when none waits. */
		if (listening)
			lobby_accept(l);
	}
}

/* Close every connection still in the lobby; when a source was accepted,
 * tell each (that can be told) so. */
static void lobby_end(struct lobby *l, bool accepted)
{
	unsigned left = 0;
	log_unlogged(l, UINT64_MAX);
	for (unsigned i = 0; l->admit && i < lmt__admit_capacity(l->admit); i++)
		if (lmt__admit_fd(l->admit, i) >= 0) {
			bool told =
			        accepted &&
			        lobby_tell(l, i, LMT_ECONN,
			                   "another source was accepted: a destination takes one");
			candidate_free(&l->c[i]);
			if (told)
				lmt__admit_close(l->admit, i, true);
			left++;
		}
	if (left && accepted)
		lmt__session_log(l->s, LMT_LOG_INFO,
		                 "destination: closed %u other connection%s in their handshake: "
		                 "another source was accepted",
		                 left, left == 1 ? "" : "s");
	else if (left)
		lmt__session_log(l->s, LMT_LOG_INFO,
		                 "destination: closed %u connection%s still in their handshake",
		                 left, left == 1 ? "" : "s");
	lmt__admit_free(l->admit);
	lmt__buf_free(&l->out);
	free(l->msg);
	free(l->c);
	free(l);
}

int lmt__lobby_find_source(struct lmt_session *s, int listen_fd, uint64_t wait_ns, int *fd,
                           lmt__tls **tls, uint64_t *accepted_ns)
{
	struct lobby *l = calloc(1, sizeof(*l));
	struct lmt__admit_limits lim = {
	        .max = lmt__admit_fit(LOBBY_MAX, LOBBY_MIN),
	        .opened_max = LOBBY_OPENED_MAX,
	        .proven_max = LOBBY_PROVEN_MAX,
	        .timeout_ns = s->connect_timeout_ns,
	        .drop = lobby_evicted,
	        .ctx = l,
	};
	struct lmt__net_error e = {{0}};
	int rc = l ? 0 : -LMT_ENOMEM;
	if (!rc && listen_fd >= 0)
		lmt__net_set_nonblock(listen_fd, 1); /* accepts until none is waiting */
	if (!rc)
		rc = lmt__admit_new(&l->admit, listen_fd, &lim, &e);
	if (!rc) {
		l->s = s;
		l->c = calloc(lmt__admit_capacity(l->admit), sizeof(*l->c));
		l->msg = malloc(LMT_PROTO_HEADER_SIZE + LOBBY_MSG_MAX);
		rc = l->c && l->msg ? 0 : -LMT_ENOMEM;
	}
	unsigned id;
	if (*fd >= 0 && rc)
		close(*fd);
	else if (*fd >= 0 && (rc = lmt__admit_add(l->admit, *fd, &id)) == 0)
		l->c[id] = (struct candidate){0};
	*fd = -1; /* the lobby's now, whatever happened */
	if (rc) {
		if (l && !l->admit)
			free(l);
		else if (l)
			lobby_end(l, false);
		return lmt__fail(s, rc, "waiting for the source: %s",
		                 rc == -LMT_ENOMEM ? "out of memory"
		                 : e.msg[0]        ? e.msg
		                                   : lmt_strerror(rc));
	}
	rc = lobby_run(l, listen_fd, wait_ns, fd, tls, accepted_ns);
	lobby_end(l, rc == 0);
	if (!rc && !*tls)
		lmt__net_set_nonblock(*fd, 0); /* TLS stays non-blocking */
	return rc;
}
