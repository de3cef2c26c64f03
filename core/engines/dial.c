/* The source's way in: connect to the destination, TLS with tls=on, HELLO
 * and the proofs of the key. A destination crowded by strangers may drop
 * a connection before it authenticated (docs/security.md, "Strangers on
 * the network"); the source then connects and says HELLO again, after a
 * backoff that doubles up to a second, until connect-timeout. Only such a
 * drop is tried again: a refusal (a HELLO_REPLY that says why, a TLS alert,
 * a wrong proof) and anything after an accepted HELLO end setup.
 * Room: engines; may use: every room below it. */
#define _GNU_SOURCE
#include "dial.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "auth.h"
#include "error.h"
#include "net.h"
#include "session.h"
#include "tls_session.h"
#include "control.h"
#include "handover.h"

#define DIAL_BACKOFF_FIRST_NS 20000000ull /* 20 ms, then doubling */
#define DIAL_BACKOFF_MAX_NS 1000000000ull
#define DIAL_NAP_NS 10000000ull /* a backoff is slept in slices: cancel ends it */

/* A failure the destination's dropping the connection explains: closed or
 * reset, without a word. Through TLS that is only trusted during the
 * handshake, where a refusal comes as an alert (another code); after it a
 * refusal of this source's certificate arrives as an alert that can race
 * with the connection's end, so there the destination's explicit "crowded
 * out" (LMT_EAGAIN in HELLO_REPLY) is what is tried again. */
static bool dropped(int rc)
{
	return rc == -LMT_ECONN;
}

static int connect_control(struct lmt_session *s, const char *uri, uint64_t deadline, bool *retry)
{
	struct sockaddr_storage addr;
	socklen_t alen;
	struct lmt__net_error ne;
	int rc = lmt__net_parse(uri, &addr, &alen, &ne);
	if (rc)
		return lmt__fail(s, rc, "%s", ne.msg);
	struct lmt__wait w = lmt__wait_until(s, deadline);
	/* A refused connect is tried again in there, until the deadline; one
	 * reset before it was seen made is a drop. */
	rc = lmt__net_connect((struct sockaddr *)&addr, alen, &w, &s->ctrl_fd, &ne);
	*retry = dropped(rc) && lmt__now() < deadline;
	if (rc)
		return lmt__fail(s, rc, "control connection: %s", ne.msg);
	lmt__net_tune(s->ctrl_fd, 1, 0);
	s->ctrl_unix = addr.ss_family == AF_UNIX;
	if (s->ctrl_unix && (rc = lmt__handover_check_peer(s)))
		return rc;
	rc = lmt__tls_session_connect(s, deadline);
	*retry = dropped(rc);
	return rc ? rc : lmt__ctrl_start(s);
}

static int add_match_option(void *opaque, const char *name, const struct lmt_option_desc *d,
                            const struct lmt_option_value *v, const char *text,
                            enum lmt_opt_source src)
{
	struct lmt_msg_hello *m = opaque;
	if (!(d->flags & LMT_OPTF_MATCH) || (d->flags & LMT_OPTF_SECRET))
		return 0;
	if (m->option_count == LMT_PROTO_MAX_OPTIONS)
		return -LMT_EOVERFLOW;
	struct lmt_msg_option *o = &m->options[m->option_count++];
	snprintf(o->name, sizeof(o->name), "%s", name);
	snprintf(o->value, sizeof(o->value), "%s", text);
	return 0;
}

/* Check the destination's proof of the key and send ours. */
static int authenticate(struct lmt_session *s, const struct lmt_msg_hello *hello,
                        const struct lmt_msg_status *st)
{
	if (st->auth && !s->auth.bytes)
		return lmt__fail(s, LMT_EAUTH,
		                 "the destination requires authentication: set auth-key or "
		                 "auth-key-file");
	if (!st->auth && s->auth.bytes)
		return lmt__fail(s, LMT_EAUTH,
		                 "the destination does not authenticate (it has no auth-key): "
		                 "refusing to send it guest memory");
	if (!st->auth)
		return 0;
	uint8_t want[LMT_AUTH_PROOF], mine[LMT_AUTH_PROOF];
	int rc = lmt__auth_proof(&s->auth, LMT_AUTH_LABEL_DESTINATION, hello->nonce, st->nonce,
	                         want);
	bool equal = !rc && lmt__auth_equal(want, st->proof);
	explicit_bzero(want, sizeof(want)); /* the right answer to an impostor */
	if (!rc && !equal)
		return lmt__fail(s, LMT_EAUTH,
		                 "authentication failed: the destination does not hold this key");
	if (!rc)
		rc = lmt__auth_proof(&s->auth, LMT_AUTH_LABEL_SOURCE, st->nonce, hello->nonce,
		                     mine);
	if (!rc)
		rc = lmt__enc_auth(&s->out, mine);
	return rc ? lmt__fail(s, rc, "computing the authentication proof") : lmt__ctrl_send(s);
}

/* HELLO, its reply, and with a key the proofs. */
static int say_hello(struct lmt_session *s, uint64_t deadline, bool *retry)
{
	struct lmt_msg_hello *hello = calloc(1, sizeof(*hello));
	if (!hello)
		return lmt__fail(s, LMT_ENOMEM, "out of memory");
	hello->magic = LMT_PROTO_MAGIC;
	hello->version = LMT_PROTO_VERSION;
	hello->auth = s->auth.bytes != NULL;
	snprintf(hello->plugin, sizeof(hello->plugin), "%s", s->wire_name);
	int rc = lmt__auth_nonce(hello->nonce);
	if (!rc) {
		pthread_mutex_lock(&s->opts_lock);
		rc = lmt__optset_foreach(s->opts, add_match_option, hello);
		pthread_mutex_unlock(&s->opts_lock);
	}
	if (!rc)
		rc = lmt__enc_hello(&s->out, hello);
	if (rc)
		rc = lmt__fail(s, rc, "encoding HELLO");
	else
		*retry = dropped(rc = lmt__ctrl_send(s)) && !s->tls;
	struct lmt_msg_header h;
	struct lmt_msg_status st;
	struct lmt_error err = {0};
	if (!rc)
		*retry = dropped(rc = lmt__ctrl_expect(s, LMT_MSG_HELLO_REPLY, deadline, &h)) &&
		         !s->tls;
	if (!rc && (rc = lmt__dec_status(s->in, h.length, LMT_MSG_HELLO_REPLY, &st, &err)))
		lmt__fail(s, rc, "%s", err.message);
	if (!rc && st.code) {
		*retry = st.code == -LMT_EAGAIN;
		rc = lmt__fail(s, st.code, "the destination refused: %s", st.text);
	}
	if (!rc)
		rc = authenticate(s, hello, &st);
	free(hello);
	return rc;
}

/* Sleep `ns`, or less when cancelled. */
static void nap(struct lmt_session *s, uint64_t ns)
{
	uint64_t end = lmt__now() + ns;
	for (uint64_t now = lmt__now(); now < end && !lmt__is_cancelled(s); now = lmt__now()) {
		uint64_t slice = end - now < DIAL_NAP_NS ? end - now : DIAL_NAP_NS;
		struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)slice};
		nanosleep(&ts, NULL);
	}
}

/* Undo a dropped attempt: its connection, and its failure, which is not
 * the session's. */
static void forget_attempt(struct lmt_session *s, const struct lmt_error *before, bool before_usage)
{
	lmt__ctrl_close(s);
	atomic_store(&s->peer_gone, 0);
	atomic_store(&s->peer_checked_ns, 0);
	pthread_mutex_lock(&s->lock);
	s->error = *before;
	s->error_is_usage = before_usage;
	pthread_mutex_unlock(&s->lock);
}

int lmt__source_dial(struct lmt_session *s, const char *uri, int fd, uint64_t deadline)
{
	bool retry = false;
	if (fd >= 0) { /* a socket given: nothing to connect again */
		s->ctrl_fd = fd;
		lmt__net_tune(s->ctrl_fd, 1, 0);
		int rc = lmt__ctrl_start(s);
		return rc ? rc : say_hello(s, deadline, &retry);
	}
	uint64_t backoff = DIAL_BACKOFF_FIRST_NS;
	for (unsigned attempt = 1;; attempt++) {
		pthread_mutex_lock(&s->lock);
		struct lmt_error before = s->error;
		bool before_usage = s->error_is_usage;
		pthread_mutex_unlock(&s->lock);
		retry = false;
		int rc = connect_control(s, uri, deadline, &retry);
		if (!rc)
			rc = say_hello(s, deadline, &retry);
		if (!rc)
			return 0;
		if (!retry || lmt__is_cancelled(s))
			return rc;
		if (lmt__now() + backoff >= deadline)
			return lmt__fail_over(
			        s, rc,
			        "control connection: the destination dropped it before "
			        "authentication %u time%s within connect-timeout "
			        "(%llu ms)",
			        attempt, attempt == 1 ? "" : "s",
			        (unsigned long long)(s->connect_timeout_ns / 1000000));
		pthread_mutex_lock(&s->lock);
		char why[sizeof(s->error.message)];
		memcpy(why, s->error.message, sizeof(why));
		pthread_mutex_unlock(&s->lock);
		lmt__session_log(s, LMT_LOG_WARN,
		                 "control connection: the destination dropped it before "
		                 "authentication (%s); connecting again in %llu ms (attempt %u)",
		                 why, (unsigned long long)(backoff / 1000000), attempt + 1);
		forget_attempt(s, &before, before_usage);
		nap(s, backoff);
		if (lmt__is_cancelled(s))
			return lmt__fail(s, LMT_ECANCELED, "control connection: cancelled");
		backoff = backoff * 2 < DIAL_BACKOFF_MAX_NS ? backoff * 2 : DIAL_BACKOFF_MAX_NS;
	}
}
