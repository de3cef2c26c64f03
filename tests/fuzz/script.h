/* What the scripted harnesses share (fuzz_source, fuzz_tcp_wire): the
 * input read as a script through a cursor that yields zeros once it runs
 * out, an invariant broken (a message naming the harness, then abort, for
 * libFuzzer to keep the input), and the checks at the end of every input:
 * no descriptor or thread left behind, and the input within its time.
 * Define FUZZ_NAME (the harness's name) before including it. */
#ifndef LMT_FUZZ_SCRIPT_H
#define LMT_FUZZ_SCRIPT_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "census.h"

#ifndef FUZZ_NAME
#error "define FUZZ_NAME before including script.h"
#endif

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

static void fail(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, FUZZ_NAME ": invariant broken: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	abort();
}

static inline uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- the input ---- */

struct cursor {
	const uint8_t *p;
	size_t n;
};

static inline uint8_t take8(struct cursor *c)
{
	if (!c->n)
		return 0;
	c->n--;
	return *c->p++;
}

static inline uint64_t take(struct cursor *c, unsigned bytes)
{
	uint64_t v = 0;
	for (unsigned i = 0; i < bytes; i++)
		v |= (uint64_t)take8(c) << (8 * i);
	return v;
}

/* Up to n bytes (fewer when the input ends). */
static inline const uint8_t *take_bytes(struct cursor *c, size_t *n)
{
	if (*n > c->n)
		*n = c->n;
	const uint8_t *p = c->p;
	c->p += *n;
	c->n -= *n;
	return p;
}

/* ---- the end of an input ---- */

/* The descriptors and threads of the process when the first input began:
 * each input must leave them as they were. */
static inline struct fuzz_census fuzz_baseline(void)
{
	static struct fuzz_census baseline;
	static int taken;
	if (!taken) {
		baseline = fuzz_census_take();
		taken = 1;
	}
	return baseline;
}

/* After an input that began at `t0` (now_ns): nothing left behind, and no
 * longer than `limit_ns`. */
static inline void fuzz_input_end(uint64_t t0, uint64_t limit_ns)
{
	struct fuzz_census baseline = fuzz_baseline(), after;
	if (!fuzz_census_same(baseline, &after))
		fail("%d descriptors and %d threads after the input, %d and %d before", after.fds,
		     after.threads, baseline.fds, baseline.threads);
	if (now_ns() - t0 > limit_ns)
		fail("the input took %llu ms", (unsigned long long)((now_ns() - t0) / 1000000));
}

#endif
