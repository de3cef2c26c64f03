/* lmt-bench's JSON reader (tools/bench/bench-json.c), which reads QEMU's
 * QMP replies: it finds members by path, steps into arrays, reads numbers
 * and strings, and refuses what is not JSON without reading past it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "bench.h"

static const char *const reply =
        "{\"return\": {\"status\": \"completed\", \"setup-time\": 11, \"total-time\": 63,"
        " \"ram\": {\"transferred\": 67343298, \"multifd-bytes\": 67337984,"
        " \"mbps\": 10377.749, \"page-size\": 4096},"
        " \"socket-address\": [{\"port\": \"44177\", \"ipv4\": true, \"type\": \"inet\"}],"
        " \"error-desc\": \"a \\\"quoted\\\" word\\nand a line\"}, \"id\": \"lmt-bench-3\"}";

static void test_members_are_found_by_path_and_read_as_numbers(void **state)
{
	uint64_t value = 0;
	double mbps = 0;

	(void)state;
	assert_true(bench_json_valid(reply));
	assert_int_equal(bench_json_uint(reply, "return.ram.transferred", &value), 0);
	assert_int_equal(value, 67343298);
	assert_int_equal(bench_json_uint(reply, "return.total-time", &value), 0);
	assert_int_equal(value, 63);
	assert_int_equal(bench_json_double(reply, "return.ram.mbps", &mbps), 0);
	assert_true(mbps > 10377.7 && mbps < 10377.8);
	assert_null(bench_json_find(reply, "return.ram.absent"));
	assert_null(bench_json_find(reply, "return.status.deeper"));
	assert_int_equal(bench_json_uint(reply, "return.status", &value), -1);
}

static void test_an_array_is_stepped_into_at_its_first_element(void **state)
{
	char port[16];

	(void)state;
	assert_int_equal(bench_json_string(reply, "return.socket-address.port", port, sizeof(port)),
	                 0);
	assert_string_equal(port, "44177");
}

static void test_strings_are_unescaped_and_bounded(void **state)
{
	char text[64], small[6];
	char *dup;

	(void)state;
	assert_int_equal(bench_json_string(reply, "return.error-desc", text, sizeof(text)), 0);
	assert_string_equal(text, "a \"quoted\" word\nand a line");
	assert_int_equal(bench_json_string(reply, "return.error-desc", small, sizeof(small)), 0);
	assert_string_equal(small, "a \"qu");
	dup = bench_json_dup(reply, "return.ram");
	assert_non_null(dup);
	assert_true(bench_json_valid(dup));
	assert_int_equal(strncmp(dup, "{\"transferred\"", 14), 0);
	free(dup);
}

static void test_what_is_not_json_is_refused(void **state)
{
	static const char *const bad[] = {
	        "",
	        "{",
	        "{\"a\":}",
	        "{\"a\" 1}",
	        "[1,]",
	        "{\"a\":1,}",
	        "\"open",
	        "{\"a\":tru}",
	        "{\"a\":1} trailing",
	        "{\"a\":\"\x01\"}",
	        "{\"a\":-}",
	        "{\"a\":1.}",
	        "{\"a\":1e}",
	        "nul",
	};

	(void)state;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		assert_false(bench_json_valid(bad[i]));
	assert_true(bench_json_valid(" {\"a\": [1, -2.5e3, \"x\", null, false, {}]} "));
}

static void test_deep_nesting_is_refused_without_recursing_further(void **state)
{
	size_t depth = 100000;
	char *text = malloc(2 * depth + 1);

	(void)state;
	assert_non_null(text);
	memset(text, '[', depth);
	memset(text + depth, ']', depth);
	text[2 * depth] = '\0';
	assert_false(bench_json_valid(text));
	free(text);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_members_are_found_by_path_and_read_as_numbers),
	        cmocka_unit_test(test_an_array_is_stepped_into_at_its_first_element),
	        cmocka_unit_test(test_strings_are_unescaped_and_bounded),
	        cmocka_unit_test(test_what_is_not_json_is_refused),
	        cmocka_unit_test(test_deep_nesting_is_refused_without_recursing_further),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
