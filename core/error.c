/* Error names and messages, error objects, and the one logging path. */
#define _GNU_SOURCE
#include "error.h"

#include <pthread.h>
#include <stdatomic.h>
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

void lmt_set_log_level(enum lmt_log_level level)
{
	atomic_store(&log_level, (int)level);
}

void lmt__vlog(enum lmt_log_level level, const char *fmt, va_list ap)
{
	if ((int)level > current_level())
		return;
	char msg[1024];
	vsnprintf(msg, sizeof(msg), fmt, ap);
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
	lmt__vlog(level, fmt, ap);
	va_end(ap);
}
