/* Control-message codec tests: every message round-trips, and malformed
 * input of every kind is refused with a message naming what was wrong. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "proto.h"

static struct lmt_buf buf;
static struct lmt_error err;

static int teardown(void **state)
{
	lmt__buf_free(&buf);
	memset(&err, 0, sizeof(err));
	return 0;
}

/* The payload of what was encoded, after checking its header. */
static const uint8_t *payload(uint16_t type, size_t *len)
{
	struct lmt_msg_header h;
	assert_int_equal(lmt__dec_header(buf.data, buf.len, &h, &err), 0);
	assert_int_equal(h.type, type);
	assert_int_equal(h.length, buf.len - LMT_PROTO_HEADER_SIZE);
	*len = h.length;
	return buf.data + LMT_PROTO_HEADER_SIZE;
}

static void test_hello_round_trips(void **state)
{
	struct lmt_msg_hello in = {
	        .magic = LMT_PROTO_MAGIC, .version = LMT_PROTO_VERSION, .option_count = 2};
	strcpy(in.plugin, "tcp");
	strcpy(in.options[0].name, "chunk-size");
	strcpy(in.options[0].value, "1M");
	strcpy(in.options[1].name, "channels");
	strcpy(in.options[1].value, "2");
	assert_int_equal(lmt__enc_hello(&buf, &in), 0);
	size_t len;
	const uint8_t *p = payload(LMT_MSG_HELLO, &len);
	struct lmt_msg_hello *out = malloc(sizeof(*out));
	assert_int_equal(lmt__dec_hello(p, len, out, &err), 0);
	assert_string_equal(out->plugin, "tcp");
	assert_int_equal(out->option_count, 2);
	assert_string_equal(out->options[1].name, "channels");
	assert_string_equal(out->options[1].value, "2");
	free(out);
}

static void test_hello_with_bad_magic_is_refused(void **state)
{
	struct lmt_msg_hello in = {.magic = 0x12345678, .version = 1};
	assert_int_equal(lmt__enc_hello(&buf, &in), 0);
	size_t len;
	const uint8_t *p = payload(LMT_MSG_HELLO, &len);
	struct lmt_msg_hello *out = malloc(sizeof(*out));
	assert_int_equal(lmt__dec_hello(p, len, out, &err), -LMT_EPROTO);
	assert_string_equal(err.message, "HELLO message: bad magic (not an lmt peer)");
	free(out);
}

static void test_hello_of_another_version_decodes_only_the_version(void **state)
{
	struct lmt_msg_hello in = {.magic = LMT_PROTO_MAGIC, .version = 7, .option_count = 1};
	strcpy(in.plugin, "x");
	assert_int_equal(lmt__enc_hello(&buf, &in), 0);
	size_t len;
	const uint8_t *p = payload(LMT_MSG_HELLO, &len);
	struct lmt_msg_hello *out = malloc(sizeof(*out));
	assert_int_equal(lmt__dec_hello(p, len, out, &err), 0);
	assert_int_equal(out->version, 7);
	assert_int_equal(out->option_count, 0);
	free(out);
}

static void test_truncated_messages_are_refused_at_every_length(void **state)
{
	struct lmt_msg_blocks *in = calloc(1, sizeof(*in));
	in->count = 2;
	strcpy(in->blocks[0].name, "ram0");
	in->blocks[0].length = 1 << 20;
	in->blocks[0].page_size = 4096;
	strcpy(in->blocks[1].name, "ram1");
	in->blocks[1].length = 1 << 21;
	in->blocks[1].page_size = 4096;
	assert_int_equal(lmt__enc_blocks(&buf, in), 0);
	size_t len;
	const uint8_t *p = payload(LMT_MSG_BLOCKS, &len);
	struct lmt_msg_blocks *out = malloc(sizeof(*out));
	for (size_t cut = 0; cut < len; cut++)
		assert_int_equal(lmt__dec_blocks(p, cut, out, &err), -LMT_EPROTO);
	assert_int_equal(lmt__dec_blocks(p, len, out, &err), 0);
	assert_int_equal(out->blocks[1].length, 1 << 21);
	assert_string_equal(out->blocks[1].name, "ram1");
	free(in);
	free(out);
}

static void test_trailing_bytes_are_refused(void **state)
{
	assert_int_equal(lmt__enc_empty(&buf, LMT_MSG_READY), 0);
	uint8_t extra[1] = {0};
	assert_int_equal(lmt__dec_empty(extra, 1, LMT_MSG_READY, &err), -LMT_EPROTO);
	assert_string_equal(err.message, "READY message: trailing bytes");
}

static void test_header_rejects_unknown_type(void **state)
{
	uint8_t h[8] = {99, 0, 0, 0, 0, 0, 0, 0};
	struct lmt_msg_header out;
	assert_int_equal(lmt__dec_header(h, 8, &out, &err), -LMT_EPROTO);
	assert_string_equal(err.message, "control message: unknown type 99");
}

static void test_header_rejects_huge_length(void **state)
{
	uint8_t h[8] = {LMT_MSG_BLOCKS, 0, 0, 0, 0xff, 0xff, 0xff, 0xff};
	struct lmt_msg_header out;
	assert_int_equal(lmt__dec_header(h, 8, &out, &err), -LMT_EPROTO);
	assert_non_null(strstr(err.message, "length 4294967295 over the limit"));
}

static void test_header_rejects_flags_and_truncation(void **state)
{
	uint8_t h[8] = {LMT_MSG_PING, 0, 1, 0, 0, 0, 0, 0};
	struct lmt_msg_header out;
	assert_int_equal(lmt__dec_header(h, 8, &out, &err), -LMT_EPROTO);
	assert_int_equal(lmt__dec_header(h, 7, &out, &err), -LMT_EPROTO);
	assert_string_equal(err.message, "control message: truncated header");
}

static void test_block_count_over_the_limit_is_refused(void **state)
{
	uint8_t p[4] = {0xff, 0xff, 0, 0};
	struct lmt_msg_blocks *out = malloc(sizeof(*out));
	assert_int_equal(lmt__dec_blocks(p, 4, out, &err), -LMT_EPROTO);
	assert_string_equal(err.message, "BLOCKS message: too many blocks");
	free(out);
}

static void test_string_with_control_characters_is_refused(void **state)
{
	uint8_t p[] = {1, 0, 0, 0, 3, 0, 'a', '\n', 'b', 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
	struct lmt_msg_blocks *out = malloc(sizeof(*out));
	assert_int_equal(lmt__dec_blocks(p, sizeof(p), out, &err), -LMT_EPROTO);
	assert_string_equal(err.message, "BLOCKS message: bad block name");
	free(out);
}

static void test_regs_round_trip_with_keys(void **state)
{
	struct lmt_msg_regs *in = calloc(1, sizeof(*in));
	in->count = 2;
	in->regs[1] = (struct lmt_msg_reg){.block = 3, .offset = 1 << 20, .length = 4096};
	in->regs[0].key.len = 1;
	in->regs[1].key.len = 5;
	memcpy(in->regs[1].key.data, "abcde", 5);
	assert_int_equal(lmt__enc_regs(&buf, LMT_MSG_REG_REPLY, in), 0);
	size_t len;
	const uint8_t *p = payload(LMT_MSG_REG_REPLY, &len);
	struct lmt_msg_regs *out = malloc(sizeof(*out));
	assert_int_equal(lmt__dec_regs(p, len, LMT_MSG_REG_REPLY, out, &err), 0);
	assert_int_equal(out->regs[1].block, 3);
	assert_int_equal(out->regs[1].offset, 1 << 20);
	assert_int_equal(out->regs[1].key.len, 5);
	assert_memory_equal(out->regs[1].key.data, "abcde", 5);
	free(in);
	free(out);
}

static void test_empty_key_blob_is_refused(void **state)
{
	struct lmt_msg_regs *in = calloc(1, sizeof(*in));
	in->count = 1;
	assert_int_equal(lmt__enc_regs(&buf, LMT_MSG_REG_REPLY, in), 0);
	size_t len;
	const uint8_t *p = payload(LMT_MSG_REG_REPLY, &len);
	struct lmt_msg_regs *out = malloc(sizeof(*out));
	assert_int_equal(lmt__dec_regs(p, len, LMT_MSG_REG_REPLY, out, &err), -LMT_EPROTO);
	assert_string_equal(err.message, "REG_REPLY message: bad key blob");
	free(in);
	free(out);
}

static void test_device_state_piece_outside_the_total_is_refused(void **state)
{
	uint8_t data[16] = {0};
	struct lmt_msg_state in = {.offset = 8, .total = 16, .length = 16, .data = data};
	assert_int_equal(lmt__enc_state(&buf, &in), 0);
	size_t len;
	const uint8_t *p = payload(LMT_MSG_DEVICE_STATE, &len);
	struct lmt_msg_state out;
	assert_int_equal(lmt__dec_state(p, len, &out, &err), -LMT_EPROTO);
	assert_string_equal(err.message, "DEVICE_STATE message: chunk outside the device state");
}

static void test_device_state_round_trips(void **state)
{
	uint8_t data[5] = {1, 2, 3, 4, 5};
	struct lmt_msg_state in = {.offset = 10, .total = 15, .length = 5, .data = data};
	assert_int_equal(lmt__enc_state(&buf, &in), 0);
	size_t len;
	const uint8_t *p = payload(LMT_MSG_DEVICE_STATE, &len);
	struct lmt_msg_state out;
	assert_int_equal(lmt__dec_state(p, len, &out, &err), 0);
	assert_int_equal(out.offset, 10);
	assert_memory_equal(out.data, data, 5);
}

static void test_status_code_out_of_range_is_refused(void **state)
{
	struct lmt_msg_status in = {.code = 5};
	assert_int_equal(lmt__enc_status(&buf, LMT_MSG_ERROR, &in), 0);
	size_t len;
	const uint8_t *p = payload(LMT_MSG_ERROR, &len);
	struct lmt_msg_status out;
	assert_int_equal(lmt__dec_status(p, len, LMT_MSG_ERROR, &out, &err), -LMT_EPROTO);
	assert_string_equal(err.message, "ERROR message: status code out of range");
}

static void test_complete_round_trips_digests(void **state)
{
	struct lmt_msg_complete *in = calloc(1, sizeof(*in));
	in->passes = 3;
	in->state_length = 4096;
	in->digest_count = 2;
	in->digests[1] = 0xfeedfacecafebeefull;
	assert_int_equal(lmt__enc_complete(&buf, in), 0);
	size_t len;
	const uint8_t *p = payload(LMT_MSG_COMPLETE, &len);
	struct lmt_msg_complete *out = malloc(sizeof(*out));
	assert_int_equal(lmt__dec_complete(p, len, out, &err), 0);
	assert_int_equal(out->passes, 3);
	assert_int_equal(out->digests[1], 0xfeedfacecafebeefull);
	free(in);
	free(out);
}

static void test_landed_round_trips_the_bytes_of_each_channel(void **state)
{
	struct lmt_msg_landed in = {.channels = 2, .bytes = {7, 5ull << 30}}, out;
	assert_int_equal(lmt__enc_landed(&buf, &in), 0);
	size_t len;
	const uint8_t *p = payload(LMT_MSG_LANDED, &len);
	assert_int_equal(len, 4 + 2 * 8);
	assert_int_equal(lmt__dec_landed(p, len, &out, &err), 0);
	assert_int_equal(out.channels, 2);
	assert_int_equal(out.bytes[0], 7);
	assert_int_equal(out.bytes[1], 5ull << 30);
	/* Version 2's stripe ranges after the counts are trailing bytes now. */
	uint8_t longer[64] = {0};
	memcpy(longer, p, len);
	longer[len] = 1;
	assert_int_equal(lmt__dec_landed(longer, len + 4, &out, &err), -LMT_EPROTO);
	assert_string_equal(err.message, "LANDED message: trailing bytes");
	in.channels = LMT_MAX_CHANNELS + 1;
	assert_int_equal(lmt__enc_landed(&buf, &in), -LMT_EOVERFLOW);
}

static void test_digests_round_trip_and_refuse_none_or_too_many(void **state)
{
	struct lmt_msg_digests *in = calloc(1, sizeof(*in));
	struct lmt_msg_digests *out = malloc(sizeof(*out));
	*in = (struct lmt_msg_digests){.block = 3, .first = 1ull << 33, .count = 3};
	in->digests[0] = 1;
	in->digests[2] = 0xfeedfacecafebeefull;
	assert_int_equal(lmt__enc_digests(&buf, in), 0);
	size_t len;
	const uint8_t *p = payload(LMT_MSG_DIGESTS, &len);
	assert_int_equal(lmt__dec_digests(p, len, out, &err), 0);
	assert_int_equal(out->block, 3);
	assert_int_equal(out->first, 1ull << 33);
	assert_int_equal(out->count, 3);
	assert_int_equal(out->digests[0], 1);
	assert_int_equal(out->digests[2], 0xfeedfacecafebeefull);
	assert_int_equal(lmt__dec_digests(p, len - 1, out, &err), -LMT_EPROTO);
	assert_string_equal(err.message, "DIGESTS message: truncated digest");
	/* The count as written on the wire: 0, and one over the limit. */
	uint8_t raw[16] = {0};
	assert_int_equal(lmt__dec_digests(raw, sizeof(raw), out, &err), -LMT_EPROTO);
	assert_string_equal(err.message, "DIGESTS message: no digests");
	raw[12] = 1;
	raw[14] = 1; /* 65537 */
	assert_int_equal(lmt__dec_digests(raw, sizeof(raw), out, &err), -LMT_EPROTO);
	assert_string_equal(err.message, "DIGESTS message: too many digests");
	in->count = 0;
	assert_int_equal(lmt__enc_digests(&buf, in), -LMT_EOVERFLOW);
	in->count = LMT_PROTO_MAX_DIGESTS + 1;
	assert_int_equal(lmt__enc_digests(&buf, in), -LMT_EOVERFLOW);
	in->count = LMT_PROTO_MAX_DIGESTS; /* the largest fits a payload */
	assert_int_equal(lmt__enc_digests(&buf, in), 0);
	free(in);
	free(out);
}

static void test_zero_runs_round_trip_and_refuse_none_too_many_or_wrapping(void **state)
{
	struct lmt_msg_zero *in = calloc(1, sizeof(*in));
	struct lmt_msg_zero *out = malloc(sizeof(*out));
	in->count = 2;
	in->runs[0] = (struct lmt_msg_page){.block = 1, .page = 1ull << 40, .npages = 3};
	in->runs[1] = (struct lmt_msg_page){.block = 0, .page = 0, .npages = UINT32_MAX};
	assert_int_equal(lmt__enc_zero(&buf, in), 0);
	assert_int_equal(buf.len, LMT_PROTO_ZERO_OVERHEAD + 2 * LMT_PROTO_ZERO_RUN_SIZE);
	size_t len;
	const uint8_t *p = payload(LMT_MSG_ZERO, &len);
	assert_int_equal(lmt__dec_zero(p, len, out, &err), 0);
	assert_int_equal(out->count, 2);
	assert_int_equal(out->runs[0].block, 1);
	assert_int_equal(out->runs[0].page, 1ull << 40);
	assert_int_equal(out->runs[0].npages, 3);
	assert_int_equal(out->runs[1].npages, UINT32_MAX);
	assert_int_equal(lmt__dec_zero(p, len - 1, out, &err), -LMT_EPROTO);
	assert_string_equal(err.message, "ZERO message: truncated page count");
	/* The count as written on the wire: 0, and one over the limit. */
	uint8_t raw[4 + 16] = {0};
	assert_int_equal(lmt__dec_zero(raw, 4, out, &err), -LMT_EPROTO);
	assert_string_equal(err.message, "ZERO message: no zero run");
	raw[0] = 1;
	raw[1] = 4; /* 1025 */
	assert_int_equal(lmt__dec_zero(raw, 4, out, &err), -LMT_EPROTO);
	assert_string_equal(err.message, "ZERO message: too many zero runs");
	/* A run of no pages, and one that wraps past 2^64. */
	raw[1] = 0; /* one run: block 0, page 0, 0 pages */
	assert_int_equal(lmt__dec_zero(raw, sizeof(raw), out, &err), -LMT_EPROTO);
	assert_string_equal(err.message, "ZERO message: an empty or wrapping run of pages");
	memset(raw + 8, 0xff, 8); /* page 2^64 - 1 */
	raw[16] = 2;
	assert_int_equal(lmt__dec_zero(raw, sizeof(raw), out, &err), -LMT_EPROTO);
	assert_string_equal(err.message, "ZERO message: an empty or wrapping run of pages");
	in->count = 0;
	assert_int_equal(lmt__enc_zero(&buf, in), -LMT_EOVERFLOW);
	in->count = LMT_PROTO_MAX_ZERO_RUNS + 1;
	assert_int_equal(lmt__enc_zero(&buf, in), -LMT_EOVERFLOW);
	in->count = LMT_PROTO_MAX_ZERO_RUNS; /* the largest fits a payload */
	assert_int_equal(lmt__enc_zero(&buf, in), 0);
	free(in);
	free(out);
}

static void test_zero_ack_round_trips_the_count(void **state)
{
	assert_int_equal(lmt__enc_zero_ack(&buf, 1ull << 35), 0);
	size_t len;
	const uint8_t *p = payload(LMT_MSG_ZERO_ACK, &len);
	assert_int_equal(len, 8);
	uint64_t applied = 0;
	assert_int_equal(lmt__dec_zero_ack(p, len, &applied, &err), 0);
	assert_int_equal(applied, 1ull << 35);
	assert_int_equal(lmt__dec_zero_ack(p, len - 1, &applied, &err), -LMT_EPROTO);
	assert_string_equal(err.message, "ZERO_ACK message: truncated count");
	uint8_t longer[9] = {0};
	assert_int_equal(lmt__dec_zero_ack(longer, sizeof(longer), &applied, &err), -LMT_EPROTO);
	assert_string_equal(err.message, "ZERO_ACK message: trailing bytes");
	assert_string_equal(lmt__msg_name(LMT_MSG_ZERO), "ZERO");
	assert_string_equal(lmt__msg_name(LMT_MSG_ZERO_ACK), "ZERO_ACK");
}

static void test_fd_flags_round_trip_and_refuse_a_flag_other_than_0_or_1(void **state)
{
	struct lmt_msg_fd_flags in = {.count = 3, .flags = {1, 0, 1}}, out;
	assert_int_equal(lmt__enc_fd_flags(&buf, LMT_MSG_FD_OFFER, &in), 0);
	size_t len;
	const uint8_t *p = payload(LMT_MSG_FD_OFFER, &len);
	assert_int_equal(lmt__dec_fd_flags(p, len, LMT_MSG_FD_OFFER, &out, &err), 0);
	assert_int_equal(out.count, 3);
	assert_memory_equal(out.flags, in.flags, 3);
	in.flags[1] = 2;
	assert_int_equal(lmt__enc_fd_flags(&buf, LMT_MSG_FD_ACCEPT, &in), 0);
	p = payload(LMT_MSG_FD_ACCEPT, &len);
	assert_int_equal(lmt__dec_fd_flags(p, len, LMT_MSG_FD_ACCEPT, &out, &err), -LMT_EPROTO);
	assert_string_equal(err.message, "FD_ACCEPT message: a block flag must be 0 or 1");
}

static void test_fd_handover_round_trips_and_refuses_blocks_out_of_order(void **state)
{
	struct lmt_msg_fd_handover *in = calloc(1, sizeof(*in));
	in->count = 2;
	in->entries[0] = (struct lmt_msg_fd_entry){.block = 1, .offset = 4096, .digest = 7};
	in->entries[1] =
	        (struct lmt_msg_fd_entry){.block = 4, .offset = 1ull << 40, .digest = ~0ull};
	assert_int_equal(lmt__enc_fd_handover(&buf, in), 0);
	size_t len;
	const uint8_t *p = payload(LMT_MSG_FD_HANDOVER, &len);
	struct lmt_msg_fd_handover *out = malloc(sizeof(*out));
	assert_int_equal(lmt__dec_fd_handover(p, len, out, &err), 0);
	assert_int_equal(out->count, 2);
	assert_int_equal(out->entries[1].block, 4);
	assert_int_equal(out->entries[1].offset, 1ull << 40);
	assert_int_equal(out->entries[1].digest, ~0ull);
	in->entries[1].block = 1;
	assert_int_equal(lmt__enc_fd_handover(&buf, in), 0);
	p = payload(LMT_MSG_FD_HANDOVER, &len);
	assert_int_equal(lmt__dec_fd_handover(p, len, out, &err), -LMT_EPROTO);
	assert_string_equal(err.message, "FD_HANDOVER message: block indexes must increase");
	free(in);
	free(out);
}

static void test_addresses_round_trip(void **state)
{
	struct lmt_msg_addrs *in = calloc(1, sizeof(*in));
	in->count = 2;
	in->addrs[0].len = 3;
	in->addrs[1].len = LMT_BLOB_MAX;
	memset(in->addrs[1].data, 0xab, LMT_BLOB_MAX);
	assert_int_equal(lmt__enc_addrs(&buf, in), 0);
	size_t len;
	const uint8_t *p = payload(LMT_MSG_EP_ADDRS, &len);
	struct lmt_msg_addrs *out = malloc(sizeof(*out));
	assert_int_equal(lmt__dec_addrs(p, len, out, &err), 0);
	assert_int_equal(out->addrs[1].len, LMT_BLOB_MAX);
	assert_memory_equal(out->addrs[1].data, in->addrs[1].data, LMT_BLOB_MAX);
	free(in);
	free(out);
}

static void test_hello_reply_carries_challenge_and_proof(void **state)
{
	struct lmt_msg_status in = {.version = LMT_PROTO_VERSION, .auth = 1};
	memset(in.nonce, 0x11, sizeof(in.nonce));
	memset(in.proof, 0x22, sizeof(in.proof));
	strcpy(in.text, "ok");
	assert_int_equal(lmt__enc_status(&buf, LMT_MSG_HELLO_REPLY, &in), 0);
	size_t len;
	const uint8_t *p = payload(LMT_MSG_HELLO_REPLY, &len);
	struct lmt_msg_status out;
	assert_int_equal(lmt__dec_status(p, len, LMT_MSG_HELLO_REPLY, &out, &err), 0);
	assert_int_equal(out.auth, 1);
	assert_memory_equal(out.nonce, in.nonce, sizeof(in.nonce));
	assert_memory_equal(out.proof, in.proof, sizeof(in.proof));
	assert_int_equal(lmt__dec_status(p, len - 1, LMT_MSG_HELLO_REPLY, &out, &err), -LMT_EPROTO);
	assert_string_equal(err.message, "HELLO_REPLY message: truncated proof");
}

static void test_auth_flag_other_than_0_or_1_is_refused(void **state)
{
	struct lmt_msg_hello in = {
	        .magic = LMT_PROTO_MAGIC, .version = LMT_PROTO_VERSION, .auth = 2};
	assert_int_equal(lmt__enc_hello(&buf, &in), 0);
	size_t len;
	const uint8_t *p = payload(LMT_MSG_HELLO, &len);
	struct lmt_msg_hello *out = malloc(sizeof(*out));
	assert_int_equal(lmt__dec_hello(p, len, out, &err), -LMT_EPROTO);
	assert_string_equal(err.message, "HELLO message: auth flag must be 0 or 1");
	free(out);
}

static void test_auth_message_is_exactly_one_proof(void **state)
{
	uint8_t proof[LMT_PROTO_PROOF];
	memset(proof, 7, sizeof(proof));
	assert_int_equal(lmt__enc_auth(&buf, proof), 0);
	size_t len;
	const uint8_t *p = payload(LMT_MSG_AUTH, &len);
	uint8_t out[LMT_PROTO_PROOF];
	assert_int_equal(lmt__dec_auth(p, len, out, &err), 0);
	assert_memory_equal(out, proof, sizeof(proof));
	assert_int_equal(lmt__dec_auth(p, len - 1, out, &err), -LMT_EPROTO);
	uint8_t longer[LMT_PROTO_PROOF + 1] = {0};
	assert_int_equal(lmt__dec_auth(longer, sizeof(longer), out, &err), -LMT_EPROTO);
	assert_string_equal(err.message, "AUTH message: trailing bytes");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test_teardown(test_hello_round_trips, teardown),
	        cmocka_unit_test_teardown(test_hello_with_bad_magic_is_refused, teardown),
	        cmocka_unit_test_teardown(test_hello_of_another_version_decodes_only_the_version,
	                                  teardown),
	        cmocka_unit_test_teardown(test_truncated_messages_are_refused_at_every_length,
	                                  teardown),
	        cmocka_unit_test_teardown(test_trailing_bytes_are_refused, teardown),
	        cmocka_unit_test_teardown(test_header_rejects_unknown_type, teardown),
	        cmocka_unit_test_teardown(test_header_rejects_huge_length, teardown),
	        cmocka_unit_test_teardown(test_header_rejects_flags_and_truncation, teardown),
	        cmocka_unit_test_teardown(test_block_count_over_the_limit_is_refused, teardown),
	        cmocka_unit_test_teardown(test_string_with_control_characters_is_refused, teardown),
	        cmocka_unit_test_teardown(test_regs_round_trip_with_keys, teardown),
	        cmocka_unit_test_teardown(test_empty_key_blob_is_refused, teardown),
	        cmocka_unit_test_teardown(test_device_state_piece_outside_the_total_is_refused,
	                                  teardown),
	        cmocka_unit_test_teardown(test_device_state_round_trips, teardown),
	        cmocka_unit_test_teardown(test_status_code_out_of_range_is_refused, teardown),
	        cmocka_unit_test_teardown(test_complete_round_trips_digests, teardown),
	        cmocka_unit_test_teardown(test_landed_round_trips_the_bytes_of_each_channel,
	                                  teardown),
	        cmocka_unit_test_teardown(test_digests_round_trip_and_refuse_none_or_too_many,
	                                  teardown),
	        cmocka_unit_test_teardown(test_addresses_round_trip, teardown),
	        cmocka_unit_test_teardown(test_hello_reply_carries_challenge_and_proof, teardown),
	        cmocka_unit_test_teardown(test_auth_flag_other_than_0_or_1_is_refused, teardown),
	        cmocka_unit_test_teardown(test_auth_message_is_exactly_one_proof, teardown),
	        cmocka_unit_test_teardown(
	                test_fd_flags_round_trip_and_refuse_a_flag_other_than_0_or_1, teardown),
	        cmocka_unit_test_teardown(
	                test_fd_handover_round_trips_and_refuses_blocks_out_of_order, teardown),
	        cmocka_unit_test_teardown(
	                test_zero_runs_round_trip_and_refuse_none_too_many_or_wrapping, teardown),
	        cmocka_unit_test_teardown(test_zero_ack_round_trips_the_count, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
