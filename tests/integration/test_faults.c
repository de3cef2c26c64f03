/* Two-process failure tests: a peer killed mid-migration, a cancel from
 * another thread. The surviving side must fail within its timeouts, leave
 * the source RAM as it was, keep no descriptor or thread, and a fresh
 * migration afterwards must succeed. Plugin from LMT_TEST_PLUGIN (tcp). */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
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
#include <time.h>
#include <unistd.h>

#include "bench.h"

#define RAM_BYTES (32ull << 20)
/* Slow enough that a kill 300 ms in lands mid-pass. */
#define SLOW "max-bandwidth=16M,connect-timeout=3s,idle-timeout=3s"
#define FAIL_WITHIN_NS 4000000000ull

static const char *plugin = "tcp";

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

struct census {
	int fds;
	int threads;
};

static struct census census(void)
{
	return (struct census){count_entries("/proc/self/fd"), count_entries("/proc/self/task")};
}

static uint8_t *map_ram(void)
{
	uint8_t *p = mmap(NULL, RAM_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
	                  -1, 0);
	assert_true(p != MAP_FAILED);
	return p;
}

static lmt_session *new_session(enum lmt_role role, struct bench_ram *ram, const char *opts)
{
	struct lmt_error err = {0};
	lmt_session *s = NULL;
	int rc = lmt_session_new(&s, role, plugin, opts, &err);
	if (rc)
		fail_msg("session: %s", err.message);
	for (uint32_t i = 0; i < ram->nblocks; i++)
		assert_int_equal(lmt_session_add_block(s, ram->blocks[i].name, ram->blocks[i].host,
		                                       ram->blocks[i].length, BENCH_PAGE_SIZE),
		                 0);
	return s;
}

/* The destination in a child process; its port comes back on a pipe. The
 * child exits 0 on a completed load, 1 otherwise. */
static pid_t spawn_destination(const char *opts, uint16_t *port)
{
	int fds[2];
	assert_int_equal(pipe(fds), 0);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		close(fds[0]);
		struct bench_ram ram;
		bench_ram_layout(&ram, map_ram(), RAM_BYTES);
		lmt_session *s = new_session(LMT_ROLE_DESTINATION, &ram, opts);
		uint16_t p = 0;
		if (lmt_load_listen(s, "127.0.0.1:0", &p) != 0)
			_exit(2);
		if (write(fds[1], &p, sizeof(p)) != sizeof(p))
			_exit(2);
		int rc = lmt_load_run(s);
		lmt_session_free(s);
		_exit(rc == 0 ? 0 : 1);
	}
	close(fds[1]);
	assert_int_equal(read(fds[0], port, sizeof(*port)), sizeof(*port));
	close(fds[0]);
	return pid;
}

static int child_status(pid_t pid)
{
	int status = 0;
	assert_int_equal(waitpid(pid, &status, 0), pid);
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

struct source_run {
	int rc;
	uint64_t failed_at;
	char error[600];
};

/* Drive a source until it completes or fails. `kill_pid` is killed
 * `kill_after_ns` after setup when non-zero. */
static struct source_run migrate(struct bench_ram *ram, const char *opts, uint16_t port,
                                 pid_t kill_pid, uint64_t kill_after_ns, uint64_t *killed_at)
{
	struct source_run r = {0};
	char uri[64];
	snprintf(uri, sizeof(uri), "127.0.0.1:%u", port);
	lmt_session *s = new_session(LMT_ROLE_SOURCE, ram, opts);
	assert_int_equal(lmt_session_set_dirty_sync(s, bench_dirty_sync, ram), 0);
	uint64_t t0 = bench_now_ns();
	r.rc = lmt_save_setup(s, uri);
	struct lmt_iterate_result it = {0};
	while (r.rc == 0 && !it.ready) {
		if (kill_pid && !*killed_at && bench_now_ns() - t0 >= kill_after_ns) {
			kill(kill_pid, SIGKILL);
			*killed_at = bench_now_ns();
		}
		r.rc = lmt_save_iterate(s, &it);
	}
	if (r.rc == 0)
		r.rc = lmt_save_complete(s, "state", 5);
	r.failed_at = bench_now_ns();
	snprintf(r.error, sizeof(r.error), "%s", lmt_session_error(s)->message);
	lmt_session_free(s);
	return r;
}

static void fill(struct bench_ram *ram, uint8_t *base)
{
	bench_ram_layout(ram, base, RAM_BYTES);
	bench_ram_fill(ram, 0.1, 42);
	assert_int_equal(bench_ram_alloc_dirty(ram), 0);
}

/* A migration from scratch succeeds and is bit-exact. */
static void migrate_cleanly(struct bench_ram *ram)
{
	uint16_t port;
	pid_t pid = spawn_destination("", &port);
	uint64_t none = 0;
	struct source_run r = migrate(ram, "", port, 0, 0, &none);
	assert_int_equal(r.rc, 0);
	assert_int_equal(child_status(pid), 0);
}

static void test_destination_killed_mid_migration_fails_the_source(void **state)
{
	struct bench_ram ram;
	uint8_t *base = map_ram();
	fill(&ram, base);
	uint64_t before = bench_checksum(base, RAM_BYTES);
	struct census c0 = census();

	uint16_t port;
	pid_t pid = spawn_destination(SLOW, &port);
	uint64_t killed_at = 0;
	struct source_run r = migrate(&ram, SLOW, port, pid, 300000000ull, &killed_at);
	assert_true(killed_at != 0);
	assert_true(r.rc < 0);
	assert_true(r.failed_at - killed_at < FAIL_WITHIN_NS);
	assert_true(r.error[0] != '\0');
	assert_int_equal(child_status(pid), 128 + SIGKILL);

	struct census c1 = census();
	assert_int_equal(c1.fds, c0.fds);
	assert_int_equal(c1.threads, c0.threads);
	assert_true(bench_checksum(base, RAM_BYTES) == before);
	migrate_cleanly(&ram);
	bench_ram_free_dirty(&ram);
	munmap(base, RAM_BYTES);
}

struct killer {
	pid_t pid;
	uint64_t delay_ns;
	uint64_t killed_at;
};

static void *kill_later(void *arg)
{
	struct killer *k = arg;
	struct timespec ts = {0, (long)k->delay_ns};
	nanosleep(&ts, NULL);
	kill(k->pid, SIGKILL);
	k->killed_at = bench_now_ns();
	return NULL;
}

static void test_source_killed_mid_migration_fails_the_destination(void **state)
{
	struct bench_ram ram;
	bench_ram_layout(&ram, map_ram(), RAM_BYTES);
	struct census c0 = census();
	lmt_session *d = new_session(LMT_ROLE_DESTINATION, &ram, SLOW);
	uint16_t port = 0;
	assert_int_equal(lmt_load_listen(d, "127.0.0.1:0", &port), 0);

	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		struct bench_ram src;
		fill(&src, map_ram());
		uint64_t none = 0;
		struct source_run r = migrate(&src, SLOW, port, 0, 0, &none);
		_exit(r.rc == 0 ? 0 : 1);
	}
	struct killer k = {.pid = pid, .delay_ns = 500000000ull};
	pthread_t t;
	assert_int_equal(pthread_create(&t, NULL, kill_later, &k), 0);
	int rc = lmt_load_run(d);
	uint64_t failed_at = bench_now_ns();
	pthread_join(t, NULL);
	assert_true(rc < 0);
	assert_true(failed_at - k.killed_at < FAIL_WITHIN_NS);
	assert_int_equal(child_status(pid), 128 + SIGKILL);
	lmt_session_free(d);

	struct census c1 = census();
	assert_int_equal(c1.fds, c0.fds);
	assert_int_equal(c1.threads, c0.threads);
	munmap(ram.base, RAM_BYTES);
}

struct canceller {
	lmt_session *volatile session;
	uint64_t delay_ns;
};

static void *cancel_later(void *arg)
{
	struct canceller *c = arg;
	struct timespec ts = {0, (long)c->delay_ns};
	nanosleep(&ts, NULL);
	lmt_cancel(c->session);
	return NULL;
}

static void test_cancel_from_another_thread_ends_both_sides(void **state)
{
	struct bench_ram ram;
	uint8_t *base = map_ram();
	fill(&ram, base);
	uint64_t before = bench_checksum(base, RAM_BYTES);
	struct census c0 = census();
	uint16_t port;
	pid_t pid = spawn_destination(SLOW, &port);

	char uri[64];
	snprintf(uri, sizeof(uri), "127.0.0.1:%u", port);
	lmt_session *s = new_session(LMT_ROLE_SOURCE, &ram, SLOW);
	assert_int_equal(lmt_session_set_dirty_sync(s, bench_dirty_sync, &ram), 0);
	assert_int_equal(lmt_save_setup(s, uri), 0);
	struct canceller c = {.session = s, .delay_ns = 200000000ull};
	pthread_t t;
	assert_int_equal(pthread_create(&t, NULL, cancel_later, &c), 0);
	struct lmt_iterate_result it = {0};
	int rc = 0;
	while (rc == 0 && !it.ready)
		rc = lmt_save_iterate(s, &it);
	pthread_join(t, NULL);
	assert_int_equal(rc, -LMT_ECANCELED);
	struct lmt_stats st;
	assert_int_equal(lmt_session_stats(s, &st), 0);
	assert_int_equal(st.status, LMT_STATUS_CANCELLED);
	lmt_session_free(s);
	assert_int_equal(child_status(pid), 1);

	struct census c1 = census();
	assert_int_equal(c1.fds, c0.fds);
	assert_int_equal(c1.threads, c0.threads);
	assert_true(bench_checksum(base, RAM_BYTES) == before);
	migrate_cleanly(&ram);
	bench_ram_free_dirty(&ram);
	munmap(base, RAM_BYTES);
}

static void test_cancel_while_destination_waits_returns_promptly(void **state)
{
	struct bench_ram ram;
	bench_ram_layout(&ram, map_ram(), RAM_BYTES);
	struct census c0 = census();
	lmt_session *d = new_session(LMT_ROLE_DESTINATION, &ram, "");
	assert_int_equal(lmt_load_listen(d, "127.0.0.1:0", NULL), 0);
	struct canceller c = {.session = d, .delay_ns = 100000000ull};
	pthread_t t;
	assert_int_equal(pthread_create(&t, NULL, cancel_later, &c), 0);
	uint64_t t0 = bench_now_ns();
	assert_int_equal(lmt_load_run(d), -LMT_ECANCELED);
	assert_true(bench_now_ns() - t0 < 1000000000ull);
	pthread_join(t, NULL);
	lmt_session_free(d);
	struct census c1 = census();
	assert_int_equal(c1.fds, c0.fds);
	munmap(ram.base, RAM_BYTES);
}

static void test_unreachable_destination_fails_within_connect_timeout(void **state)
{
	struct bench_ram ram;
	uint8_t *base = map_ram();
	fill(&ram, base);
	struct census c0 = census();
	/* A port nothing listens on: bind one, note it, close it. */
	lmt_session *probe = new_session(LMT_ROLE_DESTINATION, &ram, "");
	uint16_t port = 0;
	assert_int_equal(lmt_load_listen(probe, "127.0.0.1:0", &port), 0);
	lmt_session_free(probe);
	uint64_t none = 0, t0 = bench_now_ns();
	struct source_run r = migrate(&ram, "connect-timeout=500ms", port, 0, 0, &none);
	assert_int_equal(r.rc, -LMT_ECONN);
	assert_true(r.failed_at - t0 < 2000000000ull);
	assert_non_null(strstr(r.error, "connect to 127.0.0.1:"));
	assert_non_null(strstr(r.error, "refused"));
	struct census c1 = census();
	assert_int_equal(c1.fds, c0.fds);
	bench_ram_free_dirty(&ram);
	munmap(base, RAM_BYTES);
}

int main(void)
{
	if (getenv("LMT_TEST_PLUGIN"))
		plugin = getenv("LMT_TEST_PLUGIN");
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_destination_killed_mid_migration_fails_the_source),
		cmocka_unit_test(test_source_killed_mid_migration_fails_the_destination),
		cmocka_unit_test(test_cancel_from_another_thread_ends_both_sides),
		cmocka_unit_test(test_cancel_while_destination_waits_returns_promptly),
		cmocka_unit_test(test_unreachable_destination_fails_within_connect_timeout),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
