/* The file plugin: saves a guest to a file and restores it (file:PATH).
 * The "peer" is a file on a local file system that the core lays out
 * itself (docs/file-format.md): writes and reads land at fixed offsets,
 * one thread and descriptor per channel (channel.c), the blobs the core
 * hands over checked in wire.c. It registers no memory. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "instance.h"
#include "sync.h"

#include <lmt/version.h>

/* ---- Instances --------------------------------------------------------- */

static void file_instance_close(lmt_instance *inst);

static int file_instance_open(const struct lmt_host *host, void *host_ctx,
                              const struct lmt_instance_params *params, lmt_instance **out)
{
	int rc = putil_instance_check("file", host, host_ctx, params, FILE_MAX_CHANNELS);
	if (rc)
		return rc;
	struct lmt_instance *inst = calloc(1, sizeof(*inst));
	if (!inst)
		return host->error(host_ctx, LMT_ENOMEM, "file: out of memory");
	putil_instance_init(&inst->base, "file", host, host_ctx, params);
	inst->direct = putil_option_bool(&inst->base, "direct-io", false);
	int64_t depth = putil_option_int(&inst->base, "queue-depth", 64);
	inst->depth = depth > 0 && depth <= 4096 ? (uint32_t)depth : 64;
	inst->ring_cap = inst->base.channels * inst->depth;
	inst->ring = calloc(inst->ring_cap, sizeof(*inst->ring));
	if (!inst->ring || pthread_mutex_init(&inst->lock, NULL)) {
		free(inst->ring);
		free(inst);
		return host->error(host_ctx, LMT_ENOMEM, "file: out of memory");
	}
	inst->sync_fd = -1;
	bool cond = lmt__cond_init(&inst->cond) == 0;
	if (!cond || lmt__cond_init(&inst->sync_cond)) {
		if (cond)
			pthread_cond_destroy(&inst->cond);
		pthread_mutex_destroy(&inst->lock);
		free(inst->ring);
		free(inst);
		return host->error(host_ctx, LMT_ENOMEM,
		                   "file: cannot create a condition variable");
	}
	*out = inst;
	return 0;
}

static void file_ep_close(lmt_endpoint *ep);

static void file_instance_close(lmt_instance *inst)
{
	if (!inst)
		return;
	file_syncer_stop(inst);
	for (uint32_t c = 0; c < FILE_MAX_CHANNELS; c++)
		if (inst->eps[c])
			file_ep_close(inst->eps[c]);
	while (inst->rkeys) {
		struct lmt_rkey *k = inst->rkeys;
		inst->rkeys = k->next;
		free(k);
	}
	pthread_cond_destroy(&inst->sync_cond);
	pthread_cond_destroy(&inst->cond);
	pthread_mutex_destroy(&inst->lock);
	free(inst->ring);
	free(inst);
}

/* ---- Endpoints --------------------------------------------------------- */

static int file_ep_open(lmt_instance *inst, uint32_t channel, lmt_endpoint **out,
                        struct lmt_blob *addr)
{
	const struct putil_instance *base = &inst->base;
	if (channel >= base->channels)
		return putil_error(base, LMT_EINVAL, "file: channel %u out of range (%u channels)",
		                   channel, base->channels);
	if (inst->eps[channel])
		return putil_error(base, LMT_ESTATE, "file channel %u: already open", channel);
	struct lmt_endpoint *ep = calloc(1, sizeof(*ep));
	if (ep)
		ep->queue = calloc(inst->depth, sizeof(*ep->queue));
	if (!ep || !ep->queue || lmt__cond_init(&ep->cond)) {
		if (ep)
			free(ep->queue);
		free(ep);
		return putil_error(base, LMT_ENOMEM, "file channel %u: out of memory", channel);
	}
	ep->inst = inst;
	ep->channel = channel;
	ep->fd = -1;
	/* Nobody reads it (there is no peer), but the core wants an address. */
	memset(addr, 0, sizeof(*addr));
	addr->len = (uint32_t)snprintf((char *)addr->data, sizeof(addr->data), "file channel %u",
	                               channel);
	pthread_mutex_lock(&inst->lock);
	inst->eps[channel] = ep;
	pthread_mutex_unlock(&inst->lock);
	*out = ep;
	return 0;
}

static int file_ep_connect(lmt_endpoint *ep, const struct lmt_blob *peer_addr)
{
	struct lmt_instance *inst = ep->inst;
	const struct putil_instance *base = &inst->base;
	struct file_address a;
	const char *why = file_wire_address(peer_addr, &a);
	if (why)
		return putil_error(base, LMT_EPROTO, "file channel %u: %s", ep->channel, why);
	if (ep->fd >= 0)
		return putil_error(base, LMT_ESTATE, "file channel %u: already open", ep->channel);
	bool reading = a.mode == LMT_STORAGE_READ;
	if (reading != (base->role == LMT_ROLE_DESTINATION))
		return putil_error(base, LMT_EINVAL,
		                   "file channel %u: a %s opens the file to %s, not to %s",
		                   ep->channel, reading ? "source" : "destination",
		                   reading ? "write" : "read", reading ? "read" : "write");
	return file_channel_open(inst, &a, ep);
}

static void file_ep_close(lmt_endpoint *ep)
{
	struct lmt_instance *inst = ep->inst;
	file_channel_close(ep);
	pthread_mutex_lock(&inst->lock);
	inst->eps[ep->channel] = NULL;
	pthread_mutex_unlock(&inst->lock);
	pthread_cond_destroy(&ep->cond);
	free(ep->queue);
	free(ep);
}

/* ---- Keys -------------------------------------------------------------- */

static int file_mr_register(lmt_instance *inst, void *addr, size_t len, uint32_t access,
                            lmt_mr **mr, struct lmt_blob *key)
{
	return putil_error(&inst->base, LMT_ENOTSUP,
	                   "file: registers no memory (its writes and reads need none)");
}

static void file_mr_deregister(lmt_instance *inst, lmt_mr *mr)
{
	/* file_mr_register hands out no registration to release. */
}

static int file_rkey_import(lmt_instance *inst, const struct lmt_blob *key, lmt_rkey **out)
{
	const struct putil_instance *base = &inst->base;
	struct file_range r;
	const char *why = file_wire_key(key, &r);
	if (why)
		return putil_error(base, LMT_EPROTO, "file: %s", why);
	pthread_mutex_lock(&inst->lock);
	bool reading = base->role == LMT_ROLE_DESTINATION;
	uint64_t size = inst->size;
	pthread_mutex_unlock(&inst->lock);
	/* A reader never reads past the end; a writer may grow the file. */
	if (reading && (r.offset > size || r.length > size - r.offset))
		return putil_error(
		        base, LMT_EPROTO,
		        "file '%s' is %llu bytes: %llu bytes at offset %llu run past its "
		        "end (the file is truncated)",
		        inst->path, (unsigned long long)size, (unsigned long long)r.length,
		        (unsigned long long)r.offset);
	struct lmt_rkey *k = calloc(1, sizeof(*k));
	if (!k)
		return putil_error(base, LMT_ENOMEM, "file: out of memory");
	k->range = r;
	pthread_mutex_lock(&inst->lock);
	k->next = inst->rkeys;
	inst->rkeys = k;
	pthread_mutex_unlock(&inst->lock);
	*out = k;
	return 0;
}

static void file_rkey_release(lmt_instance *inst, lmt_rkey *rkey)
{
	pthread_mutex_lock(&inst->lock);
	for (struct lmt_rkey **p = &inst->rkeys; *p; p = &(*p)->next)
		if (*p == rkey) {
			*p = rkey->next;
			free(rkey);
			break;
		}
	pthread_mutex_unlock(&inst->lock);
}

/* ---- Transfers --------------------------------------------------------- */

static int file_write(lmt_endpoint *ep, const void *local, size_t len, lmt_mr *local_mr,
                      lmt_rkey *rkey, uint64_t offset, uint64_t cookie)
{
	return file_channel_post(ep, false, (void *)(uintptr_t)local, len, rkey, offset, cookie);
}

static int file_read(lmt_endpoint *ep, void *local, size_t len, lmt_rkey *rkey, uint64_t offset,
                     uint64_t cookie)
{
	return file_channel_post(ep, true, local, len, rkey, offset, cookie);
}

static int file_progress(lmt_instance *inst, struct lmt_completion *out, uint32_t max,
                         uint64_t timeout_ns)
{
	return file_channel_progress(inst, out, max, timeout_ns);
}

static int file_flush(lmt_instance *inst, uint64_t timeout_ns)
{
	return file_channel_flush(inst, timeout_ns);
}

static const struct lmt_plugin file_plugin = {
        .abi_version = LMT_PLUGIN_ABI_VERSION,
        .struct_size = sizeof(struct lmt_plugin),
        .write_access = "no remote writer: the file plugin writes and reads a local file "
                        "created with mode 0600; whoever may open that file may read the "
                        "guest's memory and, before a restore, change it (verify=on "
                        "checks every page against digests kept in the same file, which "
                        "catches damage, not a forger).",
        .name = "file",
        .version = LMT_VERSION,
        .description = "saves a guest to a file and restores it (file:PATH), a thread "
                       "and pwrite/pread per channel",
        .caps = LMT_CAP_MULTI_CHANNEL | LMT_CAP_STORAGE,
        .options = NULL,
        .option_count = 0,
        .ops =
                {
                        .instance_open = file_instance_open,
                        .instance_close = file_instance_close,
                        .ep_open = file_ep_open,
                        .ep_connect = file_ep_connect,
                        .ep_close = file_ep_close,
                        .mr_register = file_mr_register,
                        .mr_deregister = file_mr_deregister,
                        .rkey_import = file_rkey_import,
                        .rkey_release = file_rkey_release,
                        .write = file_write,
                        .progress = file_progress,
                        .flush = file_flush,
                },
        .read = file_read,
};

LMT_DECLARE_PLUGIN(file_plugin)
