/* libFuzzer harness: the control-message decoders. The first byte picks
 * the decoder; the rest is its input (a header for type 0). */
#include <stdint.h>
#include <stdlib.h>

#include "proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

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
	case LMT_MSG_FD_OFFER:
	case LMT_MSG_FD_ACCEPT:
		lmt__dec_fd_flags(p, n, pick, &flags, &err);
		break;
	case LMT_MSG_FD_HANDOVER:
		lmt__dec_fd_handover(p, n, &handover, &err);
		break;
	default:
		lmt__dec_empty(p, n, pick, &err);
		break;
	}
	return 0;
}
