/* Internals shared by the libfabric plugin's files: instance, endpoints,
 * registrations and the helpers each uses. Not installed. */
#ifndef LMT_OFI_H
#define LMT_OFI_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>

#include <lmt/plugin.h>

#include "sync.h"
#include "wire.h"

#define OFI_API_VERSION FI_VERSION(1, 17)
#define OFI_MAX_CHANNELS OFI_KEYS_MAX
#define OFI_QUEUE_MAX 1024u            /* writes per channel, posted and not harvested */
#define OFI_COALESCE_MAX (64u << 20)   /* largest merged write */
#define OFI_COALESCE_WINDOW (1u << 20) /* coalescing: bytes in flight before writes wait */
#define OFI_SLICE_MS 100               /* how long a progress thread sleeps at most */
#define OFI_SLICE_NS 100000000ull      /* how often blocking calls poll cancelled */

/* The FI_MR_* modes this plugin knows how to honour. */
#define OFI_MR_MODES                                                                               \
	(FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT |       \
	 FI_MR_RAW)

#define ofi_log(inst, level, ...) (inst)->host->log((inst)->host_ctx, level, __VA_ARGS__)
#define ofi_error(inst, code, ...) (inst)->host->error((inst)->host_ctx, code, __VA_ARGS__)

/* How a write is known to be visible at the target. */
enum ofi_visibility {
	OFI_DELIVERY = 0, /* FI_DELIVERY_COMPLETE on every write */
	OFI_FENCE = 1,    /* a read after the writes, ordered behind them */
};

enum ofi_op_state {
	OFI_OP_FREE = 0,
	OFI_OP_POSTED,    /* handed to the provider */
	OFI_OP_PENDING,   /* completed locally, waiting for a fence */
	OFI_OP_ABANDONED, /* reported failed; the provider still owns it */
	OFI_OP_QUEUED,    /* coalescing: waiting for the channel's write in flight */
	OFI_OP_RIDER,     /* coalescing: posted as part of the write before it */
};

/* One posted operation. The provider's context comes first, so the
 * op_context of a completion is the op. */
struct ofi_op {
	struct fi_context2 ctx;
	uint64_t cookie;
	uint64_t seq;  /* order of posting on its endpoint */
	uint32_t next; /* free, pending, queued or rider list, by index; UINT32_MAX ends it */
	uint8_t state; /* enum ofi_op_state */
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
	uint8_t *addr;
	size_t len;
	uint64_t access;
	struct lmt_mr *prev, *next; /* instance list */
	uint32_t count;
	struct fid_mr *mr[];
};

/* A peer's key: the remote address of offset 0, the length, and the keys
 * (mapped from raw bytes with FI_MR_RAW). */
struct lmt_rkey {
	uint64_t base;
	uint64_t len;
	bool mapped;
	struct lmt_rkey *prev, *next; /* instance list */
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
	struct ofi_op *ops;
	uint32_t free_head;
	uint32_t pending_head;
	uint64_t next_seq;
	uint64_t visible_seq;
	uint64_t fence_seq;
	bool fence_inflight;
	struct ofi_op fence_op;
	struct ofi_op greeting_op; /* source: the greeting write */
	bool greeting_posted;      /* source, under `lock` */
	/* Destination: the address went out (a source may be connecting),
	 * and whether the greeting arrived. */
	bool published;
	bool greeted;
	uint32_t inflight;                 /* operations the provider has not completed */
	uint32_t queued_head, queued_tail; /* coalescing: writes not yet posted */
	uint32_t queued;
	/* Coalescing: bytes the provider has not completed, and the key of the
	 * last write accepted. */
	uint64_t inflight_bytes;
	uint64_t tail_key;
	void *tail_desc;
	uint64_t writes, transfers; /* posted to the provider: writes, and as how many */

	/* Under inst->lock: writes reported to the completion queue. */
	uint64_t reported;
};

struct lmt_instance {
	const struct lmt_host *host;
	void *host_ctx;
	enum lmt_role role;
	uint32_t channels;
	uint64_t timeout_ns;

	struct fi_info *info; /* the chosen one, alone */
	struct fid_fabric *fabric;
	struct fid_domain *domain;
	struct fid_av *av;
	uint64_t mr_mode; /* FI_MR_* honoured: the provider's, plus forced local */
	bool local_mr;    /* source memory is registered with the provider */
	enum ofi_visibility visibility;
	uint64_t fence_flags; /* FI_FENCE when ordering comes from it */
	bool cq_wait;         /* CQs wait on a descriptor: threads sleep in fi_cq_sread */
	uint32_t queue;       /* writes per channel */
	bool coalesce;        /* one provider write in flight per channel, merging the rest */
	uint64_t max_msg;     /* largest write */
	uint64_t key_limit;   /* requested keys stay below it */

	lmt_endpoint **eps; /* by channel; NULL when closed */
	/* Destination: a source may be connecting since the first ep_connect;
	 * endpoints closed without its greeting wait until linger_deadline. */
	atomic_bool connecting;
	uint64_t linger_deadline;
	atomic_uint *outstanding; /* by channel: posted, completion not harvested */

	/* Completion queue and failure state. `failing` is the first error on
	 * the source; once `abandoned`, every write outstanding then has been
	 * reported with it. `fatal` is a destination thread's error. */
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct lmt__cq_ring cq;
	int failing;
	bool abandoned;
	int fatal;
	uint64_t *flush_target;

	/* Registrations and keys, under mr_lock. */
	pthread_mutex_t mr_lock;
	struct lmt_mr *mrs;
	struct lmt_rkey *rkeys;
	uint64_t next_key;
};

/* ofi.c */
/* Queue a completion; called with ep->lock held (source) or alone. */
void ofi_report(lmt_endpoint *ep, uint64_t cookie, int status);
/* Record the first failure of the source, or a destination's fatal error. */
void ofi_fail(struct lmt_instance *inst, int code);
/* An lmt code for a libfabric error number (positive FI_E* or errno). */
int ofi_code(int fi_err);

/* endpoint.c */
int ofi_ep_open(lmt_instance *inst, uint32_t channel, lmt_endpoint **ep, struct lmt_blob *addr);
int ofi_ep_connect(lmt_endpoint *ep, const struct lmt_blob *peer_addr);
void ofi_ep_close(lmt_endpoint *ep);
/* Stop the endpoint's thread, if it runs. */
void ofi_ep_stop(lmt_endpoint *ep);
int ofi_write(lmt_endpoint *ep, const void *local, size_t len, lmt_mr *local_mr, lmt_rkey *rkey,
              uint64_t offset, uint64_t cookie);
/* Report every write still outstanding on `ep` with `status`. */
void ofi_ep_abandon(lmt_endpoint *ep, int status);

/* mr.c */
/* Register [addr, addr+len) with the provider for `access` (FI_WRITE,
 * FI_REMOTE_WRITE, ...); bound to `ep` with FI_MR_ENDPOINT. */
int ofi_mr_open(lmt_instance *inst, void *addr, size_t len, uint64_t access, struct fid_ep *ep,
                struct fid_mr **out, const char *what);
/* Describe a registration in a key: the 64-bit key or its raw bytes. */
int ofi_mr_key(lmt_instance *inst, struct fid_mr *mr, struct ofi_key *key, const char *what);
/* Turn a key from the peer into one writes can use; *mapped says whether
 * fi_mr_unmap_key must release it. */
int ofi_key_import(lmt_instance *inst, const struct ofi_key *key, uint64_t *out, bool *mapped,
                   const char *what);
void ofi_key_unmap(lmt_instance *inst, uint64_t key);
/* Close whatever part of each registration is bound to `channel`. */
void ofi_mr_drop_channel(lmt_instance *inst, uint32_t channel);
int ofi_mr_register(lmt_instance *inst, void *addr, size_t len, uint32_t access, lmt_mr **mr,
                    struct lmt_blob *key);
void ofi_mr_deregister(lmt_instance *inst, lmt_mr *mr);
int ofi_rkey_import(lmt_instance *inst, const struct lmt_blob *key, lmt_rkey **rkey);
void ofi_rkey_release(lmt_instance *inst, lmt_rkey *rkey);
/* Index of the key or MR that `channel` uses. */
static inline uint32_t ofi_index(const lmt_instance *inst, uint32_t channel)
{
	return (inst->mr_mode & FI_MR_ENDPOINT) ? channel : 0;
}
/* Close a fid, logging a failure; returns nothing since teardown goes on. */
void ofi_close_fid(lmt_instance *inst, struct fid *fid, const char *what);

#endif
