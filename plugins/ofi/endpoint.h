/* Endpoints of the libfabric plugin, for the plugin's top file. */
#ifndef LMT_LFI_ENDPOINT_H
#define LMT_LFI_ENDPOINT_H

#include <stdint.h>

#include "instance.h"

/* ep_open for a channel the table has free: the endpoint, and its
 * address blob in `addr`. 0, or the error recorded. */
int lfi_endpoint_open(struct lmt_instance *inst, uint32_t channel, lmt_endpoint **out,
                      struct lmt_blob *addr);
/* ep_connect: the peer enters the address vector and the channel's
 * thread starts; the source greets, the destination waits for it. */
int lfi_endpoint_connect(lmt_endpoint *ep, const struct lmt_blob *peer_addr);
/* Stop the endpoint's thread, if it runs; a source drains first.
 * instance_close stops every thread before anything else. */
void lfi_endpoint_stop(lmt_endpoint *ep);
/* Stop, close and free an endpoint out of the channel table. */
void lfi_endpoint_close(lmt_endpoint *ep);

#endif
