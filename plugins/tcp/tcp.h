/* Internals shared by the TCP plugin's files: instance, endpoints, regions,
 * and the helpers each side uses. Not installed. */
#ifndef LMT_TCP_H
#define LMT_TCP_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <lmt/plugin.h>

#include "net.h"
#include "sync.h"
#include "wire.h"

#define TCP_QUEUE_DEPTH 256u /* writes per channel, posted and not harvested */
#define TCP_MAX_CHANNELS 1024u
#define TCP_SLICE_NS 100000000ull /* how often blocking calls poll cancelled */

#define tcp_log(inst, level, ...) (inst)->host->log((inst)->host_ctx, level, __VA_ARGS__)
/* Record an error and give -code; control flow never rests on the host's
 * return value. */
#define tcp_error(inst, code, ...)                                                                 \
	((inst)->host->error((inst)->host_ctx, code, __VA_ARGS__), -(code))

/* A registered range. Destination regions are found by id when a header
 * arrives; `busy` counts receivers placing data into it right now. */
struct lmt_mr {
	uint32_t id;
	bool remote_write;
	uint8_t *addr;
	uint64_t len;
	unsigned busy;
};

struct lmt_rkey {
	uint32_t region;
	uint64_t len;
	struct lmt_rkey *prev, *next; /* instance list, freed by instance_close */
};

/* One posted write on the source: its encoded header and payload. */
struct tcp_slot {
	uint8_t header[TCP_HEADER_LEN];
	const void *local;
	size_t len;
	uint64_t cookie;
};

struct lmt_endpoint {
	struct lmt_instance *inst;
	uint32_t channel;
	int fd;        /* data connection, -1 until connected */
	int listen_fd; /* destination, until the source connected */
	uint64_t token;
	atomic_bool stopping;

	/* Source. `lock` guards the ring: the sender copies what it sends out
	 * of it, and a slot is reused once its completion was harvested. */
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool sync_ready;
	struct tcp_slot *ring;
	uint64_t head;  /* writes posted */
	uint64_t taken; /* writes handed to the sender */
	bool connected, sending, sender_done;
	int broken; /* -LMT_E* once the channel is down */
	pthread_t sender, acker;
	bool threads_started;
	/* Under inst->lock: threads running, writes acknowledged, and the
	 * final status (-LMT_E*) once unacknowledged writes were completed. */
	bool live;
	uint64_t acked;
	int final;

	/* Destination. */
	pthread_t receiver;
	bool receiver_started;
	struct lmt_mr *busy_region; /* under inst->mr_lock */
};

struct lmt_instance {
	const struct lmt_host *host;
	void *host_ctx;
	enum lmt_role role;
	uint32_t channels;
	uint64_t timeout_ns;
	int nodelay;
	int buffer_size;
	char bind_host[256];      /* what destination listeners bind */
	char local_host[64];      /* advertised when bind_host is a wildcard */
	lmt_endpoint **eps;       /* by channel, NULL when closed; changed under `lock` */
	atomic_uint *outstanding; /* by channel: posted, completion not harvested */

	/* Completion queue, per-endpoint ack state, the endpoint table and
	 * errors. On the source, `failing` is the first channel failure and
	 * `fatal` follows once every channel has completed its writes. */
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct lmt__cq_ring cq;
	int failing;            /* -LMT_E* */
	int fatal;              /* -LMT_E* */
	uint64_t *flush_target; /* by channel, used by flush only */

	/* Region table, sorted by id (ids only grow). */
	pthread_mutex_t mr_lock;
	pthread_cond_t mr_cond;
	struct lmt_mr **regions;
	size_t region_count, region_cap;
	uint32_t next_region;
	struct lmt_rkey *rkeys;
};

/* tcp.c */
int tcp_thread_start(pthread_t *thread, void *(*fn)(void *), void *arg);
/* The deadline of a blocking call: the instance timeout from now (0 = none). */
uint64_t tcp_op_deadline(const struct lmt_instance *inst);
struct lmt__wait tcp_wait(const struct lmt_instance *inst, uint64_t deadline_ns);
/* Push completions for writes [from, to) of a source endpoint. A non-zero
 * status also makes it the channel's final one. */
void tcp_complete(lmt_endpoint *ep, uint64_t from, uint64_t to, int status);
/* Source: a channel failed, so the session is over; fail every channel. */
void tcp_fail_all(struct lmt_instance *inst, int status);
/* Source: a connected channel joins the instance (or fails at once). */
void tcp_go_live(lmt_endpoint *ep);
/* Destination: record a receiver's fatal error for progress to return. */
void tcp_set_fatal(struct lmt_instance *inst, int code);
/* Find a region by id; call with mr_lock held. */
struct lmt_mr *tcp_region_find(struct lmt_instance *inst, uint32_t id);

/* source.c */
int tcp_source_ep_open(lmt_endpoint *ep, struct lmt_blob *addr);
int tcp_source_ep_connect(lmt_endpoint *ep, const struct lmt_blob *peer_addr);
void tcp_source_ep_close(lmt_endpoint *ep);
int tcp_source_write(lmt_endpoint *ep, const void *local, size_t len, lmt_rkey *rkey,
                     uint64_t offset, uint64_t cookie);
/* Take the channel down with `status` unless it is down already. */
void tcp_source_break(lmt_endpoint *ep, int status);

/* destination.c */
int tcp_dest_ep_open(lmt_endpoint *ep, struct lmt_blob *addr);
int tcp_dest_ep_connect(lmt_endpoint *ep, const struct lmt_blob *peer_addr);
void tcp_dest_ep_close(lmt_endpoint *ep);

#endif
