/* A library that exports the entry symbol, linked by borrowed.c: dlsym on
 * the plugin would find this one, which the loader must refuse. */
#include <lmt/plugin.h>

LMT_PLUGIN_EXPORT int lmt_plugin_entry(uint32_t core_abi, const struct lmt_plugin **out);
LMT_PLUGIN_EXPORT int lmt_plugin_entry(uint32_t core_abi, const struct lmt_plugin **out)
{
	*out = 0;
	return -LMT_EABI;
}
