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
	*r = (struct putil_registry){.next_id = 1, .max_id = max_id};
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

/* Index of the first entry whose id is >= id. */
static size_t lower_bound(const struct putil_registry *r, uint64_t id)
{
	size_t lo = 0, hi = r->count;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (r->table[mid].id < id)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

int putil_registry_insert(struct putil_registry *r, const struct putil_instance *base, void *mr,
                          uint64_t *id)
{
	int rc = 0;
	pthread_mutex_lock(&r->lock);
	if (r->next_id == 0 || r->next_id > r->max_id) {
		rc = putil_error(base, LMT_EOVERFLOW, "%s: region ids exhausted", base->name);
	} else if (r->count == r->cap) {
		size_t cap = r->cap ? r->cap * 2 : 16;
		struct putil_region *grown = realloc(r->table, cap * sizeof(*grown));
		if (grown) {
			r->table = grown;
			r->cap = cap;
		} else {
			rc = putil_error(base, LMT_ENOMEM, "%s: out of memory", base->name);
		}
	}
	if (rc == 0) {
		/* Ids only grow, so the new one goes last. */
		*id = r->next_id++;
		r->table[r->count++] = (struct putil_region){.id = *id, .mr = mr};
	}
	pthread_mutex_unlock(&r->lock);
	return rc;
}

void *putil_registry_find_locked(const struct putil_registry *r, uint64_t id)
{
	size_t i = lower_bound(r, id);
	return i < r->count && r->table[i].id == id ? r->table[i].mr : NULL;
}

void putil_registry_remove_locked(struct putil_registry *r, uint64_t id)
{
	size_t i = lower_bound(r, id);
	if (i >= r->count || r->table[i].id != id)
		return;
	memmove(&r->table[i], &r->table[i + 1], (r->count - i - 1) * sizeof(*r->table));
	r->count--;
}
