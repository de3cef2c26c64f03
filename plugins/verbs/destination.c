/* The verbs plugin's destination: RDMA writes land in registered memory
 * without its CPU, so its progress only watches for a failure. */
#include "destination.h"

#include "events.h"

int verbs_dest_progress(struct lmt_instance *inst, uint32_t max, uint64_t timeout_ns)
{
	uint64_t until = lmt__deadline(timeout_ns);
	for (;;) {
		if (!putil_channels_failing(&inst->channels))
			verbs_async_events(inst);
		int rc;
		if (verbs_progress_ends(inst, max, until, &rc) ||
		    (rc = verbs_wait_event(inst, until)))
			return rc;
	}
}
