/* The UCX plugin: descriptor, options, instances (one UCP context each)
 * and the ops that dispatch to the source and destination sides of a
 * channel. Each channel is one UCP worker with a thread of its own. Below
 * it: source.c and destination.c (the two ends of a channel), region.c
 * (registrations and peer keys), channel.c (a channel's worker, endpoint,
 * thread and notices), log_relay.c (UCX's log lines), wire.c (the
 * formats). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "channel.h"
#include "config.h"
#include "destination.h"
#include "instance.h"
#include "log_relay.h"
#include "region.h"
#include "source.h"

#define UCX_MAX_CHANNELS 256u
#define UCX_LIST_MAX 256u        /* longest ucx.tls or ucx.devices, with its NUL */

#include <lmt/version.h>

static const char *const ucx_transfer_names[] = {"auto", "am", "put", NULL};

static const struct lmt_option_desc ucx_options[] = {
        {.name = "tls",
         .type = LMT_OPT_STRING,
         .default_value = "",
         .doc = "UCX transports (UCX_TLS), '+' between several: tcp, sm, rc+sm; empty = UCX's "
                "own choice"},
        {.name = "devices",
         .type = LMT_OPT_STRING,
         .default_value = "",
         .doc = "UCX network devices (UCX_NET_DEVICES), '+' between several: eth0, "
                "mlx5_0:1+mlx5_1:1; empty = all"},
        {.name = "transfer",
         .type = LMT_OPT_ENUM,
         .default_value = "auto",
         .enum_values = ucx_transfer_names,
         .doc = "how writes move: put (one-sided RMA; the destination must say put too), am "
                "(active messages the destination places), auto (put over InfiniBand RC/DC "
                "only, when both sides have it)"},
        {.name = "test-bye-delay",
         .type = LMT_OPT_DURATION,
         .default_value = "0",
         .min = 0,
         .max = 10000000000,
         .doc = "TESTS ONLY: how long a destination's channel waits before it answers the "
                "source's goodbye, as one whose thread gets no core that long; 0 in real use"},
};

/* ---- Instances --------------------------------------------------------- */

static int read_options(struct lmt_instance *inst, ucp_config_t *config)
{
	static const struct {
		const char *option, *ucx;
	} passed[] = {{"ucx.tls", "TLS"}, {"ucx.devices", "NET_DEVICES"}};
	char tls[UCX_LIST_MAX] = "";
	for (size_t i = 0; i < sizeof(passed) / sizeof(passed[0]); i++) {
		const char *value = putil_option_text(&inst->base, passed[i].option, "");
		if (!value[0])
			continue;
		/* lmt option lists separate with ',', so UCX's lists take '+'
		 * here ("rc+sm"); no UCX transport or device name holds one. */
		char list[UCX_LIST_MAX];
		size_t len = strnlen(value, sizeof(list));
		if (len == sizeof(list))
			return putil_error(&inst->base, LMT_EINVAL,
			                   "%s: longer than %zu characters", passed[i].option,
			                   sizeof(list) - 1);
		for (size_t k = 0; k <= len; k++)
			list[k] = value[k] == '+' ? ',' : value[k];
		ucs_status_t st = ucp_config_modify(config, passed[i].ucx, list);
		if (st != UCS_OK)
			return putil_error(&inst->base, LMT_EINVAL, "%s: UCX refuses '%s' (%s)",
			                   passed[i].option, value, ucs_status_string(st));
		if (i == 0)
			memcpy(tls, list, len + 1);
	}
	if (!tls[0] && getenv("UCX_TLS"))
		snprintf(tls, sizeof(tls), "%s", getenv("UCX_TLS"));
	int rc = ucx_config_tune(inst, config, tls);
	if (rc)
		return rc;
	int transfer = putil_option_enum(&inst->base, "ucx.transfer", UCX_TRANSFER_AUTO);
	if (transfer > UCX_TRANSFER_PUT)
		return putil_error(&inst->base, LMT_EINVAL,
		                   "ucx.transfer: expected auto, am or put, got %d", transfer);
	inst->transfer = (enum ucx_transfer)transfer;
	return 0;
}

/* Whether UCX opened an InfiniBand RC or DC transport: the only ones here
 * whose puts land in memory UCX did not allocate without the target's
 * CPU (UCX 1.13 emulates puts over tcp and shared memory, see
 * docs/ucx.md). */
static bool opened_rdma(ucp_context_h context)
{
	char *text = NULL;
	size_t size = 0;
	bool rdma = false;
	FILE *f = open_memstream(&text, &size);
	if (!f)
		return false;
	ucp_context_print_info(context, f);
	fclose(f);
	for (const char *at = text; at && (at = strstr(at, "flags -- ")) != NULL;) {
		at += strlen("flags -- ");
		size_t len = strcspn(at, "/\n");
		if (len > 3 && (strncmp(at, "rc_", 3) == 0 || strncmp(at, "dc_", 3) == 0))
			rdma = true;
	}
	free(text);
	return rdma;
}

static int init_context(struct lmt_instance *inst, ucp_config_t *config, bool rma)
{
	ucp_params_t params = {
	        .field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED,
	        .features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP | (rma ? UCP_FEATURE_RMA : 0),
	        .mt_workers_shared = 1,
	};
	ucs_status_t st = ucp_init(&params, config, &inst->context);
	if (st == UCS_OK)
		return 0;
	inst->context = NULL;
	return putil_error(&inst->base, ucx_status_code(st),
	                   "ucx: cannot initialise UCP with tls '%s', devices '%s' (%s)",
	                   putil_option_text(&inst->base, "ucx.tls", ""),
	                   putil_option_text(&inst->base, "ucx.devices", ""),
	                   ucs_status_string(st));
}

/* UCP_FEATURE_RMA is turned on only where puts are used: with it, UCX 1.13
 * serves puts and gets that it emulates with messages over tcp and shared
 * memory (every transport here) to any peer that reaches a worker, and
 * its handlers write and read whatever address a message names, with no
 * rkey check (ucp_put_handler, ucp_get_req_handler in rma_sw.c). So a
 * source turns it on to put (ucx.transfer=put, or auto over RC or DC), a
 * destination to take puts (the same), and neither otherwise. */
static int open_context(struct lmt_instance *inst)
{
	ucp_config_t *config;
	ucs_status_t st = ucp_config_read(NULL, NULL, &config);
	if (st != UCS_OK)
		return putil_error(&inst->base, LMT_EIO,
		                   "ucx: cannot read UCX's configuration (%s)",
		                   ucs_status_string(st));
	int rc = read_options(inst, config);
	bool rma = inst->transfer == UCX_TRANSFER_PUT;
	if (!rc)
		rc = init_context(inst, config, rma);
	if (!rc && !rma && inst->transfer == UCX_TRANSFER_AUTO && opened_rdma(inst->context)) {
		/* What UCX opens is known only once it has a context. */
		ucp_cleanup(inst->context);
		rma = true;
		rc = init_context(inst, config, rma);
	}
	ucp_config_release(config);
	if (rc)
		return rc;
	inst->rma = rma;
	/* Tests only: a destination whose channels answer a goodbye this
	 * late, as ones whose threads have no core for a while. */
	if (inst->base.role == LMT_ROLE_DESTINATION)
		inst->test_bye_delay_ns =
		        (uint64_t)putil_option_int(&inst->base, "ucx.test-bye-delay", 0);
	inst->use_put = inst->base.role == LMT_ROLE_SOURCE && rma;
	return 0;
}

/* What a remote writer must hold, said once at setup; a warning where UCX's
 * RMA is on (docs/security.md). */
static void log_write_capability(struct lmt_instance *inst)
{
	bool destination = inst->base.role == LMT_ROLE_DESTINATION;
	if (destination && inst->rma)
		putil_log(&inst->base, LMT_LOG_WARN,
		          "ucx: this destination takes puts (ucx.transfer=%s): a put carries no "
		          "session token, over RDMA the NIC checks only the rkey, and over tcp or "
		          "shared memory UCX serves emulated puts and gets of any address to any "
		          "peer that reaches this worker; use ucx.transfer=am unless the fabric is "
		          "trusted (docs/security.md)",
		          inst->transfer == UCX_TRANSFER_PUT ? "put" : "auto, over RC or DC");
	else if (destination)
		putil_log(&inst->base, LMT_LOG_DEBUG,
		          "ucx: a remote write needs its channel's 64-bit token and a 64-bit region "
		          "id of this session; UCX's RMA is off");
	else if (inst->use_put)
		putil_log(&inst->base, LMT_LOG_WARN,
		          "ucx: this source puts (ucx.transfer=%s): UCX's RMA is on, and over tcp or "
		          "shared memory UCX serves emulated gets of any address of this process to "
		          "any peer that reaches its workers (docs/security.md)",
		          inst->transfer == UCX_TRANSFER_PUT ? "put" : "auto, over RC or DC");
}

static void ucx_ep_close(lmt_endpoint *ep);

static int ucx_instance_open(const struct lmt_host *host, void *host_ctx,
                             const struct lmt_instance_params *params, lmt_instance **out)
{
	if (!out)
		return -LMT_EINVAL;
	*out = NULL;
	int rc = putil_instance_check("ucx", host, host_ctx, params, UCX_MAX_CHANNELS);
	if (rc)
		return rc;
	struct lmt_instance *inst = calloc(1, sizeof(*inst));
	if (!inst)
		return host->error(host_ctx, LMT_ENOMEM, "ucx: out of memory"), -LMT_ENOMEM;
	putil_instance_init(&inst->base, "ucx", host, host_ctx, params);
	if ((rc = putil_channels_init(&inst->channels, &inst->base, UCX_QUEUE_DEPTH)))
		goto free_instance;
	if ((rc = putil_registry_init(&inst->registry, &inst->base, UINT64_MAX)))
		goto free_channels;
	/* UCX's messages while it reads its configuration reach the host too. */
	ucx_log_attach(inst);
	if ((rc = open_context(inst)))
		goto detach;
	log_write_capability(inst);
	putil_log(&inst->base, LMT_LOG_DEBUG, "ucx: %s instance, %u channels%s",
	          inst->base.role == LMT_ROLE_SOURCE ? "source" : "destination",
	          inst->base.channels,
	          inst->base.role == LMT_ROLE_DESTINATION ? ""
	          : inst->use_put                         ? ", writes as puts"
	                                                  : ", writes as active messages");
	*out = inst;
	return 0;

detach:
	ucx_log_detach(inst);
	putil_registry_fini(&inst->registry);
free_channels:
	putil_channels_fini(&inst->channels);
free_instance:
	free(inst);
	return rc;
}

static void ucx_instance_close(lmt_instance *inst)
{
	if (!inst)
		return;
	for (uint32_t c = 0; c < inst->channels.count; c++) {
		lmt_endpoint *ep = putil_channels_endpoint(&inst->channels, c);
		if (ep)
			ucx_ep_close(ep);
	}
	ucx_regions_release_all(inst);
	ucp_cleanup(inst->context);
	ucx_log_detach(inst);
	putil_registry_fini(&inst->registry);
	putil_channels_fini(&inst->channels);
	free(inst);
}

/* ---- Endpoints --------------------------------------------------------- */

static int ucx_ep_open(lmt_instance *inst, uint32_t channel, lmt_endpoint **out,
                       struct lmt_blob *addr)
{
	if (!inst || !out || !addr)
		return -LMT_EINVAL;
	int rc = putil_channels_check_open(&inst->channels, channel);
	if (rc)
		return rc;
	lmt_endpoint *ep = calloc(1, sizeof(*ep));
	if (!ep)
		return putil_error(&inst->base, LMT_ENOMEM, "ucx: out of memory");
	ep->inst = inst;
	ep->channel = channel;
	ep->efd = ep->reply_efd = -1;
	rc = inst->base.role == LMT_ROLE_SOURCE ? ucx_source_ep_open(ep, addr)
	                                        : ucx_dest_ep_open(ep, addr);
	if (rc) {
		free(ep);
		return rc;
	}
	putil_channels_attach(&inst->channels, channel, ep);
	*out = ep;
	return 0;
}

static int ucx_ep_connect(lmt_endpoint *ep, const struct lmt_blob *peer_addr)
{
	if (!ep || !peer_addr)
		return -LMT_EINVAL;
	if (ep->inst->base.role == LMT_ROLE_SOURCE)
		return ucx_source_ep_connect(ep, peer_addr);
	return ucx_dest_ep_connect(ep, peer_addr);
}

static void ucx_ep_close(lmt_endpoint *ep)
{
	if (!ep)
		return;
	struct lmt_instance *inst = ep->inst;
	/* Out of the table first: other channels' threads wake what is
	 * there, and this worker is about to go. */
	putil_channels_detach(&inst->channels, ep->channel);
	if (inst->base.role == LMT_ROLE_SOURCE)
		ucx_source_ep_close(ep);
	else
		ucx_dest_ep_close(ep);
	putil_channels_closed(&inst->channels, ep->channel);
	free(ep);
}

/* ---- Data path --------------------------------------------------------- */

static int ucx_write(lmt_endpoint *ep, const void *local, size_t len, lmt_mr *local_mr,
                     lmt_rkey *rkey, uint64_t offset, uint64_t cookie)
{
	if (!ep)
		return -LMT_EINVAL;
	struct lmt_instance *inst = ep->inst;
	int rc = putil_write_check(&inst->base, ep->channel, local, len, rkey != NULL,
	                           rkey ? rkey->key.len : 0, offset);
	if (rc)
		return rc;
	rc = putil_channels_admit(&inst->channels, ep->channel);
	if (!rc && !(rc = ucx_source_write(ep, local, len, rkey, offset, cookie)))
		putil_channels_posted(&inst->channels, ep->channel);
	return rc;
}

static int ucx_progress(lmt_instance *inst, struct lmt_completion *out, uint32_t max,
                        uint64_t timeout_ns)
{
	return inst ? putil_channels_progress(&inst->channels, out, max, timeout_ns) : -LMT_EINVAL;
}

/* A write completes once it is visible, so waiting for the completions is
 * the whole flush; the channel threads are woken first, so that a sleeping
 * one posts its last flush of puts at once. */
static int ucx_flush(lmt_instance *inst, uint64_t timeout_ns)
{
	if (!inst)
		return -LMT_EINVAL;
	for (uint32_t c = 0; inst->base.role == LMT_ROLE_SOURCE && c < inst->channels.count; c++) {
		lmt_endpoint *ep = putil_channels_endpoint(&inst->channels, c);
		if (ep)
			ucx_wake(ep);
	}
	return putil_channels_flush(&inst->channels, timeout_ns);
}

static const struct lmt_plugin ucx_plugin = {
        .abi_version = LMT_PLUGIN_ABI_VERSION,
        .struct_size = sizeof(struct lmt_plugin),
        .write_access =
                "a write message needs its channel's 64-bit random token, compared in "
                "constant time, and a 64-bit random region id; both reach the source only "
                "over the authenticated control connection, and any other message is "
                "dropped. UCX's RMA is off unless ucx.transfer=put (or auto over RC or DC) "
                "on both sides: then puts carry no token, over RDMA only the NIC's rkey "
                "guards them, and over tcp or shared memory UCX 1.13 serves emulated puts "
                "and gets of any address to any peer; the destination warns at setup.",
        .name = "ucx",
        .version = LMT_VERSION,
        .description = "UCX (UCP): puts over RDMA, active messages over tcp and shared memory",
        /* No LMT_CAP_TARGET_PROGRESS: the destination's channel threads
         * drive UCX themselves, and a core waiting in progress would not
         * read its control connection meanwhile (docs/ucx.md). */
        .caps = LMT_CAP_MULTI_CHANNEL,
        .options = ucx_options,
        .option_count = sizeof(ucx_options) / sizeof(ucx_options[0]),
        .ops =
                {
                        .instance_open = ucx_instance_open,
                        .instance_close = ucx_instance_close,
                        .ep_open = ucx_ep_open,
                        .ep_connect = ucx_ep_connect,
                        .ep_close = ucx_ep_close,
                        .mr_register = ucx_mr_register,
                        .mr_deregister = ucx_mr_deregister,
                        .rkey_import = ucx_rkey_import,
                        .rkey_release = ucx_rkey_release,
                        .write = ucx_write,
                        .progress = ucx_progress,
                        .flush = ucx_flush,
                },
};

LMT_DECLARE_PLUGIN(ucx_plugin)
