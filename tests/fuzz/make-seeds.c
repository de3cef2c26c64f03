/* Writes the seed corpora of the fuzz harnesses: valid encodings of every
 * control message, blob and option string, so the fuzzers start from inputs
 * that reach deep. The output is committed under tests/fuzz/corpus/.
 *   make-seeds OUTPUT_DIR */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../../plugins/tcp/wire.h"
#include "../../plugins/verbs/wire.h"
#include "../unit/compress_pages.h"
#include "compress/frame.h"
#include "fileformat.h"
#include "proto.h"
#include "source_script.h"
#include "tcp_wire_script.h"

static const char *out_dir;

static void save(const char *harness, const char *name, uint8_t lead, const void *data, size_t len)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/%s", out_dir, harness);
	mkdir(path, 0755);
	snprintf(path, sizeof(path), "%s/%s/%s", out_dir, harness, name);
	FILE *f = fopen(path, "wb");
	if (!f || fwrite(&lead, 1, 1, f) != 1 || (len && fwrite(data, 1, len, f) != len)) {
		perror(path);
		exit(1);
	}
	fclose(f);
}

/* For the proto harness: the decoder's selector, then the payload only. */
static void save_msg(const char *name, struct lmt_buf *b)
{
	uint16_t type = (uint16_t)(b->data[0] | b->data[1] << 8);
	save("proto", name, (uint8_t)type, b->data + LMT_PROTO_HEADER_SIZE,
	     b->len - LMT_PROTO_HEADER_SIZE);
	save("proto", "header", 0, b->data, LMT_PROTO_HEADER_SIZE);
}

static void proto_and_destination(void)
{
	struct lmt_buf b = {0}, stream = {0};
	struct lmt_msg_hello *h = calloc(1, sizeof(*h));
	h->magic = LMT_PROTO_MAGIC;
	h->version = LMT_PROTO_VERSION;
	h->auth = 1;
	strcpy(h->plugin, "null");
	strcpy(h->options[0].name, "channels");
	strcpy(h->options[0].value, "1");
	h->option_count = 1;
	lmt__enc_hello(&b, h);
	save_msg("hello", &b);
	free(h);

	struct lmt_msg_status st = {.version = LMT_PROTO_VERSION, .auth = 1};
	strcpy(st.text, "ok");
	lmt__enc_status(&b, LMT_MSG_HELLO_REPLY, &st);
	save_msg("hello-reply", &b);
	st.code = -LMT_EPROTO;
	lmt__enc_status(&b, LMT_MSG_ERROR, &st);
	save_msg("error", &b);

	struct lmt_msg_blocks *bl = calloc(1, sizeof(*bl));
	bl->count = 1;
	strcpy(bl->blocks[0].name, "ram0");
	bl->blocks[0].length = 256 << 10;
	bl->blocks[0].page_size = 4096;
	lmt__enc_blocks(&b, bl);
	save_msg("blocks", &b);
	free(bl);

	struct lmt_msg_addrs *a = calloc(1, sizeof(*a));
	a->count = 1;
	a->addrs[0].len = 8;
	memcpy(a->addrs[0].data, "null-ep", 8);
	lmt__enc_addrs(&b, a);
	save_msg("addrs", &b);
	free(a);

	/* The destination harness starts after READY: these are what follows. */
	struct lmt_msg_regs *r = calloc(1, sizeof(*r));
	r->count = 2;
	r->regs[0] = (struct lmt_msg_reg){.block = 0, .offset = 0, .length = 64 << 10};
	r->regs[1] = (struct lmt_msg_reg){.block = 0, .offset = 64 << 10, .length = 64 << 10};
	lmt__enc_regs(&b, LMT_MSG_REG_REQ, r);
	save_msg("reg-req", &b);
	struct lmt_buf tmp = b;
	stream.data = malloc(1 << 16);
	memcpy(stream.data, tmp.data, tmp.len);
	stream.len = tmp.len;
	r->regs[0].key.len = 4;
	lmt__enc_regs(&b, LMT_MSG_REG_REPLY, r);
	save_msg("reg-reply", &b);
	free(r);

	uint8_t state[100];
	memset(state, 0x42, sizeof(state));
	struct lmt_msg_state ds = {
	        .offset = 0, .total = sizeof(state), .length = sizeof(state), .data = state};
	lmt__enc_state(&b, &ds);
	save_msg("device-state", &b);
	memcpy(stream.data + stream.len, b.data, b.len);
	stream.len += b.len;

	struct lmt_msg_landed *l = calloc(1, sizeof(*l));
	l->channels = 1;
	l->bytes[0] = 64 << 10;
	lmt__enc_landed(&b, l);
	save_msg("landed", &b);
	memcpy(stream.data + stream.len, b.data, b.len);
	stream.len += b.len;
	free(l);

	/* The destination harness runs with verify=on: the 4 stripes of its
	 * 256 KiB block. */
	struct lmt_msg_digests *dg = calloc(1, sizeof(*dg));
	dg->count = 4;
	for (uint32_t i = 0; i < dg->count; i++)
		dg->digests[i] = 0x9e3779b97f4a7c15ull * (i + 1);
	lmt__enc_digests(&b, dg);
	save_msg("digests", &b);
	memcpy(stream.data + stream.len, b.data, b.len);
	stream.len += b.len;
	free(dg);

	/* Zero runs after the registration of the first two windows: one
	 * in each, and the destination's answer. */
	struct lmt_msg_zero *z = calloc(1, sizeof(*z));
	z->count = 2;
	z->runs[0] = (struct lmt_msg_page){.block = 0, .page = 1, .npages = 3};
	z->runs[1] = (struct lmt_msg_page){.block = 0, .page = 16, .npages = 16};
	lmt__enc_zero(&b, z);
	save_msg("zero", &b);
	memcpy(stream.data + stream.len, b.data, b.len);
	stream.len += b.len;
	lmt__enc_zero_ack(&b, 1);
	save_msg("zero-ack", &b);

	struct lmt_msg_complete *c = calloc(1, sizeof(*c));
	c->passes = 2;
	c->state_length = sizeof(state);
	c->digest_count = 1;
	lmt__enc_complete(&b, c);
	save_msg("complete", &b);
	memcpy(stream.data + stream.len, b.data, b.len);
	stream.len += b.len;
	free(c);

	/* unix: targets only (the harnesses' sessions are not): the codec. */
	struct lmt_msg_fd_flags fl = {.count = 2, .flags = {1, 0}};
	lmt__enc_fd_flags(&b, LMT_MSG_FD_OFFER, &fl);
	save_msg("fd-offer", &b);
	lmt__enc_fd_flags(&b, LMT_MSG_FD_ACCEPT, &fl);
	save_msg("fd-accept", &b);
	struct lmt_msg_fd_handover *fh = calloc(1, sizeof(*fh));
	fh->count = 2;
	fh->entries[0] = (struct lmt_msg_fd_entry){.block = 0, .offset = 0, .digest = 1};
	fh->entries[1] = (struct lmt_msg_fd_entry){.block = 3, .offset = 1 << 21, .digest = 2};
	lmt__enc_fd_handover(&b, fh);
	save_msg("fd-handover", &b);
	free(fh);

	lmt__enc_empty(&b, LMT_MSG_PING);
	save_msg("ping", &b);
	uint8_t proof[LMT_PROTO_PROOF] = {1, 2, 3};
	lmt__enc_auth(&b, proof);
	save_msg("auth", &b);

	/* Lead byte: state 3 (channels up), pin-all off; then a session. */
	save("destination", "active-session", 3, stream.data, stream.len);
	save("destination", "active-pin-all", 3 | 4, stream.data + 0, 0);
	save("destination", "fresh", 0, NULL, 0);
	/* Zero runs on their own: with pin-all (the whole block registered),
	 * and without (no window registered: refused). */
	lmt__enc_zero(&b, z);
	save("destination", "zero-pin-all", 3 | 4, b.data, b.len);
	save("destination", "zero-unregistered", 3, b.data, b.len);
	z->count = 1;
	z->runs[0] = (struct lmt_msg_page){.block = 0, .page = 60, .npages = 8};
	lmt__enc_zero(&b, z);
	save("destination", "zero-past-the-block", 3 | 4, b.data, b.len);
	free(z);
	free(stream.data);
	lmt__buf_free(&b);
}

/* Postcopy's messages for the proto harness, and sessions for the
 * destination harness that switch and complete: announced pages come
 * zero or in staging slots (the null transport writes none, so they land
 * zero too), then POSTCOPY_DONE. */
static void add_msg(struct lmt_buf *stream, const struct lmt_buf *b)
{
	stream->data = realloc(stream->data, stream->len + b->len);
	memcpy(stream->data + stream->len, b->data, b->len);
	stream->len += b->len;
}

static void postcopy_pages_msg(struct lmt_buf *b, uint64_t coming)
{
	uint8_t bits[8];
	for (int i = 0; i < 8; i++)
		bits[i] = (uint8_t)(coming >> (8 * i));
	struct lmt_msg_pc_pages m = {.block = 0, .first = 0, .words = 1, .bits = bits};
	lmt__enc_pc_pages(b, &m);
}

/* PAGES for the 64-page block: pages [0, 8) zero, [8, 24) in slots 0 and
 * 1 (8 pages each, 32 KiB of a 64 KiB slot), [24, 64) in slot 2 and zero. */
static void postcopy_pages_entries(struct lmt_buf *b)
{
	struct lmt_msg_pages *m = calloc(1, sizeof(*m));
	m->channels = 2;
	m->bytes[0] = 2 * 8 * 4096;
	m->count = 5;
	m->entries[0] = (struct lmt_msg_pc_entry){LMT_PROTO_ZERO_SLOT, {0, 0, 8}};
	m->entries[1] = (struct lmt_msg_pc_entry){0, {0, 8, 8}};
	m->entries[2] = (struct lmt_msg_pc_entry){1, {0, 16, 8}};
	m->entries[3] = (struct lmt_msg_pc_entry){2, {0, 24, 16}};
	m->entries[4] = (struct lmt_msg_pc_entry){LMT_PROTO_ZERO_SLOT, {0, 40, 24}};
	lmt__enc_pages(b, m);
	free(m);
}

static void postcopy_seeds(void)
{
	struct lmt_buf b = {0}, stream = {0};
	postcopy_pages_msg(&b, ~0ull);
	save_msg("postcopy-pages", &b);
	add_msg(&stream, &b);
	uint8_t state[64];
	memset(state, 0x17, sizeof(state));
	struct lmt_msg_state ds = {
	        .offset = 0, .total = sizeof(state), .length = sizeof(state), .data = state};
	lmt__enc_state(&b, &ds);
	add_msg(&stream, &b);
	struct lmt_msg_postcopy sw = {.passes = 3, .state_length = sizeof(state), .pages = 64};
	lmt__enc_postcopy(&b, &sw);
	save_msg("postcopy", &b);
	add_msg(&stream, &b);
	postcopy_pages_entries(&b);
	save_msg("pages", &b);
	add_msg(&stream, &b);
	struct lmt_msg_pc_done done = {.pages = 64};
	lmt__enc_pc_done(&b, &done);
	save_msg("postcopy-done", &b);
	add_msg(&stream, &b);
	/* Lead byte: after READY, postcopy=on (8); then pin-all on (4). */
	save("destination", "postcopy-session", 3 | 8, stream.data, stream.len);
	save("destination", "postcopy-session-pin-all", 3 | 4 | 8, stream.data, stream.len);

	/* Past the switch (16): the announced bitmap, then what follows it. */
	uint8_t switched[8 + 4096];
	size_t n = 0;
	memset(switched, 0xff, 8);
	n = 8;
	postcopy_pages_entries(&b);
	memcpy(switched + n, b.data, b.len);
	n += b.len;
	lmt__enc_pc_done(&b, &done);
	memcpy(switched + n, b.data, b.len);
	n += b.len;
	save("destination", "postcopy-switched", 3 | 8 | 16, switched, n);
	/* Only some pages announced: PAGES names one that was not. */
	memset(switched, 0, 8);
	switched[0] = 0x0f;
	save("destination", "postcopy-switched-partly", 3 | 8 | 16, switched, n);
	/* Every page announced; a run longer than its slot, then
	 * POSTCOPY_DONE with pages missing. */
	struct lmt_msg_pages *pg = calloc(1, sizeof(*pg));
	pg->channels = 2;
	pg->count = 1;
	pg->entries[0] = (struct lmt_msg_pc_entry){0, {0, 0, 17}};
	lmt__enc_pages(&b, pg);
	memset(switched, 0xff, 8);
	memcpy(switched + 8, b.data, b.len);
	save("destination", "postcopy-switched-run-past-its-slot", 3 | 8 | 16, switched, 8 + b.len);
	pg->entries[0] = (struct lmt_msg_pc_entry){LMT_PROTO_ZERO_SLOT, {0, 0, 17}};
	lmt__enc_pages(&b, pg);
	n = 8;
	memcpy(switched + n, b.data, b.len);
	n += b.len;
	lmt__enc_pc_done(&b, &done);
	memcpy(switched + n, b.data, b.len);
	n += b.len;
	save("destination", "postcopy-switched-done-early", 3 | 8 | 16, switched, n);
	free(pg);

	struct lmt_msg_pc_ack ack = {.code = 0, .slot_size = 64 << 10, .slots = 256};
	strcpy(ack.text, "ok");
	ack.key.len = 4;
	memcpy(ack.key.data, "\x01\0\0\0", 4);
	lmt__enc_pc_ack(&b, &ack);
	save_msg("postcopy-ack", &b);
	ack.code = -LMT_ENOTSUP;
	strcpy(ack.text, "userfaultfd is not available");
	lmt__enc_pc_ack(&b, &ack);
	save_msg("postcopy-ack-refused", &b);
	struct lmt_msg_page_req req = {.count = 2};
	req.pages[0] = (struct lmt_msg_page){.block = 0, .page = 5, .npages = 1};
	req.pages[1] = (struct lmt_msg_page){.block = 1, .page = 17, .npages = 3};
	lmt__enc_page_req(&b, &req);
	save_msg("page-req", &b);
	struct lmt_msg_slots sl = {.count = 3, .slots = {0, 7, 255}};
	lmt__enc_slots(&b, &sl);
	save_msg("slots-free", &b);
	free(stream.data);
	lmt__buf_free(&b);
}

static void blobs(void)
{
	struct lmt_blob b;
	struct tcp_dst_addr d = {.family = 4, .port = 5000, .ip = {127, 0, 0, 1}, .token = 7};
	tcp_dst_addr_encode(&d, &b);
	save("blobs", "tcp-dst", 0, b.data, b.len);
	tcp_src_addr_encode(1, &b);
	save("blobs", "tcp-src", 1, b.data, b.len);
	struct tcp_key k = {.region = 3, .len = 1 << 20};
	tcp_key_encode(&k, &b);
	save("blobs", "tcp-key", 2, b.data, b.len);
	struct verbs_addr v = {.role = 1, .link = 2, .mtu = 3, .qpn = 17, .psn = 99};
	v.gid[10] = 0xff;
	v.gid[11] = 0xff;
	verbs_addr_encode(&v, &b);
	save("blobs", "verbs-addr", 3, b.data, b.len);
	struct verbs_key vk = {.rkey = 5, .addr = 0x10000, .len = 1 << 20};
	verbs_key_encode(&vk, &b);
	save("blobs", "verbs-key", 4, b.data, b.len);
}

static void options(void)
{
	const char *seeds[] = {
	        "chunk-size=64M,channels=2,pin-all=on",
	        "downtime-limit=300ms,max-iterate-ms=50,verify=off",
	        "fz.mode=zerocopy,fz.label=x,fz.depth=16,fz.wait=2s",
	        "max-bandwidth=1G,queue-depth=64,auth-key=secret",
	        "18446744073709551615",
	};
	for (size_t i = 0; i < sizeof(seeds) / sizeof(seeds[0]); i++) {
		char name[16];
		snprintf(name, sizeof(name), "opts-%zu", i);
		/* the options harness takes the whole input as text: no lead byte */
		char path[512];
		snprintf(path, sizeof(path), "%s/options", out_dir);
		mkdir(path, 0755);
		snprintf(path, sizeof(path), "%s/options/%s", out_dir, name);
		FILE *f = fopen(path, "wb");
		if (!f || fputs(seeds[i], f) < 0) {
			perror(path);
			exit(1);
		}
		fclose(f);
	}
}

/* A script: its bytes, as fuzz_source and fuzz_tcp_wire read them. */
struct script {
	uint8_t b[512];
	size_t n;
};

static void op(struct script *s, int count, ...)
{
	va_list ap;
	va_start(ap, count);
	for (int i = 0; i < count; i++)
		s->b[s->n++] = (uint8_t)va_arg(ap, int);
	va_end(ap);
}

static void op64(struct script *s, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		s->b[s->n++] = (uint8_t)(v >> (8 * i));
}

/* fuzz_source: a destination that plays its part right, in each mode. */
static void source_session(const char *name, unsigned flags)
{
	struct script s = {0};
	unsigned channels = flags & SRC_F_CHANNELS ? 2 : 1;
	op(&s, 2, SRC_OP_HELLO_REPLY, 0);
	op(&s, 2, SRC_OP_ADDRS, 0);
	for (unsigned c = 0; c < channels; c++) {
		op(&s, 1, 0);
		op64(&s, 0x1122334455667788ull + c);
	}
	if (flags & SRC_F_PIN_ALL) {
		op(&s, 2, SRC_OP_KEYS, 0);
		op(&s, 1, SRC_OP_READY);
	} else {
		op(&s, 1, SRC_OP_READY);
		for (int block = 0; block < 2; block++)
			op(&s, 4, SRC_OP_EXPECT, LMT_MSG_REG_REQ, SRC_OP_KEYS, 0);
	}
	if (flags & SRC_F_NO_ACK)
		for (unsigned i = 0; i < 6; i++)
			op(&s, 7, SRC_OP_PAUSE, 5, SRC_OP_ACK, i % channels, 0, 2, 0);
	op(&s, 4, SRC_OP_EXPECT, LMT_MSG_COMPLETE, SRC_OP_COMPLETE_ACK, 0);
	save("source", name, (uint8_t)flags, s.b, s.n);
}

/* fuzz_source, postcopy=on: a destination that takes the switch (or
 * refuses it with `refuse`), asks for a fault's pages when `fault`, frees
 * the slots PAGES names and acknowledges POSTCOPY_DONE. */
static void source_postcopy(const char *name, unsigned flags, bool fault, uint8_t refuse)
{
	struct script s = {0};
	unsigned channels = (flags & SRC_F_CHANNELS ? 2 : 1) + 1;
	unsigned iterations = (flags >> SRC_F_ITERATE_SHIFT) & SRC_F_ITERATE_MASK;
	op(&s, 2, SRC_OP_HELLO_REPLY, 0);
	op(&s, 2, SRC_OP_ADDRS, 0);
	for (unsigned c = 0; c < channels; c++) {
		op(&s, 1, 0);
		op64(&s, 0x5566778899aabbccull + c);
	}
	if (flags & SRC_F_PIN_ALL) {
		op(&s, 2, SRC_OP_KEYS, 0);
		op(&s, 1, SRC_OP_READY);
	} else {
		op(&s, 1, SRC_OP_READY);
		if (iterations)
			op(&s, 4, SRC_OP_EXPECT, LMT_MSG_REG_REQ, SRC_OP_KEYS, 0);
	}
	/* accepted, 256 slots of 64 KiB, a tcp key for them */
	op(&s, 5, SRC_OP_PC_ACK, refuse, 0, 2, 0);
	if (fault)
		op(&s, 5, SRC_OP_PAGE_REQ, 1, 3, 0, 2);
	op(&s, 4, SRC_OP_EXPECT, LMT_MSG_PAGES, SRC_OP_SLOTS_FREE, 0);
	op(&s, 4, SRC_OP_EXPECT, LMT_MSG_POSTCOPY_DONE, SRC_OP_SLOTS_FREE, 0);
	op(&s, 2, SRC_OP_COMPLETE_ACK, 0);
	save("source", name, (uint8_t)flags, s.b, s.n);
}

static void source(void)
{
	unsigned four = 2u << SRC_F_ITERATE_SHIFT;
	source_session("session", four);
	source_session("session-verify", four | SRC_F_VERIFY);
	source_session("pin-all", four | SRC_F_PIN_ALL);
	source_session("auth", four | SRC_F_AUTH | SRC_F_VERIFY);
	source_session("two-channels", four | SRC_F_CHANNELS);
	source_session("pin-all-two-channels-verify",
	               four | SRC_F_CHANNELS | SRC_F_PIN_ALL | SRC_F_VERIFY);
	source_session("scripted-acks", four | SRC_F_NO_ACK);
	source_session("no-iterate", SRC_F_PIN_ALL);
	unsigned one = 1u << SRC_F_ITERATE_SHIFT;
	source_postcopy("postcopy-at-once", SRC_F_POSTCOPY, false, 0);
	source_postcopy("postcopy-fault", SRC_F_POSTCOPY, true, 0);
	source_postcopy("postcopy-after-a-pass", SRC_F_POSTCOPY | SRC_F_PIN_ALL | one, false, 0);
	source_postcopy("postcopy-pin-all-two-channels",
	                SRC_F_POSTCOPY | SRC_F_PIN_ALL | SRC_F_CHANNELS | one, true, 0);
	source_postcopy("postcopy-from-complete",
	                SRC_F_POSTCOPY | SRC_F_PIN_ALL | SRC_F_VERIFY | 3 * one, false, 0);
	source_postcopy("postcopy-refused", SRC_F_POSTCOPY, false, LMT_ENOTSUP);
	/* A destination that refuses, and one that fails mid-session. */
	struct script s = {0};
	op(&s, 4, SRC_OP_HELLO_REPLY, 2, LMT_EMISMATCH, SRC_OP_EXPECT);
	save("source", "refused", four, s.b, s.n);
	s.n = 0;
	op(&s, 2, SRC_OP_HELLO_REPLY, 0);
	op(&s, 4, SRC_OP_ADDRS, 0, 0, 0);
	op64(&s, 7);
	op(&s, 4, SRC_OP_READY, SRC_OP_EXPECT, LMT_MSG_REG_REQ, SRC_OP_ERROR);
	op(&s, 5, LMT_EIO, 3, 'b', 'a', 'd');
	save("source", "error-mid-session", four, s.b, s.n);
	/* A destination that reads POSTCOPY and never answers it. */
	s.n = 0;
	op(&s, 4, SRC_OP_HELLO_REPLY, 0, SRC_OP_ADDRS, 0);
	for (unsigned c = 0; c < 2; c++) {
		op(&s, 1, 0);
		op64(&s, 0x2222 + c);
	}
	op(&s, 3, SRC_OP_READY, SRC_OP_EXPECT, LMT_MSG_POSTCOPY);
	for (int i = 0; i < 3; i++)
		op(&s, 2, SRC_OP_EXPECT, 31); /* no such message: waits 100 ms */
	save("source", "postcopy-no-ack", SRC_F_POSTCOPY, s.b, s.n);
}

/* fuzz_tcp_wire: a source's stream that the receiver takes whole, and a
 * destination's acknowledgements of every write. */
static void tcp_wire(void)
{
	struct script s = {0};
	op(&s, 1, WIRE_RX_HELLO);
	/* region 0 at 0, 4 KiB; region 1 at 100, 12245 bytes (to its end) */
	op(&s, 8, WIRE_RX_WRITE, 0, 0, 0, 0, 0x00, 0x10, 1);
	op(&s, 8, WIRE_RX_WRITE, 0, 1, 100, 0, 0xd5, 0x2f, 2);
	op(&s, 1, WIRE_RX_SPLIT);
	op(&s, 8, WIRE_RX_WRITE, 0, 0, 0, 0x3c, 0x00, 0x04, 3);
	op(&s, 2, WIRE_RX_BYE, 0);
	save("tcp_wire", "receiver-session", 0, s.b, s.n);
	s.n = 0;
	op(&s, 1, WIRE_RX_HELLO);
	op(&s, 8, WIRE_RX_WRITE, 0, 2, 0, 0, 0x00, 0x01, 1); /* the deregistered region */
	save("tcp_wire", "receiver-stale-region", 0, s.b, s.n);
	s.n = 0;
	op(&s, 3, WIRE_RX_BAD_HELLO, 0, 1);
	save("tcp_wire", "receiver-wrong-token", 0, s.b, s.n);
	s.n = 0;
	/* token tweak (u16), writes less one (u8), 4 writes of 1000 bytes, then
	 * acknowledgements */
	op(&s, 3, 0, 0, 3);
	for (int i = 0; i < 4; i++)
		op(&s, 2, 0xe8, 0x03);
	op(&s, 2, WIRE_TX_ACK, 2);
	op(&s, 1, WIRE_TX_SPLIT);
	op(&s, 2, WIRE_TX_ACK, 4);
	op(&s, 2, WIRE_TX_BYE, 4);
	save("tcp_wire", "acks-session", 1, s.b, s.n);
	s.n = 0;
	op(&s, 3, 0, 0, 1);
	op(&s, 4, 0x10, 0, 0x10, 0);
	op(&s, 2, WIRE_TX_ACK, 1);
	op(&s, 5, WIRE_TX_ERROR, LMT_EPROTO, 0, 0, 0);
	save("tcp_wire", "acks-error", 1, s.b, s.n);
}

/* For the file harness: the start of a save file up to the end of its
 * metadata (header, commit record, table, bitmaps, digests), as it is (0) and
 * to be resealed (1); and the storage blobs (2, 3). */
static void file_image(const char *name, bool digests)
{
	struct lmt_file_block blocks[2] = {
	        {.name = "ram0", .length = 259 * 4096, .page_size = 4096},
	        {.name = "ram1", .length = 64 * 4096, .page_size = 4096},
	};
	struct lmt_file_header h = {.save_id = {1, 2, 3}};
	lmt__file_layout(&h, blocks, 2, digests);
	/* Up to the end of the last small area, under libFuzzer's -max_len. */
	size_t len = 0;
	for (uint32_t i = 0; i < 2; i++) {
		uint64_t end = lmt__file_round(blocks[i].bitmap_offset + blocks[i].bitmap_length,
		                               LMT_FILE_ALIGN);
		if (digests)
			end = lmt__file_round(blocks[i].digests_offset + blocks[i].digests_length,
			                      LMT_FILE_ALIGN);
		len = end > len ? end : len;
	}
	uint8_t *p = calloc(1, len);
	lmt__file_encode_table(blocks, 2, p + h.table_offset);
	h.table_digest = lmt__file_hash(p + h.table_offset, h.table_length);
	lmt__file_encode_header(&h, p);
	for (uint32_t i = 0; i < 2; i++)
		memset(p + blocks[i].bitmap_offset, 0xa5, blocks[i].bitmap_length - 8);
	struct lmt_file_commit c = {.passes = 3, .state_length = 4096};
	memcpy(c.save_id, h.save_id, sizeof(c.save_id));
	c.file_length = h.state_offset + 4096;
	lmt__file_encode_commit(&c, p + LMT_FILE_ALIGN);
	char label[64];
	snprintf(label, sizeof(label), "%s", name);
	save("file", label, 0, p, len);
	snprintf(label, sizeof(label), "%s-resealed", name);
	save("file", label, 1, p, len);
	free(p);
}

static void file_seeds(void)
{
	file_image("image-digests", true);
	file_image("image", false);
	struct lmt_blob b;
	lmt__file_address(&b, LMT_STORAGE_CREATE, "/var/lib/guest.lmt", 1 << 20);
	save("file", "address-create", 2, b.data, b.len);
	lmt__file_address(&b, LMT_STORAGE_READ, "guest.lmt", 0);
	save("file", "address-read", 2, b.data, b.len);
	lmt__file_key(&b, 65536, 1 << 20);
	save("file", "key", 3, b.data, b.len);
}

/* For the frame harness: the selector (pages - 1, mode << 4, the codec
 * announced), then the slot. Frames of mixed and zero runs with each
 * codec, bare payloads, and bombs of both codecs. */
static void frame_seed(const char *name, unsigned pages, unsigned mode, enum lmt_codec codec,
                       const void *slot, size_t len)
{
	unsigned announced = codec == LMT_CODEC_ZSTD ? 0x40 : 0;
	save("frame", name, (uint8_t)((pages - 1) | mode << 4 | announced), slot, len);
}

static void frame_seeds(void)
{
	struct lmt_codec_ctx *ctx;
	struct lmt_error err;
	if (lmt__codec_ctx_new(&ctx, &err))
		exit(1);
	static const unsigned pages[] = {1, 4, 16};
	static const enum lmt_codec codecs[] = {LMT_CODEC_LZ4, LMT_CODEC_ZSTD};
	uint8_t *run = malloc(16 * TEST_PAGE), *frame = malloc(16 * TEST_PAGE);
	char name[64];
	for (int c = 0; c < 2; c++)
		for (int p = 0; p < 3; p++) {
			size_t len = pages[p] * TEST_PAGE, n;
			const char *codec = lmt__codec_name(codecs[c]);
			test_mixed_run(run, pages[p], 7, false);
			if (lmt__frame_compress(ctx, codecs[c], 0, run, len, frame, len, &n, &err))
				exit(1);
			snprintf(name, sizeof(name), "%s-mixed-%u", codec, pages[p]);
			frame_seed(name, pages[p], 0, codecs[c], frame, n);
			snprintf(name, sizeof(name), "%s-payload-mixed-%u", codec, pages[p]);
			frame_seed(name, pages[p], codecs[c] == LMT_CODEC_LZ4 ? 2 : 3, codecs[c],
			           frame + LMT_FRAME_HEADER_SIZE, n - LMT_FRAME_HEADER_SIZE);
			/* announced one byte short, and a slot with room to spare */
			memset(frame + n, 0, 1);
			snprintf(name, sizeof(name), "%s-short-%u", codec, pages[p]);
			frame_seed(name, pages[p], 1, codecs[c], frame, n + 1);
			memset(run, 0, len);
			if (lmt__frame_compress(ctx, codecs[c], 0, run, len, frame, len, &n, &err))
				exit(1);
			snprintf(name, sizeof(name), "%s-zero-%u", codec, pages[p]);
			frame_seed(name, pages[p], 0, codecs[c], frame, n);
		}
	/* Bombs: 1 MiB of zeros framed for a run of one page. */
	size_t big = 1 << 20, n;
	uint8_t *zeros = calloc(1, big), *bomb = malloc(big);
	for (int c = 0; c < 2; c++) {
		if (lmt__frame_compress(ctx, codecs[c], 0, zeros, big, bomb, big, &n, &err))
			exit(1);
		struct lmt_frame f = {.codec = codecs[c], .raw_len = TEST_PAGE,
		                      .payload_len = (uint32_t)(n - LMT_FRAME_HEADER_SIZE)};
		lmt__frame_encode(&f, bomb);
		snprintf(name, sizeof(name), "%s-bomb", lmt__codec_name(codecs[c]));
		frame_seed(name, 1, 0, codecs[c], bomb, n);
	}
	free(bomb);
	free(zeros);
	free(frame);
	free(run);
	lmt__codec_ctx_free(ctx);
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: make-seeds OUTPUT_DIR\n");
		return 2;
	}
	out_dir = argv[1];
	mkdir(out_dir, 0755);
	proto_and_destination();
	postcopy_seeds();
	blobs();
	options();
	source();
	tcp_wire();
	file_seeds();
	frame_seeds();
	return 0;
}
