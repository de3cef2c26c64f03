/* Registrations of the UCX plugin: destination regions by id, mapped for
 * puts and claimed by the receives that place writes, and peer keys with
 * the rkeys each channel unpacked. For the files above: ucx.c, source.c
 * and destination.c. */
#ifndef LMT_UCX_REGION_H
#define LMT_UCX_REGION_H

#include <stddef.h>
#include <stdint.h>

#include "instance.h"

/* The ABI's registration ops (see lmt/plugin.h). */
int ucx_mr_register(lmt_instance *inst, void *addr, size_t len, uint32_t access, lmt_mr **out,
                    struct lmt_blob *key);
void ucx_mr_deregister(lmt_instance *inst, lmt_mr *mr);
int ucx_rkey_import(lmt_instance *inst, const struct lmt_blob *key, lmt_rkey **out);
void ucx_rkey_release(lmt_instance *inst, lmt_rkey *rkey);
/* instance_close: whatever the core did not release. */
void ucx_regions_release_all(lmt_instance *inst);

/* Source: destroy the rkeys unpacked on `channel`'s endpoint, which UCX
 * wants gone before the endpoint. */
void ucx_rkeys_drop(lmt_instance *inst, uint32_t channel);

/* Destination: a receive takes region `id` for a write of `len` bytes at
 * `offset`, or gets NULL with the reason in `why`; it releases it once
 * placed or abandoned. */
struct lmt_mr *ucx_region_claim(lmt_instance *inst, uint64_t id, uint64_t offset, uint64_t len,
                                char *why, size_t size);
void ucx_region_release(lmt_instance *inst, struct lmt_mr *mr);

#endif
