/* Destination side of a libfabric channel, for endpoint.c. */
#ifndef LMT_LFI_DESTINATION_H
#define LMT_LFI_DESTINATION_H

#include <stdbool.h>

#include "instance.h"

/* ep_connect: wait, up to the instance timeout and polling cancel, for
 * the source's greeting. The channel is then connected. */
int lfi_dest_connect(lmt_endpoint *ep);
/* Whether the greeting has landed, for the channel's thread. */
bool lfi_dest_greeting_landed(const lmt_endpoint *ep);

#endif
