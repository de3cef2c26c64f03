/* The plugin loader: search path, dlopen, entry-point and ABI negotiation,
 * descriptor validation.
 * Room: transport; may use: base, wire, session, control. */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "error.h"

/* Oldest plugin ABI this core still adapts. */
#define ABI_OLDEST 1u
#define MAX_DIRS 32

struct lmt_plugin_handle {
	void *dl;
	const struct lmt_plugin *desc;
	char path[PATH_MAX];
};

struct search_path {
	int count;
	char dirs[MAX_DIRS][PATH_MAX];
};

static void add_dir(struct search_path *sp, const char *dir, size_t len)
{
	if (len == 0 || len >= PATH_MAX || sp->count == MAX_DIRS)
		return;
	memcpy(sp->dirs[sp->count], dir, len);
	sp->dirs[sp->count][len] = '\0';
	for (int i = 0; i < sp->count; i++)
		if (strcmp(sp->dirs[i], sp->dirs[sp->count]) == 0)
			return;
	sp->count++;
}

/* Where liblmt itself was loaded from; decides installed vs. build tree. */
static bool library_dir(char *out, size_t size)
{
	Dl_info info;
	char real[PATH_MAX];
	if (!dladdr((void *)lmt_plugin_open, &info) || !info.dli_fname ||
	    !realpath(info.dli_fname, real))
		return false;
	char *slash = strrchr(real, '/');
	if (!slash)
		return false;
	*slash = '\0';
	snprintf(out, size, "%s", real);
	return true;
}

static void add_build_tree(struct search_path *sp)
{
	char dir[PATH_MAX];
	snprintf(dir, sizeof(dir), "%s/plugins", LMT_BUILD_ROOT);
	DIR *d = opendir(dir);
	if (!d)
		return;
	struct dirent *e;
	char names[MAX_DIRS][NAME_MAX + 1];
	int n = 0;
	while ((e = readdir(d)) && n < MAX_DIRS) {
		if (e->d_name[0] != '.' && e->d_type == DT_DIR)
			snprintf(names[n++], sizeof(names[0]), "%s", e->d_name);
	}
	closedir(d);
	qsort(names, (size_t)n, sizeof(names[0]), (int (*)(const void *, const void *))strcmp);
	for (int i = 0; i < n; i++) {
		char sub[PATH_MAX];
		int len = snprintf(sub, sizeof(sub), "%s/%s", dir, names[i]);
		if (len > 0 && len < (int)sizeof(sub))
			add_dir(sp, sub, (size_t)len);
	}
}

static void build_search_path(struct search_path *sp)
{
	sp->count = 0;
	const char *env = getenv("LMT_PLUGIN_PATH");
	while (env && *env) {
		const char *colon = strchr(env, ':');
		size_t len = colon ? (size_t)(colon - env) : strlen(env);
		add_dir(sp, env, len);
		env += len + (colon ? 1 : 0);
	}
	char libdir[PATH_MAX], build_core[PATH_MAX];
	if (!library_dir(libdir, sizeof(libdir)))
		return;
	if (realpath(LMT_BUILD_ROOT "/core", build_core) && strcmp(libdir, build_core) == 0) {
		add_build_tree(sp); /* running uninstalled */
		return;
	}
	char installed[PATH_MAX];
	int len = snprintf(installed, sizeof(installed), "%s/lmt", libdir);
	if (len > 0 && len < (int)sizeof(installed))
		add_dir(sp, installed, (size_t)len);
}

int lmt_plugin_search_path(char *buf, size_t size)
{
	if (!buf)
		return -LMT_EINVAL;
	struct search_path *sp = malloc(sizeof(*sp));
	if (!sp)
		return -LMT_ENOMEM;
	build_search_path(sp);
	size_t used = 0;
	if (size)
		buf[0] = '\0';
	for (int i = 0; i < sp->count; i++) {
		int n = snprintf(buf + used, size > used ? size - used : 0, "%s%s", i ? ":" : "",
		                 sp->dirs[i]);
		if (n < 0 || used + (size_t)n >= size) {
			free(sp);
			return -LMT_EOVERFLOW;
		}
		used += (size_t)n;
	}
	free(sp);
	return 0;
}

static bool valid_plugin_name(const char *name)
{
	if (!name || !*name || strlen(name) > 32)
		return false;
	for (const char *p = name; *p; p++)
		if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '_' ||
		      *p == '-'))
			return false;
	return true;
}

static int check_options(const struct lmt_plugin *d, const char *path, struct lmt_error *err)
{
	if (d->option_count && !d->options)
		return lmt__error(err, LMT_EABI, "plugin %s: option_count %u without options", path,
		                  d->option_count);
	for (uint32_t i = 0; i < d->option_count; i++) {
		const struct lmt_option_desc *o = &d->options[i];
		if (!o->name || !*o->name || strchr(o->name, '.') || strchr(o->name, '=') ||
		    strchr(o->name, ','))
			return lmt__error(err, LMT_EABI, "plugin %s: option %u has a bad name",
			                  path, i);
		if ((unsigned)o->type > LMT_OPT_STRING || !o->default_value || !o->doc)
			return lmt__error(err, LMT_EABI,
			                  "plugin %s: option '%s' lacks a type, default or doc",
			                  path, o->name);
		if (o->type == LMT_OPT_ENUM && (!o->enum_values || !o->enum_values[0]))
			return lmt__error(err, LMT_EABI,
			                  "plugin %s: enum option '%s' has no values", path,
			                  o->name);
	}
	return 0;
}

static int check_descriptor(const struct lmt_plugin *d, const char *path, struct lmt_error *err)
{
	if (d->struct_size < LMT_PLUGIN_V1_MIN_SIZE)
		return lmt__error(err, LMT_EABI,
		                  "plugin %s: descriptor of %u bytes is smaller than ABI v%u's %zu",
		                  path, d->struct_size, d->abi_version,
		                  (size_t)LMT_PLUGIN_V1_MIN_SIZE);
	if (!valid_plugin_name(d->name))
		return lmt__error(err, LMT_EABI, "plugin %s: name '%s' is not [a-z0-9_-]{1,32}",
		                  path, d->name ? d->name : "(null)");
	if (!d->version || !d->description)
		return lmt__error(err, LMT_EABI, "plugin %s: no version or description", path);
	const struct lmt_plugin_ops *o = &d->ops;
	if (!o->instance_open || !o->instance_close || !o->ep_open || !o->ep_connect ||
	    !o->ep_close || !o->mr_register || !o->mr_deregister || !o->rkey_import ||
	    !o->rkey_release || !o->write || !o->progress || !o->flush)
		return lmt__error(err, LMT_EABI, "plugin %s ('%s'): an operation is missing", path,
		                  d->name);
	if ((d->caps & LMT_CAP_STORAGE) && !(d->caps & LMT_CAP_DECORATOR) && !LMT_PLUGIN_READ(d))
		return lmt__error(err, LMT_EABI,
		                  "plugin %s ('%s'): a storage plugin without a read operation",
		                  path, d->name);
	return check_options(d, path, err);
}

static int negotiate(struct lmt_plugin_handle *h, struct lmt_error *err)
{
	dlerror();
	void *sym = dlsym(h->dl, LMT_PLUGIN_ENTRY_SYMBOL);
	if (!sym)
		return lmt__error(err, LMT_EABI, "%s: not an lmt plugin: no %s symbol", h->path,
		                  LMT_PLUGIN_ENTRY_SYMBOL);
	/* dlsym also searches the library's dependencies: make sure the entry
	 * point is this file's own, not one of a library it links. */
	Dl_info info;
	char mine[PATH_MAX], theirs[PATH_MAX];
	if (!dladdr(sym, &info) || !info.dli_fname || !realpath(info.dli_fname, theirs) ||
	    !realpath(h->path, mine) || strcmp(mine, theirs) != 0)
		return lmt__error(err, LMT_EABI, "%s: not an lmt plugin: %s comes from %s", h->path,
		                  LMT_PLUGIN_ENTRY_SYMBOL,
		                  info.dli_fname ? info.dli_fname : "elsewhere");
	lmt_plugin_entry_fn entry;
	memcpy(&entry, &sym, sizeof(entry));
	const struct lmt_plugin *d = NULL;
	int rc = entry(LMT_PLUGIN_ABI_VERSION, &d);
	if (!d)
		return lmt__error(err, LMT_EABI, "%s: the plugin refused ABI v%u (%s)", h->path,
		                  LMT_PLUGIN_ABI_VERSION, lmt_err_name(rc));
	if (d->abi_version > LMT_PLUGIN_ABI_VERSION || d->abi_version < ABI_OLDEST || rc)
		return lmt__error(err, LMT_EABI,
		                  "%s: plugin speaks ABI v%u, this lmt speaks v%u to v%u", h->path,
		                  d->abi_version, ABI_OLDEST, LMT_PLUGIN_ABI_VERSION);
	rc = check_descriptor(d, h->path, err);
	if (rc)
		return rc;
	h->desc = d;
	return 0;
}

static int load_file(const char *path, lmt_plugin_handle **out, struct lmt_error *err)
{
	lmt_plugin_handle *h = calloc(1, sizeof(*h));
	if (!h)
		return lmt__error(err, LMT_ENOMEM, "out of memory loading %s", path);
	snprintf(h->path, sizeof(h->path), "%s", path);
	h->dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h->dl) {
		const char *why = dlerror();
		int rc = lmt__error(err, LMT_EABI, "%s: cannot load: %s", path,
		                    why ? why : "unknown dlopen error");
		free(h);
		return rc;
	}
	int rc = negotiate(h, err);
	if (rc) {
		lmt_plugin_close(h);
		return rc;
	}
	*out = h;
	return 0;
}

void lmt_plugin_close(lmt_plugin_handle *plugin)
{
	if (!plugin)
		return;
	if (plugin->dl)
		dlclose(plugin->dl);
	free(plugin);
}

const struct lmt_plugin *lmt_plugin_descriptor(const lmt_plugin_handle *plugin)
{
	return plugin ? plugin->desc : NULL;
}

const char *lmt_plugin_path(const lmt_plugin_handle *plugin)
{
	return plugin ? plugin->path : NULL;
}

/* Names of the plugins that load, for "not found" messages. */
static void append_name(void *opaque, const char *path, const lmt_plugin_handle *plugin,
                        const struct lmt_error *err)
{
	char *list = opaque;
	size_t used = strlen(list);
	if (!plugin || used > 400)
		return;
	snprintf(list + used, 512 - used, "%s%s", used ? ", " : "", plugin->desc->name);
}

static bool file_exists(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0;
}

int lmt_plugin_open(const char *name, lmt_plugin_handle **out, struct lmt_error *err)
{
	if (!out)
		return lmt__error(err, LMT_EINVAL, "plugin: no place for the handle (out is NULL)");
	*out = NULL;
	if (!name || !*name)
		return lmt__error(err, LMT_EINVAL, "plugin: no name given");
	if (strchr(name, '/')) {
		if (!file_exists(name))
			return lmt__error(err, LMT_ENOTFOUND, "plugin %s: %s", name,
			                  strerror(errno));
		return load_file(name, out, err);
	}
	if (!valid_plugin_name(name))
		return lmt__error(err, LMT_EINVAL,
		                  "plugin '%s': a name is [a-z0-9_-]{1,32}, or give a path", name);
	struct search_path *sp = malloc(sizeof(*sp));
	if (!sp)
		return lmt__error(err, LMT_ENOMEM, "out of memory");
	build_search_path(sp);
	char path[PATH_MAX + 64];
	int rc = 1;
	for (int i = 0; i < sp->count && rc > 0; i++) {
		snprintf(path, sizeof(path), "%s/%s.so", sp->dirs[i], name);
		if (!file_exists(path))
			continue; /* absent from this directory: not worth a word */
		rc = load_file(path, out, err);
		if (rc == 0 && strcmp((*out)->desc->name, name) != 0) {
			rc = lmt__error(err, LMT_EABI, "%s: declares plugin '%s', expected '%s'",
			                path, (*out)->desc->name, name);
			lmt_plugin_close(*out);
			*out = NULL;
		}
	}
	if (rc > 0) {
		char searched[2048] = "", available[512] = "";
		for (int i = 0; i < sp->count; i++) {
			size_t used = strlen(searched);
			snprintf(searched + used, sizeof(searched) - used, "%s%s", i ? ", " : "",
			         sp->dirs[i]);
		}
		lmt_plugin_list(append_name, available);
		rc = lmt__error(err, LMT_ENOTFOUND,
		                "plugin '%s' not found; searched: %s; available: %s", name,
		                sp->count ? searched : "(no directory)",
		                available[0] ? available : "none");
	}
	free(sp);
	return rc;
}

/* A decorator and the plugin it wraps, each checked for its part. */
static int open_decorated(const char *spec, size_t outer_len, lmt_plugin_handle **plugin,
                          lmt_plugin_handle **inner, struct lmt_error *err)
{
	char outer[64];
	const char *wrapped = spec + outer_len + 1;
	if (outer_len >= sizeof(outer))
		return lmt__error(err, LMT_EINVAL, "plugin '%s': decorator name too long", spec);
	memcpy(outer, spec, outer_len);
	outer[outer_len] = '\0';
	int rc = lmt_plugin_open(outer, plugin, err);
	if (rc)
		return rc;
	if (!((*plugin)->desc->caps & LMT_CAP_DECORATOR))
		return lmt__error(err, LMT_EINVAL,
		                  "plugin '%s': '%s' is not a decorator, so it cannot wrap '%s'",
		                  spec, outer, wrapped);
	if ((rc = lmt_plugin_open(wrapped, inner, err)))
		return rc;
	if ((*inner)->desc->caps & LMT_CAP_DECORATOR)
		return lmt__error(err, LMT_EINVAL,
		                  "plugin '%s': a decorator wraps one transport, "
		                  "not another decorator",
		                  spec);
	return 0;
}

static int open_spec(const char *spec, lmt_plugin_handle **plugin, lmt_plugin_handle **inner,
                     struct lmt_error *err)
{
	/* "decorator:plugin", unless the ':' is in a path's directories. */
	const char *colon = spec ? strchr(spec, ':') : NULL;
	if (colon && !memchr(spec, '/', (size_t)(colon - spec)))
		return open_decorated(spec, (size_t)(colon - spec), plugin, inner, err);
	int rc = lmt_plugin_open(spec, plugin, err);
	if (rc)
		return rc;
	const char *name = (*plugin)->desc->name;
	if ((*plugin)->desc->caps & LMT_CAP_DECORATOR)
		return lmt__error(err, LMT_EINVAL,
		                  "plugin '%s' is a decorator: name the plugin it wraps, as in "
		                  "'%s:tcp'",
		                  name, name);
	return 0;
}

int lmt_plugin_open_spec(const char *spec, lmt_plugin_handle **plugin, lmt_plugin_handle **inner,
                         struct lmt_error *err)
{
	if (!plugin || !inner)
		return lmt__error(err, LMT_EINVAL,
		                  "plugin: no place for the handles (plugin or inner is NULL)");
	*plugin = NULL;
	*inner = NULL;
	int rc = open_spec(spec, plugin, inner, err);
	if (rc) {
		lmt_plugin_close(*inner);
		lmt_plugin_close(*plugin);
		*plugin = NULL;
		*inner = NULL;
	}
	return rc;
}

static int compare_names(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Visit every .so of one directory in name order; `seen` collects the
 * plugin names already visited so a later duplicate is reported. */
static int list_dir(const char *dir, lmt_plugin_visit_fn fn, void *opaque, char seen[][33],
                    int *nseen)
{
	DIR *d = opendir(dir);
	if (!d)
		return 0;
	char *files[256];
	int n = 0, loaded = 0;
	struct dirent *e;
	while ((e = readdir(d)) && n < 256) {
		size_t len = strlen(e->d_name);
		if (len > 3 && strcmp(e->d_name + len - 3, ".so") == 0)
			files[n++] = strdup(e->d_name);
	}
	closedir(d);
	qsort(files, (size_t)n, sizeof(files[0]), compare_names);
	for (int i = 0; i < n; i++) {
		char path[PATH_MAX + 300];
		struct lmt_error err = {0};
		lmt_plugin_handle *h = NULL;
		if (!files[i])
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, files[i]);
		free(files[i]);
		if (load_file(path, &h, &err) == 0) {
			int dup = -1;
			for (int j = 0; j < *nseen; j++)
				if (strcmp(seen[j], h->desc->name) == 0)
					dup = j;
			if (dup >= 0) {
				lmt__error(
				        &err, LMT_EINVAL,
				        "%s: duplicate plugin '%s', shadowed by one found earlier",
				        path, h->desc->name);
				lmt_plugin_close(h);
				h = NULL;
			} else if (*nseen < 256) {
				snprintf(seen[(*nseen)++], 33, "%s", h->desc->name);
				loaded++;
			}
		}
		fn(opaque, path, h, h ? NULL : &err);
		lmt_plugin_close(h);
	}
	return loaded;
}

int lmt_plugin_list(lmt_plugin_visit_fn fn, void *opaque)
{
	if (!fn)
		return -LMT_EINVAL;
	struct search_path *sp = malloc(sizeof(*sp));
	char(*seen)[33] = calloc(256, 33);
	int nseen = 0, loaded = 0;
	if (!sp || !seen) {
		free(sp);
		free(seen);
		return -LMT_ENOMEM;
	}
	build_search_path(sp);
	for (int i = 0; i < sp->count; i++)
		loaded += list_dir(sp->dirs[i], fn, opaque, seen, &nseen);
	free(seen);
	free(sp);
	return loaded;
}
