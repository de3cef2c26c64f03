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

#include <lmt/lmt.h>

#include "guest.h"
#include "guest_content.h"

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
};

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
	bool sweeping;    /* rows differ by config */
	bool yardsticks;  /* --yardsticks: a column for them */
	int plugin_width; /* of the table's plugin column */
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
