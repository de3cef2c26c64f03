/* A file save's pause (file:PATH): with the guest paused the save writes
 * the last pass, its metadata, and syncs twice; the expected downtime
 * counts all of it, so a save that iterate called ready pauses within
 * downtime-limit and about as long as it was told. The syncs are timed
 * through chaos:file's flush-delay, a disk that takes that long to flush;
 * a dirtying guest's saves on the real disk are checked against their
 * estimates. With LMT_TEST_FILE_DIRECT=1 the saves use direct-io=on, or
 * the test exits 77 where the directory refuses O_DIRECT. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

/* The pause may take at most this many times what the estimate said when
 * iterate said ready (at most downtime-limit), and this much more: a
 * wake-up on a busy host, the disk's own jitter. The bound is on the
 * estimate, not on the limit itself, which a host with many more runnable
 * threads than cores does not keep whatever was measured moments before. */
#define PAUSE_FACTOR 3.0
#define PAUSE_SLACK_MS 30.0

static char test_dir[PATH_MAX - 64];
static const char *direct_opts = "direct-io=off";

struct pause {
	uint32_t pass;      /* the pass under way when iterate said ready */
	double expected_ms; /* what it said the pause would take */
	double actual_ms;
};

/* Save `ram`, dirtied at `rate` over `working_set` bytes, over `plugin`
 * with `opts`; the guest is paused when iterate says ready. */
static struct pause save(struct guest_ram *ram, const char *plugin, const char *opts, uint64_t rate,
                         uint64_t working_set)
{
	char all[512], path[PATH_MAX], uri[PATH_MAX + 8];
	snprintf(all, sizeof(all), "%s,%s", direct_opts, opts);
	snprintf(path, sizeof(path), "%s/pause.lmt", test_dir);
	snprintf(uri, sizeof(uri), "file:%s", path);
	lmt_session *s = session_on(LMT_ROLE_SOURCE, ram, plugin, all);
	assert_int_equal(lmt_session_set_dirty_sync(s, guest_dirty_sync, ram), 0);
	struct guest_workload *w = NULL;
	if (rate)
		assert_int_equal(guest_workload_start(&w, ram, working_set, rate, 3), 0);
	if (lmt_save_setup(s, uri))
		fail_msg("setup: %s", lmt_session_error(s)->message);
	struct lmt_iterate_result it = {0};
	uint64_t give_up = guest_now_ns() + 60000000000ull;
	while (!it.ready) {
		if (lmt_save_iterate(s, &it))
			fail_msg("iterate: %s", lmt_session_error(s)->message);
		if (guest_now_ns() > give_up)
			fail_msg("not ready within 60 s: %.1f ms expected for %llu KiB left",
			         (double)it.expected_downtime_ns / 1e6,
			         (unsigned long long)it.remaining_bytes >> 10);
	}
	guest_workload_pause(w);
	if (lmt_save_complete(s, "dev", 3))
		fail_msg("complete: %s", lmt_session_error(s)->message);
	guest_workload_stop(w);
	struct lmt_stats st;
	assert_int_equal(lmt_session_stats(s, &st), 0);
	lmt_session_free(s);
	unlink(path);
	struct pause p = {.pass = it.pass,
	                  .expected_ms = (double)it.expected_downtime_ns / 1e6,
	                  .actual_ms = (double)st.downtime_ns / 1e6};
	print_message("    ready in pass %u: %.1f ms expected, the pause took %.1f ms\n", p.pass,
	              p.expected_ms, p.actual_ms);
	return p;
}

static void pause_as_promised(const struct pause *p)
{
	if (p->actual_ms > PAUSE_FACTOR * p->expected_ms + PAUSE_SLACK_MS)
		fail_msg("the pause took %.1f ms, %.1f ms expected", p->actual_ms, p->expected_ms);
}

/* Each flush takes 60 ms more: the pause syncs twice (the pages and
 * metadata, then the commit record), 120 ms that the estimate counts from
 * the sync the passes made ahead of it, before it says ready. */
static void test_the_estimate_counts_the_pauses_syncs(void **state)
{
	const uint64_t bytes = 32ull << 20;
	struct guest_ram ram;
	ram_fill(&ram, bytes, 41);
	struct pause p =
	        save(&ram, "chaos:file", "chaos.flush-delay=60ms", 16ull << 20, 4ull << 20);
	ram_release(&ram);
	if (p.expected_ms < 120.0)
		fail_msg("%.1f ms expected: the pause's two syncs of 60 ms are not counted",
		         p.expected_ms);
	assert_true(p.actual_ms >= 120.0);
	pause_as_promised(&p);
}

/* A guest rewriting 128 MiB/s of 256 MiB saved to the disk, three times:
 * each pause within the limit and about as long as expected. */
static void test_a_dirtying_guests_save_pauses_as_expected(void **state)
{
	const uint64_t bytes = 512ull << 20;
	const char *opts[] = {"channels=1", "channels=2", "channels=2"};
	for (int i = 0; i < 3; i++) {
		struct guest_ram ram;
		ram_fill(&ram, bytes, 42 + (uint64_t)i);
		struct pause p = save(&ram, "file", opts[i], 128ull << 20, 256ull << 20);
		ram_release(&ram);
		pause_as_promised(&p);
	}
}

static int prepare_dir(bool direct)
{
	const char *base = getenv("LMT_TEST_FILE_DIR");
	if (!base || !*base)
		base = ".";
	mkdir(base, 0700);
	snprintf(test_dir, sizeof(test_dir), "%s/lmt-pause-XXXXXX", base);
	if (!mkdtemp(test_dir)) {
		fprintf(stderr, "cannot create a directory under %s: %s\n", base, strerror(errno));
		return 1;
	}
	if (!direct)
		return 0;
	char probe[PATH_MAX];
	snprintf(probe, sizeof(probe), "%s/probe", test_dir);
	int fd = open(probe, O_WRONLY | O_CREAT | O_DIRECT, 0600);
	int e = errno;
	unlink(probe);
	if (fd < 0) {
		printf("SKIP: %s refuses O_DIRECT (%s); direct-io=on needs a disk file system\n",
		       test_dir, strerror(e));
		rmdir(test_dir);
		return 77;
	}
	close(fd);
	direct_opts = "direct-io=on";
	return 0;
}

int main(void)
{
	const char *d = getenv("LMT_TEST_FILE_DIRECT");
	bool direct = d && strcmp(d, "1") == 0;
	int rc = prepare_dir(direct);
	if (rc)
		return rc;
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_the_estimate_counts_the_pauses_syncs),
	        cmocka_unit_test(test_a_dirtying_guests_save_pauses_as_expected),
	};
	rc = cmocka_run_group_tests_name(direct ? "file pauses, direct-io=on" : "file pauses",
	                                 tests, NULL, NULL);
	rmdir(test_dir);
	return rc;
}
