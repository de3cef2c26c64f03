/* lmt-bench --qemu: the guest QEMU runs (qemu-guest/): where its own RAM
 * area lies after the image, the parameters written into its firmware,
 * the pools it copies from, the probe of its speed, and the check of a
 * destination's RAM after a migration, page by page against the image or
 * against the page the guest logged writing. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "bench.h"
#include "qemu-guest/qemu-guest.h"

#define AREA_ALIGN (UINT64_C(2) << 20)
#define REWRITE_BIT (UINT64_C(1) << 61)
#define PIT_HZ 1193182u

#ifdef BENCH_QEMU_GUEST
extern const uint8_t bench_qemu_guest_image[], bench_qemu_guest_image_end[];
#endif

_Static_assert(sizeof(struct qg_params) <= QG_PARAMS_SIZE, "the parameters fit their page");

static uint64_t align_up(uint64_t value, uint64_t to)
{
	return (value + to - 1) / to * to;
}

void bench_qemu_plan_layout(const struct bench_config *cfg, struct bench_qemu_layout *out)
{
	const struct guest_content *c = cfg->content;
	uint64_t at;

	memset(out, 0, sizeof(*out));
	out->area_base = cfg->ram_bytes;
	out->log_offset = QG_LOG_OFFSET;
	at = align_up(out->log_offset + cfg->working_set / GUEST_PAGE_SIZE * 8, GUEST_PAGE_SIZE);
	/* Only a mixed guest copies pool pages; the two pools lie end to end,
	 * so that one file loads both. */
	for (int pool = 0; pool < QG_POOLS; pool++) {
		const struct guest_pool *p = &c->pool[GUEST_PAGE_CODE + pool];

		out->pool_offset[pool] = at;
		out->pool_pages[pool] = c->profile.kind == GUEST_CONTENT_MIXED ? p->npages : 0;
		at += out->pool_pages[pool] * GUEST_PAGE_SIZE;
	}
	out->area_bytes = align_up(at, AREA_ALIGN);
}

static int write_file(const char *path, const void *data, size_t length, char *err, size_t size)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	const uint8_t *p = data;

	if (fd < 0) {
		snprintf(err, size, "creating %s: %s", path, strerror(errno));
		return -1;
	}
	while (length > 0) {
		ssize_t n = write(fd, p, length);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			snprintf(err, size, "writing %s: %s", path,
			         n < 0 ? strerror(errno) : "short write");
			close(fd);
			return -1;
		}
		p += n;
		length -= (size_t)n;
	}
	if (close(fd) < 0) {
		snprintf(err, size, "writing %s: %s", path, strerror(errno));
		return -1;
	}
	return 0;
}

static void fill_params(struct qg_params *p, const struct bench_config *cfg,
                        const struct bench_qemu_layout *lay, uint64_t tsc_hz)
{
	const struct guest_content *c = cfg->content;
	struct guest_hot_set hot;
	uint64_t pages = cfg->working_set / GUEST_PAGE_SIZE;

	memset(p, 0, sizeof(*p));
	p->magic = QG_PARAMS_MAGIC;
	p->version = QG_VERSION;
	p->ram_bytes = cfg->ram_bytes;
	p->area_base = lay->area_base;
	p->area_bytes = lay->area_bytes;
	p->log_offset = lay->log_offset;
	for (int pool = 0; pool < QG_POOLS; pool++) {
		p->pool_offset[pool] = lay->pool_offset[pool];
		p->pool_pages[pool] = lay->pool_pages[pool];
	}
	p->kind = c->profile.kind == GUEST_CONTENT_MIXED  ? QG_KIND_MIXED
	          : c->profile.kind == GUEST_CONTENT_ZERO ? QG_KIND_ZERO
	                                                  : QG_KIND_RANDOM;
	for (int k = 0; k < GUEST_PAGE_CLASSES; k++)
		p->write_cut[k] = c->write_cut[k];
	p->dirty_rate = cfg->dirty_rate;
	p->bytes_per_tick_q32 =
	        (uint64_t)(((unsigned __int128)cfg->dirty_rate << 32) / (tsc_hz ? tsc_hz : 1));
	/* The workload's token bucket: at most 10 ms of credit. */
	p->burst =
	        cfg->dirty_rate / 100 > GUEST_PAGE_SIZE ? cfg->dirty_rate / 100 : GUEST_PAGE_SIZE;
	p->tsc_hz = tsc_hz;
	guest_hot_set_init(&hot, &cfg->pattern, pages, cfg->seed);
	p->pages = pages;
	p->hot = hot.hot;
	p->stride = hot.stride;
	p->offset = hot.offset;
	p->share = hot.share;
	p->rng = cfg->seed ^ UINT64_C(0x5bd1e9955bd1e995);
	p->pit_reload = (PIT_HZ + 500) / 1000;
}

static int write_rom(const char *path, const struct qg_params *params, char *err, size_t size)
{
#ifdef BENCH_QEMU_GUEST
	size_t length = (size_t)(bench_qemu_guest_image_end - bench_qemu_guest_image);
	uint8_t *rom;
	int rc;

	if (length != QG_ROM_SIZE) {
		snprintf(err, size, "the embedded QEMU guest is %zu bytes, expected %u", length,
		         QG_ROM_SIZE);
		return -1;
	}
	rom = malloc(length);
	if (!rom) {
		snprintf(err, size, "out of memory");
		return -1;
	}
	memcpy(rom, bench_qemu_guest_image, length);
	memcpy(rom, params, sizeof(*params));
	rc = write_file(path, rom, length, err, size);
	free(rom);
	return rc;
#else
	(void)path;
	(void)params;
	snprintf(err, size,
	         "this lmt-bench was built without the QEMU guest (an x86-64 host "
	         "builds it)");
	return -1;
#endif
}

int bench_qemu_write_rom(const char *path, const struct bench_config *cfg,
                         const struct bench_qemu_layout *lay, uint64_t tsc_hz, char *err,
                         size_t size)
{
	struct qg_params params;

	if (cfg->dirty_rate >= tsc_hz) {
		snprintf(err, size,
		         "--dirty-rate: the QEMU guest paces itself by its TSC and "
		         "writes less than a byte per cycle");
		return -1;
	}
	fill_params(&params, cfg, lay, tsc_hz);
	return write_rom(path, &params, err, size);
}

int bench_qemu_write_probe_rom(const char *path, uint64_t probe_pages, uint64_t tsc_hz, char *err,
                               size_t size)
{
	struct qg_params params = {
	        .magic = QG_PARAMS_MAGIC,
	        .version = QG_VERSION,
	        .ram_bytes = BENCH_QEMU_PROBE_RAM / 2,
	        .area_base = BENCH_QEMU_PROBE_RAM / 2,
	        .area_bytes = BENCH_QEMU_PROBE_RAM / 2,
	        .log_offset = QG_LOG_OFFSET,
	        .kind = QG_KIND_RANDOM,
	        .tsc_hz = tsc_hz,
	        .probe_pages = probe_pages,
	};

	return write_rom(path, &params, err, size);
}

int bench_qemu_write_pools(const char *path, const struct bench_config *cfg,
                           const struct bench_qemu_layout *lay, char *err, size_t size)
{
	const struct guest_content *c = cfg->content;
	uint64_t code = lay->pool_pages[QG_POOL_CODE] * GUEST_PAGE_SIZE;
	uint64_t text = lay->pool_pages[QG_POOL_TEXT] * GUEST_PAGE_SIZE;
	uint8_t *bytes = malloc(code + text ? code + text : 1);
	int rc;

	if (!bytes) {
		snprintf(err, size, "out of memory");
		return -1;
	}
	if (code)
		memcpy(bytes, c->pool[GUEST_PAGE_CODE].bytes, code);
	if (text)
		memcpy(bytes + code, c->pool[GUEST_PAGE_TEXT].bytes, text);
	rc = write_file(path, bytes, code + text, err, size);
	free(bytes);
	return rc;
}

/* ---- The check ------------------------------------------------------------- */

static const char *state_name(uint64_t state)
{
	switch (state) {
	case QG_BOOTED:
		return "booted";
	case QG_IDLE:
		return "idle";
	case QG_DIRTYING:
		return "dirtying";
	case QG_FAULT:
		return "faulted";
	case QG_PROBED:
		return "probed";
	default:
		return "not started";
	}
}

static int check_status(const struct bench_config *cfg, const struct qg_status *st, char *err,
                        size_t size)
{
	uint64_t want = cfg->dirty_rate ? QG_DIRTYING : QG_IDLE;

	if (st->magic != QG_STATUS_MAGIC) {
		snprintf(err, size, "the destination holds no status of the QEMU guest");
		return -1;
	}
	if (st->state == QG_FAULT) {
		snprintf(err, size, "the QEMU guest faulted: exception %llu, error %#llx, at %#llx",
		         (unsigned long long)st->fault_vector, (unsigned long long)st->fault_error,
		         (unsigned long long)st->fault_eip);
		return -1;
	}
	if (st->state != want) {
		snprintf(err, size, "the QEMU guest is %s on the destination, expected %s",
		         state_name(st->state), state_name(want));
		return -1;
	}
	return 0;
}

static int check_pools(const struct bench_config *cfg, const struct bench_qemu_layout *lay,
                       const uint8_t *area, char *err, size_t size)
{
	for (int pool = 0; pool < QG_POOLS; pool++) {
		uint64_t bytes = lay->pool_pages[pool] * GUEST_PAGE_SIZE;

		if (bytes && memcmp(area + lay->pool_offset[pool],
		                    cfg->content->pool[GUEST_PAGE_CODE + pool].bytes, bytes) != 0) {
			snprintf(err, size, "the destination's copy of the %s pool differs",
			         guest_page_class_name(GUEST_PAGE_CODE + pool));
			return -1;
		}
	}
	return 0;
}

/* The guest's writes are lmt-bench's workload's: replaying guest_workload's
 * page order and recipes from the same seed for as many draws as the
 * guest made leaves each page of the working set with the recipe the
 * guest logged last (the legacy hole's pages drawn and left alone). */
static int check_workload(const struct bench_config *cfg, const struct bench_qemu_layout *lay,
                          const struct qg_status *st, const uint64_t *log,
                          const struct bench_qemu_source *source, char *err, size_t size)
{
	uint64_t pages = cfg->working_set / GUEST_PAGE_SIZE, cursor = 0;
	uint64_t draws = st->pages_written + st->pages_skipped;
	uint64_t rng = cfg->seed ^ UINT64_C(0x5bd1e9955bd1e995);
	uint64_t *last = calloc(pages ? pages : 1, sizeof(*last));
	struct guest_hot_set hot;
	int rc = 0;

	if (!last) {
		snprintf(err, size, "out of memory");
		return -1;
	}
	guest_hot_set_init(&hot, &cfg->pattern, pages, cfg->seed);
	for (uint64_t i = 0; i < draws && pages; i++) {
		uint64_t index = cursor;

		if (hot.hot)
			index = guest_hot_set_next(&hot, &rng);
		else
			cursor = cursor + 1 == pages ? 0 : cursor + 1;
		uint64_t recipe = guest_content_rewrite(cfg->content, &rng);
		if (index < QG_HOLE_START / GUEST_PAGE_SIZE ||
		    index >= QG_HOLE_END / GUEST_PAGE_SIZE)
			last[index] = recipe;
	}
	for (uint64_t p = 0; p < pages && rc == 0; p++) {
		if ((st->busy && p == st->busy - 1) || last[p] == log[p])
			continue;
		struct qg_status at_source;
		int n = snprintf(err, size,
		                 "the QEMU guest did not write as lmt-bench's workload does: after "
		                 "%llu draws, page %llu holds recipe %#llx, the workload's %#llx",
		                 (unsigned long long)draws, (unsigned long long)p,
		                 (unsigned long long)log[p], (unsigned long long)last[p]);
		/* Or the destination's copy of the status is older than the
		 * pages: the source says. */
		if (source && n > 0 && (size_t)n < size &&
		    source->read(source->opaque, lay->area_base + QG_STATUS_OFFSET, &at_source,
		                 sizeof(at_source)) == 0 &&
		    at_source.pages_written + at_source.pages_skipped != draws)
			snprintf(err + n, size - (size_t)n,
			         "; but the paused source's status counts %llu draws: QEMU did not "
			         "migrate the guest's last write of its status page",
			         (unsigned long long)(at_source.pages_written +
			                              at_source.pages_skipped));
		rc = -1;
	}
	free(last);
	return rc;
}

static uint64_t first_difference(const uint8_t *a, const uint8_t *b)
{
	uint64_t i = 0;

	while (i < GUEST_PAGE_SIZE && a[i] == b[i])
		i++;
	return i;
}

/* Whether the paused source holds what the destination should: then the
 * migration lost a write, not the guest. */
static void explain_difference(const struct bench_qemu_source *source, uint64_t p,
                               const uint8_t *expected, const uint8_t *got, char *err, size_t size,
                               int n)
{
	uint8_t at_source[GUEST_PAGE_SIZE];

	if (!source || n <= 0 || (size_t)n >= size ||
	    source->read(source->opaque, p * GUEST_PAGE_SIZE, at_source, sizeof(at_source)) < 0)
		return;
	if (memcmp(at_source, expected, GUEST_PAGE_SIZE) == 0)
		snprintf(err + n, size - (size_t)n,
		         "; the paused source holds the expected page: QEMU did not migrate "
		         "its last write");
	else if (memcmp(at_source, got, GUEST_PAGE_SIZE) == 0)
		snprintf(err + n, size - (size_t)n, "; the paused source holds the same bytes");
}

int bench_qemu_check(const struct bench_config *cfg, const struct bench_qemu_layout *lay,
                     const uint8_t *image, const uint8_t *ram, const uint8_t *area,
                     const struct bench_qemu_source *source, struct bench_qemu_guest *out,
                     char *err, size_t size)
{
	const struct qg_status *st = (const void *)(area + QG_STATUS_OFFSET);
	const uint64_t *log = (const void *)(area + lay->log_offset);
	uint64_t pages = cfg->ram_bytes / GUEST_PAGE_SIZE;
	uint64_t ws_pages = cfg->working_set / GUEST_PAGE_SIZE;
	uint8_t *page = malloc(GUEST_PAGE_SIZE);

	if (!page) {
		snprintf(err, size, "out of memory");
		return -1;
	}
	memset(out, 0, sizeof(*out));
	if (check_status(cfg, st, err, size) < 0 || check_pools(cfg, lay, area, err, size) < 0)
		goto fail;
	out->pages_written = st->pages_written;
	out->pages_skipped = st->pages_skipped;
	out->start_tsc = st->start_tsc;
	out->last_tsc = st->last_tsc;
	for (uint64_t p = 0; p < pages; p++) {
		const uint8_t *expected = image + p * GUEST_PAGE_SIZE;
		const uint8_t *got = ram + p * GUEST_PAGE_SIZE;
		uint64_t recipe = p < ws_pages ? log[p] : 0;

		/* The vCPU stopped while writing this page: it may hold part
		 * of the old bytes and part of the new. */
		if (st->busy && p == st->busy - 1) {
			out->unchecked_pages++;
			continue;
		}
		if (recipe) {
			if (!(recipe & REWRITE_BIT)) {
				snprintf(err, size,
				         "the QEMU guest's log names page %llu with %#llx, not a "
				         "rewrite",
				         (unsigned long long)p, (unsigned long long)recipe);
				goto fail;
			}
			guest_content_page(cfg->content, page, recipe);
			expected = page;
			out->pages_rewritten++;
		}
		if (memcmp(expected, got, GUEST_PAGE_SIZE) != 0) {
			uint64_t at = first_difference(expected, got);

			bool stale = recipe &&
			             memcmp(image + p * GUEST_PAGE_SIZE, got, GUEST_PAGE_SIZE) == 0;
			int n = snprintf(err, size,
			                 "destination RAM differs at offset %llu (page %llu, %s): "
			                 "0x%02x, expected 0x%02x%s",
			                 (unsigned long long)(p * GUEST_PAGE_SIZE + at),
			                 (unsigned long long)p,
			                 recipe ? "written by the guest" : "the image's", got[at],
			                 expected[at],
			                 stale ? " (it still holds the image's page)" : "");

			explain_difference(source, p, expected, got, err, size, n);
			goto fail;
		}
	}
	free(page);
	return check_workload(cfg, lay, st, log, source, err, size);
fail:
	free(page);
	return -1;
}

int bench_qemu_map(const char *path, int fd, uint64_t bytes, const uint8_t **out, char *err,
                   size_t size)
{
	void *p = mmap(NULL, bytes, PROT_READ, MAP_SHARED, fd, 0);

	if (p == MAP_FAILED) {
		snprintf(err, size, "mapping %s: %s", path, strerror(errno));
		return -1;
	}
	*out = p;
	return 0;
}
