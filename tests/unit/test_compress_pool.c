/* The compression threads (core/compress/pool.c): many jobs through a
 * small bounded pool, each done once with the right bytes; the bound; the
 * deadline wait and the descriptor; a stop while busy that waits for the
 * running jobs and cancels the rest; thread names; per-thread figures;
 * refusals. Leaks are LeakSanitizer's to find in the sanitizer build. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compress/frame.h"
#include "compress/pool.h"
#include "compress_pages.h"
#include "net.h"
#include "sync.h"
#include "../support/threads_live.h"

#define RUN_PAGES 4u
#define RUN (RUN_PAGES * TEST_PAGE)

static void assert_message(const struct lmt_error *err, const char *part)
{
	if (!strstr(err->message, part))
		fail_msg("message '%s' lacks '%s'", err->message, part);
}

/* Submit, harvesting (and waiting) whenever the pool is full. */
static void submit_all(struct lmt_compress_pool *pool, struct lmt_compress_job *jobs, size_t n,
                       struct lmt_compress_job **done, size_t *ndone)
{
	struct lmt_error err = {0};
	for (size_t i = 0; i < n;) {
		int rc = lmt__compress_pool_submit(pool, &jobs[i], &err);
		if (rc == 0) {
			i++;
			continue;
		}
		assert_int_equal(rc, -LMT_EAGAIN);
		assert_int_equal(lmt__compress_pool_wait(pool, lmt__deadline(30000000000ull)), 0);
		*ndone += lmt__compress_pool_harvest(pool, done + *ndone, 64);
	}
}

static void harvest_all(struct lmt_compress_pool *pool, struct lmt_compress_job **done,
                        size_t *ndone, size_t n)
{
	while (*ndone < n) {
		assert_int_equal(lmt__compress_pool_wait(pool, lmt__deadline(30000000000ull)), 0);
		*ndone += lmt__compress_pool_harvest(pool, done + *ndone, 64);
	}
}

static void test_many_jobs_are_each_done_once_with_the_right_bytes(void **state)
{
	enum { N = 600 };
	struct lmt_error err = {0};
	struct lmt_compress_pool *pool;
	assert_int_equal(lmt__compress_pool_new(&pool, 3, 16, "lmt-compress", &err), 0);
	uint8_t *raw = malloc((size_t)N * RUN), *frames = malloc((size_t)N * RUN);
	uint8_t *back = malloc((size_t)N * RUN);
	struct lmt_compress_job *jobs = calloc(N, sizeof(*jobs));
	struct lmt_compress_job **done = calloc(N, sizeof(*done));
	for (size_t i = 0; i < N; i++) {
		/* every seventh run random: it does not fit and stays raw */
		if (i % 7 == 0)
			for (size_t p = 0; p < RUN_PAGES; p++)
				test_page(raw + i * RUN + p * TEST_PAGE, PAGE_RANDOM, i * 8 + p);
		else
			test_mixed_run(raw + i * RUN, RUN_PAGES, i, false);
		jobs[i] = (struct lmt_compress_job){.op = LMT_COMPRESS_OP_COMPRESS,
		                                    .codec = i % 2 ? LMT_CODEC_ZSTD : LMT_CODEC_LZ4,
		                                    .in = raw + i * RUN,
		                                    .in_len = RUN,
		                                    .out = frames + i * RUN,
		                                    .out_cap = RUN,
		                                    .cookie = i};
	}
	size_t ndone = 0;
	submit_all(pool, jobs, N, done, &ndone);
	harvest_all(pool, done, &ndone, N);
	assert_int_equal(lmt__compress_pool_harvest(pool, done, 1), 0);
	assert_int_equal(lmt__compress_pool_held(pool), 0);

	/* Every cookie once; then each frame back through the pool. */
	uint8_t *seen = calloc(N, 1);
	size_t unfit = 0, framed = 0;
	for (size_t i = 0; i < N; i++) {
		struct lmt_compress_job *j = done[i];
		assert_true(j->cookie < N && !seen[j->cookie]);
		seen[j->cookie] = 1;
		assert_true(j->thread < 3);
		if (j->cookie % 7 == 0) {
			assert_int_equal(j->status, -LMT_EOVERFLOW);
			unfit++;
		} else {
			if (j->status)
				fail_msg("job %llu: %s", (unsigned long long)j->cookie,
				         j->err.message);
			framed++;
		}
	}
	size_t k = 0;
	for (size_t i = 0; i < N; i++) {
		if (jobs[i].status)
			continue;
		struct lmt_compress_job *j = &jobs[k++];
		size_t frame_len = jobs[i].out_len;
		enum lmt_codec codec = jobs[i].codec;
		*j = (struct lmt_compress_job){.op = LMT_COMPRESS_OP_EXPAND,
		                               .codec = codec,
		                               .in = frames + i * RUN,
		                               .in_len = RUN,
		                               .frame_len = frame_len,
		                               .out = back + i * RUN,
		                               .out_cap = RUN,
		                               .cookie = i};
	}
	assert_int_equal(k, framed);
	ndone = 0;
	submit_all(pool, jobs, k, done, &ndone);
	harvest_all(pool, done, &ndone, k);
	for (size_t i = 0; i < k; i++) {
		if (done[i]->status)
			fail_msg("expand %llu: %s", (unsigned long long)done[i]->cookie,
			         done[i]->err.message);
		size_t c = done[i]->cookie;
		assert_memory_equal(back + c * RUN, raw + c * RUN, RUN);
	}

	/* The threads' figures add up to what was done. */
	struct lmt_compress_thread_stats st[4];
	assert_int_equal(lmt__compress_pool_stats(pool, st, 4), 3);
	uint64_t jobs_c = 0, unfit_c = 0, in_c = 0, jobs_e = 0, out_e = 0, busy = 0;
	for (int t = 0; t < 3; t++)
		for (int c = 0; c < LMT_CODEC_COUNT; c++) {
			jobs_c += st[t].rates[LMT_COMPRESS_OP_COMPRESS][c].jobs;
			unfit_c += st[t].rates[LMT_COMPRESS_OP_COMPRESS][c].unfit;
			in_c += st[t].rates[LMT_COMPRESS_OP_COMPRESS][c].bytes_in;
			busy += st[t].rates[LMT_COMPRESS_OP_COMPRESS][c].busy_ns;
			jobs_e += st[t].rates[LMT_COMPRESS_OP_EXPAND][c].jobs;
			out_e += st[t].rates[LMT_COMPRESS_OP_EXPAND][c].bytes_out;
			assert_int_equal(st[t].rates[LMT_COMPRESS_OP_EXPAND][c].failed, 0);
		}
	assert_int_equal(jobs_c, N);
	assert_int_equal(unfit_c, unfit);
	assert_int_equal(in_c, (uint64_t)N * RUN);
	assert_int_equal(jobs_e, framed);
	assert_int_equal(out_e, (uint64_t)framed * RUN);
	assert_true(busy > 0);
	assert_int_equal(st[0].rates[LMT_COMPRESS_OP_COMPRESS][LMT_CODEC_RAW].jobs, 0);

	lmt__compress_pool_free(pool);
	free(seen);
	free(done);
	free(jobs);
	free(back);
	free(frames);
	free(raw);
}

static struct lmt_compress_job small_job(const uint8_t *in, uint8_t *out, uint64_t cookie)
{
	return (struct lmt_compress_job){.op = LMT_COMPRESS_OP_COMPRESS,
	                                 .codec = LMT_CODEC_LZ4,
	                                 .in = in,
	                                 .in_len = TEST_PAGE,
	                                 .out = out,
	                                 .out_cap = TEST_PAGE,
	                                 .cookie = cookie};
}

static void test_a_full_pool_says_try_again_until_harvested(void **state)
{
	struct lmt_error err = {0};
	struct lmt_compress_pool *pool;
	assert_int_equal(lmt__compress_pool_new(&pool, 1, 2, "lmt-compress", &err), 0);
	static uint8_t in[TEST_PAGE], out[3][TEST_PAGE];
	test_page(in, PAGE_TEXT, 1);
	struct lmt_compress_job j[3] = {small_job(in, out[0], 0), small_job(in, out[1], 1),
	                                small_job(in, out[2], 2)};
	assert_int_equal(lmt__compress_pool_submit(pool, &j[0], &err), 0);
	assert_int_equal(lmt__compress_pool_submit(pool, &j[1], &err), 0);
	assert_int_equal(lmt__compress_pool_held(pool), 2);
	/* Done or not, both are held until harvested. */
	assert_int_equal(lmt__compress_pool_submit(pool, &j[2], &err), -LMT_EAGAIN);
	struct lmt_compress_job *got[2];
	assert_int_equal(lmt__compress_pool_wait(pool, lmt__deadline(30000000000ull)), 0);
	unsigned n = lmt__compress_pool_harvest(pool, got, 1);
	assert_int_equal(n, 1);
	assert_ptr_equal(got[0], &j[0]); /* one thread: done in order */
	assert_int_equal(lmt__compress_pool_submit(pool, &j[2], &err), 0);
	lmt__compress_pool_free(pool);
}

static void test_wait_returns_at_its_deadline_or_when_a_job_is_done(void **state)
{
	struct lmt_error err = {0};
	struct lmt_compress_pool *pool;
	assert_int_equal(lmt__compress_pool_new(&pool, 2, 4, "lmt-compress", &err), 0);
	uint64_t start = lmt__now_ns();
	assert_int_equal(lmt__compress_pool_wait(pool, start + 50000000), -LMT_ETIMEDOUT);
	uint64_t took = lmt__now_ns() - start;
	assert_true(took >= 50000000);
	/* A deadline in the past: no wait at all. */
	assert_int_equal(lmt__compress_pool_wait(pool, 1), -LMT_ETIMEDOUT);

	static uint8_t in[TEST_PAGE], out[TEST_PAGE];
	test_page(in, PAGE_TABLE, 2);
	struct lmt_compress_job j = small_job(in, out, 7);
	assert_int_equal(lmt__compress_pool_submit(pool, &j, &err), 0);
	start = lmt__now_ns();
	assert_int_equal(lmt__compress_pool_wait(pool, start + 60000000000ull), 0);
	/* Woken by the job, long before the deadline. */
	assert_true(lmt__now_ns() - start < 30000000000ull);
	/* Still there until harvested: a second wait returns at once. */
	assert_int_equal(lmt__compress_pool_wait(pool, 1), 0);
	struct lmt_compress_job *got;
	assert_int_equal(lmt__compress_pool_harvest(pool, &got, 1), 1);
	assert_int_equal(got->cookie, 7);
	assert_int_equal(got->status, 0);
	lmt__compress_pool_free(pool);
}

static bool readable(int fd)
{
	struct pollfd p = {.fd = fd, .events = POLLIN};
	return poll(&p, 1, 0) == 1 && (p.revents & POLLIN);
}

static void test_descriptor_is_readable_exactly_while_done_jobs_wait(void **state)
{
	struct lmt_error err = {0};
	struct lmt_compress_pool *pool;
	assert_int_equal(lmt__compress_pool_new(&pool, 1, 4, "lmt-compress", &err), 0);
	int fd = lmt__compress_pool_fd(pool);
	assert_true(fd >= 0);
	assert_false(readable(fd));
	static uint8_t in[TEST_PAGE], out[2][TEST_PAGE];
	test_page(in, PAGE_TEXT, 3);
	struct lmt_compress_job j[2] = {small_job(in, out[0], 0), small_job(in, out[1], 1)};
	for (int round = 0; round < 3; round++) {
		assert_int_equal(lmt__compress_pool_submit(pool, &j[0], &err), 0);
		assert_int_equal(lmt__compress_pool_submit(pool, &j[1], &err), 0);
		struct pollfd p = {.fd = fd, .events = POLLIN};
		assert_int_equal(poll(&p, 1, 30000), 1);
		/* Harvest one; once the other is done too, readable again. */
		struct lmt_compress_job *got[2];
		assert_int_equal(lmt__compress_pool_harvest(pool, got, 1), 1);
		assert_int_equal(lmt__compress_pool_wait(pool, lmt__deadline(30000000000ull)), 0);
		assert_true(readable(fd));
		assert_int_equal(lmt__compress_pool_harvest(pool, got, 2), 1);
		assert_false(readable(fd));
	}
	lmt__compress_pool_free(pool);
}

static void test_stop_while_busy_waits_for_running_jobs_and_cancels_the_rest(void **state)
{
	enum { N = 128 };
	const size_t len = 64 * TEST_PAGE;
	struct lmt_error err = {0};
	struct lmt_compress_pool *pool;
	int before = threads_live(0);
	assert_int_equal(lmt__compress_pool_new(&pool, 2, N, "lmt-compress", &err), 0);
	uint8_t *in = malloc(len);
	test_mixed_run(in, 64, 9, false);
	uint8_t **outs = calloc(N, sizeof(*outs));
	struct lmt_compress_job *jobs = calloc(N, sizeof(*jobs));
	for (size_t i = 0; i < N; i++) {
		outs[i] = test_guarded(len);
		/* zstd's slowest level: tens of milliseconds a job */
		jobs[i] = (struct lmt_compress_job){.op = LMT_COMPRESS_OP_COMPRESS,
		                                    .codec = LMT_CODEC_ZSTD,
		                                    .level = 19,
		                                    .in = in,
		                                    .in_len = len,
		                                    .out = outs[i],
		                                    .out_cap = len,
		                                    .cookie = i};
		assert_int_equal(lmt__compress_pool_submit(pool, &jobs[i], &err), 0);
	}
	lmt__compress_pool_stop(pool);
	/* No thread of the pool is left to touch a job's memory. */
	assert_int_equal(threads_live(0), before);
	struct lmt_compress_job late = jobs[0];
	assert_int_equal(lmt__compress_pool_submit(pool, &late, &err), -LMT_ESTATE);
	assert_string_equal(err.message, "compression pool: stopped");
	struct lmt_compress_job *done[N];
	assert_int_equal(lmt__compress_pool_harvest(pool, done, N), N);
	size_t ran = 0, cancelled = 0;
	for (size_t i = 0; i < N; i++) {
		struct lmt_compress_job *j = done[i];
		if (j->status == -LMT_ECANCELED) {
			cancelled++;
			assert_message(&j->err, "stopped before the job ran");
			/* never started: its output untouched */
			for (size_t b = 0; b < len + TEST_GUARD; b++)
				if (outs[j->cookie][b] != TEST_GUARD_BYTE)
					fail_msg("cancelled job %zu wrote byte %zu",
					         (size_t)j->cookie, b);
		} else {
			assert_int_equal(j->status, 0);
			assert_true(j->busy_ns > 0);
			assert_true(test_guard_intact(outs[j->cookie], len));
			ran++;
		}
	}
	assert_int_equal(ran + cancelled, N);
	/* 128 jobs of tens of milliseconds each on two threads cannot all
	 * have run between the last submit and the stop. */
	assert_true(cancelled > 0);
	/* Stopping again, then freeing, is fine. */
	lmt__compress_pool_stop(pool);
	lmt__compress_pool_free(pool);
	for (size_t i = 0; i < N; i++)
		free(outs[i]);
	free(outs);
	free(jobs);
	free(in);
}

/* How many threads of this process carry `name`. */
static int threads_named(const char *name)
{
	DIR *d = opendir("/proc/self/task");
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		char got[16] = "";
		if (e->d_name[0] != '.' && !thread_exiting(e->d_name, got) && !strcmp(got, name))
			n++;
	}
	closedir(d);
	return n;
}

static void test_threads_are_named_and_gone_after_free(void **state)
{
	struct lmt_error err = {0};
	int before = threads_live(0);
	struct lmt_compress_pool *compress, *expand;
	assert_int_equal(lmt__compress_pool_new(&compress, 3, 8, "lmt-compressX", &err),
	                 -LMT_EINVAL);
	assert_message(&err, "a thread name of 1 to 12 characters");
	assert_int_equal(lmt__compress_pool_new(&compress, 3, 8, "lmt-compress", &err), 0);
	assert_int_equal(lmt__compress_pool_new(&expand, 2, 8, "lmt-expand", &err), 0);
	/* Named before lmt__compress_pool_new returns. */
	assert_int_equal(threads_named("lmt-compress/0"), 1);
	assert_int_equal(threads_named("lmt-compress/1"), 1);
	assert_int_equal(threads_named("lmt-compress/2"), 1);
	assert_int_equal(threads_named("lmt-expand/0"), 1);
	assert_int_equal(threads_named("lmt-expand/1"), 1);
	assert_int_equal(threads_live(0), before + 5);
	lmt__compress_pool_free(compress);
	lmt__compress_pool_free(expand);
	assert_int_equal(threads_live(0), before);
	lmt__compress_pool_free(NULL);
}

static void test_bad_pools_and_jobs_are_refused_by_name(void **state)
{
	struct lmt_error err = {0};
	struct lmt_compress_pool *pool = (void *)1;
	assert_int_equal(lmt__compress_pool_new(&pool, 0, 8, "c", &err), -LMT_EINVAL);
	assert_null(pool);
	assert_string_equal(err.message, "compression pool: expected 1 to 64 threads, got 0");
	assert_int_equal(lmt__compress_pool_new(&pool, 65, 8, "c", &err), -LMT_EINVAL);
	assert_int_equal(lmt__compress_pool_new(&pool, 1, 0, "c", &err), -LMT_EINVAL);
	assert_string_equal(err.message, "compression pool: expected 1 to 65536 jobs, got 0");
	assert_int_equal(lmt__compress_pool_new(&pool, 1, 8, NULL, &err), -LMT_EINVAL);
	assert_int_equal(lmt__compress_pool_new(&pool, 1, 8, "", &err), -LMT_EINVAL);

	assert_int_equal(lmt__compress_pool_new(&pool, 1, 8, "c", &err), 0);
	static uint8_t in[TEST_PAGE], out[TEST_PAGE];
	struct lmt_compress_job j = small_job(in, out, 0);
	j.codec = LMT_CODEC_ZSTD;
	j.level = 20;
	assert_int_equal(lmt__compress_pool_submit(pool, &j, &err), -LMT_EINVAL);
	assert_string_equal(err.message, "zstd: expected a level from 1 to 19, got 20");
	j = small_job(in, out, 0);
	j.codec = LMT_CODEC_RAW;
	assert_int_equal(lmt__compress_pool_submit(pool, &j, &err), -LMT_EINVAL);
	j = small_job(NULL, out, 0);
	assert_int_equal(lmt__compress_pool_submit(pool, &j, &err), -LMT_EINVAL);
	assert_string_equal(err.message, "compression job: NULL buffer");
	j = small_job(in, out, 0);
	j.in_len = 0;
	assert_int_equal(lmt__compress_pool_submit(pool, &j, &err), -LMT_EINVAL);
	j = (struct lmt_compress_job){.op = LMT_COMPRESS_OP_EXPAND,
	                              .codec = LMT_CODEC_LZ4,
	                              .in = in,
	                              .in_len = 16,
	                              .frame_len = 16,
	                              .out = out,
	                              .out_cap = 0};
	assert_int_equal(lmt__compress_pool_submit(pool, &j, &err), -LMT_EINVAL);
	assert_string_equal(err.message,
	                    "expansion job: cannot expand to 0 bytes (1 to 1073741824)");
	j.out_cap = TEST_PAGE;
	j.codec = LMT_CODEC_RAW;
	assert_int_equal(lmt__compress_pool_submit(pool, &j, &err), -LMT_EINVAL);
	assert_string_equal(err.message, "expansion job: codec 0: expected lz4 or zstd");
	j.op = (enum lmt_compress_op)5;
	assert_int_equal(lmt__compress_pool_submit(pool, &j, &err), -LMT_EINVAL);
	assert_int_equal(lmt__compress_pool_held(pool), 0);
	lmt__compress_pool_free(pool);
}

static void test_a_hostile_frame_fails_its_job_by_name(void **state)
{
	struct lmt_error err = {0};
	struct lmt_compress_pool *pool;
	assert_int_equal(lmt__compress_pool_new(&pool, 2, 8, "lmt-expand", &err), 0);
	static uint8_t slot[TEST_PAGE], out[2 * TEST_PAGE + TEST_GUARD];
	memset(out, TEST_GUARD_BYTE, sizeof(out));
	memset(slot, 0x11, sizeof(slot));
	struct lmt_compress_job j[3] = {
	        {.op = LMT_COMPRESS_OP_EXPAND,
	         .codec = LMT_CODEC_ZSTD,
	         .in = slot,
	         .in_len = sizeof(slot),
	         .frame_len = 100,
	         .out = out,
	         .out_cap = 2 * TEST_PAGE,
	         .cookie = 0},
	        {.op = LMT_COMPRESS_OP_EXPAND,
	         .codec = LMT_CODEC_ZSTD,
	         .in = slot,
	         .in_len = sizeof(slot),
	         .frame_len = sizeof(slot) + 1,
	         .out = out,
	         .out_cap = 2 * TEST_PAGE,
	         .cookie = 1},
	        {.op = LMT_COMPRESS_OP_EXPAND,
	         .codec = LMT_CODEC_ZSTD,
	         .in = slot,
	         .in_len = sizeof(slot),
	         .frame_len = 0,
	         .out = out,
	         .out_cap = 2 * TEST_PAGE,
	         .cookie = 2},
	};
	/* A real header over a payload of garbage, for the third. */
	struct lmt_frame f = {.codec = LMT_CODEC_ZSTD, .raw_len = 2 * TEST_PAGE, .payload_len = 84};
	static uint8_t framed[100];
	lmt__frame_encode(&f, framed);
	memset(framed + 16, 0x22, 84);
	j[2].in = framed;
	j[2].in_len = sizeof(framed);
	j[2].frame_len = sizeof(framed);
	size_t ndone = 0;
	struct lmt_compress_job *done[3];
	submit_all(pool, j, 3, done, &ndone);
	harvest_all(pool, done, &ndone, 3);
	assert_int_equal(j[0].status, -LMT_EPROTO);
	assert_string_equal(j[0].err.message, "frame: bad magic 0x11111111, expected 0x5a544d4c");
	assert_int_equal(j[1].status, -LMT_EPROTO);
	assert_string_equal(j[1].err.message, "frame: 4097 bytes overrun their 4096-byte slot");
	assert_int_equal(j[2].status, -LMT_EPROTO);
	assert_string_equal(j[2].err.message,
	                    "zstd frame: magic 0x22222222 in 84 bytes, expected 0xfd2fb528");
	assert_true(test_guard_intact(out, 2 * TEST_PAGE));
	/* Each counted as a failure of the codec announced. */
	struct lmt_compress_thread_stats st[2];
	lmt__compress_pool_stats(pool, st, 2);
	assert_int_equal(st[0].rates[LMT_COMPRESS_OP_EXPAND][LMT_CODEC_ZSTD].failed +
	                         st[1].rates[LMT_COMPRESS_OP_EXPAND][LMT_CODEC_ZSTD].failed,
	                 3);
	lmt__compress_pool_free(pool);
}

static void test_free_with_jobs_queued_joins_and_leaves_them_to_the_caller(void **state)
{
	struct lmt_error err = {0};
	struct lmt_compress_pool *pool;
	int before = threads_live(0);
	assert_int_equal(lmt__compress_pool_new(&pool, 2, 64, "lmt-compress", &err), 0);
	size_t len = 16 * TEST_PAGE;
	uint8_t *in = malloc(len), *out = malloc(64 * len);
	test_mixed_run(in, 16, 4, false);
	struct lmt_compress_job jobs[64];
	for (size_t i = 0; i < 64; i++) {
		jobs[i] = (struct lmt_compress_job){.op = LMT_COMPRESS_OP_COMPRESS,
		                                    .codec = LMT_CODEC_ZSTD,
		                                    .level = 9,
		                                    .in = in,
		                                    .in_len = len,
		                                    .out = out + i * len,
		                                    .out_cap = len,
		                                    .cookie = i};
		assert_int_equal(lmt__compress_pool_submit(pool, &jobs[i], &err), 0);
	}
	lmt__compress_pool_free(pool);
	assert_int_equal(threads_live(0), before);
	/* Nothing of the pool's is left to write here. */
	free(out);
	free(in);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_many_jobs_are_each_done_once_with_the_right_bytes),
	        cmocka_unit_test(test_a_full_pool_says_try_again_until_harvested),
	        cmocka_unit_test(test_wait_returns_at_its_deadline_or_when_a_job_is_done),
	        cmocka_unit_test(test_descriptor_is_readable_exactly_while_done_jobs_wait),
	        cmocka_unit_test(test_stop_while_busy_waits_for_running_jobs_and_cancels_the_rest),
	        cmocka_unit_test(test_threads_are_named_and_gone_after_free),
	        cmocka_unit_test(test_bad_pools_and_jobs_are_refused_by_name),
	        cmocka_unit_test(test_a_hostile_frame_fails_its_job_by_name),
	        cmocka_unit_test(test_free_with_jobs_queued_joins_and_leaves_them_to_the_caller),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
