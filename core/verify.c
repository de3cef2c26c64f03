/* verify=on: an XXH3-64 digest per stripe of every RAM block, kept up to
 * date while the guest runs, so that the pause only hashes what changed
 * since. The source hashes a stripe again once the dirty log says the
 * guest wrote it; the destination once the source says a write to it
 * landed (LANDED). At completion each side folds a block's stripe digests
 * into the block's digest, and the destination compares. */
#include <stdlib.h>
#include <string.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

#include "bitmap.h"
#include "bytes.h"
#include "error.h"
#include "session.h"

/* Small enough that a page dirtied here and there costs little to hash
 * again in the pause, large enough that the digests are 1/8192 of RAM. */
#define STRIPE_SHIFT 16u

static uint64_t stripe_bytes(const struct lmt_block *b, uint64_t i)
{
	uint64_t off = i << b->stripe_shift;
	uint64_t len = 1ull << b->stripe_shift;
	return b->length - off < len ? b->length - off : len;
}

static int set_alloc(struct lmt_stripe_set *set, uint64_t nstripes, bool full)
{
	uint64_t words = (nstripes + 63) / 64;
	set->bits = calloc(words ? words : 1, sizeof(uint64_t));
	if (!set->bits)
		return -LMT_ENOMEM;
	set->count = 0;
	if (full) {
		lmt__bitmap_range(set->bits, 0, nstripes, LMT_BITS_SET);
		set->count = nstripes;
	}
	return 0;
}

static int prepare_block(struct lmt_block *b)
{
	b->stripe_shift = b->page_shift > STRIPE_SHIFT ? b->page_shift : STRIPE_SHIFT;
	b->nstripes = (b->length + (1ull << b->stripe_shift) - 1) >> b->stripe_shift;
	b->digests = calloc(b->nstripes, sizeof(uint64_t));
	if (!b->digests || set_alloc(&b->stale, b->nstripes, true) ||
	    set_alloc(&b->landed, b->nstripes, false))
		return -LMT_ENOMEM;
	return 0;
}

int lmt__verify_prepare(struct lmt_session *s)
{
	for (uint32_t i = 0; i < s->nblocks && s->verify; i++) {
		struct lmt_block *b = &s->blocks[i];
		lmt__verify_free(b);
		if (prepare_block(b))
			return lmt__fail(s, LMT_ENOMEM, "verify: out of memory for block '%s'",
			                 b->name);
	}
	return 0;
}

void lmt__verify_free(struct lmt_block *b)
{
	free(b->digests);
	free(b->stale.bits);
	free(b->landed.bits);
	b->digests = NULL;
	b->stale = (struct lmt_stripe_set){0};
	b->landed = (struct lmt_stripe_set){0};
}

void lmt__verify_mark(struct lmt_block *b, struct lmt_stripe_set *set, uint64_t page,
                      uint64_t npages)
{
	uint32_t shift = b->stripe_shift - b->page_shift;
	uint64_t last = (page + npages - 1) >> shift;
	for (uint64_t i = page >> shift; i <= last; i++)
		if (!lmt__bitmap_test(set->bits, i)) {
			lmt__bitmap_range(set->bits, i, 1, LMT_BITS_SET);
			set->count++;
		}
}

bool lmt__verify_take(struct lmt_stripe_set *set, uint64_t i)
{
	if (!lmt__bitmap_test(set->bits, i))
		return false;
	lmt__bitmap_range(set->bits, i, 1, LMT_BITS_CLEAR);
	set->count--;
	return true;
}

void lmt__verify_hash(struct lmt_block *b, uint64_t i)
{
	lmt__verify_take(&b->stale, i);
	b->digests[i] = XXH3_64bits(b->host + (i << b->stripe_shift), stripe_bytes(b, i));
}

uint64_t lmt__verify_digest(const struct lmt_block *b)
{
	XXH3_state_t st;
	uint8_t le[8 * 64];
	XXH3_64bits_reset(&st);
	for (uint64_t i = 0; i < b->nstripes; i += 64) {
		uint64_t n = b->nstripes - i < 64 ? b->nstripes - i : 64;
		for (uint64_t k = 0; k < n; k++)
			lmt__put64(le + 8 * k, b->digests[i + k]);
		XXH3_64bits_update(&st, le, 8 * n);
	}
	return XXH3_64bits_digest(&st);
}

uint64_t lmt__verify_bytes(const struct lmt_block *b, const struct lmt_stripe_set *set)
{
	uint64_t n = set->count;
	if (!n)
		return 0;
	/* The last stripe may be short; counting it whole errs on the safe side. */
	return n << b->stripe_shift;
}
