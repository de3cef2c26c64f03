/* The libfabric plugin's objects: instance (one fabric, domain and address
 * vector), endpoint (one RDM endpoint, CQ and thread per channel), the
 * operations a source posts, registration and peer key. Types only; every
 * file of the plugin includes it. */
#ifndef LMT_LFI_INSTANCE_H
#define LMT_LFI_INSTANCE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>

#include <lmt/plugin.h>

#include "putil_base.h"
#include "putil_channels.h"
#include "putil_registry.h"
#include "wire.h"

#define LFI_MAX_CHANNELS LFI_KEYS_MAX
#define LFI_POLL_NAP_NS 50000 /* how long a thread that polls naps */
#define LFI_CQ_BATCH 32       /* completions read at once */
#define LFI_SINK_RING 8       /* receives of each kind kept posted for unasked messages */

/* How a write is known to be visible at the target. */
enum lfi_visibility {
	LFI_DELIVERY = 0, /* FI_DELIVERY_COMPLETE on every write */
	LFI_FENCE = 1,    /* a read after the writes, ordered behind them */
};

enum lfi_op_state {
	LFI_OP_FREE = 0,
	LFI_OP_POSTED,    /* handed to the provider */
	LFI_OP_PENDING,   /* completed locally, waiting for a fence */
	LFI_OP_ABANDONED, /* reported failed; the provider still owns it */
	LFI_OP_QUEUED,    /* coalescing: waiting for the channel's write in flight */
	LFI_OP_RIDER,     /* coalescing: posted as part of the write before it */
};

/* One posted operation. The provider's context comes first, so the
 * op_context of a completion is the op. */
struct lfi_op {
	struct fi_context2 ctx;
	uint64_t cookie;
	uint64_t seq;  /* order of posting on its endpoint */
	uint32_t next; /* free, pending, queued or rider list, by index; UINT32_MAX ends it */
	uint8_t state; /* enum lfi_op_state */
	/* Coalescing: the write itself while queued, and the writes posted
	 * with it (by index, through `next`) once it heads a posted one. */
	uint8_t *buf;
	size_t len;
	void *desc;
	uint64_t addr, key;
	uint32_t riders;
};

/* A registration: one provider MR, or one per channel with FI_MR_ENDPOINT,
 * or none for source memory the provider does not need registered. */
struct lmt_mr {
	struct putil_link link; /* released by instance_close if the core did not */
	uint8_t *addr;
	size_t len;
	uint64_t access;
	uint32_t count;
	struct fid_mr *mr[];
};

/* A peer's key: the remote address of offset 0, the length, and the keys
 * (mapped from raw bytes with FI_MR_RAW). */
struct lmt_rkey {
	struct putil_link link; /* released by instance_close if the core did not */
	uint64_t base;
	uint64_t len;
	bool mapped;
	uint32_t count;
	uint64_t key[];
};

struct lmt_endpoint {
	struct lmt_instance *inst;
	uint32_t channel;
	struct fid_ep *ep;
	struct fid_cq *cq;
	fi_addr_t peer;
	bool connected;
	pthread_t thread;
	bool thread_started;
	atomic_bool stopping;
	atomic_bool thread_exited;

	/* The fence region: readable by the source on the destination, the
	 * landing buffer of fence reads on the source. The source's first
	 * write, the greeting, goes from it into the destination's. */
	uint64_t fence_buf[2]; /* [0] the region, [1] the source's greeting */
	struct fid_mr *fence_mr;
	uint64_t fence_base; /* source: the destination's fence region */
	uint64_t fence_key;
	bool fence_mapped;

	/* Source: operations and their order, under `lock`. Writes with
	 * seq < visible_seq are known visible. */
	pthread_mutex_t lock;
	bool lock_ready;
	struct lfi_op *ops;
	uint32_t free_head;
	uint32_t pending_head;
	uint64_t next_seq;
	uint64_t visible_seq;
	uint64_t fence_seq;
	bool fence_inflight;
	struct lfi_op fence_op;
	struct lfi_op greeting_op;         /* source: the greeting write */
	bool greeting_posted;              /* source, under `lock` */
	atomic_bool greeting_done;         /* source: its completion was read */
	uint32_t inflight;                 /* operations the provider has not completed */
	uint32_t queued_head, queued_tail; /* coalescing: writes not yet posted */
	uint32_t queued;
	uint64_t inflight_bytes; /* coalescing: bytes the provider has not completed */
	uint64_t writes, transfers; /* posted to the provider: writes, and as how many */
	/* Source failure: `broken` is the session's failure once the channel
	 * table broke this channel; `abandoned` (set under `lock`) once every
	 * write it owed was reported with it. */
	atomic_int broken;
	atomic_bool abandoned;

	/* Destination: whether the greeting arrived. */
	bool greeted;
	/* Receives that drop what strangers send (sink.c): their contexts,
	 * the first half plain, the second tagged; those the provider has not
	 * taken back yet; how many messages they dropped. */
	struct fi_context2 sink_ctx[2 * LFI_SINK_RING];
	uint8_t *sink_buf;
	uint32_t sink_unposted;
	unsigned long sink_taken;

	/* Over shm: the endpoint's name, and the locks of its own region and
	 * its peer's, what an unlocked one holds, and the peer's process and
	 * whether it was last seen stopped or gone (shmlock.c). */
	char shm_name[48];
	char shm_peer_name[48];
	int *shm_lock[2];
	int shm_unlocked;
	int shm_peer_pid;
	uint64_t shm_checked_ns;
	bool shm_frozen;
	bool shm_looking; /* the peer's region is not mapped yet */
	uint64_t shm_looked_ns;

	/* The listening address, over sockets, and when the channel's thread
	 * last trimmed its connections (conns.c). */
	struct sockaddr_storage bound;
	socklen_t bound_len;
	uint64_t trimmed_ns;
	bool sealed;    /* takes no more connections */
	unsigned trims; /* connections shut down beyond LFI_CONNS_MAX */
};

struct lmt_instance {
	struct putil_instance base;

	struct fi_info *info; /* the chosen one, alone */
	struct fid_fabric *fabric;
	struct fid_domain *domain;
	struct fid_av *av;
	uint64_t mr_mode; /* FI_MR_* honoured: the provider's, plus forced local */
	bool local_mr;    /* source memory is registered with the provider */
	enum lfi_visibility visibility;
	uint64_t fence_flags; /* FI_FENCE when ordering comes from it */
	bool cq_wait;         /* CQs wait on a descriptor: threads sleep in fi_cq_sread */
	uint32_t queue;       /* writes per channel */
	bool coalesce;        /* one provider write in flight per channel, merging the rest */
	uint64_t max_msg;     /* largest write */
	uint64_t key_limit;   /* keys stay below it; requested ones are random below it */

	/* Endpoints by channel, the completion queue, failure settling. */
	struct putil_channels channels;
	/* The provider moves data over TCP sockets of its own (net, or the
	 * native tcp of later libfabric): conns.c bounds the connections it
	 * accepts, and closes those it lost at close (noted by inode). */
	bool sockets;
	bool sink; /* endpoints post receives that drop unasked messages (sink.c) */
	struct {
		ino_t *inode;
		size_t count, size;
	} conns;
	/* Over shm: a source closing a channel first waits, until
	 * greeting_deadline, for its greeting to complete, and drains its
	 * writes without the quiet bound (source.c). */
	bool shm;
	uint64_t greeting_deadline;

	/* Registrations and peer keys. */
	struct putil_registry registry;
};

#endif
