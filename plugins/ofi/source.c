/* Source side of a libfabric channel: writes and their completions, the
 * fences that make writes visible without delivery completion, coalescing,
 * the greeting, and what a failure owes the core: every write reported
 * once, with the error. */
#define _GNU_SOURCE
#include "source.h"

#include <stdlib.h>
#include <string.h>

#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include "provider.h"
#include "shmlock.h"

#define LFI_NONE UINT32_MAX
#define LFI_COALESCE_MAX (64u << 20)   /* largest merged write */
#define LFI_COALESCE_WINDOW (1u << 20) /* coalescing: bytes in flight before writes wait */
#define LFI_DRAIN_NS 1000000000ull     /* longest wait for writes in flight at close */
#define LFI_DRAIN_QUIET_NS 50000000ull /* ... given up when none completes for this long */
#define LFI_GREETING_WAIT_NS 1000000000ull /* shm: longest wait for the greeting at close */

/* ---- Operations ----------------------------------------------------------- */

static void op_free(lmt_endpoint *ep, struct lfi_op *op)
{
	op->state = LFI_OP_FREE;
	op->riders = LFI_NONE;
	op->next = ep->free_head;
	ep->free_head = (uint32_t)(op - ep->ops);
}

/* Queue a write's completion for the core. Called with ep->lock held. */
static void report(lmt_endpoint *ep, uint64_t cookie, int status)
{
	/* Never full: a write is refused while its channel has `queue`
	 * completions unharvested. */
	putil_channels_complete(&ep->inst->channels, ep->channel, cookie, status);
}

/* Report every pending write the last fence made visible. Called with
 * ep->lock held. */
static void release_pending(lmt_endpoint *ep)
{
	uint32_t *link = &ep->pending_head;
	while (*link != LFI_NONE) {
		struct lfi_op *op = &ep->ops[*link];
		if (op->seq >= ep->visible_seq) {
			link = &op->next;
			continue;
		}
		*link = op->next;
		report(ep, op->cookie, 0);
		op_free(ep, op);
	}
}

/* Post one RMA operation on one buffer: a write, or a fence read. Called
 * with ep->lock held, except by post_queued. */
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

int lfi_source_open(lmt_endpoint *ep)
{
	struct lmt_instance *inst = ep->inst;
	ep->free_head = ep->pending_head = ep->queued_head = ep->queued_tail = LFI_NONE;
	if (pthread_mutex_init(&ep->lock, NULL))
		return putil_error(&inst->base, LMT_ENOMEM, "ofi: cannot create locks");
	ep->lock_ready = true;
	ep->ops = calloc(inst->queue, sizeof(*ep->ops));
	if (!ep->ops)
		return putil_error(&inst->base, LMT_ENOMEM, "ofi: out of memory");
	for (uint32_t i = inst->queue; i-- > 0;)
		op_free(ep, &ep->ops[i]);
	return 0;
}

void lfi_source_close(lmt_endpoint *ep)
{
	if (ep->lock_ready)
		pthread_mutex_destroy(&ep->lock);
	free(ep->ops);
}

/* ---- Failure -------------------------------------------------------------- */

/* The channel table's break callback, run under its lock for each live
 * channel once the source fails. Reporting what the channel owes takes
 * ep->lock, which completion handling holds while it reports into the
 * table (ep->lock, then the table's lock), so this only marks the channel
 * and wakes its thread; lfi_source_abandon does the rest outside the
 * table's lock. */
static void break_channel(void *arg, int status)
{
	lmt_endpoint *ep = arg;
	atomic_store(&ep->broken, status);
	/* Without a wait object (util CQs), there is nothing to signal. */
	if (ep->inst->cq_wait)
		fi_cq_signal(ep->cq);
}

void lfi_source_fail(struct lmt_instance *inst, int code)
{
	putil_channels_fail(&inst->channels, code, break_channel);
}

void lfi_source_go_live(lmt_endpoint *ep)
{
	putil_channels_go_live(&ep->inst->channels, ep->channel, break_channel);
}

/* Report every write the channel still owes with `status`: those the
 * provider has (their completions, when they come, are dropped), those
 * queued behind them and those waiting for a fence. Called with ep->lock
 * held. */
static void report_owed(lmt_endpoint *ep, int status)
{
	for (uint32_t i = 0; i < ep->inst->queue; i++) {
		struct lfi_op *op = &ep->ops[i];
		if (op->state == LFI_OP_POSTED) {
			report(ep, op->cookie, status);
			for (uint32_t r = op->riders; r != LFI_NONE; r = ep->ops[r].next)
				report(ep, ep->ops[r].cookie, status);
			op->state = LFI_OP_ABANDONED;
		}
	}
	/* Queued writes never reached the provider. */
	while (ep->queued_head != LFI_NONE) {
		struct lfi_op *op = &ep->ops[ep->queued_head];
		ep->queued_head = op->next;
		report(ep, op->cookie, status);
		op_free(ep, op);
	}
	ep->queued_tail = LFI_NONE;
	ep->queued = 0;
	/* Pending writes are done with the provider: free them outright. */
	while (ep->pending_head != LFI_NONE) {
		struct lfi_op *op = &ep->ops[ep->pending_head];
		ep->pending_head = op->next;
		report(ep, op->cookie, status);
		op_free(ep, op);
	}
}

void lfi_source_abandon(lmt_endpoint *ep)
{
	/* Once abandoned, never the lock again: progress calls this every
	 * time, and a thread may be stuck in the provider holding it. */
	int status = atomic_load(&ep->broken);
	if (!status || atomic_load(&ep->abandoned))
		return;
	pthread_mutex_lock(&ep->lock);
	if (!atomic_load(&ep->abandoned)) {
		report_owed(ep, status);
		putil_channels_settle(&ep->inst->channels, ep->channel, status);
		/* Last: whoever sees it set may count on the channel settled. */
		atomic_store(&ep->abandoned, true);
	}
	pthread_mutex_unlock(&ep->lock);
}

void lfi_source_abandon_all(struct lmt_instance *inst)
{
	for (uint32_t c = 0; c < inst->channels.count; c++) {
		lmt_endpoint *ep = putil_channels_endpoint(&inst->channels, c);
		if (ep)
			lfi_source_abandon(ep);
	}
}

/* ---- Completions, coalescing, fences -------------------------------------- */

/* Coalescing: the run of queued writes from the head that follow each
 * other in both memories under one key, up to LFI_COALESCE_MAX. Its last
 * write is *last, its length *len; returns how many writes it has. */
static uint32_t queued_run(lmt_endpoint *ep, struct lfi_op **last, size_t *len)
{
	struct lfi_op *head = &ep->ops[ep->queued_head];
	uint32_t count = 1;
	*last = head;
	*len = head->len;
	while ((*last)->next != LFI_NONE) {
		struct lfi_op *n = &ep->ops[(*last)->next];
		if (n->buf != (*last)->buf + (*last)->len || n->addr != (*last)->addr + (*last)->len ||
		    n->key != head->key || n->desc != head->desc || n->len > LFI_COALESCE_MAX - *len ||
		    *len + n->len > ep->inst->max_msg)
			break;
		*len += n->len;
		*last = n;
		count++;
	}
	return count;
}

/* Take a run off the queue as one posted write, merged into its head.
 * Called with ep->lock held. */
static void take_run(lmt_endpoint *ep, struct lfi_op *head, struct lfi_op *last, size_t len,
                     uint32_t count)
{
	ep->queued_head = last->next;
	if (ep->queued_head == LFI_NONE)
		ep->queued_tail = LFI_NONE;
	ep->queued -= count;
	head->riders = count > 1 ? head->next : LFI_NONE;
	last->next = LFI_NONE;
	for (uint32_t r = head->riders; r != LFI_NONE; r = ep->ops[r].next)
		ep->ops[r].state = LFI_OP_RIDER;
	head->state = LFI_OP_POSTED;
	head->len = len;
	ep->inflight++;
	ep->inflight_bytes += len;
}

/* The provider did not take a run (-FI_EAGAIN): back to the head of the
 * queue as it was, unless the channel was abandoned meanwhile, which
 * reported it. Called with ep->lock held. */
static void untake_run(lmt_endpoint *ep, struct lfi_op *head, size_t first_len)
{
	bool abandoned = head->state == LFI_OP_ABANDONED;
	ep->inflight--;
	ep->inflight_bytes -= head->len;
	uint32_t index = (uint32_t)(head - ep->ops), last = index, count = 1;
	for (uint32_t r = head->riders, next; r != LFI_NONE; r = next) {
		next = ep->ops[r].next;
		if (abandoned) {
			op_free(ep, &ep->ops[r]);
			continue;
		}
		ep->ops[r].state = LFI_OP_QUEUED;
		last = r;
		count++;
	}
	if (abandoned) {
		op_free(ep, head);
		return;
	}
	head->state = LFI_OP_QUEUED;
	head->len = first_len;
	head->next = head->riders;
	head->riders = LFI_NONE;
	ep->ops[last].next = ep->queued_head;
	if (ep->queued_head == LFI_NONE)
		ep->queued_tail = last;
	ep->queued_head = index;
	ep->queued += count;
}

/* A merged write the provider refused: every write in it fails, unless
 * the channel was abandoned meanwhile, which reported them. Called with
 * ep->lock held. */
static void fail_run(lmt_endpoint *ep, struct lfi_op *head, uint32_t count, ssize_t rc)
{
	struct lmt_instance *inst = ep->inst;
	bool abandoned = head->state == LFI_OP_ABANDONED;
	ep->inflight--;
	ep->inflight_bytes -= head->len;
	int err = 0;
	if (!abandoned) {
		err = putil_error(&inst->base, lfi_code((int)-rc),
		                  "ofi channel %u: fi_writemsg of %zu bytes (%u writes merged): %s",
		                  ep->channel, head->len, count, fi_strerror((int)-rc));
		lfi_source_fail(inst, err);
	}
	for (uint32_t r = head->riders, next; r != LFI_NONE; r = next) {
		next = ep->ops[r].next;
		if (!abandoned)
			report(ep, ep->ops[r].cookie, err);
		op_free(ep, &ep->ops[r]);
	}
	head->riders = LFI_NONE;
	if (!abandoned)
		report(ep, head->cookie, err);
	op_free(ep, head);
}

/* Coalescing: while the channel has less than LFI_COALESCE_WINDOW bytes in
 * flight, post the writes queued, each run of them as a single write.
 * Only the channel's thread posts them, and without ep->lock: over shm a
 * post waits on the target's lock for as long as the target copies, and
 * a caller of lfi_source_write must not wait that long for ep->lock (the
 * core's lmt_save_iterate has a budget of a few milliseconds). The run
 * is taken off the queue, counted as posted, first, so that an abandon
 * meanwhile reports it once. Called with ep->lock held; returns with it
 * held. */
static void post_queued(lmt_endpoint *ep)
{
	struct lmt_instance *inst = ep->inst;
	if (!inst->coalesce)
		return;
	while (ep->queued_head != LFI_NONE && ep->inflight_bytes < LFI_COALESCE_WINDOW &&
	       !atomic_load(&ep->abandoned)) {
		struct lfi_op *head = &ep->ops[ep->queued_head], *last;
		size_t len, first_len = head->len;
		uint32_t count = queued_run(ep, &last, &len);
		take_run(ep, head, last, len, count);
		pthread_mutex_unlock(&ep->lock);
		ssize_t rc = post_rma(ep, true, head->buf, len, head->desc, head->addr, head->key,
		                      &head->ctx, FI_COMPLETION | FI_DELIVERY_COMPLETE);
		pthread_mutex_lock(&ep->lock);
		if (rc == -FI_EAGAIN) {
			untake_run(ep, head, first_len);
			return; /* the channel's thread tries again */
		}
		if (rc) {
			fail_run(ep, head, count, rc);
			return;
		}
		ep->transfers++;
		ep->writes += count;
	}
}

void lfi_source_post_queued(lmt_endpoint *ep)
{
	pthread_mutex_lock(&ep->lock);
	post_queued(ep);
	pthread_mutex_unlock(&ep->lock);
}

void lfi_source_done(lmt_endpoint *ep, void *context, int status)
{
	struct lmt_instance *inst = ep->inst;
	if (context == &ep->greeting_op) {
		atomic_store(&ep->greeting_done, true);
		return; /* an error was reported with the error entry */
	}
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
	struct lfi_op *op = context;
	size_t index = (size_t)(op - ep->ops);
	if (!ep->ops || op < ep->ops || index >= inst->queue || op != &ep->ops[index]) {
		pthread_mutex_unlock(&ep->lock);
		putil_log(&inst->base, LMT_LOG_WARN,
		          "ofi channel %u: completion of an unknown operation", ep->channel);
		return;
	}
	if (op->state == LFI_OP_ABANDONED || op->state == LFI_OP_POSTED) {
		ep->inflight--;
		ep->inflight_bytes -= op->len;
	}
	/* The writes merged into this one end with it; abandoned ones were
	 * reported already. */
	for (uint32_t r = op->riders, next; r != LFI_NONE; r = next) {
		next = ep->ops[r].next;
		if (op->state == LFI_OP_POSTED)
			report(ep, ep->ops[r].cookie, status);
		op_free(ep, &ep->ops[r]);
	}
	op->riders = LFI_NONE;
	if (op->state == LFI_OP_ABANDONED) {
		op_free(ep, op);
	} else if (op->state == LFI_OP_POSTED) {
		if (status || inst->visibility == LFI_DELIVERY || op->seq < ep->visible_seq) {
			report(ep, op->cookie, status);
			op_free(ep, op);
		} else {
			op->state = LFI_OP_PENDING;
			op->next = ep->pending_head;
			ep->pending_head = (uint32_t)index;
		}
	}
	post_queued(ep);
	pthread_mutex_unlock(&ep->lock);
}

void lfi_source_fence(lmt_endpoint *ep)
{
	struct lmt_instance *inst = ep->inst;
	pthread_mutex_lock(&ep->lock);
	if (ep->fence_inflight || ep->pending_head == LFI_NONE) {
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
		lfi_source_fail(inst, putil_error(&inst->base, lfi_code((int)-rc),
		                                  "ofi channel %u: fence read: %s", ep->channel,
		                                  fi_strerror((int)-rc)));
}

int lfi_source_greet(lmt_endpoint *ep)
{
	struct lmt_instance *inst = ep->inst;
	uint64_t flags =
	        FI_COMPLETION | (inst->visibility == LFI_DELIVERY ? FI_DELIVERY_COMPLETE : 0);
	void *desc = ep->fence_mr ? fi_mr_desc(ep->fence_mr) : NULL;
	ssize_t rc = 0;
	pthread_mutex_lock(&ep->lock);
	if (!ep->greeting_posted) {
		ep->fence_buf[1] = lfi_greeting(ep->channel);
		rc = post_rma(ep, true, &ep->fence_buf[1], sizeof(ep->fence_buf[1]), desc,
		              ep->fence_base, ep->fence_key, &ep->greeting_op.ctx, flags);
		ep->greeting_posted = rc == 0;
	}
	pthread_mutex_unlock(&ep->lock);
	if (rc == -FI_EAGAIN)
		return 1;
	if (rc)
		return putil_error(&inst->base, lfi_code((int)-rc), "ofi channel %u: greeting: %s",
		                   ep->channel, fi_strerror((int)-rc));
	return 0;
}

/* The shm provider serves a source's connection request, sent with the
 * first attempt at its first write (the greeting), by mapping the source's
 * region by name.
 * A source that closes its endpoint first unlinks that region, and
 * libfabric 1.17's shm then crashes the destination inside fi_cq_read.
 * The greeting asks for delivery completion, which the destination gives
 * once it has served what came before it: until then the endpoint stays,
 * for at most LFI_GREETING_WAIT_NS over all the channels of a close. */
static void await_greeting(lmt_endpoint *ep)
{
	struct lmt_instance *inst = ep->inst;
	/* Not only a greeting posted: shm sends the request on the first
	 * attempt and answers FI_EAGAIN until it is served, so a channel
	 * whose greeting is still being retried has a request out too. */
	if (!inst->shm || !ep->connected || atomic_load(&ep->greeting_done) ||
	    lfi_shmlock_peer_frozen(ep))
		return;
	if (!inst->greeting_deadline)
		inst->greeting_deadline = lmt__deadline(LFI_GREETING_WAIT_NS);
	while (!atomic_load(&ep->greeting_done) && lmt__now_ns() < inst->greeting_deadline)
		putil_nap(LFI_POLL_NAP_NS);
}

/* Writes in flight at close: over tcp a write whose peer is gone never
 * completes, so the drain gives up once none completes for a while. Over
 * shm a peer in the same process (lmt-plugin-check) reads the source's
 * memory by pointer, so its progress would touch freed memory after the
 * close: there the drain waits the whole bound, which a loaded host's
 * pauses fit in. */
void lfi_source_drain(lmt_endpoint *ep)
{
	/* A peer that no longer runs completes nothing. */
	if (ep->inst->shm && lfi_shmlock_peer_frozen(ep))
		return;
	await_greeting(ep);
	uint64_t quiet_ns = ep->inst->shm ? LFI_DRAIN_NS : LFI_DRAIN_QUIET_NS;
	uint64_t deadline = lmt__deadline(LFI_DRAIN_NS);
	uint64_t quiet = lmt__deadline(quiet_ns);
	uint32_t last = UINT32_MAX;
	for (;;) {
		pthread_mutex_lock(&ep->lock);
		uint32_t left = ep->inflight + ep->queued;
		pthread_mutex_unlock(&ep->lock);
		uint64_t now = lmt__now_ns();
		if (left != last) {
			last = left;
			quiet = lmt__deadline(quiet_ns);
		}
		if (!left || now >= deadline || now >= quiet)
			return;
		putil_nap(LFI_POLL_NAP_NS);
	}
}

/* ---- Writes --------------------------------------------------------------- */

/* Index of the key or MR that `channel` uses. */
static uint32_t key_index(const struct lmt_instance *inst, uint32_t channel)
{
	return (inst->mr_mode & FI_MR_ENDPOINT) ? channel : 0;
}

/* The descriptor of the source memory, when the provider wants one. */
static int local_desc(lmt_endpoint *ep, const void *local, size_t len, lmt_mr *mr, void **desc)
{
	struct lmt_instance *inst = ep->inst;
	*desc = NULL;
	if (!inst->local_mr || !len)
		return 0;
	const uint8_t *p = local;
	uint32_t index = key_index(inst, ep->channel);
	if (!mr || p < mr->addr || len > mr->len || (size_t)(p - mr->addr) > mr->len - len)
		return putil_error(&inst->base, LMT_EINVAL,
		                   "ofi channel %u: source memory %p (+%zu) is not inside the "
		                   "registration given, and the provider needs FI_MR_LOCAL",
		                   ep->channel, local, len);
	if (index >= mr->count || !mr->mr[index])
		return putil_error(&inst->base, LMT_ESTATE,
		                   "ofi channel %u: the source registration has no part for this "
		                   "channel",
		                   ep->channel);
	*desc = fi_mr_desc(mr->mr[index]);
	return 0;
}

/* Hold a write back behind the channel's writes in flight (coalescing).
 * Called with ep->lock held. */
static void queue_write(lmt_endpoint *ep, struct lfi_op *op, const void *local, size_t len,
                        void *desc, uint64_t remote, uint64_t key, uint64_t cookie)
{
	ep->free_head = op->next;
	*op = (struct lfi_op){.cookie = cookie,
	                      .seq = ep->next_seq++,
	                      .next = LFI_NONE,
	                      .state = LFI_OP_QUEUED,
	                      .buf = (uint8_t *)local,
	                      .len = len,
	                      .desc = desc,
	                      .addr = remote,
	                      .key = key,
	                      .riders = LFI_NONE};
	if (ep->queued_tail == LFI_NONE)
		ep->queued_head = (uint32_t)(op - ep->ops);
	else
		ep->ops[ep->queued_tail].next = (uint32_t)(op - ep->ops);
	ep->queued_tail = (uint32_t)(op - ep->ops);
	ep->queued++;
}

/* Accept a write: 0, -LMT_EAGAIN, or the provider's refusal as a negative
 * libfabric error number. Called with ep->lock held. */
static ssize_t accept_write(lmt_endpoint *ep, const void *local, size_t len, void *desc,
                            lmt_rkey *rkey, uint64_t offset, uint64_t cookie)
{
	struct lmt_instance *inst = ep->inst;
	if (len == 0) {
		/* Nothing to place: visible at once. */
		ep->next_seq++;
		report(ep, cookie, 0);
		return 0;
	}
	if (ep->free_head == LFI_NONE)
		return -FI_EAGAIN;
	struct lfi_op *op = &ep->ops[ep->free_head];
	uint64_t remote = rkey->base + offset, key = rkey->key[key_index(inst, ep->channel)];
	if (inst->coalesce) {
		/* Every write waits in the queue for the channel's thread,
		 * which posts it, merged with the writes it continues once
		 * the bytes in flight fall below the window: the caller never
		 * waits inside the provider (post_queued). The core never has
		 * overlapping writes in flight, so order does not matter. */
		bool idle = ep->queued_head == LFI_NONE && ep->inflight_bytes < LFI_COALESCE_WINDOW;
		queue_write(ep, op, local, len, desc, remote, key, cookie);
		/* The channel's thread, asleep in fi_cq_sread, wakes for a
		 * completion or its timeout (LFI_SLICE_MS): when the window
		 * has room, the write must not wait for either. */
		if (idle && inst->cq_wait)
			fi_cq_signal(ep->cq);
		return 0;
	}
	/* The caller posts itself (ofi.coalesce=off): never into a lock a
	 * stopped or dead peer holds. */
	if (inst->shm && lfi_shmlock_stuck(ep))
		return -FI_EAGAIN;
	uint64_t flags = FI_COMPLETION;
	if (inst->visibility == LFI_DELIVERY)
		flags |= FI_DELIVERY_COMPLETE;
	/* Posting under the lock keeps seq in posting order, which fences
	 * rely on, and lets no completion overtake the bookkeeping. */
	op->cookie = cookie;
	op->seq = ep->next_seq;
	op->state = LFI_OP_POSTED;
	op->riders = LFI_NONE;
	ssize_t posted = post_rma(ep, true, (void *)local, len, desc, remote, key, &op->ctx, flags);
	if (posted) {
		op->state = LFI_OP_FREE;
		return posted;
	}
	ep->free_head = op->next;
	ep->next_seq++;
	ep->inflight++;
	op->len = len;
	ep->inflight_bytes += len;
	ep->transfers++;
	ep->writes++;
	return 0;
}

static int session_failed(lmt_endpoint *ep, int failing)
{
	return putil_error(&ep->inst->base, -failing, "ofi channel %u: the session failed",
	                   ep->channel);
}

int lfi_source_write(lmt_endpoint *ep, const void *local, size_t len, lmt_mr *local_mr,
                     lmt_rkey *rkey, uint64_t offset, uint64_t cookie)
{
	struct lmt_instance *inst = ep->inst;
	void *desc;
	int rc = local_desc(ep, local, len, local_mr, &desc);
	if (rc)
		return rc;
	int failing = putil_channels_failing(&inst->channels);
	if (failing)
		return session_failed(ep, failing);
	if ((rc = putil_channels_admit(&inst->channels, ep->channel)))
		return rc;
	pthread_mutex_lock(&ep->lock);
	/* The channel's thread may have reported what it owed since: a
	 * write accepted now would never be. */
	bool abandoned = atomic_load(&ep->abandoned);
	ssize_t posted = abandoned ? 0 : accept_write(ep, local, len, desc, rkey, offset, cookie);
	pthread_mutex_unlock(&ep->lock);
	if (abandoned)
		return session_failed(ep, atomic_load(&ep->broken));
	if (posted == 0) {
		putil_channels_posted(&inst->channels, ep->channel);
		return 0;
	}
	if (posted == -FI_EAGAIN)
		return -LMT_EAGAIN;
	return putil_error(&inst->base, lfi_code((int)-posted),
	                   "ofi channel %u: fi_writemsg of %zu bytes: %s", ep->channel, len,
	                   fi_strerror((int)-posted));
}
