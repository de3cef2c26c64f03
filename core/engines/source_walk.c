/* The source engine's walk (engines room): the dirty sync, zero pages
 * skipped or sent as zero runs (source_zero.c), chunks, keys asked ahead,
 * writes posted and harvested over the channels, the destination's
 * answers, stalls, max-bandwidth, the stripes hashed behind the writes
 * (verify=on) and LANDED. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bitmap.h"
#include "control.h"
#include "engines.h"
#include "error.h"
#include "file.h"
#include "net.h"
#include "session.h"
#include "source_engine.h"
#include "verify.h"

int lmt__source_report_progress(struct lmt_session *s)
{
	uint64_t every = s->idle_timeout_ns / 4 < 1000000000ull ? s->idle_timeout_ns / 4
	                                                        : 1000000000ull;
	if (lmt__now() - s->source->progress_sent_ns < every)
		return 0;
	return lmt__source_report_landed(s, true);
}

/* Keep-alives both ways, and any error the destination sent meanwhile;
 * at most every SERVICE_EVERY_NS. */
static int await_keys(struct lmt_session *s, uint64_t deadline);

/* A message of the destination's during the passes: ZERO_ACK, and
 * REG_REPLY while a key request is out (1: taken by the caller). */
static int take_answer(struct lmt_session *s, const struct lmt_msg_header *h)
{
	if (h->type == LMT_MSG_ZERO_ACK)
		return lmt__source_zero_acked(s, h->length);
	if (h->type == LMT_MSG_REG_REPLY && s->source->keys_asked)
		return 1;
	return lmt__fail(s, LMT_EPROTO, "unexpected %s from the destination",
	                 lmt__msg_name(h->type));
}

/* Every answer already queued. */
static int take_answers(struct lmt_session *s, uint64_t now)
{
	while (!s->source->keys_asked && lmt__ctrl_pending(s)) {
		struct lmt_msg_header h;
		int rc = lmt__ctrl_recv(s, &h, now);
		if (rc || (rc = take_answer(s, &h)))
			return rc;
	}
	return s->source->keys_asked ? await_keys(s, now) : 0;
}

int lmt__source_service(struct lmt_session *s)
{
	struct lmt_source_engine *e = s->source;
	uint64_t now = lmt__now();
	if (now - e->last_service_ns < SERVICE_EVERY_NS)
		return 0;
	e->last_service_ns = now;
	if (lmt__is_cancelled(s))
		return lmt__fail(s, LMT_ECANCELED, "migration cancelled");
	int rc = lmt__source_report_progress(s);
	if (rc)
		return rc;
	/* Keep-alives are the service thread's; the destination sends
	 * nothing else unasked. */
	return take_answers(s, now);
}

/* The switchover took longer than switchover-timeout: `what` was not done. */
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

bool lmt__source_step_fits(const struct lmt_source_engine *e, uint64_t cost, uint64_t deadline)
{
	return !e->call_progressed || deadline == NO_DEADLINE || lmt__now() + cost <= deadline;
}

/* The snapshot's remaining bytes, with s->lock held: dirty plus in flight,
 * changed together with the figures that moved them. */
static void publish_remaining(struct lmt_session *s)
{
	s->stats.remaining_bytes = lmt__source_left(s->source);
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

int lmt__source_sync_dirty(struct lmt_session *s, uint64_t *new_bytes)
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

int lmt__source_start_first_pass(struct lmt_session *s)
{
	struct lmt_source_engine *e = s->source;
	int rc = lmt__source_sync_dirty(s, NULL); /* starts the VMM's tracking; all is dirty anyway */
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
	e->pass_zero_pages = 0;
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

/* What a dirty page is to the walk. */
enum page_kind {
	PAGE_DATA,     /* sent as data */
	PAGE_SKIPPED,  /* all zero where the destination's page is still zero */
	PAGE_ZERO_RUN, /* all zero, sent in a zero run */
};

/* An all-zero page is skipped where the destination's page has never been
 * written: in the bulk pass (the destination starts zeroed) and, later,
 * in a window it has given no key for, since no write went there without
 * one. Elsewhere, in the passes after the bulk one, it goes in a zero run
 * (source_zero.c), but to a file: target as data. The check stops at the
 * first non-zero word, so it costs next to nothing on a page of data. */
static enum page_kind page_kind(struct lmt_session *s, struct lmt_block *b, uint64_t page)
{
	struct lmt_source_engine *e = s->source;
	if (!e->zero_detect)
		return PAGE_DATA;
	bool untouched = e->pass == 1 || (e->zero_runs && b->rkeys &&
	                                  !b->rkeys[(page << b->page_shift) / b->window]);
	if ((!untouched && !e->zero_runs) ||
	    !page_is_zero(b->host + (page << b->page_shift), b->page_size))
		return PAGE_DATA;
	return untouched ? PAGE_SKIPPED : PAGE_ZERO_RUN;
}

static void skip_zero(struct lmt_session *s, struct lmt_block *b, uint64_t page)
{
	struct lmt_source_engine *e = s->source;
	lmt__bitmap_range(b->dirty, page, 1, LMT_BITS_CLEAR);
	e->dirty_bytes -= b->page_size;
	e->pass_zero_pages++;
	pthread_mutex_lock(&s->lock);
	s->stats.zero_pages++;
	publish_remaining(s);
	pthread_mutex_unlock(&s->lock);
}

bool lmt__source_next_chunk(struct lmt_session *s, struct chunk *c)
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
		enum page_kind kind = page_kind(s, b, p);
		if (kind == PAGE_SKIPPED) {
			skip_zero(s, b, p);
			e->cur_page = p + 1;
			continue;
		}
		uint64_t per_chunk = s->chunk_size >> b->page_shift;
		if (per_chunk == 0)
			per_chunk = 1;
		uint64_t limit = (p / per_chunk + 1) * per_chunk;
		if (limit > b->npages)
			limit = b->npages;
		if (limit - p > UINT32_MAX)
			limit = p + UINT32_MAX; /* a zero run's count of pages */
		uint64_t end = p + 1;
		while (end < limit && lmt__bitmap_test(b->dirty, end)) {
			enum page_kind next = page_kind(s, b, end);
			if (next == PAGE_SKIPPED && kind == PAGE_DATA)
				skip_zero(s, b, end);
			if (next != kind)
				break;
			end++;
		}
		*c = (struct chunk){.block = e->cur_block,
		                    .page = p,
		                    .npages = end - p,
		                    .zero = kind == PAGE_ZERO_RUN};
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

int lmt__source_harvest(struct lmt_session *s, uint64_t timeout_ns)
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

int lmt__source_wait_some(struct lmt_session *s, uint64_t deadline)
{
	/* What waits may be a zero run still to go, or its answer. */
	int rc = lmt__source_zero_flush(s);
	if (rc)
		return rc;
	uint64_t now = lmt__now();
	uint64_t slice = WAIT_SLICE_NS;
	if (deadline != NO_DEADLINE)
		slice = deadline > now ? (deadline - now < slice ? deadline - now : slice) : 0;
	if (!s->source->inflight_bytes && lmt__source_zero_busy(s->source)) {
		/* Nothing on the channels: only the destination's answer. */
		lmt__ctrl_wait(s, now + slice);
		if (lmt__is_cancelled(s))
			return lmt__fail(s, LMT_ECANCELED, "migration cancelled");
		return take_answers(s, lmt__now());
	}
	int n = lmt__source_harvest(s, slice);
	return n < 0 ? n : lmt__source_service(s);
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
	e->keys_due = lmt__source_reply_deadline(s);
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
				return lmt__source_switchover_expired(s, "waiting for the destination's keys");
			return lmt__fail(s, LMT_ETIMEDOUT,
			                 "the destination did not answer a key request for %llu ms",
			                 (unsigned long long)(s->idle_timeout_ns / 1000000));
		}
		struct lmt_msg_header h;
		int rc = lmt__ctrl_recv(s, &h, due);
		if (rc || (rc = take_answer(s, &h)) < 0)
			return rc;
		if (!rc)
			continue; /* a ZERO_ACK */
		e->keys_asked = false;
		if ((rc = lmt__source_import_keys(s, h.length)))
			return rc;
	}
	return 0;
}

int lmt__source_settle_keys(struct lmt_session *s)
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
	if ((s->caps & LMT_CAP_LOCAL_MR) && !b->mrs[w] && (rc = lmt__source_register_local(s, b, w)))
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

int lmt__source_try_post(struct lmt_session *s, struct chunk *c, uint64_t deadline)
{
	struct lmt_source_engine *e = s->source;
	struct lmt_block *b = &s->blocks[c->block];
	if (!clear_of_inflight(b, c))
		return 0;
	if (c->zero)
		return lmt__source_zero_post(s, c);
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

uint64_t lmt__source_bandwidth_gate(struct lmt_session *s, bool limited, uint64_t now)
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

void lmt__source_tune(struct lmt_session *s)
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

void lmt__source_hash_behind(struct lmt_session *s, uint64_t deadline)
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

void lmt__source_hash_rest(struct lmt_session *s)
{
	for (uint32_t k = 0; k < s->nblocks && s->verify; k++) {
		struct lmt_block *b = &s->blocks[k];
		for (uint64_t i = lmt__bitmap_next(b->stale.bits, 0, b->nstripes); i < b->nstripes;
		     i = lmt__bitmap_next(b->stale.bits, i + 1, b->nstripes))
			lmt__verify_hash(b, i);
	}
}

int lmt__source_report_landed(struct lmt_session *s, bool always)
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
	if ((rc = lmt__ctrl_send_by(s, lmt__source_reply_deadline(s))))
		return rc;
	e->landed_bytes = sent;
	return 0;
}

