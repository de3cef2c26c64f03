/* Registrations and peer keys of a plugin instance: lists that let
 * instance_close release whatever the core did not, and a table that
 * finds a destination region by the id a write names. Region ids are drawn
 * from the kernel's CSPRNG, unique in the table and never 0: a key blob
 * names its region with one, and it is part of what a writer must hold
 * (docs/security.md). Part of the plugin utility layer. */
#ifndef LMT_PUTIL_REGISTRY_H
#define LMT_PUTIL_REGISTRY_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "putil_base.h"

#define putil_container_of(ptr, type, member)                                                      \
	((type *)(void *)((char *)(ptr)-offsetof(type, member)))

/* An intrusive, circular, doubly linked list. */
struct putil_link {
	struct putil_link *prev, *next;
};

struct putil_region {
	uint64_t id;
	void *mr;
};

struct putil_registry {
	pthread_mutex_t lock; /* the lists, the table, and the plugin's own
	                         registration state (busy counts) */
	pthread_cond_t cond;  /* broadcast when the plugin's state changes */
	struct putil_link mrs;
	struct putil_link rkeys;
	/* Open addressing with linear probing; an id of 0 marks a free slot.
	 * `cap` is 0 or a power of two, at most half full. */
	struct putil_region *table;
	size_t count, cap;
	uint64_t max_id;
};

/* 0, or an error recorded through the host. Ids are drawn uniformly from
 * 1 to max_id (UINT64_MAX: 64-bit ids); 0 for a plugin that names regions
 * otherwise. */
int putil_registry_init(struct putil_registry *r, const struct putil_instance *base,
                        uint64_t max_id);
/* Call once the lists are empty. */
void putil_registry_fini(struct putil_registry *r);

/* List membership, under the registry's lock. */
void putil_registry_add_mr(struct putil_registry *r, struct putil_link *link);
void putil_registry_add_rkey(struct putil_registry *r, struct putil_link *link);
void putil_registry_unlink(struct putil_registry *r, struct putil_link *link);
/* The first of a list, or NULL when empty: instance_close releases them
 * one by one. */
struct putil_link *putil_registry_first_mr(struct putil_registry *r);
struct putil_link *putil_registry_first_rkey(struct putil_registry *r);

/* mr_register's arguments: memory (not wrapping the address space), an
 * access the plugin supports (`supported`, a mask of LMT_MR_*) and a key
 * blob for remote write. 0, or -LMT_EINVAL recorded with what was wrong. */
int putil_mr_check(const struct putil_instance *base, const void *addr, size_t len,
                   uint32_t access, uint32_t supported, const struct lmt_blob *key);

/* write's arguments on `channel`: this is a source, the key and the source
 * buffer are there (`keyed`: the key handle is not NULL; `key_len`: the
 * length of its region) and the write lies within the region. 0, or the
 * error recorded with what was wrong. */
int putil_write_check(const struct putil_instance *base, uint32_t channel, const void *local,
                      size_t len, bool keyed, uint64_t key_len, uint64_t offset);

/* Give `mr` a fresh random id in the table: 0, or -LMT_ENOMEM,
 * -LMT_EOVERFLOW (no id left) or -LMT_EIO (no randomness) recorded. Takes
 * the lock. */
int putil_registry_insert(struct putil_registry *r, const struct putil_instance *base, void *mr,
                          uint64_t *id);
/* With the lock held: the region of `id` (0 finds nothing), or NULL;
 * remove one; hand every region to `fn` and empty the table. */
void *putil_registry_find_locked(const struct putil_registry *r, uint64_t id);
void putil_registry_remove_locked(struct putil_registry *r, uint64_t id);
void putil_registry_drain_locked(struct putil_registry *r, void (*fn)(void *mr, void *arg),
                                 void *arg);

#endif
