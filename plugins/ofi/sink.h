/* Receives that take and drop what a peer sends unasked, for endpoint.c. */
#ifndef LMT_LFI_SINK_H
#define LMT_LFI_SINK_H

#include <stdbool.h>

#include "instance.h"

/* Post the endpoint's receives, after fi_enable; 0, or the error recorded.
 * Nothing to do where the instance has no sink. */
int lfi_sink_open(lmt_endpoint *ep);
/* A completion (or error entry) for `context`: when it is one of the
 * sink's, post that receive again and return true. Channel thread only. */
bool lfi_sink_done(lmt_endpoint *ep, void *context);
/* Post again what the provider refused to take back (-FI_EAGAIN).
 * Channel thread only. */
void lfi_sink_refill(lmt_endpoint *ep);
/* Free the sink's buffer, once the endpoint is closed. */
void lfi_sink_close(lmt_endpoint *ep);

#endif
