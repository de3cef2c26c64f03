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

#include "net.h"
#include "sync.h"
#include "wire.h"

#define UCX_QUEUE_DEPTH 256u /* writes per channel, posted and not harvested */
#define UCX_MAX_CHANNELS 256u
#define UCX_SLICE_NS 100000000ull     /* how often blocking calls poll cancelled */
#define UCX_CLOSE_NS 500000000ull     /* longest orderly goodbye per channel, */
#define UCX_CANCEL_NS 100000000ull    /* or once the session is cancelled */
#define UCX_FORCE_NS 500000000ull     /* longest wait for an endpoint to close */
#define UCX_SPIN_IDLE_NS 50000ull     /* a channel thread polls this long idle, */
#define UCX_SPIN_PENDING_NS 200000ull /* or this long when its peer owes an answer */
#define UCX_LIST_MAX 256u             /* longest ucx.tls or ucx.devices, with its NUL */
#define UCX_MM_RX_BUFS_GROW "64"      /* see tune_shared_memory() */

#define ucx_log(inst, level, ...) (inst)->host->log((inst)->host_ctx, level, __VA_ARGS__)
#define ucx_error(inst, code, ...) (inst)->host->error((inst)->host_ctx, code, __VA_ARGS__)

enum ucx_transfer {
	UCX_TRANSFER_AUTO = 0,
	UCX_TRANSFER_AM = 1,
	UCX_TRANSFER_PUT = 2,
};

/* A registered range. On the destination it is mapped with ucp_mem_map
 * (for puts) and found by id when an active message names it; `busy`
 * counts receives placing data into it right now (under inst->mr_lock). */
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
	struct lmt_rkey *prev, *next; /* instance list, under mr_lock */
};

/* One write on the source. `busy`, the generation and `seq` change under
 * ep->lock; the rest belongs to the channel thread once queued. */
struct ucx_slot {
	lmt_endpoint *ep;
	uint32_t index;
	uint32_t generation;
	bool busy;
	uint64_t seq;
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
	uint64_t posted; /* writes accepted; the next write's seq */
	int broken;      /* -LMT_E* once writes are refused */

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

	/* Under inst->lock: the channel joined the instance, and its final
	 * status (-LMT_E*) once every write of a failed channel completed. */
	bool live;
	int final;

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
	const struct lmt_host *host;
	void *host_ctx;
	enum lmt_role role;
	uint32_t channels;
	uint64_t timeout_ns;
	enum ucx_transfer transfer;
	bool use_put;
	bool peer_failure; /* endpoints try UCP_ERR_HANDLING_MODE_PEER */
	ucp_context_h context;
	lmt_endpoint **eps;       /* by channel; NULL when closed */
	atomic_uint *outstanding; /* by channel: posted, completion not harvested */

	/* Completion queue and errors. On the source `failing` is the first
	 * channel failure and `fatal` follows once every channel completed
	 * its writes; on the destination `fatal` is set at once. */
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct lmt__cq_ring cq;
	int failing;
	int fatal;
	atomic_int failing_hint; /* `failing`, for channel threads to poll */

	/* Regions (sorted by id; ids only grow) and imported keys. */
	pthread_mutex_t mr_lock;
	pthread_cond_t mr_cond;
	struct lmt_mr **regions;
	size_t region_count, region_cap;
	uint32_t next_region;
	struct lmt_rkey *rkeys;
	struct lmt_instance *log_next; /* log.c's list of live instances */
};

/* ucx.c */
/* When an orderly close stops waiting: sooner once cancelled. */
uint64_t ucx_close_deadline(const struct lmt_instance *inst);
/* Source: queue a completion and free its slot. */
void ucx_complete(lmt_endpoint *ep, struct ucx_slot *slot, int status);
/* Source: a channel failed, so the session is over; tell every channel. */
void ucx_fail_all(struct lmt_instance *inst, int status);
/* Source: a channel finished every write after a failure. */
void ucx_settled(lmt_endpoint *ep, int status);
/* Destination: record a channel's fatal error for progress to return. */
void ucx_set_fatal(struct lmt_instance *inst, int code);
/* Find a region by id; call with mr_lock held. */
struct lmt_mr *ucx_region_find(struct lmt_instance *inst, uint32_t id);

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
/* Seq of the oldest write still running on the channel, or `posted`. */
uint64_t ucx_source_oldest(lmt_endpoint *ep);
/* Destroy the rkeys this channel unpacked. */
void ucx_source_drop_rkeys(lmt_endpoint *ep);

/* destination.c */
int ucx_dest_ep_open(lmt_endpoint *ep, struct lmt_blob *addr);
int ucx_dest_ep_connect(lmt_endpoint *ep, const struct lmt_blob *peer_addr);
void ucx_dest_ep_close(lmt_endpoint *ep);
/* Stop placing data on every channel with a receive into `mr`. Called
 * with mr_lock held. */
void ucx_dest_cut(struct lmt_instance *inst, struct lmt_mr *mr);

#endif
