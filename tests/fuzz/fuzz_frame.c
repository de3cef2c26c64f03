/* libFuzzer harness: a compressed frame as a destination reads it from a
 * staging slot, decoded and expanded into a page run of exactly its
 * length (core/compress). The first byte picks the run (bits 0-3: 1 to
 * 16 pages of 4 KiB) and what is fuzzed (bits 4-5: a whole frame; a frame
 * announced 1 or 2 bytes shorter than its slot holds, bit 7; a bare lz4
 * payload; a bare zstd payload), and for a frame the codec announced
 * (bit 6: lz4 or zstd); the rest is the slot. The slot and
 * the run each end where an inaccessible page begins: libzstd and liblz4
 * are not instrumented, so the sanitizers would not see them read or
 * write past either, but the fault is seen. A frame that expands must
 * keep what it promised:
 * its header within the rules, and the run it gave compressing and
 * expanding back to itself. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "compress/frame.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct lmt_codec_ctx *ctx;

#define FENCED_MAX (68u << 10) /* the largest input (-max_len) or run, and more */

/* `len` bytes that end where a PROT_NONE page begins. */
static uint8_t *fenced(uint8_t **area, size_t len)
{
	if (!*area) {
		uint8_t *p = mmap(NULL, FENCED_MAX + 4096, PROT_READ | PROT_WRITE,
		                  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (p == MAP_FAILED || mprotect(p + FENCED_MAX, 4096, PROT_NONE))
			abort();
		*area = p;
	}
	if (len > FENCED_MAX)
		abort();
	return *area + FENCED_MAX - len;
}

/* The run compressed again and expanded must come back unchanged. */
static void round_trip(enum lmt_codec codec, const uint8_t *run, size_t raw)
{
	static uint8_t *frame_area, *back_area;
	uint8_t *frame = fenced(&frame_area, raw), *back = fenced(&back_area, raw);
	size_t n;
	struct lmt_error err;
	if (lmt__frame_compress(ctx, codec, 1, run, raw, frame, raw, &n, &err) == 0) {
		struct lmt_frame_expect x = {
		        .codec = codec, .room = raw, .length = n, .raw_len = raw};
		if (lmt__frame_expand(ctx, frame, &x, back, &err) || memcmp(back, run, raw))
			abort();
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct lmt_error err;
	if (!ctx && lmt__codec_ctx_new(&ctx, &err))
		abort();
	static uint8_t *slot_area, *run_area;
	if (size < 1 || size - 1 > FENCED_MAX)
		return 0;
	uint8_t pick = data[0];
	size_t raw = ((size_t)(pick & 15) + 1) * 4096;
	unsigned mode = (pick >> 4) & 3;
	size_t n = size - 1;
	uint8_t *slot = fenced(&slot_area, n);
	memcpy(slot, data + 1, n);
	uint8_t *out = fenced(&run_area, raw);
	struct lmt_frame_expect x = {.codec = pick & 0x40 ? LMT_CODEC_ZSTD : LMT_CODEC_LZ4,
	                             .room = n,
	                             .length = n,
	                             .raw_len = raw};
	if (mode == 1)
		x.length = n - (n < 2 ? n : (size_t)(pick >> 7) + 1);
	int rc;
	if (mode <= 1) {
		rc = lmt__frame_expand(ctx, slot, &x, out, &err);
		if (rc == 0) {
			struct lmt_frame f;
			if (lmt__frame_decode(slot, &x, &f, &err) || f.raw_len != raw ||
			    f.payload_len == 0 || f.payload_len >= raw ||
			    LMT_FRAME_HEADER_SIZE + (size_t)f.payload_len != x.length ||
			    f.codec != x.codec || f.flags)
				abort();
			round_trip(f.codec, out, raw);
		}
	} else {
		enum lmt_codec codec = mode == 2 ? LMT_CODEC_LZ4 : LMT_CODEC_ZSTD;
		rc = lmt__codec_expand(ctx, codec, slot, n, out, raw, &err);
		if (rc == 0)
			round_trip(codec, out, raw);
	}
	/* Hostile input is refused as a protocol error, never anything else. */
	if (rc != 0 && rc != -LMT_EPROTO)
		abort();
	return 0;
}
