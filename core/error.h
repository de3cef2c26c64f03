/* Error objects and logging inside the core (one logging path for all). */
#ifndef LMT_CORE_ERROR_H
#define LMT_CORE_ERROR_H

#include <stdarg.h>
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

void lmt__log(enum lmt_log_level level, const char *fmt, ...) LMT_PRINTF(2, 3);
void lmt__vlog(enum lmt_log_level level, const char *fmt, va_list ap) LMT_PRINTF(2, 0);

#endif
