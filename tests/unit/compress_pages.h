/* Pages for the compression room's tests: zero, random, text-like and
 * table-like pages from a seed; buffers with guard bytes behind them, to
 * show a codec wrote nothing past its end, and buffers that end where an
 * inaccessible page begins, for what the sanitizers cannot see: libzstd
 * and liblz4 are not instrumented. Header-only. */
#ifndef LMT_TESTS_COMPRESS_PAGES_H
#define LMT_TESTS_COMPRESS_PAGES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define TEST_PAGE 4096u
#define TEST_GUARD 256u
#define TEST_GUARD_BYTE 0xa5

enum test_page_kind { PAGE_ZERO, PAGE_RANDOM, PAGE_TEXT, PAGE_TABLE, PAGE_KINDS };

static inline uint64_t test_splitmix(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static inline void test_page(uint8_t *p, enum test_page_kind kind, uint64_t seed)
{
	static const char *const words[] = {"the ",     "guest ",     "page ", "memory ",
	                                    "dirty ",   "migration ", "of ",   "a ",
	                                    "running ", "kernel\n"};
	uint64_t s = seed;
	switch (kind) {
	case PAGE_ZERO:
		memset(p, 0, TEST_PAGE);
		break;
	case PAGE_RANDOM:
		for (size_t i = 0; i < TEST_PAGE; i += 8) {
			uint64_t v = test_splitmix(&s);
			memcpy(p + i, &v, 8);
		}
		break;
	case PAGE_TEXT:
		for (size_t i = 0; i < TEST_PAGE;) {
			const char *w = words[test_splitmix(&s) % 10];
			size_t n = strlen(w);
			if (n > TEST_PAGE - i)
				n = TEST_PAGE - i;
			memcpy(p + i, w, n);
			i += n;
		}
		break;
	default: /* a table: small counters and pointers, as in a heap */
		for (size_t i = 0; i < TEST_PAGE; i += 16) {
			uint64_t a = 0x7f0000000000ull + (test_splitmix(&s) % 64) * 64;
			uint64_t b = i / 16 + seed % 7;
			memcpy(p + i, &a, 8);
			memcpy(p + i + 8, &b, 8);
		}
		break;
	}
}

/* `pages` pages of every kind but random in turn (random every fifth when
 * `with_random`): the mixed run a guest has. */
static inline void test_mixed_run(uint8_t *p, size_t pages, uint64_t seed, bool with_random)
{
	for (size_t i = 0; i < pages; i++) {
		enum test_page_kind k = (enum test_page_kind)((seed + i) % PAGE_KINDS);
		if (k == PAGE_RANDOM && !with_random)
			k = PAGE_TEXT;
		test_page(p + i * TEST_PAGE, k, seed * 131 + i);
	}
}

/* `len` bytes followed by TEST_GUARD guard bytes: free with free(). */
static inline uint8_t *test_guarded(size_t len)
{
	uint8_t *p = malloc(len + TEST_GUARD);
	if (p)
		memset(p, TEST_GUARD_BYTE, len + TEST_GUARD);
	return p;
}

static inline bool test_guard_intact(const uint8_t *p, size_t len)
{
	for (size_t i = 0; i < TEST_GUARD; i++)
		if (p[len + i] != TEST_GUARD_BYTE)
			return false;
	return true;
}

/* `len` bytes that end where a PROT_NONE page begins: reading or writing
 * past them faults. Free with test_unfence. */
static inline uint8_t *test_fenced(size_t len)
{
	size_t span = (len + 4095) / 4096 * 4096;
	uint8_t *base =
	        mmap(NULL, span + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (base == MAP_FAILED || mprotect(base + span, 4096, PROT_NONE))
		abort();
	return base + span - len;
}

static inline void test_unfence(uint8_t *p, size_t len)
{
	size_t span = (len + 4095) / 4096 * 4096;
	munmap(p + len - span, span + 4096);
}

#endif
