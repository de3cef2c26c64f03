/* verify=on is end to end: the destination's RAM as it is at the check is
 * compared with the source's at the pause, whoever wrote it. A third
 * party here is this process, which maps the destination's RAM (a memfd)
 * a second time and writes a byte through it: after the pages landed,
 * before the switchover, and from another thread during the pause. Each
 * fails the migration on both sides with the block and the bytes of the
 * first stripe that differs; a clean migration with a dirtying guest
 * passes, bit for bit. Over the plugin under test (LMT_TEST_PLUGIN). */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

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

#include "harness.h"

#define RAM_BYTES (32ull << 20)
#define RAM1_AT (24ull << 20) /* guest_ram_layout: ram0 is 3/4, ram1 the rest */
#define OPTS "verify=on"

/* A destination in a child process over a memfd, which this process maps
 * too: what it writes there the destination's guest holds. */
struct dest {
	pid_t pid;
	int result;    /* read end: the child's lmt_load_run result */
	uint8_t *view; /* this process's mapping of the destination's RAM */
	uint16_t port;
};

struct dest_result {
	int rc;
	char error[600];
};

static void dest_child(int memfd, int out, const char *opts)
{
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	struct guest_ram ram;
	uint8_t *base = mmap(NULL, RAM_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
	if (base == MAP_FAILED)
		_exit(2);
	guest_ram_layout(&ram, base, RAM_BYTES);
	lmt_session *s = session_with_blocks(LMT_ROLE_DESTINATION, &ram, opts);
	uint16_t port = 0;
	if (lmt_load_listen(s, "127.0.0.1:0", &port) || write(out, &port, 2) != 2)
		_exit(2);
	struct dest_result r = {.rc = lmt_load_run(s)};
	snprintf(r.error, sizeof(r.error), "%s", lmt_session_error(s)->message);
	lmt_session_free(s);
	_exit(write(out, &r, sizeof(r)) == sizeof(r) ? 0 : 2);
}

static void dest_start(struct dest *d, const char *opts)
{
	int memfd = memfd_create("lmt-verify-dest", MFD_CLOEXEC);
	assert_true(memfd >= 0);
	assert_int_equal(ftruncate(memfd, RAM_BYTES), 0);
	int fds[2];
	assert_int_equal(pipe(fds), 0);
	d->pid = fork();
	assert_true(d->pid >= 0);
	if (d->pid == 0) {
		close(fds[0]);
		dest_child(memfd, fds[1], opts);
	}
	close(fds[1]);
	d->result = fds[0];
	d->view = mmap(NULL, RAM_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
	assert_true(d->view != MAP_FAILED);
	close(memfd);
	assert_int_equal(read(d->result, &d->port, 2), 2);
}

/* The child's result, once it has ended. */
static struct dest_result dest_end(struct dest *d)
{
	struct dest_result r = {.rc = 1};
	if (read(d->result, &r, sizeof(r)) != sizeof(r))
		snprintf(r.error, sizeof(r.error), "the destination said nothing");
	close(d->result);
	assert_int_equal(dest_wait(d->pid), 0);
	return r;
}

static void iterate_until_ready(lmt_session *s)
{
	struct lmt_iterate_result it = {0};
	while (!it.ready)
		if (lmt_save_iterate(s, &it))
			fail_msg("iterate: %s", lmt_session_error(s)->message);
}

/* A byte of ram1 at `offset`, as the source does not have it. */
static void scribble(struct dest *d, const struct guest_ram *src, uint64_t offset)
{
	d->view[RAM1_AT + offset] = (uint8_t)(src->base[RAM1_AT + offset] ^ 0xa5);
}

/* Both sides failed on the byte of ram1 at `offset`, naming its stripe. */
static void refused_at(lmt_session *s, int rc, struct dest *d, uint64_t offset)
{
	char where[160];
	uint64_t from = offset / 65536 * 65536;
	snprintf(where, sizeof(where),
	         "verify: RAM block 'ram1' differs from the source's at bytes "
	         "%llu to %llu",
	         (unsigned long long)from, (unsigned long long)(from + 65535));
	const char *said = lmt_session_error(s)->message;
	print_message("    source: %s\n", said);
	if (rc != -LMT_EVERIFY || !strstr(said, where))
		fail_msg("complete: %s (%s), expected LMT_EVERIFY and '%s'", said, lmt_err_name(rc),
		         where);
	struct dest_result r = dest_end(d);
	if (r.rc != -LMT_EVERIFY || !strstr(r.error, where))
		fail_msg("destination: %s (%s), expected LMT_EVERIFY and '%s'", r.error,
		         lmt_err_name(r.rc), where);
}

/* The pages landed in the bulk pass; a byte written over one of them
 * after that is not the source's. The idle guest sends nothing more, so
 * nothing covers it up. */
static void test_a_byte_written_after_its_page_landed_fails_the_migration(void **state)
{
	struct guest_ram ram;
	ram_fill(&ram, RAM_BYTES, 51);
	struct dest d;
	dest_start(&d, OPTS);
	lmt_session *s = source_set_up(&ram, OPTS, d.port);
	iterate_until_ready(s);
	const uint64_t offset = (5ull << 20) + 4321;
	scribble(&d, &ram, offset);
	int rc = lmt_save_complete(s, "dev", 3);
	refused_at(s, rc, &d, offset);
	lmt_session_free(s);
	munmap(d.view, RAM_BYTES);
	ram_release(&ram);
}

struct writer {
	struct dest *d;
	const struct guest_ram *src;
	uint64_t offset;
	uint64_t after_ns;
	pthread_t thread;
};

static void *write_later(void *arg)
{
	struct writer *w = arg;
	struct timespec t = {.tv_sec = (time_t)(w->after_ns / 1000000000ull),
	                     .tv_nsec = (long)(w->after_ns % 1000000000ull)};
	nanosleep(&t, NULL);
	scribble(w->d, w->src, w->offset);
	return NULL;
}

/* The pause holds the guest while the source flushes: a flush that takes
 * a second (chaos.flush-delay) is a window in which another thread writes
 * the destination's RAM, after the last page of the migration landed and
 * before the check. */
static void test_a_write_during_the_pause_fails_the_migration(void **state)
{
	struct guest_ram ram;
	ram_fill(&ram, RAM_BYTES, 52);
	struct dest d;
	dest_start(&d, OPTS);
	char plugin[128];
	snprintf(plugin, sizeof(plugin), "%s%s",
	         strncmp(test_plugin(), "chaos:", 6) ? "chaos:" : "", test_plugin());
	lmt_session *s = source_set_up_on(&ram, plugin, OPTS ",chaos.flush-delay=1s", d.port);
	iterate_until_ready(s);
	struct writer w = {.d = &d, .src = &ram, .offset = 7ull << 20, .after_ns = 100000000ull};
	assert_int_equal(pthread_create(&w.thread, NULL, write_later, &w), 0);
	int rc = lmt_save_complete(s, "dev", 3);
	pthread_join(w.thread, NULL);
	refused_at(s, rc, &d, w.offset);
	lmt_session_free(s);
	munmap(d.view, RAM_BYTES);
	ram_release(&ram);
}

/* Nobody else writes: a dirtying guest's migration completes, and the
 * destination holds the source's RAM at the pause, bit for bit. */
static void test_a_clean_migration_of_a_dirtying_guest_passes(void **state)
{
	struct guest_ram ram;
	ram_fill(&ram, RAM_BYTES, 53);
	struct dest d;
	dest_start(&d, OPTS); /* forked before the guest's thread starts */
	struct guest_workload *w = NULL;
	assert_int_equal(guest_workload_start(&w, &ram, 8ull << 20, 32ull << 20, 9), 0);
	lmt_session *s = source_set_up(&ram, OPTS, d.port);
	iterate_until_ready(s);
	guest_workload_pause(w);
	if (lmt_save_complete(s, "dev", 3))
		fail_msg("complete: %s", lmt_session_error(s)->message);
	struct dest_result r = dest_end(&d);
	if (r.rc)
		fail_msg("destination: %s", r.error);
	assert_memory_equal(d.view, ram.base, RAM_BYTES);
	guest_workload_stop(w);
	lmt_session_free(s);
	munmap(d.view, RAM_BYTES);
	ram_release(&ram);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_a_byte_written_after_its_page_landed_fails_the_migration),
	        cmocka_unit_test(test_a_write_during_the_pause_fails_the_migration),
	        cmocka_unit_test(test_a_clean_migration_of_a_dirtying_guest_passes),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
