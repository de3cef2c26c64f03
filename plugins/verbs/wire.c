/* Encoding and validation of the verbs plugin's blobs (see wire.h). */
#include "wire.h"

#include <string.h>

#include "bytes.h"

static const char *check_prefix(const struct lmt_blob *b, uint32_t len, uint32_t magic)
{
	return lmt__blob_check(b, len, magic, VERBS_WIRE_VERSION);
}

void verbs_addr_encode(const struct verbs_addr *a, struct lmt_blob *b)
{
	memset(b->data, 0, VERBS_ADDR_LEN);
	b->len = VERBS_ADDR_LEN;
	lmt__put32(b->data, VERBS_MAGIC_ADDR);
	lmt__put16(b->data + 4, VERBS_WIRE_VERSION);
	b->data[6] = a->role;
	b->data[7] = a->link;
	b->data[8] = a->mtu;
	lmt__put32(b->data + 12, a->channel);
	lmt__put32(b->data + 16, a->qpn);
	lmt__put32(b->data + 20, a->psn);
	lmt__put16(b->data + 24, a->lid);
	memcpy(b->data + 28, a->gid, 16);
}

static int all_zero(const uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (p[i])
			return 0;
	return 1;
}

const char *verbs_addr_decode(const struct lmt_blob *b, struct verbs_addr *a)
{
	const char *why = check_prefix(b, VERBS_ADDR_LEN, VERBS_MAGIC_ADDR);
	if (why)
		return why;
	a->role = b->data[6];
	a->link = b->data[7];
	a->mtu = b->data[8];
	a->channel = lmt__get32(b->data + 12);
	a->qpn = lmt__get32(b->data + 16);
	a->psn = lmt__get32(b->data + 20);
	a->lid = lmt__get16(b->data + 24);
	memcpy(a->gid, b->data + 28, 16);
	if (!all_zero(b->data + 9, 3) || !all_zero(b->data + 26, 2))
		return "reserved field not zero";
	if (a->role != LMT_ROLE_SOURCE && a->role != LMT_ROLE_DESTINATION)
		return "unknown role";
	if (a->link != VERBS_LINK_IB && a->link != VERBS_LINK_ETHERNET)
		return "unknown link layer";
	if (a->mtu < 1 || a->mtu > 5)
		return "MTU out of range";
	if (a->qpn == 0 || a->qpn > 0xffffffu)
		return "queue pair number out of range";
	if (a->psn > 0xffffffu)
		return "packet sequence number out of range";
	if (a->link == VERBS_LINK_ETHERNET && all_zero(a->gid, 16))
		return "RoCE address without a GID";
	if (a->link == VERBS_LINK_IB && (a->lid == 0 || a->lid >= 0xc000u))
		return "InfiniBand address without a unicast LID";
	return NULL;
}

void verbs_key_encode(const struct verbs_key *k, struct lmt_blob *b)
{
	memset(b->data, 0, VERBS_KEY_LEN);
	b->len = VERBS_KEY_LEN;
	lmt__put32(b->data, VERBS_MAGIC_KEY);
	lmt__put16(b->data + 4, VERBS_WIRE_VERSION);
	lmt__put32(b->data + 8, k->rkey);
	lmt__put64(b->data + 16, k->addr);
	lmt__put64(b->data + 24, k->len);
}

const char *verbs_key_decode(const struct lmt_blob *b, struct verbs_key *k)
{
	const char *why = check_prefix(b, VERBS_KEY_LEN, VERBS_MAGIC_KEY);
	if (why)
		return why;
	k->rkey = lmt__get32(b->data + 8);
	k->addr = lmt__get64(b->data + 16);
	k->len = lmt__get64(b->data + 24);
	if (!all_zero(b->data + 6, 2) || !all_zero(b->data + 12, 4))
		return "reserved field not zero";
	if (k->len == 0)
		return "empty region";
	if (k->addr > UINT64_MAX - k->len)
		return "region wraps around the address space";
	return NULL;
}
