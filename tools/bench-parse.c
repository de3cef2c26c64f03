/* lmt-bench: strict parsing of command-line values (sizes, durations,
 * counts, fractions) and the few formatters its output needs. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

static int parse_digits(const char **text, uint64_t *out)
{
	const char *s = *text;
	uint64_t value = 0;

	if (*s < '0' || *s > '9')
		return -1;
	for (; *s >= '0' && *s <= '9'; s++) {
		unsigned digit = (unsigned)(*s - '0');

		if (value > (UINT64_MAX - digit) / 10)
			return -1;
		value = value * 10 + digit;
	}
	*text = s;
	*out = value;
	return 0;
}

static int size_shift(char unit)
{
	switch (unit) {
	case 'K':
	case 'k':
		return 10;
	case 'M':
	case 'm':
		return 20;
	case 'G':
	case 'g':
		return 30;
	case 'T':
	case 't':
		return 40;
	default:
		return -1;
	}
}

int bench_parse_size(const char *text, uint64_t *out)
{
	const char *s = text;
	uint64_t value;
	int shift;

	if (parse_digits(&s, &value) < 0)
		return -1;
	shift = size_shift(*s);
	if (shift >= 0) {
		s++;
		if (*s == 'i')
			s++;
	} else {
		shift = 0;
	}
	if (*s == 'B')
		s++;
	if (*s != '\0' || value > (UINT64_MAX >> shift))
		return -1;
	*out = value << shift;
	return 0;
}

static const struct {
	const char *name;
	uint64_t ns;
} duration_units[] = {
        {"h", UINT64_C(3600000000000)}, {"m", UINT64_C(60000000000)}, {"s", UINT64_C(1000000000)},
        {"ms", UINT64_C(1000000)},      {"us", UINT64_C(1000)},       {"ns", 1},
};

#define DURATION_UNITS (sizeof(duration_units) / sizeof(duration_units[0]))

int bench_parse_duration(const char *text, uint64_t *out_ns)
{
	const char *s = text;
	uint64_t value;

	if (parse_digits(&s, &value) < 0)
		return -1;
	for (size_t i = 0; i < DURATION_UNITS; i++) {
		uint64_t unit = duration_units[i].ns;

		if (strcmp(s, duration_units[i].name) != 0)
			continue;
		if (value > UINT64_MAX / unit)
			return -1;
		*out_ns = value * unit;
		return 0;
	}
	return -1;
}

int bench_parse_uint(const char *text, uint64_t max, uint64_t *out)
{
	const char *s = text;
	uint64_t value;

	if (parse_digits(&s, &value) < 0 || *s != '\0' || value > max)
		return -1;
	*out = value;
	return 0;
}

int bench_parse_fraction(const char *text, double *out)
{
	char *end;
	double value;

	/* strtod would also take spaces, signs, hex and "nan". */
	if (strspn(text, "0123456789.") != strlen(text) || text[0] == '\0')
		return -1;
	value = strtod(text, &end);
	if (*end != '\0' || !isfinite(value) || value < 0.0 || value > 1.0)
		return -1;
	*out = value;
	return 0;
}

void bench_format_size(uint64_t bytes, char *buf, size_t size)
{
	static const char units[] = "KMGT";
	int i = -1;

	while (bytes != 0 && i < 3 && (bytes & 1023) == 0) {
		bytes >>= 10;
		i++;
	}
	if (i < 0)
		snprintf(buf, size, "%llu", (unsigned long long)bytes);
	else
		snprintf(buf, size, "%llu%c", (unsigned long long)bytes, units[i]);
}

void bench_format_duration(uint64_t ns, char *buf, size_t size)
{
	for (size_t i = 0; i < DURATION_UNITS; i++) {
		uint64_t unit = duration_units[i].ns;

		/* Seconds at most: "120s" reads better than "2m". */
		if (unit <= 1000000000u && ns != 0 && ns % unit == 0) {
			snprintf(buf, size, "%llu%s", (unsigned long long)(ns / unit),
			         duration_units[i].name);
			return;
		}
	}
	snprintf(buf, size, "0s");
}

void bench_json_string(FILE *f, const char *text)
{
	if (!text) {
		fputs("null", f);
		return;
	}
	fputc('"', f);
	for (const unsigned char *c = (const unsigned char *)text; *c; c++) {
		if (*c == '"' || *c == '\\')
			fprintf(f, "\\%c", *c);
		else if (*c == '\n')
			fputs("\\n", f);
		else if (*c < 0x20)
			fprintf(f, "\\u%04x", *c);
		else
			fputc(*c, f);
	}
	fputc('"', f);
}

void bench_csv_string(FILE *f, const char *text)
{
	if (!text[strcspn(text, ",\"\r\n")]) {
		fputs(text, f);
		return;
	}
	fputc('"', f);
	for (const char *c = text; *c; c++) {
		if (*c == '"')
			fputc('"', f);
		fputc(*c, f);
	}
	fputc('"', f);
}
