/* Destination side of a libfabric channel: the source writes into it
 * without its help beyond progress, so what is left is the greeting, which
 * says the source has connected, and not closing under a connection that
 * is still being made. */
#define _GNU_SOURCE
#include "destination.h"

#include <stdio.h>

#include <rdma/fi_errno.h>

#define LFI_GREETING_NAP_NS 1000000 /* a destination waiting for the greeting polls this often */
#define LFI_LINGER_NS 1000000000ull /* longest wait for a greeting that may be on its way */

bool lfi_dest_greeting_landed(const lmt_endpoint *ep)
{
	return __atomic_load_n(&ep->fence_buf[0], __ATOMIC_ACQUIRE) == lfi_greeting(ep->channel);
}

/* Whether the source's greeting has landed in this destination's region;
 * for the core's thread. */
static bool greeted(lmt_endpoint *ep)
{
	if (!ep->greeted && lfi_dest_greeting_landed(ep))
		ep->greeted = true;
	return ep->greeted;
}

/* A channel thread's error, which progress returns. */
static int fatal(struct lmt_instance *inst)
{
	pthread_mutex_lock(&inst->channels.lock);
	int code = inst->channels.fatal;
	pthread_mutex_unlock(&inst->channels.lock);
	return code;
}

int lfi_dest_connect(lmt_endpoint *ep)
{
	struct lmt_instance *inst = ep->inst;
	atomic_store(&inst->connecting, true);
	uint64_t deadline = lmt__deadline(inst->base.timeout_ns);
	char what[64];
	snprintf(what, sizeof(what), "ofi channel %u: waiting for the source to connect",
	         ep->channel);
	while (!greeted(ep)) {
		int rc = fatal(inst);
		if (!rc)
			rc = putil_wait_check(&inst->base, deadline, inst->base.timeout_ns, what);
		if (rc)
			return rc;
		putil_nap(LFI_GREETING_NAP_NS);
	}
	return 0;
}

void lfi_dest_linger(lmt_endpoint *ep)
{
	struct lmt_instance *inst = ep->inst;
	if (!inst->linger || !atomic_load(&inst->connecting) || !ep->published || greeted(ep))
		return;
	ep->published = false;
	/* One wait for all the channels of the instance. */
	if (!inst->linger_deadline)
		inst->linger_deadline = lmt__deadline(LFI_LINGER_NS);
	struct fi_cq_entry entries[LFI_CQ_BATCH];
	while (!greeted(ep) && lmt__now_ns() < inst->linger_deadline) {
		/* Writes land only while someone drives the provider. */
		if (!ep->thread_started &&
		    fi_cq_read(ep->cq, entries, LFI_CQ_BATCH) == -FI_EAVAIL) {
			struct fi_cq_err_entry err = {0};
			(void)fi_cq_readerr(ep->cq, &err, 0);
		}
		putil_nap(LFI_GREETING_NAP_NS);
	}
	if (!greeted(ep))
		putil_log(&inst->base, LMT_LOG_DEBUG,
		          "ofi channel %u: closing without the source's greeting", ep->channel);
}
