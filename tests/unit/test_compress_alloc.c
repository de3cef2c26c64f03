/* The compression room allocates nothing per frame: once a thread's
 * contexts have seen a codec and level, compressing and expanding more
 * runs of that size, by hand or through the pool, calls no allocator.
 * The program replaces malloc and its kin (glibc's documented way, over
 * __libc_malloc) to count the calls libzstd, liblz4 and lmt make, so it
 * is built only without the sanitizers, which replace them themselves. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <malloc.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "compress/frame.h"
#include "compress/pool.h"
#include "compress_pages.h"
#include "sync.h"

void *__libc_malloc(size_t size);
void *__libc_calloc(size_t n, size_t size);
void *__libc_realloc(void *p, size_t size);
void *__libc_memalign(size_t align, size_t size);
void __libc_free(void *p);

static _Atomic int counting;
static _Atomic unsigned long allocations;

static void count(void)
{
	if (atomic_load(&counting))
		atomic_fetch_add(&allocations, 1);
}

void *malloc(size_t size)
{
	count();
	return __libc_malloc(size);
}

void *calloc(size_t n, size_t size)
{
	count();
	return __libc_calloc(n, size);
}

void *realloc(void *p, size_t size)
{
	count();
	return __libc_realloc(p, size);
}

void *aligned_alloc(size_t align, size_t size)
{
	count();
	return __libc_memalign(align, size);
}

void *memalign(size_t align, size_t size)
{
	count();
	return __libc_memalign(align, size);
}

int posix_memalign(void **out, size_t align, size_t size)
{
	count();
	*out = __libc_memalign(align, size);
	return *out ? 0 : 12; /* ENOMEM */
}

void free(void *p)
{
	__libc_free(p);
}

#define RUN (16 * TEST_PAGE)

static void test_the_allocator_is_really_counted(void **state)
{
	/* Through a volatile pointer: the compiler may not elide the pair. */
	void *(*volatile allocate)(size_t) = malloc;
	atomic_store(&allocations, 0);
	atomic_store(&counting, 1);
	void *p = allocate(10);
	atomic_store(&counting, 0);
	free(p);
	assert_int_equal(atomic_load(&allocations), 1);
}

static void test_codecs_allocate_nothing_per_frame_once_warm(void **state)
{
	struct lmt_error err = {0};
	struct lmt_codec_ctx *ctx;
	/* Its own block, libzstd's two contexts and lz4's state: the calls
	 * libzstd makes are counted too. */
	atomic_store(&allocations, 0);
	atomic_store(&counting, 1);
	assert_int_equal(lmt__codec_ctx_new(&ctx, &err), 0);
	atomic_store(&counting, 0);
	assert_true(atomic_load(&allocations) >= 4);
	uint8_t *run = malloc(RUN), *frame = malloc(RUN), *back = malloc(RUN);
	static const struct {
		enum lmt_codec codec;
		int level;
	} use[] = {{LMT_CODEC_LZ4, 1}, {LMT_CODEC_ZSTD, 1}, {LMT_CODEC_ZSTD, 3}};
	for (size_t u = 0; u < 3; u++) {
		test_mixed_run(run, 16, u, false);
		size_t n;
		/* warm: the first frame at a level may size zstd's workspace */
		assert_int_equal(lmt__frame_compress(ctx, use[u].codec, use[u].level, run, RUN,
		                                     frame, RUN, &n, &err),
		                 0);
		struct lmt_frame_expect x = {
		        .codec = use[u].codec, .room = RUN, .length = n, .raw_len = RUN};
		assert_int_equal(lmt__frame_expand(ctx, frame, &x, back, &err), 0);
		atomic_store(&allocations, 0);
		atomic_store(&counting, 1);
		for (int i = 0; i < 200; i++) {
			test_mixed_run(run, 16, (size_t)i, false);
			assert_int_equal(lmt__frame_compress(ctx, use[u].codec, use[u].level, run,
			                                     RUN, frame, RUN, &n, &err),
			                 0);
			x.length = n;
			assert_int_equal(lmt__frame_expand(ctx, frame, &x, back, &err), 0);
		}
		atomic_store(&counting, 0);
		assert_memory_equal(back, run, RUN);
		if (atomic_load(&allocations))
			fail_msg("%s-%d: %lu allocations in 200 frames",
			         lmt__codec_name(use[u].codec), use[u].level,
			         atomic_load(&allocations));
	}
	free(back);
	free(frame);
	free(run);
	lmt__codec_ctx_free(ctx);
}

/* What a peer sends never makes the destination allocate: a fresh
 * context expands its very first frames, of each codec, hostile ones
 * included, without a call to the allocator. */
static void test_expanding_allocates_nothing_even_the_first_time(void **state)
{
	struct lmt_error err = {0};
	struct lmt_codec_ctx *packer, *fresh;
	assert_int_equal(lmt__codec_ctx_new(&packer, &err), 0);
	assert_int_equal(lmt__codec_ctx_new(&fresh, &err), 0);
	uint8_t *run = malloc(RUN), *frames[2], *back = malloc(RUN);
	size_t n[2];
	enum lmt_codec codecs[2] = {LMT_CODEC_LZ4, LMT_CODEC_ZSTD};
	test_mixed_run(run, 16, 3, false);
	for (int c = 0; c < 2; c++) {
		frames[c] = malloc(RUN);
		assert_int_equal(lmt__frame_compress(packer, codecs[c], 0, run, RUN, frames[c], RUN,
		                                     &n[c], &err),
		                 0);
	}
	atomic_store(&allocations, 0);
	atomic_store(&counting, 1);
	for (int c = 0; c < 2; c++) {
		struct lmt_frame_expect x = {
		        .codec = codecs[c], .room = RUN, .length = n[c], .raw_len = RUN};
		assert_int_equal(lmt__frame_expand(fresh, frames[c], &x, back, &err), 0);
		/* and a damaged one */
		frames[c][LMT_FRAME_HEADER_SIZE + n[c] / 2] ^= 0x5a;
		lmt__frame_expand(fresh, frames[c], &x, back, &err);
	}
	atomic_store(&counting, 0);
	assert_int_equal(atomic_load(&allocations), 0);
	for (int c = 0; c < 2; c++)
		free(frames[c]);
	free(back);
	free(run);
	lmt__codec_ctx_free(fresh);
	lmt__codec_ctx_free(packer);
}

static bool both_warm(struct lmt_compress_pool *pool)
{
	struct lmt_compress_thread_stats st[2];
	lmt__compress_pool_stats(pool, st, 2);
	return st[0].rates[LMT_COMPRESS_OP_COMPRESS][LMT_CODEC_ZSTD].jobs &&
	       st[1].rates[LMT_COMPRESS_OP_COMPRESS][LMT_CODEC_ZSTD].jobs;
}

static void test_the_pool_allocates_nothing_per_job(void **state)
{
	enum { N = 256 };
	struct lmt_error err = {0};
	struct lmt_compress_pool *pool;
	assert_int_equal(lmt__compress_pool_new(&pool, 2, 8, "lmt-compress", &err), 0);
	uint8_t *run = malloc(RUN), *frames = malloc((size_t)8 * RUN);
	test_mixed_run(run, 16, 1, false);
	struct lmt_compress_job jobs[8];
	struct lmt_compress_job *done[8];
	/* Rounds of 8 jobs until each thread has compressed once (its
	 * context warm), then N counted jobs. */
	for (int counted = 0; counted < 2; counted++) {
		if (counted) {
			atomic_store(&allocations, 0);
			atomic_store(&counting, 1);
		}
		for (int k = 0; counted ? k < N / 8 : !both_warm(pool); k++) {
			for (int i = 0; i < 8; i++) {
				jobs[i] = (struct lmt_compress_job){.op = LMT_COMPRESS_OP_COMPRESS,
				                                    .codec = LMT_CODEC_ZSTD,
				                                    .level = 1,
				                                    .in = run,
				                                    .in_len = RUN,
				                                    .out = frames + (size_t)i * RUN,
				                                    .out_cap = RUN};
				assert_int_equal(lmt__compress_pool_submit(pool, &jobs[i], &err),
				                 0);
			}
			unsigned got = 0;
			while (got < 8) {
				assert_int_equal(lmt__compress_pool_wait(
				                         pool, lmt__deadline(30000000000ull)),
				                 0);
				got += lmt__compress_pool_harvest(pool, done, 8);
			}
			for (int i = 0; i < 8; i++)
				assert_int_equal(jobs[i].status, 0);
		}
	}
	atomic_store(&counting, 0);
	if (atomic_load(&allocations))
		fail_msg("%lu allocations in %d jobs", atomic_load(&allocations), N);
	lmt__compress_pool_free(pool);
	free(frames);
	free(run);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_the_allocator_is_really_counted),
	        cmocka_unit_test(test_codecs_allocate_nothing_per_frame_once_warm),
	        cmocka_unit_test(test_expanding_allocates_nothing_even_the_first_time),
	        cmocka_unit_test(test_the_pool_allocates_nothing_per_job),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
