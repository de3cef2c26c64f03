/* Engine behaviour between two processes: the iterate time budget, the
 * convergence rule, the bandwidth limit, statistics, verify, the device
 * state, and mismatches named on the source. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define RAM_BYTES (32ull << 20)
#define MS 1000000ull

static const struct dest_spec plain_dest = {.ram_bytes = RAM_BYTES, .options = ""};

static void test_iterate_returns_within_its_budget(void **state)
{
	struct guest_ram ram;
	ram_fill(&ram, RAM_BYTES, 1);
	const char *opts = "max-bandwidth=64M,max-iterate-ms=20ms";
	struct source_run r = migrate_to_child(&ram, opts);
	/* 32M at 64M/s is about 500 ms: many calls, each near 20 ms. */
	assert_true(r.iterations >= 10);
	if (r.median_iterate_ns > 40 * MS || r.max_iterate_ns > 500 * MS)
		fail_msg("iterate took %llu ms (median) and %llu ms (max) for a 20 ms budget",
		         (unsigned long long)(r.median_iterate_ns / MS),
		         (unsigned long long)(r.max_iterate_ns / MS));
	ram_release(&ram);
}

/* A destination that registers each window slowly (100 ms, as pinning a
 * large region can) holds up no iterate call: the source asks for keys
 * ahead of the walk and waits for an answer only within a call's budget.
 * One request here covers 8 windows, 800 ms of registration, which a call
 * that waited for its answer would have spent whole. */
static void test_a_slow_registration_holds_up_no_iterate_call(void **state)
{
	struct guest_ram ram;
	ram_fill(&ram, RAM_BYTES, 5);
	/* Both sides over chaos, wrapping the plugin under test. */
	const char *was = getenv("LMT_TEST_PLUGIN");
	char *saved = was ? strdup(was) : NULL;
	char *plugin = NULL;
	assert_true(!was || saved);
	assert_true(asprintf(&plugin, "%s%s", strncmp(test_plugin(), "chaos:", 6) ? "chaos:" : "",
	                     test_plugin()) > 0);
	setenv("LMT_TEST_PLUGIN", plugin, 1);
	struct source_run r =
	        migrate_to_child(&ram, "chunk-size=4M,max-iterate-ms=20ms,chaos.register-delay=100ms");
	if (saved)
		setenv("LMT_TEST_PLUGIN", saved, 1);
	else
		unsetenv("LMT_TEST_PLUGIN");
	free(saved);
	free(plugin);
	assert_true(r.iterations >= 10);
	if (r.max_iterate_ns > 400 * MS)
		fail_msg("an iterate call took %llu ms for a 20 ms budget while the destination "
		         "registered",
		         (unsigned long long)(r.max_iterate_ns / MS));
	ram_release(&ram);
}

static void test_bandwidth_limit_is_honoured(void **state)
{
	struct guest_ram ram;
	ram_fill(&ram, RAM_BYTES, 2);
	const char *opts = "max-bandwidth=64M";
	struct source_run r = migrate_to_child(&ram, opts);
	/* Everything but the stop-and-copy pass is under the limit. */
	double floor_ns = (double)r.stats.bytes_sent / (64.0 * 1048576.0) * 1e9 * 0.9;
	if ((double)r.stats.total_ns < floor_ns)
		fail_msg("%llu bytes in %llu ms: faster than 64M/s",
		         (unsigned long long)r.stats.bytes_sent,
		         (unsigned long long)(r.stats.total_ns / MS));
	ram_release(&ram);
}

static void test_idle_guest_is_ready_after_the_bulk_pass(void **state)
{
	struct guest_ram ram;
	guest_ram_layout(&ram, ram_map(RAM_BYTES), RAM_BYTES);
	uint64_t zero = guest_ram_fill(&ram, 0.25, 3);
	assert_int_equal(guest_ram_alloc_dirty(&ram), 0);
	uint16_t port;
	pid_t pid = dest_spawn(&plain_dest, &port);
	uint64_t none = 0;
	struct source_run r = source_migrate(&ram, "", port, NULL, 0, 0, 0, &none);
	assert_int_equal(r.rc, 0);
	assert_int_equal(dest_wait(pid), 0);
	assert_int_equal(r.stats.status, LMT_STATUS_COMPLETED);
	assert_int_equal(r.stats.passes, 2); /* the bulk pass and an empty final one */
	assert_int_equal(r.stats.zero_pages, zero);
	assert_int_equal(r.stats.normal_pages, RAM_BYTES / GUEST_PAGE_SIZE - zero);
	assert_int_equal(r.stats.bytes_sent, RAM_BYTES - zero * GUEST_PAGE_SIZE);
	assert_int_equal(r.stats.remaining_bytes, 0);
	assert_true(r.stats.downtime_ns < 300 * MS);
	assert_true(r.stats.downtime_ns <= r.stats.total_ns);
	assert_true(r.stats.setup_ns <= r.stats.total_ns);
	assert_int_equal(r.stats.channel_bytes[0], r.stats.bytes_sent);
	assert_int_equal(r.npasses, 2);
	assert_int_equal(r.passes[0].pass, 1);
	assert_false(r.passes[0].final);
	assert_int_equal(r.passes[0].bytes, r.stats.bytes_sent);
	assert_int_equal(r.passes[0].dirtied_bytes, 0);
	assert_int_equal(r.passes[1].pass, 2);
	assert_true(r.passes[1].final);
	assert_int_equal(r.passes[1].bytes, 0);
	assert_true(r.passes[1].start_ns >= r.passes[0].start_ns + r.passes[0].duration_ns);
	ram_release(&ram);
}

static void test_dirtying_guest_records_every_pass(void **state)
{
	struct guest_ram ram;
	ram_fill(&ram, RAM_BYTES, 8);
	struct guest_workload *w = NULL;
	assert_int_equal(guest_workload_start(&w, &ram, 8u << 20, 256u << 20, 9), 0);
	uint16_t port;
	pid_t pid = dest_spawn(&plain_dest, &port);
	uint64_t none = 0;
	/* A tight limit forces passes until the dirty set fits. */
	struct source_run r =
	        source_migrate(&ram, "downtime-limit=2ms", port, NULL, 0, 0, 0, &none);
	guest_workload_stop(w);
	assert_int_equal(r.rc, 0);
	assert_int_equal(dest_wait(pid), 0);
	assert_true(r.npasses >= 3);
	assert_int_equal((uint64_t)r.npasses, r.stats.passes);
	uint64_t bytes = 0;
	for (int i = 0; i < r.npasses; i++) {
		assert_int_equal(r.passes[i].pass, (uint32_t)i + 1);
		assert_int_equal(r.passes[i].final, i == r.npasses - 1);
		bytes += r.passes[i].bytes;
	}
	assert_true(r.passes[0].dirtied_bytes > 0);
	assert_int_equal(bytes, r.stats.bytes_sent);
	ram_release(&ram);
}

static void test_stats_json_carries_every_figure(void **state)
{
	struct lmt_stats st = {.status = LMT_STATUS_COMPLETED,
	                       .channels = 2,
	                       .bytes_sent = 123,
	                       .channel_bytes = {100, 23}};
	char buf[2048];
	int n = lmt_stats_json(&st, buf, sizeof(buf));
	assert_true(n > 0 && (size_t)n < sizeof(buf));
	const char *keys[] = {"\"status\":\"completed\"",
	                      "\"setup_ms\":",
	                      "\"total_ms\":",
	                      "\"downtime_ms\":",
	                      "\"expected_downtime_ms\":",
	                      "\"ram_bytes\":",
	                      "\"bytes_sent\":123",
	                      "\"remaining_bytes\":",
	                      "\"zero_pages\":",
	                      "\"normal_pages\":",
	                      "\"writes\":",
	                      "\"passes\":",
	                      "\"dirty_rate_bps\":",
	                      "\"throughput_bps\":",
	                      "\"bandwidth_bps\":",
	                      "\"channels\":2",
	                      "\"channel_bytes\":[100,23]"};
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
		if (!strstr(buf, keys[i]))
			fail_msg("%s lacks %s", buf, keys[i]);
	assert_int_equal(lmt_stats_json(&st, NULL, 0), n);
}

/* A page the source skips as zero holds garbage on this destination. */
static void scribble(struct guest_ram *ram)
{
	memset(ram->blocks[1].host + 8192, 0xee, 100);
}

static void test_verify_catches_a_destination_that_differs(void **state)
{
	struct guest_ram ram;
	guest_ram_layout(&ram, ram_map(RAM_BYTES), RAM_BYTES);
	assert_int_equal(guest_ram_alloc_dirty(&ram), 0); /* all zero: every page skipped */
	struct dest_spec spec = {
	        .ram_bytes = RAM_BYTES, .options = "verify=on", .prepare = scribble};
	uint16_t port;
	pid_t pid = dest_spawn(&spec, &port);
	uint64_t none = 0;
	struct source_run r = source_migrate(&ram, "verify=on", port, NULL, 0, 0, 0, &none);
	assert_int_equal(r.rc, -LMT_EVERIFY);
	assert_non_null(strstr(r.error, "verify: RAM block 'ram1' differs"));
	assert_int_equal(dest_wait(pid), 1);
	ram_release(&ram);
}

static uint8_t big_state[3u << 20];

static int check_big_state(const void *data, size_t length)
{
	return length != sizeof(big_state) || memcmp(data, big_state, length) != 0;
}

static void test_device_state_arrives_intact(void **state)
{
	for (size_t i = 0; i < sizeof(big_state); i++)
		big_state[i] = (uint8_t)(i * 131 + (i >> 12));
	struct guest_ram ram;
	ram_fill(&ram, RAM_BYTES, 4);
	struct dest_spec spec = {
	        .ram_bytes = RAM_BYTES, .options = "", .check_state = check_big_state};
	uint16_t port;
	pid_t pid = dest_spawn(&spec, &port);
	uint64_t none = 0;
	struct source_run r =
	        source_migrate(&ram, "", port, big_state, sizeof(big_state), 0, 0, &none);
	assert_int_equal(r.rc, 0);
	assert_int_equal(dest_wait(pid), 0);
	ram_release(&ram);
}

static void test_block_size_mismatch_is_named_on_the_source(void **state)
{
	struct guest_ram ram;
	ram_fill(&ram, RAM_BYTES, 5);
	struct dest_spec spec = {.ram_bytes = RAM_BYTES * 2, .options = ""};
	uint16_t port;
	pid_t pid = dest_spawn(&spec, &port);
	uint64_t none = 0;
	struct source_run r = source_migrate(&ram, "", port, NULL, 0, 0, 0, &none);
	assert_int_equal(r.rc, -LMT_EMISMATCH);
	assert_non_null(strstr(r.error, "the destination refused: RAM block 'ram0': 25165824 "
	                                "bytes on the source, 50331648 on the destination"));
	assert_int_equal(dest_wait(pid), 1);
	ram_release(&ram);
}

static void test_option_mismatch_is_named_on_the_source(void **state)
{
	struct guest_ram ram;
	ram_fill(&ram, RAM_BYTES, 6);
	uint16_t port;
	pid_t pid = dest_spawn(&plain_dest, &port);
	uint64_t none = 0;
	struct source_run r = source_migrate(&ram, "chunk-size=64K", port, NULL, 0, 0, 0, &none);
	assert_int_equal(r.rc, -LMT_EMISMATCH);
	assert_string_equal(r.error, "the destination refused: chunk-size: the source has 64K, "
	                             "the destination has 1M");
	assert_int_equal(dest_wait(pid), 1);
	ram_release(&ram);
}

static void test_calls_out_of_order_are_refused(void **state)
{
	struct guest_ram ram;
	ram_fill(&ram, 1u << 20, 7);
	lmt_session *s = session_with_blocks(LMT_ROLE_SOURCE, &ram, "");
	struct lmt_iterate_result it;
	assert_int_equal(lmt_save_iterate(s, &it), -LMT_ESTATE);
	assert_int_equal(lmt_save_complete(s, NULL, 0), -LMT_ESTATE);
	assert_int_equal(lmt_load_run(s), -LMT_ESTATE);
	assert_string_equal(lmt_session_error(s)->message, "load run: this session is a source");
	assert_int_equal(lmt_save_setup(s, "127.0.0.1:1"), -LMT_EINVAL);
	assert_string_equal(lmt_session_error(s)->message,
	                    "save setup: no dirty-sync callback: set it before setup");
	/* Refused before it started: the session is as it was. */
	struct lmt_stats st;
	assert_int_equal(lmt_session_stats(s, &st), 0);
	assert_int_equal(st.status, LMT_STATUS_NEW);
	assert_int_equal(lmt_session_add_block(s, "late", ram.base, 4096, 4096), 0);
	lmt_session_free(s);
	ram_release(&ram);
}

static void test_bad_blocks_are_refused_with_the_reason(void **state)
{
	static uint8_t mem[65536] __attribute__((aligned(4096)));
	struct lmt_error err = {0};
	lmt_session *s = NULL;
	assert_int_equal(lmt_session_new(&s, LMT_ROLE_SOURCE, "tcp", NULL, &err), 0);
	assert_int_equal(lmt_session_add_block(s, "a", mem, 6000, 4096), -LMT_EINVAL);
	assert_non_null(strstr(lmt_session_error(s)->message, "block 'a': length 6000"));
	lmt_session_free(s);
	assert_int_equal(lmt_session_new(&s, LMT_ROLE_SOURCE, "tcp", NULL, &err), 0);
	assert_int_equal(lmt_session_add_block(s, "b", mem, 65536, 3000), -LMT_EINVAL);
	assert_non_null(strstr(lmt_session_error(s)->message, "page size 3000"));
	lmt_session_free(s);
	assert_int_equal(lmt_session_new(&s, LMT_ROLE_SOURCE, "tcp", NULL, &err), 0);
	assert_int_equal(lmt_session_add_block(s, "c", mem, 65536, 4096), 0);
	assert_int_equal(lmt_session_add_block(s, "c", mem, 65536, 4096), -LMT_EINVAL);
	assert_string_equal(lmt_session_error(s)->message, "block 'c': added twice");
	lmt_session_free(s);
}

static void test_bad_option_fails_session_creation(void **state)
{
	struct lmt_error err = {0};
	lmt_session *s = (lmt_session *)&err;
	assert_int_equal(lmt_session_new(&s, LMT_ROLE_SOURCE, "tcp", "chunk-size=3M", &err),
	                 -LMT_EINVAL);
	assert_null(s);
	assert_string_equal(err.message, "chunk-size: expected a power of two from 4K to 1G, "
	                                 "got '3M'");
	assert_int_equal(lmt_session_new(&s, LMT_ROLE_SOURCE, "tcp", "tcp.nodelya=on", &err),
	                 -LMT_ENOTFOUND);
	assert_non_null(strstr(err.message, "did you mean 'tcp.nodelay'?"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_iterate_returns_within_its_budget),
	        cmocka_unit_test(test_a_slow_registration_holds_up_no_iterate_call),
	        cmocka_unit_test(test_bandwidth_limit_is_honoured),
	        cmocka_unit_test(test_idle_guest_is_ready_after_the_bulk_pass),
	        cmocka_unit_test(test_dirtying_guest_records_every_pass),
	        cmocka_unit_test(test_stats_json_carries_every_figure),
	        cmocka_unit_test(test_verify_catches_a_destination_that_differs),
	        cmocka_unit_test(test_device_state_arrives_intact),
	        cmocka_unit_test(test_block_size_mismatch_is_named_on_the_source),
	        cmocka_unit_test(test_option_mismatch_is_named_on_the_source),
	        cmocka_unit_test(test_calls_out_of_order_are_refused),
	        cmocka_unit_test(test_bad_blocks_are_refused_with_the_reason),
	        cmocka_unit_test(test_bad_option_fails_session_creation),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
