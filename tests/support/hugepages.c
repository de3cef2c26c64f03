/* 2 MiB huge pages for tests (hugepages.h): the pool is the kernel's
 * per-size count, which root may raise and lower. Lowering it never takes
 * a page in use or reserved: the kernel keeps those. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "hugepages.h"

#define POOL "/sys/kernel/mm/hugepages/hugepages-2048kB/"

static uint64_t added;

static bool read_count(const char *path, uint64_t *out)
{
	FILE *f = fopen(path, "r");
	bool ok = f && fscanf(f, "%" SCNu64, out) == 1;
	if (f)
		fclose(f);
	return ok;
}

static bool write_count(int fd, uint64_t n)
{
	char text[32];
	int len = snprintf(text, sizeof(text), "%" PRIu64 "\n", n);
	return pwrite(fd, text, (size_t)len, 0) == len;
}

/* The pool's size, read and changed under an exclusive lock on it. */
static bool resize(int fd, int64_t by, uint64_t *before, uint64_t *after)
{
	if (!read_count(POOL "nr_hugepages", before))
		return false;
	uint64_t want = by < 0 && (uint64_t)-by > *before ? 0 : *before + (uint64_t)by;
	return write_count(fd, want) && read_count(POOL "nr_hugepages", after);
}

bool huge_pages_take(uint64_t pages, char *why, size_t why_len)
{
	added = 0;
	int fd = open(POOL "nr_hugepages", O_RDWR | O_CLOEXEC);
	if (fd < 0) {
		uint64_t free_pages = 0, reserved = 0;
		if (!read_count(POOL "free_hugepages", &free_pages)) {
			snprintf(why, why_len, "this kernel has no 2 MiB huge pages (" POOL ": %s)",
			         strerror(errno));
			return false;
		}
		read_count(POOL "resv_hugepages", &reserved);
		if (free_pages - (reserved < free_pages ? reserved : free_pages) >= pages)
			return true;
		snprintf(why, why_len,
		         "needs %" PRIu64 " free 2 MiB huge pages, %" PRIu64
		         " are: reserve them (vm.nr_hugepages) or run as root",
		         pages, free_pages);
		return false;
	}
	uint64_t before = 0, after = 0;
	bool ok = flock(fd, LOCK_EX) == 0 && resize(fd, (int64_t)pages, &before, &after);
	if (ok && after >= before + pages) {
		added = pages;
	} else {
		snprintf(why, why_len,
		         "the kernel gave %" PRIu64 " of %" PRIu64 " more 2 MiB huge pages asked for",
		         after > before ? after - before : 0, pages);
		if (after > before)
			resize(fd, -(int64_t)(after - before), &before, &after);
		ok = false;
	}
	close(fd); /* and the lock */
	return ok;
}

void huge_pages_return(void)
{
	if (!added)
		return;
	int fd = open(POOL "nr_hugepages", O_RDWR | O_CLOEXEC);
	uint64_t before, after;
	if (fd >= 0 && flock(fd, LOCK_EX) == 0)
		resize(fd, -(int64_t)added, &before, &after);
	if (fd >= 0)
		close(fd);
	added = 0;
}
