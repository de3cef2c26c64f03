/* 2 MiB huge pages for the tests that migrate hugetlbfs memory. Test
 * support, not installed. */
#ifndef LMT_TESTS_HUGEPAGES_H
#define LMT_TESTS_HUGEPAGES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>

#define HUGE_PAGE_SIZE (2u << 20)
/* memfd_create and mmap flags for that size, where libc lacks them. */
#ifndef MFD_HUGE_2MB
#define MFD_HUGE_2MB (21u << 26)
#endif
#ifndef MAP_HUGE_2MB
#define MAP_HUGE_2MB (21 << 26)
#endif

/* Make `pages` 2 MiB huge pages free for this process: as root, by adding
 * them to the pool (vm.nr_hugepages, under a lock so that tests running
 * at once each add their own); otherwise they must be free already.
 * False, with `why` saying what is missing, when they cannot be had. */
bool huge_pages_take(uint64_t pages, char *why, size_t why_len);
/* Give back what huge_pages_take added to the pool (nothing when it added
 * none). The pages must be unmapped first. */
void huge_pages_return(void);

#endif
