/* verify=on (engines room, verify.c): the per-stripe digests both sides
 * keep, the source's sent in the pause and the destination's check of
 * all its RAM against them. May use: every room below engines. */
#ifndef LMT_CORE_VERIFY_H
#define LMT_CORE_VERIFY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "session.h"

/* Size every block's stripes and allocate their digests, every stripe
 * stale (and on a destination room for the source's). */
int lmt__verify_prepare(struct lmt_session *s);
void lmt__verify_free(struct lmt_block *b);
/* Add the stripes of pages [page, page + npages) of b to `set`. */
void lmt__verify_mark(struct lmt_block *b, struct lmt_stripe_set *set, uint64_t page,
                      uint64_t npages);
/* Take stripe i out of `set`; whether it was in it. */
bool lmt__verify_take(struct lmt_stripe_set *set, uint64_t i);
/* Hash stripe i of b from memory; it is no longer stale. */
void lmt__verify_hash(struct lmt_block *b, uint64_t i);
/* The block's digest: XXH3-64 over its stripe digests, in order, each as
 * 8 little-endian bytes. */
uint64_t lmt__verify_digest(const struct lmt_block *b);
/* Bytes of b's stripes in `set`. */
uint64_t lmt__verify_bytes(const struct lmt_block *b, const struct lmt_stripe_set *set);
/* Source: the bytes the pause will hash: its stale stripes, and with a
 * destination (not a file) all of the RAM copied, which the destination
 * hashes after the last write landed. */
uint64_t lmt__verify_pause_bytes(const struct lmt_session *s);
/* Source, guest paused, every write landed: the stripe digests of every
 * block copied, in DIGESTS messages, each sent by `deadline`. */
int lmt__verify_send(struct lmt_session *s, uint64_t deadline);
/* Destination: a DIGESTS message of `length` bytes in s->in. */
int lmt__verify_receive(struct lmt_session *s, size_t length);
/* Destination, at COMPLETE with `digests` (one per block): every digest
 * of every block copied arrived and adds up to its block's; then all of
 * this side's RAM is hashed, as it is now, and compared stripe by
 * stripe. 0; or the code, with the first block and byte range that
 * differ written into `why`. */
int lmt__verify_check(struct lmt_session *s, const uint64_t *digests, char *why, size_t size);

#endif
