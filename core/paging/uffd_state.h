/* userfaultfd's state (paging room), private to uffd.c (opening,
 * registration, failure, statistics, closing) and uffd_fault.c (the
 * present bitmaps, placement, the fault thread). */
#ifndef LMT_CORE_UFFD_STATE_H
#define LMT_CORE_UFFD_STATE_H

#include <linux/userfaultfd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/ioctl.h>

#include "uffd.h"

#ifndef USERFAULTFD_IOC_NEW
#define USERFAULTFD_IOC_NEW _IO(0xAA, 0x00)
/* Wake the threads that faulted in [addr, addr + len). */
static inline void lmt__uffd_wake(struct lmt__uffd *u, uint8_t *addr, uint64_t len)
{
	struct uffdio_range r = {.start = (uintptr_t)addr, .len = len};
	ioctl(u->fd, UFFDIO_WAKE, &r);
}

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

/* Wake the threads that faulted in [addr, addr + len). */
static inline void lmt__uffd_wake(struct lmt__uffd *u, uint8_t *addr, uint64_t len)
{
	struct uffdio_range r = {.start = (uintptr_t)addr, .len = len};
	ioctl(u->fd, UFFDIO_WAKE, &r);
}

#endif
