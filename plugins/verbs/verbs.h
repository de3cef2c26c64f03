/* Internals shared by the verbs plugin's files: instance, endpoints (one RC
 * queue pair each), registrations and the helpers each file offers. */
#ifndef LMT_VERBS_H
#define LMT_VERBS_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include <infiniband/verbs.h>
#include <lmt/plugin.h>

#include "wire.h"

#define VERBS_MAX_CHANNELS 64u
#define VERBS_SLICE_NS 100000000ull /* how often blocking calls poll cancelled */
#define VERBS_DEFAULT_DEPTH 64u
#define VERBS_DEFAULT_SIGNAL 16u

/* RC transport timers: ack timeout 4.096 us * 2^16 (about 270 ms), seven
 * retries, so a peer that vanished fails a write within about 2 s. */
#define VERBS_ACK_TIMEOUT 16
#define VERBS_RETRY_COUNT 7
#define VERBS_RNR_RETRY 7

/* A work request id: the channel in the top 16 bits, the endpoint's
 * sequence number of the request below. Never reused within a session. */
#define VERBS_SEQ_BITS 48
#define VERBS_SEQ_MASK ((UINT64_C(1) << VERBS_SEQ_BITS) - 1)

#define verbs_log(inst, level, ...) (inst)->host->log((inst)->host_ctx, level, __VA_ARGS__)
#define verbs_error(inst, code, ...) (inst)->host->error((inst)->host_ctx, code, __VA_ARGS__)

struct lmt_mr {
	struct ibv_mr *mr;
	uint8_t *addr;
	uint64_t len;
	struct lmt_mr *prev, *next; /* instance list, for instance_close */
};

struct lmt_rkey {
	uint32_t rkey;
	uint64_t addr;
	uint64_t len;
	struct lmt_rkey *prev, *next;
};

enum verbs_wr_flags {
	VERBS_WR_SIGNALLED = 1u << 0,
	VERBS_WR_MARKER = 1u << 1, /* zero-length write posted to flush the queue */
};

/* One posted work request, at ring[seq % sq_cap] until retired. */
struct verbs_wr {
	uint64_t cookie;
	uint32_t flags;
};

struct lmt_endpoint {
	struct lmt_instance *inst;
	uint32_t channel;
	struct ibv_qp *qp;
	uint32_t psn;
	bool connected;
	int broken; /* -LMT_E* once the channel failed */

	/* Source send queue. Requests [retired, posted) are in the queue; a
	 * signalled completion of request S retires every one up to S. */
	struct verbs_wr *ring;
	uint32_t sq_cap;    /* requests the queue holds: writes and one marker */
	uint32_t write_max; /* writes the queue takes before -LMT_EAGAIN */
	uint64_t posted;
	uint64_t retired;
	uint32_t unsignalled; /* posted since the last signalled request */
	uint32_t marker_rkey; /* a valid target for a zero-length marker */
	uint64_t marker_addr;
};

struct lmt_instance {
	const struct lmt_host *host;
	void *host_ctx;
	enum lmt_role role;
	uint32_t channels;
	uint64_t timeout_ns;
	uint32_t depth;           /* queue-depth: writes per channel */
	uint32_t signal_interval; /* signal one write in this many */
	bool odp;

	/* The device, port and GID in use. */
	struct ibv_context *ctx;
	char device[64];
	uint8_t port;
	enum verbs_link link;
	enum ibv_mtu mtu;
	uint16_t lid;
	int gid_index;
	union ibv_gid gid;
	uint32_t max_msg;
	uint32_t max_qp_wr;
	int max_cqe;
	uint64_t odp_general, odp_rc;

	struct ibv_pd *pd;
	struct ibv_comp_channel *comp;
	struct ibv_cq *cq;
	bool armed;              /* a CQ event was requested and not yet read */
	unsigned unacked_events; /* CQ events read but not acknowledged */
	lmt_endpoint **eps;      /* by channel; NULL when closed */

	/* Completions harvested from the CQ and not yet handed to the core. */
	struct lmt_completion *pending;
	uint32_t pending_cap, pending_first, pending_count;
	int fatal; /* -LMT_E* once the instance failed */

	pthread_mutex_t mr_lock; /* the lists: the destination registers while
	                            another thread may run progress */
	struct lmt_mr *mrs;
	struct lmt_rkey *rkeys;
};

/* device.c: pick and open the device, port and GID (options in inst), and
 * fill the device fields of inst. Closes what it opened on failure. */
int verbs_device_open(struct lmt_instance *inst, const char *device, int port, int gid_index,
                      const char *local_host);

/* datapath.c */
int verbs_write(lmt_endpoint *ep, const void *local, size_t len, lmt_mr *local_mr, lmt_rkey *rkey,
                uint64_t offset, uint64_t cookie);
int verbs_progress(lmt_instance *inst, struct lmt_completion *out, uint32_t max,
                   uint64_t timeout_ns);
int verbs_flush(lmt_instance *inst, uint64_t timeout_ns);
/* Fail the instance with `code`: every outstanding write of every channel
 * is queued as a completion with that status. */
void verbs_fail_all(struct lmt_instance *inst, int code);
/* Read and acknowledge pending asynchronous events; fatal ones fail the
 * instance. */
void verbs_async_events(struct lmt_instance *inst);

#endif
