/* lmt-plugin-check: error paths — malformed blobs, writes out of bounds,
 * timeouts and cancels. */
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

/* ---- Error paths ----------------------------------------------------------- */

struct variant {
	const char *what;
	struct lmt_blob blob;
};

static bool refuses(struct ph_run *run, struct ph_host *host, const char *what, int before, int rc,
                    int expected);

/* Malformed copies of a good blob. */
static size_t malformed(const struct lmt_blob *good, struct variant *out)
{
	size_t n = 0;
	out[n] = (struct variant){.what = "an empty blob"};
	n++;
	if (good->len > 2) {
		out[n] = (struct variant){.what = "its first byte", .blob = *good};
		out[n++].blob.len = 1;
		out[n] = (struct variant){.what = "its first half", .blob = *good};
		out[n++].blob.len = good->len / 2;
	}
	if (good->len > 1) {
		out[n] = (struct variant){.what = "it one byte short", .blob = *good};
		out[n++].blob.len = good->len - 1;
	}
	if (good->len < LMT_BLOB_MAX) {
		out[n] = (struct variant){.what = "it with a zero byte more", .blob = *good};
		out[n++].blob.len = good->len + 1;
	}
	out[n] =
	        (struct variant){.what = "it claiming more than LMT_BLOB_MAX bytes", .blob = *good};
	out[n++].blob.len = LMT_BLOB_MAX + 1;
	out[n] = (struct variant){.what = "as many zero bytes", .blob.len = good->len};
	n++;
	out[n] = (struct variant){.what = "as many 0xff bytes", .blob.len = good->len};
	memset(out[n++].blob.data, 0xff, good->len);
	return n;
}

/* Good addresses given to the wrong endpoint: one of its own side, and the
 * peer's for another channel. */
static size_t misdirected(const struct ph_pair *pair, const struct ph_side *own,
                          const struct ph_side *peer, struct variant *out)
{
	size_t n = 0;
	out[n++] = (struct variant){.what = "an address of its own side", .blob = own->addr[0]};
	if (pair->channels > 1)
		out[n++] = (struct variant){.what = "the peer's address for channel 1",
		                            .blob = peer->addr[1]};
	return n;
}

/* Every variant refused with LMT_EPROTO by `side`'s ep_connect of channel 0. */
static bool refuses_addresses(struct ph_run *run, struct ph_pair *pair, struct ph_side *side,
                              const struct ph_side *peer, size_t *count)
{
	struct variant v[12];
	size_t n = malformed(&peer->addr[0], v);
	n += misdirected(pair, side, peer, v + n);
	char what[200];
	for (size_t i = 0; i < n; i++) {
		snprintf(what, sizeof(what), "%s ep_connect with %s (of a %u-byte address)",
		         side->host.role, v[i].what, peer->addr[0].len);
		int before = ph_host_errors(&side->host);
		int rc = pair->plugin->ops.ep_connect(side->ep[0], &v[i].blob);
		if (!refuses(run, &side->host, what, before, rc, -LMT_EPROTO))
			return false;
	}
	*count = n;
	return true;
}

static bool refuses(struct ph_run *run, struct ph_host *host, const char *what, int before, int rc,
                    int expected)
{
	if (rc == 0)
		return ph_fail(run, "%s: accepted", what);
	if (rc != expected)
		return ph_fail(run, "%s: returned %s, expected %s", what, lmt_err_name(rc),
		               lmt_err_name(expected));
	return ph_error_recorded(run, host, before, rc, what);
}

void pc_check_bad_address(struct ph_run *run)
{
	struct ph_pair pair;
	size_t sent = 0, received = 0;
	/* A short timeout: a destination that waits before it validates
	 * returns LMT_ETIMEDOUT, not LMT_EPROTO. */
	if (ph_pair_open(run, &pair, 3 * PH_SECOND) && ph_pair_open_endpoints(run, &pair) &&
	    refuses_addresses(run, &pair, &pair.src, &pair.dst, &sent) &&
	    refuses_addresses(run, &pair, &pair.dst, &pair.src, &received))
		ph_note(run,
		        "%zu malformed or misdirected blobs refused with LMT_EPROTO by the "
		        "source, %zu by the destination",
		        sent, received);
	ph_pair_close(&pair);
}

void pc_check_bad_key(struct ph_run *run)
{
	struct ph_pair pair;
	struct ph_region region = {0};
	struct variant v[12];
	char what[160], d[640];
	size_t n = 0;
	bool ok = ph_pair_ready(run, &pair) && ph_region_open(run, &pair, &region, 16 * PH_PAGE);
	if (ok) {
		n = malformed(&region.key, v);
		for (size_t i = 0; i < n && ok; i++) {
			snprintf(what, sizeof(what), "rkey_import of %s (of a %u-byte key)",
			         v[i].what, region.key.len);
			lmt_rkey *rkey = NULL;
			int before = ph_host_errors(&pair.src.host);
			int rc = pair.plugin->ops.rkey_import(pair.src.inst, &v[i].blob, &rkey);
			ok = refuses(run, &pair.src.host, what, before, rc, -LMT_EPROTO);
			if (rc == 0 && rkey)
				pair.plugin->ops.rkey_release(pair.src.inst, rkey);
		}
	}
	/* The refusals left the instance as it was: the good key still imports. */
	lmt_rkey *again = NULL;
	int rc = ok ? pair.plugin->ops.rkey_import(pair.src.inst, &region.key, &again) : 0;
	if (rc)
		ok = ph_fail(run, "rkey_import of the good key after the malformed ones: %s",
		             ph_describe(&pair.src.host, rc, d, sizeof(d)));
	if (again)
		pair.plugin->ops.rkey_release(pair.src.inst, again);
	ok = ok && ph_pair_stop_progress(run, &pair);
	if (ok)
		ph_note(run, "%zu malformed keys refused with LMT_EPROTO, the good one still taken",
		        n);
	pc_finish(run, &pair, NULL, NULL, &region, 1);
}

void pc_check_beyond(struct ph_run *run)
{
	const size_t len = 16 * PH_PAGE;
	const struct {
		uint64_t offset;
		size_t len;
	} bad[] = {
	        {len, 1},
	        {len - PH_PAGE, 2 * PH_PAGE},
	        {0, len + 1},
	        {len + PH_PAGE, PH_PAGE},
	        {UINT64_MAX - PH_PAGE + 1, PH_PAGE},
	        {UINT64_MAX, 2},
	        {1, SIZE_MAX},
	};
	struct ph_pair pair;
	struct ph_region region = {0};
	struct ph_source source = {0};
	struct ph_tally tally = {0};
	char what[160];
	bool ok = ph_pair_ready(run, &pair) && ph_region_open(run, &pair, &region, len) &&
	          ph_source_open(run, &pair, &source, len + 2 * PH_PAGE, 9) &&
	          ph_tally_init(run, &tally, 2);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]) && ok; i++) {
		snprintf(what, sizeof(what),
		         "a write of %zu byte%s at offset %llu of a %zu-byte key", bad[i].len,
		         bad[i].len == 1 ? "" : "s", (unsigned long long)bad[i].offset, len);
		int before = ph_host_errors(&pair.src.host);
		int rc = pair.plugin->ops.write(pair.src.ep[0], source.mem, bad[i].len, source.mr,
		                                region.rkey, bad[i].offset, 1000 + i);
		ok = refuses(run, &pair.src.host, what, before, rc, -LMT_EINVAL);
	}
	ok = ok && ph_all_zero(run, "the region after refused writes", region.mem, len, 0);
	/* The last page and the last byte are still writable. */
	ok = ok &&
	     ph_post(run, &pair, &tally, 0, &source, source.mem, &region, len - PH_PAGE, PH_PAGE) &&
	     ph_harvest_all(run, &pair, &tally) &&
	     ph_post(run, &pair, &tally, 0, &source, source.mem + 2 * PH_PAGE, &region, len - 1,
	             1) &&
	     ph_harvest_all(run, &pair, &tally);
	if (ok) {
		uint8_t want[PH_PAGE];
		memcpy(want, source.mem, PH_PAGE);
		want[PH_PAGE - 1] = source.mem[2 * PH_PAGE];
		ok = ph_same(run, "the last page", region.mem + len - PH_PAGE, want, PH_PAGE,
		             len - PH_PAGE) &&
		     ph_region_guards_intact(run, &region);
	}
	ok = ok && ph_pair_stop_progress(run, &pair);
	if (ok)
		ph_note(run, "%zu writes past the end refused with LMT_EINVAL",
		        sizeof(bad) / sizeof(bad[0]));
	pc_finish(run, &pair, &tally, &source, &region, 1);
}

/* A blocking call that gave up must return within `limit` with `expected`;
 * with 0 only when `may_succeed`, for a call that had nothing to wait for. */
static bool prompt(struct ph_run *run, struct ph_host *host, const char *what, int before, int rc,
                   uint64_t took, uint64_t limit, int expected, bool may_succeed)
{
	if (took > limit)
		return ph_fail(run, "%s took %.1f s", what, pc_seconds(took));
	if (rc == 0 && !may_succeed)
		return ph_fail(run, "%s returned 0, expected %s", what, lmt_err_name(expected));
	if (rc < 0 && rc != expected)
		return ph_fail(run, "%s returned %s, expected %s%s", what, lmt_err_name(rc),
		               lmt_err_name(expected), may_succeed ? " or 0" : "");
	return rc >= 0 || ph_error_recorded(run, host, before, rc, what);
}

/* A destination's ep_connect with no source. A plugin whose destination
 * waits there for the source gives up with LMT_ETIMEDOUT (*waits); one that
 * does not wait returns 0. */
static bool connect_times_out(struct ph_run *run, bool *waits)
{
	struct ph_pair pair;
	bool ok = ph_pair_open(run, &pair, PH_SECOND / 2) && ph_pair_open_endpoints(run, &pair);
	if (ok) {
		int before = ph_host_errors(&pair.dst.host);
		uint64_t start = ph_now();
		int rc = pair.plugin->ops.ep_connect(pair.dst.ep[0], &pair.src.addr[0]);
		ok = prompt(run, &pair.dst.host,
		            "a destination's ep_connect(timeout 500 ms), with no source", before,
		            rc, ph_now() - start, PH_SECOND / 2 + PROMPT_NS, -LMT_ETIMEDOUT, true);
		*waits = rc != 0;
	}
	ph_pair_close(&pair);
	return ok;
}

/* Cancelled calls return LMT_ECANCELED; only an ep_connect that does not
 * wait (see connect_times_out) may return 0. */
static bool cancelled_calls(struct ph_run *run, bool waits)
{
	struct ph_pair pair;
	struct lmt_completion c[4];
	bool ok = ph_pair_open(run, &pair, 30 * PH_SECOND) && ph_pair_open_endpoints(run, &pair);
	if (ok) {
		atomic_store(&pair.dst.host.cancelled, 1);
		int before = ph_host_errors(&pair.dst.host);
		uint64_t start = ph_now();
		int rc = pair.plugin->ops.ep_connect(pair.dst.ep[0], &pair.src.addr[0]);
		ok = prompt(run, &pair.dst.host,
		            "a cancelled destination's ep_connect, with no source", before, rc,
		            ph_now() - start, CANCEL_PROMPT_NS, -LMT_ECANCELED, !waits);
	}
	if (ok) {
		int before = ph_host_errors(&pair.dst.host);
		uint64_t start = ph_now();
		int rc = pair.plugin->ops.progress(pair.dst.inst, c, 4, 30 * PH_SECOND);
		ok = prompt(run, &pair.dst.host, "a cancelled destination's progress(30 s)", before,
		            rc, ph_now() - start, CANCEL_PROMPT_NS, -LMT_ECANCELED, false);
	}
	if (ok) {
		atomic_store(&pair.src.host.cancelled, 1);
		int before = ph_host_errors(&pair.src.host);
		uint64_t start = ph_now();
		int rc = pair.plugin->ops.progress(pair.src.inst, c, 4, 30 * PH_SECOND);
		ok = prompt(run, &pair.src.host, "a cancelled source's progress(30 s)", before, rc,
		            ph_now() - start, CANCEL_PROMPT_NS, -LMT_ECANCELED, false);
	}
	ph_pair_close(&pair);
	return ok;
}

void pc_check_cancel(struct ph_run *run)
{
	bool waits = false;
	if (connect_times_out(run, &waits) && cancelled_calls(run, waits))
		ph_note(run,
		        "the destination's ep_connect %s; cancelled, it and progress on both "
		        "sides returned within %.0f s",
		        waits ? "waits for the source until its timeout" : "does not wait",
		        pc_seconds(CANCEL_PROMPT_NS));
}
