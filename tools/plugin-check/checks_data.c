/* lmt-plugin-check: instances, endpoints, registration and writes on the
 * paths that succeed. */
#define _GNU_SOURCE
#include "plugin-check.h"

#include <fcntl.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- Instances and endpoints ---------------------------------------------- */

void pc_check_instances(struct ph_run *run)
{
	static const enum lmt_role roles[] = {LMT_ROLE_SOURCE, LMT_ROLE_DESTINATION};
	for (size_t i = 0; i < 2 && !run->failed; i++) {
		struct ph_side side = {0};
		ph_host_init(&side.host, run->cfg, i ? "destination" : "source");
		if (ph_instance_open(run, &side, roles[i], run->cfg->channels,
		                     run->cfg->op_timeout_ns)) {
			run->cfg->plugin->ops.instance_close(side.inst);
			if (ph_host_errors(&side.host))
				ph_fail(run, "the %s recorded an error on success: %s",
				        side.host.role, side.host.last);
		}
		ph_host_fini(&side.host);
	}
}

void pc_check_connect(struct ph_run *run)
{
	struct ph_pair pair;
	uint64_t start = ph_now();
	if (ph_pair_open(run, &pair, run->cfg->op_timeout_ns) &&
	    ph_pair_open_endpoints(run, &pair) && ph_pair_connect(run, &pair)) {
		uint64_t took = ph_now() - start;
		for (uint32_t c = 0; c < pair.channels; c++) {
			pair.plugin->ops.ep_close(pair.src.ep[c]);
			pair.plugin->ops.ep_close(pair.dst.ep[c]);
		}
		if (ph_pair_quiet(run, &pair))
			ph_note(run, "%u channel%s in %.0f ms, address blobs of %u and %u bytes",
			        pair.channels, pair.channels == 1 ? "" : "s",
			        pc_seconds(took) * 1000, pair.src.addr[0].len,
			        pair.dst.addr[0].len);
	}
	ph_pair_close(&pair);
}

/* Progress with nothing to report returns 0 once its timeout has passed,
 * and not before: the core's destination loop waits in it. */
static bool idle_progress(struct ph_run *run, struct ph_side *side, uint64_t timeout_ns)
{
	struct lmt_completion c[8];
	char d[640];
	uint64_t start = ph_now();
	int n = run->cfg->plugin->ops.progress(side->inst, c, 8, timeout_ns);
	uint64_t took = ph_now() - start;
	if (n < 0)
		return ph_fail(run, "%s progress with nothing posted: %s", side->host.role,
		               ph_describe(&side->host, n, d, sizeof(d)));
	if (n > 0)
		return ph_fail(run, "%s progress reported %d completions before any write",
		               side->host.role, n);
	if (took < timeout_ns)
		return ph_fail(run,
		               "%s progress(%.0f ms) with nothing to report returned after "
		               "%.1f ms, before its timeout",
		               side->host.role, pc_seconds(timeout_ns) * 1000,
		               pc_seconds(took) * 1000);
	if (took > timeout_ns + PROMPT_NS)
		return ph_fail(run, "%s progress(%.0f ms) took %.1f s", side->host.role,
		               pc_seconds(timeout_ns) * 1000, pc_seconds(took));
	return true;
}

void pc_check_idle(struct ph_run *run)
{
	struct ph_pair pair;
	char d[640];
	bool ok = ph_pair_ready(run, &pair) && ph_pair_stop_progress(run, &pair) &&
	          idle_progress(run, &pair.src, IDLE_NS) && idle_progress(run, &pair.dst, IDLE_NS);
	if (ok) {
		uint64_t start = ph_now();
		int rc = pair.plugin->ops.flush(pair.src.inst, PH_SECOND);
		uint64_t took = ph_now() - start;
		if (rc)
			ok = ph_fail(run, "flush with nothing posted: %s",
			             ph_describe(&pair.src.host, rc, d, sizeof(d)));
		else if (took > PH_SECOND + PROMPT_NS)
			ok = ph_fail(run, "flush(1 s) with nothing posted took %.1f s",
			             pc_seconds(took));
	}
	if (ok && ph_pair_quiet(run, &pair))
		ph_note(run, "progress(%.0f ms) waited its time on both sides",
		        pc_seconds(IDLE_NS) * 1000);
	ph_pair_close(&pair);
}

/* ---- Registration and writes ---------------------------------------------- */

/* Write the first and the last page of each region and check they landed
 * there and nowhere else. */
static bool write_ends(struct ph_run *run, struct ph_pair *pair, struct ph_source *source,
                       struct ph_region *regions, size_t count)
{
	struct ph_tally tally;
	if (!ph_tally_init(run, &tally, 2 * count))
		return false;
	bool ok = true;
	for (size_t i = 0; i < count && ok; i++) {
		struct ph_region *r = &regions[i];
		uint64_t last = r->len - PH_PAGE;
		ok = ph_post(run, pair, &tally, 0, source, source->mem + i * PH_PAGE, r, 0,
		             PH_PAGE) &&
		     ph_post(run, pair, &tally, pair->channels - 1, source,
		             source->mem + (i + count) * PH_PAGE, r, last, PH_PAGE);
	}
	ok = ok && ph_harvest_all(run, pair, &tally);
	for (size_t i = 0; i < count && ok; i++) {
		struct ph_region *r = &regions[i];
		uint64_t last = r->len - PH_PAGE;
		ok = ph_same(run, "first page", r->mem, source->mem + i * PH_PAGE, PH_PAGE, 0) &&
		     ph_same(run, "last page", r->mem + last, source->mem + (i + count) * PH_PAGE,
		             PH_PAGE, last) &&
		     ph_all_zero(run, "between the pages", r->mem + PH_PAGE, last - PH_PAGE,
		                 PH_PAGE) &&
		     ph_region_guards_intact(run, r);
	}
	ph_tally_fini(&tally);
	return ok;
}

void pc_check_registration(struct ph_run *run)
{
	static const size_t sizes[] = {2 * PH_PAGE, 17 * PH_PAGE, 2 * MIB + PH_PAGE};
	enum { COUNT = sizeof(sizes) / sizeof(sizes[0]) };
	struct ph_pair pair;
	struct ph_region regions[COUNT] = {{0}};
	struct ph_source source = {0};
	bool ok = ph_pair_ready(run, &pair);
	/* Registration runs while the destination progresses, as in the core. */
	for (size_t i = 0; i < COUNT && ok; i++)
		ok = ph_region_open(run, &pair, &regions[i], sizes[i]);
	ok = ok && ph_source_open(run, &pair, &source, 2 * COUNT * PH_PAGE, 1) &&
	     write_ends(run, &pair, &source, regions, COUNT);
	/* Release one and register fresh memory in its place. */
	ok = ok && ph_pair_stop_progress(run, &pair);
	if (ok) {
		ph_region_close(&pair, &regions[1]);
		ph_pair_start_progress(&pair);
		ph_fill(source.mem, source.len, 2);
		ok = ph_region_open(run, &pair, &regions[1], sizes[1]) &&
		     write_ends(run, &pair, &source, regions, COUNT) &&
		     ph_pair_stop_progress(run, &pair) && ph_pair_quiet(run, &pair);
	}
	if (ok)
		ph_note(run, "%u regions of 8 KiB to 2 MiB, key blobs of %u bytes%s", COUNT,
		        regions[0].key.len, source.mr ? ", source memory registered" : "");
	pc_finish(run, &pair, NULL, &source, regions, COUNT);
}

struct span {
	uint64_t offset;
	size_t len;
};

/* Sizes from a page to several MiB, each at an odd multiple of 4 KiB with
 * a gap before the next; then sizes that are no multiple of anything, each
 * 13 bytes after the one before; a last page that ends the region, and a
 * write of no bytes at its very end. */
static size_t plan_sizes(uint64_t chunk, struct span *spans, size_t max, uint64_t *region_len)
{
	static const size_t pages[] = {
	        PH_PAGE,      2 * PH_PAGE,           3 * PH_PAGE, 15 * PH_PAGE,
	        16 * PH_PAGE, 17 * PH_PAGE,          64 * KIB,    252 * KIB,
	        256 * KIB,    MIB - PH_PAGE,         MIB,         MIB + PH_PAGE,
	        2 * MIB,      3 * MIB + 5 * PH_PAGE, 4 * MIB,     8 * MIB,
	        5 * PH_PAGE,
	};
	static const size_t odd[] = {
	        1,           7,           92,   93,           100,           512,
	        PH_PAGE - 1, PH_PAGE + 3, 8257, 64 * KIB + 1, 256 * KIB + 3, MIB + 1,
	};
	size_t n = 0;
	uint64_t at = PH_PAGE;
	for (size_t i = 0; i < sizeof(pages) / sizeof(pages[0]) && n + 3 < max; i++) {
		if (pages[i] > chunk)
			continue;
		spans[n++] = (struct span){at, pages[i]};
		uint64_t end = at + pages[i];
		at = end + ((end / PH_PAGE) % 2 ? 2 : 1) * PH_PAGE;
	}
	for (size_t i = 0; i < sizeof(odd) / sizeof(odd[0]) && n + 3 < max; i++) {
		if (odd[i] > chunk)
			continue;
		spans[n++] = (struct span){at + 13, odd[i]};
		at += 13 + odd[i];
	}
	at = (at + 2 * PH_PAGE - 1) / PH_PAGE * PH_PAGE;
	spans[n++] = (struct span){at, PH_PAGE};
	*region_len = at + PH_PAGE;
	spans[n++] = (struct span){*region_len, 0};
	return n;
}

static bool post_spans(struct ph_run *run, struct ph_pair *pair, struct ph_tally *tally,
                       struct ph_source *source, struct ph_region *region, const struct span *spans,
                       size_t n, bool reverse)
{
	for (size_t k = 0; k < n; k++) {
		const struct span *s = &spans[reverse ? n - 1 - k : k];
		const uint8_t *local = source->mem + (s->len ? s->offset : 0);
		if (!ph_post(run, pair, tally, (uint32_t)(k % pair->channels), source, local,
		             region, s->offset, s->len))
			return false;
	}
	return true;
}

/* The spans hold the source's bytes, everything else is still zero. */
static bool spans_landed(struct ph_run *run, const struct ph_region *region,
                         const struct ph_source *source, const struct span *spans, size_t n)
{
	uint64_t at = 0;
	for (size_t i = 0; i < n; i++) {
		const struct span *s = &spans[i];
		if (!ph_all_zero(run, "a gap between writes", region->mem + at, s->offset - at,
		                 at) ||
		    !ph_same(run, "a write", region->mem + s->offset, source->mem + s->offset,
		             s->len, s->offset))
			return false;
		at = s->offset + s->len;
	}
	return ph_all_zero(run, "after the last write", region->mem + at, region->len - at, at) &&
	       ph_region_guards_intact(run, region);
}

static bool flush(struct ph_run *run, struct ph_pair *pair)
{
	char d[640];
	int rc = pair->plugin->ops.flush(pair->src.inst, 30 * PH_SECOND);
	return rc == 0 || ph_fail(run, "flush: %s", ph_describe(&pair->src.host, rc, d, sizeof(d)));
}

void pc_check_sizes(struct ph_run *run)
{
	struct span spans[48];
	uint64_t len;
	size_t n = plan_sizes(run->cfg->chunk_size, spans, 48, &len);
	struct ph_pair pair;
	struct ph_region region = {0};
	struct ph_source source = {0};
	struct ph_tally tally = {0};
	bool ok = ph_pair_ready(run, &pair) && ph_region_open(run, &pair, &region, len) &&
	          ph_source_open(run, &pair, &source, len, 3) && ph_tally_init(run, &tally, 2 * n);
	/* Harvested, then flushed; then every byte again, new, in reverse
	 * order, flushed and compared before anything is harvested. */
	ok = ok && post_spans(run, &pair, &tally, &source, &region, spans, n, false) &&
	     ph_harvest_all(run, &pair, &tally) && flush(run, &pair) &&
	     spans_landed(run, &region, &source, spans, n);
	if (ok)
		ph_fill(source.mem, source.len, 4);
	ok = ok && post_spans(run, &pair, &tally, &source, &region, spans, n, true) &&
	     flush(run, &pair) && spans_landed(run, &region, &source, spans, n) &&
	     ph_harvest_all(run, &pair, &tally);
	ok = ok && ph_pair_stop_progress(run, &pair) && ph_pair_quiet(run, &pair);
	size_t largest = 0;
	for (size_t i = 0; i < n; i++)
		largest = spans[i].len > largest ? spans[i].len : largest;
	if (ok)
		ph_note(run,
		        "%zu writes of 0 bytes to %zu KiB, page-aligned and not, twice; flush "
		        "before harvest the second time",
		        n, largest / KIB);
	pc_finish(run, &pair, &tally, &source, &region, 1);
}

/* One write as large as the core may post (chunk-size, 8M unless -o says
 * otherwise), starting a byte into a page, and nothing around it touched. */
void pc_check_largest(struct ph_run *run)
{
	size_t big = run->cfg->chunk_size, len = big + 2 * PH_PAGE;
	struct ph_pair pair;
	struct ph_region region = {0};
	struct ph_source source = {0};
	struct ph_tally tally = {0};
	bool ok = ph_pair_ready(run, &pair) && ph_region_open(run, &pair, &region, len) &&
	          ph_source_open(run, &pair, &source, len, 12) && ph_tally_init(run, &tally, 1) &&
	          ph_post(run, &pair, &tally, 0, &source, source.mem + 1, &region, PH_PAGE + 1,
	                  big) &&
	          ph_harvest_all(run, &pair, &tally) && flush(run, &pair) &&
	          ph_all_zero(run, "before the write", region.mem, PH_PAGE + 1, 0) &&
	          ph_same(run, "the write", region.mem + PH_PAGE + 1, source.mem + 1, big,
	                  PH_PAGE + 1) &&
	          ph_all_zero(run, "after the write", region.mem + PH_PAGE + 1 + big, PH_PAGE - 1,
	                      PH_PAGE + 1 + big) &&
	          ph_region_guards_intact(run, &region) && ph_pair_stop_progress(run, &pair) &&
	          ph_pair_quiet(run, &pair);
	if (ok)
		ph_note(run, "%zu MiB in one write", big / MIB);
	pc_finish(run, &pair, &tally, &source, &region, 1);
}

/* A plugin that declares `encrypts` keys its channels from the session's
 * channel secret (tls=on): with the same secret on both sides writes land;
 * a source with another secret cannot connect a channel. */
void pc_check_encryption(struct ph_run *run)
{
	if (!(run->cfg->caps & LMT_CAP_ENCRYPTS)) {
		ph_note(run, "no encrypts capability: with tls=on the channels stay in clear");
		return;
	}
	uint8_t secret[32], other[32];
	memset(secret, 0xa5, sizeof(secret));
	memcpy(other, secret, sizeof(other));
	other[0] ^= 0x80;
	const size_t len = 2 * MIB;
	struct ph_pair pair;
	struct ph_region region = {0};
	struct ph_source source = {0};
	struct ph_tally tally = {0};
	ph_pair_init(&pair, run->cfg);
	pair.src.channel_secret = secret;
	pair.dst.channel_secret = secret;
	uint32_t last = pair.channels - 1;
	bool ok = ph_pair_bring_up(run, &pair) && ph_region_open(run, &pair, &region, len) &&
	          ph_source_open(run, &pair, &source, len, 21) && ph_tally_init(run, &tally, 2) &&
	          ph_post(run, &pair, &tally, 0, &source, source.mem, &region, 0, len / 2) &&
	          ph_post(run, &pair, &tally, last, &source, source.mem + len / 2, &region, len / 2,
	                  len / 2) &&
	          ph_harvest_all(run, &pair, &tally) && flush(run, &pair) &&
	          ph_same(run, "the writes", region.mem, source.mem, len, 0) &&
	          ph_region_guards_intact(run, &region) && ph_pair_stop_progress(run, &pair) &&
	          ph_pair_quiet(run, &pair);
	pc_finish(run, &pair, &tally, &source, &region, 1);
	if (!ok)
		return;

	/* Another secret: the connect must fail, on the source's side. */
	struct ph_run wrong = {.cfg = run->cfg};
	ph_pair_init(&pair, run->cfg);
	pair.channels = 1;
	pair.src.channel_secret = other;
	pair.dst.channel_secret = secret;
	bool opened = ph_pair_open_instances(run, &pair, 2 * PH_SECOND) &&
	              ph_pair_open_endpoints(run, &pair);
	bool connected = opened && ph_pair_connect(&wrong, &pair);
	ph_pair_close(&pair);
	if (!opened)
		return;
	if (connected) {
		ph_fail(run, "a source with another channel secret connected a channel");
		return;
	}
	if (!strstr(wrong.why, "source ep_connect")) {
		ph_fail(run,
		        "with another channel secret: expected the source's ep_connect to "
		        "fail, got: %s",
		        wrong.why);
		return;
	}
	ph_note(run, "%zu KiB over %u channel%s with a channel secret; another secret refused",
	        len / KIB, last + 1, last ? "s" : "");
}

void pc_check_cookies(struct ph_run *run)
{
	enum { WRITES = 4096 };
	static const uint32_t maxes[] = {1, 2, 3, 7, 64, 256};
	struct ph_pair pair;
	struct ph_region region = {0};
	struct ph_source source = {0};
	struct ph_tally tally = {0};
	size_t len = (size_t)WRITES * PH_PAGE;
	bool ok = ph_pair_ready(run, &pair) && ph_region_open(run, &pair, &region, len) &&
	          ph_source_open(run, &pair, &source, len, 5) && ph_tally_init(run, &tally, WRITES);
	for (uint64_t i = 0; i < WRITES && ok; i++) {
		/* Pages in a shuffled order, spread over the channels. */
		uint64_t page = (i * 1031) % WRITES;
		ok = ph_post(run, &pair, &tally, (uint32_t)(i % pair.channels), &source,
		             source.mem + page * PH_PAGE, &region, page * PH_PAGE, PH_PAGE);
		if (ok && i % 5 == 0)
			ok = ph_harvest(run, &pair, &tally, maxes[i / 5 % 6], 0) >= 0;
	}
	ok = ok && ph_harvest_all(run, &pair, &tally);
	/* Nothing more may come. */
	int extra = ok ? ph_harvest(run, &pair, &tally, 16, PH_SECOND / 5) : 0;
	if (extra > 0)
		ok = ph_fail(run, "%d completions after every write had completed", extra);
	ok = ok && extra == 0 && ph_same(run, "the region", region.mem, source.mem, len, 0) &&
	     ph_region_guards_intact(run, &region) && ph_pair_stop_progress(run, &pair) &&
	     ph_pair_quiet(run, &pair);
	if (ok)
		ph_note(run, "%d writes over %u channel%s, %llu EAGAIN answers", WRITES,
		        pair.channels, pair.channels == 1 ? "" : "s",
		        (unsigned long long)tally.eagain);
	pc_finish(run, &pair, &tally, &source, &region, 1);
}

void pc_check_flush(struct ph_run *run)
{
	enum { WRITES = 16 };
	size_t piece = run->cfg->chunk_size < 512 * KIB ? run->cfg->chunk_size : 512 * KIB;
	size_t len = WRITES * piece;
	struct ph_pair pair;
	struct ph_region region = {0};
	struct ph_source source = {0};
	struct ph_tally tally = {0};
	bool ok = ph_pair_ready(run, &pair) && ph_region_open(run, &pair, &region, len) &&
	          ph_source_open(run, &pair, &source, len, 6) &&
	          ph_tally_init(run, &tally, WRITES + 1);
	for (uint64_t i = 0; i < WRITES && ok; i++)
		ok = ph_post(run, &pair, &tally, (uint32_t)(i % pair.channels), &source,
		             source.mem + i * piece, &region, i * piece, piece);
	/* Nothing harvested yet: flush alone must make every write visible. */
	ok = ok && flush(run, &pair) &&
	     ph_same(run, "after flush", region.mem, source.mem, len, 0) &&
	     ph_harvest_all(run, &pair, &tally);
	/* A single small write, then flush again. */
	if (ok)
		ph_fill(source.mem, PH_PAGE, 7);
	ok = ok && ph_post(run, &pair, &tally, 0, &source, source.mem, &region, 0, PH_PAGE) &&
	     flush(run, &pair) && ph_same(run, "after flush", region.mem, source.mem, PH_PAGE, 0) &&
	     ph_harvest_all(run, &pair, &tally);
	ok = ok && ph_region_guards_intact(run, &region) && ph_pair_stop_progress(run, &pair) &&
	     ph_pair_quiet(run, &pair);
	if (ok)
		ph_note(run, "%d writes of %zu KiB, then one page", WRITES, piece / KIB);
	pc_finish(run, &pair, &tally, &source, &region, 1);
}

/* Keep retrying a write that answered EAGAIN, with progress in between. */
static bool retry(struct ph_run *run, struct ph_pair *pair, struct ph_tally *tally,
                  uint32_t channel, struct ph_source *source, struct ph_region *region,
                  uint64_t page)
{
	uint64_t deadline = ph_now() + 10 * PH_SECOND;
	for (;;) {
		if (ph_harvest(run, pair, tally, 64, PH_SECOND / 100) < 0)
			return false;
		int rc =
		        ph_post_once(run, pair, tally, channel, source,
		                     source->mem + page * PH_PAGE, region, page * PH_PAGE, PH_PAGE);
		if (rc == 0)
			return true;
		if (rc != -LMT_EAGAIN)
			return false;
		if (ph_now() > deadline)
			return ph_fail(run,
			               "write answered LMT_EAGAIN for 10 s with %llu writes "
			               "outstanding, while progress ran",
			               (unsigned long long)(tally->posted - tally->done));
	}
}

/* Post without harvesting until the plugin answers EAGAIN with writes
 * outstanding; progress must then make room. *full_at is how many were
 * outstanding, 0 if the queue never filled. */
static bool fill_queue(struct ph_run *run, struct ph_pair *pair, struct ph_tally *tally,
                       struct ph_source *source, struct ph_region *region, uint64_t pages,
                       uint64_t *full_at)
{
	*full_at = 0;
	while (tally->posted < pages && !*full_at) {
		uint64_t page = tally->posted;
		uint32_t channel = (uint32_t)(page % pair->channels);
		int rc =
		        ph_post_once(run, pair, tally, channel, source,
		                     source->mem + page * PH_PAGE, region, page * PH_PAGE, PH_PAGE);
		if (rc == 0)
			continue;
		if (rc != -LMT_EAGAIN)
			return false;
		/* With nothing outstanding it is a transient answer, not a full
		 * queue; either way progress must let the write through. */
		*full_at = tally->posted - tally->done;
		if (!retry(run, pair, tally, channel, source, region, page))
			return false;
	}
	return true;
}

/* A queue that never fills would grow without bound: every plugin answers
 * EAGAIN at some depth, and the core relies on it to pace its writes. */
void pc_check_queue_full(struct ph_run *run)
{
	enum { PAGES = 8192 };
	size_t len = (size_t)PAGES * PH_PAGE;
	struct ph_pair pair;
	struct ph_region region = {0};
	struct ph_source source = {0};
	struct ph_tally tally = {0};
	uint64_t full_at = 0;
	bool ok = ph_pair_ready(run, &pair) && ph_region_open(run, &pair, &region, len) &&
	          ph_source_open(run, &pair, &source, len, 8) &&
	          ph_tally_init(run, &tally, PAGES) &&
	          fill_queue(run, &pair, &tally, &source, &region, PAGES, &full_at);
	if (ok && !full_at)
		ok = ph_fail(run,
		             "%d writes posted without a harvest and never LMT_EAGAIN: a "
		             "plugin's queue must be bounded",
		             PAGES);
	for (uint64_t i = tally.posted; i < PAGES && ok; i++)
		ok = ph_post(run, &pair, &tally, (uint32_t)(i % pair.channels), &source,
		             source.mem + i * PH_PAGE, &region, i * PH_PAGE, PH_PAGE);
	ok = ok && ph_harvest_all(run, &pair, &tally) && flush(run, &pair) &&
	     ph_same(run, "the region", region.mem, source.mem, len, 0) &&
	     ph_pair_stop_progress(run, &pair) && ph_pair_quiet(run, &pair);
	if (ok)
		ph_note(run, "EAGAIN with %llu write%s outstanding, accepted after progress",
		        (unsigned long long)full_at, full_at == 1 ? "" : "s");
	pc_finish(run, &pair, &tally, &source, &region, 1);
}
