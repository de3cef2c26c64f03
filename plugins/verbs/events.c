/* Completions, asynchronous events and failure of a verbs instance (see
 * events.h). The core's progress and flush poll the CQ themselves: the
 * plugin runs no thread of its own. */
#define _GNU_SOURCE
#include "events.h"

#include <errno.h>
#include <poll.h>
#include <string.h>

#define VERBS_POLL_BATCH 32
#define VERBS_ACK_BATCH 64u

static lmt_endpoint *find_qp(struct lmt_instance *inst, uint32_t qp_num)
{
	for (uint32_t c = 0; c < inst->channels.count; c++) {
		lmt_endpoint *ep = putil_channels_endpoint(&inst->channels, c);
		if (ep && ep->qp->qp_num == qp_num)
			return ep;
	}
	return NULL;
}

/* Requests [retired, upto) are complete: queue the cookies of their
 * writes. Called with the channel table's lock held. */
static void retire_locked(lmt_endpoint *ep, uint64_t upto, int status)
{
	for (; ep->retired < upto; ep->retired++) {
		const struct verbs_wr *wr = &ep->ring[ep->retired % ep->sq_cap];
		if (!(wr->flags & VERBS_WR_MARKER))
			putil_channels_complete_locked(&ep->inst->channels, ep->channel, wr->cookie,
			                               status);
	}
}

/* The instance failed: report every outstanding write of the channel with
 * `status` and stop the hardware, so that nothing of this QP lands after
 * its cookies were reported. The channel settles at once: with no channel
 * threads, the failure is final as soon as every channel broke. Called
 * under the channel table's lock. */
static void break_channel(void *arg, int status)
{
	lmt_endpoint *ep = arg;
	if (ep->broken)
		return;
	ep->broken = status;
	retire_locked(ep, ep->posted, status);
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
	ibv_modify_qp(ep->qp, &a, IBV_QP_STATE);
	putil_channels_settle_locked(&ep->inst->channels, ep->channel, status);
}

/* Both ends go through the source's state machine: the destination's
 * queue pairs, too, move to the error state when its instance fails. */
void verbs_fail(struct lmt_instance *inst, int code)
{
	putil_channels_fail(&inst->channels, code, break_channel);
}

void verbs_channel_live(lmt_endpoint *ep)
{
	putil_channels_go_live(&ep->inst->channels, ep->channel, break_channel);
}

static int status_code(enum ibv_wc_status status)
{
	switch (status) {
	case IBV_WC_RETRY_EXC_ERR:
	case IBV_WC_RNR_RETRY_EXC_ERR:
		return LMT_ECONN; /* the peer stopped answering */
	case IBV_WC_REM_ACCESS_ERR:
		/* Every write is checked against the keys the destination
		 * granted before it is posted, so its registration is gone:
		 * it closed it, or died and the kernel released it before its
		 * queue pair (as rxe does). */
		return LMT_ECONN;
	default:
		return LMT_EIO;
	}
}

static void handle_wc(struct lmt_instance *inst, const struct ibv_wc *wc)
{
	lmt_endpoint *ep = find_qp(inst, wc->qp_num);
	if (!ep || ep->broken)
		return; /* a closed channel, or one whose cookies were all reported */
	if (wc->status != IBV_WC_SUCCESS) {
		int code = status_code(wc->status);
		putil_error(&inst->base, code,
		            "verbs channel %u: RDMA write failed: %s (status %d, "
		            "vendor error 0x%x)",
		            ep->channel, ibv_wc_status_str(wc->status), (int)wc->status,
		            wc->vendor_err);
		verbs_fail(inst, -code);
		return;
	}
	uint64_t outstanding = ep->posted - ep->retired;
	uint64_t ahead = (wc->wr_id - ep->retired) & VERBS_SEQ_MASK;
	if (wc->wr_id >> VERBS_SEQ_BITS != ep->channel || ahead >= outstanding ||
	    !(ep->ring[(ep->retired + ahead) % ep->sq_cap].flags & VERBS_WR_SIGNALLED) ||
	    wc->opcode != IBV_WC_RDMA_WRITE) {
		verbs_fail(inst,
		           putil_error(&inst->base, LMT_EIO,
		                       "verbs channel %u: completion for unknown work request "
		                       "0x%llx (opcode %d, %llu outstanding)",
		                       ep->channel, (unsigned long long)wc->wr_id, (int)wc->opcode,
		                       (unsigned long long)outstanding));
		return;
	}
	/* Send completions of an RC queue pair come in order, and a signalled
	 * one means every request before it completed too. */
	pthread_mutex_lock(&inst->channels.lock);
	retire_locked(ep, ep->retired + ahead + 1, 0);
	pthread_mutex_unlock(&inst->channels.lock);
}

void verbs_poll_cq(struct lmt_instance *inst)
{
	struct ibv_wc wc[VERBS_POLL_BATCH];
	int n;
	do {
		n = ibv_poll_cq(inst->cq, VERBS_POLL_BATCH, wc);
		if (n < 0) {
			verbs_fail(inst, putil_error(&inst->base, LMT_EIO,
			                             "verbs: %s: ibv_poll_cq failed (%d)",
			                             inst->device, n));
			return;
		}
		for (int i = 0; i < n; i++)
			handle_wc(inst, &wc[i]);
	} while (n == VERBS_POLL_BATCH);
}

static const char *event_name(enum ibv_event_type type)
{
	const char *name = ibv_event_type_str(type);
	return name ? name : "unknown event";
}

void verbs_async_events(struct lmt_instance *inst)
{
	const struct putil_instance *base = &inst->base;
	struct ibv_async_event ev;
	while (ibv_get_async_event(inst->ctx, &ev) == 0) {
		enum ibv_event_type type = ev.event_type;
		lmt_endpoint *ep = NULL;
		int code = 0;
		switch (type) {
		case IBV_EVENT_QP_FATAL:
		case IBV_EVENT_QP_REQ_ERR:
		case IBV_EVENT_QP_ACCESS_ERR:
			ep = ev.element.qp ? find_qp(inst, ev.element.qp->qp_num) : NULL;
			if (ep)
				code = putil_error(base, LMT_EIO,
				                   "verbs channel %u: queue pair in error: %s",
				                   ep->channel, event_name(type));
			break;
		case IBV_EVENT_CQ_ERR:
		case IBV_EVENT_DEVICE_FATAL:
			code = putil_error(base, LMT_EIO, "verbs: %s: %s", inst->device,
			                   event_name(type));
			break;
		case IBV_EVENT_PORT_ERR:
			if (ev.element.port_num == inst->port)
				code = putil_error(base, LMT_ECONN, "verbs: %s port %u: %s",
				                   inst->device, inst->port, event_name(type));
			break;
		default:
			putil_log(base, LMT_LOG_DEBUG, "verbs: %s: %s", inst->device,
			          event_name(type));
			break;
		}
		ibv_ack_async_event(&ev);
		if (code)
			verbs_fail(inst, code);
	}
}

bool verbs_progress_ends(struct lmt_instance *inst, uint32_t max, uint64_t until, int *rc)
{
	*rc = putil_channels_failing(&inst->channels);
	if (*rc || !max)
		return true;
	if (putil_cancelled(&inst->base)) {
		*rc = putil_error(&inst->base, LMT_ECANCELED, "verbs: cancelled");
		return true;
	}
	return lmt__now_ns() >= until;
}

int verbs_wait_event(struct lmt_instance *inst, uint64_t until)
{
	bool source = inst->base.role == LMT_ROLE_SOURCE;
	if (source && !inst->armed) {
		int rc = ibv_req_notify_cq(inst->cq, 0);
		if (rc)
			return putil_error(&inst->base, LMT_EIO,
			                   "verbs: ibv_req_notify_cq failed (%s)", strerror(rc));
		inst->armed = true;
		/* A completion that came before the request raises no event. */
		return 0;
	}
	uint64_t now = lmt__now_ns();
	uint64_t wait = until > now ? until - now : 0;
	if (wait > LMT__SLICE_NS)
		wait = LMT__SLICE_NS;
	struct pollfd fds[2] = {{.fd = inst->ctx->async_fd, .events = POLLIN},
	                        {.fd = inst->comp->fd, .events = POLLIN}};
	int n = poll(fds, source ? 2 : 1, (int)((wait + 999999) / 1000000));
	if (n < 0 && errno != EINTR)
		return putil_error(&inst->base, LMT_EIO, "verbs: poll failed (%s)",
		                   strerror(errno));
	if (n > 0 && fds[0].revents)
		verbs_async_events(inst);
	if (n > 0 && source && fds[1].revents) {
		struct ibv_cq *cq;
		void *cq_ctx;
		if (ibv_get_cq_event(inst->comp, &cq, &cq_ctx) == 0) {
			inst->armed = false;
			if (++inst->unacked_events >= VERBS_ACK_BATCH) {
				ibv_ack_cq_events(inst->cq, inst->unacked_events);
				inst->unacked_events = 0;
			}
		}
	}
	return 0;
}
