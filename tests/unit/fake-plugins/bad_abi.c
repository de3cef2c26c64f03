/* Test plugins that the loader must refuse: an ABI that is too new or too
 * old (chosen at build time with -DTEST_ABI=N). */
#include <lmt/plugin.h>

static const struct lmt_plugin descriptor = {
        .abi_version = TEST_ABI,
        .struct_size = sizeof(struct lmt_plugin),
        .name = TEST_NAME,
        .version = "0",
        .description = "loader test: speaks ABI " TEST_NAME,
};

LMT_PLUGIN_EXPORT int lmt_plugin_entry(uint32_t core_abi, const struct lmt_plugin **out);
LMT_PLUGIN_EXPORT int lmt_plugin_entry(uint32_t core_abi, const struct lmt_plugin **out)
{
	*out = &descriptor;
	return descriptor.abi_version <= core_abi ? 0 : -LMT_EABI;
}
