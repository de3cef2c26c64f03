/* The verbs plugin's source: RDMA writes with selective signalling, the
 * markers that retire an unsignalled tail, progress and flush. One
 * signalled completion retires every write before it (events.c). */
#define _GNU_SOURCE
#include "source.h"

#include <string.h>

#include "events.h"

static uint64_t wr_id(const lmt_endpoint *ep, uint64_t seq)
{
	return (uint64_t)ep->channel << VERBS_SEQ_BITS | (seq & VERBS_SEQ_MASK);
}

/* Post one work request: a write, or (len 0, marker) a zero-length write
 * that only asks for a completion. */
static int post(lmt_endpoint *ep, const void *local, uint32_t len, uint32_t lkey, uint32_t rkey,
                uint64_t raddr, uint64_t cookie, bool marker)
{
	struct lmt_instance *inst = ep->inst;
	bool signalled = marker || ep->unsignalled + 1 >= inst->signal_interval;
	struct ibv_sge sge = {.addr = (uintptr_t)local, .length = len, .lkey = lkey};
	struct ibv_send_wr wr = {
	        .wr_id = wr_id(ep, ep->posted),
	        .sg_list = len ? &sge : NULL,
	        .num_sge = len ? 1 : 0,
	        .opcode = IBV_WR_RDMA_WRITE,
	        .send_flags = signalled ? IBV_SEND_SIGNALED : 0,
	        .wr.rdma = {.remote_addr = raddr, .rkey = rkey},
	};
	struct ibv_send_wr *bad = NULL;
	int rc = ibv_post_send(ep->qp, &wr, &bad);
	if (rc) {
		rc = putil_error(&inst->base, LMT_EIO,
		                 "verbs channel %u: ibv_post_send failed (%s)", ep->channel,
		                 strerror(rc));
		verbs_fail(inst, rc);
		return rc;
	}
	ep->ring[ep->posted % ep->sq_cap] = (struct verbs_wr){
	        .cookie = cookie,
	        .flags = (signalled ? VERBS_WR_SIGNALLED : 0) | (marker ? VERBS_WR_MARKER : 0)};
	ep->posted++;
	ep->unsignalled = signalled ? 0 : ep->unsignalled + 1;
	return 0;
}

int verbs_source_write(lmt_endpoint *ep, const void *local, size_t len, lmt_mr *local_mr,
                       lmt_rkey *rkey, uint64_t offset, uint64_t cookie)
{
	struct lmt_instance *inst = ep->inst;
	const struct putil_instance *base = &inst->base;
	if (!ep->connected)
		return putil_error(base, LMT_ESTATE, "verbs channel %u: write before connect",
		                   ep->channel);
	if (ep->broken)
		return ep->broken;
	/* The key, the buffer and the range are checked (putil_write_check);
	 * verbs also needs the buffer's registration. */
	if (!local_mr)
		return putil_error(base, LMT_EINVAL,
		                   "verbs channel %u: write without a local registration",
		                   ep->channel);
	uintptr_t at = (uintptr_t)local, start = (uintptr_t)local_mr->addr;
	if (at < start || (uint64_t)len > local_mr->len || at - start > local_mr->len - len)
		return putil_error(base, LMT_EINVAL,
		                   "verbs channel %u: source range of %zu bytes at %p outside its "
		                   "registration",
		                   ep->channel, len, local);
	if (len > inst->max_msg)
		return putil_error(base, LMT_EINVAL,
		                   "verbs channel %u: write of %zu bytes, the port allows %u",
		                   ep->channel, len, inst->max_msg);
	/* The send queue frees its slots as the CQ retires requests; the
	 * channel table's as the core harvests completions. */
	if (ep->posted - ep->retired >= ep->write_max)
		return -LMT_EAGAIN;
	int rc = putil_channels_admit(&inst->channels, ep->channel);
	if (rc)
		return rc;
	rc = post(ep, local, (uint32_t)len, local_mr->mr->lkey, rkey->rkey, rkey->addr + offset,
	          cookie, false);
	if (rc == 0) {
		putil_channels_posted(&inst->channels, ep->channel);
		ep->marker_rkey = rkey->rkey;
		ep->marker_addr = rkey->addr + offset;
	}
	return rc;
}

/* A channel whose last requests are unsignalled would never report them:
 * post a signalled zero-length write behind them. */
static int post_markers(struct lmt_instance *inst)
{
	for (uint32_t c = 0; c < inst->channels.count; c++) {
		lmt_endpoint *ep = putil_channels_endpoint(&inst->channels, c);
		if (!ep || ep->broken || !ep->unsignalled || ep->posted - ep->retired >= ep->sq_cap)
			continue;
		int rc = post(ep, NULL, 0, 0, ep->marker_rkey, ep->marker_addr, 0, true);
		if (rc)
			return rc;
	}
	return 0;
}

/* Hand the core up to `max` completions the CQ retired. */
static uint32_t take(struct lmt_instance *inst, struct lmt_completion *out, uint32_t max)
{
	pthread_mutex_lock(&inst->channels.lock);
	uint32_t n = putil_channels_drain_locked(&inst->channels, out, max);
	pthread_mutex_unlock(&inst->channels.lock);
	return n;
}

int verbs_source_progress(struct lmt_instance *inst, struct lmt_completion *out, uint32_t max,
                          uint64_t timeout_ns)
{
	struct putil_channels *c = &inst->channels;
	uint64_t until = lmt__deadline(timeout_ns);
	bool marked = false;
	for (;;) {
		uint32_t n = take(inst, out, max);
		if (n)
			return (int)n;
		if (!putil_channels_failing(c))
			verbs_poll_cq(inst);
		if (!putil_channels_failing(c))
			verbs_async_events(inst);
		if ((n = take(inst, out, max)))
			return (int)n;
		int rc;
		if (verbs_progress_ends(inst, max, until, &rc))
			return rc;
		rc = marked ? 0 : post_markers(inst);
		marked = true;
		if (rc || (rc = verbs_wait_event(inst, until)))
			return rc;
	}
}

/* Work requests still in the send queues of channels that did not fail. */
static uint64_t outstanding(struct lmt_instance *inst)
{
	uint64_t n = 0;
	for (uint32_t c = 0; c < inst->channels.count; c++) {
		lmt_endpoint *ep = putil_channels_endpoint(&inst->channels, c);
		if (ep && !ep->broken)
			n += ep->posted - ep->retired;
	}
	return n;
}

/* A completion means "visible at the target", so the flush is over once
 * every request posted before it was retired. */
int verbs_source_flush(struct lmt_instance *inst, uint64_t timeout_ns)
{
	struct putil_channels *c = &inst->channels;
	uint64_t until = lmt__deadline(timeout_ns);
	int rc = putil_channels_failing(c);
	if (!rc)
		rc = post_markers(inst);
	while (rc == 0 && outstanding(inst)) {
		verbs_poll_cq(inst);
		verbs_async_events(inst);
		if ((rc = putil_channels_failing(c)))
			return rc;
		if (!outstanding(inst))
			break;
		if (putil_cancelled(&inst->base))
			return putil_error(&inst->base, LMT_ECANCELED, "verbs: flush cancelled");
		if (lmt__now_ns() >= until)
			return putil_error(&inst->base, LMT_ETIMEDOUT,
			                   "verbs: flush timed out after %llu ms with %llu work "
			                   "requests outstanding",
			                   (unsigned long long)(timeout_ns / 1000000),
			                   (unsigned long long)outstanding(inst));
		rc = verbs_wait_event(inst, until);
	}
	return rc ? rc : putil_channels_failing(c);
}
