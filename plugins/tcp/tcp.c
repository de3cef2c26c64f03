/* The TCP baseline plugin: descriptor, options, instances and the ops that
 * dispatch to the source and destination sides of a channel. Each channel
 * is one TCP stream. Below it: source.c and destination.c (the two ends of
 * a channel), region.c (registrations), wire.c (the formats). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "channel_tls.h"
#include "destination.h"
#include "instance.h"
#include "region.h"
#include "source.h"

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

/* ---- Instances --------------------------------------------------------- */

static int read_options(struct lmt_instance *inst)
{
	const struct putil_instance *base = &inst->base;
	inst->nodelay = putil_option_bool(base, "tcp.nodelay", true);
	int64_t size = putil_option_int(base, "tcp.buffer-size", DEFAULT_BUFFER_SIZE);
	if (size < 0 || size > (1 << 30))
		return putil_error(base, LMT_EINVAL,
		                   "tcp.buffer-size: expected a size from 0 to 1G, got %lld",
		                   (long long)size);
	inst->buffer_size = (int)size;
	const char *address = putil_option_text(base, "tcp.address", "");
	if (!address[0])
		address = base->local_host;
	size_t len = strlen(address);
	if (len >= sizeof(inst->bind_host))
		return putil_error(base, LMT_EINVAL, "tcp.address: longer than %zu characters",
		                   sizeof(inst->bind_host) - 1);
	memcpy(inst->bind_host, address, len + 1);
	if (base->role == LMT_ROLE_DESTINATION && !inst->bind_host[0])
		return putil_error(base, LMT_EINVAL,
		                   "tcp: no address for data listeners: set tcp.address");
	return 0;
}

static int tcp_instance_open(const struct lmt_host *host, void *host_ctx,
                             const struct lmt_instance_params *params, lmt_instance **out)
{
	if (!out)
		return -LMT_EINVAL;
	*out = NULL;
	int rc = putil_instance_check("tcp", host, host_ctx, params, TCP_MAX_CHANNELS);
	if (rc)
		return rc;
	struct lmt_instance *inst = calloc(1, sizeof(*inst));
	if (!inst)
		return host->error(host_ctx, LMT_ENOMEM, "tcp: out of memory"), -LMT_ENOMEM;
	putil_instance_init(&inst->base, "tcp", host, host_ctx, params);
	tcp_tls_init(inst, params);
	if ((rc = read_options(inst)) ||
	    (rc = putil_channels_init(&inst->channels, &inst->base, TCP_QUEUE_DEPTH))) {
		free(inst);
		return rc;
	}
	if ((rc = putil_registry_init(&inst->registry, &inst->base, UINT64_MAX))) {
		putil_channels_fini(&inst->channels);
		free(inst);
		return rc;
	}
	putil_log(&inst->base, LMT_LOG_DEBUG,
	          "tcp: %s instance, %u channels, nodelay %d, buffers %d",
	          params->role == LMT_ROLE_SOURCE ? "source" : "destination", params->channels,
	          inst->nodelay, inst->buffer_size);
	*out = inst;
	return 0;
}

static void tcp_ep_close(lmt_endpoint *ep);

static void tcp_instance_close(lmt_instance *inst)
{
	if (!inst)
		return;
	for (uint32_t c = 0; c < inst->channels.count; c++) {
		lmt_endpoint *ep = putil_channels_endpoint(&inst->channels, c);
		if (ep)
			tcp_ep_close(ep);
	}
	tcp_regions_release_all(inst);
	putil_registry_fini(&inst->registry);
	putil_channels_fini(&inst->channels);
	explicit_bzero(inst->tls_secret, sizeof(inst->tls_secret));
	free(inst);
}

/* ---- Endpoints --------------------------------------------------------- */

static int tcp_ep_open(lmt_instance *inst, uint32_t channel, lmt_endpoint **out,
                       struct lmt_blob *addr)
{
	if (!inst || !out || !addr)
		return -LMT_EINVAL;
	int rc = putil_channels_check_open(&inst->channels, channel);
	if (rc)
		return rc;
	lmt_endpoint *ep = calloc(1, sizeof(*ep));
	if (!ep)
		return putil_error(&inst->base, LMT_ENOMEM, "tcp: out of memory");
	ep->inst = inst;
	ep->channel = channel;
	ep->fd = -1;
	ep->listen_fd = -1;
	rc = tcp_tls_open(ep);
	if (!rc)
		rc = inst->base.role == LMT_ROLE_SOURCE ? tcp_source_ep_open(ep, addr)
		                                        : tcp_dest_ep_open(ep, addr);
	if (rc) {
		tcp_tls_close(ep);
		free(ep);
		return rc;
	}
	putil_channels_attach(&inst->channels, channel, ep);
	*out = ep;
	return 0;
}

static int tcp_ep_connect(lmt_endpoint *ep, const struct lmt_blob *peer_addr)
{
	if (!ep || !peer_addr)
		return -LMT_EINVAL;
	if (ep->inst->base.role == LMT_ROLE_SOURCE)
		return tcp_source_ep_connect(ep, peer_addr);
	return tcp_dest_ep_connect(ep, peer_addr);
}

static void tcp_ep_close(lmt_endpoint *ep)
{
	if (!ep)
		return;
	struct lmt_instance *inst = ep->inst;
	putil_channels_detach(&inst->channels, ep->channel);
	if (inst->base.role == LMT_ROLE_SOURCE)
		tcp_source_ep_close(ep);
	else
		tcp_dest_ep_close(ep);
	tcp_tls_close(ep);
	putil_channels_closed(&inst->channels, ep->channel);
	free(ep);
}

/* ---- Data path --------------------------------------------------------- */

static int tcp_write(lmt_endpoint *ep, const void *local, size_t len, lmt_mr *local_mr,
                     lmt_rkey *rkey, uint64_t offset, uint64_t cookie)
{
	if (!ep)
		return -LMT_EINVAL;
	struct lmt_instance *inst = ep->inst;
	int rc = putil_write_check(&inst->base, ep->channel, local, len, rkey != NULL,
	                           rkey ? rkey->len : 0, offset);
	if (rc)
		return rc;
	rc = putil_channels_admit(&inst->channels, ep->channel);
	if (!rc && !(rc = tcp_source_write(ep, local, len, rkey, offset, cookie)))
		putil_channels_posted(&inst->channels, ep->channel);
	return rc;
}

static int tcp_progress(lmt_instance *inst, struct lmt_completion *out, uint32_t max,
                        uint64_t timeout_ns)
{
	return inst ? putil_channels_progress(&inst->channels, out, max, timeout_ns) : -LMT_EINVAL;
}

/* A write is acknowledged once placed, so waiting for the completions is
 * the whole flush. */
static int tcp_flush(lmt_instance *inst, uint64_t timeout_ns)
{
	return inst ? putil_channels_flush(&inst->channels, timeout_ns) : -LMT_EINVAL;
}

static const struct lmt_plugin tcp_plugin = {
        .abi_version = LMT_PLUGIN_ABI_VERSION,
        .struct_size = sizeof(struct lmt_plugin),
        .write_access =
                "a write needs its channel's 64-bit random token, presented in the hello of "
                "its TCP connection and compared in constant time, and a 64-bit random "
                "region id; both reach the source only over the authenticated control "
                "connection, and any other connection is dropped. With tls=off the stream is "
                "not encrypted or integrity-protected: an attacker on the path who can "
                "inject into the TCP connection can alter what it carries. With tls=on "
                "each connection is TLS 1.3 keyed by a pre-shared key derived, per channel, "
                "from a secret of the session's TLS control connection: only the session's "
                "source can complete the handshake, and the stream is encrypted and "
                "authenticated.",
        .name = "tcp",
        .version = LMT_VERSION,
        .description = "TCP sockets, one stream per channel; works everywhere",
        .caps = LMT_CAP_MULTI_CHANNEL | LMT_CAP_ENCRYPTS,
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
