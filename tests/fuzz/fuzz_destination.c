/* libFuzzer harness: a destination session fed a control stream. The first
 * byte picks the state to fuzz in — before HELLO, after HELLO, after BLOCKS,
 * or after the channels are up (READY sent) — whether pin-all is on, and
 * whether postcopy=on; with postcopy=on after READY, optionally past the
 * switch: the next 8 bytes are the bitmap of the block's 64 pages that
 * POSTCOPY_PAGES announces, and the prefix ends with POSTCOPY, so that the
 * input is what the source sends once the guest runs (PAGES,
 * POSTCOPY_DONE). A valid prefix brings the session there, then the input
 * follows. The transport is the null test plugin, so no network is
 * involved. Whatever the input, the session must end with an error or a
 * completed load, never crash, leak or touch memory outside its RAM
 * block; with postcopy=on, a page the switch did not announce keeps what
 * the guest had, and an announced one ends zero (the null transport
 * writes no staging slot) or inaccessible (a failed postcopy). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "proto.h"
#include "engines.h"
#include "session.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

#define BLOCK (256u << 10)
#define PAGE 4096u
#define NPAGES (BLOCK / PAGE) /* 64: one bitmap word */

/* The lead byte. */
#define LEAD_STATE 3u     /* 0 fresh, 1 after HELLO, 2 after BLOCKS, 3 after READY */
#define LEAD_PIN_ALL 4u   /* pin-all=on */
#define LEAD_POSTCOPY 8u  /* postcopy=on (and verify=off, which it needs) */
#define LEAD_SWITCHED 16u /* postcopy=on after READY: past POSTCOPY */

static uint8_t *ram;

/* The guest's bytes before the input: every page its own, none zero. */
static uint8_t guest_byte(uint64_t i)
{
	return (uint8_t)(1 + (i / PAGE * 7 + i % 251) % 255);
}

static void fill_guest(void)
{
	for (uint64_t i = 0; i < BLOCK; i++)
		ram[i] = guest_byte(i);
}

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
	if (!msg->len)
		return;
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

static void prefix(struct lmt_buf *all, unsigned state, bool pin_all, bool postcopy)
{
	struct lmt_buf msg = {0};
	if (state >= 1) {
		struct lmt_msg_hello *h = calloc(1, sizeof(*h));
		h->magic = LMT_PROTO_MAGIC;
		h->version = LMT_PROTO_VERSION;
		strcpy(h->plugin, "null");
		const char *names[] = {"chunk-size", "pin-all", "channels", "verify", "postcopy"};
		const char *values[] = {"64K", pin_all ? "on" : "off", "1", postcopy ? "off" : "on",
		                        postcopy ? "on" : "off"};
		for (int i = 0; i < 5; i++) {
			strcpy(h->options[i].name, names[i]);
			strcpy(h->options[i].value, values[i]);
		}
		h->option_count = 5;
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
		/* postcopy=on: one more channel, for the faults */
		struct lmt_msg_addrs *a = calloc(1, sizeof(*a));
		a->count = postcopy ? 2 : 1;
		for (uint32_t i = 0; i < a->count; i++) {
			a->addrs[i].len = sizeof("null-ep");
			memcpy(a->addrs[i].data, "null-ep", sizeof("null-ep"));
		}
		lmt__enc_addrs(&msg, a);
		add(all, &msg);
		free(a);
	}
	lmt__buf_free(&msg);
}

/* Past the switch: `coming` announced, POSTCOPY with its count. */
static void switch_prefix(struct lmt_buf *all, uint64_t coming)
{
	struct lmt_buf msg = {0};
	uint8_t bits[8];
	for (int i = 0; i < 8; i++)
		bits[i] = (uint8_t)(coming >> (8 * i));
	struct lmt_msg_pc_pages m = {.block = 0, .first = 0, .words = 1, .bits = bits};
	if (coming) {
		lmt__enc_pc_pages(&msg, &m);
		add(all, &msg);
	}
	struct lmt_msg_postcopy sw = {.passes = 1, .pages = (uint64_t)__builtin_popcountll(coming)};
	lmt__enc_postcopy(&msg, &sw);
	add(all, &msg);
	lmt__buf_free(&msg);
}

/* After a postcopy=on session: each page is the guest's, zero, or (a
 * failed postcopy) inaccessible; only announced pages may have changed,
 * when the announcement is known. Then the block is made afresh. */
static void check_guest(bool known, uint64_t coming)
{
	static uint8_t page[PAGE];
	for (uint64_t p = 0; p < NPAGES; p++) {
		struct iovec local = {.iov_base = page, .iov_len = PAGE};
		struct iovec remote = {.iov_base = ram + p * PAGE, .iov_len = PAGE};
		bool readable = process_vm_readv(getpid(), &local, 1, &remote, 1, 0) == PAGE;
		bool guests = readable, zero = readable;
		for (uint64_t i = 0; readable && i < PAGE; i++) {
			guests &= page[i] == guest_byte(p * PAGE + i);
			zero &= page[i] == 0;
		}
		bool announced = !known || ((coming >> p) & 1);
		if (!guests && !(announced && (zero || !readable))) {
			fprintf(stderr,
			        "fuzz_destination: page %llu of ram0 is %s after the session\n",
			        (unsigned long long)p,
			        !readable ? "inaccessible"
			        : zero    ? "zero"
			                  : "neither the guest's nor zero");
			abort();
		}
	}
	if (mmap(ram, BLOCK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1,
	         0) != ram)
		abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1 || size > (1u << 20))
		return 0;
	unsigned state = data[0] & LEAD_STATE;
	bool pin_all = data[0] & LEAD_PIN_ALL;
	bool postcopy = data[0] & LEAD_POSTCOPY;
	bool switched = postcopy && state == 3 && (data[0] & LEAD_SWITCHED);
	const uint8_t *rest = data + 1;
	size_t left = size - 1;
	uint64_t coming = 0;
	if (switched) {
		for (int i = 0; i < 8 && left; i++, left--)
			coming |= (uint64_t)*rest++ << (8 * i);
	}
	struct lmt_buf all = {0};
	prefix(&all, state, pin_all, postcopy);
	if (switched)
		switch_prefix(&all, coming);
	struct lmt_buf input = {.data = (uint8_t *)rest, .len = left};
	add(&all, &input);
	if (postcopy)
		fill_guest();

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

	char opts[200];
	snprintf(opts, sizeof(opts),
	         "chunk-size=64K,pin-all=%s,verify=%s,postcopy=%s,idle-timeout=20ms,"
	         "connect-timeout=20ms",
	         pin_all ? "on" : "off", postcopy ? "off" : "on", postcopy ? "on" : "off");
	struct lmt_error err;
	lmt_session *s = NULL;
	if (lmt_session_new(&s, LMT_ROLE_DESTINATION, FUZZ_NULL_PLUGIN, opts, &err))
		abort();
	if (lmt_session_add_block(s, "ram0", ram, BLOCK, PAGE))
		abort();
	int rc = lmt__load_connected(s, fds[1]);
	/* Switched to postcopy: the rest comes behind the running guest. */
	if (!rc && postcopy && s->postcopy)
		rc = lmt_load_finish(s);
	if (rc && (rc <= -LMT_ERRC_COUNT || lmt_session_error(s)->code != rc ||
	           !lmt_session_error(s)->message[0])) {
		fprintf(stderr,
		        "fuzz_destination: failed with %d, the session's error is %d '%s'\n", rc,
		        lmt_session_error(s)->code, lmt_session_error(s)->message);
		abort();
	}
	if (getenv("FUZZ_DESTINATION_VERBOSE"))
		fprintf(stderr, "fuzz_destination: %s%s; %llu pages placed after the switch\n",
		        rc ? "failed: " : "completed", rc ? lmt_session_error(s)->message : "",
		        (unsigned long long)s->stats.postcopy_pages);
	lmt_session_free(s);
	close(fds[0]);
	if (postcopy)
		check_guest(switched, coming);
	return 0;
}
