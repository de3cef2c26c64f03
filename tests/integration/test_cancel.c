/* How soon lmt_cancel ends a destination's load that waits for the source's
 * data channels: the source (a child process) connects its control
 * connection and its first channel and then stops (SIGSTOP), so that the
 * destination waits in ep_connect; lmt_cancel from another thread must then
 * end lmt_load_run within a bound that no loaded host reaches (500 ms; a
 * prompt cancel takes milliseconds), leaving no descriptor or thread. The
 * plugin under test (LMT_TEST_PLUGIN) is measured next to the tcp plugin in
 * the same run, and both delays are printed. */
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

#define RAM_BYTES (16ull << 20)
#define MS 1000000ull
#define CANCEL_BOUND_NS (500 * MS)
/* Both sides wait far longer than the test lasts unless cancelled. */
#define OPTIONS "channels=2,connect-timeout=30s,idle-timeout=30s"

/* A session over `plugin` on `ram`; LMT_TEST_OPTIONS belong to the plugin
 * under test only, not to the tcp plugin measured beside it. */
static lmt_session *new_session(enum lmt_role role, struct guest_ram *ram, const char *plugin,
                                bool under_test, const char *opts)
{
	struct lmt_error err = {0};
	lmt_session *s = NULL;
	const char *extra = under_test ? getenv("LMT_TEST_OPTIONS") : NULL;
	if (lmt_session_new(&s, role, plugin, opts, &err))
		fail_msg("session over %s with '%s': %s", plugin, opts, err.message);
	if (extra && *extra && lmt_session_set_options(s, extra))
		fail_msg("LMT_TEST_OPTIONS '%s': %s", extra, lmt_session_error(s)->message);
	for (uint32_t i = 0; i < ram->nblocks; i++)
		assert_int_equal(lmt_session_add_block(s, ram->blocks[i].name, ram->blocks[i].host,
		                                       ram->blocks[i].length, GUEST_PAGE_SIZE),
		                 0);
	return s;
}

struct load {
	lmt_session *session;
	int rc;
	uint64_t returned_ns;
};

static void *run_load(void *arg)
{
	struct load *l = arg;
	l->rc = lmt_load_run(l->session);
	l->returned_ns = guest_now_ns();
	return NULL;
}

/* The source: sets up over `plugin` wrapped in the chaos decorator, which
 * stops this process once its first channel's ep_connect returned. */
static _Noreturn void source_child(const char *plugin, bool under_test, uint16_t port)
{
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	struct guest_ram ram;
	ram_fill(&ram, RAM_BYTES, 3);
	char name[64];
	snprintf(name, sizeof(name), "chaos:%s", plugin);
	lmt_session *s = new_session(LMT_ROLE_SOURCE, &ram, name, under_test,
	                             OPTIONS ",chaos.fault=stop,chaos.at=connect");
	char uri[64];
	snprintf(uri, sizeof(uri), "127.0.0.1:%u", port);
	int rc = lmt_session_set_dirty_sync(s, guest_dirty_sync, &ram);
	if (rc == 0)
		rc = lmt_save_setup(s, uri);
	lmt_session_free(s);
	_exit(rc == 0 ? 0 : 1);
}

static bool child_stopped(pid_t pid)
{
	siginfo_t info = {0};
	return waitid(P_PID, (id_t)pid, &info, WSTOPPED | WNOHANG | WNOWAIT) == 0 &&
	       info.si_pid == pid && info.si_code == CLD_STOPPED;
}

static void nap_ms(unsigned ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
	nanosleep(&ts, NULL);
}

/* The delay from lmt_cancel to lmt_load_run's return over `plugin`. */
static uint64_t cancel_delay(const char *plugin, bool under_test)
{
	struct census before = census_take();
	struct guest_ram ram;
	guest_ram_layout(&ram, ram_map(RAM_BYTES), RAM_BYTES);
	struct load l = {
	        .session = new_session(LMT_ROLE_DESTINATION, &ram, plugin, under_test, OPTIONS)};
	uint16_t port = 0;
	assert_int_equal(lmt_load_listen(l.session, "127.0.0.1:0", &port), 0);
	fflush(NULL);
	pid_t child = fork();
	assert_true(child >= 0);
	if (child == 0)
		source_child(plugin, under_test, port);
	pthread_t t;
	assert_int_equal(pthread_create(&t, NULL, run_load, &l), 0);
	/* The source stops once it connected its first channel; the
	 * destination then waits for the second. */
	uint64_t deadline = guest_now_ns() + 20000 * MS;
	while (!child_stopped(child) && guest_now_ns() < deadline)
		nap_ms(2);
	assert_true(child_stopped(child));
	nap_ms(300);
	uint64_t cancelled = guest_now_ns();
	lmt_cancel(l.session);
	pthread_join(t, NULL);
	uint64_t delay = l.returned_ns - cancelled;
	if (l.rc != -LMT_ECANCELED)
		fail_msg("%s: the cancelled load returned %s: %s", plugin, lmt_err_name(l.rc),
		         lmt_session_error(l.session)->message);
	lmt_session_free(l.session);
	kill(child, SIGKILL);
	int status;
	assert_int_equal(waitpid(child, &status, 0), child);
	munmap(ram.base, RAM_BYTES);
	census_check(before);
	return delay;
}

static void test_a_destination_waiting_for_channels_returns_promptly_when_cancelled(void **state)
{
	(void)state;
	uint64_t yardstick = cancel_delay("tcp", false);
	uint64_t delay = cancel_delay(test_plugin(), true);
	print_message("    lmt_cancel to lmt_load_run's return: %.1f ms over %s, %.1f ms over tcp\n",
	              (double)delay / MS, test_plugin(), (double)yardstick / MS);
	if (delay > CANCEL_BOUND_NS)
		fail_msg("%s: lmt_load_run returned %.1f ms after lmt_cancel (bound %llu ms)",
		         test_plugin(), (double)delay / MS,
		         (unsigned long long)(CANCEL_BOUND_NS / MS));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(
	                test_a_destination_waiting_for_channels_returns_promptly_when_cancelled),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
