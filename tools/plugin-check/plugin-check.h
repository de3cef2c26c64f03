/* lmt-plugin-check internals: the checks, run on the plugin test harness
 * (plugin_harness.h), and the two that look at the file itself. */
#ifndef LMT_PLUGIN_CHECK_H
#define LMT_PLUGIN_CHECK_H

#include <stdbool.h>
#include <stddef.h>

#include "plugin_harness.h"

struct pc_check {
	const char *name;
	void (*fn)(struct ph_run *run);
};

extern const struct pc_check pc_checks[];
extern const size_t pc_check_count;

/* The other half of the "unload" check, run in a process of its own: load,
 * open and close an instance of each role, unload, and compare fds and
 * threads with before. 0, or 3 with the reason on stderr. */
int pc_unload_probe(const char *spec, const char *options, bool verbose);

/* The dynamic symbols `path` exports beyond the entry point, listed in
 * `extra`; returns how many, or -1 with the reason in `extra`. */
int pc_exports(const char *path, char *extra, size_t size);

#endif
