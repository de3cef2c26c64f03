/* lmt-bench: what the guest's RAM holds (--content, --dirty-pattern) as
 * the output describes it, the compression ratios zstd and lz4 reach on
 * it, and its image written to a file (--content-file). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <lz4.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zstd.h>

#include "bench.h"

/* ---- Compression ratios ------------------------------------------------- */

/* Every BENCH_RATIO_EVERY-th frame of BENCH_RATIO_FRAME bytes is compressed
 * on its own, as a compressor that frames chunks of that size would. */
static const int zstd_levels[2] = {1, 3};

void bench_compression_measure(const struct guest_content *content, uint64_t ram_bytes,
                               uint64_t seed, struct bench_compression *out)
{
	const size_t frame_pages = BENCH_RATIO_FRAME / GUEST_PAGE_SIZE;
	const size_t lz4_cap = (size_t)LZ4_COMPRESSBOUND(BENCH_RATIO_FRAME);
	const size_t cap = ZSTD_compressBound(BENCH_RATIO_FRAME) > lz4_cap
	                           ? ZSTD_compressBound(BENCH_RATIO_FRAME)
	                           : lz4_cap;
	uint64_t pages = ram_bytes / GUEST_PAGE_SIZE, packed[BENCH_COMPRESSORS] = {0};
	uint8_t *frame = malloc(BENCH_RATIO_FRAME), *packed_frame = malloc(cap);
	ZSTD_CCtx *zstd = ZSTD_createCCtx();
	struct guest_fill fill;
	size_t in_frame = 0;

	memset(out, 0, sizeof(*out));
	if (!frame || !packed_frame || !zstd)
		goto done;
	guest_fill_begin(&fill, content, pages, seed);
	for (uint64_t p = 0; p < pages; p++) {
		uint64_t recipe = guest_fill_next(&fill);
		bool sampled = (p / frame_pages) % BENCH_RATIO_EVERY == 0;

		if (!sampled)
			continue;
		guest_content_page(content, frame + in_frame * GUEST_PAGE_SIZE, recipe);
		in_frame++;
		if (in_frame < frame_pages && p + 1 < pages)
			continue;
		size_t n = in_frame * GUEST_PAGE_SIZE;
		for (int z = 0; z < 2; z++) {
			size_t got = ZSTD_compressCCtx(zstd, packed_frame, cap, frame, n,
			                               zstd_levels[z]);
			if (ZSTD_isError(got))
				goto done;
			packed[z] += got;
		}
		int got = LZ4_compress_default((const char *)frame, (char *)packed_frame, (int)n,
		                               (int)cap);
		if (got <= 0)
			goto done;
		packed[BENCH_LZ4] += (uint64_t)got;
		out->sampled_bytes += n;
		in_frame = 0;
	}
	for (int c = 0; c < BENCH_COMPRESSORS; c++)
		out->ratio[c] = packed[c] ? (double)out->sampled_bytes / (double)packed[c] : 0;
	out->measured = out->sampled_bytes > 0;
done:
	ZSTD_freeCCtx(zstd);
	free(packed_frame);
	free(frame);
}

const char *bench_compressor_name(enum bench_compressor c)
{
	static const char *const names[BENCH_COMPRESSORS] = {"zstd-1", "zstd-3", "lz4"};
	return names[c];
}

const char *bench_compressor_key(enum bench_compressor c)
{
	static const char *const keys[BENCH_COMPRESSORS] = {"zstd1_ratio", "zstd3_ratio",
	                                                    "lz4_ratio"};
	return keys[c];
}

/* ---- Descriptions ------------------------------------------------------- */

void bench_content_pages(const struct bench_config *cfg, uint64_t pages[GUEST_PAGE_CLASSES])
{
	struct guest_fill fill;

	guest_fill_begin(&fill, cfg->content, cfg->ram_bytes / GUEST_PAGE_SIZE, cfg->seed);
	memcpy(pages, fill.left, sizeof(fill.left));
}

/* "content mixed: 25% zero (16384 pages), 35% code (...), ..." */
void bench_content_describe(FILE *f, const struct bench_config *cfg)
{
	static const enum guest_page_class order[GUEST_PAGE_CLASSES] = {
	        GUEST_PAGE_ZERO, GUEST_PAGE_CODE, GUEST_PAGE_TEXT, GUEST_PAGE_RANDOM};
	const struct guest_content *c = cfg->content;
	uint64_t pages[GUEST_PAGE_CLASSES];
	bool first = true;

	bench_content_pages(cfg, pages);
	fprintf(f, "content %s:",
	        c->profile.kind == GUEST_CONTENT_MIXED  ? "mixed"
	        : c->profile.kind == GUEST_CONTENT_ZERO ? "zero"
	                                                : "random");
	for (int i = 0; i < GUEST_PAGE_CLASSES; i++) {
		enum guest_page_class k = order[i];

		if (c->profile.share[k] <= 0)
			continue;
		fprintf(f, "%s %.4g%% %s (%llu pages)", first ? "" : ",", c->profile.share[k],
		        guest_page_class_name(k), (unsigned long long)pages[k]);
		first = false;
	}
}

/* One line per pool that the guest draws from, and the compression line. */
void bench_content_preamble(FILE *f, const struct bench_config *cfg,
                            const struct bench_compression *compression)
{
	const struct guest_content *c = cfg->content;

	for (int k = 0; k < GUEST_PAGE_CLASSES; k++) {
		if (c->pool[k].npages)
			fprintf(f, "%s pages from: %s\n", guest_page_class_name(k),
			        c->pool[k].source);
	}
	if (c->profile.kind == GUEST_CONTENT_MIXED)
		fprintf(f,
		        "pools' checksum: %016llx (machines that print the same build the same "
		        "guest)\n",
		        (unsigned long long)c->digest);
	if (!compression->measured) {
		fprintf(f, "compression: not measured (out of memory)\n");
		return;
	}
	fprintf(f,
	        "compression of the guest's RAM (every %uth %u KiB frame, each alone; %.1f MiB):",
	        BENCH_RATIO_EVERY, BENCH_RATIO_FRAME / 1024,
	        (double)compression->sampled_bytes / 1048576.0);
	for (int z = 0; z < BENCH_COMPRESSORS; z++)
		fprintf(f, "%s %s %.2fx", z ? "," : "", bench_compressor_name(z),
		        compression->ratio[z]);
	fprintf(f, "\n");
}

/* ---- --content-file ----------------------------------------------------- */

int bench_content_file(const char *path, const struct bench_config *cfg, char *err, size_t size)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	int rc;

	if (fd < 0) {
		snprintf(err, size, "--content-file '%s': %s", path, strerror(errno));
		return -1;
	}
	rc = guest_content_write_image(cfg->content, cfg->ram_bytes, cfg->seed, fd);
	if (close(fd) < 0 && rc == 0)
		rc = -errno;
	if (rc < 0) {
		snprintf(err, size, "--content-file '%s': %s", path, strerror(-rc));
		unlink(path);
		return -1;
	}
	return 0;
}
