/* compress-rates: what lmt's codecs (core/compress) do on the synthetic
 * guest's pages, single thread, on this machine: the ratio, the share of
 * runs that do not fit, the compression rate (raw bytes in per second)
 * and the expansion rate (raw bytes out per second) of each codec and
 * level, as medians over repeats, beside a memcpy of the same bytes
 * measured in the same run as a yardstick. Each rate is given per second
 * of the thread's CPU time, which a loaded machine disturbs little, and
 * per second of wall time, which it does. Zero pages are left out, as
 * lmt sends them as markers; every expansion is checked bit for bit. The
 * compression rate counts every run tried, the expansion rate only the
 * runs that went as frames (the others need no expanding).
 *   compress-rates [--ram 64M] [--run 64K] [--repeat 5] [--content mixed]
 *                  [--codecs lz4,zstd-1,zstd-3] [--seed 1] [--keep-zero] */
#define _GNU_SOURCE
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <lmt/lmt.h>

#include "compress/frame.h"
#include "guest_content.h"

#define MAX_CODECS 24
#define MAX_REPEAT 101

struct codec_use {
	enum lmt_codec codec;
	int level;
	char name[16];
};

struct args {
	uint64_t ram, run, repeat, seed;
	const char *content;
	bool keep_zero;
	struct codec_use use[MAX_CODECS];
	unsigned nuse;
};

static void usage_error(const char *what)
{
	fprintf(stderr, "compress-rates: %s\n", what);
	exit(2);
}

static uint64_t arg_number(const char *flag, enum lmt_option_type type, int64_t min, int64_t max,
                           const char *text)
{
	struct lmt_option_desc desc = {.name = flag, .type = type, .min = min, .max = max};
	struct lmt_option_value value;
	struct lmt_error err = {0};
	if (lmt_option_parse(&desc, text, &value, &err))
		usage_error(err.message);
	return (uint64_t)value.integer;
}

/* "lz4,zstd-1,zstd-19" */
static void parse_codecs(struct args *a, const char *text)
{
	char *copy = strdup(text), *save = NULL;
	a->nuse = 0;
	for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		if (a->nuse == MAX_CODECS)
			usage_error("--codecs: too many");
		struct codec_use *u = &a->use[a->nuse++];
		struct lmt_error err = {0};
		if (strcmp(t, "lz4") == 0)
			u->codec = LMT_CODEC_LZ4, u->level = 1;
		else if (strncmp(t, "zstd-", 5) == 0)
			u->codec = LMT_CODEC_ZSTD, u->level = atoi(t + 5);
		else
			usage_error("--codecs: expected lz4 or zstd-LEVEL");
		if (lmt__codec_level(u->codec, u->level, &err) < 0)
			usage_error(err.message);
		snprintf(u->name, sizeof(u->name), "%s", t);
	}
	free(copy);
	if (!a->nuse)
		usage_error("--codecs: none given");
}

static void parse(struct args *a, int argc, char **argv)
{
	static const struct option opts[] = {
	        {"ram", required_argument, NULL, 'r'},    {"run", required_argument, NULL, 'u'},
	        {"repeat", required_argument, NULL, 'n'}, {"content", required_argument, NULL, 'c'},
	        {"codecs", required_argument, NULL, 'k'}, {"seed", required_argument, NULL, 's'},
	        {"keep-zero", no_argument, NULL, 'z'},    {NULL, 0, NULL, 0}};
	*a = (struct args){
	        .ram = 64 << 20, .run = 64 << 10, .repeat = 5, .seed = 1, .content = "mixed"};
	parse_codecs(a, "lz4,zstd-1,zstd-2,zstd-3,zstd-6,zstd-9,zstd-19");
	int c;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'r':
			a->ram = arg_number("--ram", LMT_OPT_SIZE, 1 << 20, 16ll << 30, optarg);
			break;
		case 'u':
			a->run = arg_number("--run", LMT_OPT_SIZE, 4096, 64 << 20, optarg);
			break;
		case 'n':
			a->repeat = arg_number("--repeat", LMT_OPT_INT, 1, MAX_REPEAT, optarg);
			break;
		case 'c':
			a->content = optarg;
			break;
		case 'k':
			parse_codecs(a, optarg);
			break;
		case 's':
			a->seed = arg_number("--seed", LMT_OPT_INT, 0, INT64_MAX, optarg);
			break;
		case 'z':
			a->keep_zero = true;
			break;
		default:
			usage_error("see the comment at the top of compress-rates.c");
		}
	}
	if (a->run % GUEST_PAGE_SIZE)
		usage_error("--run: expected a multiple of 4 KiB");
}

static bool zero_page(const uint8_t *p)
{
	static const uint8_t zero[GUEST_PAGE_SIZE];
	return memcmp(p, zero, GUEST_PAGE_SIZE) == 0;
}

/* The guest's pages, zero pages left out unless kept: how many bytes. */
static uint64_t make_pages(const struct args *a, const struct guest_content *content, uint8_t *out)
{
	struct guest_fill fill;
	uint64_t pages = a->ram / GUEST_PAGE_SIZE, kept = 0;
	guest_fill_begin(&fill, content, pages, a->seed);
	for (uint64_t p = 0; p < pages; p++) {
		uint8_t *page = out + kept * GUEST_PAGE_SIZE;
		guest_content_page(content, page, guest_fill_next(&fill));
		if (a->keep_zero || !zero_page(page))
			kept++;
	}
	return kept * GUEST_PAGE_SIZE;
}

/* Wall and this thread's CPU time, in seconds. */
struct stamp {
	double wall, cpu;
};

static double seconds(clockid_t clock)
{
	struct timespec ts;
	clock_gettime(clock, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static struct stamp now(void)
{
	return (struct stamp){seconds(CLOCK_MONOTONIC), seconds(CLOCK_THREAD_CPUTIME_ID)};
}

/* bytes per second of wall time (rate[0]) and of CPU time (rate[1]) */
static void rates(double rate[2], double bytes, struct stamp from, struct stamp to)
{
	rate[0] = bytes / (to.wall - from.wall);
	rate[1] = bytes / (to.cpu - from.cpu);
}

static int by_value(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double median(double *v, uint64_t n)
{
	qsort(v, n, sizeof(*v), by_value);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

struct result {
	double compress[2][MAX_REPEAT], expand[2][MAX_REPEAT]; /* [0] wall, [1] CPU */
	double ratio, unfit;
	size_t ctx_bytes;
};

/* One repeat of one codec: compress every run into its slot, then expand
 * every frame; rates in raw bytes per second. */
static void measure(const struct args *a, const struct codec_use *u, struct lmt_codec_ctx *ctx,
                    const uint8_t *raw, uint64_t bytes, uint8_t *slots, size_t *lens, uint8_t *back,
                    struct result *r, uint64_t rep)
{
	struct lmt_error err = {0};
	uint64_t runs = (bytes + a->run - 1) / a->run, wire = 0, unfit = 0;
	struct stamp t0 = now();
	for (uint64_t i = 0; i < runs; i++) {
		size_t len = bytes - i * a->run < a->run ? bytes - i * a->run : a->run;
		int rc = lmt__frame_compress(ctx, u->codec, u->level, raw + i * a->run, len,
		                             slots + i * a->run, a->run, &lens[i], &err);
		if (rc == -LMT_EOVERFLOW)
			lens[i] = 0, unfit++;
		else if (rc)
			usage_error(err.message);
		wire += lens[i] ? lens[i] : len;
	}
	struct stamp t1 = now();
	uint64_t framed = 0;
	for (uint64_t i = 0; i < runs; i++) {
		size_t len = bytes - i * a->run < a->run ? bytes - i * a->run : a->run;
		if (!lens[i])
			continue;
		struct lmt_frame_expect x = {
		        .codec = u->codec, .room = a->run, .length = lens[i], .raw_len = len};
		if (lmt__frame_expand(ctx, slots + i * a->run, &x, back + i * a->run, &err))
			usage_error(err.message);
		framed += len;
	}
	struct stamp t2 = now();
	/* The runs that did not fit go raw, straight into guest memory. */
	for (uint64_t i = 0; i < runs; i++) {
		size_t len = bytes - i * a->run < a->run ? bytes - i * a->run : a->run;
		if (!lens[i])
			memcpy(back + i * a->run, raw + i * a->run, len);
	}
	if (memcmp(back, raw, bytes)) {
		fprintf(stderr, "compress-rates: %s: the expanded pages differ\n", u->name);
		exit(1);
	}
	double c[2], e[2] = {0, 0};
	rates(c, (double)bytes, t0, t1);
	if (framed)
		rates(e, (double)framed, t1, t2);
	for (int k = 0; k < 2; k++) {
		r->compress[k][rep] = c[k];
		r->expand[k][rep] = e[k];
	}
	r->ratio = (double)bytes / (double)wire;
	r->unfit = (double)unfit / (double)runs;
}

static void memcpy_rate(double rate[2], const uint8_t *raw, uint8_t *back, uint64_t bytes)
{
	struct stamp t0 = now();
	memcpy(back, raw, bytes);
	struct stamp t1 = now();
	if (memcmp(back, raw, bytes))
		exit(1);
	rates(rate, (double)bytes, t0, t1);
}

int main(int argc, char **argv)
{
	struct args a;
	parse(&a, argc, argv);
	char err[256];
	struct guest_profile profile;
	struct guest_content content;
	if (guest_profile_parse(a.content, 0, &profile, err, sizeof(err)) < 0 ||
	    guest_content_load(&content, &profile, err, sizeof(err)) < 0)
		usage_error(err);
	uint8_t *raw = malloc(a.ram), *slots = malloc(a.ram + a.run), *back = malloc(a.ram);
	size_t *lens = calloc(a.ram / a.run + 1, sizeof(*lens));
	struct result *results = calloc(a.nuse, sizeof(*results));
	struct lmt_error lerr = {0};
	if (!raw || !slots || !back || !lens || !results)
		usage_error("out of memory");
	uint64_t bytes = make_pages(&a, &content, raw);
	if (!bytes)
		usage_error("no page left to compress");
	memset(back, 0, a.ram); /* faulted in before it is timed */
	memset(slots, 0, a.ram + a.run);

	char loadavg[64] = "?";
	FILE *f = fopen("/proc/loadavg", "re");
	if (f && fgets(loadavg, sizeof(loadavg), f))
		loadavg[strcspn(loadavg, "\n")] = '\0';
	if (f)
		fclose(f);
	char described[256];
	guest_profile_format(&profile, described, sizeof(described));
	printf("%s: %.1f MiB of %.1f MiB kept (%s), runs of %llu KiB, %llu repeats, "
	       "single thread; load %s\n",
	       described, (double)bytes / (1 << 20), (double)a.ram / (1 << 20),
	       a.keep_zero ? "zero pages kept" : "zero pages left out",
	       (unsigned long long)(a.run >> 10), (unsigned long long)a.repeat, loadavg);

	static double copies[2][MAX_REPEAT * MAX_CODECS];
	unsigned ncopies = 0;
	for (unsigned u = 0; u < a.nuse; u++) {
		struct lmt_codec_ctx *ctx;
		if (lmt__codec_ctx_new(&ctx, &lerr))
			usage_error(lerr.message);
		/* Repeats interleave the yardstick with the codec, so that a
		 * change of load hits both. */
		for (uint64_t rep = 0; rep < a.repeat; rep++) {
			double copy[2];
			memcpy_rate(copy, raw, back, bytes);
			copies[0][ncopies] = copy[0];
			copies[1][ncopies++] = copy[1];
			measure(&a, &a.use[u], ctx, raw, bytes, slots, lens, back, &results[u],
			        rep);
		}
		results[u].ctx_bytes = lmt__codec_ctx_size(ctx);
		lmt__codec_ctx_free(ctx);
	}
	double copy_wall = median(copies[0], ncopies), copy = median(copies[1], ncopies);
	printf("memcpy %.0f MB/s of CPU time, %.0f MB/s of wall time (medians of %u)\n", copy / 1e6,
	       copy_wall / 1e6, ncopies);
	printf("%-8s %6s %6s | %9s %8s %9s %8s | %9s %9s | %7s\n", "", "", "", "CPU time", "", "",
	       "", "wall time", "", "");
	printf("%-8s %6s %6s | %9s %8s %9s %8s | %9s %9s | %7s\n", "codec", "ratio", "unfit",
	       "compress", "x memcpy", "expand", "x memcpy", "compress", "expand", "ctx KiB");
	for (unsigned u = 0; u < a.nuse; u++) {
		struct result *r = &results[u];
		double c = median(r->compress[1], a.repeat), e = median(r->expand[1], a.repeat);
		double cw = median(r->compress[0], a.repeat), ew = median(r->expand[0], a.repeat);
		printf("%-8s %6.2f %5.1f%% | %9.0f %8.3f %9.0f %8.3f | %9.0f %9.0f | %7zu\n",
		       a.use[u].name, r->ratio, 100 * r->unfit, c / 1e6, c / copy, e / 1e6,
		       e / copy, cw / 1e6, ew / 1e6, r->ctx_bytes >> 10);
	}
	printf("(MB/s: raw bytes; compress counts every run tried, expand the runs framed)\n");
	free(results);
	free(lens);
	free(back);
	free(slots);
	free(raw);
	guest_content_free(&content);
	return 0;
}
