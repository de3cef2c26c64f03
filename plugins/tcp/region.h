/* Registrations of the TCP plugin: destination regions by id, which the
 * receivers place writes into, source-side no-ops, and peer keys. */
#ifndef LMT_TCP_REGION_H
#define LMT_TCP_REGION_H

#include <stddef.h>
#include <stdint.h>

#include "instance.h"

/* The ABI's registration ops (see lmt/plugin.h). */
int tcp_mr_register(lmt_instance *inst, void *addr, size_t len, uint32_t access, lmt_mr **out,
                    struct lmt_blob *key);
void tcp_mr_deregister(lmt_instance *inst, lmt_mr *mr);
int tcp_rkey_import(lmt_instance *inst, const struct lmt_blob *key, lmt_rkey **out);
void tcp_rkey_release(lmt_instance *inst, lmt_rkey *rkey);
/* instance_close: whatever the core did not release. */
void tcp_regions_release_all(lmt_instance *inst);

/* A receiver takes region `id` for a write of `len` bytes at `offset`,
 * or gets NULL with the reason in `why`; it releases it once placed. */
struct lmt_mr *tcp_region_claim(lmt_endpoint *ep, uint64_t id, uint64_t offset, uint64_t len,
                                char *why, size_t size);
void tcp_region_release(lmt_endpoint *ep, struct lmt_mr *mr);

#endif
