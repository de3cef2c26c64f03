/* The TCP connections on an endpoint's listening address, over providers
 * that move data on sockets of their own, for the files above conns.c. */
#ifndef LMT_LFI_CONNS_H
#define LMT_LFI_CONNS_H

#include "instance.h"

/* Most connections an endpoint keeps: the source's needs one. */
#define LFI_CONNS_MAX 16

/* Stop the endpoint's listening socket from taking connections: a source
 * never needs one, a destination none once its source is connected. New
 * ones then never complete (a socket filter drops what arrives for it);
 * the provider's own sockets are otherwise left alone. */
void lfi_conns_seal(lmt_endpoint *ep);
/* For the channel's thread, now and then: when more than LFI_CONNS_MAX
 * connections are on the endpoint's address, shut the oldest down (the
 * provider then closes them as any connection its peer broke). */
void lfi_conns_trim(lmt_endpoint *ep);
/* Note every connection on the endpoint's address. Called just before the
 * endpoint is closed, and just after. */
void lfi_conns_note(lmt_endpoint *ep);
/* Close the connections noted that are still open, once the provider is
 * closed (nothing of libfabric's can hold them then), and forget them. */
void lfi_conns_close(struct lmt_instance *inst);

#endif
