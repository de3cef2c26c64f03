/* userfaultfd (uffd.c): memory whose pages arrive after the guest runs.
 * Ranges of the VMM's anonymous memory are registered in missing-page
 * mode; a fault thread reads the faults and hands each missing page to
 * the user's fetch callback, which gets the page from wherever it lives
 * (a file for a lazy restore, the source for postcopy) and places it
 * with lmt__uffd_copy or lmt__uffd_zero, from any thread. A page is
 * placed once: a "present" bitmap per range says which are. On failure
 * the pages still missing become inaccessible, so that nothing waits on
 * them for ever and nothing reads wrong data (docs/engine.md).
 * Room: paging; may use: base, wire, session, control, transport, targets. */
#ifndef LMT_CORE_UFFD_H
#define LMT_CORE_UFFD_H

#include <stdbool.h>
#include <stdint.h>

#include <lmt/lmt.h>

struct lmt__uffd;

/* A fault on page `page` of range `range`, not present: get it and place
 * it, here or later, from any thread. Called on the fault thread, once per
 * page until it is placed (a page already asked for is not asked again);
 * it must not touch the registered memory and should return promptly. */
typedef void (*lmt__uffd_fetch_fn)(void *opaque, uint32_t range, uint64_t page);

/* Who placed pages, for the statistics. */
enum lmt__uffd_origin {
	LMT_UFFD_FAULT,      /* asked for by a fault */
	LMT_UFFD_BACKGROUND, /* loaded ahead of any fault */
	LMT_UFFD_AUTO,       /* a fault's when a fault waits on one of its pages */
	LMT_UFFD_LOCAL,      /* put back from where the range's own pages were moved */
};

struct lmt__uffd_stats {
	uint64_t faults;      /* faults on missing pages read from the descriptor */
	uint64_t fault_pages; /* pages placed for faults */
	uint64_t background_pages;
	/* From a fault read to its page placed, over a reservoir of up to
	 * 4096 faults (all of them when fewer): 0 without faults. */
	uint64_t fault_p50_ns;
	uint64_t fault_p99_ns;
	uint64_t fault_max_ns;
	uint64_t missing; /* pages not placed yet */
};

/* Open a userfaultfd for `nranges` ranges: /dev/userfaultfd first, then
 * the system call, then the API handshake. -LMT_ENOTSUP with err saying
 * why and what would allow it when neither is permitted or the kernel
 * lacks it, and without trying when not `allowed` (the session's option
 * userfaultfd=off: lmt__uffd_allowed). */
int lmt__uffd_open(struct lmt__uffd **out, uint32_t nranges, bool allowed, struct lmt_error *err);
/* Ranges may be of huge pages (hugetlbfs, private or shared): page_shift
 * is then the huge page's, and pages are zeroed by copying a zero page
 * (the kernel has no UFFDIO_ZEROPAGE there).
 *
 * Register range `range`: `length` bytes of private anonymous memory at
 * `host` in pages of 1 << page_shift. Its pages are dropped first
 * (MADV_DONTNEED: they read as zero, as the caller promised); a range
 * that still has pages after that (shared or file memory), or of huge
 * pages, is refused. */
int lmt__uffd_register(struct lmt__uffd *u, uint32_t range, void *host, uint64_t length,
                       uint32_t page_shift, struct lmt_error *err);
/* Register range `range` (any memory userfaultfd takes in missing mode:
 * private anonymous, memfd, shmem) keeping what it holds, except the
 * pages set in `coming` (one bit per page): those are dropped and are the
 * missing ones. A page neither coming nor ever written that faults is
 * given a zero page. For postcopy. */
int lmt__uffd_register_partial(struct lmt__uffd *u, uint32_t range, void *host,
                               uint64_t length, uint32_t page_shift, const uint64_t *coming,
                               struct lmt_error *err);
/* Whether lmt__uffd_register_in_place can work: the kernel gave minor
 * faults on shared memory (5.14 on), or on hugetlbfs (5.13 on). */
bool lmt__uffd_can_place_in_place(const struct lmt__uffd *u, bool hugetlbfs);
/* The same for shared memory whose pages are written in place through a
 * second mapping of its file:
 * watched for minor faults (and missing ones: a hole in the file faults
 * so); the coming pages stay in the file but leave this mapping, and are
 * mapped again by lmt__uffd_continue once written. */
int lmt__uffd_register_in_place(struct lmt__uffd *u, uint32_t range, void *host,
                                uint64_t length, uint32_t page_shift, const uint64_t *coming,
                                struct lmt_error *err);
/* The same, for postcopy's switch, in time independent of how many pages
 * are coming: every page of the range is moved aside at once (mremap
 * MREMAP_DONTUNMAP: page tables move, no page is freed or copied) and the
 * range watched, missing-page mode for private memory, minor faults for a
 * shared file written in place (`minor`). The pages not coming are local: a fault on
 * one puts it back at once (copied from the moved-aside pages, or mapped
 * from the file), and lmt__uffd_settle puts them all back in the
 * background. The coming ones are placed as usual. Where the kernel
 * cannot move pages so, the same as lmt__uffd_register_partial or
 * lmt__uffd_register_in_place. */
int lmt__uffd_register_moved(struct lmt__uffd *u, uint32_t range, void *host, uint64_t length,
                             uint32_t page_shift, const uint64_t *coming, bool minor,
                             struct lmt_error *err);
/* The first page from `from` on still to come: neither placed nor local
 * (the range's page count when none). */
uint64_t lmt__uffd_next_coming(struct lmt__uffd *u, uint32_t range, uint64_t from);
/* Whether a page of a moved range is local (not coming). */
bool lmt__uffd_local(struct lmt__uffd *u, uint32_t range, uint64_t page);
/* Put back up to max_pages local pages not placed yet: 1 when it did
 * some, 0 when none is left, or a negative code. One thread at a time. */
int lmt__uffd_settle(struct lmt__uffd *u, uint64_t max_pages, struct lmt_error *err);
/* Start the fault thread. */
int lmt__uffd_start(struct lmt__uffd *u, lmt__uffd_fetch_fn fetch, void *opaque,
                    struct lmt_error *err);

bool lmt__uffd_present(struct lmt__uffd *u, uint32_t range, uint64_t page);
/* Place pages [page, page + npages) of `range`: a copy of `src`, or zero.
 * Pages already present are skipped (a fault and the background may race
 * for one); those placed wake whoever waits on them. After
 * lmt__uffd_fail: -LMT_ECANCELED. Thread-safe. */
int lmt__uffd_copy(struct lmt__uffd *u, uint32_t range, uint64_t page, uint64_t npages,
                   const void *src, enum lmt__uffd_origin origin, struct lmt_error *err);
/* Map pages of an in-place range again (UFFDIO_CONTINUE): what the file
 * holds there now is the page. */
int lmt__uffd_continue(struct lmt__uffd *u, uint32_t range, uint64_t page, uint64_t npages,
                       enum lmt__uffd_origin origin, struct lmt_error *err);
int lmt__uffd_zero(struct lmt__uffd *u, uint32_t range, uint64_t page, uint64_t npages,
                   enum lmt__uffd_origin origin, struct lmt_error *err);
/* Pages not placed yet, over every range. */
uint64_t lmt__uffd_missing(struct lmt__uffd *u);

/* The pages will never come: every page still missing is replaced in
 * place by inaccessible memory (PROT_NONE), then every waiter is woken,
 * so that it faults again and gets SIGSEGV (a vCPU: KVM_RUN fails with
 * EFAULT). No page is placed after it. Once; thread-safe. */
void lmt__uffd_fail(struct lmt__uffd *u);
void lmt__uffd_stats(struct lmt__uffd *u, struct lmt__uffd_stats *out);
/* Stop the fault thread, unregister the ranges, close; NULL: nothing.
 * Pages still missing then are failed first (lmt__uffd_fail). */
void lmt__uffd_close(struct lmt__uffd *u);

#endif
