/* Postcopy: the switch on both sides, the source's thread that serves the
 * destination's faults and pushes the rest, and the destination's thread
 * that places what lands (docs/engine.md, "Postcopy").
 *
 * The destination lends the source a staging area of slots registered
 * for the transport; the source writes a run of pages into a free slot,
 * and once the write completes (its bytes are in the destination's
 * memory) names the slot and the pages in PAGES. The destination checks
 * that every one of those pages is one announced at the switch and not
 * placed yet, places them into the guest with UFFDIO_COPY and gives the
 * slot back (SLOTS_FREE). Pages the guest faults on are asked for at once
 * by the fault thread (PAGE_REQ) and written first, on a channel that
 * bulk writes do not use, into slots kept for them. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "bitmap.h"
#include "bytes.h"
#include "error.h"
#include "net.h"
#include "postcopy.h"
#include "sync.h"
#include "uffd.h"

#define FAULT_SLOTS 16u        /* slots bulk writes leave for faults */
/* Writes in place (no staging slot) in flight at once, and how many of
 * them bulk writes leave for faults. */
#define IN_PLACE_WRITES 64u
#define FAULT_IN_PLACE 8u
#define REQ_RING 4096u         /* faulted pages the source keeps in wait */
#define HARVEST_MAX 64u
#define BUSY_WAIT_NS 200000ull /* a wait with writes in flight */
#define IDLE_WAIT_NS 10000000ull
#define TARGET_SLICE_NS 200000ull
#define SETTLE_PAGES 512u /* the guest's own pages put back between messages */
#define POPULATE_PAGES 2048u /* second-mapping pages mapped between messages */
#define SLOT_BITS 20

enum slot_state { SLOT_FREE, SLOT_WRITING, SLOT_AT_DESTINATION };

struct pc_slot {
	uint8_t state;
	bool requested;
	uint32_t channel;
	uint64_t cookie;
	struct lmt_msg_page run;
};

struct lmt__postcopy {
	struct lmt_session *s;
	pthread_t thread;
	bool started;
	pthread_mutex_t lock; /* done and rc */
	pthread_cond_t cond;
	bool done;
	int rc;
	uint32_t slot_size;
	uint32_t nslots;
	uint64_t pages;     /* sent (source) or placed (destination) */
	uint64_t requested; /* of them, asked for by a fault */

	/* source */
	lmt_rkey *rkey;
	lmt_rkey **alias_rkeys; /* per block written in place; NULL otherwise */
	/* writes in flight: a staging slot's (index < nslots), or one in
	 * place (nslots and on), each with its free list */
	struct pc_slot *slots;
	uint32_t *free;
	uint32_t nfree;
	uint32_t local_free[IN_PLACE_WRITES];
	uint32_t nlocal_free;
	uint64_t generation;
	struct lmt_msg_page ring[REQ_RING];
	uint32_t ring_head, ring_len;
	uint32_t cur_block;
	uint64_t cur_page;
	uint64_t left; /* pages not sent yet */
	uint32_t writing;
	uint32_t ch_writes[LMT_MAX_CHANNELS];
	uint64_t ch_progress_ns[LMT_MAX_CHANNELS];
	struct lmt_msg_pages *batch;
	double bw_allowance;
	uint64_t bw_refill_ns;
	uint64_t bw_wait_ns; /* max-bandwidth holds the pushes this long */
	uint64_t bw_rate;    /* max-bandwidth, read at each turn of the loop */
	/* The last sign of the destination's progress: a slot back, a write
	 * completed, a request. */
	uint64_t progress_ns;

	/* destination */
	uint64_t **coming; /* per block, until the switch */
	/* per block written in place: the second mapping of its file and
	 * its registration (NULL for a block placed from staging) */
	uint8_t **alias;
	lmt_mr **alias_mrs;
	struct lmt__uffd *u;
	uint8_t *staging;
	size_t staging_len;
	lmt_mr *staging_mr;
	struct lmt_msg_pages *in;
	struct lmt_msg_slots *freed;
	bool settled; /* every local page is back */
	/* The second mappings' coming pages mapped ahead of their writes:
	 * where populate_block/populate_page got to, and whether done. */
	uint32_t populate_block;
	uint64_t populate_page;
	bool populated;
	pthread_mutex_t req_lock; /* the fault thread's requests */
	struct lmt_buf req_buf;
	uint64_t channel_bytes[LMT_MAX_CHANNELS];
};

static struct lmt__postcopy *pc_new(struct lmt_session *s)
{
	struct lmt__postcopy *pc = calloc(1, sizeof(*pc));
	if (!pc)
		return NULL;
	pc->s = s;
	pthread_mutex_init(&pc->lock, NULL);
	pthread_mutex_init(&pc->req_lock, NULL);
	if (lmt__cond_init(&pc->cond)) {
		pthread_mutex_destroy(&pc->lock);
		pthread_mutex_destroy(&pc->req_lock);
		free(pc);
		return NULL;
	}
	return pc;
}

static void pc_release(struct lmt__postcopy *pc)
{
	struct lmt_session *s = pc->s;
	lmt__uffd_close(pc->u);
	if (pc->rkey)
		s->desc->ops.rkey_release(s->inst, pc->rkey);
	if (pc->staging_mr)
		s->desc->ops.mr_deregister(s->inst, pc->staging_mr);
	if (pc->staging)
		munmap(pc->staging, pc->staging_len);
	for (uint32_t i = 0; pc->alias_rkeys && i < s->nblocks; i++)
		if (pc->alias_rkeys[i])
			s->desc->ops.rkey_release(s->inst, pc->alias_rkeys[i]);
	for (uint32_t i = 0; pc->alias && i < s->nblocks; i++) {
		if (pc->alias_mrs[i])
			s->desc->ops.mr_deregister(s->inst, pc->alias_mrs[i]);
		if (pc->alias[i])
			munmap(pc->alias[i], s->blocks[i].length);
	}
	free(pc->alias_rkeys);
	free(pc->alias);
	free(pc->alias_mrs);
	for (uint32_t i = 0; pc->coming && i < s->nblocks; i++)
		free(pc->coming[i]);
	free(pc->coming);
	free(pc->slots);
	free(pc->free);
	free(pc->batch);
	free(pc->in);
	free(pc->freed);
	lmt__buf_free(&pc->req_buf);
	pthread_cond_destroy(&pc->cond);
	pthread_mutex_destroy(&pc->lock);
	pthread_mutex_destroy(&pc->req_lock);
	free(pc);
}

/* The thread's end: its result, for lmt__postcopy_finish. */
static void pc_end(struct lmt__postcopy *pc, int rc)
{
	pthread_mutex_lock(&pc->lock);
	pc->done = true;
	pc->rc = rc;
	pthread_cond_broadcast(&pc->cond);
	pthread_mutex_unlock(&pc->lock);
}

static int pc_start(struct lmt__postcopy *pc, void *(*fn)(void *))
{
	struct lmt_session *s = pc->s;
	if (lmt__thread_start(&pc->thread, fn, pc))
		return lmt__fail(s, LMT_ENOMEM, "postcopy: cannot start its thread");
	pc->started = true;
	return 0;
}

/* Whether a run a peer named lies within a block that is copied. */
static bool run_is_guests(const struct lmt_session *s, const struct lmt_msg_page *r)
{
	return r->block < s->nblocks && lmt__block_copied(&s->blocks[r->block]) &&
	       r->page + r->npages <= s->blocks[r->block].npages;
}

/* The channel faults take: the last, opened for them (docs/engine.md). */
static uint32_t priority_channel(const struct lmt_session *s)
{
	return s->postcopy_channel ? s->channels - 1 : 0;
}

/* ---- source ---- */

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
		if ((rc = post(pc, r->block, page, n, priority_channel(s), true)) <= 0)
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
		if (!run_is_guests(s, r)) {
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
	pc_end(pc, rc < 0 ? rc : 0);
	return NULL;
}

int lmt__postcopy_source_switch(struct lmt_session *s, const void *state, size_t length,
                                uint64_t passes, uint64_t deadline)
{
	struct lmt__postcopy *pc = pc_new(s);
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
		rc = pc_start(pc, source_thread);
		if (rc) {
			pthread_mutex_lock(&s->lock);
			s->postcopy = NULL;
			pthread_mutex_unlock(&s->lock);
		}
	}
	if (rc)
		pc_release(pc);
	return rc;
}

/* ---- destination ---- */

int lmt__postcopy_pages(struct lmt_session *s, size_t length)
{
	struct lmt_msg_pc_pages m;
	struct lmt_error err = {0};
	if (!s->postcopy_on)
		return lmt__fail(s, LMT_EPROTO, "POSTCOPY_PAGES without postcopy=on");
	int rc = lmt__dec_pc_pages(s->in, length, &m, &err);
	if (rc)
		return lmt__fail(s, rc, "%s", err.message);
	if (m.block >= s->nblocks || !lmt__block_copied(&s->blocks[m.block]))
		return lmt__fail(s, LMT_EPROTO, "POSTCOPY_PAGES: block %u is not one copied",
		                 m.block);
	struct lmt_block *b = &s->blocks[m.block];
	uint64_t first = m.first / 64;
	if (first > b->words || m.words > b->words - first)
		return lmt__fail(s, LMT_EPROTO, "POSTCOPY_PAGES: pages past the end of block '%s'",
		                 b->name);
	struct lmt__postcopy *pc = s->postcopy;
	if (!pc) {
		pc = pc_new(s);
		if (!pc || !(pc->coming = calloc(s->nblocks, sizeof(*pc->coming)))) {
			if (pc)
				pc_release(pc);
			return lmt__fail(s, LMT_ENOMEM, "out of memory");
		}
		pthread_mutex_lock(&s->lock);
		s->postcopy = pc;
		pthread_mutex_unlock(&s->lock);
	}
	if (!pc->coming || pc->started)
		return lmt__fail(s, LMT_EPROTO, "POSTCOPY_PAGES after the switch");
	if (!pc->coming[m.block] && !(pc->coming[m.block] = calloc(b->words, 8)))
		return lmt__fail(s, LMT_ENOMEM, "out of memory");
	for (uint32_t w = 0; w < m.words; w++) {
		uint64_t bits = lmt__get64(m.bits + 8 * (size_t)w);
		uint64_t at = first + w;
		if (at == b->words - 1 && b->npages % 64 && (bits >> (b->npages % 64)))
			return lmt__fail(s, LMT_EPROTO,
			                 "POSTCOPY_PAGES: pages past the end of block '%s'", b->name);
		pc->coming[m.block][at] |= bits;
	}
	return 0;
}

/* The fault thread: ask the source for the page at once. */
static void fetch(void *opaque, uint32_t range, uint64_t page)
{
	struct lmt__postcopy *pc = opaque;
	struct lmt_session *s = pc->s;
	struct lmt_msg_page_req m = {.count = 1, .pages = {{.block = range, .page = page, .npages = 1}}};
	pthread_mutex_lock(&pc->req_lock);
	if (!lmt__enc_page_req(&pc->req_buf, &m))
		lmt__ctrl_send_raw(s, &pc->req_buf, lmt__now() + s->idle_timeout_ns);
	pthread_mutex_unlock(&pc->req_lock);
}

static int place(struct lmt__postcopy *pc, const struct lmt_msg_pc_entry *e)
{
	struct lmt_session *s = pc->s;
	const struct lmt_msg_page *r = &e->run;
	if (!run_is_guests(s, r))
		return lmt__fail(s, LMT_EPROTO, "PAGES: pages %llu+%u of block %u are not the guest's",
		                 (unsigned long long)r->page, r->npages, r->block);
	struct lmt_block *b = &s->blocks[r->block];
	uint8_t *alias = pc->alias[r->block];
	bool staged = e->slot != LMT_PROTO_ZERO_SLOT && e->slot != LMT_PROTO_IN_PLACE_SLOT;
	if (staged && (e->slot >= pc->nslots ||
	               ((uint64_t)r->npages << b->page_shift) > pc->slot_size))
		return lmt__fail(s, LMT_EPROTO, "PAGES: slot %u cannot hold %u pages of block '%s'",
		                 e->slot, r->npages, b->name);
	if ((e->slot == LMT_PROTO_IN_PLACE_SLOT) != (alias && e->slot != LMT_PROTO_ZERO_SLOT))
		return lmt__fail(s, LMT_EPROTO, "PAGES: block '%s' is %s", b->name,
		                 alias ? "written in place" : "not written in place");
	/* Only pages announced at the switch and not placed yet. */
	for (uint64_t p = r->page; p < r->page + r->npages; p++)
		if (lmt__uffd_present(pc->u, r->block, p) || lmt__uffd_local(pc->u, r->block, p))
			return lmt__fail(s, LMT_EPROTO,
			                 "PAGES: page %llu of block '%s' is not one still to come",
			                 (unsigned long long)p, b->name);
	struct lmt_error err = {0};
	int rc;
	if (alias) {
		/* In place: the file holds the page (zero ones are zeroed here,
		 * out of the guest's sight); map it for the guest. */
		if (e->slot == LMT_PROTO_ZERO_SLOT)
			memset(alias + (r->page << b->page_shift), 0,
			       (size_t)r->npages << b->page_shift);
		rc = lmt__uffd_continue(pc->u, r->block, r->page, r->npages, LMT_UFFD_AUTO, &err);
	} else if (e->slot == LMT_PROTO_ZERO_SLOT) {
		rc = lmt__uffd_zero(pc->u, r->block, r->page, r->npages, LMT_UFFD_AUTO, &err);
	} else {
		rc = lmt__uffd_copy(pc->u, r->block, r->page, r->npages,
		                    pc->staging + (size_t)e->slot * pc->slot_size, LMT_UFFD_AUTO,
		                    &err);
	}
	if (rc)
		return lmt__fail(s, err.code ? err.code : LMT_EIO, "postcopy: %s", err.message);
	pc->pages += r->npages;
	if (staged)
		pc->freed->slots[pc->freed->count++] = e->slot;
	return 0;
}

static int send_freed(struct lmt__postcopy *pc)
{
	struct lmt_session *s = pc->s;
	if (!pc->freed->count)
		return 0;
	int rc = lmt__enc_slots(&s->out, pc->freed);
	pc->freed->count = 0;
	return rc ? lmt__fail(s, rc, "encoding SLOTS_FREE") : lmt__ctrl_send(s);
}

static int take_pages(struct lmt__postcopy *pc, size_t length)
{
	struct lmt_session *s = pc->s;
	struct lmt_error err = {0};
	int rc = lmt__dec_pages(s->in, length, pc->in, &err);
	if (rc)
		return lmt__fail(s, rc, "%s", err.message);
	if (pc->in->channels != s->channels)
		return lmt__fail(s, LMT_EPROTO, "PAGES: %u channel counts for %u channels",
		                 pc->in->channels, s->channels);
	for (uint32_t c = 0; c < s->channels; c++)
		if (pc->in->bytes[c] < pc->channel_bytes[c])
			return lmt__fail(s, LMT_EPROTO, "PAGES: channel %u's byte count went back", c);
	for (uint32_t i = 0; i < pc->in->count && !rc; i++) {
		if (pc->freed->count == LMT_PROTO_MAX_SLOTS && (rc = send_freed(pc)))
			break;
		rc = place(pc, &pc->in->entries[i]);
	}
	if (rc)
		return rc;
	uint64_t total = 0;
	pthread_mutex_lock(&s->lock);
	for (uint32_t c = 0; c < s->channels; c++) {
		pc->channel_bytes[c] = pc->in->bytes[c];
		s->stats.channel_bytes[c] = pc->in->bytes[c];
		total += pc->in->bytes[c];
	}
	s->stats.bytes_received = total;
	s->stats.postcopy_pages = pc->pages;
	pthread_mutex_unlock(&s->lock);
	return send_freed(pc);
}

/* POSTCOPY_DONE: every page must be in place. Returns 1 when done. */
static int take_done(struct lmt__postcopy *pc, size_t length)
{
	struct lmt_session *s = pc->s;
	struct lmt_msg_pc_done m;
	struct lmt_error err = {0};
	int rc = lmt__dec_pc_done(s->in, length, &m, &err);
	if (rc)
		return lmt__fail(s, rc, "%s", err.message);
	/* The guest's own pages not back yet go back now. */
	while ((rc = lmt__uffd_settle(pc->u, UINT64_MAX, &err)) > 0)
		;
	if (rc < 0)
		return lmt__fail(s, rc, "postcopy: %s", err.message);
	uint64_t missing = lmt__uffd_missing(pc->u);
	struct lmt_msg_status st = {.code = 0};
	if (missing) {
		rc = lmt__fail(s, LMT_EPROTO, "POSTCOPY_DONE with %llu pages still missing",
		               (unsigned long long)missing);
		return rc;
	}
	if (m.pages != pc->pages)
		return lmt__fail(
		        s, LMT_EPROTO,
		        "POSTCOPY_DONE: the source counts %llu pages sent, %llu were placed",
		        (unsigned long long)m.pages, (unsigned long long)pc->pages);
	lmt__copy(st.text, sizeof(st.text), "ok");
	if ((rc = lmt__enc_status(&s->out, LMT_MSG_COMPLETE_ACK, &st)))
		return lmt__fail(s, rc, "encoding COMPLETE_ACK");
	rc = lmt__ctrl_send(s);
	lmt__ctrl_expect_close(s);
	return rc ? rc : 1;
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

/* Map up to max_pages of the pages still to come into the second
 * mappings, in the order the source pushes them, ahead of their writes:
 * a transport that copies (tcp, ucx over tcp or shared memory) would
 * otherwise take a page fault per page in its receiving thread, many
 * times the cost (512 MiB: 1.7 s against 0.05 s here). 1 when it mapped
 * some, 0 when none is left. Only an optimisation: a kernel without
 * MADV_POPULATE_WRITE (5.14) ends it. */
static int populate(struct lmt__postcopy *pc, uint64_t max_pages)
{
	struct lmt_session *s = pc->s;
	uint64_t done = 0;
	while (done < max_pages && pc->populate_block < s->nblocks) {
		uint32_t bi = pc->populate_block;
		struct lmt_block *b = &s->blocks[bi];
		uint64_t p = pc->alias[bi] ? lmt__uffd_next_coming(pc->u, bi, pc->populate_page)
		                           : b->npages;
		if (p >= b->npages) {
			pc->populate_block++;
			pc->populate_page = 0;
			continue;
		}
		uint64_t end = p + 1;
		while (end < b->npages && end - p < max_pages - done &&
		       !lmt__uffd_present(pc->u, bi, end) && !lmt__uffd_local(pc->u, bi, end))
			end++;
		if (madvise(pc->alias[bi] + (p << b->page_shift), (end - p) << b->page_shift,
		            MADV_POPULATE_WRITE)) {
			lmt__session_log(s, LMT_LOG_DEBUG,
			                 "postcopy: second mappings not populated ahead: %s",
			                 strerror(errno));
			pc->populate_block = s->nblocks;
			break;
		}
		pc->populate_page = end;
		done += end - p;
	}
	return done > 0;
}

static int destination_loop(struct lmt__postcopy *pc)
{
	struct lmt_session *s = pc->s;
	bool target = s->caps & LMT_CAP_TARGET_PROGRESS;
	struct lmt_completion comps[16];
	uint64_t heard = lmt__now();
	for (;;) {
		if (lmt__is_cancelled(s))
			return lmt__fail(s, LMT_ECANCELED, "postcopy cancelled");
		if (lmt__now() - heard > s->idle_timeout_ns)
			return lmt__fail(s, LMT_ETIMEDOUT,
			                 "postcopy: the source sent no pages for %llu ms "
			                 "(idle-timeout), %llu pages still missing",
			                 (unsigned long long)(s->idle_timeout_ns / 1000000),
			                 (unsigned long long)lmt__uffd_missing(pc->u));
		if (target) {
			int n = s->desc->ops.progress(s->inst, comps, 16, TARGET_SLICE_NS);
			if (n < 0)
				return lmt__fail(s, n, "plugin %s: progress failed (%s)", s->desc->name,
				                 lmt_err_name(n));
		}
		/* Between messages, the guest's own pages go back, a slice at a
		 * time (the fault thread puts back any it touches first). */
		struct lmt_error err = {0};
		int settling = pc->populated ? 0 : populate(pc, POPULATE_PAGES);
		pc->populated = settling == 0;
		if (!settling)
			settling = pc->settled ? 0 : lmt__uffd_settle(pc->u, SETTLE_PAGES, &err);
		if (settling < 0)
			return lmt__fail(s, settling, "postcopy: %s", err.message);
		pc->settled = pc->populated && settling == 0;
		if (!lmt__ctrl_wait(s, lmt__now() + (target || settling ? 0 : IDLE_WAIT_NS)))
			continue;
		struct lmt_msg_header h;
		int rc = lmt__ctrl_recv(s, &h, lmt__now() + s->idle_timeout_ns);
		if (rc)
			return rc;
		heard = lmt__now();
		if (h.type == LMT_MSG_PAGES)
			rc = take_pages(pc, h.length);
		else if (h.type == LMT_MSG_POSTCOPY_DONE)
			rc = take_done(pc, h.length);
		else
			rc = lmt__fail(s, LMT_EPROTO, "postcopy: unexpected %s from the source",
			               lmt__msg_name(h.type));
		if (rc)
			return rc;
	}
}

static void *destination_thread(void *arg)
{
	struct lmt__postcopy *pc = arg;
	int rc = destination_loop(pc);
	if (rc < 0) {
		lmt__uffd_fail(pc->u); /* no vCPU waits for ever */
		lmt__postcopy_failed(pc->s, rc);
	}
	pc_end(pc, rc < 0 ? rc : 0);
	return NULL;
}

/* Whether a block is written in place: a shared file (memfd, hugetlbfs)
 * where the kernel has minor faults on it. */
static bool written_in_place(const struct lmt__postcopy *pc, const struct lmt_block *b)
{
	return b->fd >= 0 && lmt__uffd_can_place_in_place(pc->u, b->hugetlbfs);
}

/* The second mapping of each block written in place, registered for the
 * source to write; the guest's own mapping stays out of its reach. */
static int open_aliases(struct lmt__postcopy *pc, struct lmt_msg_pc_ack *ack)
{
	struct lmt_session *s = pc->s;
	for (uint32_t i = 0; i < s->nblocks; i++) {
		struct lmt_block *b = &s->blocks[i];
		if (!lmt__block_copied(b) || !written_in_place(pc, b))
			continue;
		uint8_t *at = mmap(NULL, b->length, PROT_READ | PROT_WRITE, MAP_SHARED, b->fd,
		                   (off_t)b->fd_offset);
		if (at == MAP_FAILED)
			return lmt__fail(s, LMT_ENOMEM, "postcopy: block '%s': cannot map its file "
			                                "again: %s",
			                 b->name, strerror(errno));
		pc->alias[i] = at;
		struct lmt_msg_pc_alias *a = &ack->aliases[ack->naliases++];
		a->block = i;
		int rc = s->desc->ops.mr_register(s->inst, at, b->length, LMT_MR_REMOTE_WRITE,
		                                  &pc->alias_mrs[i], &a->key);
		if (rc)
			return lmt__fail(s, rc, "postcopy: block '%s': cannot register its second "
			                        "mapping",
			                 b->name);
	}
	return 0;
}

/* The guest's own mapping is out of the source's reach from the switch on:
 * its registrations go (nothing is in flight: the source drained). */
static void close_windows(struct lmt_session *s)
{
	for (uint32_t i = 0; i < s->nblocks; i++) {
		struct lmt_block *b = &s->blocks[i];
		for (uint64_t w = 0; b->mrs && w < b->nwindows; w++)
			if (b->mrs[w]) {
				s->desc->ops.mr_deregister(s->inst, b->mrs[w]);
				b->mrs[w] = NULL;
			}
	}
}

/* The staging area, registered for the source to write. */
static int open_staging(struct lmt__postcopy *pc, struct lmt_blob *key)
{
	struct lmt_session *s = pc->s;
	pc->slot_size = LMT_POSTCOPY_SLOT_SIZE;
	for (uint32_t i = 0; i < s->nblocks; i++)
		if (s->blocks[i].page_size > pc->slot_size)
			pc->slot_size = s->blocks[i].page_size;
	/* Huge pages make the slots as large: fewer of them then, as long
	 * as the pushes keep more than FAULT_SLOTS (at most 2 MiB pages:
	 * 64 MiB). */
	pc->nslots = LMT_POSTCOPY_STAGING / pc->slot_size;
	if (pc->nslots > LMT_POSTCOPY_SLOTS)
		pc->nslots = LMT_POSTCOPY_SLOTS;
	if (pc->nslots < 2 * FAULT_SLOTS)
		pc->nslots = 2 * FAULT_SLOTS;
	pc->staging_len = (size_t)pc->slot_size * pc->nslots;
	pc->staging = mmap(NULL, pc->staging_len, PROT_READ | PROT_WRITE,
	                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (pc->staging == MAP_FAILED) {
		pc->staging = NULL;
		return lmt__fail(s, LMT_ENOMEM, "postcopy: no memory for %zu bytes of staging",
		                 pc->staging_len);
	}
	int rc = s->desc->ops.mr_register(s->inst, pc->staging, pc->staging_len,
	                                  LMT_MR_REMOTE_WRITE, &pc->staging_mr, key);
	if (rc)
		return lmt__fail(s, rc, "postcopy: cannot register the staging area");
	pc->in = malloc(sizeof(*pc->in));
	pc->freed = calloc(1, sizeof(*pc->freed));
	return pc->in && pc->freed ? 0 : lmt__fail(s, LMT_ENOMEM, "out of memory");
}

/* userfaultfd over every copied block, the announced pages dropped. */
static int watch_blocks(struct lmt__postcopy *pc, uint64_t announced)
{
	struct lmt_session *s = pc->s;
	struct lmt_error err = {0};
	uint64_t counted = 0;
	for (uint32_t i = 0; i < s->nblocks; i++)
		for (uint64_t w = 0; pc->coming[i] && w < s->blocks[i].words; w++)
			counted += (uint64_t)__builtin_popcountll(pc->coming[i][w]);
	if (counted != announced)
		return lmt__fail(s, LMT_EPROTO,
		                 "POSTCOPY: %llu pages announced, POSTCOPY_PAGES named %llu",
		                 (unsigned long long)announced, (unsigned long long)counted);
	int rc = lmt__uffd_open(&pc->u, s->nblocks, s->userfaultfd, &err);
	for (uint32_t i = 0; i < s->nblocks && !rc; i++) {
		struct lmt_block *b = &s->blocks[i];
		if (!lmt__block_copied(b))
			continue;
		if (!pc->coming[i] && !(pc->coming[i] = calloc(b->words, 8)))
			return lmt__fail(s, LMT_ENOMEM, "out of memory");
		/* A block of a shared file is written in place where the kernel
		 * has minor faults; any other is placed from staging. Either way
		 * its pages move aside at once, however many are coming, and
		 * the guest's own come back on touch or in the background. */
		rc = lmt__uffd_register_moved(pc->u, i, b->host, b->length, b->page_shift,
		                              pc->coming[i], written_in_place(pc, b), &err);
		if (rc)
			return lmt__fail(s, err.code, "postcopy: block '%s': %s", b->name,
			                 err.message);
	}
	if (rc)
		return lmt__fail(s, err.code, "postcopy: %s", err.message);
	return lmt__uffd_start(pc->u, fetch, pc, &err) ? lmt__fail(s, err.code, "%s", err.message)
	                                                : 0;
}

/* POSTCOPY_ACK: `m` filled (code 0), or a refusal. */
static int send_ack(struct lmt_session *s, struct lmt_msg_pc_ack *m, int code, const char *text)
{
	m->code = code;
	lmt__copy(m->text, sizeof(m->text), text);
	int rc = lmt__enc_pc_ack(&s->out, m);
	return rc ? rc : lmt__ctrl_send(s);
}

int lmt__postcopy_switch(struct lmt_session *s, size_t length, uint64_t state_length)
{
	struct lmt_msg_postcopy m;
	struct lmt_error err = {0};
	struct lmt__postcopy *pc = s->postcopy;
	if (!s->postcopy_on)
		return lmt__fail(s, LMT_EPROTO, "POSTCOPY without postcopy=on");
	int rc = lmt__dec_postcopy(s->in, length, &m, &err);
	if (rc)
		return lmt__fail(s, rc, "%s", err.message);
	if (m.state_length != state_length)
		return lmt__fail(s, LMT_EPROTO, "POSTCOPY: device state of %llu bytes, %llu received",
		                 (unsigned long long)m.state_length,
		                 (unsigned long long)state_length);
	for (uint32_t i = 0; i < s->nblocks; i++)
		if (s->blocks[i].handover && s->blocks[i].received_fd < 0)
			return lmt__fail(s, LMT_EPROTO, "POSTCOPY before block '%s' was handed over",
			                 s->blocks[i].name);
	if (!pc) {
		pc = pc_new(s);
		if (!pc || !(pc->coming = calloc(s->nblocks, sizeof(*pc->coming)))) {
			if (pc)
				pc_release(pc);
			return lmt__fail(s, LMT_ENOMEM, "out of memory");
		}
		pthread_mutex_lock(&s->lock);
		s->postcopy = pc;
		pthread_mutex_unlock(&s->lock);
	}
	if (pc->started)
		return lmt__fail(s, LMT_EPROTO, "POSTCOPY twice");
	struct lmt_msg_pc_ack *ack = calloc(1, sizeof(*ack));
	pc->alias = calloc(s->nblocks, sizeof(*pc->alias));
	pc->alias_mrs = calloc(s->nblocks, sizeof(*pc->alias_mrs));
	if (!ack || !pc->alias || !pc->alias_mrs)
		rc = lmt__fail(s, LMT_ENOMEM, "out of memory");
	uint64_t t[5] = {lmt__now()};
	if (!rc && !(rc = watch_blocks(pc, m.pages))) {
		t[1] = lmt__now();
		if (!(rc = open_staging(pc, &ack->key))) {
			t[2] = lmt__now();
			rc = open_aliases(pc, ack);
		}
	}
	if (rc) {
		if (ack)
			send_ack(s, ack, rc, lmt_session_error(s)->message);
		free(ack);
		return rc;
	}
	t[3] = lmt__now();
	close_windows(s);
	t[4] = lmt__now();
	for (uint32_t i = 0; i < s->nblocks; i++) {
		free(pc->coming[i]);
		pc->coming[i] = NULL;
	}
	ack->slot_size = pc->slot_size;
	ack->slots = pc->nslots;
	lmt__session_log(s, LMT_LOG_INFO,
	                 "postcopy: %llu pages to come, %u block(s) written in place, the rest "
	                 "through %u staging slots of %u bytes",
	                 (unsigned long long)m.pages, ack->naliases, pc->nslots, pc->slot_size);
	rc = send_ack(s, ack, 0, "ok");
	free(ack);
	lmt__session_log(s, LMT_LOG_DEBUG,
	                 "postcopy: switched in %.2f ms: userfaultfd and pages moved aside %.2f, "
	                 "staging %.2f, second mappings %.2f, windows released %.2f, ack %.2f",
	                 (double)(lmt__now() - t[0]) / 1e6, (double)(t[1] - t[0]) / 1e6,
	                 (double)(t[2] - t[1]) / 1e6, (double)(t[3] - t[2]) / 1e6,
	                 (double)(t[4] - t[3]) / 1e6, (double)(lmt__now() - t[4]) / 1e6);
	if (rc)
		return rc < 0 && !lmt_session_error(s)->code ? lmt__fail(s, rc, "POSTCOPY_ACK") : rc;
	atomic_store(&s->in_postcopy, 1);
	pthread_mutex_lock(&s->lock);
	s->stats.passes = m.passes;
	s->stats.status = LMT_STATUS_POSTCOPY;
	pthread_mutex_unlock(&s->lock);
	if ((rc = pc_start(pc, destination_thread)))
		return rc;
	lmt__event_simple(s, LMT_EVENT_POSTCOPY, 0);
	return 1;
}

/* ---- both ---- */

int lmt__postcopy_finish(struct lmt_session *s)
{
	struct lmt__postcopy *pc = s->postcopy;
	if (!pc)
		return 0;
	int rc = 0;
	if (pc->started) {
		pthread_mutex_lock(&pc->lock);
		while (!pc->done)
			lmt__cond_wait_slice(&pc->cond, &pc->lock, lmt__deadline(LMT__SLICE_NS));
		rc = pc->rc;
		pthread_mutex_unlock(&pc->lock);
		pthread_join(pc->thread, NULL);
	}
	pthread_mutex_lock(&s->lock);
	lmt__postcopy_stats(s, &s->stats);
	s->postcopy = NULL;
	pthread_mutex_unlock(&s->lock);
	pc_release(pc);
	return rc;
}

void lmt__postcopy_free(struct lmt_session *s)
{
	if (!s->postcopy)
		return;
	if (s->postcopy->started)
		lmt_cancel(s);
	lmt__postcopy_finish(s);
}

void lmt__postcopy_stats(struct lmt_session *s, struct lmt_stats *out)
{
	struct lmt__postcopy *pc = s->postcopy;
	if (!pc || !pc->u)
		return;
	struct lmt__uffd_stats u;
	lmt__uffd_stats(pc->u, &u);
	out->faults = u.faults;
	out->fault_p50_ns = u.fault_p50_ns;
	out->fault_p99_ns = u.fault_p99_ns;
	out->fault_max_ns = u.fault_max_ns;
	out->background_pages = u.background_pages;
	out->postcopy_requested = u.fault_pages;
}
