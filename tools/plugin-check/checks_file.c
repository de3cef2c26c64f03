/* lmt-plugin-check: the checks of what the file declares — its descriptor,
 * the symbols it exports, version negotiation, option defaults. */
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

void pc_check_descriptor(struct ph_run *run)
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
	if (!pc_valid_name(d->name, 32)) {
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
	if (!pc_one_line(d->version) || !pc_one_line(d->description)) {
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

void pc_check_exports(struct ph_run *run)
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

void pc_check_negotiation(struct ph_run *run)
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
	if (!pc_valid_name(o->name, 64))
		return ph_fail(run, "%s: an option name is [a-z0-9_-]{1,64}", qualified);
	if (!pc_one_line(o->doc))
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

void pc_check_options(struct ph_run *run)
{
	const struct lmt_plugin *d = run->cfg->plugin;
	for (uint32_t i = 0; i < d->option_count; i++)
		if (!check_option(run, &d->options[i]))
			break;
	ph_note(run, "%u option%s, every default parses and is in range", d->option_count,
	        d->option_count == 1 ? "" : "s");
}
