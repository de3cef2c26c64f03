/* Error objects and logging inside the core (one logging path for all).
 * Room: base; may use: ABI, common. */
#ifndef LMT_CORE_ERROR_H
#define LMT_CORE_ERROR_H

#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <string.h>

#include <lmt/lmt.h>

/* Fill `err` (may be NULL) with -code and the formatted message; returns
 * -code so that `return lmt__error(err, LMT_EINVAL, "...")` reads well. */
int lmt__error(struct lmt_error *err, int code, const char *fmt, ...) LMT_PRINTF(3, 4);
int lmt__verror(struct lmt_error *err, int code, const char *fmt, va_list ap) LMT_PRINTF(3, 0);
void lmt__error_clear(struct lmt_error *err);

/* Copy a string into a fixed buffer, truncating when it must. */
static inline void lmt__copy(char *dst, size_t size, const char *src)
{
	size_t n = strnlen(src, size - 1);
	memcpy(dst, src, n);
	dst[n] = '\0';
}

/* A message of no session, to the process-wide handler (or stderr). */
void lmt__log(enum lmt_log_level level, const char *fmt, ...) LMT_PRINTF(2, 3);

/* What a session logs through: its id, which starts every one of its
 * messages ("[s3] "), and its own handler, which takes them instead of the
 * process-wide one while set. */
struct lmt__logger {
	uint64_t id;
	pthread_mutex_t lock; /* held while the handler runs, so none runs after a change */
	lmt_log_fn fn;
	void *opaque;
};

/* A fresh id (1, 2, ...: unique in the process) and no handler. */
void lmt__logger_init(struct lmt__logger *l);
void lmt__logger_destroy(struct lmt__logger *l);
void lmt__logger_set(struct lmt__logger *l, lmt_log_fn fn, void *opaque);
void lmt__slog(struct lmt__logger *l, enum lmt_log_level level, const char *fmt, ...)
        LMT_PRINTF(3, 4);

#endif
