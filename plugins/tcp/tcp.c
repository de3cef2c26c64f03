/* The TCP baseline plugin: descriptor, instances, registrations, progress and
 * flush. Each channel is one TCP stream; see source.c and destination.c. */
#define _GNU_SOURCE
#include "tcp.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <lmt/version.h>

#define DEFAULT_BUFFER_SIZE (4 << 20)

static const struct lmt_option_desc tcp_options[] = {
        {.name = "nodelay",
         .type = LMT_OPT_BOOL,
         .default_value = "on",
         .doc = "disable Nagle's algorithm on data connections"},
        {.name = "buffer-size",
         .type = LMT_OPT_SIZE,
         .default_value = "4M",
         .min = 0,
         .max = 1 << 30,
         .doc = "SO_SNDBUF and SO_RCVBUF per data connection; 0 = kernel default"},
        {.name = "address",
         .type = LMT_OPT_STRING,
         .default_value = "",
         .doc = "IP the destination's data listeners bind; empty = the control connection's"},
};

/* ---- Helpers for the other files -------------------------------------- */

int tcp_thread_start(pthread_t *thread, void *(*fn)(void *), void *arg)
{
	/* The embedding VMM's signals belong to its own threads. */
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	int rc = pthread_create(thread, NULL, fn, arg);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return rc ? -LMT_ENOMEM : 0;
}

uint64_t tcp_op_deadline(const struct lmt_instance *inst)
{
	return inst->timeout_ns ? lmt__deadline(inst->timeout_ns) : UINT64_MAX;
}

struct lmt__wait tcp_wait(const struct lmt_instance *inst, uint64_t deadline_ns)
{
	return (struct lmt__wait){.deadline_ns = deadline_ns == UINT64_MAX ? 0 : deadline_ns,
	                          .cancelled = inst->host->cancelled,
	                          .ctx = inst->host_ctx};
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

void tcp_complete(lmt_endpoint *ep, uint64_t from, uint64_t to, int status)
{
	struct lmt_instance *inst = ep->inst;
	pthread_mutex_lock(&inst->lock);
	for (uint64_t seq = from; seq < to; seq++)
		if (!lmt__cq_push(&inst->cq, ep->ring[seq % TCP_QUEUE_DEPTH].cookie, status,
		                  ep->channel))
			break;
	if (status == 0)
		ep->acked = to;
	else
		ep->final = status;
	/* Progress reports the failure only once every cookie is queued. */
	if (inst->failing && !inst->fatal && all_settled(inst))
		inst->fatal = inst->failing;
	pthread_cond_broadcast(&inst->cond);
	pthread_mutex_unlock(&inst->lock);
}

void tcp_fail_all(struct lmt_instance *inst, int status)
{
	pthread_mutex_lock(&inst->lock);
	if (!inst->failing) {
		inst->failing = status;
		for (uint32_t c = 0; c < inst->channels; c++)
			if (inst->eps[c] && inst->eps[c]->live)
				tcp_source_break(inst->eps[c], status);
		if (all_settled(inst))
			inst->fatal = status;
	}
	pthread_cond_broadcast(&inst->cond);
	pthread_mutex_unlock(&inst->lock);
}

void tcp_go_live(lmt_endpoint *ep)
{
	struct lmt_instance *inst = ep->inst;
	pthread_mutex_lock(&inst->lock);
	ep->live = true;
	if (inst->failing)
		tcp_source_break(ep, inst->failing);
	pthread_mutex_unlock(&inst->lock);
}

void tcp_set_fatal(struct lmt_instance *inst, int code)
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

struct lmt_mr *tcp_region_find(struct lmt_instance *inst, uint32_t id)
{
	size_t i = region_index(inst, id);
	return i < inst->region_count && inst->regions[i]->id == id ? inst->regions[i] : NULL;
}

/* ---- Instances --------------------------------------------------------- */

static int read_options(struct lmt_instance *inst, const struct lmt_instance_params *params)
{
	const struct lmt_host *host = inst->host;
	struct lmt_option_value v;
	inst->nodelay = 1;
	inst->buffer_size = DEFAULT_BUFFER_SIZE;
	if (host->option(inst->host_ctx, "tcp.nodelay", &v) == 0 && v.type == LMT_OPT_BOOL)
		inst->nodelay = v.boolean;
	if (host->option(inst->host_ctx, "tcp.buffer-size", &v) == 0 && v.type == LMT_OPT_SIZE) {
		if (v.integer < 0 || v.integer > (1 << 30))
			return tcp_error(inst, LMT_EINVAL,
			                 "tcp.buffer-size: expected a size from 0 to 1G, got %lld",
			                 (long long)v.integer);
		inst->buffer_size = (int)v.integer;
	}
	snprintf(inst->local_host, sizeof(inst->local_host), "%.*s",
	         (int)strnlen(params->local_host, sizeof(params->local_host)), params->local_host);
	const char *address = inst->local_host;
	if (host->option(inst->host_ctx, "tcp.address", &v) == 0 && v.type == LMT_OPT_STRING &&
	    v.text && v.text[0])
		address = v.text;
	size_t len = strnlen(address, sizeof(inst->bind_host));
	if (len == sizeof(inst->bind_host))
		return tcp_error(inst, LMT_EINVAL, "tcp.address: longer than %zu characters",
		                 sizeof(inst->bind_host) - 1);
	memcpy(inst->bind_host, address, len + 1);
	if (inst->role == LMT_ROLE_DESTINATION && !inst->bind_host[0])
		return tcp_error(inst, LMT_EINVAL,
		                 "tcp: no address for data listeners: set tcp.address");
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
	free(inst->flush_target);
	lmt__cq_free(&inst->cq);
	free(inst);
}

static void tcp_ep_close(lmt_endpoint *ep);

static int open_error(const struct lmt_host *host, void *host_ctx, int code, const char *fmt, ...)
        LMT_PRINTF(4, 5);

static int open_error(const struct lmt_host *host, void *host_ctx, int code, const char *fmt, ...)
{
	char msg[256];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	host->error(host_ctx, code, "%s", msg);
	return -code;
}

static int tcp_instance_open(const struct lmt_host *host, void *host_ctx,
                             const struct lmt_instance_params *params, lmt_instance **out)
{
	if (!host || !out || !host->error)
		return -LMT_EINVAL;
	*out = NULL;
	if (host->struct_size < offsetof(struct lmt_host, cancelled) + sizeof(host->cancelled) ||
	    !host->log || !host->now_ns || !host->option || !host->cancelled)
		return open_error(host, host_ctx, LMT_EABI, "tcp: host services incomplete");
	if (!params || params->struct_size < offsetof(struct lmt_instance_params, peer_host) +
	                                             sizeof(params->peer_host))
		return open_error(host, host_ctx, LMT_EABI, "tcp: instance parameters too old");
	if (params->role != LMT_ROLE_SOURCE && params->role != LMT_ROLE_DESTINATION)
		return open_error(host, host_ctx, LMT_EINVAL, "tcp: unknown role %d",
		                  (int)params->role);
	if (params->channels == 0 || params->channels > TCP_MAX_CHANNELS)
		return open_error(host, host_ctx, LMT_EINVAL, "tcp: %u channels, expected 1 to %u",
		                  params->channels, TCP_MAX_CHANNELS);

	struct lmt_instance *inst = calloc(1, sizeof(*inst));
	if (!inst)
		return open_error(host, host_ctx, LMT_ENOMEM, "tcp: out of memory");
	inst->host = host;
	inst->host_ctx = host_ctx;
	inst->role = params->role;
	inst->channels = params->channels;
	inst->timeout_ns = params->timeout_ns;
	inst->next_region = 1;
	int rc = read_options(inst, params);
	if (rc) {
		free(inst);
		return rc;
	}
	inst->eps = calloc(inst->channels, sizeof(*inst->eps));
	inst->outstanding = calloc(inst->channels, sizeof(*inst->outstanding));
	inst->flush_target = calloc(inst->channels, sizeof(*inst->flush_target));
	if (inst->role == LMT_ROLE_SOURCE) {
		if (lmt__cq_init(&inst->cq, inst->channels * TCP_QUEUE_DEPTH))
			inst->cq.ring = NULL;
	}
	if (!inst->eps || !inst->outstanding || !inst->flush_target ||
	    (inst->role == LMT_ROLE_SOURCE && !inst->cq.ring)) {
		free_instance(inst);
		return open_error(host, host_ctx, LMT_ENOMEM, "tcp: out of memory");
	}
	if (init_sync(inst)) {
		free_instance(inst);
		return open_error(host, host_ctx, LMT_ENOMEM, "tcp: cannot create locks");
	}
	tcp_log(inst, LMT_LOG_DEBUG, "tcp: %s instance, %u channels, nodelay %d, buffers %d",
	        inst->role == LMT_ROLE_SOURCE ? "source" : "destination", inst->channels,
	        inst->nodelay, inst->buffer_size);
	*out = inst;
	return 0;
}

static void tcp_instance_close(lmt_instance *inst)
{
	if (!inst)
		return;
	for (uint32_t c = 0; c < inst->channels; c++)
		if (inst->eps[c])
			tcp_ep_close(inst->eps[c]);
	for (size_t i = 0; i < inst->region_count; i++)
		free(inst->regions[i]);
	free(inst->regions);
	while (inst->rkeys) {
		struct lmt_rkey *next = inst->rkeys->next;
		free(inst->rkeys);
		inst->rkeys = next;
	}
	pthread_cond_destroy(&inst->mr_cond);
	pthread_mutex_destroy(&inst->mr_lock);
	pthread_cond_destroy(&inst->cond);
	pthread_mutex_destroy(&inst->lock);
	free_instance(inst);
}

/* ---- Endpoints --------------------------------------------------------- */

static int tcp_ep_open(lmt_instance *inst, uint32_t channel, lmt_endpoint **out,
                       struct lmt_blob *addr)
{
	if (!inst || !out || !addr)
		return -LMT_EINVAL;
	if (channel >= inst->channels)
		return tcp_error(inst, LMT_EINVAL, "tcp: channel %u out of range (%u channels)",
		                 channel, inst->channels);
	if (inst->eps[channel])
		return tcp_error(inst, LMT_ESTATE, "tcp channel %u: already open", channel);
	lmt_endpoint *ep = calloc(1, sizeof(*ep));
	if (!ep)
		return tcp_error(inst, LMT_ENOMEM, "tcp: out of memory");
	ep->inst = inst;
	ep->channel = channel;
	ep->fd = -1;
	ep->listen_fd = -1;
	int rc = inst->role == LMT_ROLE_SOURCE ? tcp_source_ep_open(ep, addr)
	                                       : tcp_dest_ep_open(ep, addr);
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

static int tcp_ep_connect(lmt_endpoint *ep, const struct lmt_blob *peer_addr)
{
	if (!ep || !peer_addr)
		return -LMT_EINVAL;
	if (ep->inst->role == LMT_ROLE_SOURCE)
		return tcp_source_ep_connect(ep, peer_addr);
	return tcp_dest_ep_connect(ep, peer_addr);
}

static void tcp_ep_close(lmt_endpoint *ep)
{
	if (!ep)
		return;
	struct lmt_instance *inst = ep->inst;
	/* Out of the table first: other channels' threads look there. */
	pthread_mutex_lock(&inst->lock);
	inst->eps[ep->channel] = NULL;
	if (inst->failing && !inst->fatal && all_settled(inst))
		inst->fatal = inst->failing;
	pthread_mutex_unlock(&inst->lock);
	if (inst->role == LMT_ROLE_SOURCE)
		tcp_source_ep_close(ep);
	else
		tcp_dest_ep_close(ep);
	free(ep);
}

/* ---- Registrations ----------------------------------------------------- */

static int tcp_mr_register(lmt_instance *inst, void *addr, size_t len, uint32_t access,
                           lmt_mr **out, struct lmt_blob *key)
{
	if (!inst || !out)
		return -LMT_EINVAL;
	bool remote = access & LMT_MR_REMOTE_WRITE;
	if (!addr || !len || (remote && !key))
		return tcp_error(inst, LMT_EINVAL, "tcp: cannot register %zu bytes at %p%s", len,
		                 addr, remote && !key ? " without a key blob" : "");
	struct lmt_mr *mr = calloc(1, sizeof(*mr));
	if (!mr)
		return tcp_error(inst, LMT_ENOMEM, "tcp: out of memory");
	mr->addr = addr;
	mr->len = len;
	mr->remote_write = remote;

	pthread_mutex_lock(&inst->mr_lock);
	int rc = 0;
	if (inst->next_region == 0) {
		rc = tcp_error(inst, LMT_EOVERFLOW, "tcp: region ids exhausted");
	} else if (inst->region_count == inst->region_cap) {
		size_t cap = inst->region_cap ? inst->region_cap * 2 : 16;
		struct lmt_mr **grown = realloc(inst->regions, cap * sizeof(*grown));
		if (grown) {
			inst->regions = grown;
			inst->region_cap = cap;
		} else {
			rc = tcp_error(inst, LMT_ENOMEM, "tcp: out of memory");
		}
	}
	if (rc == 0) {
		mr->id = inst->next_region++;
		inst->regions[inst->region_count++] = mr;
	}
	pthread_mutex_unlock(&inst->mr_lock);
	if (rc) {
		free(mr);
		return rc;
	}
	if (remote)
		tcp_key_encode(&(struct tcp_key){.region = mr->id, .len = mr->len}, key);
	else if (key)
		key->len = 0;
	*out = mr;
	return 0;
}

/* A receiver still placing data into `mr` past the deadline is cut off:
 * its socket is shut down, which ends the receive and fails the channel.
 * Called with mr_lock held. */
static void cut_off_receivers(struct lmt_instance *inst, struct lmt_mr *mr)
{
	pthread_mutex_lock(&inst->lock);
	for (uint32_t c = 0; c < inst->channels; c++) {
		lmt_endpoint *ep = inst->eps[c];
		if (ep && ep->busy_region == mr && ep->fd >= 0) {
			(void)tcp_error(inst, LMT_ETIMEDOUT,
			                "tcp channel %u: region %u deregistered while data was "
			                "arriving",
			                c, mr->id);
			shutdown(ep->fd, SHUT_RDWR);
		}
	}
	pthread_mutex_unlock(&inst->lock);
}

static void tcp_mr_deregister(lmt_instance *inst, lmt_mr *mr)
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
	uint64_t deadline = tcp_op_deadline(inst);
	bool cut = false;
	while (mr->busy) {
		if (!cut && (lmt__now_ns() >= deadline || inst->host->cancelled(inst->host_ctx))) {
			cut_off_receivers(inst, mr);
			cut = true;
		}
		lmt__cond_wait_slice(&inst->mr_cond, &inst->mr_lock, UINT64_MAX);
	}
	pthread_mutex_unlock(&inst->mr_lock);
	free(mr);
}

static int tcp_rkey_import(lmt_instance *inst, const struct lmt_blob *key, lmt_rkey **out)
{
	if (!inst || !key || !out)
		return -LMT_EINVAL;
	struct tcp_key k;
	const char *why = tcp_key_decode(key, &k);
	if (why)
		return tcp_error(inst, LMT_EPROTO, "tcp: bad key blob (%u bytes): %s", key->len,
		                 why);
	struct lmt_rkey *rkey = calloc(1, sizeof(*rkey));
	if (!rkey)
		return tcp_error(inst, LMT_ENOMEM, "tcp: out of memory");
	rkey->region = k.region;
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

static void tcp_rkey_release(lmt_instance *inst, lmt_rkey *rkey)
{
	if (!inst || !rkey)
		return;
	pthread_mutex_lock(&inst->mr_lock);
	if (rkey->prev)
		rkey->prev->next = rkey->next;
	else
		inst->rkeys = rkey->next;
	if (rkey->next)
		rkey->next->prev = rkey->prev;
	pthread_mutex_unlock(&inst->mr_lock);
	free(rkey);
}

/* ---- Data path --------------------------------------------------------- */

static int tcp_write(lmt_endpoint *ep, const void *local, size_t len, lmt_mr *local_mr,
                     lmt_rkey *rkey, uint64_t offset, uint64_t cookie)
{
	if (!ep)
		return -LMT_EINVAL;
	struct lmt_instance *inst = ep->inst;
	if (inst->role != LMT_ROLE_SOURCE)
		return tcp_error(inst, LMT_ESTATE, "tcp channel %u: write on a destination",
		                 ep->channel);
	if (!rkey || (!local && len))
		return tcp_error(inst, LMT_EINVAL, "tcp channel %u: write without %s", ep->channel,
		                 rkey ? "a source buffer" : "a key");
	if ((uint64_t)len > rkey->len || offset > rkey->len - len)
		return tcp_error(inst, LMT_EINVAL,
		                 "tcp channel %u: write of %zu bytes at offset %llu past the end "
		                 "of region %u (%llu bytes)",
		                 ep->channel, len, (unsigned long long)offset, rkey->region,
		                 (unsigned long long)rkey->len);
	if (atomic_load(&inst->outstanding[ep->channel]) >= TCP_QUEUE_DEPTH)
		return -LMT_EAGAIN;
	int rc = tcp_source_write(ep, local, len, rkey, offset, cookie);
	if (rc == 0)
		atomic_fetch_add(&inst->outstanding[ep->channel], 1);
	return rc;
}

static int tcp_progress(lmt_instance *inst, struct lmt_completion *out, uint32_t max,
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
			rc = tcp_error(inst, LMT_ECANCELED, "tcp: cancelled");
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

/* Whether every write counted in flush_target was acknowledged: 1, 0, or
 * the error of a channel that failed first. Called with inst->lock held. */
static int flush_done(struct lmt_instance *inst)
{
	int done = 1;
	for (uint32_t c = 0; c < inst->channels; c++) {
		lmt_endpoint *ep = inst->eps[c];
		if (!ep || ep->acked >= inst->flush_target[c])
			continue;
		if (ep->final)
			return ep->final;
		done = 0;
	}
	return inst->failing ? inst->failing : inst->fatal ? inst->fatal : done;
}

static int tcp_flush(lmt_instance *inst, uint64_t timeout_ns)
{
	if (!inst)
		return -LMT_EINVAL;
	for (uint32_t c = 0; c < inst->channels; c++) {
		lmt_endpoint *ep = inst->eps[c];
		inst->flush_target[c] = 0;
		if (ep && inst->role == LMT_ROLE_SOURCE) {
			pthread_mutex_lock(&ep->lock);
			inst->flush_target[c] = ep->head;
			pthread_mutex_unlock(&ep->lock);
		}
	}
	uint64_t deadline = lmt__deadline(timeout_ns);
	int rc;
	pthread_mutex_lock(&inst->lock);
	while ((rc = flush_done(inst)) == 0) {
		if (inst->host->cancelled(inst->host_ctx)) {
			rc = tcp_error(inst, LMT_ECANCELED, "tcp: flush cancelled");
			break;
		}
		if (lmt__now_ns() >= deadline) {
			rc = tcp_error(inst, LMT_ETIMEDOUT, "tcp: flush timed out after %llu ms",
			               (unsigned long long)(timeout_ns / 1000000));
			break;
		}
		lmt__cond_wait_slice(&inst->cond, &inst->lock, deadline);
	}
	pthread_mutex_unlock(&inst->lock);
	return rc < 0 ? rc : 0;
}

static const struct lmt_plugin tcp_plugin = {
        .abi_version = LMT_PLUGIN_ABI_VERSION,
        .struct_size = sizeof(struct lmt_plugin),
        .name = "tcp",
        .version = LMT_VERSION,
        .description = "TCP sockets, one stream per channel; works everywhere",
        .caps = LMT_CAP_MULTI_CHANNEL,
        .options = tcp_options,
        .option_count = sizeof(tcp_options) / sizeof(tcp_options[0]),
        .ops =
                {
                        .instance_open = tcp_instance_open,
                        .instance_close = tcp_instance_close,
                        .ep_open = tcp_ep_open,
                        .ep_connect = tcp_ep_connect,
                        .ep_close = tcp_ep_close,
                        .mr_register = tcp_mr_register,
                        .mr_deregister = tcp_mr_deregister,
                        .rkey_import = tcp_rkey_import,
                        .rkey_release = tcp_rkey_release,
                        .write = tcp_write,
                        .progress = tcp_progress,
                        .flush = tcp_flush,
                },
};

LMT_DECLARE_PLUGIN(tcp_plugin)
