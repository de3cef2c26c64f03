/* lmt-bench --plot: throughput and downtime per row, drawn by gnuplot from
 * a script and a data file that lmt-bench writes to a temporary directory. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"

#define GNUPLOT "gnuplot"
#define GIB 1073741824.0
#define PANEL_BASE_PX 90
#define ROW_PX 26
#define WIDTH_PX 1000

extern char **environ;

/* One colour per plugin, so that a transport reads the same in both panels. */
static const unsigned palette[] = {
        0x1f77b4, 0xff7f0e, 0x2ca02c, 0xd62728, 0x9467bd, 0x8c564b, 0xe377c2, 0x7f7f7f,
};

#define PALETTE_SIZE (sizeof(palette) / sizeof(palette[0]))

struct plot_files {
	char dir[4096];
	char data[4200];
	char script[4200];
};

bool bench_on_path(const char *program)
{
	const char *path = getenv("PATH");
	char file[4096];

	for (const char *dir = path; dir && *dir;) {
		size_t len = strcspn(dir, ":");
		struct stat st;

		snprintf(file, sizeof(file), "%.*s/%s", (int)len, len ? dir : ".", program);
		if (len + strlen(program) + 2 <= sizeof(file) && stat(file, &st) == 0 &&
		    S_ISREG(st.st_mode) && access(file, X_OK) == 0)
			return true;
		dir += len + (dir[len] == ':');
	}
	return false;
}

bool bench_plot_available(void)
{
	return bench_on_path(GNUPLOT);
}

static bool plotted(const struct bench_row *row)
{
	return !row->skipped && row->runs > 0;
}

/* A gnuplot single-quoted string: only the quote itself needs doubling. */
static void gp_string(FILE *f, const char *text)
{
	fputc('\'', f);
	for (const char *c = text; *c; c++) {
		if (*c == '\'')
			fputc('\'', f);
		fputc(*c == '\n' || *c == '\t' ? ' ' : *c, f);
	}
	fputc('\'', f);
}

static void data_value(FILE *f, const struct bench_row *row, int which, int figure)
{
	const struct bench_figures *set = which == 0   ? &row->median
	                                  : which == 1 ? &row->min
	                                               : &row->max;
	double v = row->verified_runs ? set->v[figure] : NAN;

	fprintf(f, "\t%s", isnan(v) ? "NaN" : "");
	if (!isnan(v))
		fprintf(f, "%.6g", v);
}

/* y, then median, min and max of throughput and of downtime, then colour. */
static int write_data(const char *file, const struct bench_row *rows, size_t nrows)
{
	const char **names = calloc(nrows, sizeof(*names));
	FILE *f = names ? fopen(file, "w") : NULL;
	size_t nnames = 0;
	int y = 0;

	if (!f) {
		free(names);
		return -1;
	}
	for (size_t i = 0; i < nrows; i++) {
		size_t colour = 0;

		if (!plotted(&rows[i]))
			continue;
		while (colour < nnames && strcmp(names[colour], rows[i].plugin->name) != 0)
			colour++;
		if (colour == nnames)
			names[nnames++] = rows[i].plugin->name;
		fprintf(f, "%d", y++);
		for (int w = 0; w < 3; w++)
			data_value(f, &rows[i], w, BENCH_GBPS);
		for (int w = 0; w < 3; w++)
			data_value(f, &rows[i], w, BENCH_DOWNTIME_MS);
		fprintf(f, "\t%u\n", palette[colour % PALETTE_SIZE]);
	}
	free(names);
	return fclose(f) == 0 ? 0 : -1;
}

static bool ends_with(const char *text, const char *suffix)
{
	size_t len = strlen(text), slen = strlen(suffix);

	return len >= slen && strcasecmp(text + len - slen, suffix) == 0;
}

static void script_terminal(FILE *f, const char *path, size_t n)
{
	int height = 2 * (PANEL_BASE_PX + ROW_PX * (int)n) + 40;

	if (ends_with(path, ".png"))
		fprintf(f,
		        "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {\n"
		        "\tset terminal pngcairo size %d,%d font 'sans,10'\n"
		        "} else {\n\tset terminal png size %d,%d\n}\n",
		        WIDTH_PX, height, WIDTH_PX, height);
	else
		fprintf(f,
		        "set terminal svg size %d,%d dynamic font 'sans,10' "
		        "background rgb 'white'\n",
		        WIDTH_PX, height);
	fprintf(f, "set output ");
	gp_string(f, path);
	fprintf(f, "\n");
}

static void script_title(FILE *f, const struct bench_report *rep)
{
	const struct bench_config *cfg = rep->cfg;
	char ram[32], rate[32], ws[32], title[512];

	bench_format(LMT_OPT_SIZE, cfg->ram_bytes, ram, sizeof(ram));
	bench_format(LMT_OPT_SIZE, cfg->dirty_rate, rate, sizeof(rate));
	bench_format(LMT_OPT_SIZE, cfg->working_set, ws, sizeof(ws));
	snprintf(title, sizeof(title), "lmt-bench: %s guest, %s%s%s%s, destination %s; %s%u %s",
	         ram, cfg->dirty_rate ? "dirtying " : "idle", cfg->dirty_rate ? rate : "",
	         cfg->dirty_rate ? "/s of " : "", cfg->dirty_rate ? ws : "",
	         cfg->prefault ? "pre-faulted" : "not pre-faulted",
	         rep->repeat > 1 ? "median of " : "", rep->repeat,
	         rep->repeat > 1 ? "runs, bars min-max" : "run");
	fprintf(f, "set multiplot layout 2,1 title ");
	gp_string(f, title);
	fprintf(f, " noenhanced\n");
}

static void script_axes(FILE *f, const struct bench_row *rows, size_t nrows, size_t n)
{
	size_t y = 0;

	fprintf(f,
	        "set datafile separator '\\t'\n"
	        "set style fill solid 0.85 border -1\n"
	        "set yrange [%g:-0.6]\n"
	        "set border 3\nset grid xtics\nset xtics nomirror\n"
	        "set ytics noenhanced nomirror scale 0 (",
	        (double)n - 0.4);
	for (size_t i = 0; i < nrows; i++) {
		char label[1024];

		if (!plotted(&rows[i]))
			continue;
		snprintf(label, sizeof(label), "%s%s", rows[i].label,
		         rows[i].verified_runs ? "" : " (failed)");
		fprintf(f, "%s", y ? ", " : "");
		gp_string(f, label);
		fprintf(f, " %zu", y++);
	}
	fprintf(f, ")\n");
}

/* Bars at the median, min-max error bars, and the median written after. */
static void script_panel(FILE *f, const char *data, int column, const char *format)
{
	fprintf(f, "plot ");
	gp_string(f, data);
	fprintf(f,
	        " using %d:1:(0):%d:($1-0.35):($1+0.35):8 with boxxyerror "
	        "lc rgb variable notitle, \\\n  '' using %d:1:%d:%d with xerrorbars "
	        "lc rgb 'black' pt 0 notitle, \\\n  '' using %d:1:(sprintf('  %s', $%d)) "
	        "with labels left notitle\n",
	        column, column, column, column + 1, column + 2, column + 2, format, column);
}

static double figure_max(const struct bench_row *rows, size_t nrows, int figure)
{
	double top = 0;

	for (size_t i = 0; i < nrows; i++) {
		if (plotted(&rows[i]) && rows[i].verified_runs && rows[i].max.v[figure] > top)
			top = rows[i].max.v[figure];
	}
	return top;
}

static int write_script(const struct plot_files *pf, const char *path,
                        const struct bench_report *rep, const struct bench_row *rows, size_t nrows,
                        size_t n)
{
	double memcpy_gbps = rep->memcpy_gibps * GIB * 8 / 1e9;
	double gbps_top = fmax(figure_max(rows, nrows, BENCH_GBPS), memcpy_gbps);
	double down_top = figure_max(rows, nrows, BENCH_DOWNTIME_MS);
	FILE *f = fopen(pf->script, "w");

	if (!f)
		return -1;
	script_terminal(f, path, n);
	script_title(f, rep);
	script_axes(f, rows, nrows, n);
	/* Room on the right for the value written after the longest bar. */
	fprintf(f,
	        "set title 'Throughput: bytes sent / total migration time'\n"
	        "set xlabel 'Gb/s'\nset xrange [0:%g]\n",
	        gbps_top > 0 ? gbps_top * 1.15 : 1);
	if (memcpy_gbps > 0)
		fprintf(f,
		        "set arrow from %g, graph 0 to %g, graph 1 nohead dt 2 "
		        "lc rgb '#555555'\nset label 'memcpy, one thread' at %g, graph 1 "
		        "right offset -0.5,-0.8\n",
		        memcpy_gbps, memcpy_gbps, memcpy_gbps);
	script_panel(f, pf->data, 2, "%.2f");
	fprintf(f,
	        "unset arrow\nunset label\n"
	        "set title 'Downtime: from the pause of the guest to the acknowledgement'\n"
	        "set xlabel 'ms'\nset xrange [0:%g]\n",
	        down_top > 0 ? down_top * 1.15 : 1);
	script_panel(f, pf->data, 5, "%.2f");
	fprintf(f, "unset multiplot\n");
	return fclose(f) == 0 ? 0 : -1;
}

static int run_gnuplot(const char *script, int *status)
{
	posix_spawn_file_actions_t actions;
	char *argv[] = {GNUPLOT, (char *)script, NULL};
	pid_t pid;
	int rc;

	posix_spawn_file_actions_init(&actions);
	posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
	/* stdout may carry JSON or CSV: whatever gnuplot says goes to stderr. */
	posix_spawn_file_actions_adddup2(&actions, STDERR_FILENO, STDOUT_FILENO);
	fflush(NULL);
	rc = posix_spawnp(&pid, GNUPLOT, &actions, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&actions);
	if (rc != 0)
		return -rc;
	while (waitpid(pid, status, 0) < 0) {
		if (errno != EINTR)
			return -errno;
	}
	return 0;
}

static void remove_files(const struct plot_files *pf)
{
	unlink(pf->data);
	unlink(pf->script);
	rmdir(pf->dir);
}

static int make_files(struct plot_files *pf, const char *path, const struct bench_report *rep,
                      const struct bench_row *rows, size_t nrows, size_t n)
{
	const char *tmp = getenv("TMPDIR");

	snprintf(pf->dir, sizeof(pf->dir), "%s/lmt-bench-plot.XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(pf->dir)) {
		fprintf(stderr, "lmt-bench: --plot: cannot create a directory like %s: %s\n",
		        pf->dir, strerror(errno));
		return -1;
	}
	snprintf(pf->data, sizeof(pf->data), "%s/rows.dat", pf->dir);
	snprintf(pf->script, sizeof(pf->script), "%s/plot.gp", pf->dir);
	if (write_data(pf->data, rows, nrows) < 0 ||
	    write_script(pf, path, rep, rows, nrows, n) < 0) {
		fprintf(stderr, "lmt-bench: --plot: writing in %s: %s\n", pf->dir, strerror(errno));
		remove_files(pf);
		return -1;
	}
	return 0;
}

int bench_plot(const char *path, const struct bench_report *rep, const struct bench_row *rows,
               size_t nrows)
{
	struct plot_files pf;
	struct stat st;
	size_t n = 0;
	int status = 0, rc;

	if (!bench_plot_available()) {
		fprintf(stderr,
		        "lmt-bench: --plot: gnuplot is not on PATH; %s not drawn "
		        "(Debian: apt-get install gnuplot-nox)\n",
		        path);
		return 1;
	}
	for (size_t i = 0; i < nrows; i++)
		n += plotted(&rows[i]);
	if (n == 0) {
		fprintf(stderr, "lmt-bench: --plot: no row ran; %s not drawn\n", path);
		return 1;
	}
	if (make_files(&pf, path, rep, rows, nrows, n) < 0)
		return -1;
	/* An older plot left in place must not pass for this one. */
	unlink(path);
	rc = run_gnuplot(pf.script, &status);
	if (rc < 0) {
		fprintf(stderr, "lmt-bench: --plot: cannot run gnuplot: %s\n", strerror(-rc));
	} else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || stat(path, &st) < 0 ||
	           st.st_size == 0) {
		fprintf(stderr,
		        "lmt-bench: --plot: gnuplot failed; %s not drawn; its script and "
		        "data are in %s\n",
		        path, pf.dir);
		return -1;
	} else {
		fprintf(stderr, "lmt-bench: plot written to %s\n", path);
	}
	remove_files(&pf);
	return rc < 0 ? -1 : 0;
}
