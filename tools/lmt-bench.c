/* lmt-bench: migrates a synthetic guest between two processes over each
 * transport plugin and prints throughput, total time and downtime. */
#define _GNU_SOURCE
#include <getopt.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <stdnoreturn.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"

#define DEFAULT_RAM (UINT64_C(256) << 20)
#define DEFAULT_TIMEOUT_NS (UINT64_C(120) * 1000000000u)
#define MAX_REPEAT 1000u
#define MIB 1048576.0
#define GIB 1073741824.0

struct args {
	struct bench_config cfg;
	char *plugins; /* comma-separated, or NULL for every plugin found */
	char *options; /* the -o values joined with ',' */
	unsigned repeat;
	bool json;
};

struct names {
	char **items;
	size_t count;
};

/* The figures of one run, by index, so that a summary can take medians. */
enum metric {
	M_SETUP_MS,
	M_TOTAL_MS,
	M_DOWNTIME_MS,
	M_GBPS,
	M_GIBPS,
	M_SENT_BYTES,
	M_ZERO_PAGES,
	M_PASSES,
	M_PREFAULT_MS,
	M_COUNT
};

struct metrics {
	double v[M_COUNT];
};

/* ---- Arguments ---------------------------------------------------------- */

static noreturn void bad_arg(const char *flag, const char *expected, const char *got)
{
	fprintf(stderr, "lmt-bench: %s: expected %s, got '%s'\n", flag, expected, got);
	exit(2);
}

static noreturn void out_of_memory(void)
{
	fprintf(stderr, "lmt-bench: out of memory\n");
	exit(1);
}

static char *xstrdup(const char *s)
{
	char *p = strdup(s);

	if (!p)
		out_of_memory();
	return p;
}

static void usage(FILE *f)
{
	char ram[32], timeout[32];

	bench_format_size(DEFAULT_RAM, ram, sizeof(ram));
	bench_format_duration(DEFAULT_TIMEOUT_NS, timeout, sizeof(timeout));
	fprintf(f,
	        "usage: lmt-bench [--plugins LIST | --plugin NAME] [--ram SIZE] [options]\n"
	        "\n"
	        "Migrates a synthetic guest between two processes over each transport\n"
	        "plugin, checks the copy bit for bit, and prints throughput, total time\n"
	        "and downtime side by side, next to single-thread memcpy bandwidth.\n"
	        "\n"
	        "  --plugins LIST|all   plugins to compare, comma-separated (default: all,\n"
	        "                       every plugin found that is not a decorator)\n"
	        "  --plugin NAME        the same, for one plugin\n"
	        "  --ram SIZE           guest RAM, a multiple of 4K (default %s)\n"
	        "  --dirty-rate SIZE    bytes per second the guest rewrites while it is\n"
	        "                       migrated, e.g. 100M or 100M/s (default 0: idle)\n"
	        "  --working-set SIZE   how much RAM, from its start, the guest rewrites\n"
	        "                       (default: all of it)\n"
	        "  --zero-fraction F    fraction of the 4 KiB pages left all-zero, 0 to 1\n"
	        "                       (default 0)\n"
	        "  -o, --options LIST   lmt options for both sides, key=value,...; may be\n"
	        "                       given more than once (default: none)\n"
	        "  --repeat N           runs per plugin; prints each, then the median and\n"
	        "                       min-max (default 1)\n"
	        "  --seed N             seed of the guest's pseudo-random data (default 1)\n"
	        "  --no-prefault        leave the destination's RAM unfaulted, to measure\n"
	        "                       the page-fault cost (default: pre-fault it)\n"
	        "  --port N             destination control port (default 0: any)\n"
	        "  --timeout DURATION   watchdog for one run: 500ms, 120s, 5m... (default %s)\n"
	        "  --json               one JSON object per run (and per summary) on stdout\n"
	        "  -h, --help           this help\n"
	        "\n"
	        "Sizes are digits with an optional K, M, G or T (binary; 64KiB and 64KB\n"
	        "mean 64K). Throughput is bytes sent over the transport divided by the\n"
	        "total migration time. Exit status: 0 when every run migrated and\n"
	        "verified, 1 when one failed, 2 for bad arguments.\n",
	        ram, timeout);
}

static uint64_t arg_size(const char *flag, const char *text)
{
	uint64_t value;

	if (bench_parse_size(text, &value) < 0)
		bad_arg(flag, "a size such as 256M or 2G", text);
	return value;
}

static uint64_t arg_rate(const char *text)
{
	size_t len = strlen(text);
	char *copy = xstrdup(text);
	uint64_t value;

	if (len > 2 && strcmp(text + len - 2, "/s") == 0)
		copy[len - 2] = '\0';
	if (bench_parse_size(copy, &value) < 0) {
		free(copy);
		bad_arg("--dirty-rate", "bytes per second such as 100M or 1G/s", text);
	}
	free(copy);
	return value;
}

static void append_options(struct args *args, const char *text)
{
	char *joined;

	if (!args->options) {
		args->options = xstrdup(text);
		return;
	}
	if (asprintf(&joined, "%s,%s", args->options, text) < 0)
		out_of_memory();
	free(args->options);
	args->options = joined;
}

static void check_plugin_list(const char *flag, const char *text)
{
	size_t len = strlen(text);

	if (len == 0 || text[0] == ',' || text[len - 1] == ',' || strstr(text, ",,"))
		bad_arg(flag, "plugin names separated by commas, or 'all'", text);
}

static void apply_flag(struct args *args, int flag, const char *value)
{
	struct bench_config *cfg = &args->cfg;
	uint64_t n;

	switch (flag) {
	case 'p':
	case 'P':
		check_plugin_list(flag == 'p' ? "--plugin" : "--plugins", value);
		free(args->plugins);
		args->plugins = strcmp(value, "all") == 0 ? NULL : xstrdup(value);
		break;
	case 'r':
		cfg->ram_bytes = arg_size("--ram", value);
		break;
	case 'd':
		cfg->dirty_rate = arg_rate(value);
		break;
	case 'w':
		cfg->working_set = arg_size("--working-set", value);
		break;
	case 'z':
		if (bench_parse_fraction(value, &cfg->zero_fraction) < 0)
			bad_arg("--zero-fraction", "a fraction from 0 to 1 such as 0.5", value);
		break;
	case 'o':
		append_options(args, value);
		break;
	case 'n':
		if (bench_parse_uint(value, MAX_REPEAT, &n) < 0 || n == 0)
			bad_arg("--repeat", "a count from 1 to 1000", value);
		args->repeat = (unsigned)n;
		break;
	case 's':
		if (bench_parse_uint(value, UINT64_MAX, &cfg->seed) < 0)
			bad_arg("--seed", "a non-negative integer", value);
		break;
	case 't':
		if (bench_parse_duration(value, &cfg->timeout_ns) < 0 || cfg->timeout_ns == 0)
			bad_arg("--timeout", "a duration with its unit such as 120s or 5m", value);
		break;
	case 'q':
		if (bench_parse_uint(value, UINT16_MAX, &n) < 0)
			bad_arg("--port", "a port number from 0 to 65535", value);
		cfg->port = (uint16_t)n;
		break;
	}
}

static void check_sizes(struct bench_config *cfg, const char *ram_text, const char *ws_text)
{
	if (cfg->ram_bytes == 0 || cfg->ram_bytes % BENCH_PAGE_SIZE != 0)
		bad_arg("--ram", "a size such as 256M or 2G, a multiple of 4K", ram_text);
	if (!ws_text) {
		cfg->working_set = cfg->ram_bytes;
		return;
	}
	if (cfg->working_set == 0 || cfg->working_set % BENCH_PAGE_SIZE != 0 ||
	    cfg->working_set > cfg->ram_bytes)
		bad_arg("--working-set", "a multiple of 4K no larger than --ram", ws_text);
}

static void parse_args(int argc, char **argv, struct args *args)
{
	static const struct option longopts[] = {
		{ "plugin", required_argument, NULL, 'p' },
		{ "plugins", required_argument, NULL, 'P' },
		{ "ram", required_argument, NULL, 'r' },
		{ "dirty-rate", required_argument, NULL, 'd' },
		{ "working-set", required_argument, NULL, 'w' },
		{ "zero-fraction", required_argument, NULL, 'z' },
		{ "options", required_argument, NULL, 'o' },
		{ "repeat", required_argument, NULL, 'n' },
		{ "seed", required_argument, NULL, 's' },
		{ "timeout", required_argument, NULL, 't' },
		{ "port", required_argument, NULL, 'q' },
		{ "no-prefault", no_argument, NULL, 'F' },
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char *ram_text = "256M", *ws_text = NULL;
	int c;

	args->cfg.ram_bytes = DEFAULT_RAM;
	args->cfg.seed = 1;
	args->cfg.timeout_ns = DEFAULT_TIMEOUT_NS;
	args->cfg.prefault = true;
	args->repeat = 1;
	while ((c = getopt_long(argc, argv, "o:h", longopts, NULL)) != -1) {
		if (c == 'h') {
			usage(stdout);
			exit(0);
		} else if (c == '?') {
			fprintf(stderr, "lmt-bench: see --help for the flags\n");
			exit(2);
		} else if (c == 'F') {
			args->cfg.prefault = false;
		} else if (c == 'j') {
			args->json = true;
		} else {
			ram_text = c == 'r' ? optarg : ram_text;
			ws_text = c == 'w' ? optarg : ws_text;
			apply_flag(args, c, optarg);
		}
	}
	if (optind < argc) {
		fprintf(stderr, "lmt-bench: unexpected argument '%s' (see --help)\n",
		        argv[optind]);
		exit(2);
	}
	check_sizes(&args->cfg, ram_text, ws_text);
	args->cfg.options = args->options;
	args->cfg.progress = isatty(STDERR_FILENO);
}

/* ---- Plugins ------------------------------------------------------------ */

static void names_add(struct names *names, const char *name)
{
	char **items;

	for (size_t i = 0; i < names->count; i++) {
		if (strcmp(names->items[i], name) == 0)
			return;
	}
	items = realloc(names->items, (names->count + 1) * sizeof(*items));
	if (!items)
		out_of_memory();
	names->items = items;
	names->items[names->count++] = xstrdup(name);
}

static void names_free(struct names *names)
{
	for (size_t i = 0; i < names->count; i++)
		free(names->items[i]);
	free(names->items);
}

static void visit_plugin(void *opaque, const char *path, const lmt_plugin_handle *plugin,
                         const struct lmt_error *err)
{
	const struct lmt_plugin *desc;

	if (!plugin) {
		fprintf(stderr, "lmt-bench: skipping %s: %s\n", path,
		        err && err->message[0] ? err->message : "failed to load");
		return;
	}
	desc = lmt_plugin_descriptor(plugin);
	/* A decorator needs a plugin to wrap; name it explicitly to bench it. */
	if (!(desc->caps & LMT_CAP_DECORATOR))
		names_add(opaque, desc->name);
}

static int resolve_plugins(const char *list, struct names *names)
{
	char *copy, *save = NULL;

	if (!list) {
		lmt_plugin_list(visit_plugin, names);
		return names->count > 0 ? 0 : -1;
	}
	copy = xstrdup(list);
	for (char *name = strtok_r(copy, ",", &save); name; name = strtok_r(NULL, ",", &save))
		names_add(names, name);
	free(copy);
	return 0;
}

/* ---- Figures ------------------------------------------------------------ */

static void metrics_of(const struct bench_result *r, struct metrics *m)
{
	const struct lmt_stats *s = &r->stats;
	double total_ns = (double)s->total_ns;

	m->v[M_SETUP_MS] = (double)s->setup_ns / 1e6;
	m->v[M_TOTAL_MS] = total_ns / 1e6;
	m->v[M_DOWNTIME_MS] = (double)s->downtime_ns / 1e6;
	/* Bits per nanosecond are Gb/s. */
	m->v[M_GBPS] = total_ns > 0 ? (double)s->bytes_sent * 8.0 / total_ns : 0.0;
	m->v[M_GIBPS] = total_ns > 0 ? (double)s->bytes_sent / total_ns * 1e9 / GIB : 0.0;
	m->v[M_SENT_BYTES] = (double)s->bytes_sent;
	m->v[M_ZERO_PAGES] = (double)s->zero_pages;
	m->v[M_PASSES] = (double)s->passes;
	m->v[M_PREFAULT_MS] = (double)r->prefault_ns / 1e6;
}

static int compare_doubles(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* Median, min and max of each figure over `n` runs (n > 0). */
static void summarize(const struct metrics *runs, size_t n, struct metrics *median,
                      struct metrics *min, struct metrics *max)
{
	double *values = malloc(n * sizeof(*values));

	if (!values)
		out_of_memory();
	for (int k = 0; k < M_COUNT; k++) {
		for (size_t i = 0; i < n; i++)
			values[i] = runs[i].v[k];
		qsort(values, n, sizeof(*values), compare_doubles);
		median->v[k] = n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
		min->v[k] = values[0];
		max->v[k] = values[n - 1];
	}
	free(values);
}

/* ---- Table -------------------------------------------------------------- */

enum column {
	C_PLUGIN,
	C_RAM,
	C_VERIFIED,
	C_SETUP,
	C_TOTAL,
	C_DOWNTIME,
	C_GBPS,
	C_GIBPS,
	C_MEMCPY,
	C_SENT,
	C_ZERO,
	C_PASSES,
	C_PREFAULT,
	C_COUNT
};

static const struct {
	const char *title;
	const char *unit;
	int width; /* negative: left-aligned */
} columns[C_COUNT] = {
	[C_PLUGIN] = { "plugin", "", -14 },       [C_RAM] = { "RAM", "(MiB)", 7 },
	[C_VERIFIED] = { "verified", "(yes/NO)", 8 }, [C_SETUP] = { "setup", "(ms)", 8 },
	[C_TOTAL] = { "total", "(ms)", 9 },        [C_DOWNTIME] = { "downtime", "(ms)", 9 },
	[C_GBPS] = { "throughput", "(Gb/s)", 10 }, [C_GIBPS] = { "throughput", "(GiB/s)", 10 },
	[C_MEMCPY] = { "of memcpy", "(%)", 9 },    [C_SENT] = { "sent", "(MiB)", 9 },
	[C_ZERO] = { "zero", "(pages)", 9 },       [C_PASSES] = { "passes", "(count)", 7 },
	[C_PREFAULT] = { "prefault", "(ms)", 8 },
};

typedef char cell[32];

static void print_cells(cell cells[C_COUNT])
{
	for (int i = 0; i < C_COUNT; i++)
		printf("%s%*s", i ? "  " : "", columns[i].width, cells[i]);
	printf("\n");
}

static void print_header(void)
{
	cell titles[C_COUNT], units[C_COUNT];

	for (int i = 0; i < C_COUNT; i++) {
		snprintf(titles[i], sizeof(cell), "%s", columns[i].title);
		snprintf(units[i], sizeof(cell), "%s", columns[i].unit);
	}
	print_cells(titles);
	print_cells(units);
}

/* `m` NULL: a run that left no figures. */
static void print_row(const char *label, const char *verified, const struct args *args,
                      const struct metrics *m, double memcpy_gibps)
{
	const uint64_t ram = args->cfg.ram_bytes;
	cell c[C_COUNT];

	for (int i = 0; i < C_COUNT; i++)
		snprintf(c[i], sizeof(cell), "-");
	snprintf(c[C_PLUGIN], sizeof(cell), "%s", label);
	snprintf(c[C_RAM], sizeof(cell), ram % (1u << 20) ? "%.2f" : "%.0f", (double)ram / MIB);
	snprintf(c[C_VERIFIED], sizeof(cell), "%s", verified);
	if (m) {
		snprintf(c[C_SETUP], sizeof(cell), "%.1f", m->v[M_SETUP_MS]);
		snprintf(c[C_TOTAL], sizeof(cell), "%.1f", m->v[M_TOTAL_MS]);
		snprintf(c[C_DOWNTIME], sizeof(cell), "%.2f", m->v[M_DOWNTIME_MS]);
		snprintf(c[C_GBPS], sizeof(cell), "%.2f", m->v[M_GBPS]);
		snprintf(c[C_GIBPS], sizeof(cell), "%.2f", m->v[M_GIBPS]);
		if (memcpy_gibps > 0)
			snprintf(c[C_MEMCPY], sizeof(cell), "%.1f",
			         100.0 * m->v[M_GIBPS] / memcpy_gibps);
		snprintf(c[C_SENT], sizeof(cell), "%.1f", m->v[M_SENT_BYTES] / MIB);
		snprintf(c[C_ZERO], sizeof(cell), "%.0f", m->v[M_ZERO_PAGES]);
		snprintf(c[C_PASSES], sizeof(cell), "%.0f", m->v[M_PASSES]);
		if (args->cfg.prefault)
			snprintf(c[C_PREFAULT], sizeof(cell), "%.1f", m->v[M_PREFAULT_MS]);
	}
	print_cells(c);
}

static void print_preamble(const struct args *args, double memcpy_gibps)
{
	const struct bench_config *cfg = &args->cfg;
	struct bench_ram layout;
	char size[32];

	bench_ram_layout(&layout, NULL, cfg->ram_bytes);
	bench_format_size(cfg->ram_bytes, size, sizeof(size));
	printf("guest: %s of RAM (", size);
	for (uint32_t i = 0; i < layout.nblocks; i++) {
		bench_format_size(layout.blocks[i].length, size, sizeof(size));
		printf("%s%s %s", i ? ", " : "", layout.blocks[i].name, size);
	}
	printf("), %.0f%% of its pages zero, seed %llu; ", cfg->zero_fraction * 100.0,
	       (unsigned long long)cfg->seed);
	if (cfg->dirty_rate > 0) {
		bench_format_size(cfg->dirty_rate, size, sizeof(size));
		printf("dirties %s/s ", size);
		bench_format_size(cfg->working_set, size, sizeof(size));
		printf("of a %s working set\n", size);
	} else {
		printf("idle\n");
	}
	printf("options: %s; destination RAM %s\n", cfg->options ? cfg->options : "(defaults)",
	       cfg->prefault ? "pre-faulted" : "not pre-faulted");
	if (memcpy_gibps > 0)
		printf("memcpy yardstick: %.2f GiB/s (one thread, median of 3)\n\n", memcpy_gibps);
	else
		printf("memcpy yardstick: unavailable (not enough memory)\n\n");
}

static void print_ranges(const char *plugin, const struct metrics *min, const struct metrics *max)
{
	printf("  %s min-max: setup %.1f-%.1f ms, total %.1f-%.1f ms, downtime %.2f-%.2f ms, "
	       "throughput %.2f-%.2f Gb/s\n",
	       plugin, min->v[M_SETUP_MS], max->v[M_SETUP_MS], min->v[M_TOTAL_MS],
	       max->v[M_TOTAL_MS], min->v[M_DOWNTIME_MS], max->v[M_DOWNTIME_MS], min->v[M_GBPS],
	       max->v[M_GBPS]);
}

/* ---- JSON --------------------------------------------------------------- */

static void json_number(const char *key, double value, bool valid, bool integer)
{
	if (!valid)
		printf(",\"%s\":null", key);
	else if (integer)
		printf(",\"%s\":%.0f", key, value);
	else
		printf(",\"%s\":%.4f", key, value);
}

static void json_common(const char *kind, const char *plugin, const struct args *args,
                        double memcpy_gibps)
{
	const struct bench_config *cfg = &args->cfg;

	printf("{\"kind\":\"%s\",\"plugin\":", kind);
	bench_json_string(stdout, plugin);
	printf(",\"ram_bytes\":%llu,\"options\":", (unsigned long long)cfg->ram_bytes);
	bench_json_string(stdout, cfg->options ? cfg->options : "");
	printf(",\"dirty_rate\":%llu,\"working_set\":%llu,\"zero_fraction\":%g,\"seed\":%llu",
	       (unsigned long long)cfg->dirty_rate, (unsigned long long)cfg->working_set,
	       cfg->zero_fraction, (unsigned long long)cfg->seed);
	printf(",\"prefault\":%s", cfg->prefault ? "true" : "false");
	json_number("memcpy_gibps", memcpy_gibps, memcpy_gibps > 0, false);
}

static void json_metrics(const struct metrics *m, const struct args *args, double memcpy_gibps,
                         const char *suffix)
{
	static const char *const keys[M_COUNT] = {
		[M_SETUP_MS] = "setup_ms",      [M_TOTAL_MS] = "total_ms",
		[M_DOWNTIME_MS] = "downtime_ms", [M_GBPS] = "throughput_gbps",
		[M_GIBPS] = "throughput_gibps", [M_SENT_BYTES] = "bytes_sent",
		[M_ZERO_PAGES] = "zero_pages",  [M_PASSES] = "passes",
		[M_PREFAULT_MS] = "prefault_ms",
	};
	char key[64];

	for (int k = 0; k < M_COUNT; k++) {
		bool valid = m && (k != M_PREFAULT_MS || args->cfg.prefault);
		bool integer = k == M_SENT_BYTES || k == M_ZERO_PAGES || k == M_PASSES;

		snprintf(key, sizeof(key), "%s%s", keys[k], suffix);
		json_number(key, m ? m->v[k] : 0, valid, integer);
	}
	if (!suffix[0]) {
		json_number("memcpy_percent",
		            m && memcpy_gibps > 0 ? 100.0 * m->v[M_GIBPS] / memcpy_gibps : 0,
		            m && memcpy_gibps > 0, false);
	}
}

static void json_run(const char *plugin, unsigned run, const struct args *args,
                     const struct bench_result *r, double memcpy_gibps)
{
	struct metrics m;

	metrics_of(r, &m);
	json_common("run", plugin, args, memcpy_gibps);
	printf(",\"run\":%u,\"runs\":%u,\"verified\":%s", run, args->repeat,
	       r->verified ? "true" : "false");
	json_metrics(r->have_stats ? &m : NULL, args, memcpy_gibps, "");
	printf(",\"zero_pages_made\":%llu,\"dirtied_bytes\":%llu,\"error\":",
	       (unsigned long long)r->zero_pages_made, (unsigned long long)r->dirtied_bytes);
	bench_json_string(stdout, r->ok ? NULL : r->error);
	printf(",\"stats\":%s}\n", r->stats_json ? r->stats_json : "null");
}

static void json_summary(const char *plugin, const struct args *args, size_t ok,
                         const struct metrics *median, const struct metrics *min,
                         const struct metrics *max, double memcpy_gibps)
{
	char error[64];

	json_common("summary", plugin, args, memcpy_gibps);
	printf(",\"runs\":%u,\"verified_runs\":%zu,\"verified\":%s", args->repeat, ok,
	       ok == args->repeat ? "true" : "false");
	json_metrics(ok ? median : NULL, args, memcpy_gibps, "");
	json_metrics(ok ? min : NULL, args, memcpy_gibps, "_min");
	json_metrics(ok ? max : NULL, args, memcpy_gibps, "_max");
	snprintf(error, sizeof(error), "%u of %u runs failed", args->repeat - (unsigned)ok,
	         args->repeat);
	printf(",\"error\":");
	bench_json_string(stdout, ok == args->repeat ? NULL : error);
	printf("}\n");
}

/* ---- Main --------------------------------------------------------------- */

static void report_run(const char *plugin, unsigned run, const struct args *args,
                       const struct bench_result *r, double memcpy_gibps)
{
	struct metrics m;
	char label[64];

	if (args->json) {
		json_run(plugin, run, args, r, memcpy_gibps);
		if (!r->ok)
			fprintf(stderr, "lmt-bench: %s: run %u: %s\n", plugin, run, r->error);
	} else {
		if (args->repeat > 1)
			snprintf(label, sizeof(label), "%s #%u", plugin, run);
		else
			snprintf(label, sizeof(label), "%s", plugin);
		metrics_of(r, &m);
		print_row(label, r->ok ? "yes" : "NO", args, r->have_stats ? &m : NULL,
		          memcpy_gibps);
		if (!r->ok)
			printf("  %s: %s\n", label, r->error);
	}
	fflush(stdout);
}

static void report_summary(const char *plugin, const struct args *args,
                           const struct metrics *runs, size_t ok, double memcpy_gibps)
{
	struct metrics median, min, max;
	char label[64], verified[32];

	if (ok > 0)
		summarize(runs, ok, &median, &min, &max);
	if (args->json) {
		json_summary(plugin, args, ok, &median, &min, &max, memcpy_gibps);
		return;
	}
	snprintf(label, sizeof(label), "%s median", plugin);
	snprintf(verified, sizeof(verified), ok == args->repeat ? "yes" : "NO %zu/%u", ok,
	         args->repeat);
	print_row(label, verified, args, ok ? &median : NULL, memcpy_gibps);
	if (ok > 0)
		print_ranges(plugin, &min, &max);
	if (ok < args->repeat)
		printf("  %s: %u of %u runs failed; the median is over the others\n", plugin,
		       args->repeat - (unsigned)ok, args->repeat);
}

/* Runs one plugin `repeat` times; returns how many runs failed. */
static unsigned bench_plugin(const char *plugin, const struct args *args, double memcpy_gibps)
{
	struct metrics *runs = calloc(args->repeat, sizeof(*runs));
	struct bench_result result;
	size_t ok = 0;

	if (!runs)
		out_of_memory();
	for (unsigned i = 1; i <= args->repeat; i++) {
		bench_run(&args->cfg, plugin, &result);
		report_run(plugin, i, args, &result, memcpy_gibps);
		/* Medians are over the runs that migrated and verified. */
		if (result.ok)
			metrics_of(&result, &runs[ok++]);
		bench_result_clear(&result);
	}
	if (args->repeat > 1)
		report_summary(plugin, args, runs, ok, memcpy_gibps);
	free(runs);
	return args->repeat - (unsigned)ok;
}

int main(int argc, char **argv)
{
	struct args args = { 0 };
	struct names plugins = { 0 };
	unsigned failed = 0;
	double memcpy_gibps;

	parse_args(argc, argv, &args);
	/* A peer that dies must end a run with an error, not end lmt-bench. */
	signal(SIGPIPE, SIG_IGN);
	if (resolve_plugins(args.plugins, &plugins) < 0) {
		fprintf(stderr, "lmt-bench: no plugins found (see lmt-info --search-path)\n");
		free(args.options);
		return 1;
	}
	memcpy_gibps = bench_memcpy_gibps(args.cfg.ram_bytes);
	if (!args.json) {
		print_preamble(&args, memcpy_gibps);
		print_header();
	}
	for (size_t i = 0; i < plugins.count; i++)
		failed += bench_plugin(plugins.items[i], &args, memcpy_gibps);
	names_free(&plugins);
	free(args.plugins);
	free(args.options);
	return failed ? 1 : 0;
}
