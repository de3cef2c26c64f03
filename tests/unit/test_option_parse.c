/* Unit tests of lmt_option_parse(), the public option parser, through
 * liblmt's exported API: every type, ranges and powers of two, the exact
 * messages, what the value borrows, and the round trip with
 * lmt_option_format(). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include <lmt/lmt.h>

#include "test_schema.h"

#define NS_PER_MS INT64_C(1000000)

/* A bounded size that need not be a power of two, which neither the core's
 * schema nor the test schema has. */
static const struct lmt_option_desc buffer = {.name = "buffer",
                                              .type = LMT_OPT_SIZE,
                                              .default_value = "64K",
                                              .min = 4096,
                                              .max = INT64_C(1) << 30,
                                              .doc = "bounded size"};

static struct lmt_option_value parsed(const struct lmt_option_desc *d, const char *text)
{
	struct lmt_option_value value;
	struct lmt_error err = {0};

	if (lmt_option_parse(d, text, &value, &err) != 0)
		fail_msg("%s: '%s' rejected: %s", d->name, text, err.message);
	assert_int_equal(value.type, d->type);
	return value;
}

/* The code and the whole message of a rejected value. */
static void assert_rejected(const struct lmt_option_desc *d, const char *text, int code,
                            const char *message)
{
	struct lmt_option_value value;
	struct lmt_error err = {0};

	assert_int_equal(lmt_option_parse(d, text, &value, &err), code);
	assert_int_equal(err.code, code);
	assert_string_equal(err.message, message);
}

static void test_bool_takes_every_spelling(void **state)
{
	const char *yes[] = {"on", "true", "yes", "1", "ON", "True"};
	const char *no[] = {"off", "false", "no", "0", "OFF", "No"};

	for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++)
		assert_int_equal(parsed(tcp_desc("nodelay"), yes[i]).boolean, 1);
	for (size_t i = 0; i < sizeof(no) / sizeof(no[0]); i++)
		assert_int_equal(parsed(tcp_desc("nodelay"), no[i]).boolean, 0);
	assert_rejected(tcp_desc("nodelay"), "maybe", -LMT_EINVAL,
	                "nodelay: expected on or off, got 'maybe'");
}

static void test_int_takes_signed_decimals_in_range(void **state)
{
	assert_int_equal(parsed(tcp_desc("retries"), "-10").integer, -10);
	assert_int_equal(parsed(tcp_desc("retries"), "+10").integer, 10);
	assert_rejected(tcp_desc("retries"), "11", -LMT_EINVAL,
	                "retries: expected an integer from -10 to 10, got '11'");
	assert_rejected(tcp_desc("retries"), "3x", -LMT_EINVAL,
	                "retries: expected an integer from -10 to 10, got '3x'");
}

static void test_int_power_of_two_is_checked(void **state)
{
	assert_int_equal(parsed(tcp_desc("batch"), "64").integer, 64);
	assert_rejected(tcp_desc("batch"), "48", -LMT_EINVAL,
	                "batch: expected a power of two, got '48'");
	assert_rejected(tcp_desc("batch"), "0", -LMT_EINVAL,
	                "batch: expected a power of two, got '0'");
}

static void test_size_takes_binary_suffixes(void **state)
{
	assert_int_equal(parsed(tcp_desc("sndbuf"), "4096").integer, 4096);
	assert_int_equal(parsed(tcp_desc("sndbuf"), "64K").integer, 64 << 10);
	assert_int_equal(parsed(tcp_desc("sndbuf"), "2MiB").integer, 2 << 20);
	assert_int_equal(parsed(tcp_desc("sndbuf"), "1G").integer, INT64_C(1) << 30);
	assert_rejected(tcp_desc("sndbuf"), "64Q", -LMT_EINVAL,
	                "sndbuf: expected a size such as 64K or 1M, got '64Q'");
}

static void test_size_range_error_names_the_bounds(void **state)
{
	assert_int_equal(parsed(&buffer, "3M").integer, 3 << 20);
	assert_rejected(&buffer, "2G", -LMT_EINVAL,
	                "buffer: expected a size from 4K to 1G, got '2G'");
	assert_rejected(&buffer, "99999999999999999999", -LMT_EOVERFLOW,
	                "buffer: expected a size from 4K to 1G, got '99999999999999999999' "
	                "(too large)");
}

static void test_chunk_size_message_is_the_documented_one(void **state)
{
	assert_int_equal(parsed(core_desc("chunk-size"), "4M").integer, 4 << 20);
	assert_rejected(core_desc("chunk-size"), "3M", -LMT_EINVAL,
	                "chunk-size: expected a power of two from 4K to 1G, got '3M'");
}

static void test_duration_is_nanoseconds_and_bare_is_milliseconds(void **state)
{
	assert_int_equal(parsed(tcp_desc("linger"), "250").integer, 250 * NS_PER_MS);
	assert_int_equal(parsed(tcp_desc("linger"), "2s").integer, 2000 * NS_PER_MS);
	assert_int_equal(parsed(tcp_desc("linger"), "1m").integer, 60000 * NS_PER_MS);
	assert_int_equal(parsed(tcp_desc("linger"), "1500us").integer, 1500000);
	assert_rejected(tcp_desc("linger"), "2h", -LMT_EINVAL,
	                "linger: expected a duration such as 300ms or 2s, got '2h'");
}

static void test_duration_range_error_names_the_bounds(void **state)
{
	assert_rejected(core_desc("downtime-limit"), "90m", -LMT_EINVAL,
	                "downtime-limit: expected a duration from 1ms to 60m, got '90m'");
}

static void test_enum_value_borrows_the_descriptors_text(void **state)
{
	char text[] = "zerocopy";
	struct lmt_option_value value = parsed(tcp_desc("mode"), text);

	assert_int_equal(value.integer, 1);
	assert_ptr_equal(value.text, tcp_modes[1]);
	assert_rejected(tcp_desc("mode"), "fast", -LMT_EINVAL,
	                "mode: expected one of stream, zerocopy, got 'fast'");
}

static void test_string_value_borrows_the_callers_text(void **state)
{
	const char *text = "eth0";
	struct lmt_option_value value = parsed(tcp_desc("bind-device"), text);

	assert_ptr_equal(value.text, text);
	assert_string_equal(parsed(tcp_desc("bind-device"), "").text, "");
	assert_rejected(tcp_desc("bind-device"), "eth0,eth1", -LMT_EINVAL,
	                "bind-device: expected text without ',', got 'eth0,eth1'");
}

static void test_secret_is_never_echoed(void **state)
{
	assert_rejected(tcp_desc("token"), "open,sesame", -LMT_EINVAL,
	                "token: expected text without ',', got '(secret)'");
}

static void test_missing_arguments_are_errors(void **state)
{
	struct lmt_option_value value;
	struct lmt_error err = {0};

	assert_rejected(tcp_desc("retries"), NULL, -LMT_EINVAL, "retries: no value given");
	assert_int_equal(lmt_option_parse(NULL, "1", &value, &err), -LMT_EINVAL);
	assert_int_equal(lmt_option_parse(tcp_desc("retries"), "1", NULL, &err), -LMT_EINVAL);
	assert_int_equal(lmt_option_parse(tcp_desc("retries"), "x", &value, NULL), -LMT_EINVAL);
}

/* Every core option's default and every descriptor here survive
 * format(parse(text)) and parse(format(value)) unchanged. */
static void assert_round_trip(const struct lmt_option_desc *d, const char *text)
{
	struct lmt_option_value first = parsed(d, text), again;
	char canonical[256], twice[256];
	struct lmt_error err = {0};

	assert_int_equal(lmt_option_format(d, &first, canonical, sizeof(canonical)), 0);
	if (lmt_option_parse(d, canonical, &again, &err) != 0)
		fail_msg("%s: '%s' formatted as '%s' does not parse: %s", d->name, text, canonical,
		         err.message);
	assert_int_equal(again.integer, first.integer);
	assert_int_equal(again.boolean, first.boolean);
	if (first.text)
		assert_string_equal(again.text, first.text);
	assert_int_equal(lmt_option_format(d, &again, twice, sizeof(twice)), 0);
	assert_string_equal(twice, canonical);
}

static void test_round_trips_with_format(void **state)
{
	uint32_t count = 0;
	const struct lmt_option_desc *core = lmt_core_options(&count);

	for (uint32_t i = 0; i < count; i++)
		assert_round_trip(&core[i], core[i].default_value ? core[i].default_value : "");
	for (size_t i = 0; i < TCP_OPTION_COUNT; i++)
		assert_round_trip(&tcp_options[i], tcp_options[i].default_value);
	assert_round_trip(&buffer, "1048576");
	assert_round_trip(tcp_desc("linger"), "90000us");
	assert_round_trip(tcp_desc("nodelay"), "yes");
}

static void test_format_gives_the_canonical_spelling(void **state)
{
	struct lmt_option_value value = parsed(tcp_desc("sndbuf"), "1048576");
	char text[32];

	assert_int_equal(lmt_option_format(tcp_desc("sndbuf"), &value, text, sizeof(text)), 0);
	assert_string_equal(text, "1M");
	value = parsed(tcp_desc("linger"), "120000ms");
	assert_int_equal(lmt_option_format(tcp_desc("linger"), &value, text, sizeof(text)), 0);
	assert_string_equal(text, "2m");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_bool_takes_every_spelling),
	        cmocka_unit_test(test_int_takes_signed_decimals_in_range),
	        cmocka_unit_test(test_int_power_of_two_is_checked),
	        cmocka_unit_test(test_size_takes_binary_suffixes),
	        cmocka_unit_test(test_size_range_error_names_the_bounds),
	        cmocka_unit_test(test_chunk_size_message_is_the_documented_one),
	        cmocka_unit_test(test_duration_is_nanoseconds_and_bare_is_milliseconds),
	        cmocka_unit_test(test_duration_range_error_names_the_bounds),
	        cmocka_unit_test(test_enum_value_borrows_the_descriptors_text),
	        cmocka_unit_test(test_string_value_borrows_the_callers_text),
	        cmocka_unit_test(test_secret_is_never_echoed),
	        cmocka_unit_test(test_missing_arguments_are_errors),
	        cmocka_unit_test(test_round_trips_with_format),
	        cmocka_unit_test(test_format_gives_the_canonical_spelling),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
