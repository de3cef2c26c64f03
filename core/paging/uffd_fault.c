/* userfaultfd's faults (paging room): the present bitmaps and the faults
 * in wait, placing pages (copy, continue, zero), settling, and the fault
 * thread that asks its user for what the guest faults on. Opening and
 * registration are uffd.c's. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "bitmap.h"
#include "error.h"
#include "net.h"
#include "sync.h"
#include "uffd_state.h"

/* ---- the present bitmaps and the faults in wait ---- */

bool lmt__uffd_present(struct lmt__uffd *u, uint32_t range, uint64_t page)
{
	return (atomic_load(&u->ranges[range].present[page / 64]) >> (page % 64)) & 1;
}

/* Mark a page present; whether it was missing. */
static bool mark(struct lmt__uffd *u, uint32_t range, uint64_t page)
{
	uint64_t bit = 1ull << (page % 64);
	bool was = atomic_fetch_or(&u->ranges[range].present[page / 64], bit) & bit;
	if (!was)
		atomic_fetch_sub(&u->missing, 1);
	return !was;
}

static uint64_t next_random(struct lmt__uffd *u)
{
	u->rng ^= u->rng << 13;
	u->rng ^= u->rng >> 7;
	u->rng ^= u->rng << 17;
	return u->rng;
}

/* With u->lock: one fault's latency into the reservoir. */
static void sample(struct lmt__uffd *u, uint64_t ns)
{
	if (ns > u->max_ns)
		u->max_ns = ns;
	uint64_t seen = u->nsamples++;
	if (seen < RESERVOIR)
		u->samples[seen] = ns;
	else if (next_random(u) % (seen + 1) < RESERVOIR)
		u->samples[next_random(u) % RESERVOIR] = ns;
}

/* Pages [page, page + n) were placed: count them, and time the faults
 * that waited on them. */
static void placed(struct lmt__uffd *u, uint32_t range, uint64_t page, uint64_t n,
                   enum lmt__uffd_origin origin)
{
	uint64_t now = lmt__now_ns();
	bool waited = false;
	pthread_mutex_lock(&u->lock);
	for (uint32_t i = 0; i < u->npending;) {
		struct pending *p = &u->pending[i];
		if (p->range != range || p->page < page || p->page >= page + n) {
			i++;
			continue;
		}
		/* A fault noted after `now` was read waited for nothing. */
		sample(u, now > p->since_ns ? now - p->since_ns : 0);
		*p = u->pending[--u->npending];
		waited = true;
	}
	if (origin == LMT_UFFD_LOCAL)
		u->local_pages += n;
	else if (origin == LMT_UFFD_FAULT || (origin == LMT_UFFD_AUTO && waited))
		u->fault_pages += n;
	else
		u->background_pages += n;
	pthread_mutex_unlock(&u->lock);
}

/* A fault on a missing page: whether it is new (not asked for yet). */
static bool note_fault(struct lmt__uffd *u, uint32_t range, uint64_t page)
{
	bool fresh = true;
	pthread_mutex_lock(&u->lock);
	u->faults++;
	for (uint32_t i = 0; i < u->npending && fresh; i++)
		fresh = u->pending[i].range != range || u->pending[i].page != page;
	if (fresh && u->npending < PENDING_MAX)
		u->pending[u->npending++] =
		        (struct pending){.range = range, .page = page, .since_ns = lmt__now_ns()};
	pthread_mutex_unlock(&u->lock);
	return fresh;
}

/* ---- placement ---- */

typedef int (*place_fn)(struct lmt__uffd *u, const struct uffd_range *r, uint8_t *dst,
                        const uint8_t *src, uint64_t len, int64_t *done);

static int place_copy(struct lmt__uffd *u, const struct uffd_range *r, uint8_t *dst,
                      const uint8_t *src, uint64_t len, int64_t *done)
{
	(void)r;
	struct uffdio_copy c = {.dst = (uintptr_t)dst,
	                        .src = (uintptr_t)src,
	                        .len = len,
	                        .mode = UFFDIO_COPY_MODE_DONTWAKE};
	int rc = ioctl(u->fd, UFFDIO_COPY, &c) ? -errno : 0;
	*done = c.copy;
	return rc;
}

#ifndef UFFDIO_CONTINUE
#define _UFFDIO_CONTINUE (0x07)
#define UFFDIO_CONTINUE_MODE_DONTWAKE ((__u64)1 << 0)
struct uffdio_continue {
	struct uffdio_range range;
	__u64 mode;
	__s64 mapped;
};
#define UFFDIO_CONTINUE _IOWR(UFFDIO, _UFFDIO_CONTINUE, struct uffdio_continue)
#endif

/* Map what the file holds at dst: the page is already in place. */
static int place_continue(struct lmt__uffd *u, const struct uffd_range *r, uint8_t *dst,
                          const uint8_t *src, uint64_t len, int64_t *done)
{
	(void)r;
	(void)src;
	struct uffdio_continue c = {.range = {.start = (uintptr_t)dst, .len = len},
	                            .mode = UFFDIO_CONTINUE_MODE_DONTWAKE};
	int rc = ioctl(u->fd, UFFDIO_CONTINUE, &c) ? -errno : 0;
	*done = c.mapped;
	return rc;
}

/* Zero pages: UFFDIO_ZEROPAGE, or where the range has none (hugetlbfs)
 * a copy of the zero buffer a page at a time. */
static int place_zero(struct lmt__uffd *u, const struct uffd_range *r, uint8_t *dst,
                      const uint8_t *src, uint64_t len, int64_t *done)
{
	(void)src;
	if (r->zero_by_copy) {
		uint64_t size = 1ull << r->page_shift, at = 0;
		int rc = 0;
		while (!rc && at < len) {
			int64_t one = 0;
			rc = place_copy(u, r, dst + at, u->zeros, size, &one);
			at += one > 0 ? (uint64_t)one : 0;
		}
		*done = (int64_t)at;
		return rc;
	}
	struct uffdio_zeropage z = {.range = {.start = (uintptr_t)dst, .len = len},
	                            .mode = UFFDIO_ZEROPAGE_MODE_DONTWAKE};
	int rc = ioctl(u->fd, UFFDIO_ZEROPAGE, &z) ? -errno : 0;
	*done = z.zeropage;
	return rc;
}

/* One run of missing pages [page, page + n): the kernel may stop early
 * at a page that appeared meanwhile (EEXIST) or a changing address space
 * (EAGAIN); go on after it. Pages are marked and counted before their
 * waiters are woken, so that whoever sees a page sees it counted. */
static int place_run(struct lmt__uffd *u, uint32_t range, uint64_t page, uint64_t n,
                     const uint8_t *src, place_fn fn, enum lmt__uffd_origin origin,
                     struct lmt_error *err)
{
	struct uffd_range *r = &u->ranges[range];
	uint64_t size = 1ull << r->page_shift, at = 0;
	while (at < n) {
		int64_t done = 0;
		int rc = fn(u, r, r->host + ((page + at) << r->page_shift),
		            src ? src + (at << r->page_shift) : NULL, (n - at) << r->page_shift,
		            &done);
		uint64_t pages = done > 0 ? (uint64_t)done / size : 0;
		for (uint64_t i = 0; i < pages; i++)
			mark(u, range, page + at + i);
		placed(u, range, page + at, pages, origin);
		if (pages)
			lmt__uffd_wake(u, r->host + ((page + at) << r->page_shift), pages << r->page_shift);
		at += pages;
		if (rc == -EEXIST && at < n) {
			mark(u, range, page + at++);
		} else if (rc == -EFAULT && fn == place_continue && origin == LMT_UFFD_LOCAL &&
		           at < n) {
			/* The guest's own page is a hole in the file: nothing to
			 * map, and a touch is a missing-page fault. What the hole
			 * reads as, a zero page, goes there. */
			rc = place_zero(u, r, r->host + ((page + at) << r->page_shift), NULL, size,
			                &done);
			if (rc && rc != -EEXIST)
				return lmt__error(err, LMT_EIO,
				                  "userfaultfd: range %u: cannot zero page %llu: %s",
				                  range, (unsigned long long)(page + at),
				                  strerror(-rc));
			mark(u, range, page + at);
			placed(u, range, page + at, 1, origin);
			lmt__uffd_wake(u, r->host + ((page + at) << r->page_shift), size);
			at++;
		} else if (rc && rc != -EAGAIN && rc != -EEXIST) {
			return lmt__error(err, LMT_EIO,
			                  "userfaultfd: range %u: cannot place page %llu: %s",
			                  range, (unsigned long long)(page + at), strerror(-rc));
		}
	}
	return 0;
}

/* Every missing page of [page, page + npages), run by run. */
static int place(struct lmt__uffd *u, uint32_t range, uint64_t page, uint64_t npages,
                 const uint8_t *src, place_fn fn, enum lmt__uffd_origin origin,
                 struct lmt_error *err)
{
	int rc = 0;
	uint32_t shift = u->ranges[range].page_shift;
	pthread_rwlock_rdlock(&u->place_lock);
	if (atomic_load(&u->failed))
		rc = lmt__error(err, LMT_ECANCELED, "userfaultfd: placement after a failure");
	for (uint64_t p = 0; p < npages && !rc;) {
		if (lmt__uffd_present(u, range, page + p)) {
			p++;
			continue;
		}
		uint64_t end = p + 1;
		while (end < npages && !lmt__uffd_present(u, range, page + end))
			end++;
		rc = place_run(u, range, page + p, end - p, src ? src + (p << shift) : NULL, fn,
		               origin, err);
		p = end;
	}
	pthread_rwlock_unlock(&u->place_lock);
	return rc;
}

int lmt__uffd_copy(struct lmt__uffd *u, uint32_t range, uint64_t page, uint64_t npages,
                   const void *src, enum lmt__uffd_origin origin, struct lmt_error *err)
{
	return place(u, range, page, npages, src, place_copy, origin, err);
}

int lmt__uffd_continue(struct lmt__uffd *u, uint32_t range, uint64_t page, uint64_t npages,
                       enum lmt__uffd_origin origin, struct lmt_error *err)
{
	return place(u, range, page, npages, NULL, place_continue, origin, err);
}

int lmt__uffd_zero(struct lmt__uffd *u, uint32_t range, uint64_t page, uint64_t npages,
                   enum lmt__uffd_origin origin, struct lmt_error *err)
{
	return place(u, range, page, npages, NULL, place_zero, origin, err);
}

/* A run of local pages put back: a copy from the shadow (private memory,
 * the shadow's pages then freed), or mapped from the file (shared). */
static int settle_run(struct lmt__uffd *u, uint32_t range, uint64_t page, uint64_t n,
                      struct lmt_error *err)
{
	struct uffd_range *r = &u->ranges[range];
	uint8_t *from = r->shadow + (page << r->page_shift);
	int rc = r->minor ? place(u, range, page, n, NULL, place_continue, LMT_UFFD_LOCAL, err)
	                  : place(u, range, page, n, from, place_copy, LMT_UFFD_LOCAL, err);
	if (!rc)
		madvise(from, n << r->page_shift, MADV_DONTNEED);
	return rc;
}

int lmt__uffd_settle(struct lmt__uffd *u, uint64_t max_pages, struct lmt_error *err)
{
	uint64_t done = 0;
	while (done < max_pages && u->settle_range < u->nranges) {
		struct uffd_range *r = &u->ranges[u->settle_range];
		uint64_t p = r->local && r->registered
		                     ? lmt__bitmap_next(r->local, r->settle_next, r->npages)
		                     : r->npages;
		if (p == r->npages) {
			u->settle_range++;
			continue;
		}
		uint64_t end = p + 1;
		while (end < r->npages && end - p < max_pages - done && lmt__bitmap_test(r->local, end))
			end++;
		int rc = settle_run(u, u->settle_range, p, end - p, err);
		if (rc)
			return rc;
		r->settle_next = end;
		done += end - p;
	}
	return (int)(done > 0);
}

uint64_t lmt__uffd_missing(struct lmt__uffd *u)
{
	return atomic_load(&u->missing);
}

/* ---- the fault thread ---- */

/* The range and page of a faulting address, or false when none has it. */
static bool locate(struct lmt__uffd *u, uint64_t addr, uint32_t *range, uint64_t *page)
{
	for (uint32_t i = 0; i < u->nranges; i++) {
		struct uffd_range *r = &u->ranges[i];
		uint64_t base = (uintptr_t)r->host;
		if (r->registered && addr >= base && addr - base < r->length) {
			*range = i;
			*page = (addr - base) >> r->page_shift;
			return true;
		}
	}
	return false;
}

static void serve(struct lmt__uffd *u, const struct uffd_msg *m)
{
	uint32_t range;
	uint64_t page;
	if (m->event != UFFD_EVENT_PAGEFAULT || !locate(u, m->arg.pagefault.address, &range, &page))
		return;
	struct uffd_range *r = &u->ranges[range];
	/* Placed since the fault was raised, or failed: the waiter only needs
	 * waking (it then finds the page, or inaccessible memory). A page that
	 * was never missing yet faults (lmt__uffd_register_partial: a page the
	 * destination never wrote) is a zero page; one that is there already
	 * refuses it (EEXIST), and either way the waiter is woken. */
	if (lmt__uffd_present(u, range, page) || atomic_load(&u->failed)) {
		uint8_t *at = r->host + (page << r->page_shift);
		int64_t done = 0;
		if (!atomic_load(&u->failed)) {
			pthread_rwlock_rdlock(&u->place_lock);
			/* A minor range's page that is a hole faults as missing:
			 * nothing to map from the file, a zero page instead. */
			if (!atomic_load(&u->failed) &&
			    (!r->minor ||
			     place_continue(u, r, at, NULL, 1ull << r->page_shift, &done) == -EFAULT))
				place_zero(u, r, at, NULL, 1ull << r->page_shift, &done);
			pthread_rwlock_unlock(&u->place_lock);
		}
		lmt__uffd_wake(u, at, 1ull << r->page_shift);
		return;
	}
	/* The guest's own page, moved aside at the switch: put back now. */
	if (r->local && lmt__bitmap_test(r->local, page)) {
		struct lmt_error err = {0};
		if (settle_run(u, range, page, 1, &err))
			lmt__log(LMT_LOG_ERROR, "%s", err.message);
		lmt__uffd_wake(u, r->host + (page << r->page_shift), 1ull << r->page_shift);
		return;
	}
	if (note_fault(u, range, page))
		u->fetch(u->opaque, range, page);
}

static void *fault_thread(void *arg)
{
	struct lmt__uffd *u = arg;
	struct pollfd fds[2] = {{.fd = u->fd, .events = POLLIN},
	                        {.fd = u->stop_fd, .events = POLLIN}};
	for (;;) {
		if (poll(fds, 2, -1) < 0 && errno != EINTR)
			break;
		if (fds[1].revents)
			break;
		struct uffd_msg msgs[EVENTS_PER_READ];
		ssize_t n = read(u->fd, msgs, sizeof(msgs));
		for (ssize_t i = 0; i < n / (ssize_t)sizeof(msgs[0]); i++)
			serve(u, &msgs[i]);
	}
	return NULL;
}

int lmt__uffd_start(struct lmt__uffd *u, lmt__uffd_fetch_fn fetch, void *opaque,
                    struct lmt_error *err)
{
	u->fetch = fetch;
	u->opaque = opaque;
	if (lmt__thread_start(&u->thread, fault_thread, u))
		return lmt__error(err, LMT_ENOMEM, "userfaultfd: cannot start the fault thread");
	u->started = true;
	return 0;
}

