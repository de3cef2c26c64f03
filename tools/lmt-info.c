/* lmt-info: lists the transport plugins found (with what a remote writer
 * must hold to write through each) and every option of the core and of
 * each plugin, as text or as the Markdown options reference. */
#define _GNU_SOURCE
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lmt/lmt.h>

/* One option, already rendered to text, so that nothing points into a
 * plugin after it is closed. */
struct info_option {
	char *name; /* qualified: "tcp.nodelay" */
	const char *type;
	char *default_text;
	char *range;
	char *doc;
	uint32_t flags;
};

struct info_schema {
	struct info_option *options;
	uint32_t count;
};

struct info_plugin {
	char *path;
	char *error; /* non-NULL: the file failed to load */
	char *name;
	char *version;
	char *description;
	char *write_access; /* NULL: the plugin does not say */
	uint64_t caps;
	bool shadowed; /* an earlier file has the same name */
	struct info_schema schema;
};

struct info_list {
	struct info_plugin *items;
	size_t count;
	size_t cap;
};

static const char *const capability_names[] = {
        "one-sided",       "local-mr",  "pin",         "multi-channel",
        "target-progress", "decorator", "merges-runs", "encrypts",
        "storage",
};

/* What tls=on does to a plugin's data channels (docs/security.md). */
static const char *tls_channels(uint64_t caps)
{
	if (caps & LMT_CAP_DECORATOR)
		return "as the plugin it wraps";
	if (caps & LMT_CAP_STORAGE)
		return "not applicable: a storage plugin writes a local file, with no peer and no "
		       "control connection";
	if (caps & LMT_CAP_ENCRYPTS)
		return "encrypted and authenticated (TLS 1.3, a per-channel key from the session's "
		       "TLS control connection)";
	return "NOT encrypted: only the control connection is TLS; guest memory crosses the "
	       "data channels in clear";
}

static void die(const char *fmt, ...) LMT_PRINTF(1, 2);

static void die(const char *fmt, ...)
{
	va_list ap;

	fputs("lmt-info: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

static void *xcalloc(size_t n, size_t size)
{
	void *p = calloc(n ? n : 1, size);

	if (!p)
		die("out of memory");
	return p;
}

static char *xstrdup(const char *s)
{
	char *p = strdup(s ? s : "");

	if (!p)
		die("out of memory");
	return p;
}

static char *xasprintf(const char *fmt, ...) LMT_PRINTF(1, 2);

static char *xasprintf(const char *fmt, ...)
{
	va_list ap;
	char *p;
	int n;

	va_start(ap, fmt);
	n = vasprintf(&p, fmt, ap);
	va_end(ap);
	if (n < 0)
		die("out of memory");
	return p;
}

static const char *type_name(enum lmt_option_type type)
{
	switch (type) {
	case LMT_OPT_BOOL:
		return "bool";
	case LMT_OPT_INT:
		return "integer";
	case LMT_OPT_SIZE:
		return "size";
	case LMT_OPT_DURATION:
		return "duration";
	case LMT_OPT_ENUM:
		return "enum";
	case LMT_OPT_STRING:
		return "string";
	}
	return "unknown";
}

static bool is_numeric(enum lmt_option_type type)
{
	return type == LMT_OPT_INT || type == LMT_OPT_SIZE || type == LMT_OPT_DURATION;
}

/* A bound in the option's own units ("4K", "300ms"), raw when the core
 * cannot format it. */
static char *format_bound(const struct lmt_option_desc *desc, int64_t bound)
{
	struct lmt_option_value value = {.type = desc->type, .integer = bound};
	char buf[64];

	if (lmt_option_format(desc, &value, buf, sizeof(buf)) < 0 || buf[0] == '\0')
		snprintf(buf, sizeof(buf), "%" PRId64, bound);
	return xstrdup(buf);
}

static char *format_enum_values(const struct lmt_option_desc *desc)
{
	char *out = xstrdup("");

	for (const char *const *v = desc->enum_values; v && *v; v++) {
		char *next = xasprintf("%s%s%s", out, out[0] ? ", " : "", *v);

		free(out);
		out = next;
	}
	return out;
}

/* "4K..1G", "1..", "" when unbounded; enum values for an enum. */
static char *format_range(const struct lmt_option_desc *desc)
{
	char *lo, *hi, *out;

	if (desc->type == LMT_OPT_ENUM)
		return format_enum_values(desc);
	if (!is_numeric(desc->type) || (desc->min == 0 && desc->max == 0))
		return xstrdup("");
	lo = desc->min == INT64_MIN ? xstrdup("") : format_bound(desc, desc->min);
	hi = desc->max == INT64_MAX ? xstrdup("") : format_bound(desc, desc->max);
	out = xasprintf("%s..%s", lo, hi);
	free(lo);
	free(hi);
	return out;
}

static char *format_default(const struct lmt_option_desc *desc)
{
	const char *text = desc->default_value ? desc->default_value : "";

	if ((desc->flags & LMT_OPTF_SECRET) && text[0])
		return xstrdup("(secret)");
	return xstrdup(text);
}

static void collect_schema(struct info_schema *schema, const char *ns,
                           const struct lmt_option_desc *descs, uint32_t count)
{
	schema->options = xcalloc(count, sizeof(*schema->options));
	schema->count = count;
	for (uint32_t i = 0; i < count; i++) {
		const struct lmt_option_desc *d = &descs[i];
		struct info_option *o = &schema->options[i];

		o->name = ns ? xasprintf("%s.%s", ns, d->name) : xstrdup(d->name);
		o->type = type_name(d->type);
		o->default_text = format_default(d);
		o->range = format_range(d);
		o->doc = xstrdup(d->doc);
		o->flags = d->flags;
	}
}

static void free_schema(struct info_schema *schema)
{
	for (uint32_t i = 0; i < schema->count; i++) {
		struct info_option *o = &schema->options[i];

		free(o->name);
		free(o->default_text);
		free(o->range);
		free(o->doc);
	}
	free(schema->options);
}

static struct info_plugin *list_add(struct info_list *list, const char *path)
{
	struct info_plugin *p;

	if (list->count == list->cap) {
		list->cap = list->cap ? 2 * list->cap : 8;
		list->items = realloc(list->items, list->cap * sizeof(*list->items));
		if (!list->items)
			die("out of memory");
	}
	p = &list->items[list->count++];
	memset(p, 0, sizeof(*p));
	p->path = xstrdup(path);
	return p;
}

static bool name_seen(const struct info_list *list, const char *name)
{
	for (size_t i = 0; i + 1 < list->count; i++) {
		const struct info_plugin *p = &list->items[i];

		if (!p->error && strcmp(p->name, name) == 0)
			return true;
	}
	return false;
}

static void collect_plugin(struct info_list *list, const char *path,
                           const lmt_plugin_handle *handle)
{
	const struct lmt_plugin *d = lmt_plugin_descriptor(handle);
	struct info_plugin *p = list_add(list, path);

	p->name = xstrdup(d->name);
	p->version = xstrdup(d->version);
	p->description = xstrdup(d->description);
	p->write_access =
	        LMT_PLUGIN_WRITE_ACCESS(d) ? xstrdup(LMT_PLUGIN_WRITE_ACCESS(d)) : NULL;
	p->caps = d->caps;
	p->shadowed = name_seen(list, p->name);
	collect_schema(&p->schema, d->name, d->options, d->option_count);
}

static void visit(void *opaque, const char *path, const lmt_plugin_handle *plugin,
                  const struct lmt_error *err)
{
	struct info_list *list = opaque;
	struct info_plugin *p;

	if (plugin) {
		collect_plugin(list, path, plugin);
		return;
	}
	p = list_add(list, path);
	p->error =
	        xstrdup(err && err->message[0] ? err->message : lmt_strerror(err ? err->code : 0));
}

static void free_list(struct info_list *list)
{
	for (size_t i = 0; i < list->count; i++) {
		struct info_plugin *p = &list->items[i];

		free(p->path);
		free(p->error);
		free(p->name);
		free(p->version);
		free(p->description);
		free(p->write_access);
		free_schema(&p->schema);
	}
	free(list->items);
}

static int open_one(struct info_list *list, const char *name)
{
	struct lmt_error err = {0};
	lmt_plugin_handle *handle;
	int rc = lmt_plugin_open(name, &handle, &err);

	if (rc < 0) {
		fprintf(stderr, "lmt-info: %s\n", err.message[0] ? err.message : lmt_strerror(rc));
		return rc;
	}
	collect_plugin(list, lmt_plugin_path(handle), handle);
	lmt_plugin_close(handle);
	return 0;
}

/* ---- Text output -------------------------------------------------------- */

static void print_caps(uint64_t caps)
{
	const size_t known = sizeof(capability_names) / sizeof(capability_names[0]);
	const char *sep = "";

	printf("      capabilities: ");
	for (size_t i = 0; i < known; i++) {
		if (caps & (UINT64_C(1) << i)) {
			printf("%s%s", sep, capability_names[i]);
			sep = ", ";
		}
	}
	if (caps >> known)
		printf("%sunknown 0x%" PRIx64, sep, caps >> known << known);
	printf("%s\n", caps ? "" : "none");
}

/* `text` after `label`, wrapped at 79 columns under an indent of `indent`. */
static void print_wrapped(const char *label, const char *text, int indent)
{
	int col = printf("%*s%s", indent, "", label);

	for (const char *w = text; *w;) {
		while (*w == ' ')
			w++;
		int len = (int)strcspn(w, " ");

		if (!len)
			break;
		if (col > indent + (int)strlen(label) && col + 1 + len > 79) {
			printf("\n%*s", indent + (int)strlen(label), "");
			col = indent + (int)strlen(label);
		} else if (col > indent + (int)strlen(label)) {
			putchar(' ');
			col++;
		}
		col += printf("%.*s", len, w);
		w += len;
	}
	putchar('\n');
}

static void print_plugins(const struct info_list *list)
{
	bool failures = false, found = false;

	printf("plugins:\n");
	for (size_t i = 0; i < list->count; i++) {
		const struct info_plugin *p = &list->items[i];

		if (p->error) {
			failures = true;
			continue;
		}
		found = true;
		printf("  %s %s%s\n", p->name, p->version,
		       p->shadowed ? " (shadowed by an earlier file of that name)" : "");
		printf("      %s\n", p->description);
		printf("      path: %s\n", p->path);
		print_caps(p->caps);
		print_wrapped("who may write: ",
		              p->write_access ? p->write_access : "not declared by the plugin", 6);
		print_wrapped("data channels with tls=on: ", tls_channels(p->caps), 6);
	}
	if (!found)
		printf("  (none found)\n");
	if (!failures)
		return;
	printf("\nfailed to load:\n");
	for (size_t i = 0; i < list->count; i++) {
		const struct info_plugin *p = &list->items[i];

		/* The loader's messages usually name the file already. */
		if (p->error && strstr(p->error, p->path))
			printf("  %s\n", p->error);
		else if (p->error)
			printf("  %s: %s\n", p->path, p->error);
	}
}

static void print_option_text(const struct info_option *o)
{
	printf("  %s (%s", o->name, o->type);
	if (o->default_text[0])
		printf(", default %s", o->default_text);
	if (o->range[0])
		printf(", %s %s", strcmp(o->type, "enum") == 0 ? "one of" : "range", o->range);
	if (o->flags & LMT_OPTF_POW2)
		printf(", power of two");
	if (o->flags & LMT_OPTF_MATCH)
		printf(", must match on both sides");
	if (o->flags & LMT_OPTF_SECRET)
		printf(", secret");
	printf(")\n      %s\n", o->doc);
}

static void print_schema_text(const char *title, const struct info_schema *schema, bool *first)
{
	printf("%s%s:\n", *first ? "" : "\n", title);
	*first = false;
	if (schema->count == 0)
		printf("  (none)\n");
	for (uint32_t i = 0; i < schema->count; i++)
		print_option_text(&schema->options[i]);
}

static void print_options_text(const struct info_schema *core, const struct info_list *list,
                               bool first)
{
	if (core)
		print_schema_text("core options", core, &first);
	for (size_t i = 0; i < list->count; i++) {
		const struct info_plugin *p = &list->items[i];
		char *title;

		if (p->error || p->shadowed)
			continue;
		title = xasprintf("%s options", p->name);
		print_schema_text(title, &p->schema, &first);
		free(title);
	}
}

/* ---- Markdown output ---------------------------------------------------- */

/* A table cell: '|' would end the cell and a newline the row. */
static void md_cell(const char *text, bool code)
{
	if (!text[0]) {
		printf(" - |");
		return;
	}
	printf(" %s", code ? "`" : "");
	for (const char *c = text; *c; c++) {
		if (*c == '|')
			printf("\\|");
		else
			putchar(*c == '\n' ? ' ' : *c);
	}
	printf("%s |", code ? "`" : "");
}

static void md_option(const struct info_option *o)
{
	char *range, *doc;
	const char *doc_extra = "";

	if (o->flags & LMT_OPTF_POW2)
		range = xasprintf("%s%spower of two", o->range, o->range[0] ? ", " : "");
	else
		range = xstrdup(o->range);
	if (o->flags & LMT_OPTF_MATCH)
		doc_extra = " (must match on both sides)";
	doc = xasprintf("%s%s%s", o->doc, doc_extra,
	                (o->flags & LMT_OPTF_SECRET) ? " (secret: never printed or sent)" : "");
	printf("|");
	md_cell(o->name, true);
	md_cell(o->type, false);
	md_cell(o->default_text, o->default_text[0] != '\0');
	md_cell(range, false);
	md_cell(doc, false);
	printf("\n");
	free(range);
	free(doc);
}

static void md_table(const struct info_schema *schema)
{
	if (schema->count == 0) {
		printf("No options.\n");
		return;
	}
	printf("| Option | Type | Default | Range | Doc |\n");
	printf("|---|---|---|---|---|\n");
	for (uint32_t i = 0; i < schema->count; i++)
		md_option(&schema->options[i]);
}

static void md_intro(void)
{
	printf("# lmt options reference\n\n");
	printf("Generated by `lmt-info --markdown` (lmt %s) from the option schemas of\n"
	       "the core and of the plugins it found; do not edit by hand.\n\n",
	       lmt_version());
	printf("## Setting options\n\n");
	printf("Each option takes its value from, lowest to highest precedence:\n\n"
	       "1. its default, listed below;\n"
	       "2. the environment variable `LMT_<NAME>`: the name in upper case with\n"
	       "   `-` and `.` turned into `_` (`chunk-size` is `LMT_CHUNK_SIZE`,\n"
	       "   `tcp.nodelay` is `LMT_TCP_NODELAY`);\n"
	       "3. an explicit value: a `key=value,key=value` string given to\n"
	       "   `lmt_session_new()` or `lmt_session_set_options()` (and to\n"
	       "   `lmt-bench -o`), or one option with `lmt_session_set_option()`.\n\n"
	       "So default < environment < explicit. Plugin options are qualified by\n"
	       "the plugin name (`tcp.nodelay`). Sizes take binary suffixes (`64K`,\n"
	       "`1M`, `2GiB`); durations take a unit (`500us`, `300ms`, `2s`, `1m`;\n"
	       "a bare number is milliseconds); booleans are `on`/`off`, `true`/`false`,\n"
	       "`yes`/`no` or `1`/`0`. Options that must match on both sides are\n"
	       "compared at the handshake, and a difference fails the migration.\n\n"
	       "Options are read when the migration begins (`lmt_save_setup`,\n"
	       "`lmt_load_run` or a job). After that a source still takes\n"
	       "`downtime-limit`, `max-bandwidth` and `switchover-bandwidth`, from\n"
	       "any thread, for its next `lmt_save_iterate` call, as QEMU's\n"
	       "`migrate-set-parameters` does;\n"
	       "any other option, and any option of a destination, is refused with\n"
	       "`LMT_ESTATE` and a message naming it.\n\n");
	printf("## Encryption (`tls`)\n\n"
	       "With `tls=on` the control connection, and the data channels of a\n"
	       "plugin that encrypts (see each plugin below), run over TLS 1.3. The\n"
	       "mode follows from the other options:\n\n"
	       "- `tls-cert`, `tls-key` and `tls-ca` all set: certificates. Each side\n"
	       "  presents its certificate and requires the peer's to chain to its\n"
	       "  `tls-ca`. An `auth-key` may be set as well: its challenge-response\n"
	       "  then runs inside TLS.\n"
	       "- none of the three set, and `auth-key` or `auth-key-file` set: a\n"
	       "  pre-shared key derived from that key (HKDF-SHA-256).\n"
	       "- only some of the three: refused, naming those not set; none of them\n"
	       "  and no key: refused, naming both ways.\n\n"
	       "`tls-cert`, `tls-key` or `tls-ca` with `tls=off` is refused. Both\n"
	       "sides must set `tls` alike: a side with `tls=on` facing one with\n"
	       "`tls=off` fails on both with a message naming `tls`. Details in\n"
	       "[security.md](security.md) and [protocol.md](protocol.md#tls).\n");
}

static int compare_by_name(const void *a, const void *b)
{
	const struct info_plugin *const *pa = a, *const *pb = b;

	return strcmp((*pa)->name, (*pb)->name);
}

static void print_markdown(const struct info_schema *core, const struct info_list *list)
{
	const struct info_plugin **sorted = xcalloc(list->count, sizeof(*sorted));
	size_t n = 0;

	md_intro();
	if (core) {
		printf("\n## Core options\n\n");
		md_table(core);
	}
	for (size_t i = 0; i < list->count; i++) {
		if (!list->items[i].error && !list->items[i].shadowed)
			sorted[n++] = &list->items[i];
	}
	/* By name, so that the committed document does not depend on paths. */
	qsort(sorted, n, sizeof(*sorted), compare_by_name);
	for (size_t i = 0; i < n; i++) {
		printf("\n## Plugin `%s`\n\n%s\n\n", sorted[i]->name, sorted[i]->description);
		if (sorted[i]->write_access)
			printf("Who may write: %s\n\n", sorted[i]->write_access);
		printf("Data channels with tls=on: %s.\n\n", tls_channels(sorted[i]->caps));
		md_table(&sorted[i]->schema);
	}
	free(sorted);
}

/* ---- Main --------------------------------------------------------------- */

/* The ':'-separated search path, malloc'ed; NULL (after a message) on
 * failure. */
static char *search_path(void)
{
	for (size_t size = 4096; size <= (1u << 20); size *= 2) {
		char *buf = xcalloc(size, 1);
		int rc = lmt_plugin_search_path(buf, size);

		if (rc >= 0 && (size_t)rc < size)
			return buf;
		free(buf);
		if (rc < 0 && rc != -LMT_EOVERFLOW) {
			fprintf(stderr, "lmt-info: search path: %s\n", lmt_strerror(rc));
			return NULL;
		}
	}
	fprintf(stderr, "lmt-info: search path: %s\n", lmt_strerror(-LMT_EOVERFLOW));
	return NULL;
}

static int print_search_path(void)
{
	char *path = search_path();

	if (!path)
		return -1;
	for (char *dir = strtok(path, ":"); dir; dir = strtok(NULL, ":"))
		printf("%s\n", dir);
	free(path);
	return 0;
}

static void print_search_line(void)
{
	char *path = search_path();

	if (path)
		printf("search path: %s\n\n", path);
	free(path);
}

static void usage(FILE *f)
{
	fprintf(f, "usage: lmt-info [--plugin NAME] [--options | --markdown]\n"
	           "       lmt-info --search-path\n"
	           "\n"
	           "Lists the lmt transport plugins found on the search path (name, version,\n"
	           "path, capabilities, what a remote writer must hold to write guest RAM\n"
	           "through it, files that failed to load), then every option of the core\n"
	           "and of each plugin with its type, default, range and doc.\n"
	           "\n"
	           "  --plugin NAME   only this plugin (a name or a path to a .so), no core\n"
	           "  --options       only the options\n"
	           "  --markdown      the options reference as Markdown (docs/options.md)\n"
	           "  --search-path   the directories searched for plugins, one per line\n"
	           "  -h, --help      this help\n");
}

struct info_args {
	const char *plugin;
	bool options_only;
	bool markdown;
	bool search_path;
};

static int parse_args(int argc, char **argv, struct info_args *args)
{
	static const struct option longopts[] = {
	        {"plugin", required_argument, NULL, 'p'}, {"options", no_argument, NULL, 'o'},
	        {"markdown", no_argument, NULL, 'm'},     {"search-path", no_argument, NULL, 's'},
	        {"help", no_argument, NULL, 'h'},         {NULL, 0, NULL, 0},
	};
	int c;

	while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		switch (c) {
		case 'p':
			args->plugin = optarg;
			break;
		case 'o':
			args->options_only = true;
			break;
		case 'm':
			args->markdown = true;
			break;
		case 's':
			args->search_path = true;
			break;
		case 'h':
			usage(stdout);
			exit(0);
		default:
			return -1;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "lmt-info: unexpected argument '%s'\n", argv[optind]);
		return -1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct info_args args = {0};
	struct info_list list = {0};
	struct info_schema core = {0};
	const struct lmt_option_desc *core_descs;
	uint32_t core_count = 0;

	if (parse_args(argc, argv, &args) < 0) {
		usage(stderr);
		return 2;
	}
	if (args.search_path)
		return print_search_path() < 0 ? 1 : 0;
	if (args.plugin) {
		if (open_one(&list, args.plugin) < 0)
			return 1;
	} else {
		core_descs = lmt_core_options(&core_count);
		collect_schema(&core, NULL, core_descs, core_count);
		lmt_plugin_list(visit, &list);
	}
	if (args.markdown) {
		print_markdown(args.plugin ? NULL : &core, &list);
	} else {
		if (!args.options_only) {
			if (!args.plugin)
				print_search_line();
			print_plugins(&list);
		}
		print_options_text(args.plugin ? NULL : &core, &list, args.options_only);
	}
	free_schema(&core);
	free_list(&list);
	return fflush(stdout) == 0 ? 0 : 1;
}
