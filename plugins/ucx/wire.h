/* Wire format of the UCX plugin: address and key blobs, and the active
 * messages that carry writes and their acknowledgements. Little-endian. */
#ifndef LMT_UCX_WIRE_H
#define LMT_UCX_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <lmt/plugin.h>

/* 2: tokens in address blobs, writes and notices; 64-bit random region ids;
 * a key blob without an rkey from a destination that takes no puts. */
#define UCX_WIRE_VERSION 2u

/* Each magic spells its message in ASCII on the wire ("LMUS", ...). */
enum ucx_magic {
	UCX_MAGIC_SRC_ADDR = 0x53554d4cu, /* source address blob */
	UCX_MAGIC_DST_ADDR = 0x44554d4cu, /* destination address blob */
	UCX_MAGIC_KEY = 0x4b554d4cu,      /* key blob */
	UCX_MAGIC_WRITE = 0x57554d4cu,    /* header of a write sent as an AM */
	UCX_MAGIC_NOTE = 0x4e554d4cu,     /* header of an acknowledgement or notice */
};

/* Active message ids. Every worker has a handler for each id below
 * UCX_AM_IDS; those a side does not use drop what they get. */
enum ucx_am_id {
	UCX_AM_WRITE = 1, /* source -> destination: header + payload */
	UCX_AM_NOTE = 2,  /* either way: ACK, BYE or ERROR */
	UCX_AM_IDS = 4,
};

enum ucx_note_kind {
	UCX_NOTE_ACK = 1,   /* these writes are in the destination's memory */
	UCX_NOTE_BYE = 2,   /* orderly close; answered with BYE once */
	UCX_NOTE_ERROR = 3, /* the destination failed the channel with `code` */
};

/* Flags of an address blob. */
enum ucx_addr_flags {
	UCX_ADDR_PUTS = 1, /* destination: it takes puts (UCP_FEATURE_RMA) */
};

/* Sizes on the wire. */
#define UCX_ADDR_HEADER_LEN 24u /* magic, version, flags, channel, address length, token */
#define UCX_KEY_HEADER_LEN 40u  /* magic, version, pad, rkey length, pad, region, base, length */
#define UCX_WRITE_HEADER_LEN 48u /* magic, slot, token, region, offset, length, generation, pad */
#define UCX_WRITE_TOKEN_AT 8u
#define UCX_NOTE_HEADER_LEN 24u  /* magic, kind, pad, code, count, token */
#define UCX_NOTE_TOKEN_AT 16u
#define UCX_NOTE_ENTRY_LEN 8u    /* slot, generation */

#define UCX_ADDR_MAX (LMT_BLOB_MAX - UCX_ADDR_HEADER_LEN)
#define UCX_RKEY_MAX (LMT_BLOB_MAX - UCX_KEY_HEADER_LEN)

/* An endpoint's blob: whose it is, its channel, the UCP worker address,
 * and the token: random, never 0, and what every message to this endpoint
 * must carry (compared in constant time), so that only the peer that got
 * the blob over the authenticated control connection is heard. */
struct ucx_addr {
	uint32_t magic; /* UCX_MAGIC_SRC_ADDR or UCX_MAGIC_DST_ADDR */
	uint16_t flags; /* enum ucx_addr_flags; 0 from a source */
	uint32_t channel;
	uint64_t token;
	uint32_t len;
	const uint8_t *worker; /* into the blob */
};

/* A key blob: the destination region's id (random, never 0), base address
 * and length, and the packed UCP rkey that lets a put reach it (none when
 * the destination takes no puts). */
struct ucx_key {
	uint64_t region;
	uint64_t base;
	uint64_t len;
	uint32_t rkey_len;
	const uint8_t *rkey; /* into the blob */
};

/* The header of a write carried by an active message: the destination
 * endpoint's token, then the region and range. `slot` and `generation`
 * name the source's slot for the acknowledgement. */
struct ucx_write {
	uint64_t token;
	uint64_t region;
	uint64_t offset;
	uint64_t len;
	uint32_t slot;
	uint32_t generation;
};

struct ucx_note {
	uint64_t token; /* the receiving endpoint's */
	uint16_t kind;  /* enum ucx_note_kind */
	int32_t code;   /* UCX_NOTE_ERROR: the LMT_E* code, positive */
	uint32_t count; /* UCX_NOTE_ACK: entries that follow as payload */
};

/* Encoders fail only when the payload does not fit: they return NULL or
 * what is wrong. Decoders return NULL, or what is wrong with the input. */
const char *ucx_addr_encode(const struct ucx_addr *a, const void *worker, size_t len,
                            struct lmt_blob *b);
const char *ucx_addr_decode(const struct lmt_blob *b, uint32_t magic, struct ucx_addr *a);
const char *ucx_key_encode(const struct ucx_key *k, const void *rkey, size_t rkey_len,
                           struct lmt_blob *b);
const char *ucx_key_decode(const struct lmt_blob *b, struct ucx_key *k);

/* Whether a message header of `len` bytes is a whole header of its kind
 * (`expected` bytes) carrying `token` at byte `at`, compared in constant
 * time. One that is not came from outside the session and is dropped
 * before anything else in it is read. */
bool ucx_token_ok(const void *in, size_t len, size_t expected, size_t at, uint64_t token);

void ucx_write_encode(const struct ucx_write *w, uint8_t *out);
const char *ucx_write_decode(const void *in, size_t len, struct ucx_write *w);
void ucx_note_encode(const struct ucx_note *n, uint8_t *out);
const char *ucx_note_decode(const void *in, size_t len, struct ucx_note *n);
void ucx_entry_encode(uint32_t slot, uint32_t generation, uint8_t *out);
void ucx_entry_decode(const uint8_t *in, uint32_t *slot, uint32_t *generation);

#endif
