/* The spin locks of shm's regions that a stopped or dead peer holds, for
 * endpoint.c and source.c. */
#ifndef LMT_LFI_SHMLOCK_H
#define LMT_LFI_SHMLOCK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "instance.h"

/* Find the locks of a connected shm channel: its own region's (named
 * ep->shm_name) and its peer's (`peer`, the `len` bytes of the name in the
 * peer's address blob). Nothing is found where the layout is not libfabric
 * 1.17's, the name not one lmt gives, or the peer's process not the one
 * that maps its region. */
void lfi_shmlock_find(lmt_endpoint *ep, const uint8_t *peer, size_t len);
/* Whether the peer process no longer runs (gone, a zombie, or stopped),
 * where its locks were found. */
bool lfi_shmlock_peer_frozen(lmt_endpoint *ep);
/* After a transfer failed: whether the peer process is gone or going
 * (waiting up to 100 ms for one killed to be seen so). */
bool lfi_shmlock_peer_died(lmt_endpoint *ep);
/* Whether one of the channel's locks is held by a peer process that can
 * no longer release it (gone, a zombie, or stopped): calling into the
 * provider would then spin for as long. Cheap while no lock is held. */
bool lfi_shmlock_stuck(lmt_endpoint *ep);
/* Release the locks held by such a peer; logs each. At teardown only. */
void lfi_shmlock_break(lmt_endpoint *ep);
/* At close, with the channel's thread gone: a lock still held is waited
 * for, up to LFI_SETTLE_NS, until its holder releases it or no longer runs
 * (a peer killed takes a moment to die), and released then. */
void lfi_shmlock_settle(lmt_endpoint *ep);
/* At close: remove the region file of a peer that died (nobody else
 * would: 16 MiB of /dev/shm, that is of RAM, each). */
void lfi_shmlock_forget_dead_peer(lmt_endpoint *ep);

#endif
