/* libFuzzer harness: the save file's header, commit record, block table
 * and bitmaps (core/fileformat.c), and the file plugin's blobs. The first
 * byte picks: 0 decodes the rest as the start of a file as it is; 1 first
 * makes its checksums right, so that the checks behind them are reached;
 * 2 and 3 are the file plugin's address and key blobs. A table that
 * decodes must keep every area inside the file's bounds and apart. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../plugins/file/wire.h"
#include "bytes.h"
#include "fileformat.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define SUM_AT (LMT_FILE_ALIGN - 8)

static void reseal(uint8_t *p, size_t n)
{
	if (n < 2 * LMT_FILE_ALIGN)
		return;
	uint64_t table = lmt__get64(p + 40), len = lmt__get64(p + 48);
	if (table <= n && len <= n - table)
		lmt__put64(p + 56, lmt__file_hash(p + table, len));
	lmt__put64(p + SUM_AT, lmt__file_hash(p, SUM_AT));
	lmt__put64(p + LMT_FILE_ALIGN + SUM_AT, lmt__file_hash(p + LMT_FILE_ALIGN, SUM_AT));
}

static void check_areas(const struct lmt_file_header *h, const struct lmt_file_block *b)
{
	uint64_t low = h->table_offset + h->table_length;
	if (b->pages_offset < low || b->pages_offset + b->length > h->state_offset ||
	    b->bitmap_offset < low || b->bitmap_offset + b->bitmap_length > h->state_offset ||
	    b->bitmap_length / 8 * 64 < b->length / b->page_size)
		abort();
}

static void image(const uint8_t *data, size_t n)
{
	struct lmt_error err;
	struct lmt_file_header h;
	struct lmt_file_commit c;
	if (lmt__file_decode_header(data, n, &h, &err))
		return;
	lmt__file_decode_commit(data + LMT_FILE_ALIGN, n - LMT_FILE_ALIGN, &h, &c, &err);
	if (h.table_offset > n)
		return;
	struct lmt_file_block *blocks = calloc(h.block_count, sizeof(*blocks));
	if (!blocks)
		return;
	if (lmt__file_decode_table(data + h.table_offset, n - h.table_offset, &h, blocks, &err) ==
	    0) {
		for (uint32_t i = 0; i < h.block_count; i++) {
			const struct lmt_file_block *b = &blocks[i];
			check_areas(&h, b);
			if (b->bitmap_offset > n || b->bitmap_length > n - b->bitmap_offset)
				continue;
			uint64_t *map = malloc(b->bitmap_length);
			if (!map)
				continue;
			memcpy(map, data + b->bitmap_offset, b->bitmap_length);
			lmt__file_check_bitmap(b, map, &err);
			free(map);
		}
	}
	free(blocks);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	const uint8_t *p = data + 1;
	size_t n = size - 1;
	switch (data[0] % 4) {
	case 0:
		image(p, n);
		break;
	case 1: {
		uint8_t *copy = malloc(n ? n : 1);
		if (!copy)
			return 0;
		memcpy(copy, p, n);
		reseal(copy, n);
		image(copy, n);
		free(copy);
		break;
	}
	default: {
		if (n > LMT_BLOB_MAX)
			return 0;
		struct lmt_blob b = {.len = (uint32_t)n};
		memcpy(b.data, p, n);
		struct file_address a;
		struct file_range r;
		if (data[0] % 4 == 2 && !file_wire_address(&b, &a) && strlen(a.path) == 0)
			abort(); /* an address that decodes names a path */
		if (data[0] % 4 == 3 && !file_wire_key(&b, &r) && r.length == 0)
			abort();
		break;
	}
	}
	return 0;
}
