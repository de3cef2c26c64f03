/* The plugin utility layer's base (see instance.h). */
#define _GNU_SOURCE
#include "putil_base.h"

#include <errno.h>
#include <sched.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "sync.h"

/* Record through the host alone, before a base exists. */
static int host_error(const struct lmt_host *host, void *host_ctx, int code, const char *fmt, ...)
        LMT_PRINTF(4, 5);

static int host_error(const struct lmt_host *host, void *host_ctx, int code, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	host->error(host_ctx, code, "%s", msg);
	return -code;
}

int putil_instance_check(const char *name, const struct lmt_host *host, void *host_ctx,
                         const struct lmt_instance_params *params, uint32_t max_channels)
{
	if (!host || !host->error)
		return -LMT_EINVAL;
	if (host->struct_size < offsetof(struct lmt_host, cancelled) + sizeof(host->cancelled) ||
	    !host->log || !host->now_ns || !host->option || !host->cancelled)
		return host_error(host, host_ctx, LMT_EABI, "%s: host services incomplete", name);
	if (!params || params->struct_size < offsetof(struct lmt_instance_params, peer_host) +
	                                             sizeof(params->peer_host))
		return host_error(host, host_ctx, LMT_EABI, "%s: instance parameters too old",
		                  name);
	if (params->role != LMT_ROLE_SOURCE && params->role != LMT_ROLE_DESTINATION)
		return host_error(host, host_ctx, LMT_EINVAL, "%s: unknown role %d", name,
		                  (int)params->role);
	if (params->channels == 0 || params->channels > max_channels)
		return host_error(host, host_ctx, LMT_EINVAL, "%s: %u channels, expected 1 to %u",
		                  name, params->channels, max_channels);
	return 0;
}

/* A fixed-size field that may lack its terminator. */
static void copy_host(char *dst, size_t size, const char *src, size_t src_size)
{
	size_t len = strnlen(src, src_size);
	if (len >= size)
		len = size - 1;
	memcpy(dst, src, len);
	dst[len] = 0;
}

void putil_instance_init(struct putil_instance *base, const char *name, const struct lmt_host *host,
                         void *host_ctx, const struct lmt_instance_params *params)
{
	base->host = host;
	base->host_ctx = host_ctx;
	base->name = name;
	base->role = params->role;
	base->channels = params->channels;
	base->timeout_ns = params->timeout_ns;
	copy_host(base->local_host, sizeof(base->local_host), params->local_host,
	          sizeof(params->local_host));
	copy_host(base->peer_host, sizeof(base->peer_host), params->peer_host,
	          sizeof(params->peer_host));
}

int putil_error(const struct putil_instance *base, int code, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	base->host->error(base->host_ctx, code, "%s", msg);
	return -code;
}

bool putil_cancelled(const struct putil_instance *base)
{
	return base->host->cancelled(base->host_ctx) != 0;
}

static bool lookup(const struct putil_instance *base, const char *name, enum lmt_option_type type,
                   struct lmt_option_value *v)
{
	return base->host->option(base->host_ctx, name, v) == 0 && v->type == type;
}

bool putil_option_bool(const struct putil_instance *base, const char *name, bool fallback)
{
	struct lmt_option_value v;
	return lookup(base, name, LMT_OPT_BOOL, &v) ? v.boolean != 0 : fallback;
}

int64_t putil_option_int(const struct putil_instance *base, const char *name, int64_t fallback)
{
	struct lmt_option_value v;
	if (lookup(base, name, LMT_OPT_INT, &v) || lookup(base, name, LMT_OPT_SIZE, &v) ||
	    lookup(base, name, LMT_OPT_DURATION, &v))
		return v.integer;
	return fallback;
}

int putil_option_enum(const struct putil_instance *base, const char *name, int fallback)
{
	struct lmt_option_value v;
	return lookup(base, name, LMT_OPT_ENUM, &v) && v.integer >= 0 && v.integer <= INT32_MAX
	               ? (int)v.integer
	               : fallback;
}

const char *putil_option_text(const struct putil_instance *base, const char *name,
                              const char *fallback)
{
	struct lmt_option_value v;
	return lookup(base, name, LMT_OPT_STRING, &v) && v.text ? v.text : fallback;
}

uint64_t putil_call_deadline(const struct putil_instance *base)
{
	return base->timeout_ns ? lmt__deadline(base->timeout_ns) : UINT64_MAX;
}

struct lmt__wait putil_wait(const struct putil_instance *base, uint64_t deadline_ns)
{
	return (struct lmt__wait){.deadline_ns = deadline_ns == UINT64_MAX ? 0 : deadline_ns,
	                          .cancelled = base->host->cancelled,
	                          .ctx = base->host_ctx};
}

int putil_wait_check(const struct putil_instance *base, uint64_t deadline_ns, uint64_t timeout_ns,
                     const char *what)
{
	if (putil_cancelled(base))
		return putil_error(base, LMT_ECANCELED, "%s: cancelled", what);
	if (lmt__now_ns() >= deadline_ns)
		return putil_error(base, LMT_ETIMEDOUT, "%s: timed out after %llu ms", what,
		                   (unsigned long long)(timeout_ns / 1000000));
	return 0;
}

void putil_nap(uint64_t ns)
{
	struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)ns};
	nanosleep(&ts, NULL);
}

void putil_share_core(uint64_t *last)
{
	uint64_t now = lmt__now_ns();
	if (!*last) {
		*last = now;
	} else if (now - *last >= PUTIL_SHARE_NS) {
		sched_yield();
		*last = lmt__now_ns();
	}
}

int putil_random(const struct putil_instance *base, void *buf, size_t len)
{
	uint8_t *p = buf;
	while (len) {
		/* Blocks only until the kernel's pool is first seeded at boot. */
		ssize_t n = getrandom(p, len, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return putil_error(base, LMT_EIO, "%s: getrandom: %s", base->name,
			                   n < 0 ? strerror(errno) : "no bytes");
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

int putil_random_id(const struct putil_instance *base, uint64_t max, uint64_t *out)
{
	if (max == 0)
		return putil_error(base, LMT_EINVAL, "%s: no room for a random id", base->name);
	/* Draw under the smallest all-ones mask that covers max, and draw
	 * again when out of range: uniform, and fewer than two draws on
	 * average. */
	uint64_t mask = max;
	for (unsigned shift = 1; shift < 64; shift *= 2)
		mask |= mask >> shift;
	for (;;) {
		uint64_t x;
		int rc = putil_random(base, &x, sizeof(x));
		if (rc)
			return rc;
		x &= mask;
		if (x != 0 && x <= max) {
			*out = x;
			return 0;
		}
	}
}
