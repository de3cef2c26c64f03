/* lmt-plugin-check internals: the configuration, the host services lent to the
 * plugin under test, and helpers that drive a source and a destination. */
#ifndef LMT_PLUGIN_CHECK_H
#define LMT_PLUGIN_CHECK_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <lmt/lmt.h>

#define PC_SECOND 1000000000ull
#define PC_PAGE 4096u
#define PC_MAX_CHANNELS 16u

struct pc_options;

struct pc_config {
	const char *target;              /* NAME, PATH or DECORATOR:PLUGIN as given */
	const char *path;                /* the file under test */
	const struct lmt_plugin *plugin; /* its descriptor */
	const struct lmt_plugin *inner;  /* the plugin a decorator wraps, or NULL */
	const char *spec;                /* what sessions load: path, or the target */
	uint64_t caps;                   /* how to drive it: a decorator, as its inner */
	struct pc_options *options;      /* option values the host service hands out */
	const char *option_text;         /* what -o gave, or NULL */
	uint32_t channels;
	unsigned cycles;
	uint64_t cycle_budget_ns; /* time after which the cycle checks may stop */
	uint64_t op_timeout_ns;   /* instance timeout: any single blocking call */
	uint64_t chunk_size;      /* largest write */
	bool verbose;
};

/* One check being run: the first failure wins, a note may follow a pass. */
struct pc_run {
	const struct pc_config *cfg;
	bool failed;
	char why[1024];
	char note[256];
};

bool pc_fail(struct pc_run *run, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void pc_note(struct pc_run *run, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
uint64_t pc_now(void);

/* ---- Loading -------------------------------------------------------------- */

/* Load `target` ("tcp", a path, or "chaos:tcp") into cfg's plugin, inner,
 * path, spec and caps, keeping the handles in *outer and *inner; then the
 * option values (`options` over the defaults and LMT_* variables) into
 * cfg->options. 0, or an error with err filled. */
int pc_load(struct pc_config *cfg, const char *target, const char *options,
            lmt_plugin_handle **outer, lmt_plugin_handle **inner, struct lmt_error *err);

/* ---- Option values (options.c) -------------------------------------------- */

/* Every option of the core and of cfg's plugins, from its default, its LMT_*
 * variable, then `list` ("key=value,..."), each parsed by lmt_option_parse.
 * 0, or an error with err filled. Free with pc_options_free (NULL is fine). */
int pc_options_load(struct pc_options **out, const struct pc_config *cfg, const char *list,
                    struct lmt_error *err);
/* Set more from "key=value,...": 0, or an error with err filled. */
int pc_options_set(struct pc_options *options, const char *list, struct lmt_error *err);
/* The value of a qualified name ("tcp.nodelay"): 0 or -LMT_ENOTFOUND. Its
 * text lives as long as the options. Read-only, so any thread may call it. */
int pc_option_get(const struct pc_options *options, const char *name, struct lmt_option_value *out);
void pc_options_free(struct pc_options *options);

/* ---- Host services ------------------------------------------------------ */

struct pc_host {
	const struct pc_config *cfg;
	const char *role; /* "source" or "destination", for messages */
	pthread_mutex_t lock;
	int errors;     /* host->error calls */
	int last_code;  /* the code given to the last one */
	bool misused;   /* given a code outside 1 .. LMT_ERRC_COUNT-1 ... */
	int bad_code;   /* ... this one, the first time */
	char last[512]; /* its message */
	atomic_int cancelled;
	atomic_int injected; /* host->inject calls */
};

extern const struct lmt_host pc_host_services;
void pc_host_init(struct pc_host *host, const struct pc_config *cfg, const char *role);
void pc_host_fini(struct pc_host *host);
int pc_host_errors(struct pc_host *host);
/* "LMT_EPROTO (the message the plugin recorded)" for a call that returned rc. */
const char *pc_describe(struct pc_host *host, int rc, char *buf, size_t size);
/* Whether a call that returned rc recorded that error (host->errors was
 * `before` when it started); fails the run if not. */
bool pc_error_recorded(struct pc_run *run, struct pc_host *host, int before, int rc,
                       const char *what);

/* ---- A source and a destination instance in this process ---------------- */

struct pc_side {
	struct pc_host host;
	lmt_instance *inst;
	lmt_endpoint *ep[PC_MAX_CHANNELS];
	struct lmt_blob addr[PC_MAX_CHANNELS];
};

struct pc_pair {
	const struct pc_config *cfg;
	const struct lmt_plugin *plugin;
	uint32_t channels;
	struct pc_side src, dst;
	/* The destination's progress, run as the core runs it. */
	pthread_t progress;
	bool progressing;
	atomic_bool stop;
	int progress_rc;
	uint64_t progress_bogus; /* completions the destination reported */
};

bool pc_instance_open(struct pc_run *run, struct pc_side *side, enum lmt_role role,
                      uint32_t channels, uint64_t timeout_ns);
/* Open both instances; no endpoints yet. */
bool pc_pair_open(struct pc_run *run, struct pc_pair *pair, uint64_t timeout_ns);
/* Open every channel on both sides, as the core orders it. */
bool pc_pair_open_endpoints(struct pc_run *run, struct pc_pair *pair);
/* Connect them: the destination's blocking ep_connect on a second thread. */
bool pc_pair_connect(struct pc_run *run, struct pc_pair *pair);
/* pc_pair_open, endpoints, connect, and the destination's progress thread. */
bool pc_pair_ready(struct pc_run *run, struct pc_pair *pair);
void pc_pair_start_progress(struct pc_pair *pair);
/* Stop the destination's progress; fails the run if it went wrong. */
bool pc_pair_stop_progress(struct pc_run *run, struct pc_pair *pair);
/* Close both instances (source first) and release the hosts. */
void pc_pair_close(struct pc_pair *pair);
/* Fail the run when either side recorded an error on a path that succeeded. */
bool pc_pair_quiet(struct pc_run *run, struct pc_pair *pair);

/* ---- Memory ------------------------------------------------------------- */

/* A destination region between guard pages of a known pattern, registered
 * for remote write, with its key imported on the source. */
struct pc_region {
	uint8_t *map;
	uint8_t *mem;
	size_t len;
	lmt_mr *mr;
	struct lmt_blob key;
	lmt_rkey *rkey;
};

bool pc_region_open(struct pc_run *run, struct pc_pair *pair, struct pc_region *region, size_t len);
void pc_region_close(struct pc_pair *pair, struct pc_region *region);
bool pc_region_guards_intact(struct pc_run *run, const struct pc_region *region);

/* Source memory filled with a pattern, registered when the plugin needs it. */
struct pc_source {
	uint8_t *mem;
	size_t len;
	lmt_mr *mr;
};

bool pc_source_open(struct pc_run *run, struct pc_pair *pair, struct pc_source *source, size_t len,
                    uint64_t seed);
void pc_source_close(struct pc_pair *pair, struct pc_source *source);
/* Refill with another pattern (the memory stays registered). */
void pc_fill(uint8_t *mem, size_t len, uint64_t seed);
/* Fail with "N bytes differ at offset X" unless equal. */
bool pc_same(struct pc_run *run, const char *what, const uint8_t *got, const uint8_t *want,
             size_t len, uint64_t base);

/* ---- Writes and completions --------------------------------------------- */

struct pc_write {
	const uint8_t *local;
	struct pc_region *region;
	uint64_t offset;
	size_t len;
	uint8_t seen;
};

/* Every posted write by cookie; each must complete exactly once, status 0,
 * with its bytes visible in the region when the completion is reported. */
struct pc_tally {
	struct pc_write *writes;
	uint64_t cap;
	uint64_t posted;
	uint64_t done;
	uint64_t eagain; /* how often write answered EAGAIN */
	bool check_visible;
};

bool pc_tally_init(struct pc_run *run, struct pc_tally *tally, uint64_t cap);
void pc_tally_fini(struct pc_tally *tally);
/* Post one write, harvesting while the plugin answers EAGAIN. */
bool pc_post(struct pc_run *run, struct pc_pair *pair, struct pc_tally *tally, uint32_t channel,
             struct pc_source *source, const uint8_t *local, struct pc_region *region,
             uint64_t offset, size_t len);
/* Post one write once: 0, -LMT_EAGAIN, or fails the run (returns -1). */
int pc_post_once(struct pc_run *run, struct pc_pair *pair, struct pc_tally *tally, uint32_t channel,
                 struct pc_source *source, const uint8_t *local, struct pc_region *region,
                 uint64_t offset, size_t len);
/* One progress call; the number harvested, or -1 after failing the run. */
int pc_harvest(struct pc_run *run, struct pc_pair *pair, struct pc_tally *tally, uint32_t max,
               uint64_t timeout_ns);
/* Harvest until every posted write has completed. */
bool pc_harvest_all(struct pc_run *run, struct pc_pair *pair, struct pc_tally *tally);

/* ---- Checks ------------------------------------------------------------- */

struct pc_check {
	const char *name;
	void (*fn)(struct pc_run *run);
};

extern const struct pc_check pc_checks[];
extern const size_t pc_check_count;

/* The other half of the "unload" check, run in a process of its own: load,
 * open and close an instance of each role, unload, and compare fds and
 * threads with before. 0, or 3 with the reason on stderr. */
int pc_unload_probe(const char *spec, const char *options, bool verbose);

/* The dynamic symbols `path` exports beyond the entry point, listed in
 * `extra`; returns how many, or -1 with the reason in `extra`. */
int pc_exports(const char *path, char *extra, size_t size);

#endif
