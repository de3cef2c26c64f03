/* Auto-converge: a guest that dirties faster than the link never gets
 * ready on its own; with auto-converge=on the source asks the VMM for a
 * throttle that follows the documented rule pass by pass (docs/engine.md),
 * the migration completes, and the VMM is told once, at the end, to let
 * its vCPUs run. The options and the callback are checked at setup, and a
 * failed migration releases the throttle too.
 *
 * The guest is simulated where it counts, in its dirty log: between two
 * syncs it has rewritten its whole working set, less the share of the time
 * its vCPUs were held. That is what a guest much faster than the link
 * does, and it does not depend on how busy the host running the test is,
 * as a real writer thread would. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "harness.h"

#define RAM_BYTES (32ull << 20)
#define WORKING_SET (16ull << 20)
/* 16 MiB dirty at 32 MiB/s is 500 ms of expected downtime, over the 300 ms
 * limit: without a throttle the guest never gets ready. */
#define FAST_GUEST "max-bandwidth=32M,auto-converge=on,throttle-initial=30,throttle-increment=20"
#define MAX_CALLS 64

/* The simulated guest, and what the VMM was asked, in order. */
struct throttle_log {
	pthread_mutex_t lock;
	uint32_t calls[MAX_CALLS];
	int n;
	uint32_t percent; /* the throttle in force */
};

static void throttle(void *opaque, uint32_t percent)
{
	struct throttle_log *log = opaque;
	pthread_mutex_lock(&log->lock);
	if (log->n < MAX_CALLS)
		log->calls[log->n++] = percent;
	log->percent = percent;
	pthread_mutex_unlock(&log->lock);
}

/* lmt_dirty_sync_fn: the first pages of the working set, as many as the
 * vCPUs rewrote while they were let run. */
static int dirty_log(void *opaque, uint32_t block, uint64_t *bitmap, uint64_t npages)
{
	struct throttle_log *log = opaque;
	if (block != 0)
		return 0;
	pthread_mutex_lock(&log->lock);
	uint64_t pages = WORKING_SET / GUEST_PAGE_SIZE * (100 - log->percent) / 100;
	pthread_mutex_unlock(&log->lock);
	for (uint64_t p = 0; p < pages && p < npages; p++)
		bitmap[p / 64] |= UINT64_C(1) << (p % 64);
	return 0;
}

static lmt_session *throttled_source(struct guest_ram *ram, const char *opts,
                                     struct throttle_log *log)
{
	lmt_session *s = session_with_blocks(LMT_ROLE_SOURCE, ram, opts);
	assert_int_equal(lmt_session_set_dirty_sync(s, dirty_log, log), 0);
	assert_int_equal(lmt_session_set_throttle(s, throttle, log), 0);
	return s;
}

/* A destination child, and a source with `opts` set up to it. */
static lmt_session *migration(struct guest_ram *ram, uint64_t seed, const char *opts,
                              struct throttle_log *log, pid_t *pid)
{
	ram_fill(ram, RAM_BYTES, seed);
	struct dest_spec spec = {.ram_bytes = RAM_BYTES, .options = ""};
	uint16_t port;
	*pid = dest_spawn(&spec, &port);
	lmt_session *s = throttled_source(ram, opts, log);
	char uri[64];
	snprintf(uri, sizeof(uri), "127.0.0.1:%u", port);
	if (lmt_save_setup(s, uri))
		fail_msg("setup: %s", lmt_session_error(s)->message);
	return s;
}

/* The rule, replayed over the passes as recorded: each pass ran under the
 * throttle the passes before it called for. Returns the throttles asked
 * for, in order, in `asked` (their number). */
static int replay_rule(const struct lmt_pass_stats *p, int n, uint32_t *asked)
{
	uint32_t percent = 0, slow = 0;
	int nasked = 0;
	int last = n - 1;
	while (last >= 0 && p[last].final)
		last--;
	for (int i = 0; i <= last; i++) {
		if (p[i].throttle_percent != percent)
			fail_msg("pass %u ran under a %u%% throttle, the rule gives %u%%", p[i].pass,
			         p[i].throttle_percent, percent);
		if (i == last)
			break; /* the pass that got ready: the rule is not applied */
		if (p[i].dirtied_bytes * 100 <= p[i].bytes * 50) {
			slow = 0;
			continue;
		}
		slow++;
		if (!percent && slow < 2)
			continue;
		uint32_t next = percent ? percent + 20 : 30;
		next = next > 99 ? 99 : next;
		if (next != percent)
			asked[nasked++] = next;
		percent = next;
	}
	return nasked;
}

static void test_a_guest_faster_than_the_link_converges_under_the_throttle(void **state)
{
	struct guest_ram ram;
	struct throttle_log log = {.lock = PTHREAD_MUTEX_INITIALIZER};
	pid_t pid;
	lmt_session *s = migration(&ram, 31, FAST_GUEST, &log, &pid);
	struct lmt_iterate_result it = {0};
	while (!it.ready)
		if (lmt_save_iterate(s, &it))
			fail_msg("iterate: %s", lmt_session_error(s)->message);
	if (lmt_save_complete(s, NULL, 0))
		fail_msg("complete: %s", lmt_session_error(s)->message);
	assert_int_equal(dest_wait(pid), 0);

	struct lmt_pass_stats passes[64];
	int n = lmt_session_passes(s, passes, 64);
	assert_true(n >= 2 && n <= 64);
	for (int i = 0; i < n; i++)
		print_message("    pass %u: %llu KiB sent, %llu KiB dirtied, %u%% throttle%s\n",
		              passes[i].pass, (unsigned long long)passes[i].bytes >> 10,
		              (unsigned long long)passes[i].dirtied_bytes >> 10,
		              passes[i].throttle_percent, passes[i].final ? " (final)" : "");
	uint32_t asked[64];
	int nasked = replay_rule(passes, n, asked);
	struct lmt_stats st;
	assert_int_equal(lmt_session_stats(s, &st), 0);
	assert_int_equal(st.throttle_percent, 0);
	/* Asked as the rule says, then released once. */
	pthread_mutex_lock(&log.lock);
	print_message("    %d passes, throttle asked %d times, last %u%%\n", n, log.n,
	              log.n > 1 ? log.calls[log.n - 2] : 0);
	if (log.n != nasked + (nasked ? 1 : 0))
		fail_msg("the VMM was called %d times; the rule asked %d throttles and a release",
		         log.n, nasked);
	for (int i = 0; i < nasked; i++)
		assert_int_equal(log.calls[i], asked[i]);
	if (nasked)
		assert_int_equal(log.calls[nasked], 0);
	pthread_mutex_unlock(&log.lock);
	lmt_session_free(s);
	/* Freeing a completed session asks nothing more. */
	assert_int_equal(log.n, nasked + (nasked ? 1 : 0));
	/* 16 MiB at 32 MiB/s is over the 300 ms limit: only the throttle got
	 * the guest ready. */
	assert_true(nasked > 0);
	ram_release(&ram);
}

static void test_a_cancelled_migration_releases_the_throttle(void **state)
{
	struct guest_ram ram;
	struct throttle_log log = {.lock = PTHREAD_MUTEX_INITIALIZER};
	pid_t pid;
	/* Throttling from the first slow passes on, and never enough. */
	lmt_session *s = migration(
	        &ram, 32, "max-bandwidth=32M,auto-converge=on,throttle-initial=5,throttle-max=5",
	        &log, &pid);
	struct lmt_iterate_result it = {0};
	int rc = 0;
	for (;;) {
		pthread_mutex_lock(&log.lock);
		int asked = log.n;
		pthread_mutex_unlock(&log.lock);
		if (asked)
			lmt_cancel(s);
		if ((rc = lmt_save_iterate(s, &it)))
			break;
		if (it.ready)
			fail_msg("a guest rewriting 16 MiB per pass over 32 MiB/s got ready under a "
			         "5%% throttle");
	}
	assert_int_equal(rc, -LMT_ECANCELED);
	pthread_mutex_lock(&log.lock);
	assert_int_equal(log.n, 2);
	assert_int_equal(log.calls[0], 5);
	assert_int_equal(log.calls[1], 0);
	pthread_mutex_unlock(&log.lock);
	struct lmt_stats st;
	assert_int_equal(lmt_session_stats(s, &st), 0);
	assert_int_equal(st.throttle_percent, 0);
	lmt_session_free(s);
	assert_int_equal(log.n, 2);
	dest_wait(pid);
	ram_release(&ram);
}

static void setup_fails_with(lmt_session *s, const char *text)
{
	assert_int_equal(lmt_save_setup(s, "127.0.0.1:9"), -LMT_EINVAL);
	const char *said = lmt_session_error(s)->message;
	if (!strstr(said, text))
		fail_msg("setup said '%s', expected '%s'", said, text);
}

static void test_options_and_callback_are_checked_before_setup(void **state)
{
	struct guest_ram ram;
	ram_fill(&ram, 1 << 20, 33);
	struct throttle_log log = {.lock = PTHREAD_MUTEX_INITIALIZER};

	lmt_session *s = session_with_blocks(LMT_ROLE_SOURCE, &ram, "auto-converge=on");
	assert_int_equal(lmt_session_set_dirty_sync(s, guest_dirty_sync, &ram), 0);
	setup_fails_with(s, "auto-converge=on needs a throttle callback");
	lmt_session_free(s);

	s = throttled_source(&ram, "auto-converge=on,throttle-initial=60,throttle-max=50", &log);
	setup_fails_with(s, "throttle-initial (60%) is above throttle-max (50%)");
	assert_int_equal(lmt_session_set_throttle(s, NULL, NULL), -LMT_EINVAL);
	lmt_session_free(s);
	assert_int_equal(log.n, 0);

	struct lmt_error err = {0};
	assert_int_equal(lmt_session_new(&s, LMT_ROLE_SOURCE, "tcp", "throttle-max=100", &err),
	                 -LMT_EINVAL);
	if (!strstr(err.message, "throttle-max"))
		fail_msg("'%s' does not name throttle-max", err.message);

	s = session_with_blocks(LMT_ROLE_DESTINATION, &ram, "");
	assert_int_equal(lmt_session_set_throttle(s, throttle, &log), -LMT_ESTATE);
	lmt_session_free(s);
	assert_int_equal(lmt_session_set_throttle(NULL, throttle, &log), -LMT_EINVAL);
	ram_release(&ram);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_options_and_callback_are_checked_before_setup),
	        cmocka_unit_test(test_a_guest_faster_than_the_link_converges_under_the_throttle),
	        cmocka_unit_test(test_a_cancelled_migration_releases_the_throttle),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
