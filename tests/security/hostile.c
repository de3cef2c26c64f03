/* The hostile peer of the security suite (see hostile.h). */
#define _GNU_SOURCE
#include "hostile.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <lmt/plugin.h>

#include "harness.h"
#include "net.h"
#include "wire.h"

/* ---- the destination ---- */

static void *dest_thread(void *arg)
{
	struct guard_dest *d = arg;
	d->rc = lmt_load_run(d->session);
	d->ended_ns = lmt__now_ns();
	snprintf(d->error, sizeof(d->error), "%s", lmt_session_error(d->session)->message);
	if (d->rc == 0)
		lmt_load_device_state(d->session, &d->state, &d->state_len);
	return NULL;
}

struct guard_dest *guard_dest_start(uint64_t ram_bytes, const char *opts)
{
	struct guard_dest *d = calloc(1, sizeof(*d));
	assert_non_null(d);
	guest_ram_layout(&d->ram, ram_map(ram_bytes), ram_bytes);
	d->session = session_on(LMT_ROLE_DESTINATION, &d->ram, "tcp", opts);
	assert_int_equal(lmt_load_listen(d->session, "127.0.0.1:0", &d->port), 0);
	d->thread = malloc(sizeof(pthread_t));
	d->started_ns = lmt__now_ns();
	assert_int_equal(pthread_create(d->thread, NULL, dest_thread, d), 0);
	return d;
}

void guard_dest_join(struct guard_dest *d)
{
	if (!d->thread)
		return;
	pthread_join(*(pthread_t *)d->thread, NULL);
	free(d->thread);
	d->thread = NULL;
}

bool guard_dest_done(struct guard_dest *d)
{
	return d->ended_ns != 0;
}

bool guard_ram_untouched(const struct guard_dest *d)
{
	for (uint64_t i = 0; i < d->ram.bytes; i++)
		if (d->ram.base[i])
			return false;
	return true;
}

void guard_dest_free(struct guard_dest *d)
{
	guard_dest_join(d);
	lmt_session_free(d->session);
	munmap(d->ram.base, d->ram.bytes);
	free(d);
}

const char *guard_key_file(const char *key)
{
	static char path[64];
	snprintf(path, sizeof(path), "/tmp/lmt-guard-key-XXXXXX");
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	char text[256];
	int n = snprintf(text, sizeof(text), "%s\n", key);
	assert_int_equal(write(fd, text, (size_t)n), n);
	close(fd);
	return path;
}

/* ---- raw control connections ---- */

int hostile_connect(uint16_t port)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_true(fd >= 0);
	if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0)
		fail_msg("connect to port %u: %s", port, strerror(errno));
	return fd;
}

void hostile_send(int fd, const void *data, size_t len)
{
	struct lmt__wait w = {.deadline_ns = lmt__now_ns() + 5000000000ull};
	struct lmt__net_error e;
	if (lmt__net_send_all(fd, data, len, &w, &e))
		fail_msg("sending %zu bytes: %s", len, e.msg);
}

void hostile_send_buf(int fd, const struct lmt_buf *b)
{
	hostile_send(fd, b->data, b->len);
}

uint16_t hostile_recv(int fd, uint8_t *payload, uint32_t *len, int timeout_ms)
{
	uint8_t raw[LMT_PROTO_HEADER_SIZE];
	struct lmt__wait w = {.deadline_ns = lmt__now_ns() + (uint64_t)timeout_ms * 1000000};
	struct lmt_msg_header h;
	struct lmt_error err = {0};
	do {
		if (lmt__net_recv_all(fd, raw, sizeof(raw), &w, NULL))
			return 0;
		assert_int_equal(lmt__dec_header(raw, sizeof(raw), &h, &err), 0);
		assert_int_equal(lmt__net_recv_all(fd, payload, h.length, &w, NULL), 0);
		/* The destination's keep-alives come whenever a second passes
		 * without a message: they answer nothing here. */
	} while (h.type == LMT_MSG_PING || h.type == LMT_MSG_PONG);
	*len = h.length;
	return h.type;
}

bool hostile_closed_by_peer(int fd, int timeout_ms)
{
	uint64_t end = lmt__now_ns() + (uint64_t)timeout_ms * 1000000;
	for (;;) {
		uint64_t now = lmt__now_ns();
		if (now >= end)
			return false;
		struct pollfd p = {.fd = fd, .events = POLLIN};
		if (poll(&p, 1, (int)((end - now) / 1000000) + 1) <= 0)
			continue;
		char c[512];
		ssize_t n = recv(fd, c, sizeof(c), 0);
		if (n <= 0)
			return true; /* end of stream, or reset */
	}
}

struct lmt_msg_hello *hostile_hello(bool auth)
{
	struct lmt_msg_hello *m = calloc(1, sizeof(*m));
	m->magic = LMT_PROTO_MAGIC;
	m->version = LMT_PROTO_VERSION;
	snprintf(m->plugin, sizeof(m->plugin), "tcp");
	const char *names[] = {"chunk-size", "pin-all", "channels", "verify", "postcopy"};
	const char *values[] = {"1M", "off", "1", "off", "off"};
	for (int i = 0; i < 5; i++) {
		snprintf(m->options[i].name, sizeof(m->options[i].name), "%s", names[i]);
		snprintf(m->options[i].value, sizeof(m->options[i].value), "%s", values[i]);
	}
	m->option_count = 5;
	m->auth = auth;
	for (unsigned i = 0; i < LMT_PROTO_NONCE; i++)
		m->nonce[i] = (uint8_t)(rand() & 0xff);
	return m;
}

void hostile_proof(const char *key, const char *label, const uint8_t *first,
                   const uint8_t *second, uint8_t out[LMT_PROTO_PROOF])
{
	uint8_t msg[128];
	size_t n = strlen(label);
	memcpy(msg, label, n);
	memcpy(msg + n, first, LMT_PROTO_NONCE);
	memcpy(msg + n + LMT_PROTO_NONCE, second, LMT_PROTO_NONCE);
	unsigned int len = 0;
	assert_non_null(HMAC(EVP_sha256(), key, (int)strlen(key), msg, n + 2 * LMT_PROTO_NONCE,
	                     out, &len));
	assert_int_equal(len, LMT_PROTO_PROOF);
}

int hostile_handshake(int fd, const char *key, bool good, char *text, size_t size)
{
	struct lmt_msg_hello *m = hostile_hello(key != NULL);
	struct lmt_buf b = {0};
	assert_int_equal(lmt__enc_hello(&b, m), 0);
	hostile_send_buf(fd, &b);
	uint8_t *in = malloc(LMT_PROTO_MAX_PAYLOAD);
	uint32_t len = 0;
	struct lmt_msg_status st = {0};
	struct lmt_error err = {0};
	assert_int_equal(hostile_recv(fd, in, &len, 5000), LMT_MSG_HELLO_REPLY);
	assert_int_equal(lmt__dec_status(in, len, LMT_MSG_HELLO_REPLY, &st, &err), 0);
	if (text)
		snprintf(text, size, "%s", st.text);
	if (st.code == 0 && key) {
		assert_int_equal(st.auth, 1);
		uint8_t want[LMT_PROTO_PROOF], proof[LMT_PROTO_PROOF];
		/* The destination proves the key first (to one who holds it). */
		hostile_proof(key, "lmt v1 destination proof", m->nonce, st.nonce, want);
		if (good)
			assert_memory_equal(want, st.proof, LMT_PROTO_PROOF);
		hostile_proof(key, "lmt v1 source proof", st.nonce, m->nonce, proof);
		if (!good)
			proof[0] ^= 1;
		assert_int_equal(lmt__enc_auth(&b, proof), 0);
		hostile_send_buf(fd, &b);
	}
	free(in);
	free(m);
	lmt__buf_free(&b);
	return st.code;
}

/* ---- a tcp source endpoint through the ABI ---- */

#define PLUGIN(h) ((h)->cfg.plugin)

static struct lmt_msg_addrs peer_addrs;

void hostile_source_open(struct hostile_source *h, uint16_t port, const char *key,
                         const struct guest_ram *ram)
{
	memset(h, 0, sizeof(*h));
	h->in = malloc(LMT_PROTO_MAX_PAYLOAD);
	h->fd = hostile_connect(port);
	assert_int_equal(hostile_handshake(h->fd, key, true, NULL, 0), 0);

	struct lmt_msg_blocks *bl = calloc(1, sizeof(*bl));
	bl->count = ram->nblocks;
	for (uint32_t i = 0; i < ram->nblocks; i++) {
		snprintf(bl->blocks[i].name, sizeof(bl->blocks[i].name), "%s", ram->blocks[i].name);
		bl->blocks[i].length = ram->blocks[i].length;
		bl->blocks[i].page_size = GUEST_PAGE_SIZE;
	}
	assert_int_equal(lmt__enc_blocks(&h->out, bl), 0);
	free(bl);
	hostile_send_buf(h->fd, &h->out);

	const char *path = getenv("LMT_TEST_TCP_PLUGIN");
	assert_non_null(path);
	struct lmt_error err = {0};
	if (ph_load(&h->cfg, path, "", &err))
		fail_msg("cannot load %s: %s", path, err.message);
	struct ph_run run = {.cfg = &h->cfg};
	ph_host_init(&h->side.host, &h->cfg, "source");
	if (!ph_instance_open(&run, &h->side, LMT_ROLE_SOURCE, 1, 5 * PH_SECOND))
		fail_msg("%s", run.why);
	struct lmt_msg_addrs *a = calloc(1, sizeof(*a));
	a->count = 1;
	assert_int_equal(PLUGIN(h)->ops.ep_open(h->side.inst, 0, &h->side.ep[0], &a->addrs[0]), 0);
	assert_int_equal(lmt__enc_addrs(&h->out, a), 0);
	free(a);
	hostile_send_buf(h->fd, &h->out);
	assert_int_equal(hostile_recv(h->fd, h->in, &h->in_len, 5000), LMT_MSG_EP_ADDRS);
	assert_int_equal(lmt__dec_addrs(h->in, h->in_len, &peer_addrs, &err), 0);
	struct tcp_dst_addr da;
	assert_null(tcp_dst_addr_decode(&peer_addrs.addrs[0], &da));
	h->data_port = da.port;
}

int hostile_source_connect(struct hostile_source *h)
{
	if (PLUGIN(h)->ops.ep_connect(h->side.ep[0], &peer_addrs.addrs[0]))
		return -1;
	return hostile_recv(h->fd, h->in, &h->in_len, 10000) == LMT_MSG_READY ? 0 : -1;
}

int hostile_source_write_all(struct hostile_source *h, const struct guest_ram *ram)
{
	const struct lmt_plugin *p = PLUGIN(h);
	const uint64_t window = 1u << 20; /* chunk-size */
	uint64_t cookie = 0, done = 0;
	lmt_rkey *keys[64];
	unsigned nkeys = 0;
	struct lmt_error err = {0};
	struct lmt_msg_regs *r = calloc(1, sizeof(*r));
	for (uint32_t b = 0; b < ram->nblocks; b++) {
		for (uint64_t off = 0; off < ram->blocks[b].length; off += window) {
			uint64_t len = ram->blocks[b].length - off < window
			                       ? ram->blocks[b].length - off
			                       : window;
			r->count = 1;
			r->regs[0] = (struct lmt_msg_reg){.block = b, .offset = off, .length = len};
			assert_int_equal(lmt__enc_regs(&h->out, LMT_MSG_REG_REQ, r), 0);
			hostile_send_buf(h->fd, &h->out);
			if (hostile_recv(h->fd, h->in, &h->in_len, 5000) != LMT_MSG_REG_REPLY)
				return -1;
			assert_int_equal(lmt__dec_regs(h->in, h->in_len, LMT_MSG_REG_REPLY, r, &err),
			                 0);
			assert_true(nkeys < 64);
			assert_int_equal(p->ops.rkey_import(h->side.inst, &r->regs[0].key, &keys[nkeys]),
			                 0);
			assert_int_equal(p->ops.write(h->side.ep[0], ram->blocks[b].host + off, len, NULL,
			                              keys[nkeys], 0, cookie++),
			                 0);
			nkeys++;
		}
	}
	free(r);
	if (p->ops.flush(h->side.inst, 10000000000ull))
		return -1;
	struct lmt_completion c[16];
	while (done < cookie) {
		int n = p->ops.progress(h->side.inst, c, 16, 1000000000ull);
		if (n <= 0)
			return -1;
		for (int i = 0; i < n; i++)
			if (c[i].status)
				return -1;
		done += (uint64_t)n;
	}
	for (unsigned i = 0; i < nkeys; i++)
		p->ops.rkey_release(h->side.inst, keys[i]);
	return 0;
}

void hostile_source_close(struct hostile_source *h)
{
	const struct lmt_plugin *p = PLUGIN(h);
	if (p) {
		if (h->side.ep[0])
			p->ops.ep_close(h->side.ep[0]);
		if (h->side.inst)
			p->ops.instance_close(h->side.inst);
		ph_host_fini(&h->side.host);
		ph_unload(&h->cfg);
	}
	close(h->fd);
	lmt__buf_free(&h->out);
	free(h->in);
	memset(h, 0, sizeof(*h));
}
