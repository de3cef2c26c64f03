/* Statistics are honest at every instant: a thread samples both sides of
 * an in-process migration over tcp in a tight loop, and every snapshot
 * must hold together — per-channel bytes adding up to the total, figures
 * that only grow, a total time that runs and then stops (also after a
 * failure), no number standing for "unknown", a timeline without a gap —
 * for a migration that completes, one that fails midway and one completed
 * before it was ready. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "harness.h"

#define MS 1000000ull
#define MAX_PASSES 4096

/* One session the sampler watches, and what it saw. */
struct watch {
	lmt_session *s;
	enum lmt_role role;
	bool idle_guest; /* nothing dirtied: every byte is sent, skipped or left */
	uint64_t samples;
	uint64_t unknown_expected; /* samples without an expected downtime */
	struct lmt_stats last;
	bool have_last;
	char failure[768]; /* the first broken invariant */
	struct lmt_pass_stats passes[MAX_PASSES];
};

struct sampler {
	pthread_t thread;
	atomic_bool stop;
	struct watch *w[2];
	int n;
};

static int rank(enum lmt_status st)
{
	switch (st) {
	case LMT_STATUS_NEW:
		return 0;
	case LMT_STATUS_SETUP:
		return 1;
	case LMT_STATUS_ACTIVE:
		return 2;
	case LMT_STATUS_COMPLETING:
		return 3;
	default:
		return 4;
	}
}

static bool ended(enum lmt_status st)
{
	return rank(st) == 4;
}

/* Record the first broken invariant; the sampler thread cannot fail the
 * test itself. */
static void broken(struct watch *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void broken(struct watch *w, const char *fmt, ...)
{
	if (w->failure[0])
		return;
	int n = snprintf(w->failure, sizeof(w->failure),
	                 "%s sample %llu: ", w->role == LMT_ROLE_SOURCE ? "source" : "destination",
	                 (unsigned long long)w->samples);
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(w->failure + n, sizeof(w->failure) - (size_t)n, fmt, ap);
	va_end(ap);
}

static void check_channels(struct watch *w, const struct lmt_stats *st)
{
	uint64_t sum = 0;
	for (uint32_t c = 0; c < LMT_MAX_CHANNELS; c++) {
		if (c >= st->channels && st->channel_bytes[c])
			broken(w, "channel %u of %u has %llu bytes", c, st->channels,
			       (unsigned long long)st->channel_bytes[c]);
		sum += st->channel_bytes[c];
	}
	uint64_t total = w->role == LMT_ROLE_SOURCE ? st->bytes_sent : st->bytes_received;
	uint64_t other = w->role == LMT_ROLE_SOURCE ? st->bytes_received : st->bytes_sent;
	if (sum != total)
		broken(w, "channels add up to %llu bytes, the total is %llu",
		       (unsigned long long)sum, (unsigned long long)total);
	if (other)
		broken(w, "%llu bytes in the other role's count", (unsigned long long)other);
}

static void check_grows(struct watch *w, const struct lmt_stats *st)
{
	const struct lmt_stats *was = &w->last;
	if (!w->have_last)
		return;
	if (rank(st->status) < rank(was->status))
		broken(w, "status went back from %s to %s", lmt_status_name(was->status),
		       lmt_status_name(st->status));
	if (st->total_ns < was->total_ns)
		broken(w, "total time went back from %llu to %llu ns",
		       (unsigned long long)was->total_ns, (unsigned long long)st->total_ns);
	if (ended(was->status) && st->total_ns != was->total_ns)
		broken(w, "total time %llu ns still runs after the end at %llu",
		       (unsigned long long)st->total_ns, (unsigned long long)was->total_ns);
	if (st->bytes_sent < was->bytes_sent || st->bytes_received < was->bytes_received ||
	    st->writes < was->writes || st->normal_pages < was->normal_pages ||
	    st->zero_pages < was->zero_pages || st->passes < was->passes)
		broken(w, "a count went back");
}

static void check_times(struct watch *w, const struct lmt_stats *st)
{
	if (rank(st->status) >= 2 && st->total_ns == 0)
		broken(w, "no total time while %s", lmt_status_name(st->status));
	if (st->setup_ns > st->total_ns || st->downtime_ns > st->total_ns)
		broken(w, "setup %llu or downtime %llu ns beyond the total %llu",
		       (unsigned long long)st->setup_ns, (unsigned long long)st->downtime_ns,
		       (unsigned long long)st->total_ns);
	uint64_t bytes = st->bytes_sent + st->bytes_received;
	uint64_t want = st->total_ns ? (uint64_t)((double)bytes * 1e9 / (double)st->total_ns) : 0;
	if (st->throughput_bps + 1 < want || st->throughput_bps > want + 1)
		broken(w, "throughput %llu, the figures give %llu",
		       (unsigned long long)st->throughput_bps, (unsigned long long)want);
}

static void check_estimate(struct watch *w, const struct lmt_stats *st)
{
	char json[1024];
	int n = lmt_stats_json(st, json, sizeof(json));
	if (n <= 0 || (size_t)n >= sizeof(json))
		broken(w, "lmt_stats_json gave %d", n);
	if (strstr(json, "18446744073709"))
		broken(w, "a sentinel in %s", json);
	if (!st->expected_downtime_known) {
		w->unknown_expected++;
		if (st->expected_downtime_ns)
			broken(w, "unknown expected downtime of %llu ns",
			       (unsigned long long)st->expected_downtime_ns);
		if (!strstr(json, "\"expected_downtime_ms\":null"))
			broken(w, "unknown expected downtime not null in %s", json);
	} else if (w->role == LMT_ROLE_DESTINATION) {
		broken(w, "a destination with an expected downtime");
	} else if (st->expected_downtime_ns > 3600000 * MS) {
		broken(w, "expected downtime of %llu ns",
		       (unsigned long long)st->expected_downtime_ns);
	}
}

static void check_bytes(struct watch *w, const struct lmt_stats *st)
{
	if (w->role != LMT_ROLE_SOURCE) {
		/* zero_pages is both sides': on a destination, the pages zero
		 * runs made zero. */
		if (st->remaining_bytes || st->writes || st->normal_pages)
			broken(w, "a source's figure on a destination");
		return;
	}
	if (st->normal_pages * GUEST_PAGE_SIZE != st->bytes_sent)
		broken(w, "%llu pages written, %llu bytes sent",
		       (unsigned long long)st->normal_pages, (unsigned long long)st->bytes_sent);
	if (!st->passes)
		return;
	uint64_t accounted =
	        st->bytes_sent + st->remaining_bytes + st->zero_pages * GUEST_PAGE_SIZE;
	if (w->idle_guest ? accounted != st->ram_bytes : accounted < st->ram_bytes)
		broken(w, "sent %llu + left %llu + zero %llu pages against %llu bytes of RAM",
		       (unsigned long long)st->bytes_sent, (unsigned long long)st->remaining_bytes,
		       (unsigned long long)st->zero_pages, (unsigned long long)st->ram_bytes);
}

/* The timeline, taken before the stats: it can only be behind them. */
static void check_passes(struct watch *w, int n, const struct lmt_stats *st)
{
	uint64_t bytes = 0;
	if (n < 0 || (uint64_t)n > st->passes)
		broken(w, "%d passes recorded, %llu begun", n, (unsigned long long)st->passes);
	for (int i = 0; i < n && i < MAX_PASSES; i++) {
		const struct lmt_pass_stats *p = &w->passes[i];
		if (p->pass != (uint32_t)i + 1)
			broken(w, "entry %d is pass %u", i, p->pass);
		if (p->final && i != n - 1)
			broken(w, "final pass %u is not the last", p->pass);
		if (!p->expected_downtime_known && p->expected_downtime_ns)
			broken(w, "pass %u: unknown expected downtime of %llu ns", p->pass,
			       (unsigned long long)p->expected_downtime_ns);
		bytes += p->bytes;
	}
	if (bytes > st->bytes_sent)
		broken(w, "the passes wrote %llu bytes, %llu were sent", (unsigned long long)bytes,
		       (unsigned long long)st->bytes_sent);
	if (ended(st->status) && st->status == LMT_STATUS_COMPLETED && w->role == LMT_ROLE_SOURCE &&
	    (uint64_t)n != st->passes)
		broken(w, "completed with %d of %llu passes recorded", n,
		       (unsigned long long)st->passes);
}

static void sample(struct watch *w)
{
	struct lmt_stats st;
	int n = lmt_session_passes(w->s, w->passes, MAX_PASSES);
	if (lmt_session_stats(w->s, &st) != 0) {
		broken(w, "lmt_session_stats failed");
		return;
	}
	check_channels(w, &st);
	check_grows(w, &st);
	check_times(w, &st);
	check_estimate(w, &st);
	check_bytes(w, &st);
	if (w->role == LMT_ROLE_SOURCE)
		check_passes(w, n, &st);
	w->last = st;
	w->have_last = true;
	w->samples++;
}

static void *sampler_main(void *arg)
{
	struct sampler *sp = arg;
	while (!atomic_load(&sp->stop))
		for (int i = 0; i < sp->n; i++)
			sample(sp->w[i]);
	return NULL;
}

static void sampler_start(struct sampler *sp, struct watch *src, struct watch *dst)
{
	sp->w[0] = src;
	sp->w[1] = dst;
	sp->n = 2;
	atomic_store(&sp->stop, false);
	assert_int_equal(pthread_create(&sp->thread, NULL, sampler_main, sp), 0);
}

static void sleep_ms(uint64_t ms)
{
	struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)(ms * MS)};
	nanosleep(&ts, NULL);
}

/* Stop sampling, then check that the end holds still: a last sample
 * 20 ms later shows the same total time. */
static void sampler_stop(struct sampler *sp)
{
	atomic_store(&sp->stop, true);
	pthread_join(sp->thread, NULL);
	sleep_ms(20);
	for (int i = 0; i < sp->n; i++) {
		struct watch *w = sp->w[i];
		sample(w);
		if (w->failure[0])
			fail_msg("%s", w->failure);
		if (!ended(w->last.status))
			fail_msg("%s did not end: %s",
			         w->role == LMT_ROLE_SOURCE ? "source" : "destination",
			         lmt_status_name(w->last.status));
		print_message("    %s: %llu samples, %llu without an expected downtime\n",
		              w->role == LMT_ROLE_SOURCE ? "source" : "destination",
		              (unsigned long long)w->samples,
		              (unsigned long long)w->unknown_expected);
		assert_true(w->samples >= 20);
		assert_true(w->last.total_ns > 0);
	}
}

/* The destination, in this process, on a thread of its own. */
struct dest {
	lmt_session *s;
	pthread_t thread;
	int rc;
};

static void *dest_main(void *arg)
{
	struct dest *d = arg;
	d->rc = lmt_load_run(d->s);
	return NULL;
}

static uint16_t dest_start(struct dest *d, struct guest_ram *ram, const char *opts)
{
	d->s = session_on(LMT_ROLE_DESTINATION, ram, "tcp", opts);
	uint16_t port = 0;
	assert_int_equal(lmt_load_listen(d->s, "127.0.0.1:0", &port), 0);
	assert_int_equal(pthread_create(&d->thread, NULL, dest_main, d), 0);
	return port;
}

static lmt_session *source_to(struct guest_ram *ram, const char *plugin, const char *opts,
                              uint16_t port)
{
	lmt_session *s = session_on(LMT_ROLE_SOURCE, ram, plugin, opts);
	assert_int_equal(lmt_session_set_dirty_sync(s, guest_dirty_sync, ram), 0);
	return s;
}

static int setup_to(lmt_session *s, uint16_t port)
{
	char uri[64];
	snprintf(uri, sizeof(uri), "127.0.0.1:%u", port);
	return lmt_save_setup(s, uri);
}

static void test_every_snapshot_of_a_completed_migration_holds(void **state)
{
	const uint64_t bytes = 32ull << 20;
	const char *opts = "channels=2,verify=on,max-bandwidth=256M";
	struct guest_ram src, dst;
	ram_fill(&src, bytes, 31);
	guest_ram_layout(&dst, ram_map(bytes), bytes);
	struct guest_workload *work = NULL;
	assert_int_equal(guest_workload_start(&work, &src, 8u << 20, 32u << 20, 5), 0);
	struct dest d;
	uint16_t port = dest_start(&d, &dst, opts);
	lmt_session *s = source_to(&src, "tcp", opts, port);
	struct watch ws = {.s = s, .role = LMT_ROLE_SOURCE};
	struct watch wd = {.s = d.s, .role = LMT_ROLE_DESTINATION};
	struct sampler sp;
	sampler_start(&sp, &ws, &wd);
	if (setup_to(s, port))
		fail_msg("setup: %s", lmt_session_error(s)->message);
	struct lmt_iterate_result it = {0};
	while (!it.ready)
		if (lmt_save_iterate(s, &it))
			fail_msg("iterate: %s", lmt_session_error(s)->message);
	guest_workload_pause(work);
	if (lmt_save_complete(s, "cpu", 3))
		fail_msg("complete: %s", lmt_session_error(s)->message);
	pthread_join(d.thread, NULL);
	assert_int_equal(d.rc, 0);
	sampler_stop(&sp);
	assert_int_equal(ws.last.status, LMT_STATUS_COMPLETED);
	assert_int_equal(wd.last.status, LMT_STATUS_COMPLETED);
	/* What the destination counted is what the source sent, channel by
	 * channel. */
	assert_int_equal(wd.last.bytes_received, ws.last.bytes_sent);
	for (uint32_t c = 0; c < 2; c++)
		assert_int_equal(wd.last.channel_bytes[c], ws.last.channel_bytes[c]);
	assert_true(ws.last.expected_downtime_known);
	assert_memory_equal(src.base, dst.base, bytes);
	guest_workload_stop(work);
	lmt_session_free(s);
	lmt_session_free(d.s);
	ram_release(&src);
	munmap(dst.base, bytes);
}

static void test_every_snapshot_of_a_migration_failing_midway_holds(void **state)
{
	const uint64_t bytes = 16ull << 20;
	struct guest_ram src, dst;
	ram_fill(&src, bytes, 32);
	guest_ram_layout(&dst, ram_map(bytes), bytes);
	struct dest d;
	uint16_t port = dest_start(&d, &dst, "idle-timeout=2s");
	lmt_session *s = source_to(&src, "chaos:tcp",
	                           "idle-timeout=2s,max-bandwidth=64M,chaos.fault=fail-write,"
	                           "chaos.at=write:150",
	                           port);
	struct watch ws = {.s = s, .role = LMT_ROLE_SOURCE, .idle_guest = true};
	struct watch wd = {.s = d.s, .role = LMT_ROLE_DESTINATION};
	struct sampler sp;
	sampler_start(&sp, &ws, &wd);
	int rc = setup_to(s, port);
	struct lmt_iterate_result it = {0};
	while (!rc && !it.ready)
		rc = lmt_save_iterate(s, &it);
	assert_int_not_equal(rc, 0);
	pthread_join(d.thread, NULL);
	assert_int_not_equal(d.rc, 0);
	sampler_stop(&sp);
	assert_int_equal(ws.last.status, LMT_STATUS_FAILED);
	assert_int_equal(wd.last.status, LMT_STATUS_FAILED);
	/* Midway: some RAM went, some was left. */
	assert_true(ws.last.bytes_sent > 0 && ws.last.remaining_bytes > 0);
	assert_true(ws.unknown_expected > 0);
	lmt_session_free(s);
	lmt_session_free(d.s);
	ram_release(&src);
	munmap(dst.base, bytes);
}

/* A VMM may switch over before lmt says it is ready: the pass under way
 * is recorded as it stood (interrupted), and the final pass follows. */
static void test_every_snapshot_of_a_migration_completed_before_ready_holds(void **state)
{
	const uint64_t bytes = 16ull << 20;
	const char *opts = "max-bandwidth=32M";
	struct guest_ram src, dst;
	ram_fill(&src, bytes, 33);
	guest_ram_layout(&dst, ram_map(bytes), bytes);
	struct guest_workload *work = NULL;
	assert_int_equal(guest_workload_start(&work, &src, 4u << 20, 16u << 20, 6), 0);
	struct dest d;
	uint16_t port = dest_start(&d, &dst, opts);
	lmt_session *s = source_to(&src, "tcp", opts, port);
	struct watch ws = {.s = s, .role = LMT_ROLE_SOURCE};
	struct watch wd = {.s = d.s, .role = LMT_ROLE_DESTINATION};
	struct sampler sp;
	sampler_start(&sp, &ws, &wd);
	if (setup_to(s, port))
		fail_msg("setup: %s", lmt_session_error(s)->message);
	/* 16M at 32M/s takes longer than three calls of at most 50 ms. */
	struct lmt_iterate_result it = {0};
	for (int i = 0; i < 3; i++)
		if (lmt_save_iterate(s, &it))
			fail_msg("iterate: %s", lmt_session_error(s)->message);
	assert_false(it.ready);
	guest_workload_pause(work);
	if (lmt_save_complete(s, "cpu", 3))
		fail_msg("complete: %s", lmt_session_error(s)->message);
	pthread_join(d.thread, NULL);
	assert_int_equal(d.rc, 0);
	sampler_stop(&sp);
	struct lmt_pass_stats passes[8];
	int n = lmt_session_passes(s, passes, 8);
	assert_int_equal((uint64_t)n, ws.last.passes);
	assert_int_equal(n, 2);
	assert_true(passes[0].interrupted);
	assert_false(passes[0].final);
	assert_true(passes[1].final);
	assert_false(passes[1].interrupted);
	assert_int_equal(passes[0].bytes + passes[1].bytes, ws.last.bytes_sent);
	assert_int_equal(wd.last.bytes_received, ws.last.bytes_sent);
	assert_memory_equal(src.base, dst.base, bytes);
	guest_workload_stop(work);
	lmt_session_free(s);
	lmt_session_free(d.s);
	ram_release(&src);
	munmap(dst.base, bytes);
}

static void test_json_says_null_for_an_unknown_expected_downtime(void **state)
{
	struct lmt_stats st = {.status = LMT_STATUS_ACTIVE, .expected_downtime_ns = 0};
	char buf[2048];
	assert_true(lmt_stats_json(&st, buf, sizeof(buf)) > 0);
	assert_non_null(strstr(buf, "\"expected_downtime_ms\":null"));
	st.expected_downtime_known = 1;
	st.expected_downtime_ns = 1500000;
	st.bytes_received = 77;
	assert_true(lmt_stats_json(&st, buf, sizeof(buf)) > 0);
	assert_non_null(strstr(buf, "\"expected_downtime_ms\":1.500"));
	assert_non_null(strstr(buf, "\"bytes_received\":77"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_every_snapshot_of_a_completed_migration_holds),
	        cmocka_unit_test(test_every_snapshot_of_a_migration_failing_midway_holds),
	        cmocka_unit_test(test_every_snapshot_of_a_migration_completed_before_ready_holds),
	        cmocka_unit_test(test_json_says_null_for_an_unknown_expected_downtime),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
