/* The destination fed malformed or hostile control traffic by a fake
 * source: every case ends the load with an error that names the problem,
 * without a crash and without a write outside the RAM blocks (which sit
 * between PROT_NONE guard pages). The postcopy cases go past the switch
 * (userfaultfd: skipped where it cannot be opened): there the guest's
 * pages that were not announced must keep what they held, and a thread
 * waiting on an announced page must be let go when the load fails. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <lmt/lmt.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "net.h"
#include "plugin_harness.h"
#include "proto.h"

#define PAGE 4096u
#define BLOCK_BYTES (1u << 20)

/* Postcopy: the destination's bytes before the switch, none zero. */
static uint8_t own_byte(uint64_t i)
{
	return (uint8_t)(0x40 + (i / PAGE) % 97 + i % 13);
}

/* A destination loading in a thread, with guarded RAM. */
struct dest {
	uint8_t *map;
	uint8_t *ram;
	int memfd;      /* unix: the block's own file, or -1 */
	char path[108]; /* unix: the socket */
	lmt_session *session;
	uint16_t port;
	pthread_t thread;
	int rc;
	bool postcopy;         /* postcopy=on: lmt_load_finish follows lmt_load_run */
	_Atomic bool switched; /* lmt_load_run returned 0 there */
	char error[600];
};

static void *run_dest(void *arg)
{
	struct dest *d = arg;
	d->rc = lmt_load_run(d->session);
	if (!d->rc && d->postcopy) {
		atomic_store(&d->switched, true);
		d->rc = lmt_load_finish(d->session);
	}
	snprintf(d->error, sizeof(d->error), "%s", lmt_session_error(d->session)->message);
	return NULL;
}

/* With `unix_path`, the block is a memfd's and the destination listens
 * there. */
static struct dest *start_dest_at(const char *opts, const char *unix_path)
{
	struct dest *d = calloc(1, sizeof(*d));
	d->memfd = -1;
	d->postcopy = strstr(opts, "postcopy=on") != NULL;
	d->map = mmap(NULL, BLOCK_BYTES + 2 * PAGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	assert_true(d->map != MAP_FAILED);
	d->ram = d->map + PAGE;
	assert_int_equal(mprotect(d->ram, BLOCK_BYTES, PROT_READ | PROT_WRITE), 0);
	/* Postcopy: the pages the destination holds before the switch, as
	 * precopy left them (see own_byte). */
	for (uint32_t i = 0; d->postcopy && i < BLOCK_BYTES; i++)
		d->ram[i] = own_byte(i);
	if (unix_path) {
		d->memfd = memfd_create("ram0", MFD_CLOEXEC);
		assert_int_equal(ftruncate(d->memfd, BLOCK_BYTES), 0);
		assert_true(mmap(d->ram, BLOCK_BYTES, PROT_READ | PROT_WRITE,
		                 MAP_SHARED | MAP_FIXED, d->memfd, 0) == d->ram);
		snprintf(d->path, sizeof(d->path), "%s", unix_path);
	}
	struct lmt_error err = {0};
	assert_int_equal(lmt_session_new(&d->session, LMT_ROLE_DESTINATION, "tcp", opts, &err), 0);
	if (unix_path)
		assert_int_equal(lmt_session_add_block_fd(d->session, "ram0", d->ram, BLOCK_BYTES,
		                                          PAGE, d->memfd, 0),
		                 0);
	else
		assert_int_equal(
		        lmt_session_add_block(d->session, "ram0", d->ram, BLOCK_BYTES, PAGE), 0);
	char uri[128];
	snprintf(uri, sizeof(uri), "unix:%s", d->path);
	assert_int_equal(lmt_load_listen(d->session, unix_path ? uri : "127.0.0.1:0", &d->port), 0);
	assert_int_equal(pthread_create(&d->thread, NULL, run_dest, d), 0);
	return d;
}

static struct dest *start_dest(const char *opts)
{
	return start_dest_at(opts, NULL);
}

/* Join the destination, check it failed with `code` and a message holding
 * `text`, and that its RAM is still all zero. */
static void finish_dest(struct dest *d, int code, const char *text)
{
	pthread_join(d->thread, NULL);
	if (d->rc != code || !strstr(d->error, text))
		fail_msg("destination returned %d '%s'; expected %d with '%s'", d->rc, d->error,
		         code, text);
	for (uint32_t i = 0; i < BLOCK_BYTES; i++)
		if (d->ram[i])
			fail_msg("destination RAM written at %u", i);
	if (d->memfd >= 0) {
		/* Still the block's own file at its address: nothing of the
		 * source's is mapped there. */
		assert_int_equal(pwrite(d->memfd, "own", 3, 0), 3);
		assert_memory_equal(d->ram, "own", 3);
		close(d->memfd);
	}
	lmt_session_free(d->session);
	munmap(d->map, BLOCK_BYTES + 2 * PAGE);
	free(d);
}

static int connect_to(uint16_t port)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_true(fd >= 0);
	assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	return fd;
}

static void send_bytes(int fd, const void *p, size_t n)
{
	assert_int_equal(send(fd, p, n, MSG_NOSIGNAL), (ssize_t)n);
}

static void send_buf(int fd, struct lmt_buf *b)
{
	send_bytes(fd, b->data, b->len);
}

static uint32_t reply_length; /* of the last read_reply */

/* Read one reply; returns its type (0 on EOF) and decodes a status. */
static uint16_t read_reply(int fd, struct lmt_msg_status *st, uint8_t *payload)
{
	uint8_t h[8];
	struct lmt_msg_header hdr;
	struct lmt_error err = {0};
	struct lmt__wait w = {.deadline_ns = lmt__now_ns() + 5000000000ull};
	if (lmt__net_recv_all(fd, h, 8, &w, NULL))
		return 0;
	assert_int_equal(lmt__dec_header(h, 8, &hdr, &err), 0);
	assert_int_equal(lmt__net_recv_all(fd, payload, hdr.length, &w, NULL), 0);
	reply_length = hdr.length;
	if (st && (hdr.type == LMT_MSG_HELLO_REPLY || hdr.type == LMT_MSG_ERROR ||
	           hdr.type == LMT_MSG_COMPLETE_ACK))
		assert_int_equal(lmt__dec_status(payload, hdr.length, hdr.type, st, &err), 0);
	return hdr.type;
}

/* A HELLO with every must-match option, at the destination's defaults but
 * for `channels` and postcopy=on when `postcopy`. */
static void encode_hello_with(struct lmt_buf *b, uint32_t magic, uint16_t version,
                              const char *plugin, const char *channels, bool postcopy)
{
	struct lmt_msg_hello *m = calloc(1, sizeof(*m));
	m->magic = magic;
	m->version = version;
	snprintf(m->plugin, sizeof(m->plugin), "%s", plugin);
	const char *names[] = {"chunk-size", "pin-all", "channels", "verify", "postcopy"};
	const char *values[] = {"1M", "off", channels, "off", postcopy ? "on" : "off"};
	m->option_count = 5;
	for (uint32_t i = 0; i < m->option_count; i++) {
		snprintf(m->options[i].name, sizeof(m->options[i].name), "%s", names[i]);
		snprintf(m->options[i].value, sizeof(m->options[i].value), "%s", values[i]);
	}
	assert_int_equal(lmt__enc_hello(b, m), 0);
	free(m);
}

static void encode_hello(struct lmt_buf *b, uint32_t magic, uint16_t version, const char *plugin,
                         const char *channels)
{
	encode_hello_with(b, magic, version, plugin, channels, false);
}

/* Send a valid HELLO and check the positive reply. */
static void hello_ok(int fd, struct lmt_buf *b, uint8_t *in)
{
	struct lmt_msg_status st;
	encode_hello(b, LMT_PROTO_MAGIC, LMT_PROTO_VERSION, "tcp", "1");
	send_buf(fd, b);
	assert_int_equal(read_reply(fd, &st, in), LMT_MSG_HELLO_REPLY);
	assert_int_equal(st.code, 0);
}

static void send_blocks(int fd, struct lmt_buf *b, const char *name, uint64_t length)
{
	struct lmt_msg_blocks *m = calloc(1, sizeof(*m));
	m->count = 1;
	snprintf(m->blocks[0].name, sizeof(m->blocks[0].name), "%s", name);
	m->blocks[0].length = length;
	m->blocks[0].page_size = PAGE;
	assert_int_equal(lmt__enc_blocks(b, m), 0);
	free(m);
	send_buf(fd, b);
}

struct fake {
	struct dest *d;
	int fd;
	struct lmt_buf out;
	uint8_t *in;
};

static struct fake *fake_start(const char *opts)
{
	struct fake *f = calloc(1, sizeof(*f));
	f->d = start_dest(opts);
	f->fd = connect_to(f->d->port);
	f->in = malloc(LMT_PROTO_MAX_PAYLOAD);
	return f;
}

static int connect_unix(const char *path)
{
	struct sockaddr_storage a;
	socklen_t len;
	char uri[128];
	snprintf(uri, sizeof(uri), "unix:%s", path);
	assert_int_equal(lmt__net_parse(uri, &a, &len, NULL), 0);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_true(fd >= 0);
	assert_int_equal(connect(fd, (struct sockaddr *)&a, len), 0);
	return fd;
}

static void fake_end(struct fake *f, int code, const char *text)
{
	shutdown(f->fd, SHUT_WR);
	finish_dest(f->d, code, text);
	close(f->fd);
	lmt__buf_free(&f->out);
	free(f->in);
	free(f);
}

/* A connection refused before its HELLO passed is dropped and the
 * destination goes on listening until its wait ends (idle-timeout); it
 * then fails with that connection's reason. Keep the wait short. */
#define BEFORE_HELLO "idle-timeout=300ms"

static void test_truncated_header_then_close(void **state)
{
	struct fake *f = fake_start(BEFORE_HELLO);
	send_bytes(f->fd, "\x01\x00\x00", 3);
	fake_end(f, -LMT_ECONN, "closed by peer");
}

static void test_unknown_message_type(void **state)
{
	struct fake *f = fake_start(BEFORE_HELLO);
	send_bytes(f->fd, "\x63\x00\x00\x00\x00\x00\x00\x00", 8);
	fake_end(f, -LMT_EPROTO, "unknown type 99");
}

static void test_huge_length(void **state)
{
	struct fake *f = fake_start(BEFORE_HELLO);
	send_bytes(f->fd, "\x01\x00\x00\x00\xff\xff\xff\x7f", 8);
	fake_end(f, -LMT_EPROTO, "over the limit");
}

static void test_bad_magic(void **state)
{
	struct fake *f = fake_start(BEFORE_HELLO);
	encode_hello(&f->out, 0xdeadbeef, LMT_PROTO_VERSION, "tcp", "1");
	send_buf(f->fd, &f->out);
	struct lmt_msg_status st;
	assert_int_equal(read_reply(f->fd, &st, f->in), LMT_MSG_HELLO_REPLY);
	assert_int_equal(st.code, -LMT_EPROTO);
	fake_end(f, -LMT_EPROTO, "bad magic");
}

static void test_wrong_protocol_version(void **state)
{
	struct fake *f = fake_start(BEFORE_HELLO);
	encode_hello(&f->out, LMT_PROTO_MAGIC, 9, "tcp", "1");
	send_buf(f->fd, &f->out);
	struct lmt_msg_status st;
	assert_int_equal(read_reply(f->fd, &st, f->in), LMT_MSG_HELLO_REPLY);
	assert_int_equal(st.code, -LMT_EPROTO);
	assert_non_null(strstr(st.text, "protocol version 9 is not supported"));
	char speaks[64];
	snprintf(speaks, sizeof(speaks), "this destination speaks %u", LMT_PROTO_VERSION);
	fake_end(f, -LMT_EPROTO, speaks);
}

static void test_other_plugin(void **state)
{
	struct fake *f = fake_start(BEFORE_HELLO);
	encode_hello(&f->out, LMT_PROTO_MAGIC, LMT_PROTO_VERSION, "ucx", "1");
	send_buf(f->fd, &f->out);
	fake_end(f, -LMT_EMISMATCH, "plugin: the source uses 'ucx', the destination 'tcp'");
}

static void test_option_mismatch_names_both_values(void **state)
{
	struct fake *f = fake_start(BEFORE_HELLO);
	encode_hello(&f->out, LMT_PROTO_MAGIC, LMT_PROTO_VERSION, "tcp", "2");
	send_buf(f->fd, &f->out);
	struct lmt_msg_status st;
	assert_int_equal(read_reply(f->fd, &st, f->in), LMT_MSG_HELLO_REPLY);
	assert_string_equal(st.text, "channels: the source has 2, the destination has 1");
	fake_end(f, -LMT_EMISMATCH, "channels: the source has 2, the destination has 1");
}

static void test_block_size_mismatch_names_block_and_sizes(void **state)
{
	struct fake *f = fake_start("");
	hello_ok(f->fd, &f->out, f->in);
	send_blocks(f->fd, &f->out, "ram0", 2 * BLOCK_BYTES);
	fake_end(f, -LMT_EMISMATCH,
	         "RAM block 'ram0': 2097152 bytes on the source, 1048576 on the destination");
}

static void test_block_name_mismatch(void **state)
{
	struct fake *f = fake_start("");
	hello_ok(f->fd, &f->out, f->in);
	send_blocks(f->fd, &f->out, "vram", BLOCK_BYTES);
	fake_end(f, -LMT_EMISMATCH, "the source calls it 'vram', the destination 'ram0'");
}

static void test_message_out_of_order(void **state)
{
	struct fake *f = fake_start("");
	hello_ok(f->fd, &f->out, f->in);
	assert_int_equal(lmt__enc_empty(&f->out, LMT_MSG_READY), 0);
	send_buf(f->fd, &f->out);
	fake_end(f, -LMT_EPROTO, "expected BLOCKS from the source, got READY");
}

static void test_garbage_address_blob(void **state)
{
	struct fake *f = fake_start("");
	hello_ok(f->fd, &f->out, f->in);
	send_blocks(f->fd, &f->out, "ram0", BLOCK_BYTES);
	struct lmt_msg_addrs *a = calloc(1, sizeof(*a));
	a->count = 1;
	a->addrs[0].len = 7;
	memcpy(a->addrs[0].data, "garbage", 7);
	assert_int_equal(lmt__enc_addrs(&f->out, a), 0);
	free(a);
	send_buf(f->fd, &f->out);
	fake_end(f, -LMT_EPROTO, "tcp");
}

static void test_wrong_channel_count(void **state)
{
	struct fake *f = fake_start("");
	hello_ok(f->fd, &f->out, f->in);
	send_blocks(f->fd, &f->out, "ram0", BLOCK_BYTES);
	struct lmt_msg_addrs *a = calloc(1, sizeof(*a));
	a->count = 3;
	for (int i = 0; i < 3; i++)
		a->addrs[i].len = 1;
	assert_int_equal(lmt__enc_addrs(&f->out, a), 0);
	free(a);
	send_buf(f->fd, &f->out);
	fake_end(f, -LMT_EPROTO, "the source opened 3 channels, expected 1");
}

/* ---- past the handshake: a real tcp source endpoint through the ABI ---- */

/* tcp.so loaded as lmt loads it, with the plugin test harness's host. */
struct abi_source {
	struct ph_config cfg;
	struct ph_run run;
	struct ph_side side;
	const struct lmt_plugin *p;
	lmt_instance *inst;
	lmt_endpoint *ep;
	lmt_endpoint *fault_ep; /* postcopy=on: the second channel, for faults */
};

static void abi_source_open(struct abi_source *src, uint32_t channels)
{
	struct lmt_error err = {0};
	const char *path = getenv("LMT_TEST_TCP_PLUGIN");
	assert_non_null(path);
	if (ph_load(&src->cfg, path, "", &err))
		fail_msg("cannot load %s: %s", path, err.message);
	src->run = (struct ph_run){.cfg = &src->cfg};
	ph_host_init(&src->side.host, &src->cfg, "source");
	if (!ph_instance_open(&src->run, &src->side, LMT_ROLE_SOURCE, channels, 5 * PH_SECOND))
		fail_msg("%s", src->run.why);
	src->p = src->cfg.plugin;
	src->inst = src->side.inst;
}

/* `channels` channels (1, or 2 with postcopy=on) connected through the
 * ABI; READY follows. */
static void connect_channels(struct fake *f, struct abi_source *src, uint32_t channels)
{
	abi_source_open(src, channels);
	lmt_endpoint **eps[2] = {&src->ep, &src->fault_ep};
	struct lmt_msg_addrs *a = calloc(1, sizeof(*a));
	a->count = channels;
	for (uint32_t c = 0; c < channels; c++)
		assert_int_equal(src->p->ops.ep_open(src->inst, c, eps[c], &a->addrs[c]), 0);
	assert_int_equal(lmt__enc_addrs(&f->out, a), 0);
	send_buf(f->fd, &f->out);
	assert_int_equal(read_reply(f->fd, NULL, f->in), LMT_MSG_EP_ADDRS);
	struct lmt_error err = {0};
	assert_int_equal(lmt__dec_addrs(f->in, reply_length, a, &err), 0);
	assert_int_equal(a->count, channels);
	for (uint32_t c = 0; c < channels; c++)
		assert_int_equal(src->p->ops.ep_connect(*eps[c], &a->addrs[c]), 0);
	free(a);
	assert_int_equal(read_reply(f->fd, NULL, f->in), LMT_MSG_READY);
}

static void connect_channel(struct fake *f, struct abi_source *src)
{
	connect_channels(f, src, 1);
}

/* Handshake with blocks and one connected channel; the destination then
 * waits for REG_REQ and friends. */
static struct fake *fake_connected(struct abi_source *src)
{
	struct fake *f = fake_start("");
	hello_ok(f->fd, &f->out, f->in);
	send_blocks(f->fd, &f->out, "ram0", BLOCK_BYTES);
	connect_channel(f, src);
	return f;
}

static void abi_source_close(struct abi_source *src)
{
	if (src->fault_ep)
		src->p->ops.ep_close(src->fault_ep);
	if (src->ep)
		src->p->ops.ep_close(src->ep);
	src->p->ops.instance_close(src->inst);
	ph_host_fini(&src->side.host);
	ph_unload(&src->cfg);
}

static void send_reg_req(struct fake *f, uint32_t block, uint64_t offset, uint64_t length)
{
	struct lmt_msg_regs *r = calloc(1, sizeof(*r));
	r->count = 1;
	r->regs[0] = (struct lmt_msg_reg){.block = block, .offset = offset, .length = length};
	assert_int_equal(lmt__enc_regs(&f->out, LMT_MSG_REG_REQ, r), 0);
	free(r);
	send_buf(f->fd, &f->out);
}

static void test_registration_beyond_the_block_is_refused(void **state)
{
	struct abi_source src = {0};
	struct fake *f = fake_connected(&src);
	send_reg_req(f, 0, 2 * BLOCK_BYTES, BLOCK_BYTES);
	fake_end(f, -LMT_EPROTO, "REG_REQ: block 0 offset 2097152 length 1048576 is not a window");
	abi_source_close(&src);
}

static void test_registration_of_an_unknown_block_is_refused(void **state)
{
	struct abi_source src = {0};
	struct fake *f = fake_connected(&src);
	send_reg_req(f, 7, 0, BLOCK_BYTES);
	fake_end(f, -LMT_EPROTO, "REG_REQ: block 7 offset 0");
	abi_source_close(&src);
}

static void test_registration_with_a_huge_length_is_refused(void **state)
{
	struct abi_source src = {0};
	struct fake *f = fake_connected(&src);
	send_reg_req(f, 0, 0, UINT64_MAX);
	fake_end(f, -LMT_EPROTO, "is not a window of a RAM block");
	abi_source_close(&src);
}

static void test_registering_a_window_twice_is_refused(void **state)
{
	struct abi_source src = {0};
	struct fake *f = fake_connected(&src);
	send_reg_req(f, 0, 0, BLOCK_BYTES);
	assert_int_equal(read_reply(f->fd, NULL, f->in), LMT_MSG_REG_REPLY);
	send_reg_req(f, 0, 0, BLOCK_BYTES);
	fake_end(f, -LMT_EPROTO, "registered twice");
	abi_source_close(&src);
}

static void test_device_state_out_of_order_is_refused(void **state)
{
	struct abi_source src = {0};
	struct fake *f = fake_connected(&src);
	uint8_t data[8] = {0};
	struct lmt_msg_state m = {.offset = 8, .total = 16, .length = 8, .data = data};
	assert_int_equal(lmt__enc_state(&f->out, &m), 0);
	send_buf(f->fd, &f->out);
	fake_end(f, -LMT_EPROTO, "DEVICE_STATE: the first piece is at 8");
	abi_source_close(&src);
}

static void test_complete_without_the_announced_state_is_refused(void **state)
{
	struct abi_source src = {0};
	struct fake *f = fake_connected(&src);
	struct lmt_msg_complete *m = calloc(1, sizeof(*m));
	m->state_length = 100;
	assert_int_equal(lmt__enc_complete(&f->out, m), 0);
	free(m);
	send_buf(f->fd, &f->out);
	struct lmt_msg_status st;
	assert_int_equal(read_reply(f->fd, &st, f->in), LMT_MSG_COMPLETE_ACK);
	assert_int_equal(st.code, -LMT_EPROTO);
	fake_end(f, -LMT_EPROTO, "device state: 100 bytes announced, 0 received");
	abi_source_close(&src);
}

static void send_landed(struct fake *f, uint32_t channels, uint64_t bytes)
{
	struct lmt_msg_landed m = {.channels = channels, .bytes = {bytes}};
	assert_int_equal(lmt__enc_landed(&f->out, &m), 0);
	send_buf(f->fd, &f->out);
}

/* The bytes landed are the destination's statistics: they only grow. */
static void test_landed_bytes_that_go_back_are_refused(void **state)
{
	struct abi_source src = {0};
	struct fake *f = fake_connected(&src);
	send_landed(f, 1, 8192);
	send_landed(f, 1, 4096);
	fake_end(f, -LMT_EPROTO, "LANDED: channel 0 went back from 8192 to 4096 bytes");
	abi_source_close(&src);
}

static void test_landed_for_other_channels_is_refused(void **state)
{
	struct abi_source src = {0};
	struct fake *f = fake_connected(&src);
	send_landed(f, 2, 0);
	fake_end(f, -LMT_EPROTO, "LANDED: 2 channels, expected 1");
	abi_source_close(&src);
}

static void test_digests_without_verify_are_refused(void **state)
{
	struct abi_source src = {0};
	struct fake *f = fake_connected(&src);
	struct lmt_msg_digests *m = calloc(1, sizeof(*m));
	m->count = 3;
	assert_int_equal(lmt__enc_digests(&f->out, m), 0);
	free(m);
	send_buf(f->fd, &f->out);
	fake_end(f, -LMT_EPROTO, "DIGESTS for block 'ram0', which is not verified");
	abi_source_close(&src);
}

/* The fake source is a faithful one: a write inside a registered window
 * lands and the load completes. */
static void test_fake_source_can_complete_a_load(void **state)
{
	struct abi_source src = {0};
	struct fake *f = fake_connected(&src);
	send_reg_req(f, 0, 0, BLOCK_BYTES);
	assert_int_equal(read_reply(f->fd, NULL, f->in), LMT_MSG_REG_REPLY);
	struct lmt_msg_regs *r = malloc(sizeof(*r));
	struct lmt_error err = {0};
	assert_int_equal(lmt__dec_regs(f->in, reply_length, LMT_MSG_REG_REPLY, r, &err), 0);
	lmt_rkey *rkey = NULL;
	assert_int_equal(src.p->ops.rkey_import(src.inst, &r->regs[0].key, &rkey), 0);
	free(r);
	static uint8_t page[PAGE];
	memset(page, 0x5a, sizeof(page));
	assert_int_equal(src.p->ops.write(src.ep, page, PAGE, NULL, rkey, 3 * PAGE, 77), 0);
	assert_int_equal(src.p->ops.flush(src.inst, 5000000000ull), 0);
	struct lmt_completion c;
	assert_int_equal(src.p->ops.progress(src.inst, &c, 1, 1000000000ull), 1);
	assert_int_equal(c.cookie, 77);
	assert_int_equal(c.status, 0);
	struct lmt_msg_complete *m = calloc(1, sizeof(*m));
	assert_int_equal(lmt__enc_complete(&f->out, m), 0);
	free(m);
	send_buf(f->fd, &f->out);
	struct lmt_msg_status st;
	assert_int_equal(read_reply(f->fd, &st, f->in), LMT_MSG_COMPLETE_ACK);
	assert_int_equal(st.code, 0);
	pthread_join(f->d->thread, NULL);
	assert_int_equal(f->d->rc, 0);
	assert_memory_equal(f->d->ram + 3 * PAGE, page, PAGE);
	assert_int_equal(f->d->ram[3 * PAGE - 1], 0);
	assert_int_equal(f->d->ram[4 * PAGE], 0);
	src.p->ops.rkey_release(src.inst, rkey);
	abi_source_close(&src);
	lmt_session_free(f->d->session);
	munmap(f->d->map, BLOCK_BYTES + 2 * PAGE);
	free(f->d);
	close(f->fd);
	lmt__buf_free(&f->out);
	free(f->in);
	free(f);
}

/* ---- unix: a hostile source at the handover ---- */

static void socket_path(char *buf, size_t size)
{
	const char *dir = getenv("TMPDIR");
	snprintf(buf, size, "%s/lmt-malformed-%d.sock", dir && *dir ? dir : "/tmp", (int)getpid());
}

/* Over unix: up to READY, ram0 taken by descriptor. */
static struct fake *fake_unix_connected(struct abi_source *src)
{
	char path[108];
	socket_path(path, sizeof(path));
	struct fake *f = calloc(1, sizeof(*f));
	f->d = start_dest_at("", path);
	f->fd = connect_unix(path);
	f->in = malloc(LMT_PROTO_MAX_PAYLOAD);
	hello_ok(f->fd, &f->out, f->in);
	send_blocks(f->fd, &f->out, "ram0", BLOCK_BYTES);
	struct lmt_msg_fd_flags offer = {.count = 1, .flags = {1}};
	assert_int_equal(lmt__enc_fd_flags(&f->out, LMT_MSG_FD_OFFER, &offer), 0);
	send_buf(f->fd, &f->out);
	assert_int_equal(read_reply(f->fd, NULL, f->in), LMT_MSG_FD_ACCEPT);
	struct lmt_error err = {0};
	assert_int_equal(lmt__dec_fd_flags(f->in, reply_length, LMT_MSG_FD_ACCEPT, &offer, &err),
	                 0);
	assert_int_equal(offer.flags[0], 1);
	connect_channel(f, src);
	return f;
}

/* The digest of the pages the destination samples (docs/protocol.md). */
static uint64_t sampled_digest(int fd)
{
	uint8_t *p = mmap(NULL, BLOCK_BYTES, PROT_READ, MAP_SHARED, fd, 0);
	assert_true(p != MAP_FAILED);
	uint64_t n = BLOCK_BYTES / PAGE, pages[3] = {0, n / 2, n - 1};
	XXH3_state_t st;
	XXH3_64bits_reset(&st);
	for (int i = 0; i < 3; i++)
		XXH3_64bits_update(&st, p + pages[i] * PAGE, PAGE);
	munmap(p, BLOCK_BYTES);
	return XXH3_64bits_digest(&st);
}

static int guest_file(uint64_t size, uint8_t fill)
{
	int fd = memfd_create("guest", MFD_CLOEXEC);
	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, (off_t)size), 0);
	uint8_t page[PAGE];
	memset(page, fill, sizeof(page));
	assert_int_equal(pwrite(fd, page, sizeof(page), 0), PAGE);
	return fd;
}

/* FD_HANDOVER for ram0 at offset 0 with `digest`, passing fds[0..n). */
static void send_handover(struct fake *f, const int *fds, unsigned n, uint64_t digest)
{
	struct lmt_msg_fd_handover *m = calloc(1, sizeof(*m));
	m->count = 1;
	m->entries[0] = (struct lmt_msg_fd_entry){.block = 0, .offset = 0, .digest = digest};
	assert_int_equal(lmt__enc_fd_handover(&f->out, m), 0);
	free(m);
	struct lmt__wait w = {.deadline_ns = lmt__now_ns() + 5000000000ull};
	assert_int_equal(lmt__net_send_fds(f->fd, f->out.data, f->out.len, fds, n, &w, NULL), 0);
}

static void hostile_handover(const int *fds, unsigned n, uint64_t digest, int code,
                             const char *text)
{
	struct abi_source src = {0};
	struct fake *f = fake_unix_connected(&src);
	send_handover(f, fds, n, digest);
	fake_end(f, code, text);
	abi_source_close(&src);
}

static void test_handover_of_a_too_small_file_is_refused(void **state)
{
	int fd = guest_file(BLOCK_BYTES / 2, 1);
	hostile_handover(&fd, 1, 0, -LMT_EPROTO,
	                 "block 'ram0': the file holds 524288 bytes, fewer than offset 0 + length "
	                 "1048576: refused");
	close(fd);
}

static void test_handover_of_a_pipe_is_refused(void **state)
{
	int p[2];
	assert_int_equal(pipe(p), 0);
	hostile_handover(&p[0], 1, 0, -LMT_EPROTO,
	                 "block 'ram0': the descriptor is not a memory file");
	close(p[0]);
	close(p[1]);
}

static void test_handover_of_a_socket_is_refused(void **state)
{
	int sv[2];
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	hostile_handover(&sv[0], 1, 0, -LMT_EPROTO,
	                 "block 'ram0': the descriptor is not a memory file");
	close(sv[0]);
	close(sv[1]);
}

static void test_handover_with_more_descriptors_than_blocks_is_refused(void **state)
{
	int fds[3] = {guest_file(BLOCK_BYTES, 1), guest_file(BLOCK_BYTES, 2),
	              guest_file(BLOCK_BYTES, 3)};
	hostile_handover(fds, 3, sampled_digest(fds[0]), -LMT_EPROTO,
	                 "FD_HANDOVER: 3 descriptors passed for 1 blocks: refused");
	for (int i = 0; i < 3; i++)
		close(fds[i]);
}

static void test_handover_of_a_file_that_is_not_the_guest_is_refused(void **state)
{
	int fd = guest_file(BLOCK_BYTES, 7);
	hostile_handover(&fd, 1, sampled_digest(fd) ^ 1, -LMT_EVERIFY,
	                 "block 'ram0': the file is not the guest's memory the source describes");
	close(fd);
}

/* A good file handed over, then the source goes: the destination gives
 * the block its own memory back. */
static void test_a_source_gone_after_the_handover_leaves_the_destination_its_own(void **state)
{
	int fd = guest_file(BLOCK_BYTES, 9);
	hostile_handover(&fd, 1, sampled_digest(fd), -LMT_ECONN, "source");
	close(fd);
}

static void test_descriptors_with_another_message_are_refused(void **state)
{
	struct abi_source src = {0};
	struct fake *f = fake_unix_connected(&src);
	int fd = guest_file(BLOCK_BYTES, 1);
	uint8_t data[8] = {0};
	struct lmt_msg_state m = {.offset = 0, .total = 8, .length = 8, .data = data};
	assert_int_equal(lmt__enc_state(&f->out, &m), 0);
	struct lmt__wait w = {.deadline_ns = lmt__now_ns() + 5000000000ull};
	assert_int_equal(lmt__net_send_fds(f->fd, f->out.data, f->out.len, &fd, 1, &w, NULL), 0);
	fake_end(f, -LMT_EPROTO, "the source passed 1 descriptor(s) with DEVICE_STATE");
	abi_source_close(&src);
	close(fd);
}

static void test_registration_of_a_block_handed_over_is_refused(void **state)
{
	struct abi_source src = {0};
	struct fake *f = fake_unix_connected(&src);
	send_reg_req(f, 0, 0, BLOCK_BYTES);
	fake_end(f, -LMT_EPROTO, "REG_REQ: block 'ram0' is handed over by descriptor, not written");
	abi_source_close(&src);
}

/* ---- postcopy: a hostile source at and after the switch ---- */

#define PC_PAGES (BLOCK_BYTES / PAGE) /* ram0's 256 pages */
#define PC_COMING 0xffffull           /* pages [0, 16) are announced */
#define PC_COUNT 16u
#define STAGED 0x5au /* what the fake source writes into staging slots */

/* What the destination's lmt_load_run checks first with postcopy=on. */
static bool userfaultfd_available(char *why, size_t size)
{
	int fd = open("/dev/userfaultfd", O_RDWR | O_CLOEXEC);
	if (fd < 0)
		fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
	if (fd >= 0) {
		close(fd);
		return true;
	}
	snprintf(why, size, "userfaultfd cannot be opened here (%s): postcopy needs it",
	         strerror(errno));
	return false;
}

#define REQUIRE_USERFAULTFD()                                                                      \
	do {                                                                                       \
		char why_[160];                                                                    \
		if (!userfaultfd_available(why_, sizeof(why_))) {                                  \
			print_message("skipped: %s\n", why_);                                      \
			skip();                                                                    \
		}                                                                                  \
	} while (0)

/* A fake source past its handshake with postcopy=on, and what the
 * destination's POSTCOPY_ACK lent it. */
struct pc_fake {
	struct fake *f;
	struct abi_source src;
	uint64_t coming; /* pages [0, 64) announced, a bit each */
	uint64_t staged; /* of them, those that must hold STAGED in the end */
	uint32_t slot_size, slots;
	lmt_rkey *staging;
};

/* HELLO with postcopy=on, BLOCKS, both channels (the second for faults)
 * connected, READY read. */
static void pc_connect(struct pc_fake *pc, const char *opts)
{
	pc->f = fake_start(opts);
	struct fake *f = pc->f;
	struct lmt_msg_status st;
	encode_hello_with(&f->out, LMT_PROTO_MAGIC, LMT_PROTO_VERSION, "tcp", "1", true);
	send_buf(f->fd, &f->out);
	assert_int_equal(read_reply(f->fd, &st, f->in), LMT_MSG_HELLO_REPLY);
	assert_int_equal(st.code, 0);
	send_blocks(f->fd, &f->out, "ram0", BLOCK_BYTES);
	connect_channels(f, &pc->src, 2);
}

/* The next reply other than a keep-alive, or a fault's PAGE_REQ unless
 * that is what is wanted. */
static uint16_t pc_reply(struct fake *f, uint16_t want, struct lmt_msg_status *st)
{
	for (;;) {
		uint16_t type = read_reply(f->fd, st, f->in);
		if (type == LMT_MSG_PING || type == LMT_MSG_PONG ||
		    (type == LMT_MSG_PAGE_REQ && want != LMT_MSG_PAGE_REQ))
			continue;
		return type;
	}
}

/* POSTCOPY_PAGES: bits [first, first + 64) of a block's bitmap. */
static void send_coming(struct fake *f, uint32_t block, uint64_t first, uint64_t bits)
{
	uint8_t le[8];
	for (int i = 0; i < 8; i++)
		le[i] = (uint8_t)(bits >> (8 * i));
	struct lmt_msg_pc_pages m = {.block = block, .first = first, .words = 1, .bits = le};
	assert_int_equal(lmt__enc_pc_pages(&f->out, &m), 0);
	send_buf(f->fd, &f->out);
}

static void send_switch(struct fake *f, uint64_t pages)
{
	struct lmt_msg_postcopy m = {.passes = 1, .state_length = 0, .pages = pages};
	assert_int_equal(lmt__enc_postcopy(&f->out, &m), 0);
	send_buf(f->fd, &f->out);
}

/* Announce pages [0, 16), switch, and take the staging area. */
static void pc_switch(struct pc_fake *pc)
{
	struct fake *f = pc->f;
	pc->coming = PC_COMING;
	send_coming(f, 0, 0, pc->coming);
	send_switch(f, PC_COUNT);
	assert_int_equal(pc_reply(f, LMT_MSG_POSTCOPY_ACK, NULL), LMT_MSG_POSTCOPY_ACK);
	struct lmt_msg_pc_ack *ack = malloc(sizeof(*ack));
	struct lmt_error err = {0};
	assert_int_equal(lmt__dec_pc_ack(f->in, reply_length, ack, &err), 0);
	if (ack->code)
		fail_msg("the destination refused the switch: %s", ack->text);
	pc->slot_size = ack->slot_size;
	pc->slots = ack->slots;
	assert_int_equal(pc->src.p->ops.rkey_import(pc->src.inst, &ack->key, &pc->staging), 0);
	free(ack);
}

static void send_pages(struct fake *f, uint32_t channels, uint64_t bytes0,
                       const struct lmt_msg_pc_entry *entries, uint32_t count)
{
	struct lmt_msg_pages *m = calloc(1, sizeof(*m));
	m->channels = channels;
	m->bytes[0] = bytes0;
	m->count = count;
	memcpy(m->entries, entries, count * sizeof(*entries));
	assert_int_equal(lmt__enc_pages(&f->out, m), 0);
	free(m);
	send_buf(f->fd, &f->out);
}

static void send_done(struct fake *f, uint64_t pages)
{
	struct lmt_msg_pc_done m = {.pages = pages};
	assert_int_equal(lmt__enc_pc_done(&f->out, &m), 0);
	send_buf(f->fd, &f->out);
}

/* Write `npages` pages of STAGED into staging slot `slot` on channel 0
 * and wait for the write to complete. */
static void stage(struct pc_fake *pc, uint32_t slot, uint32_t npages)
{
	static uint8_t data[64 << 10];
	assert_true(npages * PAGE <= sizeof(data));
	memset(data, STAGED, sizeof(data));
	const struct lmt_plugin *p = pc->src.p;
	assert_int_equal(p->ops.write(pc->src.ep, data, npages * PAGE, NULL, pc->staging,
	                              (uint64_t)slot * pc->slot_size, 1000 + slot),
	                 0);
	assert_int_equal(p->ops.flush(pc->src.inst, 5000000000ull), 0);
	struct lmt_completion c;
	assert_int_equal(p->ops.progress(pc->src.inst, &c, 1, 1000000000ull), 1);
	assert_int_equal(c.status, 0);
}

/* A page of the destination's RAM, read without faulting: false when it
 * is inaccessible (a page a failed postcopy never got). */
static bool read_page(const uint8_t *at, uint8_t *out)
{
	struct iovec local = {.iov_base = out, .iov_len = PAGE};
	struct iovec remote = {.iov_base = (void *)at, .iov_len = PAGE};
	return process_vm_readv(getpid(), &local, 1, &remote, 1, 0) == PAGE;
}

#define ANY_FAILURE 1 /* for pc_finish: whichever negative code */

/* Join the destination; it failed with `code` and a message holding
 * `text` (or completed, with code 0). Once the session is freed (no page
 * waits on userfaultfd any more): every page not announced holds what it
 * held before the switch, bit for bit; an announced one holds zero or
 * what the fake staged, or is inaccessible, and those in pc->staged hold
 * what was staged. */
static void pc_finish(struct pc_fake *pc, int code, const char *text)
{
	struct fake *f = pc->f;
	struct dest *d = f->d;
	shutdown(f->fd, SHUT_WR);
	pthread_join(d->thread, NULL);
	if ((code == ANY_FAILURE ? d->rc >= 0 : d->rc != code) || !strstr(d->error, text))
		fail_msg("destination returned %d '%s'; expected %d with '%s'", d->rc, d->error,
		         code, text);
	/* Announced pages: the guest ran (lmt_load_run returned 0); none:
	 * the load ended before the switch. */
	if (atomic_load(&d->switched) != (pc->coming != 0))
		fail_msg("the load %s the switch", pc->coming ? "ended before" : "went past");
	if (pc->staging)
		pc->src.p->ops.rkey_release(pc->src.inst, pc->staging);
	lmt_session_free(d->session);
	static uint8_t page[PAGE];
	for (uint64_t p = 0; p < PC_PAGES; p++) {
		bool readable = read_page(d->ram + p * PAGE, page);
		bool announced = p < 64 && ((pc->coming >> p) & 1);
		if (!announced) {
			if (!readable)
				fail_msg("page %llu was not announced and is inaccessible",
				         (unsigned long long)p);
			for (uint32_t i = 0; i < PAGE; i++)
				if (page[i] != own_byte(p * PAGE + i))
					fail_msg("page %llu, not announced, changed at byte %u",
					         (unsigned long long)p, i);
			continue;
		}
		if (((pc->staged >> p) & 1) && (!readable || page[0] != STAGED))
			fail_msg("page %llu does not hold what was staged for it",
			         (unsigned long long)p);
		for (uint32_t i = 1; readable && i < PAGE; i++)
			if (page[i] != page[0] || (page[0] != 0 && page[0] != STAGED))
				fail_msg("announced page %llu is neither zero nor staged",
				         (unsigned long long)p);
	}
	abi_source_close(&pc->src);
	close(f->fd);
	munmap(d->map, BLOCK_BYTES + 2 * PAGE);
	free(d);
	lmt__buf_free(&f->out);
	free(f->in);
	free(f);
}

/* Past the switch, one PAGES message with these entries. */
static void hostile_pages(const struct lmt_msg_pc_entry *entries, uint32_t count, int code,
                          const char *text)
{
	REQUIRE_USERFAULTFD();
	struct pc_fake pc = {0};
	pc_connect(&pc, "postcopy=on");
	pc_switch(&pc);
	send_pages(pc.f, 2, 0, entries, count);
	pc_finish(&pc, code, text);
}

/* The fake source is a faithful one: the pages it announces land where
 * it says, the others keep what the destination held, and the load
 * completes. */
static void test_fake_source_can_complete_a_postcopy(void **state)
{
	REQUIRE_USERFAULTFD();
	struct pc_fake pc = {0};
	pc_connect(&pc, "postcopy=on");
	pc_switch(&pc);
	assert_true(pc.slot_size >= PC_COUNT * PAGE);
	stage(&pc, 3, PC_COUNT);
	struct lmt_msg_pc_entry e = {.slot = 3, .run = {.block = 0, .page = 0, .npages = PC_COUNT}};
	send_pages(pc.f, 2, PC_COUNT * PAGE, &e, 1);
	assert_int_equal(pc_reply(pc.f, LMT_MSG_SLOTS_FREE, NULL), LMT_MSG_SLOTS_FREE);
	struct lmt_msg_slots *freed = malloc(sizeof(*freed));
	struct lmt_error err = {0};
	assert_int_equal(lmt__dec_slots(pc.f->in, reply_length, freed, &err), 0);
	assert_int_equal(freed->count, 1);
	assert_int_equal(freed->slots[0], 3);
	free(freed);
	send_done(pc.f, PC_COUNT);
	struct lmt_msg_status st;
	assert_int_equal(pc_reply(pc.f, LMT_MSG_COMPLETE_ACK, &st), LMT_MSG_COMPLETE_ACK);
	assert_int_equal(st.code, 0);
	pc.staged = PC_COMING;
	pc_finish(&pc, 0, "");
}

static void test_postcopy_pages_naming_a_page_not_announced_are_refused(void **state)
{
	struct lmt_msg_pc_entry e = {.slot = LMT_PROTO_ZERO_SLOT, .run = {0, 100, 1}};
	hostile_pages(&e, 1, -LMT_EPROTO,
	              "PAGES: page 100 of block 'ram0' is not one still to come");
}

static void test_postcopy_pages_naming_a_page_twice_are_refused(void **state)
{
	struct lmt_msg_pc_entry e[2] = {{.slot = LMT_PROTO_ZERO_SLOT, .run = {0, 2, 4}},
	                                {.slot = LMT_PROTO_ZERO_SLOT, .run = {0, 5, 1}}};
	hostile_pages(e, 2, -LMT_EPROTO, "PAGES: page 5 of block 'ram0' is not one still to come");
}

static void test_postcopy_pages_from_a_slot_out_of_range_are_refused(void **state)
{
	/* The destination lends 256 slots; the codec's limit is 4096. */
	struct lmt_msg_pc_entry e = {.slot = 256, .run = {0, 0, 1}};
	hostile_pages(&e, 1, -LMT_EPROTO, "PAGES: slot 256 cannot hold 1 pages of block 'ram0'");
	e.slot = 4096;
	hostile_pages(&e, 1, -LMT_EPROTO, "PAGES message: slot out of range");
}

static void test_postcopy_pages_longer_than_a_slot_are_refused(void **state)
{
	/* Slots are 64 KiB: 16 pages. The run would read past its slot. */
	REQUIRE_USERFAULTFD();
	struct pc_fake pc = {0};
	pc_connect(&pc, "postcopy=on");
	pc.coming = ~0ull;
	send_coming(pc.f, 0, 0, pc.coming);
	send_switch(pc.f, 64);
	assert_int_equal(pc_reply(pc.f, LMT_MSG_POSTCOPY_ACK, NULL), LMT_MSG_POSTCOPY_ACK);
	struct lmt_msg_pc_entry e = {.slot = 255, .run = {0, 0, 17}};
	send_pages(pc.f, 2, 0, &e, 1);
	pc_finish(&pc, -LMT_EPROTO, "PAGES: slot 255 cannot hold 17 pages of block 'ram0'");
}

static void test_postcopy_pages_of_a_block_out_of_range_are_refused(void **state)
{
	struct lmt_msg_pc_entry e = {.slot = LMT_PROTO_ZERO_SLOT, .run = {1, 0, 1}};
	hostile_pages(&e, 1, -LMT_EPROTO, "PAGES: pages 0+1 of block 1 are not the guest's");
}

static void test_postcopy_pages_past_the_end_of_the_block_are_refused(void **state)
{
	struct lmt_msg_pc_entry e = {.slot = LMT_PROTO_ZERO_SLOT, .run = {0, 250, 7}};
	hostile_pages(&e, 1, -LMT_EPROTO, "PAGES: pages 250+7 of block 0 are not the guest's");
}

static void test_postcopy_pages_for_other_channels_are_refused(void **state)
{
	REQUIRE_USERFAULTFD();
	struct pc_fake pc = {0};
	pc_connect(&pc, "postcopy=on");
	pc_switch(&pc);
	struct lmt_msg_pc_entry e = {.slot = LMT_PROTO_ZERO_SLOT, .run = {0, 0, 1}};
	send_pages(pc.f, 1, 0, &e, 1);
	pc_finish(&pc, -LMT_EPROTO, "PAGES: 1 channel counts for 2 channels");
}

static void test_postcopy_announcement_after_the_switch_is_refused(void **state)
{
	REQUIRE_USERFAULTFD();
	struct pc_fake pc = {0};
	pc_connect(&pc, "postcopy=on");
	pc_switch(&pc);
	send_coming(pc.f, 0, 64, 1);
	pc_finish(&pc, -LMT_EPROTO, "postcopy: unexpected POSTCOPY_PAGES from the source");
}

static void test_postcopy_announcement_of_a_block_out_of_range_is_refused(void **state)
{
	REQUIRE_USERFAULTFD();
	struct pc_fake pc = {0};
	pc_connect(&pc, "postcopy=on");
	send_coming(pc.f, 3, 0, 1);
	pc_finish(&pc, -LMT_EPROTO, "POSTCOPY_PAGES: block 3 is not one copied");
}

static void test_postcopy_announcement_past_the_end_of_the_block_is_refused(void **state)
{
	REQUIRE_USERFAULTFD();
	struct pc_fake pc = {0};
	pc_connect(&pc, "postcopy=on");
	send_coming(pc.f, 0, PC_PAGES, 1);
	pc_finish(&pc, -LMT_EPROTO, "POSTCOPY_PAGES: pages past the end of block 'ram0'");
}

/* The count POSTCOPY carries must be the pages announced: the switch is
 * refused, and nothing of the guest's RAM is dropped. */
static void test_postcopy_with_a_wrong_page_count_is_refused(void **state)
{
	REQUIRE_USERFAULTFD();
	struct pc_fake pc = {0}; /* pc.coming 0: every page must stay as it was */
	pc_connect(&pc, "postcopy=on");
	send_coming(pc.f, 0, 0, PC_COMING);
	send_switch(pc.f, PC_COUNT + 1);
	assert_int_equal(pc_reply(pc.f, LMT_MSG_POSTCOPY_ACK, NULL), LMT_MSG_POSTCOPY_ACK);
	struct lmt_msg_pc_ack *ack = malloc(sizeof(*ack));
	struct lmt_error err = {0};
	assert_int_equal(lmt__dec_pc_ack(pc.f->in, reply_length, ack, &err), 0);
	assert_int_equal(ack->code, -LMT_EPROTO);
	assert_non_null(strstr(ack->text, "17 pages announced, POSTCOPY_PAGES named 16"));
	free(ack);
	pc_finish(&pc, -LMT_EPROTO, "POSTCOPY: 17 pages announced, POSTCOPY_PAGES named 16");
}

static void test_postcopy_done_with_pages_missing_is_refused(void **state)
{
	REQUIRE_USERFAULTFD();
	struct pc_fake pc = {0};
	pc_connect(&pc, "postcopy=on");
	pc_switch(&pc);
	struct lmt_msg_pc_entry e = {.slot = LMT_PROTO_ZERO_SLOT, .run = {0, 0, 10}};
	send_pages(pc.f, 2, 0, &e, 1);
	send_done(pc.f, PC_COUNT);
	pc_finish(&pc, -LMT_EPROTO, "POSTCOPY_DONE with 6 pages still missing");
}

static void test_postcopy_done_that_miscounts_the_pages_is_refused(void **state)
{
	REQUIRE_USERFAULTFD();
	struct pc_fake pc = {0};
	pc_connect(&pc, "postcopy=on");
	pc_switch(&pc);
	struct lmt_msg_pc_entry e = {.slot = LMT_PROTO_ZERO_SLOT, .run = {0, 0, PC_COUNT}};
	send_pages(pc.f, 2, 0, &e, 1);
	send_done(pc.f, PC_COUNT + 1);
	pc_finish(&pc, -LMT_EPROTO,
	          "POSTCOPY_DONE: the source counts 17 pages sent, 16 were placed");
}

static void test_postcopy_without_postcopy_on_is_refused(void **state)
{
	struct abi_source src = {0};
	struct fake *f = fake_connected(&src);
	send_switch(f, 0);
	fake_end(f, -LMT_EPROTO, "POSTCOPY without postcopy=on");
	abi_source_close(&src);
}

static void test_postcopy_announcement_without_postcopy_on_is_refused(void **state)
{
	struct abi_source src = {0};
	struct fake *f = fake_connected(&src);
	send_coming(f, 0, 0, 1);
	fake_end(f, -LMT_EPROTO, "POSTCOPY_PAGES without postcopy=on");
	abi_source_close(&src);
}

/* A "vCPU" waiting on a page that the hostile source never sends: the
 * failure lets it go (the page is made inaccessible: its read fails with
 * EFAULT, a user-mode access would get SIGSEGV) instead of leaving it
 * blocked. The read is a write(2) from the page, so the wait is in the
 * kernel and no signal is involved. */
struct waiter {
	pthread_t thread;
	const uint8_t *page;
	_Atomic bool done;
	ssize_t n;
	int err;
};

static void *wait_on_page(void *arg)
{
	struct waiter *w = arg;
	int p[2];
	assert_int_equal(pipe(p), 0);
	w->n = write(p[1], w->page, 1);
	w->err = w->n < 0 ? errno : 0;
	close(p[0]);
	close(p[1]);
	atomic_store(&w->done, true);
	return NULL;
}

static void test_a_thread_waiting_on_a_page_is_let_go_when_the_source_turns_hostile(void **state)
{
	REQUIRE_USERFAULTFD();
	struct pc_fake pc = {0};
	pc_connect(&pc, "postcopy=on");
	pc_switch(&pc);
	struct waiter w = {.page = pc.f->d->ram + 5 * PAGE};
	assert_int_equal(pthread_create(&w.thread, NULL, wait_on_page, &w), 0);
	/* Its fault reached the source: it waits. */
	assert_int_equal(pc_reply(pc.f, LMT_MSG_PAGE_REQ, NULL), LMT_MSG_PAGE_REQ);
	struct lmt_msg_page_req *req = malloc(sizeof(*req));
	struct lmt_error err = {0};
	assert_int_equal(lmt__dec_page_req(pc.f->in, reply_length, req, &err), 0);
	assert_int_equal(req->pages[0].page, 5);
	free(req);
	usleep(20000);
	assert_false(atomic_load(&w.done));
	struct lmt_msg_pc_entry e = {.slot = LMT_PROTO_ZERO_SLOT, .run = {0, 100, 1}};
	send_pages(pc.f, 2, 0, &e, 1);
	/* Failed: the thread is let go within a few seconds at most. */
	for (int i = 0; i < 500 && !atomic_load(&w.done); i++)
		usleep(10000);
	if (!atomic_load(&w.done))
		fail_msg("a thread waiting on an announced page is still blocked");
	pthread_join(w.thread, NULL);
	assert_int_equal(w.n, -1);
	assert_int_equal(w.err, EFAULT);
	pc_finish(&pc, -LMT_EPROTO, "PAGES: page 100 of block 'ram0' is not one still to come");
}

/* The windows the source registered before the switch are the guest's
 * RAM: once the guest runs there, nothing may write them but the
 * placement of announced pages. A write through a window's key after
 * the switch must not land: the destination releases the windows at the
 * switch. */
static void test_a_window_registered_before_the_switch_is_not_written_after_it(void **state)
{
	REQUIRE_USERFAULTFD();
	struct pc_fake pc = {0};
	pc_connect(&pc, "postcopy=on");
	send_reg_req(pc.f, 0, 0, BLOCK_BYTES);
	assert_int_equal(pc_reply(pc.f, LMT_MSG_REG_REPLY, NULL), LMT_MSG_REG_REPLY);
	struct lmt_msg_regs *r = malloc(sizeof(*r));
	struct lmt_error err = {0};
	assert_int_equal(lmt__dec_regs(pc.f->in, reply_length, LMT_MSG_REG_REPLY, r, &err), 0);
	lmt_rkey *window = NULL;
	assert_int_equal(pc.src.p->ops.rkey_import(pc.src.inst, &r->regs[0].key, &window), 0);
	free(r);
	pc_switch(&pc);
	/* The guest runs at the destination: page 100 (not announced) is its. */
	static uint8_t data[PAGE];
	memset(data, 0xee, sizeof(data));
	const struct lmt_plugin *p = pc.src.p;
	int rc = p->ops.write(pc.src.ep, data, PAGE, NULL, window, 100 * PAGE, 7);
	if (!rc)
		rc = p->ops.flush(pc.src.inst, 2000000000ull);
	struct lmt_completion c = {0};
	if (!rc && p->ops.progress(pc.src.inst, &c, 1, 1000000000ull) == 1)
		rc = c.status;
	usleep(50000);
	uint8_t page[PAGE];
	assert_true(read_page(pc.f->d->ram + 100 * PAGE, page));
	bool written = page[0] == 0xee;
	p->ops.rkey_release(pc.src.inst, window);
	if (written)
		fail_msg("a write through a window registered before the switch landed in the "
		         "running guest's page 100 (write status %d)",
		         rc);
	pc_finish(&pc, ANY_FAILURE, "");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_truncated_header_then_close),
	        cmocka_unit_test(test_unknown_message_type),
	        cmocka_unit_test(test_huge_length),
	        cmocka_unit_test(test_bad_magic),
	        cmocka_unit_test(test_wrong_protocol_version),
	        cmocka_unit_test(test_landed_bytes_that_go_back_are_refused),
	        cmocka_unit_test(test_landed_for_other_channels_is_refused),
	        cmocka_unit_test(test_digests_without_verify_are_refused),
	        cmocka_unit_test(test_other_plugin),
	        cmocka_unit_test(test_option_mismatch_names_both_values),
	        cmocka_unit_test(test_block_size_mismatch_names_block_and_sizes),
	        cmocka_unit_test(test_block_name_mismatch),
	        cmocka_unit_test(test_message_out_of_order),
	        cmocka_unit_test(test_garbage_address_blob),
	        cmocka_unit_test(test_wrong_channel_count),
	        cmocka_unit_test(test_registration_beyond_the_block_is_refused),
	        cmocka_unit_test(test_registration_of_an_unknown_block_is_refused),
	        cmocka_unit_test(test_registration_with_a_huge_length_is_refused),
	        cmocka_unit_test(test_registering_a_window_twice_is_refused),
	        cmocka_unit_test(test_device_state_out_of_order_is_refused),
	        cmocka_unit_test(test_complete_without_the_announced_state_is_refused),
	        cmocka_unit_test(test_fake_source_can_complete_a_load),
	        cmocka_unit_test(test_handover_of_a_too_small_file_is_refused),
	        cmocka_unit_test(test_handover_of_a_pipe_is_refused),
	        cmocka_unit_test(test_handover_of_a_socket_is_refused),
	        cmocka_unit_test(test_handover_with_more_descriptors_than_blocks_is_refused),
	        cmocka_unit_test(test_handover_of_a_file_that_is_not_the_guest_is_refused),
	        cmocka_unit_test(
	                test_a_source_gone_after_the_handover_leaves_the_destination_its_own),
	        cmocka_unit_test(test_descriptors_with_another_message_are_refused),
	        cmocka_unit_test(test_registration_of_a_block_handed_over_is_refused),
	        cmocka_unit_test(test_fake_source_can_complete_a_postcopy),
	        cmocka_unit_test(test_postcopy_pages_naming_a_page_not_announced_are_refused),
	        cmocka_unit_test(test_postcopy_pages_naming_a_page_twice_are_refused),
	        cmocka_unit_test(test_postcopy_pages_from_a_slot_out_of_range_are_refused),
	        cmocka_unit_test(test_postcopy_pages_longer_than_a_slot_are_refused),
	        cmocka_unit_test(test_postcopy_pages_of_a_block_out_of_range_are_refused),
	        cmocka_unit_test(test_postcopy_pages_past_the_end_of_the_block_are_refused),
	        cmocka_unit_test(test_postcopy_pages_for_other_channels_are_refused),
	        cmocka_unit_test(test_postcopy_announcement_after_the_switch_is_refused),
	        cmocka_unit_test(test_postcopy_announcement_of_a_block_out_of_range_is_refused),
	        cmocka_unit_test(test_postcopy_announcement_past_the_end_of_the_block_is_refused),
	        cmocka_unit_test(test_postcopy_with_a_wrong_page_count_is_refused),
	        cmocka_unit_test(test_postcopy_done_with_pages_missing_is_refused),
	        cmocka_unit_test(test_postcopy_done_that_miscounts_the_pages_is_refused),
	        cmocka_unit_test(test_postcopy_without_postcopy_on_is_refused),
	        cmocka_unit_test(test_postcopy_announcement_without_postcopy_on_is_refused),
	        cmocka_unit_test(
	                test_a_thread_waiting_on_a_page_is_let_go_when_the_source_turns_hostile),
	        cmocka_unit_test(
	                test_a_window_registered_before_the_switch_is_not_written_after_it),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
