/* The option schema engine: the per-session option set, with precedence
 * default < environment < explicit, over the one parser of every option of
 * the core, the plugins and the tools (lmt_option_parse in lmt/lmt.h).
 * Room: base; may use: ABI, common. */
#ifndef LMT_CORE_OPTIONS_H
#define LMT_CORE_OPTIONS_H

#include <stdbool.h>
#include <stdint.h>

#include <lmt/lmt.h>

enum lmt_opt_source {
	LMT_OPT_SRC_DEFAULT = 0,
	LMT_OPT_SRC_ENV = 1,
	LMT_OPT_SRC_EXPLICIT = 2,
};

/* A set of option values for one session: the core schema plus the schema
 * of the plugin in use. */
struct lmt_optset;

int lmt__optset_new(struct lmt_optset **out);
void lmt__optset_free(struct lmt_optset *set);

/* Add a schema. `ns` NULL is the core; otherwise the plugin name, which
 * qualifies each option ("tcp" + "nodelay" -> "tcp.nodelay"). Each default
 * goes through the parser; a bad default is an error naming the option. */
int lmt__optset_add_schema(struct lmt_optset *set, const char *ns,
                           const struct lmt_option_desc *descs, uint32_t count,
                           struct lmt_error *err);

/* Read LMT_<NAME> for every option in the set ("chunk-size" ->
 * LMT_CHUNK_SIZE, "tcp.nodelay" -> LMT_TCP_NODELAY). A bad value is an
 * error naming the variable. */
int lmt__optset_load_env(struct lmt_optset *set, struct lmt_error *err);

/* Set one option from text. A value from a lower source than the one
 * already set is ignored. Unknown names are errors that suggest the
 * closest known name. */
int lmt__optset_set(struct lmt_optset *set, const char *name, const char *value,
                    enum lmt_opt_source source, struct lmt_error *err);

/* Parse "key=value,key=value" (explicit source). Empty string is fine. */
int lmt__optset_parse(struct lmt_optset *set, const char *list, struct lmt_error *err);

/* The same, for only the options `allow` accepts: it returns 0, or fills
 * err and returns a negative code that refuses the whole list. Unknown
 * names and bad values are refused as by lmt__optset_parse. */
typedef int (*lmt_optset_allow_fn)(void *opaque, const char *name, struct lmt_error *err);
int lmt__optset_parse_allowed(struct lmt_optset *set, const char *list, lmt_optset_allow_fn allow,
                              void *opaque, struct lmt_error *err);

/* Look up a value by qualified name: 0 or -LMT_ENOTFOUND. */
int lmt__optset_get(const struct lmt_optset *set, const char *name, struct lmt_option_value *out);

/* Typed shortcuts for names the caller knows exist (core code). */
int64_t lmt__opt_int(const struct lmt_optset *set, const char *name);
bool lmt__opt_bool(const struct lmt_optset *set, const char *name);
const char *lmt__opt_text(const struct lmt_optset *set, const char *name);

/* Visit every option: qualified name, descriptor, value, canonical text,
 * and where the value came from. Stops early when fn returns non-zero and
 * returns that value. */
typedef int (*lmt_optset_visit_fn)(void *opaque, const char *name,
                                   const struct lmt_option_desc *desc,
                                   const struct lmt_option_value *value, const char *text,
                                   enum lmt_opt_source source);
int lmt__optset_foreach(const struct lmt_optset *set, lmt_optset_visit_fn fn, void *opaque);

/* lmt_option_parse() with `name` (the qualified "tcp.nodelay", or NULL for
 * desc->name) in its messages. */
int lmt__option_parse(const struct lmt_option_desc *desc, const char *name, const char *text,
                      struct lmt_option_value *out, struct lmt_error *err);

/* The strict number parsers under it: whole string, no sign, no overflow.
 * Sizes accept K/M/G/T with optional "i" and "B" (binary); bytes as
 * unsigned. Durations return nanoseconds; unit ns/us/ms/s/m, bare = ms. */
int lmt__parse_size(const char *text, uint64_t *out);
int lmt__parse_duration(const char *text, uint64_t *out_ns);

/* Whether a number option's descriptor bounds it (min or max set). */
bool lmt__option_has_range(const struct lmt_option_desc *desc);

#endif
