/* Endpoints of the verbs plugin (see endpoint.h): a queue pair created in
 * INIT with an address blob for the peer, then brought to RTR and RTS with
 * the peer's. Nothing blocks on the peer. */
#define _GNU_SOURCE
#include "endpoint.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "events.h"

static int to_init(lmt_endpoint *ep)
{
	struct lmt_instance *inst = ep->inst;
	struct ibv_qp_attr a = {
	        .qp_state = IBV_QPS_INIT,
	        .pkey_index = 0,
	        .port_num = inst->port,
	        .qp_access_flags =
	                inst->base.role == LMT_ROLE_DESTINATION ? IBV_ACCESS_REMOTE_WRITE : 0,
	};
	int rc = ibv_modify_qp(
	        ep->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
	if (rc)
		return putil_error(&inst->base, LMT_EIO,
		                   "verbs channel %u: queue pair to INIT failed (%s)", ep->channel,
		                   strerror(rc));
	return 0;
}

/* Create the queue pair of `ep` and bring it to INIT. */
static int create_qp(lmt_endpoint *ep)
{
	struct lmt_instance *inst = ep->inst;
	struct ibv_qp_init_attr qa = {
	        .send_cq = inst->cq,
	        .recv_cq = inst->cq,
	        .cap = {.max_send_wr = ep->sq_cap,
	                .max_recv_wr = 1,
	                .max_send_sge = 1,
	                .max_recv_sge = 1},
	        .qp_type = IBV_QPT_RC,
	        .sq_sig_all = 0,
	};
	ep->qp = ibv_create_qp(inst->pd, &qa);
	if (!ep->qp)
		return putil_error(
		        &inst->base, LMT_EIO,
		        "verbs channel %u: ibv_create_qp with %u send requests failed (%s)",
		        ep->channel, ep->sq_cap, strerror(errno));
	int rc = to_init(ep);
	if (rc)
		ibv_destroy_qp(ep->qp);
	return rc;
}

/* A new endpoint with the ring of its send queue and its queue pair in
 * INIT. */
static int new_endpoint(struct lmt_instance *inst, uint32_t channel, lmt_endpoint **out)
{
	bool source = inst->base.role == LMT_ROLE_SOURCE;
	lmt_endpoint *ep = calloc(1, sizeof(*ep));
	if (ep) {
		*ep = (lmt_endpoint){.inst = inst,
		                     .channel = channel,
		                     .sq_cap = source ? inst->depth + 1 : 1,
		                     .write_max = source ? inst->depth : 0};
		ep->ring = calloc(ep->sq_cap, sizeof(*ep->ring));
	}
	/* The first PSN is part of what a packet must match to reach the
	 * connected QP: from the CSPRNG, never from the clock. */
	uint32_t psn = 0;
	int rc = ep && ep->ring ? putil_random(&inst->base, &psn, sizeof(psn))
	                        : putil_error(&inst->base, LMT_ENOMEM, "verbs: out of memory");
	if (!rc)
		rc = create_qp(ep);
	if (rc) {
		if (ep)
			free(ep->ring);
		free(ep);
		return rc;
	}
	ep->psn = psn & 0xffffffu;
	*out = ep;
	return 0;
}

int verbs_ep_open(lmt_instance *inst, uint32_t channel, lmt_endpoint **out, struct lmt_blob *addr)
{
	if (!inst || !out || !addr)
		return -LMT_EINVAL;
	lmt_endpoint *ep = NULL;
	int rc = putil_channels_check_open(&inst->channels, channel);
	if (rc || (rc = new_endpoint(inst, channel, &ep)))
		return rc;
	struct verbs_addr a = {
	        .role = (uint8_t)inst->base.role,
	        .link = (uint8_t)inst->link,
	        .mtu = (uint8_t)inst->mtu,
	        .channel = channel,
	        .qpn = ep->qp->qp_num,
	        .psn = ep->psn,
	        .lid = inst->lid,
	};
	memcpy(a.gid, inst->gid.raw, 16);
	verbs_addr_encode(&a, addr);
	putil_channels_attach(&inst->channels, channel, ep);
	/* Live from the start: a failure moves every open queue pair to the
	 * error state, connected or not. */
	verbs_channel_live(ep);
	*out = ep;
	return 0;
}

/* Check the peer's blob against this endpoint; NULL when it fits. */
static const char *peer_mismatch(const lmt_endpoint *ep, const struct verbs_addr *peer)
{
	const struct lmt_instance *inst = ep->inst;
	if (peer->role == (uint8_t)inst->base.role)
		return "it comes from the same role";
	if (peer->channel != ep->channel)
		return "it is for another channel";
	if (peer->link != (uint8_t)inst->link)
		return inst->link == VERBS_LINK_ETHERNET
		               ? "the peer is on InfiniBand, this port on "
		                 "Ethernet"
		               : "the peer is on Ethernet, this port on "
		                 "InfiniBand";
	return NULL;
}

static int to_rtr_rts(lmt_endpoint *ep, const struct verbs_addr *peer)
{
	struct lmt_instance *inst = ep->inst;
	struct ibv_qp_attr a = {
	        .qp_state = IBV_QPS_RTR,
	        .path_mtu = peer->mtu < (uint8_t)inst->mtu ? (enum ibv_mtu)peer->mtu : inst->mtu,
	        .dest_qp_num = peer->qpn,
	        .rq_psn = peer->psn,
	        .max_dest_rd_atomic = 1,
	        .min_rnr_timer = 12,
	        .ah_attr = {.port_num = inst->port, .sl = 0},
	};
	/* RoCE always routes by GID; InfiniBand by LID unless the peer is in
	 * another subnet. */
	bool global = inst->link == VERBS_LINK_ETHERNET || memcmp(peer->gid, inst->gid.raw, 8) != 0;
	if (inst->link == VERBS_LINK_IB)
		a.ah_attr.dlid = peer->lid;
	if (global) {
		a.ah_attr.is_global = 1;
		memcpy(a.ah_attr.grh.dgid.raw, peer->gid, 16);
		a.ah_attr.grh.sgid_index = (uint8_t)inst->gid_index;
		a.ah_attr.grh.hop_limit = 64;
	}
	int rc = ibv_modify_qp(ep->qp, &a,
	                       IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
	                               IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
	                               IBV_QP_MIN_RNR_TIMER);
	if (rc)
		return putil_error(&inst->base, LMT_EIO,
		                   "verbs channel %u: queue pair to RTR failed (%s)", ep->channel,
		                   strerror(rc));
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = VERBS_ACK_TIMEOUT;
	a.retry_cnt = VERBS_RETRY_COUNT;
	a.rnr_retry = VERBS_RNR_RETRY;
	a.sq_psn = ep->psn;
	a.max_rd_atomic = 1;
	rc = ibv_modify_qp(ep->qp, &a,
	                   IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
	                           IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
	if (rc)
		return putil_error(&inst->base, LMT_EIO,
		                   "verbs channel %u: queue pair to RTS failed (%s)", ep->channel,
		                   strerror(rc));
	return 0;
}

int verbs_ep_connect(lmt_endpoint *ep, const struct lmt_blob *peer_addr)
{
	if (!ep || !peer_addr)
		return -LMT_EINVAL;
	struct lmt_instance *inst = ep->inst;
	if (ep->connected)
		return putil_error(&inst->base, LMT_ESTATE, "verbs channel %u: already connected",
		                   ep->channel);
	struct verbs_addr peer;
	const char *why = verbs_addr_decode(peer_addr, &peer);
	if (!why)
		why = peer_mismatch(ep, &peer);
	if (why)
		return putil_error(&inst->base, LMT_EPROTO,
		                   "verbs channel %u: bad peer address (%u bytes): %s", ep->channel,
		                   peer_addr->len, why);
	int rc = to_rtr_rts(ep, &peer);
	if (rc)
		return rc;
	ep->connected = true;
	putil_log(&inst->base, LMT_LOG_DEBUG, "verbs channel %u: QP %u connected to QP %u",
	          ep->channel, ep->qp->qp_num, peer.qpn);
	return 0;
}

void verbs_ep_close(lmt_endpoint *ep)
{
	if (!ep)
		return;
	struct lmt_instance *inst = ep->inst;
	putil_channels_detach(&inst->channels, ep->channel);
	int rc = ibv_destroy_qp(ep->qp);
	if (rc)
		putil_log(&inst->base, LMT_LOG_WARN, "verbs channel %u: ibv_destroy_qp failed (%s)",
		          ep->channel, strerror(rc));
	free(ep->ring);
	free(ep);
}
