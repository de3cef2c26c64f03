/* The provider of a libfabric plugin instance: choosing it from what the
 * options ask (fi_getinfo, and why nothing matched when nothing did),
 * opening its fabric, domain and address vector, and two helpers for every
 * file above: libfabric's error numbers as lmt codes, and closing its
 * objects. */
#define _GNU_SOURCE
#include "provider.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>

#include <rdma/fi_errno.h>

#include "policy.h"

#define LFI_API_VERSION FI_VERSION(1, 17)
#define LFI_QUEUE_MAX 1024u /* writes per channel, posted and not harvested */

/* ---- For every file above ---------------------------------------------- */

int lfi_code(int fi_err)
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

void lfi_close_fid(struct lmt_instance *inst, struct fid *fid, const char *what)
{
	if (!fid)
		return;
	int rc = fi_close(fid);
	if (rc)
		putil_log(&inst->base, LMT_LOG_WARN, "ofi: closing %s: %s", what, fi_strerror(-rc));
}

/* ---- Choosing the provider -------------------------------------------- */

/* How visibility is obtained: with FI_DELIVERY_COMPLETE, or with a read
 * ordered behind the writes by FI_ORDER_RAW, or by FI_FENCE. */
enum lfi_variant {
	LFI_VARIANT_DELIVERY = 0,
	LFI_VARIANT_ORDERED_READ = 1,
	LFI_VARIANT_FENCED_READ = 2,
	LFI_VARIANT_BASIC = 3, /* only what every variant needs, for diagnosis */
};

static struct fi_info *make_hints(const struct lfi_choice *c, enum lfi_variant variant,
                                  uint64_t offer, bool with_provider, bool with_domain)
{
	struct fi_info *h = fi_allocinfo();
	if (!h)
		return NULL;
	h->ep_attr->type = FI_EP_RDM;
	/* RMA only: lmt sends no message. Asking for FI_MSG bounded nothing
	 * (providers take messages whatever the caps say); policy.c decides
	 * which providers keep what a peer sends in bounds. */
	h->caps = FI_RMA | c->caps;
	h->mode = FI_CONTEXT | FI_CONTEXT2;
	h->addr_format = FI_FORMAT_UNSPEC;
	h->domain_attr->mr_mode = (int)offer;
	h->domain_attr->threading = FI_THREAD_SAFE;
	if (variant == LFI_VARIANT_DELIVERY)
		h->tx_attr->op_flags = FI_DELIVERY_COMPLETE;
	if (variant == LFI_VARIANT_ORDERED_READ)
		h->tx_attr->msg_order = FI_ORDER_RAW;
	if (variant == LFI_VARIANT_FENCED_READ)
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

/* fi_getinfo for one variant: 0, -FI_ENODATA, or another -FI_E*. Some
 * providers (tcp;ofi_rxm) ignore the domain in the hints, so the entries of
 * other domains are dropped here. */
static int query(const struct lfi_choice *c, enum lfi_variant variant, uint64_t offer,
                 bool with_provider, bool with_domain, struct fi_info **out)
{
	*out = NULL;
	struct fi_info *hints = make_hints(c, variant, offer, with_provider, with_domain);
	if (!hints)
		return -FI_ENOMEM;
	int rc = fi_getinfo(LFI_API_VERSION, NULL, NULL, 0, hints, out);
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
#define LFI_MR_ANY (LFI_MR_MODES | FI_MR_MMU_NOTIFY | FI_MR_RMA_EVENT | FI_MR_HMEM)

/* A provider that exists but wants modes not offered: say which. */
static int explain_modes(struct lmt_instance *inst, const struct lfi_choice *c)
{
	struct fi_info *list;
	if (query(c, LFI_VARIANT_BASIC, LFI_MR_ANY, true, true, &list))
		return 0;
	char text[256];
	int missing = (int)((uint64_t)list->domain_attr->mr_mode & ~c->offer);
	fi_tostr_r(text, sizeof(text), &missing, FI_TYPE_MR_MODE);
	fi_freeinfo(list);
	return putil_error(&inst->base, LMT_ENOTSUP,
	                   "ofi.provider=%s: needs memory-registration modes %s (%s)",
	                   c->provider[0] ? c->provider : "(any)",
	                   missing & ~(int)LFI_MR_MODES ? "that lmt does not honour"
	                                                : "that ofi.mr-mode does not offer",
	                   text);
}

/* Whether any provider answers basic hints with these modes offered. */
static bool answers(const struct lfi_choice *c, uint64_t offer, bool with_domain)
{
	struct fi_info *list;
	int rc = query(c, LFI_VARIANT_BASIC, offer, true, with_domain, &list);
	fi_freeinfo(list);
	return rc == 0;
}

/* Nothing matched: say which of provider, domain, modes or completion is
 * why. */
static int explain(struct lmt_instance *inst, const struct lfi_choice *c)
{
	char names[512];
	struct fi_info *list;
	int rc = query(c, LFI_VARIANT_BASIC, LFI_MR_MODES, false, false, &list);
	if (rc && rc != -FI_ENODATA)
		return putil_error(&inst->base, LMT_EIO, "ofi: fi_getinfo: %s", fi_strerror(-rc));
	/* Name only the providers the plugin would take. */
	struct lfi_refusal refused;
	if (!rc)
		lfi_policy_filter(&list, LFI_API_VERSION, &refused);
	list_names(list, false, names, sizeof(names));
	fi_freeinfo(list);
	if (!c->provider[0] && rc == -FI_ENODATA)
		return putil_error(&inst->base, LMT_ENOTFOUND,
		                   "ofi: no libfabric provider offers reliable RMA endpoints "
		                   "(FI_EP_RDM, FI_RMA, thread-safe)");
	if (c->provider[0] && !answers(c, LFI_MR_ANY, false))
		return putil_error(&inst->base, LMT_ENOTFOUND,
		                   "ofi.provider=%s: not available; providers: %s", c->provider,
		                   names);
	if (c->domain[0] && !answers(c, LFI_MR_ANY, true)) {
		rc = query(c, LFI_VARIANT_BASIC, LFI_MR_ANY, true, false, &list);
		list_names(rc ? NULL : list, true, names, sizeof(names));
		fi_freeinfo(list);
		return putil_error(&inst->base, LMT_ENOTFOUND,
		                   "ofi.domain=%s: not available%s%s; domains: %s", c->domain,
		                   c->provider[0] ? " with provider " : "", c->provider, names);
	}
	if (!answers(c, c->offer, true) && (rc = explain_modes(inst, c)))
		return rc;
	return putil_error(&inst->base, LMT_ENOTSUP, "ofi: provider %s offers %s",
	                   c->provider[0] ? c->provider : "(any)",
	                   c->completion == LFI_COMPLETION_DELIVERY
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

/* The variants to try, in order, for each ofi.completion. */
static const enum lfi_variant variant_order[3][3] = {
        [LFI_COMPLETION_AUTO] = {LFI_VARIANT_DELIVERY, LFI_VARIANT_ORDERED_READ,
                                 LFI_VARIANT_FENCED_READ},
        [LFI_COMPLETION_DELIVERY] = {LFI_VARIANT_DELIVERY, LFI_VARIANT_DELIVERY,
                                     LFI_VARIANT_DELIVERY},
        [LFI_COMPLETION_FENCE] = {LFI_VARIANT_ORDERED_READ, LFI_VARIANT_FENCED_READ,
                                  LFI_VARIANT_FENCED_READ},
};

/* The entries of the first variant that answers with a provider the
 * policy takes: 0, -FI_ENODATA, or another -FI_E*. The first provider the
 * policy refused, if any, is in *refused. */
static int candidates(const struct lfi_choice *c, struct fi_info **list, enum lfi_variant *variant,
                      struct lfi_refusal *refused)
{
	int rc = -FI_ENODATA;
	refused->provider[0] = 0;
	refused->why = NULL;
	for (int i = 0; i < 3 && rc == -FI_ENODATA; i++) {
		*variant = variant_order[c->completion][i];
		rc = query(c, *variant, c->offer, true, true, list);
		if (rc)
			continue;
		struct lfi_refusal r;
		if (!lfi_policy_filter(list, LFI_API_VERSION, &r))
			rc = -FI_ENODATA;
		if (r.why && !refused->why)
			*refused = r;
	}
	return rc;
}

static int choose_provider(struct lmt_instance *inst, const struct lfi_choice *c)
{
	struct fi_info *list = NULL;
	enum lfi_variant variant = LFI_VARIANT_DELIVERY;
	struct lfi_refusal refused;
	int rc = candidates(c, &list, &variant, &refused);
	/* tcp in libfabric 1.17 answers RDM only as tcp;ofi_rxm: its native
	 * RDM over TCP is the provider net. */
	const char *alt = rc == -FI_ENODATA && refused.why && c->provider[0]
	                          ? lfi_policy_alternative(c->provider)
	                          : NULL;
	if (alt) {
		struct lfi_choice instead = *c;
		struct lfi_refusal again;
		instead.provider = alt;
		rc = candidates(&instead, &list, &variant, &again);
		if (rc == 0)
			putil_log(&inst->base, LMT_LOG_DEBUG,
			          "ofi.provider=%s: libfabric offers it for RDM only as %s, which lmt "
			          "refuses; taking %s, its native RDM over TCP",
			          c->provider, refused.provider, alt);
	}
	/* A provider over sockets gets receives that take and drop what
	 * strangers send (sink.c): the same choice, with messages. */
	if (rc == 0 && lfi_policy_sinks(list->fabric_attr->prov_name)) {
		struct lfi_choice with_rx = *c;
		struct fi_info *again = NULL;
		struct lfi_refusal none;
		enum lfi_variant v;
		with_rx.provider = list->fabric_attr->prov_name;
		with_rx.caps = FI_MSG | FI_TAGGED;
		if (candidates(&with_rx, &again, &v, &none) == 0 && v == variant) {
			fi_freeinfo(list);
			list = again;
		} else {
			fi_freeinfo(again);
		}
	}
	if (rc == -FI_ENODATA && refused.why)
		return putil_error(&inst->base, LMT_ENOTSUP, "ofi.provider=%s: provider %s refused: %s",
		                   c->provider[0] ? c->provider : "(any)", refused.provider,
		                   refused.why);
	if (rc == -FI_ENODATA)
		return explain(inst, c);
	if (rc)
		return putil_error(&inst->base, rc == -FI_ENOMEM ? LMT_ENOMEM : LMT_EIO,
		                   "ofi: fi_getinfo: %s", fi_strerror(-rc));
	/* The entry whose source address is the control connection's, so
	 * the data goes where the control connection does. */
	const struct fi_info *pick = list;
	for (const struct fi_info *i = list; i; i = i->next)
		if (has_source(i, inst->base.local_host)) {
			pick = i;
			break;
		}
	inst->info = fi_dupinfo(pick);
	fi_freeinfo(list);
	if (!inst->info)
		return putil_error(&inst->base, LMT_ENOMEM, "ofi: out of memory");
	inst->visibility = variant == LFI_VARIANT_DELIVERY ? LFI_DELIVERY : LFI_FENCE;
	inst->fence_flags = variant == LFI_VARIANT_FENCED_READ ? FI_FENCE : 0;

	uint64_t mode = (uint64_t)inst->info->domain_attr->mr_mode;
	if (mode & ~(uint64_t)LFI_MR_MODES) {
		char text[256];
		int bad = (int)(mode & ~(uint64_t)LFI_MR_MODES);
		fi_tostr_r(text, sizeof(text), &bad, FI_TYPE_MR_MODE);
		return putil_error(
		        &inst->base, LMT_ENOTSUP,
		        "ofi: provider %s asks for memory-registration modes lmt does not "
		        "honour: %s",
		        inst->info->fabric_attr->prov_name, text);
	}
	if (inst->info->mode & ~(uint64_t)(FI_CONTEXT | FI_CONTEXT2))
		return putil_error(&inst->base, LMT_ENOTSUP, "ofi: provider %s needs modes 0x%llx",
		                   inst->info->fabric_attr->prov_name,
		                   (unsigned long long)inst->info->mode);
	inst->mr_mode = mode | (c->force_local ? FI_MR_LOCAL : 0);
	inst->local_mr = inst->mr_mode & FI_MR_LOCAL;
	/* Merged writes complete together, which only delivery completion
	 * reports write by write; fences order by posting sequence. */
	if (c->coalesce == LFI_COALESCE_ON && inst->visibility != LFI_DELIVERY)
		return putil_error(&inst->base, LMT_EINVAL,
		                   "ofi.coalesce=on needs delivery completion; provider %s gives "
		                   "visibility by fence reads here",
		                   inst->info->fabric_attr->prov_name);
	const char *name = inst->info->fabric_attr->prov_name;
	inst->sockets = strcmp(name, "net") == 0 || strcmp(name, "tcp") == 0;
	inst->shm = strcmp(name, "shm") == 0;
	inst->sink = (inst->info->caps & FI_MSG) && lfi_policy_sinks(name);
	/* auto: shm's sender spins on the target's copy lock, and net sends
	 * inside the post, so either would hold the VMM's thread in iterate
	 * past its budget (docs/ofi.md). */
	inst->coalesce = inst->base.role == LMT_ROLE_SOURCE && inst->visibility == LFI_DELIVERY &&
	                 (c->coalesce == LFI_COALESCE_ON ||
	                  (c->coalesce == LFI_COALESCE_AUTO && (inst->shm || inst->sockets)));
	return 0;
}

/* ---- Opening it ------------------------------------------------------- */

static int open_fabric(struct lmt_instance *inst)
{
	struct fi_info *info = inst->info;
	int rc = fi_fabric(info->fabric_attr, &inst->fabric, NULL);
	if (rc)
		return putil_error(&inst->base, lfi_code(-rc), "ofi: fi_fabric(%s): %s",
		                   info->fabric_attr->name, fi_strerror(-rc));
	rc = fi_domain(inst->fabric, info, &inst->domain, NULL);
	if (rc)
		return putil_error(&inst->base, lfi_code(-rc), "ofi: fi_domain(%s): %s",
		                   info->domain_attr->name, fi_strerror(-rc));
	struct fi_av_attr av = {.type = info->domain_attr->av_type == FI_AV_UNSPEC
	                                        ? FI_AV_TABLE
	                                        : info->domain_attr->av_type,
	                        .count = inst->base.channels};
	rc = fi_av_open(inst->domain, &av, &inst->av, NULL);
	if (rc)
		return putil_error(&inst->base, lfi_code(-rc), "ofi: fi_av_open: %s",
		                   fi_strerror(-rc));

	size_t tx = info->tx_attr->size;
	inst->queue = tx > 1 && tx - 1 < LFI_QUEUE_MAX ? (uint32_t)(tx - 1) : LFI_QUEUE_MAX;
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
		lfi_close_fid(inst, &cq->fid, "a probe CQ");
	return 0;
}

int lfi_provider_open(struct lmt_instance *inst, const struct lfi_choice *c)
{
	int rc = choose_provider(inst, c);
	return rc ? rc : open_fabric(inst);
}

void lfi_provider_close(struct lmt_instance *inst)
{
	lfi_close_fid(inst, inst->av ? &inst->av->fid : NULL, "the address vector");
	lfi_close_fid(inst, inst->domain ? &inst->domain->fid : NULL, "the domain");
	lfi_close_fid(inst, inst->fabric ? &inst->fabric->fid : NULL, "the fabric");
	if (inst->info)
		fi_freeinfo(inst->info);
}
