/* The libfabric plugin: descriptor, options, instances and the ops, which
 * dispatch to the parts below. Each channel is one RDM endpoint. Below it:
 * endpoint.c (endpoints and their threads), region.c (registrations),
 * source.c and destination.c (the two ends of a channel), provider.c (the
 * provider and the fabric), wire.c (the blobs). */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <rdma/fi_domain.h>

#include <lmt/version.h>

#include "endpoint.h"
#include "instance.h"
#include "conns.h"
#include "provider.h"
#include "region.h"
#include "source.h"

static const char *const lfi_completion_names[] = {"auto", "delivery", "fence", NULL};
static const char *const lfi_coalesce_names[] = {"auto", "on", "off", NULL};

static const struct lmt_option_desc lfi_options[] = {
        {.name = "provider",
         .type = LMT_OPT_STRING,
         .default_value = "",
         .flags = LMT_OPTF_MATCH,
         .doc = "libfabric provider: tcp (in libfabric 1.17 its native RDM, net), net or shm; "
                "ofi_rxm and ofi_rxd layerings are refused; empty = the first taken"},
        {.name = "domain",
         .type = LMT_OPT_STRING,
         .default_value = "",
         .doc = "libfabric domain (NIC or interface, e.g. mlx5_0 or lo); empty = the one "
                "that reaches the control connection's address"},
        {.name = "completion",
         .type = LMT_OPT_ENUM,
         .default_value = "auto",
         .enum_values = lfi_completion_names,
         .doc = "how a write is known to be visible: delivery = FI_DELIVERY_COMPLETE, fence = "
                "an ordered read after the writes, auto = delivery when the provider has it"},
        {.name = "coalesce",
         .type = LMT_OPT_ENUM,
         .default_value = "auto",
         .enum_values = lfi_coalesce_names,
         .doc = "the channel's thread posts every write, up to 1 MiB in flight, merged "
                "where contiguous under one key; auto = on for shm, whose target copies "
                "under a lock the sender spins on, and for net (tcp), which sends inside "
                "the post (source only)"},
        {.name = "mr-mode",
         .type = LMT_OPT_STRING,
         .default_value = "",
         .doc = "FI_MR_* modes offered to the provider, joined with '+' (local, virt_addr, "
                "allocated, prov_key, endpoint, raw); empty = all; a listed local is always "
                "honoured"},
};

/* ---- Options ----------------------------------------------------------- */

static const struct {
	const char *name;
	uint64_t mode;
} lfi_mode_names[] = {
        {"local", FI_MR_LOCAL},         {"virt_addr", FI_MR_VIRT_ADDR},
        {"allocated", FI_MR_ALLOCATED}, {"prov_key", FI_MR_PROV_KEY},
        {"endpoint", FI_MR_ENDPOINT},   {"raw", FI_MR_RAW},
};

static int parse_mr_mode(struct lmt_instance *inst, const char *text, struct lfi_choice *c)
{
	c->offer = LFI_MR_MODES;
	c->force_local = false;
	if (!text || !text[0])
		return 0;
	c->offer = 0;
	const char *p = text;
	while (*p) {
		size_t len = strcspn(p, "+|");
		const char *word = p;
		if (len > 6 && strncasecmp(word, "fi_mr_", 6) == 0) {
			word += 6;
			len -= 6;
		}
		uint64_t mode = 0;
		for (size_t i = 0; i < sizeof(lfi_mode_names) / sizeof(lfi_mode_names[0]); i++)
			if (strlen(lfi_mode_names[i].name) == len &&
			    strncasecmp(word, lfi_mode_names[i].name, len) == 0)
				mode = lfi_mode_names[i].mode;
		if (!mode)
			return putil_error(
			        &inst->base, LMT_EINVAL,
			        "ofi.mr-mode: unknown mode '%.*s' in '%s'; expected local, "
			        "virt_addr, allocated, prov_key, endpoint or raw, joined with "
			        "'+'",
			        (int)len, word, text);
		c->offer |= mode;
		p = word + len;
		if (*p)
			p++;
	}
	c->force_local = c->offer & FI_MR_LOCAL;
	return 0;
}

static int read_options(struct lmt_instance *inst, struct lfi_choice *c)
{
	const struct putil_instance *base = &inst->base;
	memset(c, 0, sizeof(*c));
	c->provider = putil_option_text(base, "ofi.provider", "");
	c->domain = putil_option_text(base, "ofi.domain", "");
	c->completion = putil_option_enum(base, "ofi.completion", LFI_COMPLETION_AUTO);
	if (c->completion > LFI_COMPLETION_FENCE)
		return putil_error(base, LMT_EINVAL, "ofi.completion: unknown value %d",
		                   c->completion);
	c->coalesce = putil_option_enum(base, "ofi.coalesce", LFI_COALESCE_AUTO);
	if (c->coalesce > LFI_COALESCE_OFF)
		return putil_error(base, LMT_EINVAL, "ofi.coalesce: unknown value %d", c->coalesce);
	return parse_mr_mode(inst, putil_option_text(base, "ofi.mr-mode", ""), c);
}

/* ---- Instances --------------------------------------------------------- */

static void log_instance(struct lmt_instance *inst)
{
	char modes[256];
	int mode = (int)inst->mr_mode;
	fi_tostr_r(modes, sizeof(modes), &mode, FI_TYPE_MR_MODE);
	putil_log(&inst->base, LMT_LOG_DEBUG,
	          "ofi: %s, provider %s, fabric %s, domain %s, mr_mode [%s], %s, %s CQs, "
	          "%u writes per channel%s",
	          inst->base.role == LMT_ROLE_SOURCE ? "source" : "destination",
	          inst->info->fabric_attr->prov_name, inst->info->fabric_attr->name,
	          inst->info->domain_attr->name, modes,
	          inst->visibility == LFI_DELIVERY ? "FI_DELIVERY_COMPLETE"
	          : inst->fence_flags              ? "fenced reads"
	                                           : "ordered reads",
	          inst->cq_wait ? "waiting" : "polled", inst->queue,
	          inst->coalesce ? ", coalesced" : "");
}

/* What a remote writer must hold to write into this destination's
 * registrations, said once at setup. An RDM endpoint takes RMA from any
 * peer that reaches it (libfabric 1.17's tcp, shm and verbs have no
 * auth_key), so a memory key is the whole credential: a warning where
 * that is weaker than a 64-bit key drawn by lmt (docs/security.md). */
static void log_write_capability(struct lmt_instance *inst)
{
	if (inst->base.role != LMT_ROLE_DESTINATION)
		return;
	const char *prov = inst->info->fabric_attr->prov_name;
	size_t size = inst->info->domain_attr->mr_key_size;
	if (!size || size > 8)
		size = 8;
	if (inst->mr_mode & (FI_MR_PROV_KEY | FI_MR_RAW))
		putil_log(&inst->base, LMT_LOG_WARN,
		          "ofi: provider %s picks its own %zu-byte memory keys (%s): any peer that "
		          "reaches this endpoint can write guest RAM with a key it guesses, and how "
		          "hard that is is the provider's (verbs: the NIC's 32-bit rkey); migrate "
		          "over a trusted fabric (docs/security.md)",
		          prov, size, inst->mr_mode & FI_MR_RAW ? "FI_MR_RAW" : "FI_MR_PROV_KEY");
	else if (size < 8)
		putil_log(&inst->base, LMT_LOG_WARN,
		          "ofi: provider %s has %zu-byte memory keys: lmt draws them at random, but "
		          "any peer that reaches this endpoint can try all 2^%zu of them; migrate "
		          "over a trusted fabric (docs/security.md)",
		          prov, size, 8 * size);
	else
		putil_log(&inst->base, LMT_LOG_DEBUG,
		          "ofi: a remote write needs a 64-bit random key of this session (provider "
		          "%s)",
		          prov);
}

static int lfi_instance_open(const struct lmt_host *host, void *host_ctx,
                             const struct lmt_instance_params *params, lmt_instance **out)
{
	if (!out)
		return -LMT_EINVAL;
	*out = NULL;
	int rc = putil_instance_check("ofi", host, host_ctx, params, LFI_MAX_CHANNELS);
	if (rc)
		return rc;
	struct lmt_instance *inst = calloc(1, sizeof(*inst));
	if (!inst)
		return host->error(host_ctx, LMT_ENOMEM, "ofi: out of memory"), -LMT_ENOMEM;
	putil_instance_init(&inst->base, "ofi", host, host_ctx, params);
	/* No region ids: the provider's keys name the regions. */
	if ((rc = putil_registry_init(&inst->registry, &inst->base, 0))) {
		free(inst);
		return rc;
	}
	struct lfi_choice choice;
	/* The channel table's depth is the provider's queue. */
	if ((rc = read_options(inst, &choice)) || (rc = lfi_provider_open(inst, &choice)) ||
	    (rc = putil_channels_init(&inst->channels, &inst->base, inst->queue))) {
		lfi_provider_close(inst);
		putil_registry_fini(&inst->registry);
		free(inst);
		return rc;
	}
	log_instance(inst);
	log_write_capability(inst);
	*out = inst;
	return 0;
}

static void lfi_ep_close(lmt_endpoint *ep);

static void lfi_instance_close(lmt_instance *inst)
{
	if (!inst)
		return;
	struct putil_channels *c = &inst->channels;
	/* Threads first: nothing may touch a registration while it goes. */
	for (uint32_t i = 0; i < c->count; i++) {
		lmt_endpoint *ep = putil_channels_endpoint(c, i);
		if (ep)
			lfi_endpoint_stop(ep);
	}
	lfi_regions_release_all(inst);
	for (uint32_t i = 0; i < c->count; i++) {
		lmt_endpoint *ep = putil_channels_endpoint(c, i);
		if (ep)
			lfi_ep_close(ep);
	}
	putil_channels_fini(c);
	lfi_provider_close(inst);
	/* Nothing of the provider's is left to hold them. */
	lfi_conns_close(inst);
	putil_registry_fini(&inst->registry);
	free(inst);
}

/* ---- Endpoints --------------------------------------------------------- */

static int lfi_ep_open(lmt_instance *inst, uint32_t channel, lmt_endpoint **out,
                       struct lmt_blob *addr)
{
	if (!inst || !out || !addr)
		return -LMT_EINVAL;
	int rc = putil_channels_check_open(&inst->channels, channel);
	if (!rc)
		rc = lfi_endpoint_open(inst, channel, out, addr);
	if (!rc)
		putil_channels_attach(&inst->channels, channel, *out);
	return rc;
}

static int lfi_ep_connect(lmt_endpoint *ep, const struct lmt_blob *peer_addr)
{
	if (!ep || !peer_addr)
		return -LMT_EINVAL;
	return lfi_endpoint_connect(ep, peer_addr);
}

static void lfi_ep_close(lmt_endpoint *ep)
{
	if (!ep)
		return;
	putil_channels_detach(&ep->inst->channels, ep->channel);
	lfi_endpoint_close(ep);
}

/* ---- Data path --------------------------------------------------------- */

static int check_write(lmt_endpoint *ep, const void *local, size_t len, lmt_rkey *rkey,
                       uint64_t offset)
{
	struct lmt_instance *inst = ep->inst;
	int rc = putil_write_check(&inst->base, ep->channel, local, len, rkey != NULL,
	                           rkey ? rkey->len : 0, offset);
	if (rc)
		return rc;
	if ((uint64_t)len > inst->max_msg)
		return putil_error(
		        &inst->base, LMT_EINVAL,
		        "ofi channel %u: write of %zu bytes, the provider's limit is %llu",
		        ep->channel, len, (unsigned long long)inst->max_msg);
	if (!ep->connected)
		return putil_error(&inst->base, LMT_ESTATE, "ofi channel %u: not connected",
		                   ep->channel);
	return 0;
}

static int lfi_write(lmt_endpoint *ep, const void *local, size_t len, lmt_mr *local_mr,
                     lmt_rkey *rkey, uint64_t offset, uint64_t cookie)
{
	if (!ep)
		return -LMT_EINVAL;
	int rc = check_write(ep, local, len, rkey, offset);
	return rc ? rc : lfi_source_write(ep, local, len, local_mr, rkey, offset, cookie);
}

static int lfi_progress(lmt_instance *inst, struct lmt_completion *out, uint32_t max,
                        uint64_t timeout_ns)
{
	if (!inst)
		return -LMT_EINVAL;
	/* After a failure, every write still owed is reported before the
	 * harvest, so that the failure comes right after the last one. */
	if (inst->base.role == LMT_ROLE_SOURCE)
		lfi_source_abandon_all(inst);
	return putil_channels_progress(&inst->channels, out, max, timeout_ns);
}

/* A write is reported only once visible, and the threads fence on their
 * own; waiting for the reports is the whole flush. */
static int lfi_flush(lmt_instance *inst, uint64_t timeout_ns)
{
	return inst ? putil_channels_flush(&inst->channels, timeout_ns) : -LMT_EINVAL;
}

static const struct lmt_plugin lfi_plugin = {
        .abi_version = LMT_PLUGIN_ABI_VERSION,
        .struct_size = sizeof(struct lmt_plugin),
        .write_access =
                "a write needs a memory key of this session: FI_EP_RDM takes RMA from any "
                "peer that reaches the endpoint, and libfabric 1.17's net and shm ignore or "
                "refuse auth_key, so the key is the whole credential. net (ofi.provider=tcp) "
                "and shm (no FI_MR_PROV_KEY): keys drawn by lmt from getrandom over "
                "mr_key_size, 64-bit; over net a source's endpoints take no connection, a "
                "destination's none once its source is in (guest RAM is registered after). "
                "A provider with FI_MR_PROV_KEY or FI_MR_RAW: the provider's keys, "
                "guessable; keys under 8 bytes likewise; the destination warns at setup.",
        .name = "ofi",
        .version = LMT_VERSION,
        .description = "libfabric RMA writes over net (tcp) and shm",
        .caps = LMT_CAP_LOCAL_MR | LMT_CAP_PIN | LMT_CAP_MULTI_CHANNEL | LMT_CAP_TARGET_PROGRESS |
                LMT_CAP_MERGES_RUNS,
        .options = lfi_options,
        .option_count = sizeof(lfi_options) / sizeof(lfi_options[0]),
        .ops =
                {
                        .instance_open = lfi_instance_open,
                        .instance_close = lfi_instance_close,
                        .ep_open = lfi_ep_open,
                        .ep_connect = lfi_ep_connect,
                        .ep_close = lfi_ep_close,
                        .mr_register = lfi_mr_register,
                        .mr_deregister = lfi_mr_deregister,
                        .rkey_import = lfi_rkey_import,
                        .rkey_release = lfi_rkey_release,
                        .write = lfi_write,
                        .progress = lfi_progress,
                        .flush = lfi_flush,
                },
};

LMT_DECLARE_PLUGIN(lfi_plugin)
