/* The option set (base room): a schema's options with their values
 * (default < environment < explicit), the environment, lists, "did you
 * mean", reading values. One value is parsed and formatted by
 * option_value.c.
 *
 * Thread-safety: an optset is used by one thread at a time; the caller
 * serialises. lmt__optset_load_env() reads the environment with getenv(),
 * so it must not race with setenv() in another thread. The parsers and
 * lmt_option_format() keep no state and are safe from any thread. */
#define _GNU_SOURCE /* explicit_bzero */
#include "options.h"

#include <ctype.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "error.h"

/* The core schema plus a few plugins (a decorator and what it wraps). */
enum { OPTSET_MAX_SCHEMAS = 8 };

/* Longest name the "did you mean" search compares. */
enum { SUGGEST_NAME_MAX = 64 };

struct option_entry {
	const struct lmt_option_desc *desc; /* the schema's; outlives the set */
	char *name;                         /* qualified: "tcp.nodelay" */
	char *env_name;                     /* "LMT_TCP_NODELAY" */
	struct lmt_option_value value;
	char *text; /* canonical text; also value.text for ENUM and STRING */
	enum lmt_opt_source source;
};

struct lmt_optset {
	struct option_entry *entries;
	size_t count;
	size_t capacity;
	char *schemas[OPTSET_MAX_SCHEMAS]; /* namespaces added; "" is the core */
	size_t schema_count;
	/* Texts replaced by a later set. value.text handed out by get must
	 * live as long as the set (the plugin ABI promises it), so they are
	 * only freed with the set. */
	char **retired;
	size_t retired_count;
	size_t retired_capacity;
};

static void free_text(char *text)
{
	if (text) {
		explicit_bzero(text, strlen(text));
		free(text);
	}
}

/* Parse `text` for `entry` into a value and its malloc'ed canonical text,
 * which also backs value.text for ENUM and STRING. */
static int parse_for_entry(const struct option_entry *entry, const char *text,
                           struct lmt_option_value *value, char **canonical, struct lmt_error *err)
{
	char buf[32];

	*canonical = NULL;
	int rc = lmt__option_parse(entry->desc, entry->name, text, value, err);
	if (rc < 0)
		return rc;
	if (!value->text && lmt_option_format(entry->desc, value, buf, sizeof(buf)) < 0)
		return lmt__error(err, LMT_EINVAL, "%s: cannot format the value", entry->name);
	*canonical = strdup(value->text ? value->text : buf);
	if (!*canonical)
		return lmt__error(err, LMT_ENOMEM, "out of memory");
	if (value->text)
		value->text = *canonical;
	return 0;
}

/* Parse only to check `text`; nothing is kept. */
static int check_value(const struct option_entry *entry, const char *text, struct lmt_error *err)
{
	struct lmt_option_value value;
	char *canonical = NULL;

	int rc = parse_for_entry(entry, text, &value, &canonical, err);
	free_text(canonical);
	return rc;
}

/* ---- the option set ---------------------------------------------------- */

int lmt__optset_new(struct lmt_optset **out)
{
	if (!out)
		return -LMT_EINVAL;
	*out = calloc(1, sizeof(**out));
	return *out ? 0 : -LMT_ENOMEM;
}

static void free_entry(struct option_entry *entry)
{
	free(entry->name);
	free(entry->env_name);
	free_text(entry->text);
}

void lmt__optset_free(struct lmt_optset *set)
{
	if (!set)
		return;
	for (size_t i = 0; i < set->count; i++)
		free_entry(&set->entries[i]);
	for (size_t i = 0; i < set->schema_count; i++)
		free(set->schemas[i]);
	for (size_t i = 0; i < set->retired_count; i++)
		free_text(set->retired[i]);
	free(set->entries);
	free(set->retired);
	free(set);
}

static struct option_entry *find_entry(const struct lmt_optset *set, const char *name)
{
	for (size_t i = 0; i < set->count; i++)
		if (strcmp(set->entries[i].name, name) == 0)
			return &set->entries[i];
	return NULL;
}

/* "core schema: ..." or "plugin 'tcp': ..." for mistakes in a schema. */
static int schema_error(struct lmt_error *err, int code, const char *ns, const char *fmt, ...)
        LMT_PRINTF(4, 5);

static int schema_error(struct lmt_error *err, int code, const char *ns, const char *fmt, ...)
{
	char detail[sizeof(err->message)];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(detail, sizeof(detail), fmt, ap);
	va_end(ap);
	if (ns)
		return lmt__error(err, code, "plugin '%s': %s", ns, detail);
	return lmt__error(err, code, "core schema: %s", detail);
}

/* Namespaces and short option names: [a-z0-9_-]+ (ASCII, whatever the
 * locale). */
static bool valid_name(const char *name)
{
	if (!name || !*name)
		return false;
	for (const char *p = name; *p; p++)
		if (!(*p >= 'a' && *p <= 'z') && !(*p >= '0' && *p <= '9') && *p != '_' &&
		    *p != '-')
			return false;
	return true;
}

static int check_namespace(const struct lmt_optset *set, const char *ns, struct lmt_error *err)
{
	const char *key = ns ? ns : "";

	if (ns && !valid_name(ns))
		return lmt__error(err, LMT_EINVAL, "'%s' is not a valid option namespace", ns);
	for (size_t i = 0; i < set->schema_count; i++)
		if (strcmp(set->schemas[i], key) == 0)
			return schema_error(err, LMT_EINVAL, ns, "options already added");
	if (set->schema_count == OPTSET_MAX_SCHEMAS)
		return schema_error(err, LMT_EOVERFLOW, ns, "more than %d option schemas",
		                    OPTSET_MAX_SCHEMAS);
	return 0;
}

static bool is_number_type(enum lmt_option_type type)
{
	return type == LMT_OPT_INT || type == LMT_OPT_SIZE || type == LMT_OPT_DURATION;
}

/* Mistakes a schema author can make, other than a bad name or default. */
static int check_desc(const struct lmt_option_desc *desc, const char *qualified, const char *ns,
                      struct lmt_error *err)
{
	if ((unsigned)desc->type > LMT_OPT_STRING)
		return schema_error(err, LMT_EINVAL, ns, "%s has unknown type %d", qualified,
		                    (int)desc->type);
	if (desc->type == LMT_OPT_ENUM && (!desc->enum_values || !desc->enum_values[0]))
		return schema_error(err, LMT_EINVAL, ns, "%s is an enum without values", qualified);
	if (!is_number_type(desc->type) || !lmt__option_has_range(desc))
		return 0;
	if (desc->min > desc->max || (desc->type != LMT_OPT_INT && desc->min < 0))
		return schema_error(err, LMT_EINVAL, ns, "%s has a bad range", qualified);
	return 0;
}

static char *qualify(const char *ns, const char *name)
{
	size_t len = (ns ? strlen(ns) + 1 : 0) + strlen(name) + 1;
	char *out = malloc(len);

	if (out)
		snprintf(out, len, "%s%s%s", ns ? ns : "", ns ? "." : "", name);
	return out;
}

/* "tcp.no-delay" -> "LMT_TCP_NO_DELAY". */
static char *env_name_of(const char *qualified)
{
	size_t len = strlen("LMT_") + strlen(qualified) + 1;
	char *out = malloc(len);

	if (!out)
		return NULL;
	snprintf(out, len, "LMT_%s", qualified);
	for (char *p = out; *p; p++)
		*p = (*p == '-' || *p == '.') ? '_' : (char)toupper((unsigned char)*p);
	return out;
}

static int check_unique(const struct lmt_optset *set, const struct option_entry *entry,
                        const char *ns, struct lmt_error *err)
{
	for (size_t i = 0; i < set->count; i++) {
		const struct option_entry *other = &set->entries[i];
		if (strcmp(other->name, entry->name) == 0)
			return schema_error(err, LMT_EINVAL, ns, "%s is declared twice",
			                    entry->name);
		if (strcmp(other->env_name, entry->env_name) == 0)
			return schema_error(err, LMT_EINVAL, ns, "%s and %s share the variable %s",
			                    other->name, entry->name, entry->env_name);
	}
	return 0;
}

static int apply_default(struct option_entry *entry, const char *ns, struct lmt_error *err)
{
	const char *text = entry->desc->default_value;
	struct lmt_error inner;

	if (!text && entry->desc->type == LMT_OPT_STRING)
		text = "";
	if (!text)
		return schema_error(err, LMT_EINVAL, ns, "%s has no default", entry->name);
	int rc = parse_for_entry(entry, text, &entry->value, &entry->text, &inner);
	if (rc < 0)
		return schema_error(err, rc, ns, "bad default: %s", inner.message);
	entry->source = LMT_OPT_SRC_DEFAULT;
	return 0;
}

/* Build the entry for one descriptor; on failure nothing is left allocated. */
static int make_entry(const struct lmt_optset *set, const char *ns,
                      const struct lmt_option_desc *desc, struct option_entry *entry,
                      struct lmt_error *err)
{
	int rc = 0;

	memset(entry, 0, sizeof(*entry));
	entry->desc = desc;
	if (!valid_name(desc->name))
		return schema_error(err, LMT_EINVAL, ns, "option name '%s' is not [a-z0-9_-]+",
		                    desc->name ? desc->name : "(null)");
	entry->name = qualify(ns, desc->name);
	entry->env_name = entry->name ? env_name_of(entry->name) : NULL;
	if (!entry->env_name)
		rc = lmt__error(err, LMT_ENOMEM, "out of memory");
	if (rc == 0)
		rc = check_desc(desc, entry->name, ns, err);
	if (rc == 0)
		rc = check_unique(set, entry, ns, err);
	if (rc == 0)
		rc = apply_default(entry, ns, err);
	if (rc < 0)
		free_entry(entry);
	return rc;
}

static int reserve_entries(struct lmt_optset *set, size_t more, struct lmt_error *err)
{
	if (set->count + more <= set->capacity)
		return 0;
	size_t capacity = set->count + more;
	struct option_entry *entries = realloc(set->entries, capacity * sizeof(*entries));
	if (!entries)
		return lmt__error(err, LMT_ENOMEM, "out of memory");
	set->entries = entries;
	set->capacity = capacity;
	return 0;
}

static void drop_entries_from(struct lmt_optset *set, size_t first)
{
	while (set->count > first)
		free_entry(&set->entries[--set->count]);
}

/* The caller keeps `descs` alive as long as the set. All or nothing: on
 * failure the set is as it was. */
int lmt__optset_add_schema(struct lmt_optset *set, const char *ns,
                           const struct lmt_option_desc *descs, uint32_t count,
                           struct lmt_error *err)
{
	if (!set || (count && !descs))
		return lmt__error(err, LMT_EINVAL, "no option set or schema");
	int rc = check_namespace(set, ns, err);
	if (rc == 0)
		rc = reserve_entries(set, count, err);
	if (rc < 0)
		return rc;
	char *key = strdup(ns ? ns : "");
	if (!key)
		return lmt__error(err, LMT_ENOMEM, "out of memory");
	size_t first = set->count;
	for (uint32_t i = 0; i < count && rc == 0; i++) {
		rc = make_entry(set, ns, &descs[i], &set->entries[set->count], err);
		if (rc == 0)
			set->count++;
	}
	if (rc < 0) {
		drop_entries_from(set, first);
		free(key);
		return rc;
	}
	set->schemas[set->schema_count++] = key;
	return 0;
}

/* ---- setting values ---------------------------------------------------- */

/* Edit distance, ignoring case; SIZE_MAX for names too long to compare. */
static size_t edit_distance(const char *a, const char *b)
{
	size_t row[SUGGEST_NAME_MAX + 1];
	size_t len_a = strlen(a), len_b = strlen(b);

	if (len_a > SUGGEST_NAME_MAX || len_b > SUGGEST_NAME_MAX)
		return SIZE_MAX;
	for (size_t j = 0; j <= len_b; j++)
		row[j] = j;
	for (size_t i = 1; i <= len_a; i++) {
		size_t diagonal = row[0];
		row[0] = i;
		for (size_t j = 1; j <= len_b; j++) {
			size_t above = row[j];
			bool same = tolower((unsigned char)a[i - 1]) ==
			            tolower((unsigned char)b[j - 1]);
			size_t best = diagonal + !same;
			if (above + 1 < best)
				best = above + 1;
			if (row[j - 1] + 1 < best)
				best = row[j - 1] + 1;
			diagonal = above;
			row[j] = best;
		}
	}
	return row[len_b];
}

/* A plugin option named without its namespace ("nodelay") counts as an
 * exact match of "tcp.nodelay". */
static size_t name_distance(const char *typed, const char *known)
{
	const char *dot = strchr(known, '.');

	if (dot && strcmp(dot + 1, typed) == 0)
		return 0;
	return edit_distance(typed, known);
}

/* The known name closest to `typed`, when close enough to be a typo. */
static const char *closest_name(const struct lmt_optset *set, const char *typed)
{
	size_t limit = strlen(typed) / 3;
	const char *best = NULL;
	size_t best_distance = SIZE_MAX;

	limit = limit < 1 ? 1 : limit > 3 ? 3 : limit;
	for (size_t i = 0; i < set->count; i++) {
		size_t distance = name_distance(typed, set->entries[i].name);
		if (distance < best_distance) {
			best_distance = distance;
			best = set->entries[i].name;
		}
	}
	return best_distance <= limit ? best : NULL;
}

static int unknown_option(const struct lmt_optset *set, const char *name, struct lmt_error *err)
{
	const char *guess = closest_name(set, name);

	if (guess)
		return lmt__error(err, LMT_ENOTFOUND, "%s: unknown option; did you mean '%s'?",
		                  name, guess);
	return lmt__error(err, LMT_ENOTFOUND, "%s: unknown option (lmt-info lists them all)", name);
}

static int retire(struct lmt_optset *set, char *text)
{
	if (set->retired_count == set->retired_capacity) {
		size_t capacity = set->retired_capacity ? set->retired_capacity * 2 : 8;
		char **retired = realloc(set->retired, capacity * sizeof(*retired));
		if (!retired)
			return -LMT_ENOMEM;
		set->retired = retired;
		set->retired_capacity = capacity;
	}
	set->retired[set->retired_count++] = text;
	return 0;
}

static bool valid_source(enum lmt_opt_source source)
{
	return source == LMT_OPT_SRC_DEFAULT || source == LMT_OPT_SRC_ENV ||
	       source == LMT_OPT_SRC_EXPLICIT;
}

/* The value is parsed even when its source is too low to apply, so that a
 * bad value is an error whatever order the sources arrive in. */
int lmt__optset_set(struct lmt_optset *set, const char *name, const char *value,
                    enum lmt_opt_source source, struct lmt_error *err)
{
	struct lmt_option_value parsed;
	char *canonical = NULL;

	if (!set || !name || !value || !valid_source(source))
		return lmt__error(err, LMT_EINVAL, "option set: missing name or value");
	struct option_entry *entry = find_entry(set, name);
	if (!entry)
		return unknown_option(set, name, err);
	int rc = parse_for_entry(entry, value, &parsed, &canonical, err);
	if (rc < 0 || source < entry->source) {
		free_text(canonical);
		return rc;
	}
	if (retire(set, entry->text) < 0) {
		free_text(canonical);
		return lmt__error(err, LMT_ENOMEM, "out of memory");
	}
	entry->value = parsed;
	entry->text = canonical;
	entry->source = source;
	return 0;
}

/* Check, or apply, the variable of one option when it is set. */
static int env_value(struct lmt_optset *set, const struct option_entry *entry, bool apply,
                     struct lmt_error *err)
{
	struct lmt_error inner;
	const char *text = getenv(entry->env_name);

	if (!text)
		return 0;
	int rc = apply ? lmt__optset_set(set, entry->name, text, LMT_OPT_SRC_ENV, &inner)
	               : check_value(entry, text, &inner);
	if (rc < 0)
		return lmt__error(err, rc, "%s: %s", entry->env_name, inner.message);
	return 0;
}

/* Check every LMT_* variable before applying any, so that a bad one leaves
 * the set as it was. */
int lmt__optset_load_env(struct lmt_optset *set, struct lmt_error *err)
{
	if (!set)
		return lmt__error(err, LMT_EINVAL, "no option set");
	for (int apply = 0; apply < 2; apply++) {
		for (size_t i = 0; i < set->count; i++) {
			int rc = env_value(set, &set->entries[i], apply, err);
			if (rc < 0)
				return rc;
		}
	}
	return 0;
}

struct list_item {
	const char *name;
	const char *value;
};

/* Cut `list` (a modifiable copy) into items at ',' and '='. Returns the
 * number of items, or a negative code for a malformed item. */
static int split_list(char *list, struct list_item *items, struct lmt_error *err)
{
	int count = 0;

	for (char *item = list; item; count++) {
		char *next = strchr(item, ',');
		if (next)
			*next++ = '\0';
		char *equals = strchr(item, '=');
		if (!equals || equals == item)
			return lmt__error(err, LMT_EINVAL, "expected key=value, got '%s'", item);
		*equals = '\0';
		items[count].name = item;
		items[count].value = equals + 1;
		item = next;
	}
	return count;
}

struct list_filter {
	lmt_optset_allow_fn allow; /* NULL: every option */
	void *opaque;
};

static int check_items(const struct lmt_optset *set, const struct list_item *items, int count,
                       const struct list_filter *filter, struct lmt_error *err)
{
	for (int i = 0; i < count; i++) {
		const struct option_entry *entry = find_entry(set, items[i].name);
		if (!entry)
			return unknown_option(set, items[i].name, err);
		int rc = filter->allow ? filter->allow(filter->opaque, entry->name, err) : 0;
		if (rc == 0)
			rc = check_value(entry, items[i].value, err);
		if (rc < 0)
			return rc;
	}
	return 0;
}

static int apply_list(struct lmt_optset *set, char *list, const struct list_filter *filter,
                      struct lmt_error *err)
{
	size_t max_items = 1;

	for (const char *p = list; *p; p++)
		max_items += *p == ',';
	struct list_item *items = calloc(max_items, sizeof(*items));
	if (!items)
		return lmt__error(err, LMT_ENOMEM, "out of memory");
	int count = split_list(list, items, err);
	int rc = count < 0 ? count : check_items(set, items, count, filter, err);
	for (int i = 0; rc == 0 && i < count; i++)
		rc = lmt__optset_set(set, items[i].name, items[i].value, LMT_OPT_SRC_EXPLICIT, err);
	free(items);
	return rc;
}

static int parse_filtered(struct lmt_optset *set, const char *list,
                          const struct list_filter *filter, struct lmt_error *err)
{
	if (!set)
		return lmt__error(err, LMT_EINVAL, "no option set");
	if (!list || !*list)
		return 0;
	char *copy = strdup(list);
	if (!copy)
		return lmt__error(err, LMT_ENOMEM, "out of memory");
	size_t len = strlen(list);
	int rc = apply_list(set, copy, filter, err);
	explicit_bzero(copy, len); /* cut at ',' and '=', so by length */
	free(copy);
	return rc;
}

/* All or nothing: every item is checked before any is applied. */
int lmt__optset_parse(struct lmt_optset *set, const char *list, struct lmt_error *err)
{
	return parse_filtered(set, list, &(struct list_filter){0}, err);
}

int lmt__optset_parse_allowed(struct lmt_optset *set, const char *list, lmt_optset_allow_fn allow,
                              void *opaque, struct lmt_error *err)
{
	return parse_filtered(set, list, &(struct list_filter){allow, opaque}, err);
}

/* ---- reading values ---------------------------------------------------- */

/* out->text stays valid as long as the set, even after the option changes. */
int lmt__optset_get(const struct lmt_optset *set, const char *name, struct lmt_option_value *out)
{
	if (!set || !name || !out)
		return -LMT_EINVAL;
	const struct option_entry *entry = find_entry(set, name);
	if (!entry)
		return -LMT_ENOTFOUND;
	*out = entry->value;
	return 0;
}

/* For the typed shortcuts: a missing name is a bug in the core, logged but
 * not fatal. */
static const struct option_entry *known_entry(const struct lmt_optset *set, const char *name)
{
	const struct option_entry *entry = set && name ? find_entry(set, name) : NULL;

	if (!entry)
		lmt__log(LMT_LOG_WARN, "internal error: no option named '%s'",
		         name ? name : "(null)");
	return entry;
}

/* DURATION in nanoseconds, ENUM as its index, BOOL as 0 or 1. */
int64_t lmt__opt_int(const struct lmt_optset *set, const char *name)
{
	const struct option_entry *entry = known_entry(set, name);

	return entry ? entry->value.integer : 0;
}

bool lmt__opt_bool(const struct lmt_optset *set, const char *name)
{
	const struct option_entry *entry = known_entry(set, name);

	return entry ? entry->value.boolean != 0 : false;
}

/* The canonical text of any option (secrets included), valid as long as
 * the set. */
const char *lmt__opt_text(const struct lmt_optset *set, const char *name)
{
	const struct option_entry *entry = known_entry(set, name);

	return entry ? entry->text : "";
}

/* In schema order (the core first). A secret's text is "(secret)"; its
 * value is passed unchanged for the core's own use and is never printed. */
int lmt__optset_foreach(const struct lmt_optset *set, lmt_optset_visit_fn fn, void *opaque)
{
	if (!set || !fn)
		return -LMT_EINVAL;
	for (size_t i = 0; i < set->count; i++) {
		const struct option_entry *entry = &set->entries[i];
		const char *text = entry->desc->flags & LMT_OPTF_SECRET ? "(secret)" : entry->text;
		int rc = fn(opaque, entry->name, entry->desc, &entry->value, text, entry->source);
		if (rc != 0)
			return rc;
	}
	return 0;
}

