/* Auto-converge (see converge.h and docs/engine.md).
 * Room: engines; may use: every room below it. */
#include "converge.h"

#include <stdio.h>

#include "options.h"

/* A pass does not converge when what the guest dirtied during it exceeds
 * this share of what the pass sent: the next pass has at least half as
 * much to send again, and with a guest that dirties at a steady rate the
 * passes stop shrinking. */
#define SLOW_SHARE_PERCENT 50
/* Passes in a row that must not converge before the throttle engages: one
 * slow pass may be a burst, or the bulk pass of a large guest. */
#define SLOW_PASSES_TO_ENGAGE 2

void lmt__converge_configure(struct lmt_converge *c, const struct lmt_optset *o)
{
	c->on = lmt__opt_bool(o, "auto-converge");
	c->initial = (uint32_t)lmt__opt_int(o, "throttle-initial");
	c->increment = (uint32_t)lmt__opt_int(o, "throttle-increment");
	c->max = (uint32_t)lmt__opt_int(o, "throttle-max");
	c->slow_passes = 0;
	atomic_store(&c->percent, 0);
}

const char *lmt__converge_check(const struct lmt_converge *c, const struct lmt_optset *o,
                                char *why, size_t size)
{
	if (!lmt__opt_bool(o, "auto-converge"))
		return NULL;
	int64_t initial = lmt__opt_int(o, "throttle-initial");
	int64_t max = lmt__opt_int(o, "throttle-max");
	if (!c->fn)
		snprintf(why, size, "auto-converge=on needs a throttle callback: set it with "
		                    "lmt_session_set_throttle before setup");
	else if (initial > max)
		snprintf(why, size, "throttle-initial (%lld%%) is above throttle-max (%lld%%)",
		         (long long)initial, (long long)max);
	else
		return NULL;
	return why;
}

static void ask(struct lmt_converge *c, uint32_t percent)
{
	if (atomic_exchange(&c->percent, percent) != percent && c->fn)
		c->fn(c->opaque, percent);
}

uint32_t lmt__converge_pass(struct lmt_converge *c, uint64_t sent, uint64_t dirtied)
{
	uint32_t now = atomic_load(&c->percent);
	if (!c->on)
		return 0;
	if ((double)dirtied * 100.0 <= (double)sent * SLOW_SHARE_PERCENT) {
		c->slow_passes = 0;
		return now; /* converging: the throttle is doing its part */
	}
	c->slow_passes++;
	if (!now && c->slow_passes < SLOW_PASSES_TO_ENGAGE)
		return 0;
	uint32_t next = now ? now + c->increment : c->initial;
	if (next > c->max)
		next = c->max;
	ask(c, next);
	return next;
}

void lmt__converge_release(struct lmt_converge *c)
{
	ask(c, 0);
}
