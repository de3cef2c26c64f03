/* Internals shared by the UCX plugin's files: instance, endpoints (one UCP
 * worker and one thread each), regions, remote keys, helpers. Not installed. */
#ifndef LMT_UCX_H
#define LMT_UCX_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <ucp/api/ucp.h>

#include <lmt/plugin.h>

#include "putil_base.h"
#include "putil_channels.h"
#include "putil_registry.h"
#include "wire.h"

#define UCX_QUEUE_DEPTH 256u /* writes per channel, posted and not harvested */
#define UCX_MAX_CHANNELS 256u
#define UCX_CLOSE_NS 500000000ull     /* longest orderly goodbye per channel, */
#define UCX_CANCEL_NS 100000000ull    /* or once the session is cancelled */
#define UCX_FORCE_NS 500000000ull     /* longest wait for an endpoint to close */
#define UCX_SPIN_IDLE_NS 50000ull     /* a channel thread polls this long idle, */
#define UCX_SPIN_PENDING_NS 200000ull /* or this long when its peer owes an answer */
#define UCX_LIST_MAX 256u             /* longest ucx.tls or ucx.devices, with its NUL */
#define UCX_MM_RX_BUFS_GROW "64"      /* see tune_shared_memory() */

enum ucx_transfer {
	UCX_TRANSFER_AUTO = 0,
	UCX_TRANSFER_AM = 1,
	UCX_TRANSFER_PUT = 2,
};

/* A registered range. On the destination it is mapped with ucp_mem_map
 * (for puts) and found by id when an active message names it; `busy`
 * counts receives placing data into it right now (under the registry's
 * lock). */
struct lmt_mr {
	uint32_t id;
	bool remote_write;
	uint8_t *addr;
	uint64_t len;
	ucp_mem_h memh;
	unsigned busy;
};

/* A destination region as the source knows it. `unpacked[c]` is the rkey
 * unpacked on channel c's endpoint, made and destroyed by that channel's
 * thread (or after it ended); `users` counts writes queued or in flight. */
struct lmt_rkey {
	struct ucx_key key;
	uint8_t packed[UCX_RKEY_MAX];
	ucp_rkey_h *unpacked;
	atomic_uint users;
	struct putil_link link; /* released by instance_close if the core did not */
};

/* One write on the source. The generation changes under ep->lock; the
 * rest belongs to the channel thread once queued. */
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

/* Destination: a rendezvous receive placing one write into a region. */
struct ucx_recv {
	lmt_endpoint *ep;
	ucp_ep_h reply_ep; /* UCX's endpoint for the source's connection */
	struct lmt_mr *mr;
	uint32_t slot, generation;
	uint64_t len;
	bool abandoned; /* the region was let go; the request may still finish */
	struct ucx_recv *prev, *next;
};

struct lmt_endpoint {
	struct lmt_instance *inst;
	uint32_t channel;
	ucp_worker_h worker; /* receives: writes (destination), notices (source) */
	int efd;             /* its wake-up descriptor, -1 without one */
	/* Destination: a second worker owns `ep`, so that the two sides'
	 * endpoints never meet on one pair of workers, which UCX 1.13 would
	 * try to merge into one connection (and fail, or crash on close). */
	ucp_worker_h reply_worker;
	int reply_efd;
	ucp_ep_h ep; /* to the peer's worker */
	bool use_put;
	pthread_t thread;
	bool thread_started;
	atomic_bool stopping;
	atomic_bool sleeping;
	uint64_t idle_since; /* channel thread: when it last found nothing to do */

	/* Source: `lock` guards the submission queue, the free slots, the
	 * slots' busy flags and `broken`. */
	pthread_mutex_t lock;
	bool lock_ready;
	bool connected;
	struct ucx_slot *slots;
	uint32_t *free_slots;
	uint32_t free_count;
	uint32_t *queue;
	uint64_t queue_head, queue_tail;
	int broken; /* -LMT_E* once writes are refused */
	/* -LMT_E*: another channel failed the session; set under the channel
	 * table's lock, polled by the channel thread. */
	atomic_int session_failed;

	/* Owned by the channel thread (or whoever runs the worker). */
	int failure; /* -LMT_E* the channel is down with */
	bool closed; /* `ep` was closed */
	bool bye_sent, peer_bye;
	bool transport_failed; /* UCX reported the peer failed */
	uint32_t in_flight;    /* source: slots posted and not finished */
	uint32_t unflushed;
	uint64_t unflushed_bytes;
	uint64_t epoch; /* puts posted now belong to this flush */
	bool flushing;
	uint64_t flush_covers;

	/* Destination. */
	struct ucx_recv *recvs; /* rendezvous receives running */
	unsigned recv_count;
	struct ucx_recv *abandoned; /* freed once the worker is gone */
	uint8_t *acks;              /* acknowledgement entries waiting to go */
	uint32_t ack_count;
	uint64_t ack_bytes;
	uint32_t notes_in_flight;
	bool refusing;
	atomic_bool cut; /* stop placing data: a region is being let go */
};

struct lmt_instance {
	struct putil_instance base;
	enum ucx_transfer transfer;
	bool use_put;
	bool peer_failure; /* endpoints try UCP_ERR_HANDLING_MODE_PEER */
	ucp_context_h context;
	struct putil_channels channels; /* endpoints, completions, failure */
	struct putil_registry registry; /* regions by id, peer keys */
	struct lmt_instance *log_next;  /* log.c's list of live instances */
};

/* ucx.c */
/* When an orderly close stops waiting: sooner once cancelled. */
uint64_t ucx_close_deadline(const struct lmt_instance *inst);

/* log.c: UCX's messages go to the host logger of a live instance, from
 * before the instance opens its UCP context to after it closes it. */
void ucx_log_attach(struct lmt_instance *inst);
void ucx_log_detach(struct lmt_instance *inst);

/* worker.c: what both sides do with a worker and its thread. */
int ucx_status_code(ucs_status_t status);
/* An active-message handler on the channel's worker, with `ep` as its
 * argument; and the worker's address as the channel's blob. */
int ucx_set_handler(lmt_endpoint *ep, unsigned id, ucp_am_recv_callback_t cb);
int ucx_worker_blob(lmt_endpoint *ep, uint32_t magic, struct lmt_blob *addr);
/* The channel's worker, and for a destination the one its endpoint uses. */
int ucx_worker_open(lmt_endpoint *ep, bool reply_worker);
void ucx_worker_close(lmt_endpoint *ep);
int ucx_endpoint_create(lmt_endpoint *ep, const struct ucx_addr *peer, ucp_err_handler_cb_t failed);
int ucx_thread_start(lmt_endpoint *ep, void *(*fn)(void *));
/* Wake the channel thread if it sleeps. Safe from any thread. */
void ucx_wake(lmt_endpoint *ep);
/* Wait for the workers' descriptors, at most `timeout_ms`. */
void ucx_wait_events(lmt_endpoint *ep, int timeout_ms);
/* Sleep until the worker has events, at most `timeout_ms`, unless the
 * endpoint is stopping or `ready` says there is work already. */
void ucx_idle(lmt_endpoint *ep, int timeout_ms, bool (*ready)(lmt_endpoint *));
/* After a round of the channel thread: poll on, or sleep once idle long
 * enough (longer when `pending`: the peer owes an answer). */
void ucx_pace(lmt_endpoint *ep, bool busy, bool pending, bool (*ready)(lmt_endpoint *));
/* Drive the worker; true when something happened. */
bool ucx_drive(lmt_endpoint *ep);
/* Send a notice (with `count` acknowledgement entries); a UCS status. */
ucs_status_t ucx_send_notice(lmt_endpoint *ep, uint16_t kind, int code, const uint8_t *entries,
                             uint32_t count);
ucs_status_t ucx_send_note(lmt_endpoint *ep, uint16_t kind, int code);
/* Close `ep->ep` without waiting for the peer, driving the worker (when
 * `drive`) until UCX is done with it, for a bounded time. */
void ucx_ep_close_now(lmt_endpoint *ep, bool drive);
/* Force-close the endpoint UCX made for the peer's connection (a reply
 * endpoint), purging what it still tracks. */
void ucx_ep_close_peer(lmt_endpoint *ep, ucp_ep_h uep);
/* The peer said BYE: answer once. */
void ucx_peer_bye(lmt_endpoint *ep);
/* Orderly goodbye: send BYE and wait (bounded) for the peer's. */
bool ucx_goodbye(lmt_endpoint *ep);

/* source.c */
int ucx_source_ep_open(lmt_endpoint *ep, struct lmt_blob *addr);
int ucx_source_ep_connect(lmt_endpoint *ep, const struct lmt_blob *peer_addr);
void ucx_source_ep_close(lmt_endpoint *ep);
int ucx_source_write(lmt_endpoint *ep, const void *local, size_t len, lmt_rkey *rkey,
                     uint64_t offset, uint64_t cookie);
/* Destroy the rkeys this channel unpacked. */
void ucx_source_drop_rkeys(lmt_endpoint *ep);

/* destination.c */
int ucx_dest_ep_open(lmt_endpoint *ep, struct lmt_blob *addr);
int ucx_dest_ep_connect(lmt_endpoint *ep, const struct lmt_blob *peer_addr);
void ucx_dest_ep_close(lmt_endpoint *ep);
/* Stop placing data on every channel with a receive into `mr`. Called
 * with the registry's lock held. */
void ucx_dest_cut(struct lmt_instance *inst, struct lmt_mr *mr);

#endif
