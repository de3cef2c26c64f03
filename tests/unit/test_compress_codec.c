/* The codecs of the compression room (core/compress/codec.c): round trips
 * of mixed, zero and random pages with zstd and lz4, compression bounded
 * by the caller's buffer and the margin, and every refusal of a hostile
 * input — another declared size, none, a bomb, truncation at every byte,
 * trailing bytes — without a byte written past the output. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lz4.h>
#include <zstd.h>

#include "compress/codec.h"
#include "compress_pages.h"

struct fixture {
	struct lmt_codec_ctx *ctx;
};

static int setup(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));
	struct lmt_error err = {0};
	if (!f || lmt__codec_ctx_new(&f->ctx, &err))
		return -1;
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *f = *state;
	lmt__codec_ctx_free(f->ctx);
	free(f);
	return 0;
}

static struct lmt_codec_ctx *ctx_of(void **state)
{
	return ((struct fixture *)*state)->ctx;
}

static void assert_message(const struct lmt_error *err, const char *part)
{
	if (!strstr(err->message, part))
		fail_msg("message '%s' lacks '%s'", err->message, part);
}

/* Compress `len` bytes, expand them again, compare. */
static void round_trip(struct lmt_codec_ctx *ctx, enum lmt_codec codec, int level,
                       const uint8_t *in, size_t len)
{
	struct lmt_error err = {0};
	uint8_t *packed = test_guarded(len);
	uint8_t *back = test_guarded(len);
	size_t n = 0;
	int rc = lmt__codec_compress(ctx, codec, level, in, len, packed, len, &n, &err);
	if (rc)
		fail_msg("%s-%d of %zu bytes: %s", lmt__codec_name(codec), level, len, err.message);
	assert_true(n > 0 && n <= len - lmt__codec_margin(len));
	assert_true(test_guard_intact(packed, len));
	rc = lmt__codec_expand(ctx, codec, packed, n, back, len, &err);
	if (rc)
		fail_msg("expand: %s", err.message);
	assert_memory_equal(back, in, len);
	assert_true(test_guard_intact(back, len));
	free(packed);
	free(back);
}

static void test_mixed_zero_and_text_runs_round_trip_with_each_codec_and_level(void **state)
{
	static const struct {
		enum lmt_codec codec;
		int level;
	} use[] = {{LMT_CODEC_LZ4, 0},
	           {LMT_CODEC_ZSTD, 1},
	           {LMT_CODEC_ZSTD, 3},
	           {LMT_CODEC_ZSTD, 9},
	           {LMT_CODEC_ZSTD, 19}};
	size_t pages[] = {1, 2, 16, 256};
	uint8_t *run = malloc(256 * TEST_PAGE);
	for (size_t u = 0; u < sizeof(use) / sizeof(use[0]); u++)
		for (size_t p = 0; p < sizeof(pages) / sizeof(pages[0]); p++) {
			size_t len = pages[p] * TEST_PAGE;
			test_mixed_run(run, pages[p], p + 1, pages[p] >= 16);
			round_trip(ctx_of(state), use[u].codec, use[u].level, run, len);
			memset(run, 0, len);
			round_trip(ctx_of(state), use[u].codec, use[u].level, run, len);
		}
	free(run);
}

static void test_random_pages_do_not_fit_and_nothing_is_written_past_the_cap(void **state)
{
	struct lmt_error err = {0};
	size_t len = 16 * TEST_PAGE;
	uint8_t *run = malloc(len);
	for (size_t i = 0; i < 16; i++)
		test_page(run + i * TEST_PAGE, PAGE_RANDOM, i);
	enum lmt_codec codecs[] = {LMT_CODEC_LZ4, LMT_CODEC_ZSTD};
	for (int c = 0; c < 2; c++) {
		uint8_t *out = test_guarded(len * 2);
		size_t n = 7;
		/* Room for anything: the margin refuses it all the same. */
		assert_int_equal(lmt__codec_compress(ctx_of(state), codecs[c], 0, run, len, out,
		                                     len * 2, &n, &err),
		                 -LMT_EOVERFLOW);
		assert_int_equal(n, 0);
		assert_message(&err, "do not compress into");
		assert_message(&err, lmt__codec_name(codecs[c]));
		/* Nothing past in_len - margin, the most it may write. */
		size_t limit = len - lmt__codec_margin(len);
		for (size_t i = limit; i < len * 2 + TEST_GUARD; i++)
			assert_int_equal(out[i], TEST_GUARD_BYTE);
		free(out);
	}
	free(run);
}

static void test_compression_never_writes_past_a_small_output_buffer(void **state)
{
	struct lmt_error err = {0};
	size_t len = 64 * TEST_PAGE;
	uint8_t *run = malloc(len);
	test_mixed_run(run, 64, 5, false);
	enum lmt_codec codecs[] = {LMT_CODEC_LZ4, LMT_CODEC_ZSTD};
	for (int c = 0; c < 2; c++) {
		size_t full = 0;
		uint8_t *out = test_guarded(len);
		assert_int_equal(lmt__codec_compress(ctx_of(state), codecs[c], 0, run, len, out,
		                                     len, &full, &err),
		                 0);
		free(out);
		/* Every cap below what it needs fails cleanly, within the cap:
		 * a write past it would fault. */
		for (size_t cap = 0; cap < full; cap += 1 + full / 97) {
			out = test_fenced(cap);
			size_t n = 0;
			assert_int_equal(lmt__codec_compress(ctx_of(state), codecs[c], 0, run, len,
			                                     out, cap, &n, &err),
			                 -LMT_EOVERFLOW);
			test_unfence(out, cap);
		}
		/* The libraries may want a few bytes of slack over what the
		 * result takes (lz4 checks its bound before the last literals). */
		out = test_guarded(full + 64);
		size_t n = 0;
		assert_int_equal(lmt__codec_compress(ctx_of(state), codecs[c], 0, run, len, out,
		                                     full + 64, &n, &err),
		                 0);
		assert_int_equal(n, full);
		assert_true(test_guard_intact(out, full + 64));
		free(out);
	}
	free(run);
}

static void test_levels_are_checked_and_zero_means_the_default(void **state)
{
	struct lmt_error err = {0};
	assert_int_equal(lmt__codec_level(LMT_CODEC_ZSTD, 0, &err), LMT_CODEC_ZSTD_LEVEL_DEFAULT);
	assert_int_equal(lmt__codec_level(LMT_CODEC_ZSTD, 19, &err), 19);
	assert_int_equal(lmt__codec_level(LMT_CODEC_LZ4, 0, &err), 1);
	assert_int_equal(lmt__codec_level(LMT_CODEC_ZSTD, 20, &err), -LMT_EINVAL);
	assert_string_equal(err.message, "zstd: expected a level from 1 to 19, got 20");
	assert_int_equal(lmt__codec_level(LMT_CODEC_ZSTD, -1, &err), -LMT_EINVAL);
	assert_int_equal(lmt__codec_level(LMT_CODEC_LZ4, 2, &err), -LMT_EINVAL);
	assert_string_equal(err.message, "lz4: has only level 1, got 2");
	assert_int_equal(lmt__codec_level(LMT_CODEC_RAW, 0, &err), -LMT_EINVAL);
	assert_int_equal(lmt__codec_level((enum lmt_codec)9, 0, &err), -LMT_EINVAL);
	assert_string_equal(err.message, "unknown codec 9: expected lz4 or zstd");

	uint8_t in[TEST_PAGE] = {0}, out[TEST_PAGE];
	size_t n;
	assert_int_equal(lmt__codec_compress(ctx_of(state), LMT_CODEC_ZSTD, 22, in, sizeof(in), out,
	                                     sizeof(out), &n, &err),
	                 -LMT_EINVAL);
	assert_int_equal(lmt__codec_compress(ctx_of(state), LMT_CODEC_ZSTD, 1, in, 0, out,
	                                     sizeof(out), &n, &err),
	                 -LMT_EINVAL);
	assert_message(&err, "cannot compress 0 bytes");
}

/* A zstd frame of `len` bytes of `byte`, with or without its size. */
static size_t zstd_frame(uint8_t *out, size_t cap, size_t len, uint8_t byte, bool size_flag)
{
	uint8_t *in = malloc(len);
	memset(in, byte, len);
	ZSTD_CCtx *c = ZSTD_createCCtx();
	ZSTD_CCtx_setParameter(c, ZSTD_c_contentSizeFlag, size_flag);
	size_t n = ZSTD_compress2(c, out, cap, in, len);
	assert_false(ZSTD_isError(n));
	ZSTD_freeCCtx(c);
	free(in);
	return n;
}

static int expand(void **state, enum lmt_codec codec, const uint8_t *in, size_t n, size_t expected,
                  struct lmt_error *err)
{
	/* The input and the output each end at an inaccessible page, so a
	 * read or write past either faults; the output is checked again by
	 * guard bytes in a plain allocation. */
	uint8_t *copy = test_fenced(n);
	memcpy(copy, in, n);
	uint8_t *out = test_fenced(expected);
	int rc = lmt__codec_expand(ctx_of(state), codec, copy, n, out, expected, err);
	uint8_t *guarded = test_guarded(expected);
	struct lmt_error again = {0};
	assert_int_equal(
	        lmt__codec_expand(ctx_of(state), codec, copy, n, guarded, expected, &again), rc);
	assert_true(test_guard_intact(guarded, expected));
	free(guarded);
	test_unfence(out, expected);
	test_unfence(copy, n);
	return rc;
}

static void test_zstd_frame_declaring_another_size_is_refused(void **state)
{
	struct lmt_error err = {0};
	uint8_t frame[512];
	size_t n = zstd_frame(frame, sizeof(frame), 2 * TEST_PAGE, 'a', true);
	assert_int_equal(expand(state, LMT_CODEC_ZSTD, frame, n, TEST_PAGE, &err), -LMT_EPROTO);
	assert_string_equal(err.message, "zstd frame: declares 8192 bytes, expected 4096");
	assert_int_equal(expand(state, LMT_CODEC_ZSTD, frame, n, 4 * TEST_PAGE, &err), -LMT_EPROTO);
	assert_string_equal(err.message, "zstd frame: declares 8192 bytes, expected 16384");
	assert_int_equal(expand(state, LMT_CODEC_ZSTD, frame, n, 2 * TEST_PAGE, &err), 0);
}

static void test_zstd_frame_declaring_no_size_is_refused(void **state)
{
	struct lmt_error err = {0};
	uint8_t frame[512];
	size_t n = zstd_frame(frame, sizeof(frame), TEST_PAGE, 'b', false);
	assert_int_equal(ZSTD_getFrameContentSize(frame, n), ZSTD_CONTENTSIZE_UNKNOWN);
	assert_int_equal(expand(state, LMT_CODEC_ZSTD, frame, n, TEST_PAGE, &err), -LMT_EPROTO);
	assert_message(&err, "zstd frame: declares no content size");
	assert_message(&err, "expected 4096");
}

static void test_zstd_bomb_declaring_far_more_than_the_slot_is_refused(void **state)
{
	struct lmt_error err = {0};
	uint8_t frame[4096];
	/* 64 MiB of zeros in a few kilobytes, for a slot of 64 KiB. */
	size_t n = zstd_frame(frame, sizeof(frame), (size_t)64 << 20, 0, true);
	assert_true(n < sizeof(frame));
	assert_int_equal(expand(state, LMT_CODEC_ZSTD, frame, n, 16 * TEST_PAGE, &err),
	                 -LMT_EPROTO);
	assert_string_equal(err.message, "zstd frame: declares 67108864 bytes, expected 65536");
}

/* A hand-made zstd frame that declares `declared` bytes (single segment,
 * 2-byte size field: 256 .. 65791) and then holds `blocks` RLE blocks of
 * `block` bytes each: it expands to blocks x block bytes whatever it
 * declares. */
static size_t rle_bomb(uint8_t *out, uint32_t declared, uint32_t blocks, uint32_t block)
{
	size_t n = 0;
	static const uint8_t magic[4] = {0x28, 0xb5, 0x2f, 0xfd};
	memcpy(out, magic, 4);
	n = 4;
	out[n++] = 0x60; /* frame content size flag 1 (2 bytes), single segment */
	out[n++] = (uint8_t)(declared - 256);
	out[n++] = (uint8_t)((declared - 256) >> 8);
	for (uint32_t i = 0; i < blocks; i++) {
		uint32_t last = i + 1 == blocks;
		uint32_t h = last | 1u << 1 | block << 3; /* RLE */
		out[n++] = (uint8_t)h;
		out[n++] = (uint8_t)(h >> 8);
		out[n++] = (uint8_t)(h >> 16);
		out[n++] = 0x42;
	}
	return n;
}

static void
test_zstd_bomb_expanding_past_what_it_declares_writes_nothing_past_the_output(void **state)
{
	struct lmt_error err = {0};
	size_t cap = 1024 * 4 + 16;
	uint8_t *frame = malloc(cap);
	/* Declares 64 KiB, as expected, but 1024 blocks of 64 KiB follow: a
	 * 4 KiB frame that would write 64 MiB. */
	size_t n = rle_bomb(frame, 65536, 1024, 65536);
	assert_int_equal(expand(state, LMT_CODEC_ZSTD, frame, n, 65536, &err), -LMT_EPROTO);
	assert_message(&err, "zstd frame");
	/* Two blocks of 4 KiB under a frame that declares 4 KiB. */
	n = rle_bomb(frame, TEST_PAGE, 2, TEST_PAGE);
	assert_int_equal(expand(state, LMT_CODEC_ZSTD, frame, n, TEST_PAGE, &err), -LMT_EPROTO);
	assert_message(&err, "zstd frame");
	/* The same frame with one block is fine: the bomb is refused for
	 * what it does, not for its shape. */
	n = rle_bomb(frame, TEST_PAGE, 1, TEST_PAGE);
	assert_int_equal(expand(state, LMT_CODEC_ZSTD, frame, n, TEST_PAGE, &err), 0);
	free(frame);
}

static void test_lz4_bomb_expanding_past_the_output_is_refused(void **state)
{
	struct lmt_error err = {0};
	size_t big = 1 << 20;
	uint8_t *zeros = calloc(1, big);
	int cap = LZ4_compressBound((int)big);
	uint8_t *block = malloc((size_t)cap);
	int n = LZ4_compress_default((const char *)zeros, (char *)block, (int)big, cap);
	assert_true(n > 0 && n < 8192);
	assert_int_equal(expand(state, LMT_CODEC_LZ4, block, (size_t)n, 16 * TEST_PAGE, &err),
	                 -LMT_EPROTO);
	assert_message(&err, "lz4 frame: damaged or truncated in");
	assert_message(&err, "expanding past 65536");
	free(block);
	free(zeros);
}

/* Compress a mixed run with `codec`; the payload and its length. */
static uint8_t *packed_run(void **state, enum lmt_codec codec, size_t len, size_t *n)
{
	struct lmt_error err = {0};
	uint8_t *run = malloc(len), *out = malloc(len);
	test_mixed_run(run, len / TEST_PAGE, 11, true);
	assert_int_equal(lmt__codec_compress(ctx_of(state), codec, 0, run, len, out, len, n, &err),
	                 0);
	free(run);
	return out;
}

static void test_truncation_at_every_byte_is_refused(void **state)
{
	struct lmt_error err = {0};
	size_t len = 4 * TEST_PAGE;
	enum lmt_codec codecs[] = {LMT_CODEC_LZ4, LMT_CODEC_ZSTD};
	for (int c = 0; c < 2; c++) {
		size_t n;
		uint8_t *packed = packed_run(state, codecs[c], len, &n);
		assert_int_equal(expand(state, codecs[c], packed, n, len, &err), 0);
		for (size_t cut = 0; cut < n; cut++) {
			int rc = expand(state, codecs[c], packed, cut, len, &err);
			if (rc != -LMT_EPROTO)
				fail_msg("%s cut at %zu of %zu: %d", lmt__codec_name(codecs[c]),
				         cut, n, rc);
			assert_message(&err, lmt__codec_name(codecs[c]));
		}
		free(packed);
	}
}

static void test_trailing_bytes_are_refused(void **state)
{
	struct lmt_error err = {0};
	size_t len = 4 * TEST_PAGE;
	enum lmt_codec codecs[] = {LMT_CODEC_LZ4, LMT_CODEC_ZSTD};
	for (int c = 0; c < 2; c++) {
		size_t n;
		uint8_t *packed = packed_run(state, codecs[c], len, &n);
		uint8_t *longer = malloc(n + 64);
		memcpy(longer, packed, n);
		uint64_t seed = 3;
		for (size_t extra = 1; extra <= 64; extra++) {
			/* zeros, then random bytes */
			longer[n + extra - 1] = extra <= 32 ? 0 : (uint8_t)test_splitmix(&seed);
			if (expand(state, codecs[c], longer, n + extra, len, &err) != -LMT_EPROTO)
				fail_msg("%s with %zu trailing bytes accepted",
				         lmt__codec_name(codecs[c]), extra);
		}
		if (codecs[c] == LMT_CODEC_ZSTD) {
			assert_int_equal(expand(state, codecs[c], longer, n + 5, len, &err),
			                 -LMT_EPROTO);
			char want[80];
			snprintf(want, sizeof(want),
			         "zstd frame: 5 trailing bytes after a frame of %zu", n);
			assert_string_equal(err.message, want);
		}
		free(longer);
		free(packed);
	}
}

static void test_two_zstd_frames_a_skippable_and_a_legacy_frame_are_refused(void **state)
{
	struct lmt_error err = {0};
	uint8_t frames[1024] = {0};
	size_t a = zstd_frame(frames, sizeof(frames), 2048, 'x', true);
	size_t b = zstd_frame(frames + a, sizeof(frames) - a, 2048, 'y', true);
	/* Together they would make the 4096 bytes expected. */
	assert_int_equal(expand(state, LMT_CODEC_ZSTD, frames, a + b, 4096, &err), -LMT_EPROTO);
	/* A skippable frame: magic 0x184D2A50, length, then anything. */
	uint8_t skip[16] = {0x50, 0x2a, 0x4d, 0x18, 8, 0, 0, 0};
	assert_int_equal(expand(state, LMT_CODEC_ZSTD, skip, sizeof(skip), 4096, &err),
	                 -LMT_EPROTO);
	assert_string_equal(err.message,
	                    "zstd frame: magic 0x184d2a50 in 16 bytes, expected 0xfd2fb528");
	/* A frame of zstd 0.7 (magic 0xFD2FB527): never handed to a legacy
	 * decoder, even where libzstd has one. */
	uint8_t legacy[32];
	memcpy(legacy, frames, sizeof(legacy));
	legacy[0] = 0x27;
	assert_int_equal(expand(state, LMT_CODEC_ZSTD, legacy, sizeof(legacy), 4096, &err),
	                 -LMT_EPROTO);
	assert_string_equal(err.message,
	                    "zstd frame: magic 0xfd2fb527 in 32 bytes, expected 0xfd2fb528");
}

static void test_lz4_expanding_to_another_length_is_refused(void **state)
{
	struct lmt_error err = {0};
	size_t len = 2 * TEST_PAGE, n;
	uint8_t *packed = packed_run(state, LMT_CODEC_LZ4, len, &n);
	assert_int_equal(expand(state, LMT_CODEC_LZ4, packed, n, TEST_PAGE, &err), -LMT_EPROTO);
	char want[120];
	snprintf(want, sizeof(want),
	         "lz4 frame: damaged or truncated in %zu bytes, or expanding past 4096", n);
	assert_string_equal(err.message, want);
	assert_int_equal(expand(state, LMT_CODEC_LZ4, packed, n, 4 * TEST_PAGE, &err), -LMT_EPROTO);
	assert_string_equal(err.message, "lz4 frame: expands to 8192 bytes, expected 16384");
	free(packed);
}

static void test_unknown_codec_raw_and_empty_input_are_refused(void **state)
{
	struct lmt_error err = {0};
	uint8_t in[8] = {0};
	assert_int_equal(expand(state, LMT_CODEC_RAW, in, sizeof(in), TEST_PAGE, &err),
	                 -LMT_EINVAL);
	assert_string_equal(err.message, "unknown codec 0: expected lz4 or zstd");
	assert_int_equal(expand(state, (enum lmt_codec)77, in, sizeof(in), TEST_PAGE, &err),
	                 -LMT_EINVAL);
	assert_int_equal(expand(state, LMT_CODEC_ZSTD, in, 0, TEST_PAGE, &err), -LMT_EPROTO);
	assert_string_equal(err.message, "zstd frame: empty (0 bytes), expected 4096 bytes out");
	assert_int_equal(expand(state, LMT_CODEC_ZSTD, in, sizeof(in), 0, &err), -LMT_EINVAL);
	assert_string_equal(err.message, "zstd: cannot expand to 0 bytes (1 to 1073741824)");
	assert_int_equal(expand(state, LMT_CODEC_LZ4, in, sizeof(in), TEST_PAGE, &err),
	                 -LMT_EPROTO);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test_setup_teardown(
	                test_mixed_zero_and_text_runs_round_trip_with_each_codec_and_level, setup,
	                teardown),
	        cmocka_unit_test_setup_teardown(
	                test_random_pages_do_not_fit_and_nothing_is_written_past_the_cap, setup,
	                teardown),
	        cmocka_unit_test_setup_teardown(
	                test_compression_never_writes_past_a_small_output_buffer, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_levels_are_checked_and_zero_means_the_default,
	                                        setup, teardown),
	        cmocka_unit_test_setup_teardown(test_zstd_frame_declaring_another_size_is_refused,
	                                        setup, teardown),
	        cmocka_unit_test_setup_teardown(test_zstd_frame_declaring_no_size_is_refused, setup,
	                                        teardown),
	        cmocka_unit_test_setup_teardown(
	                test_zstd_bomb_declaring_far_more_than_the_slot_is_refused, setup,
	                teardown),
	        cmocka_unit_test_setup_teardown(
	                test_zstd_bomb_expanding_past_what_it_declares_writes_nothing_past_the_output,
	                setup, teardown),
	        cmocka_unit_test_setup_teardown(test_lz4_bomb_expanding_past_the_output_is_refused,
	                                        setup, teardown),
	        cmocka_unit_test_setup_teardown(test_truncation_at_every_byte_is_refused, setup,
	                                        teardown),
	        cmocka_unit_test_setup_teardown(test_trailing_bytes_are_refused, setup, teardown),
	        cmocka_unit_test_setup_teardown(
	                test_two_zstd_frames_a_skippable_and_a_legacy_frame_are_refused, setup,
	                teardown),
	        cmocka_unit_test_setup_teardown(test_lz4_expanding_to_another_length_is_refused,
	                                        setup, teardown),
	        cmocka_unit_test_setup_teardown(test_unknown_codec_raw_and_empty_input_are_refused,
	                                        setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
