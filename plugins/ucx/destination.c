/* Destination side of a UCX channel: a thread drives the worker, so that
 * puts emulated by UCX land, and places writes sent as active messages into
 * registered regions after checking them, then acknowledges them. */
#define _GNU_SOURCE
#include "destination.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "channel.h"
#include "region.h"

#define ACK_EVERY 16           /* placed writes per acknowledgement, at most */
#define ACK_BYTES (512u << 10) /* placed bytes per acknowledgement, at most */
#define MAX_RECEIVES 4096u     /* rendezvous receives at once, per channel */

/* A rendezvous receive placing one write into a region. */
struct ucx_recv {
	lmt_endpoint *ep;
	ucp_ep_h reply_ep; /* UCX's endpoint for the source's connection */
	struct lmt_mr *mr;
	uint32_t slot, generation;
	uint64_t len;
	bool abandoned; /* the region was let go; the request may still finish */
	struct ucx_recv *prev, *next;
};

/* ---- Failures -------------------------------------------------------------- */

/* A write that must not be placed: fail the load, tell the source, and
 * place nothing more from this channel. */
static void refuse(lmt_endpoint *ep, const char *fmt, ...) LMT_PRINTF(2, 3);

static void refuse(lmt_endpoint *ep, const char *fmt, ...)
{
	if (ep->refusing || atomic_load(&ep->stopping))
		return;
	ep->refusing = true;
	char msg[320];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	int rc = putil_error(&ep->inst->base, LMT_EPROTO, "ucx channel %u: %s", ep->channel, msg);
	putil_channels_set_fatal(&ep->inst->channels, rc);
	ucx_send_note(ep, UCX_NOTE_ERROR, LMT_EPROTO);
}

static void dest_fail(lmt_endpoint *ep, int code, const char *fmt, ...) LMT_PRINTF(3, 4);

static void dest_fail(lmt_endpoint *ep, int code, const char *fmt, ...)
{
	if (ep->failure)
		return;
	if (atomic_load(&ep->stopping) || ep->peer_bye) {
		ep->failure = -code;
		return;
	}
	char msg[256];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	ep->failure = putil_error(&ep->inst->base, code, "ucx channel %u: %s", ep->channel, msg);
	putil_channels_set_fatal(&ep->inst->channels, ep->failure);
}

static void dest_ep_failed(void *arg, ucp_ep_h uep, ucs_status_t status)
{
	lmt_endpoint *ep = arg;
	(void)uep;
	ep->transport_failed = true;
	dest_fail(ep, LMT_ECONN, "the source went away (%s)", ucs_status_string(status));
}

/* ---- Receives ----------------------------------------------------------------- */

/* Let go of every receive still running: their regions may go, and the
 * worker is not driven again, so nothing more is placed. */
static void abandon(lmt_endpoint *ep)
{
	while (ep->recvs) {
		struct ucx_recv *r = ep->recvs;
		ep->recvs = r->next;
		ep->recv_count--;
		r->abandoned = true;
		ucx_region_release(ep->inst, r->mr);
		r->mr = NULL;
		r->prev = NULL;
		r->next = ep->abandoned;
		ep->abandoned = r;
	}
}

/* ---- Acknowledgements -------------------------------------------------------- */

static bool send_acks(lmt_endpoint *ep, bool idle)
{
	if (!ep->ack_count || ep->failure)
		return false;
	if (!idle && ep->ack_count < ACK_EVERY && ep->ack_bytes < ACK_BYTES)
		return false;
	ucs_status_t st = ucx_send_notice(ep, UCX_NOTE_ACK, 0, ep->acks, ep->ack_count);
	ep->ack_count = 0;
	ep->ack_bytes = 0;
	if (st != UCS_OK)
		dest_fail(ep, ucx_status_code(st), "cannot acknowledge writes (%s)",
		          ucs_status_string(st));
	return true;
}

static void placed(lmt_endpoint *ep, uint32_t slot, uint32_t generation, uint64_t len)
{
	ucx_entry_encode(slot, generation, ep->acks + (size_t)ep->ack_count * UCX_NOTE_ENTRY_LEN);
	ep->ack_count++;
	ep->ack_bytes += len;
	if (ep->ack_count == UCX_QUEUE_DEPTH)
		send_acks(ep, true);
}

static void unlink_receive(lmt_endpoint *ep, struct ucx_recv *r)
{
	ep->recv_count--;
	if (r->prev)
		r->prev->next = r->next;
	else
		ep->recvs = r->next;
	if (r->next)
		r->next->prev = r->prev;
}

static void received(void *request, ucs_status_t status, size_t length, void *user_data)
{
	struct ucx_recv *r = user_data;
	lmt_endpoint *ep = r->ep;
	if (request)
		ucp_request_free(request);
	if (r->abandoned) {
		/* Freed with the worker; mark it so nobody waits for it. */
		r->ep = NULL;
		return;
	}
	unlink_receive(ep, r);
	ucx_region_release(ep->inst, r->mr);
	if (status != UCS_OK || length != r->len)
		dest_fail(ep, status == UCS_OK ? LMT_EPROTO : ucx_status_code(status),
		          "receiving a write of %llu bytes failed (%s)", (unsigned long long)r->len,
		          status == UCS_OK ? "short" : ucs_status_string(status));
	else
		placed(ep, r->slot, r->generation, r->len);
	free(r);
}

/* ---- Handlers ------------------------------------------------------------------ */

/* Start a rendezvous receive straight into the region. */
static ucs_status_t receive(lmt_endpoint *ep, struct lmt_mr *mr, const struct ucx_write *w,
                            void *desc, ucp_ep_h reply_ep)
{
	struct ucx_recv *r = ep->recv_count < MAX_RECEIVES ? calloc(1, sizeof(*r)) : NULL;
	if (!r) {
		ucx_region_release(ep->inst, mr);
		dest_fail(ep, LMT_ENOMEM, "too many writes arriving at once");
		return UCS_ERR_NO_MEMORY;
	}
	*r = (struct ucx_recv){.ep = ep,
	                       .reply_ep = reply_ep,
	                       .mr = mr,
	                       .slot = w->slot,
	                       .generation = w->generation,
	                       .len = w->len,
	                       .next = ep->recvs};
	if (ep->recvs)
		ep->recvs->prev = r;
	ep->recvs = r;
	ep->recv_count++;
	ucp_request_param_t params = {
	        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
	        .cb.recv_am = received,
	        .user_data = r,
	};
	void *req = ucp_am_recv_data_nbx(ep->worker, desc, mr->addr + w->offset, w->len, &params);
	if (req == NULL) {
		received(NULL, UCS_OK, w->len, r);
	} else if (UCS_PTR_IS_ERR(req)) {
		received(NULL, UCS_PTR_STATUS(req), 0, r);
		return UCS_PTR_STATUS(req);
	}
	return UCS_OK;
}

static ucs_status_t dest_write(void *arg, const void *header, size_t header_length, void *data,
                               size_t length, const ucp_am_recv_param_t *param)
{
	lmt_endpoint *ep = arg;
	bool rndv = param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV;
	/* Any peer that reaches this worker can send to it (UCX cannot say
	 * which endpoint a message came by unless the sender asks for a
	 * reply endpoint, and one it made itself proves nothing): only a
	 * write with this channel's token comes from the source of this
	 * session. Anything else is dropped, and the load goes on. */
	if (!ucx_token_ok(header, header_length, UCX_WRITE_HEADER_LEN, UCX_WRITE_TOKEN_AT,
	                  ep->token)) {
		ucx_foreign(ep, "a write", header_length, length);
		return rndv ? UCS_ERR_REJECTED : UCS_OK;
	}
	/* A rendezvous write answered with an error fails on the source
	 * with it: REJECTED says it was refused, CANCELED that we close. */
	if (ep->refusing)
		return rndv ? UCS_ERR_REJECTED : UCS_OK;
	if (ep->failure || atomic_load(&ep->stopping) || atomic_load(&ep->cut))
		return rndv ? UCS_ERR_CANCELED : UCS_OK;
	struct ucx_write w;
	char why[320];
	const char *bad = ucx_write_decode(header, header_length, &w);
	if (bad) {
		refuse(ep, "%s", bad);
		return rndv ? UCS_ERR_REJECTED : UCS_OK;
	}
	if (w.len != length) {
		refuse(ep, "write header says %llu bytes, %zu arrived", (unsigned long long)w.len,
		       length);
		return rndv ? UCS_ERR_REJECTED : UCS_OK;
	}
	struct lmt_mr *mr = ucx_region_claim(ep->inst, w.region, w.offset, w.len, why, sizeof(why));
	if (!mr) {
		refuse(ep, "%s", why);
		return rndv ? UCS_ERR_REJECTED : UCS_OK;
	}
	if (rndv)
		return receive(ep, mr, &w, data,
		               param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP ? param->reply_ep
		                                                                  : NULL);
	if (length)
		memcpy(mr->addr + w.offset, data, length);
	ucx_region_release(ep->inst, mr);
	placed(ep, w.slot, w.generation, length);
	return UCS_OK;
}

static ucs_status_t dest_note(void *arg, const void *header, size_t header_length, void *data,
                              size_t length, const ucp_am_recv_param_t *param)
{
	lmt_endpoint *ep = arg;
	struct ucx_note n;
	(void)data;
	if (!ucx_token_ok(header, header_length, UCX_NOTE_HEADER_LEN, UCX_NOTE_TOKEN_AT,
	                  ep->token)) {
		ucx_foreign(ep, "a notice", header_length, length);
		return UCS_OK;
	}
	const char *why = ucx_note_decode(header, header_length, &n);
	if (!why &&
	    (n.kind != UCX_NOTE_BYE || length || (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)))
		why = "a notice only a destination sends";
	if (why) {
		refuse(ep, "bad notice from the source: %s", why);
		return UCS_OK;
	}
	if (ep->inst->test_bye_delay_ns)
		putil_nap(ep->inst->test_bye_delay_ns);
	ucx_peer_bye(ep);
	return UCS_OK;
}

/* ---- The channel thread ------------------------------------------------------ */

static bool dest_ready(lmt_endpoint *ep)
{
	return ep->ack_count > 0 || atomic_load(&ep->cut);
}

/* Purge the receives UCX still runs for this channel by force-closing its
 * endpoint for the source's connection. A receive still pending means
 * UCX has not destroyed that endpoint: it purges before it destroys. */
static void purge_receives(lmt_endpoint *ep)
{
	for (struct ucx_recv *r = ep->recvs; r; r = r->next) {
		if (r->reply_ep) {
			ucx_ep_close_peer(ep, r->reply_ep);
			break;
		}
	}
}

/* Close the channel. Driving the worker meanwhile (`drive`) lets the
 * peer answer a goodbye and running receives finish; a channel that must
 * not place data any more is closed without, and its receives purged. */
static void stand_down(lmt_endpoint *ep, bool drive)
{
	if (drive) {
		send_acks(ep, true);
		ucx_ep_close_now(ep, true);
		uint64_t deadline = ucx_close_deadline(ep->inst);
		while (ep->recvs && !atomic_load(&ep->cut) && lmt__now_ns() < deadline)
			if (!ucx_drive(ep))
				ucx_wait_events(ep, 1);
	}
	purge_receives(ep);
	ucx_ep_close_now(ep, false);
	abandon(ep);
}

static void *dest_thread(void *arg)
{
	lmt_endpoint *ep = arg;
	while (!atomic_load(&ep->stopping)) {
		if ((ep->failure || atomic_load(&ep->cut)) && !ep->closed)
			stand_down(ep, !atomic_load(&ep->cut) && !ep->transport_failed);
		if (ep->closed) {
			struct timespec ts = {0, 5000000};
			nanosleep(&ts, NULL);
			continue;
		}
		bool busy = ucx_drive(ep);
		busy |= send_acks(ep, !busy);
		ucx_pace(ep, busy, ep->recvs != NULL, dest_ready);
	}
	if (!ep->closed)
		stand_down(ep, !atomic_load(&ep->cut) && !ep->transport_failed);
	abandon(ep);
	return NULL;
}

/* ---- Operations ---------------------------------------------------------------- */

int ucx_dest_ep_open(lmt_endpoint *ep, struct lmt_blob *addr)
{
	struct lmt_instance *inst = ep->inst;
	ep->acks = malloc((size_t)UCX_QUEUE_DEPTH * UCX_NOTE_ENTRY_LEN);
	if (!ep->acks)
		return putil_error(&inst->base, LMT_ENOMEM, "ucx: out of memory");
	int rc = ucx_channel_open(ep, dest_write, dest_note, addr);
	if (rc)
		ucx_dest_ep_close(ep);
	return rc;
}

int ucx_dest_ep_connect(lmt_endpoint *ep, const struct lmt_blob *peer_addr)
{
	struct lmt_instance *inst = ep->inst;
	/* Acknowledgements go back on an endpoint of our own. */
	int rc = ucx_channel_connect(ep, peer_addr, dest_ep_failed, dest_thread);
	if (rc)
		return rc;
	putil_log(&inst->base, LMT_LOG_DEBUG, "ucx channel %u: connected to the source",
	          ep->channel);
	return 0;
}

void ucx_dest_ep_close(lmt_endpoint *ep)
{
	if (!ucx_channel_stop(ep) && ep->worker)
		stand_down(ep, false);
	ucx_worker_close(ep);
	while (ep->abandoned) {
		struct ucx_recv *next = ep->abandoned->next;
		free(ep->abandoned);
		ep->abandoned = next;
	}
	free(ep->acks);
	ep->acks = NULL;
}
