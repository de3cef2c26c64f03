/* Destination side of the verbs plugin's data path, for the plugin's top
 * file. */
#ifndef LMT_VERBS_DESTINATION_H
#define LMT_VERBS_DESTINATION_H

#include <stdint.h>

#include "instance.h"

/* The ABI's progress on the destination: writes land without it, so it
 * only watches the asynchronous events and reports no completions. */
int verbs_dest_progress(struct lmt_instance *inst, uint32_t max, uint64_t timeout_ns);

#endif
