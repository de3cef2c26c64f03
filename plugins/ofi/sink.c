/* Receives that take and drop what a peer sends unasked. lmt sends no
 * message, so any that reaches an endpoint is a stranger's (or a broken
 * peer's). Over sockets (net) a message with no receive stalls its
 * connection: nothing is kept, but the provider stops reading it, so it
 * would never see that connection shut (conns.c) and would hold its
 * descriptor for good. Each endpoint therefore keeps LFI_SINK_RING plain
 * and as many tagged receives posted, all into one scratch buffer whose
 * contents nobody reads; each is posted again as soon as it completes,
 * truncated or not. A message larger than the buffer completes truncated. */
#define _GNU_SOURCE
#include "sink.h"

#include <stdlib.h>

#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>

#include "provider.h"

#define LFI_SINK_BYTES (64u << 10) /* the scratch buffer */

/* Post receive `i` (the first half plain, the second tagged, matching any
 * tag): 0, or a negative libfabric error number. */
static ssize_t post(lmt_endpoint *ep, unsigned i)
{
	struct iovec iov = {.iov_base = ep->sink_buf, .iov_len = LFI_SINK_BYTES};
	void *context = &ep->sink_ctx[i];
	if (i < LFI_SINK_RING) {
		struct fi_msg msg = {
		        .msg_iov = &iov, .iov_count = 1, .addr = FI_ADDR_UNSPEC, .context = context};
		return fi_recvmsg(ep->ep, &msg, 0);
	}
	struct fi_msg_tagged msg = {.msg_iov = &iov,
	                            .iov_count = 1,
	                            .addr = FI_ADDR_UNSPEC,
	                            .tag = 0,
	                            .ignore = ~0ull,
	                            .context = context};
	return fi_trecvmsg(ep->ep, &msg, 0);
}

/* Post receive `i`, or leave it for lfi_sink_refill when the provider
 * says try again. */
static void repost(lmt_endpoint *ep, unsigned i)
{
	ssize_t rc = post(ep, i);
	if (rc == -FI_EAGAIN)
		ep->sink_unposted |= 1u << i;
	else if (rc)
		putil_log(&ep->inst->base, LMT_LOG_WARN,
		          "ofi channel %u: cannot post a receive for unasked messages: %s", ep->channel,
		          fi_strerror((int)-rc));
}

int lfi_sink_open(lmt_endpoint *ep)
{
	struct lmt_instance *inst = ep->inst;
	if (!inst->sink)
		return 0;
	if (!(ep->sink_buf = malloc(LFI_SINK_BYTES)))
		return putil_error(&inst->base, LMT_ENOMEM, "ofi: out of memory");
	for (unsigned i = 0; i < 2 * LFI_SINK_RING; i++) {
		ssize_t rc = post(ep, i);
		if (rc)
			return putil_error(&inst->base, lfi_code((int)-rc),
			                   "ofi channel %u: posting a receive for unasked messages: %s",
			                   ep->channel, fi_strerror((int)-rc));
	}
	return 0;
}

bool lfi_sink_done(lmt_endpoint *ep, void *context)
{
	struct fi_context2 *c = context;
	if (!ep->sink_buf || c < ep->sink_ctx || c >= ep->sink_ctx + 2 * LFI_SINK_RING)
		return false;
	if (ep->sink_taken++ == 0)
		putil_log(&ep->inst->base, LMT_LOG_WARN,
		          "ofi channel %u: a message nobody asked for arrived (lmt sends none: a "
		          "stranger's?); dropped, as every later one",
		          ep->channel);
	repost(ep, (unsigned)(c - ep->sink_ctx));
	return true;
}

void lfi_sink_refill(lmt_endpoint *ep)
{
	uint32_t unposted = ep->sink_unposted;
	ep->sink_unposted = 0;
	for (unsigned i = 0; unposted; i++, unposted >>= 1)
		if (unposted & 1)
			repost(ep, i);
}

void lfi_sink_close(lmt_endpoint *ep)
{
	free(ep->sink_buf);
	ep->sink_buf = NULL;
}
