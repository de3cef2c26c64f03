/* libFuzzer harness: the option parser, over the core schema and a plugin
 * schema with every type, and the strict size and duration parsers. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "options.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const modes[] = {"stream", "zerocopy", NULL};

static const struct lmt_option_desc plugin_options[] = {
        {.name = "mode",
         .type = LMT_OPT_ENUM,
         .default_value = "stream",
         .enum_values = modes,
         .doc = "an enum"},
        {.name = "label", .type = LMT_OPT_STRING, .default_value = "", .doc = "a string"},
        {.name = "depth",
         .type = LMT_OPT_INT,
         .default_value = "8",
         .min = -4,
         .max = 1 << 20,
         .flags = LMT_OPTF_POW2,
         .doc = "an integer"},
        {.name = "secret",
         .type = LMT_OPT_STRING,
         .default_value = "",
         .flags = LMT_OPTF_SECRET,
         .doc = "a secret"},
        {.name = "wait",
         .type = LMT_OPT_DURATION,
         .default_value = "1s",
         .min = 1000,
         .max = 60000000000ll,
         .doc = "a duration"},
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *text = malloc(size + 1);
	if (!text)
		return 0;
	memcpy(text, data, size);
	text[size] = '\0';
	uint64_t v;
	lmt__parse_size(text, &v);
	lmt__parse_duration(text, &v);

	struct lmt_optset *set = NULL;
	struct lmt_error err;
	uint32_t n;
	const struct lmt_option_desc *core = lmt_core_options(&n);
	if (lmt__optset_new(&set) == 0 && lmt__optset_add_schema(set, NULL, core, n, &err) == 0 &&
	    lmt__optset_add_schema(set, "fz", plugin_options,
	                           sizeof(plugin_options) / sizeof(plugin_options[0]), &err) == 0)
		lmt__optset_parse(set, text, &err);
	lmt__optset_free(set);
	free(text);
	return 0;
}
