/* Helpers of the two-process engine tests: guest RAM, a destination in a
 * child process, a source driven to completion, and a census of the
 * process's descriptors and threads. */
#ifndef LMT_TEST_HARNESS_H
#define LMT_TEST_HARNESS_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include <lmt/lmt.h>

#include "guest.h"

struct census {
	int fds;
	int threads;
};

struct census census_take(void);
void census_check(struct census before);

uint8_t *ram_map(uint64_t bytes);
/* Random pages (10% zero) in a fresh mapping, with dirty bitmaps. */
void ram_fill(struct guest_ram *ram, uint64_t bytes, uint64_t seed);
void ram_release(struct guest_ram *ram);

/* The plugin under test: LMT_TEST_PLUGIN, or tcp. Its options are in
 * LMT_TEST_OPTIONS and are added to every session. */
const char *test_plugin(void);
lmt_session *session_with_blocks(enum lmt_role role, struct guest_ram *ram, const char *opts);
lmt_session *session_on(enum lmt_role role, struct guest_ram *ram, const char *plugin,
                        const char *opts);

/* A source session on `ram` (its dirty bitmaps as the dirty sync) whose
 * setup to 127.0.0.1:port succeeded; fails the test otherwise. */
lmt_session *source_set_up(struct guest_ram *ram, const char *opts, uint16_t port);
/* The same over `plugin`. */
lmt_session *source_set_up_on(struct guest_ram *ram, const char *plugin, const char *opts,
                              uint16_t port);

/* What a destination child does besides loading. */
struct dest_spec {
	uint64_t ram_bytes;
	const char *options;
	/* Before the load: scribble over the RAM the source will send. */
	void (*prepare)(struct guest_ram *ram);
	/* After a load that succeeded: 0 if the device state is right. */
	int (*check_state)(const void *data, size_t length);
};

/* Fork a destination; its bound port comes back. The child exits 0 on a
 * completed (and checked) load, 1 on a failed one, 2 on a setup error. */
pid_t dest_spawn(const struct dest_spec *spec, uint16_t *port);
/* The child's exit status, or 128 + signal. */
int dest_wait(pid_t pid);

struct source_run {
	int rc;
	char error[600];
	struct lmt_stats stats;
	uint64_t failed_at_ns;
	uint32_t iterations;
	uint64_t max_iterate_ns;
	uint64_t median_iterate_ns;
	int npasses;
	struct lmt_pass_stats passes[16];
};

/* Migrate `ram` to 127.0.0.1:port. `kill_pid` is killed `kill_after_ns`
 * after setup when non-zero, and *killed_at notes when. */
struct source_run source_migrate(struct guest_ram *ram, const char *opts, uint16_t port,
                                 const void *state, size_t state_len, pid_t kill_pid,
                                 uint64_t kill_after_ns, uint64_t *killed_at);

/* A migration of `ram` to a destination child, both sides with `opts`,
 * that must succeed on both sides. */
struct source_run migrate_to_child(struct guest_ram *ram, const char *opts);

/* The same as source_migrate, with lmt given `view` (e.g. a read-only mapping) while the
 * dirty bitmaps live in `tracking`. */
struct source_run source_migrate_view(struct guest_ram *view, struct guest_ram *tracking,
                                      const char *opts, uint16_t port, const void *state,
                                      size_t state_len, pid_t kill_pid, uint64_t kill_after_ns,
                                      uint64_t *killed_at);

/* One end of a migration between two sessions of this process. */
struct migration_side {
	int rc;
	char error[600];
	struct lmt_stats stats;
};

/* Migrate a guest of `bytes` filled from `seed` (with `marker`, 32 bytes,
 * written into every page when not NULL) from a source session to a
 * destination session on a thread of this process, with the given
 * options, over loopback tcp; each end's result in *src and *dst. Checks
 * that no thread or descriptor is left, and the memory bit for bit when
 * the source succeeded. */
void migrate_in_process(const char *src_opts, const char *dst_opts, uint64_t bytes, uint64_t seed,
                        const uint8_t *marker, struct migration_side *src, struct migration_side *dst);

#endif
