/* Helpers of the two-process engine tests (see harness.h). */
#define _GNU_SOURCE
#include "harness.h"
#include "threads_live.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

static int count_entries(const char *dir)
{
	DIR *d = opendir(dir);
	int n = 0;
	if (!d)
		return -1;
	while (readdir(d))
		n++;
	closedir(d);
	return n;
}

struct census census_take(void)
{
	return (struct census){count_entries("/proc/self/fd"), threads_live(0)};
}

/* What each descriptor of the process refers to, for a census that failed. */
static void print_descriptors(void)
{
	DIR *d = opendir("/proc/self/fd");
	if (!d)
		return;
	struct dirent *e;
	while ((e = readdir(d))) {
		char path[300], target[256];
		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
		ssize_t n = readlink(path, target, sizeof(target) - 1);
		target[n > 0 ? n : 0] = 0;
		print_message("    fd %s -> %s\n", e->d_name, target);
	}
	closedir(d);
}

void census_check(struct census before)
{
	struct census now = census_take();
	if (now.fds != before.fds || now.threads != before.threads) {
		print_descriptors();
		threads_live(1);
		fail_msg("left behind: %d descriptors and %d threads (before %d and %d)", now.fds,
		         now.threads, before.fds, before.threads);
	}
}

uint8_t *ram_map(uint64_t bytes)
{
	uint8_t *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	assert_true(p != MAP_FAILED);
	return p;
}

void ram_fill(struct guest_ram *ram, uint64_t bytes, uint64_t seed)
{
	guest_ram_layout(ram, ram_map(bytes), bytes);
	guest_ram_fill(ram, 0.1, seed);
	assert_int_equal(guest_ram_alloc_dirty(ram), 0);
}

void ram_release(struct guest_ram *ram)
{
	guest_ram_free_dirty(ram);
	munmap(ram->base, ram->bytes);
}

const char *test_plugin(void)
{
	return getenv("LMT_TEST_PLUGIN") ? getenv("LMT_TEST_PLUGIN") : "tcp";
}

lmt_session *session_with_blocks(enum lmt_role role, struct guest_ram *ram, const char *opts)
{
	return session_on(role, ram, test_plugin(), opts);
}

lmt_session *source_set_up(struct guest_ram *ram, const char *opts, uint16_t port)
{
	return source_set_up_on(ram, test_plugin(), opts, port);
}

lmt_session *source_set_up_on(struct guest_ram *ram, const char *plugin, const char *opts,
                              uint16_t port)
{
	lmt_session *s = session_on(LMT_ROLE_SOURCE, ram, plugin, opts);
	assert_int_equal(lmt_session_set_dirty_sync(s, guest_dirty_sync, ram), 0);
	char uri[64];
	snprintf(uri, sizeof(uri), "127.0.0.1:%u", port);
	if (lmt_save_setup(s, uri))
		fail_msg("setup: %s", lmt_session_error(s)->message);
	return s;
}

lmt_session *session_on(enum lmt_role role, struct guest_ram *ram, const char *plugin,
                        const char *opts)
{
	struct lmt_error err = {0};
	lmt_session *s = NULL;
	const char *extra = getenv("LMT_TEST_OPTIONS");
	if (lmt_session_new(&s, role, plugin, opts, &err))
		fail_msg("session over %s with '%s': %s", plugin, opts ? opts : "", err.message);
	if (extra && *extra && lmt_session_set_options(s, extra))
		fail_msg("LMT_TEST_OPTIONS '%s': %s", extra, lmt_session_error(s)->message);
	for (uint32_t i = 0; i < ram->nblocks; i++)
		assert_int_equal(lmt_session_add_block(s, ram->blocks[i].name, ram->blocks[i].host,
		                                       ram->blocks[i].length, GUEST_PAGE_SIZE),
		                 0);
	return s;
}

static void dest_child(const struct dest_spec *spec, int out)
{
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	struct guest_ram ram;
	guest_ram_layout(&ram, ram_map(spec->ram_bytes), spec->ram_bytes);
	if (spec->prepare)
		spec->prepare(&ram);
	lmt_session *s = session_with_blocks(LMT_ROLE_DESTINATION, &ram, spec->options);
	uint16_t port = 0;
	if (lmt_load_listen(s, "127.0.0.1:0", &port) != 0 ||
	    write(out, &port, sizeof(port)) != sizeof(port))
		_exit(2);
	int rc = lmt_load_run(s);
	const void *state = NULL;
	size_t length = 0;
	if (rc == 0 && spec->check_state &&
	    (lmt_load_device_state(s, &state, &length) != 0 || spec->check_state(state, length)))
		rc = -1;
	lmt_session_free(s);
	_exit(rc == 0 ? 0 : 1);
}

pid_t dest_spawn(const struct dest_spec *spec, uint16_t *port)
{
	int fds[2];
	assert_int_equal(pipe(fds), 0);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		close(fds[0]);
		dest_child(spec, fds[1]);
	}
	close(fds[1]);
	assert_int_equal(read(fds[0], port, sizeof(*port)), sizeof(*port));
	close(fds[0]);
	return pid;
}

int dest_wait(pid_t pid)
{
	int status = 0;
	assert_int_equal(waitpid(pid, &status, 0), pid);
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static int compare_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

struct source_run source_migrate(struct guest_ram *ram, const char *opts, uint16_t port,
                                 const void *state, size_t state_len, pid_t kill_pid,
                                 uint64_t kill_after_ns, uint64_t *killed_at)
{
	return source_migrate_view(ram, ram, opts, port, state, state_len, kill_pid, kill_after_ns,
	                           killed_at);
}

struct source_run source_migrate_view(struct guest_ram *view, struct guest_ram *tracking,
                                      const char *opts, uint16_t port, const void *state,
                                      size_t state_len, pid_t kill_pid, uint64_t kill_after_ns,
                                      uint64_t *killed_at)
{
	struct source_run r = {0};
	char uri[64];
	snprintf(uri, sizeof(uri), "127.0.0.1:%u", port);
	lmt_session *s = session_with_blocks(LMT_ROLE_SOURCE, view, opts);
	assert_int_equal(lmt_session_set_dirty_sync(s, guest_dirty_sync, tracking), 0);
	uint64_t t0 = guest_now_ns();
	uint64_t *times = calloc(100000, sizeof(*times));
	r.rc = lmt_save_setup(s, uri);
	struct lmt_iterate_result it = {0};
	while (r.rc == 0 && !it.ready) {
		if (kill_pid && !*killed_at && guest_now_ns() - t0 >= kill_after_ns) {
			kill(kill_pid, SIGKILL);
			*killed_at = guest_now_ns();
		}
		uint64_t before = guest_now_ns();
		r.rc = lmt_save_iterate(s, &it);
		if (r.iterations < 100000)
			times[r.iterations++] = guest_now_ns() - before;
	}
	if (r.iterations) {
		qsort(times, r.iterations, sizeof(*times), compare_u64);
		r.max_iterate_ns = times[r.iterations - 1];
		r.median_iterate_ns = times[r.iterations / 2];
	}
	free(times);
	if (r.rc == 0)
		r.rc = lmt_save_complete(s, state, state_len);
	r.failed_at_ns = guest_now_ns();
	snprintf(r.error, sizeof(r.error), "%s", lmt_session_error(s)->message);
	lmt_session_stats(s, &r.stats);
	r.npasses = lmt_session_passes(s, r.passes, 16);
	lmt_session_free(s);
	return r;
}

struct source_run migrate_to_child(struct guest_ram *ram, const char *opts)
{
	struct dest_spec spec = {.ram_bytes = ram->bytes, .options = opts};
	uint16_t port;
	pid_t pid = dest_spawn(&spec, &port);
	uint64_t none = 0;
	struct source_run r = source_migrate(ram, opts, port, NULL, 0, 0, 0, &none);
	if (r.rc)
		fail_msg("migration with '%s': %s", opts, r.error);
	assert_int_equal(dest_wait(pid), 0);
	return r;
}

/* ---- a migration between two sessions of this process ---- */

struct dest_thread {
	lmt_session *s;
	struct migration_side out;
};

static void *run_dest(void *arg)
{
	struct dest_thread *d = arg;
	d->out.rc = lmt_load_run(d->s);
	snprintf(d->out.error, sizeof(d->out.error), "%s", lmt_session_error(d->s)->message);
	lmt_session_stats(d->s, &d->out.stats);
	return NULL;
}

void migrate_in_process(const char *src_opts, const char *dst_opts, uint64_t bytes, uint64_t seed,
                        const uint8_t *marker, struct migration_side *src, struct migration_side *dst)
{
	struct guest_ram sram, dram;
	ram_fill(&sram, bytes, seed);
	if (marker)
		for (uint64_t off = 0; off < bytes; off += 4096)
			memcpy(sram.base + off + 1000, marker, 32);
	guest_ram_layout(&dram, ram_map(bytes), bytes);
	struct census c0 = census_take();
	struct dest_thread d = {.s = session_with_blocks(LMT_ROLE_DESTINATION, &dram, dst_opts)};
	uint16_t port = 0;
	assert_int_equal(lmt_load_listen(d.s, "127.0.0.1:0", &port), 0);
	pthread_t t;
	assert_int_equal(pthread_create(&t, NULL, run_dest, &d), 0);
	uint64_t none = 0;
	struct source_run r = source_migrate(&sram, src_opts, port, "dev", 3, 0, 0, &none);
	pthread_join(t, NULL);
	lmt_session_free(d.s);
	census_check(c0);
	src->rc = r.rc;
	snprintf(src->error, sizeof(src->error), "%s", r.error);
	src->stats = r.stats;
	*dst = d.out;
	if (src->rc == 0)
		assert_memory_equal(sram.base, dram.base, bytes);
	ram_release(&sram);
	ram_release(&dram);
}
