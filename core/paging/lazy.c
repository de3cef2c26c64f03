/* restore=lazy: the file is checked, the guest may run, and its pages
 * come in behind it. The blocks are registered with userfaultfd (uffd.c);
 * a fault hands its page to the loader thread, which owns the storage
 * plugin's channels: it reads the runs faulted first, and otherwise the
 * next pages in order, into buffers it then places. Holes are zeroed in
 * place. With verify=on every read covers whole stripes and is checked
 * against its digest before a byte of it is placed.
 * Room: paging; may use: base, wire, session, control, transport, targets. */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "bitmap.h"
#include "error.h"
#include "file.h"
#include "net.h"
#include "session.h"
#include "sync.h"
#include "uffd.h"
#include "lazy.h"

#define QUEUE 1024u
#define FAULT_SLOTS 8u
#define FAULT_RUN (64u << 10)
#define BACKGROUND_RUN (256u << 10)
#define HOLE_GAP 16u

struct fault_req {
	uint32_t block;
	uint64_t page;
};

/* A read in a batch: pages [page, page + npages) of a block. */
struct slot {
	uint32_t block;
	uint64_t page, npages;
	enum lmt__uffd_origin origin;
	uint8_t *buf;
};

struct lmt__lazy {
	struct lmt_session *s;
	struct lmt__uffd *u;
	struct lmt__mover m;
	uint64_t **bitmaps; /* pages the file holds, per block */
	uint64_t **digests; /* verify=on */
	pthread_t thread;
	bool started;
	pthread_mutex_t lock; /* guards the queue, done, rc, fault_error */
	pthread_cond_t cond;
	struct fault_req queue[QUEUE];
	uint32_t first, used;
	bool done;
	int rc;
	struct lmt_error fault_error; /* a hole the fault thread could not zero */
	/* The background's place. */
	uint32_t bg_block;
	uint64_t bg_page;
	struct slot slots[FAULT_SLOTS + LMT_MAX_CHANNELS];
	uint64_t run_bytes; /* each slot's buffer */
	_Atomic uint64_t file_pages;
};

/* Pages per run of at most `bytes` in block b (at least one page), whole
 * stripes with verify=on. */
static uint64_t run_pages(const struct lmt_block *b, uint64_t bytes, bool verify)
{
	uint32_t unit = verify ? b->stripe_shift : b->page_shift;
	uint64_t units = bytes >> unit ? bytes >> unit : 1;
	return (units << unit) >> b->page_shift;
}

static uint64_t min_u64(uint64_t a, uint64_t b)
{
	return a < b ? a : b;
}

/* ---- verify=on ---- */

/* Whole stripes of [page, page + npages) in buf, against their digests. */
static int check_stripes(struct lmt__lazy *z, const struct slot *sl)
{
	struct lmt_session *s = z->s;
	struct lmt_block *b = &s->blocks[sl->block];
	uint64_t from = sl->page << b->page_shift;
	uint64_t end = min_u64(from + (sl->npages << b->page_shift), b->length);
	for (uint64_t off = from; off < end; off += 1ull << b->stripe_shift) {
		uint64_t k = off >> b->stripe_shift;
		uint64_t len = min_u64(1ull << b->stripe_shift, b->length - off);
		if (XXH3_64bits(sl->buf + (off - from), len) != z->digests[sl->block][k])
			return lmt__fail(
			        s, LMT_EVERIFY,
			        "file '%s': verify: block '%s': bytes %llu to %llu differ from "
			        "the digest saved with them; none of them was placed",
			        s->file_path, b->name, (unsigned long long)off,
			        (unsigned long long)(off + len - 1));
	}
	return 0;
}

/* ---- choosing what to read ---- */

static bool in_file(const struct lmt__lazy *z, uint32_t block, uint64_t page)
{
	return lmt__bitmap_test(z->bitmaps[block], page);
}

/* The run from `page`: pages missing, in the file (or, for `holes`, not
 * in it), at most `max`. verify=on reads whole stripes instead. */
static uint64_t run_from(struct lmt__lazy *z, uint32_t block, uint64_t page, uint64_t max,
                         bool holes)
{
	const struct lmt_block *b = &z->s->blocks[block];
	uint64_t n = 1;
	while (page + n < b->npages && n < max && !lmt__uffd_present(z->u, block, page + n) &&
	       in_file(z, block, page + n) != holes)
		n++;
	return n;
}

/* The background's run from `page` (in the file, missing): it reads
 * across holes of fewer than HOLE_GAP pages, which the file holds as
 * zeros, rather than split there; a longer hole is zeroed on its own. */
static uint64_t background_run(struct lmt__lazy *z, uint32_t block, uint64_t page, uint64_t max)
{
	const struct lmt_block *b = &z->s->blocks[block];
	uint64_t n = 1, last = 1, gap = 0;
	while (page + n < b->npages && n < max && gap < HOLE_GAP &&
	       !lmt__uffd_present(z->u, block, page + n)) {
		bool data = in_file(z, block, page + n++);
		gap = data ? 0 : gap + 1;
		last = data ? n : last;
	}
	return last;
}

/* A slot for the fault on (block, page), unless it was placed meanwhile. */
static bool fault_slot(struct lmt__lazy *z, const struct fault_req *f, struct slot *sl)
{
	const struct lmt_block *b = &z->s->blocks[f->block];
	if (lmt__uffd_present(z->u, f->block, f->page))
		return false;
	uint64_t page = f->page, max = run_pages(b, FAULT_RUN, z->s->verify);
	if (z->s->verify) {
		uint64_t per_stripe = 1ull << (b->stripe_shift - b->page_shift);
		page = page / per_stripe * per_stripe;
		max = min_u64(max, b->npages - page);
	}
	*sl = (struct slot){.block = f->block,
	                    .page = page,
	                    .npages = z->s->verify ? max : run_from(z, f->block, page, max, false),
	                    .origin = LMT_UFFD_FAULT,
	                    .buf = sl->buf};
	return true;
}

static uint32_t take_faults(struct lmt__lazy *z)
{
	uint32_t n = 0;
	pthread_mutex_lock(&z->lock);
	while (z->used && n < FAULT_SLOTS) {
		struct fault_req f = z->queue[z->first];
		z->first = (z->first + 1) % QUEUE;
		z->used--;
		n += fault_slot(z, &f, &z->slots[n]);
	}
	pthread_cond_broadcast(&z->cond);
	pthread_mutex_unlock(&z->lock);
	return n;
}

/* The next missing page from the background's place, or false at the
 * end of the last block. */
static bool next_missing(struct lmt__lazy *z)
{
	struct lmt_session *s = z->s;
	while (z->bg_block < s->nblocks) {
		const struct lmt_block *b = &s->blocks[z->bg_block];
		if (s->verify)
			z->bg_page &= ~((1ull << (b->stripe_shift - b->page_shift)) - 1);
		while (z->bg_page < b->npages && lmt__uffd_present(z->u, z->bg_block, z->bg_page))
			z->bg_page++;
		if (z->bg_page < b->npages)
			return true;
		z->bg_block++;
		z->bg_page = 0;
	}
	return false;
}

/* Background slots for up to one batch; holes on the way are zeroed. */
static int take_background(struct lmt__lazy *z, uint32_t *n)
{
	struct lmt_session *s = z->s;
	struct lmt_error err = {0};
	while (*n < s->channels && next_missing(z)) {
		const struct lmt_block *b = &s->blocks[z->bg_block];
		uint64_t page = z->bg_page, max = run_pages(b, z->run_bytes, s->verify);
		bool hole = !s->verify && !in_file(z, z->bg_block, page);
		uint64_t len = s->verify ? min_u64(max, b->npages - page)
		               : hole    ? run_from(z, z->bg_block, page, max, true)
		                         : background_run(z, z->bg_block, page, max);
		z->bg_page = page + len;
		if (hole && lmt__uffd_zero(z->u, z->bg_block, page, len, LMT_UFFD_BACKGROUND, &err))
			return lmt__fail(s, err.code, "file '%s': %s", s->file_path, err.message);
		if (hole)
			continue;
		struct slot *sl = &z->slots[(*n)++];
		*sl = (struct slot){.block = z->bg_block,
		                    .page = page,
		                    .npages = len,
		                    .origin = LMT_UFFD_BACKGROUND,
		                    .buf = sl->buf};
	}
	return 0;
}

/* ---- one batch: read, wait, check, place ---- */

static int read_batch(struct lmt__lazy *z, uint32_t n)
{
	struct lmt_session *s = z->s;
	for (uint32_t i = 0; i < n; i++) {
		const struct slot *sl = &z->slots[i];
		const struct lmt_block *b = &s->blocks[sl->block];
		uint64_t off = sl->page << b->page_shift;
		uint64_t len = min_u64(sl->npages << b->page_shift, b->length - off);
		uint64_t at = s->file->blocks[sl->block].pages_offset + off;
		int rc = lmt__mover_post(&z->m, s->file->rkey, at, at, sl->buf, len);
		if (rc)
			return rc;
	}
	return lmt__mover_drain(&z->m);
}

static int place_batch(struct lmt__lazy *z, uint32_t n)
{
	struct lmt_session *s = z->s;
	struct lmt_error err = {0};
	for (uint32_t i = 0; i < n; i++) {
		const struct slot *sl = &z->slots[i];
		int rc = s->verify ? check_stripes(z, sl) : 0;
		if (!rc && lmt__uffd_copy(z->u, sl->block, sl->page, sl->npages, sl->buf,
		                          sl->origin, &err))
			rc = lmt__fail(s, err.code, "file '%s': %s", s->file_path, err.message);
		if (rc)
			return rc;
		for (uint64_t p = sl->page; p < sl->page + sl->npages; p++)
			z->file_pages += in_file(z, sl->block, p);
	}
	return 0;
}

/* A failure the fault thread met, as the session's. */
static int fault_failure(struct lmt__lazy *z)
{
	struct lmt_error err = {0};
	pthread_mutex_lock(&z->lock);
	err = z->fault_error;
	pthread_mutex_unlock(&z->lock);
	return err.code ? lmt__fail(z->s, err.code, "file '%s': %s", z->s->file_path, err.message)
	                : 0;
}

/* One batch: 1 when every page is in place. */
static int batch(struct lmt__lazy *z)
{
	struct lmt_session *s = z->s;
	if (lmt__is_cancelled(s))
		return lmt__fail(s, LMT_ECANCELED, "restore cancelled");
	int rc = fault_failure(z);
	uint32_t n = rc ? 0 : take_faults(z);
	if (!rc && !n)
		rc = take_background(z, &n);
	if (!rc && !n && !lmt__uffd_missing(z->u))
		return 1;
	if (!rc && !n)
		return lmt__fail(s, LMT_EIO,
		                 "file '%s': %llu pages missing after the last one read",
		                 s->file_path, (unsigned long long)lmt__uffd_missing(z->u));
	if (!rc)
		rc = read_batch(z, n);
	return rc ? rc : place_batch(z, n);
}

static void *loader_thread(void *arg)
{
	struct lmt__lazy *z = arg;
	struct lmt_session *s = z->s;
	int rc;
	while (!(rc = batch(z)))
		;
	rc = rc == 1 ? 0 : rc;
	if (rc) {
		/* No waiter may block for ever, none may read a page it is not
		 * given: the pages still missing become inaccessible. */
		lmt__uffd_fail(z->u);
		char why[sizeof(s->error.message)];
		pthread_mutex_lock(&s->lock);
		lmt__copy(why, sizeof(why), s->error.message);
		pthread_mutex_unlock(&s->lock);
		lmt__session_async_failure(s, rc, why);
	}
	pthread_mutex_lock(&z->lock);
	z->done = true;
	z->rc = rc;
	pthread_cond_broadcast(&z->cond);
	pthread_mutex_unlock(&z->lock);
	return NULL;
}

/* ---- faults ---- */

static void fault_zero(struct lmt__lazy *z, uint32_t block, uint64_t page)
{
	struct lmt_error err = {0};
	const struct lmt_block *b = &z->s->blocks[block];
	uint64_t n = run_from(z, block, page, run_pages(b, FAULT_RUN, false), true);
	if (!lmt__uffd_zero(z->u, block, page, n, LMT_UFFD_FAULT, &err) ||
	    err.code == -LMT_ECANCELED)
		return;
	pthread_mutex_lock(&z->lock);
	if (!z->fault_error.code)
		z->fault_error = err;
	pthread_mutex_unlock(&z->lock);
}

/* The fault thread's fetch: a hole is zeroed at once; a page the file
 * holds goes to the loader, which reads faults before anything else. */
static void fetch(void *opaque, uint32_t block, uint64_t page)
{
	struct lmt__lazy *z = opaque;
	if (!z->s->verify && !in_file(z, block, page)) {
		fault_zero(z, block, page);
		return;
	}
	pthread_mutex_lock(&z->lock);
	while (z->used == QUEUE && !z->done)
		lmt__cond_wait_slice(&z->cond, &z->lock, lmt__deadline(LMT__SLICE_NS));
	if (!z->done) {
		z->queue[(z->first + z->used++) % QUEUE] = (struct fault_req){block, page};
		pthread_cond_broadcast(&z->cond);
	}
	pthread_mutex_unlock(&z->lock);
}

/* ---- start, wait, free ---- */

static int alloc_slots(struct lmt__lazy *z)
{
	struct lmt_session *s = z->s;
	uint64_t largest = 0;
	for (uint32_t i = 0; i < s->nblocks; i++) {
		const struct lmt_block *b = &s->blocks[i];
		uint64_t unit = 1ull << (s->verify ? b->stripe_shift : b->page_shift);
		largest = unit > largest ? unit : largest;
	}
	z->run_bytes = min_u64(s->chunk_size, BACKGROUND_RUN);
	z->run_bytes = z->run_bytes > largest ? z->run_bytes : largest;
	z->run_bytes = z->run_bytes > FAULT_RUN ? z->run_bytes : FAULT_RUN;
	for (uint32_t i = 0; i < FAULT_SLOTS + s->channels; i++)
		if (!(z->slots[i].buf = lmt__file_buffer(z->run_bytes)))
			return lmt__fail(s, LMT_ENOMEM, "out of memory for the restore's buffers");
	return 0;
}

static int register_blocks(struct lmt__lazy *z)
{
	struct lmt_session *s = z->s;
	struct lmt_error err = {0};
	for (uint32_t i = 0; i < s->nblocks; i++) {
		struct lmt_block *b = &s->blocks[i];
		if (lmt__uffd_register(z->u, i, b->host, b->length, b->page_shift, &err))
			return lmt__fail(s, err.code, "restore=lazy: block '%s': %s", b->name,
			                 err.message);
	}
	if (lmt__uffd_start(z->u, fetch, z, &err))
		return lmt__fail(s, err.code, "restore=lazy: %s", err.message);
	return 0;
}

static void lazy_release(struct lmt__lazy *z)
{
	/* A fetch waiting for room in the queue gives up. */
	pthread_mutex_lock(&z->lock);
	z->done = true;
	pthread_cond_broadcast(&z->cond);
	pthread_mutex_unlock(&z->lock);
	lmt__uffd_close(z->u);
	for (uint32_t i = 0; i < z->s->nblocks; i++) {
		free(z->bitmaps ? z->bitmaps[i] : NULL);
		free(z->digests ? z->digests[i] : NULL);
	}
	free(z->bitmaps);
	free(z->digests);
	for (uint32_t i = 0; i < FAULT_SLOTS + LMT_MAX_CHANNELS; i++)
		free(z->slots[i].buf);
	lmt__mover_fini(&z->m);
	pthread_cond_destroy(&z->cond);
	pthread_mutex_destroy(&z->lock);
	free(z);
}

int lmt__lazy_start(struct lmt_session *s, struct lmt__uffd *u, struct lmt__mover *m,
                    uint64_t **bitmaps, uint64_t **digests)
{
	struct lmt__lazy *z = calloc(1, sizeof(*z));
	if (!z) {
		lmt__uffd_close(u);
		return lmt__fail(s, LMT_ENOMEM, "out of memory");
	}
	*z = (struct lmt__lazy){.s = s, .u = u, .m = *m, .bitmaps = bitmaps, .digests = digests};
	pthread_mutex_init(&z->lock, NULL);
	int rc = lmt__cond_init(&z->cond) ? lmt__fail(s, LMT_ENOMEM, "out of memory") : 0;
	if (!rc && !(rc = alloc_slots(z)) && !(rc = register_blocks(z)) &&
	    lmt__thread_start(&z->thread, loader_thread, z))
		rc = lmt__fail(s, LMT_ENOMEM, "restore=lazy: cannot start the loader thread");
	if (rc) {
		lazy_release(z);
		return rc;
	}
	z->started = true;
	s->lazy = z;
	return 0;
}

/* The loader's end, its thread joined; then the descriptor closed. */
static int lazy_join(struct lmt__lazy *z)
{
	pthread_mutex_lock(&z->lock);
	while (!z->done)
		lmt__cond_wait_slice(&z->cond, &z->lock, lmt__deadline(LMT__SLICE_NS));
	int rc = z->rc;
	pthread_mutex_unlock(&z->lock);
	pthread_join(z->thread, NULL);
	return rc;
}

/* With s->lock: the figures of the userfaultfd layer into `st`. */
static void copy_stats(struct lmt__lazy *z, struct lmt_stats *st)
{
	struct lmt__uffd_stats u;
	lmt__uffd_stats(z->u, &u);
	st->faults = u.faults;
	st->fault_p50_ns = u.fault_p50_ns;
	st->fault_p99_ns = u.fault_p99_ns;
	st->fault_max_ns = u.fault_max_ns;
	st->background_pages = u.background_pages;
	st->normal_pages = z->file_pages;
}

int lmt__lazy_finish(struct lmt_session *s)
{
	struct lmt__lazy *z = s->lazy;
	int rc = lazy_join(z);
	pthread_mutex_lock(&s->lock);
	copy_stats(z, &s->stats);
	s->lazy = NULL;
	pthread_mutex_unlock(&s->lock);
	lazy_release(z);
	return rc;
}

void lmt__lazy_free(struct lmt_session *s)
{
	if (!s->lazy)
		return;
	lmt_cancel(s);
	lmt__lazy_finish(s);
}

void lmt__lazy_stats(struct lmt_session *s, struct lmt_stats *out)
{
	if (s->lazy)
		copy_stats(s->lazy, out);
}
