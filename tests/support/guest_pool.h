/* The pools that a mixed guest's code and text pages are taken from: whole
 * pages of the machine's own ELF files and text files, read the same way
 * in every process (sorted names, fixed sizes), or synthetic pages of
 * similar statistics where the machine has too few. Internal to the
 * synthetic guest (guest_content.c). */
#ifndef LMT_TESTS_GUEST_POOL_H
#define LMT_TESTS_GUEST_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "guest_content.h"

/* Fill `pool` with bytes / 4 KiB pages: -1 only when out of memory. */
int guest_pool_load_code(struct guest_pool *pool, uint64_t bytes, bool synthetic);
int guest_pool_load_text(struct guest_pool *pool, uint64_t bytes, bool synthetic);
void guest_pool_free(struct guest_pool *pool);
/* The same from other directories (at most 4), as the tests do. */
int guest_pool_load_code_from(struct guest_pool *pool, uint64_t bytes, bool synthetic,
                              const char *const *roots, size_t nroots);
int guest_pool_load_text_from(struct guest_pool *pool, uint64_t bytes, bool synthetic,
                              const char *const *roots, size_t nroots);

/* guest_synthetic.c: `bytes` of x86-64-like machine code and tables, or of
 * English-like text, the same for the same seed on every machine. 0, or -1
 * when out of memory. */
int guest_synthetic_code(uint8_t *out, uint64_t bytes, uint64_t seed);
int guest_synthetic_text(uint8_t *out, uint64_t bytes, uint64_t seed);

#endif
