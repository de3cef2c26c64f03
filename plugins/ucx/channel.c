/* What both ends of a UCX channel do with their UCP worker: create it,
 * connect an endpoint, run a thread that sleeps on the worker's wake-up
 * descriptor, send notices, and close without the peer's help. */
#define _GNU_SOURCE
#include "channel.h"

#include <poll.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define UCX_CANCEL_NS 100000000ull    /* longest goodbye once the session is cancelled */
#define UCX_FORCE_NS 500000000ull     /* longest wait for an endpoint to close */
#define UCX_SETTLE_NS 100000000ull    /* longest wait for a worker's own sends */
#define UCX_SPIN_IDLE_NS 50000ull     /* a channel thread polls this long idle, */
#define UCX_SPIN_PENDING_NS 200000ull /* or this long when its peer owes an answer, */
#define UCX_SPIN_PULLED_NS 25000ull   /* or this long on a source whose peer pulls */

struct note_buffer {
	lmt_endpoint *ep;
	uint8_t data[]; /* header, then entries */
};

int ucx_status_code(ucs_status_t status)
{
	switch (status) {
	case UCS_OK:
		return 0;
	case UCS_ERR_NO_MEMORY:
	case UCS_ERR_NO_RESOURCE:
		return LMT_ENOMEM;
	case UCS_ERR_INVALID_PARAM:
	case UCS_ERR_INVALID_ADDR:
		return LMT_EINVAL;
	case UCS_ERR_NO_DEVICE:
	case UCS_ERR_NO_ELEM:
		return LMT_ENOTFOUND;
	case UCS_ERR_UNSUPPORTED:
		return LMT_ENOTSUP;
	case UCS_ERR_TIMED_OUT:
		return LMT_ETIMEDOUT;
	case UCS_ERR_CANCELED:
		return LMT_ECANCELED;
	case UCS_ERR_UNREACHABLE:
	case UCS_ERR_CONNECTION_RESET:
	case UCS_ERR_ENDPOINT_TIMEOUT:
	case UCS_ERR_NOT_CONNECTED:
	case UCS_ERR_REJECTED:
		return LMT_ECONN;
	default:
		return LMT_EIO;
	}
}

uint64_t ucx_close_deadline(const struct lmt_instance *inst)
{
	uint64_t bound = putil_cancelled(&inst->base) ? UCX_CANCEL_NS : UCX_CLOSE_NS;
	if (inst->base.timeout_ns && inst->base.timeout_ns < bound)
		bound = inst->base.timeout_ns;
	return lmt__deadline(bound);
}

static int create_worker(lmt_endpoint *ep, ucp_worker_h *worker, int *efd)
{
	struct lmt_instance *inst = ep->inst;
	/* Only the channel thread drives the worker once it runs; before
	 * and after, the session thread does. */
	ucp_worker_params_t params = {
	        .field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
	        .thread_mode = UCS_THREAD_MODE_SINGLE,
	};
	ucs_status_t st = ucp_worker_create(inst->context, &params, worker);
	if (st != UCS_OK) {
		*worker = NULL;
		return putil_error(&inst->base, ucx_status_code(st),
		                   "ucx channel %u: cannot create a worker (%s)", ep->channel,
		                   ucs_status_string(st));
	}
	if (ucp_worker_get_efd(*worker, efd) != UCS_OK) {
		*efd = -1;
		putil_log(&inst->base, LMT_LOG_DEBUG,
		          "ucx channel %u: no wake-up descriptor, polling", ep->channel);
	}
	return 0;
}

static int open_workers(lmt_endpoint *ep, bool reply_worker)
{
	int rc = create_worker(ep, &ep->worker, &ep->efd);
	if (!rc && reply_worker)
		rc = create_worker(ep, &ep->reply_worker, &ep->reply_efd);
	return rc;
}

static int set_handler(lmt_endpoint *ep, unsigned id, ucp_am_recv_callback_t cb)
{
	ucp_am_handler_param_t handler = {
	        .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
	                      UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG,
	        .id = id,
	        .flags = UCP_AM_FLAG_WHOLE_MSG,
	        .cb = cb,
	        .arg = ep,
	};
	ucs_status_t st = ucp_worker_set_am_recv_handler(ep->worker, &handler);
	if (st != UCS_OK)
		return putil_error(&ep->inst->base, ucx_status_code(st),
		                   "ucx channel %u: cannot set a handler (%s)", ep->channel,
		                   ucs_status_string(st));
	return 0;
}

static int worker_blob(lmt_endpoint *ep, uint32_t magic, struct lmt_blob *addr)
{
	struct lmt_instance *inst = ep->inst;
	ucp_address_t *worker;
	size_t len;
	ucs_status_t st = ucp_worker_get_address(ep->worker, &worker, &len);
	if (st != UCS_OK)
		return putil_error(&inst->base, ucx_status_code(st),
		                   "ucx channel %u: cannot get the worker address (%s)",
		                   ep->channel, ucs_status_string(st));
	struct ucx_addr a = {.magic = magic,
	                     .flags = magic == UCX_MAGIC_DST_ADDR && inst->rma ? UCX_ADDR_PUTS : 0,
	                     .channel = ep->channel,
	                     .token = ep->token};
	const char *why = ucx_addr_encode(&a, worker, len, addr);
	/* The worker address is no secret (it is the transports' addresses,
	 * which anyone can find on the network); the token is, and is not
	 * logged. The security tests point their outsider at it. */
	char hex[2 * 256 + 1];
	if (!why && len <= 256) {
		for (size_t i = 0; i < len; i++)
			snprintf(hex + 2 * i, 3, "%02x", ((const uint8_t *)worker)[i]);
		putil_log(&inst->base, LMT_LOG_DEBUG, "ucx channel %u: worker address %s",
		          ep->channel, hex);
	}
	ucp_worker_release_address(ep->worker, worker);
	if (why)
		return putil_error(&inst->base, LMT_EOVERFLOW,
		                   "ucx channel %u: the worker address is %zu bytes, an address "
		                   "blob carries %u: restrict ucx.tls or ucx.devices",
		                   ep->channel, len, UCX_ADDR_MAX);
	return 0;
}

/* A message with an id this side does not use: from outside the session. */
static ucs_status_t unused_id(void *arg, const void *header, size_t header_length, void *data,
                              size_t length, const ucp_am_recv_param_t *param)
{
	(void)header;
	(void)data;
	ucx_foreign(arg, "a message of a kind this side does not take", header_length, length);
	return (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) ? UCS_ERR_REJECTED : UCS_OK;
}

/* UCX 1.13 grows a worker's table of handlers for a new id without
 * setting the new slots but the id's own (ucp_worker_set_am_handler_common
 * sets that one over and over), and calls whatever a slot holds for a
 * message naming its id: anyone who reaches the worker could make it jump
 * to garbage with id 0 or 3. So every slot gets a handler, the last first,
 * which sizes the table to UCX_AM_IDS (the growth rounds up to an even
 * count); ids the side does not use drop what they get. */
static int set_handlers(lmt_endpoint *ep, ucp_am_recv_callback_t on_write,
                        ucp_am_recv_callback_t on_note)
{
	int rc = 0;
	for (unsigned i = 0; !rc && i < UCX_AM_IDS; i++) {
		unsigned id = i ? i - 1 : UCX_AM_IDS - 1;
		ucp_am_recv_callback_t cb = id == UCX_AM_WRITE && on_write ? on_write
		                            : id == UCX_AM_NOTE            ? on_note
		                                                           : unused_id;
		rc = set_handler(ep, id, cb);
	}
	return rc;
}

int ucx_channel_open(lmt_endpoint *ep, ucp_am_recv_callback_t on_write,
                     ucp_am_recv_callback_t on_note, struct lmt_blob *addr)
{
	bool source = ep->inst->base.role == LMT_ROLE_SOURCE;
	/* The channel's token: only a peer that got this blob over the
	 * authenticated control connection can speak to this worker. */
	int rc = putil_random_id(&ep->inst->base, UINT64_MAX, &ep->token);
	if (!rc)
		rc = open_workers(ep, !source);
	if (!rc)
		rc = set_handlers(ep, on_write, on_note);
	if (!rc)
		rc = worker_blob(ep, source ? UCX_MAGIC_SRC_ADDR : UCX_MAGIC_DST_ADDR, addr);
	return rc;
}

static void settle_workers(lmt_endpoint *ep);

void ucx_worker_close(lmt_endpoint *ep)
{
	/* Also for a peer that failed or left our goodbye unanswered: one
	 * that was stopped may run again while this side closes and ask for a
	 * connection, and the reply to it must not be in the queue that
	 * ucp_worker_destroy purges (a destination closing as its stopped
	 * source resumed aborted so, once in a suite run). A peer that is
	 * gone costs at most UCX_SETTLE_NS more at close. */
	settle_workers(ep);
	if (ep->reply_worker)
		ucp_worker_destroy(ep->reply_worker);
	if (ep->worker)
		ucp_worker_destroy(ep->worker);
	ep->worker = ep->reply_worker = NULL;
	ep->efd = ep->reply_efd = -1;
}

/* Every endpoint asks UCX to watch its peer (UCP_ERR_HANDLING_MODE_PEER):
 * only then can it be closed by force, which is how UCX 1.13 lets go of
 * the writes a stopped or dead peer never answers; without that,
 * ucp_worker_destroy aborts the process on them (docs/ucx.md, "Peers that
 * stop or die"). A peer reachable only over transports that cannot watch
 * it is refused. */
static int create_endpoint(lmt_endpoint *ep, const struct ucx_addr *peer,
                           ucp_err_handler_cb_t failed)
{
	struct lmt_instance *inst = ep->inst;
	ucp_worker_h worker = ep->reply_worker ? ep->reply_worker : ep->worker;
	ucp_ep_params_t params = {
	        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
	                      UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER,
	        .address = (const ucp_address_t *)peer->worker,
	        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
	        .err_handler = {.cb = failed, .arg = ep},
	};
	ucs_status_t st = ucp_ep_create(worker, &params, &ep->ep);
	if (st == UCS_ERR_UNREACHABLE) {
		/* A peer that died, or transports in ucx.tls that cannot watch it. */
		ep->ep = NULL;
		return putil_error(
		        &inst->base, LMT_ECONN,
		        "ucx channel %u: cannot reach the peer's worker over a transport that "
		        "reports a failed peer (%s): the peer is gone, or ucx.tls '%s' names "
		        "only transports that cannot watch it, and UCX needs that to let go of "
		        "the writes of a peer that stops or dies (use tcp, sm, posix, sysv or "
		        "InfiniBand)",
		        ep->channel, ucs_status_string(st),
		        putil_option_text(&inst->base, "ucx.tls", ""));
	}
	if (st != UCS_OK) {
		ep->ep = NULL;
		/* Over shared memory, the segment of a peer that died is gone. */
		int code = st == UCS_ERR_SHMEM_SEGMENT ? LMT_ECONN : ucx_status_code(st);
		return putil_error(&inst->base, code,
		                   "ucx channel %u: cannot reach the peer's worker (%s)",
		                   ep->channel, ucs_status_string(st));
	}
	ep->closed = false;
	return 0;
}

/* What carries an endpoint's bulk data (its am_bw and rma_bw lanes), read
 * from the lanes ucp_ep_print_info lists ("lane[0]:  1:tcp/lo.0 md[1] ->
 * ... am am_bw#0 ..."; UCX 1.13 has no query for them): `tcp` when a
 * bandwidth lane is tcp; `peer_copies` when the rendezvous lane is a copy
 * the peer's CPU makes between the two processes (cma, knem, xpmem): the
 * destination then pulls, and the source's thread mostly waits. */
struct ucx_lanes {
	bool tcp;
	bool peer_copies;
};

static struct ucx_lanes bulk_lanes(ucp_ep_h uep)
{
	static const char *const copies[] = {":cma/", ":knem/", ":xpmem/"};
	struct ucx_lanes l = {false, false};
	char *text = NULL;
	size_t size = 0;
	FILE *f = open_memstream(&text, &size);
	if (!f)
		return l;
	ucp_ep_print_info(uep, f);
	fclose(f);
	for (char *line = text; line && *line;) {
		char *end = strchr(line, '\n');
		if (end)
			*end = '\0';
		char *lane = strstr(line, "lane[");
		char *colon = lane ? strstr(lane, "]:") : NULL;
		bool am_bw = colon && strstr(colon, " am_bw"), rma_bw = colon && strstr(colon, " rma_bw");
		if (am_bw || rma_bw) {
			const char *name = colon + 2 + strspn(colon + 2, " ");
			name += strspn(name, "0123456789");
			l.tcp |= strncmp(name, ":tcp/", 5) == 0;
			for (size_t i = 0; rma_bw && i < sizeof(copies) / sizeof(copies[0]); i++)
				l.peer_copies |= strncmp(name, copies[i], strlen(copies[i])) == 0;
		}
		line = end ? end + 1 : NULL;
	}
	free(text);
	return l;
}

int ucx_channel_connect(lmt_endpoint *ep, const struct lmt_blob *peer_addr,
                        ucp_err_handler_cb_t failed, void *(*thread)(void *))
{
	struct lmt_instance *inst = ep->inst;
	bool source = inst->base.role == LMT_ROLE_SOURCE;
	struct ucx_addr a;
	const char *why =
	        ucx_addr_decode(peer_addr, source ? UCX_MAGIC_DST_ADDR : UCX_MAGIC_SRC_ADDR, &a);
	if (!why && a.channel != ep->channel)
		why = "address of another channel";
	if (why)
		return putil_error(&inst->base, LMT_EPROTO,
		                   "ucx channel %u: bad address blob from the %s: %s", ep->channel,
		                   source ? "destination" : "source", why);
	if (ep->ep || ep->thread_started)
		return putil_error(&inst->base, LMT_ESTATE, "ucx channel %u: already connected",
		                   ep->channel);
	/* Puts need a destination that takes them (UCP_FEATURE_RMA, which it
	 * turns on only for ucx.transfer=put, or auto over RC or DC). */
	if (source && ep->use_put && !(a.flags & UCX_ADDR_PUTS)) {
		if (inst->transfer == UCX_TRANSFER_PUT)
			return putil_error(&inst->base, LMT_EMISMATCH,
			                   "ucx channel %u: ucx.transfer=put, but the destination "
			                   "takes no puts (set ucx.transfer=put there too)",
			                   ep->channel);
		ep->use_put = false;
	}
	ep->peer_token = a.token;
	int rc = create_endpoint(ep, &a, failed);
	if (rc)
		return rc;
	struct ucx_lanes lanes = bulk_lanes(ep->ep);
	ep->unsent_max = source && lanes.tcp ? UCX_TCP_UNSENT_MAX : UINT64_MAX;
	/* A source whose destination pulls the data spins only briefly
	 * while it waits: on a shared host a longer spin takes the core
	 * from the thread copying the data and from the VMM's (docs/ucx.md,
	 * "The iterate budget over shared memory"). */
	bool pulled = source && !ep->use_put && lanes.peer_copies;
	ep->spin_idle_ns = pulled ? UCX_SPIN_PULLED_NS : UCX_SPIN_IDLE_NS;
	ep->spin_pending_ns = pulled ? UCX_SPIN_PULLED_NS : UCX_SPIN_PENDING_NS;
	if (pulled)
		putil_log(&inst->base, LMT_LOG_DEBUG,
		          "ucx channel %u: the destination pulls the data, the channel spins "
		          "%llu us before it sleeps",
		          ep->channel, UCX_SPIN_PULLED_NS / 1000);
	if (ep->unsent_max != UINT64_MAX)
		putil_log(&inst->base, LMT_LOG_DEBUG,
		          "ucx channel %u: bulk data over tcp, posting held to %u KiB unsent",
		          ep->channel, UCX_TCP_UNSENT_MAX >> 10);
	if (lmt__thread_start(&ep->thread, thread, ep)) {
		ucx_ep_close_now(ep, true);
		return putil_error(&inst->base, LMT_ENOMEM, "ucx channel %u: cannot start a thread",
		                   ep->channel);
	}
	ep->thread_started = true;
	return 0;
}

bool ucx_channel_stop(lmt_endpoint *ep)
{
	if (!ep->thread_started)
		return false;
	atomic_store(&ep->stopping, true);
	ucx_wake(ep);
	pthread_join(ep->thread, NULL);
	ep->thread_started = false;
	return true;
}

void ucx_wake(lmt_endpoint *ep)
{
	if (atomic_load(&ep->sleeping) && ep->worker)
		ucp_worker_signal(ep->worker);
}

void ucx_wait_events(lmt_endpoint *ep, int timeout_ms)
{
	if (ep->efd < 0 || (ep->reply_worker && ep->reply_efd < 0)) {
		struct timespec ts = {0, 50000};
		nanosleep(&ts, NULL);
		return;
	}
	/* BUSY: events are waiting (or a wake-up came): do not sleep. */
	if (ucp_worker_arm(ep->worker) != UCS_OK)
		return;
	if (ep->reply_worker && ucp_worker_arm(ep->reply_worker) != UCS_OK)
		return;
	struct pollfd p[2] = {{.fd = ep->efd, .events = POLLIN},
	                      {.fd = ep->reply_efd, .events = POLLIN}};
	poll(p, ep->reply_worker ? 2 : 1, timeout_ms);
}

/* Sleep until the worker has events, at most `timeout_ms`, unless the
 * endpoint is stopping or `ready` says there is work already. */
static void idle(lmt_endpoint *ep, int timeout_ms, bool (*ready)(lmt_endpoint *))
{
	atomic_store(&ep->sleeping, true);
	if (!atomic_load(&ep->stopping) && !(ready && ready(ep)))
		ucx_wait_events(ep, timeout_ms);
	atomic_store(&ep->sleeping, false);
}

void ucx_pace(lmt_endpoint *ep, bool busy, bool pending, bool (*ready)(lmt_endpoint *))
{
	if (busy) {
		ep->idle_since = 0;
		putil_share_core(&ep->busy_since);
		return;
	}
	ep->busy_since = 0;
	uint64_t now = lmt__now_ns();
	if (!ep->idle_since)
		ep->idle_since = now;
	/* Waking a sleeping thread costs more than a short spin, and shared
	 * memory signals every message to a sleeping peer: stay awake a while,
	 * longer when the peer owes an answer, yielding to other threads. */
	if (now - ep->idle_since < (pending ? ep->spin_pending_ns : ep->spin_idle_ns)) {
		sched_yield();
		return;
	}
	idle(ep, pending ? 1 : 100, ready);
	ep->idle_since = 0;
}

bool ucx_drive(lmt_endpoint *ep)
{
	unsigned rounds = 0;
	while (rounds < 64 && ucp_worker_progress(ep->worker))
		rounds++;
	if (ep->reply_worker)
		while (rounds < 128 && ucp_worker_progress(ep->reply_worker))
			rounds++;
	return rounds > 0;
}

static void note_sent(void *request, ucs_status_t status, void *user_data)
{
	struct note_buffer *buf = user_data;
	buf->ep->notes_in_flight--;
	buf->ep->requests--;
	free(buf);
	ucp_request_free(request);
	(void)status; /* a lost notice shows up as a failed endpoint */
}

void ucx_foreign(lmt_endpoint *ep, const char *what, size_t header_len, size_t len)
{
	uint64_t n = ++ep->foreign;
	if (n & (n - 1))
		return;
	putil_log(&ep->inst->base, LMT_LOG_WARN,
	          "ucx channel %u: dropped %s (%zu-byte header, %zu bytes) without this "
	          "session's token: someone outside the migration is sending to this worker "
	          "(%llu such message%s so far)",
	          ep->channel, what, header_len, len, (unsigned long long)n, n == 1 ? "" : "s");
}

ucs_status_t ucx_send_notice(lmt_endpoint *ep, uint16_t kind, int code, const uint8_t *entries,
                             uint32_t count)
{
	if (!ep->ep || ep->closed)
		return UCS_ERR_NOT_CONNECTED;
	size_t len = (size_t)count * UCX_NOTE_ENTRY_LEN;
	struct note_buffer *buf = malloc(sizeof(*buf) + UCX_NOTE_HEADER_LEN + len);
	if (!buf)
		return UCS_ERR_NO_MEMORY;
	buf->ep = ep;
	ucx_note_encode(&(struct ucx_note){.token = ep->peer_token,
	                                   .kind = kind,
	                                   .code = code,
	                                   .count = count},
	                buf->data);
	if (len)
		memcpy(buf->data + UCX_NOTE_HEADER_LEN, entries, len);
	ucp_request_param_t params = {
	        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
	                        UCP_OP_ATTR_FIELD_FLAGS,
	        .flags = UCP_AM_SEND_FLAG_EAGER,
	        .cb.send = note_sent,
	        .user_data = buf,
	};
	void *req = ucp_am_send_nbx(ep->ep, UCX_AM_NOTE, buf->data, UCX_NOTE_HEADER_LEN,
	                            len ? buf->data + UCX_NOTE_HEADER_LEN : NULL, len, &params);
	if (req == NULL) {
		free(buf);
		return UCS_OK;
	}
	if (UCS_PTR_IS_ERR(req)) {
		free(buf);
		return UCS_PTR_STATUS(req);
	}
	ep->notes_in_flight++;
	ep->requests++;
	return UCS_OK;
}

ucs_status_t ucx_send_note(lmt_endpoint *ep, uint16_t kind, int code)
{
	return ucx_send_notice(ep, kind, code, NULL, 0);
}

/* Let what UCX sends on its own from `worker` go out, at most
 * UCX_SETTLE_NS: UCX 1.13 answers a peer's new connection with a wireup
 * reply that it may hold queued while its side of the connection is set
 * up, and ucp_worker_destroy aborts on such a reply in the queue it purges
 * ("got REP message", ucp_request.c:684; gone in UCX 1.14). A peer that
 * runs sets the connection up within milliseconds, but one that hears our
 * goodbye (or loses the session) tears its worker down at once, so this
 * comes before the goodbye, and again before the worker goes. */
static void settle_worker(lmt_endpoint *ep, ucp_worker_h worker)
{
	ucp_request_param_t params = {.op_attr_mask = 0};
	void *req = ucp_worker_flush_nbx(worker, &params);
	if (!UCS_PTR_IS_PTR(req))
		return;
	uint64_t deadline = lmt__deadline(UCX_SETTLE_NS);
	while (ucp_request_check_status(req) == UCS_INPROGRESS && lmt__now_ns() < deadline)
		if (!ucx_drive(ep))
			ucx_wait_events(ep, 1);
	ucp_request_free(req);
}

static void settle_workers(lmt_endpoint *ep)
{
	if (ep->reply_worker)
		settle_worker(ep, ep->reply_worker);
	if (ep->worker)
		settle_worker(ep, ep->worker);
}

/* Orderly goodbye: send BYE and wait (bounded) for the peer's. */
static void goodbye(lmt_endpoint *ep)
{
	if (!ep->ep || ep->closed || ep->transport_failed)
		return;
	settle_workers(ep);
	if (!ep->bye_sent) {
		ep->bye_sent = true;
		if (ucx_send_note(ep, UCX_NOTE_BYE, 0) != UCS_OK)
			return;
	}
	uint64_t deadline = ucx_close_deadline(ep->inst);
	/* The peer's BYE, and our own notices on their way. */
	while ((!ep->peer_bye || ep->notes_in_flight) && !ep->transport_failed &&
	       lmt__now_ns() < deadline)
		if (!ucx_drive(ep))
			ucx_wait_events(ep, 1);
}

/* Close `uep`, by force or flushing, and (when `drive`) drive the worker
 * until the close is done and UCX has let go of every request of this
 * channel, at most UCX_FORCE_NS: a forced close cancels them, but
 * completes them only in later progress calls. */
static void close_endpoint(lmt_endpoint *ep, ucp_ep_h uep, bool force, bool drive)
{
	ucp_request_param_t params = {
	        .op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
	        .flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0,
	};
	void *req = ucp_ep_close_nbx(uep, &params);
	if (!UCS_PTR_IS_PTR(req))
		req = NULL;
	uint64_t deadline = lmt__deadline(UCX_FORCE_NS);
	while (drive &&
	       ((req && ucp_request_check_status(req) == UCS_INPROGRESS) || ep->requests) &&
	       lmt__now_ns() < deadline)
		if (!ucx_drive(ep))
			ucx_wait_events(ep, 1);
	/* Still running: UCX frees it when it ends. */
	if (req)
		ucp_request_free(req);
	if (drive && ep->requests)
		putil_log(&ep->inst->base, LMT_LOG_WARN,
		          "ucx channel %u: UCX still holds %u requests %llu ms after closing the "
		          "endpoint; destroying the worker ends them",
		          ep->channel, ep->requests, UCX_FORCE_NS / 1000000);
}

void ucx_ep_close_now(lmt_endpoint *ep, bool drive)
{
	if (!ep->ep || ep->closed)
		return;
	if (drive && !ep->transport_failed)
		goodbye(ep);
	ucp_ep_h uep = ep->ep;
	ep->closed = true;
	ep->ep = NULL;
	/* A flush waits for the peer to answer every request, and one that
	 * stopped or died never does: UCX 1.13 then keeps the requests (and
	 * reads the memory they name) until ucp_worker_destroy, which aborts
	 * the process on them. So flush only when the peer answered the
	 * goodbye and nothing of this channel is outstanding; otherwise
	 * force, which cancels and completes every request. */
	close_endpoint(ep, uep, ep->transport_failed || !ep->peer_bye || ep->requests, drive);
}

void ucx_ep_close_peer(lmt_endpoint *ep, ucp_ep_h uep)
{
	close_endpoint(ep, uep, true, false);
}

void ucx_peer_bye(lmt_endpoint *ep)
{
	ep->peer_bye = true;
	if (!ep->bye_sent && ep->ep && !ep->closed) {
		ep->bye_sent = true;
		ucx_send_note(ep, UCX_NOTE_BYE, 0);
	}
}
