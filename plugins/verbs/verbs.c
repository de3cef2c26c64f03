/* The verbs plugin (rdma-core): descriptor, options, instances, queue pairs,
 * registrations and remote keys. The data path is in datapath.c. */
#define _GNU_SOURCE
#include "verbs.h"

#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include <lmt/version.h>

static const struct lmt_option_desc verbs_options[] = {
        {.name = "device",
         .type = LMT_OPT_STRING,
         .default_value = "",
         .doc = "RDMA device (mlx5_0, rxe0); empty = the first with an active port"},
        {.name = "port",
         .type = LMT_OPT_INT,
         .default_value = "0",
         .min = 0,
         .max = 255,
         .doc = "port of the device; 0 = its first active port"},
        {.name = "gid-index",
         .type = LMT_OPT_INT,
         .default_value = "-1",
         .min = -1,
         .max = 4095,
         .doc = "GID table index; -1 = on RoCE the v2 GID of the control connection's "
                "address, else the first RoCE v2 IPv4 GID"},
        {.name = "odp",
         .type = LMT_OPT_BOOL,
         .default_value = "off",
         .doc = "register with on-demand paging (IBV_ACCESS_ON_DEMAND) instead of pinning; "
                "fails where the device lacks it"},
        {.name = "signal-interval",
         .type = LMT_OPT_INT,
         .default_value = "16",
         .min = 1,
         .max = 4096,
         .doc = "ask for a completion on one write in this many (at most half "
                "the queue depth)"},
};

/* ---- Instances --------------------------------------------------------- */

static int read_options(struct lmt_instance *inst, const char **device, int *port, int *gid_index)
{
	const struct lmt_host *host = inst->host;
	struct lmt_option_value v;
	inst->depth = VERBS_DEFAULT_DEPTH;
	inst->signal_interval = VERBS_DEFAULT_SIGNAL;
	if (host->option(inst->host_ctx, "queue-depth", &v) == 0 && v.type == LMT_OPT_INT &&
	    v.integer >= 1 && v.integer <= 65536)
		inst->depth = (uint32_t)v.integer;
	if (host->option(inst->host_ctx, "verbs.signal-interval", &v) == 0 &&
	    v.type == LMT_OPT_INT && v.integer >= 1 && v.integer <= 4096)
		inst->signal_interval = (uint32_t)v.integer;
	if (host->option(inst->host_ctx, "verbs.odp", &v) == 0 && v.type == LMT_OPT_BOOL)
		inst->odp = v.boolean;
	*device = "";
	if (host->option(inst->host_ctx, "verbs.device", &v) == 0 && v.type == LMT_OPT_STRING &&
	    v.text)
		*device = v.text;
	*port = 0;
	if (host->option(inst->host_ctx, "verbs.port", &v) == 0 && v.type == LMT_OPT_INT) {
		if (v.integer < 0 || v.integer > 255)
			return verbs_error(inst, LMT_EINVAL,
			                   "verbs.port: expected 0 to 255, got %lld",
			                   (long long)v.integer);
		*port = (int)v.integer;
	}
	*gid_index = -1;
	if (host->option(inst->host_ctx, "verbs.gid-index", &v) == 0 && v.type == LMT_OPT_INT) {
		if (v.integer < -1 || v.integer > 4095)
			return verbs_error(inst, LMT_EINVAL,
			                   "verbs.gid-index: expected -1 to 4095, got %lld",
			                   (long long)v.integer);
		*gid_index = (int)v.integer;
	}
	return 0;
}

/* Queue sizes from queue-depth and what the device allows. */
static void size_queues(struct lmt_instance *inst)
{
	uint32_t cap = inst->depth + 1;
	if (cap > inst->max_qp_wr)
		cap = inst->max_qp_wr;
	if (cap < 2)
		cap = 2;
	uint32_t half = (cap - 1) / 2 ? (cap - 1) / 2 : 1;
	if (inst->signal_interval > half)
		inst->signal_interval = half;
	inst->depth = cap - 1;
}

static int check_odp(struct lmt_instance *inst)
{
	if (!inst->odp)
		return 0;
	if ((inst->odp_general & IBV_ODP_SUPPORT) && (inst->odp_rc & IBV_ODP_SUPPORT_WRITE))
		return 0;
	return verbs_error(inst, LMT_ENOTSUP,
	                   "verbs.odp=on: %s does not support on-demand paging for RC RDMA writes "
	                   "(ODP caps 0x%llx, RC caps 0x%llx); use verbs.odp=off",
	                   inst->device, (unsigned long long)inst->odp_general,
	                   (unsigned long long)inst->odp_rc);
}

static int set_nonblock(int fd)
{
	int flags = fcntl(fd, F_GETFL);
	return flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0 ? -1 : 0;
}

/* Create the protection domain, the completion channel and the CQ. */
static int open_queues(struct lmt_instance *inst)
{
	inst->pd = ibv_alloc_pd(inst->ctx);
	if (!inst->pd)
		return verbs_error(inst, LMT_EIO, "verbs: %s: ibv_alloc_pd failed (%s)",
		                   inst->device, strerror(errno));
	inst->comp = ibv_create_comp_channel(inst->ctx);
	if (!inst->comp)
		return verbs_error(inst, LMT_EIO, "verbs: %s: ibv_create_comp_channel failed (%s)",
		                   inst->device, strerror(errno));
	if (set_nonblock(inst->comp->fd) || set_nonblock(inst->ctx->async_fd))
		return verbs_error(inst, LMT_EIO,
		                   "verbs: %s: cannot make event channels "
		                   "non-blocking (%s)",
		                   inst->device, strerror(errno));
	int size = inst->role == LMT_ROLE_SOURCE ? (int)(inst->channels * (inst->depth + 1))
	                                         : (int)inst->channels;
	if (inst->max_cqe > 0 && size > inst->max_cqe)
		size = inst->max_cqe;
	inst->cq = ibv_create_cq(inst->ctx, size, NULL, inst->comp, 0);
	if (!inst->cq)
		return verbs_error(inst, LMT_EIO,
		                   "verbs: %s: ibv_create_cq of %d entries failed (%s)",
		                   inst->device, size, strerror(errno));
	return 0;
}

static void verbs_ep_close(lmt_endpoint *ep);

/* Release everything, whatever was opened; used on every exit path. */
static void free_instance(struct lmt_instance *inst)
{
	for (uint32_t c = 0; inst->eps && c < inst->channels; c++)
		if (inst->eps[c])
			verbs_ep_close(inst->eps[c]);
	while (inst->mrs) {
		struct lmt_mr *next = inst->mrs->next;
		int rc = ibv_dereg_mr(inst->mrs->mr);
		if (rc)
			verbs_log(inst, LMT_LOG_WARN, "verbs: ibv_dereg_mr failed (%s)",
			          strerror(rc));
		free(inst->mrs);
		inst->mrs = next;
	}
	while (inst->rkeys) {
		struct lmt_rkey *next = inst->rkeys->next;
		free(inst->rkeys);
		inst->rkeys = next;
	}
	if (inst->cq) {
		if (inst->unacked_events)
			ibv_ack_cq_events(inst->cq, inst->unacked_events);
		int rc = ibv_destroy_cq(inst->cq);
		if (rc)
			verbs_log(inst, LMT_LOG_WARN, "verbs: ibv_destroy_cq failed (%s)",
			          strerror(rc));
	}
	if (inst->comp && ibv_destroy_comp_channel(inst->comp))
		verbs_log(inst, LMT_LOG_WARN, "verbs: ibv_destroy_comp_channel failed");
	if (inst->pd) {
		int rc = ibv_dealloc_pd(inst->pd);
		if (rc)
			verbs_log(inst, LMT_LOG_WARN, "verbs: ibv_dealloc_pd failed (%s)",
			          strerror(rc));
	}
	if (inst->ctx && ibv_close_device(inst->ctx))
		verbs_log(inst, LMT_LOG_WARN, "verbs: ibv_close_device failed");
	pthread_mutex_destroy(&inst->mr_lock);
	free(inst->eps);
	free(inst->pending);
	free(inst);
}

static int verbs_instance_open(const struct lmt_host *host, void *host_ctx,
                               const struct lmt_instance_params *params, lmt_instance **out)
{
	if (!host || !out || !host->error)
		return -LMT_EINVAL;
	*out = NULL;
	if (host->struct_size < offsetof(struct lmt_host, cancelled) + sizeof(host->cancelled) ||
	    !host->log || !host->now_ns || !host->option || !host->cancelled)
		return host->error(host_ctx, LMT_EABI, "verbs: host services incomplete");
	if (!params || params->struct_size < offsetof(struct lmt_instance_params, peer_host) +
	                                             sizeof(params->peer_host))
		return host->error(host_ctx, LMT_EABI, "verbs: instance parameters too old");
	if (params->role != LMT_ROLE_SOURCE && params->role != LMT_ROLE_DESTINATION)
		return host->error(host_ctx, LMT_EINVAL, "verbs: unknown role %d",
		                   (int)params->role);
	if (params->channels == 0 || params->channels > VERBS_MAX_CHANNELS)
		return host->error(host_ctx, LMT_EINVAL, "verbs: %u channels, expected 1 to %u",
		                   params->channels, VERBS_MAX_CHANNELS);

	struct lmt_instance *inst = calloc(1, sizeof(*inst));
	if (!inst)
		return host->error(host_ctx, LMT_ENOMEM, "verbs: out of memory");
	inst->host = host;
	inst->host_ctx = host_ctx;
	inst->role = params->role;
	inst->channels = params->channels;
	inst->timeout_ns = params->timeout_ns;
	if (pthread_mutex_init(&inst->mr_lock, NULL)) {
		free(inst);
		return host->error(host_ctx, LMT_ENOMEM, "verbs: cannot create a lock");
	}
	char local[sizeof(params->local_host)];
	memcpy(local, params->local_host, sizeof(local));
	local[sizeof(local) - 1] = 0;
	const char *device;
	int port, gid_index;
	int rc = read_options(inst, &device, &port, &gid_index);
	if (rc == 0)
		rc = verbs_device_open(inst, device, port, gid_index, local);
	if (rc == 0 && (rc = check_odp(inst)) == 0) {
		size_queues(inst);
		rc = open_queues(inst);
	}
	if (rc == 0) {
		inst->eps = calloc(inst->channels, sizeof(*inst->eps));
		inst->pending_cap = inst->channels * (inst->depth + 1);
		inst->pending = calloc(inst->pending_cap, sizeof(*inst->pending));
		if (!inst->eps || !inst->pending)
			rc = verbs_error(inst, LMT_ENOMEM, "verbs: out of memory");
	}
	if (rc) {
		free_instance(inst);
		return rc;
	}
	verbs_log(inst, LMT_LOG_DEBUG, "verbs: %s instance, %u channels, depth %u, signal 1 in %u",
	          inst->role == LMT_ROLE_SOURCE ? "source" : "destination", inst->channels,
	          inst->depth, inst->signal_interval);
	*out = inst;
	return 0;
}

static void verbs_instance_close(lmt_instance *inst)
{
	if (inst)
		free_instance(inst);
}

/* ---- Endpoints: one RC queue pair per channel --------------------------- */

static uint32_t random_psn(struct lmt_instance *inst)
{
	uint32_t r;
	if (getrandom(&r, sizeof(r), GRND_NONBLOCK) != (ssize_t)sizeof(r))
		r = (uint32_t)inst->host->now_ns(inst->host_ctx) * 2654435761u;
	return r & 0xffffffu;
}

static int to_init(lmt_endpoint *ep)
{
	struct lmt_instance *inst = ep->inst;
	struct ibv_qp_attr a = {
	        .qp_state = IBV_QPS_INIT,
	        .pkey_index = 0,
	        .port_num = inst->port,
	        .qp_access_flags = inst->role == LMT_ROLE_DESTINATION ? IBV_ACCESS_REMOTE_WRITE : 0,
	};
	int rc = ibv_modify_qp(
	        ep->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
	if (rc)
		return verbs_error(inst, LMT_EIO,
		                   "verbs channel %u: queue pair to INIT failed (%s)", ep->channel,
		                   strerror(rc));
	return 0;
}

static int verbs_ep_open(lmt_instance *inst, uint32_t channel, lmt_endpoint **out,
                         struct lmt_blob *addr)
{
	if (!inst || !out || !addr)
		return -LMT_EINVAL;
	if (channel >= inst->channels)
		return verbs_error(inst, LMT_EINVAL, "verbs: channel %u out of range (%u channels)",
		                   channel, inst->channels);
	if (inst->eps[channel])
		return verbs_error(inst, LMT_ESTATE, "verbs channel %u: already open", channel);
	lmt_endpoint *ep = calloc(1, sizeof(*ep));
	if (!ep)
		return verbs_error(inst, LMT_ENOMEM, "verbs: out of memory");
	ep->inst = inst;
	ep->channel = channel;
	bool source = inst->role == LMT_ROLE_SOURCE;
	ep->sq_cap = source ? inst->depth + 1 : 1;
	ep->write_max = source ? inst->depth : 0;
	ep->ring = calloc(ep->sq_cap, sizeof(*ep->ring));
	if (!ep->ring) {
		free(ep);
		return verbs_error(inst, LMT_ENOMEM, "verbs: out of memory");
	}
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
	if (!ep->qp) {
		int rc = verbs_error(
		        inst, LMT_EIO,
		        "verbs channel %u: ibv_create_qp with %u send requests failed (%s)",
		        channel, ep->sq_cap, strerror(errno));
		free(ep->ring);
		free(ep);
		return rc;
	}
	int rc = to_init(ep);
	if (rc) {
		ibv_destroy_qp(ep->qp);
		free(ep->ring);
		free(ep);
		return rc;
	}
	ep->psn = random_psn(inst);
	struct verbs_addr a = {
	        .role = (uint8_t)inst->role,
	        .link = (uint8_t)inst->link,
	        .mtu = (uint8_t)inst->mtu,
	        .channel = channel,
	        .qpn = ep->qp->qp_num,
	        .psn = ep->psn,
	        .lid = inst->lid,
	};
	memcpy(a.gid, inst->gid.raw, 16);
	verbs_addr_encode(&a, addr);
	inst->eps[channel] = ep;
	*out = ep;
	return 0;
}

/* Check the peer's blob against this endpoint; NULL when it fits. */
static const char *peer_mismatch(const lmt_endpoint *ep, const struct verbs_addr *peer)
{
	const struct lmt_instance *inst = ep->inst;
	if (peer->role == (uint8_t)inst->role)
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
		return verbs_error(inst, LMT_EIO, "verbs channel %u: queue pair to RTR failed (%s)",
		                   ep->channel, strerror(rc));
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
		return verbs_error(inst, LMT_EIO, "verbs channel %u: queue pair to RTS failed (%s)",
		                   ep->channel, strerror(rc));
	return 0;
}

static int verbs_ep_connect(lmt_endpoint *ep, const struct lmt_blob *peer_addr)
{
	if (!ep || !peer_addr)
		return -LMT_EINVAL;
	struct lmt_instance *inst = ep->inst;
	if (ep->connected)
		return verbs_error(inst, LMT_ESTATE, "verbs channel %u: already connected",
		                   ep->channel);
	struct verbs_addr peer;
	const char *why = verbs_addr_decode(peer_addr, &peer);
	if (!why)
		why = peer_mismatch(ep, &peer);
	if (why)
		return verbs_error(inst, LMT_EPROTO,
		                   "verbs channel %u: bad peer address (%u bytes): %s", ep->channel,
		                   peer_addr->len, why);
	int rc = to_rtr_rts(ep, &peer);
	if (rc)
		return rc;
	ep->connected = true;
	verbs_log(inst, LMT_LOG_DEBUG, "verbs channel %u: QP %u connected to QP %u", ep->channel,
	          ep->qp->qp_num, peer.qpn);
	return 0;
}

static void verbs_ep_close(lmt_endpoint *ep)
{
	if (!ep)
		return;
	struct lmt_instance *inst = ep->inst;
	if (inst->eps[ep->channel] == ep)
		inst->eps[ep->channel] = NULL;
	int rc = ibv_destroy_qp(ep->qp);
	if (rc)
		verbs_log(inst, LMT_LOG_WARN, "verbs channel %u: ibv_destroy_qp failed (%s)",
		          ep->channel, strerror(rc));
	free(ep->ring);
	free(ep);
}

/* ---- Registrations ----------------------------------------------------- */

static int verbs_mr_register(lmt_instance *inst, void *addr, size_t len, uint32_t access,
                             lmt_mr **out, struct lmt_blob *key)
{
	if (!inst || !out)
		return -LMT_EINVAL;
	bool remote = access & LMT_MR_REMOTE_WRITE;
	if (!addr || !len || (remote && !key))
		return verbs_error(inst, LMT_EINVAL, "verbs: cannot register %zu bytes at %p%s",
		                   len, addr, remote && !key ? " without a key blob" : "");
	/* The source only reads what it registers: no write access, so
	 * pinning never breaks copy-on-write of guest memory. */
	unsigned flags = remote ? IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE : 0;
	if (inst->odp)
		flags |= IBV_ACCESS_ON_DEMAND;
	struct lmt_mr *mr = calloc(1, sizeof(*mr));
	if (!mr)
		return verbs_error(inst, LMT_ENOMEM, "verbs: out of memory");
	mr->mr = ibv_reg_mr_iova2(inst->pd, addr, len, (uintptr_t)addr, flags);
	if (!mr->mr) {
		int err = errno;
		free(mr);
		return verbs_error(inst, err == ENOMEM ? LMT_ENOMEM : LMT_EIO,
		                   "verbs: %s: ibv_reg_mr of %zu bytes at %p failed (%s)%s",
		                   inst->device, len, addr, strerror(err),
		                   err == ENOMEM || err == EPERM
		                           ? "; is RLIMIT_MEMLOCK (ulimit -l) large enough?"
		                           : "");
	}
	mr->addr = addr;
	mr->len = len;
	pthread_mutex_lock(&inst->mr_lock);
	mr->next = inst->mrs;
	if (inst->mrs)
		inst->mrs->prev = mr;
	inst->mrs = mr;
	pthread_mutex_unlock(&inst->mr_lock);
	if (remote)
		verbs_key_encode(&(struct verbs_key){.rkey = mr->mr->rkey,
		                                     .addr = (uintptr_t)addr,
		                                     .len = len},
		                 key);
	else if (key)
		key->len = 0;
	*out = mr;
	return 0;
}

static void verbs_mr_deregister(lmt_instance *inst, lmt_mr *mr)
{
	if (!inst || !mr)
		return;
	pthread_mutex_lock(&inst->mr_lock);
	if (mr->prev)
		mr->prev->next = mr->next;
	else if (inst->mrs == mr)
		inst->mrs = mr->next;
	if (mr->next)
		mr->next->prev = mr->prev;
	pthread_mutex_unlock(&inst->mr_lock);
	int rc = ibv_dereg_mr(mr->mr);
	if (rc)
		verbs_log(inst, LMT_LOG_WARN, "verbs: ibv_dereg_mr of %llu bytes failed (%s)",
		          (unsigned long long)mr->len, strerror(rc));
	free(mr);
}

static int verbs_rkey_import(lmt_instance *inst, const struct lmt_blob *key, lmt_rkey **out)
{
	if (!inst || !key || !out)
		return -LMT_EINVAL;
	struct verbs_key k;
	const char *why = verbs_key_decode(key, &k);
	if (why)
		return verbs_error(inst, LMT_EPROTO, "verbs: bad key blob (%u bytes): %s", key->len,
		                   why);
	struct lmt_rkey *rkey = calloc(1, sizeof(*rkey));
	if (!rkey)
		return verbs_error(inst, LMT_ENOMEM, "verbs: out of memory");
	rkey->rkey = k.rkey;
	rkey->addr = k.addr;
	rkey->len = k.len;
	pthread_mutex_lock(&inst->mr_lock);
	rkey->next = inst->rkeys;
	if (inst->rkeys)
		inst->rkeys->prev = rkey;
	inst->rkeys = rkey;
	pthread_mutex_unlock(&inst->mr_lock);
	*out = rkey;
	return 0;
}

static void verbs_rkey_release(lmt_instance *inst, lmt_rkey *rkey)
{
	if (!inst || !rkey)
		return;
	pthread_mutex_lock(&inst->mr_lock);
	if (rkey->prev)
		rkey->prev->next = rkey->next;
	else if (inst->rkeys == rkey)
		inst->rkeys = rkey->next;
	if (rkey->next)
		rkey->next->prev = rkey->prev;
	pthread_mutex_unlock(&inst->mr_lock);
	free(rkey);
}

static const struct lmt_plugin verbs_plugin = {
        .abi_version = LMT_PLUGIN_ABI_VERSION,
        .struct_size = sizeof(struct lmt_plugin),
        .name = "verbs",
        .version = LMT_VERSION,
        .description = "RDMA verbs (rdma-core): RC RDMA writes on InfiniBand and RoCE",
        .caps = LMT_CAP_ONE_SIDED | LMT_CAP_LOCAL_MR | LMT_CAP_PIN | LMT_CAP_MULTI_CHANNEL,
        .options = verbs_options,
        .option_count = sizeof(verbs_options) / sizeof(verbs_options[0]),
        .ops =
                {
                        .instance_open = verbs_instance_open,
                        .instance_close = verbs_instance_close,
                        .ep_open = verbs_ep_open,
                        .ep_connect = verbs_ep_connect,
                        .ep_close = verbs_ep_close,
                        .mr_register = verbs_mr_register,
                        .mr_deregister = verbs_mr_deregister,
                        .rkey_import = verbs_rkey_import,
                        .rkey_release = verbs_rkey_release,
                        .write = verbs_write,
                        .progress = verbs_progress,
                        .flush = verbs_flush,
                },
};

LMT_DECLARE_PLUGIN(verbs_plugin)
