/* The UCX plugin: descriptor, options, instances (one UCP context each),
 * registrations, remote keys, progress and flush. Channels are in
 * worker.c, source.c and destination.c. */
#define _GNU_SOURCE
#include "ucx.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
         .doc = "how writes move: put (one-sided RMA), am (active messages the destination "
                "places), auto (put over InfiniBand RC/DC only)"},
};

/* ---- Helpers for the other files -------------------------------------- */

uint64_t ucx_close_deadline(const struct lmt_instance *inst)
{
	uint64_t bound = inst->host->cancelled(inst->host_ctx) ? UCX_CANCEL_NS : UCX_CLOSE_NS;
	if (inst->timeout_ns && inst->timeout_ns < bound)
		bound = inst->timeout_ns;
	return lmt__deadline(bound);
}

/* Whether every live source channel has completed its writes, after a
 * failure. Called with inst->lock held. */
static bool all_settled(const struct lmt_instance *inst)
{
	for (uint32_t c = 0; c < inst->channels; c++)
		if (inst->eps[c] && inst->eps[c]->live && !inst->eps[c]->final)
			return false;
	return true;
}

void ucx_complete(lmt_endpoint *ep, struct ucx_slot *slot, int status)
{
	struct lmt_instance *inst = ep->inst;
	if (slot->rkey)
		atomic_fetch_sub(&slot->rkey->users, 1);
	pthread_mutex_lock(&inst->lock);
	/* Cannot overflow: a channel has at most UCX_QUEUE_DEPTH writes
	 * posted and not harvested. */
	lmt__cq_push(&inst->cq, slot->cookie, status, ep->channel);
	pthread_mutex_lock(&ep->lock);
	slot->busy = false;
	slot->rkey = NULL;
	slot->posted = slot->sent = slot->acked = false;
	slot->status = 0;
	ep->free_slots[ep->free_count++] = slot->index;
	pthread_mutex_unlock(&ep->lock);
	pthread_cond_broadcast(&inst->cond);
	pthread_mutex_unlock(&inst->lock);
}

void ucx_fail_all(struct lmt_instance *inst, int status)
{
	pthread_mutex_lock(&inst->lock);
	if (!inst->failing) {
		inst->failing = status;
		atomic_store(&inst->failing_hint, status);
		for (uint32_t c = 0; c < inst->channels; c++)
			if (inst->eps[c] && inst->eps[c]->live)
				ucx_wake(inst->eps[c]);
		if (all_settled(inst))
			inst->fatal = status;
	}
	pthread_cond_broadcast(&inst->cond);
	pthread_mutex_unlock(&inst->lock);
}

void ucx_settled(lmt_endpoint *ep, int status)
{
	struct lmt_instance *inst = ep->inst;
	pthread_mutex_lock(&inst->lock);
	ep->final = status;
	if (inst->failing && !inst->fatal && all_settled(inst))
		inst->fatal = inst->failing;
	pthread_cond_broadcast(&inst->cond);
	pthread_mutex_unlock(&inst->lock);
}

void ucx_set_fatal(struct lmt_instance *inst, int code)
{
	pthread_mutex_lock(&inst->lock);
	if (!inst->fatal)
		inst->fatal = code;
	pthread_cond_broadcast(&inst->cond);
	pthread_mutex_unlock(&inst->lock);
}

/* Index of the first region whose id is >= id. */
static size_t region_index(const struct lmt_instance *inst, uint32_t id)
{
	size_t lo = 0, hi = inst->region_count;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (inst->regions[mid]->id < id)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

struct lmt_mr *ucx_region_find(struct lmt_instance *inst, uint32_t id)
{
	size_t i = region_index(inst, id);
	return i < inst->region_count && inst->regions[i]->id == id ? inst->regions[i] : NULL;
}

/* ---- Instances --------------------------------------------------------- */

/* A string option, or "" when the host does not know it. */
static const char *string_option(struct lmt_instance *inst, const char *name)
{
	struct lmt_option_value v;
	if (inst->host->option(inst->host_ctx, name, &v) == 0 && v.type == LMT_OPT_STRING && v.text)
		return v.text;
	return "";
}

/* Whether a UCX transport list (UCX_TLS syntax) may open one of UCX's
 * shared-memory FIFO transports (posix, sysv, xpmem): empty is UCX's
 * choice, and a list starting with '^' names what to leave out. */
static bool may_open_mm(const char *tls)
{
	static const char *const mm[] = {"all", "sm", "shm", "mm", "posix", "sysv", "xpmem"};
	if (!tls[0] || tls[0] == '^')
		return true;
	for (const char *at = tls; *at;) {
		size_t len = strcspn(at, ",");
		for (size_t i = 0; i < sizeof(mm) / sizeof(mm[0]); i++)
			if (strlen(mm[i]) == len && strncmp(at, mm[i], len) == 0)
				return true;
		at += len + (at[len] == ',');
	}
	return false;
}

/* Each worker of a shared-memory FIFO transport allocates and touches
 * 512 receive buffers of 8 KiB at once (UCX's MM_RX_BUFS_GROW), which
 * made a worker over sm cost 3–4 ms here and a two-channel setup about
 * 25 ms. lmt sends few and small messages over them (headers and
 * acknowledgements; the data goes by rendezvous), and the pool still
 * grows on demand, so 64 is plenty. Left alone when the user set it. */
static int tune_shared_memory(struct lmt_instance *inst, ucp_config_t *config, const char *tls)
{
	static const char *const set_by_user[] = {"UCX_MM_RX_BUFS_GROW", "UCX_POSIX_RX_BUFS_GROW",
	                                          "UCX_SYSV_RX_BUFS_GROW",
	                                          "UCX_XPMEM_RX_BUFS_GROW"};
	if (!may_open_mm(tls))
		return 0;
	for (size_t i = 0; i < sizeof(set_by_user) / sizeof(set_by_user[0]); i++)
		if (getenv(set_by_user[i]))
			return 0;
	ucs_status_t st = ucp_config_modify(config, "MM_RX_BUFS_GROW", UCX_MM_RX_BUFS_GROW);
	if (st != UCS_OK)
		return ucx_error(inst, LMT_EIO, "ucx: cannot set MM_RX_BUFS_GROW (%s)",
		                 ucs_status_string(st));
	return 0;
}

static int read_options(struct lmt_instance *inst, ucp_config_t *config)
{
	static const struct {
		const char *option, *ucx;
	} passed[] = {{"ucx.tls", "TLS"}, {"ucx.devices", "NET_DEVICES"}};
	char tls[UCX_LIST_MAX] = "";
	for (size_t i = 0; i < sizeof(passed) / sizeof(passed[0]); i++) {
		const char *value = string_option(inst, passed[i].option);
		if (!value[0])
			continue;
		/* lmt option lists separate with ',', so UCX's lists take '+'
		 * here ("rc+sm"); no UCX transport or device name holds one. */
		char list[UCX_LIST_MAX];
		size_t len = strnlen(value, sizeof(list));
		if (len == sizeof(list))
			return ucx_error(inst, LMT_EINVAL, "%s: longer than %zu characters",
			                 passed[i].option, sizeof(list) - 1);
		for (size_t k = 0; k <= len; k++)
			list[k] = value[k] == '+' ? ',' : value[k];
		ucs_status_t st = ucp_config_modify(config, passed[i].ucx, list);
		if (st != UCS_OK)
			return ucx_error(inst, LMT_EINVAL, "%s: UCX refuses '%s' (%s)",
			                 passed[i].option, value, ucs_status_string(st));
		if (i == 0)
			memcpy(tls, list, len + 1);
	}
	if (!tls[0] && getenv("UCX_TLS"))
		snprintf(tls, sizeof(tls), "%s", getenv("UCX_TLS"));
	int rc = tune_shared_memory(inst, config, tls);
	if (rc)
		return rc;
	struct lmt_option_value v;
	inst->transfer = UCX_TRANSFER_AUTO;
	if (inst->host->option(inst->host_ctx, "ucx.transfer", &v) == 0 && v.type == LMT_OPT_ENUM) {
		if (v.integer < UCX_TRANSFER_AUTO || v.integer > UCX_TRANSFER_PUT)
			return ucx_error(inst, LMT_EINVAL,
			                 "ucx.transfer: expected auto, am or put, got %lld",
			                 (long long)v.integer);
		inst->transfer = (enum ucx_transfer)v.integer;
	}
	return 0;
}

/* What UCX opened: an InfiniBand RC or DC transport (the only ones here
 * whose puts land in memory UCX did not allocate without the target's
 * CPU: UCX 1.13 emulates puts over tcp and shared memory, see
 * docs/ucx.md), and whether everything is shared memory (which cannot
 * report a failed peer). */
static void scan_transports(ucp_context_h context, bool *rdma, bool *shm_only)
{
	static const char *const shm[] = {"sysv", "posix", "cma", "xpmem", "knem", "self"};
	char *text = NULL;
	size_t size = 0;
	*rdma = false;
	*shm_only = false;
	FILE *f = open_memstream(&text, &size);
	if (!f)
		return;
	ucp_context_print_info(context, f);
	fclose(f);
	unsigned found = 0, shared = 0;
	for (const char *at = text; at && (at = strstr(at, "flags -- ")) != NULL;) {
		at += strlen("flags -- ");
		size_t len = strcspn(at, "/\n");
		found++;
		if (len > 3 && (strncmp(at, "rc_", 3) == 0 || strncmp(at, "dc_", 3) == 0))
			*rdma = true;
		for (size_t i = 0; i < sizeof(shm) / sizeof(shm[0]); i++)
			if (strlen(shm[i]) == len && strncmp(at, shm[i], len) == 0)
				shared++;
	}
	*shm_only = found && found == shared;
	free(text);
}

static int open_context(struct lmt_instance *inst)
{
	ucp_config_t *config;
	ucs_status_t st = ucp_config_read(NULL, NULL, &config);
	if (st != UCS_OK)
		return ucx_error(inst, LMT_EIO, "ucx: cannot read UCX's configuration (%s)",
		                 ucs_status_string(st));
	int rc = read_options(inst, config);
	if (rc) {
		ucp_config_release(config);
		return rc;
	}
	ucp_params_t params = {
	        .field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED,
	        .features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP,
	        .mt_workers_shared = 1,
	};
	st = ucp_init(&params, config, &inst->context);
	ucp_config_release(config);
	if (st != UCS_OK) {
		inst->context = NULL;
		return ucx_error(inst, ucx_status_code(st),
		                 "ucx: cannot initialise UCP with tls '%s', devices '%s' (%s)",
		                 string_option(inst, "ucx.tls"), string_option(inst, "ucx.devices"),
		                 ucs_status_string(st));
	}
	bool rdma, shm_only;
	scan_transports(inst->context, &rdma, &shm_only);
	inst->peer_failure = !shm_only;
	if (inst->role == LMT_ROLE_SOURCE)
		inst->use_put = inst->transfer == UCX_TRANSFER_PUT ||
		                (inst->transfer == UCX_TRANSFER_AUTO && rdma);
	return 0;
}

static int init_sync(struct lmt_instance *inst)
{
	if (pthread_mutex_init(&inst->lock, NULL))
		return -LMT_ENOMEM;
	if (lmt__cond_init(&inst->cond)) {
		pthread_mutex_destroy(&inst->lock);
		return -LMT_ENOMEM;
	}
	if (pthread_mutex_init(&inst->mr_lock, NULL) == 0) {
		if (lmt__cond_init(&inst->mr_cond) == 0)
			return 0;
		pthread_mutex_destroy(&inst->mr_lock);
	}
	pthread_cond_destroy(&inst->cond);
	pthread_mutex_destroy(&inst->lock);
	return -LMT_ENOMEM;
}

static void free_instance(struct lmt_instance *inst)
{
	free(inst->eps);
	free(inst->outstanding);
	lmt__cq_free(&inst->cq);
	free(inst);
}

static void ucx_ep_close(lmt_endpoint *ep);

static int ucx_instance_open(const struct lmt_host *host, void *host_ctx,
                             const struct lmt_instance_params *params, lmt_instance **out)
{
	if (!host || !out || !host->error)
		return -LMT_EINVAL;
	*out = NULL;
	if (host->struct_size < offsetof(struct lmt_host, cancelled) + sizeof(host->cancelled) ||
	    !host->log || !host->now_ns || !host->option || !host->cancelled)
		return host->error(host_ctx, LMT_EABI, "ucx: host services incomplete");
	if (!params || params->struct_size < offsetof(struct lmt_instance_params, peer_host) +
	                                             sizeof(params->peer_host))
		return host->error(host_ctx, LMT_EABI, "ucx: instance parameters too old");
	if (params->role != LMT_ROLE_SOURCE && params->role != LMT_ROLE_DESTINATION)
		return host->error(host_ctx, LMT_EINVAL, "ucx: unknown role %d", (int)params->role);
	if (params->channels == 0 || params->channels > UCX_MAX_CHANNELS)
		return host->error(host_ctx, LMT_EINVAL, "ucx: %u channels, expected 1 to %u",
		                   params->channels, UCX_MAX_CHANNELS);

	struct lmt_instance *inst = calloc(1, sizeof(*inst));
	if (!inst)
		return host->error(host_ctx, LMT_ENOMEM, "ucx: out of memory");
	inst->host = host;
	inst->host_ctx = host_ctx;
	inst->role = params->role;
	inst->channels = params->channels;
	inst->timeout_ns = params->timeout_ns;
	inst->next_region = 1;
	inst->eps = calloc(inst->channels, sizeof(*inst->eps));
	inst->outstanding = calloc(inst->channels, sizeof(*inst->outstanding));
	if (inst->role == LMT_ROLE_SOURCE) {
		if (lmt__cq_init(&inst->cq, inst->channels * UCX_QUEUE_DEPTH))
			inst->cq.ring = NULL;
	}
	if (!inst->eps || !inst->outstanding || (inst->role == LMT_ROLE_SOURCE && !inst->cq.ring)) {
		free_instance(inst);
		return host->error(host_ctx, LMT_ENOMEM, "ucx: out of memory");
	}
	if (init_sync(inst)) {
		free_instance(inst);
		return host->error(host_ctx, LMT_ENOMEM, "ucx: cannot create locks");
	}
	ucx_log_attach(inst);
	int rc = open_context(inst);
	if (rc) {
		ucx_log_detach(inst);
		pthread_cond_destroy(&inst->mr_cond);
		pthread_mutex_destroy(&inst->mr_lock);
		pthread_cond_destroy(&inst->cond);
		pthread_mutex_destroy(&inst->lock);
		free_instance(inst);
		return rc;
	}
	ucx_log(inst, LMT_LOG_DEBUG, "ucx: %s instance, %u channels%s",
	        inst->role == LMT_ROLE_SOURCE ? "source" : "destination", inst->channels,
	        inst->role == LMT_ROLE_DESTINATION ? ""
	        : inst->use_put                    ? ", writes as puts"
	                                           : ", writes as active messages");
	*out = inst;
	return 0;
}

static void free_rkey(struct lmt_rkey *rkey)
{
	free(rkey->unpacked);
	free(rkey);
}

static void ucx_instance_close(lmt_instance *inst)
{
	if (!inst)
		return;
	for (uint32_t c = 0; c < inst->channels; c++)
		if (inst->eps[c])
			ucx_ep_close(inst->eps[c]);
	for (size_t i = 0; i < inst->region_count; i++) {
		if (inst->regions[i]->memh)
			ucp_mem_unmap(inst->context, inst->regions[i]->memh);
		free(inst->regions[i]);
	}
	free(inst->regions);
	while (inst->rkeys) {
		struct lmt_rkey *next = inst->rkeys->next;
		free_rkey(inst->rkeys);
		inst->rkeys = next;
	}
	ucp_cleanup(inst->context);
	ucx_log_detach(inst);
	pthread_cond_destroy(&inst->mr_cond);
	pthread_mutex_destroy(&inst->mr_lock);
	pthread_cond_destroy(&inst->cond);
	pthread_mutex_destroy(&inst->lock);
	free_instance(inst);
}

/* ---- Endpoints --------------------------------------------------------- */

static int ucx_ep_open(lmt_instance *inst, uint32_t channel, lmt_endpoint **out,
                       struct lmt_blob *addr)
{
	if (!inst || !out || !addr)
		return -LMT_EINVAL;
	if (channel >= inst->channels)
		return ucx_error(inst, LMT_EINVAL, "ucx: channel %u out of range (%u channels)",
		                 channel, inst->channels);
	if (inst->eps[channel])
		return ucx_error(inst, LMT_ESTATE, "ucx channel %u: already open", channel);
	lmt_endpoint *ep = calloc(1, sizeof(*ep));
	if (!ep)
		return ucx_error(inst, LMT_ENOMEM, "ucx: out of memory");
	ep->inst = inst;
	ep->channel = channel;
	ep->efd = ep->reply_efd = -1;
	int rc = inst->role == LMT_ROLE_SOURCE ? ucx_source_ep_open(ep, addr)
	                                       : ucx_dest_ep_open(ep, addr);
	if (rc) {
		free(ep);
		return rc;
	}
	pthread_mutex_lock(&inst->lock);
	inst->eps[channel] = ep;
	pthread_mutex_unlock(&inst->lock);
	*out = ep;
	return 0;
}

static int ucx_ep_connect(lmt_endpoint *ep, const struct lmt_blob *peer_addr)
{
	if (!ep || !peer_addr)
		return -LMT_EINVAL;
	if (ep->inst->role == LMT_ROLE_SOURCE)
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
	pthread_mutex_lock(&inst->lock);
	inst->eps[ep->channel] = NULL;
	if (inst->failing && !inst->fatal && all_settled(inst))
		inst->fatal = inst->failing;
	pthread_cond_broadcast(&inst->cond);
	pthread_mutex_unlock(&inst->lock);
	if (inst->role == LMT_ROLE_SOURCE)
		ucx_source_ep_close(ep);
	else
		ucx_dest_ep_close(ep);
	free(ep);
}

/* ---- Registrations ----------------------------------------------------- */

/* Map `mr` for puts and describe it in `key`. */
static int map_region(struct lmt_instance *inst, struct lmt_mr *mr, struct lmt_blob *key)
{
	ucp_mem_map_params_t params = {
	        .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
	                      UCP_MEM_MAP_PARAM_FIELD_PROT,
	        .address = mr->addr,
	        .length = mr->len,
	        .prot = UCP_MEM_MAP_PROT_LOCAL_READ | UCP_MEM_MAP_PROT_LOCAL_WRITE |
	                UCP_MEM_MAP_PROT_REMOTE_WRITE,
	};
	ucs_status_t st = ucp_mem_map(inst->context, &params, &mr->memh);
	if (st != UCS_OK) {
		mr->memh = NULL;
		return ucx_error(inst, ucx_status_code(st), "ucx: cannot map %llu bytes at %p (%s)",
		                 (unsigned long long)mr->len, (void *)mr->addr,
		                 ucs_status_string(st));
	}
	void *packed;
	size_t packed_len;
	st = ucp_rkey_pack(inst->context, mr->memh, &packed, &packed_len);
	if (st != UCS_OK)
		return ucx_error(inst, ucx_status_code(st), "ucx: cannot pack an rkey (%s)",
		                 ucs_status_string(st));
	struct ucx_key k = {.region = mr->id, .base = (uintptr_t)mr->addr, .len = mr->len};
	const char *why = ucx_key_encode(&k, packed, packed_len, key);
	ucp_rkey_buffer_release(packed);
	if (why)
		return ucx_error(inst, LMT_EOVERFLOW,
		                 "ucx: the packed rkey is %zu bytes, a key blob carries %u: "
		                 "restrict ucx.tls or ucx.devices",
		                 packed_len, UCX_RKEY_MAX);
	return 0;
}

static int add_region(struct lmt_instance *inst, struct lmt_mr *mr)
{
	int rc = 0;
	pthread_mutex_lock(&inst->mr_lock);
	if (inst->next_region == 0) {
		rc = ucx_error(inst, LMT_EOVERFLOW, "ucx: region ids exhausted");
	} else if (inst->region_count == inst->region_cap) {
		size_t cap = inst->region_cap ? inst->region_cap * 2 : 16;
		struct lmt_mr **grown = realloc(inst->regions, cap * sizeof(*grown));
		if (grown) {
			inst->regions = grown;
			inst->region_cap = cap;
		} else {
			rc = ucx_error(inst, LMT_ENOMEM, "ucx: out of memory");
		}
	}
	if (rc == 0) {
		mr->id = inst->next_region++;
		inst->regions[inst->region_count++] = mr;
	}
	pthread_mutex_unlock(&inst->mr_lock);
	return rc;
}

static void ucx_mr_deregister(lmt_instance *inst, lmt_mr *mr);

static int ucx_mr_register(lmt_instance *inst, void *addr, size_t len, uint32_t access,
                           lmt_mr **out, struct lmt_blob *key)
{
	if (!inst || !out)
		return -LMT_EINVAL;
	bool remote = access & LMT_MR_REMOTE_WRITE;
	if (!addr || !len || (remote && !key) || (uintptr_t)addr > UINTPTR_MAX - len)
		return ucx_error(inst, LMT_EINVAL, "ucx: cannot register %zu bytes at %p%s", len,
		                 addr, remote && !key ? " without a key blob" : "");
	struct lmt_mr *mr = calloc(1, sizeof(*mr));
	if (!mr)
		return ucx_error(inst, LMT_ENOMEM, "ucx: out of memory");
	mr->addr = addr;
	mr->len = len;
	int rc = add_region(inst, mr);
	if (rc) {
		free(mr);
		return rc;
	}
	if (remote && (rc = map_region(inst, mr, key)) != 0) {
		ucx_mr_deregister(inst, mr);
		return rc;
	}
	if (!remote && key)
		key->len = 0;
	/* Writes may name it only now that it is complete. */
	pthread_mutex_lock(&inst->mr_lock);
	mr->remote_write = remote;
	pthread_mutex_unlock(&inst->mr_lock);
	*out = mr;
	return 0;
}

static void ucx_mr_deregister(lmt_instance *inst, lmt_mr *mr)
{
	if (!inst || !mr)
		return;
	pthread_mutex_lock(&inst->mr_lock);
	size_t i = region_index(inst, mr->id);
	if (i < inst->region_count && inst->regions[i] == mr) {
		memmove(&inst->regions[i], &inst->regions[i + 1],
		        (inst->region_count - i - 1) * sizeof(*inst->regions));
		inst->region_count--;
	}
	/* Receives into it finish, or are cut off past the deadline (soon
	 * after a cancel). */
	uint64_t deadline = inst->timeout_ns ? lmt__deadline(inst->timeout_ns) : UINT64_MAX;
	uint64_t soon = lmt__deadline(UCX_CLOSE_NS);
	bool cut = false;
	while (mr->busy) {
		uint64_t now = lmt__now_ns();
		if (!cut &&
		    (now >= deadline || (now >= soon && inst->host->cancelled(inst->host_ctx)))) {
			ucx_dest_cut(inst, mr);
			cut = true;
		}
		lmt__cond_wait_slice(&inst->mr_cond, &inst->mr_lock, cut ? UINT64_MAX : deadline);
	}
	pthread_mutex_unlock(&inst->mr_lock);
	if (mr->memh)
		ucp_mem_unmap(inst->context, mr->memh);
	free(mr);
}

static int ucx_rkey_import(lmt_instance *inst, const struct lmt_blob *key, lmt_rkey **out)
{
	if (!inst || !key || !out)
		return -LMT_EINVAL;
	*out = NULL;
	struct ucx_key k;
	const char *why = ucx_key_decode(key, &k);
	if (why)
		return ucx_error(inst, LMT_EPROTO, "ucx: bad key blob (%u bytes): %s", key->len,
		                 why);
	struct lmt_rkey *rkey = calloc(1, sizeof(*rkey));
	if (rkey)
		rkey->unpacked = calloc(inst->channels, sizeof(*rkey->unpacked));
	if (!rkey || !rkey->unpacked) {
		free(rkey);
		return ucx_error(inst, LMT_ENOMEM, "ucx: out of memory");
	}
	memcpy(rkey->packed, k.rkey, k.rkey_len);
	rkey->key = k;
	rkey->key.rkey = rkey->packed;
	pthread_mutex_lock(&inst->mr_lock);
	rkey->next = inst->rkeys;
	if (inst->rkeys)
		inst->rkeys->prev = rkey;
	inst->rkeys = rkey;
	pthread_mutex_unlock(&inst->mr_lock);
	*out = rkey;
	return 0;
}

static void ucx_rkey_release(lmt_instance *inst, lmt_rkey *rkey)
{
	if (!inst || !rkey)
		return;
	pthread_mutex_lock(&inst->mr_lock);
	/* An rkey unpacked on a channel, or still in use, waits for the
	 * channel's close (UCX wants it destroyed before its endpoint). */
	bool idle = atomic_load(&rkey->users) == 0;
	for (uint32_t c = 0; idle && c < inst->channels; c++)
		idle = !rkey->unpacked[c];
	if (idle) {
		if (rkey->prev)
			rkey->prev->next = rkey->next;
		else
			inst->rkeys = rkey->next;
		if (rkey->next)
			rkey->next->prev = rkey->prev;
	}
	pthread_mutex_unlock(&inst->mr_lock);
	if (idle)
		free_rkey(rkey);
}

/* ---- Data path --------------------------------------------------------- */

static int ucx_write(lmt_endpoint *ep, const void *local, size_t len, lmt_mr *local_mr,
                     lmt_rkey *rkey, uint64_t offset, uint64_t cookie)
{
	if (!ep)
		return -LMT_EINVAL;
	struct lmt_instance *inst = ep->inst;
	if (inst->role != LMT_ROLE_SOURCE)
		return ucx_error(inst, LMT_ESTATE, "ucx channel %u: write on a destination",
		                 ep->channel);
	if (!rkey || (!local && len))
		return ucx_error(inst, LMT_EINVAL, "ucx channel %u: write without %s", ep->channel,
		                 rkey ? "a source buffer" : "a key");
	if ((uint64_t)len > rkey->key.len || offset > rkey->key.len - len)
		return ucx_error(inst, LMT_EINVAL,
		                 "ucx channel %u: write of %zu bytes at offset %llu past the end "
		                 "of region %u (%llu bytes)",
		                 ep->channel, len, (unsigned long long)offset, rkey->key.region,
		                 (unsigned long long)rkey->key.len);
	if (atomic_load(&inst->outstanding[ep->channel]) >= UCX_QUEUE_DEPTH)
		return -LMT_EAGAIN;
	int rc = ucx_source_write(ep, local, len, rkey, offset, cookie);
	if (rc == 0)
		atomic_fetch_add(&inst->outstanding[ep->channel], 1);
	return rc;
}

static int ucx_progress(lmt_instance *inst, struct lmt_completion *out, uint32_t max,
                        uint64_t timeout_ns)
{
	if (!inst || (!out && max))
		return -LMT_EINVAL;
	uint64_t deadline = lmt__deadline(timeout_ns);
	int rc = 0;
	pthread_mutex_lock(&inst->lock);
	/* Completions come before the fatal error: a failed channel queues
	 * its writes with an error status first, so every cookie is seen. */
	while (!inst->cq.count || !max) {
		if (inst->fatal || !max) {
			rc = inst->fatal;
			goto out;
		}
		if (inst->host->cancelled(inst->host_ctx)) {
			rc = ucx_error(inst, LMT_ECANCELED, "ucx: cancelled");
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

/* Whether every write before `targets` is visible: 1, 0, or the error of
 * a channel that failed first. Called with inst->lock held. */
static int flush_done(struct lmt_instance *inst, const uint64_t *targets)
{
	int done = 1;
	for (uint32_t c = 0; c < inst->channels; c++) {
		lmt_endpoint *ep = inst->eps[c];
		if (!ep || ucx_source_oldest(ep) >= targets[c])
			continue;
		if (ep->final)
			return ep->final;
		done = 0;
	}
	return inst->failing ? inst->failing : inst->fatal ? inst->fatal : done;
}

static int ucx_flush(lmt_instance *inst, uint64_t timeout_ns)
{
	if (!inst)
		return -LMT_EINVAL;
	if (inst->role != LMT_ROLE_SOURCE)
		return 0;
	uint64_t *targets = calloc(inst->channels, sizeof(*targets));
	if (!targets)
		return ucx_error(inst, LMT_ENOMEM, "ucx: out of memory");
	for (uint32_t c = 0; c < inst->channels; c++) {
		lmt_endpoint *ep = inst->eps[c];
		if (ep && ep->lock_ready) {
			pthread_mutex_lock(&ep->lock);
			targets[c] = ep->posted;
			pthread_mutex_unlock(&ep->lock);
			ucx_wake(ep);
		}
	}
	uint64_t deadline = lmt__deadline(timeout_ns);
	int rc;
	pthread_mutex_lock(&inst->lock);
	while ((rc = flush_done(inst, targets)) == 0) {
		if (inst->host->cancelled(inst->host_ctx)) {
			rc = ucx_error(inst, LMT_ECANCELED, "ucx: flush cancelled");
			break;
		}
		if (lmt__now_ns() >= deadline) {
			rc = ucx_error(inst, LMT_ETIMEDOUT,
			               "ucx: flush timed out after %llu ms with writes not yet "
			               "visible",
			               (unsigned long long)(timeout_ns / 1000000));
			break;
		}
		lmt__cond_wait_slice(&inst->cond, &inst->lock, deadline);
	}
	pthread_mutex_unlock(&inst->lock);
	free(targets);
	return rc < 0 ? rc : 0;
}

static const struct lmt_plugin ucx_plugin = {
        .abi_version = LMT_PLUGIN_ABI_VERSION,
        .struct_size = sizeof(struct lmt_plugin),
        .name = "ucx",
        .version = LMT_VERSION,
        .description = "UCX (UCP): puts over RDMA, active messages over tcp and shared memory",
        .caps = LMT_CAP_MULTI_CHANNEL | LMT_CAP_TARGET_PROGRESS,
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
