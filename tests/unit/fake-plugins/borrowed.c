/* A module whose entry symbol comes only from a library it links: it
 * refers to the library's symbol so the link keeps the dependency. */
#include <lmt/plugin.h>

int lmt_plugin_entry(uint32_t core_abi, const struct lmt_plugin **out);
int borrowed_marker(uint32_t abi);
int borrowed_marker(uint32_t abi)
{
	const struct lmt_plugin *d;
	return lmt_plugin_entry(abi, &d);
}
