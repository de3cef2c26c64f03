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
 * bulk writes do not use, into slots kept for them.
 * Room: paging; may use: base, wire, session, control, transport, targets. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "bitmap.h"
#include "bytes.h"
#include "error.h"
#include "net.h"
#include "postcopy_state.h"
#include "sync.h"
#include "uffd.h"

struct lmt__postcopy *lmt__postcopy_alloc(struct lmt_session *s)
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

void lmt__postcopy_release(struct lmt__postcopy *pc)
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

void lmt__postcopy_end(struct lmt__postcopy *pc, int rc)
{
	pthread_mutex_lock(&pc->lock);
	pc->done = true;
	pc->rc = rc;
	pthread_cond_broadcast(&pc->cond);
	pthread_mutex_unlock(&pc->lock);
}

int lmt__postcopy_start_thread(struct lmt__postcopy *pc, void *(*fn)(void *))
{
	struct lmt_session *s = pc->s;
	if (lmt__thread_start(&pc->thread, fn, pc))
		return lmt__fail(s, LMT_ENOMEM, "postcopy: cannot start its thread");
	pc->started = true;
	return 0;
}

bool lmt__postcopy_run_is_guests(const struct lmt_session *s, const struct lmt_msg_page *r)
{
	return r->block < s->nblocks && lmt__block_copied(&s->blocks[r->block]) &&
	       r->page + r->npages <= s->blocks[r->block].npages;
}

uint32_t lmt__postcopy_priority_channel(const struct lmt_session *s)
{
	return s->postcopy_channel ? s->channels - 1 : 0;
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
	lmt__postcopy_release(pc);
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
