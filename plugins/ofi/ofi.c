/* The libfabric plugin: descriptor, options, provider choice, instances,
 * progress and flush. Endpoints are in endpoint.c, registrations in mr.c. */
#define _GNU_SOURCE
#include "ofi.h"
#include "net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <rdma/fi_errno.h>

#include <lmt/version.h>

static const char *const ofi_completion_names[] = {"auto", "delivery", "fence", NULL};
static const char *const ofi_coalesce_names[] = {"auto", "on", "off", NULL};

enum ofi_coalesce_option {
	OFI_COALESCE_AUTO = 0,
	OFI_COALESCE_ON = 1,
	OFI_COALESCE_OFF = 2,
};

enum ofi_completion_option {
	OFI_COMPLETION_AUTO = 0,
	OFI_COMPLETION_DELIVERY = 1,
	OFI_COMPLETION_FENCE = 2,
};

static const struct lmt_option_desc ofi_options[] = {
        {.name = "provider",
         .type = LMT_OPT_STRING,
         .default_value = "",
         .flags = LMT_OPTF_MATCH,
         .doc = "libfabric provider (tcp, shm, verbs, or a layering such as tcp;ofi_rxm); "
                "empty = the best available"},
        {.name = "domain",
         .type = LMT_OPT_STRING,
         .default_value = "",
         .doc = "libfabric domain (NIC or interface, e.g. mlx5_0 or lo); empty = the one "
                "that reaches the control connection's address"},
        {.name = "completion",
         .type = LMT_OPT_ENUM,
         .default_value = "auto",
         .enum_values = ofi_completion_names,
         .doc = "how a write is known to be visible: delivery = FI_DELIVERY_COMPLETE, fence = "
                "an ordered read after the writes, auto = delivery when the provider has it"},
        {.name = "coalesce",
         .type = LMT_OPT_ENUM,
         .default_value = "auto",
         .enum_values = ofi_coalesce_names,
         .doc = "while a channel has 1 MiB in flight, hold back writes under the same key "
                "and post them merged where contiguous; auto = on for shm, whose target "
                "copies under a lock the sender spins on (source only)"},
        {.name = "mr-mode",
         .type = LMT_OPT_STRING,
         .default_value = "",
         .doc = "FI_MR_* modes offered to the provider, joined with '+' (local, virt_addr, "
                "allocated, prov_key, endpoint, raw); empty = all; a listed local is always "
                "honoured"},
};

/* ---- Helpers for the other files -------------------------------------- */

void ofi_report(lmt_endpoint *ep, uint64_t cookie, int status)
{
	struct lmt_instance *inst = ep->inst;
	pthread_mutex_lock(&inst->lock);
	/* Never full: a write is refused while its channel has `queue`
	 * completions unharvested. */
	lmt__cq_push(&inst->cq, cookie, status, ep->channel);
	ep->reported++;
	pthread_cond_broadcast(&inst->cond);
	pthread_mutex_unlock(&inst->lock);
}

void ofi_fail(struct lmt_instance *inst, int code)
{
	pthread_mutex_lock(&inst->lock);
	if (inst->role == LMT_ROLE_SOURCE && !inst->failing)
		inst->failing = code;
	if (inst->role == LMT_ROLE_DESTINATION && !inst->fatal)
		inst->fatal = code;
	pthread_cond_broadcast(&inst->cond);
	pthread_mutex_unlock(&inst->lock);
}

int ofi_code(int fi_err)
{
	switch (fi_err) {
	case FI_ECONNREFUSED:
	case FI_ECONNRESET:
	case FI_ECONNABORTED:
	case FI_ENOTCONN:
	case FI_EHOSTUNREACH:
	case FI_ENETDOWN:
	case FI_ENETUNREACH:
	case FI_ESHUTDOWN:
	case FI_EADDRNOTAVAIL:
		return LMT_ECONN;
	case FI_ETIMEDOUT:
		return LMT_ETIMEDOUT;
	case FI_ECANCELED:
		return LMT_ECANCELED;
	case FI_ENOMEM:
		return LMT_ENOMEM;
	case FI_ENOSYS:
	case FI_EOPNOTSUPP:
		return LMT_ENOTSUP;
	default:
		return LMT_EIO;
	}
}

void ofi_close_fid(lmt_instance *inst, struct fid *fid, const char *what)
{
	if (!fid)
		return;
	int rc = fi_close(fid);
	if (rc)
		ofi_log(inst, LMT_LOG_WARN, "ofi: closing %s: %s", what, fi_strerror(-rc));
}

/* ---- Options and the provider ----------------------------------------- */

struct ofi_choice {
	const char *provider;
	const char *domain;
	int completion; /* enum ofi_completion_option */
	int coalesce;   /* enum ofi_coalesce_option */
	uint64_t offer; /* FI_MR_* modes offered */
	bool force_local;
};

static const struct {
	const char *name;
	uint64_t mode;
} ofi_mode_names[] = {
        {"local", FI_MR_LOCAL},         {"virt_addr", FI_MR_VIRT_ADDR},
        {"allocated", FI_MR_ALLOCATED}, {"prov_key", FI_MR_PROV_KEY},
        {"endpoint", FI_MR_ENDPOINT},   {"raw", FI_MR_RAW},
};

static int parse_mr_mode(struct lmt_instance *inst, const char *text, struct ofi_choice *c)
{
	c->offer = OFI_MR_MODES;
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
		for (size_t i = 0; i < sizeof(ofi_mode_names) / sizeof(ofi_mode_names[0]); i++)
			if (strlen(ofi_mode_names[i].name) == len &&
			    strncasecmp(word, ofi_mode_names[i].name, len) == 0)
				mode = ofi_mode_names[i].mode;
		if (!mode)
			return ofi_error(
			        inst, LMT_EINVAL,
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

static int read_options(struct lmt_instance *inst, struct ofi_choice *c)
{
	const struct lmt_host *host = inst->host;
	struct lmt_option_value v;
	memset(c, 0, sizeof(*c));
	c->provider = "";
	c->domain = "";
	if (host->option(inst->host_ctx, "ofi.provider", &v) == 0 && v.type == LMT_OPT_STRING &&
	    v.text)
		c->provider = v.text;
	if (host->option(inst->host_ctx, "ofi.domain", &v) == 0 && v.type == LMT_OPT_STRING &&
	    v.text)
		c->domain = v.text;
	if (host->option(inst->host_ctx, "ofi.completion", &v) == 0 && v.type == LMT_OPT_ENUM) {
		if (v.integer < OFI_COMPLETION_AUTO || v.integer > OFI_COMPLETION_FENCE)
			return ofi_error(inst, LMT_EINVAL, "ofi.completion: unknown value %lld",
			                 (long long)v.integer);
		c->completion = (int)v.integer;
	}
	if (host->option(inst->host_ctx, "ofi.coalesce", &v) == 0 && v.type == LMT_OPT_ENUM) {
		if (v.integer < OFI_COALESCE_AUTO || v.integer > OFI_COALESCE_OFF)
			return ofi_error(inst, LMT_EINVAL, "ofi.coalesce: unknown value %lld",
			                 (long long)v.integer);
		c->coalesce = (int)v.integer;
	}
	const char *modes = "";
	if (host->option(inst->host_ctx, "ofi.mr-mode", &v) == 0 && v.type == LMT_OPT_STRING &&
	    v.text)
		modes = v.text;
	return parse_mr_mode(inst, modes, c);
}

/* How visibility is obtained: with FI_DELIVERY_COMPLETE, or with a read
 * ordered behind the writes by FI_ORDER_RAW, or by FI_FENCE. */
enum ofi_variant {
	OFI_VARIANT_DELIVERY = 0,
	OFI_VARIANT_ORDERED_READ = 1,
	OFI_VARIANT_FENCED_READ = 2,
	OFI_VARIANT_BASIC = 3, /* only what every variant needs, for diagnosis */
};

static struct fi_info *make_hints(const struct ofi_choice *c, enum ofi_variant variant,
                                  uint64_t offer, bool with_provider, bool with_domain)
{
	struct fi_info *h = fi_allocinfo();
	if (!h)
		return NULL;
	h->ep_attr->type = FI_EP_RDM;
	h->caps = FI_RMA | FI_MSG;
	h->mode = FI_CONTEXT | FI_CONTEXT2;
	h->addr_format = FI_FORMAT_UNSPEC;
	h->domain_attr->mr_mode = (int)offer;
	h->domain_attr->threading = FI_THREAD_SAFE;
	if (variant == OFI_VARIANT_DELIVERY)
		h->tx_attr->op_flags = FI_DELIVERY_COMPLETE;
	if (variant == OFI_VARIANT_ORDERED_READ)
		h->tx_attr->msg_order = FI_ORDER_RAW;
	if (variant == OFI_VARIANT_FENCED_READ)
		h->caps |= FI_FENCE;
	if (with_provider && c->provider[0] && !(h->fabric_attr->prov_name = strdup(c->provider)))
		goto fail;
	if (with_domain && c->domain[0] && !(h->domain_attr->name = strdup(c->domain)))
		goto fail;
	return h;
fail:
	fi_freeinfo(h);
	return NULL;
}

/* ofi_rxm preposts FI_OFI_RXM_MSG_RX_SIZE receive buffers (default 128) of
 * FI_OFI_RXM_BUFFER_SIZE for messages on every connection it makes. lmt
 * sends it none (writes are RMA; control goes over the core's connection),
 * and with the default, setting a channel up over tcp;ofi_rxm took 70–90 ms
 * here against about 20 ms with 64. libfabric reads its parameters from
 * the environment once, at its first fi_getinfo in the process, so the
 * plugin sets a default there unless the user set one (setenv never
 * overwrites it); a program that used libfabric before keeps its own. */
#define OFI_RXM_MSG_RX_SIZE "64"

static void default_environment(void)
{
	setenv("FI_OFI_RXM_MSG_RX_SIZE", OFI_RXM_MSG_RX_SIZE, 0);
}

static pthread_once_t environment_once = PTHREAD_ONCE_INIT;

/* fi_getinfo for one variant: 0, -FI_ENODATA, or another -FI_E*. Some
 * providers (tcp;ofi_rxm) ignore the domain in the hints, so the entries of
 * other domains are dropped here. */
static int query(const struct ofi_choice *c, enum ofi_variant variant, uint64_t offer,
                 bool with_provider, bool with_domain, struct fi_info **out)
{
	*out = NULL;
	struct fi_info *hints = make_hints(c, variant, offer, with_provider, with_domain);
	if (!hints)
		return -FI_ENOMEM;
	pthread_once(&environment_once, default_environment);
	int rc = fi_getinfo(OFI_API_VERSION, NULL, NULL, 0, hints, out);
	fi_freeinfo(hints);
	if (rc || !with_domain || !c->domain[0])
		return rc;
	struct fi_info **link = out;
	while (*link) {
		struct fi_info *i = *link;
		if (i->domain_attr->name && strcmp(i->domain_attr->name, c->domain) == 0) {
			link = &i->next;
			continue;
		}
		*link = i->next;
		i->next = NULL;
		fi_freeinfo(i);
	}
	return *out ? 0 : -FI_ENODATA;
}

/* The distinct provider or domain names of a list, comma-separated. */
static void list_names(const struct fi_info *list, bool domains, char *buf, size_t size)
{
	size_t used = 0;
	buf[0] = 0;
	for (const struct fi_info *i = list; i; i = i->next) {
		const char *name = domains ? i->domain_attr->name : i->fabric_attr->prov_name;
		bool seen = !name;
		for (const struct fi_info *j = list; j != i && !seen; j = j->next)
			seen = strcmp(domains ? j->domain_attr->name : j->fabric_attr->prov_name,
			              name) == 0;
		if (seen)
			continue;
		int n = snprintf(buf + used, size - used, "%s%s", used ? ", " : "", name);
		if (n < 0 || (size_t)n >= size - used)
			break;
		used += (size_t)n;
	}
	if (!used)
		snprintf(buf, size, "none");
}

/* Every mode a provider may ask for, to learn what one that answers
 * nothing would want. */
#define OFI_MR_ANY (OFI_MR_MODES | FI_MR_MMU_NOTIFY | FI_MR_RMA_EVENT | FI_MR_HMEM)

/* A provider that exists but wants modes not offered: say which. */
static int explain_modes(struct lmt_instance *inst, const struct ofi_choice *c)
{
	struct fi_info *list;
	if (query(c, OFI_VARIANT_BASIC, OFI_MR_ANY, true, true, &list))
		return 0;
	char text[256];
	int missing = (int)((uint64_t)list->domain_attr->mr_mode & ~c->offer);
	fi_tostr_r(text, sizeof(text), &missing, FI_TYPE_MR_MODE);
	fi_freeinfo(list);
	return ofi_error(inst, LMT_ENOTSUP,
	                 "ofi.provider=%s: needs memory-registration modes %s (%s)",
	                 c->provider[0] ? c->provider : "(any)",
	                 missing & ~(int)OFI_MR_MODES ? "that lmt does not honour"
	                                              : "that ofi.mr-mode does not offer",
	                 text);
}

/* Whether any provider answers basic hints with these modes offered. */
static bool answers(const struct ofi_choice *c, uint64_t offer, bool with_domain)
{
	struct fi_info *list;
	int rc = query(c, OFI_VARIANT_BASIC, offer, true, with_domain, &list);
	fi_freeinfo(list);
	return rc == 0;
}

/* Nothing matched: say which of provider, domain, modes or completion is
 * why. */
static int explain(struct lmt_instance *inst, const struct ofi_choice *c)
{
	char names[512];
	struct fi_info *list;
	int rc = query(c, OFI_VARIANT_BASIC, OFI_MR_MODES, false, false, &list);
	if (rc && rc != -FI_ENODATA)
		return ofi_error(inst, LMT_EIO, "ofi: fi_getinfo: %s", fi_strerror(-rc));
	list_names(list, false, names, sizeof(names));
	fi_freeinfo(list);
	if (!c->provider[0] && rc == -FI_ENODATA)
		return ofi_error(inst, LMT_ENOTFOUND,
		                 "ofi: no libfabric provider offers reliable RMA endpoints "
		                 "(FI_EP_RDM, FI_RMA, thread-safe)");
	if (c->provider[0] && !answers(c, OFI_MR_ANY, false))
		return ofi_error(inst, LMT_ENOTFOUND,
		                 "ofi.provider=%s: not available; providers: %s", c->provider,
		                 names);
	if (c->domain[0] && !answers(c, OFI_MR_ANY, true)) {
		rc = query(c, OFI_VARIANT_BASIC, OFI_MR_ANY, true, false, &list);
		list_names(rc ? NULL : list, true, names, sizeof(names));
		fi_freeinfo(list);
		return ofi_error(inst, LMT_ENOTFOUND,
		                 "ofi.domain=%s: not available%s%s; domains: %s", c->domain,
		                 c->provider[0] ? " with provider " : "", c->provider, names);
	}
	if (!answers(c, c->offer, true) && (rc = explain_modes(inst, c)))
		return rc;
	return ofi_error(inst, LMT_ENOTSUP, "ofi: provider %s offers %s",
	                 c->provider[0] ? c->provider : "(any)",
	                 c->completion == OFI_COMPLETION_DELIVERY
	                         ? "no FI_DELIVERY_COMPLETE (ofi.completion=delivery)"
	                         : "neither FI_DELIVERY_COMPLETE nor reads ordered after writes");
}

/* Whether `i` is bound to the numeric address `host`. */
static bool has_source(const struct fi_info *i, const char *host)
{
	struct in6_addr a6;
	struct in_addr a4;
	if (!i->src_addr || !host[0])
		return false;
	const struct sockaddr *sa = i->src_addr;
	if (sa->sa_family == AF_INET && i->src_addrlen >= sizeof(struct sockaddr_in) &&
	    inet_pton(AF_INET, host, &a4) == 1)
		return memcmp(&((const struct sockaddr_in *)sa)->sin_addr, &a4, sizeof(a4)) == 0;
	if (sa->sa_family == AF_INET6 && i->src_addrlen >= sizeof(struct sockaddr_in6) &&
	    inet_pton(AF_INET6, host, &a6) == 1)
		return memcmp(&((const struct sockaddr_in6 *)sa)->sin6_addr, &a6, sizeof(a6)) == 0;
	return false;
}

static int choose_provider(struct lmt_instance *inst, const struct ofi_choice *c,
                           const char *local_host)
{
	static const enum ofi_variant order[3][3] = {
	        [OFI_COMPLETION_AUTO] = {OFI_VARIANT_DELIVERY, OFI_VARIANT_ORDERED_READ,
	                                 OFI_VARIANT_FENCED_READ},
	        [OFI_COMPLETION_DELIVERY] = {OFI_VARIANT_DELIVERY, OFI_VARIANT_DELIVERY,
	                                     OFI_VARIANT_DELIVERY},
	        [OFI_COMPLETION_FENCE] = {OFI_VARIANT_ORDERED_READ, OFI_VARIANT_FENCED_READ,
	                                  OFI_VARIANT_FENCED_READ},
	};
	struct fi_info *list = NULL;
	enum ofi_variant variant = OFI_VARIANT_DELIVERY;
	int rc = -FI_ENODATA;
	for (int i = 0; i < 3 && rc == -FI_ENODATA; i++) {
		variant = order[c->completion][i];
		rc = query(c, variant, c->offer, true, true, &list);
	}
	if (rc == -FI_ENODATA)
		return explain(inst, c);
	if (rc)
		return ofi_error(inst, rc == -FI_ENOMEM ? LMT_ENOMEM : LMT_EIO,
		                 "ofi: fi_getinfo: %s", fi_strerror(-rc));
	/* The entry whose source address is the control connection's, so
	 * the data goes where the control connection does. */
	const struct fi_info *pick = list;
	for (const struct fi_info *i = list; i; i = i->next)
		if (has_source(i, local_host)) {
			pick = i;
			break;
		}
	inst->info = fi_dupinfo(pick);
	fi_freeinfo(list);
	if (!inst->info)
		return ofi_error(inst, LMT_ENOMEM, "ofi: out of memory");
	inst->visibility = variant == OFI_VARIANT_DELIVERY ? OFI_DELIVERY : OFI_FENCE;
	inst->fence_flags = variant == OFI_VARIANT_FENCED_READ ? FI_FENCE : 0;

	uint64_t mode = (uint64_t)inst->info->domain_attr->mr_mode;
	if (mode & ~(uint64_t)OFI_MR_MODES) {
		char text[256];
		int bad = (int)(mode & ~(uint64_t)OFI_MR_MODES);
		fi_tostr_r(text, sizeof(text), &bad, FI_TYPE_MR_MODE);
		return ofi_error(inst, LMT_ENOTSUP,
		                 "ofi: provider %s asks for memory-registration modes lmt does not "
		                 "honour: %s",
		                 inst->info->fabric_attr->prov_name, text);
	}
	if (inst->info->mode & ~(uint64_t)(FI_CONTEXT | FI_CONTEXT2))
		return ofi_error(inst, LMT_ENOTSUP, "ofi: provider %s needs modes 0x%llx",
		                 inst->info->fabric_attr->prov_name,
		                 (unsigned long long)inst->info->mode);
	inst->mr_mode = mode | (c->force_local ? FI_MR_LOCAL : 0);
	inst->local_mr = inst->mr_mode & FI_MR_LOCAL;
	/* Merged writes complete together, which only delivery completion
	 * reports write by write; fences order by posting sequence. */
	if (c->coalesce == OFI_COALESCE_ON && inst->visibility != OFI_DELIVERY)
		return ofi_error(inst, LMT_EINVAL,
		                 "ofi.coalesce=on needs delivery completion; provider %s gives "
		                 "visibility by fence reads here",
		                 inst->info->fabric_attr->prov_name);
	inst->coalesce = inst->role == LMT_ROLE_SOURCE && inst->visibility == OFI_DELIVERY &&
	                 (c->coalesce == OFI_COALESCE_ON ||
	                  (c->coalesce == OFI_COALESCE_AUTO &&
	                   strcmp(inst->info->fabric_attr->prov_name, "shm") == 0));
	return 0;
}

/* ---- Instances --------------------------------------------------------- */

static int open_fabric(struct lmt_instance *inst)
{
	struct fi_info *info = inst->info;
	int rc = fi_fabric(info->fabric_attr, &inst->fabric, NULL);
	if (rc)
		return ofi_error(inst, ofi_code(-rc), "ofi: fi_fabric(%s): %s",
		                 info->fabric_attr->name, fi_strerror(-rc));
	rc = fi_domain(inst->fabric, info, &inst->domain, NULL);
	if (rc)
		return ofi_error(inst, ofi_code(-rc), "ofi: fi_domain(%s): %s",
		                 info->domain_attr->name, fi_strerror(-rc));
	struct fi_av_attr av = {.type = info->domain_attr->av_type == FI_AV_UNSPEC
	                                        ? FI_AV_TABLE
	                                        : info->domain_attr->av_type,
	                        .count = inst->channels};
	rc = fi_av_open(inst->domain, &av, &inst->av, NULL);
	if (rc)
		return ofi_error(inst, ofi_code(-rc), "ofi: fi_av_open: %s", fi_strerror(-rc));

	size_t tx = info->tx_attr->size;
	inst->queue = tx > 1 && tx - 1 < OFI_QUEUE_MAX ? (uint32_t)(tx - 1) : OFI_QUEUE_MAX;
	inst->max_msg = info->ep_attr->max_msg_size ? info->ep_attr->max_msg_size : UINT64_MAX;
	size_t key_size = info->domain_attr->mr_key_size;
	inst->key_limit = key_size && key_size < 8 ? 1ull << (8 * key_size) : UINT64_MAX;

	/* A progress thread sleeps in fi_cq_sread when the provider's CQs
	 * wait on a file descriptor. Otherwise it polls and naps: the wait a
	 * provider picks by itself may spin (shm yields in a loop), and
	 * spinning threads starve the copies on a machine of few cores. */
	struct fi_cq_attr attr = {
	        .format = FI_CQ_FORMAT_CONTEXT, .size = 1, .wait_obj = FI_WAIT_FD};
	struct fid_cq *cq;
	inst->cq_wait = fi_cq_open(inst->domain, &attr, &cq, NULL) == 0;
	if (inst->cq_wait)
		ofi_close_fid(inst, &cq->fid, "a probe CQ");
	return 0;
}

static int check_params(const struct lmt_host *host, void *host_ctx,
                        const struct lmt_instance_params *params)
{
	if (host->struct_size < offsetof(struct lmt_host, cancelled) + sizeof(host->cancelled) ||
	    !host->log || !host->now_ns || !host->option || !host->cancelled)
		return host->error(host_ctx, LMT_EABI, "ofi: host services incomplete");
	if (!params || params->struct_size < offsetof(struct lmt_instance_params, peer_host) +
	                                             sizeof(params->peer_host))
		return host->error(host_ctx, LMT_EABI, "ofi: instance parameters too old");
	if (params->role != LMT_ROLE_SOURCE && params->role != LMT_ROLE_DESTINATION)
		return host->error(host_ctx, LMT_EINVAL, "ofi: unknown role %d", (int)params->role);
	if (params->channels == 0 || params->channels > OFI_MAX_CHANNELS)
		return host->error(host_ctx, LMT_EINVAL, "ofi: %u channels, expected 1 to %u",
		                   params->channels, OFI_MAX_CHANNELS);
	return 0;
}

static int init_sync(struct lmt_instance *inst)
{
	if (pthread_mutex_init(&inst->lock, NULL))
		return -LMT_ENOMEM;
	if (lmt__cond_init(&inst->cond) == 0) {
		if (pthread_mutex_init(&inst->mr_lock, NULL) == 0)
			return 0;
		pthread_cond_destroy(&inst->cond);
	}
	pthread_mutex_destroy(&inst->lock);
	return -LMT_ENOMEM;
}

/* Release what instance_open built, in reverse order. */
static void free_instance(struct lmt_instance *inst)
{
	ofi_close_fid(inst, inst->av ? &inst->av->fid : NULL, "the address vector");
	ofi_close_fid(inst, inst->domain ? &inst->domain->fid : NULL, "the domain");
	ofi_close_fid(inst, inst->fabric ? &inst->fabric->fid : NULL, "the fabric");
	if (inst->info)
		fi_freeinfo(inst->info);
	free(inst->eps);
	free(inst->outstanding);
	free(inst->flush_target);
	lmt__cq_free(&inst->cq);
	free(inst);
}

static int ofi_instance_open(const struct lmt_host *host, void *host_ctx,
                             const struct lmt_instance_params *params, lmt_instance **out)
{
	if (!host || !out || !host->error)
		return -LMT_EINVAL;
	*out = NULL;
	int rc = check_params(host, host_ctx, params);
	if (rc)
		return rc;
	struct lmt_instance *inst = calloc(1, sizeof(*inst));
	if (!inst)
		return host->error(host_ctx, LMT_ENOMEM, "ofi: out of memory");
	inst->host = host;
	inst->host_ctx = host_ctx;
	inst->role = params->role;
	inst->channels = params->channels;
	inst->timeout_ns = params->timeout_ns;
	inst->next_key = 1;
	if (init_sync(inst)) {
		free(inst);
		return host->error(host_ctx, LMT_ENOMEM, "ofi: cannot create locks");
	}
	char local_host[sizeof(params->local_host) + 1] = {0};
	memcpy(local_host, params->local_host, sizeof(params->local_host));
	struct ofi_choice choice;
	if ((rc = read_options(inst, &choice)) ||
	    (rc = choose_provider(inst, &choice, local_host)) || (rc = open_fabric(inst)))
		goto fail;

	inst->eps = calloc(inst->channels, sizeof(*inst->eps));
	inst->outstanding = calloc(inst->channels, sizeof(*inst->outstanding));
	inst->flush_target = calloc(inst->channels, sizeof(*inst->flush_target));
	if (inst->role == LMT_ROLE_SOURCE) {
		if (lmt__cq_init(&inst->cq, inst->channels * inst->queue))
			inst->cq.ring = NULL;
	}
	if (!inst->eps || !inst->outstanding || !inst->flush_target ||
	    (inst->role == LMT_ROLE_SOURCE && !inst->cq.ring)) {
		rc = ofi_error(inst, LMT_ENOMEM, "ofi: out of memory");
		goto fail;
	}
	char modes[256];
	int mode = (int)inst->mr_mode;
	fi_tostr_r(modes, sizeof(modes), &mode, FI_TYPE_MR_MODE);
	ofi_log(inst, LMT_LOG_DEBUG,
	        "ofi: %s, provider %s, fabric %s, domain %s, mr_mode [%s], %s, %s CQs, "
	        "%u writes per channel%s",
	        inst->role == LMT_ROLE_SOURCE ? "source" : "destination",
	        inst->info->fabric_attr->prov_name, inst->info->fabric_attr->name,
	        inst->info->domain_attr->name, modes,
	        inst->visibility == OFI_DELIVERY ? "FI_DELIVERY_COMPLETE"
	        : inst->fence_flags              ? "fenced reads"
	                                         : "ordered reads",
	        inst->cq_wait ? "waiting" : "polled", inst->queue,
	        inst->coalesce ? ", coalesced" : "");
	*out = inst;
	return 0;
fail:
	pthread_mutex_destroy(&inst->mr_lock);
	pthread_cond_destroy(&inst->cond);
	pthread_mutex_destroy(&inst->lock);
	free_instance(inst);
	return rc;
}

static void ofi_instance_close(lmt_instance *inst)
{
	if (!inst)
		return;
	/* Threads first: nothing may touch a registration while it goes. */
	for (uint32_t c = 0; c < inst->channels; c++)
		if (inst->eps[c])
			ofi_ep_stop(inst->eps[c]);
	while (inst->mrs)
		ofi_mr_deregister(inst, inst->mrs);
	while (inst->rkeys)
		ofi_rkey_release(inst, inst->rkeys);
	for (uint32_t c = 0; c < inst->channels; c++)
		if (inst->eps[c])
			ofi_ep_close(inst->eps[c]);
	pthread_mutex_destroy(&inst->mr_lock);
	pthread_cond_destroy(&inst->cond);
	pthread_mutex_destroy(&inst->lock);
	free_instance(inst);
}

/* ---- Progress and flush ----------------------------------------------- */

/* Report every write still outstanding with the first failure, once. */
static void abandon_all(struct lmt_instance *inst)
{
	for (uint32_t c = 0; c < inst->channels; c++)
		if (inst->eps[c])
			ofi_ep_abandon(inst->eps[c], inst->failing);
}

static int ofi_progress(lmt_instance *inst, struct lmt_completion *out, uint32_t max,
                        uint64_t timeout_ns)
{
	if (!inst || (!out && max))
		return -LMT_EINVAL;
	uint64_t deadline = lmt__deadline(timeout_ns);
	int rc = 0;
	pthread_mutex_lock(&inst->lock);
	for (;;) {
		if (inst->failing && !inst->abandoned) {
			inst->abandoned = true;
			pthread_mutex_unlock(&inst->lock);
			abandon_all(inst);
			pthread_mutex_lock(&inst->lock);
			continue;
		}
		/* Completions come before the failure, so every cookie is seen. */
		if (inst->cq.count && max)
			break;
		if (inst->failing || inst->fatal || !max) {
			rc = inst->failing ? inst->failing : inst->fatal;
			goto out;
		}
		if (inst->host->cancelled(inst->host_ctx)) {
			rc = ofi_error(inst, LMT_ECANCELED, "ofi: cancelled");
			goto out;
		}
		if (lmt__now_ns() >= deadline)
			goto out;
		lmt__cond_wait_slice(&inst->cond, &inst->lock, deadline);
	}
	rc = (int)lmt__cq_drain(&inst->cq, out, max, inst->outstanding);
out:
	pthread_mutex_unlock(&inst->lock);
	return rc;
}

/* 1 when every write counted in flush_target was reported, 0 if not yet,
 * or the failure. Called with inst->lock held. */
static int flush_done(struct lmt_instance *inst)
{
	if (inst->failing)
		return inst->failing;
	for (uint32_t c = 0; c < inst->channels; c++)
		if (inst->eps[c] && inst->eps[c]->reported < inst->flush_target[c])
			return 0;
	return 1;
}

static int ofi_flush(lmt_instance *inst, uint64_t timeout_ns)
{
	if (!inst)
		return -LMT_EINVAL;
	if (inst->role != LMT_ROLE_SOURCE)
		return 0;
	for (uint32_t c = 0; c < inst->channels; c++) {
		lmt_endpoint *ep = inst->eps[c];
		inst->flush_target[c] = 0;
		if (ep && ep->lock_ready) {
			pthread_mutex_lock(&ep->lock);
			inst->flush_target[c] = ep->next_seq;
			pthread_mutex_unlock(&ep->lock);
		}
	}
	/* A write is reported only once visible, and the threads fence on
	 * their own; waiting for the reports is the whole flush. */
	uint64_t deadline = lmt__deadline(timeout_ns);
	int rc;
	pthread_mutex_lock(&inst->lock);
	while ((rc = flush_done(inst)) == 0) {
		if (inst->host->cancelled(inst->host_ctx)) {
			rc = ofi_error(inst, LMT_ECANCELED, "ofi: flush cancelled");
			break;
		}
		if (lmt__now_ns() >= deadline) {
			rc = ofi_error(
			        inst, LMT_ETIMEDOUT,
			        "ofi: flush timed out after %llu ms with writes not yet visible",
			        (unsigned long long)(timeout_ns / 1000000));
			break;
		}
		lmt__cond_wait_slice(&inst->cond, &inst->lock, deadline);
	}
	pthread_mutex_unlock(&inst->lock);
	return rc < 0 ? rc : 0;
}

static const struct lmt_plugin ofi_plugin = {
        .abi_version = LMT_PLUGIN_ABI_VERSION,
        .struct_size = sizeof(struct lmt_plugin),
        .name = "ofi",
        .version = LMT_VERSION,
        .description = "libfabric RMA writes over any provider (tcp, shm, verbs, ...)",
        .caps = LMT_CAP_LOCAL_MR | LMT_CAP_PIN | LMT_CAP_MULTI_CHANNEL | LMT_CAP_TARGET_PROGRESS |
                LMT_CAP_MERGES_RUNS,
        .options = ofi_options,
        .option_count = sizeof(ofi_options) / sizeof(ofi_options[0]),
        .ops =
                {
                        .instance_open = ofi_instance_open,
                        .instance_close = ofi_instance_close,
                        .ep_open = ofi_ep_open,
                        .ep_connect = ofi_ep_connect,
                        .ep_close = ofi_ep_close,
                        .mr_register = ofi_mr_register,
                        .mr_deregister = ofi_mr_deregister,
                        .rkey_import = ofi_rkey_import,
                        .rkey_release = ofi_rkey_release,
                        .write = ofi_write,
                        .progress = ofi_progress,
                        .flush = ofi_flush,
                },
};

LMT_DECLARE_PLUGIN(ofi_plugin)
