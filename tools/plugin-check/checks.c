/* The checks of lmt-plugin-check, in the order they run, and what they
 * share. Each drives the plugin under test through the ABI alone; they
 * live by concern in checks_*.c and reopen.c. */
#include "plugin-check.h"

#include <string.h>

double pc_seconds(uint64_t ns)
{
	return (double)ns / PH_SECOND;
}

bool pc_one_line(const char *text)
{
	return text && *text && !strchr(text, '\n');
}

bool pc_valid_name(const char *name, size_t max)
{
	size_t len = name ? strlen(name) : 0;
	if (len == 0 || len > max)
		return false;
	for (size_t i = 0; i < len; i++)
		if (!((name[i] >= 'a' && name[i] <= 'z') || (name[i] >= '0' && name[i] <= '9') ||
		      name[i] == '_' || name[i] == '-'))
			return false;
	return true;
}

/* Tear down as the core does: the destination's progress stopped, memory
 * released, then the instances. */
void pc_finish(struct ph_run *run, struct ph_pair *pair, struct ph_tally *tally,
               struct ph_source *source, struct ph_region *regions, size_t count)
{
	ph_pair_stop_progress(run, pair);
	if (tally)
		ph_tally_fini(tally);
	if (source)
		ph_source_close(pair, source);
	for (size_t i = 0; i < count; i++)
		ph_region_close(pair, &regions[i]);
	ph_pair_close(pair);
}

const struct pc_check pc_checks[] = {
        {"descriptor", pc_check_descriptor},
        {"exported symbols", pc_check_exports},
        {"version negotiation", pc_check_negotiation},
        {"option defaults", pc_check_options},
        {"instance open/close", pc_check_instances},
        {"endpoint open/connect", pc_check_connect},
        {"idle progress and flush", pc_check_idle},
        {"registration", pc_check_registration},
        {"writes of many sizes", pc_check_sizes},
        {"a write of chunk-size", pc_check_largest},
        {"every cookie exactly once", pc_check_cookies},
        {"flush visibility", pc_check_flush},
        {"encrypted channels", pc_check_encryption},
        {"queue full (EAGAIN)", pc_check_queue_full},
        {"malformed address blob", pc_check_bad_address},
        {"malformed key blob", pc_check_bad_key},
        {"write beyond the key's length", pc_check_beyond},
        {"cancel and timeout", pc_check_cancel},
        {"instance open/close cycles", pc_check_instance_cycles},
        {"endpoint open/close cycles", pc_check_endpoint_cycles},
        {"half-open close cycles", pc_check_half_open_cycles},
        {"connected open/close cycles", pc_check_connected_cycles},
        {"reopen", pc_check_reopen},
        {"unload", pc_check_unload},
};

const size_t pc_check_count = sizeof(pc_checks) / sizeof(pc_checks[0]);
