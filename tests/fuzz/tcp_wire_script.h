/* The input of fuzz_tcp_wire, shared with make-seeds. Byte 0 picks the
 * side under test (bit 0: 0 the destination's receiver, 1 the source's
 * acknowledgement reader); then a script of operations, each an op byte
 * (modulo the side's count) and the bytes it takes. An operation that runs
 * out of input takes zeros. */
#ifndef LMT_FUZZ_TCP_WIRE_SCRIPT_H
#define LMT_FUZZ_TCP_WIRE_SCRIPT_H

/* What the fake source sends on the destination's data port. */
enum wire_rx_op {
	WIRE_RX_HELLO, /* the right hello: channel 0, the endpoint's token */
	/* kind (u8): 0 a wrong token (u8 xor, made odd), 1 another channel
	 * (u8), 2 another version (u16), 3 24 raw bytes */
	WIRE_RX_BAD_HELLO,
	/* flags (u8), region (u8: 0 and 1 the live regions, 2 the one
	 * deregistered, 3 a raw id (u64), 4 live region 0's id + 1), offset
	 * (u16, or u64 with flag 2), length (u16, or u64 with flag 4),
	 * sequence (next, or u64 with flag 8), magic (WRITE, or u32 with flag
	 * 32), payload seed (u8); the payload is `length` bytes (at most
	 * 64 KiB), or with flag 16 a u16 count of them */
	WIRE_RX_WRITE,
	/* sequence (u8: 0 the next, else a u64 follows): a BYE header */
	WIRE_RX_BYE,
	WIRE_RX_RAW,   /* length (u8), bytes */
	WIRE_RX_SPLIT, /* what came before goes in its own send, then 1 ms */
	WIRE_RX_COUNT,
};

/* The source's writes (count u8, each of length u16), then what the fake
 * destination answers on the data connection. */
enum wire_tx_op {
	/* count (u8: high bit set, a u64 follows; else the value modulo
	 * writes + 3): ACK records count writes placed, cumulatively */
	WIRE_TX_ACK,
	WIRE_TX_BYE,   /* count as ACK: the destination's orderly close */
	WIRE_TX_ERROR, /* code (u32): the destination failed the channel */
	WIRE_TX_MAGIC, /* magic (u32), count (u64) */
	WIRE_TX_RAW,   /* length (u8), bytes */
	WIRE_TX_SPLIT, /* as WIRE_RX_SPLIT */
	WIRE_TX_COUNT,
};

#endif
