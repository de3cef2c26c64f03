/* The source engine's state (engines room), private to its files:
 * source.c (the engine object, what every phase shares), source_setup.c
 * (the way in, blocks, channels, keys), source_zero.c (zero runs on the
 * control connection), source_walk.c (the dirty walk and its writes),
 * source_passes.c (passes, convergence, the switchover), and postcopy's
 * source side (postcopy_source.c). Calls run in that order, downward:
 * passes over postcopy_source over walk over zero over setup over
 * source.c. */
#ifndef LMT_CORE_SOURCE_ENGINE_H
#define LMT_CORE_SOURCE_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "converge.h"
#include "session.h"
#include "switchover.h"

#define SLOT_BITS 20
#define REG_BATCH 64u
/* How many windows ahead of the walk look_ahead asks for keys: half a
 * batch, so that the next request goes out while the walk is still in
 * the windows of the last. */
#define KEYS_AHEAD (REG_BATCH / 2)
#define HARVEST_MAX 64u
#define SERVICE_EVERY_NS 1000000ull
#define WAIT_SLICE_NS 10000000ull
/* lmt_save_iterate stops its own work a fifth of max-iterate-ms and a
 * millisecond early, or by how late waits have been ending when that is
 * more: a wait that ends there still returns within the budget when a
 * busy host wakes the caller late (by up to a scheduler time slice, a few
 * milliseconds, on a host with fewer cores than busy threads). */
#define ITERATE_GUARD_DIV 5u
#define ITERATE_GUARD_NS 1000000ull
#define NO_DEADLINE UINT64_MAX
/* A pass that could not get the migration ready with nothing left to send
 * that would help (nothing dirty, or the rest of the pause over the limit
 * by itself) is followed by the next no sooner than this: the calls in
 * between wait in their budget, rather than end a pass of a few pages, or
 * none, each (1.1 million passes in 270 s of a VMM that called in a loop,
 * each kept in the timeline). */
#define IDLE_PASS_GAP_NS 100000000ull

/* ZERO messages at once: those sent and not acknowledged, and the one
 * being filled (source_zero.c). */
#define ZERO_RING 4u

/* Zero runs of the passes after the bulk one: a ring of ZERO messages,
 * the oldest sent first, then the one being filled. Their pages stay set
 * in `inflight` until the destination's ZERO_ACK says it applied them. */
struct lmt_zero_out {
	struct lmt_msg_zero *msgs; /* ZERO_RING, allocated at the first run */
	uint32_t head;             /* the oldest sent, not acknowledged */
	uint32_t nsent;            /* sent, not acknowledged */
	uint64_t acked;            /* ZERO messages acknowledged since setup */
	/* Wire bytes of the runs queued or not acknowledged, with their
	 * messages' headers: what is left to send of those pages. */
	uint64_t wire_bytes;
};

/* One write in flight. */
struct lmt_slot {
	uint64_t cookie; /* 0 when free */
	uint32_t block;
	uint32_t channel;
	uint64_t page;
	uint64_t npages;
	uint64_t bytes;
};

struct lmt_source_engine {
	lmt_dirty_sync_fn dirty_fn;
	void *dirty_opaque;

	/* option values only the source uses, read once at setup; the two
	 * runtime ones again at each iterate call (tune) */
	bool zero_detect;
	/* A zero page of a pass after the bulk one goes as a zero run (not a
	 * file: target, which takes it as data). */
	bool zero_runs;
	struct lmt_zero_out zero;
	uint64_t max_bandwidth;
	uint64_t downtime_limit_ns;
	uint64_t iterate_ns;
	uint64_t switchover_timeout_ns;
	uint32_t queue_depth;
	/* lmt_save_complete's end: no wait goes past it (NO_DEADLINE otherwise) */
	uint64_t switchover_deadline;

	/* writes in flight, by the slot in their cookie */
	struct lmt_slot *slots;
	uint32_t *free_slots;
	uint32_t nslots;
	uint32_t nfree;
	uint64_t generation;
	uint32_t ch_writes[LMT_MAX_CHANNELS];
	/* When each channel last completed a write, or took its first one
	 * while idle: a channel with writes in flight and nothing completed
	 * for idle-timeout has stalled. */
	uint64_t ch_progress_ns[LMT_MAX_CHANNELS];
	uint64_t ch_bytes[LMT_MAX_CHANNELS];    /* completed, per channel */
	uint64_t ch_inflight[LMT_MAX_CHANNELS]; /* posted, not yet completed */
	/* The last write posted: its channel, where it ended, and how many
	 * writes in a row that channel took, each following the one before. */
	uint32_t run_channel;
	uint32_t run_block;
	uint64_t run_end_page;
	uint32_t run_length;

	/* the walk over the dirty pages */
	uint64_t dirty_bytes;
	uint64_t inflight_bytes;
	uint32_t cur_block;
	uint64_t cur_page;
	uint32_t pass;
	bool pass_done;        /* the walk reached the end of the pass */
	bool need_pass;        /* "ready" was returned; the next call starts a pass */
	uint64_t next_pass_ns; /* with need_pass: not before then (IDLE_PASS_GAP_NS) */
	bool ready_posted;     /* the last call returned ready, and said so */
	bool draining;         /* the pass ended near convergence: draining */
	uint64_t pass_dirtied; /* newly dirty at the end of the walk */
	uint64_t pass_start_ns;
	uint64_t pass_bytes;
	uint64_t pass_zero_pages; /* skipped or sent as zero runs this pass */
	uint64_t last_service_ns;
	uint64_t progress_sent_ns; /* the last LANDED to the destination */

	/* Keys of the destination's windows are asked for ahead of the walk
	 * and the answer taken when it comes: one REG_REQ out at a time. */
	bool keys_asked;      /* a REG_REQ is out, its REG_REPLY not taken */
	uint64_t keys_due;    /* when the destination must have answered */
	uint32_t ahead_block; /* the window the last look ahead began at */
	uint64_t ahead_window;

	/* A step iterate cannot cut short, by how long it recently took:
	 * once a call has done some work, it leaves the step for the next
	 * call rather than start it too close to its deadline. */
	uint64_t sync_cost_ns; /* the VMM's dirty-log sync */
	uint64_t late_ns;      /* how long after its timeout a wait ends */
	bool call_progressed;  /* this call posted a write or ended a pass */

	/* max-bandwidth as a token bucket that outlives each call (see
	 * bandwidth_gate), and the bandwidth measured */
	double bw_allowance;   /* bytes that may be posted now; < 0: wait */
	uint64_t bw_refill_ns; /* when it was last topped up; 0: unlimited */
	uint64_t bandwidth_bps;
	/* the rate the expected downtime counts at (switchover.h) */
	struct lmt_switchover switchover;

	struct lmt_converge converge;

	/* postcopy-after passes ended without converging: the next
	 * lmt_save_complete switches to postcopy */
	uint32_t postcopy_after;
	bool postcopy_due;

	/* lmt_save_set_device_state_size, counted in the expected downtime */
	_Atomic uint64_t device_state_bytes;

	/* verify=on: the sweep that hashes stale stripes behind the walk
	 * (hash_behind), how fast hashing goes, and LANDED's buffer */
	uint32_t hash_pass; /* the pass whose walk the sweep follows */
	uint32_t hash_block;
	uint64_t hash_stripe;
	uint64_t hash_ns;
	uint64_t hash_bytes;
	struct lmt_msg_landed *landed;
	uint64_t landed_bytes; /* bytes_sent as last reported */
	bool verify_warned;    /* said that hashing alone is over the limit */
};

/* A run of dirty pages within one chunk-size window of one block; `zero`:
 * all of them zero, for a zero run. */
struct chunk {
	uint32_t block;
	uint64_t page;
	uint64_t npages;
	bool zero;
};

/* What is left to send: dirty, in flight, and zero runs not acknowledged
 * (at their wire size). */
static inline uint64_t lmt__source_left(const struct lmt_source_engine *e)
{
	return e->dirty_bytes + e->inflight_bytes + e->zero.wire_bytes;
}

/* Whether zero runs are queued or not acknowledged yet. */
static inline bool lmt__source_zero_busy(const struct lmt_source_engine *e)
{
	return e->zero.nsent || (e->zero.msgs && e->zero.msgs[(e->zero.head + e->zero.nsent) %
	                                                      ZERO_RING].count);
}

/* Whether writes or zero runs are still to land. */
static inline bool lmt__source_in_flight(const struct lmt_source_engine *e)
{
	return e->inflight_bytes || lmt__source_zero_busy(e);
}

/* ---- source.c ---- */

/* The switchover took longer than switchover-timeout: `what` was not done. */
int lmt__source_switchover_expired(struct lmt_session *s, const char *what);
/* How long to wait for the destination's answer: idle-timeout, and never
 * past the switchover's end. */
uint64_t lmt__source_reply_deadline(const struct lmt_session *s);
/* DEVICE_STATE messages, within the switchover. */
int lmt__source_send_state(struct lmt_session *s, const uint8_t *data, size_t length);

/* ---- source_setup.c ---- */

/* The plugin's registration for window `w` of block `block` when it
 * needs one (LMT_CAP_LOCAL_MR), made as needed. */
int lmt__source_window_mr(struct lmt_session *s, uint32_t block, uint64_t w, lmt_mr **mr);
/* Store the keys of a REG_REPLY, checking each against what we can use. */
int lmt__source_import_keys(struct lmt_session *s, size_t length);
int lmt__source_register_local(struct lmt_session *s, struct lmt_block *b, uint64_t w);

/* ---- source_zero.c ---- */

/* Queue the zero run `c` (clear of writes in flight) in the ZERO message
 * being filled, and send that when full: 1, or 0 when ZERO_RING messages
 * wait for their answer, or an error. */
int lmt__source_zero_post(struct lmt_session *s, const struct chunk *c);
/* Send the ZERO message being filled, if it holds a run. */
int lmt__source_zero_flush(struct lmt_session *s);
/* The destination's ZERO_ACK, whose payload is in s->in: the oldest ZERO
 * sent was applied, its pages leave `inflight`. */
int lmt__source_zero_acked(struct lmt_session *s, size_t length);

/* ---- source_walk.c ---- */

/* Whether a step that recently took `cost` still fits before `deadline`,
 * or this call has done nothing yet and must take it anyway. */
bool lmt__source_step_fits(const struct lmt_source_engine *e, uint64_t cost, uint64_t deadline);
/* Ask the VMM what it dirtied and merge it in. */
int lmt__source_sync_dirty(struct lmt_session *s, uint64_t *new_bytes);
/* The runtime options (tuning.c), which any thread may have changed since
 * the last call. A debt of the bucket is paid at the new rate; going from
 * unlimited to a rate starts the bucket afresh. */
void lmt__source_tune(struct lmt_session *s);
int lmt__source_start_first_pass(struct lmt_session *s);
/* Tell the destination what landed since the last LANDED (`always`: even
 * if nothing did): the bytes per channel, for its statistics. Each write
 * reported completed, so its bytes are in the destination's memory before
 * this arrives. A file: target has no one to tell. */
int lmt__source_report_landed(struct lmt_session *s, bool always);
/* Harvest completions, waiting up to timeout_ns for the first. */
int lmt__source_harvest(struct lmt_session *s, uint64_t timeout_ns);
int lmt__source_service(struct lmt_session *s);
/* Hash the stale stripes behind the walk until `deadline`. Behind the walk
 * this pass has sent or skipped every dirty page, so the work spreads over
 * the pass and a stripe is read about when its pages were. A stripe the
 * guest writes after it was hashed is stale again at the next dirty sync;
 * whatever is stale when the guest is paused is hashed then (hash_rest).
 * A sweep that fell behind finishes its lap before following a new pass. */
void lmt__source_hash_behind(struct lmt_session *s, uint64_t deadline);
int lmt__source_report_progress(struct lmt_session *s);
/* Time before which max-bandwidth allows no further write; 0 for now.
 * The limit is a token bucket that outlives each call: the allowance grows
 * at the rate, and a write may go while it is not negative and spends its
 * size. Over any span the bytes posted stay within the rate times the span
 * plus one burst and one write, however often and however briefly the VMM
 * calls iterate. (Accounting that restarted with each call let the first
 * write of every call through: three times the limit with 1M chunks and
 * 5 ms calls.) */
uint64_t lmt__source_bandwidth_gate(struct lmt_session *s, bool limited, uint64_t now);
/* The guest is paused: every stripe still stale. */
void lmt__source_hash_rest(struct lmt_session *s);
/* The next run of dirty pages from the cursor, within one chunk-size
 * window. Returns false at the end of the pass. */
bool lmt__source_next_chunk(struct lmt_session *s, struct chunk *c);
/* Before an exchange of another kind (the switchover's): the answer to
 * the key request that is out, if one is. */
int lmt__source_settle_keys(struct lmt_session *s);
/* Post one write for `c`, or shrink it to the part not overlapping a write
 * in flight. Returns 1 when it posted, 0 when it must wait, 2 when the
 * window's key is still to come at `deadline`, < 0 on error. */
int lmt__source_try_post(struct lmt_session *s, struct chunk *c, uint64_t deadline);
/* Wait a slice for completions, then look after the control connection. */
int lmt__source_wait_some(struct lmt_session *s, uint64_t deadline);

/* A channel with writes in flight (`writes`) that completed none since
 * `progress_ns` for idle-timeout has stalled: the failure, naming it after
 * `what`. */
int lmt__check_stalls(struct lmt_session *s, const uint32_t *writes, const uint64_t *progress_ns,
                      const char *what);

/* ---- postcopy_source.c ---- */

/* Guest paused, nothing in flight, each block's dirty bitmap the pages
 * the destination lacks: announce them, send the device state (and hand
 * over descriptors on a unix: target), switch, and start the thread that
 * serves faults and pushes the rest. By `deadline`. */
int lmt__postcopy_source_switch(struct lmt_session *s, const void *state, size_t length,
                                uint64_t passes, uint64_t deadline);

#endif
