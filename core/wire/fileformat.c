/* The save file's codec (docs/file-format.md): layout, encoders, and
 * decoders that check every field before the engines trust it.
 * Room: wire; may use: base. */
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "bytes.h"
#include "error.h"
#include "fileformat.h"

static const uint8_t header_magic[8] = {'L', 'M', 'T', '-', 'S', 'A', 'V', 'E'};
static const uint8_t commit_magic[8] = {'L', 'M', 'T', '-', 'D', 'O', 'N', 'E'};

/* Fixed places in the header and the commit record; the last 8 bytes of
 * each hold the XXH3-64 of the bytes before them. */
#define H_VERSION 8
#define H_SIZE 12
#define H_ALIGN 16
#define H_FLAGS 20
#define H_STRIPE 24
#define H_BLOCKS 28
#define H_COMMIT 32
#define H_TABLE 40
#define H_TABLE_LEN 48
#define H_TABLE_DIGEST 56
#define H_STATE 64
#define H_SAVE_ID 72
#define H_USED 88
#define C_VERSION 8
#define C_SAVE_ID 16
#define C_PASSES 32
#define C_STATE_LEN 40
#define C_FILE_LEN 48
#define C_BITMAPS 56
#define C_DIGESTS 64
#define C_STATE 72
#define C_USED 80
#define SUM_AT (LMT_FILE_ALIGN - 8)
#define E_LENGTH 64
#define E_PAGE 72
#define E_BITMAP 80
#define E_BITMAP_LEN 88
#define E_PAGES 96
#define E_DIGESTS 104
#define E_DIGESTS_LEN 112
#define E_USED 120

uint64_t lmt__file_hash(const void *data, size_t len)
{
	return XXH3_64bits(data, len);
}

uint32_t lmt__file_block_stripe_shift(const struct lmt_file_block *b, uint32_t stripe_shift)
{
	uint32_t page_shift = (uint32_t)__builtin_ctz(b->page_size);
	return page_shift > stripe_shift ? page_shift : stripe_shift;
}

uint64_t lmt__file_block_stripes(const struct lmt_file_block *b, uint32_t stripe_shift)
{
	uint32_t shift = lmt__file_block_stripe_shift(b, stripe_shift);
	return (b->length >> shift) + ((b->length & ((1ull << shift) - 1)) != 0);
}

static uint64_t bitmap_bytes(const struct lmt_file_block *b)
{
	uint64_t pages = b->length / b->page_size;
	return (pages + 63) / 64 * 8;
}

void lmt__file_layout(struct lmt_file_header *h, struct lmt_file_block *blocks, uint32_t n,
                      bool digests)
{
	h->version = LMT_FILE_VERSION;
	h->align = LMT_FILE_ALIGN;
	h->flags = digests ? LMT_FILE_DIGESTS : 0;
	h->stripe_shift = LMT_FILE_STRIPE_SHIFT;
	h->block_count = n;
	h->commit_offset = LMT_FILE_ALIGN;
	h->table_offset = 2 * LMT_FILE_ALIGN;
	h->table_length = (uint64_t)n * LMT_FILE_ENTRY_SIZE;
	uint64_t at = lmt__file_round(h->table_offset + h->table_length, LMT_FILE_ALIGN);
	/* The small areas first, together, then the page areas. */
	for (uint32_t i = 0; i < n; i++) {
		struct lmt_file_block *b = &blocks[i];
		b->bitmap_offset = at;
		b->bitmap_length = bitmap_bytes(b);
		at = lmt__file_round(at + b->bitmap_length, LMT_FILE_ALIGN);
		b->digests_offset = 0;
		b->digests_length = 0;
		if (digests) {
			b->digests_offset = at;
			b->digests_length = lmt__file_block_stripes(b, h->stripe_shift) * 8;
			at = lmt__file_round(at + b->digests_length, LMT_FILE_ALIGN);
		}
	}
	for (uint32_t i = 0; i < n; i++) {
		at = lmt__file_round(at, LMT_FILE_PAGES_ALIGN);
		blocks[i].pages_offset = at;
		at += blocks[i].length;
	}
	h->state_offset = lmt__file_round(at, LMT_FILE_ALIGN);
}

void lmt__file_encode_header(const struct lmt_file_header *h, uint8_t *out)
{
	memset(out, 0, LMT_FILE_ALIGN);
	memcpy(out, header_magic, sizeof(header_magic));
	lmt__put32(out + H_VERSION, h->version);
	lmt__put32(out + H_SIZE, LMT_FILE_ALIGN);
	lmt__put32(out + H_ALIGN, h->align);
	lmt__put32(out + H_FLAGS, h->flags);
	lmt__put32(out + H_STRIPE, h->stripe_shift);
	lmt__put32(out + H_BLOCKS, h->block_count);
	lmt__put64(out + H_COMMIT, h->commit_offset);
	lmt__put64(out + H_TABLE, h->table_offset);
	lmt__put64(out + H_TABLE_LEN, h->table_length);
	lmt__put64(out + H_TABLE_DIGEST, h->table_digest);
	lmt__put64(out + H_STATE, h->state_offset);
	memcpy(out + H_SAVE_ID, h->save_id, LMT_FILE_SAVE_ID);
	lmt__put64(out + SUM_AT, lmt__file_hash(out, SUM_AT));
}

void lmt__file_encode_table(const struct lmt_file_block *blocks, uint32_t n, uint8_t *out)
{
	for (uint32_t i = 0; i < n; i++) {
		const struct lmt_file_block *b = &blocks[i];
		uint8_t *e = out + (size_t)i * LMT_FILE_ENTRY_SIZE;
		memset(e, 0, LMT_FILE_ENTRY_SIZE);
		memcpy(e, b->name, strnlen(b->name, LMT_BLOCK_NAME_MAX));
		lmt__put64(e + E_LENGTH, b->length);
		lmt__put32(e + E_PAGE, b->page_size);
		lmt__put64(e + E_BITMAP, b->bitmap_offset);
		lmt__put64(e + E_BITMAP_LEN, b->bitmap_length);
		lmt__put64(e + E_PAGES, b->pages_offset);
		lmt__put64(e + E_DIGESTS, b->digests_offset);
		lmt__put64(e + E_DIGESTS_LEN, b->digests_length);
	}
}

void lmt__file_encode_commit(const struct lmt_file_commit *c, uint8_t *out)
{
	memset(out, 0, LMT_FILE_ALIGN);
	memcpy(out, commit_magic, sizeof(commit_magic));
	lmt__put32(out + C_VERSION, LMT_FILE_VERSION);
	memcpy(out + C_SAVE_ID, c->save_id, LMT_FILE_SAVE_ID);
	lmt__put64(out + C_PASSES, c->passes);
	lmt__put64(out + C_STATE_LEN, c->state_length);
	lmt__put64(out + C_FILE_LEN, c->file_length);
	lmt__put64(out + C_BITMAPS, c->bitmaps_digest);
	lmt__put64(out + C_DIGESTS, c->digests_digest);
	lmt__put64(out + C_STATE, c->state_digest);
	lmt__put64(out + SUM_AT, lmt__file_hash(out, SUM_AT));
}

static bool all_zero(const uint8_t *p, size_t len)
{
	for (size_t i = 0; i < len; i++)
		if (p[i])
			return false;
	return true;
}

int lmt__file_decode_header(const uint8_t *buf, size_t len, struct lmt_file_header *h,
                            struct lmt_error *err)
{
	memset(h, 0, sizeof(*h));
	if (len < LMT_FILE_ALIGN)
		return lmt__error(err, LMT_EPROTO,
		                  "header: %zu bytes, shorter than the %u of a header", len,
		                  LMT_FILE_ALIGN);
	if (memcmp(buf, header_magic, sizeof(header_magic)) != 0)
		return lmt__error(err, LMT_EPROTO,
		                  "header: not an lmt save file (no LMT-SAVE magic at offset 0)");
	h->version = lmt__get32(buf + H_VERSION);
	if (h->version > LMT_FILE_VERSION)
		return lmt__error(err, LMT_EPROTO,
		                  "header: format version %u is newer than this lmt reads (%u)",
		                  h->version, LMT_FILE_VERSION);
	if (h->version != LMT_FILE_VERSION)
		return lmt__error(err, LMT_EPROTO,
		                  "header: format version %u is unknown; this lmt reads %u",
		                  h->version, LMT_FILE_VERSION);
	if (lmt__get64(buf + SUM_AT) != lmt__file_hash(buf, SUM_AT))
		return lmt__error(err, LMT_EPROTO,
		                  "header: checksum mismatch (the header is corrupt)");
	uint32_t size = lmt__get32(buf + H_SIZE);
	h->align = lmt__get32(buf + H_ALIGN);
	h->flags = lmt__get32(buf + H_FLAGS);
	h->stripe_shift = lmt__get32(buf + H_STRIPE);
	h->block_count = lmt__get32(buf + H_BLOCKS);
	h->commit_offset = lmt__get64(buf + H_COMMIT);
	h->table_offset = lmt__get64(buf + H_TABLE);
	h->table_length = lmt__get64(buf + H_TABLE_LEN);
	h->table_digest = lmt__get64(buf + H_TABLE_DIGEST);
	h->state_offset = lmt__get64(buf + H_STATE);
	memcpy(h->save_id, buf + H_SAVE_ID, LMT_FILE_SAVE_ID);
	if (size != LMT_FILE_ALIGN || h->align != LMT_FILE_ALIGN)
		return lmt__error(err, LMT_EPROTO,
		                  "header: header size %u and alignment %u, expected %u and %u",
		                  size, h->align, LMT_FILE_ALIGN, LMT_FILE_ALIGN);
	if (h->flags & ~LMT_FILE_KNOWN_FLAGS)
		return lmt__error(err, LMT_EPROTO, "header: unknown flags 0x%x",
		                  h->flags & ~LMT_FILE_KNOWN_FLAGS);
	if (h->stripe_shift != LMT_FILE_STRIPE_SHIFT)
		return lmt__error(err, LMT_EPROTO, "header: stripe shift %u, expected %u",
		                  h->stripe_shift, LMT_FILE_STRIPE_SHIFT);
	if (h->block_count == 0 || h->block_count > LMT_FILE_MAX_BLOCKS)
		return lmt__error(err, LMT_EPROTO, "header: %u blocks, expected 1 to %u",
		                  h->block_count, LMT_FILE_MAX_BLOCKS);
	if (!all_zero(buf + H_USED, SUM_AT - H_USED))
		return lmt__error(err, LMT_EPROTO, "header: reserved bytes are not zero");
	if (h->commit_offset != LMT_FILE_ALIGN)
		return lmt__error(err, LMT_EPROTO, "header: commit record at %llu, expected %u",
		                  (unsigned long long)h->commit_offset, LMT_FILE_ALIGN);
	if (h->table_offset != 2ull * LMT_FILE_ALIGN ||
	    h->table_length != (uint64_t)h->block_count * LMT_FILE_ENTRY_SIZE)
		return lmt__error(err, LMT_EPROTO,
		                  "header: block table of %llu bytes at %llu, expected %llu at %u",
		                  (unsigned long long)h->table_length,
		                  (unsigned long long)h->table_offset,
		                  (unsigned long long)h->block_count * LMT_FILE_ENTRY_SIZE,
		                  2 * LMT_FILE_ALIGN);
	if (h->state_offset % LMT_FILE_ALIGN ||
	    h->state_offset < lmt__file_round(h->table_offset + h->table_length, LMT_FILE_ALIGN) ||
	    h->state_offset > (UINT64_MAX >> 2))
		return lmt__error(err, LMT_EPROTO,
		                  "header: device state offset %llu is not an aligned offset after "
		                  "the block table",
		                  (unsigned long long)h->state_offset);
	return 0;
}

struct area {
	uint64_t offset, length;
	uint32_t block;
	const char *what;
};

static int area_cmp(const void *a, const void *b)
{
	const struct area *x = a, *y = b;
	return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* An area of block i: aligned, not wrapping, between the table and the
 * device state. */
static int check_area(const struct lmt_file_header *h, uint32_t i, const char *name,
                      const char *what, uint64_t offset, uint64_t length, uint64_t align,
                      struct lmt_error *err)
{
	uint64_t low = lmt__file_round(h->table_offset + h->table_length, LMT_FILE_ALIGN);
	if (offset % align || offset < low || offset > h->state_offset ||
	    length > h->state_offset - offset)
		return lmt__error(err, LMT_EPROTO,
		                  "block table: block %u ('%s'): %s of %llu bytes at offset %llu "
		                  "lies outside the file's areas (%llu to %llu) or is not aligned "
		                  "to %llu",
		                  i, name, what, (unsigned long long)length,
		                  (unsigned long long)offset, (unsigned long long)low,
		                  (unsigned long long)h->state_offset, (unsigned long long)align);
	return 0;
}

static int decode_entry(const uint8_t *e, const struct lmt_file_header *h, uint32_t i,
                        struct lmt_file_block *b, struct lmt_error *err)
{
	memset(b, 0, sizeof(*b));
	size_t n = strnlen((const char *)e, LMT_BLOCK_NAME_MAX + 1);
	if (n == 0 || n > LMT_BLOCK_NAME_MAX || !all_zero(e + n, E_LENGTH - n))
		return lmt__error(err, LMT_EPROTO,
		                  "block table: block %u: the name is empty, too long or not "
		                  "NUL-padded",
		                  i);
	for (size_t k = 0; k < n; k++)
		if (e[k] < 0x20 || e[k] == 0x7f)
			return lmt__error(err, LMT_EPROTO,
			                  "block table: block %u: the name has a control character",
			                  i);
	memcpy(b->name, e, n);
	b->length = lmt__get64(e + E_LENGTH);
	b->page_size = lmt__get32(e + E_PAGE);
	b->bitmap_offset = lmt__get64(e + E_BITMAP);
	b->bitmap_length = lmt__get64(e + E_BITMAP_LEN);
	b->pages_offset = lmt__get64(e + E_PAGES);
	b->digests_offset = lmt__get64(e + E_DIGESTS);
	b->digests_length = lmt__get64(e + E_DIGESTS_LEN);
	if (!all_zero(e + E_USED, LMT_FILE_ENTRY_SIZE - E_USED) || lmt__get32(e + E_PAGE + 4))
		return lmt__error(err, LMT_EPROTO,
		                  "block table: block %u ('%s'): reserved bytes "
		                  "are not zero",
		                  i, b->name);
	if (b->page_size < 4096 || (b->page_size & (b->page_size - 1)) || b->page_size > (1u << 30))
		return lmt__error(
		        err, LMT_EPROTO,
		        "block table: block %u ('%s'): page size %u is not a power of two "
		        "from 4K to 1G",
		        i, b->name, b->page_size);
	if (b->length == 0 || b->length % b->page_size || b->length > h->state_offset)
		return lmt__error(err, LMT_EPROTO,
		                  "block table: block %u ('%s'): length %llu is 0, not a multiple "
		                  "of its page size or larger than the file's areas",
		                  i, b->name, (unsigned long long)b->length);
	if (b->bitmap_length != bitmap_bytes(b))
		return lmt__error(err, LMT_EPROTO,
		                  "block table: block %u ('%s'): bitmap of %llu bytes for %llu "
		                  "pages, expected %llu",
		                  i, b->name, (unsigned long long)b->bitmap_length,
		                  (unsigned long long)(b->length / b->page_size),
		                  (unsigned long long)bitmap_bytes(b));
	uint64_t digests =
	        (h->flags & LMT_FILE_DIGESTS) ? lmt__file_block_stripes(b, h->stripe_shift) * 8 : 0;
	if (b->digests_length != digests || (!digests && b->digests_offset))
		return lmt__error(err, LMT_EPROTO,
		                  "block table: block %u ('%s'): digests of %llu bytes, expected "
		                  "%llu",
		                  i, b->name, (unsigned long long)b->digests_length,
		                  (unsigned long long)digests);
	int rc;
	if ((rc = check_area(h, i, b->name, "bitmap", b->bitmap_offset, b->bitmap_length,
	                     LMT_FILE_ALIGN, err)) ||
	    (rc = check_area(h, i, b->name, "page area", b->pages_offset, b->length, LMT_FILE_ALIGN,
	                     err)))
		return rc;
	if (digests && (rc = check_area(h, i, b->name, "digests", b->digests_offset,
	                                b->digests_length, LMT_FILE_ALIGN, err)))
		return rc;
	return 0;
}

int lmt__file_decode_table(const uint8_t *buf, size_t len, const struct lmt_file_header *h,
                           struct lmt_file_block *blocks, struct lmt_error *err)
{
	if (len < h->table_length)
		return lmt__error(err, LMT_EPROTO, "block table: %zu bytes, expected %llu", len,
		                  (unsigned long long)h->table_length);
	if (lmt__file_hash(buf, h->table_length) != h->table_digest)
		return lmt__error(err, LMT_EPROTO,
		                  "block table: checksum mismatch (the table is corrupt)");
	struct area *areas = calloc((size_t)h->block_count * 3, sizeof(*areas));
	if (!areas)
		return lmt__error(err, LMT_ENOMEM, "block table: out of memory");
	uint32_t n = 0;
	int rc = 0;
	for (uint32_t i = 0; i < h->block_count && !rc; i++) {
		struct lmt_file_block *b = &blocks[i];
		rc = decode_entry(buf + (size_t)i * LMT_FILE_ENTRY_SIZE, h, i, b, err);
		for (uint32_t k = 0; k < i && !rc; k++)
			if (strcmp(blocks[k].name, b->name) == 0)
				rc = lmt__error(err, LMT_EPROTO,
				                "block table: blocks %u and %u are both '%s'", k, i,
				                b->name);
		if (rc)
			break;
		areas[n++] = (struct area){b->bitmap_offset, b->bitmap_length, i, "bitmap"};
		areas[n++] = (struct area){b->pages_offset, b->length, i, "page area"};
		if (b->digests_length)
			areas[n++] =
			        (struct area){b->digests_offset, b->digests_length, i, "digests"};
	}
	if (!rc) {
		qsort(areas, n, sizeof(*areas), area_cmp);
		for (uint32_t k = 1; k < n && !rc; k++)
			if (areas[k - 1].offset + areas[k - 1].length > areas[k].offset)
				rc = lmt__error(
				        err, LMT_EPROTO,
				        "block table: the %s of block %u ('%s') overlaps the "
				        "%s of block %u ('%s')",
				        areas[k].what, areas[k].block, blocks[areas[k].block].name,
				        areas[k - 1].what, areas[k - 1].block,
				        blocks[areas[k - 1].block].name);
	}
	free(areas);
	return rc;
}

int lmt__file_decode_commit(const uint8_t *buf, size_t len, const struct lmt_file_header *h,
                            struct lmt_file_commit *c, struct lmt_error *err)
{
	memset(c, 0, sizeof(*c));
	if (len < LMT_FILE_ALIGN)
		return lmt__error(err, LMT_EPROTO, "commit record: %zu bytes, expected %u", len,
		                  LMT_FILE_ALIGN);
	if (all_zero(buf, LMT_FILE_ALIGN))
		return lmt__error(
		        err, LMT_EPROTO,
		        "no commit record: the file is from a save that did not complete");
	if (memcmp(buf, commit_magic, sizeof(commit_magic)) != 0 ||
	    lmt__get64(buf + SUM_AT) != lmt__file_hash(buf, SUM_AT))
		return lmt__error(err, LMT_EPROTO,
		                  "commit record: bad magic or checksum (the record is corrupt)");
	if (lmt__get32(buf + C_VERSION) != h->version || lmt__get32(buf + C_VERSION + 4) ||
	    !all_zero(buf + C_USED, SUM_AT - C_USED))
		return lmt__error(err, LMT_EPROTO,
		                  "commit record: version %u or reserved bytes do not match the "
		                  "header",
		                  lmt__get32(buf + C_VERSION));
	memcpy(c->save_id, buf + C_SAVE_ID, LMT_FILE_SAVE_ID);
	c->passes = lmt__get64(buf + C_PASSES);
	c->state_length = lmt__get64(buf + C_STATE_LEN);
	c->file_length = lmt__get64(buf + C_FILE_LEN);
	c->bitmaps_digest = lmt__get64(buf + C_BITMAPS);
	c->digests_digest = lmt__get64(buf + C_DIGESTS);
	c->state_digest = lmt__get64(buf + C_STATE);
	if (memcmp(c->save_id, h->save_id, LMT_FILE_SAVE_ID) != 0)
		return lmt__error(err, LMT_EPROTO,
		                  "commit record: it belongs to another save (save ids differ)");
	if (c->state_length > LMT_FILE_MAX_STATE)
		return lmt__error(err, LMT_EPROTO,
		                  "commit record: device state of %llu bytes, more than 1G",
		                  (unsigned long long)c->state_length);
	if (c->file_length != h->state_offset + lmt__file_round(c->state_length, LMT_FILE_ALIGN))
		return lmt__error(
		        err, LMT_EPROTO,
		        "commit record: file length %llu, expected %llu for %llu bytes of "
		        "device state at %llu",
		        (unsigned long long)c->file_length,
		        (unsigned long long)(h->state_offset +
		                             lmt__file_round(c->state_length, LMT_FILE_ALIGN)),
		        (unsigned long long)c->state_length, (unsigned long long)h->state_offset);
	return 0;
}

int lmt__file_check_bitmap(const struct lmt_file_block *b, const uint64_t *bitmap,
                           struct lmt_error *err)
{
	uint64_t pages = b->length / b->page_size, words = b->bitmap_length / 8;
	if (pages % 64 == 0)
		return 0;
	uint64_t beyond = bitmap[words - 1] & ~((1ull << (pages % 64)) - 1);
	if (beyond)
		return lmt__error(
		        err, LMT_EPROTO,
		        "block '%s': the bitmap claims page %llu, beyond the block's %llu "
		        "pages",
		        b->name,
		        (unsigned long long)((words - 1) * 64 + (uint64_t)__builtin_ctzll(beyond)),
		        (unsigned long long)pages);
	return 0;
}

int lmt__file_address(struct lmt_blob *blob, enum lmt_storage_mode mode, const char *path,
                      uint64_t size)
{
	size_t n = strlen(path);
	if (n == 0 || n > LMT_STORAGE_PATH_MAX)
		return -LMT_EINVAL;
	memset(blob, 0, sizeof(*blob));
	lmt__put16(blob->data, LMT_STORAGE_BLOB_VERSION);
	lmt__put16(blob->data + 2, (uint16_t)mode);
	lmt__put32(blob->data + 4, (uint32_t)n);
	lmt__put64(blob->data + 8, size);
	memcpy(blob->data + LMT_STORAGE_ADDR_HEADER, path, n);
	blob->len = (uint32_t)(LMT_STORAGE_ADDR_HEADER + n);
	return 0;
}

void lmt__file_key(struct lmt_blob *blob, uint64_t offset, uint64_t length)
{
	memset(blob, 0, sizeof(*blob));
	lmt__put16(blob->data, LMT_STORAGE_BLOB_VERSION);
	lmt__put64(blob->data + 8, offset);
	lmt__put64(blob->data + 16, length);
	blob->len = LMT_STORAGE_KEY_SIZE;
}
