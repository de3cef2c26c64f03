/* What the device reports to both ends of the verbs plugin's data path:
 * completions on the CQ, asynchronous events, the wait for either, and the
 * failure of the instance they may cause. */
#ifndef LMT_VERBS_EVENTS_H
#define LMT_VERBS_EVENTS_H

#include <stdbool.h>
#include <stdint.h>

#include "instance.h"

/* Source: drain the CQ, turning each signalled completion into the
 * cookies of the writes it retires; an error completion fails the
 * instance. */
void verbs_poll_cq(struct lmt_instance *inst);
/* Read and acknowledge pending asynchronous events; fatal ones fail the
 * instance. */
void verbs_async_events(struct lmt_instance *inst);
/* Wait up to `until` (and one slice at most) for a CQ or async event. The
 * source's first call only arms the CQ. 0, or an error recorded. */
int verbs_wait_event(struct lmt_instance *inst, uint64_t until);

/* Progress found no completion: whether it ends now, and with what in
 * *rc: the failure once every cookie is out, 0 when no completion was
 * asked for or the deadline `until` passed, or -LMT_ECANCELED. */
bool verbs_progress_ends(struct lmt_instance *inst, uint32_t max, uint64_t until, int *rc);

/* Fail the instance with `code` (-LMT_E*): every channel is broken, its
 * outstanding writes reported with that status and its queue pair moved
 * to the error state. */
void verbs_fail(struct lmt_instance *inst, int code);
/* ep_open: the channel takes part in failures from now on (broken at once
 * if the instance failed already). */
void verbs_channel_live(lmt_endpoint *ep);

#endif
