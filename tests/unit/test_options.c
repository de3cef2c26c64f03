/* Unit tests of the option schema engine: parsers, messages, precedence,
 * environment, plugin namespaces and canonical text. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "options.h"
#include "test_schema.h"

#define NS_PER_MS INT64_C(1000000)
#define NS_PER_S INT64_C(1000000000)

/* Every variable the tests may set; cleared around each test so that the
 * developer's environment cannot change the results. */
static const char *const env_names[] = {
        "LMT_CHUNK_SIZE",
        "LMT_PIN_ALL",
        "LMT_CHANNELS",
        "LMT_MAX_BANDWIDTH",
        "LMT_DOWNTIME_LIMIT",
        "LMT_MAX_ITERATE_MS",
        "LMT_ZERO_PAGE_DETECTION",
        "LMT_VERIFY",
        "LMT_CONNECT_TIMEOUT",
        "LMT_IDLE_TIMEOUT",
        "LMT_QUEUE_DEPTH",
        "LMT_TCP_NODELAY",
        "LMT_TCP_MODE",
        "LMT_TCP_BIND_DEVICE",
        "LMT_TCP_TOKEN",
        "LMT_TCP_KEY_SLOT",
        "LMT_TCP_RETRIES",
        "LMT_TCP_BATCH",
        "LMT_TCP_OFFSET",
        "LMT_TCP_SNDBUF",
        "LMT_TCP_LINGER",
};

static void clear_env(void)
{
	for (size_t i = 0; i < sizeof(env_names) / sizeof(env_names[0]); i++)
		unsetenv(env_names[i]);
}

static void add_core(struct lmt_optset *set)
{
	struct lmt_error err = {0};
	uint32_t count;
	const struct lmt_option_desc *core = lmt_core_options(&count);

	assert_int_equal(lmt__optset_add_schema(set, NULL, core, count, &err), 0);
}

static void add_tcp(struct lmt_optset *set)
{
	struct lmt_error err = {0};

	assert_int_equal(lmt__optset_add_schema(set, "tcp", tcp_options, TCP_OPTION_COUNT, &err),
	                 0);
}

/* State: an optset with the core schema and the "tcp" test schema. */
static int setup_set(void **state)
{
	struct lmt_optset *set = NULL;

	clear_env();
	if (lmt__optset_new(&set) < 0)
		return -1;
	add_core(set);
	add_tcp(set);
	*state = set;
	return 0;
}

static int teardown_set(void **state)
{
	lmt__optset_free(*state);
	clear_env();
	return 0;
}

/* Set `name` explicitly and expect failure with `code` and `message`. */
static void assert_set_fails(struct lmt_optset *set, const char *name, const char *value, int code,
                             const char *message)
{
	struct lmt_error err = {0};

	assert_int_equal(lmt__optset_set(set, name, value, LMT_OPT_SRC_EXPLICIT, &err), code);
	assert_int_equal(err.code, code);
	if (message)
		assert_string_equal(err.message, message);
}

static void assert_set_ok(struct lmt_optset *set, const char *name, const char *value)
{
	struct lmt_error err = {0};
	int rc = lmt__optset_set(set, name, value, LMT_OPT_SRC_EXPLICIT, &err);

	if (rc != 0)
		fail_msg("%s=%s: %s", name, value, err.message);
}

static void assert_option_rejected(const struct lmt_option_desc *desc, const char *text, int code)
{
	struct lmt_option_value value;

	if (lmt__option_parse(desc, NULL, text, &value, NULL) != code)
		fail_msg("%s: '%s' should fail with %d", desc->name, text, code);
}

static int64_t parsed_integer(const struct lmt_option_desc *desc, const char *text)
{
	struct lmt_option_value value;
	struct lmt_error err = {0};

	if (lmt__option_parse(desc, NULL, text, &value, &err) != 0)
		fail_msg("%s: '%s' rejected: %s", desc->name, text, err.message);
	assert_int_equal(value.type, desc->type);
	return value.integer;
}

static uint64_t size_of(const char *text)
{
	uint64_t value = 0;

	if (lmt__parse_size(text, &value) != 0)
		fail_msg("size '%s' rejected", text);
	return value;
}

static uint64_t duration_of(const char *text)
{
	uint64_t value = 0;

	if (lmt__parse_duration(text, &value) != 0)
		fail_msg("duration '%s' rejected", text);
	return value;
}

static void assert_size_rejected(const char *text, int code)
{
	uint64_t value = 12345;

	if (lmt__parse_size(text, &value) != code)
		fail_msg("size '%s' should fail with %d", text, code);
	assert_int_equal(value, 12345);
}

static void assert_duration_rejected(const char *text, int code)
{
	uint64_t value = 12345;

	if (lmt__parse_duration(text, &value) != code)
		fail_msg("duration '%s' should fail with %d", text, code);
	assert_int_equal(value, 12345);
}

/* ---- size parser -------------------------------------------------------- */

static void test_size_accepts_plain_bytes(void **state)
{
	assert_int_equal(size_of("4096"), 4096);
	assert_int_equal(size_of("0"), 0);
	assert_int_equal(size_of("007"), 7);
	assert_int_equal(size_of("4096B"), 4096);
}

static void test_size_accepts_binary_suffixes(void **state)
{
	assert_int_equal(size_of("64K"), 64 * 1024);
	assert_int_equal(size_of("1M"), 1 << 20);
	assert_int_equal(size_of("2G"), UINT64_C(2) << 30);
	assert_int_equal(size_of("1T"), UINT64_C(1) << 40);
	assert_int_equal(size_of("4KB"), 4096);
	assert_int_equal(size_of("4KiB"), 4096);
	assert_int_equal(size_of("3MiB"), 3 << 20);
	assert_int_equal(size_of("5GB"), UINT64_C(5) << 30);
	assert_int_equal(size_of("2TiB"), UINT64_C(2) << 40);
}

static void test_size_unit_is_case_insensitive(void **state)
{
	assert_int_equal(size_of("64k"), 64 * 1024);
	assert_int_equal(size_of("1m"), 1 << 20);
	assert_int_equal(size_of("1kib"), 1024);
	assert_int_equal(size_of("1KIB"), 1024);
	assert_int_equal(size_of("1gb"), UINT64_C(1) << 30);
	assert_int_equal(size_of("7b"), 7);
}

static void test_negative_size_is_rejected(void **state)
{
	assert_size_rejected("-4K", -LMT_EINVAL);
	assert_size_rejected("-0", -LMT_EINVAL);
	assert_size_rejected("+4K", -LMT_EINVAL);
}

static void test_trailing_junk_is_rejected(void **state)
{
	assert_size_rejected("4Kx", -LMT_EINVAL);
	assert_size_rejected("1MBB", -LMT_EINVAL);
	assert_size_rejected("1KiBB", -LMT_EINVAL);
	assert_size_rejected("1Bi", -LMT_EINVAL);
	assert_size_rejected("1iB", -LMT_EINVAL);
	assert_size_rejected("1P", -LMT_EINVAL);
	assert_size_rejected("1.5M", -LMT_EINVAL);
	assert_size_rejected("0x10", -LMT_EINVAL);
	assert_size_rejected("1e3", -LMT_EINVAL);
}

static void test_whitespace_is_rejected(void **state)
{
	assert_size_rejected(" 4K", -LMT_EINVAL);
	assert_size_rejected("4K ", -LMT_EINVAL);
	assert_size_rejected("4 K", -LMT_EINVAL);
	assert_size_rejected("\t1", -LMT_EINVAL);
	assert_duration_rejected("1 s", -LMT_EINVAL);
	assert_duration_rejected(" 1s", -LMT_EINVAL);
}

static void test_size_without_digits_is_rejected(void **state)
{
	assert_size_rejected("", -LMT_EINVAL);
	assert_size_rejected("K", -LMT_EINVAL);
	assert_size_rejected("MiB", -LMT_EINVAL);
}

static void test_overflow_is_rejected(void **state)
{
	assert_int_equal(size_of("18446744073709551615"), UINT64_MAX);
	assert_size_rejected("18446744073709551616", -LMT_EOVERFLOW);
	assert_size_rejected("99999999999999999999999999K", -LMT_EOVERFLOW);
	assert_int_equal(duration_of("18446744073709551615ns"), UINT64_MAX);
	assert_duration_rejected("18446744073709551616ns", -LMT_EOVERFLOW);
}

static void test_unit_multiplication_overflow_is_rejected(void **state)
{
	assert_int_equal(size_of("16777215T"), UINT64_C(16777215) << 40);
	assert_size_rejected("16777216T", -LMT_EOVERFLOW);
	assert_int_equal(duration_of("307445734m"), UINT64_C(307445734) * 60 * NS_PER_S);
	assert_duration_rejected("307445735m", -LMT_EOVERFLOW);
	assert_duration_rejected("18446744073710ms", -LMT_EOVERFLOW);
}

static void test_junk_wins_over_overflow(void **state)
{
	assert_size_rejected("99999999999999999999999x", -LMT_EINVAL);
}

static void test_parsers_reject_null(void **state)
{
	uint64_t value;

	assert_int_equal(lmt__parse_size(NULL, &value), -LMT_EINVAL);
	assert_int_equal(lmt__parse_size("1", NULL), -LMT_EINVAL);
	assert_int_equal(lmt__parse_duration(NULL, &value), -LMT_EINVAL);
	assert_int_equal(lmt__parse_duration("1", NULL), -LMT_EINVAL);
}

/* ---- duration parser ---------------------------------------------------- */

static void test_duration_accepts_units(void **state)
{
	assert_int_equal(duration_of("7ns"), 7);
	assert_int_equal(duration_of("500us"), 500 * 1000);
	assert_int_equal(duration_of("300ms"), 300 * NS_PER_MS);
	assert_int_equal(duration_of("2s"), 2 * NS_PER_S);
	assert_int_equal(duration_of("1m"), 60 * NS_PER_S);
	assert_int_equal(duration_of("2S"), 2 * NS_PER_S);
	assert_int_equal(duration_of("0s"), 0);
}

static void test_duration_bare_number_is_milliseconds(void **state)
{
	assert_int_equal(duration_of("250"), 250 * NS_PER_MS);
	assert_int_equal(duration_of("0"), 0);
}

static void test_duration_rejects_signs_and_junk(void **state)
{
	assert_duration_rejected("-1s", -LMT_EINVAL);
	assert_duration_rejected("+1s", -LMT_EINVAL);
	assert_duration_rejected("1h", -LMT_EINVAL);
	assert_duration_rejected("1.5s", -LMT_EINVAL);
	assert_duration_rejected("1sec", -LMT_EINVAL);
	assert_duration_rejected("1mss", -LMT_EINVAL);
	assert_duration_rejected("s", -LMT_EINVAL);
	assert_duration_rejected("", -LMT_EINVAL);
}

/* ---- option values and their messages ------------------------------------ */

static void test_chunk_size_rejects_non_power_of_two(void **state)
{
	assert_set_fails(*state, "chunk-size", "3M", -LMT_EINVAL,
	                 "chunk-size: expected a power of two from 4K to 1G, got '3M'");
	assert_int_equal(lmt__opt_int(*state, "chunk-size"), 1 << 20);
}

static void test_chunk_size_rejects_out_of_range(void **state)
{
	assert_set_fails(*state, "chunk-size", "2K", -LMT_EINVAL,
	                 "chunk-size: expected a power of two from 4K to 1G, got '2K'");
	assert_set_fails(*state, "chunk-size", "2G", -LMT_EINVAL,
	                 "chunk-size: expected a power of two from 4K to 1G, got '2G'");
	assert_set_fails(*state, "chunk-size", "0", -LMT_EINVAL, NULL);
}

static void test_chunk_size_accepts_bounds(void **state)
{
	assert_int_equal(parsed_integer(core_desc("chunk-size"), "4K"), 4096);
	assert_int_equal(parsed_integer(core_desc("chunk-size"), "4096"), 4096);
	assert_int_equal(parsed_integer(core_desc("chunk-size"), "1G"), 1 << 30);
	assert_int_equal(parsed_integer(core_desc("chunk-size"), "64KiB"), 65536);
}

static void test_size_syntax_error_gives_examples(void **state)
{
	assert_set_fails(*state, "max-bandwidth", "fast", -LMT_EINVAL,
	                 "max-bandwidth: expected a size such as 64K or 1M, got 'fast'");
}

static void test_size_option_overflowing_int64_is_rejected(void **state)
{
	const struct lmt_option_desc *desc = core_desc("max-bandwidth");

	assert_int_equal(parsed_integer(desc, "8388607T"), INT64_C(8388607) << 40);
	assert_option_rejected(desc, "8388608T", -LMT_EOVERFLOW);
	assert_set_fails(*state, "max-bandwidth", "18446744073709551616", -LMT_EOVERFLOW,
	                 "max-bandwidth: expected a size such as 64K or 1M, "
	                 "got '18446744073709551616' (too large)");
}

static void test_bounded_overflow_message_gives_range(void **state)
{
	assert_set_fails(*state, "channels", "99999999999999999999", -LMT_EOVERFLOW,
	                 "channels: expected an integer from 1 to 64, "
	                 "got '99999999999999999999' (too large)");
}

static void test_int_rejects_out_of_range(void **state)
{
	assert_set_fails(*state, "channels", "0", -LMT_EINVAL,
	                 "channels: expected an integer from 1 to 64, got '0'");
	assert_set_fails(*state, "channels", "65", -LMT_EINVAL,
	                 "channels: expected an integer from 1 to 64, got '65'");
	assert_set_ok(*state, "channels", "64");
	assert_int_equal(lmt__opt_int(*state, "channels"), 64);
}

static void test_int_accepts_signed_decimal(void **state)
{
	const struct lmt_option_desc *desc = tcp_desc("retries");

	assert_int_equal(parsed_integer(desc, "-10"), -10);
	assert_int_equal(parsed_integer(desc, "+3"), 3);
	assert_int_equal(parsed_integer(desc, "10"), 10);
	assert_int_equal(parsed_integer(desc, "-0"), 0);
	assert_int_equal(parsed_integer(desc, "007"), 7);
}

static void test_int_rejects_junk(void **state)
{
	const struct lmt_option_desc *desc = tcp_desc("offset");
	const char *const bad[] = {"1x", " 1", "1 ", "-", "+", "--1", "0x10", "1e3", "1K", "1.0"};

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		assert_option_rejected(desc, bad[i], -LMT_EINVAL);
	assert_set_fails(*state, "channels", "two", -LMT_EINVAL,
	                 "channels: expected an integer from 1 to 64, got 'two'");
}

static void test_int_overflow_is_rejected(void **state)
{
	const struct lmt_option_desc *desc = tcp_desc("offset");

	assert_int_equal(parsed_integer(desc, "9223372036854775807"), INT64_MAX);
	assert_int_equal(parsed_integer(desc, "-9223372036854775808"), INT64_MIN);
	assert_option_rejected(desc, "9223372036854775808", -LMT_EOVERFLOW);
	assert_option_rejected(desc, "-9223372036854775809", -LMT_EOVERFLOW);
}

static void test_pow2_int_rejects_other_numbers(void **state)
{
	const struct lmt_option_desc *desc = tcp_desc("batch");

	assert_int_equal(parsed_integer(desc, "1"), 1);
	assert_int_equal(parsed_integer(desc, "1024"), 1024);
	assert_option_rejected(desc, "0", -LMT_EINVAL);
	assert_option_rejected(desc, "-8", -LMT_EINVAL);
	assert_set_fails(*state, "tcp.batch", "12", -LMT_EINVAL,
	                 "tcp.batch: expected a power of two, got '12'");
}

static void test_bool_accepts_all_spellings(void **state)
{
	const char *const on[] = {"on", "true", "yes", "1", "ON", "True", "YeS"};
	const char *const off[] = {"off", "false", "no", "0", "OFF", "False", "nO"};

	for (size_t i = 0; i < sizeof(on) / sizeof(on[0]); i++) {
		assert_set_ok(*state, "pin-all", on[i]);
		assert_true(lmt__opt_bool(*state, "pin-all"));
		assert_string_equal(lmt__opt_text(*state, "pin-all"), "on");
		assert_set_ok(*state, "pin-all", off[i]);
		assert_false(lmt__opt_bool(*state, "pin-all"));
		assert_string_equal(lmt__opt_text(*state, "pin-all"), "off");
	}
}

static void test_bool_rejects_other_words(void **state)
{
	const char *const bad[] = {"", "2", "onn", " on", "of", "y", "enabled"};

	assert_set_fails(*state, "pin-all", "maybe", -LMT_EINVAL,
	                 "pin-all: expected on or off, got 'maybe'");
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		assert_option_rejected(core_desc("pin-all"), bad[i], -LMT_EINVAL);
}

static void test_duration_option_message_gives_examples(void **state)
{
	assert_set_fails(*state, "downtime-limit", "3 parsecs", -LMT_EINVAL,
	                 "downtime-limit: expected a duration such as 300ms or 2s, "
	                 "got '3 parsecs'");
}

static void test_duration_option_rejects_out_of_range(void **state)
{
	assert_set_fails(*state, "downtime-limit", "999us", -LMT_EINVAL,
	                 "downtime-limit: expected a duration from 1ms to 60m, got '999us'");
	assert_set_fails(*state, "max-iterate-ms", "61s", -LMT_EINVAL,
	                 "max-iterate-ms: expected a duration from 1ms to 1m, got '61s'");
}

static void test_duration_option_is_nanoseconds(void **state)
{
	assert_int_equal(lmt__opt_int(*state, "downtime-limit"), 300 * NS_PER_MS);
	assert_set_ok(*state, "downtime-limit", "2s");
	assert_int_equal(lmt__opt_int(*state, "downtime-limit"), 2 * NS_PER_S);
	assert_set_ok(*state, "downtime-limit", "1500");
	assert_int_equal(lmt__opt_int(*state, "downtime-limit"), 1500 * NS_PER_MS);
	assert_string_equal(lmt__opt_text(*state, "downtime-limit"), "1500ms");
}

static void test_enum_accepts_listed_values(void **state)
{
	struct lmt_option_value value;

	assert_int_equal(lmt__optset_get(*state, "tcp.mode", &value), 0);
	assert_int_equal(value.type, LMT_OPT_ENUM);
	assert_int_equal(value.integer, 0);
	assert_string_equal(value.text, "stream");
	assert_set_ok(*state, "tcp.mode", "zerocopy");
	assert_int_equal(lmt__optset_get(*state, "tcp.mode", &value), 0);
	assert_int_equal(value.integer, 1);
	assert_string_equal(value.text, "zerocopy");
}

static void test_enum_rejects_other_values(void **state)
{
	assert_set_fails(*state, "tcp.mode", "x", -LMT_EINVAL,
	                 "tcp.mode: expected one of stream, zerocopy, got 'x'");
	assert_set_fails(*state, "tcp.mode", "Stream", -LMT_EINVAL, NULL);
	assert_set_fails(*state, "tcp.mode", "stream ", -LMT_EINVAL, NULL);
	assert_set_fails(*state, "tcp.mode", "", -LMT_EINVAL, NULL);
	assert_string_equal(lmt__opt_text(*state, "tcp.mode"), "stream");
}

static void test_string_accepts_any_text_without_comma(void **state)
{
	const char *const good[] = {"eth0", "", " spaced out ", "a=b", "ünïcode"};

	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		assert_set_ok(*state, "tcp.bind-device", good[i]);
		assert_string_equal(lmt__opt_text(*state, "tcp.bind-device"), good[i]);
	}
}

static void test_string_rejects_comma(void **state)
{
	assert_set_fails(*state, "tcp.bind-device", "eth0,eth1", -LMT_EINVAL,
	                 "tcp.bind-device: expected text without ',', got 'eth0,eth1'");
}

static void test_empty_value_is_rejected_except_for_strings(void **state)
{
	const char *const typed[] = {"chunk-size", "pin-all", "channels", "downtime-limit",
	                             "tcp.mode"};

	for (size_t i = 0; i < sizeof(typed) / sizeof(typed[0]); i++)
		assert_set_fails(*state, typed[i], "", -LMT_EINVAL, NULL);
	assert_set_ok(*state, "tcp.bind-device", "");
}

static void test_secret_value_is_not_echoed_in_errors(void **state)
{
	assert_set_fails(*state, "tcp.key-slot", "sesame", -LMT_EINVAL,
	                 "tcp.key-slot: expected an integer from 0 to 7, got '(secret)'");
	assert_set_fails(*state, "tcp.token", "open,sesame", -LMT_EINVAL,
	                 "tcp.token: expected text without ',', got '(secret)'");
}

static void test_parse_without_value_is_an_error(void **state)
{
	struct lmt_option_value value;
	struct lmt_error err = {0};

	assert_int_equal(lmt__option_parse(core_desc("channels"), NULL, NULL, &value, &err),
	                 -LMT_EINVAL);
	assert_string_equal(err.message, "channels: no value given");
}

static void test_parse_uses_the_given_name_in_messages(void **state)
{
	struct lmt_option_value value;
	struct lmt_error err = {0};

	assert_int_equal(
	        lmt__option_parse(tcp_desc("nodelay"), "tcp.nodelay", "maybe", &value, &err),
	        -LMT_EINVAL);
	assert_string_equal(err.message, "tcp.nodelay: expected on or off, got 'maybe'");
}

/* ---- canonical text ------------------------------------------------------ */

static void assert_formats(const struct lmt_option_desc *desc, int64_t integer,
                           const char *expected)
{
	struct lmt_option_value value = {
	        .type = desc->type, .integer = integer, .boolean = integer != 0};
	char buf[64];

	assert_int_equal(lmt_option_format(desc, &value, buf, sizeof(buf)), 0);
	assert_string_equal(buf, expected);
}

static void test_format_uses_largest_exact_size_suffix(void **state)
{
	const struct lmt_option_desc *desc = core_desc("max-bandwidth");

	assert_formats(desc, 1048576, "1M");
	assert_formats(desc, 0, "0");
	assert_formats(desc, 4096, "4K");
	assert_formats(desc, 1536 * 1024, "1536K");
	assert_formats(desc, INT64_C(1) << 30, "1G");
	assert_formats(desc, INT64_C(3) << 40, "3T");
	assert_formats(desc, INT64_C(1) << 50, "1024T");
	assert_formats(desc, (INT64_C(1) << 30) + 1, "1073741825");
}

static void test_format_uses_largest_exact_duration_unit(void **state)
{
	const struct lmt_option_desc *desc = core_desc("downtime-limit");

	assert_formats(desc, 300 * NS_PER_MS, "300ms");
	assert_formats(desc, 2 * NS_PER_S, "2s");
	assert_formats(desc, 1500 * 1000, "1500us");
	assert_formats(desc, 0, "0");
	assert_formats(desc, 90 * NS_PER_S, "90s");
	assert_formats(desc, 120 * NS_PER_S, "2m");
	assert_formats(desc, 1, "1ns");
}

static void test_format_bool_and_int(void **state)
{
	assert_formats(core_desc("pin-all"), 1, "on");
	assert_formats(core_desc("pin-all"), 0, "off");
	assert_formats(core_desc("channels"), 64, "64");
	assert_formats(tcp_desc("offset"), INT64_MIN, "-9223372036854775808");
}

static void test_format_enum_and_string(void **state)
{
	struct lmt_option_value by_index = {.type = LMT_OPT_ENUM, .integer = 1};
	struct lmt_option_value string = {.type = LMT_OPT_STRING, .text = "eth0"};
	struct lmt_option_value empty = {.type = LMT_OPT_STRING};
	char buf[32];

	assert_int_equal(lmt_option_format(tcp_desc("mode"), &by_index, buf, sizeof(buf)), 0);
	assert_string_equal(buf, "zerocopy");
	assert_int_equal(lmt_option_format(tcp_desc("bind-device"), &string, buf, sizeof(buf)), 0);
	assert_string_equal(buf, "eth0");
	assert_int_equal(lmt_option_format(tcp_desc("bind-device"), &empty, buf, sizeof(buf)), 0);
	assert_string_equal(buf, "");
}

static void test_format_round_trips(void **state)
{
	static const struct {
		const char *option;
		const char *text;
	} cases[] = {
	        {"chunk-size", "64K"},
	        {"chunk-size", "1G"},
	        {"max-bandwidth", "0"},
	        {"max-bandwidth", "1536K"},
	        {"max-bandwidth", "1000"},
	        {"downtime-limit", "1ms"},
	        {"downtime-limit", "1500us"},
	        {"connect-timeout", "90s"},
	        {"idle-timeout", "2m"},
	        {"channels", "7"},
	        {"pin-all", "on"},
	        {"verify", "off"},
	        {"tcp.mode", "zerocopy"},
	        {"tcp.bind-device", "eth0"},
	        {"tcp.retries", "-4"},
	        {"tcp.linger", "0"},
	        {"tcp.linger", "7ns"},
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct lmt_option_value first, second;
		char copy[64];
		assert_set_ok(*state, cases[i].option, cases[i].text);
		assert_string_equal(lmt__opt_text(*state, cases[i].option), cases[i].text);
		assert_int_equal(lmt__optset_get(*state, cases[i].option, &first), 0);
		snprintf(copy, sizeof(copy), "%s", lmt__opt_text(*state, cases[i].option));
		assert_set_ok(*state, cases[i].option, copy);
		assert_int_equal(lmt__optset_get(*state, cases[i].option, &second), 0);
		assert_int_equal(first.integer, second.integer);
		assert_int_equal(first.boolean, second.boolean);
	}
}

static void test_format_canonicalises_spellings(void **state)
{
	assert_set_ok(*state, "chunk-size", "1048576");
	assert_string_equal(lmt__opt_text(*state, "chunk-size"), "1M");
	assert_set_ok(*state, "chunk-size", "2048KiB");
	assert_string_equal(lmt__opt_text(*state, "chunk-size"), "2M");
	assert_set_ok(*state, "connect-timeout", "120000");
	assert_string_equal(lmt__opt_text(*state, "connect-timeout"), "2m");
	assert_set_ok(*state, "verify", "YES");
	assert_string_equal(lmt__opt_text(*state, "verify"), "on");
}

static void test_format_reports_short_buffer(void **state)
{
	struct lmt_option_value value = {.type = LMT_OPT_SIZE, .integer = 1536 * 1024};
	char buf[4];

	assert_int_equal(lmt_option_format(core_desc("max-bandwidth"), &value, buf, sizeof(buf)),
	                 -LMT_EOVERFLOW);
	assert_string_equal(buf, "153");
}

static void test_format_rejects_bad_values(void **state)
{
	struct lmt_option_value wrong_type = {.type = LMT_OPT_BOOL, .integer = 1};
	struct lmt_option_value negative_size = {.type = LMT_OPT_SIZE, .integer = -1};
	struct lmt_option_value bad_index = {.type = LMT_OPT_ENUM, .integer = 2};
	char buf[32];

	assert_int_equal(lmt_option_format(core_desc("channels"), &wrong_type, buf, sizeof(buf)),
	                 -LMT_EINVAL);
	assert_int_equal(
	        lmt_option_format(core_desc("max-bandwidth"), &negative_size, buf, sizeof(buf)),
	        -LMT_EINVAL);
	assert_int_equal(lmt_option_format(tcp_desc("mode"), &bad_index, buf, sizeof(buf)),
	                 -LMT_EINVAL);
	assert_int_equal(lmt_option_format(core_desc("channels"), &wrong_type, NULL, 0),
	                 -LMT_EINVAL);
}

/* ---- the option set ------------------------------------------------------ */

static void test_defaults_are_applied(void **state)
{
	assert_int_equal(lmt__opt_int(*state, "chunk-size"), 1 << 20);
	assert_false(lmt__opt_bool(*state, "pin-all"));
	assert_int_equal(lmt__opt_int(*state, "channels"), 1);
	assert_int_equal(lmt__opt_int(*state, "max-bandwidth"), 0);
	assert_int_equal(lmt__opt_int(*state, "max-iterate-ms"), 50 * NS_PER_MS);
	assert_true(lmt__opt_bool(*state, "zero-page-detection"));
	assert_false(lmt__opt_bool(*state, "verify"));
	assert_int_equal(lmt__opt_int(*state, "connect-timeout"), 10 * NS_PER_S);
	assert_int_equal(lmt__opt_int(*state, "idle-timeout"), 30 * NS_PER_S);
	assert_int_equal(lmt__opt_int(*state, "queue-depth"), 64);
	assert_false(lmt__opt_bool(*state, "direct-io"));
	assert_int_equal(lmt__opt_int(*state, "switchover-bandwidth"), 0);
	assert_string_equal(lmt__opt_text(*state, "downtime-limit"), "300ms");
}

static void test_core_schema_is_complete(void **state)
{
	uint32_t count = 0;
	const struct lmt_option_desc *core = lmt_core_options(&count);

	assert_null(lmt_core_options(NULL));
	assert_int_equal(count, 29);
	for (uint32_t i = 0; i < count; i++) {
		assert_non_null(core[i].doc);
		assert_true(strlen(core[i].doc) > 10);
		assert_non_null(core[i].default_value);
	}
	assert_int_equal(core_desc("chunk-size")->flags, LMT_OPTF_POW2 | LMT_OPTF_MATCH);
	assert_int_equal(core_desc("verify")->flags, LMT_OPTF_MATCH);
	assert_int_equal(core_desc("downtime-limit")->max, 3600 * NS_PER_S);
	assert_int_equal(core_desc("auth-key")->flags, LMT_OPTF_SECRET);
	assert_int_equal(core_desc("auth-key-file")->type, LMT_OPT_STRING);
	assert_int_equal(core_desc("switchover-timeout")->type, LMT_OPT_DURATION);
	assert_int_equal(core_desc("switchover-bandwidth")->type, LMT_OPT_SIZE);
	/* tls is not flagged must-match: a mismatch shows in the first bytes,
	 * before any HELLO could compare it. */
	assert_int_equal(core_desc("tls")->type, LMT_OPT_BOOL);
	assert_int_equal(core_desc("tls")->flags, 0);
	assert_string_equal(core_desc("tls")->default_value, "off");
	assert_int_equal(core_desc("tls-ca")->type, LMT_OPT_STRING);
	/* Each side's own: a destination without it refuses postcopy. */
	assert_int_equal(core_desc("userfaultfd")->type, LMT_OPT_BOOL);
	assert_int_equal(core_desc("userfaultfd")->flags, 0);
	assert_string_equal(core_desc("userfaultfd")->default_value, "on");
}

static void test_env_overrides_default(void **state)
{
	struct lmt_error err = {0};

	setenv("LMT_CHUNK_SIZE", "4M", 1);
	setenv("LMT_DOWNTIME_LIMIT", "2s", 1);
	assert_int_equal(lmt__optset_load_env(*state, &err), 0);
	assert_int_equal(lmt__opt_int(*state, "chunk-size"), 4 << 20);
	assert_int_equal(lmt__opt_int(*state, "downtime-limit"), 2 * NS_PER_S);
	assert_int_equal(lmt__opt_int(*state, "channels"), 1);
}

static void test_explicit_overrides_env_whatever_the_order(void **state)
{
	struct lmt_optset *later = NULL;
	struct lmt_error err = {0};

	setenv("LMT_CHANNELS", "4", 1);
	assert_int_equal(lmt__optset_load_env(*state, &err), 0);
	assert_set_ok(*state, "channels", "8");
	assert_int_equal(lmt__opt_int(*state, "channels"), 8);

	assert_int_equal(lmt__optset_new(&later), 0);
	add_core(later);
	assert_set_ok(later, "channels", "8");
	assert_int_equal(lmt__optset_load_env(later, &err), 0);
	assert_int_equal(lmt__opt_int(later, "channels"), 8);
	lmt__optset_free(later);
}

static void test_default_does_not_override_env(void **state)
{
	struct lmt_error err = {0};

	setenv("LMT_QUEUE_DEPTH", "16", 1);
	assert_int_equal(lmt__optset_load_env(*state, &err), 0);
	assert_int_equal(lmt__optset_set(*state, "queue-depth", "32", LMT_OPT_SRC_DEFAULT, &err),
	                 0);
	assert_int_equal(lmt__opt_int(*state, "queue-depth"), 16);
}

static void test_later_explicit_value_wins(void **state)
{
	assert_set_ok(*state, "channels", "2");
	assert_set_ok(*state, "channels", "3");
	assert_int_equal(lmt__opt_int(*state, "channels"), 3);
}

static void test_lower_source_value_is_still_validated(void **state)
{
	struct lmt_error err = {0};

	assert_set_ok(*state, "chunk-size", "2M");
	setenv("LMT_CHUNK_SIZE", "3M", 1);
	assert_int_equal(lmt__optset_load_env(*state, &err), -LMT_EINVAL);
	assert_int_equal(lmt__opt_int(*state, "chunk-size"), 2 << 20);
}

static void test_bad_env_value_names_variable(void **state)
{
	struct lmt_error err = {0};

	setenv("LMT_CHUNK_SIZE", "3M", 1);
	assert_int_equal(lmt__optset_load_env(*state, &err), -LMT_EINVAL);
	assert_int_equal(err.code, -LMT_EINVAL);
	assert_string_equal(err.message, "LMT_CHUNK_SIZE: chunk-size: expected a power of two "
	                                 "from 4K to 1G, got '3M'");
}

static void test_bad_env_value_leaves_set_unchanged(void **state)
{
	struct lmt_error err = {0};

	setenv("LMT_CHANNELS", "4", 1);
	setenv("LMT_TCP_MODE", "sideways", 1);
	assert_int_equal(lmt__optset_load_env(*state, &err), -LMT_EINVAL);
	assert_string_equal(err.message, "LMT_TCP_MODE: tcp.mode: expected one of stream, "
	                                 "zerocopy, got 'sideways'");
	assert_int_equal(lmt__opt_int(*state, "channels"), 1);
}

static void test_empty_env_value_is_rejected(void **state)
{
	struct lmt_error err = {0};

	setenv("LMT_VERIFY", "", 1);
	assert_int_equal(lmt__optset_load_env(*state, &err), -LMT_EINVAL);
	assert_string_equal(err.message, "LMT_VERIFY: verify: expected on or off, got ''");
}

static void test_plugin_env_variable_is_namespaced(void **state)
{
	struct lmt_error err = {0};

	setenv("LMT_TCP_NODELAY", "off", 1);
	setenv("LMT_TCP_BIND_DEVICE", "eth1", 1);
	assert_int_equal(lmt__optset_load_env(*state, &err), 0);
	assert_false(lmt__opt_bool(*state, "tcp.nodelay"));
	assert_string_equal(lmt__opt_text(*state, "tcp.bind-device"), "eth1");
}

static void test_plugin_option_is_namespaced(void **state)
{
	struct lmt_option_value value;

	assert_int_equal(lmt__optset_get(*state, "tcp.nodelay", &value), 0);
	assert_int_equal(value.type, LMT_OPT_BOOL);
	assert_true(value.boolean);
	assert_int_equal(lmt__optset_get(*state, "nodelay", &value), -LMT_ENOTFOUND);
	assert_set_fails(*state, "nodelay", "off", -LMT_ENOTFOUND,
	                 "nodelay: unknown option; did you mean 'tcp.nodelay'?");
}

static void test_get_unknown_returns_not_found(void **state)
{
	struct lmt_option_value value;

	assert_int_equal(lmt__optset_get(*state, "no-such-option", &value), -LMT_ENOTFOUND);
	assert_int_equal(lmt__optset_get(*state, "CHUNK-SIZE", &value), -LMT_ENOTFOUND);
	assert_int_equal(lmt__optset_get(*state, NULL, &value), -LMT_EINVAL);
}

static void test_parse_sets_several_options(void **state)
{
	struct lmt_error err = {0};

	assert_int_equal(lmt__optset_parse(*state,
	                                   "chunk-size=64M,channels=2,tcp.mode=zerocopy,"
	                                   "tcp.bind-device=a=b",
	                                   &err),
	                 0);
	assert_int_equal(lmt__opt_int(*state, "chunk-size"), 64 << 20);
	assert_int_equal(lmt__opt_int(*state, "channels"), 2);
	assert_string_equal(lmt__opt_text(*state, "tcp.mode"), "zerocopy");
	assert_string_equal(lmt__opt_text(*state, "tcp.bind-device"), "a=b");
}

static int record_source(void *opaque, const char *name, const struct lmt_option_desc *desc,
                         const struct lmt_option_value *value, const char *text,
                         enum lmt_opt_source source)
{
	if (strcmp(name, opaque) == 0)
		return 100 + (int)source;
	return 0;
}

static void test_parse_is_explicit(void **state)
{
	struct lmt_error err = {0};

	setenv("LMT_CHANNELS", "4", 1);
	assert_int_equal(lmt__optset_parse(*state, "channels=2", &err), 0);
	assert_int_equal(lmt__optset_load_env(*state, &err), 0);
	assert_int_equal(lmt__opt_int(*state, "channels"), 2);
	assert_int_equal(lmt__optset_foreach(*state, record_source, "channels"),
	                 100 + LMT_OPT_SRC_EXPLICIT);
}

static void test_parse_accepts_empty_and_null(void **state)
{
	struct lmt_error err = {0};

	assert_int_equal(lmt__optset_parse(*state, "", &err), 0);
	assert_int_equal(lmt__optset_parse(*state, NULL, &err), 0);
	assert_int_equal(lmt__opt_int(*state, "channels"), 1);
}

static void test_parse_rejects_item_without_equals(void **state)
{
	struct lmt_error err = {0};

	assert_int_equal(lmt__optset_parse(*state, "channels=2,verify", &err), -LMT_EINVAL);
	assert_string_equal(err.message, "expected key=value, got 'verify'");
	assert_int_equal(lmt__optset_parse(*state, "channels=2,", &err), -LMT_EINVAL);
	assert_string_equal(err.message, "expected key=value, got ''");
}

static void test_parse_rejects_empty_key(void **state)
{
	struct lmt_error err = {0};

	assert_int_equal(lmt__optset_parse(*state, "=4", &err), -LMT_EINVAL);
	assert_string_equal(err.message, "expected key=value, got '=4'");
}

static void test_parse_is_all_or_nothing(void **state)
{
	struct lmt_error err = {0};

	assert_int_equal(lmt__optset_parse(*state, "channels=2,chunk-size=3M", &err), -LMT_EINVAL);
	assert_string_equal(err.message,
	                    "chunk-size: expected a power of two from 4K to 1G, got '3M'");
	assert_int_equal(lmt__opt_int(*state, "channels"), 1);
	assert_int_equal(lmt__optset_parse(*state, "channels=2,chunk-sise=4M", &err),
	                 -LMT_ENOTFOUND);
	assert_int_equal(lmt__opt_int(*state, "channels"), 1);
}

static void test_parse_value_may_be_empty_string(void **state)
{
	struct lmt_error err = {0};

	assert_set_ok(*state, "tcp.bind-device", "eth0");
	assert_int_equal(lmt__optset_parse(*state, "tcp.bind-device=", &err), 0);
	assert_string_equal(lmt__opt_text(*state, "tcp.bind-device"), "");
}

static void test_unknown_option_suggests_closest(void **state)
{
	assert_set_fails(*state, "chunk-sise", "4M", -LMT_ENOTFOUND,
	                 "chunk-sise: unknown option; did you mean 'chunk-size'?");
	assert_set_fails(*state, "chanels", "2", -LMT_ENOTFOUND,
	                 "chanels: unknown option; did you mean 'channels'?");
	assert_set_fails(*state, "chunk_size", "4M", -LMT_ENOTFOUND,
	                 "chunk_size: unknown option; did you mean 'chunk-size'?");
	assert_set_fails(*state, "tcp.nodelya", "on", -LMT_ENOTFOUND,
	                 "tcp.nodelya: unknown option; did you mean 'tcp.nodelay'?");
}

static void test_unknown_option_without_close_name(void **state)
{
	assert_set_fails(*state, "frobnicate", "1", -LMT_ENOTFOUND,
	                 "frobnicate: unknown option (lmt-info lists them all)");
	assert_set_fails(*state, "x", "1", -LMT_ENOTFOUND,
	                 "x: unknown option (lmt-info lists them all)");
}

static void test_unknown_option_in_list(void **state)
{
	struct lmt_error err = {0};

	assert_int_equal(lmt__optset_parse(*state, "verfy=on", &err), -LMT_ENOTFOUND);
	assert_string_equal(err.message, "verfy: unknown option; did you mean 'verify'?");
}

static void test_duplicate_namespace_is_rejected(void **state)
{
	struct lmt_error err = {0};

	assert_int_equal(lmt__optset_add_schema(*state, "tcp", tcp_options, TCP_OPTION_COUNT, &err),
	                 -LMT_EINVAL);
	assert_string_equal(err.message, "plugin 'tcp': options already added");
}

static void test_core_schema_added_twice_is_rejected(void **state)
{
	struct lmt_error err = {0};
	uint32_t count;
	const struct lmt_option_desc *core = lmt_core_options(&count);

	assert_int_equal(lmt__optset_add_schema(*state, NULL, core, count, &err), -LMT_EINVAL);
	assert_string_equal(err.message, "core schema: options already added");
}

static void test_duplicate_option_name_is_rejected(void **state)
{
	static const struct lmt_option_desc twice[] = {
	        {.name = "depth", .type = LMT_OPT_INT, .default_value = "1"},
	        {.name = "depth", .type = LMT_OPT_INT, .default_value = "2"},
	};
	struct lmt_error err = {0};
	struct lmt_option_value value;

	assert_int_equal(lmt__optset_add_schema(*state, "ofi", twice, 2, &err), -LMT_EINVAL);
	assert_string_equal(err.message, "plugin 'ofi': ofi.depth is declared twice");
	assert_int_equal(lmt__optset_get(*state, "ofi.depth", &value), -LMT_ENOTFOUND);
}

static void test_env_name_collision_is_rejected(void **state)
{
	static const struct lmt_option_desc clash[] = {
	        {.name = "no_delay", .type = LMT_OPT_BOOL, .default_value = "on"},
	        {.name = "no-delay", .type = LMT_OPT_BOOL, .default_value = "on"},
	};
	struct lmt_error err = {0};

	assert_int_equal(lmt__optset_add_schema(*state, "ucx", clash, 2, &err), -LMT_EINVAL);
	assert_string_equal(err.message, "plugin 'ucx': ucx.no_delay and ucx.no-delay share "
	                                 "the variable LMT_UCX_NO_DELAY");
}

static void test_bad_plugin_default_is_an_error(void **state)
{
	static const struct lmt_option_desc broken[] = {
	        {.name = "fine", .type = LMT_OPT_INT, .default_value = "1"},
	        {.name = "nodelay", .type = LMT_OPT_BOOL, .default_value = "maybe"},
	};
	struct lmt_error err = {0};
	struct lmt_option_value value;

	assert_int_equal(lmt__optset_add_schema(*state, "verbs", broken, 2, &err), -LMT_EINVAL);
	assert_string_equal(err.message, "plugin 'verbs': bad default: verbs.nodelay: expected "
	                                 "on or off, got 'maybe'");
	assert_int_equal(lmt__optset_get(*state, "verbs.fine", &value), -LMT_ENOTFOUND);
}

static void test_failed_schema_can_be_added_again_fixed(void **state)
{
	static const struct lmt_option_desc broken[] = {
	        {.name = "depth", .type = LMT_OPT_INT, .default_value = "0", .min = 1, .max = 8},
	};
	static const struct lmt_option_desc fixed[] = {
	        {.name = "depth", .type = LMT_OPT_INT, .default_value = "4", .min = 1, .max = 8},
	};
	struct lmt_error err = {0};

	assert_int_equal(lmt__optset_add_schema(*state, "verbs", broken, 1, &err), -LMT_EINVAL);
	assert_int_equal(lmt__optset_add_schema(*state, "verbs", fixed, 1, &err), 0);
	assert_int_equal(lmt__opt_int(*state, "verbs.depth"), 4);
}

static void test_missing_default_is_an_error_except_for_strings(void **state)
{
	static const struct lmt_option_desc no_default[] = {
	        {.name = "label", .type = LMT_OPT_STRING},
	        {.name = "depth", .type = LMT_OPT_INT},
	};
	struct lmt_error err = {0};

	assert_int_equal(lmt__optset_add_schema(*state, "ofi", no_default, 2, &err), -LMT_EINVAL);
	assert_string_equal(err.message, "plugin 'ofi': ofi.depth has no default");
	assert_int_equal(lmt__optset_add_schema(*state, "ofi", no_default, 1, &err), 0);
	assert_string_equal(lmt__opt_text(*state, "ofi.label"), "");
}

static void test_invalid_schema_is_rejected(void **state)
{
	static const struct lmt_option_desc upper[] = {
	        {.name = "NoDelay", .type = LMT_OPT_BOOL, .default_value = "on"},
	};
	static const struct lmt_option_desc dotted[] = {
	        {.name = "a.b", .type = LMT_OPT_BOOL, .default_value = "on"},
	};
	static const struct lmt_option_desc backwards[] = {
	        {.name = "depth", .type = LMT_OPT_INT, .default_value = "4", .min = 8, .max = 1},
	};
	static const struct lmt_option_desc no_values[] = {
	        {.name = "mode", .type = LMT_OPT_ENUM, .default_value = "a"},
	};
	struct lmt_error err = {0};

	assert_int_equal(lmt__optset_add_schema(*state, "a", upper, 1, &err), -LMT_EINVAL);
	assert_string_equal(err.message, "plugin 'a': option name 'NoDelay' is not [a-z0-9_-]+");
	assert_int_equal(lmt__optset_add_schema(*state, "b", dotted, 1, &err), -LMT_EINVAL);
	assert_int_equal(lmt__optset_add_schema(*state, "c", backwards, 1, &err), -LMT_EINVAL);
	assert_string_equal(err.message, "plugin 'c': c.depth has a bad range");
	assert_int_equal(lmt__optset_add_schema(*state, "d", no_values, 1, &err), -LMT_EINVAL);
	assert_string_equal(err.message, "plugin 'd': d.mode is an enum without values");
	assert_int_equal(lmt__optset_add_schema(*state, "Bad", NULL, 0, &err), -LMT_EINVAL);
	assert_string_equal(err.message, "'Bad' is not a valid option namespace");
}

static void test_schema_count_is_limited(void **state)
{
	static const char *const names[] = {"p1", "p2", "p3", "p4", "p5", "p6", "p7"};
	struct lmt_error err = {0};

	/* The core and tcp are in already: six more fit, the seventh does not. */
	for (size_t i = 0; i < 6; i++)
		assert_int_equal(lmt__optset_add_schema(*state, names[i], NULL, 0, &err), 0);
	assert_int_equal(lmt__optset_add_schema(*state, names[6], NULL, 0, &err), -LMT_EOVERFLOW);
	assert_string_equal(err.message, "plugin 'p7': more than 8 option schemas");
}

struct visit_log {
	int calls;
	int tcp_calls;
	int explicit_calls;
	int env_calls;
	char token_text[32];
	char chunk_text[32];
};

static int log_visit(void *opaque, const char *name, const struct lmt_option_desc *desc,
                     const struct lmt_option_value *value, const char *text,
                     enum lmt_opt_source source)
{
	struct visit_log *log = opaque;

	log->calls++;
	log->tcp_calls += strncmp(name, "tcp.", 4) == 0;
	log->explicit_calls += source == LMT_OPT_SRC_EXPLICIT;
	log->env_calls += source == LMT_OPT_SRC_ENV;
	assert_int_equal(value->type, desc->type);
	if (strcmp(name, "tcp.token") == 0)
		snprintf(log->token_text, sizeof(log->token_text), "%s", text);
	if (strcmp(name, "chunk-size") == 0)
		snprintf(log->chunk_text, sizeof(log->chunk_text), "%s", text);
	return 0;
}

static void test_foreach_visits_every_option_with_source(void **state)
{
	struct visit_log log = {0};
	struct lmt_error err = {0};
	uint32_t core_count;

	lmt_core_options(&core_count);
	setenv("LMT_VERIFY", "on", 1);
	assert_int_equal(lmt__optset_load_env(*state, &err), 0);
	assert_set_ok(*state, "chunk-size", "2M");
	assert_set_ok(*state, "tcp.mode", "zerocopy");
	assert_int_equal(lmt__optset_foreach(*state, log_visit, &log), 0);
	assert_int_equal(log.calls, core_count + TCP_OPTION_COUNT);
	assert_int_equal(log.tcp_calls, TCP_OPTION_COUNT);
	assert_int_equal(log.explicit_calls, 2);
	assert_int_equal(log.env_calls, 1);
	assert_string_equal(log.chunk_text, "2M");
	assert_int_equal(lmt__optset_foreach(*state, record_source, "verify"),
	                 100 + LMT_OPT_SRC_ENV);
	assert_int_equal(lmt__optset_foreach(*state, record_source, "pin-all"),
	                 100 + LMT_OPT_SRC_DEFAULT);
}

static void test_foreach_hides_secret_values(void **state)
{
	struct visit_log log = {0};

	assert_int_equal(lmt__optset_foreach(*state, log_visit, &log), 0);
	assert_string_equal(log.token_text, "(secret)");
	assert_string_equal(lmt__opt_text(*state, "tcp.token"), "hunter2");
}

static int stop_at_channels(void *opaque, const char *name, const struct lmt_option_desc *desc,
                            const struct lmt_option_value *value, const char *text,
                            enum lmt_opt_source source)
{
	int *calls = opaque;

	(*calls)++;
	return strcmp(name, "channels") == 0 ? -42 : 0;
}

static void test_foreach_stops_when_visitor_returns_non_zero(void **state)
{
	int calls = 0;

	assert_int_equal(lmt__optset_foreach(*state, stop_at_channels, &calls), -42);
	assert_int_equal(calls, 3);
}

static void capture_log(void *opaque, enum lmt_log_level level, const char *msg)
{
	snprintf(opaque, 256, "%s", msg);
}

static void test_missing_name_gives_zero_values(void **state)
{
	char logged[256] = "";

	lmt_set_log_level(LMT_LOG_WARN);
	lmt_set_log_handler(capture_log, logged);
	assert_int_equal(lmt__opt_int(*state, "no-such"), 0);
	assert_false(lmt__opt_bool(*state, "no-such"));
	assert_string_equal(lmt__opt_text(*state, "no-such"), "");
	lmt_set_log_handler(NULL, NULL);
	assert_string_equal(logged, "internal error: no option named 'no-such'");
}

static void test_text_stays_valid_after_option_changes(void **state)
{
	struct lmt_option_value value;

	assert_set_ok(*state, "tcp.bind-device", "eth0");
	assert_int_equal(lmt__optset_get(*state, "tcp.bind-device", &value), 0);
	const char *old_text = lmt__opt_text(*state, "tcp.mode");
	assert_set_ok(*state, "tcp.bind-device", "eth1");
	assert_set_ok(*state, "tcp.mode", "zerocopy");
	assert_string_equal(value.text, "eth0");
	assert_string_equal(old_text, "stream");
}

static void test_failed_set_keeps_previous_value(void **state)
{
	assert_set_ok(*state, "tcp.mode", "zerocopy");
	assert_set_fails(*state, "tcp.mode", "bogus", -LMT_EINVAL, NULL);
	assert_string_equal(lmt__opt_text(*state, "tcp.mode"), "zerocopy");
	assert_int_equal(lmt__opt_int(*state, "tcp.mode"), 1);
}

static void test_set_rejects_bad_arguments(void **state)
{
	struct lmt_error err = {0};

	assert_int_equal(lmt__optset_set(*state, "channels", NULL, LMT_OPT_SRC_EXPLICIT, &err),
	                 -LMT_EINVAL);
	assert_int_equal(lmt__optset_set(*state, NULL, "1", LMT_OPT_SRC_EXPLICIT, &err),
	                 -LMT_EINVAL);
	assert_int_equal(lmt__optset_set(*state, "channels", "2", (enum lmt_opt_source)7, &err),
	                 -LMT_EINVAL);
	assert_int_equal(lmt__opt_int(*state, "channels"), 1);
}

static void test_optset_free_accepts_null(void **state)
{
	struct lmt_optset *empty = NULL;

	lmt__optset_free(NULL);
	assert_int_equal(lmt__optset_new(&empty), 0);
	assert_non_null(empty);
	assert_int_equal(lmt__optset_parse(empty, "", NULL), 0);
	assert_int_equal(lmt__optset_new(NULL), -LMT_EINVAL);
	lmt__optset_free(empty);
}

#define SET_TEST(fn) cmocka_unit_test_setup_teardown(fn, setup_set, teardown_set)

int main(void)
{
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_size_accepts_plain_bytes),
	        cmocka_unit_test(test_size_accepts_binary_suffixes),
	        cmocka_unit_test(test_size_unit_is_case_insensitive),
	        cmocka_unit_test(test_negative_size_is_rejected),
	        cmocka_unit_test(test_trailing_junk_is_rejected),
	        cmocka_unit_test(test_whitespace_is_rejected),
	        cmocka_unit_test(test_size_without_digits_is_rejected),
	        cmocka_unit_test(test_overflow_is_rejected),
	        cmocka_unit_test(test_unit_multiplication_overflow_is_rejected),
	        cmocka_unit_test(test_junk_wins_over_overflow),
	        cmocka_unit_test(test_parsers_reject_null),
	        cmocka_unit_test(test_duration_accepts_units),
	        cmocka_unit_test(test_duration_bare_number_is_milliseconds),
	        cmocka_unit_test(test_duration_rejects_signs_and_junk),
	        SET_TEST(test_chunk_size_rejects_non_power_of_two),
	        SET_TEST(test_chunk_size_rejects_out_of_range),
	        cmocka_unit_test(test_chunk_size_accepts_bounds),
	        SET_TEST(test_size_syntax_error_gives_examples),
	        SET_TEST(test_size_option_overflowing_int64_is_rejected),
	        SET_TEST(test_bounded_overflow_message_gives_range),
	        SET_TEST(test_int_rejects_out_of_range),
	        cmocka_unit_test(test_int_accepts_signed_decimal),
	        SET_TEST(test_int_rejects_junk),
	        cmocka_unit_test(test_int_overflow_is_rejected),
	        SET_TEST(test_pow2_int_rejects_other_numbers),
	        SET_TEST(test_bool_accepts_all_spellings),
	        SET_TEST(test_bool_rejects_other_words),
	        SET_TEST(test_duration_option_message_gives_examples),
	        SET_TEST(test_duration_option_rejects_out_of_range),
	        SET_TEST(test_duration_option_is_nanoseconds),
	        SET_TEST(test_enum_accepts_listed_values),
	        SET_TEST(test_enum_rejects_other_values),
	        SET_TEST(test_string_accepts_any_text_without_comma),
	        SET_TEST(test_string_rejects_comma),
	        SET_TEST(test_empty_value_is_rejected_except_for_strings),
	        SET_TEST(test_secret_value_is_not_echoed_in_errors),
	        cmocka_unit_test(test_parse_without_value_is_an_error),
	        cmocka_unit_test(test_parse_uses_the_given_name_in_messages),
	        cmocka_unit_test(test_format_uses_largest_exact_size_suffix),
	        cmocka_unit_test(test_format_uses_largest_exact_duration_unit),
	        cmocka_unit_test(test_format_bool_and_int),
	        cmocka_unit_test(test_format_enum_and_string),
	        SET_TEST(test_format_round_trips),
	        SET_TEST(test_format_canonicalises_spellings),
	        cmocka_unit_test(test_format_reports_short_buffer),
	        cmocka_unit_test(test_format_rejects_bad_values),
	        SET_TEST(test_defaults_are_applied),
	        cmocka_unit_test(test_core_schema_is_complete),
	        SET_TEST(test_env_overrides_default),
	        SET_TEST(test_explicit_overrides_env_whatever_the_order),
	        SET_TEST(test_default_does_not_override_env),
	        SET_TEST(test_later_explicit_value_wins),
	        SET_TEST(test_lower_source_value_is_still_validated),
	        SET_TEST(test_bad_env_value_names_variable),
	        SET_TEST(test_bad_env_value_leaves_set_unchanged),
	        SET_TEST(test_empty_env_value_is_rejected),
	        SET_TEST(test_plugin_env_variable_is_namespaced),
	        SET_TEST(test_plugin_option_is_namespaced),
	        SET_TEST(test_get_unknown_returns_not_found),
	        SET_TEST(test_parse_sets_several_options),
	        SET_TEST(test_parse_is_explicit),
	        SET_TEST(test_parse_accepts_empty_and_null),
	        SET_TEST(test_parse_rejects_item_without_equals),
	        SET_TEST(test_parse_rejects_empty_key),
	        SET_TEST(test_parse_is_all_or_nothing),
	        SET_TEST(test_parse_value_may_be_empty_string),
	        SET_TEST(test_unknown_option_suggests_closest),
	        SET_TEST(test_unknown_option_without_close_name),
	        SET_TEST(test_unknown_option_in_list),
	        SET_TEST(test_duplicate_namespace_is_rejected),
	        SET_TEST(test_core_schema_added_twice_is_rejected),
	        SET_TEST(test_duplicate_option_name_is_rejected),
	        SET_TEST(test_env_name_collision_is_rejected),
	        SET_TEST(test_bad_plugin_default_is_an_error),
	        SET_TEST(test_failed_schema_can_be_added_again_fixed),
	        SET_TEST(test_missing_default_is_an_error_except_for_strings),
	        SET_TEST(test_invalid_schema_is_rejected),
	        SET_TEST(test_schema_count_is_limited),
	        SET_TEST(test_foreach_visits_every_option_with_source),
	        SET_TEST(test_foreach_hides_secret_values),
	        SET_TEST(test_foreach_stops_when_visitor_returns_non_zero),
	        SET_TEST(test_missing_name_gives_zero_values),
	        SET_TEST(test_text_stays_valid_after_option_changes),
	        SET_TEST(test_failed_set_keeps_previous_value),
	        SET_TEST(test_set_rejects_bad_arguments),
	        cmocka_unit_test(test_optset_free_accepts_null),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
