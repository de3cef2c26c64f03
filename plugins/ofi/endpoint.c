/* Endpoints of the libfabric plugin: one RDM endpoint and CQ per channel, a
 * progress thread each, writes, and the fences that make writes visible. */
#define _GNU_SOURCE
#include "ofi.h"
#include "net.h"

#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include <rdma/fi_cm.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#define OFI_CQ_BATCH 32
#define OFI_NONE UINT32_MAX
#define OFI_POLL_SPINS 64              /* empty polls before a polling thread naps */
#define OFI_POLL_NAP_NS 50000          /* the nap */
#define OFI_DRAIN_NS 1000000000ull     /* longest wait for writes in flight at close */
#define OFI_DRAIN_QUIET_NS 50000000ull /* ... given up when none completes for this long */
#define OFI_GREETING_NAP_NS 1000000    /* a destination waiting for the greeting polls this often */
#define OFI_LINGER_NS 1000000000ull    /* longest wait for a greeting that may be on its way */

static const char *role_name(uint8_t role)
{
	return role == LMT_ROLE_SOURCE ? "source" : "destination";
}

/* ---- Operations ----------------------------------------------------------- */

static void op_free(lmt_endpoint *ep, struct ofi_op *op)
{
	op->state = OFI_OP_FREE;
	op->riders = OFI_NONE;
	op->next = ep->free_head;
	ep->free_head = (uint32_t)(op - ep->ops);
}

/* Report every pending write the last fence made visible. Called with
 * ep->lock held. */
static void release_pending(lmt_endpoint *ep)
{
	uint32_t *link = &ep->pending_head;
	while (*link != OFI_NONE) {
		struct ofi_op *op = &ep->ops[*link];
		if (op->seq >= ep->visible_seq) {
			link = &op->next;
			continue;
		}
		*link = op->next;
		ofi_report(ep, op->cookie, 0);
		op_free(ep, op);
	}
}

static void post_queued(lmt_endpoint *ep);
static int greet(lmt_endpoint *ep);

/* A completion for `context`, with status 0 or -LMT_E*. */
static void op_done(lmt_endpoint *ep, void *context, int status)
{
	struct lmt_instance *inst = ep->inst;
	if (inst->role != LMT_ROLE_SOURCE) {
		ofi_log(inst, LMT_LOG_DEBUG, "ofi channel %u: completion on a destination",
		        ep->channel);
		return;
	}
	if (context == &ep->greeting_op)
		return; /* an error was reported by cq_error */
	pthread_mutex_lock(&ep->lock);
	if (context == &ep->fence_op) {
		ep->inflight--;
		ep->fence_inflight = false;
		if (status == 0) {
			ep->visible_seq = ep->fence_seq;
			release_pending(ep);
		}
		pthread_mutex_unlock(&ep->lock);
		return;
	}
	struct ofi_op *op = context;
	size_t index = (size_t)(op - ep->ops);
	if (!ep->ops || op < ep->ops || index >= inst->queue || op != &ep->ops[index]) {
		pthread_mutex_unlock(&ep->lock);
		ofi_log(inst, LMT_LOG_WARN, "ofi channel %u: completion of an unknown operation",
		        ep->channel);
		return;
	}
	if (op->state == OFI_OP_ABANDONED || op->state == OFI_OP_POSTED) {
		ep->inflight--;
		ep->inflight_bytes -= op->len;
	}
	/* The writes merged into this one end with it; abandoned ones were
	 * reported already. */
	for (uint32_t r = op->riders, next; r != OFI_NONE; r = next) {
		next = ep->ops[r].next;
		if (op->state == OFI_OP_POSTED)
			ofi_report(ep, ep->ops[r].cookie, status);
		op_free(ep, &ep->ops[r]);
	}
	op->riders = OFI_NONE;
	if (op->state == OFI_OP_ABANDONED) {
		op_free(ep, op);
	} else if (op->state == OFI_OP_POSTED) {
		if (status || inst->visibility == OFI_DELIVERY || op->seq < ep->visible_seq) {
			ofi_report(ep, op->cookie, status);
			op_free(ep, op);
		} else {
			op->state = OFI_OP_PENDING;
			op->next = ep->pending_head;
			ep->pending_head = (uint32_t)index;
		}
	}
	post_queued(ep);
	pthread_mutex_unlock(&ep->lock);
}

void ofi_ep_abandon(lmt_endpoint *ep, int status)
{
	if (!ep->lock_ready)
		return;
	pthread_mutex_lock(&ep->lock);
	for (uint32_t i = 0; ep->ops && i < ep->inst->queue; i++) {
		struct ofi_op *op = &ep->ops[i];
		if (op->state == OFI_OP_POSTED) {
			ofi_report(ep, op->cookie, status);
			for (uint32_t r = op->riders; r != OFI_NONE; r = ep->ops[r].next)
				ofi_report(ep, ep->ops[r].cookie, status);
			op->state = OFI_OP_ABANDONED;
		}
	}
	/* Queued writes never reached the provider. */
	while (ep->queued_head != OFI_NONE) {
		struct ofi_op *op = &ep->ops[ep->queued_head];
		ep->queued_head = op->next;
		ofi_report(ep, op->cookie, status);
		op_free(ep, op);
	}
	ep->queued_tail = OFI_NONE;
	ep->queued = 0;
	/* Pending writes are done with the provider: free them outright. */
	while (ep->pending_head != OFI_NONE) {
		struct ofi_op *op = &ep->ops[ep->pending_head];
		ep->pending_head = op->next;
		ofi_report(ep, op->cookie, status);
		op_free(ep, op);
	}
	pthread_mutex_unlock(&ep->lock);
}

/* Post one RMA operation on one buffer: a write, or a fence read. Called
 * with ep->lock held. */
static ssize_t post_rma(lmt_endpoint *ep, bool write, void *buf, size_t len, void *desc,
                        uint64_t addr, uint64_t key, void *context, uint64_t flags)
{
	struct iovec iov = {.iov_base = buf, .iov_len = len};
	struct fi_rma_iov rma = {.addr = addr, .len = len, .key = key};
	struct fi_msg_rma msg = {.msg_iov = &iov,
	                         .desc = &desc,
	                         .iov_count = 1,
	                         .addr = ep->peer,
	                         .rma_iov = &rma,
	                         .rma_iov_count = 1,
	                         .context = context};
	return write ? fi_writemsg(ep->ep, &msg, flags) : fi_readmsg(ep->ep, &msg, flags);
}

/* Coalescing: while the channel has less than OFI_COALESCE_WINDOW bytes in
 * flight, post the writes queued, each run of them that follows each other
 * in both memories under one key as a single write. Called with ep->lock
 * held. */
static void post_queued(lmt_endpoint *ep)
{
	struct lmt_instance *inst = ep->inst;
	if (!inst->coalesce)
		return;
	while (ep->queued_head != OFI_NONE && ep->inflight_bytes < OFI_COALESCE_WINDOW) {
		struct ofi_op *head = &ep->ops[ep->queued_head], *last = head;
		size_t len = head->len;
		uint32_t count = 1;
		while (last->next != OFI_NONE) {
			struct ofi_op *n = &ep->ops[last->next];
			if (n->buf != last->buf + last->len || n->addr != last->addr + last->len ||
			    n->key != head->key || n->desc != head->desc ||
			    n->len > OFI_COALESCE_MAX - len || len + n->len > inst->max_msg)
				break;
			len += n->len;
			last = n;
			count++;
		}
		ssize_t rc = post_rma(ep, true, head->buf, len, head->desc, head->addr, head->key,
		                      &head->ctx, FI_COMPLETION | FI_DELIVERY_COMPLETE);
		if (rc == -FI_EAGAIN)
			return; /* the channel's thread tries again */
		ep->queued_head = last->next;
		if (ep->queued_head == OFI_NONE)
			ep->queued_tail = OFI_NONE;
		ep->queued -= count;
		head->riders = count > 1 ? head->next : OFI_NONE;
		last->next = OFI_NONE;
		for (uint32_t r = head->riders; r != OFI_NONE; r = ep->ops[r].next)
			ep->ops[r].state = OFI_OP_RIDER;
		if (rc == 0) {
			head->state = OFI_OP_POSTED;
			head->len = len;
			ep->inflight++;
			ep->inflight_bytes += len;
			ep->transfers++;
			ep->writes += count;
			continue;
		}
		int err =
		        ofi_error(inst, ofi_code((int)-rc),
		                  "ofi channel %u: fi_writemsg of %zu bytes (%u writes merged): %s",
		                  ep->channel, len, count, fi_strerror((int)-rc));
		ofi_fail(inst, err);
		for (uint32_t r = head->riders, next; r != OFI_NONE; r = next) {
			next = ep->ops[r].next;
			ofi_report(ep, ep->ops[r].cookie, err);
			op_free(ep, &ep->ops[r]);
		}
		ofi_report(ep, head->cookie, err);
		op_free(ep, head);
		return;
	}
}

/* Post a read of the destination's fence region behind the writes, when
 * writes wait for one and none is in flight. */
static void fence(lmt_endpoint *ep)
{
	struct lmt_instance *inst = ep->inst;
	pthread_mutex_lock(&ep->lock);
	if (ep->fence_inflight || ep->pending_head == OFI_NONE) {
		pthread_mutex_unlock(&ep->lock);
		return;
	}
	void *desc = ep->fence_mr ? fi_mr_desc(ep->fence_mr) : NULL;
	ssize_t rc = post_rma(ep, false, &ep->fence_buf[0], sizeof(ep->fence_buf[0]), desc,
	                      ep->fence_base, ep->fence_key, &ep->fence_op.ctx,
	                      FI_COMPLETION | inst->fence_flags);
	if (rc == 0) {
		ep->inflight++;
		ep->fence_inflight = true;
		ep->fence_seq = ep->next_seq;
	}
	pthread_mutex_unlock(&ep->lock);
	if (rc && rc != -FI_EAGAIN)
		ofi_fail(inst, ofi_error(inst, ofi_code((int)-rc), "ofi channel %u: fence read: %s",
		                         ep->channel, fi_strerror((int)-rc)));
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
		ofi_fail(inst, ofi_error(inst, LMT_EIO, "ofi channel %u: fi_cq_readerr: %s",
		                         ep->channel, fi_strerror((int)-n)));
		return;
	}
	char buf[256];
	const char *text = fi_cq_strerror(ep->cq, err.prov_errno, err.err_data, buf, sizeof(buf));
	int code = ofi_code(err.err);
	const char *what = err.op_context == &ep->fence_op      ? "fence read"
	                   : err.op_context == &ep->greeting_op ? "greeting"
	                                                        : "write";
	int rc = ofi_error(inst, code, "ofi channel %u: %s failed: %s (provider %s: %s, error %d)",
	                   ep->channel, what, fi_strerror(err.err),
	                   inst->info->fabric_attr->prov_name, text ? text : "no detail",
	                   err.prov_errno);
	/* Failed first, so that whoever sees the error completion also sees
	 * the session failed. */
	ofi_fail(inst, rc);
	if (err.op_context)
		op_done(ep, err.op_context, rc);
}

static void nap(long ns)
{
	struct timespec ts = {.tv_sec = 0, .tv_nsec = ns};
	nanosleep(&ts, NULL);
}

/* Drive the provider for one channel: harvest completions, fence, and on a
 * destination simply make progress so that writes land. */
static void *ep_thread(void *arg)
{
	lmt_endpoint *ep = arg;
	struct lmt_instance *inst = ep->inst;
	struct fi_cq_entry entries[OFI_CQ_BATCH];
	bool fencing = inst->role == LMT_ROLE_SOURCE && inst->visibility == OFI_FENCE;
	unsigned idle = 0;
	while (!atomic_load(&ep->stopping)) {
		/* While the channel connects, the provider's connection steps
		 * are driven from here: no long sleeps until the greeting is
		 * posted (source) or has landed (destination). */
		bool connecting = inst->role == LMT_ROLE_SOURCE
		                          ? !ep->greeting_posted
		                          : __atomic_load_n(&ep->fence_buf[0], __ATOMIC_ACQUIRE) !=
		                                    ofi_greeting(ep->channel);
		int wait_ms = connecting ? 1 : OFI_SLICE_MS;
		ssize_t n = inst->cq_wait
		                    ? fi_cq_sread(ep->cq, entries, OFI_CQ_BATCH, NULL, wait_ms)
		                    : fi_cq_read(ep->cq, entries, OFI_CQ_BATCH);
		if (n > 0) {
			idle = 0;
			for (ssize_t i = 0; i < n; i++)
				op_done(ep, entries[i].op_context, 0);
		} else if (n == -FI_EAVAIL) {
			cq_error(ep);
		} else if (n == -FI_EAGAIN || n == -FI_ETIMEDOUT || n == -FI_ECANCELED ||
		           n == -FI_EINTR) {
			if (!inst->cq_wait && ++idle > OFI_POLL_SPINS)
				nap(OFI_POLL_NAP_NS);
		} else {
			ofi_fail(inst, ofi_error(inst, ofi_code((int)-n), "ofi channel %u: %s: %s",
			                         ep->channel,
			                         inst->cq_wait ? "fi_cq_sread" : "fi_cq_read",
			                         fi_strerror((int)-n)));
			break;
		}
		if (inst->role == LMT_ROLE_SOURCE && !ep->greeting_posted) {
			int rc = greet(ep);
			if (rc < 0) {
				ofi_fail(inst, rc);
				break;
			}
		}
		if (fencing)
			fence(ep);
		if (inst->coalesce) {
			pthread_mutex_lock(&ep->lock);
			post_queued(ep);
			pthread_mutex_unlock(&ep->lock);
		}
	}
	return NULL;
}

static int start_thread(lmt_endpoint *ep)
{
	/* The embedding VMM's signals belong to its own threads. */
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	int rc = pthread_create(&ep->thread, NULL, ep_thread, ep);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rc)
		return -LMT_ENOMEM;
	ep->thread_started = true;
	return 0;
}

/* Give writes in flight a moment to finish before their endpoint goes, for
 * as long as completions keep coming: the peer may still be working on
 * them, and a peer in the same process (shm maps it by pointer, not by a
 * mapping of its own) would do so in memory about to be unmapped. */
static void drain(lmt_endpoint *ep)
{
	uint64_t deadline = lmt__deadline(OFI_DRAIN_NS);
	uint64_t quiet = lmt__deadline(OFI_DRAIN_QUIET_NS);
	uint32_t last = UINT32_MAX;
	for (;;) {
		pthread_mutex_lock(&ep->lock);
		uint32_t left = ep->inflight + ep->queued;
		pthread_mutex_unlock(&ep->lock);
		uint64_t now = lmt__now_ns();
		if (left != last) {
			last = left;
			quiet = lmt__deadline(OFI_DRAIN_QUIET_NS);
		}
		if (!left || now >= deadline || now >= quiet)
			return;
		nap(OFI_POLL_NAP_NS);
	}
}

/* Whether the source's greeting has landed in this destination's region. */
static bool greeted(lmt_endpoint *ep)
{
	if (!ep->greeted &&
	    __atomic_load_n(&ep->fence_buf[0], __ATOMIC_ACQUIRE) == ofi_greeting(ep->channel))
		ep->greeted = true;
	return ep->greeted;
}

/* A destination must not close while a source may be connecting to it:
 * libfabric 1.17's tcp provider accepts a connection in a thread of its
 * own and keeps the socket in a request that nothing frees if the
 * endpoint closes before ofi_rxm has taken the request, so the socket
 * stays open for the life of the process. Once the greeting has landed,
 * the connection belongs to ofi_rxm, which closes it with the endpoint.
 * Before that, the endpoint waits, up to OFI_LINGER_NS, for the greeting
 * or for a connection in progress to settle (a source that gives up
 * closes it, and the provider then frees the request itself). */
static void linger(lmt_endpoint *ep)
{
	struct lmt_instance *inst = ep->inst;
	if (inst->role != LMT_ROLE_DESTINATION || !atomic_load(&inst->connecting) ||
	    !ep->published || greeted(ep))
		return;
	ep->published = false;
	/* One wait for all the channels of the instance. */
	if (!inst->linger_deadline)
		inst->linger_deadline = lmt__deadline(OFI_LINGER_NS);
	struct fi_cq_entry entries[OFI_CQ_BATCH];
	while (!greeted(ep) && lmt__now_ns() < inst->linger_deadline) {
		/* Writes land only while someone drives the provider. */
		if (!ep->thread_started &&
		    fi_cq_read(ep->cq, entries, OFI_CQ_BATCH) == -FI_EAVAIL) {
			struct fi_cq_err_entry err = {0};
			(void)fi_cq_readerr(ep->cq, &err, 0);
		}
		nap(OFI_GREETING_NAP_NS);
	}
	if (!greeted(ep))
		ofi_log(inst, LMT_LOG_DEBUG,
		        "ofi channel %u: closing without the source's greeting", ep->channel);
}

void ofi_ep_stop(lmt_endpoint *ep)
{
	linger(ep);
	if (!ep->thread_started)
		return;
	if (ep->inst->role == LMT_ROLE_SOURCE)
		drain(ep);
	atomic_store(&ep->stopping, true);
	/* Without a wait object (util CQs), there is nothing to signal. */
	if (ep->inst->cq_wait)
		fi_cq_signal(ep->cq);
	pthread_join(ep->thread, NULL);
	ep->thread_started = false;
}

/* ---- Opening and closing -------------------------------------------------- */

static void ep_destroy(lmt_endpoint *ep)
{
	struct lmt_instance *inst = ep->inst;
	ofi_ep_stop(ep);
	ofi_mr_drop_channel(inst, ep->channel);
	ofi_close_fid(inst, ep->fence_mr ? &ep->fence_mr->fid : NULL, "a fence region");
	if (ep->fence_mapped)
		ofi_key_unmap(inst, ep->fence_key);
	ofi_close_fid(inst, ep->ep ? &ep->ep->fid : NULL, "an endpoint");
	ofi_close_fid(inst, ep->cq ? &ep->cq->fid : NULL, "a completion queue");
	if (ep->lock_ready)
		pthread_mutex_destroy(&ep->lock);
	free(ep->ops);
	free(ep);
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
	else if ((rc = fi_enable(ep->ep)))
		call = "fi_enable";
	if (rc)
		return ofi_error(inst, ofi_code(-rc), "ofi channel %u: %s: %s", ep->channel, call,
		                 fi_strerror(-rc));
	return 0;
}

/* The fence region: the destination's is readable by the source, the
 * source's receives the reads and is registered only with FI_MR_LOCAL. */
static int open_fence(lmt_endpoint *ep, struct ofi_addr *a)
{
	struct lmt_instance *inst = ep->inst;
	a->flags = (inst->mr_mode & FI_MR_VIRT_ADDR ? OFI_KEY_VIRT : 0) |
	           (inst->mr_mode & FI_MR_RAW ? OFI_KEY_RAW : 0);
	if (inst->role == LMT_ROLE_SOURCE) {
		if (!inst->local_mr)
			return 0;
		return ofi_mr_open(inst, ep->fence_buf, sizeof(ep->fence_buf), FI_READ | FI_WRITE,
		                   ep->ep, &ep->fence_mr, "the fence landing buffer");
	}
	int rc = ofi_mr_open(inst, ep->fence_buf, sizeof(ep->fence_buf),
	                     FI_REMOTE_READ | FI_REMOTE_WRITE, ep->ep, &ep->fence_mr,
	                     "the fence region");
	if (rc)
		return rc;
	a->fence_base = inst->mr_mode & FI_MR_VIRT_ADDR ? (uint64_t)(uintptr_t)ep->fence_buf : 0;
	return ofi_mr_key(inst, ep->fence_mr, &a->fence_key, "the fence region");
}

static int alloc_ops(lmt_endpoint *ep)
{
	struct lmt_instance *inst = ep->inst;
	ep->free_head = ep->pending_head = ep->queued_head = ep->queued_tail = OFI_NONE;
	if (pthread_mutex_init(&ep->lock, NULL))
		return ofi_error(inst, LMT_ENOMEM, "ofi: cannot create locks");
	ep->lock_ready = true;
	if (inst->role != LMT_ROLE_SOURCE)
		return 0;
	ep->ops = calloc(inst->queue, sizeof(*ep->ops));
	if (!ep->ops)
		return ofi_error(inst, LMT_ENOMEM, "ofi: out of memory");
	for (uint32_t i = inst->queue; i-- > 0;)
		op_free(ep, &ep->ops[i]);
	return 0;
}

int ofi_ep_open(lmt_instance *inst, uint32_t channel, lmt_endpoint **out, struct lmt_blob *addr)
{
	if (!inst || !out || !addr)
		return -LMT_EINVAL;
	if (channel >= inst->channels)
		return ofi_error(inst, LMT_EINVAL, "ofi: channel %u out of range (%u channels)",
		                 channel, inst->channels);
	if (inst->eps[channel])
		return ofi_error(inst, LMT_ESTATE, "ofi channel %u: already open", channel);
	lmt_endpoint *ep = calloc(1, sizeof(*ep));
	if (!ep)
		return ofi_error(inst, LMT_ENOMEM, "ofi: out of memory");
	ep->inst = inst;
	ep->channel = channel;
	ep->peer = FI_ADDR_NOTAVAIL;
	struct ofi_addr *a = calloc(1, sizeof(*a));
	int rc = a ? 0 : ofi_error(inst, LMT_ENOMEM, "ofi: out of memory");
	if (!rc)
		rc = alloc_ops(ep);
	if (!rc)
		rc = open_fids(ep);
	if (!rc) {
		size_t len = sizeof(a->name);
		rc = fi_getname(&ep->ep->fid, a->name, &len);
		if (rc || len == 0 || len > sizeof(a->name))
			rc = ofi_error(inst, LMT_EIO, "ofi channel %u: fi_getname: %s", channel,
			               rc ? fi_strerror(-rc) : "no name");
		a->name_len = (uint16_t)len;
	}
	if (!rc)
		rc = open_fence(ep, a);
	if (!rc) {
		a->role = (uint8_t)inst->role;
		a->channel = channel;
		a->addr_format = inst->info->addr_format;
		snprintf(a->prov_name, sizeof(a->prov_name), "%s",
		         inst->info->fabric_attr->prov_name);
		if (ofi_addr_encode(a, addr))
			rc = ofi_error(
			        inst, LMT_EOVERFLOW,
			        "ofi channel %u: the endpoint's address (%u bytes) does not fit "
			        "a %u-byte blob",
			        channel, a->name_len, LMT_BLOB_MAX);
	}
	free(a);
	if (rc) {
		ep_destroy(ep);
		return rc;
	}
	pthread_mutex_lock(&inst->lock);
	inst->eps[channel] = ep;
	pthread_mutex_unlock(&inst->lock);
	ep->published = true;
	*out = ep;
	return 0;
}

/* Whether an endpoint name is well formed for its address format. */
static const char *check_name(const struct ofi_addr *a)
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
static int check_peer(lmt_endpoint *ep, const struct ofi_addr *a, const char *why)
{
	struct lmt_instance *inst = ep->inst;
	uint8_t peer_role = inst->role == LMT_ROLE_SOURCE ? LMT_ROLE_DESTINATION : LMT_ROLE_SOURCE;
	if (!why && a->role != peer_role)
		why = inst->role == LMT_ROLE_SOURCE ? "the blob of a source"
		                                    : "the blob of a destination";
	if (!why && a->channel != ep->channel)
		why = "address of another channel";
	if (!why && a->addr_format != inst->info->addr_format)
		why = "another address format";
	if (!why)
		why = check_name(a);
	if (why)
		return ofi_error(inst, LMT_EPROTO,
		                 "ofi channel %u: bad address blob from the %s: %s", ep->channel,
		                 role_name(peer_role), why);
	if (strcmp(a->prov_name, inst->info->fabric_attr->prov_name) != 0)
		return ofi_error(inst, LMT_EMISMATCH,
		                 "ofi channel %u: the %s uses provider %s, this side %s",
		                 ep->channel, role_name(peer_role), a->prov_name,
		                 inst->info->fabric_attr->prov_name);
	uint8_t flags = (inst->mr_mode & FI_MR_VIRT_ADDR ? OFI_KEY_VIRT : 0) |
	                (inst->mr_mode & FI_MR_RAW ? OFI_KEY_RAW : 0);
	if (a->flags != flags)
		return ofi_error(inst, LMT_EMISMATCH,
		                 "ofi channel %u: the %s's memory registration differs (%s%s, here "
		                 "%s%s)",
		                 ep->channel, role_name(peer_role),
		                 a->flags & OFI_KEY_VIRT ? "virtual" : "offset",
		                 a->flags & OFI_KEY_RAW ? ", raw keys" : "",
		                 flags & OFI_KEY_VIRT ? "virtual" : "offset",
		                 flags & OFI_KEY_RAW ? ", raw keys" : "");
	return 0;
}

/* Why a blocking step of the channel must stop, or 0 to go on. */
static int should_stop(lmt_endpoint *ep, uint64_t deadline, const char *what)
{
	struct lmt_instance *inst = ep->inst;
	if (inst->host->cancelled(inst->host_ctx))
		return ofi_error(inst, LMT_ECANCELED, "ofi channel %u: cancelled while %s",
		                 ep->channel, what);
	if (lmt__now_ns() >= deadline)
		return ofi_error(inst, LMT_ETIMEDOUT, "ofi channel %u: timed out after %llu ms %s",
		                 ep->channel, (unsigned long long)(inst->timeout_ns / 1000000),
		                 what);
	return 0;
}

/* The source's first write: the greeting, into the destination's fence
 * region. It makes the provider connect now, during setup, so that no
 * connection is still being made when either side closes. Posted from
 * ep_connect, or by the channel's thread while the provider answers
 * EAGAIN (ofi_rxm does until the destination has accepted). Returns 0
 * once posted, 1 to try again, or an error. */
static int greet(lmt_endpoint *ep)
{
	struct lmt_instance *inst = ep->inst;
	uint64_t flags =
	        FI_COMPLETION | (inst->visibility == OFI_DELIVERY ? FI_DELIVERY_COMPLETE : 0);
	void *desc = ep->fence_mr ? fi_mr_desc(ep->fence_mr) : NULL;
	ssize_t rc = 0;
	pthread_mutex_lock(&ep->lock);
	if (!ep->greeting_posted) {
		ep->fence_buf[1] = ofi_greeting(ep->channel);
		rc = post_rma(ep, true, &ep->fence_buf[1], sizeof(ep->fence_buf[1]), desc,
		              ep->fence_base, ep->fence_key, &ep->greeting_op.ctx, flags);
		ep->greeting_posted = rc == 0;
	}
	pthread_mutex_unlock(&ep->lock);
	if (rc == -FI_EAGAIN)
		return 1;
	if (rc)
		return ofi_error(inst, ofi_code((int)-rc), "ofi channel %u: greeting: %s",
		                 ep->channel, fi_strerror((int)-rc));
	return 0;
}

/* The destination waits for the source's greeting: the channel is then
 * connected, and the connection is ofi_rxm's (see linger). */
static int await_greeting(lmt_endpoint *ep)
{
	struct lmt_instance *inst = ep->inst;
	uint64_t deadline = lmt__deadline(inst->timeout_ns);
	while (!greeted(ep)) {
		pthread_mutex_lock(&inst->lock);
		int fatal = inst->fatal;
		pthread_mutex_unlock(&inst->lock);
		if (fatal)
			return fatal;
		int stop = should_stop(ep, deadline, "waiting for the source to connect");
		if (stop)
			return stop;
		nap(OFI_GREETING_NAP_NS);
	}
	return 0;
}

int ofi_ep_connect(lmt_endpoint *ep, const struct lmt_blob *peer_addr)
{
	if (!ep || !peer_addr)
		return -LMT_EINVAL;
	struct lmt_instance *inst = ep->inst;
	struct ofi_addr *a = malloc(sizeof(*a));
	if (!a)
		return ofi_error(inst, LMT_ENOMEM, "ofi: out of memory");
	int rc = check_peer(ep, a, ofi_addr_decode(peer_addr, a));
	if (!rc && ep->connected)
		rc = ofi_error(inst, LMT_ESTATE, "ofi channel %u: already connected", ep->channel);
	if (!rc && inst->role == LMT_ROLE_SOURCE) {
		if (ep->fence_mapped) /* from an attempt that failed later */
			ofi_key_unmap(inst, ep->fence_key);
		rc = ofi_key_import(inst, &a->fence_key, &ep->fence_key, &ep->fence_mapped,
		                    "the destination's fence region");
		ep->fence_base = inst->mr_mode & FI_MR_VIRT_ADDR ? a->fence_base : 0;
	}
	if (!rc) {
		int n = fi_av_insert(inst->av, a->name, 1, &ep->peer, 0, NULL);
		if (n != 1)
			rc = ofi_error(
			        inst, n < 0 ? ofi_code(-n) : LMT_EPROTO,
			        "ofi channel %u: fi_av_insert of the %s's address: %s", ep->channel,
			        role_name(inst->role == LMT_ROLE_SOURCE ? LMT_ROLE_DESTINATION
			                                                : LMT_ROLE_SOURCE),
			        n < 0 ? fi_strerror(-n) : "refused");
	}
	free(a);
	if (rc)
		return rc;
	if (start_thread(ep))
		return ofi_error(inst, LMT_ENOMEM, "ofi channel %u: cannot start its thread",
		                 ep->channel);
	ep->connected = true;
	ofi_log(inst, LMT_LOG_DEBUG, "ofi channel %u: peer inserted", ep->channel);
	if (inst->role == LMT_ROLE_DESTINATION) {
		atomic_store(&inst->connecting, true);
		return await_greeting(ep);
	}
	rc = greet(ep);
	return rc < 0 ? rc : 0;
}

void ofi_ep_close(lmt_endpoint *ep)
{
	if (!ep)
		return;
	struct lmt_instance *inst = ep->inst;
	ofi_ep_stop(ep);
	if (inst->coalesce)
		ofi_log(inst, LMT_LOG_DEBUG,
		        "ofi channel %u: %llu writes coalesced into %llu transfers", ep->channel,
		        (unsigned long long)ep->writes, (unsigned long long)ep->transfers);
	pthread_mutex_lock(&inst->lock);
	inst->eps[ep->channel] = NULL;
	pthread_cond_broadcast(&inst->cond);
	pthread_mutex_unlock(&inst->lock);
	ep_destroy(ep);
}

/* ---- Writes ------------------------------------------------------------- */

/* The descriptor of the source memory, when the provider wants one. */
static int local_desc(lmt_endpoint *ep, const void *local, size_t len, lmt_mr *mr, void **desc)
{
	struct lmt_instance *inst = ep->inst;
	*desc = NULL;
	if (!inst->local_mr || !len)
		return 0;
	const uint8_t *p = local;
	uint32_t index = ofi_index(inst, ep->channel);
	if (!mr || p < mr->addr || len > mr->len || (size_t)(p - mr->addr) > mr->len - len)
		return ofi_error(inst, LMT_EINVAL,
		                 "ofi channel %u: source memory %p (+%zu) is not inside the "
		                 "registration given, and the provider needs FI_MR_LOCAL",
		                 ep->channel, local, len);
	if (index >= mr->count || !mr->mr[index])
		return ofi_error(inst, LMT_ESTATE,
		                 "ofi channel %u: the source registration has no part for this "
		                 "channel",
		                 ep->channel);
	*desc = fi_mr_desc(mr->mr[index]);
	return 0;
}

static int check_write(lmt_endpoint *ep, const void *local, size_t len, lmt_rkey *rkey,
                       uint64_t offset)
{
	struct lmt_instance *inst = ep->inst;
	if (inst->role != LMT_ROLE_SOURCE)
		return ofi_error(inst, LMT_ESTATE, "ofi channel %u: write on a destination",
		                 ep->channel);
	if (!rkey || (!local && len))
		return ofi_error(inst, LMT_EINVAL, "ofi channel %u: write without %s", ep->channel,
		                 rkey ? "a source buffer" : "a key");
	if ((uint64_t)len > rkey->len || offset > rkey->len - len)
		return ofi_error(
		        inst, LMT_EINVAL,
		        "ofi channel %u: write of %zu bytes at offset %llu past the end of "
		        "a %llu-byte region",
		        ep->channel, len, (unsigned long long)offset,
		        (unsigned long long)rkey->len);
	if ((uint64_t)len > inst->max_msg)
		return ofi_error(inst, LMT_EINVAL,
		                 "ofi channel %u: write of %zu bytes, the provider's limit is %llu",
		                 ep->channel, len, (unsigned long long)inst->max_msg);
	if (!ep->connected)
		return ofi_error(inst, LMT_ESTATE, "ofi channel %u: not connected", ep->channel);
	return 0;
}

int ofi_write(lmt_endpoint *ep, const void *local, size_t len, lmt_mr *local_mr, lmt_rkey *rkey,
              uint64_t offset, uint64_t cookie)
{
	if (!ep)
		return -LMT_EINVAL;
	struct lmt_instance *inst = ep->inst;
	void *desc;
	int rc = check_write(ep, local, len, rkey, offset);
	if (rc || (rc = local_desc(ep, local, len, local_mr, &desc)))
		return rc;
	pthread_mutex_lock(&inst->lock);
	int failing = inst->failing;
	pthread_mutex_unlock(&inst->lock);
	if (failing)
		return ofi_error(inst, -failing, "ofi channel %u: the session failed", ep->channel);
	if (atomic_load(&inst->outstanding[ep->channel]) >= inst->queue)
		return -LMT_EAGAIN;

	pthread_mutex_lock(&ep->lock);
	if (len == 0) {
		/* Nothing to place: visible at once. */
		ep->next_seq++;
		atomic_fetch_add(&inst->outstanding[ep->channel], 1);
		ofi_report(ep, cookie, 0);
		pthread_mutex_unlock(&ep->lock);
		return 0;
	}
	if (ep->free_head == OFI_NONE) {
		pthread_mutex_unlock(&ep->lock);
		return -LMT_EAGAIN;
	}
	struct ofi_op *op = &ep->ops[ep->free_head];
	uint64_t remote = rkey->base + offset, key = rkey->key[ofi_index(inst, ep->channel)];
	bool same_key = ep->tail_key == key && ep->tail_desc == desc;
	ep->tail_key = key;
	ep->tail_desc = desc;
	if (inst->coalesce && same_key &&
	    (ep->queued_head != OFI_NONE || ep->inflight_bytes >= OFI_COALESCE_WINDOW)) {
		/* Under the key of the last write, while the channel is busy:
		 * it waits, and goes with the writes it continues once the
		 * bytes in flight fall below the window. A write under another
		 * key (a chunk window of its own, without pin-all) could never
		 * merge and goes at once; so does any write while the channel
		 * is not busy. The core never has overlapping writes in flight,
		 * so order does not matter. */
		ep->free_head = op->next;
		*op = (struct ofi_op){.cookie = cookie,
		                      .seq = ep->next_seq++,
		                      .next = OFI_NONE,
		                      .state = OFI_OP_QUEUED,
		                      .buf = (uint8_t *)local,
		                      .len = len,
		                      .desc = desc,
		                      .addr = remote,
		                      .key = key,
		                      .riders = OFI_NONE};
		if (ep->queued_tail == OFI_NONE)
			ep->queued_head = (uint32_t)(op - ep->ops);
		else
			ep->ops[ep->queued_tail].next = (uint32_t)(op - ep->ops);
		ep->queued_tail = (uint32_t)(op - ep->ops);
		ep->queued++;
		atomic_fetch_add(&inst->outstanding[ep->channel], 1);
		pthread_mutex_unlock(&ep->lock);
		return 0;
	}
	uint64_t flags = FI_COMPLETION;
	if (inst->visibility == OFI_DELIVERY)
		flags |= FI_DELIVERY_COMPLETE;
	/* Posting under the lock keeps seq in posting order, which fences
	 * rely on, and lets no completion overtake the bookkeeping. */
	op->cookie = cookie;
	op->seq = ep->next_seq;
	op->state = OFI_OP_POSTED;
	op->riders = OFI_NONE;
	ssize_t posted = post_rma(ep, true, (void *)local, len, desc, remote, key, &op->ctx, flags);
	if (posted == 0) {
		ep->free_head = op->next;
		ep->next_seq++;
		ep->inflight++;
		op->len = len;
		ep->inflight_bytes += len;
		ep->transfers++;
		ep->writes++;
		atomic_fetch_add(&inst->outstanding[ep->channel], 1);
	} else {
		op->state = OFI_OP_FREE;
	}
	pthread_mutex_unlock(&ep->lock);
	if (posted == 0)
		return 0;
	if (posted == -FI_EAGAIN)
		return -LMT_EAGAIN;
	return ofi_error(inst, ofi_code((int)-posted),
	                 "ofi channel %u: fi_writemsg of %zu bytes: %s", ep->channel, len,
	                 fi_strerror((int)-posted));
}
