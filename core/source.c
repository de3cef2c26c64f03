/* The source engine: after dial.c's way in, the block list and channel
 * setup, the dirty-page walk, writes spread over the channels,
 * convergence, and the stop-and-copy. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bitmap.h"
#include "converge.h"
#include "dial.h"
#include "error.h"
#include "file.h"
#include "net.h"
#include "postcopy.h"
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
	uint64_t last_service_ns;
	uint64_t progress_sent_ns; /* the last LANDED to the destination */

	/* Keys of the destination's windows are asked for ahead of the walk
	 * and the answer taken when it comes: one REG_REQ out at a time. */
	bool keys_asked;       /* a REG_REQ is out, its REG_REPLY not taken */
	uint64_t keys_due;     /* when the destination must have answered */
	uint32_t ahead_block;  /* the window the last look ahead began at */
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

/* A run of dirty pages within one chunk-size window of one block. */
struct chunk {
	uint32_t block;
	uint64_t page;
	uint64_t npages;
};

int lmt__source_new(struct lmt_source_engine **out)
{
	*out = calloc(1, sizeof(**out));
	return *out ? 0 : -LMT_ENOMEM;
}

void lmt__source_free(struct lmt_source_engine *e)
{
	if (e)
		lmt__converge_release(&e->converge);
	if (!e)
		return;
	free(e->slots);
	free(e->free_slots);
	free(e->landed);
	free(e);
}

int lmt_session_set_dirty_sync(lmt_session *s, lmt_dirty_sync_fn fn, void *opaque)
{
	if (!s)
		return -LMT_EINVAL;
	if (s->role != LMT_ROLE_SOURCE)
		return lmt__usage(s, LMT_ESTATE, "dirty sync: only a source tracks dirty pages");
	if (!fn)
		return lmt__usage(s, LMT_EINVAL, "dirty sync: the callback is NULL");
	const char *fixed = lmt__config_fixed(s);
	if (fixed)
		return lmt__usage(s, LMT_ESTATE, "dirty sync: the callback is fixed %s", fixed);
	s->source->dirty_fn = fn;
	s->source->dirty_opaque = opaque;
	return 0;
}

int lmt_session_set_throttle(lmt_session *s, lmt_throttle_fn fn, void *opaque)
{
	if (!s)
		return -LMT_EINVAL;
	if (s->role != LMT_ROLE_SOURCE)
		return lmt__usage(s, LMT_ESTATE, "throttle: only a source throttles its guest");
	if (!fn)
		return lmt__usage(s, LMT_EINVAL, "throttle: the callback is NULL");
	const char *fixed = lmt__config_fixed(s);
	if (fixed)
		return lmt__usage(s, LMT_ESTATE, "throttle: the callback is fixed %s", fixed);
	s->source->converge.fn = fn;
	s->source->converge.opaque = opaque;
	return 0;
}

void lmt__source_release_throttle(struct lmt_session *s)
{
	lmt__converge_release(&s->source->converge);
	pthread_mutex_lock(&s->lock);
	s->stats.throttle_percent = 0;
	pthread_mutex_unlock(&s->lock);
}

static int report_landed(struct lmt_session *s, bool always);

/* Tell the destination the engine is moving, with a LANDED even when
 * nothing new landed, at most every min(1 s, idle-timeout / 4): without
 * one, or another message, for idle-timeout the destination gives up on a
 * source that only sends keep-alives. */
static int report_progress(struct lmt_session *s)
{
	uint64_t every = s->idle_timeout_ns / 4 < 1000000000ull ? s->idle_timeout_ns / 4
	                                                        : 1000000000ull;
	if (lmt__now() - s->source->progress_sent_ns < every)
		return 0;
	return report_landed(s, true);
}

/* Keep-alives both ways, and any error the destination sent meanwhile;
 * at most every SERVICE_EVERY_NS. */
static int await_keys(struct lmt_session *s, uint64_t deadline);

static int service(struct lmt_session *s)
{
	struct lmt_source_engine *e = s->source;
	uint64_t now = lmt__now();
	if (now - e->last_service_ns < SERVICE_EVERY_NS)
		return 0;
	e->last_service_ns = now;
	if (lmt__is_cancelled(s))
		return lmt__fail(s, LMT_ECANCELED, "migration cancelled");
	int rc = report_progress(s);
	if (rc)
		return rc;
	/* Keep-alives are the service thread's; the destination sends
	 * nothing else unasked. */
	if (e->keys_asked)
		return await_keys(s, now);
	if (lmt__ctrl_pending(s)) {
		struct lmt_msg_header h;
		rc = lmt__ctrl_recv(s, &h, now);
		return rc ? rc
		          : lmt__fail(s, LMT_EPROTO, "unexpected %s from the destination",
		                      lmt__msg_name(h.type));
	}
	return 0;
}

/* The switchover took longer than switchover-timeout: `what` was not done. */
static int switchover_expired(struct lmt_session *s, const char *what)
{
	/* Once POSTCOPY went out the destination may be running the guest. */
	bool sent = atomic_load(&s->in_postcopy);
	return lmt__fail_over(s, LMT_ETIMEDOUT,
	                      "switchover-timeout (%llu ms) passed with the guest paused, %s; %s",
	                      (unsigned long long)(s->source->switchover_timeout_ns / 1000000),
	                      what,
	                      sent ? "the switch was sent and the destination may run the guest: "
	                             "do not resume the source guest"
	                           : "the source guest may resume");
}

/* How long to wait for the destination's answer: idle-timeout, and never
 * past the switchover's end. */
static uint64_t reply_deadline(const struct lmt_session *s)
{
	uint64_t d = lmt__now() + s->idle_timeout_ns;
	return d < s->source->switchover_deadline ? d : s->source->switchover_deadline;
}

/* ---- setup ---- */

static int send_blocks(struct lmt_session *s)
{
	struct lmt_msg_blocks *bl = calloc(1, sizeof(*bl));
	if (!bl)
		return lmt__fail(s, LMT_ENOMEM, "out of memory");
	bl->count = s->nblocks;
	for (uint32_t i = 0; i < s->nblocks; i++) {
		snprintf(bl->blocks[i].name, sizeof(bl->blocks[i].name), "%s", s->blocks[i].name);
		bl->blocks[i].length = s->blocks[i].length;
		bl->blocks[i].page_size = s->blocks[i].page_size;
	}
	int rc = lmt__enc_blocks(&s->out, bl);
	free(bl);
	return rc ? lmt__fail(s, rc, "encoding BLOCKS") : lmt__ctrl_send(s);
}

/* After authentication: the block list, and over unix: which blocks are
 * handed over. */
static int handshake(struct lmt_session *s, uint64_t deadline)
{
	int rc = send_blocks(s);
	if (!rc && s->ctrl_unix)
		rc = lmt__handover_negotiate_source(s, deadline);
	return rc;
}

static int open_channels(struct lmt_session *s, uint64_t deadline)
{
	int rc = lmt__endpoints_open(s);
	if (rc)
		return rc;
	struct lmt_msg_addrs *a = malloc(sizeof(*a));
	if (!a)
		return lmt__fail(s, LMT_ENOMEM, "out of memory");
	struct lmt_msg_header h;
	struct lmt_error err = {0};
	rc = lmt__ctrl_expect(s, LMT_MSG_EP_ADDRS, deadline, &h);
	if (!rc && (rc = lmt__dec_addrs(s->in, h.length, a, &err)))
		lmt__fail(s, rc, "%s", err.message);
	if (!rc && a->count != s->channels)
		rc = lmt__fail(s, LMT_EPROTO, "the destination opened %u channels, expected %u",
		               a->count, s->channels);
	for (uint32_t c = 0; c < s->channels && !rc; c++) {
		rc = s->desc->ops.ep_connect(s->eps[c], &a->addrs[c]);
		if (rc)
			rc = lmt__fail(s, rc, "channel %u: cannot connect to the destination", c);
	}
	free(a);
	return rc;
}

/* Store the keys of a REG_REPLY, checking each against what we can use. */
static int import_keys(struct lmt_session *s, size_t length)
{
	struct lmt_msg_regs *r = malloc(sizeof(*r));
	struct lmt_error err = {0};
	if (!r)
		return lmt__fail(s, LMT_ENOMEM, "out of memory");
	int rc = lmt__dec_regs(s->in, length, LMT_MSG_REG_REPLY, r, &err);
	if (rc)
		lmt__fail(s, rc, "%s", err.message);
	for (uint32_t i = 0; i < r->count && !rc; i++) {
		const struct lmt_msg_reg *g = &r->regs[i];
		struct lmt_block *b = g->block < s->nblocks ? &s->blocks[g->block] : NULL;
		uint64_t w = b ? g->offset / b->window : 0;
		if (!b || g->offset % b->window || w >= b->nwindows || b->rkeys[w] ||
		    g->length != (b->length - g->offset < b->window ? b->length - g->offset
		                                                    : b->window)) {
			rc = lmt__fail(s, LMT_EPROTO,
			               "REG_REPLY: key for block %u offset %llu length %llu was "
			               "not asked for",
			               g->block, (unsigned long long)g->offset,
			               (unsigned long long)g->length);
			break;
		}
		rc = s->desc->ops.rkey_import(s->inst, &g->key, &b->rkeys[w]);
		if (rc)
			rc = lmt__fail(s, rc, "block '%s': the destination's key is unusable",
			               b->name);
	}
	free(r);
	return rc;
}

static int register_local(struct lmt_session *s, struct lmt_block *b, uint64_t w)
{
	uint64_t off = w * b->window;
	uint64_t len = b->length - off < b->window ? b->length - off : b->window;
	lmt_mr *mr = NULL;
	struct lmt_blob key = {0};
	int rc =
	        s->desc->ops.mr_register(s->inst, b->host + off, len, LMT_MR_LOCAL_READ, &mr, &key);
	if (rc)
		return lmt__fail(s, rc, "block '%s': cannot register %llu bytes at offset %llu",
		                 b->name, (unsigned long long)len, (unsigned long long)off);
	b->mrs[w] = mr;
	return 0;
}

int lmt__source_window_mr(struct lmt_session *s, uint32_t block, uint64_t w, lmt_mr **mr)
{
	struct lmt_block *b = &s->blocks[block];
	int rc = 0;
	if ((s->caps & LMT_CAP_LOCAL_MR) && !b->mrs[w])
		rc = register_local(s, b, w);
	*mr = b->mrs[w];
	return rc;
}

/* Wait for READY; with pin-all the keys of every block come first. */
static int wait_ready(struct lmt_session *s)
{
	struct lmt_msg_header h;
	struct lmt_error err = {0};
	for (;;) {
		int rc = lmt__ctrl_recv(s, &h, lmt__now() + s->idle_timeout_ns);
		if (rc)
			return rc;
		if (h.type == LMT_MSG_READY)
			break;
		if (h.type == LMT_MSG_REG_REPLY && s->pin_all)
			rc = import_keys(s, h.length);
		else
			rc = lmt__fail(s, LMT_EPROTO, "expected READY from the destination, got %s",
			               lmt__msg_name(h.type));
		if (rc)
			return rc;
	}
	int rc = lmt__dec_empty(s->in, h.length, LMT_MSG_READY, &err);
	if (rc)
		return lmt__fail(s, rc, "%s", err.message);
	for (uint32_t i = 0; i < s->nblocks && s->pin_all; i++)
		if (lmt__block_copied(&s->blocks[i]) && !s->blocks[i].rkeys[0])
			return lmt__fail(s, LMT_EPROTO,
			                 "pin-all: the destination sent no key for '%s'",
			                 s->blocks[i].name);
	return 0;
}

static int alloc_slots(struct lmt_session *s)
{
	struct lmt_source_engine *e = s->source;
	e->nslots = s->channels * e->queue_depth;
	e->slots = calloc(e->nslots, sizeof(*e->slots));
	e->free_slots = calloc(e->nslots, sizeof(*e->free_slots));
	if (!e->slots || !e->free_slots)
		return lmt__fail(s, LMT_ENOMEM, "out of memory for %u write slots", e->nslots);
	for (uint32_t i = 0; i < e->nslots; i++)
		e->free_slots[i] = e->nslots - 1 - i;
	e->nfree = e->nslots;
	return 0;
}

static void read_options(struct lmt_session *s)
{
	struct lmt_source_engine *e = s->source;
	const struct lmt_optset *o = s->opts;
	pthread_mutex_lock(&s->opts_lock);
	e->zero_detect = lmt__opt_bool(o, "zero-page-detection");
	e->max_bandwidth = (uint64_t)lmt__opt_int(o, "max-bandwidth");
	e->switchover.option_bps = (uint64_t)lmt__opt_int(o, "switchover-bandwidth");
	e->downtime_limit_ns = (uint64_t)lmt__opt_int(o, "downtime-limit");
	e->iterate_ns = (uint64_t)lmt__opt_int(o, "max-iterate-ms");
	e->queue_depth = (uint32_t)lmt__opt_int(o, "queue-depth");
	e->switchover_timeout_ns = (uint64_t)lmt__opt_int(o, "switchover-timeout");
	e->postcopy_after = (uint32_t)lmt__opt_int(o, "postcopy-after");
	lmt__converge_configure(&e->converge, o);
	pthread_mutex_unlock(&s->opts_lock);
	e->switchover_deadline = NO_DEADLINE;
}

/* The source's page bitmaps and the destination's keys, per block. */
static int alloc_bitmaps(struct lmt_session *s)
{
	for (uint32_t i = 0; i < s->nblocks; i++) {
		struct lmt_block *b = &s->blocks[i];
		b->rkeys = calloc(b->nwindows, sizeof(*b->rkeys));
		b->dirty = calloc(b->words, sizeof(uint64_t));
		b->inflight = calloc(b->words, sizeof(uint64_t));
		b->sync = calloc(b->words, sizeof(uint64_t));
		if (!b->rkeys || !b->dirty || !b->inflight || !b->sync)
			return lmt__fail(s, LMT_ENOMEM, "out of memory for block '%s'", b->name);
	}
	return 0;
}

static int prepare(struct lmt_session *s)
{
	int rc = lmt__session_prepare(s);
	if (rc)
		return rc;
	read_options(s);
	s->source->landed = malloc(sizeof(*s->source->landed));
	if (!s->source->landed)
		return lmt__fail(s, LMT_ENOMEM, "out of memory");
	return alloc_bitmaps(s);
}

/* Connect to `uri`, or with fd >= 0 use that socket (the session owns it
 * from here, whatever happens). */
static int setup(struct lmt_session *s, const char *uri, int fd)
{
	int rc = prepare(s);
	if (!rc && s->file_path) /* no destination: the file is laid out here */
		return (rc = lmt__file_save_open(s)) ? rc : alloc_slots(s);
	uint64_t deadline = s->start_ns + s->connect_timeout_ns;
	if (rc && fd >= 0)
		close(fd);
	if (!rc)
		rc = lmt__source_dial(s, uri, fd, deadline);
	if (rc || (rc = handshake(s, deadline)) || (rc = open_channels(s, deadline)))
		return rc;
	if (s->pin_all && (s->caps & LMT_CAP_LOCAL_MR))
		for (uint32_t i = 0; i < s->nblocks && !rc; i++)
			if (lmt__block_copied(&s->blocks[i]))
				rc = register_local(s, &s->blocks[i], 0);
	if (rc || (rc = wait_ready(s)))
		return rc;
	return alloc_slots(s);
}

int lmt__save_check(struct lmt_session *s, const char *uri, const char *what)
{
	if (s->role != LMT_ROLE_SOURCE)
		return lmt__usage(s, LMT_ESTATE, "%s: this session is a destination", what);
	if (!uri)
		return lmt__usage(s, LMT_EINVAL, "%s: uri is NULL, expected host:port", what);
	int rc = lmt__file_check_uri(s, uri, what);
	if (rc)
		return rc;
	if (s->nblocks == 0)
		return lmt__usage(s, LMT_EINVAL, "%s: no RAM blocks: add them before setup", what);
	if (!s->source->dirty_fn)
		return lmt__usage(s, LMT_EINVAL, "%s: no dirty-sync callback: set it before setup",
		                  what);
	char why[160];
	pthread_mutex_lock(&s->opts_lock);
	const char *bad = lmt__converge_check(&s->source->converge, s->opts, why, sizeof(why));
	pthread_mutex_unlock(&s->opts_lock);
	if (bad)
		return lmt__usage(s, LMT_EINVAL, "%s: %s", what, bad);
	return 0;
}

static int save_setup(lmt_session *s, const char *uri, int fd)
{
	int rc = lmt__save_check(s, uri, "save setup");
	int expected = LMT_STATE_NEW;
	if (!rc && !atomic_compare_exchange_strong(&s->state, &expected, LMT_STATE_SETUP))
		rc = lmt__usage(s, LMT_ESTATE, "save setup: called twice");
	else if (!rc && lmt__is_file_uri(uri) && (rc = lmt__file_set_path(s, uri)))
		atomic_store(&s->state, LMT_STATE_NEW);
	if (rc) {
		if (fd >= 0)
			close(fd);
		return rc;
	}
	pthread_mutex_lock(&s->lock);
	s->start_ns = lmt__now();
	s->stats.status = LMT_STATUS_SETUP;
	pthread_mutex_unlock(&s->lock);
	rc = setup(s, uri, fd);
	if (rc)
		return lmt__abort(s, rc);
	atomic_store(&s->state, LMT_STATE_ACTIVE);
	pthread_mutex_lock(&s->lock);
	s->stats.status = LMT_STATUS_ACTIVE;
	s->stats.setup_ns = lmt__now() - s->start_ns;
	pthread_mutex_unlock(&s->lock);
	lmt__event_simple(s, LMT_EVENT_SETUP_DONE, 0);
	return 0;
}

int lmt_save_setup(lmt_session *s, const char *uri)
{
	if (!s)
		return -LMT_EINVAL;
	if (lmt__job_owns(s))
		return lmt__usage(
		        s, LMT_ESTATE,
		        "save setup: a job started with lmt_save_start runs this session");
	lmt__call_enter(s);
	int rc = save_setup(s, uri, -1);
	lmt__call_leave(s);
	return rc;
}

int lmt__save_connected(struct lmt_session *s, int fd)
{
	lmt__call_enter(s);
	int rc = save_setup(s, "a connected socket", fd);
	lmt__call_leave(s);
	return rc;
}

/* ---- dirty pages ---- */

/* A cost estimate that follows a longer step at once and a shorter one
 * slowly. */
static void note_cost(uint64_t *estimate, uint64_t since)
{
	uint64_t took = lmt__now() - since;
	*estimate = took > *estimate - *estimate / 8 ? took : *estimate - *estimate / 8;
}

/* A wait that timed out at `due`: how late it ended. On a host with fewer
 * cores than busy threads (the transport's, the guest's) a thread woken
 * by its timer may wait for a core for a scheduler slice or more. */
static void note_late(struct lmt_source_engine *e, uint64_t due)
{
	uint64_t now = lmt__now();
	note_cost(&e->late_ns, now > due ? due : now);
}

/* Whether a step that recently took `cost` still fits before `deadline`,
 * or this call has done nothing yet and must take it anyway. */
static bool step_fits(const struct lmt_source_engine *e, uint64_t cost, uint64_t deadline)
{
	return !e->call_progressed || deadline == NO_DEADLINE || lmt__now() + cost <= deadline;
}

/* The snapshot's remaining bytes, with s->lock held: dirty plus in flight,
 * changed together with the figures that moved them. */
static void publish_remaining(struct lmt_session *s)
{
	s->stats.remaining_bytes = s->source->dirty_bytes + s->source->inflight_bytes;
}

/* verify=on: the stripes of the pages of word w that the guest wrote
 * (`bits`, already dirty or not) must be hashed again. */
static void mark_stale(struct lmt_block *b, uint64_t w, uint64_t bits)
{
	uint64_t per_stripe = 1ull << (b->stripe_shift - b->page_shift);
	while (bits) {
		uint64_t p = w * 64 + (uint64_t)__builtin_ctzll(bits);
		lmt__verify_mark(b, &b->stale, p, 1);
		uint64_t next = (p / per_stripe + 1) * per_stripe - w * 64;
		if (next >= 64)
			break;
		bits &= ~lmt__bits(0, next);
	}
}

/* Ask the VMM what it dirtied and merge it in. */
static int sync_dirty(struct lmt_session *s, uint64_t *new_bytes)
{
	struct lmt_source_engine *e = s->source;
	uint64_t added = 0, since = lmt__now();
	for (uint32_t i = 0; i < s->nblocks; i++) {
		struct lmt_block *b = &s->blocks[i];
		if (!lmt__block_copied(b))
			continue; /* handed over at the switchover */
		memset(b->sync, 0, b->words * sizeof(uint64_t));
		int rc = e->dirty_fn(e->dirty_opaque, i, b->sync, b->npages);
		if (rc)
			return lmt__fail(s, rc < 0 ? rc : -LMT_EIO,
			                 "dirty sync of block '%s' failed (%d)", b->name, rc);
		if (b->npages % 64)
			b->sync[b->words - 1] &= lmt__bits(0, b->npages % 64);
		uint64_t pages = 0;
		for (uint64_t w = 0; w < b->words; w++) {
			pages += (uint64_t)__builtin_popcountll(b->sync[w] & ~b->dirty[w]);
			b->dirty[w] |= b->sync[w];
			if (s->verify && b->sync[w])
				mark_stale(b, w, b->sync[w]);
		}
		added += pages << b->page_shift;
	}
	e->dirty_bytes += added;
	pthread_mutex_lock(&s->lock);
	publish_remaining(s);
	pthread_mutex_unlock(&s->lock);
	if (new_bytes)
		*new_bytes = added;
	note_cost(&e->sync_cost_ns, since);
	return 0;
}

static int start_first_pass(struct lmt_session *s)
{
	struct lmt_source_engine *e = s->source;
	int rc = sync_dirty(s, NULL); /* starts the VMM's tracking; all is dirty anyway */
	if (rc)
		return rc;
	e->dirty_bytes = 0;
	for (uint32_t i = 0; i < s->nblocks; i++) {
		struct lmt_block *b = &s->blocks[i];
		if (!lmt__block_copied(b))
			continue;
		lmt__bitmap_range(b->dirty, 0, b->npages, LMT_BITS_SET);
		e->dirty_bytes += b->length;
	}
	e->pass = 1;
	e->hash_pass = 1;
	e->pass_start_ns = lmt__now();
	e->cur_block = 0;
	e->cur_page = 0;
	pthread_mutex_lock(&s->lock);
	s->stats.passes = e->pass;
	publish_remaining(s);
	pthread_mutex_unlock(&s->lock);
	return 0;
}

static bool page_is_zero(const uint8_t *p, uint32_t size)
{
	const uint64_t *w = (const uint64_t *)p;
	if (w[0])
		return false;
	uint64_t acc = 0;
	for (uint32_t i = 0; i < size / 8; i += 8) {
		acc |= w[i] | w[i + 1] | w[i + 2] | w[i + 3] | w[i + 4] | w[i + 5] | w[i + 6] |
		       w[i + 7];
		if (acc)
			return false;
	}
	return true;
}

/* Skip an all-zero page of the bulk pass: the destination starts zeroed. */
static bool skip_zero(struct lmt_session *s, struct lmt_block *b, uint64_t page)
{
	struct lmt_source_engine *e = s->source;
	if (e->pass != 1 || !e->zero_detect ||
	    !page_is_zero(b->host + (page << b->page_shift), b->page_size))
		return false;
	lmt__bitmap_range(b->dirty, page, 1, LMT_BITS_CLEAR);
	e->dirty_bytes -= b->page_size;
	pthread_mutex_lock(&s->lock);
	s->stats.zero_pages++;
	publish_remaining(s);
	pthread_mutex_unlock(&s->lock);
	return true;
}

/* The next run of dirty pages from the cursor, within one chunk-size
 * window. Returns false at the end of the pass. */
static bool next_chunk(struct lmt_session *s, struct chunk *c)
{
	struct lmt_source_engine *e = s->source;
	while (e->cur_block < s->nblocks) {
		struct lmt_block *b = &s->blocks[e->cur_block];
		uint64_t p = lmt__bitmap_next(b->dirty, e->cur_page, b->npages);
		if (p == b->npages) {
			e->cur_block++;
			e->cur_page = 0;
			continue;
		}
		e->cur_page = p;
		if (skip_zero(s, b, p)) {
			e->cur_page = p + 1;
			continue;
		}
		uint64_t per_chunk = s->chunk_size >> b->page_shift;
		if (per_chunk == 0)
			per_chunk = 1;
		uint64_t limit = (p / per_chunk + 1) * per_chunk;
		if (limit > b->npages)
			limit = b->npages;
		uint64_t end = p + 1;
		while (end < limit && lmt__bitmap_test(b->dirty, end) && !skip_zero(s, b, end))
			end++;
		*c = (struct chunk){.block = e->cur_block, .page = p, .npages = end - p};
		return true;
	}
	return false;
}

/* ---- writes and completions ---- */

static int complete_slot(struct lmt_session *s, const struct lmt_completion *cp)
{
	struct lmt_source_engine *e = s->source;
	uint64_t idx = cp->cookie & ((1ull << SLOT_BITS) - 1);
	struct lmt_slot *sl = idx < e->nslots ? &e->slots[idx] : NULL;
	if (!sl || !sl->cookie || sl->cookie != cp->cookie)
		return lmt__fail(s, LMT_EPROTO, "plugin %s completed unknown write 0x%llx",
		                 s->desc->name, (unsigned long long)cp->cookie);
	struct lmt_block *b = &s->blocks[sl->block];
	if (cp->status)
		return lmt__fail(
		        s, cp->status,
		        "write of %llu bytes to block '%s' at offset %llu failed on channel "
		        "%u: %s",
		        (unsigned long long)sl->bytes, b->name,
		        (unsigned long long)(sl->page << b->page_shift), sl->channel,
		        lmt_strerror(cp->status));
	lmt__bitmap_range(b->inflight, sl->page, sl->npages, LMT_BITS_CLEAR);
	uint64_t now = lmt__now();
	e->ch_progress_ns[sl->channel] = now;
	e->ch_writes[sl->channel]--;
	e->ch_inflight[sl->channel] -= sl->bytes;
	e->ch_bytes[sl->channel] += sl->bytes;
	e->inflight_bytes -= sl->bytes;
	lmt__switchover_landed(&e->switchover, sl->bytes, !e->inflight_bytes, now);
	e->pass_bytes += sl->bytes;
	if (b->present)
		lmt__bitmap_range(b->present, sl->page, sl->npages, LMT_BITS_SET);
	/* One lock for the figures that must add up in any snapshot. */
	pthread_mutex_lock(&s->lock);
	s->stats.bytes_sent += sl->bytes;
	s->stats.channel_bytes[sl->channel] += sl->bytes;
	s->stats.normal_pages += sl->npages;
	publish_remaining(s);
	pthread_mutex_unlock(&s->lock);
	sl->cookie = 0;
	e->free_slots[e->nfree++] = (uint32_t)idx;
	return 0;
}

/* A channel with writes in flight that completed none for idle-timeout
 * has stalled, whether lmt is iterating, completing or between calls. */
int lmt__check_stalls(struct lmt_session *s, const uint32_t *writes, const uint64_t *progress_ns,
                      const char *what)
{
	uint64_t now = lmt__now();
	for (uint32_t ch = 0; ch < s->channels; ch++)
		if (writes[ch] && now - progress_ns[ch] > s->idle_timeout_ns)
			return lmt__fail(s, LMT_ETIMEDOUT,
			                 "%schannel %u: %u writes in flight and none completed for "
			                 "%llu ms",
			                 what, ch, writes[ch],
			                 (unsigned long long)(s->idle_timeout_ns / 1000000));
	return 0;
}

static int check_stalls(struct lmt_session *s)
{
	return lmt__check_stalls(s, s->source->ch_writes, s->source->ch_progress_ns, "");
}

/* Harvest completions, waiting up to timeout_ns for the first. */
static int harvest(struct lmt_session *s, uint64_t timeout_ns)
{
	struct lmt_completion comps[HARVEST_MAX];
	uint64_t since = lmt__now();
	int n = s->desc->ops.progress(s->inst, comps, HARVEST_MAX, timeout_ns);
	if (timeout_ns && n == 0)
		note_late(s->source, since + timeout_ns);
	if (n < 0)
		return lmt__fail(s, n, "plugin %s: progress failed (%s)", s->desc->name,
		                 lmt_err_name(n));
	for (int i = 0; i < n; i++) {
		int rc = complete_slot(s, &comps[i]);
		if (rc)
			return rc;
	}
	int rc = check_stalls(s);
	return rc ? rc : n;
}

/* Wait a slice for completions, then look after the control connection. */
static int wait_some(struct lmt_session *s, uint64_t deadline)
{
	uint64_t now = lmt__now();
	uint64_t slice = WAIT_SLICE_NS;
	if (deadline != NO_DEADLINE)
		slice = deadline > now ? (deadline - now < slice ? deadline - now : slice) : 0;
	int n = harvest(s, slice);
	return n < 0 ? n : service(s);
}

/* Writes in a row, each following the one before in guest RAM, that one
 * channel takes before the least loaded is chosen again, for a plugin that
 * merges them into one transfer (LMT_CAP_MERGES_RUNS: ofi over shm); 16
 * chunks keep the channels balanced. Other plugins get the least loaded
 * channel every time, which measured faster for tcp and ucx. */
#define CHANNEL_RUN 16u

/* The channel that took the write `c` continues, while the run is short
 * and it has room; otherwise the channel with the fewest bytes in flight
 * that has room. */
static uint32_t pick_channel(const struct lmt_session *s, const struct chunk *c)
{
	const struct lmt_source_engine *e = s->source;
	uint32_t best = UINT32_MAX;
	if ((s->caps & LMT_CAP_MERGES_RUNS) && e->run_length && e->run_length < CHANNEL_RUN &&
	    c->block == e->run_block && c->page == e->run_end_page &&
	    e->ch_writes[e->run_channel] < e->queue_depth)
		return e->run_channel;
	for (uint32_t ch = 0; ch < s->channels; ch++)
		if (e->ch_writes[ch] < e->queue_depth &&
		    (best == UINT32_MAX || e->ch_inflight[ch] < e->ch_inflight[best]))
			best = ch;
	return best;
}

/* Whether window `w` of `b` has a page to send. */
static bool window_dirty(const struct lmt_block *b, uint64_t w)
{
	uint64_t per = b->window >> b->page_shift;
	uint64_t first = w * per;
	uint64_t n = b->npages - first < per ? b->npages - first : per;
	return lmt__bitmap_range(b->dirty, first, n, LMT_BITS_ANY);
}

/* Ask the destination to register up to REG_BATCH windows that have no
 * key yet, from window `w` of block `bi` on in the walk's order: that
 * window when the walk `needs` it, and those with dirty pages. The answer
 * is not waited for: await_keys (or service) takes it when it comes, so
 * the round trip and the destination's registration (0.2-2.5 ms a batch
 * here) overlap the writes instead of stalling the call. */
static int ask_keys(struct lmt_session *s, uint32_t bi, uint64_t w, bool needs)
{
	struct lmt_source_engine *e = s->source;
	struct lmt_msg_regs *r = calloc(1, sizeof(*r));
	if (!r)
		return lmt__fail(s, LMT_ENOMEM, "out of memory");
	for (; bi < s->nblocks && r->count < REG_BATCH; bi++, w = 0) {
		const struct lmt_block *b = &s->blocks[bi];
		for (; b->rkeys && w < b->nwindows && r->count < REG_BATCH; w++) {
			if (b->rkeys[w] || (!(needs && r->count == 0) && !window_dirty(b, w)))
				continue;
			struct lmt_msg_reg *g = &r->regs[r->count++];
			g->block = bi;
			g->offset = w * b->window;
			g->length = b->length - g->offset < b->window ? b->length - g->offset
			                                              : b->window;
		}
	}
	int rc = r->count ? lmt__enc_regs(&s->out, LMT_MSG_REG_REQ, r) : 0;
	uint32_t count = r->count;
	free(r);
	if (rc)
		return lmt__fail(s, rc, "encoding REG_REQ");
	if (!count || (rc = lmt__ctrl_send(s)))
		return rc;
	e->keys_asked = true;
	e->keys_due = reply_deadline(s);
	e->call_progressed = true;
	return 0;
}

/* Take the destination's answer to the key request that is out, waiting
 * for it until `deadline` at most: 0 with the keys stored, or with the
 * request still out at `deadline`; an error once the destination has let
 * idle-timeout pass without answering. */
static int await_keys(struct lmt_session *s, uint64_t deadline)
{
	struct lmt_source_engine *e = s->source;
	while (e->keys_asked) {
		uint64_t due = e->keys_due < e->switchover_deadline ? e->keys_due
		                                                    : e->switchover_deadline;
		if (!lmt__ctrl_wait(s, deadline < due ? deadline : due)) {
			if (lmt__is_cancelled(s))
				return lmt__fail(s, LMT_ECANCELED, "migration cancelled");
			if (lmt__now() < due)
				return 0;
			if (due == e->switchover_deadline)
				return switchover_expired(s, "waiting for the destination's keys");
			return lmt__fail(s, LMT_ETIMEDOUT,
			                 "the destination did not answer a key request for %llu ms",
			                 (unsigned long long)(s->idle_timeout_ns / 1000000));
		}
		struct lmt_msg_header h;
		int rc = lmt__ctrl_expect(s, LMT_MSG_REG_REPLY, due, &h);
		if (rc)
			return rc;
		e->keys_asked = false;
		if ((rc = import_keys(s, h.length)))
			return rc;
	}
	return 0;
}

/* Before an exchange of another kind (the switchover's): the answer to
 * the key request that is out, if one is. */
static int settle_keys(struct lmt_session *s)
{
	return await_keys(s, UINT64_MAX);
}

/* The walk has reached window `w` of block `bi`: ask now for the keys of
 * the first window within KEYS_AHEAD ahead that has none and has pages to
 * send, so that they are in before the walk gets there. */
static int look_ahead(struct lmt_session *s, uint32_t bi, uint64_t w)
{
	struct lmt_source_engine *e = s->source;
	if (e->keys_asked || (bi == e->ahead_block && w == e->ahead_window))
		return 0;
	e->ahead_block = bi;
	e->ahead_window = w;
	uint32_t seen = 0;
	for (w++; bi < s->nblocks && seen < KEYS_AHEAD; bi++, w = 0) {
		const struct lmt_block *b = &s->blocks[bi];
		for (; b->rkeys && w < b->nwindows && seen < KEYS_AHEAD; w++, seen++)
			if (!b->rkeys[w] && window_dirty(b, w))
				return ask_keys(s, bi, w, false);
	}
	return 0;
}

/* Cut `c` short before the first of its pages that a write in flight
 * covers; false when that is its first page. */
static bool clear_of_inflight(const struct lmt_block *b, struct chunk *c)
{
	if (lmt__bitmap_test(b->inflight, c->page))
		return false;
	for (uint64_t i = 1; i < c->npages; i++)
		if (lmt__bitmap_test(b->inflight, c->page + i)) {
			c->npages = i;
			break;
		}
	return true;
}

/* The destination's key for window `w` of `c`'s block, and the local
 * registration when the plugin needs one, asked for or made as needed.
 * 0 when the window is ready, 2 when its key is still to come at
 * `deadline`, or an error. */
static int prepare_window(struct lmt_session *s, const struct chunk *c, uint64_t w,
                          uint64_t deadline)
{
	struct lmt_source_engine *e = s->source;
	struct lmt_block *b = &s->blocks[c->block];
	int rc;
	while (!b->rkeys[w]) {
		/* A request out may not cover this window: one that skipped
		 * it as clean before the guest wrote to it. */
		bool asked_now = !e->keys_asked;
		if (asked_now && (rc = ask_keys(s, c->block, w, true)))
			return rc;
		if ((rc = await_keys(s, deadline)))
			return rc;
		if (e->keys_asked)
			return 2;
		if (!b->rkeys[w] && asked_now)
			return lmt__fail(s, LMT_EPROTO, "block '%s': no key for offset %llu",
			                 b->name, (unsigned long long)(c->page << b->page_shift));
	}
	if ((s->caps & LMT_CAP_LOCAL_MR) && !b->mrs[w] && (rc = register_local(s, b, w)))
		return rc;
	return 0;
}

/* Account for the write of `c` just posted on channel `ch` in slot `idx`. */
static void account_post(struct lmt_session *s, const struct chunk *c, uint32_t ch, uint32_t idx,
                         uint64_t cookie)
{
	struct lmt_source_engine *e = s->source;
	struct lmt_block *b = &s->blocks[c->block];
	uint64_t bytes = c->npages << b->page_shift;
	e->nfree--;
	e->slots[idx] = (struct lmt_slot){.cookie = cookie,
	                                  .block = c->block,
	                                  .channel = ch,
	                                  .page = c->page,
	                                  .npages = c->npages,
	                                  .bytes = bytes};
	lmt__bitmap_range(b->inflight, c->page, c->npages, LMT_BITS_SET);
	bool follows = e->run_length && ch == e->run_channel && c->block == e->run_block &&
	               c->page == e->run_end_page;
	e->run_length = follows ? e->run_length + 1 : 1;
	e->run_channel = ch;
	e->run_block = c->block;
	e->run_end_page = c->page + c->npages;
	lmt__bitmap_range(b->dirty, c->page, c->npages, LMT_BITS_CLEAR);
	if (e->ch_writes[ch]++ == 0)
		e->ch_progress_ns[ch] = lmt__now();
	if (!e->inflight_bytes)
		lmt__switchover_busy(&e->switchover, lmt__now());
	e->ch_inflight[ch] += bytes;
	e->dirty_bytes -= bytes;
	e->inflight_bytes += bytes;
	e->bw_allowance -= (double)bytes;
	e->cur_page = c->page + c->npages;
	pthread_mutex_lock(&s->lock);
	s->stats.writes++;
	pthread_mutex_unlock(&s->lock);
}

/* Post one write for `c`, or shrink it to the part not overlapping a write
 * in flight. Returns 1 when it posted, 0 when it must wait, 2 when the
 * window's key is still to come at `deadline`, < 0 on error. */
static int try_post(struct lmt_session *s, struct chunk *c, uint64_t deadline)
{
	struct lmt_source_engine *e = s->source;
	struct lmt_block *b = &s->blocks[c->block];
	if (!clear_of_inflight(b, c))
		return 0;
	uint32_t ch = pick_channel(s, c);
	if (ch == UINT32_MAX || e->nfree == 0)
		return 0;
	uint64_t offset = c->page << b->page_shift;
	uint64_t bytes = c->npages << b->page_shift;
	uint64_t w = offset / b->window;
	int rc = prepare_window(s, c, w, deadline);
	if (rc)
		return rc;
	uint32_t idx = e->free_slots[e->nfree - 1];
	uint64_t cookie = (++e->generation << SLOT_BITS) | idx;
	rc = s->desc->ops.write(s->eps[ch], b->host + offset, bytes, b->mrs[w], b->rkeys[w],
	                        offset - w * b->window, cookie);
	if (rc == -LMT_EAGAIN)
		return 0;
	if (rc)
		return lmt__fail(s, rc, "channel %u: write of %llu bytes to block '%s' failed", ch,
		                 (unsigned long long)bytes, b->name);
	account_post(s, c, ch, idx, cookie);
	e->call_progressed = true;
	rc = look_ahead(s, c->block, w);
	return rc ? rc : 1;
}

/* ---- max-bandwidth ---- */

/* The most the allowance holds: one call's budget at the rate, or one
 * chunk when that is more. A VMM that comes back after a pause gets no
 * more than that at once. */
static double bw_burst(const struct lmt_session *s)
{
	const struct lmt_source_engine *e = s->source;
	double burst = (double)e->max_bandwidth * (double)e->iterate_ns / 1e9;
	return burst > (double)s->chunk_size ? burst : (double)s->chunk_size;
}

static void bw_refill(struct lmt_session *s, uint64_t now)
{
	struct lmt_source_engine *e = s->source;
	if (!e->bw_refill_ns) {
		e->bw_refill_ns = now;
		e->bw_allowance = 0;
		return;
	}
	e->bw_allowance += (double)(now - e->bw_refill_ns) * (double)e->max_bandwidth / 1e9;
	double burst = bw_burst(s);
	if (e->bw_allowance > burst)
		e->bw_allowance = burst;
	e->bw_refill_ns = now;
}

/* Time before which max-bandwidth allows no further write; 0 for now.
 * The limit is a token bucket that outlives each call: the allowance grows
 * at the rate, and a write may go while it is not negative and spends its
 * size. Over any span the bytes posted stay within the rate times the span
 * plus one burst and one write, however often and however briefly the VMM
 * calls iterate. (Accounting that restarted with each call let the first
 * write of every call through: three times the limit with 1M chunks and
 * 5 ms calls.) */
static uint64_t bandwidth_gate(struct lmt_session *s, bool limited, uint64_t now)
{
	struct lmt_source_engine *e = s->source;
	if (!limited || !e->max_bandwidth)
		return 0;
	bw_refill(s, now);
	if (e->bw_allowance >= 0)
		return 0;
	lmt__switchover_held(&e->switchover);
	return now + (uint64_t)(-e->bw_allowance * 1e9 / (double)e->max_bandwidth) + 1;
}

/* The runtime options (tuning.c), which any thread may have changed since
 * the last call. A debt of the bucket is paid at the new rate; going from
 * unlimited to a rate starts the bucket afresh. */
static void tune(struct lmt_session *s)
{
	struct lmt_source_engine *e = s->source;
	pthread_mutex_lock(&s->opts_lock);
	uint64_t rate = (uint64_t)lmt__opt_int(s->opts, "max-bandwidth");
	e->downtime_limit_ns = (uint64_t)lmt__opt_int(s->opts, "downtime-limit");
	e->switchover.option_bps = (uint64_t)lmt__opt_int(s->opts, "switchover-bandwidth");
	pthread_mutex_unlock(&s->opts_lock);
	if (rate == e->max_bandwidth)
		return;
	e->max_bandwidth = rate;
	if (!rate)
		e->bw_refill_ns = 0;
	else if (e->bw_refill_ns && e->bw_allowance > bw_burst(s))
		e->bw_allowance = bw_burst(s);
}

/* ---- verify=on ---- */

/* Hash the stale stripes behind the walk until `deadline`. Behind the walk
 * this pass has sent or skipped every dirty page, so the work spreads over
 * the pass and a stripe is read about when its pages were. A stripe the
 * guest writes after it was hashed is stale again at the next dirty sync;
 * whatever is stale when the guest is paused is hashed then (hash_rest).
 * A sweep that fell behind finishes its lap before following a new pass. */
static void hash_behind(struct lmt_session *s, uint64_t deadline)
{
	struct lmt_source_engine *e = s->source;
	if (!s->verify)
		return;
	uint64_t t0 = lmt__now(), now = t0, bytes = 0;
	while (now < deadline) {
		if (e->hash_block == s->nblocks) {
			if (e->hash_pass == e->pass)
				break;
			e->hash_pass = e->pass;
			e->hash_block = 0;
			e->hash_stripe = 0;
			continue;
		}
		struct lmt_block *b = &s->blocks[e->hash_block];
		bool at_walk =
		        e->hash_pass == e->pass && !e->pass_done && e->hash_block == e->cur_block;
		uint64_t limit =
		        at_walk ? e->cur_page >> (b->stripe_shift - b->page_shift) : b->nstripes;
		uint64_t i = lmt__bitmap_next(b->stale.bits, e->hash_stripe, limit);
		if (i == limit) {
			if (at_walk)
				break;
			e->hash_block++;
			e->hash_stripe = 0;
			continue;
		}
		lmt__verify_hash(b, i);
		e->hash_stripe = i + 1;
		bytes += 1ull << b->stripe_shift;
		now = lmt__now();
	}
	if (bytes) {
		e->hash_ns += now - t0;
		e->hash_bytes += bytes;
	}
}

/* The guest is paused: every stripe still stale. */
static void hash_rest(struct lmt_session *s)
{
	for (uint32_t k = 0; k < s->nblocks && s->verify; k++) {
		struct lmt_block *b = &s->blocks[k];
		for (uint64_t i = lmt__bitmap_next(b->stale.bits, 0, b->nstripes); i < b->nstripes;
		     i = lmt__bitmap_next(b->stale.bits, i + 1, b->nstripes))
			lmt__verify_hash(b, i);
	}
}

/* Tell the destination what landed since the last LANDED (`always`: even
 * if nothing did): the bytes per channel, for its statistics. Each write
 * reported completed, so its bytes are in the destination's memory before
 * this arrives. A file: target has no one to tell. */
static int report_landed(struct lmt_session *s, bool always)
{
	struct lmt_source_engine *e = s->source;
	struct lmt_msg_landed *m = e->landed;
	uint64_t sent = 0;
	if (s->file_path)
		return 0;
	for (uint32_t c = 0; c < s->channels; c++)
		sent += e->ch_bytes[c];
	if (!always && sent == e->landed_bytes)
		return 0;
	e->progress_sent_ns = lmt__now();
	m->channels = s->channels;
	memcpy(m->bytes, e->ch_bytes, sizeof(m->bytes));
	int rc = lmt__enc_landed(&s->out, m);
	if (rc)
		return lmt__fail(s, rc, "encoding LANDED");
	if ((rc = lmt__ctrl_send_by(s, reply_deadline(s))))
		return rc;
	e->landed_bytes = sent;
	return 0;
}

/* ---- passes ---- */

/* Walk and post until the pass ends or the deadline passes. */
static int send_pass(struct lmt_session *s, uint64_t deadline, bool limited)
{
	struct lmt_source_engine *e = s->source;
	struct chunk c;
	while (!e->pass_done) {
		int rc = harvest(s, 0);
		if (rc < 0 || (rc = service(s)))
			return rc;
		hash_behind(s, deadline);
		uint64_t now = lmt__now();
		if (now >= deadline)
			return 0;
		uint64_t gate = bandwidth_gate(s, limited, now);
		if (now < gate) {
			rc = harvest(s, (gate < deadline ? gate : deadline) - now);
			if (rc < 0)
				return rc;
			continue;
		}
		if (!next_chunk(s, &c)) {
			e->pass_done = true;
			break;
		}
		rc = try_post(s, &c, deadline);
		if (rc < 0)
			return rc;
		if (rc == 2)
			return 0; /* for the next call */
		if (rc == 0 && (rc = wait_some(s, deadline)))
			return rc;
	}
	return 0;
}

/* Wait for every write in flight; 1 if the deadline came first. */
static int drain(struct lmt_session *s, uint64_t deadline)
{
	struct lmt_source_engine *e = s->source;
	while (e->inflight_bytes) {
		if (lmt__now() >= deadline)
			return 1;
		int rc = wait_some(s, deadline);
		if (rc)
			return rc;
	}
	return 0;
}

/* With verify=on, how long the pause will spend hashing
 * (lmt__verify_pause_bytes), at this source's own rate. False while there
 * is some and no rate yet. */
static bool verify_pause_ns(const struct lmt_session *s, double *ns)
{
	const struct lmt_source_engine *e = s->source;
	uint64_t bytes = lmt__verify_pause_bytes(s);
	*ns = 0;
	if (!bytes)
		return true;
	if (!e->hash_bytes)
		return false;
	*ns = (double)bytes * (double)e->hash_ns / (double)e->hash_bytes;
	return true;
}

/* What the pause would take if it began now: the RAM left and the device
 * state announced (lmt_save_set_device_state_size) at the rate the pause
 * will send at, and the hashing left to it (lmt__pause_estimate). */
static void pause_parts(const struct lmt_session *s, struct lmt_pause_parts *p)
{
	const struct lmt_source_engine *e = s->source;
	*p = (struct lmt_pause_parts){
	        .ram_bytes = e->dirty_bytes + e->inflight_bytes,
	        .other_bytes = atomic_load(&e->device_state_bytes),
	        .rate_bps = lmt__switchover_bps(&e->switchover),
	};
	p->hash_known = verify_pause_ns(s, &p->hash_ns);
	if (s->file) {
		uint64_t bytes;
		lmt__file_pause_cost(s, &bytes, &p->sync_ns);
		p->other_bytes += bytes;
	}
}

static bool expected_downtime(const struct lmt_session *s, uint64_t *out)
{
	struct lmt_pause_parts p;
	pause_parts(s, &p);
	return lmt__pause_estimate(&p, out);
}

/* Whether what the pause does besides sending RAM (the device state, the
 * hashing, a file's syncs) fits downtime-limit, as far as can be told:
 * when it does not, no pass gets the migration ready. */
static bool rest_fits(const struct lmt_session *s)
{
	struct lmt_pause_parts p;
	uint64_t ns;
	pause_parts(s, &p);
	p.ram_bytes = 0;
	return !lmt__pause_estimate(&p, &ns) || ns <= s->source->downtime_limit_ns;
}

/* verify=on: say once that the pause's hashing alone, which no pass
 * shortens, is over downtime-limit, so that the migration will not be
 * ready until the limit is raised. */
static void warn_verify(struct lmt_session *s)
{
	struct lmt_source_engine *e = s->source;
	double ns;
	if (!s->verify || e->verify_warned || !verify_pause_ns(s, &ns) ||
	    ns <= (double)e->downtime_limit_ns)
		return;
	e->verify_warned = true;
	lmt__session_log(s, LMT_LOG_WARN,
	                 "verify=on: hashing the RAM in the pause takes about %.0f ms here, over "
	                 "downtime-limit (%.0f ms): not ready until the limit allows it",
	                 ns / 1e6, (double)e->downtime_limit_ns / 1e6);
}

/* A pass ended with `dirtied` bytes newly dirty: measure and record it.
 * `interrupted`: lmt_save_complete cut it short. */
static void measure_pass(struct lmt_session *s, uint64_t dirtied, bool final, bool interrupted)
{
	struct lmt_source_engine *e = s->source;
	uint64_t now = lmt__now();
	uint64_t span = now - e->pass_start_ns;
	uint64_t rate = span ? (uint64_t)((double)dirtied * 1e9 / (double)span) : 0;
	uint64_t pass_bps = span ? (uint64_t)((double)e->pass_bytes * 1e9 / (double)span) : 0;
	if (span && !final && (e->pass_bytes >= (1u << 20) || !e->bandwidth_bps))
		e->bandwidth_bps = pass_bps;
	if (!final) {
		lmt__switchover_measure(&e->switchover, pass_bps, 1u << 20, true, now);
		warn_verify(s);
	}
	pthread_mutex_lock(&s->lock);
	if (!final)
		s->stats.dirty_rate_bps = rate;
	s->stats.bandwidth_bps = e->bandwidth_bps;
	pthread_mutex_unlock(&s->lock);
	uint64_t expected = 0;
	bool known = final || expected_downtime(s, &expected);
	struct lmt_pass_stats p = {
	        .pass = e->pass,
	        .final = final,
	        .start_ns = e->pass_start_ns - s->start_ns,
	        .duration_ns = span,
	        .bytes = e->pass_bytes,
	        .dirtied_bytes = dirtied,
	        .dirty_rate_bps = rate,
	        .bandwidth_bps = pass_bps,
	        .expected_downtime_ns = expected,
	        .interrupted = interrupted,
	        .expected_downtime_known = known,
	        .throttle_percent = atomic_load(&e->converge.percent),
	};
	lmt__pass_record(s, &p);
}

/* A pass ended short of ready: auto-converge may ask for more throttle
 * before the next one. */
static void converge(struct lmt_session *s, uint64_t dirtied)
{
	struct lmt_source_engine *e = s->source;
	uint32_t percent = lmt__converge_pass(&e->converge, e->pass_bytes, dirtied);
	pthread_mutex_lock(&s->lock);
	s->stats.throttle_percent = percent;
	pthread_mutex_unlock(&s->lock);
}

static void start_pass(struct lmt_session *s)
{
	struct lmt_source_engine *e = s->source;
	e->pass++;
	e->pass_done = false;
	e->pass_start_ns = lmt__now();
	e->pass_bytes = 0;
	e->cur_block = 0;
	e->cur_page = 0;
	pthread_mutex_lock(&s->lock);
	s->stats.passes = e->pass;
	pthread_mutex_unlock(&s->lock);
}

/* A pass has walked every block. Far from converging, the next pass
 * starts at once and overlaps the writes still in flight (the overlap
 * rule keeps that safe). Close to it, the writes in flight are drained
 * first, so that "ready" means nothing is left but what is dirty. Returns
 * 1 when the deadline came first. */
/* postcopy-after passes ended and the migration is not ready: say to
 * switch. The pass is recorded; writes in flight are the switch's to
 * drain. */
static bool postcopy_due(const struct lmt_session *s)
{
	const struct lmt_source_engine *e = s->source;
	return s->postcopy_on && e->postcopy_after && e->pass >= e->postcopy_after;
}

/* The pass that ended was measured: say to switch. */
static void postcopy_now(struct lmt_session *s, struct lmt_iterate_result *res)
{
	struct lmt_source_engine *e = s->source;
	/* Said once the writes in flight have landed (iterate). */
	res->ready = res->postcopy = !e->inflight_bytes;
	e->postcopy_due = true;
	e->need_pass = true;
}

/* A file: target, its pass drained: sync ahead of the pause (file.c), if
 * the call has time for it by its last cost; 1: left to the next call. */
static int sync_ahead(struct lmt_session *s, uint64_t deadline)
{
	if (!s->file)
		return 0;
	if (!step_fits(s->source, s->file->sync_ns, deadline))
		return 1;
	return lmt__file_sync_ahead(s);
}

static int end_pass(struct lmt_session *s, uint64_t deadline, struct lmt_iterate_result *res)
{
	struct lmt_source_engine *e = s->source;
	int rc;
	if (!e->draining) {
		uint64_t dirtied;
		if ((rc = sync_dirty(s, &dirtied)))
			return rc;
		e->pass_dirtied = dirtied;
		uint64_t bw = lmt__switchover_bps(&e->switchover);
		if (bw &&
		    (double)e->dirty_bytes * 1e9 / (double)bw > (double)e->downtime_limit_ns) {
			measure_pass(s, dirtied, false, false);
			if (postcopy_due(s)) {
				postcopy_now(s, res);
				return 0;
			}
			converge(s, dirtied);
			start_pass(s);
			return 0;
		}
		e->draining = true;
	}
	if ((rc = drain(s, deadline)) || (rc = sync_ahead(s, deadline)))
		return rc;
	e->draining = false;
	uint64_t more, expected;
	if ((rc = sync_dirty(s, &more)))
		return rc;
	measure_pass(s, e->pass_dirtied + more, false, false);
	if (expected_downtime(s, &expected) && expected <= e->downtime_limit_ns) {
		res->ready = 1;
		e->need_pass = true;
	} else if (postcopy_due(s)) {
		postcopy_now(s, res);
	} else if (!e->dirty_bytes || !rest_fits(s)) {
		/* Not ready with nothing dirty, or with the rest of the pause
		 * over the limit by itself: a pass at once would not get the
		 * migration ready (passes of a few pages each, thousands a
		 * second). A later call starts the next pass. */
		converge(s, e->pass_dirtied + more);
		e->need_pass = true;
		e->next_pass_ns = lmt__now() + IDLE_PASS_GAP_NS;
	} else {
		converge(s, e->pass_dirtied + more);
		start_pass(s);
	}
	return 0;
}

/* One lmt_save_iterate call, which began at `start`. */
static int iterate(struct lmt_session *s, struct lmt_iterate_result *res, uint64_t start)
{
	struct lmt_source_engine *e = s->source;
	tune(s);
	/* The call's own work stops early: by the guard, or by how late
	 * waits have been ending when that is more, but never before a fifth
	 * of the budget, so that every call moves the migration on. The
	 * budget counts from the call's start: a thread kept off a core
	 * before it got here has spent that much of it. */
	uint64_t guard = e->iterate_ns / ITERATE_GUARD_DIV + ITERATE_GUARD_NS;
	if (guard < e->late_ns + ITERATE_GUARD_NS / 2)
		guard = e->late_ns + ITERATE_GUARD_NS / 2;
	uint64_t least = e->iterate_ns / ITERATE_GUARD_DIV;
	uint64_t deadline = start + (e->iterate_ns > guard + least ? e->iterate_ns - guard : least);
	uint64_t now = lmt__now();
	if (deadline < now + least)
		deadline = now + least;
	int rc = 0;
	e->call_progressed = false;
	if (e->pass == 0 && (rc = start_first_pass(s)))
		return rc;
	if (e->postcopy_due) {
		/* Switching is due. The writes still in flight land first,
		 * while the guest runs, so that the pause does not wait for
		 * them; then the call says to switch. */
		if (e->inflight_bytes && (rc = drain(s, deadline)) < 0)
			return rc;
		res->ready = res->postcopy = !e->inflight_bytes;
		return report_landed(s, false);
	}
	while (e->need_pass && lmt__now() < e->next_pass_ns && lmt__now() < deadline)
		if ((rc = wait_some(s, e->next_pass_ns < deadline ? e->next_pass_ns : deadline)))
			return rc;
	if (e->need_pass && lmt__now() >= e->next_pass_ns) {
		e->need_pass = false;
		e->next_pass_ns = 0;
		start_pass(s);
	}
	while (!res->ready && !e->need_pass && lmt__now() < deadline) {
		if ((rc = send_pass(s, deadline, true)))
			return rc;
		hash_behind(s, deadline);
		if (!e->pass_done || !step_fits(e, e->sync_cost_ns, deadline))
			break;
		if ((rc = end_pass(s, deadline, res)) < 0)
			return rc;
		e->call_progressed = true;
		if (rc)
			break;
	}
	hash_behind(s, deadline); /* the time left in the call */
	return report_landed(s, false);
}

static void fill_result(struct lmt_session *s, struct lmt_iterate_result *res)
{
	struct lmt_source_engine *e = s->source;
	/* Mid-pass, the pass so far is the best estimate once it means something. */
	uint64_t now = lmt__now(), span = now - e->pass_start_ns;
	if (!e->pass_done && e->pass_bytes >= (4u << 20) && span) {
		e->bandwidth_bps = (uint64_t)((double)e->pass_bytes * 1e9 / (double)span);
		lmt__switchover_measure(&e->switchover, e->bandwidth_bps, 4u << 20, false, now);
	}
	res->pass = e->pass;
	res->remaining_bytes = e->dirty_bytes + e->inflight_bytes;
	res->bandwidth_bps = e->bandwidth_bps;
	res->expected_downtime_known = expected_downtime(s, &res->expected_downtime_ns);
	pthread_mutex_lock(&s->lock);
	s->stats.expected_downtime_ns = res->expected_downtime_ns;
	s->stats.expected_downtime_known = res->expected_downtime_known;
	s->stats.bandwidth_bps = e->bandwidth_bps;
	pthread_mutex_unlock(&s->lock);
}

static int save_iterate(lmt_session *s, struct lmt_iterate_result *res)
{
	if (s->role != LMT_ROLE_SOURCE || atomic_load(&s->state) != LMT_STATE_ACTIVE)
		return lmt__usage(s, LMT_ESTATE, "save iterate: the session is not migrating");
	if (!res)
		return lmt__usage(s, LMT_EINVAL, "save iterate: result is NULL");
	if (s->postcopy)
		return lmt__usage(s, LMT_ESTATE,
		                  "save iterate: the migration switched to postcopy (call "
		                  "lmt_save_finish)");
	uint64_t start = lmt__now();
	memset(res, 0, sizeof(*res));
	int rc = report_progress(s);
	if (!rc)
		rc = iterate(s, res, start);
	if (rc)
		return lmt__abort(s, rc);
	fill_result(s, res);
	/* READY when the migration becomes ready, not on every call that
	 * finds it still so. */
	if (res->ready && !s->source->ready_posted)
		lmt__event_simple(s, LMT_EVENT_READY, 0);
	s->source->ready_posted = res->ready;
	return 0;
}

int lmt_save_iterate(lmt_session *s, struct lmt_iterate_result *res)
{
	if (!s)
		return -LMT_EINVAL;
	if (lmt__job_owns(s))
		return lmt__usage(
		        s, LMT_ESTATE,
		        "save iterate: a job started with lmt_save_start runs this session");
	lmt__call_enter(s);
	int rc = save_iterate(s, res);
	lmt__call_leave(s);
	return rc;
}

/* ---- stop and copy ---- */

int lmt__source_send_state(struct lmt_session *s, const uint8_t *data, size_t length)
{
	size_t off = 0;
	while (off < length) {
		size_t n =
		        length - off < LMT_PROTO_STATE_CHUNK ? length - off : LMT_PROTO_STATE_CHUNK;
		struct lmt_msg_state m = {
		        .offset = off, .total = length, .length = (uint32_t)n, .data = data + off};
		int rc = lmt__enc_state(&s->out, &m);
		if (rc)
			return lmt__fail(s, rc, "encoding DEVICE_STATE");
		if ((rc = lmt__ctrl_send_by(s, reply_deadline(s))))
			return rc == -LMT_ETIMEDOUT && lmt__now() >= s->source->switchover_deadline
			               ? switchover_expired(s, "sending the device state")
			               : rc;
		off += n;
	}
	return 0;
}

/* The guest is paused, a pass under way: nothing left in flight, the last
 * dirty pages synced, and the pass recorded as the switchover cut it
 * short. */
static int end_cut_pass(struct lmt_session *s)
{
	struct lmt_source_engine *e = s->source;
	uint64_t more;
	int rc;
	if ((rc = drain(s, e->switchover_deadline)))
		return rc < 0 ? rc : switchover_expired(s, "writes still in flight");
	if ((rc = sync_dirty(s, &more)))
		return rc;
	if (!e->need_pass)
		measure_pass(s, (e->draining ? e->pass_dirtied : 0) + more, false, true);
	e->need_pass = false;
	e->draining = false;
	return 0;
}

/* The guest is paused: a last pass over what is dirty, then every write
 * landed and flushed, all before the switchover's end. */
static int send_rest(struct lmt_session *s)
{
	struct lmt_source_engine *e = s->source;
	uint64_t end = e->switchover_deadline;
	int rc;
	if (e->pass == 0) {
		if ((rc = start_first_pass(s)))
			return rc;
	} else {
		if ((rc = end_cut_pass(s)))
			return rc;
		start_pass(s);
	}
	if ((rc = send_pass(s, end, false)))
		return rc;
	if (!e->pass_done)
		return switchover_expired(s, "the final pass unfinished");
	hash_rest(s); /* while the last writes are in flight */
	if ((rc = drain(s, end)))
		return rc < 0 ? rc : switchover_expired(s, "writes of the final pass in flight");
	uint64_t now = lmt__now();
	if (now >= end)
		return switchover_expired(s, "before the flush");
	uint64_t left = end - now;
	/* A file's pages are flushed with its metadata, before the commit
	 * record (lmt__file_save_finish): one fdatasync less in the pause. */
	if (s->file_path)
		rc = 0;
	else
		rc = s->desc->ops.flush(s->inst,
		                        left < s->idle_timeout_ns ? left : s->idle_timeout_ns);
	if (rc == -LMT_ETIMEDOUT && lmt__now() >= end)
		return switchover_expired(s, "in the plugin's flush");
	if (rc)
		return lmt__fail(s, rc, "plugin %s: flush failed (%s)", s->desc->name,
		                 lmt_err_name(rc));
	measure_pass(s, 0, true, false);
	return 0;
}

/* COMPLETE, with a digest per block when verify=on, and the answer. */
static int send_complete(struct lmt_session *s, size_t state_length)
{
	struct lmt_msg_complete *m = calloc(1, sizeof(*m));
	if (!m)
		return lmt__fail(s, LMT_ENOMEM, "out of memory");
	m->passes = s->source->pass;
	m->state_length = state_length;
	m->digest_count = s->verify ? s->nblocks : 0;
	for (uint32_t i = 0; i < m->digest_count; i++)
		m->digests[i] = lmt__verify_digest(&s->blocks[i]);
	int rc = lmt__enc_complete(&s->out, m);
	free(m);
	if (rc)
		return lmt__fail(s, rc, "encoding COMPLETE");
	struct lmt_msg_header h;
	if ((rc = lmt__ctrl_send_by(s, reply_deadline(s))) ||
	    (rc = lmt__ctrl_expect(s, LMT_MSG_COMPLETE_ACK, reply_deadline(s), &h)))
		return rc == -LMT_ETIMEDOUT && lmt__now() >= s->source->switchover_deadline
		               ? switchover_expired(s, "without the destination's acknowledgement")
		               : rc;
	struct lmt_msg_status st;
	struct lmt_error err = {0};
	if ((rc = lmt__dec_status(s->in, h.length, LMT_MSG_COMPLETE_ACK, &st, &err)))
		return lmt__fail(s, rc, "%s", err.message);
	if (st.code)
		return lmt__fail(s, st.code, "the destination refused the migration: %s", st.text);
	return 0;
}

static int finish(struct lmt_session *s, const void *state, size_t length)
{
	int rc;
	if (s->file_path) {
		if ((rc = send_rest(s)))
			return rc;
		return lmt__file_save_finish(s, state, length, s->source->pass,
		                             s->source->switchover_deadline);
	}
	if ((rc = send_rest(s)) || (rc = settle_keys(s)) || (rc = report_landed(s, false)) ||
	    (rc = lmt__source_send_state(s, state, length)))
		return rc;
	if (s->ctrl_unix && (rc = lmt__handover_send(s)))
		return rc;
	if (s->verify && (rc = lmt__verify_send(s, reply_deadline(s))))
		return rc == -LMT_ETIMEDOUT && lmt__now() >= s->source->switchover_deadline
		               ? switchover_expired(s, "sending the digests")
		               : rc;
	return send_complete(s, length);
}

/* Postcopy: the guest is paused. Nothing is left in flight and the last
 * dirty pages are synced: what is dirty now is what the destination
 * lacks, and postcopy.c takes over from here. */
static int postcopy_prepare(struct lmt_session *s)
{
	struct lmt_source_engine *e = s->source;
	uint64_t end = e->switchover_deadline;
	int rc;
	if (e->pass == 0)
		return start_first_pass(s);
	uint64_t t0 = lmt__now();
	if ((rc = end_cut_pass(s)) || (rc = settle_keys(s)))
		return rc;
	uint64_t now = lmt__now();
	if (now >= end)
		return switchover_expired(s, "before the flush");
	rc = s->desc->ops.flush(s->inst, end - now < s->idle_timeout_ns ? end - now
	                                                               : s->idle_timeout_ns);
	if (rc)
		return lmt__fail(s, rc, "plugin %s: flush failed (%s)", s->desc->name,
		                 lmt_err_name(rc));
	uint64_t t2 = lmt__now();
	rc = report_landed(s, false);
	lmt__session_log(s, LMT_LOG_DEBUG,
	                 "postcopy: last pass cut in %.2f ms, flushed in %.2f, landed reported "
	                 "in %.2f",
	                 (double)(now - t0) / 1e6, (double)(t2 - now) / 1e6,
	                 (double)(lmt__now() - t2) / 1e6);
	return rc;
}

static int save_postcopy(lmt_session *s, const void *device_state, size_t length)
{
	struct lmt_source_engine *e = s->source;
	uint64_t t0 = lmt__now();
	e->switchover_deadline = t0 + e->switchover_timeout_ns;
	int rc = postcopy_prepare(s);
	if (!rc)
		rc = lmt__postcopy_source_switch(s, device_state, length, e->pass,
		                                 e->switchover_deadline);
	if (rc == -LMT_ETIMEDOUT && lmt__now() >= e->switchover_deadline)
		rc = switchover_expired(s, "switching to postcopy");
	if (rc)
		return lmt__abort(s, rc);
	pthread_mutex_lock(&s->lock);
	s->stats.downtime_ns = lmt__now() - t0;
	s->stats.expected_downtime_ns = 0;
	s->stats.expected_downtime_known = 1;
	s->stats.status = LMT_STATUS_POSTCOPY;
	pthread_mutex_unlock(&s->lock);
	lmt__source_release_throttle(s);
	lmt__event_simple(s, LMT_EVENT_POSTCOPY, 0);
	return 0;
}

/* What lmt_save_complete and lmt_save_postcopy refuse alike. */
static int check_pause(lmt_session *s, const void *device_state, size_t length,
                       const char *what)
{
	if (s->role != LMT_ROLE_SOURCE || atomic_load(&s->state) != LMT_STATE_ACTIVE ||
	    s->postcopy)
		return lmt__usage(s, LMT_ESTATE, "%s: the session is not migrating", what);
	if (length && !device_state)
		return lmt__usage(s, LMT_EINVAL, "%s: %zu bytes of device state at NULL", what,
		                  length);
	if (length > LMT_PROTO_MAX_STATE)
		return lmt__usage(s, LMT_EOVERFLOW, "%s: device state of %zu bytes over 1G", what,
		                  length);
	return 0;
}

static int save_complete(lmt_session *s, const void *device_state, size_t length)
{
	int refused = check_pause(s, device_state, length, "save complete");
	if (refused)
		return refused;
	if (s->source->postcopy_due)
		return save_postcopy(s, device_state, length);
	uint64_t t0 = lmt__now();
	s->source->switchover_deadline = t0 + s->source->switchover_timeout_ns;
	pthread_mutex_lock(&s->lock);
	s->stats.status = LMT_STATUS_COMPLETING;
	pthread_mutex_unlock(&s->lock);
	int rc = finish(s, device_state, length);
	if (rc)
		return lmt__abort(s, rc);
	uint64_t acked = lmt__now();
	lmt__file_free(s);
	lmt__transport_close(s);
	lmt__ctrl_close(s);
	pthread_mutex_lock(&s->lock);
	s->stats.downtime_ns = acked - t0;
	s->stats.expected_downtime_ns = 0;
	s->stats.expected_downtime_known = 1;
	lmt__stats_end(s, LMT_STATUS_COMPLETED);
	pthread_mutex_unlock(&s->lock);
	lmt__source_release_throttle(s);
	atomic_store(&s->state, LMT_STATE_DONE);
	lmt__event_simple(s, LMT_EVENT_COMPLETED, 0);
	return 0;
}

int lmt_save_complete(lmt_session *s, const void *device_state, size_t length)
{
	if (!s)
		return -LMT_EINVAL;
	if (lmt__job_owns(s))
		return lmt__usage(
		        s, LMT_ESTATE,
		        "save complete: a job started with lmt_save_start runs this session");
	lmt__call_enter(s);
	int rc = save_complete(s, device_state, length);
	lmt__call_leave(s);
	return rc;
}

int lmt_save_postcopy(lmt_session *s, const void *device_state, size_t length)
{
	if (!s)
		return -LMT_EINVAL;
	if (lmt__job_owns(s))
		return lmt__usage(
		        s, LMT_ESTATE,
		        "save postcopy: a job started with lmt_save_start runs this session");
	int rc = check_pause(s, device_state, length, "save postcopy");
	if (!rc && !s->postcopy_on)
		rc = lmt__usage(s, LMT_EINVAL,
		                "save postcopy: postcopy=off (set postcopy=on on both sides "
		                "before setup)");
	if (rc)
		return rc;
	lmt__call_enter(s);
	rc = save_postcopy(s, device_state, length);
	lmt__call_leave(s);
	return rc;
}

/* After the switch: wait for the postcopy thread, then end the migration
 * as lmt_save_complete ends a precopy one. */
static int save_finish(lmt_session *s)
{
	int rc = lmt__postcopy_finish(s);
	if (rc)
		return lmt__abort(s, rc);
	lmt__transport_close(s);
	lmt__ctrl_close(s);
	pthread_mutex_lock(&s->lock);
	lmt__stats_end(s, LMT_STATUS_COMPLETED);
	s->finishing = false;
	pthread_mutex_unlock(&s->lock);
	atomic_store(&s->state, LMT_STATE_DONE);
	lmt__event_simple(s, LMT_EVENT_COMPLETED, 0);
	return 0;
}

int lmt_save_finish(lmt_session *s)
{
	if (!s)
		return -LMT_EINVAL;
	if (s->role != LMT_ROLE_SOURCE)
		return lmt__usage(s, LMT_ESTATE, "save finish: this session is a destination");
	int state = atomic_load(&s->state);
	if (state == LMT_STATE_DONE)
		return 0;
	if (state == LMT_STATE_FAILED)
		return lmt__usage(s, LMT_ESTATE, "save finish: the migration failed: %s",
		                  lmt_session_error(s)->message);
	pthread_mutex_lock(&s->lock);
	bool postcopy = s->postcopy && !s->finishing;
	s->finishing = postcopy;
	pthread_mutex_unlock(&s->lock);
	if (!postcopy)
		return lmt__usage(s, LMT_ESTATE,
		                  "save finish: no postcopy to finish (lmt_save_postcopy or "
		                  "lmt_save_complete must return 0 first, and only one call "
		                  "waits)");
	lmt__call_enter(s);
	int rc = save_finish(s);
	lmt__call_leave(s);
	return rc;
}

int lmt_save_set_device_state_size(lmt_session *s, uint64_t bytes)
{
	if (!s)
		return -LMT_EINVAL;
	if (s->role != LMT_ROLE_SOURCE)
		return lmt__usage(s, LMT_ESTATE,
		                  "device state size: only a source sends a device state");
	if (bytes > LMT_PROTO_MAX_STATE)
		return lmt__usage(s, LMT_EOVERFLOW,
		                  "device state size: %llu bytes is over the limit of 1G",
		                  (unsigned long long)bytes);
	atomic_store(&s->source->device_state_bytes, bytes);
	return 0;
}
