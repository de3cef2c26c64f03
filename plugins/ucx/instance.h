/* The UCX plugin's objects: instance (one UCP context), endpoint (one
 * UCP worker and one thread per channel), registration and peer key.
 * Types only; every file of the plugin includes it. */
#ifndef LMT_UCX_INSTANCE_H
#define LMT_UCX_INSTANCE_H

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
/* Over tcp, the most a source channel hands UCX that UCX has not sent:
 * see post_queued() in source.c. */
#define UCX_TCP_UNSENT_MAX (1u << 20)

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
	uint64_t id; /* random (putil_registry), never 0 */
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

struct ucx_slot; /* source.c: one write */
struct ucx_recv; /* destination.c: one rendezvous receive */

/* One channel: a UCP worker driven by a thread of its own, and a UCP
 * endpoint to the peer's worker. */
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
	/* Random, never 0: what every message to this endpoint must carry
	 * (`token`, in its address blob), and what every message to the
	 * peer carries (`peer_token`, from the peer's blob). */
	uint64_t token, peer_token;
	uint64_t foreign; /* channel thread: messages dropped for a wrong token */
	pthread_t thread;
	bool thread_started;
	atomic_bool stopping;
	atomic_bool sleeping;
	uint64_t idle_since; /* channel thread: when it last found nothing to do */
	uint64_t busy_since; /* channel thread: busy since, or last yield (putil_share_core) */
	/* channel thread: how long it spins before it sleeps, idle or owed
	 * an answer (ucx_pace) */
	uint64_t spin_idle_ns, spin_pending_ns;

	/* Source: `lock` guards the submission queue, the free slots, the
	 * slots' generations and `broken`. */
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
	bool transport_failed;    /* UCX reported the peer failed */
	uint32_t notes_in_flight; /* notices sent and not yet gone */
	/* Requests of this channel's endpoint that UCX holds (writes,
	 * notices, flushes of puts) and has not completed: each may still
	 * touch memory until it does. */
	uint32_t requests;
	uint32_t in_flight;    /* source: slots posted and not finished */
	uint64_t unsent_bytes; /* source: bytes posted that UCX has not sent yet */
	uint64_t unsent_max;   /* source: posts stop at this (UCX_TCP_UNSENT_MAX over tcp) */
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
	bool refusing;
	atomic_bool cut; /* stop placing data: a region is being let go */
};

struct lmt_instance {
	struct putil_instance base;
	enum ucx_transfer transfer;
	/* UCP_FEATURE_RMA is on: the source puts, the destination takes
	 * puts. Off otherwise, so that UCX's emulated puts and gets, which
	 * reach any address for any peer, are not served at all. */
	bool rma;
	bool use_put;
	/* Tests only: how long a destination's channel waits before it
	 * answers the source's goodbye (ucx.test-bye-delay). */
	uint64_t test_bye_delay_ns;
	ucp_context_h context;
	struct putil_channels channels; /* endpoints, completions, failure */
	struct putil_registry registry; /* regions by id, peer keys */
	struct lmt_instance *log_next;  /* log_relay.c's list of live instances */
};

#endif
