/* How a session fails: its error object (the first failure, refused
 * calls, what may take a failure's place), the one rule of error codes
 * (docs/embedding.md, "Error codes") with the races it settles, the
 * FAILED event, and the end of a failed migration (lmt__abort). */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "error.h"
#include "file.h"
#include "session.h"

static const char *peer_of(const struct lmt_session *s)
{
	return s->role == LMT_ROLE_SOURCE ? "destination" : "source";
}

/* LMT_ECANCELED is this side's lmt_cancel alone. A plugin's blocking call
 * also stops when the host says so because the peer hung up or the
 * session is failing (host->cancelled): that failure is the connection's,
 * recorded as it told the control connection, or as LMT_ECONN. */
static int not_cancelled(struct lmt_session *s, const char *fmt, va_list ap) LMT_PRINTF(2, 0);

static int not_cancelled(struct lmt_session *s, const char *fmt, va_list ap)
{
	int rc = lmt__ctrl_failure(s);
	if (rc)
		return rc;
	char msg[sizeof(s->error.message)];
	vsnprintf(msg, sizeof(msg), fmt, ap);
	return lmt__fail(s, LMT_ECONN, "%s (the %s is gone)", msg, peer_of(s));
}

/* The first failure stays: later ones are usually its consequences. A
 * refused call is reported until the next error, and never hides a
 * failure; after a completion, only refused calls are reported. */
enum origin {
	USAGE,     /* a refused call */
	FAILURE,   /* the core's own */
	TRANSPORT, /* the plugin's (host->error) */
};

static int record(struct lmt_session *s, enum origin from, int code, const char *fmt, va_list ap)
        LMT_PRINTF(4, 0);

static int record(struct lmt_session *s, enum origin from, int code, const char *fmt, va_list ap)
{
	bool usage = from == USAGE;
	code = code > 0 ? -code : code;
	if (!usage && code == -LMT_ECANCELED && !lmt__is_cancelled(s))
		return not_cancelled(s, fmt, ap);
	pthread_mutex_lock(&s->lock);
	bool failed = s->error.code != 0 && !s->error_is_usage;
	if (!failed && (usage || atomic_load(&s->state) != LMT_STATE_DONE)) {
		lmt__verror(&s->error, code, fmt, ap);
		s->error_is_usage = usage;
		s->error_is_transport = from == TRANSPORT;
	}
	pthread_mutex_unlock(&s->lock);
	return code;
}

/* A failure the peer's own end may have caused: a connection that died, or
 * anything the transport saw go wrong once the peer tore its side down;
 * never this side's own cancel. */
static bool maybe_consequence(const struct lmt_session *s)
{
	return s->error.code && !s->error_is_usage && s->error.code != -LMT_ECANCELED &&
	       (s->error.code == -LMT_ECONN || s->error_is_transport);
}

int lmt__fail(struct lmt_session *s, int code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	code = record(s, FAILURE, code, fmt, ap);
	va_end(ap);
	return code;
}

int lmt__fail_transport(struct lmt_session *s, int code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	code = record(s, TRANSPORT, code, fmt, ap);
	va_end(ap);
	return code;
}

/* With s->lock held: `msg` takes the recorded failure's place, keeping
 * its text in parentheses as the cause. */
static void replace_locked(struct lmt_session *s, int code, const char *msg)
{
	if (s->error.code && !s->error_is_usage) {
		char cause[sizeof(s->error.message)];
		memcpy(cause, s->error.message, sizeof(cause));
		lmt__error(&s->error, code, "%s (%s)", msg, cause);
	} else {
		lmt__error(&s->error, code, "%s", msg);
	}
	s->error_is_usage = false;
	s->error_is_transport = false;
}

int lmt__fail_over(struct lmt_session *s, int code, const char *fmt, ...)
{
	char msg[sizeof(s->error.message)];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	code = code > 0 ? -code : code;
	pthread_mutex_lock(&s->lock);
	if (atomic_load(&s->state) != LMT_STATE_DONE)
		replace_locked(s, code, msg);
	pthread_mutex_unlock(&s->lock);
	return code;
}

int lmt__fail_peer(struct lmt_session *s, const char *why)
{
	pthread_mutex_lock(&s->lock);
	bool failed = s->error.code != 0 && !s->error_is_usage;
	/* The peer tears its transport down after its ERROR: what failed here
	 * meanwhile is the consequence, unless already reported. */
	bool consequence = maybe_consequence(s) && !atomic_load(&s->failure_posted) &&
	                   atomic_load(&s->state) != LMT_STATE_FAILED;
	if (atomic_load(&s->state) != LMT_STATE_DONE && (!failed || consequence))
		replace_locked(s, LMT_EPEER, why);
	int code = s->error.code;
	pthread_mutex_unlock(&s->lock);
	return code ? code : -LMT_EPEER;
}

int lmt__usage(struct lmt_session *s, int code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	code = record(s, USAGE, code, fmt, ap);
	va_end(ap);
	return code;
}

/* The status a failure ends with: postcopy-failed after the switch,
 * cancelled exactly when the code is this side's own cancel. */
static enum lmt_status failed_status(struct lmt_session *s)
{
	return atomic_load(&s->in_postcopy)      ? LMT_STATUS_POSTCOPY_FAILED
	       : s->error.code == -LMT_ECANCELED ? LMT_STATUS_CANCELLED
	                                         : LMT_STATUS_FAILED;
}

/* A connection that died, or a transport that failed, may be the peer's
 * doing: it sends its ERROR, then tears its transport down, and a channel
 * can break here before the control connection's thread has read the
 * ERROR. Wait briefly for the control connection's last word (see
 * LMT__SETTLE_NS), so that the failure is reported as the peer said
 * (LMT_EPEER) or as it was seen here. */
static void settle(struct lmt_session *s)
{
	pthread_mutex_lock(&s->lock);
	bool wait = maybe_consequence(s);
	pthread_mutex_unlock(&s->lock);
	if (wait)
		lmt__ctrl_settle(s, LMT__SETTLE_QUIET_NS, lmt__now() + LMT__SETTLE_NS);
}

/* The FAILED event, once per session, with the code recorded. */
static void post_failure(struct lmt_session *s)
{
	if (s->source)
		lmt__source_release_throttle(s);
	/* Under the lock that lmt__fail_peer takes: once posted, the code
	 * stays. */
	pthread_mutex_lock(&s->lock);
	int code = s->error.code;
	bool first = !atomic_exchange(&s->failure_posted, 1);
	pthread_mutex_unlock(&s->lock);
	if (first)
		lmt__event_simple(s, LMT_EVENT_FAILED, code);
}

/* Tell the peer why, unless the peer ended it. */
static void tell_peer(struct lmt_session *s, const struct lmt_msg_status *st)
{
	if (st->code != -LMT_EPEER)
		lmt__ctrl_send_error(s, st);
}

/* Tell the peer (best effort, briefly), release the transport. */
int lmt__abort(struct lmt_session *s, int code)
{
	settle(s);
	pthread_mutex_lock(&s->lock);
	if (s->error.code == 0 || s->error_is_usage) {
		lmt__error(&s->error, code ? code : LMT_EIO, "%s", lmt_strerror(code));
		s->error_is_usage = s->error_is_transport = false;
	}
	code = s->error.code;
	struct lmt_msg_status st = {.code = code};
	lmt__copy(st.text, sizeof(st.text), s->error.message);
	lmt__stats_end(s, failed_status(s));
	pthread_mutex_unlock(&s->lock);
	atomic_store(&s->state, LMT_STATE_FAILED);
	tell_peer(s, &st);
	/* From here a plugin's waits in teardown end soon (host cancelled). */
	atomic_store(&s->aborting, 1);
	lmt__file_free(s);
	lmt__transport_close(s);
	lmt__ctrl_close(s);
	lmt__session_log(s, LMT_LOG_INFO, "migration failed: %s", s->error.message);
	post_failure(s);
	return code;
}

void lmt__postcopy_failed(struct lmt_session *s, int code)
{
	settle(s);
	pthread_mutex_lock(&s->lock);
	if (s->error.code == 0 || s->error_is_usage) {
		lmt__error(&s->error, code ? code : LMT_EIO, "%s", lmt_strerror(code));
		s->error_is_usage = s->error_is_transport = false;
	}
	lmt__stats_end(s, LMT_STATUS_POSTCOPY_FAILED);
	struct lmt_msg_status st = {.code = s->error.code};
	lmt__copy(st.text, sizeof(st.text), s->error.message);
	pthread_mutex_unlock(&s->lock);
	/* The peer hears of it now, not when the VMM calls to finish. */
	tell_peer(s, &st);
	post_failure(s);
}

void lmt__session_async_failure(struct lmt_session *s, int code, const char *why)
{
	/* Inside a call, or with messages still queued before the failure,
	 * the engine reports it, in order. */
	int state = atomic_load(&s->state);
	if ((state != LMT_STATE_SETUP && state != LMT_STATE_ACTIVE) || atomic_load(&s->in_call) ||
	    atomic_load(&s->in_postcopy) || lmt__ctrl_queued(s))
		return;
	if (code == -LMT_EPEER || code == LMT_EPEER)
		lmt__fail_peer(s, why);
	else
		lmt__fail(s, code, "%s", why);
	pthread_mutex_lock(&s->lock);
	if (s->stats.status != LMT_STATUS_COMPLETED)
		lmt__stats_end(s, failed_status(s));
	pthread_mutex_unlock(&s->lock);
	post_failure(s);
}

/* What lmt_session_error gives for no session, so that
 * lmt_session_error(s)->message is safe after a failed lmt_session_new. */
static const struct lmt_error no_session = {
        .code = -LMT_EINVAL,
        .message = "no session (lmt_session_error was given NULL)",
};

const struct lmt_error *lmt_session_error(const lmt_session *s)
{
	return s ? &s->error : &no_session;
}
