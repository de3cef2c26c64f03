/* The plugin test harness (prefix ph_): drives a transport plugin through the
 * plugin ABI alone, with no session in between. It lends the plugin a host
 * (struct lmt_host) that hands out option values and records what the
 * plugin logs and the errors it reports; opens a source and a destination
 * instance in this process and connects them in the core's order; registers
 * regions between guard pages; posts writes and accounts for every
 * completion by cookie; and counts the process's descriptors and threads.
 * lmt-plugin-check's checks are built on it, and so is every plugin's unit
 * test. Test support: built even with -Dtests=disabled, never installed.
 *
 * Failures: a call that can fail takes a struct ph_run, records the first
 * failure there and returns false (or -1); nothing aborts or exits. A cmocka
 * test turns that into a failed test with PH_REQUIRE (plugin_test.h).
 *
 * Ownership: every ph_*_open or _init has a _close or _fini that releases
 * what it made and accepts what a failed open left half done. Memory the
 * harness maps (regions, source buffers) is its own; plugin objects (mr,
 * rkey, endpoints) are released through the plugin, or left to
 * instance_close where the caller says so.
 *
 * Threading: a pair is driven from one thread, as the core drives a session.
 * The harness runs two threads of its own: the destination's blocking
 * ep_connect during ph_pair_connect, and the destination's progress between
 * ph_pair_start_progress and ph_pair_stop_progress. The host services (and
 * the ph_host_* readers) are safe from any thread. */
#ifndef LMT_PLUGIN_HARNESS_H
#define LMT_PLUGIN_HARNESS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <lmt/lmt.h>

#define PH_SECOND 1000000000ull
#define PH_PAGE 4096u
#define PH_MAX_CHANNELS 16u

struct ph_options;

/* What is under test and how to drive it. Owns `options` and the plugin
 * handles; release with ph_unload. */
struct ph_config {
	const char *target;              /* NAME, PATH or DECORATOR:PLUGIN as given */
	const char *path;                /* the file under test, or NULL */
	const struct lmt_plugin *plugin; /* its descriptor */
	const struct lmt_plugin *inner;  /* the plugin a decorator wraps, or NULL */
	const char *spec;                /* what a session would load: path, or the target */
	uint64_t caps;                   /* how to drive it: a decorator, as its inner */
	lmt_plugin_handle *handle;       /* from ph_load, closed by ph_unload */
	lmt_plugin_handle *inner_handle;
	struct ph_options *options; /* the values every host hands out by default */
	const char *option_text;    /* the options given to lmt-plugin-check, or NULL */
	uint32_t channels;          /* per pair; 2 with LMT_CAP_MULTI_CHANNEL, else 1 */
	unsigned cycles;            /* open/close cycles of lmt-plugin-check's leak checks */
	uint64_t cycle_budget_ns;   /* time after which those may stop */
	uint64_t op_timeout_ns;     /* instance timeout: any single blocking call */
	uint64_t chunk_size;        /* the largest write */
	bool verbose;               /* print what plugins log and record to stderr */
};

/* Load `target` ("tcp", a path, or "chaos:tcp") as lmt loads plugins, and the
 * option values (defaults, LMT_* variables, then `options`), with defaults
 * for the rest: 10 s timeout, 8 MiB chunks. 0, or an error with err filled;
 * release with ph_unload either way. */
int ph_load(struct ph_config *cfg, const char *target, const char *options, struct lmt_error *err);
/* The same for a descriptor linked into the caller, with no file. */
int ph_config_init(struct ph_config *cfg, const struct lmt_plugin *plugin, const char *options,
                   struct lmt_error *err);
void ph_unload(struct ph_config *cfg);

/* One run of harness calls: the first failure wins, a note may follow a
 * pass. `cfg` is what the calls drive. */
struct ph_run {
	const struct ph_config *cfg;
	bool failed;
	char why[1024];
	char note[256];
};

bool ph_fail(struct ph_run *run, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void ph_note(struct ph_run *run, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
uint64_t ph_now(void);

/* ---- Option values (plugin_options.c) ------------------------------------- */

/* Every option of the core and of cfg's plugins, from its default, its LMT_*
 * variable, then `list` ("key=value,..."), each parsed by lmt_option_parse.
 * 0, or an error with err filled. Free with ph_options_free (NULL is fine). */
int ph_options_load(struct ph_options **out, const struct ph_config *cfg, const char *list,
                    struct lmt_error *err);
/* A copy that can then be set apart from the original. NULL when out of
 * memory. */
struct ph_options *ph_options_copy(const struct ph_options *options);
/* Set more from "key=value,...": 0, or an error with err filled. */
int ph_options_set(struct ph_options *options, const char *list, struct lmt_error *err);
/* The value of a qualified name ("tcp.nodelay"): 0 or -LMT_ENOTFOUND. Its
 * text lives as long as the options. Read-only, so any thread may call it. */
int ph_option_get(const struct ph_options *options, const char *name, struct lmt_option_value *out);
void ph_options_free(struct ph_options *options);

/* ---- The host lent to an instance ----------------------------------------- */

/* One per instance. The plugin calls it from any thread; the fields are
 * read through the ph_host_* functions, except `cancelled`, which the
 * test sets. */
struct ph_host {
	const struct ph_config *cfg;
	const char *role;           /* "source" or "destination", for messages */
	struct ph_options *options; /* this host's own values, or NULL for cfg's */
	pthread_mutex_t lock;
	int errors;      /* host->error calls */
	int first_code;  /* the code of the first one */
	int last_code;   /* and of the last */
	char first[512]; /* their messages */
	char last[512];
	bool misused; /* given a code outside 1 .. LMT_ERRC_COUNT-1 ... */
	int bad_code; /* ... this one, the first time */
	char *log;    /* what the plugin logged, one line each, newest kept */
	size_t log_len;
	atomic_int cancelled; /* what host->cancelled answers */
	atomic_int injected;  /* host->inject calls */
};

extern const struct lmt_host ph_host_services;
void ph_host_init(struct ph_host *host, const struct ph_config *cfg, const char *role);
void ph_host_fini(struct ph_host *host);
/* Give this host option values of its own: cfg's, then `list` over them.
 * Call before the instance opens. 0, or an error with err filled. */
int ph_host_set_options(struct ph_host *host, const char *list, struct lmt_error *err);
int ph_host_errors(struct ph_host *host);
/* The code of the first (or last) error recorded, 0 for none, with its
 * message copied to buf. */
int ph_host_first_error(struct ph_host *host, char *buf, size_t size);
int ph_host_last_error(struct ph_host *host, char *buf, size_t size);
/* Whether the plugin logged a line containing `text`. */
bool ph_host_logged(struct ph_host *host, const char *text);
/* What the plugin logged (the newest part that fits), for parsing. */
size_t ph_host_log(struct ph_host *host, char *buf, size_t size);
/* Forget the errors and the log recorded so far. */
void ph_host_forget(struct ph_host *host);
/* "LMT_EPROTO (the message the plugin recorded)" for a call that returned rc. */
const char *ph_describe(struct ph_host *host, int rc, char *buf, size_t size);
/* Whether a call that returned rc recorded that error (host->errors was
 * `before` when it started); fails the run if not. */
bool ph_error_recorded(struct ph_run *run, struct ph_host *host, int before, int rc,
                       const char *what);

/* ---- A source and a destination instance in this process ---------------- */

struct ph_side {
	struct ph_host host;
	/* Given to instance_open as the session's channel secret (tls=on),
	 * 32 bytes, when set before it. */
	const uint8_t *channel_secret;
	lmt_instance *inst;
	lmt_endpoint *ep[PH_MAX_CHANNELS];
	struct lmt_blob addr[PH_MAX_CHANNELS];
};

struct ph_pair {
	const struct ph_config *cfg;
	const struct lmt_plugin *plugin;
	uint32_t channels;
	struct ph_side src, dst;
	/* The destination's progress, run as the core runs it. */
	pthread_t progress;
	bool progressing;
	atomic_bool stop;
	int progress_rc;
	uint64_t progress_bogus; /* completions the destination reported */
};

/* Open one side's instance with `channels` channels, both ends 127.0.0.1. */
bool ph_instance_open(struct ph_run *run, struct ph_side *side, enum lmt_role role,
                      uint32_t channels, uint64_t timeout_ns);
/* The same with the addresses of both ends of the control connection. */
bool ph_instance_open_at(struct ph_run *run, struct ph_side *side, enum lmt_role role,
                         uint32_t channels, uint64_t timeout_ns, const char *host);
/* Both hosts ready, cfg->channels channels, nothing open: set options per
 * side or fewer channels now, then open. */
void ph_pair_init(struct ph_pair *pair, const struct ph_config *cfg);
/* Open both instances (source first); no endpoints yet. */
bool ph_pair_open_instances(struct ph_run *run, struct ph_pair *pair, uint64_t timeout_ns);
/* ph_pair_init, then ph_pair_open_instances. */
bool ph_pair_open(struct ph_run *run, struct ph_pair *pair, uint64_t timeout_ns);
/* Open every channel on both sides, as the core orders it. */
bool ph_pair_open_endpoints(struct ph_run *run, struct ph_pair *pair);
/* Connect them: the destination's blocking ep_connect on a second thread. */
bool ph_pair_connect(struct ph_run *run, struct ph_pair *pair);
/* After ph_pair_init: instances (cfg's timeout), endpoints, connect, and the
 * destination's progress thread. */
bool ph_pair_bring_up(struct ph_run *run, struct ph_pair *pair);
/* ph_pair_init, then ph_pair_bring_up. */
bool ph_pair_ready(struct ph_run *run, struct ph_pair *pair);
void ph_pair_start_progress(struct ph_pair *pair);
/* Stop the destination's progress; fails the run if it went wrong. */
bool ph_pair_stop_progress(struct ph_run *run, struct ph_pair *pair);
/* Close both instances (source first) and release the hosts. */
void ph_pair_close(struct ph_pair *pair);
/* Fail the run when either side recorded an error on a path that succeeded. */
bool ph_pair_quiet(struct ph_run *run, struct ph_pair *pair);

/* ---- Memory ------------------------------------------------------------- */

/* A destination region between guard pages of a known pattern, registered
 * for remote write, with its key imported on the source when the source
 * is open. */
struct ph_region {
	uint8_t *map;
	uint8_t *mem;
	size_t len;
	lmt_mr *mr;
	struct lmt_blob key;
	lmt_rkey *rkey;
};

bool ph_region_open(struct ph_run *run, struct ph_pair *pair, struct ph_region *region, size_t len);
/* Release the key and the registration through the plugin, where the side
 * is still open, and unmap. */
void ph_region_close(struct ph_pair *pair, struct ph_region *region);
bool ph_region_guards_intact(struct ph_run *run, const struct ph_region *region);

/* Source memory filled with a pattern, registered when the plugin needs it. */
struct ph_source {
	uint8_t *mem;
	size_t len;
	lmt_mr *mr;
};

bool ph_source_open(struct ph_run *run, struct ph_pair *pair, struct ph_source *source, size_t len,
                    uint64_t seed);
void ph_source_close(struct ph_pair *pair, struct ph_source *source);
/* Refill with another pattern (the memory stays registered). */
void ph_fill(uint8_t *mem, size_t len, uint64_t seed);
/* Fail with "N bytes differ at offset X" unless equal. */
bool ph_same(struct ph_run *run, const char *what, const uint8_t *got, const uint8_t *want,
             size_t len, uint64_t base);
/* Fail with the first byte that is not zero. */
bool ph_all_zero(struct ph_run *run, const char *what, const uint8_t *mem, size_t len,
                 uint64_t base);

/* ---- Writes and completions --------------------------------------------- */

struct ph_write {
	const uint8_t *local;
	struct ph_region *region;
	uint64_t offset;
	size_t len;
	uint8_t seen;
};

/* Every posted write by cookie; each must complete exactly once, status 0
 * (unless failures are allowed), with its bytes visible in the region when
 * the completion is reported. */
struct ph_tally {
	struct ph_write *writes;
	uint64_t cap;
	uint64_t posted;
	uint64_t done;
	uint64_t failed; /* completions with an error status, when allowed */
	uint64_t eagain; /* how often write answered EAGAIN */
	bool check_visible;
	bool allow_failures; /* count error statuses in `failed` instead of failing */
};

bool ph_tally_init(struct ph_run *run, struct ph_tally *tally, uint64_t cap);
void ph_tally_fini(struct ph_tally *tally);
/* Post one write, harvesting while the plugin answers EAGAIN. */
bool ph_post(struct ph_run *run, struct ph_pair *pair, struct ph_tally *tally, uint32_t channel,
             struct ph_source *source, const uint8_t *local, struct ph_region *region,
             uint64_t offset, size_t len);
/* Post one write once: 0, -LMT_EAGAIN, or fails the run (returns -1; with
 * failures allowed, the write's error code instead, the run untouched). */
int ph_post_once(struct ph_run *run, struct ph_pair *pair, struct ph_tally *tally, uint32_t channel,
                 struct ph_source *source, const uint8_t *local, struct ph_region *region,
                 uint64_t offset, size_t len);
/* One progress call; the number harvested, or -1 after failing the run. */
int ph_harvest(struct ph_run *run, struct ph_pair *pair, struct ph_tally *tally, uint32_t max,
               uint64_t timeout_ns);
/* One progress call, as ph_harvest, except that a progress error goes to
 * *error (and 0 is returned) instead of failing the run. */
int ph_harvest_or_error(struct ph_run *run, struct ph_pair *pair, struct ph_tally *tally,
                        uint64_t timeout_ns, int *error);
/* Harvest until every posted write has completed. */
bool ph_harvest_all(struct ph_run *run, struct ph_pair *pair, struct ph_tally *tally);
/* Harvest (failures allowed) until progress returns an error, within
 * `limit_ns`: that error, or 0 after failing the run. */
int ph_harvest_until_error(struct ph_run *run, struct ph_pair *pair, struct ph_tally *tally,
                           uint64_t limit_ns);

/* ---- Scenarios that more than one plugin's tests share -------------------- */

/* How the source took losing its destination mid-stream. */
struct ph_loss {
	int write_rc;    /* the first write error other than EAGAIN, or 0 */
	int progress_rc; /* the error progress ended with */
	uint64_t posted; /* writes posted, each accounted for exactly once */
	uint64_t failed; /* of which completed with an error status */
	int first_code;  /* the first error the source recorded, and why */
	char first_error[512];
};

/* Connect a pair, keep 64 MiB of writes in flight, close the destination's
 * instance, and keep writing until progress fails. Fails the run unless
 * every posted write completes exactly once before progress returns its
 * error, and the next progress returns it again. Closes the pair. */
bool ph_lose_destination_mid_stream(struct ph_run *run, struct ph_pair *pair, struct ph_loss *loss);

/* Connect a 2-channel pair, write, flush and harvest, then close the
 * endpoints of the side in `closing` as an orderly teardown does: after a
 * moment the other side's progress must report nothing, and neither side
 * may have recorded an error. Closes the pair. */
bool ph_orderly_close(struct ph_run *run, struct ph_pair *pair, enum lmt_role closing);

/* ---- Descriptors and threads of this process ---------------------------- */

struct ph_census {
	int fds;
	int threads;
};

struct ph_census ph_census_take(void);
/* Whether the process is back to `before` (threads already exiting are not
 * counted: see threads_live.h). Fills `after`. */
bool ph_census_same(struct ph_census before, struct ph_census *after);

#endif
