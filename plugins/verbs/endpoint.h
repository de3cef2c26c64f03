/* Endpoints of the verbs plugin: one RC queue pair per channel, for the
 * plugin's top file. */
#ifndef LMT_VERBS_ENDPOINT_H
#define LMT_VERBS_ENDPOINT_H

#include <stdint.h>

#include "instance.h"

/* The ABI's endpoint ops (see lmt/plugin.h). */
int verbs_ep_open(lmt_instance *inst, uint32_t channel, lmt_endpoint **out, struct lmt_blob *addr);
int verbs_ep_connect(lmt_endpoint *ep, const struct lmt_blob *peer_addr);
void verbs_ep_close(lmt_endpoint *ep);

#endif
