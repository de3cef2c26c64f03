/* Same-host handover (targets room, handover.c): RAM handed over by
 * descriptor on a unix: target. May use: base, wire, session, control,
 * transport. */
#ifndef LMT_CORE_HANDOVER_H
#define LMT_CORE_HANDOVER_H

#include <stddef.h>
#include <stdint.h>

#include "session.h"

/* After connecting or accepting over unix: the peer must run as this
 * user, or as root (SO_PEERCRED). */
int lmt__handover_check_peer(struct lmt_session *s);
/* Source, after BLOCKS: FD_OFFER, and the destination's FD_ACCEPT. */
int lmt__handover_negotiate_source(struct lmt_session *s, uint64_t deadline);
/* Destination, after BLOCKS: the source's FD_OFFER answered. */
int lmt__handover_negotiate_destination(struct lmt_session *s, uint64_t deadline);
/* Source, guest paused: FD_HANDOVER with the descriptors. */
int lmt__handover_send(struct lmt_session *s);
/* Destination: check and map what FD_HANDOVER brought. */
int lmt__handover_receive(struct lmt_session *s, size_t length);
/* Destination, failed: each block mapped from the source's file gets its
 * own mapping back, and the received descriptors are closed. */
void lmt__handover_undo(struct lmt_session *s);
/* Close what a block holds of handover (at lmt_session_free). */
void lmt__handover_block_free(struct lmt_block *b);
#endif
