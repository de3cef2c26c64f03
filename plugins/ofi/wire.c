/* Encoding and validation of the libfabric plugin's blobs (see wire.h). */
#include "wire.h"

#include <string.h>

#include "bytes.h"

#define LFI_KEY_FLAGS_ALL (LFI_KEY_VIRT | LFI_KEY_RAW)

static const char *check_prefix(const struct lmt_blob *b, uint32_t min, uint32_t magic)
{
	if (b->len < min || b->len > LMT_BLOB_MAX)
		return "wrong length";
	if (lmt__get32(b->data) != magic)
		return "bad magic";
	if (lmt__get16(b->data + 4) != LFI_WIRE_VERSION)
		return "unsupported version";
	return NULL;
}

int lfi_addr_encode(const struct lfi_addr *a, struct lmt_blob *b)
{
	size_t prov = strnlen(a->prov_name, sizeof(a->prov_name));
	size_t raw = a->flags & LFI_KEY_RAW ? a->fence_key.raw_len : 0;
	size_t len = LFI_ADDR_HEADER_LEN + prov + a->name_len + raw;
	if (len > LMT_BLOB_MAX || a->name_len > sizeof(a->name) || raw > LFI_RAW_KEY_MAX)
		return -1;
	memset(b->data, 0, LFI_ADDR_HEADER_LEN);
	lmt__put32(b->data, LFI_MAGIC_ADDR);
	lmt__put16(b->data + 4, LFI_WIRE_VERSION);
	b->data[6] = a->role;
	b->data[7] = a->flags;
	lmt__put32(b->data + 8, a->channel);
	lmt__put32(b->data + 12, a->addr_format);
	lmt__put16(b->data + 16, (uint16_t)prov);
	lmt__put16(b->data + 18, a->name_len);
	lmt__put16(b->data + 20, (uint16_t)raw);
	lmt__put64(b->data + 24, a->fence_base);
	lmt__put64(b->data + 32, raw ? a->fence_key.raw_base : a->fence_key.key);
	uint8_t *p = b->data + LFI_ADDR_HEADER_LEN;
	memcpy(p, a->prov_name, prov);
	memcpy(p + prov, a->name, a->name_len);
	memcpy(p + prov + a->name_len, a->fence_key.raw, raw);
	b->len = (uint32_t)len;
	return 0;
}

static bool printable(const uint8_t *p, size_t len)
{
	for (size_t i = 0; i < len; i++)
		if (p[i] < 0x20 || p[i] > 0x7e)
			return false;
	return true;
}

const char *lfi_addr_decode(const struct lmt_blob *b, struct lfi_addr *a)
{
	const char *why = check_prefix(b, LFI_ADDR_HEADER_LEN, LFI_MAGIC_ADDR);
	if (why)
		return why;
	memset(a, 0, sizeof(*a));
	const uint8_t *d = b->data;
	a->role = d[6];
	a->flags = d[7];
	a->channel = lmt__get32(d + 8);
	a->addr_format = lmt__get32(d + 12);
	size_t prov = lmt__get16(d + 16), raw = lmt__get16(d + 20);
	a->name_len = lmt__get16(d + 18);
	a->fence_base = lmt__get64(d + 24);
	a->fence_key.key = lmt__get64(d + 32);
	if (a->flags & LFI_KEY_RAW) {
		a->fence_key.raw_base = a->fence_key.key;
		a->fence_key.key = 0;
	}
	if (a->role != LMT_ROLE_SOURCE && a->role != LMT_ROLE_DESTINATION)
		return "unknown role";
	if (a->flags & ~LFI_KEY_FLAGS_ALL)
		return "unknown flags";
	if (lmt__get16(d + 22))
		return "reserved field not zero";
	if (prov == 0 || prov >= LFI_PROV_NAME_MAX)
		return "provider name length out of range";
	if (a->name_len == 0 || a->name_len > LFI_NAME_MAX)
		return "endpoint name length out of range";
	if ((a->flags & LFI_KEY_RAW) ? raw > LFI_RAW_KEY_MAX : raw != 0)
		return "fence key does not match its flags";
	if (b->len != LFI_ADDR_HEADER_LEN + prov + a->name_len + raw)
		return "wrong length";
	const uint8_t *p = d + LFI_ADDR_HEADER_LEN;
	if (!printable(p, prov))
		return "provider name not printable";
	memcpy(a->prov_name, p, prov);
	memcpy(a->name, p + prov, a->name_len);
	a->fence_key.raw_len = (uint16_t)raw;
	memcpy(a->fence_key.raw, p + prov + a->name_len, raw);
	return NULL;
}

int lfi_key_encode(const struct lfi_key_blob *k, struct lmt_blob *b)
{
	bool raw = k->flags & LFI_KEY_RAW;
	if (k->count == 0 || k->count > LFI_KEYS_MAX)
		return -1;
	size_t len = LFI_KEY_HEADER_LEN;
	for (uint16_t i = 0; i < k->count; i++) {
		if (raw && (k->keys[i].raw_len == 0 || k->keys[i].raw_len > LFI_RAW_KEY_MAX))
			return -1;
		len += raw ? 10u + k->keys[i].raw_len : 8u;
	}
	if (len > LMT_BLOB_MAX)
		return -1;
	lmt__put32(b->data, LFI_MAGIC_KEY);
	lmt__put16(b->data + 4, LFI_WIRE_VERSION);
	b->data[6] = k->flags;
	b->data[7] = (uint8_t)k->count;
	lmt__put64(b->data + 8, k->base);
	lmt__put64(b->data + 16, k->len);
	uint8_t *p = b->data + LFI_KEY_HEADER_LEN;
	for (uint16_t i = 0; i < k->count; i++) {
		if (raw) {
			lmt__put16(p, k->keys[i].raw_len);
			lmt__put64(p + 2, k->keys[i].raw_base);
			memcpy(p + 10, k->keys[i].raw, k->keys[i].raw_len);
			p += 10u + k->keys[i].raw_len;
		} else {
			lmt__put64(p, k->keys[i].key);
			p += 8;
		}
	}
	b->len = (uint32_t)len;
	return 0;
}

const char *lfi_key_decode(const struct lmt_blob *b, struct lfi_key_blob *k)
{
	const char *why = check_prefix(b, LFI_KEY_HEADER_LEN, LFI_MAGIC_KEY);
	if (why)
		return why;
	const uint8_t *d = b->data;
	k->flags = d[6];
	k->count = d[7];
	k->base = lmt__get64(d + 8);
	k->len = lmt__get64(d + 16);
	if (k->flags & ~LFI_KEY_FLAGS_ALL)
		return "unknown flags";
	if (k->count == 0 || k->count > LFI_KEYS_MAX)
		return "key count out of range";
	if (k->len == 0)
		return "empty region";
	if (!(k->flags & LFI_KEY_VIRT) && k->base)
		return "base address without virtual addressing";
	if (k->base > UINT64_MAX - k->len)
		return "region wraps around the address space";
	bool raw = k->flags & LFI_KEY_RAW;
	size_t at = LFI_KEY_HEADER_LEN;
	for (uint16_t i = 0; i < k->count; i++) {
		struct lfi_key *key = &k->keys[i];
		memset(key, 0, sizeof(*key));
		if (!raw) {
			if (b->len < at + 8)
				return "wrong length";
			key->key = lmt__get64(d + at);
			at += 8;
			continue;
		}
		if (b->len < at + 10)
			return "wrong length";
		key->raw_len = lmt__get16(d + at);
		key->raw_base = lmt__get64(d + at + 2);
		if (key->raw_len == 0 || key->raw_len > LFI_RAW_KEY_MAX)
			return "raw key length out of range";
		if (b->len < at + 10 + key->raw_len)
			return "wrong length";
		memcpy(key->raw, d + at + 10, key->raw_len);
		at += 10u + key->raw_len;
	}
	if (b->len != at)
		return "wrong length";
	return NULL;
}
