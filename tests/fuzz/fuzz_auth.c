/* libFuzzer harness: a destination that holds a key, fed by a source that
 * answers its challenge. The first byte picks where the input starts:
 *   0 — from the first byte on the wire (HELLOs, AUTHs, keep-alives,
 *       garbage before anything was accepted);
 *   1 — after a valid keyed HELLO and its reply: the input stands where
 *       AUTH belongs (wrong, short, long proofs, other messages);
 *   2 — after the right AUTH, computed from the destination's nonce: the
 *       input is what an authenticated source sends next.
 * A thread plays the source over a socketpair, since the right proof needs
 * the destination's fresh nonce. The transport is the null test plugin.
 * Whatever the input, the load must end with an error or a completed load,
 * never crash, leak or touch memory outside its RAM block. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "auth.h"
#include "net.h"
#include "proto.h"
#include "engines.h"
#include "session.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

#define BLOCK (256u << 10)
#define PAGE 4096u
#define KEY "fuzz-shared-key"

static uint8_t *ram;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	uint8_t *map = mmap(NULL, BLOCK + 2 * PAGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (map == MAP_FAILED || mprotect(map + PAGE, BLOCK, PROT_READ | PROT_WRITE))
		abort();
	ram = map + PAGE;
	setenv("LMT_LOG", "error", 0);
	if (!dlopen(FUZZ_NULL_PLUGIN, RTLD_NOW | RTLD_NODELETE))
		abort();
	return 0;
}

struct source {
	int fd;
	unsigned mode;
	const uint8_t *rest;
	size_t rest_len;
};

static int send_all(int fd, const uint8_t *p, size_t n)
{
	struct lmt__wait w = {.deadline_ns = lmt__now_ns() + 1000000000ull};
	struct lmt__net_error e;
	return lmt__net_send_all(fd, p, n, &w, &e);
}

/* The destination's HELLO_REPLY: 0 with its nonce, or -1. */
static int read_reply(int fd, uint8_t nonce[LMT_PROTO_NONCE])
{
	uint8_t h[LMT_PROTO_HEADER_SIZE], *payload = malloc(LMT_PROTO_MAX_PAYLOAD);
	struct lmt__wait w = {.deadline_ns = lmt__now_ns() + 1000000000ull};
	struct lmt_msg_header hdr;
	struct lmt_msg_status st;
	struct lmt_error err = {0};
	int rc = -1;
	if (payload && !lmt__net_recv_all(fd, h, sizeof(h), &w, NULL) &&
	    !lmt__dec_header(h, sizeof(h), &hdr, &err) && hdr.type == LMT_MSG_HELLO_REPLY &&
	    !lmt__net_recv_all(fd, payload, hdr.length, &w, NULL) &&
	    !lmt__dec_status(payload, hdr.length, LMT_MSG_HELLO_REPLY, &st, &err) && st.code == 0 &&
	    st.auth) {
		memcpy(nonce, st.nonce, LMT_PROTO_NONCE);
		rc = 0;
	}
	free(payload);
	return rc;
}

static void *play_source(void *arg)
{
	struct source *src = arg;
	struct lmt_buf msg = {0};
	int ok = 1;
	if (src->mode >= 1) {
		struct lmt_msg_hello *h = calloc(1, sizeof(*h));
		h->magic = LMT_PROTO_MAGIC;
		h->version = LMT_PROTO_VERSION;
		strcpy(h->plugin, "null");
		const char *names[] = {"chunk-size", "pin-all", "channels", "verify", "postcopy"};
		const char *values[] = {"64K", "off", "1", "on", "off"};
		for (int i = 0; i < 5; i++) {
			strcpy(h->options[i].name, names[i]);
			strcpy(h->options[i].value, values[i]);
		}
		h->option_count = 5;
		h->auth = 1;
		memset(h->nonce, 0x5a, sizeof(h->nonce));
		uint8_t theirs[LMT_PROTO_NONCE];
		ok = !lmt__enc_hello(&msg, h) && !send_all(src->fd, msg.data, msg.len) &&
		     !read_reply(src->fd, theirs);
		if (ok && src->mode >= 2) {
			struct lmt_auth_key key = {.bytes = (uint8_t *)KEY, .len = strlen(KEY)};
			uint8_t proof[LMT_AUTH_PROOF];
			ok = !lmt__auth_proof(&key, LMT_AUTH_LABEL_SOURCE, theirs, h->nonce, proof) &&
			     !lmt__enc_auth(&msg, proof) && !send_all(src->fd, msg.data, msg.len);
		}
		free(h);
	}
	if (ok && src->rest_len)
		send_all(src->fd, src->rest, src->rest_len);
	lmt__buf_free(&msg);
	shutdown(src->fd, SHUT_WR);
	/* Read whatever the destination says until it closes. */
	char sink[4096];
	struct pollfd p = {.fd = src->fd, .events = POLLIN};
	while (poll(&p, 1, 2000) > 0 && recv(src->fd, sink, sizeof(sink), 0) > 0)
		;
	return NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1 || size > (1u << 20))
		return 0;
	struct source src = {.mode = data[0] % 3, .rest = data + 1, .rest_len = size - 1};
	int fds[2];
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds))
		abort();
	int big = 4 << 20;
	setsockopt(fds[0], SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
	setsockopt(fds[1], SOL_SOCKET, SO_RCVBUF, &big, sizeof(big));
	src.fd = fds[0];
	pthread_t t;
	if (pthread_create(&t, NULL, play_source, &src))
		abort();
	struct lmt_error err;
	lmt_session *s = NULL;
	if (lmt_session_new(&s, LMT_ROLE_DESTINATION, FUZZ_NULL_PLUGIN,
	                    "auth-key=" KEY ",chunk-size=64K,verify=on,idle-timeout=50ms,"
	                    "connect-timeout=200ms",
	                    &err))
		abort();
	if (lmt_session_add_block(s, "ram0", ram, BLOCK, PAGE))
		abort();
	lmt__load_connected(s, fds[1]);
	lmt_session_free(s);
	pthread_join(t, NULL);
	close(fds[0]);
	return 0;
}
