/* Registrations of the verbs plugin (see region.h): memory regions of the
 * protection domain, and the peer's rkeys that writes name. */
#define _GNU_SOURCE
#include "region.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int verbs_mr_register(lmt_instance *inst, void *addr, size_t len, uint32_t access, lmt_mr **out,
                      struct lmt_blob *key)
{
	if (!inst || !out)
		return -LMT_EINVAL;
	const struct putil_instance *base = &inst->base;
	bool remote = access & LMT_MR_REMOTE_WRITE;
	int rc = putil_mr_check(base, addr, len, access, LMT_MR_REMOTE_WRITE | LMT_MR_LOCAL_READ,
	                        key);
	if (rc)
		return rc;
	/* The source only reads what it registers: no write access, so
	 * pinning never breaks copy-on-write of guest memory. */
	unsigned flags = remote ? IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE : 0;
	if (inst->odp)
		flags |= IBV_ACCESS_ON_DEMAND;
	struct lmt_mr *mr = calloc(1, sizeof(*mr));
	if (!mr)
		return putil_error(base, LMT_ENOMEM, "verbs: out of memory");
	mr->mr = ibv_reg_mr_iova2(inst->pd, addr, len, (uintptr_t)addr, flags);
	if (!mr->mr) {
		int err = errno;
		free(mr);
		return putil_error(base, err == ENOMEM ? LMT_ENOMEM : LMT_EIO,
		                   "verbs: %s: ibv_reg_mr of %zu bytes at %p failed (%s)%s",
		                   inst->device, len, addr, strerror(err),
		                   err == ENOMEM || err == EPERM
		                           ? "; is RLIMIT_MEMLOCK (ulimit -l) large enough?"
		                           : "");
	}
	mr->addr = addr;
	mr->len = len;
	putil_registry_add_mr(&inst->registry, &mr->link);
	if (remote)
		verbs_key_encode(&(struct verbs_key){.rkey = mr->mr->rkey,
		                                     .addr = (uintptr_t)addr,
		                                     .len = len},
		                 key);
	else if (key)
		key->len = 0;
	*out = mr;
	return 0;
}

void verbs_mr_deregister(lmt_instance *inst, lmt_mr *mr)
{
	if (!inst || !mr)
		return;
	putil_registry_unlink(&inst->registry, &mr->link);
	int rc = ibv_dereg_mr(mr->mr);
	if (rc)
		putil_log(&inst->base, LMT_LOG_WARN,
		          "verbs: ibv_dereg_mr of %llu bytes failed (%s)",
		          (unsigned long long)mr->len, strerror(rc));
	free(mr);
}

int verbs_rkey_import(lmt_instance *inst, const struct lmt_blob *key, lmt_rkey **out)
{
	if (!inst || !key || !out)
		return -LMT_EINVAL;
	struct verbs_key k;
	const char *why = verbs_key_decode(key, &k);
	if (why)
		return putil_error(&inst->base, LMT_EPROTO, "verbs: bad key blob (%u bytes): %s",
		                   key->len, why);
	struct lmt_rkey *rkey = calloc(1, sizeof(*rkey));
	if (!rkey)
		return putil_error(&inst->base, LMT_ENOMEM, "verbs: out of memory");
	rkey->rkey = k.rkey;
	rkey->addr = k.addr;
	rkey->len = k.len;
	putil_registry_add_rkey(&inst->registry, &rkey->link);
	*out = rkey;
	return 0;
}

void verbs_rkey_release(lmt_instance *inst, lmt_rkey *rkey)
{
	if (!inst || !rkey)
		return;
	putil_registry_unlink(&inst->registry, &rkey->link);
	free(rkey);
}

void verbs_regions_release_all(lmt_instance *inst)
{
	struct putil_registry *r = &inst->registry;
	struct putil_link *link;
	while ((link = putil_registry_first_mr(r)))
		verbs_mr_deregister(inst, putil_container_of(link, struct lmt_mr, link));
	while ((link = putil_registry_first_rkey(r)))
		verbs_rkey_release(inst, putil_container_of(link, struct lmt_rkey, link));
}
