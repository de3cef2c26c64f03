/* The checks of lmt-plugin-check, one function each, in the order they run.
 * Each drives the plugin under test through the ABI alone. */
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

#define KIB 1024u
#define MIB (1024u * 1024u)
#define ALL_CAPS                                                                                   \
	(LMT_CAP_ONE_SIDED | LMT_CAP_LOCAL_MR | LMT_CAP_PIN | LMT_CAP_MULTI_CHANNEL |              \
	 LMT_CAP_TARGET_PROGRESS | LMT_CAP_DECORATOR | LMT_CAP_MERGES_RUNS | LMT_CAP_ENCRYPTS |   \
	 LMT_CAP_STORAGE)
#define PROMPT_NS (2 * PH_SECOND)  /* a timed-out call returns this soon after */
#define CANCEL_PROMPT_NS PH_SECOND /* a cancelled call returns this soon */
#define IDLE_NS (PH_SECOND / 20)   /* how long idle progress waits */

static double seconds(uint64_t ns)
{
	return (double)ns / PH_SECOND;
}

static bool one_line(const char *text)
{
	return text && *text && !strchr(text, '\n');
}

static bool valid_name(const char *name, size_t max)
{
	size_t len = name ? strlen(name) : 0;
	if (len == 0 || len > max)
		return false;
	for (size_t i = 0; i < len; i++)
		if (!((name[i] >= 'a' && name[i] <= 'z') || (name[i] >= '0' && name[i] <= '9') ||
		      name[i] == '_' || name[i] == '-'))
			return false;
	return true;
}

/* Tear down as the core does: the destination's progress stopped, memory
 * released, then the instances. */
static void finish(struct ph_run *run, struct ph_pair *pair, struct ph_tally *tally,
                   struct ph_source *source, struct ph_region *regions, size_t count)
{
	ph_pair_stop_progress(run, pair);
	if (tally)
		ph_tally_fini(tally);
	if (source)
		ph_source_close(pair, source);
	for (size_t i = 0; i < count; i++)
		ph_region_close(pair, &regions[i]);
	ph_pair_close(pair);
}

/* ---- The descriptor ------------------------------------------------------- */

static void format_caps(uint64_t caps, char *buf, size_t size)
{
	static const struct {
		uint64_t bit;
		const char *name;
	} names[] = {
	        {LMT_CAP_ONE_SIDED, "one-sided"},
	        {LMT_CAP_LOCAL_MR, "local-mr"},
	        {LMT_CAP_PIN, "pin"},
	        {LMT_CAP_MULTI_CHANNEL, "multi-channel"},
	        {LMT_CAP_TARGET_PROGRESS, "target-progress"},
	        {LMT_CAP_DECORATOR, "decorator"},
	        {LMT_CAP_MERGES_RUNS, "merges-runs"},
	        {LMT_CAP_ENCRYPTS, "encrypts"},
	        {LMT_CAP_STORAGE, "storage"},
	};
	size_t used = 0;
	buf[0] = 0;
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (caps & names[i].bit)
			used += (size_t)snprintf(buf + used, size - used, "%s%s", used ? " " : "",
			                         names[i].name);
	if (!used)
		snprintf(buf, size, "none");
}

static void check_descriptor(struct ph_run *run)
{
	const struct lmt_plugin *d = run->cfg->plugin;
	if (d->abi_version < 1 || d->abi_version > LMT_PLUGIN_ABI_VERSION) {
		ph_fail(run, "ABI v%u, expected v1 to v%u", d->abi_version, LMT_PLUGIN_ABI_VERSION);
		return;
	}
	if (d->abi_version == LMT_PLUGIN_ABI_VERSION && d->struct_size < LMT_PLUGIN_V1_MIN_SIZE) {
		ph_fail(run, "struct_size %u is smaller than ABI v%u's %zu", d->struct_size,
		        d->abi_version, (size_t)LMT_PLUGIN_V1_MIN_SIZE);
		return;
	}
	if (!valid_name(d->name, 32)) {
		ph_fail(run, "name '%s' is not [a-z0-9_-]{1,32}", d->name ? d->name : "(null)");
		return;
	}
	const char *file = strrchr(run->cfg->path, '/');
	file = file ? file + 1 : run->cfg->path;
	size_t len = strlen(d->name);
	if (strncmp(file, d->name, len) != 0 || strcmp(file + len, ".so") != 0) {
		ph_fail(run, "declares '%s' from %s: lmt looks for it as %s.so", d->name, file,
		        d->name);
		return;
	}
	if (!one_line(d->version) || !one_line(d->description)) {
		ph_fail(run, "version and description must be one non-empty line each");
		return;
	}
	if (d->caps & ~(uint64_t)ALL_CAPS) {
		ph_fail(run, "unknown capability bits 0x%llx",
		        (unsigned long long)(d->caps & ~(uint64_t)ALL_CAPS));
		return;
	}
	const struct lmt_plugin_ops *o = &d->ops;
	const void *ops[] = {o->instance_open, o->instance_close, o->ep_open,       o->ep_connect,
	                     o->ep_close,      o->mr_register,    o->mr_deregister, o->rkey_import,
	                     o->rkey_release,  o->write,          o->progress,      o->flush};
	static const char *const op_names[] = {"instance_open", "instance_close", "ep_open",
	                                       "ep_connect",    "ep_close",       "mr_register",
	                                       "mr_deregister", "rkey_import",    "rkey_release",
	                                       "write",         "progress",       "flush"};
	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++)
		if (!ops[i]) {
			ph_fail(run, "ops.%s is NULL", op_names[i]);
			return;
		}
	if (d->option_count && !d->options) {
		ph_fail(run, "%u options but no table", d->option_count);
		return;
	}
	char caps[128];
	format_caps(d->caps, caps, sizeof(caps));
	ph_note(run, "%s %s, ABI v%u, caps: %s", d->name, d->version, d->abi_version, caps);
}

static void check_exports(struct ph_run *run)
{
	char extra[512];
	int n = pc_exports(run->cfg->path, extra, sizeof(extra));
	if (n < 0)
		ph_fail(run, "%s", extra);
	else if (n > 0)
		ph_fail(run, "%d more symbol%s than %s: %s (build with -fvisibility=hidden)", n,
		        n == 1 ? "" : "s", LMT_PLUGIN_ENTRY_SYMBOL, extra);
}

/* Offer `core_abi`; 0 with the answer in *out, or the entry's error. */
static int offer(lmt_plugin_entry_fn entry, uint32_t core_abi, const struct lmt_plugin **out)
{
	*out = NULL;
	return entry(core_abi, out);
}

static bool answers_newer(struct ph_run *run, lmt_plugin_entry_fn entry, uint32_t core_abi,
                          uint32_t current)
{
	const struct lmt_plugin *d;
	int rc = offer(entry, core_abi, &d);
	if (rc || !d)
		return ph_fail(run,
		               "an offer of ABI v%u (newer than it speaks) got %s; it should "
		               "answer with the newest it speaks",
		               core_abi, rc ? lmt_err_name(rc) : "no descriptor");
	if (d->abi_version > core_abi || d->abi_version < current)
		return ph_fail(run, "an offer of ABI v%u got v%u, but v%u for v%u", core_abi,
		               d->abi_version, current, LMT_PLUGIN_ABI_VERSION);
	return true;
}

static void negotiate(struct ph_run *run, lmt_plugin_entry_fn entry)
{
	const struct lmt_plugin *d, *again;
	int rc = offer(entry, LMT_PLUGIN_ABI_VERSION, &d);
	if (rc || !d) {
		ph_fail(run, "an offer of ABI v%u got %s", LMT_PLUGIN_ABI_VERSION,
		        rc ? lmt_err_name(rc) : "no descriptor");
		return;
	}
	uint32_t current = d->abi_version;
	if (current < 1 || current > LMT_PLUGIN_ABI_VERSION) {
		ph_fail(run, "an offer of ABI v%u got v%u", LMT_PLUGIN_ABI_VERSION, current);
		return;
	}
	if (offer(entry, LMT_PLUGIN_ABI_VERSION, &again) != 0 || again != d) {
		ph_fail(run, "two offers of ABI v%u got different answers", LMT_PLUGIN_ABI_VERSION);
		return;
	}
	static const uint32_t newer[] = {LMT_PLUGIN_ABI_VERSION + 1, 1000, UINT32_MAX};
	for (size_t i = 0; i < sizeof(newer) / sizeof(newer[0]); i++)
		if (!answers_newer(run, entry, newer[i], current))
			return;
	for (uint32_t v = 1; v < LMT_PLUGIN_ABI_VERSION; v++) {
		rc = offer(entry, v, &again);
		if (rc == 0 && (!again || again->abi_version > v)) {
			ph_fail(run, "an offer of ABI v%u got v%u", v,
			        again ? again->abi_version : 0);
			return;
		}
		if (rc && rc != -LMT_EABI) {
			ph_fail(run, "an offer of ABI v%u got %s, expected LMT_EABI", v,
			        lmt_err_name(rc));
			return;
		}
	}
	rc = offer(entry, 0, &again);
	if (rc != -LMT_EABI) {
		ph_fail(run, "an offer of ABI v0, which does not exist, got %s, expected LMT_EABI",
		        lmt_err_name(rc));
		return;
	}
	ph_note(run, "v%u for offers v%u, v%u, v1000 and v%u; v0 refused", current,
	        LMT_PLUGIN_ABI_VERSION, LMT_PLUGIN_ABI_VERSION + 1, UINT32_MAX);
}

static void check_negotiation(struct ph_run *run)
{
	void *dl = dlopen(run->cfg->path, RTLD_NOW | RTLD_LOCAL);
	if (!dl) {
		ph_fail(run, "dlopen: %s", dlerror());
		return;
	}
	void *sym = dlsym(dl, LMT_PLUGIN_ENTRY_SYMBOL);
	Dl_info info;
	char mine[PATH_MAX], theirs[PATH_MAX];
	if (!sym) {
		ph_fail(run, "no %s symbol", LMT_PLUGIN_ENTRY_SYMBOL);
	} else if (!dladdr(sym, &info) || !info.dli_fname || !realpath(info.dli_fname, theirs) ||
	           !realpath(run->cfg->path, mine) || strcmp(mine, theirs) != 0) {
		ph_fail(run, "%s comes from %s, not from the plugin's own file",
		        LMT_PLUGIN_ENTRY_SYMBOL, info.dli_fname ? info.dli_fname : "elsewhere");
	} else {
		lmt_plugin_entry_fn entry;
		memcpy(&entry, &sym, sizeof(entry));
		negotiate(run, entry);
	}
	dlclose(dl);
}

/* ---- Options -------------------------------------------------------------- */

static bool check_value(struct ph_run *run, const char *qualified, const struct lmt_option_desc *o,
                        const struct lmt_option_value *v, const char *what)
{
	if (v->type != o->type)
		return ph_fail(run, "%s: the %s has type %d, the descriptor says %d", qualified,
		               what, (int)v->type, (int)o->type);
	bool numeric =
	        o->type == LMT_OPT_INT || o->type == LMT_OPT_SIZE || o->type == LMT_OPT_DURATION;
	if (numeric && (o->min || o->max) && (v->integer < o->min || v->integer > o->max))
		return ph_fail(run, "%s: the %s %lld is outside %lld to %lld", qualified, what,
		               (long long)v->integer, (long long)o->min, (long long)o->max);
	if (numeric && (o->flags & LMT_OPTF_POW2) &&
	    (v->integer <= 0 || (v->integer & (v->integer - 1))))
		return ph_fail(run, "%s: the %s %lld is not a power of two", qualified, what,
		               (long long)v->integer);
	if (o->type == LMT_OPT_ENUM) {
		int64_t count = 0;
		while (o->enum_values && o->enum_values[count])
			count++;
		if (v->integer < 0 || v->integer >= count || !v->text ||
		    strcmp(v->text, o->enum_values[v->integer]) != 0)
			return ph_fail(run, "%s: the %s is not one of its values", qualified, what);
	}
	if (o->type == LMT_OPT_STRING && !v->text)
		return ph_fail(run, "%s: the %s has no text", qualified, what);
	return true;
}

static bool same_value(const struct lmt_option_value *a, const struct lmt_option_value *b)
{
	switch (a->type) {
	case LMT_OPT_BOOL:
		return a->boolean == b->boolean;
	case LMT_OPT_STRING:
		return a->text && b->text && strcmp(a->text, b->text) == 0;
	default:
		return a->integer == b->integer;
	}
}

/* Format the value, parse the text back, and compare. */
static bool round_trip(struct ph_run *run, const char *qualified, const struct lmt_option_desc *o,
                       const struct lmt_option_value *v)
{
	char text[512];
	struct lmt_option_value back;
	struct lmt_error err = {0};
	if (lmt_option_format(o, v, text, sizeof(text)) != 0)
		return ph_fail(run, "%s: the default cannot be formatted", qualified);
	if (lmt_option_parse(o, text, &back, &err) != 0)
		return ph_fail(run, "%s: the default, formatted as '%s', does not parse back: %s",
		               qualified, text, err.message);
	if (!same_value(v, &back))
		return ph_fail(run, "%s: the default changes when formatted as '%s' and parsed",
		               qualified, text);
	return true;
}

static bool check_option(struct ph_run *run, const struct lmt_option_desc *o)
{
	const char *plugin = run->cfg->plugin->name;
	char qualified[128];
	snprintf(qualified, sizeof(qualified), "%s.%s", plugin, o->name ? o->name : "(null)");
	if (!valid_name(o->name, 64))
		return ph_fail(run, "%s: an option name is [a-z0-9_-]{1,64}", qualified);
	if (!one_line(o->doc))
		return ph_fail(run, "%s: the doc must be one non-empty line", qualified);
	if (o->type == LMT_OPT_ENUM && (!o->enum_values || !o->enum_values[0]))
		return ph_fail(run, "%s: an enum without values", qualified);
	struct lmt_option_value v;
	struct lmt_error err = {0};
	/* The core's own parser takes every default, as it does at load. */
	if (lmt_option_parse(o, o->default_value, &v, &err) != 0)
		return ph_fail(run, "%s: the default does not parse: %s", qualified, err.message);
	if (!check_value(run, qualified, o, &v, "default"))
		return false;
	if (!(o->flags & LMT_OPTF_SECRET) && !round_trip(run, qualified, o, &v))
		return false;
	/* The value in use, which -o may have set. */
	if (ph_option_get(run->cfg->options, qualified, &v) != 0)
		return ph_fail(run, "%s: the core does not know it", qualified);
	return check_value(run, qualified, o, &v, "value given");
}

static void check_options(struct ph_run *run)
{
	const struct lmt_plugin *d = run->cfg->plugin;
	for (uint32_t i = 0; i < d->option_count; i++)
		if (!check_option(run, &d->options[i]))
			break;
	ph_note(run, "%u option%s, every default parses and is in range", d->option_count,
	        d->option_count == 1 ? "" : "s");
}

/* ---- Instances and endpoints ---------------------------------------------- */

static void check_instances(struct ph_run *run)
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

static void check_connect(struct ph_run *run)
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
			        pair.channels, pair.channels == 1 ? "" : "s", seconds(took) * 1000,
			        pair.src.addr[0].len, pair.dst.addr[0].len);
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
		               side->host.role, seconds(timeout_ns) * 1000, seconds(took) * 1000);
	if (took > timeout_ns + PROMPT_NS)
		return ph_fail(run, "%s progress(%.0f ms) took %.1f s", side->host.role,
		               seconds(timeout_ns) * 1000, seconds(took));
	return true;
}

static void check_idle(struct ph_run *run)
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
			             seconds(took));
	}
	if (ok && ph_pair_quiet(run, &pair))
		ph_note(run, "progress(%.0f ms) waited its time on both sides",
		        seconds(IDLE_NS) * 1000);
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

static void check_registration(struct ph_run *run)
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
	finish(run, &pair, NULL, &source, regions, COUNT);
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

static void check_sizes(struct ph_run *run)
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
	finish(run, &pair, &tally, &source, &region, 1);
}

/* One write as large as the core may post (chunk-size, 8M unless -o says
 * otherwise), starting a byte into a page, and nothing around it touched. */
static void check_largest(struct ph_run *run)
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
	finish(run, &pair, &tally, &source, &region, 1);
}

/* A plugin that declares `encrypts` keys its channels from the session's
 * channel secret (tls=on): with the same secret on both sides writes land;
 * a source with another secret cannot connect a channel. */
static void check_encryption(struct ph_run *run)
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
	          ph_post(run, &pair, &tally, last, &source, source.mem + len / 2, &region,
	                  len / 2, len / 2) &&
	          ph_harvest_all(run, &pair, &tally) && flush(run, &pair) &&
	          ph_same(run, "the writes", region.mem, source.mem, len, 0) &&
	          ph_region_guards_intact(run, &region) && ph_pair_stop_progress(run, &pair) &&
	          ph_pair_quiet(run, &pair);
	finish(run, &pair, &tally, &source, &region, 1);
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
		ph_fail(run, "with another channel secret: expected the source's ep_connect to "
		             "fail, got: %s",
		        wrong.why);
		return;
	}
	ph_note(run, "%zu KiB over %u channel%s with a channel secret; another secret refused",
	        len / KIB, last + 1, last ? "s" : "");
}

static void check_cookies(struct ph_run *run)
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
	finish(run, &pair, &tally, &source, &region, 1);
}

static void check_flush(struct ph_run *run)
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
	finish(run, &pair, &tally, &source, &region, 1);
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
static void check_queue_full(struct ph_run *run)
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
	finish(run, &pair, &tally, &source, &region, 1);
}

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

static void check_bad_address(struct ph_run *run)
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

static void check_bad_key(struct ph_run *run)
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
	finish(run, &pair, NULL, NULL, &region, 1);
}

static void check_beyond(struct ph_run *run)
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
	finish(run, &pair, &tally, &source, &region, 1);
}

/* A blocking call that gave up must return within `limit` with `expected`;
 * with 0 only when `may_succeed`, for a call that had nothing to wait for. */
static bool prompt(struct ph_run *run, struct ph_host *host, const char *what, int before, int rc,
                   uint64_t took, uint64_t limit, int expected, bool may_succeed)
{
	if (took > limit)
		return ph_fail(run, "%s took %.1f s", what, seconds(took));
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

static void check_cancel(struct ph_run *run)
{
	bool waits = false;
	if (connect_times_out(run, &waits) && cancelled_calls(run, waits))
		ph_note(run,
		        "the destination's ep_connect %s; cancelled, it and progress on both "
		        "sides returned within %.0f s",
		        waits ? "waits for the source until its timeout" : "does not wait",
		        seconds(CANCEL_PROMPT_NS));
}

/* ---- Open/close cycles ------------------------------------------------------ */

/* Cycles stop early, after a hundred at least, once the time budget is
 * spent: a leak shows in a hundred as well as in a thousand. */
struct cycles {
	unsigned planned;
	unsigned done;
	uint64_t start_ns;
	uint64_t budget_ns;
};

static struct cycles cycles_plan(const struct ph_run *run, unsigned planned)
{
	return (struct cycles){
	        .planned = planned, .start_ns = ph_now(), .budget_ns = run->cfg->cycle_budget_ns};
}

static bool cycles_left(const struct cycles *c)
{
	if (c->done >= c->planned)
		return false;
	return c->done < 100 || ph_now() - c->start_ns < c->budget_ns;
}

static const char *cycles_text(const struct cycles *c, char *buf, size_t size)
{
	if (c->done == c->planned)
		snprintf(buf, size, "%u cycles", c->done);
	else
		snprintf(buf, size, "%u of %u cycles (%.0f s budget spent)", c->done, c->planned,
		         seconds(c->budget_ns));
	return buf;
}

/* Threads a plugin joined in close may still be leaving /proc for a moment. */
static bool same_usage(struct ph_run *run, struct ph_census before, const struct cycles *c)
{
	struct ph_census after;
	if (ph_census_same(before, &after))
		return true;
	char text[96];
	return ph_fail(run, "after %s: %d file descriptors and %d threads (%d and %d before)",
	               cycles_text(c, text, sizeof(text)), after.fds, after.threads, before.fds,
	               before.threads);
}

static bool instance_cycle(struct ph_run *run)
{
	for (int role = 0; role < 2; role++) {
		struct ph_side side = {0};
		ph_host_init(&side.host, run->cfg, role ? "destination" : "source");
		bool ok =
		        ph_instance_open(run, &side, role ? LMT_ROLE_DESTINATION : LMT_ROLE_SOURCE,
		                         run->cfg->channels, run->cfg->op_timeout_ns);
		if (ok)
			run->cfg->plugin->ops.instance_close(side.inst);
		ph_host_fini(&side.host);
		if (!ok)
			return false;
	}
	return true;
}

static void check_instance_cycles(struct ph_run *run)
{
	if (!instance_cycle(run))
		return;
	struct ph_census before = ph_census_take();
	struct cycles c = cycles_plan(run, run->cfg->cycles);
	for (; cycles_left(&c); c.done++)
		if (!instance_cycle(run))
			return;
	char text[96];
	if (same_usage(run, before, &c))
		ph_note(run,
		        "%s of a source and a destination, %d fds and %d thread%s before "
		        "and after",
		        cycles_text(&c, text, sizeof(text)), before.fds, before.threads,
		        before.threads == 1 ? "" : "s");
}

static bool endpoint_cycle(struct ph_run *run, struct ph_pair *pair)
{
	bool ok = ph_pair_open_endpoints(run, pair);
	for (uint32_t c = 0; c < pair->channels; c++) {
		pair->plugin->ops.ep_close(pair->src.ep[c]);
		pair->plugin->ops.ep_close(pair->dst.ep[c]);
		pair->src.ep[c] = pair->dst.ep[c] = NULL;
	}
	return ok;
}

static void check_endpoint_cycles(struct ph_run *run)
{
	struct ph_pair pair;
	char text[96];
	if (ph_pair_open(run, &pair, run->cfg->op_timeout_ns) && endpoint_cycle(run, &pair)) {
		struct ph_census before = ph_census_take();
		struct cycles c = cycles_plan(run, run->cfg->cycles);
		bool ok = true;
		for (; ok && cycles_left(&c); c.done++)
			ok = endpoint_cycle(run, &pair);
		if (ok && same_usage(run, before, &c) && ph_pair_quiet(run, &pair))
			ph_note(run, "%s of %u unconnected endpoint%s per side",
			        cycles_text(&c, text, sizeof(text)), pair.channels,
			        pair.channels == 1 ? "" : "s");
	}
	ph_pair_close(&pair);
}

/* Endpoints opened on both sides and never connected, one closed by the
 * core, the destination's ep_connect cancelled (a destination that does not
 * wait is then connected to a source that never connects back); nothing
 * released but the instances. */
static bool half_open_cycle(struct ph_run *run)
{
	struct ph_pair pair;
	char d[640];
	bool ok = ph_pair_open(run, &pair, run->cfg->op_timeout_ns) &&
	          ph_pair_open_endpoints(run, &pair);
	if (ok) {
		uint32_t last = pair.channels - 1;
		pair.plugin->ops.ep_close(pair.src.ep[last]);
		pair.src.ep[last] = NULL;
		atomic_store(&pair.dst.host.cancelled, 1);
		int rc = pair.plugin->ops.ep_connect(pair.dst.ep[0], &pair.src.addr[0]);
		if (rc && rc != -LMT_ECANCELED)
			ok = ph_fail(run, "a cancelled destination's ep_connect: %s",
			             ph_describe(&pair.dst.host, rc, d, sizeof(d)));
	}
	ph_pair_close(&pair);
	return ok;
}

static void check_half_open_cycles(struct ph_run *run)
{
	if (!half_open_cycle(run))
		return;
	struct ph_census before = ph_census_take();
	struct cycles c = cycles_plan(run, run->cfg->cycles / 100 ? run->cfg->cycles / 100 : 1);
	for (; cycles_left(&c); c.done++)
		if (!half_open_cycle(run))
			return;
	char text[96];
	if (same_usage(run, before, &c))
		ph_note(run, "%s of endpoints never connected, closed by instance_close",
		        cycles_text(&c, text, sizeof(text)));
}

/* Connect, write, and tear down: in order on even cycles, with the source's
 * endpoints closed first or, every other time, the destination's; on odd
 * ones with 1 MiB of writes maybe in flight and nothing released but the
 * instances. */
static bool connected_cycle(struct ph_run *run, unsigned i)
{
	enum { PIECES = 8, PIECE = 128 * KIB };
	struct ph_pair pair;
	struct ph_region region = {0};
	struct ph_source source = {0};
	struct ph_tally tally = {0};
	bool orderly = i % 2 == 0;
	unsigned writes = orderly ? 1 : PIECES;
	size_t len = orderly ? PH_PAGE : PIECE;
	bool ok = ph_pair_ready(run, &pair) &&
	          ph_region_open(run, &pair, &region, (size_t)PIECES * PIECE) &&
	          ph_source_open(run, &pair, &source, (size_t)PIECES * PIECE, i) &&
	          ph_tally_init(run, &tally, writes);
	for (unsigned k = 0; k < writes && ok; k++)
		ok = ph_post(run, &pair, &tally, (i + k) % pair.channels, &source,
		             source.mem + k * len, &region, k * len, len);
	orderly = orderly || !ok;
	if (ok && orderly) {
		ok = ph_harvest_all(run, &pair, &tally) && ph_pair_stop_progress(run, &pair);
		struct ph_side *first = i % 4 == 2 ? &pair.dst : &pair.src;
		struct ph_side *second = i % 4 == 2 ? &pair.src : &pair.dst;
		for (uint32_t c = 0; c < pair.channels && ok; c++)
			pair.plugin->ops.ep_close(first->ep[c]);
		for (uint32_t c = 0; c < pair.channels && ok; c++)
			pair.plugin->ops.ep_close(second->ep[c]);
		ok = ok && ph_pair_quiet(run, &pair);
	}
	ph_pair_stop_progress(run, &pair);
	if (orderly) {
		ph_source_close(&pair, &source);
		ph_region_close(&pair, &region);
	}
	ph_pair_close(&pair);
	/* Odd cycles: instance_close released the rest; only memory is left. */
	source.mr = NULL;
	region.mr = NULL;
	region.rkey = NULL;
	ph_source_close(&pair, &source);
	ph_region_close(&pair, &region);
	ph_tally_fini(&tally);
	return ok;
}

static void check_connected_cycles(struct ph_run *run)
{
	if (!connected_cycle(run, 0))
		return;
	struct ph_census before = ph_census_take();
	struct cycles c = cycles_plan(run, run->cfg->cycles / 10 ? run->cfg->cycles / 10 : 1);
	for (; cycles_left(&c); c.done++)
		if (!connected_cycle(run, c.done))
			return;
	char text[96];
	if (same_usage(run, before, &c))
		ph_note(run,
		        "%s, every other one closed with 1 MiB of writes outstanding, the rest "
		        "endpoints first, either side first",
		        cycles_text(&c, text, sizeof(text)));
}

/* ---- Unloading -------------------------------------------------------------- */

int pc_unload_probe(const char *spec, const char *options, bool verbose)
{
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	struct ph_census before = ph_census_take();
	struct ph_config cfg = {.verbose = verbose};
	struct lmt_error err = {0};
	int rc = ph_load(&cfg, spec, options, &err);
	cfg.channels = 1;
	struct ph_run run = {.cfg = &cfg};
	if (rc)
		ph_fail(&run, "%s", err.message);
	else
		instance_cycle(&run);
	ph_unload(&cfg);
	if (!run.failed)
		same_usage(&run, before, &(struct cycles){.planned = 1, .done = 1});
	if (run.failed) {
		fprintf(stderr, "unload: %s\n", run.why);
		return 3;
	}
	return 0;
}

/* Run the probe in a fresh process, where nothing else holds the plugin
 * loaded, and collect what it says on stderr. */
static void check_unload(struct ph_run *run)
{
	int p[2];
	if (pipe2(p, O_CLOEXEC) != 0) {
		ph_fail(run, "pipe: %s", strerror(errno));
		return;
	}
	char *argv[] = {"lmt-plugin-check",
	                "--unload-probe",
	                "-o",
	                (char *)(run->cfg->option_text ? run->cfg->option_text : ""),
	                (char *)run->cfg->spec,
	                NULL};
	posix_spawn_file_actions_t actions;
	posix_spawn_file_actions_init(&actions);
	posix_spawn_file_actions_adddup2(&actions, p[1], STDERR_FILENO);
	pid_t pid;
	int rc = posix_spawn(&pid, "/proc/self/exe", &actions, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&actions);
	close(p[1]);
	static char said[65536];
	size_t have = 0;
	ssize_t n;
	while (rc == 0 && (n = read(p[0], said + have, sizeof(said) - 1 - have)) != 0)
		if (n > 0 && (have += (size_t)n) == sizeof(said) - 1)
			break;
		else if (n < 0 && errno != EINTR)
			break;
	close(p[0]);
	said[have] = 0;
	fputs(said, stderr);
	int status = 0;
	while (rc == 0 && waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	const char *line = strstr(said, "unload: ");
	const char *summary = strstr(said, "SUMMARY: ");
	if (rc)
		ph_fail(run, "cannot run /proc/self/exe: %s", strerror(rc));
	else if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
		ph_note(run, "loaded, used and unloaded in a fresh process, nothing left behind");
	else if (line)
		ph_fail(run, "%.*s", (int)strcspn(line + 8, "\n"), line + 8);
	else if (summary)
		ph_fail(run, "after unloading: %.*s%s", (int)strcspn(summary + 9, "\n"),
		        summary + 9,
		        strstr(said, "call_init") ? " (some by a library's constructor at "
		                                    "dlopen, never freed at dlclose)"
		                                  : "");
	else
		ph_fail(run, "the unload probe ended with %s %d",
		        WIFSIGNALED(status) ? "signal" : "status",
		        WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
}

const struct pc_check pc_checks[] = {
        {"descriptor", check_descriptor},
        {"exported symbols", check_exports},
        {"version negotiation", check_negotiation},
        {"option defaults", check_options},
        {"instance open/close", check_instances},
        {"endpoint open/connect", check_connect},
        {"idle progress and flush", check_idle},
        {"registration", check_registration},
        {"writes of many sizes", check_sizes},
        {"a write of chunk-size", check_largest},
        {"every cookie exactly once", check_cookies},
        {"flush visibility", check_flush},
        {"encrypted channels", check_encryption},
        {"queue full (EAGAIN)", check_queue_full},
        {"malformed address blob", check_bad_address},
        {"malformed key blob", check_bad_key},
        {"write beyond the key's length", check_beyond},
        {"cancel and timeout", check_cancel},
        {"instance open/close cycles", check_instance_cycles},
        {"endpoint open/close cycles", check_endpoint_cycles},
        {"half-open close cycles", check_half_open_cycles},
        {"connected open/close cycles", check_connected_cycles},
        {"unload", check_unload},
};

const size_t pc_check_count = sizeof(pc_checks) / sizeof(pc_checks[0]);
