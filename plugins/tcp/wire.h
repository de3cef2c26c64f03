/* Wire format of the TCP plugin: address and key blobs, the hello that opens
 * a data connection, write headers and acknowledgements. Little-endian. */
#ifndef LMT_TCP_WIRE_H
#define LMT_TCP_WIRE_H

#include <stdint.h>

#include <lmt/plugin.h>

/* 2: 64-bit random region ids in key blobs and write headers. */
#define TCP_WIRE_VERSION 2u

/* Each magic spells its message in ASCII on the wire ("LMTD", ...). */
enum tcp_magic {
	TCP_MAGIC_DST_ADDR = 0x44544d4cu, /* destination address blob */
	TCP_MAGIC_SRC_ADDR = 0x53544d4cu, /* source address blob */
	TCP_MAGIC_KEY = 0x4b544d4cu,      /* key blob */
	TCP_MAGIC_HELLO = 0x48544d4cu,    /* source -> destination, once */
	TCP_MAGIC_WRITE = 0x57544d4cu,    /* source -> destination, per write */
	TCP_MAGIC_BYE = 0x42544d4cu,      /* either way: orderly close */
	TCP_MAGIC_ACK = 0x41544d4cu,      /* destination -> source */
	TCP_MAGIC_ERROR = 0x45544d4cu,    /* destination -> source, then close */
};

enum tcp_family {
	TCP_FAMILY_IPV4 = 4,
	TCP_FAMILY_IPV6 = 6,
};

/* Sizes on the wire. Blob lengths must match exactly. */
#define TCP_DST_ADDR_LEN 40u /* magic, version, family, port, pad, ip[16], token, channel */
#define TCP_SRC_ADDR_LEN 12u /* magic, version, pad, channel */
#define TCP_KEY_LEN 24u      /* magic, version, pad, region, length */
#define TCP_HELLO_LEN 24u    /* magic, version, pad, channel, pad, token */
#define TCP_HEADER_LEN 40u   /* magic, pad, region, offset, length, seq */
#define TCP_ACK_LEN 16u      /* magic, code, count */

struct tcp_dst_addr {
	uint16_t family; /* enum tcp_family */
	uint16_t port;
	uint8_t ip[16]; /* IPv4 in the first 4 bytes */
	uint64_t token;
	uint32_t channel;
};

struct tcp_key {
	uint64_t region; /* random, never 0 */
	uint64_t len;
};

/* A write header (TCP_MAGIC_WRITE) is followed by `len` payload bytes; a
 * TCP_MAGIC_BYE header has no payload and ends the stream. */
struct tcp_header {
	uint32_t magic;
	uint64_t region;
	uint64_t offset;
	uint64_t len;
	uint64_t seq; /* per channel, from 0 */
};

/* ACK: `count` writes placed so far (cumulative). BYE: the same, and the
 * destination closes. ERROR: `code` is the LMT_E* code that failed it. */
struct tcp_ack {
	uint32_t magic;
	int32_t code;
	uint64_t count;
};

/* Decoders return NULL, or what is wrong with the input. */
void tcp_dst_addr_encode(const struct tcp_dst_addr *a, struct lmt_blob *b);
const char *tcp_dst_addr_decode(const struct lmt_blob *b, struct tcp_dst_addr *a);
void tcp_src_addr_encode(uint32_t channel, struct lmt_blob *b);
const char *tcp_src_addr_decode(const struct lmt_blob *b, uint32_t *channel);
void tcp_key_encode(const struct tcp_key *k, struct lmt_blob *b);
const char *tcp_key_decode(const struct lmt_blob *b, struct tcp_key *k);

void tcp_hello_encode(uint32_t channel, uint64_t token, uint8_t *out);
/* The token is compared in constant time. */
const char *tcp_hello_check(const uint8_t *in, uint32_t channel, uint64_t token);
void tcp_header_encode(const struct tcp_header *h, uint8_t *out);
void tcp_header_decode(const uint8_t *in, struct tcp_header *h);
void tcp_ack_encode(const struct tcp_ack *a, uint8_t *out);
void tcp_ack_decode(const uint8_t *in, struct tcp_ack *a);

#endif
