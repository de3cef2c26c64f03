/* How many threads of this process can still run code: the entries of
 * /proc/self/task less those already exiting (PF_EXITING in the flags of
 * their stat). pthread_join returns once the kernel has cleared the thread's
 * id, which happens inside its exit and before /proc forgets it, so a thread
 * just joined can still be listed for a moment; counting it would make every
 * census that follows a join fail now and then. Header-only so that the
 * fuzzers, which do not link the test-support library, share it. */
#ifndef LMT_TEST_THREADS_LIVE_H
#define LMT_TEST_THREADS_LIVE_H

#include <dirent.h>
#include <stdio.h>
#include <string.h>

#define LMT_TEST_PF_EXITING 0x4UL /* include/linux/sched.h */

/* Whether the thread `tid` of this process has begun to exit (or is gone);
 * with `name` (16 bytes), its name. */
static inline int thread_exiting(const char *tid, char name[16])
{
	char path[300], stat[1024];
	snprintf(path, sizeof(path), "/proc/self/task/%s/stat", tid);
	FILE *f = fopen(path, "re");
	if (!f)
		return 1;
	size_t n = fread(stat, 1, sizeof(stat) - 1, f);
	fclose(f);
	stat[n] = '\0';
	/* pid (comm) state ppid pgrp session tty_nr tpgid flags ...; comm may
	 * hold anything, so parse from its closing parenthesis. */
	char *open = strchr(stat, '('), *close = strrchr(stat, ')');
	if (!open || !close || close < open)
		return 1;
	if (name)
		snprintf(name, 16, "%.*s", (int)(close - open - 1), open + 1);
	char state;
	int skip;
	unsigned long flags;
	if (sscanf(close + 1, " %c %d %d %d %d %d %lu", &state, &skip, &skip, &skip, &skip, &skip,
	           &flags) != 7)
		return 1;
	return (flags & LMT_TEST_PF_EXITING) != 0;
}

/* The threads of this process that have not begun to exit; with `print`,
 * each one's id and name to stderr. -1 when /proc cannot be read. */
static inline int threads_live(int print)
{
	DIR *d = opendir("/proc/self/task");
	if (!d)
		return -1;
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		char name[16] = "";
		if (e->d_name[0] == '.' || thread_exiting(e->d_name, name))
			continue;
		if (print)
			fprintf(stderr, "    thread %s (%s)\n", e->d_name, name);
		n++;
	}
	closedir(d);
	return n;
}

#endif
