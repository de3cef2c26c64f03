/* Postcopy (paging room): after the switch the destination runs the
 * guest while the pages it lacks come from the source, those it faults on
 * first. The destination's side is here (postcopy.c, its thread and
 * placing in postcopy_destination.c); the source's engine pauses, drains
 * and syncs, then hands over to postcopy's source side
 * (core/engines/postcopy_source.c). May use: base, wire, session,
 * control, transport, targets. The protocol
 * is in docs/protocol.md ("Postcopy"), the engine in docs/engine.md. */
#ifndef LMT_CORE_POSTCOPY_H
#define LMT_CORE_POSTCOPY_H

#include <stdbool.h>
#include <stdint.h>

#include "session.h"

struct lmt__postcopy;

/* Destination, in its load loop: POSTCOPY_PAGES, then POSTCOPY. The
 * second returns 1 once the guest may run (s->postcopy set, the thread
 * started), or a failure. */
int lmt__postcopy_pages(struct lmt_session *s, size_t length);
int lmt__postcopy_switch(struct lmt_session *s, size_t length, uint64_t state_length);

/* Either side, after the switch: wait for the thread's end (every page
 * in place, or a failure) and release it; its result. */
int lmt__postcopy_finish(struct lmt_session *s);
/* Cancel a postcopy still running and release it; none: nothing. */
void lmt__postcopy_free(struct lmt_session *s);
/* With s->lock: the fault figures of a destination's postcopy. */
void lmt__postcopy_stats(struct lmt_session *s, struct lmt_stats *out);

/* Staging: slots of 64 KiB (or one page where pages are larger). */
#define LMT_POSTCOPY_SLOT_SIZE (64u << 10)
#define LMT_POSTCOPY_SLOTS 256u
/* The staging area's size, where pages leave that many slots; larger
 * pages take 32 slots of their size. */
#define LMT_POSTCOPY_STAGING (16u << 20)
/* The largest page postcopy moves: a fault waits for a whole page, and
 * the staging area holds 32 of the largest. */
#define LMT_POSTCOPY_MAX_PAGE (2u << 20)

#endif
