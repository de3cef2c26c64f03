/* Wire format of the libfabric plugin: the address blob of an endpoint and
 * the key blob of a registration. Little-endian; both carry a version. */
#ifndef LMT_LFI_WIRE_H
#define LMT_LFI_WIRE_H

#include <stdbool.h>
#include <stdint.h>

#include <lmt/plugin.h>

#define LFI_WIRE_VERSION 1u

/* Each magic spells its blob in ASCII on the wire ("LOFA", "LOFK"). */
enum lfi_magic {
	LFI_MAGIC_ADDR = 0x41464f4cu,
	LFI_MAGIC_KEY = 0x4b464f4cu,
};

/* The greeting: the first thing a source writes on a channel, into the
 * destination's fence region, so that the channel's connection is made
 * and accepted during setup (see lfi_source_greet). */
#define LFI_GREETING 0x54454552474f4c4cull /* "LLOGREET" */
static inline uint64_t lfi_greeting(uint32_t channel)
{
	return LFI_GREETING ^ channel;
}

#define LFI_ADDR_HEADER_LEN 40u
#define LFI_KEY_HEADER_LEN 24u
#define LFI_PROV_NAME_MAX 64u /* provider names, e.g. "tcp;ofi_rxm" */
#define LFI_NAME_MAX 256u     /* fi_getname results */
#define LFI_RAW_KEY_MAX 64u   /* FI_MR_RAW keys */
#define LFI_KEYS_MAX 64u      /* one per channel with FI_MR_ENDPOINT */

enum lfi_key_flags {
	LFI_KEY_VIRT = 1u << 0, /* remote addresses are virtual (FI_MR_VIRT_ADDR) */
	LFI_KEY_RAW = 1u << 1,  /* keys are raw bytes (FI_MR_RAW) */
};

/* One remote key: a 64-bit key, or raw bytes and the base address that
 * fi_mr_map_raw turns into one. */
struct lfi_key {
	uint64_t key;
	uint64_t raw_base;
	uint16_t raw_len;
	uint8_t raw[LFI_RAW_KEY_MAX];
};

/* An endpoint: who it is, where it is, and the small readable region the
 * source reads from to fence its writes when the provider cannot promise
 * delivery completion. */
struct lfi_addr {
	uint8_t role;  /* enum lmt_role */
	uint8_t flags; /* enum lfi_key_flags of the fence key */
	uint32_t channel;
	uint32_t addr_format; /* FI_SOCKADDR_IN, FI_ADDR_STR, ... */
	char prov_name[LFI_PROV_NAME_MAX];
	uint16_t name_len;
	uint8_t name[LFI_NAME_MAX];
	uint64_t fence_base;
	struct lfi_key fence_key;
};

/* A registration: its base (the address of offset 0 when keys are virtual),
 * its length, and one key, or one per channel with FI_MR_ENDPOINT. */
struct lfi_key_blob {
	uint8_t flags; /* enum lfi_key_flags */
	uint16_t count;
	uint64_t base;
	uint64_t len;
	struct lfi_key keys[LFI_KEYS_MAX];
};

/* Encoders return 0, or -1 when the blob would exceed LMT_BLOB_MAX.
 * Decoders return NULL, or what is wrong with the input. */
int lfi_addr_encode(const struct lfi_addr *a, struct lmt_blob *b);
const char *lfi_addr_decode(const struct lmt_blob *b, struct lfi_addr *a);
int lfi_key_encode(const struct lfi_key_blob *k, struct lmt_blob *b);
const char *lfi_key_decode(const struct lmt_blob *b, struct lfi_key_blob *k);

#endif
