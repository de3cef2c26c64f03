/* Destination side of a UCX channel, for the plugin's top file. */
#ifndef LMT_UCX_DESTINATION_H
#define LMT_UCX_DESTINATION_H

#include "instance.h"

int ucx_dest_ep_open(lmt_endpoint *ep, struct lmt_blob *addr);
int ucx_dest_ep_connect(lmt_endpoint *ep, const struct lmt_blob *peer_addr);
void ucx_dest_ep_close(lmt_endpoint *ep);

#endif
