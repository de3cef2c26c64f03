/* Destination side of a libfabric channel: the source writes into it
 * without its help beyond progress, so what is left is the greeting, which
 * says the source has connected. A connection the provider accepted but
 * had not taken when the endpoint closes is conns.c's. */
#define _GNU_SOURCE
#include "destination.h"

#include <stdio.h>

#include <rdma/fi_errno.h>

#include "conns.h"

#define LFI_GREETING_NAP_NS 1000000 /* a destination waiting for the greeting polls this often */

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
	/* The source is in: nobody else needs to connect. */
	lfi_conns_seal(ep);
	return 0;
}
