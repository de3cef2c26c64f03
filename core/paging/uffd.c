/* userfaultfd (paging room): opening, registration, failure, statistics
 * and closing, for any user that places pages after the guest runs; the
 * faults and placement are uffd_fault.c's (uffd.h; docs/engine.md,
 * "Pages after the guest runs"). */
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

/* ---- opening ---- */

static int open_device(void)
{
	int dev = open("/dev/userfaultfd", O_RDWR | O_CLOEXEC);
	if (dev < 0)
		return -errno;
	int fd = ioctl(dev, USERFAULTFD_IOC_NEW, O_CLOEXEC | O_NONBLOCK);
	int e = errno;
	close(dev);
	return fd < 0 ? -e : fd;
}

static int open_fd(struct lmt_error *err)
{
	int dev = open_device();
	if (dev >= 0)
		return dev;
	int fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
	int sys = errno;
	if (fd >= 0)
		return fd;
	return lmt__error(err, LMT_ENOTSUP,
	                  "userfaultfd is not available: /dev/userfaultfd: %s; userfaultfd(2): "
	                  "%s (allow it with read-write access to /dev/userfaultfd, "
	                  "vm.unprivileged_userfaultfd=1 or CAP_SYS_PTRACE, on a kernel built "
	                  "with CONFIG_USERFAULTFD)",
	                  strerror(-dev), strerror(sys));
}

#ifndef UFFD_FEATURE_MINOR_HUGETLBFS
#define UFFD_FEATURE_MINOR_HUGETLBFS (1 << 9)
#endif
#ifndef UFFD_FEATURE_MINOR_SHMEM
#define UFFD_FEATURE_MINOR_SHMEM (1 << 10)
#endif
#ifndef UFFDIO_REGISTER_MODE_MINOR
#define UFFDIO_REGISTER_MODE_MINOR ((__u64)1 << 2)
#endif

/* `features` asked for; whether the kernel granted them. */
static int handshake(int fd, uint64_t features, struct lmt_error *err)
{
	struct uffdio_api api = {.api = UFFD_API, .features = features};
	if (ioctl(fd, UFFDIO_API, &api))
		return lmt__error(err, LMT_ENOTSUP, "userfaultfd: API handshake failed: %s",
		                  strerror(errno));
	uint64_t need = 1ull << _UFFDIO_REGISTER | 1ull << _UFFDIO_UNREGISTER;
	if ((api.ioctls & need) != need)
		return lmt__error(err, LMT_ENOTSUP,
		                  "userfaultfd: the kernel offers no range registration");
	return 0;
}

int lmt__uffd_open(struct lmt__uffd **out, uint32_t nranges, bool allowed, struct lmt_error *err)
{
	*out = NULL;
	if (!allowed)
		return lmt__error(
		        err, LMT_ENOTSUP,
		        "userfaultfd is not available: userfaultfd=off (this side may not "
		        "use it)");
	struct lmt__uffd *u = calloc(1, sizeof(*u));
	if (!u || !(u->ranges = calloc(nranges ? nranges : 1, sizeof(*u->ranges)))) {
		free(u);
		return lmt__error(err, LMT_ENOMEM, "userfaultfd: out of memory");
	}
	u->nranges = nranges;
	u->rng = 0x9e3779b97f4a7c15ull;
	pthread_mutex_init(&u->lock, NULL);
	pthread_rwlock_init(&u->place_lock, NULL);
	u->stop_fd = eventfd(0, EFD_CLOEXEC);
	/* Minor faults (postcopy's placement in place) on shared memory and
	 * hugetlbfs where the kernel has them (5.14 and 5.13 on): a kernel
	 * without refuses the handshake, and a fresh descriptor asks for
	 * less. The handshake is once per descriptor. */
	static const uint64_t asked[] = {
	        UFFD_FEATURE_MINOR_SHMEM | UFFD_FEATURE_MINOR_HUGETLBFS,
	        UFFD_FEATURE_MINOR_SHMEM,
	        UFFD_FEATURE_MINOR_HUGETLBFS,
	        0,
	};
	int rc = 0;
	u->fd = -1;
	for (size_t i = 0; i < sizeof(asked) / sizeof(asked[0]); i++) {
		if (u->fd >= 0)
			close(u->fd);
		u->fd = open_fd(err);
		if ((rc = u->fd < 0 ? u->fd : 0))
			break;
		bool last = i + 1 == sizeof(asked) / sizeof(asked[0]);
		if ((rc = handshake(u->fd, asked[i], last ? err : NULL)) == 0) {
			u->minor_shmem = asked[i] & UFFD_FEATURE_MINOR_SHMEM;
			u->minor_hugetlbfs = asked[i] & UFFD_FEATURE_MINOR_HUGETLBFS;
			break;
		}
	}
	if (!rc && u->stop_fd < 0)
		rc = lmt__error(err, LMT_ENOMEM, "userfaultfd: eventfd: %s", strerror(errno));
	if (rc) {
		lmt__uffd_close(u);
		return rc;
	}
	*out = u;
	return 0;
}

/* ---- registration ---- */

/* What the kernel lets lmt do in a registered range: place pages (copy,
 * or map from the file for a minor range), zero them and wake waiters.
 * Where it has no UFFDIO_ZEROPAGE (hugetlbfs), zero pages are copied
 * from u->zeros, made as large as the range's pages. */
static int check_ioctls(struct lmt__uffd *u, struct uffd_range *r, uint32_t range,
                        uint64_t ioctls, struct lmt_error *err)
{
	uint64_t need = (r->minor ? 1ull << _UFFDIO_CONTINUE : 1ull << _UFFDIO_COPY) |
	                1ull << _UFFDIO_WAKE;
	bool zero = ioctls & 1ull << _UFFDIO_ZEROPAGE, copy = ioctls & 1ull << _UFFDIO_COPY;
	if ((ioctls & need) != need || (!zero && !copy))
		return lmt__error(err, LMT_ENOTSUP,
		                  "userfaultfd: range %u: the kernel cannot %s, zero and wake pages "
		                  "there",
		                  range, r->minor ? "map" : "copy");
	uint64_t size = 1ull << r->page_shift;
	r->zero_by_copy = !zero;
	if (r->zero_by_copy && u->zeros_len < size) {
		/* Before the fault thread starts: nothing copies from it yet. */
		if (u->zeros)
			munmap(u->zeros, u->zeros_len);
		u->zeros_len = 0;
		u->zeros = mmap(NULL, size, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
		                -1, 0);
		if (u->zeros == MAP_FAILED) {
			u->zeros = NULL;
			return lmt__error(err, LMT_ENOMEM, "userfaultfd: no memory for a zero page");
		}
		u->zeros_len = size;
	}
	return 0;
}

/* Whether any page of the range is still populated, asked of mincore a
 * gigabyte at a time. */
static int populated(const struct uffd_range *r, bool *any)
{
	const uint64_t step = 1ull << 30;
	unsigned char *vec = malloc(step / 4096);
	int rc = vec ? 0 : -LMT_ENOMEM;
	*any = false;
	for (uint64_t off = 0; !rc && off < r->length && !*any; off += step) {
		uint64_t len = r->length - off < step ? r->length - off : step;
		rc = mincore(r->host + off, len, vec) ? -errno : 0;
		for (uint64_t i = 0; !rc && i < (len + 4095) / 4096 && !*any; i++)
			*any = vec[i] & 1;
	}
	free(vec);
	return rc;
}

static int make_missing(struct uffd_range *r, uint32_t range, struct lmt_error *err)
{
	bool any = false;
	if (madvise(r->host, r->length, MADV_DONTNEED))
		return lmt__error(err, LMT_EINVAL, "userfaultfd: range %u: madvise: %s", range,
		                  strerror(errno));
	int rc = populated(r, &any);
	if (rc == -LMT_ENOMEM)
		return lmt__error(err, LMT_ENOMEM, "userfaultfd: out of memory");
	if (rc)
		return lmt__error(err, LMT_EINVAL, "userfaultfd: range %u: mincore: %s", range,
		                  strerror(-rc));
	if (any)
		return lmt__error(err, LMT_EINVAL,
		                  "userfaultfd: range %u keeps pages after MADV_DONTNEED: it must "
		                  "be private anonymous memory, not shared or file-backed",
		                  range);
	return 0;
}

int lmt__uffd_register(struct lmt__uffd *u, uint32_t range, void *host, uint64_t length,
                       uint32_t page_shift, struct lmt_error *err)
{
	struct uffd_range *r = &u->ranges[range];
	*r = (struct uffd_range){.host = host,
	                         .length = length,
	                         .page_shift = page_shift,
	                         .npages = length >> page_shift};
	r->present = calloc((r->npages + 63) / 64, sizeof(uint64_t));
	if (!r->present)
		return lmt__error(err, LMT_ENOMEM, "userfaultfd: out of memory");
	int rc = make_missing(r, range, err);
	if (rc)
		return rc;
	struct uffdio_register reg = {.range = {.start = (uintptr_t)host, .len = length},
	                              .mode = UFFDIO_REGISTER_MODE_MISSING};
	if (ioctl(u->fd, UFFDIO_REGISTER, &reg))
		return lmt__error(
		        err, LMT_EINVAL,
		        "userfaultfd: range %u (%llu bytes at %p) cannot be registered: %s", range,
		        (unsigned long long)length, host, strerror(errno));
	r->registered = true;
	atomic_fetch_add(&u->missing, r->npages);
	rc = check_ioctls(u, r, range, reg.ioctls, err);
	/* A lazy restore places pages of the block's size from its reads,
	 * and has not been made to work in huge pages. */
	if (!rc && r->zero_by_copy)
		rc = lmt__error(err, LMT_EINVAL,
		                "userfaultfd: range %u is of huge pages (hugetlbfs), where the "
		                "kernel maps no zero pages: it must be private anonymous memory",
		                range);
	return rc;
}

/* Each run of set bits of `coming`, in order: fn(r, first, end). */
typedef int (*run_fn)(struct uffd_range *r, uint64_t first, uint64_t end);

static int each_run(struct uffd_range *r, const uint64_t *coming, run_fn fn)
{
	for (uint64_t p = lmt__bitmap_next(coming, 0, r->npages); p < r->npages;) {
		uint64_t end = p + 1;
		while (end < r->npages && lmt__bitmap_test(coming, end))
			end++;
		int rc = fn(r, p, end);
		if (rc)
			return rc;
		p = lmt__bitmap_next(coming, end, r->npages);
	}
	return 0;
}

/* A run dropped: private memory with MADV_DONTNEED, shared memory (memfd,
 * shmem, hugetlbfs) from its file with MADV_REMOVE, which refuses private
 * memory (EINVAL for anonymous, EACCES for hugetlbfs: done already). */
static int drop_run(struct uffd_range *r, uint64_t p, uint64_t end)
{
	uint8_t *at = r->host + (p << r->page_shift);
	size_t len = (end - p) << r->page_shift;
	if (madvise(at, len, MADV_DONTNEED) ||
	    (madvise(at, len, MADV_REMOVE) && errno != EINVAL && errno != EACCES))
		return -errno;
	return 0;
}

/* A run of a moved range's coming pages taken out of its file (shared
 * memory); -EINVAL for private memory. */
static int remove_run(struct uffd_range *r, uint64_t p, uint64_t end)
{
	return madvise(r->host + (p << r->page_shift), (end - p) << r->page_shift, MADV_REMOVE)
	               ? -errno
	               : 0;
}

/* A run to be written in place: its pages stay in the file and leave the
 * guest's mapping (a hole among them is a missing-page fault: see
 * register_keeping). */
static int unmap_run(struct uffd_range *r, uint64_t p, uint64_t end)
{
	return madvise(r->host + (p << r->page_shift), (end - p) << r->page_shift, MADV_DONTNEED)
	               ? -errno
	               : 0;
}

/* Register a range keeping its pages but the coming ones, missing-page
 * mode or (minor) minor-fault mode. A minor range is watched for missing
 * pages too: a page that is a hole in the file faults as missing, not
 * minor, and without the mode the kernel would give the guest a zero
 * page of its own making where a coming page belongs. So no hole need be
 * filled at the switch (finding them costs a page-cache lookup a page). */
static int register_keeping(struct lmt__uffd *u, uint32_t range, void *host, uint64_t length,
                            uint32_t page_shift, const uint64_t *coming, bool minor,
                            struct lmt_error *err)
{
	struct uffd_range *r = &u->ranges[range];
	free(r->present);
	*r = (struct uffd_range){.host = host,
	                         .length = length,
	                         .page_shift = page_shift,
	                         .npages = length >> page_shift,
	                         .minor = minor};
	uint64_t words = (r->npages + 63) / 64, missing = 0;
	r->present = calloc(words ? words : 1, sizeof(uint64_t));
	if (!r->present)
		return lmt__error(err, LMT_ENOMEM, "userfaultfd: out of memory");
	for (uint64_t w = 0; w < words; w++) {
		uint64_t valid = w == words - 1 && r->npages % 64 ? (1ull << (r->npages % 64)) - 1
		                                                  : ~0ull;
		atomic_store(&r->present[w], ~coming[w] & valid);
		missing += (uint64_t)__builtin_popcountll(coming[w] & valid);
	}
	struct uffdio_register reg = {
	        .range = {.start = (uintptr_t)host, .len = length},
	        .mode = minor ? UFFDIO_REGISTER_MODE_MINOR | UFFDIO_REGISTER_MODE_MISSING
	                      : UFFDIO_REGISTER_MODE_MISSING};
	if (ioctl(u->fd, UFFDIO_REGISTER, &reg))
		return lmt__error(
		        err, LMT_EINVAL,
		        "userfaultfd: range %u (%llu bytes at %p) cannot be registered%s: %s", range,
		        (unsigned long long)length, host, minor ? " for minor faults" : "",
		        strerror(errno));
	r->registered = true;
	atomic_fetch_add(&u->missing, missing);
	return check_ioctls(u, r, range, reg.ioctls, err);
}

int lmt__uffd_register_partial(struct lmt__uffd *u, uint32_t range, void *host,
                               uint64_t length, uint32_t page_shift, const uint64_t *coming,
                               struct lmt_error *err)
{
	int rc = register_keeping(u, range, host, length, page_shift, coming, false, err);
	if (!rc && (rc = each_run(&u->ranges[range], coming, drop_run)))
		return lmt__error(err, LMT_EINVAL, "userfaultfd: range %u: cannot drop pages: %s",
		                  range, strerror(-rc));
	return rc;
}

bool lmt__uffd_can_place_in_place(const struct lmt__uffd *u, bool hugetlbfs)
{
	return hugetlbfs ? u->minor_hugetlbfs : u->minor_shmem;
}

int lmt__uffd_register_in_place(struct lmt__uffd *u, uint32_t range, void *host,
                                uint64_t length, uint32_t page_shift, const uint64_t *coming,
                                struct lmt_error *err)
{
	if (!u->minor_shmem && !u->minor_hugetlbfs)
		return lmt__error(err, LMT_ENOTSUP,
		                  "userfaultfd: this kernel has no minor faults on shared memory");
	int rc = register_keeping(u, range, host, length, page_shift, coming, true, err);
	if (!rc && (rc = each_run(&u->ranges[range], coming, unmap_run)))
		return lmt__error(err, LMT_EINVAL,
		                  "userfaultfd: range %u: cannot take pages out of the mapping: %s",
		                  range, strerror(-rc));
	return rc;
}

#ifndef MREMAP_DONTUNMAP
#define MREMAP_DONTUNMAP 4
#endif

/* Move the range's pages aside, leaving it mapped and empty: page tables
 * move, no page is freed or copied. The system call itself: a transport
 * library's memory hooks may wrap mremap (UCX's do). NULL where the
 * kernel cannot (before 5.7; 5.13 for shared memory) or would not be
 * fast. */
static uint8_t *move_aside(uint8_t *host, uint64_t length)
{
	/* Fast only a page table at a time: where the range is not aligned
	 * to one (2 MiB), the kernel moves each page's entry, slower than
	 * dropping the coming pages (shared memory: 0.25 ms per MiB). */
	const uint64_t table = 2ull << 20;
	if ((uintptr_t)host % table || length % table)
		return NULL;
	/* The new place must be on a 2 MiB boundary too: a place of its own
	 * choosing, the kernel moves file mappings page by page. */
	uint8_t *area = mmap(NULL, length + table, PROT_NONE,
	                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (area == MAP_FAILED)
		return NULL;
	uint8_t *to = (uint8_t *)(((uintptr_t)area + table - 1) & ~(uintptr_t)(table - 1));
	void *at = (void *)syscall(SYS_mremap, host, (size_t)length, (size_t)length,
	                           MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP, to);
	if (at == MAP_FAILED) {
		munmap(area, length + table);
		return NULL;
	}
	if (to > area)
		munmap(area, (size_t)(to - area));
	if (area + table > to)
		munmap(to + length, (size_t)(area + table - to));
	return at;
}

int lmt__uffd_register_moved(struct lmt__uffd *u, uint32_t range, void *host, uint64_t length,
                             uint32_t page_shift, const uint64_t *coming, bool minor,
                             struct lmt_error *err)
{
	if (minor && !u->minor_shmem && !u->minor_hugetlbfs)
		return lmt__error(err, LMT_ENOTSUP,
		                  "userfaultfd: this kernel has no minor faults on shared memory");
	uint64_t words = ((length >> page_shift) + 63) / 64;
	uint64_t *local = malloc((words ? words : 1) * sizeof(uint64_t));
	if (!local)
		return lmt__error(err, LMT_ENOMEM, "userfaultfd: out of memory");
	uint8_t *shadow = move_aside(host, length);
	if (!shadow) {
		free(local);
		return minor ? lmt__uffd_register_in_place(u, range, host, length, page_shift,
		                                           coming, err)
		             : lmt__uffd_register_partial(u, range, host, length, page_shift, coming,
		                                          err);
	}
	/* Nothing is mapped any more: every page is missing until placed,
	 * the coming ones from the source, the others from the shadow. */
	uint64_t *all = calloc(words ? words : 1, sizeof(uint64_t));
	int rc = all ? 0 : lmt__error(err, LMT_ENOMEM, "userfaultfd: out of memory");
	uint64_t npages = length >> page_shift;
	for (uint64_t w = 0; all && w < words; w++) {
		uint64_t valid = w == words - 1 && npages % 64 ? (1ull << (npages % 64)) - 1 : ~0ull;
		all[w] = valid;
		local[w] = ~coming[w] & valid;
	}
	if (!rc)
		rc = register_keeping(u, range, host, length, page_shift, all, minor, err);
	free(all);
	struct uffd_range *r = &u->ranges[range];
	r->shadow = shadow;
	r->local = local;
	/* Shared memory taken as private (no descriptor given): its file
	 * still holds the coming pages, which missing-page mode would let the
	 * guest see. They leave the file; private memory refuses this at
	 * once (EINVAL), having nothing more to drop. */
	if (!rc && !minor)
		rc = each_run(r, coming, remove_run);
	if (rc == -EINVAL)
		rc = 0;
	else if (rc < 0)
		rc = lmt__error(err, LMT_EINVAL, "userfaultfd: range %u: cannot drop pages: %s",
		                range, strerror(-rc));
	return rc;
}

uint64_t lmt__uffd_next_coming(struct lmt__uffd *u, uint32_t range, uint64_t from)
{
	const struct uffd_range *r = &u->ranges[range];
	for (uint64_t w = from / 64; r->registered && w < (r->npages + 63) / 64; w++) {
		uint64_t bits = ~atomic_load(&r->present[w]) & (r->local ? ~r->local[w] : ~0ull);
		if (w == from / 64)
			bits &= ~0ull << (from % 64);
		if (bits) {
			uint64_t p = w * 64 + (uint64_t)__builtin_ctzll(bits);
			return p < r->npages ? p : r->npages;
		}
	}
	return r->npages;
}

bool lmt__uffd_local(struct lmt__uffd *u, uint32_t range, uint64_t page)
{
	const struct uffd_range *r = &u->ranges[range];
	return r->local && lmt__bitmap_test(r->local, page);
}

/* ---- failure, statistics, closing ---- */

/* Replace the missing pages of a range by inaccessible memory, run by run. */
static void fence_range(struct uffd_range *r)
{
	for (uint64_t p = 0; p < r->npages;) {
		if ((atomic_load(&r->present[p / 64]) >> (p % 64)) & 1) {
			p++;
			continue;
		}
		uint64_t end = p + 1;
		while (end < r->npages && !((atomic_load(&r->present[end / 64]) >> (end % 64)) & 1))
			end++;
		/* MAP_FIXED over the registered pages: the new mapping is not
		 * registered, so a woken waiter faults on PROT_NONE. If it cannot
		 * be made, the waiter still gets no data: it stays blocked until
		 * the descriptor is closed, then reads zero pages; say so. */
		if (mmap(r->host + (p << r->page_shift), (end - p) << r->page_shift, PROT_NONE,
		         MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1,
		         0) == MAP_FAILED)
			lmt__log(LMT_LOG_ERROR,
			         "userfaultfd: cannot make %llu missing pages inaccessible: %s",
			         (unsigned long long)(end - p), strerror(errno));
		p = end;
	}
}

void lmt__uffd_fail(struct lmt__uffd *u)
{
	pthread_rwlock_wrlock(&u->place_lock);
	if (!atomic_load(&u->failed)) {
		atomic_store(&u->failed, true);
		for (uint32_t i = 0; i < u->nranges; i++)
			if (u->ranges[i].registered)
				fence_range(&u->ranges[i]);
		for (uint32_t i = 0; i < u->nranges; i++)
			if (u->ranges[i].registered)
				lmt__uffd_wake(u, u->ranges[i].host, u->ranges[i].length);
	}
	pthread_rwlock_unlock(&u->place_lock);
}

static int compare_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

void lmt__uffd_stats(struct lmt__uffd *u, struct lmt__uffd_stats *out)
{
	uint64_t *sorted = malloc(RESERVOIR * sizeof(*sorted));
	pthread_mutex_lock(&u->lock);
	uint64_t n = !sorted ? 0 : u->nsamples < RESERVOIR ? u->nsamples : RESERVOIR;
	if (n)
		memcpy(sorted, u->samples, n * sizeof(sorted[0]));
	*out = (struct lmt__uffd_stats){.faults = u->faults,
	                                .fault_pages = u->fault_pages,
	                                .background_pages = u->background_pages,
	                                .fault_max_ns = u->max_ns};
	pthread_mutex_unlock(&u->lock);
	out->missing = lmt__uffd_missing(u);
	if (n) {
		/* Out of memory: the percentiles stay 0 in this snapshot. */
		qsort(sorted, n, sizeof(sorted[0]), compare_u64);
		out->fault_p50_ns = sorted[(n - 1) / 2];
		out->fault_p99_ns = sorted[(n - 1) * 99 / 100];
	}
	free(sorted);
}

void lmt__uffd_close(struct lmt__uffd *u)
{
	if (!u)
		return;
	if (u->fd >= 0 && lmt__uffd_missing(u))
		lmt__uffd_fail(u);
	if (u->started) {
		uint64_t one = 1;
		if (write(u->stop_fd, &one, sizeof(one)) != sizeof(one))
			lmt__log(LMT_LOG_ERROR, "userfaultfd: cannot stop the fault thread");
		pthread_join(u->thread, NULL);
	}
	for (uint32_t i = 0; i < u->nranges; i++) {
		struct uffd_range *r = &u->ranges[i];
		struct uffdio_range range = {.start = (uintptr_t)r->host, .len = r->length};
		if (r->registered)
			ioctl(u->fd, UFFDIO_UNREGISTER, &range);
		if (r->shadow)
			munmap(r->shadow, r->length);
		free(r->local);
		free(r->present);
	}
	if (u->fd >= 0)
		close(u->fd);
	if (u->zeros)
		munmap(u->zeros, u->zeros_len);
	if (u->stop_fd >= 0)
		close(u->stop_fd);
	pthread_rwlock_destroy(&u->place_lock);
	pthread_mutex_destroy(&u->lock);
	free(u->ranges);
	free(u);
}

