/* verify=on: an XXH3-64 digest per stripe of every RAM block. The source
 * keeps its digests up to date while the guest runs, hashing a stripe
 * again once the dirty log says the guest wrote it, so that the pause only
 * hashes what changed since. In the pause, once every write has landed,
 * it sends them all (DIGESTS) and the destination hashes all of its RAM
 * as it is then and compares stripe by stripe (digests.c): a byte written
 * there by anyone, at any time before the check, is found and named. Both
 * sides also fold a block's stripe digests into the block's digest, which
 * COMPLETE carries.
 * Room: engines; may use: every room below it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

#include "bitmap.h"
#include "bytes.h"
#include "digests.h"
#include "error.h"
#include "session.h"
#include "control.h"
#include "verify.h"

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

static int prepare_block(struct lmt_block *b, bool peer_digests)
{
	b->stripe_shift = b->page_shift > STRIPE_SHIFT ? b->page_shift : STRIPE_SHIFT;
	b->nstripes = (b->length + (1ull << b->stripe_shift) - 1) >> b->stripe_shift;
	b->digests = calloc(b->nstripes, sizeof(uint64_t));
	if (peer_digests)
		b->source_digests = calloc(b->nstripes, sizeof(uint64_t));
	if (!b->digests || (peer_digests && !b->source_digests) ||
	    set_alloc(&b->stale, b->nstripes, true))
		return -LMT_ENOMEM;
	return 0;
}

int lmt__verify_prepare(struct lmt_session *s)
{
	/* A destination with a source (not a file) takes its digests. */
	bool peer = s->role == LMT_ROLE_DESTINATION && !s->file_path;
	for (uint32_t i = 0; i < s->nblocks && s->verify; i++) {
		struct lmt_block *b = &s->blocks[i];
		lmt__verify_free(b);
		if (prepare_block(b, peer))
			return lmt__fail(s, LMT_ENOMEM, "verify: out of memory for block '%s'",
			                 b->name);
	}
	return 0;
}

void lmt__verify_free(struct lmt_block *b)
{
	free(b->digests);
	free(b->source_digests);
	free(b->stale.bits);
	b->digests = NULL;
	b->source_digests = NULL;
	b->source_received = 0;
	b->stale = (struct lmt_stripe_set){0};
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

/* XXH3-64 over `n` stripe digests, each as 8 little-endian bytes. */
static uint64_t fold(const uint64_t *digests, uint64_t n)
{
	XXH3_state_t st;
	uint8_t le[8 * 64];
	XXH3_64bits_reset(&st);
	for (uint64_t i = 0; i < n; i += 64) {
		uint64_t k = n - i < 64 ? n - i : 64;
		for (uint64_t j = 0; j < k; j++)
			lmt__put64(le + 8 * j, digests[i + j]);
		XXH3_64bits_update(&st, le, 8 * k);
	}
	return XXH3_64bits_digest(&st);
}

uint64_t lmt__verify_digest(const struct lmt_block *b)
{
	return fold(b->digests, b->nstripes);
}

uint64_t lmt__verify_bytes(const struct lmt_block *b, const struct lmt_stripe_set *set)
{
	uint64_t n = set->count;
	if (!n)
		return 0;
	/* The last stripe may be short; counting it whole errs on the safe side. */
	return n << b->stripe_shift;
}

/* ---- the end-to-end check ---- */

uint64_t lmt__verify_pause_bytes(const struct lmt_session *s)
{
	uint64_t bytes = 0;
	for (uint32_t i = 0; i < s->nblocks && s->verify; i++) {
		const struct lmt_block *b = &s->blocks[i];
		bytes += lmt__verify_bytes(b, &b->stale);
		if (!s->file_path && lmt__block_copied(b))
			bytes += b->length;
	}
	return bytes;
}

int lmt__verify_send(struct lmt_session *s, uint64_t deadline)
{
	struct lmt_msg_digests *m = malloc(sizeof(*m));
	if (!m)
		return lmt__fail(s, LMT_ENOMEM, "out of memory");
	int rc = 0;
	for (uint32_t k = 0; k < s->nblocks && !rc; k++) {
		const struct lmt_block *b = &s->blocks[k];
		for (uint64_t i = 0; lmt__block_copied(b) && i < b->nstripes && !rc;
		     i += m->count) {
			uint64_t n = b->nstripes - i;
			*m = (struct lmt_msg_digests){.block = k,
			                              .first = i,
			                              .count = n < LMT_PROTO_MAX_DIGESTS
			                                               ? (uint32_t)n
			                                               : LMT_PROTO_MAX_DIGESTS};
			memcpy(m->digests, b->digests + i, m->count * sizeof(uint64_t));
			if ((rc = lmt__enc_digests(&s->out, m)))
				rc = lmt__fail(s, rc, "encoding DIGESTS");
			else
				rc = lmt__ctrl_send_by(s, deadline);
		}
	}
	free(m);
	return rc;
}

int lmt__verify_receive(struct lmt_session *s, size_t length)
{
	struct lmt_msg_digests *m = malloc(sizeof(*m));
	struct lmt_error err = {0};
	char why[200];
	if (!m)
		return lmt__fail(s, LMT_ENOMEM, "out of memory");
	int rc = lmt__dec_digests(s->in, length, m, &err);
	if (rc)
		rc = lmt__fail(s, rc, "%s", err.message);
	else if ((rc = lmt__digests_store(s->blocks, s->nblocks, m, why, sizeof(why))))
		rc = lmt__fail(s, -rc, "%s", why);
	free(m);
	return rc;
}

int lmt__verify_check(struct lmt_session *s, const uint64_t *digests, char *why, size_t size)
{
	for (uint32_t k = 0; k < s->nblocks; k++) {
		const struct lmt_block *b = &s->blocks[k];
		if (!lmt__block_copied(b))
			continue;
		if (b->source_received != b->nstripes) {
			snprintf(why, size,
			         "COMPLETE before the digests of block '%s' (%llu of %llu stripes)",
			         b->name, (unsigned long long)b->source_received,
			         (unsigned long long)b->nstripes);
			return -LMT_EPROTO;
		}
		if (fold(b->source_digests, b->nstripes) != digests[k]) {
			snprintf(why, size,
			         "DIGESTS of block '%s' do not add up to its digest in COMPLETE",
			         b->name);
			return -LMT_EPROTO;
		}
	}
	uint64_t t0 = lmt__now();
	uint32_t threads = lmt__digests_hash_all(s->blocks, s->nblocks, lmt__digests_threads());
	lmt__session_log(s, LMT_LOG_DEBUG, "verify: all RAM hashed in %.1f ms on %u threads",
	                 (double)(lmt__now() - t0) / 1e6, threads);
	for (uint32_t k = 0; k < s->nblocks; k++) {
		const struct lmt_block *b = &s->blocks[k];
		uint64_t i = lmt__block_copied(b) ? lmt__digests_first_difference(b) : b->nstripes;
		uint64_t mine = lmt__verify_digest(b);
		if (i < b->nstripes) {
			uint64_t from = i << b->stripe_shift, len = 1ull << b->stripe_shift;
			snprintf(
			        why, size,
			        "verify: RAM block '%s' differs from the source's at bytes %llu to "
			        "%llu (xxh3 %016llx on the source, %016llx here)",
			        b->name, (unsigned long long)from,
			        (unsigned long long)(from +
			                             (b->length - from < len ? b->length - from
			                                                     : len) -
			                             1),
			        (unsigned long long)b->source_digests[i],
			        (unsigned long long)b->digests[i]);
			return -LMT_EVERIFY;
		}
		if (mine != digests[k]) {
			snprintf(why, size,
			         "verify: RAM block '%s' differs (xxh3 %016llx on the source, "
			         "%016llx "
			         "here)",
			         b->name, (unsigned long long)digests[k], (unsigned long long)mine);
			return -LMT_EVERIFY;
		}
	}
	return 0;
}
