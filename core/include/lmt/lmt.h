/* lmt embedding API: what a VMM includes to live-migrate guest RAM through a
 * transport plugin.
 *
 * NULL: a pointer argument is required unless its description says it may
 * be NULL. A required pointer that is NULL is refused: a function that
 * returns int returns -LMT_EINVAL (with the reason in the session's error,
 * or in `err`, when there is one), a function that returns a pointer
 * returns NULL, and lmt_session_free, lmt_plugin_close and lmt_cancel do
 * nothing. lmt_session_error and lmt_session_id say what they give for
 * NULL. docs/embedding.md has the whole contract: NULL, errors, when a
 * session's configuration is fixed, logging. */
#ifndef LMT_LMT_H
#define LMT_LMT_H

#include <stddef.h>
#include <stdint.h>

#include <lmt/plugin.h>
#include <lmt/version.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Everything declared here is exported from liblmt; the rest is hidden. */
#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

/* LMT_VERSION ("MAJOR.MINOR.PATCH") and its numbers are in lmt/version.h,
 * generated from the project's version; LMT_VERSION_STRING is its older
 * name. */
#define LMT_VERSION_STRING LMT_VERSION

/* The version of the liblmt in use at run time, "MAJOR.MINOR.PATCH", which
 * may differ from the LMT_VERSION a program was built against. Never NULL;
 * thread-safe. */
const char *lmt_version(void);

/* Maximum channels per session and length of a RAM block name. */
#define LMT_MAX_CHANNELS 64u
#define LMT_BLOCK_NAME_MAX 63u

/* ---- Errors ------------------------------------------------------------ */

/* Every function that can fail returns 0 or a negative LMT_E* code, and
 * says what was wrong: a session in its own error object, read with
 * lmt_session_error() (which says what it keeps); functions without a
 * session in the lmt_error they are given, when it is not NULL.
 *
 * The codes of a failure follow one rule (docs/embedding.md, "Error
 * codes"): LMT_ECANCELED only for this side's own lmt_cancel (or
 * lmt_session_free); LMT_EPEER when the peer ended the migration and said
 * why (its cancel, or a failure of its own), its words quoted in the
 * message; the peer's own code when it refused what this side sent
 * (LMT_EMISMATCH, LMT_EAUTH, LMT_EVERIFY, LMT_EPROTO); LMT_ECONN for a
 * connection that died; LMT_ETIMEDOUT for a bound that expired, the
 * message telling silence from keep-alives only; LMT_EPROTO for a peer
 * that breaks the protocol or does not speak lmt ("the peer at
 * 10.0.0.2:4444 is not an lmt destination (it sent 'HTTP/1.1 ...')").
 * A failure has the same code everywhere: the failing call's return, the
 * FAILED event, lmt_session_error() and the status (cancelled exactly for
 * LMT_ECANCELED). */
struct lmt_error {
	int code;          /* negative LMT_E* code, or 0 */
	char message[512]; /* "chunk-size: expected a power of two ..." */
};

/* "LMT_EINVAL" and "invalid argument". Never NULL; thread-safe. */
const char *lmt_err_name(int code);
const char *lmt_strerror(int code);

/* Logging. By default messages at or above the level in LMT_LOG
 * (error|warn|info|debug; default warn) go to stderr. A VMM may route them
 * through its own logger (`fn` NULL goes back to stderr); `fn` may be
 * called from any lmt thread, one call at a time, and must not call lmt.
 * Once lmt_set_log_handler returns, the handler it replaced is no longer
 * called. The messages of a session, the core's and those its plugin logs,
 * start with the session's id ("[s3] tcp: tcp channel 0: connected to
 * ...") and go to the session's own handler when it has one (see
 * lmt_session_set_log_handler). The level applies to every handler; one
 * outside the enum counts as the nearest level. Thread-safe. */
typedef void (*lmt_log_fn)(void *opaque, enum lmt_log_level level, const char *msg);
void lmt_set_log_handler(lmt_log_fn fn, void *opaque);
void lmt_set_log_level(enum lmt_log_level level);

/* ---- Plugins ----------------------------------------------------------- */

/* A loaded plugin. Owned by the caller; free with lmt_plugin_close(). */
typedef struct lmt_plugin_handle lmt_plugin_handle;

/* Load `name` (a plugin name such as "tcp", or a path to a .so). The search
 * order is: a path as given, each directory of LMT_PLUGIN_PATH, the plugin
 * directory next to the installed liblmt, then the build tree. `err` may
 * be NULL. lmt_plugin_close(NULL) does nothing; the descriptor and path
 * of NULL are NULL. */
int lmt_plugin_open(const char *name, lmt_plugin_handle **out, struct lmt_error *err);
void lmt_plugin_close(lmt_plugin_handle *plugin);
const struct lmt_plugin *lmt_plugin_descriptor(const lmt_plugin_handle *plugin);
const char *lmt_plugin_path(const lmt_plugin_handle *plugin);

/* Load what lmt_session_new loads for `spec`: a plugin name or path as for
 * lmt_plugin_open, or "DECORATOR:PLUGIN" ("chaos:tcp"; a ':' in a path's
 * directories is part of the path). *plugin is the plugin named first and
 * *inner the one a decorator wraps, NULL for a plain plugin; the wrapped
 * plugin is the transport, the one whose capabilities and name count. Both
 * are the caller's, to free with lmt_plugin_close(). A decorator without a
 * plugin to wrap, a plugin that is no decorator given one, and a decorator
 * around a decorator are refused with LMT_EINVAL. On failure both are NULL
 * and err says why. Thread-safe. */
int lmt_plugin_open_spec(const char *spec, lmt_plugin_handle **plugin, lmt_plugin_handle **inner,
                         struct lmt_error *err);

/* List every plugin found on the search path: calls `fn` once per file
 * that loads (with its handle, valid during the call) and once per file
 * that fails (handle NULL, err set). Returns the number of plugins that
 * loaded. */
typedef void (*lmt_plugin_visit_fn)(void *opaque, const char *path, const lmt_plugin_handle *plugin,
                                    const struct lmt_error *err);
int lmt_plugin_list(lmt_plugin_visit_fn fn, void *opaque);

/* The directories searched, in order, as one ':'-separated string in buf. */
int lmt_plugin_search_path(char *buf, size_t size);

/* The core's own option schema: *count entries (NULL when count is NULL). */
const struct lmt_option_desc *lmt_core_options(uint32_t *count);

/* Turn an option value into its canonical text ("1M", "300ms", "on"):
 * 0, -LMT_EINVAL for a value that does not fit `desc`, or -LMT_EOVERFLOW
 * when it does not fit in `size` (buf then holds it cut short). */
int lmt_option_format(const struct lmt_option_desc *desc, const struct lmt_option_value *value,
                      char *buf, size_t size);

/* The inverse of lmt_option_format, and the parser sessions use for every
 * option: parse `text` as a value of `desc` into *value. BOOL takes on/off,
 * true/false, yes/no or 1/0; INT a signed decimal; SIZE bytes with an
 * optional K, M, G or T (binary: 64K, 1M, 2GiB); DURATION a number with
 * ns, us, ms, s or m (a bare number is ms); ENUM one of desc->enum_values;
 * STRING any text without ','. desc->min..max (unless both are 0) and
 * LMT_OPTF_POW2 are checked. Returns 0, or a negative code with err (may
 * be NULL) naming desc->name and what it expects: "chunk-size: expected a
 * power of two from 4K to 1G, got '3M'"; an LMT_OPTF_SECRET value is never
 * echoed. Nothing is allocated: value->text borrows, for ENUM, the
 * descriptor's own enum_values entry and, for STRING, `text` itself, so
 * the caller keeps those alive as long as it uses value->text (NULL for
 * the other types). Thread-safe. */
int lmt_option_parse(const struct lmt_option_desc *desc, const char *text,
                     struct lmt_option_value *value, struct lmt_error *err);

/* ---- Sessions ---------------------------------------------------------- */

typedef struct lmt_session lmt_session;

/* Called by the source to learn which pages of `block` the guest dirtied
 * since the previous call: set bit p (bitmap[p / 64] >> (p % 64)) for each
 * dirty page p; the core passes a zeroed bitmap of `npages` bits. Called
 * from the thread that calls lmt_save_*. Returns 0 or a negative code,
 * which fails the migration. KVM_GET_DIRTY_LOG fills exactly this layout on
 * 64-bit little-endian hosts. */
typedef int (*lmt_dirty_sync_fn)(void *opaque, uint32_t block, uint64_t *bitmap, uint64_t npages);

/* Create a session for `role` over the plugin `plugin` (name or path),
 * with `options` ("chunk-size=64M,channels=2", may be NULL) applied on top
 * of defaults and LMT_* environment variables. Free with
 * lmt_session_free(), which also cancels and releases whatever the session
 * still holds (NULL: nothing). On failure *out is NULL and err (may be
 * NULL) says why. */
int lmt_session_new(lmt_session **out, enum lmt_role role, const char *plugin, const char *options,
                    struct lmt_error *err);
void lmt_session_free(lmt_session *session);

/* The session's error: code 0 until something goes wrong, then
 * - a failure, what ends the migration (status FAILED or CANCELLED, the
 *   FAILED event): the FIRST failure is kept for good, because what fails
 *   after it is usually its consequence. Only a failure that explains it
 *   takes its place, keeping its text in parentheses ("switchover-timeout
 *   ... (chaos: stalled flush timed out)", the peer's ERROR over a channel
 *   that broke here), and only before the FAILED event carried the code.
 *   After a completion no failure is recorded (a peer that hangs up then
 *   is none).
 * - a refused call: a bad argument or the wrong state, which leaves the
 *   session as it was (a source that cannot connect has failed; a
 *   destination that cannot bind its address has not). Its code and
 *   message stay until the next refused call or failure replaces them,
 *   but never replace a failure.
 * A successful call clears nothing, so read the error when a call returns
 * a negative code; every call on a session that fails leaves a message
 * naming what was wrong. Never NULL: for a NULL session, a static error
 * with -LMT_EINVAL and "no session (...)". Valid as long as the session;
 * thread-safe. */
const struct lmt_error *lmt_session_error(const lmt_session *session);

/* The id that starts the session's log messages ("[s3] ..."): 1, 2, ...
 * in the order sessions are created, unique in the process; 0 for NULL.
 * Thread-safe. */
uint64_t lmt_session_id(const lmt_session *session);

/* Send this session's log messages to `fn` instead of the process-wide
 * handler; `fn` NULL goes back to it. As there, `fn` may be called from
 * any lmt thread, one call at a time, must not call lmt for this session,
 * and the handler replaced is no longer called once this returns. Any time,
 * from any thread. */
int lmt_session_set_log_handler(lmt_session *session, lmt_log_fn fn, void *opaque);

/* Options, RAM blocks and the dirty-sync callback are fixed once the
 * source's migration begins (lmt_save_setup, or lmt_save_start as soon as
 * it returns) or the destination calls lmt_load_listen: setup reads them
 * once, and a source may connect to a listening destination at any moment.
 * From then on the calls that change them answer -LMT_ESTATE, and the
 * session's error says why. One exception: a running source still takes
 * `downtime-limit` and `max-bandwidth` (QEMU's migrate-set-parameters),
 * from any thread; the next lmt_save_iterate call uses them. */

/* Set options: `options` is "key=value,key=value" (empty: nothing); every
 * one is checked before any is applied, so one bad item and none applies. */
int lmt_session_set_options(lmt_session *session, const char *options);
int lmt_session_set_option(lmt_session *session, const char *name, const char *value);
/* Read an option's current value (text lives as long as the session);
 * -LMT_ENOTFOUND for a name no schema declares. Thread-safe. */
int lmt_session_get_option(lmt_session *session, const char *name, struct lmt_option_value *out);

/* Add a RAM block. Both sides must add the same names with the same
 * lengths and page sizes, in the same order. `page_size` is a power of two
 * from 4K; `host` is aligned to it, `length` a non-zero multiple of it,
 * and host + length does not run past the end of the address space. The
 * memory stays the caller's: the source only reads it, the destination's
 * must be zero-filled when lmt_load_run starts (as fresh anonymous or
 * memfd memory is). A block refused gets -LMT_EINVAL and an error naming
 * it and what is wrong ("block 'pc.ram': length is 0"). */
int lmt_session_add_block(lmt_session *session, const char *name, void *host, uint64_t length,
                          uint32_t page_size);

/* Add a RAM block whose memory is mapped MAP_SHARED at `host` from the
 * file `fd` (a memfd or a hugetlbfs file) at byte `offset`. Checked as for
 * lmt_session_add_block, and also: fd is open and a regular file (a memfd
 * is one) of at least offset + length bytes, offset a multiple of
 * page_size, and the memory from host to host + length is that file's,
 * shared, from offset (read from /proc/self/maps). A block refused gets
 * -LMT_EINVAL and an error naming it and what is wrong. lmt keeps its own
 * duplicate of fd (the caller may close its own at once) and closes it at
 * lmt_session_free. Such a block migrates like any other, except over a
 * unix: target where both sides added it with a descriptor: it is then
 * handed over at the switchover (see lmt_save_setup), never copied. */
int lmt_session_add_block_fd(lmt_session *session, const char *name, void *host, uint64_t length,
                             uint32_t page_size, int fd, uint64_t offset);

/* Source: the dirty-page callback (required before lmt_save_setup). */
int lmt_session_set_dirty_sync(lmt_session *session, lmt_dirty_sync_fn fn, void *opaque);

/* Source, with auto-converge=on: lmt asks the VMM to hold the guest's vCPUs
 * for `percent` percent of the time (1-99), and with 0 to let them run
 * freely. Raised from the thread in lmt_save_iterate as passes end; 0 is
 * sent once when the migration ends (completed, failed, cancelled, or the
 * session freed), from the thread that ends it, which is an lmt thread
 * when the peer fails the migration between calls. The callback must not
 * call into the session. Required before lmt_save_setup when
 * auto-converge=on; when throttling begins and how it grows:
 * docs/engine.md, "Auto-converge". */
typedef void (*lmt_throttle_fn)(void *opaque, uint32_t percent);
int lmt_session_set_throttle(lmt_session *session, lmt_throttle_fn fn, void *opaque);

/* Cancel whatever the session is doing, from any thread (also from a
 * signal-free context of another thread). The blocked call returns
 * -LMT_ECANCELED promptly; the peer's session fails with -LMT_EPEER
 * ("the source cancelled the migration: ..."). NULL: nothing. */
void lmt_cancel(lmt_session *session);

/* ---- Source ------------------------------------------------------------ */

/* Connect to the destination at "host:port", handshake, open the channels
 * and register (all blocks with pin-all=on). Call from the migration
 * thread, never with a VMM lock held. Refused, the session unchanged,
 * without a uri, blocks or dirty-sync callback; any later error fails the
 * session.
 *
 * "file:PATH" saves the running guest to a file instead, with no
 * destination: the session's plugin must be a storage plugin ("file"),
 * and it must be given a file: uri (either mismatch is refused with
 * -LMT_EINVAL). Setup creates PATH (mode 0600, replacing a file there)
 * and writes its header; iterate and complete then run as for a
 * migration, every page written in place, and complete writes the device
 * state, the page bitmaps (and digests with verify=on), flushes, and
 * writes the commit record last. A save that fails or is never completed
 * leaves a file that lmt_load_run refuses. `channels` are parallel
 * writers; direct-io=on opens the file with O_DIRECT. The layout is in
 * docs/file-format.md. */
int lmt_save_setup(lmt_session *session, const char *uri);

/* "unix:PATH" connects to a destination on the same host listening there,
 * and migrates as over TCP (the same protocol, auth-key and tls), with
 * one difference: a block added with lmt_session_add_block_fd on both
 * sides is not copied but handed over. lmt_save_complete passes its
 * descriptor to the destination (SCM_RIGHTS) after the device state, with
 * a digest of some of its pages, and the destination maps it in place of
 * its own block: the pause is the device state and a round trip whatever
 * the size of such blocks. The dirty-sync callback is not called for
 * them. Blocks without a descriptor on either side are copied by the
 * session's plugin, live, as usual. Each side checks that the other runs
 * as the same user or as root (SO_PEERCRED). With tls=on, descriptors
 * cannot travel (they would bypass TLS): every block is then copied.
 * After a completed handover the source must not write the guest's
 * memory any more: it is the destination's. docs/embedding.md, "Same-host
 * handover". */

struct lmt_iterate_result {
	uint32_t pass;                 /* 1-based; 1 is the bulk copy */
	uint64_t remaining_bytes;      /* dirty plus in flight */
	uint64_t bandwidth_bps;        /* measured, bytes per second */
	uint64_t expected_downtime_ns; /* what the pause would take: see below */
	int ready;                     /* expected downtime <= downtime-limit */
	/* 0 while the expected downtime cannot be estimated yet (RAM left to
	 * send and no bandwidth measured): expected_downtime_ns is then 0. */
	int expected_downtime_known;
	/* With postcopy=on, once postcopy-after passes ended without the
	 * migration becoming ready: 1, with ready set too. The VMM pauses the
	 * guest and calls lmt_save_complete, which then switches to postcopy
	 * (see lmt_save_postcopy) instead of copying the rest in the pause. */
	int postcopy;
};

/* Send what is dirty for at most max-iterate-ms (the guest runs). Returns 0
 * with *result filled; call again until result->ready, then pause the
 * guest and call lmt_save_complete. The expected downtime is what the
 * pause would take now: the RAM left and the device state (as announced
 * with lmt_save_set_device_state_size) at the measured bandwidth, plus,
 * with verify=on, hashing what changed since it was last hashed. */
int lmt_save_iterate(lmt_session *session, struct lmt_iterate_result *result);

/* The size the VMM expects its device state to have at lmt_save_complete,
 * counted in the expected downtime at the measured bandwidth. May be
 * called at any time, from any thread, as often as the estimate changes;
 * 0 (the default) counts none. At most 1 GiB, as the state itself. */
int lmt_save_set_device_state_size(lmt_session *session, uint64_t bytes);

/* The guest is paused: send the rest, then `device_state` (opaque to lmt,
 * may be NULL/0), and wait for the destination's acknowledgement. On
 * success the destination owns the guest. On failure the source guest may
 * resume: its memory was never written. */
int lmt_save_complete(lmt_session *session, const void *device_state, size_t length);

/* Postcopy (postcopy=on on both sides; docs/embedding.md, "Postcopy").
 * The guest is paused: send which pages the destination does not hold
 * yet, then `device_state`, and switch. Returns 0 once the destination
 * has taken the guest over: its lmt_load_run returned 0 and it may run
 * the guest at once, its faults on pages not there yet served by lmt.
 * From then on the source guest must never run again, but its memory
 * must stay mapped and unchanged until lmt_save_finish returns: lmt
 * sends the rest from it. On failure before the switch (the status is
 * still active), the source guest may resume as after a failed
 * lmt_save_complete. lmt_save_complete does the same when an iterate
 * call said so (result->postcopy). */
int lmt_save_postcopy(lmt_session *session, const void *device_state, size_t length);

/* Source: the second half of a switch to postcopy. lmt's thread serves
 * the destination's page faults first, on a channel of their own, and
 * pushes every other page behind them from the moment of the switch;
 * this call waits until every page has arrived and the destination
 * acknowledged, then releases the transport and ends the migration
 * (COMPLETED). Returns 0 at once after a migration that completed in
 * lmt_save_complete. A failure in postcopy (a dead destination, a broken
 * channel, lmt_cancel on either side) ends with status postcopy-failed
 * on both sides and its code here: the guest is lost, since neither side
 * holds all of it; docs/embedding.md says what the VMM does. Blocks;
 * cancel from another thread; lmt_session_free cancels and waits too. */
int lmt_save_finish(lmt_session *session);

/* ---- Destination ------------------------------------------------------- */

/* Bind the control listener to "host:port" (port 0 picks one); the bound
 * port is stored in *port when `port` is not NULL. Add the blocks first.
 * An address that does not parse or bind is refused and the session stays
 * as it was, so listening again elsewhere is fine.
 *
 * "file:PATH", with a storage plugin ("file"), restores from a file
 * lmt_save_setup wrote: nothing is bound (*port is 0), the file is only
 * named; lmt_load_run reads it.
 *
 * "unix:PATH" binds a unix stream socket at PATH (mode 0600; *port is 0)
 * for a source on the same host (see lmt_save_setup): a stale socket of
 * this user's left there is replaced, anything else at PATH is refused,
 * and the socket file is removed once the source is accepted or the
 * session freed. */
int lmt_load_listen(lmt_session *session, const char *uri, uint16_t *port);

/* Accept the source, take the migration in until it completes or fails.
 * Blocks; cancel from another thread. On success the RAM blocks hold the
 * guest and lmt_load_device_state() gives the device state.
 *
 * After lmt_load_listen(session, "file:PATH", ...): read the file into the
 * blocks, eagerly, over `channels` readers. The blocks must be the file's
 * (names, lengths, page sizes, in order: -LMT_EMISMATCH otherwise) and
 * zero-filled, since pages the file holds as holes are not read. A file
 * that is truncated, damaged, foreign, of another format version or from
 * a save that did not complete is refused (-LMT_EPROTO, or -LMT_ENOTFOUND
 * for a missing file) with the reason in the session's error; with
 * verify=on every stripe is checked against the digests saved with it
 * (-LMT_EVERIFY, naming the block and bytes). A restore reads nothing
 * outside the file and writes nothing outside the blocks.
 *
 * With restore=lazy the file is checked the same way, then lmt_load_run
 * returns 0 as soon as the guest may run and the pages are loaded behind
 * it (userfaultfd; the blocks must be private anonymous memory):
 * lmt_load_finish below waits for the last one. -LMT_ENOTSUP where
 * userfaultfd cannot be opened, before any block is touched. */
int lmt_load_run(lmt_session *session);

/* The device state received (*data, *length); valid until
 * lmt_session_free. Available once lmt_load_run returned 0. */
int lmt_load_device_state(lmt_session *session, const void **data, size_t *length);

/* After a completed load over unix: that handed block `block` (its index
 * in the order added) over: *fd is a new descriptor (close-on-exec) of
 * the source's file, which is now mapped at the block's host address; its
 * block starts at *offset in it (offset may be NULL). The caller owns *fd,
 * to hand on at the next upgrade. -LMT_ENOTFOUND for a block that was
 * copied, -LMT_ESTATE before the load completed. */
int lmt_load_block_fd(lmt_session *session, uint32_t block, int *fd, uint64_t *offset);

/* The second half of a load that returns when the guest may run:
 * restore=lazy now, postcopy later. lmt_load_run returns 0 as soon as the
 * VMM may resume the guest (device state available, every page reachable:
 * a vCPU touching a page not there yet waits in the kernel until lmt
 * places it); the pages go on arriving behind the running guest, and
 * lmt_load_finish waits until every one is in place, then releases what
 * the load held (threads, userfaultfd, the file) and ends it: the
 * COMPLETED event, status completed. Returns 0 at once after a load
 * that was complete when lmt_load_run returned (an eager restore, a
 * normal migration). After a switch to postcopy (lmt_save_postcopy on the
 * source) the same holds, the pages coming from the source: a fault is
 * asked of it at once and jumps the queue. -LMT_ESTATE before
 * lmt_load_run returned 0, after
 * a failed load, on a source, or while another lmt_load_finish waits.
 * A postcopy that fails ends with status postcopy-failed.
 *
 * A failure after lmt_load_run (a read error, a file cut short, a
 * digest that does not match with verify=on, lmt_cancel) fails the load:
 * lmt_load_finish returns its code (-LMT_ECANCELED after a cancel), the
 * FAILED event is posted as soon as it happens, and every page that had
 * not arrived is made inaccessible: a thread that touches one, or was
 * waiting on one, gets SIGSEGV, and KVM_RUN fails with EFAULT. No page is
 * ever given wrong data. The guest cannot continue; docs/embedding.md
 * says what the VMM does. Blocks; cancel from another thread;
 * lmt_session_free cancels and waits for it too. */
int lmt_load_finish(lmt_session *session);

/* ---- Statistics -------------------------------------------------------- */

enum lmt_status {
	LMT_STATUS_NEW = 0,
	LMT_STATUS_SETUP,
	LMT_STATUS_ACTIVE,
	LMT_STATUS_COMPLETING,
	LMT_STATUS_COMPLETED,
	LMT_STATUS_FAILED,
	LMT_STATUS_CANCELLED,
	/* after the switch to postcopy: the destination runs the guest and
	 * the pages it lacks are still coming */
	LMT_STATUS_POSTCOPY,
	/* postcopy failed: neither side holds the whole guest */
	LMT_STATUS_POSTCOPY_FAILED,
};

/* Every snapshot holds together, whenever and wherever it is taken: the
 * figures that belong together change together under one lock (the
 * per-channel bytes add up to bytes_sent on a source, to bytes_received on
 * a destination; see "Statistics" in docs/engine.md). */
struct lmt_stats {
	enum lmt_status status;
	uint64_t setup_ns;    /* setup/listen-accept to channels ready */
	uint64_t total_ns;    /* setup start to now, or to the end once over */
	uint64_t downtime_ns; /* complete start to acknowledgement */
	uint64_t expected_downtime_ns;
	uint64_t ram_bytes;  /* sum of block lengths */
	uint64_t bytes_sent; /* payload bytes written over channels (zero runs not counted) */
	uint64_t remaining_bytes;
	/* Source: pages that were all zero when the walk reached them and
	 * went as no data: skipped (the bulk pass), sent as zero runs (later
	 * passes), or postcopy's zero entries. Destination: pages zero runs
	 * made zero. */
	uint64_t zero_pages;
	uint64_t normal_pages; /* pages written */
	uint64_t writes;       /* writes posted */
	uint64_t passes;
	uint64_t dirty_rate_bps; /* bytes dirtied per second, last pass */
	uint64_t throughput_bps; /* bytes sent or received / total_ns */
	uint64_t bandwidth_bps;  /* measured over the last pass */
	uint32_t channels;
	uint64_t channel_bytes[LMT_MAX_CHANNELS];
	/* Destination: payload bytes landed in its RAM. Writes are one-sided,
	 * so the count is the source's, sent on the control connection at the
	 * end of each lmt_save_iterate call and before completing: it trails
	 * by at most one call and equals the source's bytes_sent once
	 * completed. 0 on a source. */
	uint64_t bytes_received;
	/* 0 while the source cannot estimate its downtime (RAM left and no
	 * bandwidth measured yet), and on a destination: expected_downtime_ns
	 * is then 0, and null in JSON. */
	int expected_downtime_known;
	/* auto-converge: the share of the time the VMM is asked to hold the
	 * vCPUs now, in percent; 0 when not throttling. */
	uint32_t throttle_percent;
	/* Destination: from the start of the load (lmt_load_run on a file,
	 * the source's connection otherwise) to when the guest may run, that
	 * is when lmt_load_run returned 0; 0 until then. */
	uint64_t resume_ns;
	/* Destination, pages that arrive after the guest runs (restore=lazy):
	 * the guest's faults on pages not there yet, the time from such a
	 * fault to its page placed (median, 99th percentile and maximum, over
	 * a sample of up to 4096 faults), and the pages loaded ahead of any
	 * fault. All 0 otherwise. */
	uint64_t faults;
	uint64_t fault_p50_ns;
	uint64_t fault_p99_ns;
	uint64_t fault_max_ns;
	uint64_t background_pages;
	/* Postcopy: pages sent (source) or placed (destination) after the
	 * switch, all-zero ones included, and of them those a fault asked
	 * for; 0 without postcopy. On the destination faults and the fault
	 * latencies above count the guest's faults after the switch. */
	uint64_t postcopy_pages;
	uint64_t postcopy_requested;
	/* Bytes of the zero runs' messages on the control connection (ZERO),
	 * sent (source) or received (destination); not in bytes_sent. */
	uint64_t zero_run_bytes;
};

/* A snapshot; callable from any thread, while running and after. */
int lmt_session_stats(lmt_session *session, struct lmt_stats *out);

/* One pass over the dirty pages, as recorded when it ended. */
struct lmt_pass_stats {
	uint32_t pass;     /* 1-based */
	int final;         /* the stop-and-copy pass */
	uint64_t start_ns; /* since setup began */
	uint64_t duration_ns;
	uint64_t bytes;         /* written during the pass */
	uint64_t dirtied_bytes; /* newly dirty when it ended */
	uint64_t dirty_rate_bps;
	uint64_t bandwidth_bps;
	uint64_t expected_downtime_ns; /* after the sync that ended it */
	/* lmt_save_complete began before the pass had ended: it is recorded
	 * as it stood, and the final pass follows. */
	int interrupted;
	int expected_downtime_known; /* as in struct lmt_stats */
	uint32_t throttle_percent;   /* auto-converge's throttle during the pass */
	/* Pages all zero when the walk reached them: skipped or sent as zero
	 * runs, not as data (struct lmt_stats's zero_pages). */
	uint64_t zero_pages;
};

/* The passes so far: copies up to `max` into `out` (may be NULL with max
 * 0) and returns how many there are. Callable from any thread. */
int lmt_session_passes(lmt_session *session, struct lmt_pass_stats *out, uint32_t max);
const char *lmt_status_name(enum lmt_status status);

/* Stats as one JSON object in buf; returns the length it needs (like
 * snprintf: buf may be NULL when size is 0), or a negative code. An
 * unknown expected downtime is null. */
int lmt_stats_json(const struct lmt_stats *stats, char *buf, size_t size);

/* ---- Events ------------------------------------------------------------ */

/* What a session reports as it goes, for a VMM's event loop. */
enum lmt_event_type {
	LMT_EVENT_SETUP_DONE = 1, /* channels connected; the source may iterate */
	LMT_EVENT_PASS_END = 2,   /* a pass ended: `pass` */
	LMT_EVENT_READY = 3,      /* source: the rest fits in downtime-limit */
	LMT_EVENT_COMPLETED = 4,  /* the destination owns the guest */
	LMT_EVENT_FAILED = 5,     /* `code`; lmt_session_error() says why; once */
	LMT_EVENT_POSTCOPY = 6,   /* switched to postcopy: the destination runs */
};

struct lmt_event {
	enum lmt_event_type type;
	/* FAILED: the failure's negative LMT_E* code, the one the failing
	 * call returns and lmt_session_error() keeps (LMT_ECANCELED after
	 * this side's lmt_cancel, LMT_EPEER when the peer ended it) */
	int code;
	uint64_t time_ns;           /* since the session's setup began */
	struct lmt_pass_stats pass; /* PASS_END */
};

/* A descriptor that is readable while events are queued, for poll/epoll.
 * Owned by the session (closed by lmt_session_free); never read it
 * yourself: take the events with lmt_session_next_event(). Thread-safe. */
int lmt_session_event_fd(lmt_session *session);

/* Take the oldest queued event: 1 with *event filled, 0 when none is
 * queued (-LMT_EINVAL, said in the session's error, for a NULL event).
 * The queue keeps the last 256 events; older pass ends are dropped first.
 * Thread-safe. */
int lmt_session_next_event(lmt_session *session, struct lmt_event *event);

/* Or be called for each event as it happens, from whichever lmt thread
 * posts it (the caller's, or one of lmt's own), one event at a time. The
 * callback must return promptly and must not free the session; it may
 * call lmt_cancel, lmt_session_stats, lmt_session_passes,
 * lmt_session_error, lmt_session_next_event and this function. Events
 * still go to the queue as well. It may be set, replaced or removed
 * (NULL) at any time from any thread, also while a job runs: once this
 * returns, the callback replaced is neither running nor called again
 * (called from inside the callback, the change applies from the next
 * event). */
typedef void (*lmt_event_fn)(void *opaque, const struct lmt_event *event);
int lmt_session_set_event_callback(lmt_session *session, lmt_event_fn fn, void *opaque);

/* ---- Migrations that run on lmt's own thread --------------------------- */

/* For a VMM whose main loop must never block in lmt: each call starts the
 * work on a thread of the session's and returns at once; progress and the
 * end come as events (lmt_session_event_fd). While such a job runs, the
 * blocking lmt_save_* and lmt_load_* calls answer -LMT_ESTATE; stats,
 * events, cancel and runtime options remain available. The dirty-sync
 * callback is then called from lmt's thread. */

/* Destination: lmt_load_run on lmt's thread (after lmt_load_listen).
 * Ends with COMPLETED or FAILED. */
int lmt_load_start(lmt_session *session);

/* Source: lmt_save_setup, then lmt_save_iterate for as long as it takes,
 * on lmt's thread. READY is posted each time the migration becomes ready;
 * passes go on (the guest still runs) until lmt_save_switchover. */
int lmt_save_start(lmt_session *session, const char *uri);

/* Source, the guest paused: the job finishes the migration with this
 * device state (copied; the caller may free it at once). Ends with
 * COMPLETED, or FAILED after which the source guest may resume. Usually
 * called on READY; called before it (even before SETUP_DONE) the job
 * stops its passes at once and completes with whatever is left, a pause
 * longer than downtime-limit. -LMT_ESTATE without a job, a second time,
 * or once the job has ended. */
int lmt_save_switchover(lmt_session *session, const void *device_state, size_t length);

/* Wait up to timeout_ms (-1: for good) for the job to end: 0 when it
 * completed, its negative LMT_E* when it failed (the FAILED event's
 * code), -LMT_EAGAIN while it still runs, -LMT_ESTATE without a job
 * (said in the session's error). Once COMPLETED or FAILED was
 * posted it returns the job's result whatever timeout_ms, after waiting
 * for the job's thread to return (no longer than the teardown). */
int lmt_session_wait(lmt_session *session, int timeout_ms);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif

#endif /* LMT_LMT_H */
