/* The save file's codec (core/fileformat.c): the layout's alignment and
 * bounds, and that what the encoders write the decoders read back; the
 * refusals are in tests/integration/test_file.c, the fuzzing in
 * tests/fuzz/fuzz_file.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "fileformat.h"

static void lay_out(struct lmt_file_header *h, struct lmt_file_block *b, bool digests)
{
	memset(h, 0, sizeof(*h));
	memset(b, 0, 3 * sizeof(*b));
	strcpy(b[0].name, "pc.ram");
	b[0].length = (1536ull << 20) + 4096 * 7; /* a bitmap with a partial word */
	b[0].page_size = 4096;
	strcpy(b[1].name, "vga");
	b[1].length = 16 << 20;
	b[1].page_size = 4096;
	strcpy(b[2].name, "huge");
	b[2].length = 64 << 20;
	b[2].page_size = 2 << 20; /* stripes of one page */
	lmt__file_layout(h, b, 3, digests);
}

static void test_layout_aligns_every_area_for_direct_io(void **state)
{
	struct lmt_file_header h;
	struct lmt_file_block b[3];
	for (int digests = 0; digests < 2; digests++) {
		lay_out(&h, b, digests);
		assert_int_equal(h.state_offset % LMT_FILE_ALIGN, 0);
		uint64_t ram = 0;
		for (int i = 0; i < 3; i++) {
			assert_int_equal(b[i].bitmap_offset % LMT_FILE_ALIGN, 0);
			assert_int_equal(b[i].pages_offset % LMT_FILE_PAGES_ALIGN, 0);
			assert_true(b[i].pages_offset + b[i].length <= h.state_offset);
			assert_int_equal(b[i].bitmap_length,
			                 (b[i].length / b[i].page_size + 63) / 64 * 8);
			if (digests)
				assert_int_equal(b[i].digests_offset % LMT_FILE_ALIGN, 0);
			ram += b[i].length;
		}
		assert_int_equal(b[2].digests_length, digests ? 32 * 8 : 0);
		/* RAM plus metadata: far under 1% here. */
		assert_true(h.state_offset - ram < (1u << 20));
	}
}

static void test_header_and_table_round_trip(void **state)
{
	struct lmt_file_header h, back;
	struct lmt_file_block b[3], got[3];
	struct lmt_error err = {0};
	lay_out(&h, b, true);
	memset(h.save_id, 0x42, sizeof(h.save_id));
	uint8_t *buf = calloc(1, 3 * LMT_FILE_ALIGN);
	lmt__file_encode_table(b, 3, buf + h.table_offset);
	h.table_digest = lmt__file_hash(buf + h.table_offset, h.table_length);
	lmt__file_encode_header(&h, buf);
	assert_int_equal(lmt__file_decode_header(buf, LMT_FILE_ALIGN, &back, &err), 0);
	assert_memory_equal(&back, &h, sizeof(h));
	assert_int_equal(
	        lmt__file_decode_table(buf + h.table_offset, LMT_FILE_ALIGN, &back, got, &err), 0);
	assert_memory_equal(got, b, sizeof(b));
	struct lmt_file_commit c = {.passes = 4, .state_length = 5000}, cback;
	memcpy(c.save_id, h.save_id, sizeof(c.save_id));
	c.file_length = h.state_offset + 8192;
	lmt__file_encode_commit(&c, buf + LMT_FILE_ALIGN);
	assert_int_equal(
	        lmt__file_decode_commit(buf + LMT_FILE_ALIGN, LMT_FILE_ALIGN, &h, &cback, &err), 0);
	assert_memory_equal(&cback, &c, sizeof(c));
	/* A commit record of another save is refused. */
	h.save_id[0] ^= 1;
	assert_int_equal(
	        lmt__file_decode_commit(buf + LMT_FILE_ALIGN, LMT_FILE_ALIGN, &h, &cback, &err),
	        -LMT_EPROTO);
	assert_non_null(strstr(err.message, "another save"));
	free(buf);
}

static void test_bitmap_bits_past_the_block_are_refused(void **state)
{
	struct lmt_file_header h;
	struct lmt_file_block b[3];
	struct lmt_error err = {0};
	lay_out(&h, b, false);
	uint64_t words = b[0].bitmap_length / 8;
	uint64_t *map = calloc(words, 8);
	memset(map, 0xff, words * 8);
	map[words - 1] = (1ull << 7) - 1; /* the 7 pages of the last word */
	assert_int_equal(lmt__file_check_bitmap(&b[0], map, &err), 0);
	map[words - 1] |= 1ull << 7;
	assert_int_equal(lmt__file_check_bitmap(&b[0], map, &err), -LMT_EPROTO);
	assert_non_null(strstr(err.message, "beyond the block's"));
	free(map);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_layout_aligns_every_area_for_direct_io),
	        cmocka_unit_test(test_header_and_table_round_trip),
	        cmocka_unit_test(test_bitmap_bits_past_the_block_are_refused),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
