/* verify=on's end-to-end check without a session (core/digests.c): the
 * source's digests are taken in order, within their block, and only for a
 * block verified and copied; every stripe of the RAM is hashed the same on
 * any number of threads; the first stripe that differs is found. The
 * engines' side is in tests/integration/test_verify.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "digests.h"
#include "session.h"

#define STRIPE (64u << 10)

static char why[200];

/* Blocks of 4, 3 stripes and a half, and 2 stripes (handed over), filled
 * with bytes of their own, with room for the source's digests. */
static struct lmt_block blocks[3];

static int setup(void **state)
{
	const uint64_t lengths[3] = {4 * STRIPE, 3 * STRIPE + STRIPE / 2, 2 * STRIPE};
	memset(blocks, 0, sizeof(blocks));
	for (int k = 0; k < 3; k++) {
		struct lmt_block *b = &blocks[k];
		snprintf(b->name, sizeof(b->name), "ram%d", k);
		b->length = lengths[k];
		b->host = malloc(b->length);
		for (uint64_t i = 0; i < b->length; i++)
			b->host[i] = (uint8_t)(i * 7 + k * 13 + i / 4093);
		b->page_shift = 12;
		b->stripe_shift = 16;
		b->nstripes = (b->length + STRIPE - 1) / STRIPE;
		b->digests = calloc(b->nstripes, 8);
		b->source_digests = calloc(b->nstripes, 8);
	}
	blocks[2].handover = true;
	return 0;
}

static int teardown(void **state)
{
	for (int k = 0; k < 3; k++) {
		free(blocks[k].host);
		free(blocks[k].digests);
		free(blocks[k].source_digests);
	}
	return 0;
}

static struct lmt_msg_digests *run(uint32_t block, uint64_t first, uint32_t count)
{
	static struct lmt_msg_digests m;
	m.block = block;
	m.first = first;
	m.count = count;
	for (uint32_t i = 0; i < count; i++)
		m.digests[i] = 1000 * block + first + i;
	return &m;
}

static void refused(const struct lmt_msg_digests *m, const char *text)
{
	assert_int_equal(lmt__digests_store(blocks, 3, m, why, sizeof(why)), -LMT_EPROTO);
	assert_string_equal(why, text);
}

static void test_runs_are_taken_in_order_within_their_block(void **state)
{
	assert_int_equal(lmt__digests_store(blocks, 3, run(0, 0, 3), why, sizeof(why)), 0);
	refused(run(0, 2, 2), "DIGESTS for block 'ram0' from stripe 2, expected 3");
	refused(run(0, 3, 2), "DIGESTS for block 'ram0': stripes 3 to 4, of 4");
	assert_int_equal(lmt__digests_store(blocks, 3, run(0, 3, 1), why, sizeof(why)), 0);
	refused(run(0, 4, 1), "DIGESTS for block 'ram0': stripes 4 to 4, of 4");
	assert_int_equal(blocks[0].source_received, 4);
	assert_int_equal(blocks[0].source_digests[3], 3);
	/* Blocks in any order, each from its start. */
	assert_int_equal(lmt__digests_store(blocks, 3, run(1, 0, 4), why, sizeof(why)), 0);
	assert_int_equal(blocks[1].source_digests[3], 1003);
}

static void test_digests_for_no_block_a_handed_over_or_an_unverified_one_are_refused(void **state)
{
	refused(run(3, 0, 1), "DIGESTS for block 3, of 3");
	refused(run(UINT32_MAX, 0, 1), "DIGESTS for block 4294967295, of 3");
	refused(run(2, 0, 1), "DIGESTS for block 'ram2', which is handed over, not copied");
	free(blocks[1].source_digests);
	blocks[1].source_digests = NULL;
	refused(run(1, 0, 1), "DIGESTS for block 'ram1', which is not verified");
}

static void test_every_stripe_is_hashed_alike_on_any_number_of_threads(void **state)
{
	for (uint32_t threads = 1; threads <= 9; threads += 4) {
		for (int k = 0; k < 3; k++)
			memset(blocks[k].digests, 0, blocks[k].nstripes * 8);
		uint32_t used = lmt__digests_hash_all(blocks, 3, threads);
		/* 2 takes of stripes at most: one for each block copied */
		assert_true(used >= 1 && used <= 2);
		for (int k = 0; k < 2; k++)
			for (uint64_t i = 0; i < blocks[k].nstripes; i++) {
				uint64_t off = i * STRIPE;
				uint64_t len = blocks[k].length - off < STRIPE
				                       ? blocks[k].length - off
				                       : STRIPE;
				assert_int_equal(blocks[k].digests[i],
				                 XXH3_64bits(blocks[k].host + off, len));
			}
		for (uint64_t i = 0; i < blocks[2].nstripes; i++)
			assert_int_equal(blocks[2].digests[i], 0); /* handed over: not hashed */
	}
	assert_true(lmt__digests_threads() >= 1 && lmt__digests_threads() <= 8);
}

static void test_the_first_stripe_that_differs_is_found(void **state)
{
	struct lmt_block *b = &blocks[1];
	lmt__digests_hash_all(blocks, 3, 2);
	memcpy(b->source_digests, b->digests, b->nstripes * 8);
	assert_int_equal(lmt__digests_first_difference(b), b->nstripes);
	b->host[3 * STRIPE + 5] ^= 1; /* the short last stripe */
	b->host[2 * STRIPE] ^= 1;
	lmt__digests_hash_all(blocks, 3, 2);
	assert_int_equal(lmt__digests_first_difference(b), 2);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test_setup_teardown(test_runs_are_taken_in_order_within_their_block,
	                                        setup, teardown),
	        cmocka_unit_test_setup_teardown(
	                test_digests_for_no_block_a_handed_over_or_an_unverified_one_are_refused,
	                setup, teardown),
	        cmocka_unit_test_setup_teardown(
	                test_every_stripe_is_hashed_alike_on_any_number_of_threads, setup,
	                teardown),
	        cmocka_unit_test_setup_teardown(test_the_first_stripe_that_differs_is_found, setup,
	                                        teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
