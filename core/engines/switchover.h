/* The switchover estimate: what the pause would take if it began now, and
 * the rate it will send at. Passes held back by max-bandwidth run slower
 * than the pause, which sends without the gate, so the rate counted is the
 * link's own: the rate while writes were in flight, or what the operator
 * says it is (switchover-bandwidth). The rules are in docs/engine.md ("The
 * expected downtime"). Pure bookkeeping: no clock, no session.
 * Room: engines; may use: every room below it. */
#ifndef LMT_SWITCHOVER_H
#define LMT_SWITCHOVER_H

#include <stdbool.h>
#include <stdint.h>

/* A pass's time with writes in flight, and the rate the pause is counted
 * at. The engine tells it when writes go in flight, land and are held
 * back; it closes each pass with lmt__switchover_pass_end. */
struct lmt_switchover {
	uint64_t option_bps;    /* switchover-bandwidth; 0: measured */
	uint64_t measured_bps;  /* the last measurement; 0: none yet */
	uint64_t busy_since_ns; /* writes in flight since then; 0: none */
	uint64_t busy_ns;       /* this pass: time with writes in flight, closed spans */
	uint64_t bytes;         /* this pass: bytes completed */
	bool held;              /* this pass: max-bandwidth held a write back */
};

/* Writes went in flight at `now` with none before. */
void lmt__switchover_busy(struct lmt_switchover *sw, uint64_t now);
/* A write of `bytes` completed at `now`; `idle`: none is left in flight. */
void lmt__switchover_landed(struct lmt_switchover *sw, uint64_t bytes, bool idle, uint64_t now);
/* max-bandwidth held a write back. */
void lmt__switchover_held(struct lmt_switchover *sw);
/* The pass so far measured at `pass_bps` (bytes over its duration): the
 * measurement it gives the estimate, kept when `min_bytes` have landed in
 * the pass or nothing was measured before. `restart`: the pass ended, the
 * next one's count starts at `now`. */
void lmt__switchover_measure(struct lmt_switchover *sw, uint64_t pass_bps, uint64_t min_bytes,
                             bool restart, uint64_t now);
/* The rate the estimate counts at: switchover-bandwidth, else measured;
 * 0 while neither is known. */
uint64_t lmt__switchover_bps(const struct lmt_switchover *sw);

/* What the pause has to do, each part at what it costs. */
struct lmt_pause_parts {
	uint64_t ram_bytes;   /* RAM left: dirty and in flight */
	uint64_t other_bytes; /* device state, a file's metadata: sent at the same rate */
	uint64_t rate_bps;    /* lmt__switchover_bps; 0: unknown */
	bool hash_known;      /* verify's hashing can be timed */
	double hash_ns;
	uint64_t sync_ns; /* a file target's syncs */
};

/* The expected downtime into *out; false while it cannot be told: RAM
 * left and no rate, or hashing left and no rate for it. Without RAM to
 * send there is no rate to time the rest at, and more passes would not
 * give one: the other bytes then count for nothing. */
bool lmt__pause_estimate(const struct lmt_pause_parts *p, uint64_t *out);

#endif
