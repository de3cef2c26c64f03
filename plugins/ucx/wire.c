/* Encoding and validation of the UCX plugin's blobs and message headers
 * (see wire.h). Every decoder checks lengths before it reads. */
#include "wire.h"

#include "bytes.h"

#include <string.h>

const char *ucx_addr_encode(const struct ucx_addr *a, const void *worker, size_t len,
                            struct lmt_blob *b)
{
	if (len == 0 || len > UCX_ADDR_MAX)
		return "worker address does not fit an address blob";
	memset(b->data, 0, UCX_ADDR_HEADER_LEN);
	lmt__put32(b->data, a->magic);
	lmt__put16(b->data + 4, UCX_WIRE_VERSION);
	lmt__put16(b->data + 6, a->flags);
	lmt__put32(b->data + 8, a->channel);
	lmt__put32(b->data + 12, (uint32_t)len);
	lmt__put64(b->data + 16, a->token);
	memcpy(b->data + UCX_ADDR_HEADER_LEN, worker, len);
	b->len = UCX_ADDR_HEADER_LEN + (uint32_t)len;
	return NULL;
}

const char *ucx_addr_decode(const struct lmt_blob *b, uint32_t magic, struct ucx_addr *a)
{
	if (b->len < UCX_ADDR_HEADER_LEN || b->len > LMT_BLOB_MAX)
		return "wrong length";
	a->magic = lmt__get32(b->data);
	if (a->magic != magic)
		return a->magic == UCX_MAGIC_SRC_ADDR || a->magic == UCX_MAGIC_DST_ADDR
		               ? "the blob of the wrong side"
		               : "bad magic";
	if (lmt__get16(b->data + 4) != UCX_WIRE_VERSION)
		return "unsupported version";
	a->flags = lmt__get16(b->data + 6);
	if (a->flags & ~(magic == UCX_MAGIC_DST_ADDR ? UCX_ADDR_PUTS : 0))
		return "unknown flags";
	a->channel = lmt__get32(b->data + 8);
	a->len = lmt__get32(b->data + 12);
	a->token = lmt__get64(b->data + 16);
	if (a->token == 0)
		return "no token";
	if (a->len == 0)
		return "empty worker address";
	if (a->len != b->len - UCX_ADDR_HEADER_LEN)
		return "worker address length disagrees with the blob";
	a->worker = b->data + UCX_ADDR_HEADER_LEN;
	return NULL;
}

const char *ucx_key_encode(const struct ucx_key *k, const void *rkey, size_t rkey_len,
                           struct lmt_blob *b)
{
	if (rkey_len > UCX_RKEY_MAX)
		return "packed rkey does not fit a key blob";
	memset(b->data, 0, UCX_KEY_HEADER_LEN);
	lmt__put32(b->data, UCX_MAGIC_KEY);
	lmt__put16(b->data + 4, UCX_WIRE_VERSION);
	lmt__put32(b->data + 8, (uint32_t)rkey_len);
	lmt__put64(b->data + 16, k->region);
	lmt__put64(b->data + 24, k->base);
	lmt__put64(b->data + 32, k->len);
	if (rkey_len)
		memcpy(b->data + UCX_KEY_HEADER_LEN, rkey, rkey_len);
	b->len = UCX_KEY_HEADER_LEN + (uint32_t)rkey_len;
	return NULL;
}

const char *ucx_key_decode(const struct lmt_blob *b, struct ucx_key *k)
{
	if (b->len < UCX_KEY_HEADER_LEN || b->len > LMT_BLOB_MAX)
		return "wrong length";
	if (lmt__get32(b->data) != UCX_MAGIC_KEY)
		return "bad magic";
	if (lmt__get16(b->data + 4) != UCX_WIRE_VERSION)
		return "unsupported version";
	if (lmt__get16(b->data + 6) != 0 || lmt__get32(b->data + 12) != 0)
		return "reserved field not zero";
	k->rkey_len = lmt__get32(b->data + 8);
	k->region = lmt__get64(b->data + 16);
	k->base = lmt__get64(b->data + 24);
	k->len = lmt__get64(b->data + 32);
	if (k->region == 0)
		return "region id 0";
	if (k->len == 0)
		return "zero length";
	if (k->base > UINT64_MAX - k->len)
		return "region wraps the address space";
	if (k->rkey_len != b->len - UCX_KEY_HEADER_LEN)
		return "rkey length disagrees with the blob";
	k->rkey = k->rkey_len ? b->data + UCX_KEY_HEADER_LEN : NULL;
	return NULL;
}

bool ucx_token_ok(const void *in, size_t len, size_t expected, size_t at, uint64_t token)
{
	if (!in || len != expected || at + 8 > expected)
		return false;
	return lmt__ct_equal64(lmt__get64((const uint8_t *)in + at), token);
}

void ucx_write_encode(const struct ucx_write *w, uint8_t *out)
{
	lmt__put32(out, UCX_MAGIC_WRITE);
	lmt__put32(out + 4, w->slot);
	lmt__put64(out + UCX_WRITE_TOKEN_AT, w->token);
	lmt__put64(out + 16, w->region);
	lmt__put64(out + 24, w->offset);
	lmt__put64(out + 32, w->len);
	lmt__put32(out + 40, w->generation);
	lmt__put32(out + 44, 0);
}

const char *ucx_write_decode(const void *in, size_t len, struct ucx_write *w)
{
	const uint8_t *p = in;
	if (len != UCX_WRITE_HEADER_LEN || !p)
		return "write header of the wrong length";
	if (lmt__get32(p) != UCX_MAGIC_WRITE)
		return "bad write magic";
	w->slot = lmt__get32(p + 4);
	w->token = lmt__get64(p + UCX_WRITE_TOKEN_AT);
	w->region = lmt__get64(p + 16);
	w->offset = lmt__get64(p + 24);
	w->len = lmt__get64(p + 32);
	w->generation = lmt__get32(p + 40);
	return NULL;
}

void ucx_note_encode(const struct ucx_note *n, uint8_t *out)
{
	lmt__put32(out, UCX_MAGIC_NOTE);
	lmt__put16(out + 4, n->kind);
	lmt__put16(out + 6, 0);
	lmt__put32(out + 8, (uint32_t)n->code);
	lmt__put32(out + 12, n->count);
	lmt__put64(out + UCX_NOTE_TOKEN_AT, n->token);
}

const char *ucx_note_decode(const void *in, size_t len, struct ucx_note *n)
{
	const uint8_t *p = in;
	if (len != UCX_NOTE_HEADER_LEN || !p)
		return "notice header of the wrong length";
	if (lmt__get32(p) != UCX_MAGIC_NOTE)
		return "bad notice magic";
	n->kind = lmt__get16(p + 4);
	n->code = (int32_t)lmt__get32(p + 8);
	n->count = lmt__get32(p + 12);
	n->token = lmt__get64(p + UCX_NOTE_TOKEN_AT);
	if (lmt__get16(p + 6) != 0)
		return "reserved field not zero";
	if (n->kind != UCX_NOTE_ACK && n->kind != UCX_NOTE_BYE && n->kind != UCX_NOTE_ERROR)
		return "unknown notice kind";
	if (n->kind != UCX_NOTE_ACK && n->count != 0)
		return "entries on a notice that carries none";
	return NULL;
}

void ucx_entry_encode(uint32_t slot, uint32_t generation, uint8_t *out)
{
	lmt__put32(out, slot);
	lmt__put32(out + 4, generation);
}

void ucx_entry_decode(const uint8_t *in, uint32_t *slot, uint32_t *generation)
{
	*slot = lmt__get32(in);
	*generation = lmt__get32(in + 4);
}
