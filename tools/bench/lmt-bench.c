/* lmt-bench: migrates a synthetic guest between two processes over each
 * transport plugin and configuration, and compares throughput and downtime. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <stdnoreturn.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"

#define DEFAULT_RAM (UINT64_C(256) << 20)
#define DEFAULT_TIMEOUT_NS (UINT64_C(120) * 1000000000u)
#define MAX_REPEAT 1000u

/* A --plugin or --plugins entry; `all` stands for every plugin found. */
struct entry {
	bool all;
	struct bench_plugin plugin;
};

struct args {
	struct bench_config cfg;
	struct entry *entries;
	size_t nentries;
	struct bench_sweep *sweeps;
	size_t nsweeps;
	char *options; /* the -o values joined with ',' */
	unsigned repeat;
	enum bench_format format;
	const char *format_flag;
	const char *plot;
	bool dry_run;
	bool yardsticks;
	const char *content_text; /* --content, or NULL for random */
	const char *content_file; /* --content-file */
	bool zero_fraction_given;
	struct guest_profile profile;
	bool no_plugins;           /* --plugins none: QEMU's rows alone */
	struct bench_plugin *qemu; /* --qemu: one entry per row */
	size_t nqemu;
	const char *qemu_binary;
	enum bench_qemu_accel qemu_accel;
};

struct plugins {
	struct bench_plugin *items;
	size_t count;
};

/* ---- Arguments ---------------------------------------------------------- */

static noreturn void bad_arg(const char *flag, const char *expected, const char *got)
{
	fprintf(stderr, "lmt-bench: %s: expected %s, got '%s'\n", flag, expected, got);
	exit(2);
}

static noreturn void usage_error(const char *message)
{
	fprintf(stderr, "lmt-bench: %s\n", message);
	exit(2);
}

static noreturn void bad_flag(const char *flag, const char *message)
{
	fprintf(stderr, "lmt-bench: %s %s\n", flag, message);
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

static void *grow(void *items, size_t count, size_t size)
{
	void *p = realloc(items, (count + 1) * size);

	if (!p)
		out_of_memory();
	return p;
}

/* The flags that take a number: parsed as lmt parses its options, with
 * the messages it gives ("--repeat: expected an integer from 1 to 1000,
 * got '0'"). */
static const struct lmt_option_desc ram_flag = {.name = "--ram", .type = LMT_OPT_SIZE};
static const struct lmt_option_desc working_set_flag = {.name = "--working-set",
                                                        .type = LMT_OPT_SIZE};
static const struct lmt_option_desc dirty_rate_flag = {.name = "--dirty-rate",
                                                       .type = LMT_OPT_SIZE};
static const struct lmt_option_desc timeout_flag = {.name = "--timeout", .type = LMT_OPT_DURATION};
static const struct lmt_option_desc repeat_flag = {
        .name = "--repeat", .type = LMT_OPT_INT, .min = 1, .max = MAX_REPEAT};
static const struct lmt_option_desc seed_flag = {
        .name = "--seed", .type = LMT_OPT_INT, .min = 0, .max = INT64_MAX};
static const struct lmt_option_desc postcopy_after_flag = {
        .name = "--postcopy-after", .type = LMT_OPT_INT, .min = 0, .max = 1000};
static const struct lmt_option_desc port_flag = {
        .name = "--port", .type = LMT_OPT_INT, .min = 0, .max = UINT16_MAX};

static uint64_t arg_number(const struct lmt_option_desc *flag, const char *text)
{
	struct lmt_option_value value;
	struct lmt_error err = {0};

	if (lmt_option_parse(flag, text, &value, &err) != 0)
		usage_error(err.message);
	return (uint64_t)value.integer;
}

/* A size, or a size per second ("100M/s"). */
static uint64_t arg_rate(const char *text)
{
	size_t len = strlen(text);
	char *copy = xstrdup(text);
	struct lmt_option_value value;

	if (len > 2 && strcmp(text + len - 2, "/s") == 0)
		copy[len - 2] = '\0';
	if (lmt_option_parse(&dirty_rate_flag, copy, &value, NULL) != 0) {
		free(copy);
		bad_arg("--dirty-rate", "bytes per second such as 100M or 1G/s", text);
	}
	free(copy);
	return (uint64_t)value.integer;
}

/* A decimal fraction from 0 to 1; strtod would also take spaces, signs,
 * hex and "nan". */
static int parse_fraction(const char *text, double *out)
{
	char *end;
	double value;

	if (strspn(text, "0123456789.") != strlen(text) || text[0] == '\0')
		return -1;
	value = strtod(text, &end);
	if (*end != '\0' || !isfinite(value) || value < 0.0 || value > 1.0)
		return -1;
	*out = value;
	return 0;
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

static void add_entry(struct args *args, const char *flag, const char *list, const char *text,
                      char sep)
{
	struct entry e = {0};
	char err[BENCH_ERROR_MAX];

	if (strcmp(text, "all") == 0) {
		e.all = true;
	} else if (bench_plugin_parse(text, sep, &e.plugin, err, sizeof(err)) < 0) {
		if (sep == ',')
			fprintf(stderr, "lmt-bench: %s '%s': %s\n", flag, list, err);
		else
			fprintf(stderr, "lmt-bench: %s '%s': entry '%s': %s\n", flag, list, text,
			        err);
		exit(2);
	}
	args->entries = grow(args->entries, args->nentries, sizeof(e));
	args->entries[args->nentries++] = e;
}

static void add_plugin_list(struct args *args, const char *list)
{
	size_t len = strlen(list);
	char *copy, *save = NULL;

	if (strcmp(list, "none") == 0) {
		args->no_plugins = true;
		return;
	}
	if (len == 0 || list[0] == ',' || list[len - 1] == ',' || strstr(list, ",,"))
		bad_arg("--plugins", "plugin entries separated by commas, 'all' or 'none'", list);
	copy = xstrdup(list);
	for (char *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save))
		add_entry(args, "--plugins", list, item, ';');
	free(copy);
}

static void add_sweep(struct args *args, const char *text)
{
	char err[BENCH_ERROR_MAX];

	args->sweeps = grow(args->sweeps, args->nsweeps, sizeof(*args->sweeps));
	if (bench_sweep_parse(text, &args->sweeps[args->nsweeps], err, sizeof(err)) < 0)
		usage_error(err);
	args->nsweeps++;
}

/* --qemu[=SPEC]: a row of QEMU's own migration; the same row twice, once. */
static void add_qemu(struct args *args, const char *text)
{
	struct bench_plugin p;
	char err[BENCH_ERROR_MAX];

	if (bench_qemu_plugin_parse(text, &p, err, sizeof(err)) < 0)
		bad_flag("--qemu", err);
	for (size_t i = 0; i < args->nqemu; i++) {
		if (strcmp(args->qemu[i].label, p.label) == 0) {
			bench_plugin_clear(&p);
			return;
		}
	}
	args->qemu = grow(args->qemu, args->nqemu, sizeof(p));
	args->qemu[args->nqemu++] = p;
}

static void set_format(struct args *args, enum bench_format format, const char *flag)
{
	if (args->format_flag && args->format != format) {
		fprintf(stderr, "lmt-bench: %s and %s: choose one output format\n",
		        args->format_flag, flag);
		exit(2);
	}
	args->format = format;
	args->format_flag = flag;
}

static void set_plot(struct args *args, const char *path)
{
	size_t len = strlen(path);

	if (len < 5 || (strcasecmp(path + len - 4, ".svg") && strcasecmp(path + len - 4, ".png")))
		bad_arg("--plot", "a file name ending in .svg or .png", path);
	args->plot = path;
}

static void apply_flag(struct args *args, int flag, const char *value)
{
	struct bench_config *cfg = &args->cfg;
	char err[BENCH_ERROR_MAX];

	switch (flag) {
	case 'p':
		if (strchr(value, ',') && !strchr(value, ':'))
			bad_arg("--plugin",
			        "one plugin, NAME or NAME:KEY=VALUE,... (--plugins "
			        "takes a list)",
			        value);
		add_entry(args, "--plugin", value, value, ',');
		break;
	case 'P':
		add_plugin_list(args, value);
		break;
	case 'S':
		add_sweep(args, value);
		break;
	case 'r':
		cfg->ram_bytes = arg_number(&ram_flag, value);
		break;
	case 'd':
		cfg->dirty_rate = arg_rate(value);
		break;
	case 'w':
		cfg->working_set = arg_number(&working_set_flag, value);
		break;
	case 'z':
		if (parse_fraction(value, &cfg->zero_fraction) < 0)
			bad_arg("--zero-fraction", "a fraction from 0 to 1 such as 0.5", value);
		args->zero_fraction_given = true;
		break;
	case 'K':
		args->content_text = value;
		break;
	case 'J':
		if (guest_dirty_pattern_parse(value, &cfg->pattern, err, sizeof(err)) < 0)
			bad_flag("--dirty-pattern", err);
		break;
	case 'I':
		args->content_file = value;
		break;
	case 'o':
		append_options(args, value);
		break;
	case 'A':
		append_options(args, "auto-converge=on");
		break;
	case 'a':
		cfg->postcopy = true;
		cfg->postcopy_after = (uint32_t)arg_number(&postcopy_after_flag, value);
		break;
	case 'n':
		args->repeat = (unsigned)arg_number(&repeat_flag, value);
		break;
	case 's':
		cfg->seed = arg_number(&seed_flag, value);
		break;
	case 't':
		cfg->timeout_ns = arg_number(&timeout_flag, value);
		if (cfg->timeout_ns == 0)
			bad_arg("--timeout", "a duration longer than 0 such as 120s or 5m", value);
		break;
	case 'q':
		cfg->port = (uint16_t)arg_number(&port_flag, value);
		break;
	case 'G':
		set_plot(args, value);
		break;
	case 'Q':
		add_qemu(args, value);
		break;
	case 'U':
		args->qemu_binary = value;
		break;
	case 'V':
		if (bench_qemu_accel_parse(value, &args->qemu_accel) < 0)
			bad_arg("--qemu-accel", "auto, kvm or tcg", value);
		break;
	case 'T':
		if (strcmp(value, "local") == 0 || strcmp(value, "local:anonymous") == 0) {
			cfg->local = true;
			cfg->local_anonymous = value[5] != '\0';
			break;
		}
		if (strncmp(value, "file:", 5) != 0 || !value[5])
			bad_arg("--target",
			        "file:DIR (a directory to save the guest in), local or "
			        "local:anonymous",
			        value);
		cfg->target_dir = value + 5;
		break;
	}
}

static void apply_switch(struct args *args, int flag)
{
	switch (flag) {
	case 'F':
		args->cfg.prefault = false;
		break;
	case 'H':
		args->cfg.thp = false;
		break;
	case 'j':
		set_format(args, BENCH_FORMAT_JSON, "--json");
		break;
	case 'c':
		set_format(args, BENCH_FORMAT_CSV, "--csv");
		break;
	case 'D':
		args->dry_run = true;
		break;
	case 'X':
		args->cfg.test_corrupt = true;
		break;
	case 'Y':
		args->yardsticks = true;
		break;
	case 'C':
		args->cfg.postcopy = true;
		break;
	case 'W':
		args->cfg.wake_probe = true;
		break;
	}
}

static void check_sizes(struct bench_config *cfg, const char *ram_text, const char *ws_text)
{
	if (cfg->ram_bytes == 0 || cfg->ram_bytes % GUEST_PAGE_SIZE != 0)
		bad_arg("--ram", "a size such as 256M or 2G, a multiple of 4K", ram_text);
	if (!ws_text) {
		cfg->working_set = cfg->ram_bytes;
		return;
	}
	if (cfg->working_set == 0 || cfg->working_set % GUEST_PAGE_SIZE != 0 ||
	    cfg->working_set > cfg->ram_bytes)
		bad_arg("--working-set", "a multiple of 4K no larger than --ram", ws_text);
}

/* --postcopy becomes the options both sides need; postcopy-after=0 is
 * lmt's default, the bench then switching by itself. */
static void check_postcopy(struct args *args)
{
	char text[64];

	if (!args->cfg.postcopy)
		return;
	if (args->cfg.target_dir || args->cfg.local)
		usage_error("--postcopy migrates to a forked destination: not with --target");
	append_options(args, "postcopy=on");
	if (args->cfg.postcopy_after > 0) {
		snprintf(text, sizeof(text), "postcopy-after=%u",
		         (unsigned)args->cfg.postcopy_after);
		append_options(args, text);
	}
}

/* QEMU's rows migrate a forked pair of QEMU processes, with max-bandwidth
 * and downtime-limit from -o alone. */
static void check_qemu(struct args *args)
{
	char err[BENCH_ERROR_MAX];

	if ((args->qemu_binary || args->qemu_accel != BENCH_QEMU_AUTO) && !args->nqemu)
		usage_error("--qemu-binary and --qemu-accel go with --qemu");
	if (args->no_plugins && !args->nqemu)
		usage_error("--plugins none leaves no rows: add --qemu");
	if (args->no_plugins && args->nentries)
		usage_error("--plugins none and plugin entries: choose one");
	if (!args->nqemu)
		return;
	if (bench_qemu_check_config(&args->cfg, args->sweeps, args->nsweeps, err, sizeof(err)) < 0)
		usage_error(err);
}

/* --content, with --zero-fraction only for random. */
static void check_content(struct args *args)
{
	const char *text = args->content_text ? args->content_text : "random";
	char err[BENCH_ERROR_MAX];

	if (guest_profile_parse(text, args->cfg.zero_fraction, &args->profile, err, sizeof(err)) <
	    0)
		bad_flag("--content", err);
	if (args->profile.kind != GUEST_CONTENT_RANDOM && args->zero_fraction_given)
		usage_error("--zero-fraction sets the zero pages of --content random; with "
		            "--content mixed, give mixed:zero=PERCENT");
	args->cfg.zero_fraction = args->profile.share[GUEST_PAGE_ZERO] / 100.0;
}

static void parse_args(int argc, char **argv, struct args *args)
{
	static const struct option longopts[] = {
	        {"plugin", required_argument, NULL, 'p'},
	        {"plugins", required_argument, NULL, 'P'},
	        {"sweep", required_argument, NULL, 'S'},
	        {"ram", required_argument, NULL, 'r'},
	        {"dirty-rate", required_argument, NULL, 'd'},
	        {"working-set", required_argument, NULL, 'w'},
	        {"zero-fraction", required_argument, NULL, 'z'},
	        {"options", required_argument, NULL, 'o'},
	        {"repeat", required_argument, NULL, 'n'},
	        {"seed", required_argument, NULL, 's'},
	        {"timeout", required_argument, NULL, 't'},
	        {"port", required_argument, NULL, 'q'},
	        {"plot", required_argument, NULL, 'G'},
	        {"target", required_argument, NULL, 'T'},
	        {"no-prefault", no_argument, NULL, 'F'},
	        {"no-thp", no_argument, NULL, 'H'},
	        {"json", no_argument, NULL, 'j'},
	        {"csv", no_argument, NULL, 'c'},
	        {"dry-run", no_argument, NULL, 'D'},
	        {"yardsticks", no_argument, NULL, 'Y'},
	        {"test-corrupt", no_argument, NULL, 'X'},
	        {"auto-converge", no_argument, NULL, 'A'},
	        {"postcopy", no_argument, NULL, 'C'},
	        {"wake-probe", no_argument, NULL, 'W'},
	        {"postcopy-after", required_argument, NULL, 'a'},
	        {"content", required_argument, NULL, 'K'},
	        {"dirty-pattern", required_argument, NULL, 'J'},
	        {"content-file", required_argument, NULL, 'I'},
	        {"qemu", optional_argument, NULL, 'Q'},
	        {"qemu-binary", required_argument, NULL, 'U'},
	        {"qemu-accel", required_argument, NULL, 'V'},
	        {"help", no_argument, NULL, 'h'},
	        {NULL, 0, NULL, 0},
	};
	const char *ram_text = "256M", *ws_text = NULL;
	int c;

	args->cfg.ram_bytes = DEFAULT_RAM;
	args->cfg.seed = 1;
	args->cfg.timeout_ns = DEFAULT_TIMEOUT_NS;
	args->cfg.prefault = true;
	args->cfg.thp = true;
	args->cfg.postcopy_after = 1;
	args->repeat = 1;
	while ((c = getopt_long(argc, argv, "o:h", longopts, NULL)) != -1) {
		if (c == 'h') {
			bench_usage(stdout, DEFAULT_RAM, DEFAULT_TIMEOUT_NS);
			exit(0);
		} else if (c == '?') {
			usage_error("see --help for the flags");
		} else if (c == 'A' || c == 'Q') {
			apply_flag(args, c, c == 'Q' ? optarg : NULL);
		} else if (strchr("FHjcDXYCW", c)) {
			apply_switch(args, c);
		} else {
			ram_text = c == 'r' ? optarg : ram_text;
			ws_text = c == 'w' ? optarg : ws_text;
			apply_flag(args, c, optarg);
		}
	}
	if (optind < argc) {
		fprintf(stderr, "lmt-bench: unexpected argument '%s' (see --help)\n", argv[optind]);
		exit(2);
	}
	check_sizes(&args->cfg, ram_text, ws_text);
	check_postcopy(args);
	check_content(args);
	check_qemu(args);
}

static void args_free(struct args *args)
{
	for (size_t i = 0; i < args->nentries; i++)
		bench_plugin_clear(&args->entries[i].plugin);
	free(args->entries);
	for (size_t i = 0; i < args->nsweeps; i++)
		bench_sweep_clear(&args->sweeps[i]);
	free(args->sweeps);
	free(args->options);
	for (size_t i = 0; i < args->nqemu; i++)
		bench_plugin_clear(&args->qemu[i]);
	free(args->qemu);
}

/* ---- Plugins ------------------------------------------------------------ */

static bool same_plugin(const struct bench_plugin *a, const struct bench_plugin *b)
{
	const char *ao = a->options ? a->options : "", *bo = b->options ? b->options : "";

	return strcmp(a->name, b->name) == 0 && strcmp(ao, bo) == 0;
}

/* Takes `p` over, or frees it when the same plugin is there already. */
static void plugins_add(struct plugins *list, struct bench_plugin *p)
{
	for (size_t i = 0; i < list->count; i++) {
		if (same_plugin(&list->items[i], p)) {
			bench_plugin_clear(p);
			return;
		}
	}
	list->items = grow(list->items, list->count, sizeof(*p));
	list->items[list->count++] = *p;
	memset(p, 0, sizeof(*p));
}

static void plugins_free(struct plugins *list)
{
	for (size_t i = 0; i < list->count; i++)
		bench_plugin_clear(&list->items[i]);
	free(list->items);
}

static void visit_plugin(void *opaque, const char *path, const lmt_plugin_handle *plugin,
                         const struct lmt_error *err)
{
	const struct lmt_plugin *desc;
	struct bench_plugin p = {.discovered = true};

	if (!plugin) {
		fprintf(stderr, "lmt-bench: skipping %s: %s\n", path,
		        err && err->message[0] ? err->message : "failed to load");
		return;
	}
	desc = lmt_plugin_descriptor(plugin);
	/* A decorator needs a plugin to wrap; name it explicitly to bench it.
	 * A storage plugin has no peer to migrate to: --target file:DIR. */
	if (desc->caps & (LMT_CAP_DECORATOR | LMT_CAP_STORAGE))
		return;
	p.name = xstrdup(desc->name);
	p.label = xstrdup(desc->name);
	plugins_add(opaque, &p);
}

/* The entries in the order given, 'all' standing for what the search path
 * holds; no entries at all means 'all'. */
/* A plugin named for a row must suit the target: a storage plugin for
 * --target file:DIR, a transport otherwise. One that does not load is
 * left for the session to name. */
static void check_target(const struct args *args, const struct bench_plugin *p)
{
	lmt_plugin_handle *outer = NULL, *inner = NULL;
	char msg[512];

	if (lmt_plugin_open_spec(p->name, &outer, &inner, NULL) < 0)
		return;
	const struct lmt_plugin *d = lmt_plugin_descriptor(inner ? inner : outer);
	bool storage = d->caps & LMT_CAP_STORAGE;
	lmt_plugin_close(inner);
	lmt_plugin_close(outer);
	if (storage && !args->cfg.target_dir) {
		snprintf(msg, sizeof(msg),
		         "plugin '%s' saves to a file and has no peer to migrate to: add "
		         "--target file:DIR",
		         p->name);
		usage_error(msg);
	}
	if (!storage && args->cfg.target_dir) {
		snprintf(msg, sizeof(msg),
		         "--target file:%s saves to a file: plugin '%s' migrates to a process; "
		         "use --plugin file (the default with --target)",
		         args->cfg.target_dir, p->name);
		usage_error(msg);
	}
}

/* With --target file:DIR and no entries, the file plugin alone. */
static int resolve_plugins(struct args *args, struct plugins *list)
{
	struct entry all = {.all = true}, file = {0};
	struct entry *entries = args->nentries ? args->entries : &all;
	size_t n = args->nentries ? args->nentries : 1;
	char err[256];

	if (!args->nentries && args->cfg.target_dir) {
		if (bench_plugin_parse("file", ',', &file.plugin, err, sizeof(err)) < 0)
			usage_error(err);
		entries = &file;
	}
	for (size_t i = 0; i < n; i++) {
		if (entries[i].all && args->cfg.target_dir)
			usage_error("--target file:DIR: name the storage plugin, not 'all'");
		if (entries[i].all) {
			lmt_plugin_list(visit_plugin, list);
			continue;
		}
		check_target(args, &entries[i].plugin);
		plugins_add(list, &entries[i].plugin);
	}
	return list->count > 0 ? 0 : -1;
}

/* ---- Rows --------------------------------------------------------------- */

/* Create a session with each row's options, as each run will: a bad value
 * is a bad argument, found now rather than after an hour of runs. */
static void check_row_options(const struct bench_row *rows, size_t nrows)
{
	for (size_t i = 0; i < nrows; i++) {
		struct lmt_error err = {0};
		lmt_session *session;
		const char *dot;

		if (rows[i].plugin->qemu)
			continue;
		if (lmt_session_new(&session, LMT_ROLE_SOURCE, rows[i].plugin->name,
		                    rows[i].options, &err) == 0) {
			lmt_session_free(session);
			continue;
		}
		fprintf(stderr, "lmt-bench: row %u (%s): %s\n", rows[i].index, rows[i].label,
		        err.message[0] ? err.message : lmt_strerror(err.code));
		dot = strstr(err.message, ": unknown option");
		if (dot && memchr(err.message, '.', (size_t)(dot - err.message)))
			fprintf(stderr, "lmt-bench: a plugin's own options go with it: "
			                "--plugin NAME:KEY=VALUE\n");
		exit(2);
	}
}

static void print_rows(FILE *out, const struct bench_row *rows, size_t nrows)
{
	for (size_t i = 0; i < nrows; i++)
		fprintf(out, "%u\t%s\t%s\n", rows[i].index, rows[i].label,
		        rows[i].options ? rows[i].options : "");
}

static void skip_plugin(struct bench_row *row, const struct bench_result *result)
{
	row->plugin->unavailable = true;
	row->skipped = true;
	fprintf(stderr, "lmt-bench: skipping %s: it loads but cannot run here: %s\n",
	        row->plugin->name, result->error);
}

/* Run one row `repeat` times and summarize its verified runs. */
static void run_row(struct bench_row *row, const struct args *args,
                    const struct bench_report *report, size_t nrows)
{
	struct bench_config cfg = args->cfg;
	struct bench_figures *verified = calloc(args->repeat, sizeof(*verified));
	char label[1024];

	row->results = calloc(args->repeat, sizeof(*row->results));
	if (!verified || !row->results)
		out_of_memory();
	cfg.options = row->options;
	cfg.label = label;
	for (unsigned i = 0; i < args->repeat; i++) {
		struct bench_result *r = &row->results[i];

		if (args->repeat > 1)
			snprintf(label, sizeof(label), "[%u/%zu] %s (run %u/%u)", row->index, nrows,
			         row->label, i + 1, args->repeat);
		else
			snprintf(label, sizeof(label), "[%u/%zu] %s", row->index, nrows,
			         row->label);
		if (row->plugin->qemu)
			bench_qemu_run(&cfg, report->qemu, &row->plugin->qemu_spec, r);
		else
			bench_run(&cfg, row->plugin->name, r);
		row->runs++;
		if (r->unavailable && row->plugin->discovered) {
			skip_plugin(row, r);
			break;
		}
		if (r->ok)
			bench_figures_of(r, report->memcpy_gibps, row->plugin->yardstick_gbps,
			                 &verified[row->verified_runs++]);
		else if (args->format != BENCH_FORMAT_TABLE)
			fprintf(stderr, "lmt-bench: %s: run %u: %s\n", row->label, i + 1, r->error);
	}
	if (row->verified_runs > 0)
		bench_figures_summarize(verified, row->verified_runs, &row->median, &row->min,
		                        &row->max);
	free(verified);
}

static void release_results(struct bench_row *row)
{
	for (unsigned r = 0; r < row->runs; r++)
		bench_result_clear(&row->results[r]);
}

/* Returns how many rows failed; -1 when none could run. */
static int run_rows(struct bench_row *rows, size_t nrows, const struct args *args,
                    const struct bench_report *report)
{
	int failed = 0;
	bool ran = false;

	bench_output_begin(report);
	for (size_t i = 0; i < nrows; i++) {
		struct bench_row *row = &rows[i];

		row->skipped = row->plugin->unavailable;
		if (!row->skipped)
			run_row(row, args, report, nrows);
		if (!row->skipped) {
			bench_output_row(report, row);
			ran = true;
			failed += row->verified_runs < row->runs;
		}
		release_results(row);
	}
	return ran ? failed : -1;
}

static int table_plugin_width(const struct bench_row *rows, size_t nrows)
{
	size_t width = strlen("plugin");

	for (size_t i = 0; i < nrows; i++) {
		size_t len = strlen(rows[i].plugin->label);

		width = len > width ? len : width;
	}
	return width > 200 ? 200 : (int)width;
}

/* ---- Main --------------------------------------------------------------- */

/* Transport libraries may log to stdout (UCX does): keep the real stdout
 * for the table, JSON or CSV, and give them stderr instead. */
static FILE *claim_stdout(void)
{
	int fd = fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 3);
	FILE *out = fd >= 0 ? fdopen(fd, "w") : NULL;

	if (!out) {
		if (fd >= 0)
			close(fd);
		return stdout;
	}
	fflush(stdout);
	dup2(STDERR_FILENO, STDOUT_FILENO);
	return out;
}

static int release_stdout(FILE *out)
{
	bool failed = ferror(out) != 0;

	if (out != stdout)
		failed = fclose(out) != 0 || failed;
	else
		failed = fflush(out) != 0 || failed;
	if (failed)
		fprintf(stderr, "lmt-bench: writing the output failed\n");
	return failed ? 1 : 0;
}

static int bench(FILE *out, struct args *args, struct plugins *plugins, struct bench_row *rows,
                 size_t nrows, const struct bench_qemu_env *qemu)
{
	struct bench_report report = {
	        .out = out,
	        .cfg = &args->cfg,
	        .common_options = args->options,
	        .format = args->format,
	        .repeat = args->repeat,
	        .sweeping = args->nsweeps > 0,
	        .yardsticks = args->yardsticks,
	        .plugins = plugins->items,
	        .nplugins = plugins->count,
	        .plugin_width = table_plugin_width(rows, nrows),
	        .qemu = qemu,
	};
	int failed, plot = 0;

	/* A handover copies nothing: no memcpy to hold it to (and no two
	 * buffers of the guest's size to allocate). */
	if (!args->cfg.local || args->cfg.local_anonymous)
		report.memcpy_gibps = bench_memcpy_gibps(args->cfg.ram_bytes, args->cfg.thp);
	bench_compression_measure(args->cfg.content, args->cfg.ram_bytes, args->cfg.seed,
	                          &report.compression);
	if (args->yardsticks)
		bench_yardsticks(plugins->items, plugins->count);
	if (args->plot && !bench_plot_available())
		fprintf(stderr,
		        "lmt-bench: --plot: gnuplot is not on PATH; %s will not be drawn "
		        "(Debian: apt-get install gnuplot-nox)\n",
		        args->plot);
	failed = run_rows(rows, nrows, args, &report);
	if (failed < 0) {
		fprintf(stderr, "lmt-bench: no plugin could run here\n");
		return 1;
	}
	if (args->plot && bench_plot_available())
		plot = bench_plot(args->plot, &report, rows, nrows);
	return failed > 0 || plot < 0 ? 1 : 0;
}

/* ofi_rxm preposts FI_OFI_RXM_MSG_RX_SIZE receive buffers (default 128)
 * of FI_OFI_RXM_BUFFER_SIZE bytes (16 KiB) on every connection it makes,
 * for messages lmt never sends through it (writes are RMA, control has
 * its own connection); with 64 of 1 KiB, setting a channel up over
 * tcp;ofi_rxm took a fraction of the time (docs/ofi.md).
 * libfabric 1.17 takes this only from the environment, read once at its
 * first fi_getinfo, and a library must leave a VMM's environment alone, so
 * lmt-bench sets it for its own process, before any plugin is loaded,
 * unless the user chose a value (docs/ofi.md). */
static void tune_libfabric(void)
{
	setenv("FI_OFI_RXM_MSG_RX_SIZE", "64", 0);
	setenv("FI_OFI_RXM_BUFFER_SIZE", "1024", 0);
}

/* The pools of a mixed guest are read once, before any destination is
 * forked; --content-file writes the image and ends here. */
static void load_content(struct args *args, struct guest_content *content)
{
	char err[BENCH_ERROR_MAX];

	if (guest_content_load(content, &args->profile, err, sizeof(err)) < 0) {
		fprintf(stderr, "lmt-bench: %s\n", err);
		exit(1);
	}
	args->cfg.content = content;
	if (!args->content_file)
		return;
	if (bench_content_file(args->content_file, &args->cfg, err, sizeof(err)) < 0) {
		fprintf(stderr, "lmt-bench: %s\n", err);
		exit(1);
	}
	char size[32];
	bench_format(LMT_OPT_SIZE, args->cfg.ram_bytes, size, sizeof(size));
	printf("wrote %s: %s of guest RAM, seed %llu, ", args->content_file, size,
	       (unsigned long long)args->cfg.seed);
	bench_content_describe(stdout, &args->cfg);
	printf("\n");
	for (int k = 0; k < GUEST_PAGE_CLASSES; k++)
		if (content->pool[k].npages)
			printf("%s pages from: %s\n", guest_page_class_name(k),
			       content->pool[k].source);
	guest_content_free(content);
	args_free(args);
	exit(fflush(stdout) == 0 ? 0 : 1);
}

int main(int argc, char **argv)
{
	struct args args = {0};
	struct guest_content content;
	struct plugins plugins = {0};
	struct bench_row *rows = NULL;
	size_t nrows = 0;
	char err[BENCH_ERROR_MAX];
	struct bench_qemu_env qemu;
	bool qemu_ready = false;
	FILE *out;
	int rc;

	tune_libfabric();
	parse_args(argc, argv, &args);
	load_content(&args, &content);
	out = claim_stdout();
	/* The progress line is for a person watching the output. */
	args.cfg.progress = isatty(fileno(out)) ? out : NULL;
	/* A peer that dies must end a run with an error, not end lmt-bench. */
	signal(SIGPIPE, SIG_IGN);
	if (!args.no_plugins && resolve_plugins(&args, &plugins) < 0) {
		fprintf(stderr, "lmt-bench: no plugins found (see lmt-info --search-path)\n");
		args_free(&args);
		return 1;
	}
	if (plugins.count &&
	    (bench_check_conflicts(args.sweeps, args.nsweeps, args.options, plugins.items,
	                           plugins.count, err, sizeof(err)) < 0 ||
	     bench_rows_build(plugins.items, plugins.count, args.sweeps, args.nsweeps, args.options,
	                      &rows, &nrows, err, sizeof(err)) < 0))
		usage_error(err);
	check_row_options(rows, nrows);
	if (args.nqemu && !args.dry_run) {
		if (bench_qemu_env_init(&qemu, &args.cfg, args.qemu_binary, args.qemu_accel,
		                        args.options, err, sizeof(err)) < 0) {
			fprintf(stderr, "lmt-bench: %s\n", err);
			bench_qemu_env_free(&qemu);
			exit(1);
		}
		qemu_ready = true;
	}
	if (bench_qemu_rows_add(args.qemu, args.nqemu, args.options, args.dry_run ? NULL : &qemu,
	                        &rows, &nrows, err, sizeof(err)) < 0)
		usage_error(err);
	if (args.dry_run) {
		print_rows(out, rows, nrows);
		rc = 0;
	} else {
		rc = bench(out, &args, &plugins, rows, nrows, qemu_ready ? &qemu : NULL);
	}
	if (qemu_ready)
		bench_qemu_env_free(&qemu);
	bench_rows_free(rows, nrows);
	plugins_free(&plugins);
	args_free(&args);
	guest_content_free(&content);
	if (release_stdout(out) != 0)
		return 1;
	return rc;
}
