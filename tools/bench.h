/* lmt-bench internals shared by its files: the synthetic guest and its
 * workload, one migration run, strict argument parsing. Not installed. */
#ifndef LMT_TOOLS_BENCH_H
#define LMT_TOOLS_BENCH_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <lmt/lmt.h>

#define BENCH_PAGE_SIZE 4096u
#define BENCH_MAX_BLOCKS 2u
#define BENCH_ERROR_MAX 1024u
#define BENCH_DEVICE_STATE_SIZE 4096u

/* What the user asked for; the same for every run. */
struct bench_config {
	uint64_t ram_bytes;
	uint64_t dirty_rate;  /* bytes per second the guest rewrites; 0 = idle */
	uint64_t working_set; /* bytes from the start of RAM the workload rewrites */
	double zero_fraction; /* of the 4 KiB pages, left all-zero */
	uint64_t seed;
	uint64_t timeout_ns; /* watchdog for one run */
	uint16_t port;       /* destination control port, 0 = any */
	bool prefault;
	bool progress; /* a progress line on stderr */
	const char *options; /* "key=value,..." for both sides, or NULL */
};

/* One RAM block of the guest, on either side. */
struct bench_block {
	const char *name;
	uint8_t *host;
	uint64_t length;
	uint64_t npages;
	_Atomic uint64_t *dirty; /* source: pages written since the last sync */
};

struct bench_ram {
	uint8_t *base;
	uint64_t bytes;
	uint32_t nblocks;
	struct bench_block blocks[BENCH_MAX_BLOCKS];
};

/* The outcome of one migration. */
struct bench_result {
	bool ok;                     /* migrated and verified bit for bit */
	bool verified;
	char error[BENCH_ERROR_MAX]; /* "" when ok */
	bool have_stats;
	struct lmt_stats stats;      /* the source's, at the end */
	char *stats_json;            /* malloc'ed lmt_stats_json text, or NULL */
	bool prefaulted;
	uint64_t prefault_ns;
	uint64_t zero_pages_made;    /* all-zero pages in the initial guest */
	uint64_t dirtied_bytes;      /* written by the workload */
};

/* ---- bench-guest.c ------------------------------------------------------ */

uint64_t bench_now_ns(void);
uint64_t bench_random(uint64_t *state);
uint64_t bench_checksum(const void *data, size_t length);

/* Split [base, base+bytes) into the blocks both sides add: one block up to
 * 64K, else "ram0" (3/4) and "ram1" (the rest). A NULL base gives only the
 * names and sizes. */
void bench_ram_layout(struct bench_ram *ram, uint8_t *base, uint64_t bytes);
int bench_ram_alloc_dirty(struct bench_ram *ram);
void bench_ram_free_dirty(struct bench_ram *ram);

/* Fill zero-filled RAM with pseudo-random pages, leaving exactly
 * round(zero_fraction * pages) of them all-zero, spread by the seed.
 * Returns that number. */
uint64_t bench_ram_fill(struct bench_ram *ram, double zero_fraction, uint64_t seed);

/* lmt_dirty_sync_fn over a struct bench_ram. */
int bench_dirty_sync(void *opaque, uint32_t block, uint64_t *bitmap, uint64_t npages);

/* A thread that rewrites the first `working_set` bytes of RAM page by page
 * at `rate` bytes per second and marks each page dirty after writing it. */
struct bench_workload;
int bench_workload_start(struct bench_workload **out, struct bench_ram *ram,
                         uint64_t working_set, uint64_t rate, uint64_t seed);
/* Returns once the thread is stopped between pages. */
void bench_workload_pause(struct bench_workload *w);
/* Ends and frees the thread; returns the bytes it wrote. NULL is fine. */
uint64_t bench_workload_stop(struct bench_workload *w);

/* Single-thread memcpy bandwidth over `bytes`, median of 3, in GiB/s; 0
 * when the buffers cannot be had. */
double bench_memcpy_gibps(uint64_t bytes);

/* ---- bench-run.c -------------------------------------------------------- */

/* Migrate one guest over `plugin` from this process to a forked
 * destination and verify it. Fills *out; free with bench_result_clear. */
void bench_run(const struct bench_config *cfg, const char *plugin, struct bench_result *out);
void bench_result_clear(struct bench_result *result);

/* ---- bench-parse.c ------------------------------------------------------ */

/* Whole-string, overflow-checked parsers; 0 or -1. Sizes: digits then an
 * optional K, M, G or T (binary) with optional "i" and "B". Durations:
 * digits then ns, us, ms, s, m or h (a unit is required). */
int bench_parse_size(const char *text, uint64_t *out);
int bench_parse_duration(const char *text, uint64_t *out_ns);
int bench_parse_uint(const char *text, uint64_t max, uint64_t *out);
int bench_parse_fraction(const char *text, double *out);

/* "256M", "1G", "4095": the largest binary unit that divides exactly. */
void bench_format_size(uint64_t bytes, char *buf, size_t size);
/* "2m", "120s", "500ms" likewise. */
void bench_format_duration(uint64_t ns, char *buf, size_t size);
/* `text` as a JSON string, quotes included; NULL as null. */
void bench_json_string(FILE *f, const char *text);

#endif
