/* Registrations of the TCP plugin (see region.h). A destination region is
 * a range the receivers copy into; the source registers nothing real. */
#include "region.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>

#include "sync.h"

int tcp_mr_register(lmt_instance *inst, void *addr, size_t len, uint32_t access, lmt_mr **out,
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
		return putil_error(&inst->base, LMT_ENOMEM, "tcp: out of memory");
	mr->addr = addr;
	mr->len = len;
	mr->remote_write = remote;
	uint64_t id;
	rc = putil_registry_insert(&inst->registry, &inst->base, mr, &id);
	if (rc) {
		free(mr);
		return rc;
	}
	mr->id = id;
	if (remote)
		tcp_key_encode(&(struct tcp_key){.region = mr->id, .len = mr->len}, key);
	else if (key)
		key->len = 0;
	*out = mr;
	return 0;
}

/* A receiver still placing data into `mr` past the deadline is cut off:
 * its socket is shut down, which ends the receive and fails the channel.
 * Called with the registry's lock held. */
static void cut_off_receivers(struct lmt_instance *inst, struct lmt_mr *mr)
{
	struct putil_channels *c = &inst->channels;
	pthread_mutex_lock(&c->lock);
	for (uint32_t i = 0; i < c->count; i++) {
		lmt_endpoint *ep = putil_channels_endpoint(c, i);
		if (ep && ep->busy_region == mr && ep->fd >= 0) {
			(void)putil_error(&inst->base, LMT_ETIMEDOUT,
			                  "tcp channel %u: region 0x%llx deregistered while data "
			                  "was arriving",
			                  i, (unsigned long long)mr->id);
			shutdown(ep->fd, SHUT_RDWR);
		}
	}
	pthread_mutex_unlock(&c->lock);
}

void tcp_mr_deregister(lmt_instance *inst, lmt_mr *mr)
{
	if (!inst || !mr)
		return;
	struct putil_registry *r = &inst->registry;
	pthread_mutex_lock(&r->lock);
	if (putil_registry_find_locked(r, mr->id) == mr)
		putil_registry_remove_locked(r, mr->id);
	uint64_t deadline = putil_call_deadline(&inst->base);
	bool cut = false;
	while (mr->busy) {
		if (!cut && (lmt__now_ns() >= deadline || putil_cancelled(&inst->base))) {
			cut_off_receivers(inst, mr);
			cut = true;
		}
		lmt__cond_wait_slice(&r->cond, &r->lock, UINT64_MAX);
	}
	pthread_mutex_unlock(&r->lock);
	free(mr);
}

int tcp_rkey_import(lmt_instance *inst, const struct lmt_blob *key, lmt_rkey **out)
{
	if (!inst || !key || !out)
		return -LMT_EINVAL;
	struct tcp_key k;
	const char *why = tcp_key_decode(key, &k);
	if (why)
		return putil_error(&inst->base, LMT_EPROTO, "tcp: bad key blob (%u bytes): %s",
		                   key->len, why);
	struct lmt_rkey *rkey = calloc(1, sizeof(*rkey));
	if (!rkey)
		return putil_error(&inst->base, LMT_ENOMEM, "tcp: out of memory");
	rkey->region = k.region;
	rkey->len = k.len;
	putil_registry_add_rkey(&inst->registry, &rkey->link);
	*out = rkey;
	return 0;
}

void tcp_rkey_release(lmt_instance *inst, lmt_rkey *rkey)
{
	if (!inst || !rkey)
		return;
	putil_registry_unlink(&inst->registry, &rkey->link);
	free(rkey);
}

static void free_region(void *mr, void *arg)
{
	(void)arg;
	free(mr);
}

void tcp_regions_release_all(lmt_instance *inst)
{
	struct putil_registry *r = &inst->registry;
	pthread_mutex_lock(&r->lock);
	putil_registry_drain_locked(r, free_region, NULL);
	pthread_mutex_unlock(&r->lock);
	struct putil_link *link;
	while ((link = putil_registry_first_rkey(r)))
		tcp_rkey_release(inst, putil_container_of(link, struct lmt_rkey, link));
}

struct lmt_mr *tcp_region_claim(lmt_endpoint *ep, uint64_t id, uint64_t offset, uint64_t len,
                                char *why, size_t size)
{
	struct putil_registry *r = &ep->inst->registry;
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
		ep->busy_region = mr;
	}
	pthread_mutex_unlock(&r->lock);
	return mr;
}

void tcp_region_release(lmt_endpoint *ep, struct lmt_mr *mr)
{
	struct putil_registry *r = &ep->inst->registry;
	pthread_mutex_lock(&r->lock);
	ep->busy_region = NULL;
	if (--mr->busy == 0)
		pthread_cond_broadcast(&r->cond);
	pthread_mutex_unlock(&r->lock);
}
