/* The codecs lmt compresses guest pages with: thin wrappers over libzstd
 * and liblz4 that compress into a caller's bounded buffer and expand a
 * hostile input into an output of exactly the expected length, never
 * writing outside it (docs/compression.md).
 * Room: compress; may use: base. */
#ifndef LMT_CORE_COMPRESS_CODEC_H
#define LMT_CORE_COMPRESS_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include <lmt/lmt.h>

/* Values are on the wire (the frame header): never renumber. */
enum lmt_codec {
	LMT_CODEC_RAW = 0,  /* no codec: pages as they are, never framed */
	LMT_CODEC_LZ4 = 1,  /* the LZ4 block format, acceleration 1 */
	LMT_CODEC_ZSTD = 2, /* one Zstandard frame with its content size */
	LMT_CODEC_COUNT
};

#define LMT_CODEC_ZSTD_LEVEL_MIN 1
#define LMT_CODEC_ZSTD_LEVEL_MAX 19
#define LMT_CODEC_ZSTD_LEVEL_DEFAULT 1
/* lz4 has one level: LZ4's default, acceleration 1. */
#define LMT_CODEC_LZ4_LEVEL 1
/* The largest input either way: chunk-size's largest value. */
#define LMT_CODEC_MAX_INPUT (1u << 30)

/* "raw", "lz4", "zstd", or "unknown" for another value. */
const char *lmt__codec_name(enum lmt_codec codec);

/* `level` for `codec`, 0 meaning the codec's default: the level to use
 * (>= 1), or -LMT_EINVAL with err naming the codec and the range. */
int lmt__codec_level(enum lmt_codec codec, int level, struct lmt_error *err);

/* What a compressed result must save over its input, in bytes: a frame
 * that saves less costs the destination an expansion (and a staging slot)
 * for next to nothing, so the caller sends those bytes raw instead. */
size_t lmt__codec_margin(size_t in_len);

/* One thread's contexts (ZSTD_CCtx, ZSTD_DCtx, LZ4 state), reused for
 * every call so that no call allocates. Not thread-safe: one per thread. */
struct lmt_codec_ctx;

/* 0, or -LMT_ENOMEM. Free with lmt__codec_ctx_free (NULL is fine). */
int lmt__codec_ctx_new(struct lmt_codec_ctx **out, struct lmt_error *err);
void lmt__codec_ctx_free(struct lmt_codec_ctx *ctx);
/* The bytes `ctx` holds now: zstd's contexts grow to what the largest
 * run at the highest level used needed, and stay so. */
size_t lmt__codec_ctx_size(const struct lmt_codec_ctx *ctx);

/* Compress `in_len` bytes (1 .. LMT_CODEC_MAX_INPUT) with lz4 or zstd into
 * `out`, writing at most min(out_cap, in_len - margin) bytes: 0 with
 * *out_len set; -LMT_EOVERFLOW ("does not fit": the input does not
 * compress enough, send it raw); -LMT_EINVAL for a bad codec, level or
 * length; -LMT_EIO if the library fails otherwise. `level` as in
 * lmt__codec_level. */
int lmt__codec_compress(struct lmt_codec_ctx *ctx, enum lmt_codec codec, int level, const void *in,
                        size_t in_len, void *out, size_t out_cap, size_t *out_len,
                        struct lmt_error *err);

/* Expand `in_len` bytes of `codec` (lz4 or zstd) into `out`, which must
 * come out exactly `expected` bytes long (1 .. LMT_CODEC_MAX_INPUT): 0, or
 * -LMT_EPROTO with err naming the codec, what was wrong and the sizes (a
 * zstd frame that declares another size or none, a truncated or damaged
 * input, bytes after the zstd frame, an expansion past or short of
 * `expected`), -LMT_EINVAL for an unknown codec. Never writes outside
 * out[0, expected); `out` may hold anything afterwards on a failure. */
int lmt__codec_expand(struct lmt_codec_ctx *ctx, enum lmt_codec codec, const void *in,
                      size_t in_len, void *out, size_t expected, struct lmt_error *err);

#endif
