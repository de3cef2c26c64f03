/* Endpoints of the libfabric plugin: per channel one RDM endpoint, its
 * completion queue, the fence region whose key travels in the address
 * blob, and the thread that drives the provider. Writes, fences and
 * failures are the source's (source.c); the greeting's wait is the
 * destination's (destination.c); the connections on the endpoint's
 * address are conns.c's. */
#define _GNU_SOURCE
#include "endpoint.h"

#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <rdma/fi_cm.h>
#include <rdma/fi_errno.h>

#include "destination.h"
#include "conns.h"
#include "provider.h"
#include "region.h"
#include "shmlock.h"
#include "sink.h"
#include "source.h"

#define LFI_POLL_SPINS 64 /* empty polls before a polling thread naps */
#define LFI_SLICE_MS 100  /* how long a progress thread sleeps at most */
#define LFI_STUCK_NS 100000000ull /* a lock a frozen peer holds this long is released */

static const char *role_name(uint8_t role)
{
	return role == LMT_ROLE_SOURCE ? "source" : "destination";
}

/* ---- The channel's thread ------------------------------------------------- */

/* A channel thread's failure: the source's session fails; a destination's
 * progress returns it. */
static void fail(lmt_endpoint *ep, int code)
{
	if (ep->inst->base.role == LMT_ROLE_SOURCE)
		lfi_source_fail(ep->inst, code);
	else
		putil_channels_set_fatal(&ep->inst->channels, code);
}

/* A completion for `context`, with status 0 or -LMT_E*. */
static void completed(lmt_endpoint *ep, void *context, int status)
{
	if (ep->inst->base.role == LMT_ROLE_SOURCE)
		lfi_source_done(ep, context, status);
	else
		putil_log(&ep->inst->base, LMT_LOG_DEBUG,
		          "ofi channel %u: completion on a destination", ep->channel);
}

/* Read one error entry and fail the operation it names, and the session. */
static void cq_error(lmt_endpoint *ep)
{
	struct lmt_instance *inst = ep->inst;
	struct fi_cq_err_entry err;
	memset(&err, 0, sizeof(err));
	ssize_t n = fi_cq_readerr(ep->cq, &err, 0);
	if (n != 1) {
		if (n == -FI_EAGAIN)
			return;
		fail(ep, putil_error(&inst->base, LMT_EIO, "ofi channel %u: fi_cq_readerr: %s",
		                     ep->channel, fi_strerror((int)-n)));
		return;
	}
	/* An unasked message that did not fit, or was cut: dropped all the
	 * same, and no concern of the session's. */
	if (err.op_context && lfi_sink_done(ep, err.op_context))
		return;
	char buf[256];
	const char *text = fi_cq_strerror(ep->cq, err.prov_errno, err.err_data, buf, sizeof(buf));
	int code = lfi_code(err.err);
	/* net cancels what was queued on a connection its peer closed: unless
	 * lmt itself is cancelling, the peer is what went away. Over shm a
	 * transfer fails (EIO: the copy from the peer's memory) once the
	 * peer's process is gone: that is a broken connection too. */
	if (code == LMT_ECANCELED && !putil_cancelled(&inst->base))
		code = LMT_ECONN;
	if (inst->shm && code == LMT_EIO && lfi_shmlock_peer_died(ep))
		code = LMT_ECONN;
	const char *what = err.op_context == &ep->fence_op      ? "fence read"
	                   : err.op_context == &ep->greeting_op ? "greeting"
	                   : err.op_context                     ? "write"
	                                                        : "transfer";
	int rc = putil_error(
	        &inst->base, code, "ofi channel %u: %s failed: %s (provider %s: %s, error %d)",
	        ep->channel, what, fi_strerror(err.err), inst->info->fabric_attr->prov_name,
	        text ? text : "no detail", err.prov_errno);
	/* Failed first, so that whoever sees the error completion also sees
	 * the session failed. */
	fail(ep, rc);
	if (err.op_context)
		completed(ep, err.op_context, rc);
}

/* Drive the provider for one channel: harvest completions, fence, and on a
 * destination simply make progress so that writes land. */
static void *channel_thread(void *arg)
{
	lmt_endpoint *ep = arg;
	struct lmt_instance *inst = ep->inst;
	struct fi_cq_entry entries[LFI_CQ_BATCH];
	bool source = inst->base.role == LMT_ROLE_SOURCE;
	bool fencing = source && inst->visibility == LFI_FENCE;
	unsigned idle = 0;
	while (!atomic_load(&ep->stopping)) {
		/* A lock of shm's held by a peer that stopped or died: any
		 * call into the provider would spin in it. */
		if (inst->shm && lfi_shmlock_stuck(ep)) {
			putil_nap(LFI_POLL_NAP_NS);
			if (source)
				lfi_source_abandon(ep);
			continue;
		}
		/* While the channel connects, the provider's connection steps
		 * are driven from here: no long sleeps until the greeting is
		 * posted (source) or has landed (destination). */
		bool connecting = source ? !ep->greeting_posted : !lfi_dest_greeting_landed(ep);
		int wait_ms = connecting ? 1 : LFI_SLICE_MS;
		ssize_t n = inst->cq_wait
		                    ? fi_cq_sread(ep->cq, entries, LFI_CQ_BATCH, NULL, wait_ms)
		                    : fi_cq_read(ep->cq, entries, LFI_CQ_BATCH);
		if (n > 0) {
			idle = 0;
			for (ssize_t i = 0; i < n; i++)
				if (!lfi_sink_done(ep, entries[i].op_context))
					completed(ep, entries[i].op_context, 0);
		} else if (n == -FI_EAVAIL) {
			cq_error(ep);
		} else if (n == -FI_EAGAIN || n == -FI_ETIMEDOUT || n == -FI_ECANCELED ||
		           n == -FI_EINTR) {
			if (!inst->cq_wait && ++idle > LFI_POLL_SPINS)
				putil_nap(LFI_POLL_NAP_NS);
		} else {
			fail(ep,
			     putil_error(&inst->base, lfi_code((int)-n), "ofi channel %u: %s: %s",
			                 ep->channel, inst->cq_wait ? "fi_cq_sread" : "fi_cq_read",
			                 fi_strerror((int)-n)));
			break;
		}
		lfi_sink_refill(ep);
		lfi_conns_trim(ep);
		if (!source)
			continue;
		if (!ep->greeting_posted) {
			int rc = lfi_source_greet(ep);
			if (rc < 0) {
				fail(ep, rc);
				break;
			}
		}
		if (fencing)
			lfi_source_fence(ep);
		if (inst->coalesce)
			lfi_source_post_queued(ep);
		lfi_source_abandon(ep);
	}
	if (source)
		lfi_source_abandon(ep);
	atomic_store(&ep->thread_exited, true);
	return NULL;
}

/* Over shm, wait for the channel's thread to leave the provider: a lock
 * a stopped or dead peer kept holding for LFI_STUCK_NS is released. */
static void await_thread(lmt_endpoint *ep)
{
	uint64_t since = 0;
	while (!atomic_load(&ep->thread_exited)) {
		putil_nap(LFI_POLL_NAP_NS);
		if (!lfi_shmlock_stuck(ep)) {
			since = 0;
			continue;
		}
		uint64_t now = lmt__now_ns();
		if (!since)
			since = now;
		else if (now - since >= LFI_STUCK_NS)
			lfi_shmlock_break(ep);
	}
}

void lfi_endpoint_stop(lmt_endpoint *ep)
{
	struct lmt_instance *inst = ep->inst;
	if (!ep->thread_started)
		return;
	if (inst->base.role == LMT_ROLE_SOURCE)
		lfi_source_drain(ep);
	atomic_store(&ep->stopping, true);
	/* Without a wait object (util CQs), there is nothing to signal. */
	if (inst->cq_wait)
		fi_cq_signal(ep->cq);
	if (inst->shm)
		await_thread(ep);
	pthread_join(ep->thread, NULL);
	ep->thread_started = false;
}

/* ---- Opening and closing -------------------------------------------------- */

static void destroy(lmt_endpoint *ep)
{
	struct lmt_instance *inst = ep->inst;
	lfi_endpoint_stop(ep);
	lfi_regions_drop_channel(inst, ep->channel);
	lfi_close_fid(inst, ep->fence_mr ? &ep->fence_mr->fid : NULL, "a fence region");
	if (ep->fence_mapped)
		lfi_key_unmap(inst, ep->fence_key);
	/* Closing may take shm's locks too: none is left to a frozen peer. */
	lfi_shmlock_settle(ep);
	lfi_shmlock_forget_dead_peer(ep);
	/* Before and after: a connection accepted meanwhile is noted too. */
	lfi_conns_note(ep);
	lfi_close_fid(inst, ep->ep ? &ep->ep->fid : NULL, "an endpoint");
	lfi_conns_note(ep);
	lfi_sink_close(ep);
	lfi_close_fid(inst, ep->cq ? &ep->cq->fid : NULL, "a completion queue");
	if (inst->base.role == LMT_ROLE_SOURCE)
		lfi_source_close(ep);
	free(ep);
}

/* The shm provider names its region after the process id and a counter
 * ("<pid>:<uid>:<n>" in /dev/shm) and refuses to enable an endpoint whose
 * name is taken. A process that died without closing leaves its region
 * behind, and once pids wrap a fresh process meets it: fi_enable fails
 * with EBUSY. A random name per endpoint cannot meet a stale one. */
static int name_shm_endpoint(lmt_endpoint *ep)
{
	struct lmt_instance *inst = ep->inst;
	if (inst->info->addr_format != FI_ADDR_STR ||
	    !strstr(inst->info->fabric_attr->prov_name, "shm"))
		return 0;
	uint64_t r;
	int rc = putil_random(&inst->base, &r, sizeof(r));
	if (rc)
		return rc;
	char name[48];
	snprintf(name, sizeof(name), "fi_shm://lmt-%016llx", (unsigned long long)r);
	snprintf(ep->shm_name, sizeof(ep->shm_name), "%s", name);
	if ((rc = fi_setname(&ep->ep->fid, name, strlen(name) + 1)))
		return putil_error(&inst->base, lfi_code(-rc), "ofi channel %u: fi_setname: %s",
		                   ep->channel, fi_strerror(-rc));
	return 0;
}

static int open_fids(lmt_endpoint *ep)
{
	struct lmt_instance *inst = ep->inst;
	struct fi_cq_attr attr = {.format = FI_CQ_FORMAT_CONTEXT,
	                          .size = inst->queue + 16,
	                          .wait_obj = inst->cq_wait ? FI_WAIT_FD : FI_WAIT_NONE};
	const char *call = NULL;
	int rc;
	if ((rc = fi_cq_open(inst->domain, &attr, &ep->cq, NULL)))
		call = "fi_cq_open";
	else if ((rc = fi_endpoint(inst->domain, inst->info, &ep->ep, NULL)))
		call = "fi_endpoint";
	else if ((rc = fi_ep_bind(ep->ep, &inst->av->fid, 0)))
		call = "fi_ep_bind (address vector)";
	else if ((rc = fi_ep_bind(ep->ep, &ep->cq->fid, FI_TRANSMIT | FI_RECV)))
		call = "fi_ep_bind (completion queue)";
	if (rc)
		return putil_error(&inst->base, lfi_code(-rc), "ofi channel %u: %s: %s",
		                   ep->channel, call, fi_strerror(-rc));
	if ((rc = name_shm_endpoint(ep)))
		return rc;
	if ((rc = fi_enable(ep->ep)))
		return putil_error(&inst->base, lfi_code(-rc), "ofi channel %u: fi_enable: %s",
		                   ep->channel, fi_strerror(-rc));
	return lfi_sink_open(ep);
}

/* The fence region: the destination's is readable by the source, the
 * source's receives the reads and is registered only with FI_MR_LOCAL. */
static int open_fence(lmt_endpoint *ep, struct lfi_addr *a)
{
	struct lmt_instance *inst = ep->inst;
	a->flags = lfi_key_flags(inst);
	if (inst->base.role == LMT_ROLE_SOURCE) {
		if (!inst->local_mr)
			return 0;
		return lfi_mr_open(inst, ep->fence_buf, sizeof(ep->fence_buf), FI_READ | FI_WRITE,
		                   ep->ep, &ep->fence_mr, "the fence landing buffer");
	}
	int rc = lfi_mr_open(inst, ep->fence_buf, sizeof(ep->fence_buf),
	                     FI_REMOTE_READ | FI_REMOTE_WRITE, ep->ep, &ep->fence_mr,
	                     "the fence region");
	if (rc)
		return rc;
	a->fence_base = inst->mr_mode & FI_MR_VIRT_ADDR ? (uint64_t)(uintptr_t)ep->fence_buf : 0;
	return lfi_mr_key(inst, ep->fence_mr, &a->fence_key, "the fence region");
}

/* The address blob: who this endpoint is and where its fence region is. */
static int describe(lmt_endpoint *ep, struct lfi_addr *a, struct lmt_blob *addr)
{
	struct lmt_instance *inst = ep->inst;
	size_t len = sizeof(a->name);
	int rc = fi_getname(&ep->ep->fid, a->name, &len);
	if (rc || len == 0 || len > sizeof(a->name))
		return putil_error(&inst->base, LMT_EIO, "ofi channel %u: fi_getname: %s",
		                   ep->channel, rc ? fi_strerror(-rc) : "no name");
	a->name_len = (uint16_t)len;
	if (inst->sockets && len <= sizeof(ep->bound)) {
		memcpy(&ep->bound, a->name, len);
		ep->bound_len = (socklen_t)len;
	}
	if ((rc = open_fence(ep, a)))
		return rc;
	a->role = (uint8_t)inst->base.role;
	a->channel = ep->channel;
	a->addr_format = inst->info->addr_format;
	snprintf(a->prov_name, sizeof(a->prov_name), "%s", inst->info->fabric_attr->prov_name);
	if (lfi_addr_encode(a, addr))
		return putil_error(&inst->base, LMT_EOVERFLOW,
		                   "ofi channel %u: the endpoint's address (%u bytes) does not fit "
		                   "a %u-byte blob",
		                   ep->channel, a->name_len, LMT_BLOB_MAX);
	return 0;
}

int lfi_endpoint_open(struct lmt_instance *inst, uint32_t channel, lmt_endpoint **out,
                      struct lmt_blob *addr)
{
	lmt_endpoint *ep = calloc(1, sizeof(*ep));
	if (!ep)
		return putil_error(&inst->base, LMT_ENOMEM, "ofi: out of memory");
	ep->inst = inst;
	ep->channel = channel;
	ep->peer = FI_ADDR_NOTAVAIL;
	struct lfi_addr *a = calloc(1, sizeof(*a));
	int rc = a ? 0 : putil_error(&inst->base, LMT_ENOMEM, "ofi: out of memory");
	if (!rc && inst->base.role == LMT_ROLE_SOURCE)
		rc = lfi_source_open(ep);
	if (!rc)
		rc = open_fids(ep);
	if (!rc)
		rc = describe(ep, a, addr);
	free(a);
	if (rc) {
		destroy(ep);
		return rc;
	}
	/* A source connects out and never needs to be connected to. */
	if (inst->base.role == LMT_ROLE_SOURCE)
		lfi_conns_seal(ep);
	*out = ep;
	return 0;
}

/* ---- Connecting ------------------------------------------------------------ */

/* Whether an endpoint name is well formed for its address format. */
static const char *check_name(const struct lfi_addr *a)
{
	const struct sockaddr *sa = (const struct sockaddr *)a->name;
	switch (a->addr_format) {
	case FI_SOCKADDR_IN:
		return a->name_len == sizeof(struct sockaddr_in) && sa->sa_family == AF_INET
		               ? NULL
		               : "not an IPv4 socket address";
	case FI_SOCKADDR_IN6:
		return a->name_len == sizeof(struct sockaddr_in6) && sa->sa_family == AF_INET6
		               ? NULL
		               : "not an IPv6 socket address";
	case FI_SOCKADDR:
		if (a->name_len == sizeof(struct sockaddr_in) && sa->sa_family == AF_INET)
			return NULL;
		if (a->name_len == sizeof(struct sockaddr_in6) && sa->sa_family == AF_INET6)
			return NULL;
		return "not a socket address";
	case FI_ADDR_STR:
		if (a->name[a->name_len - 1] != 0 || strlen((const char *)a->name) == 0)
			return "not a string";
		for (const uint8_t *p = a->name; *p; p++)
			if (*p < 0x20 || *p > 0x7e)
				return "not a printable string";
		return NULL;
	default:
		return NULL; /* provider-specific: fi_av_insert checks it */
	}
}

/* Validate the peer's blob against this endpoint. */
static int check_peer(lmt_endpoint *ep, const struct lfi_addr *a, const char *why)
{
	struct lmt_instance *inst = ep->inst;
	uint8_t peer_role =
	        inst->base.role == LMT_ROLE_SOURCE ? LMT_ROLE_DESTINATION : LMT_ROLE_SOURCE;
	if (!why && a->role != peer_role)
		why = inst->base.role == LMT_ROLE_SOURCE ? "the blob of a source"
		                                         : "the blob of a destination";
	if (!why && a->channel != ep->channel)
		why = "address of another channel";
	if (!why && a->addr_format != inst->info->addr_format)
		why = "another address format";
	if (!why)
		why = check_name(a);
	if (why)
		return putil_error(&inst->base, LMT_EPROTO,
		                   "ofi channel %u: bad address blob from the %s: %s", ep->channel,
		                   role_name(peer_role), why);
	if (strcmp(a->prov_name, inst->info->fabric_attr->prov_name) != 0)
		return putil_error(&inst->base, LMT_EMISMATCH,
		                   "ofi channel %u: the %s uses provider %s, this side %s",
		                   ep->channel, role_name(peer_role), a->prov_name,
		                   inst->info->fabric_attr->prov_name);
	uint8_t flags = lfi_key_flags(inst);
	if (a->flags != flags)
		return putil_error(
		        &inst->base, LMT_EMISMATCH,
		        "ofi channel %u: the %s's memory registration differs (%s%s, here "
		        "%s%s)",
		        ep->channel, role_name(peer_role),
		        a->flags & LFI_KEY_VIRT ? "virtual" : "offset",
		        a->flags & LFI_KEY_RAW ? ", raw keys" : "",
		        flags & LFI_KEY_VIRT ? "virtual" : "offset",
		        flags & LFI_KEY_RAW ? ", raw keys" : "");
	return 0;
}

/* Connect to the peer's endpoint: validate its blob, import the key of the
 * destination's fence region (source), insert its address. */
static int insert_peer(lmt_endpoint *ep, const struct lmt_blob *peer_addr)
{
	struct lmt_instance *inst = ep->inst;
	struct lfi_addr *a = malloc(sizeof(*a));
	if (!a)
		return putil_error(&inst->base, LMT_ENOMEM, "ofi: out of memory");
	int rc = check_peer(ep, a, lfi_addr_decode(peer_addr, a));
	if (!rc && ep->connected)
		rc = putil_error(&inst->base, LMT_ESTATE, "ofi channel %u: already connected",
		                 ep->channel);
	if (!rc && inst->base.role == LMT_ROLE_SOURCE) {
		if (ep->fence_mapped) /* from an attempt that failed later */
			lfi_key_unmap(inst, ep->fence_key);
		rc = lfi_key_import(inst, &a->fence_key, &ep->fence_key, &ep->fence_mapped,
		                    "the destination's fence region");
		ep->fence_base = inst->mr_mode & FI_MR_VIRT_ADDR ? a->fence_base : 0;
	}
	if (!rc) {
		int n = fi_av_insert(inst->av, a->name, 1, &ep->peer, 0, NULL);
		if (n == 1 && inst->shm && ep->shm_name[0])
			lfi_shmlock_find(ep, a->name, a->name_len);
		if (n != 1)
			rc = putil_error(
			        &inst->base, n < 0 ? lfi_code(-n) : LMT_EPROTO,
			        "ofi channel %u: fi_av_insert of the %s's address: %s", ep->channel,
			        role_name(inst->base.role == LMT_ROLE_SOURCE ? LMT_ROLE_DESTINATION
			                                                     : LMT_ROLE_SOURCE),
			        n < 0 ? fi_strerror(-n) : "refused");
	}
	free(a);
	return rc;
}

int lfi_endpoint_connect(lmt_endpoint *ep, const struct lmt_blob *peer_addr)
{
	struct lmt_instance *inst = ep->inst;
	bool source = inst->base.role == LMT_ROLE_SOURCE;
	int rc = insert_peer(ep, peer_addr);
	if (rc)
		return rc;
	/* Live before its thread starts, which may fail the session at once. */
	if (source)
		lfi_source_go_live(ep);
	if (lmt__thread_start(&ep->thread, channel_thread, ep))
		return putil_error(&inst->base, LMT_ENOMEM,
		                   "ofi channel %u: cannot start its thread", ep->channel);
	ep->thread_started = true;
	ep->connected = true;
	putil_log(&inst->base, LMT_LOG_DEBUG, "ofi channel %u: peer inserted", ep->channel);
	if (!source)
		return lfi_dest_connect(ep);
	/* Over shm the channel's thread posts the greeting: a post there may
	 * meet a lock a stopped peer holds, which only the thread can wait
	 * out. */
	if (inst->shm)
		return 0;
	rc = lfi_source_greet(ep);
	return rc < 0 ? rc : 0;
}

void lfi_endpoint_close(lmt_endpoint *ep)
{
	struct lmt_instance *inst = ep->inst;
	lfi_endpoint_stop(ep);
	if (inst->coalesce)
		putil_log(&inst->base, LMT_LOG_DEBUG,
		          "ofi channel %u: %llu writes coalesced into %llu transfers", ep->channel,
		          (unsigned long long)ep->writes, (unsigned long long)ep->transfers);
	if (ep->sink_taken || ep->trims)
		putil_log(&inst->base, LMT_LOG_WARN,
		          "ofi channel %u: dropped %lu messages nobody asked for and shut %u "
		          "connections down beyond the %d kept",
		          ep->channel, ep->sink_taken, ep->trims, LFI_CONNS_MAX);
	destroy(ep);
}
