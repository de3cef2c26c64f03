/* libFuzzer harness: the control-message decoders. The first byte picks
 * the decoder; the rest is its input (a header for type 0). Postcopy's
 * messages (19-25) and the zero runs' (27, 28) are also encoded again
 * once decoded: the bytes must be
 * the input's, so that nothing a decoder accepts means two things, and
 * what a decoder hands on must keep the rules it promises. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A decoded message encoded again must be the input, byte for byte. */
static void same_bytes(int rc, struct lmt_buf *b, const uint8_t *p, size_t n)
{
	if (rc || b->len != LMT_PROTO_HEADER_SIZE + n ||
	    memcmp(b->data + LMT_PROTO_HEADER_SIZE, p, n))
		abort();
}

static void run_ok(const struct lmt_msg_page *g)
{
	if (g->npages == 0 || g->page > UINT64_MAX - g->npages)
		abort();
}

/* ZERO and ZERO_ACK: what decodes encodes again to the same bytes, and
 * a ZERO has 1 to LMT_PROTO_MAX_ZERO_RUNS runs that do not wrap. */
static void zero_runs(uint8_t pick, const uint8_t *p, size_t n)
{
	static struct lmt_msg_zero zero;
	struct lmt_buf b = {0};
	struct lmt_error err;
	uint64_t applied;
	if (pick == LMT_MSG_ZERO_ACK) {
		if (!lmt__dec_zero_ack(p, n, &applied, &err))
			same_bytes(lmt__enc_zero_ack(&b, applied), &b, p, n);
	} else if (!lmt__dec_zero(p, n, &zero, &err)) {
		if (zero.count == 0 || zero.count > LMT_PROTO_MAX_ZERO_RUNS)
			abort();
		for (uint32_t i = 0; i < zero.count; i++)
			run_ok(&zero.runs[i]);
		same_bytes(lmt__enc_zero(&b, &zero), &b, p, n);
	}
	lmt__buf_free(&b);
}

static void postcopy(uint8_t pick, const uint8_t *p, size_t n)
{
	static struct lmt_msg_page_req req;
	static struct lmt_msg_pages pages;
	static struct lmt_msg_slots slots;
	static struct lmt_msg_pc_ack ack;
	struct lmt_msg_pc_pages bitmap;
	struct lmt_msg_postcopy sw;
	struct lmt_msg_pc_done done;
	struct lmt_buf b = {0};
	struct lmt_error err;
	switch (pick) {
	case LMT_MSG_POSTCOPY_PAGES:
		if (lmt__dec_pc_pages(p, n, &bitmap, &err))
			break;
		if (bitmap.words == 0 || bitmap.words > LMT_PROTO_MAX_BITMAP_WORDS ||
		    bitmap.first % 64 || bitmap.bits < p ||
		    bitmap.bits + (size_t)bitmap.words * 8 > p + n)
			abort();
		same_bytes(lmt__enc_pc_pages(&b, &bitmap), &b, p, n);
		break;
	case LMT_MSG_POSTCOPY:
		if (!lmt__dec_postcopy(p, n, &sw, &err))
			same_bytes(lmt__enc_postcopy(&b, &sw), &b, p, n);
		break;
	case LMT_MSG_POSTCOPY_ACK:
		if (lmt__dec_pc_ack(p, n, &ack, &err))
			break;
		if (ack.code > 0 || ack.code <= -LMT_ERRC_COUNT ||
		    (ack.code == 0 &&
		     (ack.slots < 2 || ack.slots > LMT_PROTO_MAX_SLOTS || ack.slot_size < 4096 ||
		      ack.slot_size % 4096 || ack.slot_size > (64u << 20) || ack.key.len == 0 ||
		      ack.naliases > LMT_PROTO_MAX_BLOCKS)))
			abort();
		for (uint32_t i = 1; ack.code == 0 && i < ack.naliases; i++)
			if (ack.aliases[i].block <= ack.aliases[i - 1].block)
				abort();
		same_bytes(lmt__enc_pc_ack(&b, &ack), &b, p, n);
		break;
	case LMT_MSG_PAGE_REQ:
		if (lmt__dec_page_req(p, n, &req, &err))
			break;
		if (req.count == 0 || req.count > LMT_PROTO_MAX_PAGE_REQS)
			abort();
		for (uint32_t i = 0; i < req.count; i++)
			run_ok(&req.pages[i]);
		same_bytes(lmt__enc_page_req(&b, &req), &b, p, n);
		break;
	case LMT_MSG_PAGES:
		if (lmt__dec_pages(p, n, &pages, &err))
			break;
		if (pages.channels > LMT_MAX_CHANNELS || pages.count > LMT_PROTO_MAX_PAGE_ENTRIES)
			abort();
		for (uint32_t i = 0; i < pages.count; i++) {
			uint32_t slot = pages.entries[i].slot;
			if (slot != LMT_PROTO_ZERO_SLOT && slot != LMT_PROTO_IN_PLACE_SLOT &&
			    slot >= LMT_PROTO_MAX_SLOTS)
				abort();
			run_ok(&pages.entries[i].run);
		}
		same_bytes(lmt__enc_pages(&b, &pages), &b, p, n);
		break;
	case LMT_MSG_SLOTS_FREE:
		if (lmt__dec_slots(p, n, &slots, &err))
			break;
		if (slots.count == 0 || slots.count > LMT_PROTO_MAX_SLOTS)
			abort();
		for (uint32_t i = 0; i < slots.count; i++)
			if (slots.slots[i] >= LMT_PROTO_MAX_SLOTS)
				abort();
		same_bytes(lmt__enc_slots(&b, &slots), &b, p, n);
		break;
	default: /* LMT_MSG_POSTCOPY_DONE */
		if (!lmt__dec_pc_done(p, n, &done, &err))
			same_bytes(lmt__enc_pc_done(&b, &done), &b, p, n);
		break;
	}
	lmt__buf_free(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	uint8_t pick = data[0] % (LMT_MSG_TYPE_MAX + 1);
	const uint8_t *p = data + 1;
	size_t n = size - 1;
	struct lmt_error err;
	static struct lmt_msg_hello hello;
	static struct lmt_msg_blocks blocks;
	static struct lmt_msg_addrs addrs;
	static struct lmt_msg_regs regs;
	static struct lmt_msg_complete complete;
	static struct lmt_msg_landed landed;
	static struct lmt_msg_digests digests;
	static struct lmt_msg_fd_flags flags;
	static struct lmt_msg_fd_handover handover;
	struct lmt_msg_status status;
	struct lmt_msg_state state;
	struct lmt_msg_header header;
	uint8_t proof[LMT_PROTO_PROOF];
	switch (pick) {
	case 0:
		lmt__dec_header(p, n, &header, &err);
		break;
	case LMT_MSG_HELLO:
		lmt__dec_hello(p, n, &hello, &err);
		break;
	case LMT_MSG_HELLO_REPLY:
	case LMT_MSG_COMPLETE_ACK:
	case LMT_MSG_ERROR:
		lmt__dec_status(p, n, pick, &status, &err);
		break;
	case LMT_MSG_BLOCKS:
		lmt__dec_blocks(p, n, &blocks, &err);
		break;
	case LMT_MSG_EP_ADDRS:
		lmt__dec_addrs(p, n, &addrs, &err);
		break;
	case LMT_MSG_REG_REQ:
	case LMT_MSG_REG_REPLY:
		lmt__dec_regs(p, n, pick, &regs, &err);
		break;
	case LMT_MSG_DEVICE_STATE:
		if (lmt__dec_state(p, n, &state, &err) == 0 && state.length &&
		    (state.data < p || state.data + state.length > p + n))
			abort(); /* a decoded piece must lie inside the input */
		break;
	case LMT_MSG_COMPLETE:
		lmt__dec_complete(p, n, &complete, &err);
		break;
	case LMT_MSG_AUTH:
		lmt__dec_auth(p, n, proof, &err);
		break;
	case LMT_MSG_LANDED:
		lmt__dec_landed(p, n, &landed, &err);
		break;
	case LMT_MSG_DIGESTS:
		if (lmt__dec_digests(p, n, &digests, &err) == 0 &&
		    (digests.count == 0 || digests.count > LMT_PROTO_MAX_DIGESTS))
			abort(); /* a decoded run has 1 to LMT_PROTO_MAX_DIGESTS digests */
		break;
	case LMT_MSG_FD_OFFER:
	case LMT_MSG_FD_ACCEPT:
		lmt__dec_fd_flags(p, n, pick, &flags, &err);
		break;
	case LMT_MSG_FD_HANDOVER:
		lmt__dec_fd_handover(p, n, &handover, &err);
		break;
	case LMT_MSG_POSTCOPY_PAGES:
	case LMT_MSG_POSTCOPY:
	case LMT_MSG_POSTCOPY_ACK:
	case LMT_MSG_PAGE_REQ:
	case LMT_MSG_PAGES:
	case LMT_MSG_SLOTS_FREE:
	case LMT_MSG_POSTCOPY_DONE:
		postcopy(pick, p, n);
		break;
	case LMT_MSG_ZERO:
	case LMT_MSG_ZERO_ACK:
		zero_runs(pick, p, n);
		break;
	default:
		lmt__dec_empty(p, n, pick, &err);
		break;
	}
	return 0;
}
