/* Ordering under stress: completions delayed and reordered by the chaos
 * decorator while the guest keeps rewriting the same few pages, over 1, 2
 * and 4 channels. A newer copy of a page must never be overwritten by an
 * older one still in flight (the write-after-write hazard of QEMU's RDMA
 * migration): the destination is bit-exact at the end. Both sides run in
 * this process; the plugin under test is LMT_TEST_PLUGIN. */
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

#include "harness.h"

#define RAM_BYTES (8ull << 20)

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

static void migrate_under_stress(unsigned channels, unsigned round)
{
	char plugin[96], opts[256];
	snprintf(plugin, sizeof(plugin), "chaos:%s", test_plugin());
	snprintf(opts, sizeof(opts),
	         "channels=%u,chunk-size=16K,queue-depth=16,chaos.hold=20ms,chaos.delay=2ms,"
	         "chaos.reorder=on,"
	         "chaos.seed=%u,downtime-limit=1ms,verify=on",
	         channels, channels * 7919 + round);
	struct guest_ram src, dst;
	ram_fill(&src, RAM_BYTES, channels * 31 + round);
	guest_ram_layout(&dst, ram_map(RAM_BYTES), RAM_BYTES);
	struct guest_workload *w = NULL;
	/* 64 pages rewritten over and over, while older copies are in flight. */
	assert_int_equal(guest_workload_start(&w, &src, 256u << 10, 64u << 20, channels), 0);

	struct dest_thread d = {.s = session_on(LMT_ROLE_DESTINATION, &dst, plugin, opts)};
	uint16_t port = 0;
	assert_int_equal(lmt_load_listen(d.s, "127.0.0.1:0", &port), 0);
	pthread_t t;
	assert_int_equal(pthread_create(&t, NULL, run_dest, &d), 0);

	lmt_session *s = session_on(LMT_ROLE_SOURCE, &src, plugin, opts);
	assert_int_equal(lmt_session_set_dirty_sync(s, guest_dirty_sync, &src), 0);
	char uri[64];
	snprintf(uri, sizeof(uri), "127.0.0.1:%u", port);
	int rc = lmt_save_setup(s, uri);
	struct lmt_iterate_result it = {0};
	/* Iterate while the guest rewrites its pages, ready or not (1 ms of
	 * downtime keeps each pass from draining before the next starts, so
	 * that writes of a page overlap); then let it go quiet, so that a page
	 * an older write clobbered is not saved by being dirtied again before
	 * the end, and go on until nothing is left to send and three passes
	 * began, however slowly a busy host ran the first; only then allow a
	 * pause that checks all of the RAM (verify=on), longer than 1 ms. */
	uint64_t until = guest_now_ns() + 700000000ull;
	while (rc == 0 && guest_now_ns() < until)
		rc = lmt_save_iterate(s, &it);
	guest_workload_pause(w);
	while (rc == 0 && (it.remaining_bytes || it.pass < 3))
		rc = lmt_save_iterate(s, &it);
	if (rc == 0)
		rc = lmt_session_set_option(s, "downtime-limit", "1s");
	it.ready = 0;
	while (rc == 0 && !it.ready)
		rc = lmt_save_iterate(s, &it);
	if (rc == 0)
		rc = lmt_save_complete(s, "cpu", 3);
	if (rc)
		fail_msg("%u channels: %s", channels, lmt_session_error(s)->message);
	struct lmt_stats st;
	lmt_session_stats(s, &st);
	pthread_join(t, NULL);
	assert_int_equal(d.rc, 0);
	for (uint64_t off = 0; off < RAM_BYTES; off += GUEST_PAGE_SIZE)
		if (memcmp(src.base + off, dst.base + off, GUEST_PAGE_SIZE) != 0)
			fail_msg("%u channels: page at %llu differs after %llu passes", channels,
			         (unsigned long long)off, (unsigned long long)st.passes);
	print_message(
	        "    %u channels, round %u: %llu passes, %llu writes, %llu bytes, bit-exact\n",
	        channels, round, (unsigned long long)st.passes, (unsigned long long)st.writes,
	        (unsigned long long)st.bytes_sent);
	assert_true(st.passes >= 3);
	lmt_session_free(s);
	lmt_session_free(d.s);
	guest_workload_stop(w);
	ram_release(&src);
	ram_release(&dst);
}

/* Three rounds with other seeds: a broken overlap rule shows in most. */
static void test_one_channel_is_bit_exact(void **state)
{
	for (unsigned round = 0; round < 3; round++)
		migrate_under_stress(1, round);
}

static void test_two_channels_are_bit_exact(void **state)
{
	for (unsigned round = 0; round < 3; round++)
		migrate_under_stress(2, round);
}

static void test_four_channels_are_bit_exact(void **state)
{
	for (unsigned round = 0; round < 3; round++)
		migrate_under_stress(4, round);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_one_channel_is_bit_exact),
	        cmocka_unit_test(test_two_channels_are_bit_exact),
	        cmocka_unit_test(test_four_channels_are_bit_exact),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
