/* Error names and messages, error objects, and the one logging path.
 * Room: base; may use: ABI, common. */
#define _GNU_SOURCE
#include "error.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const struct {
	const char *name;
	const char *text;
} errors[LMT_ERRC_COUNT] = {
        [LMT_OK] = {"LMT_OK", "success"},
        [LMT_EINVAL] = {"LMT_EINVAL", "invalid argument"},
        [LMT_ENOMEM] = {"LMT_ENOMEM", "out of memory"},
        [LMT_EAGAIN] = {"LMT_EAGAIN", "resource temporarily unavailable"},
        [LMT_ETIMEDOUT] = {"LMT_ETIMEDOUT", "timed out"},
        [LMT_ECANCELED] = {"LMT_ECANCELED", "cancelled"},
        [LMT_ECONN] = {"LMT_ECONN", "connection failed or lost"},
        [LMT_EPROTO] = {"LMT_EPROTO", "protocol error"},
        [LMT_ENOTFOUND] = {"LMT_ENOTFOUND", "not found"},
        [LMT_EABI] = {"LMT_EABI", "incompatible plugin ABI"},
        [LMT_ENOTSUP] = {"LMT_ENOTSUP", "not supported"},
        [LMT_EIO] = {"LMT_EIO", "transport I/O error"},
        [LMT_ESTATE] = {"LMT_ESTATE", "wrong session state"},
        [LMT_EMISMATCH] = {"LMT_EMISMATCH", "source and destination disagree"},
        [LMT_EVERIFY] = {"LMT_EVERIFY", "verification failed"},
        [LMT_EAUTH] = {"LMT_EAUTH", "authentication failed"},
        [LMT_EOVERFLOW] = {"LMT_EOVERFLOW", "value too large"},
        [LMT_EPEER] = {"LMT_EPEER", "the peer ended the migration"},
};

static int index_of(int code)
{
	int c = code < 0 ? -code : code;
	return c < LMT_ERRC_COUNT ? c : -1;
}

const char *lmt_err_name(int code)
{
	int i = index_of(code);
	return i < 0 ? "LMT_E?" : errors[i].name;
}

const char *lmt_strerror(int code)
{
	int i = index_of(code);
	return i < 0 ? "unknown error" : errors[i].text;
}

int lmt__verror(struct lmt_error *err, int code, const char *fmt, va_list ap)
{
	if (code > 0)
		code = -code;
	if (err) {
		err->code = code;
		vsnprintf(err->message, sizeof(err->message), fmt, ap);
	}
	return code;
}

int lmt__error(struct lmt_error *err, int code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int rc = lmt__verror(err, code, fmt, ap);
	va_end(ap);
	return rc;
}

void lmt__error_clear(struct lmt_error *err)
{
	if (err) {
		err->code = 0;
		err->message[0] = '\0';
	}
}

/* ---- logging ---- */

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static lmt_log_fn log_fn;
static void *log_opaque;
static _Atomic int log_level = -1;

static const char *const level_names[] = {"error", "warn", "info", "debug"};

static int current_level(void)
{
	int level = atomic_load(&log_level);
	if (level >= 0)
		return level;
	level = LMT_LOG_WARN;
	const char *env = getenv("LMT_LOG");
	for (int i = 0; env && i < 4; i++)
		if (strcasecmp(env, level_names[i]) == 0)
			level = i;
	atomic_store(&log_level, level);
	return level;
}

void lmt_set_log_handler(lmt_log_fn fn, void *opaque)
{
	pthread_mutex_lock(&log_lock);
	log_fn = fn;
	log_opaque = opaque;
	pthread_mutex_unlock(&log_lock);
}

/* A level outside the enum (from a plugin, say) counts as the nearest one. */
static enum lmt_log_level clamp_level(enum lmt_log_level level)
{
	if ((int)level < (int)LMT_LOG_ERROR)
		return LMT_LOG_ERROR;
	return (int)level > (int)LMT_LOG_DEBUG ? LMT_LOG_DEBUG : level;
}

void lmt_set_log_level(enum lmt_log_level level)
{
	atomic_store(&log_level, (int)clamp_level(level));
}

static _Atomic uint64_t last_session_id;

void lmt__logger_init(struct lmt__logger *l)
{
	l->id = atomic_fetch_add(&last_session_id, 1) + 1;
	l->fn = NULL;
	l->opaque = NULL;
	pthread_mutex_init(&l->lock, NULL);
}

void lmt__logger_destroy(struct lmt__logger *l)
{
	pthread_mutex_destroy(&l->lock);
}

void lmt__logger_set(struct lmt__logger *l, lmt_log_fn fn, void *opaque)
{
	pthread_mutex_lock(&l->lock);
	l->fn = fn;
	l->opaque = opaque;
	pthread_mutex_unlock(&l->lock);
}

/* Whether the session's own handler took the message. */
static bool own_handler(struct lmt__logger *l, enum lmt_log_level level, const char *msg)
{
	pthread_mutex_lock(&l->lock);
	bool own = l->fn != NULL;
	if (own)
		l->fn(l->opaque, level, msg);
	pthread_mutex_unlock(&l->lock);
	return own;
}

/* The one logging path: a session's messages (l not NULL) carry its id
 * and go to its own handler while it has one. */
static void vlog(struct lmt__logger *l, enum lmt_log_level level, const char *fmt, va_list ap)
        LMT_PRINTF(3, 0);

static void vlog(struct lmt__logger *l, enum lmt_log_level level, const char *fmt, va_list ap)
{
	level = clamp_level(level);
	if ((int)level > current_level())
		return;
	char msg[1024];
	int n = l ? snprintf(msg, sizeof(msg), "[s%llu] ", (unsigned long long)l->id) : 0;
	vsnprintf(msg + n, sizeof(msg) - (size_t)n, fmt, ap);
	if (l && own_handler(l, level, msg))
		return;
	pthread_mutex_lock(&log_lock);
	if (log_fn)
		log_fn(log_opaque, level, msg);
	else
		fprintf(stderr, "lmt %s: %s\n", level_names[level], msg);
	pthread_mutex_unlock(&log_lock);
}

void lmt__log(enum lmt_log_level level, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vlog(NULL, level, fmt, ap);
	va_end(ap);
}

void lmt__slog(struct lmt__logger *l, enum lmt_log_level level, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vlog(l, level, fmt, ap);
	va_end(ap);
}
