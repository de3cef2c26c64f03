/* Postcopy's source side (engines room): the switch (the pages the
 * destination lacks announced, the device state sent, descriptors handed
 * over), and the thread that serves the destination's faults first and
 * pushes the rest (docs/engine.md, "Postcopy"). */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "bitmap.h"
#include "bytes.h"
#include "error.h"
#include "net.h"
#include "control.h"
#include "handover.h"
#include "postcopy_state.h"
#include "source_engine.h"
#include "sync.h"
#include "uffd.h"

/* POSTCOPY_PAGES for every block that has pages to come, in pieces. */
static int announce(struct lmt_session *s, uint64_t deadline, uint64_t *total)
{
	*total = 0;
	for (uint32_t i = 0; i < s->nblocks; i++) {
		struct lmt_block *b = &s->blocks[i];
		if (!lmt__block_copied(b))
			continue;
		uint64_t *le = malloc(b->words * 8);
		if (!le)
			return lmt__fail(s, LMT_ENOMEM, "out of memory");
		bool any = false;
		for (uint64_t w = 0; w < b->words; w++) {
			*total += (uint64_t)__builtin_popcountll(b->dirty[w]);
			any |= b->dirty[w] != 0;
			lmt__put64((uint8_t *)&le[w], b->dirty[w]);
		}
		int rc = 0;
		for (uint64_t w = 0; any && w < b->words && !rc; w += LMT_PROTO_MAX_BITMAP_WORDS) {
			uint64_t n = b->words - w < LMT_PROTO_MAX_BITMAP_WORDS
			                     ? b->words - w
			                     : LMT_PROTO_MAX_BITMAP_WORDS;
			struct lmt_msg_pc_pages m = {.block = i,
			                             .first = w * 64,
			                             .words = (uint32_t)n,
			                             .bits = (const uint8_t *)&le[w]};
			rc = lmt__enc_pc_pages(&s->out, &m);
			if (rc)
				rc = lmt__fail(s, rc, "encoding POSTCOPY_PAGES");
			else
				rc = lmt__ctrl_send_by(s, deadline);
		}
		free(le);
		if (rc)
			return rc;
	}
	return 0;
}

/* The largest page of a copied block: a staging slot must hold one. */
static uint32_t largest_page(const struct lmt_session *s)
{
	uint32_t largest = 0;
	for (uint32_t i = 0; i < s->nblocks; i++)
		if (lmt__block_copied(&s->blocks[i]) && s->blocks[i].page_size > largest)
			largest = s->blocks[i].page_size;
	return largest;
}

/* POSTCOPY_ACK: the destination took the guest, and lends its slots. */
static int take_ack(struct lmt__postcopy *pc, uint64_t deadline)
{
	struct lmt_session *s = pc->s;
	struct lmt_msg_header h;
	struct lmt_error err = {0};
	int rc = lmt__ctrl_expect(s, LMT_MSG_POSTCOPY_ACK, deadline, &h);
	if (rc)
		return rc;
	struct lmt_msg_pc_ack *m = malloc(sizeof(*m));
	if (!m)
		return lmt__fail(s, LMT_ENOMEM, "out of memory");
	rc = lmt__dec_pc_ack(s->in, h.length, m, &err);
	if (rc)
		rc = lmt__fail(s, rc, "%s", err.message);
	else if (m->code) {
		atomic_store(&s->in_postcopy, 0); /* it never ran the guest */
		rc = lmt__fail(s, m->code, "the destination refused postcopy: %s", m->text);
	} else if (m->slots <= FAULT_SLOTS)
		/* push() only writes while more than FAULT_SLOTS are free: with
		 * fewer, the pages no fault asks for would never go. */
		rc = lmt__fail(s, LMT_EPROTO,
		               "POSTCOPY_ACK: %u staging slots, postcopy needs more than %u",
		               m->slots, FAULT_SLOTS);
	else if (m->slot_size < largest_page(s))
		rc = lmt__fail(
		        s, LMT_EPROTO,
		        "POSTCOPY_ACK: staging slots of %u bytes cannot hold a page of %u bytes",
		        m->slot_size, largest_page(s));
	else if ((rc = s->desc->ops.rkey_import(s->inst, &m->key, &pc->rkey)))
		rc = lmt__fail(s, rc, "postcopy: the destination's staging key is unusable");
	if (!rc && !(pc->alias_rkeys = calloc(s->nblocks, sizeof(*pc->alias_rkeys))))
		rc = lmt__fail(s, LMT_ENOMEM, "out of memory");
	for (uint32_t i = 0; i < m->naliases && !rc; i++) {
		uint32_t bi = m->aliases[i].block;
		if (bi >= s->nblocks || !lmt__block_copied(&s->blocks[bi]))
			rc = lmt__fail(s, LMT_EPROTO, "POSTCOPY_ACK: block %u is not one copied", bi);
		else if ((rc = s->desc->ops.rkey_import(s->inst, &m->aliases[i].key,
		                                        &pc->alias_rkeys[bi])))
			rc = lmt__fail(s, rc, "postcopy: the destination's key for block '%s' is "
			                      "unusable",
			               s->blocks[bi].name);
	}
	if (!rc) {
		pc->slot_size = m->slot_size;
		pc->nslots = m->slots;
	}
	free(m);
	return rc;
}

static int source_alloc(struct lmt__postcopy *pc)
{
	pc->slots = calloc(pc->nslots + IN_PLACE_WRITES, sizeof(*pc->slots));
	pc->free = calloc(pc->nslots, sizeof(*pc->free));
	pc->batch = calloc(1, sizeof(*pc->batch));
	if (!pc->slots || !pc->free || !pc->batch)
		return lmt__fail(pc->s, LMT_ENOMEM, "postcopy: out of memory");
	for (uint32_t i = 0; i < pc->nslots; i++)
		pc->free[pc->nfree++] = pc->nslots - 1 - i;
	for (uint32_t i = 0; i < IN_PLACE_WRITES; i++)
		pc->local_free[pc->nlocal_free++] = pc->nslots + IN_PLACE_WRITES - 1 - i;
	return 0;
}

/* ---- the source's thread ---- */

static bool page_zero(const uint8_t *p, uint32_t size)
{
	const uint64_t *w = (const uint64_t *)p;
	for (uint32_t i = 0; i < size / 8; i++)
		if (w[i])
			return false;
	return true;
}

static int batch_flush(struct lmt__postcopy *pc)
{
	struct lmt_session *s = pc->s;
	if (!pc->batch->count)
		return 0;
	pthread_mutex_lock(&s->lock);
	pc->batch->channels = s->channels;
	for (uint32_t c = 0; c < s->channels; c++)
		pc->batch->bytes[c] = s->stats.channel_bytes[c];
	pthread_mutex_unlock(&s->lock);
	int rc = lmt__enc_pages(&s->out, pc->batch);
	pc->batch->count = 0;
	if (rc)
		return lmt__fail(s, rc, "encoding PAGES");
	return lmt__ctrl_send(s);
}

static int batch_add(struct lmt__postcopy *pc, uint32_t slot, uint32_t block, uint64_t page,
                     uint32_t npages)
{
	if (pc->batch->count == LMT_PROTO_MAX_PAGE_ENTRIES) {
		int rc = batch_flush(pc);
		if (rc)
			return rc;
	}
	pc->batch->entries[pc->batch->count++] = (struct lmt_msg_pc_entry){
	        .slot = slot, .run = {.block = block, .page = page, .npages = npages}};
	return 0;
}

/* Pages [page, page + n) of block b leave the dirty set: sent or zero. */
static void taken(struct lmt__postcopy *pc, struct lmt_block *b, uint64_t page, uint64_t n,
                  bool requested, bool zero)
{
	struct lmt_session *s = pc->s;
	lmt__bitmap_range(b->dirty, page, n, LMT_BITS_CLEAR);
	pc->left -= n;
	pc->pages += n;
	if (requested)
		pc->requested += n;
	pthread_mutex_lock(&s->lock);
	s->stats.postcopy_pages = pc->pages;
	s->stats.postcopy_requested = pc->requested;
	if (zero)
		s->stats.zero_pages += n;
	s->stats.remaining_bytes -= n << b->page_shift;
	pthread_mutex_unlock(&s->lock);
}

/* The run of dirty pages from *at of block `bi`, within one slot and one
 * window: leading zero pages go at once as zero entries (all of them for
 * a fault, the first run otherwise); *at becomes the first page left to
 * write and *npages how many (0: none). */
static int run_at(struct lmt__postcopy *pc, uint32_t bi, uint64_t *at, bool requested,
                  uint64_t *npages)
{
	struct lmt_session *s = pc->s;
	struct lmt_block *b = &s->blocks[bi];
	uint64_t page = *at;
	*npages = 0;
	while (page < b->npages && lmt__bitmap_test(b->dirty, page) &&
	       page_zero(b->host + (page << b->page_shift), b->page_size)) {
		uint64_t end = page + 1;
		while (end < b->npages && end - page < UINT32_MAX &&
		       lmt__bitmap_test(b->dirty, end) &&
		       page_zero(b->host + (end << b->page_shift), b->page_size))
			end++;
		int rc = batch_add(pc, LMT_PROTO_ZERO_SLOT, bi, page, (uint32_t)(end - page));
		if (rc)
			return rc;
		taken(pc, b, page, end - page, requested, true);
		if (!requested)
			return 0;
		page = end;
	}
	if (page >= b->npages || !lmt__bitmap_test(b->dirty, page))
		return 0;
	uint64_t per_slot = pc->slot_size >> b->page_shift;
	uint64_t pages_per_window = b->window >> b->page_shift;
	uint64_t limit = (page / pages_per_window + 1) * pages_per_window;
	if (limit > b->npages)
		limit = b->npages;
	if (limit > page + per_slot)
		limit = page + per_slot;
	uint64_t end = page + 1;
	while (end < limit && lmt__bitmap_test(b->dirty, end))
		end++;
	*at = page;
	*npages = end - page;
	return 0;
}

/* Write pages [page, page + n) of block bi into a free slot on `ch`.
 * 1: posted; 0: no room now. */
static int post(struct lmt__postcopy *pc, uint32_t bi, uint64_t page, uint64_t n, uint32_t ch,
                bool requested)
{
	struct lmt_session *s = pc->s;
	struct lmt_block *b = &s->blocks[bi];
	lmt_rkey *alias = pc->alias_rkeys[bi];
	if (alias ? !pc->nlocal_free : !pc->nfree)
		return 0;
	uint64_t w = (page << b->page_shift) / b->window;
	lmt_mr *mr = NULL;
	int rc = lmt__source_window_mr(s, bi, w, &mr);
	if (rc)
		return rc;
	uint32_t slot = alias ? pc->local_free[pc->nlocal_free - 1] : pc->free[pc->nfree - 1];
	uint64_t cookie = (++pc->generation << SLOT_BITS) | slot;
	uint64_t bytes = n << b->page_shift;
	/* In place: at the page's own offset in the block's second mapping. */
	rc = s->desc->ops.write(s->eps[ch], b->host + (page << b->page_shift), bytes, mr,
	                        alias ? alias : pc->rkey,
	                        alias ? page << b->page_shift : (uint64_t)slot * pc->slot_size,
	                        cookie);
	if (rc == -LMT_EAGAIN)
		return 0;
	if (rc)
		return lmt__fail(s, rc, "postcopy: channel %u: write of %llu bytes failed", ch,
		                 (unsigned long long)bytes);
	if (alias)
		pc->nlocal_free--;
	else
		pc->nfree--;
	pc->slots[slot] = (struct pc_slot){
	        .state = SLOT_WRITING,
	        .requested = requested,
	        .channel = ch,
	        .cookie = cookie,
	        .run = {.block = bi, .page = page, .npages = (uint32_t)n},
	};
	if (pc->ch_writes[ch]++ == 0)
		pc->ch_progress_ns[ch] = lmt__now();
	pc->writing++;
	pc->bw_allowance -= (double)bytes; /* faults count too */
	pc->progress_ns = lmt__now();
	taken(pc, b, page, n, requested, false);
	pthread_mutex_lock(&s->lock);
	s->stats.writes++;
	pthread_mutex_unlock(&s->lock);
	return 1;
}

/* Faulted pages first, on the priority channel, into any free slot. */
static int serve_requests(struct lmt__postcopy *pc)
{
	struct lmt_session *s = pc->s;
	while (pc->ring_len) {
		struct lmt_msg_page *r = &pc->ring[pc->ring_head];
		struct lmt_block *b = &s->blocks[r->block];
		uint64_t page = lmt__bitmap_next(b->dirty, r->page, r->page + r->npages);
		if (page == r->page + r->npages) {
			pc->ring_head = (pc->ring_head + 1) % REQ_RING;
			pc->ring_len--;
			continue;
		}
		uint64_t n;
		int rc = run_at(pc, r->block, &page, true, &n);
		if (rc)
			return rc;
		if (!n || page >= r->page + r->npages)
			continue;
		if (n > r->page + r->npages - page)
			n = r->page + r->npages - page;
		if ((rc = post(pc, r->block, page, n, lmt__postcopy_priority_channel(s), true)) <= 0)
			return rc;
	}
	return 0;
}

/* max-bandwidth over the background pushes: a token bucket (faults do not
 * wait for it, but count in it). Whether a bulk write may go now. */
static bool bandwidth_allows(struct lmt__postcopy *pc)
{
	uint64_t rate = pc->bw_rate;
	if (!rate)
		return true;
	uint64_t now = lmt__now();
	if (pc->bw_refill_ns) {
		pc->bw_allowance += (double)(now - pc->bw_refill_ns) * (double)rate / 1e9;
		double burst = (double)rate / 50.0 > pc->slot_size ? (double)rate / 50.0
		                                                  : (double)pc->slot_size;
		if (pc->bw_allowance > burst)
			pc->bw_allowance = burst;
	}
	pc->bw_refill_ns = now;
	/* Held back: how long until the allowance is positive again. */
	pc->bw_wait_ns = pc->bw_allowance > 0 ? 0
	                                      : (uint64_t)(-pc->bw_allowance * 1e9 / (double)rate) + 1;
	return pc->bw_allowance > 0;
}

/* The least busy bulk channel (every channel but the faults' own). */
static uint32_t bulk_channel(const struct lmt__postcopy *pc)
{
	const struct lmt_session *s = pc->s;
	uint32_t n = s->postcopy_channel ? s->channels - 1 : s->channels, best = 0;
	for (uint32_t ch = 1; ch < n; ch++)
		if (pc->ch_writes[ch] < pc->ch_writes[best])
			best = ch;
	return best;
}

/* The rest, in order, while slots beyond the faults' reserve are free. */
static int push(struct lmt__postcopy *pc)
{
	struct lmt_session *s = pc->s;
	while (pc->left && bandwidth_allows(pc)) {
		if (pc->cur_block >= s->nblocks) {
			pc->cur_block = 0;
			pc->cur_page = 0;
		}
		struct lmt_block *b = &s->blocks[pc->cur_block];
		uint64_t page = lmt__block_copied(b)
		                        ? lmt__bitmap_next(b->dirty, pc->cur_page, b->npages)
		                        : b->npages;
		if (page == b->npages) {
			pc->cur_block++;
			pc->cur_page = 0;
			continue;
		}
		/* Bulk writes leave room for faults. */
		if (pc->alias_rkeys[pc->cur_block] ? pc->nlocal_free <= FAULT_IN_PLACE
		                                   : pc->nfree <= FAULT_SLOTS)
			return 0;
		uint64_t n;
		int rc = run_at(pc, pc->cur_block, &page, false, &n);
		if (rc)
			return rc;
		pc->cur_page = page;
		if (!n)
			continue;
		if ((rc = post(pc, pc->cur_block, page, n, bulk_channel(pc), false)) <= 0)
			return rc;
		pc->cur_page = page + n;
	}
	return 0;
}

static int complete(struct lmt__postcopy *pc, const struct lmt_completion *cp)
{
	struct lmt_session *s = pc->s;
	uint64_t idx = cp->cookie & ((1ull << SLOT_BITS) - 1);
	struct pc_slot *sl = idx < pc->nslots + IN_PLACE_WRITES ? &pc->slots[idx] : NULL;
	if (!sl || sl->state != SLOT_WRITING || sl->cookie != cp->cookie)
		return lmt__fail(s, LMT_EPROTO, "plugin %s completed unknown write 0x%llx",
		                 s->desc->name, (unsigned long long)cp->cookie);
	if (cp->status)
		return lmt__fail(s, cp->status, "postcopy: a write failed on channel %u: %s",
		                 sl->channel, lmt_strerror(cp->status));
	struct lmt_block *b = &s->blocks[sl->run.block];
	uint64_t bytes = (uint64_t)sl->run.npages << b->page_shift;
	bool in_place = idx >= pc->nslots;
	sl->state = in_place ? SLOT_FREE : SLOT_AT_DESTINATION;
	if (in_place)
		pc->local_free[pc->nlocal_free++] = (uint32_t)idx;
	pc->writing--;
	pc->ch_writes[sl->channel]--;
	pc->ch_progress_ns[sl->channel] = pc->progress_ns = lmt__now();
	pthread_mutex_lock(&s->lock);
	s->stats.bytes_sent += bytes;
	s->stats.channel_bytes[sl->channel] += bytes;
	s->stats.normal_pages += sl->run.npages;
	pthread_mutex_unlock(&s->lock);
	return batch_add(pc, in_place ? LMT_PROTO_IN_PLACE_SLOT : (uint32_t)idx, sl->run.block,
	                 sl->run.page, sl->run.npages);
}

static int source_harvest(struct lmt__postcopy *pc, uint64_t timeout_ns)
{
	struct lmt_session *s = pc->s;
	struct lmt_completion comps[HARVEST_MAX];
	int n = s->desc->ops.progress(s->inst, comps, HARVEST_MAX, timeout_ns);
	if (n < 0)
		return lmt__fail(s, n, "plugin %s: progress failed (%s)", s->desc->name,
		                 lmt_err_name(n));
	for (int i = 0; i < n; i++) {
		int rc = complete(pc, &comps[i]);
		if (rc)
			return rc;
	}
	int rc = lmt__check_stalls(s, pc->ch_writes, pc->ch_progress_ns, "postcopy: ");
	return rc ? rc : n;
}

static int take_requests(struct lmt__postcopy *pc, size_t length)
{
	struct lmt_session *s = pc->s;
	struct lmt_msg_page_req *m = malloc(sizeof(*m));
	struct lmt_error err = {0};
	if (!m)
		return lmt__fail(s, LMT_ENOMEM, "out of memory");
	int rc = lmt__dec_page_req(s->in, length, m, &err);
	if (rc)
		rc = lmt__fail(s, rc, "%s", err.message);
	for (uint32_t i = 0; i < m->count && !rc; i++) {
		struct lmt_msg_page *r = &m->pages[i];
		if (!lmt__postcopy_run_is_guests(s, r)) {
			rc = lmt__fail(s, LMT_EPROTO,
			               "PAGE_REQ: pages %llu+%u of block %u are not the guest's",
			               (unsigned long long)r->page, r->npages, r->block);
			break;
		}
		/* A full ring drops the request: the page comes in the
		 * background anyway. */
		if (pc->ring_len < REQ_RING)
			pc->ring[(pc->ring_head + pc->ring_len++) % REQ_RING] = *r;
	}
	free(m);
	return rc;
}

static int take_freed(struct lmt__postcopy *pc, size_t length)
{
	struct lmt_session *s = pc->s;
	struct lmt_msg_slots *m = malloc(sizeof(*m));
	struct lmt_error err = {0};
	if (!m)
		return lmt__fail(s, LMT_ENOMEM, "out of memory");
	int rc = lmt__dec_slots(s->in, length, m, &err);
	if (rc)
		rc = lmt__fail(s, rc, "%s", err.message);
	for (uint32_t i = 0; i < m->count && !rc; i++) {
		uint32_t slot = m->slots[i];
		if (slot >= pc->nslots || pc->slots[slot].state != SLOT_AT_DESTINATION) {
			rc = lmt__fail(s, LMT_EPROTO, "SLOTS_FREE: slot %u was not the destination's",
			               slot);
			break;
		}
		pc->slots[slot].state = SLOT_FREE;
		pc->free[pc->nfree++] = slot;
		pc->progress_ns = lmt__now();
	}
	free(m);
	return rc;
}

static int source_messages(struct lmt__postcopy *pc)
{
	struct lmt_session *s = pc->s;
	while (lmt__ctrl_pending(s)) {
		struct lmt_msg_header h;
		int rc = lmt__ctrl_recv(s, &h, lmt__now() + s->idle_timeout_ns);
		if (rc)
			return rc;
		if (h.type == LMT_MSG_PAGE_REQ)
			rc = take_requests(pc, h.length);
		else if (h.type == LMT_MSG_SLOTS_FREE)
			rc = take_freed(pc, h.length);
		else
			rc = lmt__fail(s, LMT_EPROTO, "postcopy: unexpected %s from the destination",
			               lmt__msg_name(h.type));
		if (rc)
			return rc;
	}
	return 0;
}

/* Every page sent and placed: POSTCOPY_DONE and the acknowledgement. */
static int source_done(struct lmt__postcopy *pc)
{
	struct lmt_session *s = pc->s;
	struct lmt_msg_pc_done m = {.pages = pc->pages};
	int rc = lmt__enc_pc_done(&s->out, &m);
	if (rc)
		return lmt__fail(s, rc, "encoding POSTCOPY_DONE");
	struct lmt_msg_header h;
	if ((rc = lmt__ctrl_send(s)))
		return rc;
	for (;;) {
		if ((rc = lmt__ctrl_recv(s, &h, lmt__now() + s->idle_timeout_ns)))
			return rc;
		if (h.type == LMT_MSG_SLOTS_FREE) {
			if ((rc = take_freed(pc, h.length)))
				return rc;
			continue;
		}
		if (h.type == LMT_MSG_PAGE_REQ)
			continue; /* a fault raced the last page */
		break;
	}
	if (h.type != LMT_MSG_COMPLETE_ACK)
		return lmt__fail(s, LMT_EPROTO, "expected COMPLETE_ACK from the destination, got %s",
		                 lmt__msg_name(h.type));
	struct lmt_msg_status st;
	struct lmt_error err = {0};
	if ((rc = lmt__dec_status(s->in, h.length, LMT_MSG_COMPLETE_ACK, &st, &err)))
		return lmt__fail(s, rc, "%s", err.message);
	if (st.code)
		return lmt__fail(s, st.code, "the destination failed postcopy: %s", st.text);
	return 0;
}

static int source_loop(struct lmt__postcopy *pc)
{
	struct lmt_session *s = pc->s;
	pc->progress_ns = lmt__now();
	for (;;) {
		if (lmt__is_cancelled(s))
			return lmt__fail(s, LMT_ECANCELED, "postcopy cancelled");
		/* A runtime option: a VMM may change it while postcopy runs. */
		pthread_mutex_lock(&s->opts_lock);
		pc->bw_rate = (uint64_t)lmt__opt_int(s->opts, "max-bandwidth");
		pthread_mutex_unlock(&s->opts_lock);
		int rc = source_messages(pc);
		if (!rc)
			rc = serve_requests(pc);
		if (rc >= 0 && !(rc = push(pc)))
			rc = source_harvest(pc, 0);
		if (rc < 0)
			return rc;
		if ((rc = batch_flush(pc)))
			return rc;
		if (!pc->left && !pc->writing && !pc->ring_len)
			return source_done(pc);
		if (pc->writing) {
			if ((rc = source_harvest(pc, BUSY_WAIT_NS)) < 0 || (rc = batch_flush(pc)))
				return rc;
			continue;
		}
		/* Nothing in flight and pages left: held by max-bandwidth, or
		 * every slot is the destination's. A request or a slot given
		 * back ends the wait (a message). */
		if (!pc->bw_wait_ns && lmt__now() - pc->progress_ns > s->idle_timeout_ns)
			return lmt__fail(s, LMT_ETIMEDOUT,
			                 "postcopy: the destination gave no staging slot back for %llu "
			                 "ms (idle-timeout), %llu pages still to send",
			                 (unsigned long long)(s->idle_timeout_ns / 1000000),
			                 (unsigned long long)pc->left);
		uint64_t wait = pc->bw_wait_ns && pc->bw_wait_ns < IDLE_WAIT_NS ? pc->bw_wait_ns
		                                                                : IDLE_WAIT_NS;
		lmt__ctrl_wait(s, lmt__now() + wait);
	}
}

static void *source_thread(void *arg)
{
	struct lmt__postcopy *pc = arg;
	int rc = source_loop(pc);
	if (rc < 0)
		lmt__postcopy_failed(pc->s, rc);
	lmt__postcopy_end(pc, rc < 0 ? rc : 0);
	return NULL;
}

int lmt__postcopy_source_switch(struct lmt_session *s, const void *state, size_t length,
                                uint64_t passes, uint64_t deadline)
{
	struct lmt__postcopy *pc = lmt__postcopy_alloc(s);
	if (!pc)
		return lmt__fail(s, LMT_ENOMEM, "out of memory");
	struct lmt_msg_postcopy m = {.passes = passes, .state_length = length};
	uint64_t t0 = lmt__now();
	int rc = announce(s, deadline, &m.pages);
	uint64_t t1 = lmt__now(), t2 = t1;
	if (!rc)
		rc = lmt__source_send_state(s, state, length);
	if (!rc && s->ctrl_unix)
		rc = lmt__handover_send(s);
	if (!rc && (rc = lmt__enc_postcopy(&s->out, &m)))
		rc = lmt__fail(s, rc, "encoding POSTCOPY");
	else if (!rc && !(rc = lmt__ctrl_send_by(s, deadline)))
		/* From here the destination may run the guest: a failure is
		 * postcopy's, unless it refuses the switch. */
		atomic_store(&s->in_postcopy, 1);
	t2 = lmt__now();
	if (!rc)
		rc = take_ack(pc, deadline);
	if (!rc)
		lmt__session_log(s, LMT_LOG_DEBUG,
		                 "postcopy: %llu pages announced in %.2f ms, state and POSTCOPY "
		                 "sent in %.2f, acknowledged after %.2f",
		                 (unsigned long long)m.pages, (double)(t1 - t0) / 1e6,
		                 (double)(t2 - t1) / 1e6, (double)(lmt__now() - t2) / 1e6);
	pc->left = m.pages;
	if (!rc)
		rc = source_alloc(pc);
	if (!rc) {
		pthread_mutex_lock(&s->lock);
		s->postcopy = pc;
		pthread_mutex_unlock(&s->lock);
		rc = lmt__postcopy_start_thread(pc, source_thread);
		if (rc) {
			pthread_mutex_lock(&s->lock);
			s->postcopy = NULL;
			pthread_mutex_unlock(&s->lock);
		}
	}
	if (rc)
		lmt__postcopy_release(pc);
	return rc;
}

