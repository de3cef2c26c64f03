/* Postcopy's destination side (paging room): POSTCOPY_PAGES and the
 * switch taken in the load loop, and the thread that checks and places
 * what lands, in a copy from staging slots or in place through a second
 * mapping of a memfd (docs/engine.md, "Postcopy"). */
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
#include "postcopy_state.h"
#include "sync.h"
#include "uffd.h"

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
		pc = lmt__postcopy_alloc(s);
		if (!pc || !(pc->coming = calloc(s->nblocks, sizeof(*pc->coming)))) {
			if (pc)
				lmt__postcopy_release(pc);
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
	if (!lmt__postcopy_run_is_guests(s, r))
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
	lmt__postcopy_end(pc, rc < 0 ? rc : 0);
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
		pc = lmt__postcopy_alloc(s);
		if (!pc || !(pc->coming = calloc(s->nblocks, sizeof(*pc->coming)))) {
			if (pc)
				lmt__postcopy_release(pc);
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
	if ((rc = lmt__postcopy_start_thread(pc, destination_thread)))
		return rc;
	lmt__event_simple(s, LMT_EVENT_POSTCOPY, 0);
	return 1;
}

