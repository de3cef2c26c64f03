/* The destination engine: accept the source, check what it proposes,
 * register RAM for it, drive the plugin, take the device state in, verify
 * and acknowledge. */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "error.h"
#include "file.h"
#include "net.h"
#include "postcopy.h"
#include "uffd.h"
#include "session.h"

#define TARGET_SLICE_NS 1000000ull
#define CONTROL_SLICE_MS 50

struct lmt_destination_engine {
	int listen_fd; /* until the source connects */
	char *unix_path; /* a unix: listener's socket file, removed with it */
	/* The device state grows with the pieces that arrived, up to the
	 * total the first piece announced (at most max-device-state). */
	uint8_t *state_buf;
	uint64_t state_cap;
	uint64_t state_len;
	uint64_t state_received;
	uint64_t state_max;
	/* The last sign of the source's progress: a message other than a
	 * keep-alive. idle-timeout without one fails the load. */
	uint64_t progress_ns;
	struct lmt_msg_landed *landed; /* LANDED's, decoded */
};

int lmt__destination_new(struct lmt_destination_engine **out)
{
	*out = calloc(1, sizeof(**out));
	if (!*out)
		return -LMT_ENOMEM;
	(*out)->listen_fd = -1;
	return 0;
}

static void close_listener(struct lmt_destination_engine *d)
{
	if (d->listen_fd >= 0)
		close(d->listen_fd);
	d->listen_fd = -1;
	if (d->unix_path)
		unlink(d->unix_path);
	free(d->unix_path);
	d->unix_path = NULL;
}

void lmt__destination_free(struct lmt_destination_engine *d)
{
	if (!d)
		return;
	close_listener(d);
	if (d->state_buf)
		explicit_bzero(d->state_buf, d->state_cap); /* the guest's device state */
	free(d->state_buf);
	free(d->landed);
	free(d);
}

int lmt_load_listen(lmt_session *s, const char *uri, uint16_t *port)
{
	if (!s)
		return -LMT_EINVAL;
	struct lmt_destination_engine *d = s->destination;
	if (s->role != LMT_ROLE_DESTINATION)
		return lmt__usage(s, LMT_ESTATE, "load listen: this session is a source");
	if (!uri)
		return lmt__usage(s, LMT_EINVAL, "load listen: uri is NULL, expected host:port");
	if (s->nblocks == 0)
		return lmt__usage(s, LMT_EINVAL,
		                  "load listen: no RAM blocks: add them before listening");
	int rc = lmt__file_check_uri(s, uri, "load listen");
	if (rc)
		return rc;
	int expected = LMT_STATE_NEW;
	if (!atomic_compare_exchange_strong(&s->state, &expected, LMT_STATE_LISTENING))
		return lmt__usage(s, LMT_ESTATE, "load listen: called twice");
	if (lmt__is_file_uri(uri)) {
		/* Nothing to bind: lmt_load_run reads the file. */
		if ((rc = lmt__file_set_path(s, uri)))
			atomic_store(&s->state, LMT_STATE_NEW);
		else if (port)
			*port = 0;
		return rc;
	}
	struct sockaddr_storage addr;
	socklen_t len;
	struct lmt__net_error e;
	rc = lmt__net_parse(uri, &addr, &len, &e);
	if (!rc)
		rc = lmt__net_listen((struct sockaddr *)&addr, len, 4, &d->listen_fd, &e);
	if (rc) {
		/* Nothing started: the caller may listen again, elsewhere. */
		atomic_store(&s->state, LMT_STATE_NEW);
		return lmt__usage(s, rc, "load listen: %s", e.msg);
	}
	if (port)
		*port = lmt__net_local_port(d->listen_fd);
	s->ctrl_unix = addr.ss_family == AF_UNIX;
	if (s->ctrl_unix && !(d->unix_path = strdup(uri + 5))) {
		close(d->listen_fd);
		d->listen_fd = -1;
		atomic_store(&s->state, LMT_STATE_NEW);
		return lmt__usage(s, LMT_ENOMEM, "load listen: out of memory");
	}
	return 0;
}

static int send_status(struct lmt_session *s, uint16_t type, int code, const char *text)
{
	struct lmt_msg_status st = {.version = LMT_PROTO_VERSION, .code = code};
	snprintf(st.text, sizeof(st.text), "%s", text);
	int rc = lmt__enc_status(&s->out, type, &st);
	return rc ? lmt__fail(s, rc, "encoding %s", lmt__msg_name(type)) : lmt__ctrl_send(s);
}

/* Fail, and say why to the source in the reply it waits for. */
static int refuse(struct lmt_session *s, uint16_t type, int code, const char *fmt, ...)
        LMT_PRINTF(4, 5);

static int refuse(struct lmt_session *s, uint16_t type, int code, const char *fmt, ...)
{
	char text[LMT_PROTO_MAX_TEXT + 1];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(text, sizeof(text), fmt, ap);
	va_end(ap);
	send_status(s, type, -code, text);
	return lmt__fail(s, code, "%s", text);
}

/* ---- handshake ---- */

/* The destination's must-match options, each to be sent exactly once. */
struct wanted_option {
	const char *name;
	const struct lmt_option_desc *desc;
	const struct lmt_option_value *value;
	bool seen;
};

struct wanted {
	struct wanted_option *v;
	uint32_t n, cap;
	int rc;
};

static int collect_wanted(void *opaque, const char *name, const struct lmt_option_desc *d,
                          const struct lmt_option_value *v, const char *text,
                          enum lmt_opt_source src)
{
	struct wanted *w = opaque;
	if (!(d->flags & LMT_OPTF_MATCH) || (d->flags & LMT_OPTF_SECRET))
		return 0;
	if (w->n == w->cap) {
		uint32_t cap = w->cap ? 2 * w->cap : 16;
		struct wanted_option *nv = realloc(w->v, cap * sizeof(*nv));
		if (!nv)
			return w->rc = LMT_ENOMEM;
		w->v = nv;
		w->cap = cap;
	}
	w->v[w->n++] = (struct wanted_option){.name = name, .desc = d, .value = v};
	return 0;
}

/* The source's options against the destination's must-match set: every
 * one present exactly once, with the same canonical value, and nothing
 * else. 0, or an LMT_E* code with the reason in `why`. */
static int check_options(struct lmt_session *s, const struct lmt_msg_hello *m, char *why,
                         size_t size)
{
	struct wanted w = {0};
	lmt__optset_foreach(s->opts, collect_wanted, &w);
	int rc = w.rc;
	if (rc)
		snprintf(why, size, "out of memory");
	for (uint32_t i = 0; i < m->option_count && !rc; i++) {
		const struct lmt_msg_option *o = &m->options[i];
		struct wanted_option *mine = NULL;
		for (uint32_t j = 0; j < w.n && !mine; j++)
			if (strcmp(w.v[j].name, o->name) == 0)
				mine = &w.v[j];
		struct lmt_option_value v;
		char text[256];
		if (!mine && lmt__optset_get(s->opts, o->name, &v)) {
			rc = LMT_EMISMATCH;
			snprintf(why, size,
			         "%s: the source sets an option this destination does not know",
			         o->name);
		} else if (!mine) {
			rc = LMT_EPROTO;
			snprintf(why, size, "%s: not an option both sides must agree on", o->name);
		} else if (mine->seen) {
			rc = LMT_EPROTO;
			snprintf(why, size, "%s: the source sent it twice", o->name);
		} else {
			mine->seen = true;
			lmt_option_format(mine->desc, mine->value, text, sizeof(text));
			if (strcmp(text, o->value) != 0) {
				rc = LMT_EMISMATCH;
				snprintf(why, size, "%s: the source has %s, the destination has %s",
				         o->name, o->value, text);
			}
		}
	}
	for (uint32_t j = 0; j < w.n && !rc; j++)
		if (!w.v[j].seen) {
			rc = LMT_EMISMATCH;
			snprintf(why, size,
			         "%s: the source did not send it (both sides must agree on it)",
			         w.v[j].name);
		}
	free(w.v);
	return rc;
}

/* Whether a decoded HELLO may go on: 0, or an LMT_E* code and why not. */
static int hello_verdict(struct lmt_session *s, const struct lmt_msg_hello *m, char *why,
                         size_t size)
{
	if (m->version != LMT_PROTO_VERSION) {
		snprintf(why, size, "protocol version %u is not supported; this destination speaks %u",
		         m->version, LMT_PROTO_VERSION);
		return LMT_EPROTO;
	}
	if (strcmp(m->plugin, s->wire_name) != 0) {
		snprintf(why, size, "plugin: the source uses '%s', the destination '%s'", m->plugin,
		         s->wire_name);
		return LMT_EMISMATCH;
	}
	int rc = check_options(s, m, why, size);
	if (!rc && s->auth.bytes && !m->auth) {
		snprintf(why, size,
		         "authentication required: the source holds no key (set auth-key or "
		         "auth-key-file on the source)");
		rc = LMT_EAUTH;
	}
	return rc;
}

/* ---- before authentication: every connection, at once ----
 *
 * The destination accepts connections for as long as it waits for a
 * source, and reads each one's HELLO (and AUTH, with a key) without
 * blocking on any of them. A connection that closes, sends anything else,
 * is refused or fails authentication is logged and dropped; each has
 * connect-timeout from its accept, which nothing it sends extends. The
 * first to authenticate (without a key: to send an acceptable HELLO)
 * becomes the control connection and the others are closed. */

#define LOBBY_MAX 16               /* connections in their handshake at once */
#define LOBBY_MSG_MAX (24u << 10)  /* a HELLO of 64 options of the longest fits */
#define LOBBY_KEEPALIVES_MAX 32    /* PINGs and PONGs before authenticating */
#define LOBBY_ACCEPTS_PER_ROUND 16 /* then the connections already in are read */

struct candidate {
	int fd;
	uint64_t accepted_ns, deadline_ns;
	char peer[80];
	uint8_t header[LMT_PROTO_HEADER_SIZE];
	struct lmt_msg_header h;
	bool have_header;
	size_t got;       /* bytes of the header, then of the payload */
	uint8_t *payload; /* LOBBY_MSG_MAX */
	bool hello_ok;    /* HELLO accepted: its AUTH is awaited */
	uint8_t source_nonce[LMT_PROTO_NONCE];
	uint8_t nonce[LMT_PROTO_NONCE];
	unsigned keepalives;
	lmt__tls *tls;    /* tls=on: from the first byte, which must be TLS */
	bool tls_done;    /* its handshake finished */
	short tls_events; /* what the handshake waits for */
};

struct lobby {
	struct lmt_session *s;
	struct candidate c[LOBBY_MAX];
	unsigned n;
	bool listening; /* there is a listening socket (not lmt__load_connected) */
	unsigned refused;
	int last_code;
	char last_why[LMT_PROTO_MAX_TEXT + 96];
	char last_peer[80];
	struct lmt_buf out;
	struct lmt_msg_hello hello; /* decoded in place */
};

static void lobby_close(struct candidate *c)
{
	lmt__tls_free(c->tls);
	c->tls = NULL;
	shutdown(c->fd, SHUT_RDWR);
	close(c->fd);
	free(c->payload);
	c->payload = NULL;
	c->fd = -1;
}

static void lobby_remove(struct lobby *l, unsigned i)
{
	l->c[i] = l->c[--l->n];
}

/* Drop candidate i: log why, keep the reason for the final error. */
static void lobby_drop(struct lobby *l, unsigned i, int code, const char *fmt, ...)
        LMT_PRINTF(4, 5);

static void lobby_drop(struct lobby *l, unsigned i, int code, const char *fmt, ...)
{
	struct candidate *c = &l->c[i];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(l->last_why, sizeof(l->last_why), fmt, ap);
	va_end(ap);
	l->last_code = code;
	l->refused++;
	snprintf(l->last_peer, sizeof(l->last_peer), "%s", c->peer);
	lmt__session_log(l->s, LMT_LOG_WARN, "destination: dropped the connection from %s: %s",
	                 c->peer, l->last_why);
	lobby_close(c);
	lobby_remove(l, i);
}

/* Send what l->out holds without waiting: a candidate that does not read
 * is not waited for. */
static bool lobby_send(struct lobby *l, struct candidate *c)
{
	if (c->tls_done) {
		/* A few hundred bytes: the socket takes them at once. */
		struct lmt__wait w = {.deadline_ns = lmt__now() + 100000000ull};
		struct lmt__net_error e;
		return lmt__tls_send_all(c->tls, l->out.data, l->out.len, &w, &e) == 0;
	}
	ssize_t n;
	do
		n = send(c->fd, l->out.data, l->out.len, MSG_DONTWAIT | MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	return n == (ssize_t)l->out.len;
}

/* Tell a candidate why it is dropped: in the HELLO_REPLY it waits for, or
 * in an ERROR once its HELLO was answered. Best effort. */
static void lobby_tell(struct lobby *l, struct candidate *c, int code, const char *why)
{
	struct lmt_msg_status st = {.version = LMT_PROTO_VERSION, .code = -code};
	snprintf(st.text, sizeof(st.text), "%s", why);
	if (!lmt__enc_status(&l->out, c->hello_ok ? LMT_MSG_ERROR : LMT_MSG_HELLO_REPLY, &st))
		lobby_send(l, c);
}

static void lobby_refuse(struct lobby *l, unsigned i, int code, const char *why)
{
	lobby_tell(l, &l->c[i], code, why);
	lobby_drop(l, i, code, "%s", why);
}

/* Answer an acceptable HELLO: "ok", with the destination's nonce and proof
 * when it holds a key. 1 when the candidate is the source (no key). */
static int lobby_accept_hello(struct lobby *l, unsigned i)
{
	struct lmt_session *s = l->s;
	struct candidate *c = &l->c[i];
	struct lmt_msg_status st = {.version = LMT_PROTO_VERSION, .auth = s->auth.bytes != NULL};
	snprintf(st.text, sizeof(st.text), "ok");
	int rc = 0;
	if (st.auth) {
		memcpy(c->source_nonce, l->hello.nonce, LMT_PROTO_NONCE);
		if ((rc = lmt__auth_nonce(st.nonce)) ||
		    (rc = lmt__auth_proof(&s->auth, LMT_AUTH_LABEL_DESTINATION, c->source_nonce,
		                          st.nonce, st.proof))) {
			lobby_refuse(l, i, LMT_EIO, "computing the authentication proof failed");
			return 0;
		}
		memcpy(c->nonce, st.nonce, LMT_PROTO_NONCE);
	}
	rc = lmt__enc_status(&l->out, LMT_MSG_HELLO_REPLY, &st);
	if (rc || !lobby_send(l, c)) {
		lobby_drop(l, i, LMT_ECONN, "cannot send HELLO_REPLY");
		return 0;
	}
	c->hello_ok = true;
	return st.auth ? 0 : 1;
}

static int lobby_auth(struct lobby *l, unsigned i)
{
	struct lmt_session *s = l->s;
	struct candidate *c = &l->c[i];
	struct lmt_error err = {0};
	uint8_t got[LMT_AUTH_PROOF], want[LMT_AUTH_PROOF];
	if (lmt__dec_auth(c->payload, c->h.length, got, &err)) {
		lobby_refuse(l, i, LMT_EPROTO, err.message);
		return 0;
	}
	int rc = lmt__auth_proof(&s->auth, LMT_AUTH_LABEL_SOURCE, c->nonce, c->source_nonce, want);
	bool ok = !rc && lmt__auth_equal(want, got);
	explicit_bzero(want, sizeof(want));
	if (ok)
		return 1;
	lobby_refuse(l, i, rc ? LMT_EIO : LMT_EAUTH,
	             rc ? "computing the authentication proof failed"
	                : "authentication failed: the source does not hold this key");
	return 0;
}

/* One whole message from candidate i: 1 when it is the source, else 0
 * (it may have been dropped). */
static int lobby_message(struct lobby *l, unsigned i)
{
	struct lmt_session *s = l->s;
	struct candidate *c = &l->c[i];
	struct lmt_error err = {0};
	char why[LMT_PROTO_MAX_TEXT + 1];
	uint16_t want = c->hello_ok ? LMT_MSG_AUTH : LMT_MSG_HELLO;
	switch (c->h.type) {
	case LMT_MSG_PING:
	case LMT_MSG_PONG:
		if (++c->keepalives > LOBBY_KEEPALIVES_MAX) {
			lobby_refuse(l, i, LMT_EPROTO, "too many keep-alives before authenticating");
			return 0;
		}
		if (c->h.type == LMT_MSG_PING && (lmt__enc_empty(&l->out, LMT_MSG_PONG) ||
		                                  !lobby_send(l, c)))
			lobby_drop(l, i, LMT_ECONN, "cannot answer its PING");
		return 0;
	case LMT_MSG_ERROR: {
		struct lmt_msg_status st;
		if (lmt__dec_status(c->payload, c->h.length, LMT_MSG_ERROR, &st, &err))
			lobby_drop(l, i, LMT_EPROTO, "%s", err.message);
		else
			lobby_drop(l, i, st.code ? -st.code : LMT_EPROTO, "the source failed: %s",
			           st.text);
		return 0;
	}
	default:
		break;
	}
	if (c->h.type != want) {
		snprintf(why, sizeof(why), "expected %s from the source, got %s",
		         lmt__msg_name(want), lmt__msg_name(c->h.type));
		lobby_refuse(l, i, LMT_EPROTO, why);
		return 0;
	}
	if (want == LMT_MSG_AUTH)
		return lobby_auth(l, i);
	if (lmt__dec_hello(c->payload, c->h.length, &l->hello, &err)) {
		lobby_refuse(l, i, LMT_EPROTO, err.message);
		return 0;
	}
	int rc = hello_verdict(s, &l->hello, why, sizeof(why));
	if (rc) {
		lobby_refuse(l, i, rc, why);
		return 0;
	}
	return lobby_accept_hello(l, i);
}

/* Read what candidate i has sent, one message at a time and never past
 * one: what follows the handshake is the service thread's. 1 when it is
 * the source, else 0. */
/* tls=on: the first byte must open a TLS handshake, which then goes on
 * without blocking. 1 once it is done, 0 to wait (or when dropped). */
static int lobby_tls(struct lobby *l, unsigned i)
{
	struct candidate *c = &l->c[i];
	struct lmt__net_error e = {{0}};
	if (!c->tls) {
		uint8_t first;
		ssize_t n;
		do
			n = recv(c->fd, &first, 1, MSG_PEEK | MSG_DONTWAIT);
		while (n < 0 && errno == EINTR);
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return 0;
		if (n <= 0) {
			lobby_drop(l, i, LMT_ECONN, "%s",
			           n ? strerror(errno)
			             : "connection closed by peer before a HELLO");
			return 0;
		}
		if (first != LMT_TLS_RECORD_HANDSHAKE) {
			lobby_refuse(l, i, LMT_EMISMATCH, LMT_TLS_MISMATCH_DESTINATION_ON);
			return 0;
		}
		int rc = lmt__tls_new(l->s->tls_ctx, c->fd, &c->tls, &e);
		if (rc) {
			lobby_drop(l, i, -rc, "tls: %s", e.msg);
			return 0;
		}
	}
	int rc = lmt__tls_handshake_step(c->tls, &c->tls_events, &e);
	if (rc == -LMT_EAGAIN)
		return 0;
	if (rc) {
		lobby_drop(l, i, rc == -LMT_EAUTH ? LMT_EAUTH : -rc,
		           "tls (%s): handshake with the source failed: %s",
		           lmt__tls_session_mode(l->s), e.msg);
		return 0;
	}
	c->tls_done = true;
	c->tls_events = POLLIN;
	return 1;
}

/* Bytes from candidate i without waiting: > 0, 0 when none is ready, or -1
 * after dropping it. */
static ssize_t lobby_recv(struct lobby *l, unsigned i, void *to, size_t want)
{
	struct candidate *c = &l->c[i];
	if (c->tls) {
		struct lmt__net_error e = {{0}};
		ssize_t n = lmt__tls_recv_some(c->tls, to, want, &e);
		if (n > 0 || n == -LMT_EAGAIN)
			return n > 0 ? n : 0;
		if (n == -LMT_ECONN && strcmp(e.msg, "connection closed by peer") == 0)
			lobby_drop(l, i, LMT_ECONN, "connection closed by peer before %s",
			           c->hello_ok ? "authenticating" : "a HELLO");
		else
			lobby_drop(l, i, (int)-n, "tls: %s", e.msg);
		return -1;
	}
	ssize_t n;
	do
		n = recv(c->fd, to, want, MSG_DONTWAIT);
	while (n < 0 && errno == EINTR);
	if (n > 0)
		return n;
	if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
		return 0;
	if (n < 0)
		lobby_drop(l, i, LMT_ECONN, "recv: %s", strerror(errno));
	else
		lobby_drop(l, i, LMT_ECONN, "connection closed by peer before %s",
		           c->hello_ok ? "authenticating" : "a HELLO");
	return -1;
}

static int lobby_read(struct lobby *l, unsigned i)
{
	struct candidate *c = &l->c[i];
	if (l->s->tls && !c->tls_done && !lobby_tls(l, i))
		return 0;
	for (;;) {
		uint8_t *to = c->have_header ? c->payload + c->got : c->header + c->got;
		size_t want = (c->have_header ? c->h.length : sizeof(c->header)) - c->got;
		ssize_t n = want ? lobby_recv(l, i, to, want) : 0;
		if (n < 0)
			return 0;
		if (want && n == 0)
			return 0;
		if (!l->s->tls && !c->have_header && c->got == 0 &&
		    c->header[0] == LMT_TLS_RECORD_HANDSHAKE) {
			lobby_refuse(l, i, LMT_EMISMATCH, LMT_TLS_MISMATCH_DESTINATION_OFF);
			return 0;
		}
		c->got += (size_t)n;
		if (!c->have_header) {
			if (c->got < sizeof(c->header))
				continue;
			struct lmt_error err = {0};
			if (lmt__dec_header(c->header, sizeof(c->header), &c->h, &err)) {
				lobby_drop(l, i, LMT_EPROTO, "%s", err.message);
				return 0;
			}
			if (c->h.length > LOBBY_MSG_MAX) {
				lobby_drop(l, i, LMT_EPROTO,
				           "a %u-byte %s before authenticating (at most %u)",
				           c->h.length, lmt__msg_name(c->h.type), LOBBY_MSG_MAX);
				return 0;
			}
			c->have_header = true;
			c->got = 0;
		}
		if (c->got < c->h.length)
			continue;
		c->have_header = false;
		c->got = 0;
		int fd = c->fd;
		int rc = lobby_message(l, i);
		if (rc || i >= l->n || l->c[i].fd != fd)
			return rc; /* the source, or dropped */
	}
}

static void lobby_add(struct lobby *l, int fd)
{
	struct lmt_session *s = l->s;
	if (l->n == LOBBY_MAX) {
		unsigned oldest = 0;
		for (unsigned i = 1; i < l->n; i++)
			if (l->c[i].accepted_ns < l->c[oldest].accepted_ns)
				oldest = i;
		lobby_drop(l, oldest, LMT_EOVERFLOW,
		           "%u connections were in their handshake at once; this was the oldest",
		           LOBBY_MAX);
	}
	struct candidate *c = &l->c[l->n];
	*c = (struct candidate){.fd = fd, .accepted_ns = lmt__now()};
	c->deadline_ns = c->accepted_ns + s->connect_timeout_ns;
	c->payload = malloc(LOBBY_MSG_MAX);
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);
	snprintf(c->peer, sizeof(c->peer), "?");
	struct ucred cred;
	socklen_t clen = sizeof(cred);
	if (getpeername(fd, (struct sockaddr *)&ss, &len) == 0 &&
	    (ss.ss_family == AF_INET || ss.ss_family == AF_INET6))
		lmt__net_format((struct sockaddr *)&ss, c->peer, sizeof(c->peer));
	else if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) == 0)
		snprintf(c->peer, sizeof(c->peer), "pid %d (uid %u)", (int)cred.pid,
		         (unsigned)cred.uid); /* a unix: socket's peer */
	l->n++;
	if (!c->payload)
		lobby_drop(l, l->n - 1, LMT_ENOMEM, "out of memory");
}

static void lobby_accept(struct lobby *l, int listen_fd)
{
	for (int k = 0; k < LOBBY_ACCEPTS_PER_ROUND; k++) {
		int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
		if (fd >= 0) {
			lobby_add(l, fd);
			continue;
		}
		if (errno == EINTR || errno == ECONNABORTED)
			continue;
		if (errno != EAGAIN && errno != EWOULDBLOCK) {
			/* Out of descriptors, say: make room rather than spin. */
			lmt__session_log(l->s, LMT_LOG_WARN, "destination: accept: %s",
			                 strerror(errno));
			if (l->n)
				lobby_drop(l, 0, LMT_EIO, "accept failed (%s): made room",
				           strerror(errno));
		}
		return;
	}
}

static int lobby_give_up(struct lobby *l, uint64_t waited_ns)
{
	struct lmt_session *s = l->s;
	unsigned long long ms = waited_ns / 1000000;
	if (!l->refused)
		return lmt__fail(s, LMT_ETIMEDOUT, "no source connected within idle-timeout (%llu ms)",
		                 ms);
	if (!l->listening)
		return lmt__fail(s, l->last_code, "%s", l->last_why);
	return lmt__fail(s, l->last_code,
	                 "%s (from %s; no source was accepted within idle-timeout, %llu ms, "
	                 "and %u connection%s dropped)",
	                 l->last_why, l->last_peer, ms, l->refused, l->refused == 1 ? " was" : "s were");
}

/* Until a source is accepted (its descriptor in *fd) or the wait ends:
 * accept on listen_fd (when >= 0) until wait_deadline, and serve every
 * connection in its handshake until its own deadline. */
static int lobby_run(struct lobby *l, int listen_fd, uint64_t wait_ns, int *fd, lmt__tls **tls,
                     uint64_t *accepted_ns)
{
	struct lmt_session *s = l->s;
	uint64_t wait_deadline = lmt__now() + wait_ns;
	for (;;) {
		if (lmt__is_cancelled(s))
			return lmt__fail(s, LMT_ECANCELED, "waiting for the source: cancelled");
		uint64_t now = lmt__now();
		for (unsigned i = l->n; i-- > 0;)
			if (now >= l->c[i].deadline_ns)
				lobby_refuse(l, i, LMT_ETIMEDOUT,
				             l->c[i].hello_ok
				                     ? "no AUTH within connect-timeout of connecting"
				                     : "no HELLO within connect-timeout of connecting");
		bool listening = listen_fd >= 0 && now < wait_deadline;
		if (!listening && !l->n)
			return lobby_give_up(l, wait_ns);
		struct pollfd p[LOBBY_MAX + 1];
		int fds[LOBBY_MAX];
		unsigned np = 0, nc = l->n;
		uint64_t next = listening ? wait_deadline : UINT64_MAX;
		for (unsigned i = 0; i < nc; i++) {
			fds[i] = l->c[i].fd;
			short ev = l->c[i].tls_events ? l->c[i].tls_events : POLLIN;
			p[np++] = (struct pollfd){.fd = l->c[i].fd, .events = ev};
			if (l->c[i].deadline_ns < next)
				next = l->c[i].deadline_ns;
		}
		if (listening)
			p[np++] = (struct pollfd){.fd = listen_fd, .events = POLLIN};
		uint64_t ms = next > now ? (next - now) / 1000000 + 1 : 0;
		int n = poll(p, np, ms > 100 ? 100 : (int)ms);
		if (n < 0 && errno != EINTR)
			return lmt__fail(s, LMT_EIO, "waiting for the source: poll: %s",
			                 strerror(errno));
		for (unsigned k = 0; n > 0 && k < nc; k++) {
			if (!p[k].revents)
				continue;
			unsigned i = 0;
			while (i < l->n && l->c[i].fd != fds[k])
				i++;
			if (i == l->n)
				continue; /* dropped meanwhile */
			if (lobby_read(l, i)) {
				struct candidate *c = &l->c[i];
				*fd = c->fd;
				*tls = c->tls;
				*accepted_ns = c->accepted_ns;
				free(c->payload);
				lobby_remove(l, i);
				return 0;
			}
		}
		if (n > 0 && listening && p[np - 1].revents)
			lobby_accept(l, listen_fd);
	}
}

static void lobby_end(struct lobby *l)
{
	for (unsigned i = 0; i < l->n; i++) {
		lmt__session_log(l->s, LMT_LOG_INFO, "destination: closed the connection from %s: %s",
		                 l->c[i].peer, "another source was accepted");
		lobby_close(&l->c[i]);
	}
	l->n = 0;
	lmt__buf_free(&l->out);
	free(l);
}

/* The source, authenticated: its descriptor becomes the control
 * connection. */
static int find_source(struct lmt_session *s, int listen_fd, uint64_t wait_ns, int *fd,
                       lmt__tls **tls, uint64_t *accepted_ns)
{
	struct lobby *l = calloc(1, sizeof(*l));
	if (!l)
		return lmt__fail(s, LMT_ENOMEM, "out of memory");
	l->s = s;
	l->listening = listen_fd >= 0;
	int rc = 0;
	if (listen_fd >= 0)
		lmt__net_set_nonblock(listen_fd, 1); /* accepts until none is waiting */
	if (*fd >= 0) {
		lmt__net_set_nonblock(*fd, 1);
		lobby_add(l, *fd);
		*fd = -1;
	}
	rc = lobby_run(l, listen_fd, wait_ns, fd, tls, accepted_ns);
	lobby_end(l);
	if (!rc && !*tls)
		lmt__net_set_nonblock(*fd, 0); /* TLS stays non-blocking */
	return rc;
}

static int check_blocks(struct lmt_session *s, uint64_t deadline)
{
	struct lmt_msg_header h;
	struct lmt_error err = {0};
	int rc = lmt__ctrl_expect(s, LMT_MSG_BLOCKS, deadline, &h);
	if (rc)
		return rc;
	struct lmt_msg_blocks *m = malloc(sizeof(*m));
	if (!m)
		return lmt__fail(s, LMT_ENOMEM, "out of memory");
	rc = lmt__dec_blocks(s->in, h.length, m, &err);
	if (rc)
		lmt__fail(s, rc, "%s", err.message);
	else if (m->count != s->nblocks)
		rc = lmt__fail(s, LMT_EMISMATCH,
		               "RAM blocks: the source has %u, the destination has %u", m->count,
		               s->nblocks);
	for (uint32_t i = 0; i < m->count && !rc; i++) {
		const struct lmt_msg_block *theirs = &m->blocks[i];
		const struct lmt_block *mine = &s->blocks[i];
		if (strcmp(theirs->name, mine->name) != 0)
			rc = lmt__fail(
			        s, LMT_EMISMATCH,
			        "RAM block %u: the source calls it '%s', the destination '%s'", i,
			        theirs->name, mine->name);
		else if (theirs->length != mine->length)
			rc = lmt__fail(
			        s, LMT_EMISMATCH,
			        "RAM block '%s': %llu bytes on the source, %llu on the destination",
			        mine->name, (unsigned long long)theirs->length,
			        (unsigned long long)mine->length);
		else if (theirs->page_size != mine->page_size)
			rc = lmt__fail(
			        s, LMT_EMISMATCH,
			        "RAM block '%s': page size %u on the source, %u on the destination",
			        mine->name, theirs->page_size, mine->page_size);
	}
	free(m);
	return rc;
}

static int open_channels(struct lmt_session *s, uint64_t deadline)
{
	struct lmt_msg_header h;
	struct lmt_error err = {0};
	int rc = lmt__ctrl_expect(s, LMT_MSG_EP_ADDRS, deadline, &h);
	if (rc)
		return rc;
	struct lmt_msg_addrs *theirs = malloc(sizeof(*theirs));
	if (!theirs)
		return lmt__fail(s, LMT_ENOMEM, "out of memory");
	rc = lmt__dec_addrs(s->in, h.length, theirs, &err);
	if (rc)
		lmt__fail(s, rc, "%s", err.message);
	else if (theirs->count != s->channels)
		rc = lmt__fail(s, LMT_EPROTO, "the source opened %u channels, expected %u",
		               theirs->count, s->channels);
	if (!rc)
		rc = lmt__endpoints_open(s);
	for (uint32_t c = 0; c < s->channels && !rc; c++) {
		rc = s->desc->ops.ep_connect(s->eps[c], &theirs->addrs[c]);
		if (rc)
			rc = lmt__fail(s, rc, "channel %u: the source did not connect", c);
	}
	free(theirs);
	return rc;
}

/* ---- registration ---- */

static int register_window(struct lmt_session *s, uint32_t block, uint64_t offset, uint64_t length,
                           struct lmt_blob *key)
{
	struct lmt_block *b = block < s->nblocks ? &s->blocks[block] : NULL;
	uint64_t w = b ? offset / b->window : 0;
	if (!b || offset % b->window || w >= b->nwindows ||
	    length != (b->length - offset < b->window ? b->length - offset : b->window))
		return lmt__fail(
		        s, LMT_EPROTO,
		        "REG_REQ: block %u offset %llu length %llu is not a window of a RAM "
		        "block",
		        block, (unsigned long long)offset, (unsigned long long)length);
	if (b->handover)
		return lmt__fail(s, LMT_EPROTO,
		                 "REG_REQ: block '%s' is handed over by descriptor, not written",
		                 b->name);
	if (b->mrs[w])
		return lmt__fail(s, LMT_EPROTO, "REG_REQ: block '%s' offset %llu registered twice",
		                 b->name, (unsigned long long)offset);
	key->len = 0;
	int rc = s->desc->ops.mr_register(s->inst, b->host + offset, length, LMT_MR_REMOTE_WRITE,
	                                  &b->mrs[w], key);
	if (rc)
		return lmt__fail(s, rc, "block '%s': cannot register %llu bytes at offset %llu",
		                 b->name, (unsigned long long)length, (unsigned long long)offset);
	if (key->len == 0 || key->len > LMT_BLOB_MAX)
		return lmt__fail(s, LMT_EPROTO, "plugin %s gave a key of %u bytes", s->desc->name,
		                 key->len);
	return 0;
}

static int send_regs(struct lmt_session *s, struct lmt_msg_regs *r)
{
	int rc = lmt__enc_regs(&s->out, LMT_MSG_REG_REPLY, r);
	return rc ? lmt__fail(s, rc, "encoding REG_REPLY") : lmt__ctrl_send(s);
}

static int register_all(struct lmt_session *s)
{
	struct lmt_msg_regs *r = calloc(1, sizeof(*r));
	if (!r)
		return lmt__fail(s, LMT_ENOMEM, "out of memory");
	int rc = 0;
	for (uint32_t i = 0; i < s->nblocks && !rc; i++) {
		if (!lmt__block_copied(&s->blocks[i]))
			continue;
		struct lmt_msg_reg *g = &r->regs[r->count++];
		*g = (struct lmt_msg_reg){.block = i, .offset = 0, .length = s->blocks[i].length};
		rc = register_window(s, i, 0, g->length, &g->key);
		if (!rc && r->count == LMT_PROTO_MAX_REG) {
			rc = send_regs(s, r);
			r->count = 0;
		}
	}
	if (!rc && r->count)
		rc = send_regs(s, r);
	free(r);
	return rc;
}

static int handle_reg_req(struct lmt_session *s, size_t length)
{
	struct lmt_error err = {0};
	if (s->pin_all)
		return lmt__fail(s, LMT_EPROTO, "REG_REQ: every block is registered with pin-all");
	struct lmt_msg_regs *r = malloc(sizeof(*r));
	if (!r)
		return lmt__fail(s, LMT_ENOMEM, "out of memory");
	int rc = lmt__dec_regs(s->in, length, LMT_MSG_REG_REQ, r, &err);
	if (rc)
		lmt__fail(s, rc, "%s", err.message);
	for (uint32_t i = 0; i < r->count && !rc; i++)
		rc = register_window(s, r->regs[i].block, r->regs[i].offset, r->regs[i].length,
		                     &r->regs[i].key);
	if (!rc)
		rc = send_regs(s, r);
	free(r);
	return rc;
}

/* ---- what landed ---- */

/* The counts of bytes only grow; they are the statistics' figures. */
static int take_bytes(struct lmt_session *s, const struct lmt_msg_landed *m)
{
	if (m->channels != s->channels)
		return lmt__fail(s, LMT_EPROTO, "LANDED: %u channels, expected %u", m->channels,
		                 s->channels);
	uint64_t total = 0;
	pthread_mutex_lock(&s->lock);
	for (uint32_t c = 0; c < m->channels; c++)
		if (m->bytes[c] < s->stats.channel_bytes[c]) {
			uint64_t had = s->stats.channel_bytes[c];
			pthread_mutex_unlock(&s->lock);
			return lmt__fail(s, LMT_EPROTO,
			                 "LANDED: channel %u went back from %llu to %llu bytes", c,
			                 (unsigned long long)had, (unsigned long long)m->bytes[c]);
		}
	for (uint32_t c = 0; c < m->channels; c++) {
		s->stats.channel_bytes[c] = m->bytes[c];
		total += m->bytes[c];
	}
	s->stats.bytes_received = total;
	pthread_mutex_unlock(&s->lock);
	return 0;
}

static int handle_landed(struct lmt_session *s, size_t length)
{
	struct lmt_destination_engine *d = s->destination;
	struct lmt_error err = {0};
	if (!d->landed && !(d->landed = malloc(sizeof(*d->landed))))
		return lmt__fail(s, LMT_ENOMEM, "out of memory");
	struct lmt_msg_landed *m = d->landed;
	int rc = lmt__dec_landed(s->in, length, m, &err);
	if (rc)
		return lmt__fail(s, rc, "%s", err.message);
	return take_bytes(s, m);
}

/* A source that made no progress for idle-timeout: it said nothing at all
 * (stopped, frozen, cut off), or nothing but keep-alives (its VMM stopped
 * calling); the message says which. */
static int no_progress(struct lmt_session *s)
{
	pthread_mutex_lock(&s->lock);
	uint64_t landed = s->stats.bytes_received;
	pthread_mutex_unlock(&s->lock);
	unsigned long long idle_ms = s->idle_timeout_ns / 1000000;
	uint64_t heard = lmt__ctrl_last_heard(s), now = lmt__now();
	if (heard <= s->destination->progress_ns)
		return lmt__fail(s, LMT_ETIMEDOUT,
		                 "the source said nothing for %llu ms (idle-timeout), %llu bytes "
		                 "landed",
		                 idle_ms, (unsigned long long)landed);
	return lmt__fail(s, LMT_ETIMEDOUT,
	                 "the source made no progress for %llu ms (idle-timeout): nothing but "
	                 "keep-alives (the last %llu ms ago), %llu bytes landed",
	                 idle_ms, (unsigned long long)((now - heard) / 1000000),
	                 (unsigned long long)landed);
}

/* ---- device state and completion ---- */

static int handle_state(struct lmt_session *s, size_t length)
{
	struct lmt_destination_engine *d = s->destination;
	struct lmt_msg_state m;
	struct lmt_error err = {0};
	int rc = lmt__dec_state(s->in, length, &m, &err);
	if (rc)
		return lmt__fail(s, rc, "%s", err.message);
	if (!d->state_len) {
		if (m.offset != 0 || m.total == 0)
			return lmt__fail(s, LMT_EPROTO, "DEVICE_STATE: the first piece is at %llu",
			                 (unsigned long long)m.offset);
		if (m.total > d->state_max)
			return lmt__fail(s, LMT_EOVERFLOW,
			                 "DEVICE_STATE: the source announces %llu bytes, more than "
			                 "max-device-state (%llu)",
			                 (unsigned long long)m.total,
			                 (unsigned long long)d->state_max);
		d->state_len = m.total;
	}
	if (m.total != d->state_len || m.offset != d->state_received)
		return lmt__fail(s, LMT_EPROTO,
		                 "DEVICE_STATE: piece at %llu of %llu, expected at %llu of %llu",
		                 (unsigned long long)m.offset, (unsigned long long)m.total,
		                 (unsigned long long)d->state_received,
		                 (unsigned long long)d->state_len);
	uint64_t need = d->state_received + m.length;
	if (need > d->state_cap) {
		/* Doubling, from what arrived: memory follows the bytes that
		 * came, never the total a peer announced. */
		uint64_t cap = d->state_cap ? 2 * d->state_cap : 64u << 10;
		if (cap < need)
			cap = need;
		if (cap > d->state_len)
			cap = d->state_len;
		uint8_t *buf = malloc(cap);
		if (!buf)
			return lmt__fail(s, LMT_ENOMEM, "device state of %llu bytes: out of memory",
			                 (unsigned long long)cap);
		if (d->state_buf) {
			memcpy(buf, d->state_buf, d->state_received);
			explicit_bzero(d->state_buf, d->state_cap);
			free(d->state_buf);
		}
		d->state_buf = buf;
		d->state_cap = cap;
	}
	memcpy(d->state_buf + m.offset, m.data, m.length);
	d->state_received = need;
	return 0;
}

/* The first block taken by descriptor that was not handed over yet. */
static const char *handover_missing(const struct lmt_session *s)
{
	for (uint32_t i = 0; i < s->nblocks; i++)
		if (s->blocks[i].handover && s->blocks[i].received_fd < 0)
			return s->blocks[i].name;
	return NULL;
}

/* Returns 1 when the migration completed. */
static int handle_complete(struct lmt_session *s, size_t length)
{
	struct lmt_destination_engine *d = s->destination;
	struct lmt_error err = {0};
	struct lmt_msg_complete *m = malloc(sizeof(*m));
	if (!m)
		return lmt__fail(s, LMT_ENOMEM, "out of memory");
	int rc = lmt__dec_complete(s->in, length, m, &err);
	if (rc)
		rc = refuse(s, LMT_MSG_COMPLETE_ACK, LMT_EPROTO, "%s", err.message);
	else if (m->state_length != d->state_received || m->state_length != d->state_len)
		rc = refuse(s, LMT_MSG_COMPLETE_ACK, LMT_EPROTO,
		            "device state: %llu bytes announced, %llu received",
		            (unsigned long long)m->state_length,
		            (unsigned long long)d->state_received);
	else if (handover_missing(s))
		rc = refuse(s, LMT_MSG_COMPLETE_ACK, LMT_EPROTO,
		            "COMPLETE before block '%s' was handed over", handover_missing(s));
	else if (m->digest_count != (s->verify ? s->nblocks : 0))
		rc = refuse(s, LMT_MSG_COMPLETE_ACK, LMT_EPROTO,
		            "COMPLETE carries %u digests, expected %u", m->digest_count,
		            s->verify ? s->nblocks : 0);
	char why[LMT_PROTO_MAX_TEXT];
	if (!rc && s->verify && (rc = lmt__verify_check(s, m->digests, why, sizeof(why))))
		rc = refuse(s, LMT_MSG_COMPLETE_ACK, -rc, "%s", why);
	if (!rc) {
		pthread_mutex_lock(&s->lock);
		s->stats.passes = m->passes;
		pthread_mutex_unlock(&s->lock);
	}
	free(m);
	if (rc)
		return rc;
	rc = send_status(s, LMT_MSG_COMPLETE_ACK, 0, "ok");
	lmt__ctrl_expect_close(s); /* the source is done with it */
	return rc ? rc : 1;
}

static int handle(struct lmt_session *s, const struct lmt_msg_header *h)
{
	switch (h->type) {
	case LMT_MSG_REG_REQ:
		return handle_reg_req(s, h->length);
	case LMT_MSG_DEVICE_STATE:
		return handle_state(s, h->length);
	case LMT_MSG_COMPLETE:
		return handle_complete(s, h->length);
	case LMT_MSG_LANDED:
		return handle_landed(s, h->length);
	case LMT_MSG_DIGESTS:
		return lmt__verify_receive(s, h->length);
	case LMT_MSG_FD_HANDOVER:
		return lmt__handover_receive(s, h->length);
	case LMT_MSG_POSTCOPY_PAGES:
		return lmt__postcopy_pages(s, h->length);
	case LMT_MSG_POSTCOPY:
		if (s->destination->state_received != s->destination->state_len)
			return lmt__fail(s, LMT_EPROTO,
			                 "POSTCOPY with %llu of %llu bytes of device state",
			                 (unsigned long long)s->destination->state_received,
			                 (unsigned long long)s->destination->state_len);
		return lmt__postcopy_switch(s, h->length, s->destination->state_received);
	default:
		return lmt__fail(s, LMT_EPROTO,
		                 "unexpected %s from the source during the migration",
		                 lmt__msg_name(h->type));
	}
}

/* Drive the plugin and the control connection until COMPLETE. A source
 * whose keep-alives are all that arrives for idle-timeout fails the load:
 * it stalled, or only holds the destination. */
static int load(struct lmt_session *s)
{
	struct lmt_destination_engine *d = s->destination;
	bool target = s->caps & LMT_CAP_TARGET_PROGRESS;
	struct lmt_completion comps[16];
	d->progress_ns = lmt__now();
	for (;;) {
		if (lmt__is_cancelled(s))
			return lmt__fail(s, LMT_ECANCELED, "migration cancelled");
		/* Messages waiting are progress not taken yet. */
		if (lmt__now() - d->progress_ns > s->idle_timeout_ns && !lmt__ctrl_queued(s))
			return no_progress(s);
		int n = s->desc->ops.progress(s->inst, comps, 16, target ? TARGET_SLICE_NS : 0);
		if (n < 0)
			return lmt__fail(s, n, "plugin %s: progress failed (%s)", s->desc->name,
			                 lmt_err_name(n));
		/* Without target progress to drive, the wait is for the source. */
		uint64_t wait = target ? 0 : CONTROL_SLICE_MS * 1000000ull;
		if (lmt__ctrl_wait(s, lmt__now() + wait)) {
			struct lmt_msg_header h;
			int rc = lmt__ctrl_recv(s, &h, lmt__now() + s->idle_timeout_ns);
			if (rc == 0) {
				d->progress_ns = lmt__now();
				rc = handle(s, &h);
			}
			if (rc)
				return rc;
		}
	}
}

/* Find the source among whoever connects (see the lobby above), then
 * start the control connection on it. `fd` is an already connected
 * source (lmt__load_connected), or -1 to accept on the listening socket. */
static int accept_source(struct lmt_session *s, int fd)
{
	struct lmt_destination_engine *d = s->destination;
	uint64_t accepted_ns = lmt__now();
	d->state_max = (uint64_t)lmt__opt_int(s->opts, "max-device-state");
	lmt__tls *tls = NULL;
	int rc = find_source(s, d->listen_fd, fd >= 0 ? 0 : s->idle_timeout_ns, &fd, &tls,
	                     &accepted_ns);
	close_listener(d);
	if (rc)
		return rc;
	s->ctrl_fd = fd;
	lmt__net_tune(s->ctrl_fd, 1, 0);
	if (s->ctrl_unix && (rc = lmt__handover_check_peer(s)))
		return rc;
	pthread_mutex_lock(&s->lock);
	s->start_ns = accepted_ns;
	pthread_mutex_unlock(&s->lock);
	if (tls && (rc = lmt__tls_session_adopt(s, tls)))
		return rc;
	return lmt__ctrl_start(s);
}

/* Everything after the source was accepted: its HELLO passed (and its
 * proof of the key); setup keeps to connect-timeout from its accept. */
static int serve(struct lmt_session *s)
{
	int rc;
	uint64_t deadline = s->start_ns + s->connect_timeout_ns;
	if ((rc = check_blocks(s, deadline)))
		return rc;
	if (s->ctrl_unix && (rc = lmt__handover_negotiate_destination(s, deadline)))
		return rc;
	if ((rc = open_channels(s, deadline)))
		return rc;
	if (s->pin_all && (rc = register_all(s)))
		return rc;
	if ((rc = lmt__ctrl_send_empty(s, LMT_MSG_READY)))
		return rc;
	atomic_store(&s->state, LMT_STATE_ACTIVE);
	pthread_mutex_lock(&s->lock);
	s->stats.status = LMT_STATUS_ACTIVE;
	s->stats.setup_ns = lmt__now() - s->start_ns;
	pthread_mutex_unlock(&s->lock);
	lmt__event_simple(s, LMT_EVENT_SETUP_DONE, 0);
	rc = load(s);
	return rc == 1 ? 0 : rc;
}

static int begin_load(struct lmt_session *s, int from_state)
{
	if (s->role != LMT_ROLE_DESTINATION)
		return lmt__usage(s, LMT_ESTATE, "load run: this session is a source");
	if (!atomic_compare_exchange_strong(&s->state, &from_state, LMT_STATE_SETUP))
		return lmt__usage(s, LMT_ESTATE, "load run: call lmt_load_listen first, once");
	pthread_mutex_lock(&s->lock);
	s->stats.status = LMT_STATUS_SETUP;
	pthread_mutex_unlock(&s->lock);
	return 0;
}

static int end_load(struct lmt_session *s, int rc)
{
	if (rc) {
		lmt__postcopy_free(s); /* its thread first: it drives the plugin */
		lmt__handover_undo(s);
		return lmt__abort(s, rc);
	}
	pthread_mutex_lock(&s->lock);
	if (!s->stats.resume_ns)
		s->stats.resume_ns = lmt__now() - s->start_ns;
	bool lazy = s->lazy || s->postcopy;
	pthread_mutex_unlock(&s->lock);
	/* restore=lazy or postcopy: the guest may run; the pages come in
	 * until lmt_load_finish. */
	if (lazy)
		return 0;
	lmt__file_free(s);
	lmt__transport_close(s);
	lmt__ctrl_close(s);
	pthread_mutex_lock(&s->lock);
	lmt__stats_end(s, LMT_STATUS_COMPLETED);
	pthread_mutex_unlock(&s->lock);
	atomic_store(&s->state, LMT_STATE_DONE);
	lmt__event_simple(s, LMT_EVENT_COMPLETED, 0);
	return 0;
}

/* restore=lazy is for a file: restore; a migration's load is whole when
 * it returns (postcopy is not there yet). */
static int check_restore_mode(struct lmt_session *s)
{
	pthread_mutex_lock(&s->opts_lock);
	bool lazy = strcmp(lmt__opt_text(s->opts, "restore"), "lazy") == 0;
	bool postcopy = lmt__opt_bool(s->opts, "postcopy");
	bool allowed = lmt__opt_bool(s->opts, "userfaultfd");
	pthread_mutex_unlock(&s->opts_lock);
	/* Postcopy needs userfaultfd here: say so before any source comes. */
	struct lmt__uffd *u = NULL;
	struct lmt_error err = {0};
	if (postcopy && !s->file_path && lmt__uffd_open(&u, 0, allowed, &err))
		return lmt__usage(s, err.code, "load run: postcopy=on: %s", err.message);
	lmt__uffd_close(u);
	if (lazy && !s->file_path)
		return lmt__usage(s, LMT_EINVAL,
		                  "load run: restore=lazy applies to a file: restore only; this "
		                  "session listens for a source");
	return 0;
}

static int load_run(lmt_session *s)
{
	int rc = check_restore_mode(s);
	if (!rc)
		rc = begin_load(s, LMT_STATE_LISTENING);
	if (rc)
		return rc;
	rc = lmt__session_prepare(s);
	if (!rc && s->file_path)
		return end_load(s, lmt__file_restore(s));
	if (!rc)
		rc = accept_source(s, -1);
	if (!rc)
		rc = serve(s);
	return end_load(s, rc);
}

int lmt_load_run(lmt_session *s)
{
	if (!s)
		return -LMT_EINVAL;
	if (lmt__job_owns(s))
		return lmt__usage(s, LMT_ESTATE,
		                  "load run: a job started with lmt_load_start runs this session");
	lmt__call_enter(s);
	int rc = load_run(s);
	lmt__call_leave(s);
	return rc;
}

int lmt_load_finish(lmt_session *s)
{
	if (!s)
		return -LMT_EINVAL;
	if (s->role != LMT_ROLE_DESTINATION)
		return lmt__usage(s, LMT_ESTATE, "load finish: this session is a source");
	int state = atomic_load(&s->state);
	if (state == LMT_STATE_DONE)
		return 0;
	if (state == LMT_STATE_FAILED)
		return lmt__usage(s, LMT_ESTATE, "load finish: the load failed: %s",
		                  lmt_session_error(s)->message);
	pthread_mutex_lock(&s->lock);
	bool lazy = (s->lazy || s->postcopy) && !s->finishing;
	s->finishing = lazy;
	pthread_mutex_unlock(&s->lock);
	if (!lazy)
		return lmt__usage(s, LMT_ESTATE,
		                  "load finish: no load to finish (lmt_load_run must return 0 "
		                  "first, and only one call waits)");
	lmt__call_enter(s);
	int rc = end_load(s, s->lazy ? lmt__lazy_finish(s) : lmt__postcopy_finish(s));
	lmt__call_leave(s);
	return rc;
}

int lmt__load_connected(struct lmt_session *s, int fd)
{
	int rc = begin_load(s, LMT_STATE_NEW);
	if (rc)
		return rc;
	rc = lmt__session_prepare(s);
	if (!rc)
		rc = accept_source(s, fd);
	else
		close(fd);
	if (!rc)
		rc = serve(s);
	return end_load(s, rc);
}

void lmt__destination_take_state(struct lmt_session *s, uint8_t *buf, uint64_t length)
{
	struct lmt_destination_engine *d = s->destination;
	if (d->state_buf)
		explicit_bzero(d->state_buf, d->state_cap);
	free(d->state_buf);
	d->state_buf = buf;
	d->state_cap = length;
	d->state_len = length;
	d->state_received = length;
}

int lmt_load_device_state(lmt_session *s, const void **data, size_t *length)
{
	if (!s)
		return -LMT_EINVAL;
	if (!data || !length)
		return lmt__usage(s, LMT_EINVAL, "device state: data and length are required");
	struct lmt_destination_engine *d = s->destination;
	pthread_mutex_lock(&s->lock);
	bool resumed = s->lazy != NULL || s->postcopy != NULL;
	pthread_mutex_unlock(&s->lock);
	if (s->role != LMT_ROLE_DESTINATION ||
	    (atomic_load(&s->state) != LMT_STATE_DONE && !resumed))
		return lmt__usage(s, LMT_ESTATE,
		                  "device state: only after a completed load (or, with "
		                  "restore=lazy, once lmt_load_run returned 0)");
	*data = d->state_buf;
	*length = d->state_len;
	return 0;
}
