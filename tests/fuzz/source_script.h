/* The input of fuzz_source: what the fake destination does, shared with
 * make-seeds so that the seeds are real sessions. Byte 0 is a set of
 * SRC_F_* flags; then a script of operations, each an SRC_OP_* byte
 * (modulo SRC_OP_COUNT) and the bytes it takes. An operation that runs out
 * of input takes zeros. */
#ifndef LMT_FUZZ_SOURCE_SCRIPT_H
#define LMT_FUZZ_SOURCE_SCRIPT_H

enum src_flag {
	SRC_F_PIN_ALL = 1,  /* pin-all=on */
	SRC_F_VERIFY = 2,   /* verify=on */
	SRC_F_AUTH = 4,     /* the source holds auth-key */
	SRC_F_CHANNELS = 8, /* channels=2, else 1 */
	SRC_F_NO_ACK = 16,  /* the data side acknowledges only what SRC_OP_ACK says */
	/* bits 5-6: lmt_save_iterate calls before the pause, 0-3 */
	SRC_F_ITERATE_SHIFT = 5,
	SRC_F_ITERATE_MASK = 3,
	/* postcopy=on (and verify=off: SRC_F_VERIFY then means postcopy-after=1
	 * and the pause is lmt_save_complete, which switches when the passes
	 * did not converge); the pause is lmt_save_postcopy otherwise; then
	 * lmt_save_finish. The session has one channel more, for faults. */
	SRC_F_POSTCOPY = 128,
};

enum src_op {
	/* type: read the source's messages (answering PINGs) until one of
	 * `type % 32` arrives (0: any), it hangs up, or a short wait ends */
	SRC_OP_EXPECT,
	/* flags: a HELLO_REPLY to the source's HELLO (read first if it was not
	 * yet), accepting it with the right proof; flags 1 another version
	 * (u16), 2 a status (u8: its negated code), 4 the other auth flag,
	 * 8 a wrong proof */
	SRC_OP_HELLO_REPLY,
	/* count (u8, 0: one per channel), then per blob: kind (u8) — 0 a
	 * valid tcp address for the blob's channel, 1 that with a byte
	 * changed (u8 position, u8 xor), 2 raw (u8 length, bytes), 3 valid
	 * for channel u8 — and a token (u64). A 40-byte blob always points at
	 * the harness's data listener. */
	SRC_OP_ADDRS,
	/* mutation (u8): a REG_REPLY with tcp keys for the windows of the
	 * last REG_REQ read (for every block, pin-all style, when none was);
	 * mutations: 1 key one byte short, 2 key a page long, 3 offset a page
	 * on, 4 the next block, 5 one raw key (u8 length, bytes), 6 an entry
	 * twice, 7 the last entry dropped */
	SRC_OP_KEYS,
	SRC_OP_READY,
	/* code (u8): COMPLETE_ACK with status -code */
	SRC_OP_COMPLETE_ACK,
	/* type (u8), length (u16, at most what is left), payload: a framed
	 * message; EP_ADDRS is pointed at the data listener as SRC_OP_ADDRS */
	SRC_OP_MSG,
	/* length (u8), bytes: sent as they are on the control connection */
	SRC_OP_RAW,
	/* channel (u8), kind (u8: 0 ACK, 1 BYE, 2 ERROR, 3 magic u32),
	 * count (u8: high bit set, a u64 follows; else writes received + the
	 * value's low 3 bits - 2), code (u8): an acknowledgement record */
	SRC_OP_ACK,
	/* code (u8), length (u8), text: an ERROR */
	SRC_OP_ERROR,
	/* ms (u8 % 20): wait */
	SRC_OP_PAUSE,
	/* status (u8: 0 accepts, else a refusal with that code, negated),
	 * slots (u8: 0 for 256, else 2 + value % 255), size (u8 % 3: 4, 16
	 * or 64 KiB), key (u8 % 3: 0 a tcp key for the whole staging area,
	 * 1 that a byte short, 2 raw: u8 length, bytes): POSTCOPY_ACK to the
	 * source's POSTCOPY (read first when it was not yet) */
	SRC_OP_PC_ACK,
	/* block (u8 % 4: 2 and 3 do not exist), page (u16), pages (u8): a
	 * PAGE_REQ, as a fault on the destination sends it */
	SRC_OP_PAGE_REQ,
	/* mode (u8 % 3): SLOTS_FREE for every slot PAGES named and that was
	 * not freed yet (none: nothing is sent); that with its first slot
	 * twice; one slot (u16) */
	SRC_OP_SLOTS_FREE,
	SRC_OP_COUNT,
};

#endif
