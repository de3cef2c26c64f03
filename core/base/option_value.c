/* One option value (base room): strict parsers for every option type,
 * canonical text, the checks a value meets against its descriptor and the
 * message that says what was expected. Pure: no state, safe from any
 * thread. The option set that holds the values is options.c's. */
#define _GNU_SOURCE
#include <ctype.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "error.h"
#include "options.h"

struct unit {
	const char *suffix;
	uint64_t factor;
};

/* Largest first, for formatting. */
static const struct unit size_units[] = {
        {"T", UINT64_C(1) << 40},
        {"G", UINT64_C(1) << 30},
        {"M", UINT64_C(1) << 20},
        {"K", UINT64_C(1) << 10},
};

static const struct unit duration_units[] = {
        {"m", UINT64_C(60000000000)}, {"s", UINT64_C(1000000000)}, {"ms", UINT64_C(1000000)},
        {"us", UINT64_C(1000)},       {"ns", UINT64_C(1)},
};

#define NS_PER_MS UINT64_C(1000000)

/* ---- strict number parsers ------------------------------------------- */

/* Read the decimal digits at the start of `text`; *end points after them.
 * Returns 0, -LMT_EINVAL when there is no digit, or -LMT_EOVERFLOW. */
static int scan_digits(const char *text, uint64_t *out, const char **end)
{
	uint64_t value = 0;
	int rc = 0;
	const char *p = text;

	for (; *p >= '0' && *p <= '9'; p++) {
		uint64_t digit = (uint64_t)(*p - '0');
		if (value > (UINT64_MAX - digit) / 10)
			rc = -LMT_EOVERFLOW;
		else
			value = value * 10 + digit;
	}
	*end = p;
	*out = value;
	return p == text ? -LMT_EINVAL : rc;
}

/* K, KB, Ki, KiB (any case) and the same for M, G, T; "" and "B" are bytes.
 * Returns the shift, or -1 for anything else. */
static int size_shift(const char *unit)
{
	static const char letters[] = "KMGT";

	if (*unit == '\0' || strcasecmp(unit, "B") == 0)
		return 0;
	const char *letter = strchr(letters, toupper((unsigned char)*unit));
	if (!letter)
		return -1;
	const char *rest = unit + 1;
	if (*rest == 'i' || *rest == 'I')
		rest++;
	if (*rest == 'b' || *rest == 'B')
		rest++;
	return *rest ? -1 : 10 * (int)(letter - letters + 1);
}

int lmt__parse_size(const char *text, uint64_t *out)
{
	const char *unit;
	uint64_t value;

	if (!text || !out)
		return -LMT_EINVAL;
	int rc = scan_digits(text, &value, &unit);
	int shift = size_shift(unit);
	if (rc == -LMT_EINVAL || shift < 0)
		return -LMT_EINVAL;
	if (rc < 0 || value > (UINT64_MAX >> shift))
		return -LMT_EOVERFLOW;
	*out = value << shift;
	return 0;
}

/* Nanoseconds per unit (any case); a bare number is milliseconds. */
static uint64_t duration_factor(const char *unit)
{
	if (*unit == '\0')
		return NS_PER_MS;
	for (size_t i = 0; i < sizeof(duration_units) / sizeof(duration_units[0]); i++)
		if (strcasecmp(unit, duration_units[i].suffix) == 0)
			return duration_units[i].factor;
	return 0;
}

int lmt__parse_duration(const char *text, uint64_t *out_ns)
{
	const char *unit;
	uint64_t value;

	if (!text || !out_ns)
		return -LMT_EINVAL;
	int rc = scan_digits(text, &value, &unit);
	uint64_t factor = duration_factor(unit);
	if (rc == -LMT_EINVAL || factor == 0)
		return -LMT_EINVAL;
	if (rc < 0 || value > UINT64_MAX / factor)
		return -LMT_EOVERFLOW;
	*out_ns = value * factor;
	return 0;
}

/* A signed decimal: optional '+' or '-', then digits, nothing else. */
static int parse_int(const char *text, int64_t *out)
{
	const char *end;
	uint64_t magnitude;
	bool negative = *text == '-';

	if (*text == '-' || *text == '+')
		text++;
	int rc = scan_digits(text, &magnitude, &end);
	if (rc == -LMT_EINVAL || *end != '\0')
		return -LMT_EINVAL;
	if (rc < 0 || magnitude > (uint64_t)INT64_MAX + negative)
		return -LMT_EOVERFLOW;
	if (negative)
		*out = magnitude ? -(int64_t)(magnitude - 1) - 1 : 0;
	else
		*out = (int64_t)magnitude;
	return 0;
}

static int parse_bool(const char *text, bool *out)
{
	static const struct {
		const char *word;
		bool value;
	} words[] = {
	        {"on", true},  {"off", false}, {"true", true}, {"false", false},
	        {"yes", true}, {"no", false},  {"1", true},    {"0", false},
	};

	for (size_t i = 0; i < sizeof(words) / sizeof(words[0]); i++) {
		if (strcasecmp(text, words[i].word) == 0) {
			*out = words[i].value;
			return 0;
		}
	}
	return -LMT_EINVAL;
}

/* ---- canonical text ---------------------------------------------------- */

/* `value` with the largest suffix of `units` that divides it exactly; a
 * value no suffix divides is written bare. Returns what snprintf does. */
static int format_scaled(char *buf, size_t size, uint64_t value, const struct unit *units,
                         size_t count)
{
	for (size_t i = 0; value != 0 && i < count; i++)
		if (value % units[i].factor == 0)
			return snprintf(buf, size, "%" PRIu64 "%s", value / units[i].factor,
			                units[i].suffix);
	return snprintf(buf, size, "%" PRIu64, value);
}

static int format_size(char *buf, size_t size, uint64_t bytes)
{
	return format_scaled(buf, size, bytes, size_units,
	                     sizeof(size_units) / sizeof(size_units[0]));
}

static int format_duration(char *buf, size_t size, uint64_t ns)
{
	return format_scaled(buf, size, ns, duration_units,
	                     sizeof(duration_units) / sizeof(duration_units[0]));
}

/* An INT, SIZE or DURATION in its type's notation. */
static int format_number(char *buf, size_t size, enum lmt_option_type type, int64_t value)
{
	if (type == LMT_OPT_SIZE && value >= 0)
		return format_size(buf, size, (uint64_t)value);
	if (type == LMT_OPT_DURATION && value >= 0)
		return format_duration(buf, size, (uint64_t)value);
	return snprintf(buf, size, "%" PRId64, value);
}

static const char *enum_text(const struct lmt_option_desc *desc,
                             const struct lmt_option_value *value)
{
	if (value->text)
		return value->text;
	if (!desc->enum_values || value->integer < 0)
		return NULL;
	for (int64_t i = 0; desc->enum_values[i]; i++)
		if (i == value->integer)
			return desc->enum_values[i];
	return NULL;
}

/* What to print for `value`, or NULL when it cannot be printed. `scratch`
 * holds numbers. */
static const char *value_text(const struct lmt_option_desc *desc,
                              const struct lmt_option_value *value, char *scratch, size_t size)
{
	switch (desc->type) {
	case LMT_OPT_BOOL:
		return value->boolean ? "on" : "off";
	case LMT_OPT_INT:
		format_number(scratch, size, desc->type, value->integer);
		return scratch;
	case LMT_OPT_SIZE:
	case LMT_OPT_DURATION:
		if (value->integer < 0)
			return NULL;
		format_number(scratch, size, desc->type, value->integer);
		return scratch;
	case LMT_OPT_ENUM:
		return enum_text(desc, value);
	case LMT_OPT_STRING:
		return value->text ? value->text : "";
	}
	return NULL;
}

/* Returns 0, -LMT_EINVAL for a value that does not fit `desc`, or
 * -LMT_EOVERFLOW when `buf` is too small (it then holds a truncated,
 * terminated text). Secret values are formatted like any other; hiding them
 * is the caller's business (lmt__optset_foreach does). */
int lmt_option_format(const struct lmt_option_desc *desc, const struct lmt_option_value *value,
                      char *buf, size_t size)
{
	char scratch[32];

	if (!desc || !value || !buf || size == 0 || value->type != desc->type)
		return -LMT_EINVAL;
	const char *text = value_text(desc, value, scratch, sizeof(scratch));
	if (!text) {
		buf[0] = '\0';
		return -LMT_EINVAL;
	}
	size_t len = strlen(text);
	if (len >= size) {
		memcpy(buf, text, size - 1);
		buf[size - 1] = '\0';
		return -LMT_EOVERFLOW;
	}
	memcpy(buf, text, len + 1);
	return 0;
}

/* ---- option values ----------------------------------------------------- */

bool lmt__option_has_range(const struct lmt_option_desc *desc)
{
	return desc->min != 0 || desc->max != 0;
}

static bool has_constraint(const struct lmt_option_desc *desc)
{
	return lmt__option_has_range(desc) || (desc->flags & LMT_OPTF_POW2);
}

static bool is_pow2(int64_t value)
{
	return value > 0 && (value & (value - 1)) == 0;
}

static bool meets_constraints(const struct lmt_option_desc *desc, int64_t value)
{
	if ((desc->flags & LMT_OPTF_POW2) && !is_pow2(value))
		return false;
	return !lmt__option_has_range(desc) || (value >= desc->min && value <= desc->max);
}

/* " from 4K to 1G", or nothing for an unbounded option. */
static void describe_range(const struct lmt_option_desc *desc, char *buf, size_t size)
{
	char low[32], high[32];

	buf[0] = '\0';
	if (!lmt__option_has_range(desc))
		return;
	format_number(low, sizeof(low), desc->type, desc->min);
	format_number(high, sizeof(high), desc->type, desc->max);
	snprintf(buf, size, " from %s to %s", low, high);
}

static void describe_enum(const struct lmt_option_desc *desc, char *buf, size_t size)
{
	size_t used = (size_t)snprintf(buf, size, "one of");

	for (size_t i = 0; desc->enum_values && desc->enum_values[i] && used < size; i++)
		used += (size_t)snprintf(buf + used, size - used, "%s %s", i ? "," : "",
		                         desc->enum_values[i]);
}

/* A number's noun: its syntax when `syntax` (the text did not parse),
 * otherwise what the schema allows. */
static const char *number_noun(const struct lmt_option_desc *desc, bool syntax)
{
	if (desc->type == LMT_OPT_SIZE && syntax)
		return "a size such as 64K or 1M";
	if (desc->type == LMT_OPT_DURATION && syntax)
		return "a duration such as 300ms or 2s";
	if (desc->flags & LMT_OPTF_POW2)
		return "a power of two";
	if (desc->type == LMT_OPT_SIZE)
		return "a size";
	if (desc->type == LMT_OPT_DURATION)
		return "a duration";
	return "an integer";
}

/* What a value of `desc` must look like: "a power of two from 4K to 1G". */
static void describe_expected(const struct lmt_option_desc *desc, bool syntax, char *buf,
                              size_t size)
{
	char range[80];

	switch (desc->type) {
	case LMT_OPT_BOOL:
		snprintf(buf, size, "on or off");
		return;
	case LMT_OPT_ENUM:
		describe_enum(desc, buf, size);
		return;
	case LMT_OPT_STRING:
		snprintf(buf, size, "text without ','");
		return;
	default:
		break;
	}
	bool show_range = desc->type == LMT_OPT_INT || !syntax;
	if (show_range)
		describe_range(desc, range, sizeof(range));
	snprintf(buf, size, "%s%s", number_noun(desc, syntax), show_range ? range : "");
}

/* "chunk-size: expected a power of two from 4K to 1G, got '3M'". A secret
 * value is never echoed. */
static int reject(struct lmt_error *err, int code, const struct lmt_option_desc *desc,
                  const char *name, const char *text, bool syntax)
{
	char expected[256];

	describe_expected(desc, syntax, expected, sizeof(expected));
	if (desc->flags & LMT_OPTF_SECRET)
		text = "(secret)";
	return lmt__error(err, code, "%s: expected %s, got '%s'%s", name, expected, text,
	                  code == -LMT_EOVERFLOW ? " (too large)" : "");
}

/* INT, SIZE or DURATION text to an int64 (SIZE and DURATION must fit). */
static int scan_number(enum lmt_option_type type, const char *text, int64_t *out)
{
	uint64_t value;
	int rc;

	if (type == LMT_OPT_INT)
		return parse_int(text, out);
	if (type == LMT_OPT_SIZE)
		rc = lmt__parse_size(text, &value);
	else
		rc = lmt__parse_duration(text, &value);
	if (rc < 0)
		return rc;
	if (value > (uint64_t)INT64_MAX)
		return -LMT_EOVERFLOW;
	*out = (int64_t)value;
	return 0;
}

static int parse_number_option(const struct lmt_option_desc *desc, const char *name,
                               const char *text, struct lmt_option_value *out,
                               struct lmt_error *err)
{
	int64_t value;
	int rc = scan_number(desc->type, text, &value);

	if (rc < 0)
		return reject(err, rc, desc, name, text,
		              rc == -LMT_EINVAL || !has_constraint(desc));
	if (!meets_constraints(desc, value))
		return reject(err, -LMT_EINVAL, desc, name, text, false);
	out->integer = value;
	return 0;
}

static int parse_bool_option(const struct lmt_option_desc *desc, const char *name, const char *text,
                             struct lmt_option_value *out, struct lmt_error *err)
{
	bool value;

	if (parse_bool(text, &value) < 0)
		return reject(err, -LMT_EINVAL, desc, name, text, true);
	out->boolean = value;
	out->integer = value;
	return 0;
}

/* The value borrows the descriptor's own text. */
static int parse_enum_option(const struct lmt_option_desc *desc, const char *name, const char *text,
                             struct lmt_option_value *out, struct lmt_error *err)
{
	if (!desc->enum_values)
		return lmt__error(err, LMT_EINVAL, "%s: enum option without values", name);
	for (int64_t i = 0; desc->enum_values[i]; i++) {
		if (strcmp(text, desc->enum_values[i]) == 0) {
			out->integer = i;
			out->text = desc->enum_values[i];
			return 0;
		}
	}
	return reject(err, -LMT_EINVAL, desc, name, text, true);
}

/* The value borrows the caller's text. */
static int parse_string_option(const struct lmt_option_desc *desc, const char *name,
                               const char *text, struct lmt_option_value *out,
                               struct lmt_error *err)
{
	if (strchr(text, ','))
		return reject(err, -LMT_EINVAL, desc, name, text, true);
	out->text = text;
	return 0;
}

int lmt__option_parse(const struct lmt_option_desc *desc, const char *name, const char *text,
                      struct lmt_option_value *out, struct lmt_error *err)
{
	if (!desc || !out)
		return lmt__error(err, LMT_EINVAL, "option parser called without a value");
	if (!name)
		name = desc->name ? desc->name : "option";
	memset(out, 0, sizeof(*out));
	out->type = desc->type;
	if (!text)
		return lmt__error(err, LMT_EINVAL, "%s: no value given", name);
	switch (desc->type) {
	case LMT_OPT_BOOL:
		return parse_bool_option(desc, name, text, out, err);
	case LMT_OPT_INT:
	case LMT_OPT_SIZE:
	case LMT_OPT_DURATION:
		return parse_number_option(desc, name, text, out, err);
	case LMT_OPT_ENUM:
		return parse_enum_option(desc, name, text, out, err);
	case LMT_OPT_STRING:
		return parse_string_option(desc, name, text, out, err);
	}
	return lmt__error(err, LMT_EINVAL, "%s: unknown option type %d", name, (int)desc->type);
}

int lmt_option_parse(const struct lmt_option_desc *desc, const char *text,
                     struct lmt_option_value *value, struct lmt_error *err)
{
	return lmt__option_parse(desc, NULL, text, value, err);
}

/* Every value text is wiped before it is freed: one of them may be a
 * secret (auth-key), and the lists it came in may hold it too. */
