/* verify=on's end-to-end check, the part that needs no session: where the
 * source's stripe digests go as they arrive (DIGESTS), every stripe of the
 * destination's RAM hashed on several threads, and the first stripe that
 * differs. verify.c drives it from the engines; docs/engine.md
 * ("Verification") has the rules.
 * Room: session; may use: base, wire. */
#ifndef LMT_DIGESTS_H
#define LMT_DIGESTS_H

#include <stddef.h>
#include <stdint.h>

struct lmt_block;
struct lmt_msg_digests;

/* Store m's digests as the source's for blocks[m->block]. Refused, with
 * -LMT_EPROTO and the reason in `why`: a block that does not exist, is
 * handed over or has no room for them (verify=off), a run that does not
 * start where the block's last one ended, or one past its stripes. */
int lmt__digests_store(struct lmt_block *blocks, uint32_t nblocks, const struct lmt_msg_digests *m,
                       char *why, size_t size);
/* Hash every stripe of every block copied into its digests, as memory
 * holds it now, on up to `threads` threads (the caller's among them):
 * returns how many took part. */
uint32_t lmt__digests_hash_all(struct lmt_block *blocks, uint32_t nblocks, uint32_t threads);
/* The first stripe of b whose digest differs from the source's, or
 * b->nstripes. */
uint64_t lmt__digests_first_difference(const struct lmt_block *b);
/* How many threads hash: one per CPU online, at most 8. */
uint32_t lmt__digests_threads(void);

#endif
