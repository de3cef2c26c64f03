/* Destination side of a TCP channel, for the plugin's top file. */
#ifndef LMT_TCP_DESTINATION_H
#define LMT_TCP_DESTINATION_H

#include "instance.h"

int tcp_dest_ep_open(lmt_endpoint *ep, struct lmt_blob *addr);
int tcp_dest_ep_connect(lmt_endpoint *ep, const struct lmt_blob *peer_addr);
void tcp_dest_ep_close(lmt_endpoint *ep);

#endif
