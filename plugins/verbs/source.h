/* Source side of the verbs plugin's data path, for the plugin's top file. */
#ifndef LMT_VERBS_SOURCE_H
#define LMT_VERBS_SOURCE_H

#include <stddef.h>
#include <stdint.h>

#include "instance.h"

/* The ABI's write, progress and flush on the source (see lmt/plugin.h);
 * the top file checked the instance and the role. */
int verbs_source_write(lmt_endpoint *ep, const void *local, size_t len, lmt_mr *local_mr,
                       lmt_rkey *rkey, uint64_t offset, uint64_t cookie);
int verbs_source_progress(struct lmt_instance *inst, struct lmt_completion *out, uint32_t max,
                          uint64_t timeout_ns);
int verbs_source_flush(struct lmt_instance *inst, uint64_t timeout_ns);

#endif
