/* How a session fails (session room): the status it ends with, the wait
 * for the peer's last word, the FAILED event, a failure found on a
 * postcopy thread or by the control connection's thread. The error object
 * it records into is errors.c's. The end of a failed migration that
 * releases the transport and the target is lmt__abort's
 * (core/engines/abort.c). What it needs of the control connection and the
 * source engine comes through s->up (struct lmt__upcalls). */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "error.h"
#include "session.h"

/* The status a failure ends with: postcopy-failed after the switch,
 * cancelled exactly when the code is this side's own cancel. */
enum lmt_status lmt__failed_status(struct lmt_session *s)
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
void lmt__fail_settle(struct lmt_session *s)
{
	pthread_mutex_lock(&s->lock);
	bool wait = lmt__fail_maybe_consequence(s);
	pthread_mutex_unlock(&s->lock);
	if (wait)
		s->up->ctrl_settle(s, LMT__SETTLE_QUIET_NS, lmt__now() + LMT__SETTLE_NS);
}

/* The FAILED event, once per session, with the code recorded. */
void lmt__fail_post(struct lmt_session *s)
{
	if (s->source)
		s->up->release_throttle(s);
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
void lmt__fail_tell_peer(struct lmt_session *s, const struct lmt_msg_status *st)
{
	if (st->code != -LMT_EPEER)
		s->up->ctrl_send_error(s, st);
}

void lmt__postcopy_failed(struct lmt_session *s, int code)
{
	lmt__fail_settle(s);
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
	lmt__fail_tell_peer(s, &st);
	lmt__fail_post(s);
}

void lmt__session_async_failure(struct lmt_session *s, int code, const char *why)
{
	/* Inside a call, or with messages still queued before the failure,
	 * the engine reports it, in order. */
	int state = atomic_load(&s->state);
	if ((state != LMT_STATE_SETUP && state != LMT_STATE_ACTIVE) || atomic_load(&s->in_call) ||
	    atomic_load(&s->in_postcopy) || s->up->ctrl_queued(s))
		return;
	if (code == -LMT_EPEER || code == LMT_EPEER)
		lmt__fail_peer(s, why);
	else
		lmt__fail(s, code, "%s", why);
	pthread_mutex_lock(&s->lock);
	if (s->stats.status != LMT_STATUS_COMPLETED)
		lmt__stats_end(s, lmt__failed_status(s));
	pthread_mutex_unlock(&s->lock);
	lmt__fail_post(s);
}
