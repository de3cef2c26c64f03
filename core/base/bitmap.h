/* Page bitmaps: one bit per page, 64 pages per word, bit p of word p/64.
 * The one dirty-bitmap walker of the engine.
 * Room: base; may use: ABI, common. */
#ifndef LMT_CORE_BITMAP_H
#define LMT_CORE_BITMAP_H

#include <stdbool.h>
#include <stdint.h>

/* Mask of bits [lo, hi) within one word, 0 <= lo < hi <= 64. */
static inline uint64_t lmt__bits(uint64_t lo, uint64_t hi)
{
	uint64_t high = hi == 64 ? ~0ull : (1ull << hi) - 1;
	return high & ~((1ull << lo) - 1);
}

/* Apply `op` to each word part of [first, first+n): set, clear or test. */
enum lmt_bitop { LMT_BITS_SET, LMT_BITS_CLEAR, LMT_BITS_ANY };

static inline bool lmt__bitmap_range(uint64_t *map, uint64_t first, uint64_t n, enum lmt_bitop op)
{
	uint64_t end = first + n;
	while (first < end) {
		uint64_t w = first / 64, lo = first % 64;
		uint64_t hi = end - w * 64 < 64 ? end - w * 64 : 64;
		uint64_t m = lmt__bits(lo, hi);
		if (op == LMT_BITS_SET)
			map[w] |= m;
		else if (op == LMT_BITS_CLEAR)
			map[w] &= ~m;
		else if (map[w] & m)
			return true;
		first = w * 64 + hi;
	}
	return false;
}

/* The first set bit at or after `from` and below `limit`, or `limit`. */
static inline uint64_t lmt__bitmap_next(const uint64_t *map, uint64_t from, uint64_t limit)
{
	while (from < limit) {
		uint64_t w = from / 64;
		uint64_t bits = map[w] & ~((1ull << (from % 64)) - 1);
		if (bits) {
			uint64_t p = w * 64 + (uint64_t)__builtin_ctzll(bits);
			return p < limit ? p : limit;
		}
		from = (w + 1) * 64;
	}
	return limit;
}

static inline bool lmt__bitmap_test(const uint64_t *map, uint64_t p)
{
	return (map[p / 64] >> (p % 64)) & 1;
}

#endif
