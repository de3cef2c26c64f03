/* Authentication of the handshake: matching keys migrate; a wrong or
 * missing key on either side is refused on both sides, with a clear error,
 * before any block, address or key is exchanged. Source and destination
 * run as two sessions of this process. */
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
#include <unistd.h>

#include "harness.h"

#define RAM_BYTES (4ull << 20)

/* Migrate a small guest between two sessions with the given options. */
static void migrate(const char *src_opts, const char *dst_opts, struct migration_side *src, struct migration_side *dst)
{
	migrate_in_process(src_opts, dst_opts, RAM_BYTES, 11, NULL, src, dst);
}

static void test_matching_keys_migrate(void **state)
{
	struct migration_side src, dst;
	migrate("auth-key=s3cret-shared", "auth-key=s3cret-shared", &src, &dst);
	assert_int_equal(src.rc, 0);
	assert_int_equal(dst.rc, 0);
}

static char key_path[] = "/tmp/lmt-test-key-XXXXXX";

static void write_key_file(const char *contents)
{
	int fd = mkstemp(key_path);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, contents, strlen(contents)), (ssize_t)strlen(contents));
	close(fd);
}

static void test_key_file_matches_the_same_key_given_inline(void **state)
{
	write_key_file("s3cret-shared\n");
	char opts[128];
	snprintf(opts, sizeof(opts), "auth-key-file=%s", key_path);
	struct migration_side src, dst;
	migrate(opts, "auth-key=s3cret-shared", &src, &dst);
	unlink(key_path);
	assert_int_equal(src.rc, 0);
	assert_int_equal(dst.rc, 0);
}

static void test_wrong_key_is_refused_on_both_sides(void **state)
{
	struct migration_side src, dst;
	/* The destination drops the connection and listens on until its
	 * wait ends, then reports why it dropped it. */
	migrate("auth-key=one-key", "auth-key=another-key,idle-timeout=1s", &src, &dst);
	assert_int_equal(src.rc, -LMT_EAUTH);
	assert_string_equal(src.error,
	                    "authentication failed: the destination does not hold this key");
	assert_int_equal(dst.rc, -LMT_EAUTH);
	assert_non_null(strstr(dst.error, "the source failed: authentication failed: the "
	                                  "destination does not hold this key"));
	assert_int_equal(dst.stats.status, LMT_STATUS_FAILED);
}

static void test_source_without_key_is_refused(void **state)
{
	struct migration_side src, dst;
	migrate("", "auth-key=needed,idle-timeout=1s", &src, &dst);
	assert_int_equal(src.rc, -LMT_EAUTH);
	assert_non_null(strstr(src.error, "the destination refused: authentication required"));
	assert_int_equal(dst.rc, -LMT_EAUTH);
	assert_non_null(strstr(dst.error, "the source holds no key"));
}

static void test_destination_without_key_is_refused_by_the_source(void **state)
{
	struct migration_side src, dst;
	migrate("auth-key=mine", "", &src, &dst);
	assert_int_equal(src.rc, -LMT_EAUTH);
	assert_string_equal(src.error, "the destination does not authenticate (it has no "
	                               "auth-key): refusing to send it guest memory");
	assert_int_equal(dst.rc, -LMT_EAUTH);
}

static void test_key_and_key_file_together_are_refused(void **state)
{
	struct guest_ram ram;
	ram_fill(&ram, RAM_BYTES, 12);
	lmt_session *s =
	        session_with_blocks(LMT_ROLE_SOURCE, &ram, "auth-key=a,auth-key-file=/dev/null");
	assert_int_equal(lmt_session_set_dirty_sync(s, guest_dirty_sync, &ram), 0);
	assert_int_equal(lmt_save_setup(s, "127.0.0.1:9"), -LMT_EINVAL);
	assert_string_equal(lmt_session_error(s)->message,
	                    "auth-key and auth-key-file: give only one");
	lmt_session_free(s);
	ram_release(&ram);
}

static void test_unreadable_key_file_is_named(void **state)
{
	struct guest_ram ram;
	ram_fill(&ram, RAM_BYTES, 13);
	lmt_session *s =
	        session_with_blocks(LMT_ROLE_SOURCE, &ram, "auth-key-file=/nonexistent/lmt.key");
	assert_int_equal(lmt_session_set_dirty_sync(s, guest_dirty_sync, &ram), 0);
	assert_int_equal(lmt_save_setup(s, "127.0.0.1:9"), -LMT_EINVAL);
	assert_string_equal(lmt_session_error(s)->message,
	                    "auth-key-file '/nonexistent/lmt.key': No such file or directory");
	lmt_session_free(s);
	ram_release(&ram);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_matching_keys_migrate),
	        cmocka_unit_test(test_key_file_matches_the_same_key_given_inline),
	        cmocka_unit_test(test_wrong_key_is_refused_on_both_sides),
	        cmocka_unit_test(test_source_without_key_is_refused),
	        cmocka_unit_test(test_destination_without_key_is_refused_by_the_source),
	        cmocka_unit_test(test_key_and_key_file_together_are_refused),
	        cmocka_unit_test(test_unreadable_key_file_is_named),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
