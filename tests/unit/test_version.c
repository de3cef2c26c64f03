/* Unit tests of the version: generated once from the project's (meson
 * passes it here as LMT_TEST_PROJECT_VERSION), the same in the header and
 * in the library. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>

#include <lmt/lmt.h>

static void test_library_version_is_the_project_version(void **state)
{
	assert_string_equal(lmt_version(), LMT_TEST_PROJECT_VERSION);
}

static void test_header_version_is_the_project_version(void **state)
{
	assert_string_equal(LMT_VERSION, LMT_TEST_PROJECT_VERSION);
	assert_string_equal(LMT_VERSION_STRING, LMT_VERSION);
}

static void test_version_numbers_spell_the_version(void **state)
{
	char text[64];

	snprintf(text, sizeof(text), "%d.%d.%d", LMT_VERSION_MAJOR, LMT_VERSION_MINOR,
	         LMT_VERSION_PATCH);
	assert_string_equal(text, LMT_VERSION);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_library_version_is_the_project_version),
	        cmocka_unit_test(test_header_version_is_the_project_version),
	        cmocka_unit_test(test_version_numbers_spell_the_version),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
