/* verify=on's end-to-end check without a session (see digests.h).
 * Room: session; may use: base, wire. */
#include "digests.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <unistd.h>
#include <xxhash.h>

#include "proto.h"
#include "session.h"
#include "sync.h"

#define MAX_THREADS 8u
/* Stripes a thread takes at a time: 4 MiB of 64 KiB stripes, enough to
 * keep the shared counter cold, few enough to spread a small guest. */
#define STRIPES_PER_TAKE 64u

int lmt__digests_store(struct lmt_block *blocks, uint32_t nblocks, const struct lmt_msg_digests *m,
                       char *why, size_t size)
{
	struct lmt_block *b = m->block < nblocks ? &blocks[m->block] : NULL;
	if (!b)
		snprintf(why, size, "DIGESTS for block %u, of %u", m->block, nblocks);
	else if (!lmt__block_copied(b) || !b->source_digests)
		snprintf(why, size, "DIGESTS for block '%s', which is %s", b->name,
		         b->source_digests ? "handed over, not copied" : "not verified");
	else if (m->first != b->source_received)
		snprintf(why, size, "DIGESTS for block '%s' from stripe %llu, expected %llu",
		         b->name, (unsigned long long)m->first,
		         (unsigned long long)b->source_received);
	else if (m->count > b->nstripes - m->first)
		snprintf(why, size, "DIGESTS for block '%s': stripes %llu to %llu, of %llu",
		         b->name, (unsigned long long)m->first,
		         (unsigned long long)(m->first + m->count - 1),
		         (unsigned long long)b->nstripes);
	else {
		for (uint32_t i = 0; i < m->count; i++)
			b->source_digests[m->first + i] = m->digests[i];
		b->source_received += m->count;
		return 0;
	}
	return -LMT_EPROTO;
}

struct hash_work {
	struct lmt_block *blocks;
	uint32_t nblocks;
	uint64_t takes[LMT_PROTO_MAX_BLOCKS + 1]; /* takes before each block */
	_Atomic uint64_t next;
};

static void hash_stripe(struct lmt_block *b, uint64_t i)
{
	uint64_t off = i << b->stripe_shift, len = 1ull << b->stripe_shift;
	b->digests[i] = XXH3_64bits(b->host + off, b->length - off < len ? b->length - off : len);
}

static void *hash_some(void *arg)
{
	struct hash_work *w = arg;
	uint32_t k = 0;
	for (;;) {
		uint64_t t = atomic_fetch_add(&w->next, 1);
		if (t >= w->takes[w->nblocks])
			return NULL;
		while (t >= w->takes[k + 1])
			k++; /* takes only grow, and so does t for this thread */
		struct lmt_block *b = &w->blocks[k];
		uint64_t first = (t - w->takes[k]) * STRIPES_PER_TAKE;
		uint64_t end = first + STRIPES_PER_TAKE < b->nstripes ? first + STRIPES_PER_TAKE
		                                                      : b->nstripes;
		for (uint64_t i = first; i < end; i++)
			hash_stripe(b, i);
	}
}

uint32_t lmt__digests_hash_all(struct lmt_block *blocks, uint32_t nblocks, uint32_t threads)
{
	struct hash_work work = {.blocks = blocks,
	                         .nblocks = nblocks < LMT_PROTO_MAX_BLOCKS ? nblocks
	                                                                   : LMT_PROTO_MAX_BLOCKS};
	struct hash_work *w = &work;
	for (uint32_t k = 0; k < w->nblocks; k++) {
		const struct lmt_block *b = &blocks[k];
		uint64_t n = lmt__block_copied(b) && b->digests
		                     ? (b->nstripes + STRIPES_PER_TAKE - 1) / STRIPES_PER_TAKE
		                     : 0;
		w->takes[k + 1] = w->takes[k] + n;
	}
	if (threads > MAX_THREADS)
		threads = MAX_THREADS;
	if ((uint64_t)threads > w->takes[w->nblocks])
		threads = w->takes[w->nblocks] ? (uint32_t)w->takes[w->nblocks] : 1;
	pthread_t helpers[MAX_THREADS];
	uint32_t started = 0;
	while (started + 1 < threads && lmt__thread_start(&helpers[started], hash_some, w) == 0)
		started++;
	hash_some(w); /* a helper that did not start leaves its share here */
	for (uint32_t i = 0; i < started; i++)
		pthread_join(helpers[i], NULL);
	return started + 1;
}

uint64_t lmt__digests_first_difference(const struct lmt_block *b)
{
	for (uint64_t i = 0; i < b->nstripes; i++)
		if (b->digests[i] != b->source_digests[i])
			return i;
	return b->nstripes;
}

uint32_t lmt__digests_threads(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	return n < 1 ? 1 : n > (long)MAX_THREADS ? MAX_THREADS : (uint32_t)n;
}
