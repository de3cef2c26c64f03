/* The zstd and lz4 wrappers (codec.h): bounded output both ways, every
 * size of a hostile input checked before and after the library runs.
 * Room: compress; may use: base. */
#include "codec.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include <lz4.h>
#include <zstd.h>
#include <zstd_errors.h>

#include "bytes.h"
#include "error.h"

struct lmt_codec_ctx {
	ZSTD_CCtx *zstd_c;
	ZSTD_DCtx *zstd_d;
	void *lz4_state; /* LZ4_sizeofState() bytes, 8-byte aligned (malloc) */
};

const char *lmt__codec_name(enum lmt_codec codec)
{
	switch (codec) {
	case LMT_CODEC_RAW:
		return "raw";
	case LMT_CODEC_LZ4:
		return "lz4";
	case LMT_CODEC_ZSTD:
		return "zstd";
	default:
		return "unknown";
	}
}

int lmt__codec_level(enum lmt_codec codec, int level, struct lmt_error *err)
{
	switch (codec) {
	case LMT_CODEC_LZ4:
		if (level == 0 || level == LMT_CODEC_LZ4_LEVEL)
			return LMT_CODEC_LZ4_LEVEL;
		return lmt__error(err, LMT_EINVAL, "lz4: has only level %d, got %d",
		                  LMT_CODEC_LZ4_LEVEL, level);
	case LMT_CODEC_ZSTD:
		if (level == 0)
			return LMT_CODEC_ZSTD_LEVEL_DEFAULT;
		if (level >= LMT_CODEC_ZSTD_LEVEL_MIN && level <= LMT_CODEC_ZSTD_LEVEL_MAX)
			return level;
		return lmt__error(err, LMT_EINVAL, "zstd: expected a level from %d to %d, got %d",
		                  LMT_CODEC_ZSTD_LEVEL_MIN, LMT_CODEC_ZSTD_LEVEL_MAX, level);
	default:
		return lmt__error(err, LMT_EINVAL, "unknown codec %d: expected lz4 or zstd",
		                  (int)codec);
	}
}

size_t lmt__codec_margin(size_t in_len)
{
	size_t share = in_len / 32;
	return share > 64 ? share : 64;
}

void lmt__codec_ctx_free(struct lmt_codec_ctx *ctx)
{
	if (!ctx)
		return;
	ZSTD_freeCCtx(ctx->zstd_c);
	ZSTD_freeDCtx(ctx->zstd_d);
	free(ctx->lz4_state);
	free(ctx);
}

int lmt__codec_ctx_new(struct lmt_codec_ctx **out, struct lmt_error *err)
{
	struct lmt_codec_ctx *ctx = calloc(1, sizeof(*ctx));
	*out = NULL;
	if (ctx) {
		ctx->zstd_c = ZSTD_createCCtx();
		ctx->zstd_d = ZSTD_createDCtx();
		ctx->lz4_state = malloc((size_t)LZ4_sizeofState());
	}
	if (!ctx || !ctx->zstd_c || !ctx->zstd_d || !ctx->lz4_state) {
		lmt__codec_ctx_free(ctx);
		return lmt__error(err, LMT_ENOMEM, "compression: no memory for codec contexts");
	}
	*out = ctx;
	return 0;
}

size_t lmt__codec_ctx_size(const struct lmt_codec_ctx *ctx)
{
	return sizeof(*ctx) + ZSTD_sizeof_CCtx(ctx->zstd_c) + ZSTD_sizeof_DCtx(ctx->zstd_d) +
	       (size_t)LZ4_sizeofState();
}

static int does_not_fit(struct lmt_error *err, enum lmt_codec codec, size_t in_len, size_t limit)
{
	return lmt__error(err, LMT_EOVERFLOW, "%s: %zu bytes do not compress into %zu",
	                  lmt__codec_name(codec), in_len, limit);
}

int lmt__codec_compress(struct lmt_codec_ctx *ctx, enum lmt_codec codec, int level, const void *in,
                        size_t in_len, void *out, size_t out_cap, size_t *out_len,
                        struct lmt_error *err)
{
	*out_len = 0;
	int use = lmt__codec_level(codec, level, err);
	if (use < 0)
		return use;
	if (in_len == 0 || in_len > LMT_CODEC_MAX_INPUT)
		return lmt__error(err, LMT_EINVAL, "%s: cannot compress %zu bytes (1 to %u)",
		                  lmt__codec_name(codec), in_len, LMT_CODEC_MAX_INPUT);
	size_t margin = lmt__codec_margin(in_len);
	size_t limit = in_len <= margin ? 0 : in_len - margin;
	if (out_cap < limit)
		limit = out_cap;
	if (limit == 0)
		return does_not_fit(err, codec, in_len, 0);
	if (codec == LMT_CODEC_LZ4) {
		/* lz4 stops with 0 rather than write past dstCapacity. */
		int got = LZ4_compress_fast_extState(ctx->lz4_state, in, out, (int)in_len,
		                                     (int)limit, use);
		if (got <= 0)
			return does_not_fit(err, codec, in_len, limit);
		*out_len = (size_t)got;
		return 0;
	}
	size_t got = ZSTD_compressCCtx(ctx->zstd_c, out, limit, in, in_len, use);
	if (ZSTD_isError(got)) {
		if (ZSTD_getErrorCode(got) == ZSTD_error_dstSize_tooSmall)
			return does_not_fit(err, codec, in_len, limit);
		return lmt__error(err, LMT_EIO, "zstd: compressing %zu bytes at level %d: %s",
		                  in_len, use, ZSTD_getErrorName(got));
	}
	*out_len = got;
	return 0;
}

static int bad_frame(struct lmt_error *err, enum lmt_codec codec, const char *fmt, ...)
        LMT_PRINTF(3, 4);

/* -LMT_EPROTO, "<codec> frame: <what>". */
static int bad_frame(struct lmt_error *err, enum lmt_codec codec, const char *fmt, ...)
{
	char what[256];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	return lmt__error(err, LMT_EPROTO, "%s frame: %s", lmt__codec_name(codec), what);
}

static int expand_zstd(struct lmt_codec_ctx *ctx, const void *in, size_t in_len, void *out,
                       size_t expected, struct lmt_error *err)
{
	/* Only a standard frame: libzstd would also take skippable frames
	 * and, built with legacy support, decode the formats of before 1.0
	 * with decoders that allocate. lmt never writes either. */
	uint32_t magic = in_len >= 4 ? lmt__get32(in) : 0;
	if (magic != ZSTD_MAGICNUMBER)
		return lmt__error(err, LMT_EPROTO,
		                  "zstd frame: magic 0x%08x in %zu bytes, expected 0x%08x", magic,
		                  in_len, (unsigned)ZSTD_MAGICNUMBER);
	unsigned long long declared = ZSTD_getFrameContentSize(in, in_len);
	if (declared == ZSTD_CONTENTSIZE_ERROR)
		return bad_frame(err, LMT_CODEC_ZSTD,
		                 "no valid frame header in %zu bytes (expected %zu bytes out)",
		                 in_len, expected);
	if (declared == ZSTD_CONTENTSIZE_UNKNOWN)
		return bad_frame(err, LMT_CODEC_ZSTD,
		                 "declares no content size in %zu bytes, expected %zu", in_len,
		                 expected);
	if (declared != expected)
		return bad_frame(err, LMT_CODEC_ZSTD, "declares %zu bytes, expected %zu",
		                 (size_t)declared, expected);
	size_t whole = ZSTD_findFrameCompressedSize(in, in_len);
	if (ZSTD_isError(whole))
		return lmt__error(err, LMT_EPROTO,
		                  "zstd frame: truncated or damaged in %zu bytes: %s", in_len,
		                  ZSTD_getErrorName(whole));
	if (whole != in_len)
		return bad_frame(err, LMT_CODEC_ZSTD, "%zu trailing bytes after a frame of %zu",
		                 in_len - whole, whole);
	size_t got = ZSTD_decompressDCtx(ctx->zstd_d, out, expected, in, in_len);
	if (ZSTD_isError(got)) {
		if (ZSTD_getErrorCode(got) == ZSTD_error_dstSize_tooSmall)
			return bad_frame(err, LMT_CODEC_ZSTD, "expands past %zu bytes (%zu in)",
			                 expected, in_len);
		return lmt__error(err, LMT_EPROTO,
		                  "zstd frame: %s (%zu bytes in, %zu expected out)",
		                  ZSTD_getErrorName(got), in_len, expected);
	}
	if (got != expected)
		return bad_frame(err, LMT_CODEC_ZSTD, "expands to %zu bytes, expected %zu", got,
		                 expected);
	return 0;
}

/* An lz4 block has no size of its own: LZ4_decompress_safe refuses one
 * that would write past `expected`, reads past `in_len`, or leaves input
 * unread after its last literals (which it must end on). */
static int expand_lz4(const void *in, size_t in_len, void *out, size_t expected,
                      struct lmt_error *err)
{
	if (in_len > INT_MAX)
		return bad_frame(err, LMT_CODEC_LZ4,
		                 "%zu bytes in, more than a block can hold (%zu)", in_len,
		                 (size_t)INT_MAX);
	int got = LZ4_decompress_safe(in, out, (int)in_len, (int)expected);
	if (got < 0)
		return bad_frame(err, LMT_CODEC_LZ4,
		                 "damaged or truncated in %zu bytes, or expanding past %zu", in_len,
		                 expected);
	if ((size_t)got != expected)
		return bad_frame(err, LMT_CODEC_LZ4, "expands to %zu bytes, expected %zu",
		                 (size_t)got, expected);
	return 0;
}

int lmt__codec_expand(struct lmt_codec_ctx *ctx, enum lmt_codec codec, const void *in,
                      size_t in_len, void *out, size_t expected, struct lmt_error *err)
{
	if (codec != LMT_CODEC_LZ4 && codec != LMT_CODEC_ZSTD)
		return lmt__error(err, LMT_EINVAL, "unknown codec %d: expected lz4 or zstd",
		                  (int)codec);
	if (expected == 0 || expected > LMT_CODEC_MAX_INPUT)
		return lmt__error(err, LMT_EINVAL, "%s: cannot expand to %zu bytes (1 to %u)",
		                  lmt__codec_name(codec), expected, LMT_CODEC_MAX_INPUT);
	if (in_len == 0)
		return bad_frame(err, codec, "empty (%zu bytes), expected %zu bytes out", in_len,
		                 expected);
	if (codec == LMT_CODEC_LZ4)
		return expand_lz4(in, in_len, out, expected, err);
	return expand_zstd(ctx, in, in_len, out, expected, err);
}
