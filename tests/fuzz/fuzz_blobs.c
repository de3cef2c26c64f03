/* libFuzzer harness: the address and key blob parsers of the plugins,
 * which read what the peer sent over the network. The first byte picks
 * the parser. */
#include <stdint.h>
#include <string.h>

#include "../../plugins/tcp/wire.h"
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
	switch (data[0] % 5) {
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
	default:
		verbs_key_decode(&b, &vkey);
		break;
	}
	return 0;
}
