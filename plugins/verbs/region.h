/* Registrations and peer keys of the verbs plugin, for the plugin's top
 * file. */
#ifndef LMT_VERBS_REGION_H
#define LMT_VERBS_REGION_H

#include <stddef.h>
#include <stdint.h>

#include "instance.h"

/* The ABI's registration ops (see lmt/plugin.h). */
int verbs_mr_register(lmt_instance *inst, void *addr, size_t len, uint32_t access, lmt_mr **out,
                      struct lmt_blob *key);
void verbs_mr_deregister(lmt_instance *inst, lmt_mr *mr);
int verbs_rkey_import(lmt_instance *inst, const struct lmt_blob *key, lmt_rkey **out);
void verbs_rkey_release(lmt_instance *inst, lmt_rkey *rkey);
/* instance_close: whatever the core did not release. */
void verbs_regions_release_all(lmt_instance *inst);

#endif
