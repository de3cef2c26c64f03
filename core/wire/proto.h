/* The control protocol: message types, their decoded forms, and the one
 * codec that turns them into bytes and back. Every decoder validates every
 * field before the engine sees it. docs/protocol.md describes the wire.
 * Room: wire; may use: base. */
#ifndef LMT_CORE_PROTO_H
#define LMT_CORE_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include <lmt/lmt.h>

#define LMT_PROTO_MAGIC 0x50544d4cu /* the bytes "LMTP" read as little-endian */
#define LMT_PROTO_VERSION 4u
#define LMT_PROTO_HEADER_SIZE 8u
#define LMT_PROTO_MAX_PAYLOAD (2u << 20)
#define LMT_PROTO_MAX_OPTIONS 64u
#define LMT_PROTO_MAX_BLOCKS 256u
#define LMT_PROTO_MAX_REG 256u
#define LMT_PROTO_MAX_TEXT 480u
#define LMT_PROTO_STATE_CHUNK (1u << 20)
#define LMT_PROTO_MAX_STATE (1ull << 30)
#define LMT_PROTO_NONCE 32u
#define LMT_PROTO_PROOF 32u
#define LMT_PROTO_MAX_DIGESTS 65536u

enum lmt_msg_type {
	LMT_MSG_HELLO = 1,         /* S->D: magic, version, plugin, options */
	LMT_MSG_HELLO_REPLY = 2,   /* D->S: version, status, text */
	LMT_MSG_BLOCKS = 3,        /* S->D: the RAM block list */
	LMT_MSG_EP_ADDRS = 4,      /* both: one address blob per channel */
	LMT_MSG_READY = 5,         /* D->S: channels connected, pin-all done */
	LMT_MSG_REG_REQ = 6,       /* S->D: windows to register */
	LMT_MSG_REG_REPLY = 7,     /* D->S: their key blobs */
	LMT_MSG_DEVICE_STATE = 8,  /* S->D: a piece of the device state */
	LMT_MSG_COMPLETE = 9,      /* S->D: all RAM sent; digests */
	LMT_MSG_COMPLETE_ACK = 10, /* D->S: status of the load */
	LMT_MSG_ERROR = 11,        /* both: the sender failed; code and text */
	LMT_MSG_PING = 12,         /* both: keep-alive */
	LMT_MSG_PONG = 13,
	LMT_MSG_AUTH = 14, /* S->D: the source's proof of the key */
	/* S->D: bytes landed per channel so far */
	LMT_MSG_LANDED = 15,
	/* unix: targets only (docs/protocol.md, "Handover"). S->D: which
	 * blocks the source can hand over by descriptor; D->S: which of them
	 * the destination takes that way; S->D, with the descriptors attached
	 * (SCM_RIGHTS): where each block lies in its file, and a digest. */
	LMT_MSG_FD_OFFER = 16,
	LMT_MSG_FD_ACCEPT = 17,
	LMT_MSG_FD_HANDOVER = 18,
	/* postcopy=on (docs/protocol.md, "Postcopy"). S->D, guest paused: a
	 * piece of a block's bitmap of the pages still to come; then the
	 * device state, then POSTCOPY, the switch, which the destination
	 * answers with POSTCOPY_ACK and its staging slots' key. After it:
	 * D->S the pages the guest faulted on (PAGE_REQ), S->D pages landed
	 * in staging slots or zero (PAGES), D->S slots placed and free again
	 * (SLOTS_FREE), and S->D POSTCOPY_DONE once every page was sent,
	 * answered with COMPLETE_ACK. */
	LMT_MSG_POSTCOPY_PAGES = 19,
	LMT_MSG_POSTCOPY = 20,
	LMT_MSG_POSTCOPY_ACK = 21,
	LMT_MSG_PAGE_REQ = 22,
	LMT_MSG_PAGES = 23,
	LMT_MSG_SLOTS_FREE = 24,
	LMT_MSG_POSTCOPY_DONE = 25,
	/* verify=on, S->D, guest paused, every write landed: a run of one
	 * block's stripe digests, as the source holds them at the pause; the
	 * destination checks all of its RAM against them at COMPLETE */
	LMT_MSG_DIGESTS = 26,
	/* S->D: runs of pages that are all zero on the source now, which the
	 * destination makes zero (passes after the bulk one); D->S: how many
	 * ZERO messages it has applied, one answer each */
	LMT_MSG_ZERO = 27,
	LMT_MSG_ZERO_ACK = 28,
	LMT_MSG_TYPE_MAX = 28,
};

struct lmt_msg_header {
	uint16_t type;
	uint16_t flags; /* must be 0 */
	uint32_t length;
};

struct lmt_msg_option {
	char name[64];
	char value[256];
};

struct lmt_msg_hello {
	uint32_t magic;
	uint16_t version;
	char plugin[64];
	uint32_t option_count;
	struct lmt_msg_option options[LMT_PROTO_MAX_OPTIONS];
	uint8_t auth; /* 1 when the source holds a key */
	uint8_t nonce[LMT_PROTO_NONCE];
};

struct lmt_msg_status {   /* HELLO_REPLY, COMPLETE_ACK, ERROR */
	uint16_t version; /* HELLO_REPLY only */
	int32_t code;     /* 0 or a negative LMT_E* code */
	char text[LMT_PROTO_MAX_TEXT + 1];
	/* HELLO_REPLY only: the destination's challenge and proof */
	uint8_t auth;
	uint8_t nonce[LMT_PROTO_NONCE];
	uint8_t proof[LMT_PROTO_PROOF];
};

struct lmt_msg_block {
	char name[LMT_BLOCK_NAME_MAX + 1];
	uint64_t length;
	uint32_t page_size;
};

struct lmt_msg_blocks {
	uint32_t count;
	struct lmt_msg_block blocks[LMT_PROTO_MAX_BLOCKS];
};

struct lmt_msg_addrs {
	uint32_t count;
	struct lmt_blob addrs[LMT_MAX_CHANNELS];
};

struct lmt_msg_reg {
	uint32_t block;
	uint64_t offset;
	uint64_t length;
	struct lmt_blob key; /* REG_REPLY only */
};

struct lmt_msg_regs { /* REG_REQ, REG_REPLY */
	uint32_t count;
	struct lmt_msg_reg regs[LMT_PROTO_MAX_REG];
};

struct lmt_msg_state { /* DEVICE_STATE: points into the payload */
	uint64_t offset;
	uint64_t total;
	uint32_t length;
	const uint8_t *data;
};

struct lmt_msg_complete {
	uint64_t passes;
	uint64_t state_length;
	uint32_t digest_count; /* 0, or one per block */
	uint64_t digests[LMT_PROTO_MAX_BLOCKS];
};

struct lmt_msg_landed {
	uint32_t channels;
	uint64_t bytes[LMT_MAX_CHANNELS]; /* landed on each channel since setup */
};

/* The digests of stripes [first, first + count) of a block (verify.c). */
struct lmt_msg_digests {
	uint32_t block;
	uint64_t first;
	uint32_t count; /* 1 to LMT_PROTO_MAX_DIGESTS */
	uint64_t digests[LMT_PROTO_MAX_DIGESTS];
};

struct lmt_msg_fd_flags { /* FD_OFFER, FD_ACCEPT: 0 or 1 per block */
	uint32_t count;
	uint8_t flags[LMT_PROTO_MAX_BLOCKS];
};

struct lmt_msg_fd_entry {
	uint32_t block;
	uint64_t offset; /* of the block's first byte in the file */
	uint64_t digest; /* XXH3-64 of the block's sampled pages */
};

struct lmt_msg_fd_handover { /* one entry per descriptor, in their order */
	uint32_t count;
	struct lmt_msg_fd_entry entries[LMT_PROTO_MAX_BLOCKS];
};

/* POSTCOPY_PAGES: bits [first, first + 64 * words) of a block's bitmap of
 * the pages still to come, a set bit per page; points into the payload
 * (8 little-endian bytes a word). first is a multiple of 64. */
#define LMT_PROTO_MAX_BITMAP_WORDS 65536u
struct lmt_msg_pc_pages {
	uint32_t block;
	uint64_t first;
	uint32_t words;
	const uint8_t *bits;
};

struct lmt_msg_postcopy { /* POSTCOPY */
	uint64_t passes;
	uint64_t state_length;
	uint64_t pages; /* pages announced in POSTCOPY_PAGES, over every block */
};

/* POSTCOPY_ACK: the destination's answer to the switch; with code 0, its
 * staging area: `slots` slots of `slot_size` bytes each, slot i at
 * offset i * slot_size of the region of `key`; and for each block whose
 * pages are written in place (a shared file mapped a second time), the
 * key of that second mapping, offset 0 at the block's first byte. */
#define LMT_PROTO_MAX_SLOTS 4096u
struct lmt_msg_pc_alias {
	uint32_t block;
	struct lmt_blob key;
};

struct lmt_msg_pc_ack {
	int32_t code;
	char text[LMT_PROTO_MAX_TEXT + 1];
	uint32_t slot_size;
	uint32_t slots;
	struct lmt_blob key;
	uint32_t naliases; /* blocks in increasing order */
	struct lmt_msg_pc_alias aliases[LMT_PROTO_MAX_BLOCKS];
};

struct lmt_msg_page { /* a run of pages of a block */
	uint32_t block;
	uint64_t page;
	uint32_t npages;
};

#define LMT_PROTO_MAX_PAGE_REQS 256u
struct lmt_msg_page_req { /* PAGE_REQ */
	uint32_t count;
	struct lmt_msg_page pages[LMT_PROTO_MAX_PAGE_REQS];
};

/* PAGES: each entry's pages are in staging slot `slot`, from its first
 * byte, or are all zero (LMT_PROTO_ZERO_SLOT: nothing in staging), or
 * were written in place through the block's second mapping
 * (LMT_PROTO_IN_PLACE_SLOT). */
#define LMT_PROTO_ZERO_SLOT UINT32_MAX
#define LMT_PROTO_IN_PLACE_SLOT (UINT32_MAX - 1)
#define LMT_PROTO_MAX_PAGE_ENTRIES 1024u
struct lmt_msg_pc_entry {
	uint32_t slot;
	struct lmt_msg_page run;
};

struct lmt_msg_pages {
	uint32_t channels;
	uint64_t bytes[LMT_MAX_CHANNELS]; /* landed on each channel since setup */
	uint32_t count;
	struct lmt_msg_pc_entry entries[LMT_PROTO_MAX_PAGE_ENTRIES];
};

struct lmt_msg_slots { /* SLOTS_FREE */
	uint32_t count;
	uint32_t slots[LMT_PROTO_MAX_SLOTS];
};

struct lmt_msg_pc_done { /* POSTCOPY_DONE */
	uint64_t pages; /* pages sent after the switch, zero ones included */
};

/* ZERO: runs of pages the destination makes all zero. Each run is a
 * struct lmt_msg_page; which block, pages and window exist is the
 * engine's to check. On the wire a run is 16 bytes, a message 12 more. */
#define LMT_PROTO_MAX_ZERO_RUNS 1024u
#define LMT_PROTO_ZERO_RUN_SIZE 16u
#define LMT_PROTO_ZERO_OVERHEAD (LMT_PROTO_HEADER_SIZE + 4u)
struct lmt_msg_zero {
	uint32_t count; /* 1 to LMT_PROTO_MAX_ZERO_RUNS */
	struct lmt_msg_page runs[LMT_PROTO_MAX_ZERO_RUNS];
};

/* A growable output buffer; `failed` latches an allocation or size error. */
struct lmt_buf {
	uint8_t *data;
	size_t len;
	size_t cap;
	int failed;
};

void lmt__buf_free(struct lmt_buf *b);

/* Encoders: append header + payload to b (which is reset first). Return 0
 * or -LMT_ENOMEM / -LMT_EOVERFLOW. */
int lmt__enc_hello(struct lmt_buf *b, const struct lmt_msg_hello *m);
int lmt__enc_status(struct lmt_buf *b, uint16_t type, const struct lmt_msg_status *m);
int lmt__enc_blocks(struct lmt_buf *b, const struct lmt_msg_blocks *m);
int lmt__enc_addrs(struct lmt_buf *b, const struct lmt_msg_addrs *m);
int lmt__enc_regs(struct lmt_buf *b, uint16_t type, const struct lmt_msg_regs *m);
int lmt__enc_state(struct lmt_buf *b, const struct lmt_msg_state *m);
int lmt__enc_complete(struct lmt_buf *b, const struct lmt_msg_complete *m);
int lmt__enc_empty(struct lmt_buf *b, uint16_t type); /* READY, PING, PONG */
int lmt__enc_auth(struct lmt_buf *b, const uint8_t proof[LMT_PROTO_PROOF]);
int lmt__enc_landed(struct lmt_buf *b, const struct lmt_msg_landed *m);
int lmt__enc_digests(struct lmt_buf *b, const struct lmt_msg_digests *m);
int lmt__enc_fd_flags(struct lmt_buf *b, uint16_t type, const struct lmt_msg_fd_flags *m);
int lmt__enc_fd_handover(struct lmt_buf *b, const struct lmt_msg_fd_handover *m);
int lmt__enc_pc_pages(struct lmt_buf *b, const struct lmt_msg_pc_pages *m);
int lmt__enc_postcopy(struct lmt_buf *b, const struct lmt_msg_postcopy *m);
int lmt__enc_pc_ack(struct lmt_buf *b, const struct lmt_msg_pc_ack *m);
int lmt__enc_page_req(struct lmt_buf *b, const struct lmt_msg_page_req *m);
int lmt__enc_pages(struct lmt_buf *b, const struct lmt_msg_pages *m);
int lmt__enc_slots(struct lmt_buf *b, const struct lmt_msg_slots *m);
int lmt__enc_pc_done(struct lmt_buf *b, const struct lmt_msg_pc_done *m);
int lmt__enc_zero(struct lmt_buf *b, const struct lmt_msg_zero *m);
/* ZERO_ACK: the ZERO messages applied since setup. */
int lmt__enc_zero_ack(struct lmt_buf *b, uint64_t applied);

/* Decode the fixed header; rejects unknown types, non-zero flags and
 * lengths above LMT_PROTO_MAX_PAYLOAD. */
int lmt__dec_header(const uint8_t *p, size_t len, struct lmt_msg_header *h, struct lmt_error *err);

/* Decoders of payloads. Each checks lengths, counts, string contents and
 * that nothing is left over; the message names what was wrong. */
int lmt__dec_hello(const uint8_t *p, size_t len, struct lmt_msg_hello *m, struct lmt_error *err);
int lmt__dec_status(const uint8_t *p, size_t len, uint16_t type, struct lmt_msg_status *m,
                    struct lmt_error *err);
int lmt__dec_blocks(const uint8_t *p, size_t len, struct lmt_msg_blocks *m, struct lmt_error *err);
int lmt__dec_addrs(const uint8_t *p, size_t len, struct lmt_msg_addrs *m, struct lmt_error *err);
int lmt__dec_regs(const uint8_t *p, size_t len, uint16_t type, struct lmt_msg_regs *m,
                  struct lmt_error *err);
int lmt__dec_state(const uint8_t *p, size_t len, struct lmt_msg_state *m, struct lmt_error *err);
int lmt__dec_complete(const uint8_t *p, size_t len, struct lmt_msg_complete *m,
                      struct lmt_error *err);
int lmt__dec_empty(const uint8_t *p, size_t len, uint16_t type, struct lmt_error *err);
int lmt__dec_auth(const uint8_t *p, size_t len, uint8_t proof[LMT_PROTO_PROOF],
                  struct lmt_error *err);
int lmt__dec_landed(const uint8_t *p, size_t len, struct lmt_msg_landed *m, struct lmt_error *err);
/* Which block and stripes exist is the engine's to check. */
int lmt__dec_digests(const uint8_t *p, size_t len, struct lmt_msg_digests *m,
                     struct lmt_error *err);
int lmt__dec_fd_flags(const uint8_t *p, size_t len, uint16_t type, struct lmt_msg_fd_flags *m,
                      struct lmt_error *err);
int lmt__dec_fd_handover(const uint8_t *p, size_t len, struct lmt_msg_fd_handover *m,
                         struct lmt_error *err);
/* Postcopy's: runs and slots are checked for what needs no session (a
 * run of at least one page that does not wrap, a slot below
 * LMT_PROTO_MAX_SLOTS or the zero slot); the engines check them against
 * the blocks and the staging area. */
int lmt__dec_pc_pages(const uint8_t *p, size_t len, struct lmt_msg_pc_pages *m,
                      struct lmt_error *err);
int lmt__dec_postcopy(const uint8_t *p, size_t len, struct lmt_msg_postcopy *m,
                      struct lmt_error *err);
int lmt__dec_pc_ack(const uint8_t *p, size_t len, struct lmt_msg_pc_ack *m, struct lmt_error *err);
int lmt__dec_page_req(const uint8_t *p, size_t len, struct lmt_msg_page_req *m,
                      struct lmt_error *err);
int lmt__dec_pages(const uint8_t *p, size_t len, struct lmt_msg_pages *m, struct lmt_error *err);
int lmt__dec_slots(const uint8_t *p, size_t len, struct lmt_msg_slots *m, struct lmt_error *err);
int lmt__dec_pc_done(const uint8_t *p, size_t len, struct lmt_msg_pc_done *m,
                     struct lmt_error *err);
/* At least one run, each of at least one page that does not wrap. */
int lmt__dec_zero(const uint8_t *p, size_t len, struct lmt_msg_zero *m, struct lmt_error *err);
int lmt__dec_zero_ack(const uint8_t *p, size_t len, uint64_t *applied, struct lmt_error *err);

const char *lmt__msg_name(uint16_t type);

#endif
