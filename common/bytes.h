/* Little-endian field access and the common blob prefix (magic, version),
 * shared by the plugins' wire formats. Internal; not installed. */
#ifndef LMT_COMMON_BYTES_H
#define LMT_COMMON_BYTES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <lmt/plugin.h>

static inline void lmt__put16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}

static inline void lmt__put32(uint8_t *p, uint32_t v)
{
	lmt__put16(p, (uint16_t)v);
	lmt__put16(p + 2, (uint16_t)(v >> 16));
}

static inline void lmt__put64(uint8_t *p, uint64_t v)
{
	lmt__put32(p, (uint32_t)v);
	lmt__put32(p + 4, (uint32_t)(v >> 32));
}

static inline uint16_t lmt__get16(const uint8_t *p)
{
	return (uint16_t)(p[0] | p[1] << 8);
}

static inline uint32_t lmt__get32(const uint8_t *p)
{
	return lmt__get16(p) | (uint32_t)lmt__get16(p + 2) << 16;
}

static inline uint64_t lmt__get64(const uint8_t *p)
{
	return lmt__get32(p) | (uint64_t)lmt__get32(p + 4) << 32;
}

/* Whether two byte strings of `len` bytes are equal, in a time that depends
 * on `len` alone: for secrets (tokens) that arrive from the network, where
 * an early exit would tell an attacker how many leading bytes were right.
 * The volatile reads keep the compiler from adding that exit. */
static inline bool lmt__ct_equal(const void *a, const void *b, size_t len)
{
	const volatile uint8_t *x = a, *y = b;
	uint8_t diff = 0;
	for (size_t i = 0; i < len; i++)
		diff |= (uint8_t)(x[i] ^ y[i]);
	return diff == 0;
}

static inline bool lmt__ct_equal64(uint64_t a, uint64_t b)
{
	return lmt__ct_equal(&a, &b, sizeof(a));
}

/* Every plugin blob starts with a 32-bit magic and a 16-bit version and has
 * a fixed length: NULL if `b` has them, else what is wrong. */
static inline const char *lmt__blob_check(const struct lmt_blob *b, uint32_t len, uint32_t magic,
                                          uint16_t version)
{
	if (b->len < 6 || b->len > LMT_BLOB_MAX)
		return "wrong length";
	if (lmt__get32(b->data) != magic)
		return "bad magic";
	if (lmt__get16(b->data + 4) != version)
		return "unsupported version";
	if (b->len != len)
		return "wrong length";
	return NULL;
}

/* Write the prefix of a blob of `len` bytes, zeroing the rest. */
static inline void lmt__blob_start(struct lmt_blob *b, uint32_t len, uint32_t magic,
                                   uint16_t version)
{
	for (uint32_t i = 0; i < len; i++)
		b->data[i] = 0;
	b->len = len;
	lmt__put32(b->data, magic);
	lmt__put16(b->data + 4, version);
}

#endif
