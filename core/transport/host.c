/* The host services the core lends to a plugin (struct lmt_host): logging
 * and errors into the session, the clock, option lookup, cancellation, the
 * plugin a decorator wraps, and fault injection. host_ctx is the session.
 * Room: transport; may use: base, wire, session, control. */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <sys/socket.h>

#include "error.h"
#include "session.h"
#include "control.h"
#include "transport.h"

static void host_log(void *ctx, enum lmt_log_level level, const char *fmt, ...) LMT_PRINTF(3, 4);
static int host_error(void *ctx, int code, const char *fmt, ...) LMT_PRINTF(3, 4);

static void host_log(void *ctx, enum lmt_log_level level, const char *fmt, ...)
{
	struct lmt_session *s = ctx;
	char msg[900];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	lmt__session_log(s, level, "%s: %s", s->desc->name, msg);
}

static int host_error(void *ctx, int code, const char *fmt, ...)
{
	struct lmt_session *s = ctx;
	char msg[480];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	/* LMT_EPEER is the core's to say (the peer's ERROR), not a plugin's. */
	int c = code < 0 ? -code : code;
	if (c >= LMT_ERRC_COUNT || c == 0 || c == LMT_EPEER)
		code = LMT_EIO;
	lmt__session_log(s, LMT_LOG_DEBUG, "%s: %s", s->desc->name, msg);
	/* A blocking call that stopped because the peer left or went silent
	 * (see host_cancelled) failed for that, not for a cancel: lmt__fail
	 * records the control connection's own failure then. */
	return lmt__fail_transport(s, code, "%s", msg);
}

static uint64_t host_now(void *ctx)
{
	return lmt__now();
}

static int host_option(void *ctx, const char *name, struct lmt_option_value *out)
{
	struct lmt_session *s = ctx;
	pthread_mutex_lock(&s->opts_lock); /* a runtime option may change meanwhile */
	int rc = lmt__optset_get(s->opts, name, out);
	pthread_mutex_unlock(&s->opts_lock);
	return rc;
}

/* Cancelled, the session failed and is being torn down, or the peer hung
 * up the control connection: a blocking plugin call has nothing left to
 * wait for. */
static int host_cancelled(void *ctx)
{
	struct lmt_session *s = ctx;
	return lmt__is_cancelled(s) || atomic_load(&s->aborting) || lmt__peer_gone(s);
}

static const struct lmt_plugin *host_inner(void *ctx)
{
	struct lmt_session *s = ctx;
	return s->inner;
}

/* Plugin threads end before the control socket is closed, so a shutdown
 * here never races with a close. */
static void host_inject(void *ctx, enum lmt_fault fault)
{
	struct lmt_session *s = ctx;
	if (fault == LMT_FAULT_DROP_CONTROL && s->ctrl_fd >= 0) {
		lmt__session_log(s, LMT_LOG_INFO, "%s: dropping the control connection",
		                 s->desc->name);
		shutdown(s->ctrl_fd, SHUT_RDWR);
	}
}

const struct lmt_host lmt__host_services = {
        .abi_version = LMT_PLUGIN_ABI_VERSION,
        .struct_size = sizeof(struct lmt_host),
        .log = host_log,
        .error = host_error,
        .now_ns = host_now,
        .option = host_option,
        .cancelled = host_cancelled,
        .inner = host_inner,
        .inject = host_inject,
};
