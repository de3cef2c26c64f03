/* Source side of a libfabric channel, for the files above source.c: the
 * plugin's top file writes and settles failures through it, endpoint.c
 * opens and drives it. */
#ifndef LMT_LFI_SOURCE_H
#define LMT_LFI_SOURCE_H

#include <stddef.h>
#include <stdint.h>

#include "instance.h"

/* The operations and their lock; lfi_source_close releases them, also
 * after a failed open. 0, or the error recorded. */
int lfi_source_open(lmt_endpoint *ep);
void lfi_source_close(lmt_endpoint *ep);

/* Post a write whose arguments were checked. */
int lfi_source_write(lmt_endpoint *ep, const void *local, size_t len, lmt_mr *local_mr,
                     lmt_rkey *rkey, uint64_t offset, uint64_t cookie);

/* The provider completed `context` (an operation, a fence read or the
 * greeting), with status 0 or -LMT_E*. */
void lfi_source_done(lmt_endpoint *ep, void *context, int status);
/* Coalescing: post what waits, now that writes may have completed. */
void lfi_source_post_queued(lmt_endpoint *ep);
/* Fail the channel when writes wait (in flight or refused) and for the
 * instance's bound none completed and none was taken: a peer gone
 * without a word. */
void lfi_source_check_stall(lmt_endpoint *ep);
/* Fences: read the destination's fence region behind the writes that
 * completed locally, when they wait for one and no read is in flight. */
void lfi_source_fence(lmt_endpoint *ep);
/* The source's first write, the greeting, into the destination's fence
 * region. It makes the provider connect now, during setup, so that no
 * connection is still being made when either side closes. Posted from
 * ep_connect, or by the channel's thread while the provider answers
 * EAGAIN (ofi_rxm does until the destination has accepted). Returns 0
 * once posted, 1 to try again, or an error. */
int lfi_source_greet(lmt_endpoint *ep);
/* Give writes in flight a moment to finish before their endpoint goes, for
 * as long as completions keep coming: the peer may still be working on
 * them, and a peer in the same process (shm maps it by pointer, not by a
 * mapping of its own) would do so in memory about to be unmapped. */
void lfi_source_drain(lmt_endpoint *ep);

/* Failure. The first fails the session and breaks every live channel;
 * each broken channel then reports every write it still owes with the
 * failure, once, and settles: its thread does so as soon as it wakes, and
 * the core's progress does so for every channel before it harvests, so
 * that progress returns the failure right after the last completion. */
void lfi_source_fail(struct lmt_instance *inst, int code);
/* The channel connected: a failure from now on breaks it. */
void lfi_source_go_live(lmt_endpoint *ep);
/* Report and settle a broken channel, if not done already. */
void lfi_source_abandon(lmt_endpoint *ep);
void lfi_source_abandon_all(struct lmt_instance *inst);

#endif
