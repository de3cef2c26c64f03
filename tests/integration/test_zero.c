/* Zero pages in the passes after the bulk one: a guest that zeroes pages
 * it had filled (and sent) and fills others, some of them pages it zeroed
 * before, while the passes run. A page found all zero goes as a zero run
 * on the control connection, not as data; a write of the same page still
 * in flight (held and reordered by the chaos decorator in the second
 * case) must never land over the zero, nor the zero over a newer write
 * (a destination slow to apply zero runs, in the third: its log handler
 * takes 10 ms over each, on the thread that applies them).
 * The destination ends bit for bit the source's; zero pages are counted in
 * the passes after the first; the bytes sent are the data pages' alone,
 * and the zero runs took fewer bytes than the pages they stand for. Both
 * sides run in this process; the plugin under test is LMT_TEST_PLUGIN. */
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
#include <time.h>

#include "harness.h"

#define RAM_BYTES (8ull << 20)
/* The pages the guest changes, over and over: the first 256 KiB of ram0. */
#define CHANGED_PAGES 64u

struct dest_thread {
	lmt_session *s;
	int rc;
};

static void *run_dest(void *arg)
{
	struct dest_thread *d = arg;
	d->rc = lmt_load_run(d->s);
	return NULL;
}

static void mark_dirty(struct guest_ram *ram, uint64_t page)
{
	atomic_fetch_or_explicit(&ram->blocks[0].dirty[page / 64], 1ull << (page % 64),
	                         memory_order_release);
}

static bool page_zero(const uint8_t *p)
{
	for (uint32_t i = 0; i < GUEST_PAGE_SIZE; i++)
		if (p[i])
			return false;
	return true;
}

/* The guest: a thread that takes a page of the changed set every 100 us,
 * and zeroes it when it holds data, or fills it when it is zero (a page
 * zeroed before gets data again). */
struct guest {
	struct guest_ram *ram;
	uint64_t rng;
	_Atomic bool stop;
	uint64_t zeroed, filled;
	pthread_t thread;
};

static void *guest_run(void *arg)
{
	struct guest *g = arg;
	while (!atomic_load(&g->stop)) {
		uint64_t page = guest_random_below(&g->rng, CHANGED_PAGES);
		uint8_t *p = g->ram->blocks[0].host + page * GUEST_PAGE_SIZE;
		if (page_zero(p)) {
			for (uint32_t k = 0; k < GUEST_PAGE_SIZE; k += 8) {
				uint64_t v = guest_random(&g->rng) | 1;
				memcpy(p + k, &v, 8);
			}
			g->filled++;
		} else {
			memset(p, 0, GUEST_PAGE_SIZE);
			g->zeroed++;
		}
		mark_dirty(g->ram, page);
		struct timespec ts = {.tv_nsec = 100000};
		nanosleep(&ts, NULL);
	}
	return NULL;
}

static void quiet(void *opaque, enum lmt_log_level level, const char *msg)
{
}

/* A destination that takes its time over each ZERO before it applies it,
 * as a thread kept off its core would. */
static void slow_over_zero(void *opaque, enum lmt_log_level level, const char *msg)
{
	if (strstr(msg, "ZERO ")) {
		struct timespec ts = {.tv_nsec = 10000000};
		nanosleep(&ts, NULL);
	}
}

static void migrate_zeroing(const char *plugin, const char *opts, uint64_t seed, bool slow)
{
	struct guest_ram src, dst;
	ram_fill(&src, RAM_BYTES, seed);
	guest_ram_layout(&dst, ram_map(RAM_BYTES), RAM_BYTES);
	struct dest_thread d = {.s = session_on(LMT_ROLE_DESTINATION, &dst, plugin, opts)};
	if (slow) {
		lmt_set_log_handler(quiet, NULL);
		lmt_set_log_level(LMT_LOG_DEBUG);
		assert_int_equal(lmt_session_set_log_handler(d.s, slow_over_zero, NULL), 0);
	}
	uint16_t port = 0;
	assert_int_equal(lmt_load_listen(d.s, "127.0.0.1:0", &port), 0);
	pthread_t t;
	assert_int_equal(pthread_create(&t, NULL, run_dest, &d), 0);
	lmt_session *s = source_set_up_on(&src, plugin, opts, port);

	/* The bulk pass first, so that the pages zeroed were sent with data;
	 * then the guest changes pages between calls (1 ms of downtime keeps
	 * the passes going, each overlapping the writes of the last), goes
	 * quiet, and the migration ends once nothing is left. */
	struct lmt_iterate_result it = {0};
	int rc = 0;
	while (rc == 0 && it.pass < 2)
		rc = lmt_save_iterate(s, &it);
	struct guest g = {.ram = &src, .rng = seed};
	assert_int_equal(pthread_create(&g.thread, NULL, guest_run, &g), 0);
	uint64_t until = guest_now_ns() + 600000000ull;
	while (rc == 0 && (guest_now_ns() < until || it.pass < 4))
		rc = lmt_save_iterate(s, &it);
	atomic_store(&g.stop, true);
	pthread_join(g.thread, NULL);
	while (rc == 0 && it.remaining_bytes)
		rc = lmt_save_iterate(s, &it);
	if (rc == 0)
		rc = lmt_session_set_option(s, "downtime-limit", "1s");
	it.ready = 0;
	while (rc == 0 && !it.ready)
		rc = lmt_save_iterate(s, &it);
	if (rc == 0)
		rc = lmt_save_complete(s, "cpu", 3);
	if (rc)
		fail_msg("%s: %s", plugin, lmt_session_error(s)->message);
	pthread_join(t, NULL);
	if (slow) {
		lmt_set_log_level(LMT_LOG_ERROR);
		lmt_set_log_handler(NULL, NULL);
	}
	if (d.rc)
		fail_msg("%s: destination: %s", plugin, lmt_session_error(d.s)->message);
	for (uint64_t off = 0; off < RAM_BYTES; off += GUEST_PAGE_SIZE)
		if (memcmp(src.base + off, dst.base + off, GUEST_PAGE_SIZE) != 0)
			fail_msg("%s: page at %llu differs (%s here, %s on the destination)", plugin,
			         (unsigned long long)off, page_zero(src.base + off) ? "zero" : "data",
			         page_zero(dst.base + off) ? "zero" : "data");

	struct lmt_stats st, dt;
	lmt_session_stats(s, &st);
	lmt_session_stats(d.s, &dt);
	int n = lmt_session_passes(s, NULL, 0);
	struct lmt_pass_stats *passes = calloc((size_t)n, sizeof(*passes));
	assert_non_null(passes);
	assert_int_equal(lmt_session_passes(s, passes, (uint32_t)n), n);
	uint64_t later = 0;
	for (int i = 0; i < n; i++)
		if (passes[i].pass >= 2)
			later += passes[i].zero_pages;
	free(passes);
	print_message("    %s: %llu passes, guest zeroed %llu and filled %llu pages; %llu zero "
	              "pages after the bulk pass, %llu of them in zero runs (%llu bytes), "
	              "%llu pages as data (%llu bytes)\n",
	              plugin, (unsigned long long)st.passes, (unsigned long long)g.zeroed,
	              (unsigned long long)g.filled, (unsigned long long)later,
	              (unsigned long long)dt.zero_pages, (unsigned long long)st.zero_run_bytes,
	              (unsigned long long)st.normal_pages, (unsigned long long)st.bytes_sent);
	assert_true(st.passes >= 4);
	/* Zero pages counted in the passes after the bulk one, and applied by
	 * the destination from zero runs: the source's count of those bytes
	 * is the destination's. */
	assert_true(later > 0);
	assert_true(dt.zero_pages > 0);
	assert_true(dt.zero_pages <= later);
	assert_int_equal(dt.zero_run_bytes, st.zero_run_bytes);
	/* The bytes sent are the pages sent as data, and each zero page in a
	 * zero run took fewer bytes than its data would have. */
	assert_int_equal(st.bytes_sent, st.normal_pages * GUEST_PAGE_SIZE);
	assert_int_equal(dt.bytes_received, st.bytes_sent);
	assert_true(st.zero_run_bytes < dt.zero_pages * GUEST_PAGE_SIZE);
	lmt_session_free(s);
	lmt_session_free(d.s);
	ram_release(&src);
	munmap(dst.base, dst.bytes);
}

static void test_zeroed_pages_go_as_zero_runs(void **state)
{
	migrate_zeroing(test_plugin(), "channels=2,chunk-size=16K,downtime-limit=1ms,verify=on",
	                71, false);
}

/* Writes held for up to 200 ms and completed out of order: a write of a
 * page is often still in flight when the guest has zeroed it, and a zero
 * run not yet answered when it has filled it again. */
static void test_zero_runs_keep_order_with_writes_in_flight(void **state)
{
	char plugin[96];
	snprintf(plugin, sizeof(plugin), "chaos:%s", test_plugin());
	for (unsigned round = 0; round < 2; round++) {
		char opts[256];
		snprintf(opts, sizeof(opts),
		         "channels=2,chunk-size=16K,queue-depth=16,chaos.hold=200ms,chaos.delay=2ms,"
		         "chaos.reorder=on,chaos.seed=%u,downtime-limit=1ms,verify=on",
		         7919 + round);
		migrate_zeroing(plugin, opts, 91 + round, false);
	}
}

/* The destination applies zero runs late, while the writes after them
 * land at once: the source has ZERO messages unanswered at the limit and
 * waits for answers on the control connection, and a page filled again
 * after its zero run was sent must not be written before that run was
 * answered. A switchover counted at 1 MB/s keeps every pass short of
 * ready, so that none drains (and waits for the answers) before the next
 * begins. */
static void test_zero_runs_keep_order_with_a_slow_destination(void **state)
{
	migrate_zeroing(test_plugin(),
	                "channels=2,chunk-size=16K,downtime-limit=1ms,switchover-bandwidth=1M,"
	                "verify=on",
	                113, true);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_zeroed_pages_go_as_zero_runs),
	        cmocka_unit_test(test_zero_runs_keep_order_with_writes_in_flight),
	        cmocka_unit_test(test_zero_runs_keep_order_with_a_slow_destination),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
