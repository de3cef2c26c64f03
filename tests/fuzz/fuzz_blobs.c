/* libFuzzer harness: the address and key blob parsers of the plugins,
 * which read what the peer sent over the network. The first byte picks
 * the parser. */
#include <stdint.h>
#include <string.h>

#include "../../plugins/ofi/wire.h"
#include "../../plugins/tcp/wire.h"
#include "../../plugins/ucx/wire.h"
#include "../../plugins/verbs/wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1 || size - 1 > LMT_BLOB_MAX)
		return 0;
	struct lmt_blob b = {.len = (uint32_t)(size - 1)};
	memcpy(b.data, data + 1, size - 1);
	struct tcp_dst_addr dst;
	struct tcp_key tkey;
	struct verbs_addr vaddr;
	struct verbs_key vkey;
	uint32_t channel;
	struct ucx_addr uaddr;
	struct ucx_key ukey;
	struct ucx_write uwrite;
	struct ucx_note unote;
	struct lfi_addr oaddr;
	struct lfi_key_blob okey;
	switch (data[0] % 11) {
	case 0:
		tcp_dst_addr_decode(&b, &dst);
		break;
	case 1:
		tcp_src_addr_decode(&b, &channel);
		break;
	case 2:
		tcp_key_decode(&b, &tkey);
		break;
	case 3:
		verbs_addr_decode(&b, &vaddr);
		break;
	case 4:
		verbs_key_decode(&b, &vkey);
		break;
	case 5:
		ucx_addr_decode(&b, data[0] & 16 ? UCX_MAGIC_SRC_ADDR : UCX_MAGIC_DST_ADDR, &uaddr);
		break;
	case 6:
		ucx_key_decode(&b, &ukey);
		break;
	case 7: /* the header of an active-message write, from the peer */
		ucx_write_decode(b.data, b.len, &uwrite);
		break;
	case 8:
		ucx_note_decode(b.data, b.len, &unote);
		break;
	case 9:
		lfi_addr_decode(&b, &oaddr);
		break;
	default:
		lfi_key_decode(&b, &okey);
		break;
	}
	return 0;
}
