/* Wire format of the verbs plugin: the address blob of a channel (its queue
 * pair) and the key blob of a registration. Little-endian, versioned. */
#ifndef LMT_VERBS_WIRE_H
#define LMT_VERBS_WIRE_H

#include <stdint.h>

#include <lmt/plugin.h>

#define VERBS_WIRE_VERSION 1u

enum verbs_magic {
	VERBS_MAGIC_ADDR = 0x41564d4cu, /* "LMVA" */
	VERBS_MAGIC_KEY = 0x4b564d4cu,  /* "LMVK" */
};

/* Blob lengths; a blob of any other length is refused. */
#define VERBS_ADDR_LEN                                                                             \
	44u               /* magic, version, role, link, mtu, channel, qpn, psn, lid, pad, gid   \
	                    */
#define VERBS_KEY_LEN 32u /* magic, version, pad, rkey, pad, addr, length */

enum verbs_link {
	VERBS_LINK_IB = 1,
	VERBS_LINK_ETHERNET = 2,
};

struct verbs_addr {
	uint8_t role; /* enum lmt_role of the side that made it */
	uint8_t link; /* enum verbs_link */
	uint8_t mtu;  /* enum ibv_mtu: 1 (256) to 5 (4096) */
	uint32_t channel;
	uint32_t qpn; /* 24 bits */
	uint32_t psn; /* 24 bits */
	uint16_t lid;
	uint8_t gid[16];
};

struct verbs_key {
	uint32_t rkey;
	uint64_t addr;
	uint64_t len;
};

/* Decoders return NULL, or what is wrong with the blob. */
void verbs_addr_encode(const struct verbs_addr *a, struct lmt_blob *b);
const char *verbs_addr_decode(const struct lmt_blob *b, struct verbs_addr *a);
void verbs_key_encode(const struct verbs_key *k, struct lmt_blob *b);
const char *verbs_key_decode(const struct lmt_blob *b, struct verbs_key *k);

#endif
