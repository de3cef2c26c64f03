/* The descriptors and threads of this process, for the harnesses that
 * check that an input leaves none behind. Pipes are not counted: libFuzzer
 * keeps two open to its symbolizer once it prints a new function, and lmt
 * makes none. */
#ifndef LMT_FUZZ_CENSUS_H
#define LMT_FUZZ_CENSUS_H

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "threads_live.h"

struct fuzz_census {
	int fds;
	int threads;
};

/* Entries of `path`, less pipes when `links` (a /proc/self/fd). With
 * `print`, each one to stderr. */
static inline int fuzz_census_count(const char *path, int links, int print)
{
	DIR *d = opendir(path);
	if (!d)
		abort();
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		char link[300], target[300] = "";
		if (links) {
			snprintf(link, sizeof(link), "%s/%s", path, e->d_name);
			if (readlink(link, target, sizeof(target) - 1) < 0)
				target[0] = '\0';
			if (!strncmp(target, "pipe:", 5))
				continue;
		}
		if (print)
			fprintf(stderr, "  %s/%s %s\n", path, e->d_name, target);
		n++;
	}
	closedir(d);
	return n;
}

static inline struct fuzz_census fuzz_census_take(void)
{
	return (struct fuzz_census){fuzz_census_count("/proc/self/fd", 1, 0),
	                            threads_live(0)};
}

/* Whether the process is back to `before` (threads already exiting are not
 * counted: see threads_live.h); lists the descriptors and threads when not. */
static inline int fuzz_census_same(struct fuzz_census before, struct fuzz_census *after)
{
	*after = fuzz_census_take();
	if (after->fds == before.fds && after->threads == before.threads)
		return 1;
	fuzz_census_count("/proc/self/fd", 1, 1);
	threads_live(1);
	return 0;
}

#endif
