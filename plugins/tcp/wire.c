/* Encoding and validation of the TCP plugin's wire messages (see wire.h). */
#include "wire.h"

#include <string.h>

static void put16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}

static void put32(uint8_t *p, uint32_t v)
{
	put16(p, (uint16_t)v);
	put16(p + 2, (uint16_t)(v >> 16));
}

static void put64(uint8_t *p, uint64_t v)
{
	put32(p, (uint32_t)v);
	put32(p + 4, (uint32_t)(v >> 32));
}

static uint16_t get16(const uint8_t *p)
{
	return (uint16_t)(p[0] | p[1] << 8);
}

static uint32_t get32(const uint8_t *p)
{
	return get16(p) | (uint32_t)get16(p + 2) << 16;
}

static uint64_t get64(const uint8_t *p)
{
	return get32(p) | (uint64_t)get32(p + 4) << 32;
}

/* Common prefix of every blob: length, magic, version. */
static const char *check_prefix(const struct lmt_blob *b, uint32_t len, uint32_t magic)
{
	if (b->len != len)
		return "wrong length";
	if (get32(b->data) != magic)
		return "bad magic";
	if (get16(b->data + 4) != TCP_WIRE_VERSION)
		return "unsupported version";
	return NULL;
}

void tcp_dst_addr_encode(const struct tcp_dst_addr *a, struct lmt_blob *b)
{
	memset(b->data, 0, TCP_DST_ADDR_LEN);
	b->len = TCP_DST_ADDR_LEN;
	put32(b->data, TCP_MAGIC_DST_ADDR);
	put16(b->data + 4, TCP_WIRE_VERSION);
	put16(b->data + 6, a->family);
	put16(b->data + 8, a->port);
	memcpy(b->data + 12, a->ip, 16);
	put64(b->data + 28, a->token);
	put32(b->data + 36, a->channel);
}

const char *tcp_dst_addr_decode(const struct lmt_blob *b, struct tcp_dst_addr *a)
{
	const char *why = check_prefix(b, TCP_DST_ADDR_LEN, TCP_MAGIC_DST_ADDR);
	if (why)
		return why;
	a->family = get16(b->data + 6);
	a->port = get16(b->data + 8);
	memcpy(a->ip, b->data + 12, 16);
	a->token = get64(b->data + 28);
	a->channel = get32(b->data + 36);
	if (a->family != TCP_FAMILY_IPV4 && a->family != TCP_FAMILY_IPV6)
		return "unknown address family";
	if (a->port == 0)
		return "port 0";
	if (get16(b->data + 10) != 0)
		return "reserved field not zero";
	return NULL;
}

void tcp_src_addr_encode(uint32_t channel, struct lmt_blob *b)
{
	memset(b->data, 0, TCP_SRC_ADDR_LEN);
	b->len = TCP_SRC_ADDR_LEN;
	put32(b->data, TCP_MAGIC_SRC_ADDR);
	put16(b->data + 4, TCP_WIRE_VERSION);
	put32(b->data + 8, channel);
}

const char *tcp_src_addr_decode(const struct lmt_blob *b, uint32_t *channel)
{
	const char *why = check_prefix(b, TCP_SRC_ADDR_LEN, TCP_MAGIC_SRC_ADDR);
	if (why)
		return why;
	if (get16(b->data + 6) != 0)
		return "reserved field not zero";
	*channel = get32(b->data + 8);
	return NULL;
}

void tcp_key_encode(const struct tcp_key *k, struct lmt_blob *b)
{
	memset(b->data, 0, TCP_KEY_LEN);
	b->len = TCP_KEY_LEN;
	put32(b->data, TCP_MAGIC_KEY);
	put16(b->data + 4, TCP_WIRE_VERSION);
	put32(b->data + 8, k->region);
	put64(b->data + 16, k->len);
}

const char *tcp_key_decode(const struct lmt_blob *b, struct tcp_key *k)
{
	const char *why = check_prefix(b, TCP_KEY_LEN, TCP_MAGIC_KEY);
	if (why)
		return why;
	if (get16(b->data + 6) != 0 || get32(b->data + 12) != 0)
		return "reserved field not zero";
	k->region = get32(b->data + 8);
	k->len = get64(b->data + 16);
	if (k->region == 0)
		return "region id 0";
	if (k->len == 0)
		return "zero length";
	return NULL;
}

void tcp_hello_encode(uint32_t channel, uint64_t token, uint8_t *out)
{
	memset(out, 0, TCP_HELLO_LEN);
	put32(out, TCP_MAGIC_HELLO);
	put16(out + 4, TCP_WIRE_VERSION);
	put32(out + 8, channel);
	put64(out + 16, token);
}

const char *tcp_hello_check(const uint8_t *in, uint32_t channel, uint64_t token)
{
	if (get32(in) != TCP_MAGIC_HELLO)
		return "bad hello magic";
	if (get16(in + 4) != TCP_WIRE_VERSION)
		return "unsupported hello version";
	if (get32(in + 8) != channel)
		return "hello for another channel";
	if (get64(in + 16) != token)
		return "wrong token";
	return NULL;
}

void tcp_header_encode(const struct tcp_header *h, uint8_t *out)
{
	put32(out, h->magic);
	put32(out + 4, h->region);
	put64(out + 8, h->offset);
	put64(out + 16, h->len);
	put64(out + 24, h->seq);
}

void tcp_header_decode(const uint8_t *in, struct tcp_header *h)
{
	h->magic = get32(in);
	h->region = get32(in + 4);
	h->offset = get64(in + 8);
	h->len = get64(in + 16);
	h->seq = get64(in + 24);
}

void tcp_ack_encode(const struct tcp_ack *a, uint8_t *out)
{
	put32(out, a->magic);
	put32(out + 4, (uint32_t)a->code);
	put64(out + 8, a->count);
}

void tcp_ack_decode(const uint8_t *in, struct tcp_ack *a)
{
	a->magic = get32(in);
	a->code = (int32_t)get32(in + 4);
	a->count = get64(in + 8);
}
