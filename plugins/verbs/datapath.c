/* The verbs plugin's data path: RDMA writes with selective signalling, the
 * accounting that turns one signalled completion into every cookie it
 * retires, progress, flush, and the paths that fail an instance. */
#define _GNU_SOURCE
#include "verbs.h"

#include <errno.h>
#include <poll.h>
#include <string.h>

#define VERBS_POLL_BATCH 32
#define VERBS_ACK_BATCH 64u

static uint64_t now(const struct lmt_instance *inst)
{
	return inst->host->now_ns(inst->host_ctx);
}

static uint64_t wr_id(const lmt_endpoint *ep, uint64_t seq)
{
	return (uint64_t)ep->channel << VERBS_SEQ_BITS | (seq & VERBS_SEQ_MASK);
}

static void push(struct lmt_instance *inst, uint64_t cookie, int status, uint32_t channel)
{
	/* Cannot overflow: each outstanding write enters once, and there are
	 * never more than pending_cap of them. */
	if (inst->pending_count == inst->pending_cap)
		return;
	uint32_t at = (inst->pending_first + inst->pending_count++) % inst->pending_cap;
	inst->pending[at] =
	        (struct lmt_completion){.cookie = cookie, .status = status, .channel = channel};
}

static uint32_t take(struct lmt_instance *inst, struct lmt_completion *out, uint32_t max)
{
	uint32_t n = 0;
	while (n < max && inst->pending_count) {
		out[n++] = inst->pending[inst->pending_first];
		inst->pending_first = (inst->pending_first + 1) % inst->pending_cap;
		inst->pending_count--;
	}
	return n;
}

/* Requests [retired, upto) are complete: queue their cookies. */
static void retire(lmt_endpoint *ep, uint64_t upto, int status)
{
	for (; ep->retired < upto; ep->retired++) {
		const struct verbs_wr *wr = &ep->ring[ep->retired % ep->sq_cap];
		if (!(wr->flags & VERBS_WR_MARKER))
			push(ep->inst, wr->cookie, status, ep->channel);
	}
}

void verbs_fail_all(struct lmt_instance *inst, int code)
{
	if (!inst->fatal)
		inst->fatal = code;
	for (uint32_t c = 0; c < inst->channels; c++) {
		lmt_endpoint *ep = inst->eps[c];
		if (!ep || ep->broken)
			continue;
		ep->broken = inst->fatal;
		retire(ep, ep->posted, inst->fatal);
		/* Stop the hardware: nothing of this QP may land after its
		 * cookies were reported. */
		struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
		ibv_modify_qp(ep->qp, &a, IBV_QP_STATE);
	}
}

static int status_code(enum ibv_wc_status status)
{
	switch (status) {
	case IBV_WC_RETRY_EXC_ERR:
	case IBV_WC_RNR_RETRY_EXC_ERR:
		return LMT_ECONN; /* the peer stopped answering */
	default:
		return LMT_EIO;
	}
}

static lmt_endpoint *find_qp(struct lmt_instance *inst, uint32_t qp_num)
{
	for (uint32_t c = 0; c < inst->channels; c++)
		if (inst->eps[c] && inst->eps[c]->qp->qp_num == qp_num)
			return inst->eps[c];
	return NULL;
}

static void handle_wc(struct lmt_instance *inst, const struct ibv_wc *wc)
{
	lmt_endpoint *ep = find_qp(inst, wc->qp_num);
	if (!ep || ep->broken)
		return; /* a closed channel, or one whose cookies were all reported */
	if (wc->status != IBV_WC_SUCCESS) {
		int code = status_code(wc->status);
		verbs_error(inst, code,
		            "verbs channel %u: RDMA write failed: %s (status %d, "
		            "vendor error 0x%x)",
		            ep->channel, ibv_wc_status_str(wc->status), (int)wc->status,
		            wc->vendor_err);
		verbs_fail_all(inst, -code);
		return;
	}
	uint64_t outstanding = ep->posted - ep->retired;
	uint64_t ahead = (wc->wr_id - ep->retired) & VERBS_SEQ_MASK;
	if (wc->wr_id >> VERBS_SEQ_BITS != ep->channel || ahead >= outstanding ||
	    !(ep->ring[(ep->retired + ahead) % ep->sq_cap].flags & VERBS_WR_SIGNALLED) ||
	    wc->opcode != IBV_WC_RDMA_WRITE) {
		verbs_error(inst, LMT_EIO,
		            "verbs channel %u: completion for unknown work request 0x%llx "
		            "(opcode %d, %llu outstanding)",
		            ep->channel, (unsigned long long)wc->wr_id, (int)wc->opcode,
		            (unsigned long long)outstanding);
		verbs_fail_all(inst, -LMT_EIO);
		return;
	}
	/* Send completions of an RC queue pair come in order, and a signalled
	 * one means every request before it completed too. */
	retire(ep, ep->retired + ahead + 1, 0);
}

/* Drain the CQ into the pending queue. */
static void poll_cq(struct lmt_instance *inst)
{
	struct ibv_wc wc[VERBS_POLL_BATCH];
	int n;
	do {
		n = ibv_poll_cq(inst->cq, VERBS_POLL_BATCH, wc);
		if (n < 0) {
			verbs_error(inst, LMT_EIO, "verbs: %s: ibv_poll_cq failed (%d)",
			            inst->device, n);
			verbs_fail_all(inst, -LMT_EIO);
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
				code = verbs_error(inst, LMT_EIO,
				                   "verbs channel %u: queue pair in error: %s",
				                   ep->channel, event_name(type));
			break;
		case IBV_EVENT_CQ_ERR:
		case IBV_EVENT_DEVICE_FATAL:
			code = verbs_error(inst, LMT_EIO, "verbs: %s: %s", inst->device,
			                   event_name(type));
			break;
		case IBV_EVENT_PORT_ERR:
			if (ev.element.port_num == inst->port)
				code = verbs_error(inst, LMT_ECONN, "verbs: %s port %u: %s",
				                   inst->device, inst->port, event_name(type));
			break;
		default:
			verbs_log(inst, LMT_LOG_DEBUG, "verbs: %s: %s", inst->device,
			          event_name(type));
			break;
		}
		ibv_ack_async_event(&ev);
		if (code)
			verbs_fail_all(inst, code);
	}
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
		rc = verbs_error(inst, LMT_EIO, "verbs channel %u: ibv_post_send failed (%s)",
		                 ep->channel, strerror(rc));
		verbs_fail_all(inst, rc);
		return rc;
	}
	ep->ring[ep->posted % ep->sq_cap] = (struct verbs_wr){
	        .cookie = cookie,
	        .flags = (signalled ? VERBS_WR_SIGNALLED : 0) | (marker ? VERBS_WR_MARKER : 0)};
	ep->posted++;
	ep->unsignalled = signalled ? 0 : ep->unsignalled + 1;
	return 0;
}

int verbs_write(lmt_endpoint *ep, const void *local, size_t len, lmt_mr *local_mr, lmt_rkey *rkey,
                uint64_t offset, uint64_t cookie)
{
	if (!ep)
		return -LMT_EINVAL;
	struct lmt_instance *inst = ep->inst;
	if (inst->role != LMT_ROLE_SOURCE || !ep->connected)
		return verbs_error(inst, LMT_ESTATE, "verbs channel %u: write %s", ep->channel,
		                   inst->role != LMT_ROLE_SOURCE ? "on a destination"
		                                                 : "before connect");
	if (ep->broken)
		return ep->broken;
	if (!rkey || !local_mr || (!local && len))
		return verbs_error(inst, LMT_EINVAL, "verbs channel %u: write without %s",
		                   ep->channel,
		                   !rkey       ? "a key"
		                   : !local_mr ? "a local registration"
		                               : "a source buffer");
	if ((uint64_t)len > rkey->len || offset > rkey->len - len)
		return verbs_error(
		        inst, LMT_EINVAL,
		        "verbs channel %u: write of %zu bytes at offset %llu past the end "
		        "of a region of %llu bytes",
		        ep->channel, len, (unsigned long long)offset,
		        (unsigned long long)rkey->len);
	uintptr_t at = (uintptr_t)local, base = (uintptr_t)local_mr->addr;
	if (at < base || (uint64_t)len > local_mr->len || at - base > local_mr->len - len)
		return verbs_error(inst, LMT_EINVAL,
		                   "verbs channel %u: source range of %zu bytes at %p outside its "
		                   "registration",
		                   ep->channel, len, local);
	if (len > inst->max_msg)
		return verbs_error(inst, LMT_EINVAL,
		                   "verbs channel %u: write of %zu bytes, the port allows %u",
		                   ep->channel, len, inst->max_msg);
	if (ep->posted - ep->retired >= ep->write_max)
		return -LMT_EAGAIN;
	int rc = post(ep, local, (uint32_t)len, local_mr->mr->lkey, rkey->rkey, rkey->addr + offset,
	              cookie, false);
	if (rc == 0) {
		ep->marker_rkey = rkey->rkey;
		ep->marker_addr = rkey->addr + offset;
	}
	return rc;
}

/* A channel whose last requests are unsignalled would never report them:
 * post a signalled zero-length write behind them. */
static int post_markers(struct lmt_instance *inst)
{
	for (uint32_t c = 0; c < inst->channels; c++) {
		lmt_endpoint *ep = inst->eps[c];
		if (!ep || ep->broken || !ep->unsignalled || ep->posted - ep->retired >= ep->sq_cap)
			continue;
		int rc = post(ep, NULL, 0, 0, ep->marker_rkey, ep->marker_addr, 0, true);
		if (rc)
			return rc;
	}
	return 0;
}

/* Wait up to `until` (and one slice at most) for a CQ or async event. */
static int wait_event(struct lmt_instance *inst, uint64_t until)
{
	if (inst->role == LMT_ROLE_SOURCE && !inst->armed) {
		int rc = ibv_req_notify_cq(inst->cq, 0);
		if (rc)
			return verbs_error(inst, LMT_EIO, "verbs: ibv_req_notify_cq failed (%s)",
			                   strerror(rc));
		inst->armed = true;
		/* A completion that came before the request raises no event. */
		return 0;
	}
	uint64_t t = now(inst);
	uint64_t wait = until > t ? until - t : 0;
	if (wait > VERBS_SLICE_NS)
		wait = VERBS_SLICE_NS;
	struct pollfd fds[2] = {{.fd = inst->ctx->async_fd, .events = POLLIN},
	                        {.fd = inst->comp->fd, .events = POLLIN}};
	int n = poll(fds, inst->role == LMT_ROLE_SOURCE ? 2 : 1, (int)((wait + 999999) / 1000000));
	if (n < 0 && errno != EINTR)
		return verbs_error(inst, LMT_EIO, "verbs: poll failed (%s)", strerror(errno));
	if (n > 0 && fds[0].revents)
		verbs_async_events(inst);
	if (n > 0 && inst->role == LMT_ROLE_SOURCE && fds[1].revents) {
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

static uint64_t deadline_after(const struct lmt_instance *inst, uint64_t timeout_ns)
{
	uint64_t t = now(inst);
	return timeout_ns > UINT64_MAX - t ? UINT64_MAX : t + timeout_ns;
}

int verbs_progress(lmt_instance *inst, struct lmt_completion *out, uint32_t max,
                   uint64_t timeout_ns)
{
	if (!inst || (!out && max))
		return -LMT_EINVAL;
	uint64_t until = deadline_after(inst, timeout_ns);
	bool marked = false;
	for (;;) {
		uint32_t n = take(inst, out, max);
		if (n)
			return (int)n;
		if (inst->role == LMT_ROLE_SOURCE && !inst->fatal)
			poll_cq(inst);
		if (!inst->fatal)
			verbs_async_events(inst);
		if ((n = take(inst, out, max)))
			return (int)n;
		if (inst->fatal || !max)
			return inst->fatal;
		if (inst->host->cancelled(inst->host_ctx))
			return verbs_error(inst, LMT_ECANCELED, "verbs: cancelled");
		if (now(inst) >= until)
			return 0;
		int rc = marked ? 0 : post_markers(inst);
		marked = true;
		if (rc || (rc = wait_event(inst, until)))
			return rc;
	}
}

static uint64_t outstanding(const struct lmt_instance *inst)
{
	uint64_t n = 0;
	for (uint32_t c = 0; c < inst->channels; c++)
		if (inst->eps[c] && !inst->eps[c]->broken)
			n += inst->eps[c]->posted - inst->eps[c]->retired;
	return n;
}

int verbs_flush(lmt_instance *inst, uint64_t timeout_ns)
{
	if (!inst)
		return -LMT_EINVAL;
	if (inst->role != LMT_ROLE_SOURCE)
		return inst->fatal;
	uint64_t until = deadline_after(inst, timeout_ns);
	int rc = inst->fatal ? inst->fatal : post_markers(inst);
	while (rc == 0 && outstanding(inst)) {
		poll_cq(inst);
		verbs_async_events(inst);
		if (inst->fatal)
			return inst->fatal;
		if (!outstanding(inst))
			break;
		if (inst->host->cancelled(inst->host_ctx))
			return verbs_error(inst, LMT_ECANCELED, "verbs: flush cancelled");
		if (now(inst) >= until)
			return verbs_error(inst, LMT_ETIMEDOUT,
			                   "verbs: flush timed out after %llu ms with %llu work "
			                   "requests outstanding",
			                   (unsigned long long)(timeout_ns / 1000000),
			                   (unsigned long long)outstanding(inst));
		rc = wait_event(inst, until);
	}
	return rc ? rc : inst->fatal;
}
