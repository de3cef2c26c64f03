/* lmt-bench: the figures of a run, their medians, and the three ways rows
 * are written on stdout — a table, one JSON object per row, CSV. */
#define _GNU_SOURCE
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

#define MIB 1048576.0
#define GIB 1073741824.0

/* Each figure's name in JSON and CSV, and its column in the table. */
static const struct {
	const char *key;
	const char *title;
	const char *unit;
	int width;
	int decimals; /* in the table; JSON and CSV keep 4, integers none */
	double table_scale;
	bool integer;
} figures[BENCH_FIGURE_COUNT] = {
        [BENCH_SETUP_MS] = {"setup_ms", "setup", "(ms)", 7, 1, 1, false},
        [BENCH_TOTAL_MS] = {"total_ms", "total", "(ms)", 8, 1, 1, false},
        [BENCH_DOWNTIME_MS] = {"downtime_ms", "downtime", "(ms)", 8, 2, 1, false},
        [BENCH_GBPS] = {"throughput_gbps", "throughput", "(Gb/s)", 10, 2, 1, false},
        [BENCH_GIBPS] = {"throughput_gibps", "throughput", "(GiB/s)", 10, 2, 1, false},
        [BENCH_MEMCPY_PERCENT] = {"memcpy_percent", "of memcpy", "(%)", 9, 1, 1, false},
        [BENCH_YARDSTICK_PERCENT] = {"yardstick_percent", "of own bench", "(%)", 12, 1, 1, false},
        [BENCH_BYTES_SENT] = {"bytes_sent", "sent", "(MiB)", 8, 1, 1 / MIB, true},
        [BENCH_ZERO_PAGES] = {"zero_pages", "zero", "(pages)", 8, 0, 1, true},
        [BENCH_ZERO_RUN_BYTES] = {"zero_run_bytes", "zero runs", "(KiB)", 9, 1, 1 / 1024.0,
                                  true},
        [BENCH_PASS_COUNT] = {"pass_count", "passes", "(count)", 7, 0, 1, true},
        [BENCH_PREFAULT_MS] = {"prefault_ms", "prefault", "(ms)", 8, 1, 1, false},
        [BENCH_MAX_ITERATE_MS] = {"max_iterate_ms", "max iter", "(ms)", 8, 1, 1, false},
        [BENCH_MAX_ITERATE_RUNQ_MS] = {"max_iterate_runq_ms", "iter runq", "(ms)", 9, 1, 1, false},
        [BENCH_WAKE_LATE_MS] = {"wake_late_ms", "wake late", "(ms)", 9, 1, 1, false},
        [BENCH_THROTTLE_PERCENT] = {"throttle_percent", "throttle", "(%)", 8, 0, 1, true},
        [BENCH_FILE_MIB] = {"file_bytes", "file", "(MiB)", 8, 1, 1 / MIB, true},
        [BENCH_RESTORE_MS] = {"restore_ms", "restore", "(ms)", 8, 1, 1, false},
        [BENCH_RESTORE_GIBPS] = {"restore_gibps", "restore", "(GiB/s)", 8, 2, 1, false},
        [BENCH_LAZY_RESUME_MS] = {"lazy_resume_ms", "lazy resume", "(ms)", 11, 2, 1, false},
        [BENCH_LAZY_RESTORE_MS] = {"lazy_restore_ms", "lazy total", "(ms)", 10, 1, 1, false},
        [BENCH_LAZY_FAULTS] = {"lazy_faults", "faults", "(count)", 7, 0, 1, true},
        [BENCH_LAZY_FAULT_P99_MS] = {"lazy_fault_p99_ms", "fault p99", "(ms)", 9, 3, 1, false},
        [BENCH_PAUSE_TO_RESUME_MS] = {"pause_to_resume_ms", "to resume", "(ms)", 9, 2, 1, false},
        [BENCH_FAULTS] = {"faults", "faults", "(count)", 7, 0, 1, true},
        [BENCH_FAULT_P50_MS] = {"fault_p50_ms", "fault p50", "(ms)", 9, 3, 1, false},
        [BENCH_FAULT_P99_MS] = {"fault_p99_ms", "fault p99", "(ms)", 9, 3, 1, false},
        [BENCH_FAULT_MAX_MS] = {"fault_max_ms", "fault max", "(ms)", 9, 3, 1, false},
        [BENCH_BACKGROUND_PAGES] = {"background_pages", "background", "(pages)", 10, 0, 1, true},
        [BENCH_POSTCOPY_PAGES] = {"postcopy_pages", "postcopy", "(pages)", 8, 0, 1, true},
        [BENCH_DIRTIED_MIBPS] = {"dirtied_mibps", "dirtied", "(MiB/s)", 8, 1, 1, false},
        [BENCH_QEMU_TRANSFERRED] = {"qemu_ram_transferred", "ram.xfer", "(MiB)", 9, 1, 1 / MIB,
                                    true},
        [BENCH_QEMU_MULTIFD_BYTES] = {"qemu_multifd_bytes", "multifd", "(MiB)", 8, 1, 1 / MIB,
                                      true},
        [BENCH_QEMU_WIRE_BYTES] = {"qemu_wire_bytes", "wire", "(MiB)", 8, 1, 1 / MIB, true},
};

static const char *const suffixes[3] = {"", "_min", "_max"};

/* ---- Figures ------------------------------------------------------------ */

void bench_format(enum lmt_option_type type, uint64_t value, char *buf, size_t size)
{
	const struct lmt_option_desc desc = {.name = "value", .type = type};
	const struct lmt_option_value v = {.type = type, .integer = (int64_t)value};

	if (lmt_option_format(&desc, &v, buf, size) != 0)
		snprintf(buf, size, "%llu", (unsigned long long)value);
}

/* `text` as a JSON string, quotes included; NULL as null. */
static void json_string(FILE *f, const char *text)
{
	if (!text) {
		fputs("null", f);
		return;
	}
	fputc('"', f);
	for (const unsigned char *c = (const unsigned char *)text; *c; c++) {
		if (*c == '"' || *c == '\\')
			fprintf(f, "\\%c", *c);
		else if (*c == '\n')
			fputs("\\n", f);
		else if (*c < 0x20)
			fprintf(f, "\\u%04x", *c);
		else
			fputc(*c, f);
	}
	fputc('"', f);
}

void bench_json_write_string(FILE *f, const char *text)
{
	json_string(f, text);
}

/* `text` as a CSV field, quoted when it holds a comma, quote or newline. */
static void csv_string(FILE *f, const char *text)
{
	if (!text[strcspn(text, ",\"\r\n")]) {
		fputs(text, f);
		return;
	}
	fputc('"', f);
	for (const char *c = text; *c; c++) {
		if (*c == '"')
			fputc('"', f);
		fputc(*c, f);
	}
	fputc('"', f);
}

void bench_figures_of(const struct bench_result *r, double memcpy_gibps, double yardstick_gbps,
                      struct bench_figures *out)
{
	const struct lmt_stats *s = &r->stats;
	double total_ns = (double)s->total_ns;
	double *v = out->v;

	v[BENCH_SETUP_MS] = (double)s->setup_ns / 1e6;
	v[BENCH_TOTAL_MS] = total_ns / 1e6;
	v[BENCH_DOWNTIME_MS] = (double)s->downtime_ns / 1e6;
	/* Bits per nanosecond are Gb/s. */
	v[BENCH_GBPS] = total_ns > 0 ? (double)s->bytes_sent * 8.0 / total_ns : 0.0;
	v[BENCH_GIBPS] = total_ns > 0 ? (double)s->bytes_sent / total_ns * 1e9 / GIB : 0.0;
	v[BENCH_MEMCPY_PERCENT] = memcpy_gibps > 0 ? 100.0 * v[BENCH_GIBPS] / memcpy_gibps : NAN;
	v[BENCH_YARDSTICK_PERCENT] =
	        yardstick_gbps > 0 ? 100.0 * v[BENCH_GBPS] / yardstick_gbps : NAN;
	v[BENCH_BYTES_SENT] = (double)s->bytes_sent;
	v[BENCH_ZERO_PAGES] = (double)s->zero_pages;
	v[BENCH_ZERO_RUN_BYTES] = (double)s->zero_run_bytes;
	v[BENCH_PASS_COUNT] = (double)s->passes;
	v[BENCH_PREFAULT_MS] = r->prefaulted ? (double)r->prefault_ns / 1e6 : NAN;
	v[BENCH_MAX_ITERATE_MS] = r->max_iterate_ns ? (double)r->max_iterate_ns / 1e6 : NAN;
	v[BENCH_MAX_ITERATE_RUNQ_MS] = r->max_iterate_ns && r->max_iterate_runq_known
	                                       ? (double)r->max_iterate_runq_ns / 1e6
	                                       : NAN;
	v[BENCH_WAKE_LATE_MS] = r->wake_probed ? (double)r->wake_late_max_ns / 1e6 : NAN;
	/* auto-converge's last throttle: it only grows until the end. */
	uint32_t throttle = 0;
	for (uint32_t i = 0; i < r->npasses; i++)
		if (r->passes[i].throttle_percent > throttle)
			throttle = r->passes[i].throttle_percent;
	v[BENCH_THROTTLE_PERCENT] = throttle;
	v[BENCH_FILE_MIB] = r->to_file ? (double)r->file_bytes : NAN;
	v[BENCH_RESTORE_MS] = r->to_file ? (double)r->restore_ns / 1e6 : NAN;
	v[BENCH_RESTORE_GIBPS] =
	        r->to_file && r->restore_ns
	                ? (double)r->restored_bytes / (double)r->restore_ns * 1e9 / GIB
	                : NAN;
	v[BENCH_LAZY_RESUME_MS] = r->lazy_ran ? (double)r->lazy_resume_ns / 1e6 : NAN;
	v[BENCH_LAZY_RESTORE_MS] = r->lazy_ran ? (double)r->lazy_restore_ns / 1e6 : NAN;
	v[BENCH_LAZY_FAULTS] = r->lazy_ran ? (double)r->lazy_faults : NAN;
	v[BENCH_LAZY_FAULT_P99_MS] = r->lazy_ran ? (double)r->lazy_fault_p99_ns / 1e6 : NAN;
	const struct bench_postcopy *pc = &r->postcopy;
	bool postcopy = r->postcopy_ran;
	v[BENCH_PAUSE_TO_RESUME_MS] = postcopy ? (double)pc->pause_to_resume_ns / 1e6 : NAN;
	v[BENCH_FAULTS] = postcopy ? (double)pc->faults : NAN;
	v[BENCH_FAULT_P50_MS] = postcopy ? (double)pc->fault_p50_ns / 1e6 : NAN;
	v[BENCH_FAULT_P99_MS] = postcopy ? (double)pc->fault_p99_ns / 1e6 : NAN;
	v[BENCH_FAULT_MAX_MS] = postcopy ? (double)pc->fault_max_ns / 1e6 : NAN;
	v[BENCH_BACKGROUND_PAGES] = postcopy ? (double)pc->background_pages : NAN;
	v[BENCH_POSTCOPY_PAGES] = postcopy ? (double)pc->postcopy_pages : NAN;
	/* The rate the guest's workload reached while it ran. */
	v[BENCH_DIRTIED_MIBPS] =
	        r->workload_ns ? (double)r->dirtied_bytes / MIB / ((double)r->workload_ns / 1e9)
	                       : NAN;
	bool qemu = r->qemu_ran && r->qemu;
	v[BENCH_QEMU_TRANSFERRED] = qemu ? (double)r->qemu->transferred : NAN;
	v[BENCH_QEMU_MULTIFD_BYTES] = qemu ? (double)r->qemu->multifd_bytes : NAN;
	v[BENCH_QEMU_WIRE_BYTES] = qemu && r->qemu->wire_known ? (double)r->qemu->wire_bytes : NAN;
	/* lmt's passes, zero runs and throttle have no like in QEMU's
	 * figures. */
	if (r->qemu_ran) {
		v[BENCH_PASS_COUNT] = NAN;
		v[BENCH_ZERO_RUN_BYTES] = NAN;
		v[BENCH_THROTTLE_PERCENT] = NAN;
	}
}

void bench_figures_summarize(const struct bench_figures *runs, size_t n,
                             struct bench_figures *median, struct bench_figures *min,
                             struct bench_figures *max)
{
	double *values = malloc(n * sizeof(*values));

	for (int k = 0; k < BENCH_FIGURE_COUNT; k++) {
		if (!values) {
			median->v[k] = min->v[k] = max->v[k] = NAN;
			continue;
		}
		for (size_t i = 0; i < n; i++)
			values[i] = runs[i].v[k];
		/* A figure is measured in every run or in none. */
		median->v[k] = bench_median(values, n);
		min->v[k] = values[0];
		max->v[k] = values[n - 1];
	}
	free(values);
}

static const struct bench_figures *figure_set(const struct bench_row *row, int which)
{
	if (row->verified_runs == 0)
		return NULL;
	return which == 0 ? &row->median : which == 1 ? &row->min : &row->max;
}

static bool row_ok(const struct bench_row *row)
{
	return row->runs > 0 && row->verified_runs == row->runs;
}

static const char *first_error(const struct bench_row *row, unsigned *run)
{
	for (unsigned i = 0; i < row->runs; i++) {
		if (!row->results[i].ok) {
			*run = i + 1;
			return row->results[i].error[0] ? row->results[i].error : "failed";
		}
	}
	return NULL;
}

/* ---- Table -------------------------------------------------------------- */

typedef char cell[48];

/* The postcopy figures exist only with --postcopy, and the wake probe's
 * only with --wake-probe, in every format: a run without them prints
 * what it printed before they were added. */
static bool written(const struct bench_report *rep, int figure)
{
	if (figure == BENCH_WAKE_LATE_MS)
		return rep->cfg->wake_probe;
	if (figure == BENCH_DIRTIED_MIBPS)
		return rep->cfg->dirty_rate > 0;
	if (figure >= BENCH_QEMU_TRANSFERRED && figure <= BENCH_QEMU_WIRE_BYTES)
		return rep->qemu != NULL;
	return figure < BENCH_PAUSE_TO_RESUME_MS || rep->cfg->postcopy;
}

static bool shown(const struct bench_report *rep, int figure)
{
	/* QEMU's ram.transferred is its rows' "sent" already. */
	if (figure == BENCH_QEMU_TRANSFERRED)
		return false;
	if (figure >= BENCH_FILE_MIB && figure <= BENCH_LAZY_FAULT_P99_MS)
		return rep->cfg->target_dir != NULL;
	if (!written(rep, figure))
		return false;
	return figure != BENCH_YARDSTICK_PERCENT || rep->yardsticks;
}

static void print_cell(FILE *f, const char *text, int width, bool first)
{
	fprintf(f, "%s%*s", first ? "" : "  ", width, text);
}

static void print_line(const struct bench_report *rep, const char *plugin, const char *stat,
                       const char *result, const struct bench_figures *set, const char *config)
{
	FILE *f = rep->out;
	cell c;

	print_cell(f, plugin, -rep->plugin_width, true);
	if (rep->repeat > 1)
		print_cell(f, stat, -6, false);
	print_cell(f, result, -11, false);
	for (int k = 0; k < BENCH_FIGURE_COUNT; k++) {
		if (!shown(rep, k))
			continue;
		if (!set || isnan(set->v[k]))
			snprintf(c, sizeof(c), "-");
		else
			snprintf(c, sizeof(c), "%.*f", figures[k].decimals,
			         set->v[k] * figures[k].table_scale);
		print_cell(f, c, figures[k].width, false);
	}
	if (rep->sweeping && config[0]) {
		fprintf(f, "  ");
		for (const char *ch = config; *ch; ch++)
			fputc(*ch == ',' ? ' ' : *ch, f);
	}
	fprintf(f, "\n");
}

static void print_header(const struct bench_report *rep)
{
	FILE *f = rep->out;

	for (int line = 0; line < 2; line++) {
		print_cell(f, line ? "" : "plugin", -rep->plugin_width, true);
		if (rep->repeat > 1)
			print_cell(f, line ? "" : "value", -6, false);
		print_cell(f, line ? "(ok/FAILED)" : "result", -11, false);
		for (int k = 0; k < BENCH_FIGURE_COUNT; k++) {
			if (shown(rep, k))
				print_cell(f, line ? figures[k].unit : figures[k].title,
				           figures[k].width, false);
		}
		if (rep->sweeping)
			fprintf(f, "  %s", line ? "(swept options)" : "config");
		fprintf(f, "\n");
	}
}

/* ", hot: 5% of it (N pages) takes 90% of the writes" */
static void print_pattern(FILE *f, const struct bench_config *cfg)
{
	struct guest_hot_set hot;

	if (!cfg->pattern.hot) {
		fprintf(f, ", uniformly (page after page)\n");
		return;
	}
	guest_hot_set_init(&hot, &cfg->pattern, cfg->working_set / GUEST_PAGE_SIZE, cfg->seed);
	fprintf(f, "; hot: %.4g%% of it (%llu pages, spread over it) takes %.4g%% of the writes\n",
	        cfg->pattern.set_percent, (unsigned long long)hot.hot, cfg->pattern.share_percent);
}

static void print_preamble(const struct bench_report *rep)
{
	const struct bench_config *cfg = rep->cfg;
	FILE *f = rep->out;
	struct guest_ram layout;
	char size[32];

	guest_ram_layout(&layout, NULL, cfg->ram_bytes);
	bench_format(LMT_OPT_SIZE, cfg->ram_bytes, size, sizeof(size));
	fprintf(f, "guest: %s of RAM (", size);
	for (uint32_t i = 0; i < layout.nblocks; i++) {
		bench_format(LMT_OPT_SIZE, layout.blocks[i].length, size, sizeof(size));
		fprintf(f, "%s%s %s", i ? ", " : "", layout.blocks[i].name, size);
	}
	if (cfg->content->profile.kind == GUEST_CONTENT_RANDOM) {
		fprintf(f, "), %.0f%% of its pages zero, seed %llu; ", cfg->zero_fraction * 100.0,
		        (unsigned long long)cfg->seed);
	} else {
		fprintf(f, "), ");
		bench_content_describe(f, cfg);
		fprintf(f, ", seed %llu; ", (unsigned long long)cfg->seed);
	}
	if (cfg->dirty_rate > 0) {
		bench_format(LMT_OPT_SIZE, cfg->dirty_rate, size, sizeof(size));
		fprintf(f, "dirties %s/s ", size);
		bench_format(LMT_OPT_SIZE, cfg->working_set, size, sizeof(size));
		fprintf(f, "of a %s working set", size);
		print_pattern(f, cfg);
	} else {
		fprintf(f, "idle\n");
	}
	bench_content_preamble(f, cfg, &rep->compression);
	bool handover = cfg->local && !cfg->local_anonymous;
	fprintf(f, "options: %s; source RAM %s; destination RAM %s\n",
	        rep->common_options ? rep->common_options : "(defaults)",
	        handover   ? "in a memfd"
	        : cfg->thp ? "on huge pages where granted"
	                   : "on 4 KiB pages",
	        handover        ? "handed over over unix:PATH (not pre-faulted)"
	        : cfg->prefault ? "pre-faulted"
	                        : "not pre-faulted");
	if (cfg->postcopy && cfg->postcopy_after == 0)
		fprintf(f, "postcopy: the switch at once after setup (lmt_save_postcopy)");
	else if (cfg->postcopy)
		fprintf(f, "postcopy: the switch after %u pass%s without converging",
		        (unsigned)cfg->postcopy_after, cfg->postcopy_after == 1 ? "" : "es");
	if (cfg->postcopy)
		fprintf(f, "; the guest's workload then runs on the destination, whose writes "
		           "are checked too\n");
	if (rep->qemu)
		bench_qemu_preamble(f, rep->qemu, cfg);
	if (rep->repeat > 1)
		fprintf(f, "runs: %u per row; median, min and max over the verified runs\n",
		        rep->repeat);
	if (rep->memcpy_gibps > 0)
		fprintf(f, "memcpy yardstick: %.2f GiB/s (%.2f Gb/s; one thread, median of 3)\n",
		        rep->memcpy_gibps, rep->memcpy_gibps * GIB * 8 / 1e9);
	else if (handover)
		fprintf(f, "memcpy yardstick: not measured (a handover copies nothing)\n");
	else
		fprintf(f, "memcpy yardstick: unavailable (not enough memory)\n");
	for (size_t i = 0; i < rep->nplugins; i++) {
		const struct bench_plugin *p = &rep->plugins[i];

		if (p->yardstick_gbps > 0)
			fprintf(f, "%s yardstick: %.2f Gb/s (%s; median of 3)\n", p->label,
			        p->yardstick_gbps, p->yardstick);
	}
	fprintf(f, "\n");
}

static void table_row(const struct bench_report *rep, const struct bench_row *row)
{
	static const char *const stats[3] = {"median", "min", "max"};
	const char *result = row_ok(row) ? "ok" : "FAILED";
	FILE *f = rep->out;
	int lines = rep->repeat > 1 ? 3 : 1;

	for (int i = 0; i < lines; i++)
		print_line(rep, i ? "" : row->plugin->label, stats[i], i ? "" : result,
		           figure_set(row, i), i ? "" : row->config);
	for (unsigned r = 0; r < row->runs; r++) {
		const struct bench_result *res = &row->results[r];

		if (res->ok)
			continue;
		if (rep->repeat > 1)
			fprintf(f, "  run %u: %s\n", r + 1, res->error[0] ? res->error : "failed");
		else
			fprintf(f, "  %s\n", res->error[0] ? res->error : "failed");
	}
}

/* ---- JSON --------------------------------------------------------------- */

static void json_key(FILE *f, const char *key, const char *suffix)
{
	fprintf(f, ",\"%s%s\":", key, suffix);
}

static void json_value(FILE *f, double value, bool integer)
{
	if (isnan(value) || isinf(value))
		fprintf(f, "null");
	else if (integer)
		fprintf(f, "%.0f", value);
	else
		fprintf(f, "%.4f", value);
}

static void json_figures(const struct bench_report *rep, const struct bench_figures *set,
                         const char *suffix)
{
	FILE *f = rep->out;

	for (int k = 0; k < BENCH_FIGURE_COUNT; k++) {
		if (!written(rep, k))
			continue;
		json_key(f, figures[k].key, suffix);
		json_value(f, set ? set->v[k] : NAN, figures[k].integer);
	}
}

static void json_ns_as_ms(FILE *f, const char *key, uint64_t ns)
{
	json_key(f, key, "");
	json_value(f, (double)ns / 1e6, false);
}

static void json_passes(FILE *f, const struct bench_result *r)
{
	fprintf(f, ",\"passes\":[");
	for (uint32_t i = 0; i < r->npasses; i++) {
		const struct lmt_pass_stats *p = &r->passes[i];

		fprintf(f, "%s{\"pass\":%u,\"final\":%s", i ? "," : "", (unsigned)p->pass,
		        p->final ? "true" : "false");
		json_ns_as_ms(f, "start_ms", p->start_ns);
		json_ns_as_ms(f, "duration_ms", p->duration_ns);
		fprintf(f,
		        ",\"bytes\":%llu,\"dirtied_bytes\":%llu,\"dirty_rate_bps\":%llu,"
		        "\"bandwidth_bps\":%llu",
		        (unsigned long long)p->bytes, (unsigned long long)p->dirtied_bytes,
		        (unsigned long long)p->dirty_rate_bps,
		        (unsigned long long)p->bandwidth_bps);
		json_key(f, "expected_downtime_ms", "");
		json_value(f,
		           p->expected_downtime_known ? (double)p->expected_downtime_ns / 1e6 : NAN,
		           false);
		fprintf(f, ",\"interrupted\":%s,\"throttle_percent\":%u,\"zero_pages\":%llu",
		        p->interrupted ? "true" : "false", (unsigned)p->throttle_percent,
		        (unsigned long long)p->zero_pages);
		fprintf(f, "}");
	}
	fprintf(f, "]");
}

/* --postcopy: what the destination's side of the run says. */
static void json_postcopy(FILE *f, const struct bench_result *r)
{
	const struct bench_postcopy *pc = &r->postcopy;

	fprintf(f, ",\"postcopy\":");
	if (!r->postcopy_ran) {
		fprintf(f, "null");
		return;
	}
	fprintf(f, "{\"switched\":%s", pc->switched ? "true" : "false");
	json_ns_as_ms(f, "destination_resume_ms", pc->resume_ns);
	fprintf(f,
	        ",\"destination_written_pages\":%llu,\"destination_dirtied_bytes\":%llu,"
	        "\"requested_pages\":%llu}",
	        (unsigned long long)pc->written_pages, (unsigned long long)pc->dirtied_bytes,
	        (unsigned long long)r->stats.postcopy_requested);
}

/* The guest's content, its dirty pattern and the compression ratios. */
static void json_content(const struct bench_report *rep)
{
	const struct bench_config *cfg = rep->cfg;
	const struct guest_content *c = cfg->content;
	uint64_t pages[GUEST_PAGE_CLASSES];
	char text[256];
	FILE *f = rep->out;

	guest_profile_format(&c->profile, text, sizeof(text));
	fprintf(f, ",\"content\":");
	json_string(f, text);
	bench_content_pages(cfg, pages);
	fprintf(f, ",\"content_pages\":{");
	for (int k = 0; k < GUEST_PAGE_CLASSES; k++)
		fprintf(f, "%s\"%s\":%llu", k ? "," : "", guest_page_class_name(k),
		        (unsigned long long)pages[k]);
	fprintf(f, "},\"content_pools\":{");
	for (int k = 0, n = 0; k < GUEST_PAGE_CLASSES; k++) {
		if (!c->pool[k].npages)
			continue;
		fprintf(f, "%s\"%s\":{\"synthetic\":%s,\"source\":", n++ ? "," : "",
		        guest_page_class_name(k), c->pool[k].synthetic ? "true" : "false");
		json_string(f, c->pool[k].source);
		fprintf(f, "}");
	}
	fprintf(f, "},\"content_pools_checksum\":");
	snprintf(text, sizeof(text), "%016llx", (unsigned long long)c->digest);
	json_string(f, c->profile.kind == GUEST_CONTENT_MIXED ? text : NULL);
	guest_dirty_pattern_format(&cfg->pattern, text, sizeof(text));
	fprintf(f, ",\"dirty_pattern\":");
	json_string(f, text);
	json_key(f, "compression_sample_bytes", "");
	json_value(f, rep->compression.measured ? (double)rep->compression.sampled_bytes : NAN,
	           true);
	for (int z = 0; z < BENCH_COMPRESSORS; z++) {
		json_key(f, bench_compressor_key(z), "");
		json_value(f, rep->compression.measured ? rep->compression.ratio[z] : NAN, false);
	}
}

/* The stats come last: scripts that grep the line for "throughput_bps"
 * greedily find the session's own figure. */
static void json_run(const struct bench_report *rep, const struct bench_row *row,
                     const struct bench_result *r, unsigned run)
{
	struct bench_figures set;
	FILE *f = rep->out;

	bench_figures_of(r, rep->memcpy_gibps, row->plugin->yardstick_gbps, &set);
	fprintf(f, "%s{\"kind\":\"run\",\"run\":%u,\"verified\":%s,\"error\":", run > 1 ? "," : "",
	        run, r->ok ? "true" : "false");
	json_string(f, r->ok ? NULL : (r->error[0] ? r->error : "failed"));
	json_figures(rep, r->have_stats ? &set : NULL, "");
	fprintf(f, ",\"zero_pages_made\":%llu,\"dirtied_bytes\":%llu",
	        (unsigned long long)r->zero_pages_made, (unsigned long long)r->dirtied_bytes);
	if (rep->cfg->postcopy)
		json_postcopy(f, r);
	if (r->qemu_ran && r->qemu)
		bench_qemu_json_run(f, r);
	json_passes(f, r);
	fprintf(f, ",\"stats\":%s}", r->stats_json ? r->stats_json : "null");
}

static void json_row(const struct bench_report *rep, const struct bench_row *row)
{
	const struct bench_config *cfg = rep->cfg;
	FILE *f = rep->out;
	const char *error;
	char *text = NULL;
	unsigned run = 0;

	fprintf(f, "{\"kind\":\"row\",\"row\":%u,\"label\":", row->index);
	json_string(f, row->label);
	fprintf(f, ",\"plugin\":");
	json_string(f, row->plugin->name);
	fprintf(f, ",\"plugin_options\":");
	json_string(f, row->plugin->options ? row->plugin->options : "");
	fprintf(f, ",\"config\":");
	json_string(f, row->config);
	fprintf(f, ",\"options\":");
	json_string(f, row->options ? row->options : "");
	fprintf(f, ",\"status\":\"%s\",\"repeat\":%u,\"verified_runs\":%u",
	        row_ok(row) ? "ok" : "failed", rep->repeat, row->verified_runs);
	fprintf(f, ",\"ram_bytes\":%llu,\"dirty_rate_bps\":%llu,\"working_set_bytes\":%llu",
	        (unsigned long long)cfg->ram_bytes, (unsigned long long)cfg->dirty_rate,
	        (unsigned long long)cfg->working_set);
	fprintf(f, ",\"zero_fraction\":%g,\"seed\":%llu,\"prefault\":%s,\"thp\":%s",
	        cfg->zero_fraction, (unsigned long long)cfg->seed, cfg->prefault ? "true" : "false",
	        cfg->thp ? "true" : "false");
	json_content(rep);
	json_key(f, "memcpy_gibps", "");
	json_value(f, rep->memcpy_gibps > 0 ? rep->memcpy_gibps : NAN, false);
	fprintf(f, ",\"yardstick\":");
	json_string(f, row->plugin->yardstick_gbps > 0 ? row->plugin->yardstick : NULL);
	json_key(f, "yardstick_gbps", "");
	json_value(f, row->plugin->yardstick_gbps > 0 ? row->plugin->yardstick_gbps : NAN, false);
	for (int i = 0; i < 3; i++)
		json_figures(rep, figure_set(row, i), suffixes[i]);
	if (row->plugin->qemu && rep->qemu)
		bench_qemu_json_row(f, rep->qemu);
	error = first_error(row, &run);
	if (error && asprintf(&text, "run %u of %u: %s", run, rep->repeat, error) < 0)
		text = NULL;
	fprintf(f, ",\"error\":");
	json_string(f, error ? (text ? text : error) : NULL);
	free(text);
	fprintf(f, ",\"runs\":[");
	for (unsigned r = 0; r < row->runs; r++)
		json_run(rep, row, &row->results[r], r + 1);
	fprintf(f, "]}\n");
}

/* ---- CSV ---------------------------------------------------------------- */

static void csv_header(const struct bench_report *rep)
{
	FILE *f = rep->out;

	fprintf(f, "row,label,plugin,plugin_options,config,options,status,repeat,verified_runs,"
	           "ram_bytes,dirty_rate_bps,working_set_bytes,zero_fraction,seed,prefault,"
	           "content,dirty_pattern,zstd1_ratio,zstd3_ratio,lz4_ratio,"
	           "memcpy_gibps,yardstick,yardstick_gbps");
	for (int i = 0; i < 3; i++) {
		for (int k = 0; k < BENCH_FIGURE_COUNT; k++)
			if (written(rep, k))
				fprintf(f, ",%s%s", figures[k].key, suffixes[i]);
	}
	fprintf(f, ",error\n");
}

static void csv_value(FILE *f, double value, bool integer)
{
	if (isnan(value) || isinf(value))
		return;
	fprintf(f, integer ? "%.0f" : "%.4f", value);
}

/* content,dirty_pattern,zstd1_ratio,zstd3_ratio,lz4_ratio, */
static void csv_content(const struct bench_report *rep)
{
	char text[256];
	FILE *f = rep->out;

	guest_profile_format(&rep->cfg->content->profile, text, sizeof(text));
	csv_string(f, text);
	fprintf(f, ",");
	guest_dirty_pattern_format(&rep->cfg->pattern, text, sizeof(text));
	csv_string(f, text);
	fprintf(f, ",");
	for (int z = 0; z < BENCH_COMPRESSORS; z++) {
		csv_value(f, rep->compression.measured ? rep->compression.ratio[z] : NAN, false);
		fprintf(f, ",");
	}
}

static void csv_row(const struct bench_report *rep, const struct bench_row *row)
{
	const struct bench_config *cfg = rep->cfg;
	FILE *f = rep->out;
	const char *error;
	unsigned run = 0;

	fprintf(f, "%u,", row->index);
	csv_string(f, row->label);
	fprintf(f, ",");
	csv_string(f, row->plugin->name);
	fprintf(f, ",");
	csv_string(f, row->plugin->options ? row->plugin->options : "");
	fprintf(f, ",");
	csv_string(f, row->config);
	fprintf(f, ",");
	csv_string(f, row->options ? row->options : "");
	fprintf(f, ",%s,%u,%u,%llu,%llu,%llu,%g,%llu,%s,", row_ok(row) ? "ok" : "failed",
	        rep->repeat, row->verified_runs, (unsigned long long)cfg->ram_bytes,
	        (unsigned long long)cfg->dirty_rate, (unsigned long long)cfg->working_set,
	        cfg->zero_fraction, (unsigned long long)cfg->seed,
	        cfg->prefault ? "true" : "false");
	csv_content(rep);
	csv_value(f, rep->memcpy_gibps > 0 ? rep->memcpy_gibps : NAN, false);
	fprintf(f, ",");
	if (row->plugin->yardstick_gbps > 0)
		csv_string(f, row->plugin->yardstick);
	fprintf(f, ",");
	csv_value(f, row->plugin->yardstick_gbps > 0 ? row->plugin->yardstick_gbps : NAN, false);
	for (int i = 0; i < 3; i++) {
		const struct bench_figures *set = figure_set(row, i);

		for (int k = 0; k < BENCH_FIGURE_COUNT; k++) {
			if (!written(rep, k))
				continue;
			fprintf(f, ",");
			csv_value(f, set ? set->v[k] : NAN, figures[k].integer);
		}
	}
	fprintf(f, ",");
	error = first_error(row, &run);
	if (error) {
		char text[BENCH_ERROR_MAX + 32];

		snprintf(text, sizeof(text), "run %u of %u: %s", run, rep->repeat, error);
		csv_string(f, text);
	}
	fprintf(f, "\n");
}

/* ---- Entry points ------------------------------------------------------- */

void bench_output_begin(const struct bench_report *rep)
{
	if (rep->format == BENCH_FORMAT_TABLE) {
		print_preamble(rep);
		print_header(rep);
	} else if (rep->format == BENCH_FORMAT_CSV) {
		csv_header(rep);
	}
	fflush(rep->out);
}

void bench_output_row(const struct bench_report *rep, const struct bench_row *row)
{
	switch (rep->format) {
	case BENCH_FORMAT_TABLE:
		table_row(rep, row);
		break;
	case BENCH_FORMAT_JSON:
		json_row(rep, row);
		break;
	case BENCH_FORMAT_CSV:
		csv_row(rep, row);
		break;
	}
	fflush(rep->out);
}
