/* The switchover estimate's rules (core/switchover.c): which rate the
 * pause is counted at, and what the expected downtime adds up. The
 * migrations that depend on them are in tests/integration/test_converge.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "switchover.h"

#define MS 1000000ull
#define MIB (1ull << 20)

/* One write of `bytes` in flight from `start` for `ns`, landing alone. */
static void one_write(struct lmt_switchover *sw, uint64_t start, uint64_t ns, uint64_t bytes)
{
	lmt__switchover_busy(sw, start);
	lmt__switchover_landed(sw, bytes, true, start + ns);
}

static void test_a_pass_the_gate_never_held_is_measured_over_its_span(void **state)
{
	struct lmt_switchover sw = {0};
	one_write(&sw, 1000, 1 * MS, 4 * MIB); /* 4 GiB/s while in flight */
	lmt__switchover_measure(&sw, 40 * MIB, MIB, true, 100 * MS);
	assert_int_equal(lmt__switchover_bps(&sw), 40 * MIB);
}

static void test_a_held_pass_is_measured_over_the_time_writes_were_in_flight(void **state)
{
	struct lmt_switchover sw = {0};
	/* Four writes of 1 MiB, 2 ms each, 25 ms apart: the gate's 40 MiB/s. */
	for (int i = 0; i < 4; i++) {
		one_write(&sw, 1000 + i * 25 * MS, 2 * MS, MIB);
		lmt__switchover_held(&sw);
	}
	lmt__switchover_measure(&sw, 40 * MIB, MIB, true, 100 * MS);
	assert_int_equal(lmt__switchover_bps(&sw), (uint64_t)(4.0 * MIB * 1e9 / (8.0 * MS)));
	/* The next pass starts afresh: not held, measured over its span. */
	one_write(&sw, 101 * MS, 1 * MS, 2 * MIB);
	lmt__switchover_measure(&sw, 30 * MIB, MIB, true, 200 * MS);
	assert_int_equal(lmt__switchover_bps(&sw), 30 * MIB);
}

static void test_writes_overlapping_count_their_time_once(void **state)
{
	struct lmt_switchover sw = {0};
	lmt__switchover_held(&sw);
	lmt__switchover_busy(&sw, 10 * MS);
	lmt__switchover_landed(&sw, MIB, false, 11 * MS); /* another still in flight */
	lmt__switchover_landed(&sw, MIB, true, 12 * MS);
	/* A write still in flight when the pass is measured counts up to then. */
	lmt__switchover_busy(&sw, 20 * MS);
	lmt__switchover_measure(&sw, 1, MIB, true, 22 * MS);
	assert_int_equal(lmt__switchover_bps(&sw), (uint64_t)(2.0 * MIB * 1e9 / (4.0 * MS)));
	/* ... and goes on counting in the next pass, from its start. */
	lmt__switchover_held(&sw);
	lmt__switchover_landed(&sw, 2 * MIB, true, 23 * MS);
	lmt__switchover_measure(&sw, 1, MIB, true, 30 * MS);
	assert_int_equal(lmt__switchover_bps(&sw), (uint64_t)(2.0 * MIB * 1e9 / (1.0 * MS)));
}

static void test_a_short_pass_keeps_the_last_measurement(void **state)
{
	struct lmt_switchover sw = {0};
	one_write(&sw, 1000, MS, 64 << 10);
	lmt__switchover_measure(&sw, 5 * MIB, MIB, true, 10 * MS);
	assert_int_equal(lmt__switchover_bps(&sw), 5 * MIB); /* the first one counts */
	one_write(&sw, 11 * MS, MS, 64 << 10);
	lmt__switchover_measure(&sw, 7 * MIB, MIB, true, 20 * MS);
	assert_int_equal(lmt__switchover_bps(&sw), 5 * MIB);
}

static void test_switchover_bandwidth_overrides_the_measurement(void **state)
{
	struct lmt_switchover sw = {.option_bps = 10 * MIB};
	assert_int_equal(lmt__switchover_bps(&sw), 10 * MIB); /* before any pass */
	one_write(&sw, 1000, MS, 4 * MIB);
	lmt__switchover_measure(&sw, 400 * MIB, MIB, true, 10 * MS);
	assert_int_equal(lmt__switchover_bps(&sw), 10 * MIB);
	sw.option_bps = 0; /* changed back while migrating: the measurement */
	assert_int_equal(lmt__switchover_bps(&sw), 400 * MIB);
}

static void test_the_estimate_adds_every_part_of_the_pause(void **state)
{
	struct lmt_pause_parts p = {.ram_bytes = 30 * MIB,
	                            .other_bytes = 10 * MIB,
	                            .rate_bps = 100 * MIB,
	                            .hash_known = true,
	                            .hash_ns = 5.0 * MS,
	                            .sync_ns = 7 * MS};
	uint64_t ns;
	assert_true(lmt__pause_estimate(&p, &ns));
	assert_int_equal(ns, 400 * MS + 5 * MS + 7 * MS);
}

static void test_the_estimate_is_unknown_with_ram_left_and_no_rate(void **state)
{
	struct lmt_pause_parts p = {.ram_bytes = MIB, .hash_known = true};
	uint64_t ns = 1;
	assert_false(lmt__pause_estimate(&p, &ns));
	assert_int_equal(ns, 0);
	p = (struct lmt_pause_parts){.rate_bps = MIB, .hash_known = false};
	assert_false(lmt__pause_estimate(&p, &ns));
}

static void test_without_ram_or_rate_the_device_state_counts_for_nothing(void **state)
{
	struct lmt_pause_parts p = {.other_bytes = 1ull << 30, .hash_known = true, .sync_ns = 3};
	uint64_t ns;
	assert_true(lmt__pause_estimate(&p, &ns));
	assert_int_equal(ns, 3);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_a_pass_the_gate_never_held_is_measured_over_its_span),
	        cmocka_unit_test(test_a_held_pass_is_measured_over_the_time_writes_were_in_flight),
	        cmocka_unit_test(test_writes_overlapping_count_their_time_once),
	        cmocka_unit_test(test_a_short_pass_keeps_the_last_measurement),
	        cmocka_unit_test(test_switchover_bandwidth_overrides_the_measurement),
	        cmocka_unit_test(test_the_estimate_adds_every_part_of_the_pause),
	        cmocka_unit_test(test_the_estimate_is_unknown_with_ram_left_and_no_rate),
	        cmocka_unit_test(test_without_ram_or_rate_the_device_state_counts_for_nothing),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
