/* A source that holds the key and sends hostile ZERO messages: a run of a
 * block that does not exist, outside its block, wrapping, across a window,
 * in a window the destination never registered, too many runs. Each fails
 * the load with LMT_EPROTO and a message naming the run, and the
 * destination's RAM is untouched, including the pages of the good runs
 * that came before the bad one in the same message. A good ZERO in a
 * registered window is answered with ZERO_ACK and clears exactly its
 * pages. The attacker is hostile.c's tcp source, not lmt's engine, so
 * the destination is held to docs/protocol.md. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "bytes.h"
#include "harness.h"
#include "hostile.h"

#define RAM_BYTES (4ull << 20) /* ram0: 768 pages, ram1: 256; windows of 256 */
#define KEY "guard-shared-secret"
#define FILL 0x5a

static uint8_t *in;
static uint32_t in_len;
static char dest_opts[256];

static int setup(void **state)
{
	in = malloc(LMT_PROTO_MAX_PAYLOAD);
	snprintf(dest_opts, sizeof(dest_opts), "auth-key-file=%s", guard_key_file(KEY));
	return in ? 0 : -1;
}

static int teardown(void **state)
{
	free(in);
	return 0;
}

/* A destination whose RAM holds FILL everywhere, and an authenticated
 * source past READY that had window 0 of ram0 registered. */
static struct guard_dest *attacked(struct hostile_source *h, struct guest_ram *ram)
{
	struct guard_dest *d = guard_dest_start(RAM_BYTES, dest_opts);
	memset(d->ram.base, FILL, RAM_BYTES);
	guest_ram_layout(ram, NULL, RAM_BYTES);
	hostile_source_open(h, d->port, KEY, ram);
	assert_int_equal(hostile_source_connect(h), 0);
	struct lmt_msg_regs *r = calloc(1, sizeof(*r));
	r->count = 1;
	r->regs[0] = (struct lmt_msg_reg){.block = 0, .offset = 0, .length = 1u << 20};
	assert_int_equal(lmt__enc_regs(&h->out, LMT_MSG_REG_REQ, r), 0);
	free(r);
	hostile_send_buf(h->fd, &h->out);
	assert_int_equal(hostile_recv(h->fd, in, &in_len, 5000), LMT_MSG_REG_REPLY);
	return d;
}

static void send_zero(struct hostile_source *h, const struct lmt_msg_page *runs, uint32_t count)
{
	struct lmt_msg_zero *m = calloc(1, sizeof(*m));
	m->count = count;
	memcpy(m->runs, runs, count * sizeof(*runs));
	assert_int_equal(lmt__enc_zero(&h->out, m), 0);
	free(m);
	hostile_send_buf(h->fd, &h->out);
}

/* Every byte of the destination's RAM is FILL but pages [first, first +
 * n) of ram0, which are zero. */
static void ram_is(const struct guard_dest *d, uint64_t first, uint64_t n)
{
	for (uint64_t i = 0; i < RAM_BYTES; i++) {
		uint64_t page = i / GUEST_PAGE_SIZE;
		uint8_t want = page >= first && page < first + n ? 0 : FILL;
		if (d->ram.base[i] != want)
			fail_msg("byte %llu of the destination's RAM is 0x%02x, expected 0x%02x",
			         (unsigned long long)i, d->ram.base[i], want);
	}
}

/* The load failed with LMT_EPROTO naming `text`, RAM untouched. */
static void refused(struct guard_dest *d, struct hostile_source *h, const char *text)
{
	guard_dest_join(d);
	print_message("    %s\n", d->error);
	if (d->rc != -LMT_EPROTO || !strstr(d->error, text))
		fail_msg("destination %d '%s'; expected LMT_EPROTO and '%s'", d->rc, d->error, text);
	ram_is(d, 0, 0);
	hostile_source_close(h);
	guard_dest_free(d);
}

static void bad_run(struct lmt_msg_page run, const char *text)
{
	struct hostile_source h;
	struct guest_ram ram;
	struct guard_dest *d = attacked(&h, &ram);
	/* A good run first: it must not be applied either. */
	struct lmt_msg_page runs[2] = {{.block = 0, .page = 0, .npages = 2}, run};
	send_zero(&h, runs, 2);
	refused(d, &h, text);
}

static void test_a_block_that_does_not_exist(void **state)
{
	bad_run((struct lmt_msg_page){.block = 2, .page = 0, .npages = 1},
	        "ZERO: block 2 does not exist (2 blocks)");
}

static void test_pages_outside_the_block(void **state)
{
	bad_run((struct lmt_msg_page){.block = 1, .page = 250, .npages = 7},
	        "ZERO: pages 250+7 are outside block 'ram1' (256 pages)");
	bad_run((struct lmt_msg_page){.block = 1, .page = 1ull << 60, .npages = 1},
	        "are outside block 'ram1'");
}

static void test_a_wrapping_run(void **state)
{
	bad_run((struct lmt_msg_page){.block = 0, .page = UINT64_MAX, .npages = 2},
	        "ZERO message: an empty or wrapping run of pages");
}

static void test_a_run_across_a_window(void **state)
{
	bad_run((struct lmt_msg_page){.block = 0, .page = 250, .npages = 10},
	        "ZERO: pages 250+10 of block 'ram0' cross a window boundary");
}

static void test_a_window_not_registered(void **state)
{
	bad_run((struct lmt_msg_page){.block = 0, .page = 300, .npages = 1},
	        "ZERO: pages 300+1 of block 'ram0' are in a window that is not registered");
	bad_run((struct lmt_msg_page){.block = 1, .page = 0, .npages = 1},
	        "of block 'ram1' are in a window that is not registered");
}

/* The count is refused before any run is read: a message is bounded. */
static void test_too_many_runs(void **state)
{
	struct hostile_source h;
	struct guest_ram ram;
	struct guard_dest *d = attacked(&h, &ram);
	uint8_t raw[LMT_PROTO_HEADER_SIZE + 4];
	lmt__put16(raw, LMT_MSG_ZERO);
	lmt__put16(raw + 2, 0);
	lmt__put32(raw + 4, 4);
	lmt__put32(raw + 8, LMT_PROTO_MAX_ZERO_RUNS + 1);
	hostile_send(h.fd, raw, sizeof(raw));
	refused(d, &h, "ZERO message: too many zero runs");
}

/* A good ZERO: answered, its pages and no others cleared; then COMPLETE. */
static void test_a_good_zero_run_is_applied_and_answered(void **state)
{
	struct hostile_source h;
	struct guest_ram ram;
	struct guard_dest *d = attacked(&h, &ram);
	struct lmt_msg_page run = {.block = 0, .page = 3, .npages = 5};
	send_zero(&h, &run, 1);
	assert_int_equal(hostile_recv(h.fd, in, &in_len, 5000), LMT_MSG_ZERO_ACK);
	uint64_t applied = 0;
	struct lmt_error err = {0};
	assert_int_equal(lmt__dec_zero_ack(in, in_len, &applied, &err), 0);
	assert_int_equal(applied, 1);
	ram_is(d, 3, 5);
	struct lmt_msg_complete *c = calloc(1, sizeof(*c));
	assert_int_equal(lmt__enc_complete(&h.out, c), 0);
	free(c);
	hostile_send_buf(h.fd, &h.out);
	assert_int_equal(hostile_recv(h.fd, in, &in_len, 5000), LMT_MSG_COMPLETE_ACK);
	guard_dest_join(d);
	if (d->rc)
		fail_msg("destination %d '%s'", d->rc, d->error);
	struct lmt_stats st;
	lmt_session_stats(d->session, &st);
	assert_int_equal(st.zero_pages, 5);
	assert_int_equal(st.zero_run_bytes, LMT_PROTO_ZERO_OVERHEAD + LMT_PROTO_ZERO_RUN_SIZE);
	hostile_source_close(&h);
	guard_dest_free(d);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_a_good_zero_run_is_applied_and_answered),
	        cmocka_unit_test(test_a_block_that_does_not_exist),
	        cmocka_unit_test(test_pages_outside_the_block),
	        cmocka_unit_test(test_a_wrapping_run),
	        cmocka_unit_test(test_a_run_across_a_window),
	        cmocka_unit_test(test_a_window_not_registered),
	        cmocka_unit_test(test_too_many_runs),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
