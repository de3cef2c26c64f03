/* Registrations, peer keys and the region table (see registry.h). */
#include "putil_registry.h"

#include <stdlib.h>
#include <string.h>

#include "sync.h"

int putil_mr_check(const struct putil_instance *base, const void *addr, size_t len,
                   uint32_t access, uint32_t supported, const struct lmt_blob *key)
{
	const char *why = NULL;
	if (!addr || !len)
		why = "no memory";
	else if ((uintptr_t)addr > UINTPTR_MAX - len)
		why = "a range that wraps the address space";
	else if (!access || (access & ~supported))
		why = "an access this plugin does not support";
	else if ((access & LMT_MR_REMOTE_WRITE) && !key)
		why = "remote write without a key blob";
	if (!why)
		return 0;
	return putil_error(base, LMT_EINVAL, "%s: cannot register %zu bytes at %p for access 0x%x: %s",
	                   base->name, len, addr, access, why);
}

int putil_write_check(const struct putil_instance *base, uint32_t channel, const void *local,
                      size_t len, bool keyed, uint64_t key_len, uint64_t offset)
{
	if (base->role != LMT_ROLE_SOURCE)
		return putil_error(base, LMT_ESTATE, "%s channel %u: write on a destination",
		                   base->name, channel);
	if (!keyed || (!local && len))
		return putil_error(base, LMT_EINVAL, "%s channel %u: write without %s", base->name,
		                   channel, keyed ? "a source buffer" : "a key");
	if ((uint64_t)len > key_len || offset > key_len - len)
		return putil_error(base, LMT_EINVAL,
		                   "%s channel %u: write of %zu bytes at offset %llu past the end "
		                   "of a %llu-byte region",
		                   base->name, channel, len, (unsigned long long)offset,
		                   (unsigned long long)key_len);
	return 0;
}

static void list_init(struct putil_link *head)
{
	head->prev = head->next = head;
}

static void list_add(struct putil_link *head, struct putil_link *link)
{
	link->next = head->next;
	link->prev = head;
	head->next->prev = link;
	head->next = link;
}

int putil_registry_init(struct putil_registry *r, const struct putil_instance *base,
                        uint64_t max_id)
{
	*r = (struct putil_registry){.max_id = max_id};
	list_init(&r->mrs);
	list_init(&r->rkeys);
	if (pthread_mutex_init(&r->lock, NULL) == 0) {
		if (lmt__cond_init(&r->cond) == 0)
			return 0;
		pthread_mutex_destroy(&r->lock);
	}
	return putil_error(base, LMT_ENOMEM, "%s: cannot create locks", base->name);
}

void putil_registry_fini(struct putil_registry *r)
{
	pthread_cond_destroy(&r->cond);
	pthread_mutex_destroy(&r->lock);
	free(r->table);
	r->table = NULL;
	r->count = r->cap = 0;
}

void putil_registry_add_mr(struct putil_registry *r, struct putil_link *link)
{
	pthread_mutex_lock(&r->lock);
	list_add(&r->mrs, link);
	pthread_mutex_unlock(&r->lock);
}

void putil_registry_add_rkey(struct putil_registry *r, struct putil_link *link)
{
	pthread_mutex_lock(&r->lock);
	list_add(&r->rkeys, link);
	pthread_mutex_unlock(&r->lock);
}

void putil_registry_unlink(struct putil_registry *r, struct putil_link *link)
{
	pthread_mutex_lock(&r->lock);
	if (link->next) {
		link->prev->next = link->next;
		link->next->prev = link->prev;
		link->prev = link->next = NULL;
	}
	pthread_mutex_unlock(&r->lock);
}

static struct putil_link *first(struct putil_registry *r, struct putil_link *head)
{
	pthread_mutex_lock(&r->lock);
	struct putil_link *link = head->next == head ? NULL : head->next;
	pthread_mutex_unlock(&r->lock);
	return link;
}

struct putil_link *putil_registry_first_mr(struct putil_registry *r)
{
	return first(r, &r->mrs);
}

struct putil_link *putil_registry_first_rkey(struct putil_registry *r)
{
	return first(r, &r->rkeys);
}

/* ---- The region table ------------------------------------------------ */

/* The slot an id starts probing from. Ids are random already; the
 * multiplication only spreads a small max_id over the table. */
static size_t home(const struct putil_registry *r, uint64_t id)
{
	return (size_t)((id * UINT64_C(0x9e3779b97f4a7c15)) >> 32) & (r->cap - 1);
}

/* The slot holding `id`, or the free slot where it would go. */
static size_t probe(const struct putil_registry *r, uint64_t id)
{
	size_t i = home(r, id);
	while (r->table[i].id != 0 && r->table[i].id != id)
		i = (i + 1) & (r->cap - 1);
	return i;
}

/* Room for one more entry with the table at most half full. */
static bool reserve(struct putil_registry *r)
{
	if (r->cap && (r->count + 1) * 2 <= r->cap)
		return true;
	size_t cap = r->cap ? r->cap * 2 : 16;
	struct putil_region *grown = calloc(cap, sizeof(*grown));
	if (!grown)
		return false;
	struct putil_region *old = r->table;
	size_t old_cap = r->cap;
	r->table = grown;
	r->cap = cap;
	for (size_t i = 0; i < old_cap; i++)
		if (old[i].id)
			r->table[probe(r, old[i].id)] = old[i];
	free(old);
	return true;
}

int putil_registry_insert(struct putil_registry *r, const struct putil_instance *base, void *mr,
                          uint64_t *id)
{
	int rc = 0;
	pthread_mutex_lock(&r->lock);
	if (r->max_id == 0 || r->count >= r->max_id)
		rc = putil_error(base, LMT_EOVERFLOW, "%s: region ids exhausted", base->name);
	else if (!reserve(r))
		rc = putil_error(base, LMT_ENOMEM, "%s: out of memory", base->name);
	/* Draw until the id is free: with 64-bit ids a collision is next to
	 * impossible; with small ones the table is at most max_id full. */
	size_t slot = 0;
	for (unsigned tries = 0; rc == 0; tries++) {
		if (tries == 1024) {
			rc = putil_error(base, LMT_EOVERFLOW, "%s: no free region id found",
			                 base->name);
			break;
		}
		uint64_t drawn;
		rc = putil_random_id(base, r->max_id, &drawn);
		if (rc)
			break;
		slot = probe(r, drawn);
		if (r->table[slot].id == 0) {
			*id = drawn;
			break;
		}
	}
	if (rc == 0) {
		r->table[slot] = (struct putil_region){.id = *id, .mr = mr};
		r->count++;
	}
	pthread_mutex_unlock(&r->lock);
	return rc;
}

void *putil_registry_find_locked(const struct putil_registry *r, uint64_t id)
{
	if (id == 0 || r->count == 0)
		return NULL;
	size_t i = probe(r, id);
	return r->table[i].id == id ? r->table[i].mr : NULL;
}

void putil_registry_remove_locked(struct putil_registry *r, uint64_t id)
{
	if (id == 0 || r->count == 0)
		return;
	size_t i = probe(r, id);
	if (r->table[i].id != id)
		return;
	/* Backward-shift deletion: move up each later entry of the run that
	 * may no longer be found past the hole, so no tombstones are needed. */
	size_t mask = r->cap - 1;
	for (size_t j = (i + 1) & mask; r->table[j].id != 0; j = (j + 1) & mask) {
		size_t k = home(r, r->table[j].id);
		/* Stays put when its home lies cyclically in (i, j]. */
		bool stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
		if (!stays) {
			r->table[i] = r->table[j];
			i = j;
		}
	}
	r->table[i] = (struct putil_region){0};
	r->count--;
}

void putil_registry_drain_locked(struct putil_registry *r, void (*fn)(void *mr, void *arg),
                                 void *arg)
{
	for (size_t i = 0; i < r->cap; i++) {
		if (r->table[i].id == 0)
			continue;
		void *mr = r->table[i].mr;
		r->table[i] = (struct putil_region){0};
		fn(mr, arg);
	}
	r->count = 0;
}
