/* The save file's layout and its codec (docs/file-format.md): pure
 * functions over byte buffers that check every field and say what is
 * wrong, shared by the save and the restore and fuzzed on their own.
 * Room: wire; may use: base. */
#ifndef LMT_CORE_FILEFORMAT_H
#define LMT_CORE_FILEFORMAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <lmt/lmt.h>

#define LMT_FILE_VERSION 1u
/* Every area starts at a multiple of this, and the header and the commit
 * record are this long: enough for O_DIRECT on any disk. */
#define LMT_FILE_ALIGN 4096u
/* Page areas start at a multiple of this. */
#define LMT_FILE_PAGES_ALIGN 65536u
#define LMT_FILE_ENTRY_SIZE 128u
#define LMT_FILE_MAX_BLOCKS 256u
#define LMT_FILE_MAX_STATE (1ull << 30)
#define LMT_FILE_STRIPE_SHIFT 16u
#define LMT_FILE_SAVE_ID 16u

enum lmt_file_flags {
	LMT_FILE_DIGESTS = 1u << 0, /* a digest per stripe of every block (verify=on) */
};
#define LMT_FILE_KNOWN_FLAGS ((uint32_t)LMT_FILE_DIGESTS)

struct lmt_file_header {
	uint32_t version;
	uint32_t align; /* the file's page: LMT_FILE_ALIGN */
	uint32_t flags;
	uint32_t stripe_shift; /* verify's stripes; a block's are its page where larger */
	uint32_t block_count;
	uint64_t commit_offset;
	uint64_t table_offset;
	uint64_t table_length; /* block_count * LMT_FILE_ENTRY_SIZE */
	uint64_t table_digest; /* XXH3-64 of the table's bytes */
	uint64_t state_offset; /* the device state, after every fixed area */
	uint8_t save_id[LMT_FILE_SAVE_ID];
};

struct lmt_file_block {
	char name[LMT_BLOCK_NAME_MAX + 1];
	uint64_t length;
	uint32_t page_size;
	uint64_t bitmap_offset;
	uint64_t bitmap_length; /* 8 bytes per 64 pages */
	uint64_t pages_offset;  /* page p at pages_offset + p * page_size */
	uint64_t digests_offset;
	uint64_t digests_length; /* 8 bytes per stripe with digests, else 0 */
};

/* The record written last: without it the file is from a save that did
 * not finish. */
struct lmt_file_commit {
	uint8_t save_id[LMT_FILE_SAVE_ID]; /* the header's */
	uint64_t passes;
	uint64_t state_length;
	uint64_t file_length;    /* state_offset + the state rounded up to align */
	uint64_t bitmaps_digest; /* XXH3-64 over every bitmap, in block order */
	uint64_t digests_digest; /* the same over the stripe digests, or 0 */
	uint64_t state_digest;   /* XXH3-64 of the device state */
};

uint64_t lmt__file_hash(const void *data, size_t len);
static inline uint64_t lmt__file_round(uint64_t v, uint64_t to)
{
	return (v + to - 1) / to * to;
}
/* A block's stripe shift and count in a file of `stripe_shift`. */
uint32_t lmt__file_block_stripe_shift(const struct lmt_file_block *b, uint32_t stripe_shift);
uint64_t lmt__file_block_stripes(const struct lmt_file_block *b, uint32_t stripe_shift);

/* Lay the file out for `n` blocks whose name, length and page size are
 * set: fills their offsets and the header (its save id is the caller's). */
void lmt__file_layout(struct lmt_file_header *h, struct lmt_file_block *blocks, uint32_t n,
                      bool digests);

/* Encoders fill LMT_FILE_ALIGN bytes (header, commit) or table_length. */
void lmt__file_encode_header(const struct lmt_file_header *h, uint8_t *out);
void lmt__file_encode_table(const struct lmt_file_block *blocks, uint32_t n, uint8_t *out);
void lmt__file_encode_commit(const struct lmt_file_commit *c, uint8_t *out);

/* Decoders: 0, or -LMT_EPROTO with err saying what is wrong. The table's
 * decoder checks it against its header (digest, count) and every area
 * against the others and the header's bounds; the commit's against its
 * header. `len` is how many bytes `buf` holds. */
int lmt__file_decode_header(const uint8_t *buf, size_t len, struct lmt_file_header *h,
                            struct lmt_error *err);
int lmt__file_decode_table(const uint8_t *buf, size_t len, const struct lmt_file_header *h,
                           struct lmt_file_block *blocks, struct lmt_error *err);
int lmt__file_decode_commit(const uint8_t *buf, size_t len, const struct lmt_file_header *h,
                            struct lmt_file_commit *c, struct lmt_error *err);
/* The bitmap of block b, as read: no page beyond the block. */
int lmt__file_check_bitmap(const struct lmt_file_block *b, const uint64_t *bitmap,
                           struct lmt_error *err);

/* Storage blobs (lmt/plugin.h): the address and a key. */
int lmt__file_address(struct lmt_blob *blob, enum lmt_storage_mode mode, const char *path,
                      uint64_t size);
void lmt__file_key(struct lmt_blob *blob, uint64_t offset, uint64_t length);

#endif
