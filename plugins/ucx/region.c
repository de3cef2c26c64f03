/* Registrations of the UCX plugin (see region.h). A destination region is
 * mapped with ucp_mem_map and found by id when an active message names
 * it; a peer key keeps the packed rkey, which each channel unpacks on its
 * own endpoint. */
#include "region.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "channel.h"

static void free_rkey(struct lmt_rkey *rkey)
{
	free(rkey->unpacked);
	free(rkey);
}

/* Map `mr` for puts and describe it in `key`. */
static int map_region(struct lmt_instance *inst, struct lmt_mr *mr, struct lmt_blob *key)
{
	ucp_mem_map_params_t params = {
	        .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
	                      UCP_MEM_MAP_PARAM_FIELD_PROT,
	        .address = mr->addr,
	        .length = mr->len,
	        .prot = UCP_MEM_MAP_PROT_LOCAL_READ | UCP_MEM_MAP_PROT_LOCAL_WRITE |
	                UCP_MEM_MAP_PROT_REMOTE_WRITE,
	};
	ucs_status_t st = ucp_mem_map(inst->context, &params, &mr->memh);
	if (st != UCS_OK) {
		mr->memh = NULL;
		return putil_error(
		        &inst->base, ucx_status_code(st), "ucx: cannot map %llu bytes at %p (%s)",
		        (unsigned long long)mr->len, (void *)mr->addr, ucs_status_string(st));
	}
	void *packed;
	size_t packed_len;
	st = ucp_rkey_pack(inst->context, mr->memh, &packed, &packed_len);
	if (st != UCS_OK)
		return putil_error(&inst->base, ucx_status_code(st),
		                   "ucx: cannot pack an rkey (%s)", ucs_status_string(st));
	struct ucx_key k = {.region = mr->id, .base = (uintptr_t)mr->addr, .len = mr->len};
	const char *why = ucx_key_encode(&k, packed, packed_len, key);
	ucp_rkey_buffer_release(packed);
	if (why)
		return putil_error(&inst->base, LMT_EOVERFLOW,
		                   "ucx: the packed rkey is %zu bytes, a key blob carries %u: "
		                   "restrict ucx.tls or ucx.devices",
		                   packed_len, UCX_RKEY_MAX);
	return 0;
}

int ucx_mr_register(lmt_instance *inst, void *addr, size_t len, uint32_t access, lmt_mr **out,
                    struct lmt_blob *key)
{
	if (!inst || !out)
		return -LMT_EINVAL;
	bool remote = access & LMT_MR_REMOTE_WRITE;
	int rc = putil_mr_check(&inst->base, addr, len, access,
	                        LMT_MR_REMOTE_WRITE | LMT_MR_LOCAL_READ, key);
	if (rc)
		return rc;
	struct lmt_mr *mr = calloc(1, sizeof(*mr));
	if (!mr)
		return putil_error(&inst->base, LMT_ENOMEM, "ucx: out of memory");
	mr->addr = addr;
	mr->len = len;
	uint64_t id;
	rc = putil_registry_insert(&inst->registry, &inst->base, mr, &id);
	if (rc) {
		free(mr);
		return rc;
	}
	mr->id = id;
	/* Mapped (and pinned over RDMA) only for puts: writes sent as active
	 * messages land through the region table alone. */
	if (remote && inst->rma)
		rc = map_region(inst, mr, key);
	else if (remote && ucx_key_encode(&(struct ucx_key){.region = mr->id,
	                                                    .base = (uintptr_t)mr->addr,
	                                                    .len = mr->len},
	                                  NULL, 0, key))
		rc = putil_error(&inst->base, LMT_EINVAL, "ucx: cannot describe a region");
	if (rc) {
		ucx_mr_deregister(inst, mr);
		return rc;
	}
	if (!remote && key)
		key->len = 0;
	/* Writes may name it only now that it is complete. */
	pthread_mutex_lock(&inst->registry.lock);
	mr->remote_write = remote;
	pthread_mutex_unlock(&inst->registry.lock);
	*out = mr;
	return 0;
}

/* Receives still placing data into `mr` past the deadline are cut off:
 * every channel stops placing anything more and stands down. Called with
 * the registry's lock held. */
static void cut_off_receives(struct lmt_instance *inst, struct lmt_mr *mr)
{
	(void)putil_error(&inst->base, LMT_ETIMEDOUT,
	                  "ucx: region 0x%llx deregistered while data was arriving",
	                  (unsigned long long)mr->id);
	struct putil_channels *c = &inst->channels;
	pthread_mutex_lock(&c->lock);
	for (uint32_t i = 0; i < c->count; i++) {
		lmt_endpoint *ep = putil_channels_endpoint(c, i);
		if (ep) {
			atomic_store(&ep->cut, true);
			ucx_wake(ep);
		}
	}
	pthread_mutex_unlock(&c->lock);
}

void ucx_mr_deregister(lmt_instance *inst, lmt_mr *mr)
{
	if (!inst || !mr)
		return;
	struct putil_registry *r = &inst->registry;
	pthread_mutex_lock(&r->lock);
	if (putil_registry_find_locked(r, mr->id) == mr)
		putil_registry_remove_locked(r, mr->id);
	/* Receives into it finish, or are cut off past the deadline (soon
	 * after a cancel). */
	uint64_t deadline = putil_call_deadline(&inst->base);
	uint64_t soon = lmt__deadline(UCX_CLOSE_NS);
	bool cut = false;
	while (mr->busy) {
		uint64_t now = lmt__now_ns();
		if (!cut && (now >= deadline || (now >= soon && putil_cancelled(&inst->base)))) {
			cut_off_receives(inst, mr);
			cut = true;
		}
		lmt__cond_wait_slice(&r->cond, &r->lock, cut ? UINT64_MAX : deadline);
	}
	pthread_mutex_unlock(&r->lock);
	if (mr->memh)
		ucp_mem_unmap(inst->context, mr->memh);
	free(mr);
}

int ucx_rkey_import(lmt_instance *inst, const struct lmt_blob *key, lmt_rkey **out)
{
	if (!inst || !key || !out)
		return -LMT_EINVAL;
	*out = NULL;
	struct ucx_key k;
	const char *why = ucx_key_decode(key, &k);
	if (why)
		return putil_error(&inst->base, LMT_EPROTO, "ucx: bad key blob (%u bytes): %s",
		                   key->len, why);
	struct lmt_rkey *rkey = calloc(1, sizeof(*rkey));
	if (rkey)
		rkey->unpacked = calloc(inst->base.channels, sizeof(*rkey->unpacked));
	if (!rkey || !rkey->unpacked) {
		free(rkey);
		return putil_error(&inst->base, LMT_ENOMEM, "ucx: out of memory");
	}
	if (k.rkey_len) /* none from a destination that takes no puts */
		memcpy(rkey->packed, k.rkey, k.rkey_len);
	rkey->key = k;
	rkey->key.rkey = rkey->packed;
	putil_registry_add_rkey(&inst->registry, &rkey->link);
	*out = rkey;
	return 0;
}

void ucx_rkey_release(lmt_instance *inst, lmt_rkey *rkey)
{
	if (!inst || !rkey)
		return;
	/* An rkey unpacked on a channel, or still in use, waits for the
	 * channel's close (UCX wants it destroyed before its endpoint). */
	pthread_mutex_lock(&inst->registry.lock);
	bool idle = atomic_load(&rkey->users) == 0;
	for (uint32_t c = 0; idle && c < inst->channels.count; c++)
		idle = !rkey->unpacked[c];
	pthread_mutex_unlock(&inst->registry.lock);
	if (idle) {
		putil_registry_unlink(&inst->registry, &rkey->link);
		free_rkey(rkey);
	}
}

static void free_region(void *region, void *arg)
{
	struct lmt_instance *inst = arg;
	struct lmt_mr *mr = region;
	if (mr->memh)
		ucp_mem_unmap(inst->context, mr->memh);
	free(mr);
}

void ucx_regions_release_all(lmt_instance *inst)
{
	struct putil_registry *r = &inst->registry;
	pthread_mutex_lock(&r->lock);
	putil_registry_drain_locked(r, free_region, inst);
	pthread_mutex_unlock(&r->lock);
	struct putil_link *link;
	while ((link = putil_registry_first_rkey(r))) {
		putil_registry_unlink(r, link);
		free_rkey(putil_container_of(link, struct lmt_rkey, link));
	}
}

void ucx_rkeys_drop(lmt_instance *inst, uint32_t channel)
{
	struct putil_registry *r = &inst->registry;
	pthread_mutex_lock(&r->lock);
	for (struct putil_link *link = r->rkeys.next; link != &r->rkeys; link = link->next) {
		struct lmt_rkey *rkey = putil_container_of(link, struct lmt_rkey, link);
		if (rkey->unpacked[channel])
			ucp_rkey_destroy(rkey->unpacked[channel]);
		rkey->unpacked[channel] = NULL;
	}
	pthread_mutex_unlock(&r->lock);
}

struct lmt_mr *ucx_region_claim(lmt_instance *inst, uint64_t id, uint64_t offset, uint64_t len,
                                char *why, size_t size)
{
	struct putil_registry *r = &inst->registry;
	pthread_mutex_lock(&r->lock);
	struct lmt_mr *mr = putil_registry_find_locked(r, id);
	if (!mr || !mr->remote_write) {
		snprintf(why, size, "write of %llu bytes to unknown region 0x%llx",
		         (unsigned long long)len, (unsigned long long)id);
		mr = NULL;
	} else if (len > mr->len || offset > mr->len - len) {
		snprintf(why, size,
		         "write of %llu bytes at offset %llu outside region 0x%llx (%llu bytes)",
		         (unsigned long long)len, (unsigned long long)offset,
		         (unsigned long long)id, (unsigned long long)mr->len);
		mr = NULL;
	} else {
		mr->busy++;
	}
	pthread_mutex_unlock(&r->lock);
	return mr;
}

void ucx_region_release(lmt_instance *inst, struct lmt_mr *mr)
{
	struct putil_registry *r = &inst->registry;
	pthread_mutex_lock(&r->lock);
	if (--mr->busy == 0)
		pthread_cond_broadcast(&r->cond);
	pthread_mutex_unlock(&r->lock);
}
