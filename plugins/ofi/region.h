/* Registrations of the libfabric plugin, for the files above region.c: the
 * ABI's registration ops, and the provider registrations and keys that
 * endpoints need for their fence regions. */
#ifndef LMT_LFI_REGION_H
#define LMT_LFI_REGION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "instance.h"

/* The ABI's registration ops (see lmt/plugin.h). */
int lfi_mr_register(struct lmt_instance *inst, void *addr, size_t len, uint32_t access,
                    lmt_mr **out, struct lmt_blob *key);
void lfi_mr_deregister(struct lmt_instance *inst, lmt_mr *mr);
int lfi_rkey_import(struct lmt_instance *inst, const struct lmt_blob *key, lmt_rkey **out);
void lfi_rkey_release(struct lmt_instance *inst, lmt_rkey *rkey);
/* instance_close: whatever the core did not release. */
void lfi_regions_release_all(struct lmt_instance *inst);
/* Close whatever part of each registration is bound to `channel`. */
void lfi_regions_drop_channel(struct lmt_instance *inst, uint32_t channel);
/* A channel opened again: bind its endpoint to every registration under
 * the keys sent before (FI_MR_ENDPOINT). */
int lfi_regions_bind_channel(struct lmt_instance *inst, lmt_endpoint *ep);

/* Register [addr, addr+len) with the provider for `access` (FI_WRITE,
 * FI_REMOTE_WRITE, ...); bound to `ep` with FI_MR_ENDPOINT. */
int lfi_mr_open(struct lmt_instance *inst, void *addr, size_t len, uint64_t access,
                struct fid_ep *ep, struct fid_mr **out, const char *what);
/* Describe a registration in a key: the 64-bit key or its raw bytes. */
int lfi_mr_key(struct lmt_instance *inst, struct fid_mr *mr, struct lfi_key *key, const char *what);
/* The enum lfi_key_flags of this side's keys, which the peer's must match. */
uint8_t lfi_key_flags(const struct lmt_instance *inst);
/* Turn a key from the peer into one writes can use; *mapped says whether
 * lfi_key_unmap must release it. */
int lfi_key_import(struct lmt_instance *inst, const struct lfi_key *key, uint64_t *out,
                   bool *mapped, const char *what);
void lfi_key_unmap(struct lmt_instance *inst, uint64_t key);

#endif
