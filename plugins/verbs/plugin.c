/* The verbs plugin (rdma-core): descriptor, options, instances (device, PD
 * and CQ) and the ops that dispatch to the files below. Each channel is one
 * RC queue pair. Below it: port.c (device, port and GID), endpoint.c (queue
 * pairs), region.c (registrations), source.c and destination.c (the data
 * path of each end), events.c (completions and asynchronous events),
 * wire.c (the blobs). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>

#include <lmt/version.h>

#include "destination.h"
#include "endpoint.h"
#include "instance.h"
#include "port.h"
#include "region.h"
#include "source.h"

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
	const struct putil_instance *base = &inst->base;
	int64_t depth = putil_option_int(base, "queue-depth", VERBS_DEFAULT_DEPTH);
	inst->depth = depth >= 1 && depth <= 65536 ? (uint32_t)depth : VERBS_DEFAULT_DEPTH;
	int64_t signal = putil_option_int(base, "verbs.signal-interval", VERBS_DEFAULT_SIGNAL);
	inst->signal_interval =
	        signal >= 1 && signal <= 4096 ? (uint32_t)signal : VERBS_DEFAULT_SIGNAL;
	inst->odp = putil_option_bool(base, "verbs.odp", false);
	*device = putil_option_text(base, "verbs.device", "");
	int64_t v = putil_option_int(base, "verbs.port", 0);
	if (v < 0 || v > 255)
		return putil_error(base, LMT_EINVAL, "verbs.port: expected 0 to 255, got %lld",
		                   (long long)v);
	*port = (int)v;
	v = putil_option_int(base, "verbs.gid-index", -1);
	if (v < -1 || v > 4095)
		return putil_error(base, LMT_EINVAL,
		                   "verbs.gid-index: expected -1 to 4095, got %lld", (long long)v);
	*gid_index = (int)v;
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
	return putil_error(&inst->base, LMT_ENOTSUP,
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
	const struct putil_instance *base = &inst->base;
	inst->pd = ibv_alloc_pd(inst->ctx);
	if (!inst->pd)
		return putil_error(base, LMT_EIO, "verbs: %s: ibv_alloc_pd failed (%s)",
		                   inst->device, strerror(errno));
	inst->comp = ibv_create_comp_channel(inst->ctx);
	if (!inst->comp)
		return putil_error(base, LMT_EIO, "verbs: %s: ibv_create_comp_channel failed (%s)",
		                   inst->device, strerror(errno));
	if (set_nonblock(inst->comp->fd) || set_nonblock(inst->ctx->async_fd))
		return putil_error(base, LMT_EIO,
		                   "verbs: %s: cannot make event channels non-blocking (%s)",
		                   inst->device, strerror(errno));
	int size = base->role == LMT_ROLE_SOURCE ? (int)(base->channels * (inst->depth + 1))
	                                         : (int)base->channels;
	if (inst->max_cqe > 0 && size > inst->max_cqe)
		size = inst->max_cqe;
	inst->cq = ibv_create_cq(inst->ctx, size, NULL, inst->comp, 0);
	if (!inst->cq)
		return putil_error(base, LMT_EIO,
		                   "verbs: %s: ibv_create_cq of %d entries failed (%s)",
		                   inst->device, size, strerror(errno));
	return 0;
}

/* Release everything, whatever was opened; used on every exit path. */
static void free_instance(struct lmt_instance *inst)
{
	const struct putil_instance *base = &inst->base;
	for (uint32_t c = 0; c < inst->channels.count; c++)
		verbs_ep_close(putil_channels_endpoint(&inst->channels, c));
	verbs_regions_release_all(inst);
	if (inst->cq) {
		if (inst->unacked_events)
			ibv_ack_cq_events(inst->cq, inst->unacked_events);
		int rc = ibv_destroy_cq(inst->cq);
		if (rc)
			putil_log(base, LMT_LOG_WARN, "verbs: ibv_destroy_cq failed (%s)",
			          strerror(rc));
	}
	if (inst->comp && ibv_destroy_comp_channel(inst->comp))
		putil_log(base, LMT_LOG_WARN, "verbs: ibv_destroy_comp_channel failed");
	if (inst->pd) {
		int rc = ibv_dealloc_pd(inst->pd);
		if (rc)
			putil_log(base, LMT_LOG_WARN, "verbs: ibv_dealloc_pd failed (%s)",
			          strerror(rc));
	}
	if (inst->ctx && ibv_close_device(inst->ctx))
		putil_log(base, LMT_LOG_WARN, "verbs: ibv_close_device failed");
	putil_channels_fini(&inst->channels);
	putil_registry_fini(&inst->registry);
	free(inst);
}

/* Everything but the base and the registry, which free_instance needs. */
static int open_instance(struct lmt_instance *inst)
{
	const char *device = "";
	int port = 0, gid_index = -1;
	int rc = read_options(inst, &device, &port, &gid_index);
	if (rc || (rc = verbs_port_open(inst, device, port, gid_index)) || (rc = check_odp(inst)))
		return rc;
	size_queues(inst);
	if ((rc = open_queues(inst)))
		return rc;
	rc = putil_channels_init(&inst->channels, &inst->base, inst->depth);
	if (rc) /* a failed init leaves freed pointers that free_instance must not see */
		inst->channels = (struct putil_channels){.count = 0};
	return rc;
}

static int verbs_instance_open(const struct lmt_host *host, void *host_ctx,
                               const struct lmt_instance_params *params, lmt_instance **out)
{
	if (!out)
		return -LMT_EINVAL;
	*out = NULL;
	int rc = putil_instance_check("verbs", host, host_ctx, params, VERBS_MAX_CHANNELS);
	if (rc)
		return rc;
	struct lmt_instance *inst = calloc(1, sizeof(*inst));
	if (!inst)
		return host->error(host_ctx, LMT_ENOMEM, "verbs: out of memory"), -LMT_ENOMEM;
	putil_instance_init(&inst->base, "verbs", host, host_ctx, params);
	if ((rc = putil_registry_init(&inst->registry, &inst->base, 0))) {
		free(inst);
		return rc;
	}
	if ((rc = open_instance(inst))) {
		free_instance(inst);
		return rc;
	}
	/* What a remote writer must hold (docs/security.md): the NIC's key,
	 * which lmt cannot make stronger. */
	if (params->role == LMT_ROLE_DESTINATION)
		putil_log(&inst->base, LMT_LOG_WARN,
		          "verbs: a write into guest RAM is authorised by the NIC's 32-bit rkey on "
		          "a connected RC queue pair, which takes packets only from the source's "
		          "QP (QPN and a random 24-bit PSN) but does not authenticate them: a host "
		          "that can inject packets on the fabric and learns or guesses those can "
		          "write; migrate over a trusted fabric (docs/security.md)");
	putil_log(&inst->base, LMT_LOG_DEBUG,
	          "verbs: %s instance, %u channels, depth %u, signal 1 in %u",
	          params->role == LMT_ROLE_SOURCE ? "source" : "destination", params->channels,
	          inst->depth, inst->signal_interval);
	*out = inst;
	return 0;
}

static void verbs_instance_close(lmt_instance *inst)
{
	if (inst)
		free_instance(inst);
}

/* ---- Data path --------------------------------------------------------- */

static int verbs_write(lmt_endpoint *ep, const void *local, size_t len, lmt_mr *local_mr,
                       lmt_rkey *rkey, uint64_t offset, uint64_t cookie)
{
	if (!ep)
		return -LMT_EINVAL;
	int rc = putil_write_check(&ep->inst->base, ep->channel, local, len, rkey != NULL,
	                           rkey ? rkey->len : 0, offset);
	return rc ? rc : verbs_source_write(ep, local, len, local_mr, rkey, offset, cookie);
}

static int verbs_progress(lmt_instance *inst, struct lmt_completion *out, uint32_t max,
                          uint64_t timeout_ns)
{
	if (!inst || (!out && max))
		return -LMT_EINVAL;
	if (inst->base.role == LMT_ROLE_SOURCE)
		return verbs_source_progress(inst, out, max, timeout_ns);
	return verbs_dest_progress(inst, max, timeout_ns);
}

/* The destination has nothing to flush: the source's writes complete
 * only once visible there. */
static int verbs_flush(lmt_instance *inst, uint64_t timeout_ns)
{
	if (!inst)
		return -LMT_EINVAL;
	if (inst->base.role == LMT_ROLE_SOURCE)
		return verbs_source_flush(inst, timeout_ns);
	return putil_channels_failing(&inst->channels);
}

static const struct lmt_plugin verbs_plugin = {
        .abi_version = LMT_PLUGIN_ABI_VERSION,
        .struct_size = sizeof(struct lmt_plugin),
        .write_access =
                "a write needs the NIC's 32-bit rkey and must arrive on the channel's "
                "connected RC queue pair (the source's QPN, a random 24-bit PSN); packets "
                "are not authenticated, so a host that can inject on the fabric and learns "
                "or guesses those can write; the destination warns at setup. Use a "
                "dedicated partition or VLAN.",
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
