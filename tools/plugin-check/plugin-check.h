/* lmt-plugin-check internals: the checks, run on the plugin test harness
 * (plugin_harness.h), and the two that look at the file itself. */
#ifndef LMT_PLUGIN_CHECK_H
#define LMT_PLUGIN_CHECK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "plugin_harness.h"

struct pc_check {
	const char *name;
	void (*fn)(struct ph_run *run);
};

extern const struct pc_check pc_checks[];
extern const size_t pc_check_count;

#define KIB 1024u
#define MIB (1024u * 1024u)
#define ALL_CAPS                                                                                   \
	(LMT_CAP_ONE_SIDED | LMT_CAP_LOCAL_MR | LMT_CAP_PIN | LMT_CAP_MULTI_CHANNEL |              \
	 LMT_CAP_TARGET_PROGRESS | LMT_CAP_DECORATOR | LMT_CAP_MERGES_RUNS | LMT_CAP_ENCRYPTS |    \
	 LMT_CAP_STORAGE)
#define PROMPT_NS (2 * PH_SECOND)  /* a timed-out call returns this soon after */
#define CANCEL_PROMPT_NS PH_SECOND /* a cancelled call returns this soon */
#define IDLE_NS (PH_SECOND / 20)   /* how long idle progress waits */

/* What the checks share (checks.c). */
double pc_seconds(uint64_t ns);
bool pc_one_line(const char *text);
bool pc_valid_name(const char *name, size_t max);
/* Tear down as the core does: the destination's progress stopped, memory
 * released, then the instances. */
void pc_finish(struct ph_run *run, struct ph_pair *pair, struct ph_tally *tally,
               struct ph_source *source, struct ph_region *regions, size_t count);

/* What the file declares (checks_file.c). */
void pc_check_descriptor(struct ph_run *run);
void pc_check_exports(struct ph_run *run);
void pc_check_negotiation(struct ph_run *run);
void pc_check_options(struct ph_run *run);
/* The paths that succeed (checks_data.c). */
void pc_check_instances(struct ph_run *run);
void pc_check_connect(struct ph_run *run);
void pc_check_idle(struct ph_run *run);
void pc_check_registration(struct ph_run *run);
void pc_check_sizes(struct ph_run *run);
void pc_check_largest(struct ph_run *run);
void pc_check_cookies(struct ph_run *run);
void pc_check_flush(struct ph_run *run);
void pc_check_encryption(struct ph_run *run);
void pc_check_queue_full(struct ph_run *run);
/* Error paths (checks_errors.c). */
void pc_check_bad_address(struct ph_run *run);
void pc_check_bad_key(struct ph_run *run);
void pc_check_beyond(struct ph_run *run);
void pc_check_cancel(struct ph_run *run);
/* Open/close cycles and unloading (checks_cycles.c). */
void pc_check_instance_cycles(struct ph_run *run);
void pc_check_endpoint_cycles(struct ph_run *run);
void pc_check_half_open_cycles(struct ph_run *run);
void pc_check_connected_cycles(struct ph_run *run);
void pc_check_unload(struct ph_run *run);
/* A channel that comes back (reopen.c). */
void pc_check_reopen(struct ph_run *run);

/* The other half of the "unload" check, run in a process of its own: load,
 * open and close an instance of each role, unload, and compare fds and
 * threads with before. 0, or 3 with the reason on stderr. */
int pc_unload_probe(const char *spec, const char *options, bool verbose);

/* The dynamic symbols `path` exports beyond the entry point, listed in
 * `extra`; returns how many, or -1 with the reason in `extra`. */
int pc_exports(const char *path, char *extra, size_t size);

#endif
