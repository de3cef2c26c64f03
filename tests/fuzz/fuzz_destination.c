/* libFuzzer harness: a destination session fed a control stream. The first
 * byte picks the state to fuzz in — before HELLO, after HELLO, after BLOCKS,
 * or after the channels are up (READY sent) — and whether pin-all is on; a
 * valid prefix brings the session there, then the input follows. The
 * transport is the null test plugin, so no network is involved. Whatever
 * the input, the session must end with an error or a completed load, never
 * crash, leak or touch memory outside its RAM block. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "proto.h"
#include "session.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

#define BLOCK (256u << 10)
#define PAGE 4096u

static uint8_t *ram;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	/* The block sits between guard pages: a stray write faults. */
	uint8_t *map = mmap(NULL, BLOCK + 2 * PAGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (map == MAP_FAILED || mprotect(map + PAGE, BLOCK, PROT_READ | PROT_WRITE))
		abort();
	ram = map + PAGE;
	setenv("LMT_LOG", "error", 0);
	/* Each session loads and unloads the plugin; keep its code (and its
	 * coverage counters, which libFuzzer reads) mapped in between. */
	if (!dlopen(FUZZ_NULL_PLUGIN, RTLD_NOW | RTLD_NODELETE))
		abort();
	return 0;
}

static void add(struct lmt_buf *all, struct lmt_buf *msg)
{
	size_t need = all->len + msg->len;
	if (need > all->cap) {
		all->data = realloc(all->data, need);
		if (!all->data)
			abort();
		all->cap = need;
	}
	memcpy(all->data + all->len, msg->data, msg->len);
	all->len = need;
}

static void prefix(struct lmt_buf *all, unsigned state, bool pin_all)
{
	struct lmt_buf msg = {0};
	if (state >= 1) {
		struct lmt_msg_hello *h = calloc(1, sizeof(*h));
		h->magic = LMT_PROTO_MAGIC;
		h->version = LMT_PROTO_VERSION;
		strcpy(h->plugin, "null");
		const char *names[] = {"chunk-size", "pin-all", "channels", "verify"};
		const char *values[] = {"64K", pin_all ? "on" : "off", "1", "on"};
		for (int i = 0; i < 4; i++) {
			strcpy(h->options[i].name, names[i]);
			strcpy(h->options[i].value, values[i]);
		}
		h->option_count = 4;
		lmt__enc_hello(&msg, h);
		add(all, &msg);
		free(h);
	}
	if (state >= 2) {
		struct lmt_msg_blocks *b = calloc(1, sizeof(*b));
		b->count = 1;
		strcpy(b->blocks[0].name, "ram0");
		b->blocks[0].length = BLOCK;
		b->blocks[0].page_size = PAGE;
		lmt__enc_blocks(&msg, b);
		add(all, &msg);
		free(b);
	}
	if (state >= 3) {
		struct lmt_msg_addrs *a = calloc(1, sizeof(*a));
		a->count = 1;
		a->addrs[0].len = sizeof("null-ep");
		memcpy(a->addrs[0].data, "null-ep", sizeof("null-ep"));
		lmt__enc_addrs(&msg, a);
		add(all, &msg);
		free(a);
	}
	lmt__buf_free(&msg);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1 || size > (1u << 20))
		return 0;
	unsigned state = data[0] & 3;
	bool pin_all = data[0] & 4;
	struct lmt_buf all = {0};
	prefix(&all, state, pin_all);
	struct lmt_buf input = {.data = (uint8_t *)data + 1, .len = size - 1};
	add(&all, &input);

	int fds[2];
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds))
		abort();
	int big = 4 << 20;
	setsockopt(fds[0], SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
	setsockopt(fds[1], SOL_SOCKET, SO_RCVBUF, &big, sizeof(big));
	setsockopt(fds[1], SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
	if (all.len && write(fds[0], all.data, all.len) != (ssize_t)all.len)
		abort();
	shutdown(fds[0], SHUT_WR);
	free(all.data);

	char opts[160];
	snprintf(opts, sizeof(opts),
	         "chunk-size=64K,pin-all=%s,verify=on,idle-timeout=20ms,connect-timeout=20ms",
	         pin_all ? "on" : "off");
	struct lmt_error err;
	lmt_session *s = NULL;
	if (lmt_session_new(&s, LMT_ROLE_DESTINATION, FUZZ_NULL_PLUGIN, opts, &err))
		abort();
	if (lmt_session_add_block(s, "ram0", ram, BLOCK, PAGE))
		abort();
	lmt__load_connected(s, fds[1]);
	lmt_session_free(s);
	close(fds[0]);
	return 0;
}
