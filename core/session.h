/* The session: state shared by the source and destination engines, the
 * control connection, host services handed to plugins, and teardown. */
#ifndef LMT_CORE_SESSION_H
#define LMT_CORE_SESSION_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <lmt/lmt.h>

#include "auth.h"
#include "net.h"
#include "options.h"
#include "proto.h"

enum lmt_state {
	LMT_STATE_NEW = 0,
	LMT_STATE_LISTENING, /* destination: control socket bound */
	LMT_STATE_SETUP,     /* handshake and channels in progress */
	LMT_STATE_ACTIVE,    /* source: iterating; destination: loading */
	LMT_STATE_DONE,      /* completed */
	LMT_STATE_FAILED,
};

struct lmt_block {
	char name[LMT_BLOCK_NAME_MAX + 1];
	uint8_t *host;
	uint64_t length;
	uint32_t page_size;
	uint32_t page_shift;
	uint64_t npages;
	uint64_t words;     /* 64-bit words in each bitmap */
	uint64_t *dirty;    /* source: pages still to send */
	uint64_t *inflight; /* source: pages of writes not yet completed */
	uint64_t *sync;     /* source: scratch handed to the dirty callback */
	uint64_t window;    /* bytes per registration: chunk-size or the block */
	uint64_t nwindows;
	lmt_rkey **rkeys; /* source: the peer's key per window */
	lmt_mr **mrs;     /* source local / destination registration per window */
};

/* One write in flight. */
struct lmt_slot {
	uint64_t cookie; /* 0 when free */
	uint32_t block;
	uint32_t channel;
	uint64_t page;
	uint64_t npages;
	uint64_t bytes;
};

struct lmt_session {
	enum lmt_role role;
	lmt_plugin_handle *plugin;
	const struct lmt_plugin *desc;
	/* With a decorator ("chaos:tcp"), the plugin it wraps. The wrapped
	 * plugin decides the capabilities and the name on the wire. */
	lmt_plugin_handle *inner_plugin;
	const struct lmt_plugin *inner;
	uint64_t caps;
	const char *wire_name;
	struct lmt_optset *opts;
	struct lmt_host host;
	lmt_instance *inst;
	lmt_endpoint *eps[LMT_MAX_CHANNELS];

	struct lmt_block *blocks;
	uint32_t nblocks;
	lmt_dirty_sync_fn dirty_fn;
	void *dirty_opaque;

	int ctrl_fd;
	int listen_fd;
	struct lmt_buf out;
	uint8_t *in; /* LMT_PROTO_MAX_PAYLOAD bytes */
	uint64_t last_rx_ns;
	uint64_t last_tx_ns;

	_Atomic int cancelled;
	_Atomic int state;    /* enum lmt_state */
	pthread_mutex_t lock; /* guards error and stats */
	struct lmt_error error;
	bool error_is_usage;
	struct lmt_stats stats;

	/* option values, read once at setup */
	uint32_t channels;
	uint64_t chunk_size;
	bool pin_all;
	bool zero_detect;
	bool verify;
	uint64_t max_bandwidth;
	uint64_t downtime_limit_ns;
	uint64_t iterate_ns;
	uint64_t connect_timeout_ns;
	uint64_t idle_timeout_ns;
	uint32_t queue_depth;
	struct lmt_auth_key auth;

	/* source engine */
	struct lmt_slot *slots;
	uint32_t *free_slots;
	uint32_t nslots;
	uint32_t nfree;
	uint64_t generation;
	uint32_t ch_writes[LMT_MAX_CHANNELS];
	uint64_t ch_bytes[LMT_MAX_CHANNELS];    /* completed, per channel */
	uint64_t ch_inflight[LMT_MAX_CHANNELS]; /* posted, not yet completed */
	/* The last write posted: its channel, where it ended, and how many
	 * writes in a row that channel took, each following the one before. */
	uint32_t run_channel;
	uint32_t run_block;
	uint64_t run_end_page;
	uint32_t run_length;
	uint64_t dirty_bytes;
	uint64_t inflight_bytes;
	uint32_t cur_block;
	uint64_t cur_page;
	uint32_t pass;
	bool pass_done;        /* the walk reached the end of the pass */
	bool need_pass;        /* "ready" was returned; the next call starts a pass */
	bool draining;         /* the pass ended near convergence: draining */
	uint64_t pass_dirtied; /* newly dirty at the end of the walk */
	uint64_t last_service_ns;
	uint64_t start_ns;
	uint64_t pass_start_ns;
	uint64_t pass_bytes;
	uint64_t bw_start_ns; /* max-bandwidth accounting */
	uint64_t bw_bytes;
	uint64_t bandwidth_bps;

	struct lmt_pass_stats *passes; /* under lock */
	uint32_t npasses;
	uint32_t passes_cap;

	/* destination */
	uint8_t *state_buf;
	uint64_t state_len;
	uint64_t state_received;
};

/* Record a failure (the first one wins) and return -code. */
int lmt__fail(struct lmt_session *s, int code, const char *fmt, ...) LMT_PRINTF(3, 4);
/* Record a misuse of the API: reported, but replaced by any later error. */
int lmt__usage(struct lmt_session *s, int code, const char *fmt, ...) LMT_PRINTF(3, 4);
/* Mark the session failed with the recorded error, tell the peer, release
 * the transport; returns the error code. */
int lmt__abort(struct lmt_session *s, int code);

uint64_t lmt__now(void);
bool lmt__is_cancelled(const struct lmt_session *s);
/* A wait for the net helpers: until deadline_ns (absolute), or a cancel. */
struct lmt__wait lmt__wait_until(struct lmt_session *s, uint64_t deadline_ns);
void lmt__stats_update(struct lmt_session *s);
/* Append a finished pass to the timeline. */
void lmt__pass_record(struct lmt_session *s, const struct lmt_pass_stats *pass);

/* Control connection: send the message in s->out; receive one message
 * (payload in s->in) before `deadline_ns`. An ERROR message from the peer
 * becomes the session's error. */
int lmt__ctrl_send(struct lmt_session *s);
int lmt__ctrl_recv(struct lmt_session *s, struct lmt_msg_header *h, uint64_t deadline_ns);
bool lmt__ctrl_readable(struct lmt_session *s);
/* Receive until a message of type `want`, answering keep-alives; anything
 * else is a protocol error. */
int lmt__ctrl_expect(struct lmt_session *s, uint16_t want, uint64_t deadline_ns,
                     struct lmt_msg_header *h);
/* The numeric IP of a socket's local (peer false) or remote end. */
void lmt__numeric_host(int fd, bool peer, char *buf, size_t size);

/* Destination: take a migration in over an already connected control
 * socket (the session owns fd from now on). For the fuzzer. */
int lmt__load_connected(struct lmt_session *s, int fd);

/* Transport lifecycle shared by both roles. */
int lmt__transport_open(struct lmt_session *s, const char *local_host, const char *peer_host);
void lmt__transport_close(struct lmt_session *s);
/* Open the instance and the endpoints; send their addresses (EP_ADDRS). */
int lmt__endpoints_open(struct lmt_session *s);
int lmt__blocks_prepare(struct lmt_session *s);

#endif
