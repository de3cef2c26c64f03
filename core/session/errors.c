/* The session's error object (session room): the first failure, refused
 * calls, what may take a failure's place, and the one rule of error codes
 * (docs/embedding.md, "Error codes") with the races it settles. What it
 * needs of the control connection comes through s->up. */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "error.h"
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
	int rc = s->up->ctrl_failure(s);
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

bool lmt__fail_maybe_consequence(const struct lmt_session *s)
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
	bool consequence = lmt__fail_maybe_consequence(s) && !atomic_load(&s->failure_posted) &&
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
