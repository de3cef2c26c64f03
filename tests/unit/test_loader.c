/* Loader tests: search path, messages for absent and broken plugins, ABI
 * negotiation, entry symbols borrowed from dependencies, duplicates, and
 * "decorator:plugin" specs. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <lmt/lmt.h>

static const char *test_plugins; /* build dir of tests/unit/fake-plugins */
static const char *tcp_plugin;   /* path of the built tcp.so */

static void plugin_path(char *buf, size_t size, const char *name)
{
	snprintf(buf, size, "%s/%s.so", test_plugins, name);
}

static void test_absent_plugin_lists_searched_dirs_and_available(void **state)
{
	struct lmt_error err = {0};
	lmt_plugin_handle *h = NULL;
	setenv("LMT_PLUGIN_PATH", "/nonexistent/lmt-a:/nonexistent/lmt-b", 1);
	assert_int_equal(lmt_plugin_open("nosuch", &h, &err), -LMT_ENOTFOUND);
	assert_null(h);
	assert_non_null(strstr(err.message, "plugin 'nosuch' not found"));
	assert_non_null(strstr(err.message, "/nonexistent/lmt-a, /nonexistent/lmt-b"));
	assert_non_null(strstr(err.message, "available: "));
	assert_non_null(strstr(err.message, "tcp")); /* the build tree is searched too */
	unsetenv("LMT_PLUGIN_PATH");
}

static void test_build_tree_plugin_loads_by_name(void **state)
{
	struct lmt_error err = {0};
	lmt_plugin_handle *h = NULL;
	assert_int_equal(lmt_plugin_open("tcp", &h, &err), 0);
	const struct lmt_plugin *d = lmt_plugin_descriptor(h);
	assert_string_equal(d->name, "tcp");
	assert_int_equal(d->abi_version, LMT_PLUGIN_ABI_VERSION);
	assert_non_null(strstr(lmt_plugin_path(h), "/plugins/tcp/tcp.so"));
	lmt_plugin_close(h);
}

static void test_path_is_used_as_given(void **state)
{
	struct lmt_error err = {0};
	lmt_plugin_handle *h = NULL;
	assert_int_equal(lmt_plugin_open(tcp_plugin, &h, &err), 0);
	assert_string_equal(lmt_plugin_path(h), tcp_plugin);
	lmt_plugin_close(h);
}

static void test_missing_path_says_so(void **state)
{
	struct lmt_error err = {0};
	lmt_plugin_handle *h = NULL;
	assert_int_equal(lmt_plugin_open("/nonexistent/x.so", &h, &err), -LMT_ENOTFOUND);
	assert_non_null(strstr(err.message, "/nonexistent/x.so"));
}

static void test_file_that_is_not_a_plugin_is_named(void **state)
{
	char path[PATH_MAX];
	struct lmt_error err = {0};
	lmt_plugin_handle *h = NULL;
	plugin_path(path, sizeof(path), "not_plugin");
	assert_int_equal(lmt_plugin_open(path, &h, &err), -LMT_EABI);
	assert_non_null(strstr(err.message, path));
	assert_non_null(strstr(err.message, "not an lmt plugin: no lmt_plugin_entry"));
}

static void test_garbage_file_reports_dlerror(void **state)
{
	char path[] = "/tmp/lmt-test-garbage-XXXXXX.so";
	int fd = mkstemps(path, 3);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, "not an ELF file", 15), 15);
	close(fd);
	struct lmt_error err = {0};
	lmt_plugin_handle *h = NULL;
	assert_int_equal(lmt_plugin_open(path, &h, &err), -LMT_EABI);
	assert_non_null(strstr(err.message, "cannot load"));
	assert_non_null(strstr(err.message, path));
	unlink(path);
}

static void test_too_new_abi_names_both_versions(void **state)
{
	char path[PATH_MAX];
	struct lmt_error err = {0};
	lmt_plugin_handle *h = NULL;
	plugin_path(path, sizeof(path), "too_new");
	assert_int_equal(lmt_plugin_open(path, &h, &err), -LMT_EABI);
	assert_non_null(strstr(err.message, "plugin speaks ABI v99, this lmt speaks v1 to v1"));
}

static void test_too_old_abi_names_both_versions(void **state)
{
	char path[PATH_MAX];
	struct lmt_error err = {0};
	lmt_plugin_handle *h = NULL;
	plugin_path(path, sizeof(path), "too_old");
	assert_int_equal(lmt_plugin_open(path, &h, &err), -LMT_EABI);
	assert_non_null(strstr(err.message, "plugin speaks ABI v0, this lmt speaks v1 to v1"));
}

static void test_entry_symbol_from_a_dependency_is_refused(void **state)
{
	char path[PATH_MAX];
	struct lmt_error err = {0};
	lmt_plugin_handle *h = NULL;
	plugin_path(path, sizeof(path), "borrowed");
	assert_int_equal(lmt_plugin_open(path, &h, &err), -LMT_EABI);
	assert_non_null(strstr(err.message, "lmt_plugin_entry comes from"));
	assert_non_null(strstr(err.message, "libentrylib"));
}

static void test_invalid_name_is_refused(void **state)
{
	struct lmt_error err = {0};
	lmt_plugin_handle *h = NULL;
	assert_int_equal(lmt_plugin_open("TCP!", &h, &err), -LMT_EINVAL);
	assert_non_null(strstr(err.message, "'TCP!'"));
}

/* Copy the tcp plugin to dir/name.so. */
static void install_copy(const char *dir, const char *name)
{
	char cmd[PATH_MAX * 3];
	snprintf(cmd, sizeof(cmd), "mkdir -p '%s' && cp '%s' '%s/%s.so'", dir, tcp_plugin, dir,
	         name);
	assert_int_equal(system(cmd), 0);
}

struct listing {
	int loaded;
	int failed;
	char first_tcp[PATH_MAX];
	char failure[1024];
};

static void visit(void *opaque, const char *path, const lmt_plugin_handle *plugin,
                  const struct lmt_error *err)
{
	struct listing *l = opaque;
	if (plugin) {
		l->loaded++;
		if (!l->first_tcp[0] && strcmp(lmt_plugin_descriptor(plugin)->name, "tcp") == 0)
			snprintf(l->first_tcp, sizeof(l->first_tcp), "%s", path);
	} else {
		l->failed++;
		snprintf(l->failure, sizeof(l->failure), "%s", err->message);
	}
}

static void test_duplicate_names_first_wins_and_the_other_is_reported(void **state)
{
	char a[] = "/tmp/lmt-test-dupA-XXXXXX", b[] = "/tmp/lmt-test-dupB-XXXXXX";
	assert_non_null(mkdtemp(a));
	assert_non_null(mkdtemp(b));
	install_copy(a, "tcp");
	install_copy(b, "tcp");
	char env[sizeof(a) + sizeof(b) + 2];
	snprintf(env, sizeof(env), "%s:%s", a, b);
	setenv("LMT_PLUGIN_PATH", env, 1);

	struct listing l = {0};
	lmt_plugin_list(visit, &l);
	char expect[PATH_MAX];
	snprintf(expect, sizeof(expect), "%s/tcp.so", a);
	assert_string_equal(l.first_tcp, expect);
	assert_true(l.failed >= 1);
	assert_non_null(strstr(l.failure, "duplicate plugin 'tcp'"));

	struct lmt_error err = {0};
	lmt_plugin_handle *h = NULL;
	assert_int_equal(lmt_plugin_open("tcp", &h, &err), 0);
	assert_string_equal(lmt_plugin_path(h), expect);
	lmt_plugin_close(h);
	unsetenv("LMT_PLUGIN_PATH");
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s' '%s'", a, b);
	assert_int_equal(system(cmd), 0);
}

static void test_file_name_must_match_declared_name(void **state)
{
	char a[] = "/tmp/lmt-test-name-XXXXXX";
	assert_non_null(mkdtemp(a));
	install_copy(a, "other");
	setenv("LMT_PLUGIN_PATH", a, 1);
	struct lmt_error err = {0};
	lmt_plugin_handle *h = NULL;
	assert_int_equal(lmt_plugin_open("other", &h, &err), -LMT_EABI);
	assert_non_null(strstr(err.message, "declares plugin 'tcp', expected 'other'"));
	unsetenv("LMT_PLUGIN_PATH");
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", a);
	assert_int_equal(system(cmd), 0);
}

static void test_search_path_lists_env_dirs_first(void **state)
{
	char buf[8192];
	setenv("LMT_PLUGIN_PATH", "/opt/x:/opt/y", 1);
	assert_int_equal(lmt_plugin_search_path(buf, sizeof(buf)), 0);
	assert_memory_equal(buf, "/opt/x:/opt/y:", 14);
	assert_non_null(strstr(buf, "/plugins/tcp"));
	unsetenv("LMT_PLUGIN_PATH");
}

/* What a session loads for "chaos:tcp": the decorator, then what it wraps. */
static void test_spec_with_a_decorator_opens_both_plugins(void **state)
{
	struct lmt_error err = {0};
	lmt_plugin_handle *plugin = NULL, *inner = NULL;
	assert_int_equal(lmt_plugin_open_spec("chaos:tcp", &plugin, &inner, &err), 0);
	assert_string_equal(lmt_plugin_descriptor(plugin)->name, "chaos");
	assert_true(lmt_plugin_descriptor(plugin)->caps & LMT_CAP_DECORATOR);
	assert_string_equal(lmt_plugin_descriptor(inner)->name, "tcp");
	lmt_plugin_close(inner);
	lmt_plugin_close(plugin);
}

static void test_spec_of_a_plain_plugin_has_no_inner(void **state)
{
	struct lmt_error err = {0};
	lmt_plugin_handle *plugin = NULL, *inner = NULL;
	assert_int_equal(lmt_plugin_open_spec("tcp", &plugin, &inner, &err), 0);
	assert_string_equal(lmt_plugin_descriptor(plugin)->name, "tcp");
	assert_null(inner);
	lmt_plugin_close(plugin);
}

static void test_spec_colon_in_a_directory_is_part_of_the_path(void **state)
{
	char dir[] = "/tmp/lmt-spec:XXXXXX", path[PATH_MAX];
	assert_non_null(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/tcp.so", dir);
	assert_int_equal(symlink(tcp_plugin, path), 0);
	struct lmt_error err = {0};
	lmt_plugin_handle *plugin = NULL, *inner = NULL;
	assert_int_equal(lmt_plugin_open_spec(path, &plugin, &inner, &err), 0);
	assert_string_equal(lmt_plugin_descriptor(plugin)->name, "tcp");
	assert_null(inner);
	lmt_plugin_close(plugin);
	unlink(path);
	rmdir(dir);
}

static void assert_spec_refused(const char *spec, const char *message)
{
	struct lmt_error err = {0};
	lmt_plugin_handle *plugin = (void *)1, *inner = (void *)1;
	assert_int_equal(lmt_plugin_open_spec(spec, &plugin, &inner, &err), -LMT_EINVAL);
	assert_null(plugin);
	assert_null(inner);
	assert_string_equal(err.message, message);
}

static void test_spec_decorator_alone_is_refused(void **state)
{
	assert_spec_refused("chaos",
	                    "plugin 'chaos' is a decorator: name the plugin it wraps, as in "
	                    "'chaos:tcp'");
}

static void test_spec_plain_plugin_cannot_wrap_another(void **state)
{
	assert_spec_refused("tcp:chaos",
	                    "plugin 'tcp:chaos': 'tcp' is not a decorator, so it cannot wrap "
	                    "'chaos'");
}

static void test_spec_decorator_cannot_wrap_a_decorator(void **state)
{
	assert_spec_refused("chaos:chaos", "plugin 'chaos:chaos': a decorator wraps one "
	                                   "transport, not another decorator");
}

int main(int argc, char **argv)
{
	test_plugins = getenv("LMT_TEST_PLUGIN_DIR");
	tcp_plugin = getenv("LMT_TEST_TCP_PLUGIN");
	if (!test_plugins || !tcp_plugin) {
		fprintf(stderr, "LMT_TEST_PLUGIN_DIR and LMT_TEST_TCP_PLUGIN must be set\n");
		return 1;
	}
	unsetenv("LMT_PLUGIN_PATH");
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_absent_plugin_lists_searched_dirs_and_available),
	        cmocka_unit_test(test_build_tree_plugin_loads_by_name),
	        cmocka_unit_test(test_path_is_used_as_given),
	        cmocka_unit_test(test_missing_path_says_so),
	        cmocka_unit_test(test_file_that_is_not_a_plugin_is_named),
	        cmocka_unit_test(test_garbage_file_reports_dlerror),
	        cmocka_unit_test(test_too_new_abi_names_both_versions),
	        cmocka_unit_test(test_too_old_abi_names_both_versions),
	        cmocka_unit_test(test_entry_symbol_from_a_dependency_is_refused),
	        cmocka_unit_test(test_invalid_name_is_refused),
	        cmocka_unit_test(test_duplicate_names_first_wins_and_the_other_is_reported),
	        cmocka_unit_test(test_file_name_must_match_declared_name),
	        cmocka_unit_test(test_search_path_lists_env_dirs_first),
	        cmocka_unit_test(test_spec_with_a_decorator_opens_both_plugins),
	        cmocka_unit_test(test_spec_of_a_plain_plugin_has_no_inner),
	        cmocka_unit_test(test_spec_colon_in_a_directory_is_part_of_the_path),
	        cmocka_unit_test(test_spec_decorator_alone_is_refused),
	        cmocka_unit_test(test_spec_plain_plugin_cannot_wrap_another),
	        cmocka_unit_test(test_spec_decorator_cannot_wrap_a_decorator),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
