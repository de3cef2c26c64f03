/* Source side of a UCX channel, for the plugin's top file. */
#ifndef LMT_UCX_SOURCE_H
#define LMT_UCX_SOURCE_H

#include <stddef.h>
#include <stdint.h>

#include "instance.h"

int ucx_source_ep_open(lmt_endpoint *ep, struct lmt_blob *addr);
int ucx_source_ep_connect(lmt_endpoint *ep, const struct lmt_blob *peer_addr);
void ucx_source_ep_close(lmt_endpoint *ep);
/* Queue a write whose arguments were checked. */
int ucx_source_write(lmt_endpoint *ep, const void *local, size_t len, lmt_rkey *rkey,
                     uint64_t offset, uint64_t cookie);

#endif
