/* Destination side of a libfabric channel, for endpoint.c. */
#ifndef LMT_LFI_DESTINATION_H
#define LMT_LFI_DESTINATION_H

#include <stdbool.h>

#include "instance.h"

/* ep_connect: wait, up to the instance timeout and polling cancel, for
 * the source's greeting. The channel is then connected, and its
 * connection is ofi_rxm's (see lfi_dest_linger). */
int lfi_dest_connect(lmt_endpoint *ep);
/* Whether the greeting has landed, for the channel's thread. */
bool lfi_dest_greeting_landed(const lmt_endpoint *ep);

/* A destination must not close while a source may be connecting to it:
 * libfabric 1.17's tcp provider accepts a connection in a thread of its
 * own and keeps the socket in a request that nothing frees if the
 * endpoint closes before ofi_rxm has taken the request, so the socket
 * stays open for the life of the process. Once the greeting has landed,
 * the connection belongs to ofi_rxm, which closes it with the endpoint.
 * Before that, the endpoint waits, up to a second (one wait for all the
 * channels of the instance), for the greeting or for a connection in
 * progress to settle (a source that gives up closes it, and the provider
 * then frees the request itself). */
void lfi_dest_linger(lmt_endpoint *ep);

#endif
