/* The compressed frame: a 16-byte header (magic, version, codec, flags,
 * raw length, payload length; little-endian) and the codec's payload, as
 * the source writes it into a destination's staging slot. A pure codec in
 * the style of the control protocol's: every field checked on the way in,
 * with a message that says which and why (docs/compression.md).
 * Room: compress; may use: base. */
#ifndef LMT_CORE_COMPRESS_FRAME_H
#define LMT_CORE_COMPRESS_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include <lmt/lmt.h>

#include "codec.h"

#define LMT_FRAME_MAGIC 0x5a544d4cu /* "LMTZ" */
#define LMT_FRAME_VERSION 1u
#define LMT_FRAME_HEADER_SIZE 16u
/* No flag is defined yet: a frame with any set is refused. */
#define LMT_FRAME_KNOWN_FLAGS 0u

struct lmt_frame {
	enum lmt_codec codec; /* lz4 or zstd: raw pages are never framed */
	uint16_t flags;
	uint32_t raw_len;     /* the page run the payload expands to */
	uint32_t payload_len; /* bytes after the header */
	const uint8_t *payload;
};

/* Write the header of `f` (payload_len set) at out[0, 16). */
void lmt__frame_encode(const struct lmt_frame *f, uint8_t *out);

/* What the destination knows of a frame before it reads it: from the
 * control message that names it, and the slot it was written into. */
struct lmt_frame_expect {
	enum lmt_codec codec; /* as announced: lz4 or zstd */
	size_t room;          /* bytes readable from the frame's first: its slot's size */
	size_t length;        /* the frame's announced length, header included */
	size_t raw_len;       /* the page run it must expand to (1 .. LMT_CODEC_MAX_INPUT) */
};

/* Check the header at `p` against `x`: 0 with `f` filled (payload inside
 * p[0, x->length)), or -LMT_EPROTO with err naming the field, its value and
 * what was expected (a codec other than announced included). Reads
 * nothing past min(x->room, x->length); -LMT_EINVAL when `x` itself could
 * never be met. */
int lmt__frame_decode(const uint8_t *p, const struct lmt_frame_expect *x, struct lmt_frame *f,
                      struct lmt_error *err);

/* Compress `in_len` bytes into a whole frame at `out` (at most out_cap
 * bytes, and at most in_len less lmt__codec_margin): 0 with *frame_len
 * set, or as lmt__codec_compress (-LMT_EOVERFLOW: send the run raw). */
int lmt__frame_compress(struct lmt_codec_ctx *ctx, enum lmt_codec codec, int level, const void *in,
                        size_t in_len, void *out, size_t out_cap, size_t *frame_len,
                        struct lmt_error *err);

/* Decode the frame at `p` against `x` and expand it into out[0,
 * x->raw_len): 0, or -LMT_EPROTO with the reason (the header's or the
 * codec's). Never writes outside out[0, x->raw_len). */
int lmt__frame_expand(struct lmt_codec_ctx *ctx, const uint8_t *p, const struct lmt_frame_expect *x,
                      void *out, struct lmt_error *err);

#endif
