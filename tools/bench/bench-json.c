/* lmt-bench: the little JSON it reads, from QEMU's QMP replies: a value
 * skipped whole (and so checked), a member of an object found by a path of
 * keys, integers, numbers and strings. A reply that is not JSON is an
 * error, never a read past its end. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

#define MAX_DEPTH 64

static const char *skip_space(const char *p)
{
	while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
		p++;
	return p;
}

static const char *skip_string(const char *p)
{
	for (p++; *p && *p != '"'; p++) {
		if ((unsigned char)*p < 0x20)
			return NULL;
		if (*p == '\\' && !*++p)
			return NULL;
	}
	return *p == '"' ? p + 1 : NULL;
}

static const char *skip_number(const char *p)
{
	const char *start = p;

	if (*p == '-')
		p++;
	if (!(*p >= '0' && *p <= '9'))
		return NULL;
	p += strspn(p, "0123456789");
	if (*p == '.') {
		p++;
		if (!(*p >= '0' && *p <= '9'))
			return NULL;
		p += strspn(p, "0123456789");
	}
	if (*p == 'e' || *p == 'E') {
		p++;
		p += *p == '+' || *p == '-';
		if (!(*p >= '0' && *p <= '9'))
			return NULL;
		p += strspn(p, "0123456789");
	}
	return p > start ? p : NULL;
}

static const char *skip_value(const char *p, int depth);

/* An object or an array, from its opening bracket. */
static const char *skip_container(const char *p, int depth)
{
	char close = *p == '{' ? '}' : ']';

	if (depth >= MAX_DEPTH)
		return NULL;
	p = skip_space(p + 1);
	if (*p == close)
		return p + 1;
	for (;;) {
		if (close == '}') {
			if (*p != '"' || !(p = skip_string(p)))
				return NULL;
			p = skip_space(p);
			if (*p++ != ':')
				return NULL;
		}
		if (!(p = skip_value(p, depth + 1)))
			return NULL;
		p = skip_space(p);
		if (*p == close)
			return p + 1;
		if (*p++ != ',')
			return NULL;
		p = skip_space(p);
	}
}

static const char *skip_value(const char *p, int depth)
{
	p = skip_space(p);
	switch (*p) {
	case '{':
	case '[':
		return skip_container(p, depth);
	case '"':
		return skip_string(p);
	case 't':
		return strncmp(p, "true", 4) == 0 ? p + 4 : NULL;
	case 'f':
		return strncmp(p, "false", 5) == 0 ? p + 5 : NULL;
	case 'n':
		return strncmp(p, "null", 4) == 0 ? p + 4 : NULL;
	default:
		return skip_number(p);
	}
}

bool bench_json_valid(const char *text)
{
	const char *end = skip_value(text, 0);

	return end && *skip_space(end) == '\0';
}

/* The value of `key` in the object at `object`, or NULL. */
static const char *member(const char *object, const char *key, size_t key_len)
{
	const char *p = skip_space(object);

	if (*p != '{')
		return NULL;
	p = skip_space(p + 1);
	while (*p == '"') {
		const char *name = p + 1, *end = skip_string(p);

		if (!end)
			return NULL;
		p = skip_space(end);
		if (*p++ != ':')
			return NULL;
		p = skip_space(p);
		if ((size_t)(end - 1 - name) == key_len && memcmp(name, key, key_len) == 0)
			return p;
		if (!(p = skip_value(p, 1)))
			return NULL;
		p = skip_space(p);
		if (*p != ',')
			return NULL;
		p = skip_space(p + 1);
	}
	return NULL;
}

const char *bench_json_find(const char *json, const char *path)
{
	const char *value = json;

	while (value && *path) {
		size_t len = strcspn(path, ".");

		value = skip_space(value);
		if (*value == '[')
			value = skip_space(value + 1);
		value = member(value, path, len);
		path += len + (path[len] == '.');
	}
	return value ? skip_space(value) : NULL;
}

int bench_json_uint(const char *json, const char *path, uint64_t *out)
{
	const char *value = bench_json_find(json, path);
	char *end;

	if (!value || !(*value >= '0' && *value <= '9'))
		return -1;
	*out = strtoull(value, &end, 10);
	return end > value && skip_number(value) == end ? 0 : -1;
}

int bench_json_double(const char *json, const char *path, double *out)
{
	const char *value = bench_json_find(json, path);
	char *end;

	if (!value || !skip_number(value))
		return -1;
	*out = strtod(value, &end);
	return end == skip_number(value) && isfinite(*out) ? 0 : -1;
}

int bench_json_string(const char *json, const char *path, char *buf, size_t size)
{
	const char *value = bench_json_find(json, path), *end;
	size_t n = 0;

	if (!value || *value != '"' || !(end = skip_string(value)) || size == 0)
		return -1;
	for (const char *p = value + 1; p < end - 1 && n + 1 < size; p++) {
		if (*p == '\\') {
			p++;
			/* \uXXXX is kept as '?': the messages read here are ASCII. */
			if (*p == 'u') {
				p += strspn(p + 1, "0123456789abcdefABCDEF") >= 4 ? 4 : 0;
				buf[n++] = '?';
				continue;
			}
			buf[n++] = *p == 'n' ? '\n' : *p == 't' ? '\t' : *p;
			continue;
		}
		buf[n++] = *p;
	}
	buf[n] = '\0';
	return 0;
}

char *bench_json_dup(const char *json, const char *path)
{
	const char *value = bench_json_find(json, path), *end;
	char *copy;

	if (!value || !(end = skip_value(value, 0)))
		return NULL;
	copy = malloc((size_t)(end - value) + 1);
	if (copy) {
		memcpy(copy, value, (size_t)(end - value));
		copy[end - value] = '\0';
	}
	return copy;
}
