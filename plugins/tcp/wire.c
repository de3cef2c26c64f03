/* Encoding and validation of the TCP plugin's wire messages (see wire.h). */
#include "wire.h"

#include <string.h>

#include "bytes.h"

static const char *check_prefix(const struct lmt_blob *b, uint32_t len, uint32_t magic)
{
	return lmt__blob_check(b, len, magic, TCP_WIRE_VERSION);
}

void tcp_dst_addr_encode(const struct tcp_dst_addr *a, struct lmt_blob *b)
{
	memset(b->data, 0, TCP_DST_ADDR_LEN);
	b->len = TCP_DST_ADDR_LEN;
	lmt__put32(b->data, TCP_MAGIC_DST_ADDR);
	lmt__put16(b->data + 4, TCP_WIRE_VERSION);
	lmt__put16(b->data + 6, a->family);
	lmt__put16(b->data + 8, a->port);
	memcpy(b->data + 12, a->ip, 16);
	lmt__put64(b->data + 28, a->token);
	lmt__put32(b->data + 36, a->channel);
}

const char *tcp_dst_addr_decode(const struct lmt_blob *b, struct tcp_dst_addr *a)
{
	const char *why = check_prefix(b, TCP_DST_ADDR_LEN, TCP_MAGIC_DST_ADDR);
	if (why)
		return why;
	a->family = lmt__get16(b->data + 6);
	a->port = lmt__get16(b->data + 8);
	memcpy(a->ip, b->data + 12, 16);
	a->token = lmt__get64(b->data + 28);
	a->channel = lmt__get32(b->data + 36);
	if (a->family != TCP_FAMILY_IPV4 && a->family != TCP_FAMILY_IPV6)
		return "unknown address family";
	if (a->port == 0)
		return "port 0";
	if (lmt__get16(b->data + 10) != 0)
		return "reserved field not zero";
	return NULL;
}

void tcp_src_addr_encode(uint32_t channel, struct lmt_blob *b)
{
	memset(b->data, 0, TCP_SRC_ADDR_LEN);
	b->len = TCP_SRC_ADDR_LEN;
	lmt__put32(b->data, TCP_MAGIC_SRC_ADDR);
	lmt__put16(b->data + 4, TCP_WIRE_VERSION);
	lmt__put32(b->data + 8, channel);
}

const char *tcp_src_addr_decode(const struct lmt_blob *b, uint32_t *channel)
{
	const char *why = check_prefix(b, TCP_SRC_ADDR_LEN, TCP_MAGIC_SRC_ADDR);
	if (why)
		return why;
	if (lmt__get16(b->data + 6) != 0)
		return "reserved field not zero";
	*channel = lmt__get32(b->data + 8);
	return NULL;
}

void tcp_key_encode(const struct tcp_key *k, struct lmt_blob *b)
{
	memset(b->data, 0, TCP_KEY_LEN);
	b->len = TCP_KEY_LEN;
	lmt__put32(b->data, TCP_MAGIC_KEY);
	lmt__put16(b->data + 4, TCP_WIRE_VERSION);
	lmt__put64(b->data + 8, k->region);
	lmt__put64(b->data + 16, k->len);
}

const char *tcp_key_decode(const struct lmt_blob *b, struct tcp_key *k)
{
	const char *why = check_prefix(b, TCP_KEY_LEN, TCP_MAGIC_KEY);
	if (why)
		return why;
	if (lmt__get16(b->data + 6) != 0)
		return "reserved field not zero";
	k->region = lmt__get64(b->data + 8);
	k->len = lmt__get64(b->data + 16);
	if (k->region == 0)
		return "region id 0";
	if (k->len == 0)
		return "zero length";
	return NULL;
}

void tcp_hello_encode(uint32_t channel, uint64_t token, uint8_t *out)
{
	memset(out, 0, TCP_HELLO_LEN);
	lmt__put32(out, TCP_MAGIC_HELLO);
	lmt__put16(out + 4, TCP_WIRE_VERSION);
	lmt__put32(out + 8, channel);
	lmt__put64(out + 16, token);
}

const char *tcp_hello_check(const uint8_t *in, uint32_t channel, uint64_t token)
{
	if (lmt__get32(in) != TCP_MAGIC_HELLO)
		return "bad hello magic";
	if (lmt__get16(in + 4) != TCP_WIRE_VERSION)
		return "unsupported hello version";
	/* The token is the connection's only credential: compared in
	 * constant time, and checked whatever the channel said. */
	bool token_ok = lmt__ct_equal64(lmt__get64(in + 16), token);
	if (lmt__get32(in + 8) != channel)
		return "hello for another channel";
	if (!token_ok)
		return "wrong token";
	return NULL;
}

void tcp_header_encode(const struct tcp_header *h, uint8_t *out)
{
	lmt__put32(out, h->magic);
	lmt__put32(out + 4, 0);
	lmt__put64(out + 8, h->region);
	lmt__put64(out + 16, h->offset);
	lmt__put64(out + 24, h->len);
	lmt__put64(out + 32, h->seq);
}

void tcp_header_decode(const uint8_t *in, struct tcp_header *h)
{
	h->magic = lmt__get32(in);
	h->region = lmt__get64(in + 8);
	h->offset = lmt__get64(in + 16);
	h->len = lmt__get64(in + 24);
	h->seq = lmt__get64(in + 32);
}

void tcp_ack_encode(const struct tcp_ack *a, uint8_t *out)
{
	lmt__put32(out, a->magic);
	lmt__put32(out + 4, (uint32_t)a->code);
	lmt__put64(out + 8, a->count);
}

void tcp_ack_decode(const uint8_t *in, struct tcp_ack *a)
{
	a->magic = lmt__get32(in);
	a->code = (int32_t)lmt__get32(in + 4);
	a->count = lmt__get64(in + 8);
}
