/* Source side of a UCX channel: writes are queued by the session thread and
 * posted by the channel thread, as active messages (complete once the
 * destination acknowledges them) or as puts (complete once a flush covering
 * them completes). Either way a completion means the bytes are visible. */
#define _GNU_SOURCE
#include "source.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "channel.h"
#include "region.h"

#define SUBMIT_BATCH 32          /* writes taken from the queue at a time */
#define FLUSH_EVERY 16           /* puts per flush, at most */
#define FLUSH_BYTES (8ull << 20) /* bytes put per flush, at most */

/* One write. The generation changes under ep->lock; the rest belongs to
 * the channel thread once queued. */
struct ucx_slot {
	lmt_endpoint *ep;
	uint32_t index;
	uint32_t generation;
	const void *local;
	size_t len;
	lmt_rkey *rkey;
	uint64_t offset;
	uint64_t cookie;
	uint8_t header[UCX_WRITE_HEADER_LEN];
	bool posted, sent, acked;
	int status;     /* first error of this write, -LMT_E* */
	uint64_t epoch; /* puts: the flush that makes it visible */
};

/* ---- Failures -------------------------------------------------------------- */

/* Another channel failed the session: this one goes down with `status`.
 * Only the channel's thread may drive its worker, so it is told and woken
 * here, and breaks the channel at its next round. Called under the
 * channel table's lock. */
static void break_channel(void *arg, int status)
{
	lmt_endpoint *ep = arg;
	atomic_store(&ep->session_failed, status);
	ucx_wake(ep);
}

/* Take the channel down with `code` (-LMT_E*). `report`: the session is
 * over, so every channel goes down too. */
static void source_break(lmt_endpoint *ep, int code, bool report)
{
	if (ep->failure)
		return;
	ep->failure = code;
	pthread_mutex_lock(&ep->lock);
	if (!ep->broken)
		ep->broken = code;
	pthread_mutex_unlock(&ep->lock);
	if (report)
		putil_channels_fail(&ep->inst->channels, code, break_channel);
}

static void source_fail(lmt_endpoint *ep, int code, const char *fmt, ...) LMT_PRINTF(3, 4);

static void source_fail(lmt_endpoint *ep, int code, const char *fmt, ...)
{
	if (ep->failure)
		return;
	if (atomic_load(&ep->stopping)) {
		source_break(ep, -LMT_ECANCELED, false);
		return;
	}
	char msg[256];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	source_break(ep, putil_error(&ep->inst->base, code, "ucx channel %u: %s", ep->channel, msg),
	             true);
}

static void source_ep_failed(void *arg, ucp_ep_h uep, ucs_status_t status)
{
	lmt_endpoint *ep = arg;
	(void)uep;
	ep->transport_failed = true;
	/* After an orderly goodbye the peer may vanish at any time. */
	if (ep->peer_bye && !ep->in_flight)
		source_break(ep, -LMT_ECONN, false);
	else
		source_fail(ep, LMT_ECONN, "the destination went away (%s)",
		            ucs_status_string(status));
}

/* ---- Completions ----------------------------------------------------------- */

/* Queue the completion of `slot` and free the slot, under the channel
 * table's lock: a completion the core harvested leaves its slot free for
 * the next write. */
static void complete(lmt_endpoint *ep, struct ucx_slot *slot, int status)
{
	struct putil_channels *c = &ep->inst->channels;
	if (slot->rkey)
		atomic_fetch_sub(&slot->rkey->users, 1);
	if (slot->posted && !slot->sent)
		ep->unsent_bytes -= slot->len;
	pthread_mutex_lock(&c->lock);
	putil_channels_complete_locked(c, ep->channel, slot->cookie, status);
	pthread_mutex_lock(&ep->lock);
	slot->rkey = NULL;
	slot->posted = slot->sent = slot->acked = false;
	slot->status = 0;
	ep->free_slots[ep->free_count++] = slot->index;
	pthread_mutex_unlock(&ep->lock);
	pthread_mutex_unlock(&c->lock);
}

static void try_finish(lmt_endpoint *ep, struct ucx_slot *slot)
{
	/* A failed channel completes what is left when it settles. */
	if (ep->failure || !slot->posted || !slot->sent)
		return;
	if (slot->status || slot->acked) {
		ep->in_flight--;
		complete(ep, slot, slot->status);
	}
}

static void mark_sent(lmt_endpoint *ep, struct ucx_slot *slot)
{
	slot->sent = true;
	ep->unsent_bytes -= slot->len;
}

static void write_sent(void *request, ucs_status_t status, void *user_data)
{
	struct ucx_slot *slot = user_data;
	lmt_endpoint *ep = slot->ep;
	mark_sent(ep, slot);
	ep->requests--;
	ucp_request_free(request);
	if (status == UCS_ERR_REJECTED) {
		slot->status = -LMT_EPROTO;
		source_fail(ep, LMT_EPROTO, "the destination refused a write of %zu bytes",
		            slot->len);
	} else if (status != UCS_OK) {
		int code = ucx_status_code(status);
		if (code == LMT_ECANCELED)
			code = LMT_ECONN;
		slot->status = -code;
		source_fail(ep, code, "a write of %zu bytes failed (%s)", slot->len,
		            ucs_status_string(status));
	}
	try_finish(ep, slot);
}

static void puts_flushed(lmt_endpoint *ep, ucs_status_t status)
{
	ep->flushing = false;
	if (status != UCS_OK) {
		source_fail(ep, ucx_status_code(status), "flushing puts failed (%s)",
		            ucs_status_string(status));
		return;
	}
	for (uint32_t i = 0; i < UCX_QUEUE_DEPTH; i++) {
		struct ucx_slot *slot = &ep->slots[i];
		if (slot->posted && !slot->acked && slot->epoch <= ep->flush_covers) {
			slot->acked = true;
			try_finish(ep, slot);
		}
	}
}

static void flush_done(void *request, ucs_status_t status, void *user_data)
{
	lmt_endpoint *ep = user_data;
	ep->requests--;
	ucp_request_free(request);
	puts_flushed(ep, status);
}

/* Flush the puts posted so far when enough are waiting, or when the
 * channel has nothing else to do. */
static bool flush_puts(lmt_endpoint *ep, bool idle)
{
	if (ep->flushing || !ep->unflushed || ep->closed)
		return false;
	if (!idle && ep->unflushed < FLUSH_EVERY && ep->unflushed_bytes < FLUSH_BYTES)
		return false;
	ep->flush_covers = ep->epoch++;
	ep->unflushed = 0;
	ep->unflushed_bytes = 0;
	ep->flushing = true;
	ucp_request_param_t params = {
	        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
	        .cb.send = flush_done,
	        .user_data = ep,
	};
	void *req = ucp_ep_flush_nbx(ep->ep, &params);
	if (req == NULL)
		puts_flushed(ep, UCS_OK);
	else if (UCS_PTR_IS_ERR(req))
		puts_flushed(ep, UCS_PTR_STATUS(req));
	else
		ep->requests++;
	return true;
}

/* Acknowledgements and notices from the destination. */
static ucs_status_t source_note(void *arg, const void *header, size_t header_length, void *data,
                                size_t length, const ucp_am_recv_param_t *param)
{
	lmt_endpoint *ep = arg;
	struct ucx_note n;
	/* Only the destination of this session holds the token: a forged
	 * acknowledgement would report a write before its bytes landed. */
	if (!ucx_token_ok(header, header_length, UCX_NOTE_HEADER_LEN, UCX_NOTE_TOKEN_AT,
	                  ep->token)) {
		ucx_foreign(ep, "a notice", header_length, length);
		return (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) ? UCS_ERR_REJECTED : UCS_OK;
	}
	const char *why = ucx_note_decode(header, header_length, &n);
	if (!why && (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV))
		why = "notice sent by rendezvous";
	else if (!why && n.kind == UCX_NOTE_ACK &&
	         (n.count > UCX_QUEUE_DEPTH || length != (size_t)n.count * UCX_NOTE_ENTRY_LEN))
		why = "acknowledgement entries disagree with its length";
	else if (!why && n.kind == UCX_NOTE_ACK && ep->use_put)
		why = "acknowledgement on a channel that puts";
	if (why) {
		source_fail(ep, LMT_EPROTO, "bad notice from the destination: %s", why);
		return UCS_OK;
	}
	if (n.kind == UCX_NOTE_BYE) {
		ucx_peer_bye(ep);
		if (ep->in_flight)
			source_fail(ep, LMT_ECONN,
			            "the destination closed the channel with %u writes "
			            "unacknowledged",
			            ep->in_flight);
		else
			source_break(ep, -LMT_ECONN, false);
		return UCS_OK;
	}
	if (n.kind == UCX_NOTE_ERROR) {
		int code = n.code > 0 && n.code < LMT_ERRC_COUNT ? n.code : LMT_EPROTO;
		source_fail(ep, code, "the destination failed the channel (error %d)", n.code);
		return UCS_OK;
	}
	const uint8_t *entry = data;
	for (uint32_t i = 0; i < n.count && !ep->failure; i++, entry += UCX_NOTE_ENTRY_LEN) {
		uint32_t index, generation;
		ucx_entry_decode(entry, &index, &generation);
		struct ucx_slot *slot = index < UCX_QUEUE_DEPTH ? &ep->slots[index] : NULL;
		if (!slot || !slot->posted || slot->acked || slot->generation != generation) {
			source_fail(ep, LMT_EPROTO,
			            "acknowledgement for an unknown write (slot %u, "
			            "generation %u)",
			            index, generation);
			break;
		}
		slot->acked = true;
		try_finish(ep, slot);
	}
	return UCS_OK;
}

/* ---- Posting ----------------------------------------------------------------- */

/* The rkey of `slot` unpacked on this channel's endpoint. */
static ucp_rkey_h channel_rkey(lmt_endpoint *ep, struct ucx_slot *slot)
{
	ucp_rkey_h *rkey = &slot->rkey->unpacked[ep->channel];
	if (*rkey)
		return *rkey;
	if (!slot->rkey->key.rkey_len) {
		source_fail(ep, LMT_EPROTO, "a key blob without an rkey, on a channel that puts");
		return NULL;
	}
	ucs_status_t st = ucp_ep_rkey_unpack(ep->ep, slot->rkey->packed, rkey);
	if (st == UCS_OK)
		return *rkey;
	*rkey = NULL;
	source_fail(ep, LMT_EPROTO, "cannot unpack the rkey of region 0x%llx (%s)",
	            (unsigned long long)slot->rkey->key.region, ucs_status_string(st));
	return NULL;
}

static void post(lmt_endpoint *ep, struct ucx_slot *slot)
{
	/* REPLY: the destination learns UCX's endpoint for this connection,
	 * so that it can purge a rendezvous this side never finishes. */
	ucp_request_param_t params = {
	        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
	                        UCP_OP_ATTR_FIELD_FLAGS,
	        .flags = UCP_AM_SEND_FLAG_REPLY,
	        .cb.send = write_sent,
	        .user_data = slot,
	};
	void *req;
	slot->posted = true;
	ep->in_flight++;
	ep->unsent_bytes += slot->len;
	if (ep->use_put) {
		ucp_rkey_h rkey = channel_rkey(ep, slot);
		if (!rkey) {
			mark_sent(ep, slot);
			slot->status = -LMT_EPROTO;
			return;
		}
		slot->epoch = ep->epoch;
		ep->unflushed++;
		ep->unflushed_bytes += slot->len;
		params.op_attr_mask &= ~(uint32_t)UCP_OP_ATTR_FIELD_FLAGS;
		req = ucp_put_nbx(ep->ep, slot->local, slot->len,
		                  slot->rkey->key.base + slot->offset, rkey, &params);
	} else {
		req = ucp_am_send_nbx(ep->ep, UCX_AM_WRITE, slot->header, UCX_WRITE_HEADER_LEN,
		                      slot->local, slot->len, &params);
	}
	if (req == NULL) {
		mark_sent(ep, slot);
	} else if (UCS_PTR_IS_ERR(req)) {
		ucs_status_t st = UCS_PTR_STATUS(req);
		mark_sent(ep, slot);
		slot->status = -ucx_status_code(st);
		source_fail(ep, ucx_status_code(st), "cannot post a write of %zu bytes (%s)",
		            slot->len, ucs_status_string(st));
	} else {
		ep->requests++;
	}
}

/* Complete a slot that never reached UCX, or is abandoned by a failed
 * channel. */
static void drop(lmt_endpoint *ep, struct ucx_slot *slot, int status)
{
	if (slot->posted)
		ep->in_flight--;
	complete(ep, slot, status);
}

/* Take up to `max` slots off the submission queue. */
static uint32_t take(lmt_endpoint *ep, struct ucx_slot **out, uint32_t max)
{
	uint32_t n = 0;
	pthread_mutex_lock(&ep->lock);
	while (ep->queue_tail != ep->queue_head && n < max)
		out[n++] = &ep->slots[ep->queue[ep->queue_tail++ % UCX_QUEUE_DEPTH]];
	pthread_mutex_unlock(&ep->lock);
	return n;
}

static void post_or_drop(lmt_endpoint *ep, struct ucx_slot *slot)
{
	if (ep->failure)
		drop(ep, slot, ep->failure);
	else
		post(ep, slot);
}

/* Post what the core queued. Over tcp, UCX sends all it holds in one
 * ucp_worker_progress call for as long as the socket takes it (up to
 * 60 ms over loopback was seen), so there posting stops while
 * UCX_TCP_UNSENT_MAX or more is unsent, and the channel's thread comes
 * back often enough to yield its core (docs/ucx.md, "The iterate budget
 * over tcp"). */
static bool post_queued(lmt_endpoint *ep)
{
	struct ucx_slot *batch[SUBMIT_BATCH];
	uint32_t n = 0;
	if (ep->unsent_max == UINT64_MAX) {
		n = take(ep, batch, SUBMIT_BATCH);
		for (uint32_t i = 0; i < n; i++)
			post_or_drop(ep, batch[i]);
	} else {
		while (n < SUBMIT_BATCH && ep->unsent_bytes < ep->unsent_max &&
		       take(ep, batch, 1)) {
			post_or_drop(ep, batch[0]);
			n++;
		}
	}
	return n > 0;
}

/* ---- The channel thread ------------------------------------------------------ */

/* A failed channel: close the endpoint, which makes UCX let go of every
 * write it still runs (ucx_ep_close_now), then complete every write that
 * is left with the failure: once reported, none is read any more. */
static void settle(lmt_endpoint *ep)
{
	ucx_ep_close_now(ep, true);
	struct ucx_slot *batch[SUBMIT_BATCH];
	uint32_t n;
	while ((n = take(ep, batch, SUBMIT_BATCH)) != 0)
		for (uint32_t i = 0; i < n; i++)
			drop(ep, batch[i], ep->failure);
	for (uint32_t i = 0; i < UCX_QUEUE_DEPTH; i++)
		if (ep->slots[i].posted)
			drop(ep, &ep->slots[i], ep->failure);
	putil_channels_settle(&ep->inst->channels, ep->channel, ep->failure);
}

static bool source_ready(lmt_endpoint *ep)
{
	pthread_mutex_lock(&ep->lock);
	bool queued = ep->queue_tail != ep->queue_head;
	pthread_mutex_unlock(&ep->lock);
	return (queued && ep->unsent_bytes < ep->unsent_max) || (ep->use_put && ep->unflushed && !ep->flushing);
}

static void shutdown_channel(lmt_endpoint *ep)
{
	/* UCX wants rkeys gone before their endpoint, once nothing uses
	 * them; a forced close purges what still does. */
	if (!ep->in_flight)
		ucx_rkeys_drop(ep->inst, ep->channel);
	ucx_ep_close_now(ep, true);
	if (!ep->failure)
		source_break(ep, -LMT_ECANCELED, false);
	settle(ep);
	ucx_rkeys_drop(ep->inst, ep->channel);
}

static void *source_thread(void *arg)
{
	lmt_endpoint *ep = arg;
	while (!atomic_load(&ep->stopping)) {
		bool busy = post_queued(ep);
		busy |= ucx_drive(ep);
		if (ep->use_put && !ep->failure)
			busy |= flush_puts(ep, !busy);
		int failing = atomic_load(&ep->session_failed);
		if (failing && !ep->failure)
			source_break(ep, failing, false);
		if (ep->failure && !ep->closed) {
			settle(ep);
			busy = true;
		}
		ucx_pace(ep, busy, ep->in_flight > 0, source_ready);
	}
	shutdown_channel(ep);
	return NULL;
}

/* ---- Operations ---------------------------------------------------------------- */

int ucx_source_ep_open(lmt_endpoint *ep, struct lmt_blob *addr)
{
	struct lmt_instance *inst = ep->inst;
	ep->slots = calloc(UCX_QUEUE_DEPTH, sizeof(*ep->slots));
	ep->free_slots = calloc(UCX_QUEUE_DEPTH, sizeof(*ep->free_slots));
	ep->queue = calloc(UCX_QUEUE_DEPTH, sizeof(*ep->queue));
	int rc = 0;
	if (!ep->slots || !ep->free_slots || !ep->queue)
		rc = putil_error(&inst->base, LMT_ENOMEM, "ucx: out of memory");
	else if (pthread_mutex_init(&ep->lock, NULL))
		rc = putil_error(&inst->base, LMT_ENOMEM, "ucx: cannot create locks");
	else
		ep->lock_ready = true;
	for (uint32_t i = 0; !rc && i < UCX_QUEUE_DEPTH; i++) {
		ep->slots[i].ep = ep;
		ep->slots[i].index = i;
		ep->free_slots[i] = UCX_QUEUE_DEPTH - 1 - i;
	}
	ep->free_count = UCX_QUEUE_DEPTH;
	ep->use_put = inst->use_put;
	if (!rc)
		rc = ucx_channel_open(ep, NULL, source_note, addr);
	if (rc)
		ucx_source_ep_close(ep);
	return rc;
}

int ucx_source_ep_connect(lmt_endpoint *ep, const struct lmt_blob *peer_addr)
{
	struct lmt_instance *inst = ep->inst;
	int rc = ucx_channel_connect(ep, peer_addr, source_ep_failed, source_thread);
	if (rc)
		return rc;
	pthread_mutex_lock(&ep->lock);
	ep->connected = true;
	pthread_mutex_unlock(&ep->lock);
	putil_channels_go_live(&inst->channels, ep->channel, break_channel);
	putil_log(&inst->base, LMT_LOG_DEBUG, "ucx channel %u: connected, writes as %s",
	          ep->channel, ep->use_put ? "puts" : "active messages");
	return 0;
}

int ucx_source_write(lmt_endpoint *ep, const void *local, size_t len, lmt_rkey *rkey,
                     uint64_t offset, uint64_t cookie)
{
	pthread_mutex_lock(&ep->lock);
	if (!ep->connected || ep->broken || !ep->free_count) {
		int code = !ep->connected ? LMT_ESTATE : ep->broken ? -ep->broken : LMT_EAGAIN;
		pthread_mutex_unlock(&ep->lock);
		if (code == LMT_EAGAIN)
			return -LMT_EAGAIN;
		int rc = putil_error(&ep->inst->base, code, "ucx channel %u: %s", ep->channel,
		                     code == LMT_ESTATE ? "not connected" : "channel is down");
		/* A channel the peer closed in order fails the session once
		 * it is used: progress says so too. */
		if (code != LMT_ESTATE)
			putil_channels_fail(&ep->inst->channels, rc, break_channel);
		return rc;
	}
	uint32_t index = ep->free_slots[--ep->free_count];
	struct ucx_slot *slot = &ep->slots[index];
	slot->generation++;
	slot->local = local;
	slot->len = len;
	slot->rkey = rkey;
	slot->offset = offset;
	slot->cookie = cookie;
	ucx_write_encode(&(struct ucx_write){.token = ep->peer_token,
	                                     .region = rkey->key.region,
	                                     .offset = offset,
	                                     .len = len,
	                                     .slot = index,
	                                     .generation = slot->generation},
	                 slot->header);
	atomic_fetch_add(&rkey->users, 1);
	ep->queue[ep->queue_head++ % UCX_QUEUE_DEPTH] = index;
	pthread_mutex_unlock(&ep->lock);
	ucx_wake(ep);
	return 0;
}

void ucx_source_ep_close(lmt_endpoint *ep)
{
	if (!ucx_channel_stop(ep) && ep->worker)
		ucx_ep_close_now(ep, true);
	if (ep->worker)
		ucx_rkeys_drop(ep->inst, ep->channel);
	ucx_worker_close(ep);
	if (ep->lock_ready)
		pthread_mutex_destroy(&ep->lock);
	ep->lock_ready = false;
	free(ep->slots);
	free(ep->free_slots);
	free(ep->queue);
	ep->slots = NULL;
	ep->free_slots = NULL;
	ep->queue = NULL;
}
