/* The session room (core/session/): the state the source and the
 * destination share (plugin, options, RAM blocks, control connection,
 * error, statistics) and what every room above needs of it: failure
 * recording, cancel, the event queue, pass records, what may change at
 * run time. Each role's own state is its engine's (core/engines/).
 * May use: base, wire. Never calls a room above it by name: what failure
 * recording needs from the control connection and the engines comes
 * through `up`, set by lmt_session_new (core/api/). */
#ifndef LMT_CORE_SESSION_H
#define LMT_CORE_SESSION_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <lmt/lmt.h>

#include "auth.h"
#include "clock.h"
#include "error.h"
#include "net.h"
#include "options.h"
#include "proto.h"
#include "tls.h"

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

struct lmt__upcalls;

struct lmt_session {
	/* What this room needs from the rooms above it (see struct
	 * lmt__upcalls); set by lmt_session_new, never NULL after. */
	const struct lmt__upcalls *up;
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

/* ---- what failure recording needs from the rooms above ---- */

/* The control connection's and the source engine's parts of a failure,
 * which failure.c may not call by name (they are rooms above it): one
 * table, filled in by lmt_session_new (core/api/) with
 * lmt__ctrl_failure, lmt__ctrl_queued, lmt__ctrl_settle,
 * lmt__ctrl_send_error (core/control/), lmt__source_release_throttle
 * (core/engines/) and lmt__job_runs_elsewhere (core/api/). */
struct lmt__upcalls {
	int (*ctrl_failure)(struct lmt_session *s);
	bool (*ctrl_queued)(struct lmt_session *s);
	void (*ctrl_settle)(struct lmt_session *s, uint64_t quiet_ns, uint64_t deadline_ns);
	void (*ctrl_send_error)(struct lmt_session *s, const struct lmt_msg_status *st);
	void (*release_throttle)(struct lmt_session *s);
	/* lmt__job_runs_elsewhere (core/api/jobs.c), for lmt__job_owns. */
	bool (*job_owns)(struct lmt_session *s);
};

/* How long a failure that may be the peer's doing (a connection that
 * died, the transport's) waits for the control connection's last word,
 * the peer's ERROR: at most LMT__SETTLE_NS while bytes it has not read
 * are there, LMT__SETTLE_QUIET_NS while none are. */
#define LMT__SETTLE_NS (200 * 1000000ull)
#define LMT__SETTLE_QUIET_NS (20 * 1000000ull)

/* ---- errors.c and failure.c: how a session fails ---- */

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
/* A failure the peer's own end may have caused: a connection that died,
 * or anything the transport saw go wrong once the peer tore its side
 * down; never this side's own cancel. With s->lock held. */
bool lmt__fail_maybe_consequence(const struct lmt_session *s);
/* The parts of lmt__abort (core/engines/abort.c) that the other ends of a
 * migration share: wait for the peer's last word when the failure may be
 * its doing; the status a failure ends with; the FAILED event, once. */
void lmt__fail_settle(struct lmt_session *s);
enum lmt_status lmt__failed_status(struct lmt_session *s);
void lmt__fail_post(struct lmt_session *s);
/* Tell the peer why (best effort, briefly), unless the peer ended it. */
void lmt__fail_tell_peer(struct lmt_session *s, const struct lmt_msg_status *st);
/* A failure on a postcopy thread: status postcopy-failed and the FAILED
 * event at once; the finishing call releases the rest (lmt__abort). */
void lmt__postcopy_failed(struct lmt_session *s, int code);
/* The control connection failed while the session was set up or active
 * (from its service thread): the session records it, shows it in its
 * status and posts a failure event; the engine releases the rest at its
 * next call. */
void lmt__session_async_failure(struct lmt_session *s, int code, const char *why);

/* ---- session.c: cancel, calls, blocks, setup ---- */

/* Whether lmt_cancel was called. */
static inline bool lmt__is_cancelled(const struct lmt_session *s)
{
	return atomic_load(&s->cancelled) != 0;
}
/* Around every call that runs an engine: failures found by the control
 * connection's thread meanwhile are the engine's to report. */
void lmt__call_enter(struct lmt_session *s);
void lmt__call_leave(struct lmt_session *s);
/* Whether a job (lmt_load_start, lmt_save_start: core/api/jobs.c) runs
 * this session and the caller is not its thread. */
bool lmt__job_owns(struct lmt_session *s);
/* Whether a block is left out of the passes (handed over by descriptor,
 * core/targets/handover.c). */
static inline bool lmt__block_copied(const struct lmt_block *b)
{
	return !b->handover;
}

/* ---- events.c ---- */

int lmt__events_new(struct lmt__events **out);
void lmt__events_free(struct lmt__events *q);
/* Queue an event (its time is filled in), signal the descriptor, call the
 * VMM's callback. Any thread. */
void lmt__event_post(struct lmt_session *s, const struct lmt_event *ev);
void lmt__event_simple(struct lmt_session *s, enum lmt_event_type type, int code);

/* ---- stats.c: the status, the pass timeline ---- */

/* Append a finished pass to the timeline. */
void lmt__pass_record(struct lmt_session *s, const struct lmt_pass_stats *pass);
/* With s->lock held: the migration is over with `status` (completed,
 * failed or cancelled). The total time stops at the first end. */
void lmt__stats_end(struct lmt_session *s, enum lmt_status status);
/* Whether `status` ends a migration (completed, failed, cancelled or
 * postcopy-failed). */
bool lmt__status_ended(enum lmt_status status);

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

#endif
