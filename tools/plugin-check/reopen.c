/* lmt-plugin-check: the "reopen" check — a channel that comes back
 * (docs/writing-a-plugin.md, "Reopening a channel"). On one pair of
 * instances and one registered region: write, break every channel, close
 * the broken endpoints, open and connect them again on the same channel
 * numbers, release and import the key blob again, write again and
 * compare. Three rounds, each breaking twice: both ends closed with writes
 * in flight, then the destination's first, with writes flowing, until the
 * source finds out. */
#define _GNU_SOURCE
#include "plugin-check.h"

#include <stdio.h>
#include <string.h>

#define ROUNDS 3
#define PIECE (64 * KIB)
#define PIECES 32u                   /* a round's writes: 2 MiB over every channel */
#define BREAK_WRITES 4096u           /* at most, while the source finds the break */
#define BREAK_NS (30ull * PH_SECOND) /* ... and for at most this long */

struct reopen {
	struct ph_pair pair;
	struct ph_region region;
	struct ph_source source;
	struct ph_tally tally;
};

/* Write the pattern of `seed` over the region on every channel, flush, and
 * compare. */
static bool write_round(struct ph_run *run, struct reopen *r, uint64_t seed)
{
	struct ph_pair *pair = &r->pair;
	ph_fill(r->source.mem, r->source.len, seed);
	for (unsigned k = 0; k < PIECES; k++)
		if (!ph_post(run, pair, &r->tally, k % pair->channels, &r->source,
		             r->source.mem + (size_t)k * PIECE, &r->region, (uint64_t)k * PIECE,
		             PIECE))
			return false;
	char d[640];
	int rc = pair->plugin->ops.flush(pair->src.inst, run->cfg->op_timeout_ns);
	if (rc)
		return ph_fail(run, "flush: %s", ph_describe(&pair->src.host, rc, d, sizeof(d)));
	return ph_harvest_all(run, pair, &r->tally) &&
	       ph_same(run, "after reopening", r->region.mem, r->source.mem, r->source.len, 0) &&
	       ph_region_guards_intact(run, &r->region);
}

static void close_side(struct ph_pair *pair, struct ph_side *side)
{
	for (uint32_t c = 0; c < pair->channels; c++) {
		if (side->ep[c])
			pair->plugin->ops.ep_close(side->ep[c]);
		side->ep[c] = NULL;
	}
}

/* Post the round's writes without harvesting (as many as the queue takes),
 * then close both ends: the source's endpoints first. */
static bool break_both(struct ph_run *run, struct reopen *r)
{
	struct ph_pair *pair = &r->pair;
	for (unsigned k = 0; k < PIECES; k++) {
		int rc = ph_post_once(run, pair, &r->tally, k % pair->channels, &r->source,
		                      r->source.mem + (size_t)k * PIECE, &r->region,
		                      (uint64_t)k * PIECE, PIECE);
		if (rc == -LMT_EAGAIN)
			break;
		if (rc)
			return false;
	}
	if (!ph_pair_stop_progress(run, pair))
		return false;
	close_side(pair, &pair->src);
	close_side(pair, &pair->dst);
	return true;
}

/* Close the destination's endpoints with writes flowing; the source must
 * find out, from a write or from progress, within BREAK_NS. Then its own
 * endpoints close. */
static bool break_from_destination(struct ph_run *run, struct reopen *r)
{
	struct ph_pair *pair = &r->pair;
	if (!ph_pair_stop_progress(run, pair))
		return false;
	close_side(pair, &pair->dst);
	r->tally.allow_failures = true;
	r->tally.check_visible = false;
	uint64_t deadline = ph_now() + BREAK_NS;
	int error = 0;
	for (unsigned k = 0; !error; k++) {
		if (ph_now() > deadline || r->tally.posted == r->tally.cap)
			return ph_fail(run,
			               "the source did not find out, in %.0f s and %llu writes, "
			               "that the destination closed its endpoints",
			               pc_seconds(BREAK_NS), (unsigned long long)r->tally.posted);
		unsigned piece = k % PIECES;
		int rc = ph_post_once(run, pair, &r->tally, k % pair->channels, &r->source,
		                      r->source.mem + (size_t)piece * PIECE, &r->region,
		                      (uint64_t)piece * PIECE, PIECE);
		if (rc && rc != -LMT_EAGAIN) {
			if (run->failed)
				return false;
			error = rc;
		} else if (ph_harvest_or_error(run, pair, &r->tally, PH_SECOND / 100, &error) < 0) {
			return false;
		}
	}
	close_side(pair, &pair->src);
	r->tally.allow_failures = false;
	r->tally.check_visible = true;
	return true;
}

/* After a break: the writes still in flight are abandoned (a completion of
 * one now fails the run as its second), the failure is over (progress
 * reports nothing, on either side), the key is released, the channels open
 * and connect again, and the key blob is imported again. */
static bool reopen_channels(struct ph_run *run, struct reopen *r)
{
	struct ph_pair *pair = &r->pair;
	for (uint64_t k = 0; k < r->tally.posted; k++)
		if (!r->tally.writes[k].seen) {
			r->tally.writes[k].seen = 1;
			r->tally.done++;
		}
	ph_host_forget(&pair->src.host);
	ph_host_forget(&pair->dst.host);
	char d[640];
	if (ph_harvest(run, pair, &r->tally, 16, IDLE_NS) != 0)
		return run->failed ? false
		                   : ph_fail(run, "the source's progress reported completions of "
		                                  "writes on endpoints closed before");
	struct lmt_completion c[4];
	int n = pair->plugin->ops.progress(pair->dst.inst, c, 4, IDLE_NS);
	if (n != 0)
		return ph_fail(run, "the destination's progress, every endpoint closed: %s",
		               n > 0 ? "completions"
		                     : ph_describe(&pair->dst.host, n, d, sizeof(d)));
	pair->plugin->ops.rkey_release(pair->src.inst, r->region.rkey);
	r->region.rkey = NULL;
	if (!ph_pair_open_endpoints(run, pair) || !ph_pair_connect(run, pair))
		return false;
	ph_pair_start_progress(pair);
	if (!pair->progressing)
		return ph_fail(run, "cannot start a thread");
	int rc = pair->plugin->ops.rkey_import(pair->src.inst, &r->region.key, &r->region.rkey);
	if (rc)
		return ph_fail(run, "rkey_import of the same key blob after reopening: %s",
		               ph_describe(&pair->src.host, rc, d, sizeof(d)));
	return true;
}

static bool round_trip(struct ph_run *run, struct reopen *r, unsigned round)
{
	return write_round(run, r, 3 * round + 1) && break_both(run, r) &&
	       reopen_channels(run, r) && write_round(run, r, 3 * round + 2) &&
	       break_from_destination(run, r) && reopen_channels(run, r) &&
	       write_round(run, r, 3 * round + 3) && ph_pair_quiet(run, &r->pair);
}

void pc_check_reopen(struct ph_run *run)
{
	struct reopen r = {0};
	size_t len = (size_t)PIECES * PIECE;
	bool ok = ph_pair_ready(run, &r.pair) && ph_region_open(run, &r.pair, &r.region, len) &&
	          ph_source_open(run, &r.pair, &r.source, len, 1) &&
	          ph_tally_init(run, &r.tally, ROUNDS * (4 * PIECES + BREAK_WRITES));
	struct ph_census before = {0}, after;
	for (unsigned round = 0; ok && round < ROUNDS; round++) {
		ok = round_trip(run, &r, round);
		/* Counted from the end of the first round on: a plugin may keep
		 * what its first channels started (a library's own threads). */
		if (ok && round == 0)
			before = ph_census_take();
		if (ok && round > 0 && !ph_census_same(before, &after))
			ok = ph_fail(
			        run,
			        "round %u left %d descriptors and %d threads, against %d and %d "
			        "after the first",
			        round + 1, after.fds, after.threads, before.fds, before.threads);
	}
	if (ok)
		ph_note(run,
		        "%u rounds, %u channel%s closed and opened again twice a round (both ends "
		        "with writes in flight; the destination's first), keys imported again: "
		        "every "
		        "byte landed, nothing left behind",
		        ROUNDS, r.pair.channels, r.pair.channels == 1 ? "" : "s");
	pc_finish(run, &r.pair, &r.tally, &r.source, &r.region, 1);
}
