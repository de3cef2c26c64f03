/* Wire format of the UCX plugin: address and key blobs, and the active
 * messages that carry writes and their acknowledgements. Little-endian. */
#ifndef LMT_UCX_WIRE_H
#define LMT_UCX_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include <lmt/plugin.h>

#define UCX_WIRE_VERSION 1u

/* Each magic spells its message in ASCII on the wire ("LMUS", ...). */
enum ucx_magic {
	UCX_MAGIC_SRC_ADDR = 0x53554d4cu, /* source address blob */
	UCX_MAGIC_DST_ADDR = 0x44554d4cu, /* destination address blob */
	UCX_MAGIC_KEY = 0x4b554d4cu,      /* key blob */
	UCX_MAGIC_WRITE = 0x57554d4cu,    /* header of a write sent as an AM */
	UCX_MAGIC_NOTE = 0x4e554d4cu,     /* header of an acknowledgement or notice */
};

/* Active message ids, registered on every worker. */
enum ucx_am_id {
	UCX_AM_WRITE = 1, /* source -> destination: header + payload */
	UCX_AM_NOTE = 2,  /* either way: ACK, BYE or ERROR */
};

enum ucx_note_kind {
	UCX_NOTE_ACK = 1,   /* these writes are in the destination's memory */
	UCX_NOTE_BYE = 2,   /* orderly close; answered with BYE once */
	UCX_NOTE_ERROR = 3, /* the destination failed the channel with `code` */
};

/* Sizes on the wire. */
#define UCX_ADDR_HEADER_LEN 16u  /* magic, version, flags, channel, address length */
#define UCX_KEY_HEADER_LEN 32u   /* magic, version, pad, region, rkey length, base, length */
#define UCX_WRITE_HEADER_LEN 32u /* magic, region, offset, length, slot, generation */
#define UCX_NOTE_HEADER_LEN 16u  /* magic, kind, pad, code, count */
#define UCX_NOTE_ENTRY_LEN 8u    /* slot, generation */

#define UCX_ADDR_MAX (LMT_BLOB_MAX - UCX_ADDR_HEADER_LEN)
#define UCX_RKEY_MAX (LMT_BLOB_MAX - UCX_KEY_HEADER_LEN)

/* An endpoint's blob: whose it is, its channel and the UCP worker address. */
struct ucx_addr {
	uint32_t magic; /* UCX_MAGIC_SRC_ADDR or UCX_MAGIC_DST_ADDR */
	uint32_t channel;
	uint32_t len;
	const uint8_t *worker; /* into the blob */
};

/* A key blob: the destination region's id, base address and length, and
 * the packed UCP rkey that lets a put reach it. */
struct ucx_key {
	uint32_t region;
	uint64_t base;
	uint64_t len;
	uint32_t rkey_len;
	const uint8_t *rkey; /* into the blob */
};

/* The header of a write carried by an active message. `slot` and
 * `generation` name the source's slot for the acknowledgement. */
struct ucx_write {
	uint32_t region;
	uint64_t offset;
	uint64_t len;
	uint32_t slot;
	uint32_t generation;
};

struct ucx_note {
	uint16_t kind;  /* enum ucx_note_kind */
	int32_t code;   /* UCX_NOTE_ERROR: the LMT_E* code, positive */
	uint32_t count; /* UCX_NOTE_ACK: entries that follow as payload */
};

/* Encoders fail only when the payload does not fit: they return NULL or
 * what is wrong. Decoders return NULL, or what is wrong with the input. */
const char *ucx_addr_encode(uint32_t magic, uint32_t channel, const void *worker, size_t len,
                            struct lmt_blob *b);
const char *ucx_addr_decode(const struct lmt_blob *b, uint32_t magic, struct ucx_addr *a);
const char *ucx_key_encode(const struct ucx_key *k, const void *rkey, size_t rkey_len,
                           struct lmt_blob *b);
const char *ucx_key_decode(const struct lmt_blob *b, struct ucx_key *k);

void ucx_write_encode(const struct ucx_write *w, uint8_t *out);
const char *ucx_write_decode(const void *in, size_t len, struct ucx_write *w);
void ucx_note_encode(const struct ucx_note *n, uint8_t *out);
const char *ucx_note_decode(const void *in, size_t len, struct ucx_note *n);
void ucx_entry_encode(uint32_t slot, uint32_t generation, uint8_t *out);
void ucx_entry_decode(const uint8_t *in, uint32_t *slot, uint32_t *generation);

#endif
