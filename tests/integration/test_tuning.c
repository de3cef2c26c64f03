/* Tuning a source while it migrates: max-bandwidth holds across iterate
 * calls however short their budget; downtime-limit, max-bandwidth and
 * switchover-bandwidth change from any thread and take effect at the next call; every other
 * option is refused by name once the migration has begun; the device
 * state announced counts in the expected downtime; verify=on hashes in the
 * passes, not in the pause. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "harness.h"

#define MS 1000000ull
#define MIB (1024.0 * 1024.0)

/* The rate of the passes before the stop-and-copy, as the stats record
 * them: bytes completed over the time from the first pass's start to the
 * last one's end. */
static double pass_rate(const struct source_run *r)
{
	uint64_t bytes = 0, end = 0;
	for (int i = 0; i < r->npasses && i < 16; i++) {
		if (r->passes[i].final)
			continue;
		bytes += r->passes[i].bytes;
		end = r->passes[i].start_ns + r->passes[i].duration_ns;
	}
	assert_true(r->npasses >= 2 && end > r->passes[0].start_ns);
	return (double)bytes * 1e9 / (double)(end - r->passes[0].start_ns);
}

/* A token bucket that lasts across calls: over the bulk pass the bytes
 * posted stay within the rate times the time plus one burst, so a rate
 * above the limit is a bug, whatever the load on the host. The bound only
 * fails on overshoot: a slow host sends less, never more. */
static void test_bandwidth_holds_across_short_iterate_calls(void **state)
{
	const uint64_t ram_bytes = 64ull << 20;
	struct guest_ram ram;
	guest_ram_layout(&ram, ram_map(ram_bytes), ram_bytes);
	guest_ram_fill(&ram, 0.0, 21); /* whole 1M chunks: one takes 20 ms at the limit */
	assert_int_equal(guest_ram_alloc_dirty(&ram), 0);
	const char *opts = "max-bandwidth=50M,max-iterate-ms=5ms";
	struct source_run r = migrate_to_child(&ram, opts);
	double rate = pass_rate(&r);
	print_message("    %.2f MiB/s over %d passes for a 50M limit, %u calls\n", rate / MIB,
	              r.npasses, r.iterations);
	if (rate > 50.0 * MIB * 1.05)
		fail_msg("%.2f MiB/s: over the 50M limit by more than 5%%", rate / MIB);
	ram_release(&ram);
}

static void expect_refused(lmt_session *s, int rc, int code, const char *message)
{
	assert_int_equal(rc, code);
	assert_string_equal(lmt_session_error(s)->message, message);
}

static int64_t option_int(lmt_session *s, const char *name)
{
	struct lmt_option_value v;
	assert_int_equal(lmt_session_get_option(s, name, &v), 0);
	return v.integer;
}

static void test_only_runtime_options_change_once_set_up(void **state)
{
	const uint64_t ram_bytes = 4ull << 20;
	struct guest_ram ram;
	ram_fill(&ram, ram_bytes, 22);
	struct dest_spec spec = {.ram_bytes = ram_bytes, .options = ""};
	uint16_t port;
	pid_t pid = dest_spawn(&spec, &port);
	lmt_session *s = session_with_blocks(LMT_ROLE_SOURCE, &ram, "");
	assert_int_equal(lmt_session_set_option(s, "queue-depth", "32"), 0);
	lmt_session_free(s);
	s = source_set_up(&ram, "max-bandwidth=8M", port);
	expect_refused(s, lmt_session_set_option(s, "queue-depth", "16"), -LMT_ESTATE,
	               "queue-depth: fixed once the migration has begun; only downtime-limit, "
	               "max-bandwidth and switchover-bandwidth can change during a migration");
	expect_refused(s, lmt_session_set_option(s, "tcp.nodelay", "off"), -LMT_ESTATE,
	               "tcp.nodelay: fixed once the migration has begun; only downtime-limit, "
	               "max-bandwidth and switchover-bandwidth can change during a migration");
	/* A list is all or nothing. */
	expect_refused(s, lmt_session_set_options(s, "max-bandwidth=1G,channels=2"), -LMT_ESTATE,
	               "channels: fixed once the migration has begun; only downtime-limit, "
	               "max-bandwidth and switchover-bandwidth can change during a migration");
	assert_int_equal(option_int(s, "max-bandwidth"), 8 << 20);
	expect_refused(s, lmt_session_set_option(s, "downtime-limit", "0"), -LMT_EINVAL,
	               "downtime-limit: expected a duration from 1ms to 60m, got '0'");
	assert_int_equal(lmt_session_set_option(s, "no-such-option", "1"), -LMT_ENOTFOUND);
	assert_int_equal(lmt_session_set_options(
	                         s, "downtime-limit=2s,max-bandwidth=0,switchover-bandwidth=1G"),
	                 0);
	assert_int_equal(option_int(s, "downtime-limit"), 2000 * MS);
	assert_int_equal(option_int(s, "max-bandwidth"), 0);
	assert_int_equal(option_int(s, "switchover-bandwidth"), 1 << 30);
	struct lmt_iterate_result it = {0};
	while (!it.ready)
		if (lmt_save_iterate(s, &it))
			fail_msg("iterate: %s", lmt_session_error(s)->message);
	if (lmt_save_complete(s, NULL, 0))
		fail_msg("complete: %s", lmt_session_error(s)->message);
	lmt_session_free(s);
	assert_int_equal(dest_wait(pid), 0);
	ram_release(&ram);
}

static void test_a_destination_refuses_every_option_once_listening(void **state)
{
	struct guest_ram ram;
	guest_ram_layout(&ram, ram_map(1u << 20), 1u << 20);
	lmt_session *d = session_with_blocks(LMT_ROLE_DESTINATION, &ram, "");
	uint16_t port;
	assert_int_equal(lmt_session_set_option(d, "downtime-limit", "1s"), 0);
	assert_int_equal(lmt_load_listen(d, "127.0.0.1:0", &port), 0);
	/* Fixed from listen on: a source may connect and compare them. */
	expect_refused(d, lmt_session_set_option(d, "downtime-limit", "2s"), -LMT_ESTATE,
	               "downtime-limit: options are fixed once lmt_load_listen is called (a source "
	               "may connect from then on, and the handshake checks them against its "
	               "own)");
	assert_int_equal(lmt_load_start(d), 0);
	expect_refused(d, lmt_session_set_option(d, "downtime-limit", "2s"), -LMT_ESTATE,
	               "downtime-limit: options are fixed once lmt_load_listen is called (a source "
	               "may connect from then on, and the handshake checks them against its "
	               "own)");
	assert_int_equal(lmt_save_set_device_state_size(d, 1), -LMT_ESTATE);
	lmt_cancel(d);
	lmt_session_free(d);
	munmap(ram.base, 1u << 20);
}

/* One change made by another thread, when the main thread asks for it. */
struct tuner {
	lmt_session *s;
	const char *name;
	const char *value;
	pthread_t thread;
	atomic_int asked;
	atomic_int rc;
};

static void *tuner_main(void *arg)
{
	struct tuner *t = arg;
	while (!atomic_load(&t->asked))
		sched_yield();
	atomic_store(&t->rc, lmt_session_set_option(t->s, t->name, t->value));
	return NULL;
}

static void tuner_start(struct tuner *t, lmt_session *s, const char *name, const char *value)
{
	*t = (struct tuner){.s = s, .name = name, .value = value};
	assert_int_equal(pthread_create(&t->thread, NULL, tuner_main, t), 0);
}

/* Ask for the change and wait until it is made: the next call sees it. */
static void tuner_apply(struct tuner *t)
{
	atomic_store(&t->asked, 1);
	pthread_join(t->thread, NULL);
	assert_int_equal(atomic_load(&t->rc), 0);
}

/* 1 byte/s lets one write through and nothing after it, for good: a change
 * that did not take effect would leave the migration standing still. */
static void test_max_bandwidth_changed_from_another_thread(void **state)
{
	const uint64_t ram_bytes = 16ull << 20;
	struct guest_ram ram;
	ram_fill(&ram, ram_bytes, 23);
	struct dest_spec spec = {.ram_bytes = ram_bytes, .options = ""};
	uint16_t port;
	pid_t pid = dest_spawn(&spec, &port);
	lmt_session *s = source_set_up(&ram, "max-bandwidth=1", port);
	struct tuner t;
	tuner_start(&t, s, "max-bandwidth", "0");
	struct lmt_iterate_result it = {0};
	for (int i = 0; i < 4; i++)
		if (lmt_save_iterate(s, &it))
			fail_msg("iterate: %s", lmt_session_error(s)->message);
	struct lmt_stats st;
	assert_int_equal(lmt_session_stats(s, &st), 0);
	assert_true(st.writes == 1); /* the first write, then the bucket's debt */
	tuner_apply(&t);
	while (!it.ready)
		if (lmt_save_iterate(s, &it))
			fail_msg("iterate: %s", lmt_session_error(s)->message);
	if (lmt_save_complete(s, NULL, 0))
		fail_msg("complete: %s", lmt_session_error(s)->message);
	lmt_session_free(s);
	assert_int_equal(dest_wait(pid), 0);
	ram_release(&ram);
}

/* A device state of 1G cannot go in 1 ms at any bandwidth: not ready until
 * another thread raises downtime-limit; the estimate counts the state at
 * the measured bandwidth. */
static void test_downtime_limit_changed_from_another_thread(void **state)
{
	const uint64_t ram_bytes = 8ull << 20;
	struct guest_ram ram;
	ram_fill(&ram, ram_bytes, 24);
	struct dest_spec spec = {.ram_bytes = ram_bytes, .options = ""};
	uint16_t port;
	pid_t pid = dest_spawn(&spec, &port);
	lmt_session *s = source_set_up(&ram, "downtime-limit=1ms", port);
	assert_int_equal(lmt_save_set_device_state_size(s, 1ull << 30), 0);
	assert_int_equal(lmt_save_set_device_state_size(s, (1ull << 30) + 1), -LMT_EOVERFLOW);
	struct tuner t;
	tuner_start(&t, s, "downtime-limit", "60m");
	/* Past the bulk pass, with nothing dirty, it is the state that waits. */
	struct lmt_iterate_result it = {0};
	while (it.pass < 3) {
		if (lmt_save_iterate(s, &it))
			fail_msg("iterate: %s", lmt_session_error(s)->message);
		assert_false(it.ready);
	}
	assert_int_equal(it.remaining_bytes, 0);
	assert_true(it.expected_downtime_known && it.bandwidth_bps > 0);
	double state_ns = (double)(1ull << 30) * 1e9 / (double)it.bandwidth_bps;
	assert_true((double)it.expected_downtime_ns >= state_ns * 0.999);
	tuner_apply(&t);
	int calls = 0;
	while (!it.ready && calls++ < 10)
		if (lmt_save_iterate(s, &it))
			fail_msg("iterate: %s", lmt_session_error(s)->message);
	assert_true(it.ready);
	if (lmt_save_complete(s, "dev", 3))
		fail_msg("complete: %s", lmt_session_error(s)->message);
	lmt_session_free(s);
	assert_int_equal(dest_wait(pid), 0);
	ram_release(&ram);
}

/* Options changed, read and the device state announced from a thread that
 * never stops while the source migrates with verify=on: a memory error or
 * a torn value would show up here (and under the sanitizers). */
struct hammer {
	lmt_session *s;
	atomic_bool stop;
	uint64_t rounds;
};

static void *hammer_main(void *arg)
{
	struct hammer *h = arg;
	while (!atomic_load(&h->stop)) {
		struct lmt_option_value v;
		lmt_session_set_option(h->s, "max-bandwidth", h->rounds % 2 ? "1G" : "0");
		lmt_session_set_options(h->s,
		                        h->rounds % 2 ? "downtime-limit=1s" : "downtime-limit=2s");
		lmt_session_set_option(h->s, "switchover-bandwidth", h->rounds % 3 ? "0" : "512M");
		lmt_session_get_option(h->s, "max-bandwidth", &v);
		lmt_save_set_device_state_size(h->s, h->rounds % 4096);
		h->rounds++;
	}
	return NULL;
}

static void test_options_hammered_from_another_thread_while_migrating(void **state)
{
	const uint64_t ram_bytes = 32ull << 20;
	struct guest_ram ram;
	ram_fill(&ram, ram_bytes, 25);
	struct guest_workload *w = NULL;
	assert_int_equal(guest_workload_start(&w, &ram, 4u << 20, 32u << 20, 7), 0);
	struct dest_spec spec = {.ram_bytes = ram_bytes, .options = "verify=on"};
	uint16_t port;
	pid_t pid = dest_spawn(&spec, &port);
	lmt_session *s = source_set_up(&ram, "verify=on", port);
	struct hammer h = {.s = s};
	pthread_t th;
	assert_int_equal(pthread_create(&th, NULL, hammer_main, &h), 0);
	struct lmt_iterate_result it = {0};
	while (!it.ready)
		if (lmt_save_iterate(s, &it))
			fail_msg("iterate: %s", lmt_session_error(s)->message);
	guest_workload_pause(w);
	if (lmt_save_complete(s, "dev", 3))
		fail_msg("complete: %s", lmt_session_error(s)->message);
	atomic_store(&h.stop, true);
	pthread_join(th, NULL);
	print_message("    %llu rounds of changes\n", (unsigned long long)h.rounds);
	assert_true(h.rounds > 0);
	lmt_session_free(s);
	assert_int_equal(dest_wait(pid), 0);
	guest_workload_stop(w);
	ram_release(&ram);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_bandwidth_holds_across_short_iterate_calls),
	        cmocka_unit_test(test_only_runtime_options_change_once_set_up),
	        cmocka_unit_test(test_a_destination_refuses_every_option_once_listening),
	        cmocka_unit_test(test_max_bandwidth_changed_from_another_thread),
	        cmocka_unit_test(test_downtime_limit_changed_from_another_thread),
	        cmocka_unit_test(test_options_hammered_from_another_thread_while_migrating),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
