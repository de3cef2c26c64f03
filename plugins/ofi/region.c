/* Registrations of the libfabric plugin: each FI_MR_* mode a provider may
 * ask for, key blobs for the peer, and the peer's keys; also the provider
 * registrations and keys of the endpoints' fence regions. */
#define _GNU_SOURCE
#include "region.h"

#include <stdlib.h>
#include <string.h>

#include <rdma/fi_errno.h>

#include "provider.h"

uint8_t lfi_key_flags(const struct lmt_instance *inst)
{
	return (inst->mr_mode & FI_MR_VIRT_ADDR ? LFI_KEY_VIRT : 0) |
	       (inst->mr_mode & FI_MR_RAW ? LFI_KEY_RAW : 0);
}

/* How many keys a registration draws before it gives up: with 64-bit
 * keys one is enough; FI_ENOKEY says the key is taken in the domain. */
#define LFI_KEY_DRAWS 16

/* One try at a registration under `key` (ignored with FI_MR_PROV_KEY):
 * 0, or -FI_E* and the call that failed. */
static int open_once(struct lmt_instance *inst, void *addr, size_t len, uint64_t access,
                     struct fid_ep *ep, uint64_t key, struct fid_mr **out, const char **call)
{
	struct fid_mr *mr;
	*call = "fi_mr_reg";
	int rc = fi_mr_reg(inst->domain, addr, len, access, 0, key, 0, &mr, NULL);
	if (rc)
		return rc;
	if (inst->mr_mode & FI_MR_ENDPOINT) {
		/* Such a registration works once bound to its endpoint and enabled. */
		rc = fi_mr_bind(mr, &ep->fid, 0);
		*call = "fi_mr_bind";
		if (!rc) {
			rc = fi_mr_enable(mr);
			*call = "fi_mr_enable";
		}
	}
	if (rc) {
		lfi_close_fid(inst, &mr->fid, "a registration");
		return rc;
	}
	*out = mr;
	return 0;
}

int lfi_mr_open(struct lmt_instance *inst, void *addr, size_t len, uint64_t access,
                struct fid_ep *ep, struct fid_mr **out, const char *what)
{
	*out = NULL;
	if ((inst->mr_mode & FI_MR_ENDPOINT) && !ep)
		return putil_error(&inst->base, LMT_ESTATE,
		                   "ofi: registering %s: FI_MR_ENDPOINT needs an open endpoint",
		                   what);
	/* Without FI_MR_PROV_KEY lmt picks the keys, and a key is the whole
	 * of a remote writer's credential on an RDM endpoint, which takes
	 * RMA from any peer: so each is drawn from the kernel's CSPRNG over
	 * the provider's whole key size, never 0 (docs/security.md). A key
	 * already taken in the domain (FI_ENOKEY) is drawn again. */
	bool requested = !(inst->mr_mode & FI_MR_PROV_KEY);
	const char *call = "fi_mr_reg";
	int rc = -FI_ENOKEY;
	for (int draw = 0; draw < LFI_KEY_DRAWS && rc == -FI_ENOKEY; draw++) {
		uint64_t key = 0;
		if (requested) {
			int err = putil_random_id(&inst->base, inst->key_limit - 1, &key);
			if (err)
				return err;
		}
		rc = open_once(inst, addr, len, access, ep, key, out, &call);
		if (!requested)
			break;
	}
	if (rc)
		return putil_error(&inst->base, lfi_code(-rc),
		                   "ofi: registering %s (%zu bytes at %p): %s: %s", what, len, addr,
		                   call, fi_strerror(-rc));
	return 0;
}

int lfi_mr_key(struct lmt_instance *inst, struct fid_mr *mr, struct lfi_key *key, const char *what)
{
	memset(key, 0, sizeof(*key));
	if (!(inst->mr_mode & FI_MR_RAW)) {
		/* With FI_MR_PROV_KEY this is the provider's choice. */
		key->key = fi_mr_key(mr);
		if (key->key == FI_KEY_NOTAVAIL)
			return putil_error(&inst->base, LMT_EIO,
			                   "ofi: %s: the provider gives no key", what);
		return 0;
	}
	size_t size = sizeof(key->raw);
	int rc = fi_mr_raw_attr(mr, &key->raw_base, key->raw, &size, 0);
	if (rc == -FI_ETOOSMALL)
		return putil_error(
		        &inst->base, LMT_ENOTSUP,
		        "ofi: %s: the provider's raw key has %zu bytes, lmt carries up to %u", what,
		        size, LFI_RAW_KEY_MAX);
	if (rc || size == 0 || size > sizeof(key->raw))
		return putil_error(&inst->base, rc ? lfi_code(-rc) : LMT_EIO,
		                   "ofi: %s: fi_mr_raw_attr: %s", what,
		                   rc ? fi_strerror(-rc) : "empty key");
	key->raw_len = (uint16_t)size;
	return 0;
}

int lfi_key_import(struct lmt_instance *inst, const struct lfi_key *key, uint64_t *out,
                   bool *mapped, const char *what)
{
	*mapped = false;
	if (!(inst->mr_mode & FI_MR_RAW)) {
		if (key->key >= inst->key_limit)
			return putil_error(
			        &inst->base, LMT_EPROTO,
			        "ofi: %s: key 0x%llx is wider than the provider's %zu bytes", what,
			        (unsigned long long)key->key, inst->info->domain_attr->mr_key_size);
		*out = key->key;
		return 0;
	}
	if (key->raw_len == 0)
		return putil_error(&inst->base, LMT_EPROTO, "ofi: %s: no raw key", what);
	uint8_t raw[LFI_RAW_KEY_MAX];
	memcpy(raw, key->raw, key->raw_len);
	int rc = fi_mr_map_raw(inst->domain, key->raw_base, raw, key->raw_len, out, 0);
	if (rc)
		return putil_error(&inst->base, LMT_EPROTO,
		                   "ofi: %s: fi_mr_map_raw of a %u-byte key: %s", what,
		                   key->raw_len, fi_strerror(-rc));
	*mapped = true;
	return 0;
}

void lfi_key_unmap(struct lmt_instance *inst, uint64_t key)
{
	int rc = fi_mr_unmap_key(inst->domain, key);
	if (rc)
		putil_log(&inst->base, LMT_LOG_WARN, "ofi: fi_mr_unmap_key: %s", fi_strerror(-rc));
}

void lfi_regions_drop_channel(struct lmt_instance *inst, uint32_t channel)
{
	if (!(inst->mr_mode & FI_MR_ENDPOINT))
		return;
	struct putil_registry *r = &inst->registry;
	pthread_mutex_lock(&r->lock);
	for (struct putil_link *link = r->mrs.next; link != &r->mrs; link = link->next) {
		struct lmt_mr *mr = putil_container_of(link, struct lmt_mr, link);
		if (channel < mr->count && mr->mr[channel]) {
			lfi_close_fid(inst, &mr->mr[channel]->fid, "a registration");
			mr->mr[channel] = NULL;
		}
	}
	pthread_mutex_unlock(&r->lock);
}

static void close_parts(struct lmt_instance *inst, struct lmt_mr *mr)
{
	for (uint32_t i = 0; i < mr->count; i++)
		if (mr->mr[i])
			lfi_close_fid(inst, &mr->mr[i]->fid, "a registration");
}

/* Open the provider registrations of `mr`: one, or one per channel. */
static int open_parts(struct lmt_instance *inst, struct lmt_mr *mr)
{
	for (uint32_t i = 0; i < mr->count; i++) {
		lmt_endpoint *ep = inst->mr_mode & FI_MR_ENDPOINT
		                           ? putil_channels_endpoint(&inst->channels, i)
		                           : NULL;
		if ((inst->mr_mode & FI_MR_ENDPOINT) && !ep)
			return putil_error(&inst->base, LMT_ESTATE,
			                   "ofi: the provider binds registrations to endpoints "
			                   "(FI_MR_ENDPOINT), and channel %u is not open",
			                   i);
		int rc = lfi_mr_open(inst, mr->addr, mr->len, mr->access, ep ? ep->ep : NULL,
		                     &mr->mr[i], "a memory region");
		if (rc)
			return rc;
		mr->keys[i] = fi_mr_key(mr->mr[i]);
	}
	return 0;
}

/* With FI_MR_ENDPOINT a registration has a part per channel, bound to the
 * channel's endpoint, and a channel's close drops its parts. Opened again,
 * the channel is bound to every registration anew under the keys its key
 * blobs carry (docs/writing-a-plugin.md, "Reopening a channel"): a key the
 * provider picks itself (FI_MR_PROV_KEY, FI_MR_RAW) cannot be had again,
 * and the channel is refused rather than left with keys the peer does not
 * hold. */
int lfi_regions_bind_channel(struct lmt_instance *inst, lmt_endpoint *ep)
{
	if (!(inst->mr_mode & FI_MR_ENDPOINT))
		return 0;
	struct putil_registry *r = &inst->registry;
	int rc = 0;
	pthread_mutex_lock(&r->lock);
	for (struct putil_link *link = r->mrs.next; link != &r->mrs && !rc; link = link->next) {
		struct lmt_mr *mr = putil_container_of(link, struct lmt_mr, link);
		uint32_t c = ep->channel;
		if (c >= mr->count || mr->mr[c])
			continue;
		if (!(mr->access & FI_REMOTE_WRITE)) {
			/* Source memory: no peer holds its key. */
			rc = lfi_mr_open(inst, mr->addr, mr->len, mr->access, ep->ep, &mr->mr[c],
			                 "a memory region");
			continue;
		}
		if (inst->mr_mode & (FI_MR_PROV_KEY | FI_MR_RAW)) {
			rc = putil_error(&inst->base, LMT_ENOTSUP,
			                 "ofi channel %u: the provider binds registrations to "
			                 "endpoints (FI_MR_ENDPOINT) and picks their keys itself, so "
			                 "a channel opened again cannot take the keys already sent",
			                 c);
			break;
		}
		const char *call;
		int err = open_once(inst, mr->addr, mr->len, mr->access, ep->ep, mr->keys[c],
		                    &mr->mr[c], &call);
		if (err)
			rc = putil_error(&inst->base, lfi_code(-err),
			                 "ofi channel %u: binding a memory region (%zu bytes at %p) "
			                 "again under its key: %s: %s",
			                 c, mr->len, (void *)mr->addr, call, fi_strerror(-err));
	}
	pthread_mutex_unlock(&r->lock);
	return rc;
}

static int encode_key(struct lmt_instance *inst, struct lmt_mr *mr, struct lmt_blob *key)
{
	struct lfi_key_blob *k = calloc(1, sizeof(*k));
	if (!k)
		return putil_error(&inst->base, LMT_ENOMEM, "ofi: out of memory");
	k->flags = lfi_key_flags(inst);
	k->count = (uint16_t)mr->count;
	k->base = inst->mr_mode & FI_MR_VIRT_ADDR ? (uint64_t)(uintptr_t)mr->addr : 0;
	k->len = mr->len;
	int rc = 0;
	for (uint32_t i = 0; i < mr->count && !rc; i++)
		rc = lfi_mr_key(inst, mr->mr[i], &k->keys[i], "a memory region");
	if (!rc && lfi_key_encode(k, key))
		rc = putil_error(&inst->base, LMT_EOVERFLOW,
		                 "ofi: %u keys of this provider do not fit a %u-byte key blob",
		                 mr->count, LMT_BLOB_MAX);
	free(k);
	return rc;
}

int lfi_mr_register(struct lmt_instance *inst, void *addr, size_t len, uint32_t access,
                    lmt_mr **out, struct lmt_blob *key)
{
	if (!inst || !out)
		return -LMT_EINVAL;
	bool remote = access & LMT_MR_REMOTE_WRITE;
	bool local = access & LMT_MR_LOCAL_READ;
	int rc = putil_mr_check(&inst->base, addr, len, access,
	                        LMT_MR_REMOTE_WRITE | LMT_MR_LOCAL_READ, key);
	if (rc)
		return rc;
	/* Source memory costs nothing unless the provider needs it registered. */
	bool provider = remote || inst->local_mr;
	uint32_t count = !provider ? 0 : inst->mr_mode & FI_MR_ENDPOINT ? inst->base.channels : 1;
	struct lmt_mr *mr = calloc(1, sizeof(*mr) + count * (sizeof(mr->mr[0]) + sizeof(uint64_t)));
	if (!mr)
		return putil_error(&inst->base, LMT_ENOMEM, "ofi: out of memory");
	mr->keys = (uint64_t *)(void *)&mr->mr[count];
	mr->addr = addr;
	mr->len = len;
	mr->access = (remote ? FI_REMOTE_WRITE : 0) | (local ? FI_WRITE : 0);
	mr->count = count;
	rc = open_parts(inst, mr);
	if (!rc && remote)
		rc = encode_key(inst, mr, key);
	else if (!rc && key)
		key->len = 0;
	if (rc) {
		close_parts(inst, mr);
		free(mr);
		return rc;
	}
	putil_registry_add_mr(&inst->registry, &mr->link);
	*out = mr;
	return 0;
}

void lfi_mr_deregister(struct lmt_instance *inst, lmt_mr *mr)
{
	if (!inst || !mr)
		return;
	putil_registry_unlink(&inst->registry, &mr->link);
	close_parts(inst, mr);
	free(mr);
}

static void unmap_keys(struct lmt_instance *inst, struct lmt_rkey *rkey, uint32_t count)
{
	for (uint32_t i = 0; rkey->mapped && i < count; i++)
		lfi_key_unmap(inst, rkey->key[i]);
}

int lfi_rkey_import(struct lmt_instance *inst, const struct lmt_blob *key, lmt_rkey **out)
{
	if (!inst || !key || !out)
		return -LMT_EINVAL;
	struct lfi_key_blob *k = malloc(sizeof(*k));
	if (!k)
		return putil_error(&inst->base, LMT_ENOMEM, "ofi: out of memory");
	const char *why = lfi_key_decode(key, k);
	uint32_t count = inst->mr_mode & FI_MR_ENDPOINT ? inst->base.channels : 1;
	if (!why && k->flags != lfi_key_flags(inst))
		why = "memory-registration modes differ from this side's";
	if (!why && k->count != count)
		why = "wrong number of keys";
	if (why) {
		int rc = putil_error(&inst->base, LMT_EPROTO, "ofi: bad key blob (%u bytes): %s",
		                     key->len, why);
		free(k);
		return rc;
	}
	struct lmt_rkey *rkey = calloc(1, sizeof(*rkey) + count * sizeof(rkey->key[0]));
	if (!rkey) {
		free(k);
		return putil_error(&inst->base, LMT_ENOMEM, "ofi: out of memory");
	}
	rkey->base = k->base;
	rkey->len = k->len;
	rkey->count = count;
	rkey->mapped = inst->mr_mode & FI_MR_RAW;
	int rc = 0;
	uint32_t done = 0;
	for (; done < count && !rc; done++) {
		bool mapped;
		rc = lfi_key_import(inst, &k->keys[done], &rkey->key[done], &mapped, "a key blob");
	}
	free(k);
	if (rc) {
		unmap_keys(inst, rkey, done - 1);
		free(rkey);
		return rc;
	}
	putil_registry_add_rkey(&inst->registry, &rkey->link);
	*out = rkey;
	return 0;
}

void lfi_rkey_release(struct lmt_instance *inst, lmt_rkey *rkey)
{
	if (!inst || !rkey)
		return;
	putil_registry_unlink(&inst->registry, &rkey->link);
	unmap_keys(inst, rkey, rkey->count);
	free(rkey);
}

void lfi_regions_release_all(struct lmt_instance *inst)
{
	struct putil_link *link;
	while ((link = putil_registry_first_mr(&inst->registry)))
		lfi_mr_deregister(inst, putil_container_of(link, struct lmt_mr, link));
	while ((link = putil_registry_first_rkey(&inst->registry)))
		lfi_rkey_release(inst, putil_container_of(link, struct lmt_rkey, link));
}
