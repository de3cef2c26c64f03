/* The session: what the source and the destination share (plugin, options,
 * RAM blocks, control connection, error, statistics), and the internal
 * calls between the core's files. Each role's own state is its engine's,
 * private to source.c or destination.c. */
#ifndef LMT_CORE_SESSION_H
#define LMT_CORE_SESSION_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <lmt/lmt.h>

#include "auth.h"
#include "tls_session.h"
#include "error.h"
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

/* Some stripes of a block (verify.c): a bit per stripe, and how many are
 * set. */
struct lmt_stripe_set {
	uint64_t *bits;
	uint64_t count;
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
	uint64_t *present; /* source, file: target: pages written at least once */
	/* verify=on (verify.c): an XXH3-64 digest per stripe of 64 KiB (one
	 * page where pages are larger): the source keeps them up to date
	 * during the passes, the destination takes all of them at the end. */
	uint32_t stripe_shift;
	uint64_t nstripes;
	uint64_t *digests;
	struct lmt_stripe_set stale; /* digest out of date */
	/* destination: the source's digests (DIGESTS), the first
	 * `source_received` of them arrived */
	uint64_t *source_digests;
	uint64_t source_received;
	/* lmt_session_add_block_fd: the session's own dup of the file the
	 * block is mapped from, and the block's offset in it; fd is -1 for a
	 * block of lmt_session_add_block. */
	int fd;
	uint64_t fd_offset;
	bool hugetlbfs; /* fd is a hugetlbfs file (pages of page_size) */
	/* unix: target: the block is handed over by descriptor at the
	 * switchover, never copied (handover.c) */
	bool handover;
	/* destination: the source's file, once mapped at host in place of
	 * the block's own mapping (-1 before) */
	int received_fd;
	uint64_t received_offset;
};

/* Each role's engine, defined in its own file; the control connection's
 * service thread (control.c) and the event queue (events.c). */
struct lmt__ctrl;
struct lmt__file;
struct lmt__lazy;
struct lmt__events;
struct lmt__job;
struct lmt_source_engine;
struct lmt_destination_engine;

struct lmt_session {
	enum lmt_role role;
	/* The engine of `role`; the other is NULL. A session keeps its role
	 * for life, so only that engine is allocated, not both embedded: each
	 * stays private to its file, and a role mixed up is a NULL pointer
	 * rather than the other role's state used in silence. */
	struct lmt_source_engine *source;
	struct lmt_destination_engine *destination;

	lmt_plugin_handle *plugin;
	const struct lmt_plugin *desc;
	/* With a decorator ("chaos:tcp"), the plugin it wraps. The wrapped
	 * plugin decides the capabilities and the name on the wire. */
	lmt_plugin_handle *inner_plugin;
	const struct lmt_plugin *inner;
	uint64_t caps;
	const char *wire_name;
	struct lmt_optset *opts;
	/* Guards opts: a source's runtime options change from any thread
	 * while the engine and the plugin read theirs. */
	pthread_mutex_t opts_lock;
	lmt_instance *inst;
	lmt_endpoint *eps[LMT_MAX_CHANNELS];

	struct lmt_block *blocks;
	uint32_t nblocks;

	/* The control connection (control.c): the socket, its service thread
	 * and inbox, and the engine's buffers for one message each way. */
	int ctrl_fd;
	bool ctrl_unix; /* a unix: target: descriptors may be passed */
	struct lmt__ctrl *ctrl;
	struct lmt_buf out;
	uint8_t *in; /* LMT_PROTO_MAX_PAYLOAD bytes */
	int *in_fds; /* passed with the message in `in` (FD_HANDOVER only) */
	unsigned in_nfds;
	/* The peer hung up the control connection (lmt__peer_gone), and when
	 * that was last looked at. */
	_Atomic int peer_gone;
	_Atomic uint64_t peer_checked_ns;

	/* A file: target (file.c, restore.c): no control connection, no
	 * peer; the path, and the file's layout once known. */
	char *file_path;
	struct lmt__file *file;
	/* restore=lazy between lmt_load_run and lmt_load_finish (lazy.c);
	 * set and cleared under lock. */
	struct lmt__lazy *lazy;
	bool finishing; /* lmt_load_finish or lmt_save_finish is waiting */
	/* postcopy=on (postcopy.c): once the switch began, what it holds
	 * (set and cleared under lock); in_postcopy from the switch on, so
	 * that a failure is postcopy's. */
	struct lmt__postcopy *postcopy;
	_Atomic int in_postcopy;

	struct lmt__events *events;
	struct lmt__job *job;       /* lmt_load_start or lmt_save_start (jobs.c) */
	_Atomic int failure_posted; /* the FAILED event went out */
	_Atomic int in_call;        /* a VMM's call is running the engine */
	_Atomic int cancelled;
	_Atomic int aborting; /* a failed session is being torn down */
	_Atomic int state;    /* enum lmt_state */
	pthread_mutex_t lock; /* guards error, stats and passes */
	struct lmt_error error;
	bool error_is_usage;     /* `error` is a refused call's, not a failure */
	bool error_is_transport; /* `error` is the plugin's (host->error) */
	struct lmt__logger log; /* the session's id and its own log handler */
	struct lmt_stats stats;
	struct lmt_pass_stats *passes;
	uint32_t npasses;
	uint32_t passes_cap;
	/* source: setup began; destination: the source connected (set under
	 * lock: snapshots count the total time from it) */
	uint64_t start_ns;

	/* Option values both roles use, read once at setup. */
	uint32_t channels;
	uint64_t chunk_size;
	bool pin_all;
	bool verify;
	bool postcopy_on;
	bool userfaultfd; /* the option: lmt__uffd_open is allowed */
	/* postcopy=on and room for one more channel than `channels` asked:
	 * the last channel carries faulted pages (s->channels counts it) */
	bool postcopy_channel;
	uint64_t connect_timeout_ns;
	uint64_t idle_timeout_ns;
	struct lmt_auth_key auth;
	/* tls=on: the context (tls_session.c), the control connection's TLS
	 * (freed with it) and the secret the plugin keys its channels from. */
	bool tls, tls_cert_mode;
	lmt__tls_ctx *tls_ctx;
	lmt__tls *ctrl_tls;
	uint8_t channel_secret[LMT_TLS_SECRET_LEN];
};

/* ---- session.c: lifecycle and failure ---- */

/* The error object keeps the first failure of the migration for good;
 * until there is one, each refused call's error replaces the last (see
 * lmt_session_error in lmt.h). */

/* Record a failure, something that ends the migration (the caller goes on
 * to lmt__abort), and return -code. After a completion it is not kept. */
int lmt__fail(struct lmt_session *s, int code, const char *fmt, ...) LMT_PRINTF(3, 4);
/* Record a failure that explains the one recorded so far, which stays in
 * parentheses as its cause: "switchover-timeout ... (chaos: stalled flush
 * timed out)". */
int lmt__fail_over(struct lmt_session *s, int code, const char *fmt, ...) LMT_PRINTF(3, 4);
/* The same for a failure the plugin reports (host->error). */
int lmt__fail_transport(struct lmt_session *s, int code, const char *fmt, ...) LMT_PRINTF(3, 4);
/* Record the peer's own end of the migration (its ERROR; `why` quotes it):
 * LMT_EPEER. It takes the place of a connection that died here (LMT_ECONN)
 * or a failure of the transport, as long as that was not reported yet:
 * the peer tears its transport down after its ERROR. Returns the code
 * recorded. */
int lmt__fail_peer(struct lmt_session *s, const char *why);
/* Record why a call was refused and return -code: a bad argument, the
 * wrong state, anything that leaves the session as it was. It never
 * replaces a failure, and any later error replaces it. */
int lmt__usage(struct lmt_session *s, int code, const char *fmt, ...) LMT_PRINTF(3, 4);
/* A message for the session, carrying its id, to its handler. */
#define lmt__session_log(s, level, ...) lmt__slog(&(s)->log, level, __VA_ARGS__)
/* Mark the session failed with the recorded error, tell the peer, release
 * the transport; returns the error code. */
int lmt__abort(struct lmt_session *s, int code);
/* A failure on a postcopy thread: status postcopy-failed and the FAILED
 * event at once; the finishing call releases the rest (lmt__abort). */
void lmt__postcopy_failed(struct lmt_session *s, int code);

uint64_t lmt__now(void);
bool lmt__is_cancelled(const struct lmt_session *s);
/* Around every call that runs an engine: failures found by the control
 * connection's thread meanwhile are the engine's to report. */
void lmt__call_enter(struct lmt_session *s);
void lmt__call_leave(struct lmt_session *s);
/* The control connection failed while the session was set up or active
 * (from its service thread): the session records it, shows it in its
 * status and posts a failure event; the engine releases the rest at its
 * next call. */
void lmt__session_async_failure(struct lmt_session *s, int code, const char *why);
/* Read the shared option values and size the blocks' windows once setup
 * starts, for either role. */
int lmt__session_prepare(struct lmt_session *s);

/* ---- host.c: the services lent to the plugin, with the session as host_ctx ---- */

extern const struct lmt_host lmt__host_services;

/* ---- control.c: the control connection ---- */

/* Whether the peer has hung up the control connection: a peer that died
 * or gave up, once the engine took every message it sent before, or at
 * once when it said why (its ERROR). Cheap enough for plugins' blocking
 * calls to poll (through the host's cancelled service), so that a
 * destination waiting on a data channel notices a source that is gone.
 * Any thread. */
bool lmt__peer_gone(struct lmt_session *s);
/* A wait for the net helpers: until deadline_ns (absolute), or a cancel. */
struct lmt__wait lmt__wait_until(struct lmt_session *s, uint64_t deadline_ns);
/* Once connected: the service thread takes the reading side, answers and
 * sends keep-alives, and queues every other message for the engine. */
int lmt__ctrl_start(struct lmt_session *s);
/* The peer is about to close the connection after a completion: that is
 * no failure. */
void lmt__ctrl_expect_close(struct lmt_session *s);
/* Stop the service thread, drop what it queued, close the socket. */
void lmt__ctrl_close(struct lmt_session *s);
/* Send the message in s->out; encode and send one without a payload. */
int lmt__ctrl_send(struct lmt_session *s);
/* The same, giving up at `deadline` rather than after idle-timeout. */
int lmt__ctrl_send_by(struct lmt_session *s, uint64_t deadline);
int lmt__ctrl_send_empty(struct lmt_session *s, uint16_t type);
/* Send an encoded message of the caller's own from any thread (the fault
 * thread's page requests): no failure is recorded; the engine finds a
 * broken connection on its own. 0 or a negative code. */
int lmt__ctrl_send_raw(struct lmt_session *s, const struct lmt_buf *b, uint64_t deadline);
/* Send s->out with `fds` attached (SCM_RIGHTS); a plain unix: socket only. */
int lmt__ctrl_send_fds(struct lmt_session *s, const int *fds, unsigned count);
/* Close the descriptors that came with the last message, if the engine
 * did not take them (s->in_fds). */
void lmt__ctrl_drop_fds(struct lmt_session *s);
/* Tell the peer this side failed, briefly and on a best-effort basis. */
void lmt__ctrl_send_error(struct lmt_session *s, const struct lmt_msg_status *st);
/* The next queued message (payload in s->in), waiting until `deadline_ns`.
 * The peer's ERROR, a dead or silent peer become the session's error once
 * the messages before them were taken. */
int lmt__ctrl_recv(struct lmt_session *s, struct lmt_msg_header *h, uint64_t deadline_ns);
/* The same for a message of type `want`; any other is a protocol error. */
int lmt__ctrl_expect(struct lmt_session *s, uint16_t want, uint64_t deadline_ns,
                     struct lmt_msg_header *h);
/* Whether a message (or the connection's failure) is waiting; the second
 * waits for one until `deadline_ns` (or a cancel), recording nothing. */
bool lmt__ctrl_pending(struct lmt_session *s);
/* How long a failure that may be the peer's doing (a connection that
 * died, the transport's) waits for the control connection's last word,
 * the peer's ERROR: at most LMT__SETTLE_NS while bytes it has not read
 * are there, LMT__SETTLE_QUIET_NS while none are. */
#define LMT__SETTLE_NS (200 * 1000000ull)
#define LMT__SETTLE_QUIET_NS (20 * 1000000ull)
/* Wait until the control connection has failed, or `deadline_ns`, or
 * `quiet_ns` with nothing unread; when it failed with the peer's ERROR,
 * that becomes the session's failure (lmt__fail_peer). */
void lmt__ctrl_settle(struct lmt_session *s, uint64_t quiet_ns, uint64_t deadline_ns);
/* When the peer was last heard from on the control connection (any
 * message, keep-alives included); 0 without a connection. */
uint64_t lmt__ctrl_last_heard(struct lmt_session *s);
/* Whether a message is queued (not counting a failure). */
bool lmt__ctrl_queued(struct lmt_session *s);
bool lmt__ctrl_wait(struct lmt_session *s, uint64_t deadline_ns);
/* The connection's failure as the session's, once nothing is queued; 0
 * while it is well. */
int lmt__ctrl_check(struct lmt_session *s);
/* The same whatever is still queued: for a wait that ended because the
 * peer is gone, where the messages before its end will not be taken. */
int lmt__ctrl_failure(struct lmt_session *s);

/* ---- transport.c: the plugin instance and endpoints, shared by both roles ---- */

/* Open the instance and the endpoints; send their addresses (EP_ADDRS). */
int lmt__endpoints_open(struct lmt_session *s);
/* The same without a peer to send them to (a file: target). */
int lmt__endpoints_open_local(struct lmt_session *s);
/* Release every key, registration and endpoint, then the instance. */
void lmt__transport_close(struct lmt_session *s);

/* ---- events.c ---- */

int lmt__events_new(struct lmt__events **out);
void lmt__events_free(struct lmt__events *q);
/* Queue an event (its time is filled in), signal the descriptor, call the
 * VMM's callback. Any thread. */
void lmt__event_post(struct lmt_session *s, const struct lmt_event *ev);
void lmt__event_simple(struct lmt_session *s, enum lmt_event_type type, int code);

/* ---- jobs.c ---- */

/* Whether a job runs this session and the caller is not its thread. */
bool lmt__job_owns(struct lmt_session *s);
/* Wait for the job's thread to end (after a cancel) and free it. */
void lmt__job_free(struct lmt_session *s);

/* ---- stats.c ---- */

/* Append a finished pass to the timeline. */
void lmt__pass_record(struct lmt_session *s, const struct lmt_pass_stats *pass);
/* With s->lock held: the migration is over with `status` (completed,
 * failed or cancelled). The total time stops at the first end. */
void lmt__stats_end(struct lmt_session *s, enum lmt_status status);

/* ---- tuning.c: what may change once a side has started ---- */

/* Why options, blocks and the dirty-sync callback are fixed ("once the
 * migration has begun", "once lmt_load_listen is called (...)"), or NULL
 * while the session is new and they are not. */
const char *lmt__config_fixed(const struct lmt_session *s);
/* Whether option `name` (the session is `opaque`) may be set now: 0, or
 * -LMT_ESTATE with err saying why not. Before either side starts, any;
 * after, on a source only the runtime options. The one place that decides,
 * for an option set alone and for each of a list (lmt_optset_allow_fn). */
int lmt__option_settable(void *opaque, const char *name, struct lmt_error *err);

/* ---- verify.c: per-stripe digests, shared by both roles ---- */

/* Size every block's stripes and allocate their digests, every stripe
 * stale (and on a destination room for the source's). */
int lmt__verify_prepare(struct lmt_session *s);
void lmt__verify_free(struct lmt_block *b);
/* Add the stripes of pages [page, page + npages) of b to `set`. */
void lmt__verify_mark(struct lmt_block *b, struct lmt_stripe_set *set, uint64_t page,
                      uint64_t npages);
/* Take stripe i out of `set`; whether it was in it. */
bool lmt__verify_take(struct lmt_stripe_set *set, uint64_t i);
/* Hash stripe i of b from memory; it is no longer stale. */
void lmt__verify_hash(struct lmt_block *b, uint64_t i);
/* The block's digest: XXH3-64 over its stripe digests, in order, each as
 * 8 little-endian bytes. */
uint64_t lmt__verify_digest(const struct lmt_block *b);
/* Bytes of b's stripes in `set`. */
uint64_t lmt__verify_bytes(const struct lmt_block *b, const struct lmt_stripe_set *set);
/* Source: the bytes the pause will hash: its stale stripes, and with a
 * destination (not a file) all of the RAM copied, which the destination
 * hashes after the last write landed. */
uint64_t lmt__verify_pause_bytes(const struct lmt_session *s);
/* Source, guest paused, every write landed: the stripe digests of every
 * block copied, in DIGESTS messages, each sent by `deadline`. */
int lmt__verify_send(struct lmt_session *s, uint64_t deadline);
/* Destination: a DIGESTS message of `length` bytes in s->in. */
int lmt__verify_receive(struct lmt_session *s, size_t length);
/* Destination, at COMPLETE with `digests` (one per block): every digest
 * of every block copied arrived and adds up to its block's; then all of
 * this side's RAM is hashed, as it is now, and compared stripe by
 * stripe. 0; or the code, with the first block and byte range that
 * differ written into `why`. */
int lmt__verify_check(struct lmt_session *s, const uint64_t *digests, char *why, size_t size);

/* ---- handover.c: RAM handed over by descriptor on a unix: target ---- */

/* After connecting or accepting over unix: the peer must run as this
 * user, or as root (SO_PEERCRED). */
int lmt__handover_check_peer(struct lmt_session *s);
/* Source, after BLOCKS: FD_OFFER, and the destination's FD_ACCEPT. */
int lmt__handover_negotiate_source(struct lmt_session *s, uint64_t deadline);
/* Destination, after BLOCKS: the source's FD_OFFER answered. */
int lmt__handover_negotiate_destination(struct lmt_session *s, uint64_t deadline);
/* Source, guest paused: FD_HANDOVER with the descriptors. */
int lmt__handover_send(struct lmt_session *s);
/* Destination: check and map what FD_HANDOVER brought. */
int lmt__handover_receive(struct lmt_session *s, size_t length);
/* Destination, failed: each block mapped from the source's file gets its
 * own mapping back, and the received descriptors are closed. */
void lmt__handover_undo(struct lmt_session *s);
/* Close what a block holds of handover (at lmt_session_free). */
void lmt__handover_block_free(struct lmt_block *b);
/* Whether a block is left out of the passes. */
static inline bool lmt__block_copied(const struct lmt_block *b)
{
	return !b->handover;
}

/* ---- source.c and destination.c: the engines ---- */

/* What lmt_save_setup refuses before it starts (a destination, no uri,
 * no blocks, no dirty-sync callback), so that lmt_save_start refuses the
 * same at once rather than on its thread. */
int lmt__save_check(struct lmt_session *s, const char *uri, const char *what);

int lmt__source_new(struct lmt_source_engine **out);
void lmt__source_free(struct lmt_source_engine *engine);
/* auto-converge: the VMM's vCPUs run freely again (once; see converge.h). */
void lmt__source_release_throttle(struct lmt_session *s);
int lmt__destination_new(struct lmt_destination_engine **out);
void lmt__destination_free(struct lmt_destination_engine *engine);

/* Destination: the device state restored from a file, `buf` (malloc'd)
 * now the session's. */
void lmt__destination_take_state(struct lmt_session *s, uint8_t *buf, uint64_t length);

/* Destination: take a migration in over an already connected control
 * socket (the session owns fd from now on). For the fuzzer. */
int lmt__load_connected(struct lmt_session *s, int fd);
/* Source: lmt_save_setup over an already connected control socket (the
 * session owns fd from now on, even when it refuses). For the fuzzer. */
int lmt__save_connected(struct lmt_session *s, int fd);

#endif
