/* The verbs plugin's objects: instance (device, port, PD and CQ), endpoint
 * (one RC queue pair per channel), registration and peer key. Types only;
 * every file of the plugin includes it. */
#ifndef LMT_VERBS_INSTANCE_H
#define LMT_VERBS_INSTANCE_H

#include <stdbool.h>
#include <stdint.h>

#include <infiniband/verbs.h>
#include <lmt/plugin.h>

#include "putil_base.h"
#include "putil_channels.h"
#include "putil_registry.h"
#include "wire.h"

#define VERBS_MAX_CHANNELS 64u
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

struct lmt_mr {
	struct putil_link link; /* released by instance_close if the core did not */
	struct ibv_mr *mr;
	uint8_t *addr;
	uint64_t len;
};

struct lmt_rkey {
	struct putil_link link;
	uint32_t rkey;
	uint64_t addr;
	uint64_t len;
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
	struct putil_instance base;
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

	/* The endpoints, the completions the CQ retired and the core has not
	 * harvested, and the failure. The CQ is polled by the core's progress
	 * itself, not by channel threads. */
	struct putil_channels channels;
	/* Registrations and peer keys, for instance_close. The destination
	 * registers while another thread may run progress. */
	struct putil_registry registry;
};

#endif
