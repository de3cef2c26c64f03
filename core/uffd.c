/* userfaultfd: registration, the fault thread, page placement, failure
 * and statistics, for any user that places pages after the guest runs
 * (uffd.h; docs/engine.md, "Pages after the guest runs"). */
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
#include "uffd.h"

#ifndef USERFAULTFD_IOC_NEW
#define USERFAULTFD_IOC_NEW _IO(0xAA, 0x00)
#endif

#define RESERVOIR 4096u
#define PENDING_MAX 512u
#define EVENTS_PER_READ 64

struct uffd_range {
	uint8_t *host;
	uint64_t length;
	uint32_t page_shift;
	uint64_t npages;
	_Atomic uint64_t *present;
	bool registered;
	bool minor; /* shared memory watched for minor faults: placed in place */
	/* No UFFDIO_ZEROPAGE there (hugetlbfs): a zero page is copied in from
	 * the descriptor's zero buffer. */
	bool zero_by_copy;
	/* lmt__uffd_register_moved: the range's pages as they were, moved
	 * aside (mremap MREMAP_DONTUNMAP), and which of them are the guest's
	 * (local: not coming); placed back by a fault or lmt__uffd_settle. */
	uint8_t *shadow;
	uint64_t *local;
	uint64_t settle_next; /* where lmt__uffd_settle goes on */
};

/* A fault read and not yet placed: when, to time it. */
struct pending {
	uint32_t range;
	uint64_t page;
	uint64_t since_ns;
};

struct lmt__uffd {
	int fd;
	int stop_fd; /* an eventfd: the fault thread's signal to end */
	struct uffd_range *ranges;
	uint32_t nranges;
	lmt__uffd_fetch_fn fetch;
	void *opaque;
	pthread_t thread;
	bool started;
	/* Placement holds it shared; failure exclusively, so that no page is
	 * placed once the missing ones are made inaccessible. */
	pthread_rwlock_t place_lock;
	_Atomic bool failed;
	_Atomic uint64_t missing;
	/* The kernel gave minor faults on shared memory (shmem, memfd) and
	 * on hugetlbfs. */
	bool minor_shmem, minor_hugetlbfs;
	/* Reads as zero, a page of the largest size zero_by_copy ranges have:
	 * what their zero pages are copied from. */
	uint8_t *zeros;
	uint64_t zeros_len;
	uint32_t settle_range;
	/* Guards what follows: the faults in wait and the statistics. */
	pthread_mutex_t lock;
	struct pending pending[PENDING_MAX];
	uint32_t npending;
	uint64_t faults, fault_pages, background_pages, local_pages;
	uint64_t samples[RESERVOIR];
	uint64_t nsamples; /* latencies seen; the reservoir keeps RESERVOIR */
	uint64_t max_ns;
	uint64_t rng;
};

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

static void wake(struct lmt__uffd *u, uint8_t *addr, uint64_t len)
{
	struct uffdio_range r = {.start = (uintptr_t)addr, .len = len};
	ioctl(u->fd, UFFDIO_WAKE, &r);
}

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
			wake(u, r->host + ((page + at) << r->page_shift), pages << r->page_shift);
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
			wake(u, r->host + ((page + at) << r->page_shift), size);
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
		wake(u, at, 1ull << r->page_shift);
		return;
	}
	/* The guest's own page, moved aside at the switch: put back now. */
	if (r->local && lmt__bitmap_test(r->local, page)) {
		struct lmt_error err = {0};
		if (settle_run(u, range, page, 1, &err))
			lmt__log(LMT_LOG_ERROR, "%s", err.message);
		wake(u, r->host + (page << r->page_shift), 1ull << r->page_shift);
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
				wake(u, u->ranges[i].host, u->ranges[i].length);
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
