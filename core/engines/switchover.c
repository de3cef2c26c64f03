/* The switchover estimate (see switchover.h and docs/engine.md).
 * Room: engines; may use: every room below it. */
#include "switchover.h"

void lmt__switchover_busy(struct lmt_switchover *sw, uint64_t now)
{
	sw->busy_since_ns = now ? now : 1;
}

void lmt__switchover_landed(struct lmt_switchover *sw, uint64_t bytes, bool idle, uint64_t now)
{
	sw->bytes += bytes;
	if (!idle || !sw->busy_since_ns)
		return;
	sw->busy_ns += now > sw->busy_since_ns ? now - sw->busy_since_ns : 0;
	sw->busy_since_ns = 0;
}

void lmt__switchover_held(struct lmt_switchover *sw)
{
	sw->held = true;
}

/* Under max-bandwidth the pass's own rate is the gate's, and the gaps
 * between its writes are the gate's waits: the link's rate is the bytes
 * over the time some write was in flight. A pass the gate never held
 * back is measured over its whole span, as it always was: the pause runs
 * as such a pass does. */
void lmt__switchover_measure(struct lmt_switchover *sw, uint64_t pass_bps, uint64_t min_bytes,
                             bool restart, uint64_t now)
{
	uint64_t busy = sw->busy_ns;
	if (sw->busy_since_ns && now > sw->busy_since_ns)
		busy += now - sw->busy_since_ns;
	uint64_t rate = pass_bps;
	if (sw->held && busy && sw->bytes)
		rate = (uint64_t)((double)sw->bytes * 1e9 / (double)busy);
	if (rate && (sw->bytes >= min_bytes || !sw->measured_bps))
		sw->measured_bps = rate;
	if (!restart)
		return;
	sw->busy_ns = 0;
	sw->bytes = 0;
	sw->held = false;
	if (sw->busy_since_ns)
		sw->busy_since_ns = now ? now : 1;
}

uint64_t lmt__switchover_bps(const struct lmt_switchover *sw)
{
	return sw->option_bps ? sw->option_bps : sw->measured_bps;
}

bool lmt__pause_estimate(const struct lmt_pause_parts *p, uint64_t *out)
{
	*out = 0;
	if ((p->ram_bytes && !p->rate_bps) || !p->hash_known)
		return false;
	double ns = p->hash_ns + (double)p->sync_ns;
	if (p->rate_bps)
		ns += (double)(p->ram_bytes + p->other_bytes) * 1e9 / (double)p->rate_bps;
	*out = ns < 1e18 ? (uint64_t)ns : (uint64_t)1e18; /* 31 years */
	return true;
}
