/* The compressed frame's codec (core/compress/frame.c): the header's
 * bytes, every field refused by name, and whole frames compressed into a
 * bounded slot and expanded into an exact page run. The fuzzing is
 * tests/fuzz/fuzz_frame.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compress/frame.h"
#include "compress_pages.h"

static struct lmt_codec_ctx *ctx;

static int setup(void **state)
{
	struct lmt_error err = {0};
	return lmt__codec_ctx_new(&ctx, &err);
}

static int teardown(void **state)
{
	lmt__codec_ctx_free(ctx);
	return 0;
}

static void assert_message(const struct lmt_error *err, const char *part)
{
	if (!strstr(err->message, part))
		fail_msg("message '%s' lacks '%s'", err->message, part);
}

static void test_header_is_sixteen_little_endian_bytes(void **state)
{
	struct lmt_frame f = {
	        .codec = LMT_CODEC_ZSTD, .flags = 0, .raw_len = 0x00010000, .payload_len = 0x1234};
	uint8_t h[LMT_FRAME_HEADER_SIZE];
	lmt__frame_encode(&f, h);
	static const uint8_t want[LMT_FRAME_HEADER_SIZE] = {
	        'L', 'M', 'T', 'Z', 1, 2, 0, 0, 0x00, 0x00, 0x01, 0x00, 0x34, 0x12, 0, 0};
	assert_memory_equal(h, want, sizeof(want));
}

/* A frame header for a run of `raw` bytes with a payload of `payload`
 * bytes, in a buffer that holds them (the payload zeros). */
static uint8_t *frame_of(enum lmt_codec codec, uint32_t raw, uint32_t payload)
{
	uint8_t *p = calloc(1, LMT_FRAME_HEADER_SIZE + payload + 64);
	struct lmt_frame f = {.codec = codec, .raw_len = raw, .payload_len = payload};
	lmt__frame_encode(&f, p);
	return p;
}

/* Decode as the frame's own codec was announced (p[5], lz4 when that is
 * not a codec). */
static int decode(const uint8_t *p, size_t room, size_t length, size_t raw, struct lmt_frame *f,
                  struct lmt_error *err)
{
	enum lmt_codec codec = LMT_CODEC_LZ4;
	if (p && length > 5 && p[5] == LMT_CODEC_ZSTD)
		codec = LMT_CODEC_ZSTD;
	struct lmt_frame_expect x = {
	        .codec = codec, .room = room, .length = length, .raw_len = raw};
	return lmt__frame_decode(p, &x, f, err);
}

static void test_a_good_header_decodes_to_its_fields(void **state)
{
	struct lmt_error err = {0};
	struct lmt_frame f;
	uint8_t *p = frame_of(LMT_CODEC_LZ4, 8192, 100);
	assert_int_equal(decode(p, 65536, 116, 8192, &f, &err), 0);
	assert_int_equal(f.codec, LMT_CODEC_LZ4);
	assert_int_equal(f.flags, 0);
	assert_int_equal(f.raw_len, 8192);
	assert_int_equal(f.payload_len, 100);
	assert_ptr_equal(f.payload, p + LMT_FRAME_HEADER_SIZE);
	free(p);
}

static void test_every_length_shorter_than_the_header_is_refused(void **state)
{
	struct lmt_error err = {0};
	struct lmt_frame f;
	uint8_t *p = frame_of(LMT_CODEC_LZ4, 8192, 100);
	for (size_t len = 0; len < LMT_FRAME_HEADER_SIZE; len++) {
		/* Exactly `len` readable bytes, so a sanitizer sees a read past. */
		uint8_t *copy = malloc(len ? len : 1);
		memcpy(copy, p, len);
		assert_int_equal(decode(copy, len, len, 8192, &f, &err), -LMT_EPROTO);
		char want[80];
		snprintf(want, sizeof(want), "frame: %zu bytes, shorter than its 16-byte header",
		         len);
		assert_string_equal(err.message, want);
		free(copy);
	}
	free(p);
}

static void test_each_header_field_is_refused_by_name(void **state)
{
	struct lmt_error err = {0};
	struct lmt_frame f;
	uint8_t *p = frame_of(LMT_CODEC_ZSTD, 8192, 100);
	const size_t len = 116;

	p[0] ^= 1;
	assert_int_equal(decode(p, len, len, 8192, &f, &err), -LMT_EPROTO);
	assert_string_equal(err.message, "frame: bad magic 0x5a544d4d, expected 0x5a544d4c");
	p[0] ^= 1;

	p[4] = 2;
	assert_int_equal(decode(p, len, len, 8192, &f, &err), -LMT_EPROTO);
	assert_string_equal(err.message, "frame: version 2, this lmt reads version 1");
	p[4] = 1;

	p[5] = LMT_CODEC_RAW;
	assert_int_equal(decode(p, len, len, 8192, &f, &err), -LMT_EPROTO);
	assert_string_equal(err.message, "frame: codec raw, which is never framed");
	p[5] = 3;
	assert_int_equal(decode(p, len, len, 8192, &f, &err), -LMT_EPROTO);
	assert_string_equal(err.message, "frame: unknown codec 3");
	p[5] = 255;
	assert_int_equal(decode(p, len, len, 8192, &f, &err), -LMT_EPROTO);
	p[5] = LMT_CODEC_ZSTD;

	p[7] = 0x80;
	assert_int_equal(decode(p, len, len, 8192, &f, &err), -LMT_EPROTO);
	assert_string_equal(err.message, "zstd frame: unknown flags 0x8000");
	p[7] = 0;
	p[6] = 1;
	assert_int_equal(decode(p, len, len, 8192, &f, &err), -LMT_EPROTO);
	p[6] = 0;

	assert_int_equal(decode(p, len, len, 4096, &f, &err), -LMT_EPROTO);
	assert_string_equal(err.message, "zstd frame: raw length 8192, expected 4096");

	/* The payload length against the announced length: truncated and
	 * with trailing bytes. */
	assert_int_equal(decode(p, len, len - 1, 8192, &f, &err), -LMT_EPROTO);
	assert_string_equal(err.message,
	                    "zstd frame: payload of 100 bytes in a frame announced with 99");
	assert_int_equal(decode(p, len + 8, len + 8, 8192, &f, &err), -LMT_EPROTO);
	assert_string_equal(err.message,
	                    "zstd frame: payload of 100 bytes in a frame announced with 108");
	assert_int_equal(decode(p, len, len, 8192, &f, &err), 0);
	free(p);
}

static void test_a_codec_other_than_announced_is_refused(void **state)
{
	struct lmt_error err = {0};
	struct lmt_frame f;
	uint8_t *p = frame_of(LMT_CODEC_ZSTD, 8192, 100);
	struct lmt_frame_expect x = {
	        .codec = LMT_CODEC_LZ4, .room = 116, .length = 116, .raw_len = 8192};
	assert_int_equal(lmt__frame_decode(p, &x, &f, &err), -LMT_EPROTO);
	assert_string_equal(err.message, "zstd frame where lz4 was announced");
	x.codec = LMT_CODEC_ZSTD;
	assert_int_equal(lmt__frame_decode(p, &x, &f, &err), 0);
	/* Announcing raw, or nothing known, is the caller's error. */
	x.codec = LMT_CODEC_RAW;
	assert_int_equal(lmt__frame_decode(p, &x, &f, &err), -LMT_EINVAL);
	assert_string_equal(err.message, "frame: codec 0 announced: expected lz4 or zstd");
	free(p);
}

static void test_a_payload_that_saves_nothing_or_is_empty_is_refused(void **state)
{
	struct lmt_error err = {0};
	struct lmt_frame f;
	uint8_t *p = frame_of(LMT_CODEC_LZ4, 4096, 4096);
	assert_int_equal(decode(p, 8192, 16 + 4096, 4096, &f, &err), -LMT_EPROTO);
	assert_string_equal(
	        err.message,
	        "lz4 frame: payload of 4096 bytes for 4096 raw bytes (expected 1 to 4095)");
	free(p);
	p = frame_of(LMT_CODEC_LZ4, 4096, 0);
	assert_int_equal(decode(p, 8192, 16, 4096, &f, &err), -LMT_EPROTO);
	assert_message(&err, "payload of 0 bytes");
	free(p);
}

static void test_a_frame_longer_than_its_slot_is_refused_before_it_is_read(void **state)
{
	struct lmt_error err = {0};
	struct lmt_frame f;
	uint8_t *p = frame_of(LMT_CODEC_ZSTD, 65536, 65536);
	assert_int_equal(decode(p, 65536, 65536 + 16, 65536, &f, &err), -LMT_EPROTO);
	assert_string_equal(err.message, "frame: 65552 bytes overrun their 65536-byte slot");
	free(p);
	/* Nothing at all is read then: a NULL slot is never touched. */
	assert_int_equal(decode(NULL, 0, 16, 4096, &f, &err), -LMT_EPROTO);
}

static void test_an_impossible_expectation_is_the_callers_error(void **state)
{
	struct lmt_error err = {0};
	struct lmt_frame f;
	uint8_t *p = frame_of(LMT_CODEC_ZSTD, 4096, 100);
	assert_int_equal(decode(p, 116, 116, 0, &f, &err), -LMT_EINVAL);
	assert_int_equal(decode(p, 116, 116, ((size_t)1 << 30) + 1, &f, &err), -LMT_EINVAL);
	free(p);
}

static void test_frames_compress_into_a_bounded_slot_and_expand_to_the_run(void **state)
{
	struct lmt_error err = {0};
	enum lmt_codec codecs[] = {LMT_CODEC_LZ4, LMT_CODEC_ZSTD};
	size_t pages[] = {1, 4, 16, 64};
	uint8_t *run = malloc(64 * TEST_PAGE);
	for (int c = 0; c < 2; c++)
		for (size_t i = 0; i < 4; i++) {
			size_t len = pages[i] * TEST_PAGE, slot = len, n = 0;
			test_mixed_run(run, pages[i], i + 3, false);
			uint8_t *frame = test_guarded(slot);
			if (lmt__frame_compress(ctx, codecs[c], 0, run, len, frame, slot, &n, &err))
				fail_msg("%s of %zu pages: %s", lmt__codec_name(codecs[c]),
				         pages[i], err.message);
			assert_true(n <= len - lmt__codec_margin(len) && n <= slot);
			assert_true(test_guard_intact(frame, slot));
			uint8_t *back = test_guarded(len);
			struct lmt_frame_expect x = {
			        .codec = codecs[c], .room = slot, .length = n, .raw_len = len};
			if (lmt__frame_expand(ctx, frame, &x, back, &err))
				fail_msg("%s", err.message);
			assert_memory_equal(back, run, len);
			assert_true(test_guard_intact(back, len));
			/* The announced codec is the frame's own. */
			struct lmt_frame f;
			assert_int_equal(lmt__frame_decode(frame, &x, &f, &err), 0);
			assert_int_equal(f.codec, codecs[c]);
			free(back);
			free(frame);
		}
	free(run);
}

static void test_a_run_that_would_not_fit_its_slot_is_left_to_send_raw(void **state)
{
	struct lmt_error err = {0};
	size_t len = 16 * TEST_PAGE, n = 99;
	uint8_t *run = malloc(len);
	for (size_t i = 0; i < 16; i++)
		test_page(run + i * TEST_PAGE, PAGE_RANDOM, i);
	uint8_t *frame = test_guarded(len);
	assert_int_equal(
	        lmt__frame_compress(ctx, LMT_CODEC_ZSTD, 3, run, len, frame, len, &n, &err),
	        -LMT_EOVERFLOW);
	assert_int_equal(n, 0);
	/* A compressible run into a slot too small for its frame. */
	test_mixed_run(run, 16, 1, false);
	size_t caps[] = {200, 17, 16, 0};
	for (int i = 0; i < 4; i++) {
		uint8_t *small = test_guarded(caps[i]);
		assert_int_equal(lmt__frame_compress(ctx, LMT_CODEC_LZ4, 0, run, len, small,
		                                     caps[i], &n, &err),
		                 -LMT_EOVERFLOW);
		assert_true(test_guard_intact(small, caps[i]));
		free(small);
	}
	/* Bad arguments are reported as such, not as "does not fit". */
	assert_int_equal(
	        lmt__frame_compress(ctx, LMT_CODEC_ZSTD, 30, run, len, frame, len, &n, &err),
	        -LMT_EINVAL);
	assert_int_equal(lmt__frame_compress(ctx, LMT_CODEC_RAW, 0, run, len, frame, len, &n, &err),
	                 -LMT_EINVAL);
	free(frame);
	free(run);
}

static void test_a_frame_whose_payload_is_a_bomb_is_refused_by_its_codec(void **state)
{
	struct lmt_error err = {0};
	/* A real 64 KiB run of zeros framed, announced as a 4 KiB run whose
	 * header was rewritten to match: the payload still declares 64 KiB. */
	size_t len = 65536, n;
	uint8_t *zeros = calloc(1, len);
	uint8_t frame[4096];
	assert_int_equal(lmt__frame_compress(ctx, LMT_CODEC_ZSTD, 1, zeros, len, frame,
	                                     sizeof(frame), &n, &err),
	                 0);
	struct lmt_frame f = {.codec = LMT_CODEC_ZSTD,
	                      .raw_len = 4096,
	                      .payload_len = (uint32_t)(n - LMT_FRAME_HEADER_SIZE)};
	lmt__frame_encode(&f, frame);
	uint8_t *out = test_guarded(4096);
	struct lmt_frame_expect x = {
	        .codec = LMT_CODEC_ZSTD, .room = sizeof(frame), .length = n, .raw_len = 4096};
	assert_int_equal(lmt__frame_expand(ctx, frame, &x, out, &err), -LMT_EPROTO);
	assert_string_equal(err.message, "zstd frame: declares 65536 bytes, expected 4096");
	assert_true(test_guard_intact(out, 4096));
	/* The same with lz4: expanding past the run. */
	assert_int_equal(lmt__frame_compress(ctx, LMT_CODEC_LZ4, 0, zeros, len, frame,
	                                     sizeof(frame), &n, &err),
	                 0);
	f.codec = LMT_CODEC_LZ4;
	f.payload_len = (uint32_t)(n - LMT_FRAME_HEADER_SIZE);
	lmt__frame_encode(&f, frame);
	x.codec = LMT_CODEC_LZ4;
	x.length = n;
	assert_int_equal(lmt__frame_expand(ctx, frame, &x, out, &err), -LMT_EPROTO);
	assert_message(&err, "lz4 frame: damaged or truncated");
	assert_true(test_guard_intact(out, 4096));
	free(out);
	free(zeros);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_header_is_sixteen_little_endian_bytes),
	        cmocka_unit_test(test_a_good_header_decodes_to_its_fields),
	        cmocka_unit_test(test_every_length_shorter_than_the_header_is_refused),
	        cmocka_unit_test(test_each_header_field_is_refused_by_name),
	        cmocka_unit_test(test_a_codec_other_than_announced_is_refused),
	        cmocka_unit_test(test_a_payload_that_saves_nothing_or_is_empty_is_refused),
	        cmocka_unit_test(test_a_frame_longer_than_its_slot_is_refused_before_it_is_read),
	        cmocka_unit_test(test_an_impossible_expectation_is_the_callers_error),
	        cmocka_unit_test(test_frames_compress_into_a_bounded_slot_and_expand_to_the_run),
	        cmocka_unit_test(test_a_run_that_would_not_fit_its_slot_is_left_to_send_raw),
	        cmocka_unit_test(test_a_frame_whose_payload_is_a_bomb_is_refused_by_its_codec),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
