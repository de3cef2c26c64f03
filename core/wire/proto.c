/* The control-message codec: little-endian, length-prefixed fields, every
 * field validated on the way in (see docs/protocol.md).
 * Room: wire; may use: base. */
#include "proto.h"

#include <stdlib.h>
#include <string.h>

#include "bytes.h"
#include "error.h"

/* ---- output ---- */

void lmt__buf_free(struct lmt_buf *b)
{
	free(b->data);
	memset(b, 0, sizeof(*b));
}

static void put(struct lmt_buf *b, const void *p, size_t n)
{
	if (b->failed)
		return;
	if (b->len + n > b->cap) {
		size_t cap = b->cap ? b->cap : 256;
		while (cap < b->len + n)
			cap *= 2;
		uint8_t *d = realloc(b->data, cap);
		if (!d) {
			b->failed = LMT_ENOMEM;
			return;
		}
		b->data = d;
		b->cap = cap;
	}
	memcpy(b->data + b->len, p, n);
	b->len += n;
}

static void put_u16(struct lmt_buf *b, uint16_t v)
{
	uint8_t x[2];
	lmt__put16(x, v);
	put(b, x, sizeof(x));
}

static void put_u32(struct lmt_buf *b, uint32_t v)
{
	uint8_t x[4];
	lmt__put32(x, v);
	put(b, x, sizeof(x));
}

static void put_u64(struct lmt_buf *b, uint64_t v)
{
	uint8_t x[8];
	lmt__put64(x, v);
	put(b, x, sizeof(x));
}

/* A string from a field of `cap` bytes. */
static void put_str(struct lmt_buf *b, const char *s, size_t cap)
{
	size_t n = strnlen(s, cap < 0xffff ? cap : 0xffff);
	put_u16(b, (uint16_t)n);
	put(b, s, n);
}

static void put_blob(struct lmt_buf *b, const struct lmt_blob *blob)
{
	uint32_t n = blob->len <= LMT_BLOB_MAX ? blob->len : LMT_BLOB_MAX;
	put_u16(b, (uint16_t)n);
	put(b, blob->data, n);
}

static void begin(struct lmt_buf *b, uint16_t type)
{
	b->len = 0;
	b->failed = 0;
	put_u16(b, type);
	put_u16(b, 0);
	put_u32(b, 0); /* patched by finish() */
}

static int finish(struct lmt_buf *b)
{
	if (b->failed)
		return -b->failed;
	size_t payload = b->len - LMT_PROTO_HEADER_SIZE;
	if (payload > LMT_PROTO_MAX_PAYLOAD)
		return -LMT_EOVERFLOW;
	lmt__put32(b->data + 4, (uint32_t)payload);
	return 0;
}

int lmt__enc_hello(struct lmt_buf *b, const struct lmt_msg_hello *m)
{
	if (m->option_count > LMT_PROTO_MAX_OPTIONS)
		return -LMT_EOVERFLOW;
	begin(b, LMT_MSG_HELLO);
	put_u32(b, m->magic);
	put_u16(b, m->version);
	put_str(b, m->plugin, sizeof(m->plugin));
	put_u32(b, m->option_count);
	for (uint32_t i = 0; i < m->option_count; i++) {
		put_str(b, m->options[i].name, sizeof(m->options[i].name));
		put_str(b, m->options[i].value, sizeof(m->options[i].value));
	}
	put(b, &m->auth, 1);
	put(b, m->nonce, LMT_PROTO_NONCE);
	return finish(b);
}

int lmt__enc_status(struct lmt_buf *b, uint16_t type, const struct lmt_msg_status *m)
{
	begin(b, type);
	if (type == LMT_MSG_HELLO_REPLY)
		put_u16(b, m->version);
	put_u32(b, (uint32_t)m->code);
	put_str(b, m->text, sizeof(m->text));
	if (type == LMT_MSG_HELLO_REPLY) {
		put(b, &m->auth, 1);
		if (m->auth) {
			put(b, m->nonce, LMT_PROTO_NONCE);
			put(b, m->proof, LMT_PROTO_PROOF);
		}
	}
	return finish(b);
}

int lmt__enc_blocks(struct lmt_buf *b, const struct lmt_msg_blocks *m)
{
	if (m->count > LMT_PROTO_MAX_BLOCKS)
		return -LMT_EOVERFLOW;
	begin(b, LMT_MSG_BLOCKS);
	put_u32(b, m->count);
	for (uint32_t i = 0; i < m->count; i++) {
		put_str(b, m->blocks[i].name, sizeof(m->blocks[i].name));
		put_u64(b, m->blocks[i].length);
		put_u32(b, m->blocks[i].page_size);
	}
	return finish(b);
}

int lmt__enc_addrs(struct lmt_buf *b, const struct lmt_msg_addrs *m)
{
	if (m->count > LMT_MAX_CHANNELS)
		return -LMT_EOVERFLOW;
	begin(b, LMT_MSG_EP_ADDRS);
	put_u32(b, m->count);
	for (uint32_t i = 0; i < m->count; i++)
		put_blob(b, &m->addrs[i]);
	return finish(b);
}

int lmt__enc_regs(struct lmt_buf *b, uint16_t type, const struct lmt_msg_regs *m)
{
	if (m->count > LMT_PROTO_MAX_REG)
		return -LMT_EOVERFLOW;
	begin(b, type);
	put_u32(b, m->count);
	for (uint32_t i = 0; i < m->count; i++) {
		put_u32(b, m->regs[i].block);
		put_u64(b, m->regs[i].offset);
		put_u64(b, m->regs[i].length);
		if (type == LMT_MSG_REG_REPLY)
			put_blob(b, &m->regs[i].key);
	}
	return finish(b);
}

int lmt__enc_state(struct lmt_buf *b, const struct lmt_msg_state *m)
{
	if (m->length > LMT_PROTO_STATE_CHUNK)
		return -LMT_EOVERFLOW;
	begin(b, LMT_MSG_DEVICE_STATE);
	put_u64(b, m->offset);
	put_u64(b, m->total);
	put_u32(b, m->length);
	put(b, m->data, m->length);
	return finish(b);
}

int lmt__enc_complete(struct lmt_buf *b, const struct lmt_msg_complete *m)
{
	if (m->digest_count > LMT_PROTO_MAX_BLOCKS)
		return -LMT_EOVERFLOW;
	begin(b, LMT_MSG_COMPLETE);
	put_u64(b, m->passes);
	put_u64(b, m->state_length);
	put_u32(b, m->digest_count);
	for (uint32_t i = 0; i < m->digest_count; i++)
		put_u64(b, m->digests[i]);
	return finish(b);
}

int lmt__enc_fd_flags(struct lmt_buf *b, uint16_t type, const struct lmt_msg_fd_flags *m)
{
	if (m->count > LMT_PROTO_MAX_BLOCKS)
		return -LMT_EOVERFLOW;
	begin(b, type);
	put_u32(b, m->count);
	put(b, m->flags, m->count);
	return finish(b);
}

int lmt__enc_fd_handover(struct lmt_buf *b, const struct lmt_msg_fd_handover *m)
{
	if (m->count > LMT_PROTO_MAX_BLOCKS)
		return -LMT_EOVERFLOW;
	begin(b, LMT_MSG_FD_HANDOVER);
	put_u32(b, m->count);
	for (uint32_t i = 0; i < m->count; i++) {
		put_u32(b, m->entries[i].block);
		put_u64(b, m->entries[i].offset);
		put_u64(b, m->entries[i].digest);
	}
	return finish(b);
}

int lmt__enc_auth(struct lmt_buf *b, const uint8_t proof[LMT_PROTO_PROOF])
{
	begin(b, LMT_MSG_AUTH);
	put(b, proof, LMT_PROTO_PROOF);
	return finish(b);
}

int lmt__enc_landed(struct lmt_buf *b, const struct lmt_msg_landed *m)
{
	if (m->channels > LMT_MAX_CHANNELS)
		return -LMT_EOVERFLOW;
	begin(b, LMT_MSG_LANDED);
	put_u32(b, m->channels);
	for (uint32_t i = 0; i < m->channels; i++)
		put_u64(b, m->bytes[i]);
	return finish(b);
}

int lmt__enc_digests(struct lmt_buf *b, const struct lmt_msg_digests *m)
{
	if (m->count == 0 || m->count > LMT_PROTO_MAX_DIGESTS)
		return -LMT_EOVERFLOW;
	begin(b, LMT_MSG_DIGESTS);
	put_u32(b, m->block);
	put_u64(b, m->first);
	put_u32(b, m->count);
	for (uint32_t i = 0; i < m->count; i++)
		put_u64(b, m->digests[i]);
	return finish(b);
}

/* ---- postcopy ---- */

int lmt__enc_pc_pages(struct lmt_buf *b, const struct lmt_msg_pc_pages *m)
{
	if (m->words == 0 || m->words > LMT_PROTO_MAX_BITMAP_WORDS)
		return -LMT_EOVERFLOW;
	begin(b, LMT_MSG_POSTCOPY_PAGES);
	put_u32(b, m->block);
	put_u64(b, m->first);
	put_u32(b, m->words);
	put(b, m->bits, (size_t)m->words * 8);
	return finish(b);
}

int lmt__enc_postcopy(struct lmt_buf *b, const struct lmt_msg_postcopy *m)
{
	begin(b, LMT_MSG_POSTCOPY);
	put_u64(b, m->passes);
	put_u64(b, m->state_length);
	put_u64(b, m->pages);
	return finish(b);
}

int lmt__enc_pc_ack(struct lmt_buf *b, const struct lmt_msg_pc_ack *m)
{
	begin(b, LMT_MSG_POSTCOPY_ACK);
	put_u32(b, (uint32_t)m->code);
	put_str(b, m->text, sizeof(m->text));
	if (m->code == 0) {
		if (m->naliases > LMT_PROTO_MAX_BLOCKS)
			return -LMT_EOVERFLOW;
		put_u32(b, m->slot_size);
		put_u32(b, m->slots);
		put_blob(b, &m->key);
		put_u32(b, m->naliases);
		for (uint32_t i = 0; i < m->naliases; i++) {
			put_u32(b, m->aliases[i].block);
			put_blob(b, &m->aliases[i].key);
		}
	}
	return finish(b);
}

static void put_run(struct lmt_buf *b, const struct lmt_msg_page *g)
{
	put_u32(b, g->block);
	put_u64(b, g->page);
	put_u32(b, g->npages);
}

int lmt__enc_page_req(struct lmt_buf *b, const struct lmt_msg_page_req *m)
{
	if (m->count > LMT_PROTO_MAX_PAGE_REQS)
		return -LMT_EOVERFLOW;
	begin(b, LMT_MSG_PAGE_REQ);
	put_u32(b, m->count);
	for (uint32_t i = 0; i < m->count; i++)
		put_run(b, &m->pages[i]);
	return finish(b);
}

int lmt__enc_pages(struct lmt_buf *b, const struct lmt_msg_pages *m)
{
	if (m->channels > LMT_MAX_CHANNELS || m->count > LMT_PROTO_MAX_PAGE_ENTRIES)
		return -LMT_EOVERFLOW;
	begin(b, LMT_MSG_PAGES);
	put_u32(b, m->channels);
	for (uint32_t i = 0; i < m->channels; i++)
		put_u64(b, m->bytes[i]);
	put_u32(b, m->count);
	for (uint32_t i = 0; i < m->count; i++) {
		put_u32(b, m->entries[i].slot);
		put_run(b, &m->entries[i].run);
	}
	return finish(b);
}

int lmt__enc_slots(struct lmt_buf *b, const struct lmt_msg_slots *m)
{
	if (m->count > LMT_PROTO_MAX_SLOTS)
		return -LMT_EOVERFLOW;
	begin(b, LMT_MSG_SLOTS_FREE);
	put_u32(b, m->count);
	for (uint32_t i = 0; i < m->count; i++)
		put_u32(b, m->slots[i]);
	return finish(b);
}

int lmt__enc_pc_done(struct lmt_buf *b, const struct lmt_msg_pc_done *m)
{
	begin(b, LMT_MSG_POSTCOPY_DONE);
	put_u64(b, m->pages);
	return finish(b);
}

int lmt__enc_zero(struct lmt_buf *b, const struct lmt_msg_zero *m)
{
	if (m->count == 0 || m->count > LMT_PROTO_MAX_ZERO_RUNS)
		return -LMT_EOVERFLOW;
	begin(b, LMT_MSG_ZERO);
	put_u32(b, m->count);
	for (uint32_t i = 0; i < m->count; i++)
		put_run(b, &m->runs[i]);
	return finish(b);
}

int lmt__enc_zero_ack(struct lmt_buf *b, uint64_t applied)
{
	begin(b, LMT_MSG_ZERO_ACK);
	put_u64(b, applied);
	return finish(b);
}

int lmt__enc_empty(struct lmt_buf *b, uint16_t type)
{
	begin(b, type);
	return finish(b);
}

/* ---- input ---- */

struct reader {
	const uint8_t *p;
	size_t left;
	struct lmt_error *err;
	const char *msg; /* message name, for error texts */
	int rc;
};

static int bad(struct reader *r, const char *what)
{
	if (!r->rc)
		r->rc = lmt__error(r->err, LMT_EPROTO, "%s message: %s", r->msg, what);
	return r->rc;
}

static int take(struct reader *r, void *out, size_t n, const char *what)
{
	if (r->rc)
		return r->rc;
	if (r->left < n)
		return bad(r, what);
	memcpy(out, r->p, n);
	r->p += n;
	r->left -= n;
	return 0;
}

/* A short read leaves the field zero (and the reader failed). */
static uint16_t get_u16(struct reader *r, const char *what)
{
	uint8_t x[2] = {0};
	take(r, x, sizeof(x), what);
	return lmt__get16(x);
}

static uint32_t get_u32(struct reader *r, const char *what)
{
	uint8_t x[4] = {0};
	take(r, x, sizeof(x), what);
	return lmt__get32(x);
}

static uint64_t get_u64(struct reader *r, const char *what)
{
	uint8_t x[8] = {0};
	take(r, x, sizeof(x), what);
	return lmt__get64(x);
}

/* A string of at most cap-1 bytes without NUL or control characters. */
static void get_str(struct reader *r, char *out, size_t cap, const char *what)
{
	uint16_t n = get_u16(r, what);
	out[0] = '\0';
	if (r->rc)
		return;
	if (n >= cap) {
		bad(r, what);
		return;
	}
	if (take(r, out, n, what))
		return;
	out[n] = '\0';
	for (uint16_t i = 0; i < n; i++)
		if ((unsigned char)out[i] < 0x20 || out[i] == 0x7f) {
			bad(r, what);
			return;
		}
}

static void get_blob(struct reader *r, struct lmt_blob *blob, const char *what)
{
	uint16_t n = get_u16(r, what);
	blob->len = 0;
	if (r->rc)
		return;
	if (n == 0 || n > LMT_BLOB_MAX) {
		bad(r, what);
		return;
	}
	if (take(r, blob->data, n, what) == 0)
		blob->len = n;
}

static void get_count(struct reader *r, uint32_t *count, uint32_t max, const char *what)
{
	*count = get_u32(r, what);
	if (!r->rc && *count > max) {
		*count = 0;
		bad(r, what);
	}
}

static int done(struct reader *r)
{
	if (!r->rc && r->left)
		bad(r, "trailing bytes");
	return r->rc;
}

static struct reader reader(const uint8_t *p, size_t len, uint16_t type, struct lmt_error *err)
{
	return (struct reader){.p = p, .left = len, .err = err, .msg = lmt__msg_name(type)};
}

static const char *const msg_names[] = {
        [LMT_MSG_HELLO] = "HELLO",         [LMT_MSG_HELLO_REPLY] = "HELLO_REPLY",
        [LMT_MSG_BLOCKS] = "BLOCKS",       [LMT_MSG_EP_ADDRS] = "EP_ADDRS",
        [LMT_MSG_READY] = "READY",         [LMT_MSG_REG_REQ] = "REG_REQ",
        [LMT_MSG_REG_REPLY] = "REG_REPLY", [LMT_MSG_DEVICE_STATE] = "DEVICE_STATE",
        [LMT_MSG_COMPLETE] = "COMPLETE",   [LMT_MSG_COMPLETE_ACK] = "COMPLETE_ACK",
        [LMT_MSG_ERROR] = "ERROR",         [LMT_MSG_PING] = "PING",
        [LMT_MSG_PONG] = "PONG",           [LMT_MSG_AUTH] = "AUTH",
        [LMT_MSG_LANDED] = "LANDED",       [LMT_MSG_FD_OFFER] = "FD_OFFER",
        [LMT_MSG_FD_ACCEPT] = "FD_ACCEPT", [LMT_MSG_FD_HANDOVER] = "FD_HANDOVER",
        [LMT_MSG_POSTCOPY_PAGES] = "POSTCOPY_PAGES",
        [LMT_MSG_POSTCOPY] = "POSTCOPY",
        [LMT_MSG_POSTCOPY_ACK] = "POSTCOPY_ACK",
        [LMT_MSG_PAGE_REQ] = "PAGE_REQ",
        [LMT_MSG_PAGES] = "PAGES",
        [LMT_MSG_SLOTS_FREE] = "SLOTS_FREE",
        [LMT_MSG_POSTCOPY_DONE] = "POSTCOPY_DONE",
        [LMT_MSG_DIGESTS] = "DIGESTS",
        [LMT_MSG_ZERO] = "ZERO",
        [LMT_MSG_ZERO_ACK] = "ZERO_ACK",
};

const char *lmt__msg_name(uint16_t type)
{
	if (type >= 1 && type <= LMT_MSG_TYPE_MAX)
		return msg_names[type];
	return "unknown";
}

int lmt__dec_header(const uint8_t *p, size_t len, struct lmt_msg_header *h, struct lmt_error *err)
{
	if (len < LMT_PROTO_HEADER_SIZE)
		return lmt__error(err, LMT_EPROTO, "control message: truncated header");
	h->type = lmt__get16(p);
	h->flags = lmt__get16(p + 2);
	h->length = lmt__get32(p + 4);
	if (h->type < 1 || h->type > LMT_MSG_TYPE_MAX)
		return lmt__error(err, LMT_EPROTO, "control message: unknown type %u", h->type);
	if (h->flags)
		return lmt__error(err, LMT_EPROTO, "%s message: flags 0x%x must be 0",
		                  lmt__msg_name(h->type), h->flags);
	if (h->length > LMT_PROTO_MAX_PAYLOAD)
		return lmt__error(err, LMT_EPROTO, "%s message: length %u over the limit of %u",
		                  lmt__msg_name(h->type), h->length, LMT_PROTO_MAX_PAYLOAD);
	return 0;
}

int lmt__dec_hello(const uint8_t *p, size_t len, struct lmt_msg_hello *m, struct lmt_error *err)
{
	struct reader r = reader(p, len, LMT_MSG_HELLO, err);
	m->magic = get_u32(&r, "truncated magic");
	if (!r.rc && m->magic != LMT_PROTO_MAGIC)
		return bad(&r, "bad magic (not an lmt peer)");
	m->version = get_u16(&r, "truncated version");
	/* A newer peer may have extended the rest: stop here and let the
	 * engine refuse the version with both numbers. */
	if (!r.rc && m->version != LMT_PROTO_VERSION) {
		m->option_count = 0;
		m->plugin[0] = '\0';
		return 0;
	}
	get_str(&r, m->plugin, sizeof(m->plugin), "bad plugin name");
	get_count(&r, &m->option_count, LMT_PROTO_MAX_OPTIONS, "too many options");
	for (uint32_t i = 0; i < m->option_count && !r.rc; i++) {
		get_str(&r, m->options[i].name, sizeof(m->options[i].name), "bad option name");
		get_str(&r, m->options[i].value, sizeof(m->options[i].value), "bad option value");
	}
	take(&r, &m->auth, 1, "truncated auth flag");
	if (!r.rc && m->auth > 1)
		return bad(&r, "auth flag must be 0 or 1");
	take(&r, m->nonce, LMT_PROTO_NONCE, "truncated nonce");
	return done(&r);
}

int lmt__dec_status(const uint8_t *p, size_t len, uint16_t type, struct lmt_msg_status *m,
                    struct lmt_error *err)
{
	struct reader r = reader(p, len, type, err);
	m->version = type == LMT_MSG_HELLO_REPLY ? get_u16(&r, "truncated version") : 0;
	m->code = (int32_t)get_u32(&r, "truncated code");
	if (!r.rc && (m->code > 0 || m->code <= -LMT_ERRC_COUNT))
		return bad(&r, "status code out of range");
	get_str(&r, m->text, sizeof(m->text), "bad text");
	m->auth = 0;
	if (type == LMT_MSG_HELLO_REPLY) {
		take(&r, &m->auth, 1, "truncated auth flag");
		if (!r.rc && m->auth > 1)
			return bad(&r, "auth flag must be 0 or 1");
		if (!r.rc && m->auth) {
			take(&r, m->nonce, LMT_PROTO_NONCE, "truncated nonce");
			take(&r, m->proof, LMT_PROTO_PROOF, "truncated proof");
		}
	}
	return done(&r);
}

int lmt__dec_blocks(const uint8_t *p, size_t len, struct lmt_msg_blocks *m, struct lmt_error *err)
{
	struct reader r = reader(p, len, LMT_MSG_BLOCKS, err);
	get_count(&r, &m->count, LMT_PROTO_MAX_BLOCKS, "too many blocks");
	if (!r.rc && m->count == 0)
		return bad(&r, "no blocks");
	for (uint32_t i = 0; i < m->count && !r.rc; i++) {
		struct lmt_msg_block *blk = &m->blocks[i];
		get_str(&r, blk->name, sizeof(blk->name), "bad block name");
		blk->length = get_u64(&r, "truncated block length");
		blk->page_size = get_u32(&r, "truncated page size");
	}
	return done(&r);
}

int lmt__dec_addrs(const uint8_t *p, size_t len, struct lmt_msg_addrs *m, struct lmt_error *err)
{
	struct reader r = reader(p, len, LMT_MSG_EP_ADDRS, err);
	get_count(&r, &m->count, LMT_MAX_CHANNELS, "too many channels");
	for (uint32_t i = 0; i < m->count && !r.rc; i++)
		get_blob(&r, &m->addrs[i], "bad address blob");
	return done(&r);
}

int lmt__dec_regs(const uint8_t *p, size_t len, uint16_t type, struct lmt_msg_regs *m,
                  struct lmt_error *err)
{
	struct reader r = reader(p, len, type, err);
	get_count(&r, &m->count, LMT_PROTO_MAX_REG, "too many registrations");
	for (uint32_t i = 0; i < m->count && !r.rc; i++) {
		struct lmt_msg_reg *reg = &m->regs[i];
		reg->block = get_u32(&r, "truncated block index");
		reg->offset = get_u64(&r, "truncated offset");
		reg->length = get_u64(&r, "truncated length");
		reg->key.len = 0;
		if (type == LMT_MSG_REG_REPLY)
			get_blob(&r, &reg->key, "bad key blob");
	}
	return done(&r);
}

int lmt__dec_state(const uint8_t *p, size_t len, struct lmt_msg_state *m, struct lmt_error *err)
{
	struct reader r = reader(p, len, LMT_MSG_DEVICE_STATE, err);
	m->offset = get_u64(&r, "truncated offset");
	m->total = get_u64(&r, "truncated total");
	m->length = get_u32(&r, "truncated length");
	if (r.rc)
		return r.rc;
	if (m->total > LMT_PROTO_MAX_STATE)
		return bad(&r, "device state larger than 1G");
	if (m->length > LMT_PROTO_STATE_CHUNK || m->length != r.left)
		return bad(&r, "chunk length does not match the payload");
	if (m->offset > m->total || m->length > m->total - m->offset)
		return bad(&r, "chunk outside the device state");
	m->data = r.p;
	r.left = 0;
	return done(&r);
}

int lmt__dec_complete(const uint8_t *p, size_t len, struct lmt_msg_complete *m,
                      struct lmt_error *err)
{
	struct reader r = reader(p, len, LMT_MSG_COMPLETE, err);
	m->passes = get_u64(&r, "truncated pass count");
	m->state_length = get_u64(&r, "truncated device state length");
	if (!r.rc && m->state_length > LMT_PROTO_MAX_STATE)
		return bad(&r, "device state larger than 1G");
	get_count(&r, &m->digest_count, LMT_PROTO_MAX_BLOCKS, "too many digests");
	for (uint32_t i = 0; i < m->digest_count && !r.rc; i++)
		m->digests[i] = get_u64(&r, "truncated digest");
	return done(&r);
}

int lmt__dec_auth(const uint8_t *p, size_t len, uint8_t proof[LMT_PROTO_PROOF],
                  struct lmt_error *err)
{
	struct reader r = reader(p, len, LMT_MSG_AUTH, err);
	take(&r, proof, LMT_PROTO_PROOF, "truncated proof");
	return done(&r);
}

int lmt__dec_landed(const uint8_t *p, size_t len, struct lmt_msg_landed *m, struct lmt_error *err)
{
	struct reader r = reader(p, len, LMT_MSG_LANDED, err);
	get_count(&r, &m->channels, LMT_MAX_CHANNELS, "too many channels");
	for (uint32_t i = 0; i < m->channels && !r.rc; i++)
		m->bytes[i] = get_u64(&r, "truncated byte count");
	return done(&r);
}

int lmt__dec_digests(const uint8_t *p, size_t len, struct lmt_msg_digests *m,
                     struct lmt_error *err)
{
	struct reader r = reader(p, len, LMT_MSG_DIGESTS, err);
	m->block = get_u32(&r, "truncated block index");
	m->first = get_u64(&r, "truncated first stripe");
	get_count(&r, &m->count, LMT_PROTO_MAX_DIGESTS, "too many digests");
	if (!r.rc && m->count == 0)
		return bad(&r, "no digests");
	for (uint32_t i = 0; i < m->count && !r.rc; i++)
		m->digests[i] = get_u64(&r, "truncated digest");
	return done(&r);
}

int lmt__dec_empty(const uint8_t *p, size_t len, uint16_t type, struct lmt_error *err)
{
	struct reader r = reader(p, len, type, err);
	(void)p;
	return done(&r);
}

int lmt__dec_fd_flags(const uint8_t *p, size_t len, uint16_t type, struct lmt_msg_fd_flags *m,
                      struct lmt_error *err)
{
	struct reader r = reader(p, len, type, err);
	get_count(&r, &m->count, LMT_PROTO_MAX_BLOCKS, "too many blocks");
	take(&r, m->flags, m->count, "truncated block flags");
	for (uint32_t i = 0; i < m->count && !r.rc; i++)
		if (m->flags[i] > 1)
			return bad(&r, "a block flag must be 0 or 1");
	return done(&r);
}

int lmt__dec_fd_handover(const uint8_t *p, size_t len, struct lmt_msg_fd_handover *m,
                         struct lmt_error *err)
{
	struct reader r = reader(p, len, LMT_MSG_FD_HANDOVER, err);
	get_count(&r, &m->count, LMT_PROTO_MAX_BLOCKS, "too many descriptors");
	for (uint32_t i = 0; i < m->count && !r.rc; i++) {
		struct lmt_msg_fd_entry *e = &m->entries[i];
		e->block = get_u32(&r, "truncated block index");
		e->offset = get_u64(&r, "truncated file offset");
		e->digest = get_u64(&r, "truncated digest");
		if (!r.rc && i > 0 && e->block <= m->entries[i - 1].block)
			return bad(&r, "block indexes must increase");
	}
	return done(&r);
}

/* ---- postcopy ---- */

int lmt__dec_pc_pages(const uint8_t *p, size_t len, struct lmt_msg_pc_pages *m,
                      struct lmt_error *err)
{
	struct reader r = reader(p, len, LMT_MSG_POSTCOPY_PAGES, err);
	m->block = get_u32(&r, "truncated block index");
	m->first = get_u64(&r, "truncated first page");
	get_count(&r, &m->words, LMT_PROTO_MAX_BITMAP_WORDS, "too many bitmap words");
	if (r.rc)
		return r.rc;
	if (m->words == 0)
		return bad(&r, "an empty bitmap");
	if (m->first % 64 || m->first > UINT64_MAX - 64ull * m->words)
		return bad(&r, "the first page is not a multiple of 64, or the bitmap wraps");
	if (r.left < (size_t)m->words * 8)
		return bad(&r, "truncated bitmap");
	m->bits = r.p;
	r.p += (size_t)m->words * 8;
	r.left -= (size_t)m->words * 8;
	return done(&r);
}

int lmt__dec_postcopy(const uint8_t *p, size_t len, struct lmt_msg_postcopy *m,
                      struct lmt_error *err)
{
	struct reader r = reader(p, len, LMT_MSG_POSTCOPY, err);
	m->passes = get_u64(&r, "truncated pass count");
	m->state_length = get_u64(&r, "truncated device state length");
	m->pages = get_u64(&r, "truncated page count");
	return done(&r);
}

int lmt__dec_pc_ack(const uint8_t *p, size_t len, struct lmt_msg_pc_ack *m, struct lmt_error *err)
{
	struct reader r = reader(p, len, LMT_MSG_POSTCOPY_ACK, err);
	memset(m, 0, sizeof(*m));
	m->code = (int32_t)get_u32(&r, "truncated status");
	get_str(&r, m->text, sizeof(m->text), "bad status text");
	if (!r.rc && (m->code > 0 || m->code <= -LMT_ERRC_COUNT))
		return bad(&r, "status code out of range");
	if (r.rc || m->code)
		return done(&r);
	m->slot_size = get_u32(&r, "truncated slot size");
	get_count(&r, &m->slots, LMT_PROTO_MAX_SLOTS, "too many staging slots");
	get_blob(&r, &m->key, "bad staging key");
	if (!r.rc && (m->slots < 2 || m->slot_size < 4096 || m->slot_size > (64u << 20) ||
	              m->slot_size % 4096))
		return bad(&r, "the staging area needs 2 slots or more of 4 KiB to 64 MiB, in pages");
	get_count(&r, &m->naliases, LMT_PROTO_MAX_BLOCKS, "too many in-place blocks");
	for (uint32_t i = 0; i < m->naliases && !r.rc; i++) {
		m->aliases[i].block = get_u32(&r, "truncated block index");
		get_blob(&r, &m->aliases[i].key, "bad in-place key");
		if (!r.rc && i && m->aliases[i].block <= m->aliases[i - 1].block)
			return bad(&r, "in-place blocks out of order or named twice");
	}
	return done(&r);
}

/* A run of at least one page that does not wrap. */
static void get_run(struct reader *r, struct lmt_msg_page *g)
{
	g->block = get_u32(r, "truncated block index");
	g->page = get_u64(r, "truncated page");
	g->npages = get_u32(r, "truncated page count");
	if (!r->rc && (g->npages == 0 || g->page > UINT64_MAX - g->npages))
		bad(r, "an empty or wrapping run of pages");
}

int lmt__dec_page_req(const uint8_t *p, size_t len, struct lmt_msg_page_req *m,
                      struct lmt_error *err)
{
	struct reader r = reader(p, len, LMT_MSG_PAGE_REQ, err);
	get_count(&r, &m->count, LMT_PROTO_MAX_PAGE_REQS, "too many page requests");
	if (!r.rc && m->count == 0)
		return bad(&r, "no page requested");
	for (uint32_t i = 0; i < m->count && !r.rc; i++)
		get_run(&r, &m->pages[i]);
	return done(&r);
}

int lmt__dec_pages(const uint8_t *p, size_t len, struct lmt_msg_pages *m, struct lmt_error *err)
{
	struct reader r = reader(p, len, LMT_MSG_PAGES, err);
	get_count(&r, &m->channels, LMT_MAX_CHANNELS, "too many channels");
	for (uint32_t i = 0; i < m->channels && !r.rc; i++)
		m->bytes[i] = get_u64(&r, "truncated byte count");
	get_count(&r, &m->count, LMT_PROTO_MAX_PAGE_ENTRIES, "too many page entries");
	for (uint32_t i = 0; i < m->count && !r.rc; i++) {
		struct lmt_msg_pc_entry *e = &m->entries[i];
		e->slot = get_u32(&r, "truncated slot");
		get_run(&r, &e->run);
		if (!r.rc && e->slot != LMT_PROTO_ZERO_SLOT && e->slot != LMT_PROTO_IN_PLACE_SLOT &&
		    e->slot >= LMT_PROTO_MAX_SLOTS)
			return bad(&r, "slot out of range");
	}
	return done(&r);
}

int lmt__dec_slots(const uint8_t *p, size_t len, struct lmt_msg_slots *m, struct lmt_error *err)
{
	struct reader r = reader(p, len, LMT_MSG_SLOTS_FREE, err);
	get_count(&r, &m->count, LMT_PROTO_MAX_SLOTS, "too many slots");
	if (!r.rc && m->count == 0)
		return bad(&r, "no slot");
	for (uint32_t i = 0; i < m->count && !r.rc; i++) {
		m->slots[i] = get_u32(&r, "truncated slot");
		if (!r.rc && m->slots[i] >= LMT_PROTO_MAX_SLOTS)
			return bad(&r, "slot out of range");
	}
	return done(&r);
}

int lmt__dec_pc_done(const uint8_t *p, size_t len, struct lmt_msg_pc_done *m,
                     struct lmt_error *err)
{
	struct reader r = reader(p, len, LMT_MSG_POSTCOPY_DONE, err);
	m->pages = get_u64(&r, "truncated page count");
	return done(&r);
}

int lmt__dec_zero(const uint8_t *p, size_t len, struct lmt_msg_zero *m, struct lmt_error *err)
{
	struct reader r = reader(p, len, LMT_MSG_ZERO, err);
	get_count(&r, &m->count, LMT_PROTO_MAX_ZERO_RUNS, "too many zero runs");
	if (!r.rc && m->count == 0)
		return bad(&r, "no zero run");
	for (uint32_t i = 0; i < m->count && !r.rc; i++)
		get_run(&r, &m->runs[i]);
	return done(&r);
}

int lmt__dec_zero_ack(const uint8_t *p, size_t len, uint64_t *applied, struct lmt_error *err)
{
	struct reader r = reader(p, len, LMT_MSG_ZERO_ACK, err);
	*applied = get_u64(&r, "truncated count");
	return done(&r);
}
