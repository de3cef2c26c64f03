/* lmt-bench: the rows of an invocation — plugin entries with their own
 * options, --sweep values, and their cross product. */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

/* Rows in one invocation at most: beyond it a typo, not a benchmark. */
#define MAX_ROWS 10000u
#define KEY_CHARS "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-"

static int fail(char *err, size_t size, const char *fmt, ...) LMT_PRINTF(3, 4);

static int fail(char *err, size_t size, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err, size, fmt, ap);
	va_end(ap);
	return -1;
}

static bool valid_key(const char *key, size_t len)
{
	return len > 0 && strspn(key, KEY_CHARS) >= len;
}

/* `text` with every `from` turned into `to`; NULL when out of memory. */
static char *replaced(const char *text, char from, char to)
{
	char *copy = strdup(text);

	for (char *p = copy; p && *p; p++) {
		if (*p == from)
			*p = to;
	}
	return copy;
}

/* ---- Plugin entries ----------------------------------------------------- */

static int check_plugin_options(const char *options, char sep, char *err, size_t size)
{
	const char *item = options;

	if (*options == '\0')
		return fail(err, size, "no options after ':'; expected NAME:KEY=VALUE%c...", sep);
	for (;;) {
		size_t len = strcspn(item, (char[]){sep, '\0'});
		const char *equals = memchr(item, '=', len);

		if (!equals || !valid_key(item, (size_t)(equals - item)))
			return fail(err, size, "expected KEY=VALUE, got '%.*s'%s", (int)len, item,
			            sep == ';' ? " (for a value with ';' in it, use --plugin "
			                         "NAME:KEY=VALUE,...)"
			                       : "");
		if (item[len] == '\0')
			return 0;
		item += len + 1;
	}
}

int bench_plugin_parse(const char *text, char sep, struct bench_plugin *out, char *err,
                       size_t err_size)
{
	/* The options start after the last ':' before the first '=', so a
	 * decorated name keeps its own ':' ("chaos:tcp:chaos.delay=1ms"). */
	const char *equals = strchr(text, '=');
	const char *colon = NULL;
	for (const char *p = text; equals && p < equals; p++)
		if (*p == ':')
			colon = p;
	if (!equals && *text && text[strlen(text) - 1] == ':')
		colon = text + strlen(text) - 1; /* "tcp:": options promised, none given */
	size_t name_len = colon ? (size_t)(colon - text) : strlen(text);
	char *label = NULL;

	memset(out, 0, sizeof(*out));
	if (name_len == 0)
		return fail(err, err_size, "the plugin name is empty");
	if (sep == ';' && memchr(text, '=', name_len))
		return fail(err, err_size,
		            "'%s' is not a plugin name; in --plugins, the options "
		            "of one plugin are separated by ';' (NAME:KEY=VALUE;KEY=VALUE)",
		            text);
	if (memchr(text, '=', name_len) || memchr(text, ',', name_len) ||
	    memchr(text, ' ', name_len))
		return fail(err, err_size, "expected NAME or NAME:KEY=VALUE%c..., got '%s'", sep,
		            text);
	if (colon && check_plugin_options(colon + 1, sep, err, err_size) < 0)
		return -1;
	out->name = strndup(text, name_len);
	if (colon) {
		out->options = replaced(colon + 1, sep, ',');
		label = replaced(colon + 1, sep, ' ');
	}
	if (!out->name || (colon && (!out->options || !label)) ||
	    asprintf(&out->label, "%s%s%s", out->name, label ? " " : "", label ? label : "") < 0) {
		out->label = NULL;
		free(label);
		bench_plugin_clear(out);
		return fail(err, err_size, "out of memory");
	}
	free(label);
	return 0;
}

void bench_plugin_clear(struct bench_plugin *plugin)
{
	free(plugin->name);
	free(plugin->options);
	free(plugin->label);
	memset(plugin, 0, sizeof(*plugin));
}

/* ---- Sweeps ------------------------------------------------------------- */

static int add_value(struct bench_sweep *sweep, const char *value, size_t len)
{
	char **values = realloc(sweep->values, (sweep->count + 1) * sizeof(*values));

	if (!values)
		return -1;
	sweep->values = values;
	values[sweep->count] = strndup(value, len);
	if (!values[sweep->count])
		return -1;
	sweep->count++;
	return 0;
}

static int sweep_values(struct bench_sweep *sweep, const char *list, char *err, size_t size)
{
	const char *item = list;

	if (*list == '\0')
		return fail(err, size, "--sweep '%s': no values after '='", sweep->arg);
	for (size_t n = 1;; n++) {
		size_t len = strcspn(item, ",");

		if (len == 0)
			return fail(err, size, "--sweep '%s': value %zu is empty", sweep->arg, n);
		for (size_t i = 0; i < sweep->count; i++) {
			const char *value = sweep->values[i];

			if (strlen(value) == len && strncmp(value, item, len) == 0)
				return fail(err, size, "--sweep '%s': value '%.*s' is given twice",
				            sweep->arg, (int)len, item);
		}
		if (add_value(sweep, item, len) < 0)
			return fail(err, size, "out of memory");
		if (item[len] == '\0')
			return 0;
		item += len + 1;
	}
}

int bench_sweep_parse(const char *text, struct bench_sweep *out, char *err, size_t err_size)
{
	const char *equals = strchr(text, '=');
	size_t key_len = equals ? (size_t)(equals - text) : 0;

	memset(out, 0, sizeof(*out));
	out->arg = strdup(text);
	if (!out->arg)
		return fail(err, err_size, "out of memory");
	if (!equals) {
		fail(err, err_size,
		     "--sweep '%s': expected OPTION=VALUE,VALUE,... such as "
		     "channels=1,2,4",
		     text);
	} else if (key_len == 0) {
		fail(err, err_size, "--sweep '%s': the option name before '=' is empty", text);
	} else if (!valid_key(text, key_len)) {
		fail(err, err_size,
		     "--sweep '%s': '%.*s' is not an option name (letters, "
		     "digits, '.', '_' and '-')",
		     text, (int)key_len, text);
	} else if (!(out->key = strndup(text, key_len))) {
		fail(err, err_size, "out of memory");
	} else if (sweep_values(out, equals + 1, err, err_size) == 0) {
		return 0;
	}
	bench_sweep_clear(out);
	return -1;
}

void bench_sweep_clear(struct bench_sweep *sweep)
{
	for (size_t i = 0; i < sweep->count; i++)
		free(sweep->values[i]);
	free(sweep->values);
	free(sweep->key);
	free(sweep->arg);
	memset(sweep, 0, sizeof(*sweep));
}

/* ---- Conflicts ---------------------------------------------------------- */

/* "tcp.nodelay" and "nodelay" name the same option. */
static bool same_option(const char *a, size_t a_len, const char *b, size_t b_len)
{
	const char *dot;

	if (a_len == b_len && strncmp(a, b, a_len) == 0)
		return true;
	if (a_len > b_len) {
		const char *t = a;
		size_t t_len = a_len;

		a = b, a_len = b_len, b = t, b_len = t_len;
	}
	dot = b + (b_len - a_len) - 1;
	return b_len > a_len + 1 && *dot == '.' && strncmp(dot + 1, a, a_len) == 0 &&
	       memchr(b, '.', (size_t)(dot - b)) == NULL;
}

/* Whether the "key=value,..." list sets `key`; *found gets that item. */
static bool list_sets(const char *list, const char *key, const char **found, size_t *len)
{
	for (const char *item = list; list && *item;) {
		size_t item_len = strcspn(item, ",");
		const char *equals = memchr(item, '=', item_len);

		if (equals && same_option(item, (size_t)(equals - item), key, strlen(key))) {
			*found = item;
			*len = item_len;
			return true;
		}
		item += item_len + (item[item_len] == ',');
	}
	return false;
}

static int check_sweep(const struct bench_sweep *sweeps, size_t i, const char *common,
                       const struct bench_plugin *plugins, size_t nplugins, char *err, size_t size)
{
	const struct bench_sweep *s = &sweeps[i];
	const char *item;
	size_t len;

	for (size_t j = 0; j < i; j++) {
		if (same_option(s->key, strlen(s->key), sweeps[j].key, strlen(sweeps[j].key)))
			return fail(err, size, "--sweep '%s': %s is already swept by --sweep '%s'",
			            s->arg, s->key, sweeps[j].arg);
	}
	if (list_sets(common, s->key, &item, &len))
		return fail(err, size,
		            "--sweep '%s': %s is also set by -o '%.*s'; set it in "
		            "one place",
		            s->arg, s->key, (int)len, item);
	for (size_t p = 0; p < nplugins; p++) {
		if (list_sets(plugins[p].options, s->key, &item, &len))
			return fail(err, size,
			            "--sweep '%s': %s is also set by the plugin entry "
			            "'%s:%s'; set it in one place",
			            s->arg, s->key, plugins[p].name, plugins[p].options);
	}
	return 0;
}

/* -o and a plugin entry setting the same option. */
static int check_common(const char *common, const struct bench_plugin *plugin, char *err,
                        size_t size)
{
	for (const char *item = common; *item;) {
		size_t len = strcspn(item, ","), other_len;
		const char *equals = memchr(item, '=', len), *other;
		char *key = equals ? strndup(item, (size_t)(equals - item)) : NULL;
		bool clash = key && list_sets(plugin->options, key, &other, &other_len);

		free(key);
		if (clash)
			return fail(err, size,
			            "-o '%.*s' and the plugin entry '%s:%s' both set "
			            "%.*s; set it in one place",
			            (int)len, item, plugin->name, plugin->options,
			            (int)(equals - item), item);
		item += len + (item[len] == ',');
	}
	return 0;
}

int bench_check_conflicts(const struct bench_sweep *sweeps, size_t nsweeps, const char *common,
                          const struct bench_plugin *plugins, size_t nplugins, char *err,
                          size_t err_size)
{
	for (size_t i = 0; i < nsweeps; i++) {
		if (check_sweep(sweeps, i, common, plugins, nplugins, err, err_size) < 0)
			return -1;
	}
	for (size_t p = 0; p < nplugins && common; p++) {
		if (check_common(common, &plugins[p], err, err_size) < 0)
			return -1;
	}
	return 0;
}

/* ---- Rows --------------------------------------------------------------- */

/* The values of combination `combo`, the last sweep varying fastest. */
static char *combination(const struct bench_sweep *sweeps, size_t nsweeps, size_t combo, char sep)
{
	char *text = strdup(""), *next;

	for (size_t i = nsweeps; i-- > 0 && text;) {
		const struct bench_sweep *s = &sweeps[i];
		const char *value = s->values[combo % s->count];

		combo /= s->count;
		if (asprintf(&next, "%s=%s%s%s", s->key, value, text[0] ? (char[]){sep, 0} : "",
		             text) < 0)
			next = NULL;
		free(text);
		text = next;
	}
	return text;
}

/* "a,b,c" from the non-empty parts; NULL when there are none. */
static int join_options(const char *a, const char *b, const char *c, char **out)
{
	const char *parts[] = {a, b, c};
	char *text = NULL, *next;

	for (size_t i = 0; i < 3; i++) {
		if (!parts[i] || !parts[i][0])
			continue;
		if (asprintf(&next, "%s%s%s", text ? text : "", text ? "," : "", parts[i]) < 0) {
			free(text);
			return -1;
		}
		free(text);
		text = next;
	}
	*out = text;
	return 0;
}

static int fill_row(struct bench_row *row, struct bench_plugin *plugin,
                    const struct bench_sweep *sweeps, size_t nsweeps, size_t combo,
                    const char *common)
{
	char *spaced = combination(sweeps, nsweeps, combo, ' ');

	row->plugin = plugin;
	row->config = combination(sweeps, nsweeps, combo, ',');
	if (!spaced || !row->config ||
	    join_options(plugin->options, common, row->config, &row->options) < 0 ||
	    asprintf(&row->label, "%s%s%s", plugin->label, spaced[0] ? " " : "", spaced) < 0) {
		row->label = NULL;
		free(spaced);
		return -1;
	}
	free(spaced);
	return 0;
}

int bench_rows_build(struct bench_plugin *plugins, size_t nplugins,
                     const struct bench_sweep *sweeps, size_t nsweeps, const char *common,
                     struct bench_row **rows, size_t *nrows, char *err, size_t err_size)
{
	size_t combos = 1, n = 0;
	struct bench_row *out;

	for (size_t i = 0; i < nsweeps; i++) {
		if (sweeps[i].count > MAX_ROWS / combos)
			return fail(err, err_size, "--sweep: more than %u combinations", MAX_ROWS);
		combos *= sweeps[i].count;
	}
	if (nplugins > MAX_ROWS / combos)
		return fail(err, err_size, "%zu plugins times %zu combinations: more than %u rows",
		            nplugins, combos, MAX_ROWS);
	out = calloc(nplugins * combos, sizeof(*out));
	if (!out)
		return fail(err, err_size, "out of memory");
	for (size_t p = 0; p < nplugins; p++) {
		for (size_t c = 0; c < combos; c++, n++) {
			out[n].index = (unsigned)n + 1;
			if (fill_row(&out[n], &plugins[p], sweeps, nsweeps, c, common) < 0) {
				bench_rows_free(out, n + 1);
				return fail(err, err_size, "out of memory");
			}
		}
	}
	*rows = out;
	*nrows = n;
	return 0;
}

void bench_rows_free(struct bench_row *rows, size_t nrows)
{
	for (size_t i = 0; rows && i < nrows; i++) {
		for (unsigned r = 0; rows[i].results && r < rows[i].runs; r++)
			bench_result_clear(&rows[i].results[r]);
		free(rows[i].results);
		free(rows[i].config);
		free(rows[i].options);
		free(rows[i].label);
	}
	free(rows);
}
