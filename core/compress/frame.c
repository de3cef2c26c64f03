/* The compressed frame's codec (frame.h): header layout, its checks, and
 * compress/expand of a whole frame over codec.c.
 * Room: compress; may use: base. */
#include "frame.h"

#include "bytes.h"
#include "error.h"

/* The header: u32 magic, u8 version, u8 codec, u16 flags, u32 raw length,
 * u32 payload length. */
void lmt__frame_encode(const struct lmt_frame *f, uint8_t *out)
{
	lmt__put32(out, LMT_FRAME_MAGIC);
	out[4] = (uint8_t)LMT_FRAME_VERSION;
	out[5] = (uint8_t)f->codec;
	lmt__put16(out + 6, f->flags);
	lmt__put32(out + 8, f->raw_len);
	lmt__put32(out + 12, f->payload_len);
}

int lmt__frame_decode(const uint8_t *p, const struct lmt_frame_expect *x, struct lmt_frame *f,
                      struct lmt_error *err)
{
	*f = (struct lmt_frame){0};
	if (x->raw_len == 0 || x->raw_len > LMT_CODEC_MAX_INPUT)
		return lmt__error(err, LMT_EINVAL, "frame: cannot expand to %zu bytes (1 to %u)",
		                  x->raw_len, LMT_CODEC_MAX_INPUT);
	if (x->codec != LMT_CODEC_LZ4 && x->codec != LMT_CODEC_ZSTD)
		return lmt__error(err, LMT_EINVAL,
		                  "frame: codec %d announced: expected lz4 or zstd", (int)x->codec);
	if (x->length > x->room)
		return lmt__error(err, LMT_EPROTO, "frame: %zu bytes overrun their %zu-byte slot",
		                  x->length, x->room);
	if (x->length < LMT_FRAME_HEADER_SIZE)
		return lmt__error(err, LMT_EPROTO,
		                  "frame: %zu bytes, shorter than its %u-byte header", x->length,
		                  LMT_FRAME_HEADER_SIZE);
	uint32_t magic = lmt__get32(p);
	if (magic != LMT_FRAME_MAGIC)
		return lmt__error(err, LMT_EPROTO, "frame: bad magic 0x%08x, expected 0x%08x",
		                  magic, LMT_FRAME_MAGIC);
	if (p[4] != LMT_FRAME_VERSION)
		return lmt__error(err, LMT_EPROTO, "frame: version %u, this lmt reads version %u",
		                  p[4], LMT_FRAME_VERSION);
	enum lmt_codec codec = (enum lmt_codec)p[5];
	if (codec == LMT_CODEC_RAW)
		return lmt__error(err, LMT_EPROTO, "frame: codec raw, which is never framed");
	if (codec != LMT_CODEC_LZ4 && codec != LMT_CODEC_ZSTD)
		return lmt__error(err, LMT_EPROTO, "frame: unknown codec %u", p[5]);
	const char *name = lmt__codec_name(codec);
	if (codec != x->codec)
		return lmt__error(err, LMT_EPROTO, "%s frame where %s was announced", name,
		                  lmt__codec_name(x->codec));
	uint16_t flags = lmt__get16(p + 6);
	if (flags & ~LMT_FRAME_KNOWN_FLAGS)
		return lmt__error(err, LMT_EPROTO, "%s frame: unknown flags 0x%04x", name, flags);
	uint32_t raw_len = lmt__get32(p + 8);
	if (raw_len != x->raw_len)
		return lmt__error(err, LMT_EPROTO, "%s frame: raw length %u, expected %zu", name,
		                  raw_len, x->raw_len);
	uint32_t payload_len = lmt__get32(p + 12);
	size_t room = x->length - LMT_FRAME_HEADER_SIZE;
	if (payload_len != room)
		return lmt__error(err, LMT_EPROTO,
		                  "%s frame: payload of %u bytes in a frame announced with %zu",
		                  name, payload_len, room);
	if (payload_len == 0 || payload_len >= raw_len)
		return lmt__error(
		        err, LMT_EPROTO,
		        "%s frame: payload of %u bytes for %u raw bytes (expected 1 to %u)", name,
		        payload_len, raw_len, raw_len - 1);
	f->codec = codec;
	f->flags = flags;
	f->raw_len = raw_len;
	f->payload_len = payload_len;
	f->payload = p + LMT_FRAME_HEADER_SIZE;
	return 0;
}

int lmt__frame_compress(struct lmt_codec_ctx *ctx, enum lmt_codec codec, int level, const void *in,
                        size_t in_len, void *out, size_t out_cap, size_t *frame_len,
                        struct lmt_error *err)
{
	*frame_len = 0;
	/* The frame, not just its payload, must save the margin; a cap of 0
	 * is "does not fit", after the codec checked its arguments. */
	size_t margin = lmt__codec_margin(in_len);
	size_t cap = out_cap > LMT_FRAME_HEADER_SIZE ? out_cap - LMT_FRAME_HEADER_SIZE : 0;
	if (in_len <= margin + LMT_FRAME_HEADER_SIZE)
		cap = 0;
	else if (in_len - margin - LMT_FRAME_HEADER_SIZE < cap)
		cap = in_len - margin - LMT_FRAME_HEADER_SIZE;
	uint8_t *o = out;
	size_t payload;
	int rc = lmt__codec_compress(ctx, codec, level, in, in_len, o + LMT_FRAME_HEADER_SIZE, cap,
	                             &payload, err);
	if (rc)
		return rc;
	struct lmt_frame f = {
	        .codec = codec, .raw_len = (uint32_t)in_len, .payload_len = (uint32_t)payload};
	lmt__frame_encode(&f, o);
	*frame_len = LMT_FRAME_HEADER_SIZE + payload;
	return 0;
}

int lmt__frame_expand(struct lmt_codec_ctx *ctx, const uint8_t *p, const struct lmt_frame_expect *x,
                      void *out, struct lmt_error *err)
{
	struct lmt_frame f;
	int rc = lmt__frame_decode(p, x, &f, err);
	if (rc)
		return rc;
	return lmt__codec_expand(ctx, f.codec, f.payload, f.payload_len, out, f.raw_len, err);
}
