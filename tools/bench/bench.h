/* lmt-bench internals shared by its files: one migration run, the rows of a
 * sweep, output, plots and yardsticks. The synthetic guest it migrates is
 * the tests' (tests/support/guest.h). Not installed. */
#ifndef LMT_TOOLS_BENCH_H
#define LMT_TOOLS_BENCH_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include <lmt/lmt.h>

#include "guest.h"
#include "guest_content.h"

struct bench_plugin;
struct bench_row;

#define BENCH_ERROR_MAX 1024u
#define BENCH_DEVICE_STATE_SIZE 4096u

/* What one run is asked to do. */
struct bench_config {
	uint64_t ram_bytes;
	uint64_t dirty_rate;  /* bytes per second the guest rewrites; 0 = idle */
	uint64_t working_set; /* bytes from the start of RAM the workload rewrites */
	double zero_fraction; /* of the 4 KiB pages, left all-zero */
	uint64_t seed;
	const struct guest_content *content; /* what the RAM holds: --content */
	struct guest_dirty_pattern pattern;  /* which pages the workload rewrites */
	uint64_t timeout_ns;                 /* watchdog for one run */
	uint16_t port;                       /* destination control port, 0 = any */
	bool prefault;
	bool thp;            /* source RAM and memcpy buffers on transparent huge pages */
	bool test_corrupt;   /* flip a destination byte before the check */
	FILE *progress;      /* where the progress line goes (a terminal), or NULL */
	const char *label;   /* what the progress line calls this run */
	const char *options; /* "key=value,..." for both sides, or NULL */
	/* --target file:DIR: save to a file in DIR, then restore it into a
	 * fresh destination in this process; NULL: migrate to a forked one. */
	const char *target_dir;
	/* --target local[:anonymous]: a same-host live update, to a forked
	 * destination over unix:PATH. The guest's RAM is a memfd handed over
	 * by descriptor, or with `local_anonymous` anonymous memory the
	 * plugin copies. */
	bool local;
	bool local_anonymous;
	/* --postcopy: postcopy=on on both sides; the guest's workload moves to
	 * the destination at the switch and its postcopy figures are taken.
	 * `postcopy_after` 0: the bench switches at once after setup
	 * (lmt_save_postcopy), else lmt says when (postcopy-after=N). */
	bool postcopy;
	uint32_t postcopy_after;
	/* --wake-probe: while the source pre-copies, a thread of its process
	 * sleeps 1 ms at a time and notes how late it wakes. */
	bool wake_probe;
};

/* What the destination measured in a --postcopy run. */
struct bench_postcopy {
	bool switched;               /* the migration ended in postcopy */
	uint64_t pause_to_resume_ns; /* source pause to the destination's lmt_load_run return */
	uint64_t resume_ns;          /* the destination's own: connection to lmt_load_run return */
	uint64_t faults;
	uint64_t fault_p50_ns;
	uint64_t fault_p99_ns;
	uint64_t fault_max_ns;
	uint64_t background_pages;
	uint64_t postcopy_pages; /* placed after the switch */
	uint64_t written_pages;  /* pages the destination guest wrote after resuming */
	uint64_t dirtied_bytes;  /* what its workload wrote */
};

/* The outcome of one migration. */
struct bench_result {
	bool ok; /* migrated and verified bit for bit */
	bool verified;
	char error[BENCH_ERROR_MAX]; /* "" when ok */
	bool have_stats;
	struct lmt_stats stats; /* the source's, at the end */
	char *stats_json;       /* malloc'ed lmt_stats_json text, or NULL */
	bool prefaulted;
	uint64_t prefault_ns;
	uint64_t zero_pages_made;      /* all-zero pages in the initial guest */
	uint64_t dirtied_bytes;        /* written by the workload */
	struct lmt_pass_stats *passes; /* the source's timeline, malloc'ed */
	uint32_t npasses;
	bool unavailable;        /* setup found no device to run on */
	uint64_t max_iterate_ns; /* the longest lmt_save_iterate call */
	/* How long the calling thread waited for a CPU (runnable, not
	 * running) during that call; unknown without scheduler statistics. */
	bool max_iterate_runq_known;
	uint64_t max_iterate_runq_ns;
	/* --wake-probe: the most a 1 ms sleep overran during pre-copy. */
	bool wake_probed;
	uint64_t wake_late_max_ns;
	bool to_file;            /* a file target: the three below are measured */
	uint64_t file_bytes;     /* the file's length after the save */
	uint64_t restore_ns;     /* lmt_load_listen to the end of lmt_load_run */
	uint64_t restored_bytes; /* pages read back (the destination's bytes received) */
	/* The same file restored again with restore=lazy while a synthetic
	 * guest touches its pages; unmeasured where userfaultfd is not. */
	bool lazy_ran;
	bool lazy_verified;
	uint64_t lazy_resume_ns;  /* lmt_load_listen to lmt_load_run's return */
	uint64_t lazy_restore_ns; /* lmt_load_listen to lmt_load_finish's return */
	uint64_t lazy_faults;
	uint64_t lazy_fault_p99_ns;
	bool postcopy_ran; /* --postcopy: the figures below are measured */
	struct bench_postcopy postcopy;
	/* How long the guest's workload ran (the source's, to its pause):
	 * with dirtied_bytes, the dirty rate it reached. 0: unknown. */
	uint64_t workload_ns;
	bool qemu_ran; /* a QEMU row: the figures below are QEMU's */
	struct bench_qemu_result *qemu;
};

/* ---- bench-qemu.c ------------------------------------------------------ */

/* --qemu SPEC: how QEMU migrates, as its migration parameters say. */
enum bench_qemu_compression { BENCH_QEMU_NONE, BENCH_QEMU_ZSTD, BENCH_QEMU_ZLIB };

struct bench_qemu_spec {
	bool multifd;
	unsigned channels; /* multifd-channels */
	enum bench_qemu_compression compression;
	int level; /* multifd-zstd-level or multifd-zlib-level; -1: QEMU's default */
};

enum bench_qemu_accel { BENCH_QEMU_AUTO, BENCH_QEMU_KVM, BENCH_QEMU_TCG };

/* What every QEMU row of one invocation shares: the program, the
 * accelerator, the guest's files and the migration's limits. */
struct bench_qemu_env {
	char binary[512];
	char version[128];
	enum bench_qemu_accel accel; /* KVM or TCG once chosen */
	char accel_why[256];         /* why that one */
	double probe_mibps;          /* the guest builds random pages this fast here */
	uint64_t tsc_hz;
	char dir[256];                /* a temporary directory for the files below */
	char shm_dir[256];            /* where the destination's RAM files go */
	char image[300];              /* the guest's initial RAM (--content-file) */
	char rom[300];                /* the guest's firmware, with its parameters */
	char pools[300];              /* a mixed guest's pools, or "" */
	uint64_t max_bandwidth;       /* from -o max-bandwidth; 0: unlimited */
	uint64_t downtime_ms;         /* from -o downtime-limit; 0: QEMU's default */
	uint64_t default_downtime_ms; /* QEMU's, as it said */
	struct bench_qemu_layout {
		uint64_t area_base, area_bytes, log_offset;
		uint64_t pool_offset[2], pool_pages[2];
	} layout;
};

/* What a QEMU run measured, beyond the figures of every row. */
struct bench_qemu_result {
	/* QEMU 7.2 counts multifd pages before compression in both. */
	uint64_t transferred;   /* ram.transferred: RAM sent, the multifd channels' too */
	uint64_t multifd_bytes; /* ram.multifd-bytes: the part on multifd channels */
	/* On the wire: ram.transferred with each compressed multifd packet
	 * counted at its size (QEMU's multifd_send trace); 0: unknown. */
	bool wire_known;
	uint64_t wire_bytes;
	uint64_t ram_total; /* ram.total: every RAM block, the guest's area too */
	uint64_t duplicate; /* ram.duplicate: zero pages sent as such */
	uint64_t normal;    /* ram.normal */
	uint64_t dirty_sync_count;
	uint64_t source_start_ns; /* spawn to the guest running */
	uint64_t pages_written;   /* by the guest, on the source */
	uint64_t pages_skipped;   /* drawn in the legacy hole (640 KiB-1 MiB), left alone */
	uint64_t guest_ns;        /* its workload's running time, by its TSC */
	uint64_t pages_rewritten; /* pages that differ from the image, checked */
	uint64_t unchecked_pages; /* the page a pause caught half written */
};

/* "multifd=on,channels=4,compression=zstd,level=3". 0, or -1 with `err`. */
int bench_qemu_spec_parse(const char *text, struct bench_qemu_spec *out, char *err,
                          size_t err_size);
/* A --qemu[=SPEC] entry as the rows' plugin: name "qemu", its label, the
 * spec. 0, or -1 with `err`; free with bench_plugin_clear. */
int bench_qemu_plugin_parse(const char *text, struct bench_plugin *out, char *err, size_t err_size);
/* "qemu multifd-4 zstd" */
void bench_qemu_spec_label(const struct bench_qemu_spec *spec, char *buf, size_t size);
/* QEMU's migration parameters a row sets, "multifd-channels=4,...". */
void bench_qemu_spec_options(const struct bench_qemu_spec *spec, const struct bench_qemu_env *env,
                             char *buf, size_t size);
/* Find QEMU, choose the accelerator (`accel`; auto: KVM when it runs the
 * guest natively), take max-bandwidth and downtime-limit from `options`,
 * and write the guest's files. Needs cfg->content. 0, or -1 with `err`;
 * free with bench_qemu_env_free (also after a failure). */
int bench_qemu_env_init(struct bench_qemu_env *env, const struct bench_config *cfg,
                        const char *binary, enum bench_qemu_accel accel, const char *options,
                        char *err, size_t err_size);
void bench_qemu_env_free(struct bench_qemu_env *env);
/* Only max-bandwidth and downtime-limit from `options` into env. */
int bench_qemu_env_limits(struct bench_qemu_env *env, const char *options, char *err,
                          size_t err_size);
const char *bench_qemu_accel_name(enum bench_qemu_accel accel);
/* "auto", "kvm" or "tcg": 0, or -1. */
int bench_qemu_accel_parse(const char *text, enum bench_qemu_accel *out);
/* What --qemu cannot go with: a target, postcopy, a sweep of its limits. */
struct bench_sweep;
int bench_qemu_check_config(const struct bench_config *cfg, const struct bench_sweep *sweeps,
                            size_t nsweeps, char *err, size_t err_size);
/* Append a row per --qemu entry (`qemu`, kept by the caller) to *rows;
 * their options are QEMU's migration parameters, with the limits of `env`
 * (NULL: of `options` alone, for a dry run). 0, or -1 with `err`. */
int bench_qemu_rows_add(struct bench_plugin *qemu, size_t nqemu, const char *options,
                        const struct bench_qemu_env *env, struct bench_row **rows, size_t *nrows,
                        char *err, size_t err_size);
/* One QEMU migration of the guest, checked. Fills *out. */
void bench_qemu_run(const struct bench_config *cfg, const struct bench_qemu_env *env,
                    const struct bench_qemu_spec *spec, struct bench_result *out);

/* ---- bench-qemu-guest.c ------------------------------------------------ */

/* The probe's machine: half image, half the guest's area. */
#define BENCH_QEMU_PROBE_RAM (UINT64_C(4) << 20)

/* What the check read from the guest's status on the destination. */
struct bench_qemu_guest {
	uint64_t pages_written;
	uint64_t pages_skipped; /* drawn in the legacy hole and left alone */
	uint64_t start_tsc, last_tsc;
	uint64_t pages_rewritten;
	uint64_t unchecked_pages;
};

void bench_qemu_plan_layout(const struct bench_config *cfg, struct bench_qemu_layout *out);
int bench_qemu_write_rom(const char *path, const struct bench_config *cfg,
                         const struct bench_qemu_layout *layout, uint64_t tsc_hz, char *err,
                         size_t size);
int bench_qemu_write_probe_rom(const char *path, uint64_t probe_pages, uint64_t tsc_hz, char *err,
                               size_t size);
int bench_qemu_write_pools(const char *path, const struct bench_config *cfg,
                           const struct bench_qemu_layout *layout, char *err, size_t size);
/* The destination's RAM (`ram`, the image's part, and `area`, the guest's)
 * against the image and the guest's log. 0, or -1 with `err` naming the
 * first difference. */
/* The paused source, asked after a difference whether it holds the bytes
 * the destination lacks: `read` copies guest-physical memory, 0 or -1. */
struct bench_qemu_source {
	int (*read)(void *opaque, uint64_t gpa, void *buf, size_t len);
	void *opaque;
};
int bench_qemu_check(const struct bench_config *cfg, const struct bench_qemu_layout *layout,
                     const uint8_t *image, const uint8_t *ram, const uint8_t *area,
                     const struct bench_qemu_source *source, struct bench_qemu_guest *out,
                     char *err, size_t size);
int bench_qemu_map(const char *path, int fd, uint64_t bytes, const uint8_t **out, char *err,
                   size_t size);

/* ---- bench-qmp.c -------------------------------------------------------- */

/* A QMP connection to one QEMU process. */
struct bench_qmp {
	int fd;
	char *buf;
	size_t len, cap;
	unsigned next_id;
	bool exited; /* QEMU exited while connecting: reaped, with `status` */
	int status;
};

/* Connect to the socket at `path` as soon as QEMU (`pid`) listens there,
 * read its greeting and leave negotiation. 0, or -1 with `err`. */
int bench_qmp_connect(struct bench_qmp *q, const char *path, pid_t pid, uint64_t deadline_ns,
                      char *err, size_t err_size);
/* Run `command` with `arguments` (a JSON object, or NULL); *reply gets the
 * whole reply line (malloc'ed) on success. 0, or -1 with `err` (QEMU's
 * error class and description for a failed command). */
int bench_qmp_call(struct bench_qmp *q, const char *command, const char *arguments, char **reply,
                   uint64_t deadline_ns, char *err, size_t err_size);
void bench_qmp_close(struct bench_qmp *q);

/* ---- bench-json.c ------------------------------------------------------- */

/* Whether `text` is one JSON value and nothing else. */
bool bench_json_valid(const char *text);
/* The value at `path` ("return.ram.transferred"; a key whose value is an
 * array goes on in its first element), or NULL. */
const char *bench_json_find(const char *json, const char *path);
int bench_json_uint(const char *json, const char *path, uint64_t *out);
int bench_json_double(const char *json, const char *path, double *out);
int bench_json_string(const char *json, const char *path, char *buf, size_t size);
/* The value at `path` as its own malloc'ed text, or NULL. */
char *bench_json_dup(const char *json, const char *path);

/* ---- bench-run.c -------------------------------------------------------- */

/* Migrate one guest over `plugin` from this process to a forked
 * destination and verify it. Fills *out; free with bench_result_clear. */
void bench_run(const struct bench_config *cfg, const char *plugin, struct bench_result *out);
void bench_result_clear(struct bench_result *result);

/* ---- bench-help.c ------------------------------------------------------- */

/* --help, with the defaults that lmt-bench.c keeps. */
void bench_usage(FILE *f, uint64_t default_ram, uint64_t default_timeout_ns);

/* ---- bench-content.c ---------------------------------------------------- */

/* The compression ratio of the guest's initial RAM: every 16th 64 KiB
 * frame compressed on its own. */
#define BENCH_RATIO_FRAME 65536u
#define BENCH_RATIO_EVERY 16u

enum bench_compressor { BENCH_ZSTD1, BENCH_ZSTD3, BENCH_LZ4, BENCH_COMPRESSORS };

struct bench_compression {
	bool measured;
	uint64_t sampled_bytes;
	double ratio[BENCH_COMPRESSORS]; /* sampled bytes / compressed bytes */
};

void bench_compression_measure(const struct guest_content *content, uint64_t ram_bytes,
                               uint64_t seed, struct bench_compression *out);
/* "zstd-1"; "zstd1_ratio" in JSON and CSV. */
const char *bench_compressor_name(enum bench_compressor c);
const char *bench_compressor_key(enum bench_compressor c);
/* How many pages of each class the guest starts with. */
void bench_content_pages(const struct bench_config *cfg, uint64_t pages[GUEST_PAGE_CLASSES]);
/* "content mixed: 25% zero (N pages), ..." without a newline. */
void bench_content_describe(FILE *f, const struct bench_config *cfg);
/* The pools' and the compression's lines of the table's preamble. */
void bench_content_preamble(FILE *f, const struct bench_config *cfg,
                            const struct bench_compression *compression);
/* --content-file: the guest's initial RAM into `path`. 0, or -1 with `err`. */
int bench_content_file(const char *path, const struct bench_config *cfg, char *err, size_t size);

/* ---- bench-sweep.c ------------------------------------------------------ */

/* A plugin to compare, with options of its own ("ucx", "ucx.tls=posix"). */
struct bench_plugin {
	char *name;            /* a plugin name or a path to its .so */
	char *options;         /* "key=value,...", or NULL */
	char *label;           /* "ucx ucx.tls=posix" */
	bool discovered;       /* found on the search path rather than named */
	bool unavailable;      /* it loads, but found nothing to run on here */
	char yardstick[160];   /* its own benchmark, described; "" for none */
	double yardstick_gbps; /* what that benchmark measured */
	bool qemu;             /* not an lmt plugin: QEMU's own migration */
	struct bench_qemu_spec qemu_spec;
};

/* --sweep KEY=V1,V2,...: one option and the values it takes in turn. */
struct bench_sweep {
	char *arg; /* as given, for messages */
	char *key;
	char **values;
	size_t count;
};

/* The figures of one run, or the median, minimum or maximum over a row's
 * verified runs. NAN: not measured (no pre-fault, no memcpy figure). */
enum bench_figure {
	BENCH_SETUP_MS,
	BENCH_TOTAL_MS,
	BENCH_DOWNTIME_MS,
	BENCH_GBPS,
	BENCH_GIBPS,
	BENCH_MEMCPY_PERCENT,
	BENCH_YARDSTICK_PERCENT,
	BENCH_BYTES_SENT,
	BENCH_ZERO_PAGES,
	BENCH_ZERO_RUN_BYTES,
	BENCH_PASS_COUNT,
	BENCH_PREFAULT_MS,
	BENCH_MAX_ITERATE_MS,
	BENCH_MAX_ITERATE_RUNQ_MS,
	BENCH_WAKE_LATE_MS,
	BENCH_THROTTLE_PERCENT,
	BENCH_FILE_MIB,
	BENCH_RESTORE_MS,
	BENCH_RESTORE_GIBPS,
	BENCH_LAZY_RESUME_MS,
	BENCH_LAZY_RESTORE_MS,
	BENCH_LAZY_FAULTS,
	BENCH_LAZY_FAULT_P99_MS,
	BENCH_PAUSE_TO_RESUME_MS,
	BENCH_FAULTS,
	BENCH_FAULT_P50_MS,
	BENCH_FAULT_P99_MS,
	BENCH_FAULT_MAX_MS,
	BENCH_BACKGROUND_PAGES,
	BENCH_POSTCOPY_PAGES,
	BENCH_DIRTIED_MIBPS,
	BENCH_QEMU_TRANSFERRED,
	BENCH_QEMU_MULTIFD_BYTES,
	BENCH_QEMU_WIRE_BYTES,
	BENCH_FIGURE_COUNT
};

struct bench_figures {
	double v[BENCH_FIGURE_COUNT];
};

/* One row of the output: a plugin under one combination of swept values,
 * run --repeat times. */
struct bench_row {
	unsigned index; /* 1-based */
	struct bench_plugin *plugin;
	char *config;  /* the swept values, "channels=2,pin-all=on"; "" */
	char *options; /* everything both sides get, or NULL */
	char *label;   /* "ucx ucx.tls=posix channels=2 pin-all=on" */
	bool skipped;  /* its plugin cannot run here */
	unsigned runs; /* done */
	unsigned verified_runs;
	struct bench_result *results;          /* one per run, until the row is printed */
	struct bench_figures median, min, max; /* over the verified runs */
};

/* Parse "NAME" or "NAME:KEY=VALUE<sep>KEY=VALUE..." into *out; `sep` is ','
 * (--plugin) or ';' (an entry of --plugins). 0, or -1 with `err` filled. */
int bench_plugin_parse(const char *text, char sep, struct bench_plugin *out, char *err,
                       size_t err_size);
void bench_plugin_clear(struct bench_plugin *plugin);

/* Parse "KEY=V1,V2,..." into *out. 0, or -1 with `err` filled. */
int bench_sweep_parse(const char *text, struct bench_sweep *out, char *err, size_t err_size);
void bench_sweep_clear(struct bench_sweep *sweep);

/* An option set in two places (a sweep, -o, a plugin's own options) is an
 * error: 0, or -1 with `err` naming it. */
int bench_check_conflicts(const struct bench_sweep *sweeps, size_t nsweeps,
                          const char *common_options, const struct bench_plugin *plugins,
                          size_t nplugins, char *err, size_t err_size);

/* Every plugin times every combination of the sweeps, the first sweep
 * varying slowest. 0, or -1 with `err` filled. Free with bench_rows_free. */
int bench_rows_build(struct bench_plugin *plugins, size_t nplugins,
                     const struct bench_sweep *sweeps, size_t nsweeps, const char *common_options,
                     struct bench_row **rows, size_t *nrows, char *err, size_t err_size);
void bench_rows_free(struct bench_row *rows, size_t nrows);

/* ---- bench-output.c ----------------------------------------------------- */

/* `value` in the notation of lmt's options of `type`: "256M", "2m". */
void bench_format(enum lmt_option_type type, uint64_t value, char *buf, size_t size);

enum bench_format { BENCH_FORMAT_TABLE, BENCH_FORMAT_JSON, BENCH_FORMAT_CSV };

/* What every row of one invocation shares. */
struct bench_report {
	FILE *out;                      /* stdout as it was at start */
	const struct bench_config *cfg; /* the guest; options are per row */
	const char *common_options;     /* -o, or NULL */
	enum bench_format format;
	unsigned repeat;
	double memcpy_gibps; /* 0 when it could not be measured */
	struct bench_compression compression;
	const struct bench_plugin *plugins; /* with their yardsticks */
	size_t nplugins;
	bool sweeping;                     /* rows differ by config */
	bool yardsticks;                   /* --yardsticks: a column for them */
	const struct bench_qemu_env *qemu; /* --qemu rows: their setting; NULL */
	int plugin_width;                  /* of the table's plugin column */
};

/* `yardstick_gbps`: the plugin's own benchmark, or 0. */
void bench_figures_of(const struct bench_result *result, double memcpy_gibps, double yardstick_gbps,
                      struct bench_figures *out);
/* Median, minimum and maximum of each figure over `n` runs (n > 0). */
void bench_figures_summarize(const struct bench_figures *runs, size_t n,
                             struct bench_figures *median, struct bench_figures *min,
                             struct bench_figures *max);

/* The preamble and table header, or the CSV header; nothing for JSON. */
void bench_output_begin(const struct bench_report *report);
/* One row, once its runs are done. */
void bench_output_row(const struct bench_report *report, const struct bench_row *row);
/* `text` as a JSON string, quotes included; NULL as null. */
void bench_json_write_string(FILE *f, const char *text);
/* bench-qemu.c: the QEMU rows' preamble lines, and their JSON. */
void bench_qemu_preamble(FILE *f, const struct bench_qemu_env *env, const struct bench_config *cfg);
void bench_qemu_json_row(FILE *f, const struct bench_qemu_env *env);
void bench_qemu_json_run(FILE *f, const struct bench_result *result);

/* ---- bench-plot.c ------------------------------------------------------- */

/* Whether `program` is an executable file in a directory of PATH. */
bool bench_on_path(const char *program);
/* Whether gnuplot is on PATH. */
bool bench_plot_available(void);
/* Throughput and downtime per row into `path` (.svg or .png) with gnuplot.
 * 0 when drawn, 1 when skipped (no gnuplot, nothing to draw), -1 when it
 * failed; each with a message on stderr. */
int bench_plot(const char *path, const struct bench_report *report, const struct bench_row *rows,
               size_t nrows);

/* ---- bench-yardstick.c -------------------------------------------------- */

/* Single-thread memcpy bandwidth over `bytes`, median of 3, in GiB/s; 0
 * when the buffers cannot be had. */
double bench_memcpy_gibps(uint64_t bytes, bool thp);
/* Asks for transparent huge pages over [addr, addr + len) when `thp`. */
void bench_advise_thp(void *addr, uint64_t len, bool thp);
/* Sorts `values` (n > 0) in place and returns their median. */
double bench_median(double *values, size_t n);

/* Run each plugin's own benchmark over loopback (iperf3 for tcp,
 * ucx_perftest for ucx, with the entry's ucx.tls), median of 3, and fill
 * its yardstick fields; a message on stderr for a tool that is missing. */
void bench_yardsticks(struct bench_plugin *plugins, size_t nplugins);

#endif
