/* cmocka glue for a plugin's unit test on the plugin test harness
 * (plugin_harness.h): a harness failure fails the test with its reason;
 * assertions on what the plugin recorded through its host; loading the
 * plugin under test. Include after <cmocka.h>. */
#ifndef LMT_PLUGIN_TEST_H
#define LMT_PLUGIN_TEST_H

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plugin_harness.h"

/* Fail the test, with the run's reason, unless `ok`. */
#define PH_REQUIRE(run, ok)                                                                        \
	do {                                                                                       \
		if (!(ok))                                                                         \
			fail_msg("%s", (run)->why);                                                \
	} while (0)

/* The last (or the first) error `host` recorded has `code` (an LMT_E*
 * value) and a message containing `text`. */
#define PH_ASSERT_ERROR(host, code, text)                                                          \
	ph_assert_error_at((host), false, (code), (text), __FILE__, __LINE__)
#define PH_ASSERT_FIRST_ERROR(host, code, text)                                                    \
	ph_assert_error_at((host), true, (code), (text), __FILE__, __LINE__)
/* The plugin logged a line containing `text` through `host`. */
#define PH_ASSERT_LOGGED(host, text) ph_assert_logged_at((host), (text), __FILE__, __LINE__)

static inline void ph_assert_error_at(struct ph_host *host, bool first, int code, const char *text,
                                      const char *file, int line)
{
	char said[512];
	int got = first ? ph_host_first_error(host, said, sizeof(said))
	                : ph_host_last_error(host, said, sizeof(said));
	if (got == code && strstr(said, text))
		return;
	print_error("the %s's %s error: %s \"%s\"; expected %s with \"%s\"\n", host->role,
	            first ? "first" : "last", got ? lmt_err_name(-got) : "none", said,
	            lmt_err_name(-code), text);
	_fail(file, line);
}

static inline void ph_assert_logged_at(struct ph_host *host, const char *text, const char *file,
                                       int line)
{
	if (ph_host_logged(host, text))
		return;
	char log[2048];
	ph_host_log(host, log, sizeof(log));
	print_error("the %s logged no line with \"%s\"; its log ends:\n%s", host->role, text, log);
	_fail(file, line);
}

/* Load the plugin under test at `path` (from the environment variable
 * `env`, or the first argument), with `options` over the defaults. 0, or
 * -1 after saying why on stderr. */
static inline int ph_test_load(struct ph_config *cfg, const char *env, int argc, char **argv,
                               const char *options)
{
	const char *path = argc > 1 ? argv[1] : getenv(env);
	if (!path) {
		fprintf(stderr, "usage: %s PLUGIN.so (or set %s)\n", argv[0], env);
		return -1;
	}
	struct lmt_error err = {0};
	if (ph_load(cfg, path, options, &err) != 0) {
		fprintf(stderr, "%s: cannot load %s: %s\n", argv[0], path, err.message);
		ph_unload(cfg);
		return -1;
	}
	return 0;
}

/* ---- A destination for a forged source ------------------------------------ */

/* A one-channel destination (the pair's source side stays closed) with a
 * guarded region of `len` bytes and its endpoint open, for a test that
 * plays the source itself with forged traffic: the test connects its
 * forger to pair.dst.addr[0] and gives ep_connect the forger's address. */
struct ph_forged {
	struct ph_run run;
	struct ph_pair pair;
	struct ph_region region;
};

static inline void ph_forged_open(struct ph_forged *f, const struct ph_config *cfg, size_t len,
                                  uint64_t timeout_ns)
{
	f->run = (struct ph_run){.cfg = cfg};
	ph_pair_init(&f->pair, cfg);
	f->pair.channels = 1;
	struct ph_side *dst = &f->pair.dst;
	PH_REQUIRE(&f->run, ph_instance_open(&f->run, dst, LMT_ROLE_DESTINATION, 1, timeout_ns));
	assert_int_equal(cfg->plugin->ops.ep_open(dst->inst, 0, &dst->ep[0], &dst->addr[0]), 0);
	PH_REQUIRE(&f->run, ph_region_open(&f->run, &f->pair, &f->region, len));
}

static inline void ph_forged_close(struct ph_forged *f)
{
	ph_region_close(&f->pair, &f->region);
	ph_pair_close(&f->pair);
}

/* The destination refused what was forged: its progress fails with
 * LMT_EPROTO and a first error containing `expect`, and the region is as
 * it was (guards intact, all zero). */
static inline void ph_forged_refused(struct ph_forged *f, const char *expect)
{
	struct lmt_completion c[4];
	assert_int_equal(f->run.cfg->plugin->ops.progress(f->pair.dst.inst, c, 4, 5 * PH_SECOND),
	                 -LMT_EPROTO);
	PH_ASSERT_FIRST_ERROR(&f->pair.dst.host, LMT_EPROTO, expect);
	PH_REQUIRE(&f->run,
	           ph_region_guards_intact(&f->run, &f->region) &&
	                   ph_all_zero(&f->run, "the region", f->region.mem, f->region.len, 0));
}

#endif
