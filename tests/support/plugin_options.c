/* The plugin test harness's option values: what the host's option service
 * hands the plugin under test, for the core's options and the plugin's (and,
 * around a decorator, the wrapped plugin's), each parsed by the core's own
 * parser from its default, its LMT_* variable and the list given, in that
 * order, as a session takes them. */
#define _GNU_SOURCE
#include "plugin_harness.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ph_option {
	char *name;     /* qualified: "chunk-size", "tcp.nodelay" */
	char *env_name; /* "LMT_CHUNK_SIZE", "LMT_TCP_NODELAY" */
	/* The schema's descriptor under its qualified name, which the
	 * parser's messages then give, as a session's do. */
	struct lmt_option_desc desc;
	struct lmt_option_value value;
	char *text; /* the text parsed, which value.text may borrow */
};

struct ph_options {
	struct ph_option *items;
	size_t count;
};

static int fail(struct lmt_error *err, int code, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));

static int fail(struct lmt_error *err, int code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err->message, sizeof(err->message), fmt, ap);
	va_end(ap);
	err->code = -code;
	return -code;
}

void ph_options_free(struct ph_options *options)
{
	if (!options)
		return;
	for (size_t i = 0; i < options->count; i++) {
		free(options->items[i].name);
		free(options->items[i].env_name);
		free(options->items[i].text);
	}
	free(options->items);
	free(options);
}

static struct ph_option *find(const struct ph_options *options, const char *name)
{
	for (size_t i = 0; i < options->count; i++)
		if (strcmp(options->items[i].name, name) == 0)
			return &options->items[i];
	return NULL;
}

struct ph_options *ph_options_copy(const struct ph_options *options)
{
	struct ph_options *copy = calloc(1, sizeof(*copy));
	if (!copy || !(copy->items = calloc(options->count, sizeof(*copy->items)))) {
		free(copy);
		return NULL;
	}
	for (size_t i = 0; i < options->count; i++, copy->count++) {
		const struct ph_option *o = &options->items[i];
		struct ph_option *c = &copy->items[i];
		*c = *o;
		c->name = strdup(o->name);
		c->env_name = strdup(o->env_name);
		c->text = o->text ? strdup(o->text) : NULL;
		if (!c->name || !c->env_name || (o->text && !c->text)) {
			copy->count++;
			ph_options_free(copy);
			return NULL;
		}
		c->desc.name = c->name;
		/* A value that borrows the text it was parsed from borrows the copy's. */
		if (o->text && o->value.text >= o->text &&
		    o->value.text <= o->text + strlen(o->text))
			c->value.text = c->text + (o->value.text - o->text);
	}
	return copy;
}

int ph_option_get(const struct ph_options *options, const char *name, struct lmt_option_value *out)
{
	const struct ph_option *o = find(options, name);
	if (!o)
		return -LMT_ENOTFOUND;
	*out = o->value;
	return 0;
}

/* Parse `text` for `o`, keeping a copy for the value to borrow. */
static int set(struct ph_option *o, const char *text, struct lmt_error *err)
{
	struct lmt_option_value value;
	char *copy = strdup(text);
	if (!copy)
		return fail(err, LMT_ENOMEM, "out of memory");
	if (lmt_option_parse(&o->desc, copy, &value, err) != 0) {
		free(copy);
		return err->code;
	}
	free(o->text);
	o->text = copy;
	o->value = value;
	return 0;
}

/* "tcp.no-delay" -> "LMT_TCP_NO_DELAY". */
static char *env_name_of(const char *name)
{
	char *env = NULL;
	if (asprintf(&env, "LMT_%s", name) < 0)
		return NULL;
	for (char *p = env; *p; p++)
		*p = (*p == '-' || *p == '.') ? '_' : (char)toupper((unsigned char)*p);
	return env;
}

static int add(struct ph_options *options, const char *ns, const struct lmt_option_desc *desc,
               struct lmt_error *err)
{
	struct ph_option *o = &options->items[options->count];
	*o = (struct ph_option){.desc = *desc};
	if (asprintf(&o->name, "%s%s%s", ns ? ns : "", ns ? "." : "", desc->name) < 0)
		return fail(err, LMT_ENOMEM, "out of memory");
	options->count++;
	o->desc.name = o->name;
	if (!(o->env_name = env_name_of(o->name)))
		return fail(err, LMT_ENOMEM, "out of memory");
	for (size_t i = 0; i + 1 < options->count; i++) {
		const struct ph_option *other = &options->items[i];
		if (strcmp(other->name, o->name) == 0)
			return fail(err, LMT_EINVAL, "%s is declared twice", o->name);
		if (strcmp(other->env_name, o->env_name) == 0)
			return fail(err, LMT_EINVAL, "%s and %s share the variable %s", other->name,
			            o->name, o->env_name);
	}
	struct lmt_error why = {0};
	int rc = set(o, desc->default_value ? desc->default_value : "", &why);
	return rc ? fail(err, -rc, "bad default: %s", why.message) : 0;
}

static int add_schema(struct ph_options *options, const char *ns,
                      const struct lmt_option_desc *descs, uint32_t count, struct lmt_error *err)
{
	struct ph_option *items =
	        realloc(options->items, (options->count + count) * sizeof(*options->items));
	if (!items)
		return fail(err, LMT_ENOMEM, "out of memory");
	options->items = items;
	for (uint32_t i = 0; i < count; i++) {
		int rc = add(options, ns, &descs[i], err);
		if (rc) {
			char why[sizeof(err->message)];
			snprintf(why, sizeof(why), "%s", err->message);
			return ns ? fail(err, -rc, "plugin '%s': %s", ns, why)
			          : fail(err, -rc, "core schema: %s", why);
		}
	}
	return 0;
}

static int load_env(struct ph_options *options, struct lmt_error *err)
{
	for (size_t i = 0; i < options->count; i++) {
		struct ph_option *o = &options->items[i];
		const char *text = getenv(o->env_name);
		struct lmt_error why = {0};
		if (text && set(o, text, &why) != 0)
			return fail(err, -why.code, "%s: %s", o->env_name, why.message);
	}
	return 0;
}

static int set_item(struct ph_options *options, char *item, struct lmt_error *err)
{
	char *equals = strchr(item, '=');
	if (!equals || equals == item)
		return fail(err, LMT_EINVAL, "expected key=value, got '%s'", item);
	*equals = '\0';
	struct ph_option *o = find(options, item);
	if (!o)
		return fail(err, LMT_ENOTFOUND, "%s: unknown option (lmt-info lists them all)",
		            item);
	return set(o, equals + 1, err);
}

int ph_options_set(struct ph_options *options, const char *list, struct lmt_error *err)
{
	if (!list || !*list)
		return 0;
	char *copy = strdup(list);
	if (!copy)
		return fail(err, LMT_ENOMEM, "out of memory");
	int rc = 0;
	for (char *item = copy, *next; item && !rc; item = next) {
		next = strchr(item, ',');
		if (next)
			*next++ = '\0';
		rc = set_item(options, item, err);
	}
	free(copy);
	return rc;
}

int ph_options_load(struct ph_options **out, const struct ph_config *cfg, const char *list,
                    struct lmt_error *err)
{
	uint32_t ncore = 0;
	const struct lmt_option_desc *core = lmt_core_options(&ncore);
	struct ph_options *options = calloc(1, sizeof(*options));
	int rc = options ? 0 : fail(err, LMT_ENOMEM, "out of memory");
	if (!rc)
		rc = add_schema(options, NULL, core, ncore, err);
	if (!rc)
		rc = add_schema(options, cfg->plugin->name, cfg->plugin->options,
		                cfg->plugin->option_count, err);
	if (!rc && cfg->inner)
		rc = add_schema(options, cfg->inner->name, cfg->inner->options,
		                cfg->inner->option_count, err);
	if (!rc)
		rc = load_env(options, err);
	if (!rc)
		rc = ph_options_set(options, list, err);
	if (rc) {
		ph_options_free(options);
		options = NULL;
	}
	*out = options;
	return rc;
}
