/* libFuzzer harness: the source engine facing a malicious destination. The
 * session runs the real source engine (setup, iterate, complete; or with
 * postcopy=on the switch and lmt_save_finish) over the
 * real tcp plugin; a thread plays the destination on the control
 * connection, following a script taken from the input (source_script.h),
 * and another plays the tcp data side: it accepts the source's channels,
 * reads its writes and acknowledges them. Every address blob the source is
 * given points at that data listener, and connect() in this process refuses
 * any other IP address, so no input reaches the network.
 *
 * Invariants, each checked on every input:
 * - the source's guest RAM is mapped read-only between guard pages: a
 *   write to it faults;
 * - a call that fails returns a negative LMT_E* code that the session's
 *   error repeats, with a message;
 * - each data connection opens with the token of an address blob the
 *   destination sent for that channel; each write names a key the
 *   destination gave, stays inside it, is in sequence, and carries exactly
 *   the source RAM of the place the key stands for;
 * - a completed migration had a COMPLETE_ACK sent to it, and every write
 *   the data side received was acknowledged;
 * - postcopy: POSTCOPY counts the pages POSTCOPY_PAGES announced (all of
 *   them inside their blocks); writes into the staging area start at a
 *   slot, fit in it, and never touch a slot the destination holds (named
 *   in PAGES and not freed yet); each PAGES entry names pages announced
 *   and not sent before, inside their block, a slot that exists and holds
 *   the run's pages, and carries the run's source RAM in its slot (once
 *   the write landed) or names pages that are zero; POSTCOPY_DONE comes
 *   after every announced page was sent, and counts them;
 * - descriptors and threads are back to what they were, and an input takes
 *   less than INPUT_LIMIT_NS (LeakSanitizer checks memory). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "../../plugins/tcp/wire.h"
#include "auth.h"
#include "bytes.h"
#include "net.h"
#include "proto.h"
#include "engines.h"
#include "session.h"
#include "source_script.h"
#define FUZZ_NAME "fuzz_source"
#include "script.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

#define PAGE 4096u
#define NBLOCKS 2u
#define KEY "fuzz-source-key"
#define EXPECT_WAIT_NS 100000000ull   /* one SRC_OP_EXPECT */
#define EXPECT_BUDGET_NS 400000000ull /* all of an input's */
#define PAUSE_BUDGET_MS 60u
#define MAX_KEYS 512u
#define MAX_TOKENS 64u
#define INPUT_LIMIT_NS 8000000000ull
#define MAX_CHANNELS 3u          /* two, and postcopy's for faults */
#define PAYLOAD_MAX (256u << 10) /* the largest write any key allows: a block */
/* the staging area's tcp region id: far above the windows' ids, which
 * count up from 0x5000 over the whole run */
#define STAGING_REGION 0x5354414749000000ull
#define STAGING_BLOCK NBLOCKS    /* given_key.block for the staging area */
#define STAGING_MAX (16u << 20)  /* what the harness keeps of it */

static const uint64_t block_len[NBLOCKS] = {192u << 10, 64u << 10};
static const char *const block_name[NBLOCKS] = {"ram0", "ram1"};
static uint8_t *ram[NBLOCKS];
static int data_listener = -1;
static uint16_t data_port;

static int (*real_connect)(int, const struct sockaddr *, socklen_t);

/* The plugin connects where the destination's blobs say: only the data
 * listener is let through, whatever an input manages to put in a blob. */
int connect(int fd, const struct sockaddr *sa, socklen_t len)
{
	bool ours = false;
	if (sa && sa->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
		const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
		ours = in->sin_addr.s_addr == htonl(INADDR_LOOPBACK) &&
		       ntohs(in->sin_port) == data_port;
	} else if (sa && sa->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
		const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
		static const uint8_t mapped[16] = {0, 0, 0,    0,    0,   0, 0, 0,
		                                   0, 0, 0xff, 0xff, 127, 0, 0, 1};
		ours = !memcmp(&in6->sin6_addr, mapped, 16) && ntohs(in6->sin6_port) == data_port;
	} else if (sa && sa->sa_family != AF_INET && sa->sa_family != AF_INET6) {
		ours = true; /* not an IP address */
	}
	if (!ours) {
		errno = ECONNREFUSED;
		return -1;
	}
	return real_connect(fd, sa, len);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	real_connect =
	        (int (*)(int, const struct sockaddr *, socklen_t))dlsym(RTLD_NEXT, "connect");
	if (!real_connect)
		abort();
	/* Each block read-only between guard pages, with some pages zero. */
	for (unsigned b = 0; b < NBLOCKS; b++) {
		uint8_t *map = mmap(NULL, block_len[b] + 2 * PAGE, PROT_NONE,
		                    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (map == MAP_FAILED || mprotect(map + PAGE, block_len[b], PROT_READ | PROT_WRITE))
			abort();
		ram[b] = map + PAGE;
		for (uint64_t i = 0; i < block_len[b]; i++)
			ram[b][i] = (i / PAGE) % 3 == 1 ? 0 : (uint8_t)(i * 131 + b * 7 + i / PAGE);
		if (mprotect(ram[b], block_len[b], PROT_READ))
			abort();
	}
	struct sockaddr_in in = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof(in);
	data_listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (data_listener < 0 || bind(data_listener, (struct sockaddr *)&in, len) ||
	    listen(data_listener, 64) || getsockname(data_listener, (struct sockaddr *)&in, &len))
		abort();
	data_port = ntohs(in.sin_port);
	setenv("LMT_LOG", "error", 0);
	/* Each session loads and unloads the plugin; keep its code (and its
	 * coverage counters) mapped in between. */
	if (!dlopen(FUZZ_TCP_PLUGIN, RTLD_NOW | RTLD_NODELETE))
		abort();
	return 0;
}

/* ---- the input ---- */

/* ---- what the destination gave, for the data side to check against ---- */

struct given_key {
	uint64_t region, len;
	uint32_t block;
	uint64_t offset;
};

struct given_token {
	uint32_t channel;
	uint64_t token;
};

struct data_conn {
	int fd;
	bool hello_done, closed;
	uint32_t channel;
	uint8_t hello[TCP_HELLO_LEN];
	size_t got;
	uint8_t header[TCP_HEADER_LEN];
	size_t header_got;
	struct tcp_header h;
	uint64_t payload_got;
	uint8_t *payload;
};

/* What both fake threads share. */
struct world {
	pthread_mutex_t lock;
	unsigned channels;
	bool auto_ack;
	struct given_key keys[MAX_KEYS];
	unsigned nkeys;
	bool keys_unknown; /* keys went out that the harness did not record */
	struct given_token tokens[MAX_TOKENS];
	unsigned ntokens;
	bool tokens_unknown;
	struct data_conn conn[4]; /* the accepted ones, by order */
	unsigned nconn;
	int conn_of[MAX_CHANNELS];        /* channel -> index in conn, or -1 */
	uint64_t received[MAX_CHANNELS];  /* whole writes per channel */
	uint64_t acked_max[MAX_CHANNELS]; /* the highest count of an ACK or BYE sent */
	bool early_ack;                   /* an ACK went out for writes not received yet */
	bool sent_complete_ack; /* a COMPLETE_ACK went out (framed) */
	bool sent_raw;          /* raw bytes went out on the control connection */
	atomic_bool stop;
	/* postcopy: what the source announced and sent, and the staging
	 * area the fake lent (slot contents as the data side received them) */
	uint64_t announced[NBLOCKS]; /* a bit per page: each block has <= 64 */
	uint64_t sent[NBLOCKS];
	uint64_t sent_pages;
	bool switched; /* POSTCOPY read */
	bool staging_given;
	uint32_t slot_size, slots;
	uint8_t *staging;   /* slots * slot_size bytes when that is <= STAGING_MAX */
	uint32_t *slot_len; /* per slot: bytes of the last whole write at its start */
	bool *slot_held;    /* per slot: named in PAGES and not freed yet */
	uint32_t *to_free;  /* slots named in PAGES, for SRC_OP_SLOTS_FREE */
	uint32_t nto_free;
	/* SLOTS_FREE named a slot the fake did not hold: the source may have
	 * reused it under a PAGES still on its way, so slot contents and
	 * holding are no longer checked */
	bool freed_blindly;
	bool staging_raw; /* the POSTCOPY_ACK taken was raw bytes (SRC_OP_MSG) */
};

static void note_key(struct world *w, uint64_t region, uint64_t len, uint32_t block,
                     uint64_t offset)
{
	pthread_mutex_lock(&w->lock);
	if (w->nkeys < MAX_KEYS)
		w->keys[w->nkeys++] = (struct given_key){region, len, block, offset};
	else
		w->keys_unknown = true;
	pthread_mutex_unlock(&w->lock);
}

/* Point a 40-byte blob at the data listener, and remember its token. */
static void aim_blob(struct world *w, struct lmt_blob *b)
{
	if (b->len != TCP_DST_ADDR_LEN)
		return;
	uint16_t family = lmt__get16(b->data + 6);
	memset(b->data + 12, 0, 16);
	if (family == TCP_FAMILY_IPV6) {
		b->data[12 + 10] = 0xff;
		b->data[12 + 11] = 0xff;
		memcpy(b->data + 12 + 12, (uint8_t[]){127, 0, 0, 1}, 4);
	} else {
		memcpy(b->data + 12, (uint8_t[]){127, 0, 0, 1}, 4);
	}
	lmt__put16(b->data + 8, data_port);
	struct tcp_dst_addr a;
	if (tcp_dst_addr_decode(b, &a))
		return;
	pthread_mutex_lock(&w->lock);
	if (w->ntokens < MAX_TOKENS)
		w->tokens[w->ntokens++] = (struct given_token){a.channel, a.token};
	else
		w->tokens_unknown = true;
	pthread_mutex_unlock(&w->lock);
}

/* ---- the data side ---- */

static void send_record(struct data_conn *c, const uint8_t *rec)
{
	if (c->fd >= 0 && !c->closed)
		(void)!send(c->fd, rec, TCP_ACK_LEN, MSG_NOSIGNAL | MSG_DONTWAIT);
}

static void check_hello(struct world *w, struct data_conn *c)
{
	uint32_t channel = lmt__get32(c->hello + 8);
	uint64_t token = lmt__get64(c->hello + 16);
	if (lmt__get32(c->hello) != TCP_MAGIC_HELLO || lmt__get16(c->hello + 4) != TCP_WIRE_VERSION)
		fail("the source opened a data connection without a hello");
	if (channel >= w->channels)
		fail("hello for channel %u of %u", channel, w->channels);
	bool known = w->tokens_unknown;
	for (unsigned i = 0; i < w->ntokens && !known; i++)
		known = w->tokens[i].channel == channel && w->tokens[i].token == token;
	if (!known)
		fail("channel %u: the source presented token 0x%llx, which it was never given",
		     channel, (unsigned long long)token);
	if (w->conn_of[channel] >= 0)
		fail("channel %u connected twice", channel);
	c->channel = channel;
	c->hello_done = true;
	w->conn_of[channel] = (int)(c - w->conn);
}

/* A whole write arrived on c: check it against the key it names. */
static void check_write(struct world *w, struct data_conn *c)
{
	const struct tcp_header *h = &c->h;
	const struct given_key *k = NULL;
	for (unsigned i = 0; i < w->nkeys && !k; i++)
		if (w->keys[i].region == h->region)
			k = &w->keys[i];
	if (!k) {
		if (!w->keys_unknown)
			fail("channel %u: write to region 0x%llx, for which no key was given",
			     c->channel, (unsigned long long)h->region);
		return;
	}
	if (h->len > k->len || h->offset > k->len - h->len)
		fail("channel %u: write of %llu bytes at %llu past a key of %llu bytes", c->channel,
		     (unsigned long long)h->len, (unsigned long long)h->offset,
		     (unsigned long long)k->len);
	if (k->block == STAGING_BLOCK) {
		/* A staging slot: its content is checked against PAGES. */
		uint64_t slot = h->offset / w->slot_size;
		if (h->offset % w->slot_size || h->len > w->slot_size || slot >= w->slots)
			fail("channel %u: write of %llu bytes at %llu of the staging area, not "
			     "within one of its %u slots of %u bytes",
			     c->channel, (unsigned long long)h->len, (unsigned long long)h->offset,
			     w->slots, w->slot_size);
		/* (An ACK sent ahead of the writes lets the source name a slot
		 * in PAGES before its bytes arrive.) */
		if (w->slot_held[slot] && !w->freed_blindly && !w->early_ack)
			fail("channel %u: write into staging slot %llu, which the destination "
			     "holds (named in PAGES, not freed)",
			     c->channel, (unsigned long long)slot);
		if (w->staging)
			memcpy(w->staging + h->offset, c->payload, h->len);
		w->slot_len[slot] = (uint32_t)h->len;
		return;
	}
	/* The key stands for block k->block at k->offset: the write must carry
	 * that RAM, where the key said it is. */
	if (k->block < NBLOCKS && k->offset <= block_len[k->block] &&
	    h->offset + h->len <= block_len[k->block] - k->offset &&
	    memcmp(c->payload, ram[k->block] + k->offset + h->offset, h->len))
		fail("channel %u: write of %llu bytes at %llu of block %u does not carry its RAM",
		     c->channel, (unsigned long long)h->len,
		     (unsigned long long)(k->offset + h->offset), k->block);
}

/* The longest write region may take: chunk-size into a window, a slot
 * into the staging area; PAYLOAD_MAX for a key the harness did not see. */
static uint64_t write_limit(const struct world *w, uint64_t region)
{
	for (unsigned i = 0; i < w->nkeys; i++)
		if (w->keys[i].region == region)
			return w->keys[i].block == STAGING_BLOCK ? w->slot_size : 64u << 10;
	return PAYLOAD_MAX;
}

/* Read what connection c has; false once it is done. */
static bool pump(struct world *w, struct data_conn *c)
{
	for (;;) {
		uint8_t *dst;
		size_t want;
		if (!c->hello_done) {
			dst = c->hello + c->got;
			want = TCP_HELLO_LEN - c->got;
		} else if (c->header_got < TCP_HEADER_LEN) {
			dst = c->header + c->header_got;
			want = TCP_HEADER_LEN - c->header_got;
		} else {
			dst = c->payload + c->payload_got;
			want = (size_t)(c->h.len - c->payload_got);
		}
		ssize_t n = want ? recv(c->fd, dst, want, MSG_DONTWAIT) : 0;
		if (want && n < 0 && (errno == EAGAIN || errno == EINTR))
			return true;
		if (want && n <= 0) {
			c->closed = true;
			return false;
		}
		pthread_mutex_lock(&w->lock);
		if (!c->hello_done) {
			if ((c->got += (size_t)n) == TCP_HELLO_LEN)
				check_hello(w, c);
		} else if (c->header_got < TCP_HEADER_LEN) {
			if ((c->header_got += (size_t)n) == TCP_HEADER_LEN) {
				tcp_header_decode(c->header, &c->h);
				if (c->h.magic == TCP_MAGIC_BYE) {
					pthread_mutex_unlock(&w->lock);
					c->closed = true;
					return false;
				}
				if (c->h.magic != TCP_MAGIC_WRITE)
					fail("channel %u: a header with magic 0x%08x", c->channel,
					     c->h.magic);
				if (c->h.seq != w->received[c->channel])
					fail("channel %u: write %llu out of sequence, expected "
					     "%llu",
					     c->channel, (unsigned long long)c->h.seq,
					     (unsigned long long)w->received[c->channel]);
				uint64_t limit = write_limit(w, c->h.region);
				if (c->h.len > limit)
					fail("channel %u: a write of %llu bytes to region 0x%llx, "
					     "over its limit of %llu (chunk-size, or a staging "
					     "slot)",
					     c->channel, (unsigned long long)c->h.len,
					     (unsigned long long)c->h.region,
					     (unsigned long long)limit);
				c->payload_got = 0;
			}
		} else {
			c->payload_got += (uint64_t)n;
		}
		if (c->hello_done && c->header_got == TCP_HEADER_LEN &&
		    c->payload_got == c->h.len) {
			check_write(w, c);
			c->header_got = 0;
			uint64_t count = ++w->received[c->channel];
			if (w->auto_ack) {
				uint8_t rec[TCP_ACK_LEN];
				tcp_ack_encode(
				        &(struct tcp_ack){.magic = TCP_MAGIC_ACK, .count = count},
				        rec);
				send_record(c, rec);
				if (count > w->acked_max[c->channel])
					w->acked_max[c->channel] = count;
			}
		}
		pthread_mutex_unlock(&w->lock);
	}
}

static void *play_data(void *arg)
{
	struct world *w = arg;
	uint64_t quiet_since = 0;
	for (;;) {
		struct pollfd p[5];
		unsigned n = 0;
		p[n++] = (struct pollfd){.fd = data_listener, .events = POLLIN};
		for (unsigned i = 0; i < w->nconn; i++)
			p[n++] = (struct pollfd){.fd = w->conn[i].closed ? -1 : w->conn[i].fd,
			                         .events = POLLIN};
		bool stop = atomic_load(&w->stop);
		bool open = false;
		for (unsigned i = 0; i < w->nconn; i++)
			open |= !w->conn[i].closed;
		/* Once the session is freed its connections are closed: what
		 * they sent is read to the end. */
		if (stop && !open)
			break;
		int ready = poll(p, n, stop ? 1 : 5);
		if (ready <= 0) {
			if (stop && !quiet_since)
				quiet_since = now_ns();
			if (stop && now_ns() - quiet_since > 100000000ull)
				break;
			continue;
		}
		quiet_since = 0;
		if (p[0].revents) {
			int fd = accept4(data_listener, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
			/* As the real destination does: no ACK held back by Nagle. */
			if (fd >= 0)
				setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &(int){1}, sizeof(int));
			if (fd >= 0 && w->nconn < 4) {
				w->conn[w->nconn++] = (struct data_conn){
				        .fd = fd, .payload = malloc(PAYLOAD_MAX)};
			} else if (fd >= 0) {
				close(fd); /* the channels that connected twice are caught */
			}
		}
		for (unsigned i = 1; i < n; i++)
			if (p[i].revents)
				pump(w, &w->conn[i - 1]);
	}
	return NULL;
}

/* ---- the control side ---- */

struct fake {
	struct world *w;
	int fd;
	struct cursor in;
	unsigned flags;
	bool gone; /* the source hung up */
	bool have_hello;
	uint8_t source_nonce[LMT_PROTO_NONCE];
	struct lmt_msg_regs *last_req; /* the last REG_REQ, or count 0 */
	uint64_t expect_spent;
	unsigned pause_spent;
	struct lmt_buf out;
	uint8_t *payload;
	struct lmt_msg_hello *hello;
	struct lmt_msg_zero *zero;
	uint64_t zero_acked; /* ZERO messages answered */
};

static void fake_send(struct fake *f, const uint8_t *p, size_t len)
{
	if (f->gone)
		return;
	struct lmt__wait wt = {.deadline_ns = lmt__now_ns() + 300000000ull};
	struct lmt__net_error e;
	if (lmt__net_send_all(f->fd, p, len, &wt, &e))
		f->gone = true;
}

static void send_out(struct fake *f)
{
	fake_send(f, f->out.data, f->out.len);
}

static void send_framed(struct fake *f, uint16_t type, const uint8_t *payload, uint32_t len)
{
	uint8_t *m = malloc(LMT_PROTO_HEADER_SIZE + (size_t)len);
	if (!m)
		abort();
	lmt__put16(m, type);
	lmt__put16(m + 2, 0);
	lmt__put32(m + 4, len);
	if (len)
		memcpy(m + LMT_PROTO_HEADER_SIZE, payload, len);
	fake_send(f, m, LMT_PROTO_HEADER_SIZE + (size_t)len);
	free(m);
	if (type == LMT_MSG_COMPLETE_ACK)
		f->w->sent_complete_ack = true;
}

/* ---- postcopy, as the destination sees it ---- */

static uint64_t block_pages(uint32_t b)
{
	return block_len[b] / PAGE;
}

static bool page_is_zero(uint32_t b, uint64_t page)
{
	for (uint32_t i = 0; i < PAGE; i++)
		if (ram[b][page * PAGE + i])
			return false;
	return true;
}

/* POSTCOPY_PAGES: inside a block, before the switch. */
static void seen_announcement(struct world *w, const uint8_t *p, uint32_t len)
{
	struct lmt_msg_pc_pages m;
	struct lmt_error err;
	if (lmt__dec_pc_pages(p, len, &m, &err))
		fail("the source sent a POSTCOPY_PAGES that does not decode: %s", err.message);
	if (w->switched)
		fail("POSTCOPY_PAGES after POSTCOPY");
	if (m.block >= NBLOCKS || m.first != 0 || m.words != 1)
		fail("POSTCOPY_PAGES for block %u, bits %llu+%u: not a block's bitmap", m.block,
		     (unsigned long long)m.first, 64 * m.words);
	uint64_t bits = lmt__get64(m.bits), pages = block_pages(m.block);
	if (pages < 64 && bits >> pages)
		fail("POSTCOPY_PAGES announces pages past the end of block %u", m.block);
	pthread_mutex_lock(&w->lock);
	w->announced[m.block] |= bits;
	pthread_mutex_unlock(&w->lock);
}

static void seen_switch(struct world *w, const uint8_t *p, uint32_t len)
{
	struct lmt_msg_postcopy m;
	struct lmt_error err;
	if (lmt__dec_postcopy(p, len, &m, &err))
		fail("the source sent a POSTCOPY that does not decode: %s", err.message);
	uint64_t n = 0;
	for (uint32_t b = 0; b < NBLOCKS; b++)
		n += (uint64_t)__builtin_popcountll(w->announced[b]);
	if (m.pages != n)
		fail("POSTCOPY counts %llu pages, POSTCOPY_PAGES announced %llu",
		     (unsigned long long)m.pages, (unsigned long long)n);
	pthread_mutex_lock(&w->lock);
	w->switched = true;
	pthread_mutex_unlock(&w->lock);
}

/* One PAGES entry: pages announced and not sent yet, and what they hold. */
static void seen_entry(struct world *w, const struct lmt_msg_pc_entry *e)
{
	const struct lmt_msg_page *r = &e->run;
	if (r->block >= NBLOCKS || r->page >= block_pages(r->block) ||
	    r->npages > block_pages(r->block) - r->page)
		fail("PAGES: pages %llu+%u of block %u are not a block's",
		     (unsigned long long)r->page, r->npages, r->block);
	for (uint64_t pg = r->page; pg < r->page + r->npages; pg++) {
		uint64_t bit = 1ull << pg;
		if (!(w->announced[r->block] & bit) || (w->sent[r->block] & bit))
			fail("PAGES: page %llu of block %u %s", (unsigned long long)pg, r->block,
			     w->sent[r->block] & bit ? "was sent before" : "was not announced");
		w->sent[r->block] |= bit;
		if (e->slot == LMT_PROTO_ZERO_SLOT && !page_is_zero(r->block, pg))
			fail("PAGES: page %llu of block %u sent as zero, and it is not",
			     (unsigned long long)pg, r->block);
	}
	w->sent_pages += r->npages;
	if (e->slot == LMT_PROTO_ZERO_SLOT || w->staging_raw)
		return;
	uint64_t bytes = (uint64_t)r->npages * PAGE;
	if (!w->staging_given || e->slot >= w->slots || bytes > w->slot_size)
		fail("PAGES: slot %u of %u (%u bytes each) for %u pages", e->slot, w->slots,
		     w->slot_size, r->npages);
	if (w->slot_held[e->slot] && !w->freed_blindly)
		fail("PAGES: slot %u named again before the destination freed it", e->slot);
	/* Named once its write completed: with every ACK sent for writes
	 * received whole, its bytes are there. */
	if (!w->early_ack && !w->keys_unknown && !w->freed_blindly) {
		if (w->slot_len[e->slot] != bytes)
			fail("PAGES: slot %u named for %llu bytes, its last write was %u", e->slot,
			     (unsigned long long)bytes, w->slot_len[e->slot]);
		if (w->staging && memcmp(w->staging + (size_t)e->slot * w->slot_size,
		                         ram[r->block] + r->page * PAGE, bytes))
			fail("PAGES: slot %u does not hold pages %llu+%u of block %u", e->slot,
			     (unsigned long long)r->page, r->npages, r->block);
	}
	w->slot_len[e->slot] = 0;
	if (!w->slot_held[e->slot]) {
		w->slot_held[e->slot] = true;
		w->to_free[w->nto_free++] = e->slot;
	}
}

static void seen_pages(struct fake *f, const uint8_t *p, uint32_t len)
{
	struct world *w = f->w;
	struct lmt_msg_pages *m = malloc(sizeof(*m));
	struct lmt_error err;
	if (!m)
		abort();
	if (lmt__dec_pages(p, len, m, &err))
		fail("the source sent a PAGES that does not decode: %s", err.message);
	if (!w->switched)
		fail("PAGES before POSTCOPY");
	if (m->channels != w->channels)
		fail("PAGES with %u byte counts for %u channels", m->channels, w->channels);
	pthread_mutex_lock(&w->lock);
	for (uint32_t i = 0; i < m->count; i++)
		seen_entry(w, &m->entries[i]);
	pthread_mutex_unlock(&w->lock);
	free(m);
}

static void seen_done(struct world *w, const uint8_t *p, uint32_t len)
{
	struct lmt_msg_pc_done m;
	struct lmt_error err;
	if (lmt__dec_pc_done(p, len, &m, &err))
		fail("the source sent a POSTCOPY_DONE that does not decode: %s", err.message);
	for (uint32_t b = 0; b < NBLOCKS; b++)
		if (w->sent[b] != w->announced[b])
			fail("POSTCOPY_DONE with pages of block %u not sent (0x%llx of 0x%llx)", b,
			     (unsigned long long)w->sent[b], (unsigned long long)w->announced[b]);
	if (m.pages != w->sent_pages)
		fail("POSTCOPY_DONE counts %llu pages, PAGES named %llu",
		     (unsigned long long)m.pages, (unsigned long long)w->sent_pages);
}

static void seen_postcopy(struct fake *f, uint16_t type, uint32_t len)
{
	if (type == LMT_MSG_POSTCOPY_PAGES)
		seen_announcement(f->w, f->payload, len);
	else if (type == LMT_MSG_POSTCOPY)
		seen_switch(f->w, f->payload, len);
	else if (type == LMT_MSG_PAGES)
		seen_pages(f, f->payload, len);
	else if (type == LMT_MSG_POSTCOPY_DONE)
		seen_done(f->w, f->payload, len);
}

/* One message from the source within `deadline`: its type, or 0. PINGs
 * are answered on the way. */
/* ZERO: every run inside its block and all zero in the source's RAM
 * (which never changes here); answered at once, as a destination does. */
static void seen_zero(struct fake *f, uint32_t length)
{
	struct lmt_error err;
	if (lmt__dec_zero(f->payload, length, f->zero, &err))
		fail("the source sent a ZERO that does not decode: %s", err.message);
	for (uint32_t i = 0; i < f->zero->count; i++) {
		const struct lmt_msg_page *r = &f->zero->runs[i];
		if (r->block >= NBLOCKS || r->page + r->npages > block_len[r->block] / PAGE)
			fail("ZERO: pages %llu+%u of block %u are not the guest's",
			     (unsigned long long)r->page, r->npages, r->block);
		for (uint64_t k = r->page * PAGE; k < (r->page + r->npages) * PAGE; k++)
			if (ram[r->block][k])
				fail("ZERO: page %llu of block %u is not zero",
				     (unsigned long long)(k / PAGE), r->block);
	}
	lmt__enc_zero_ack(&f->out, ++f->zero_acked);
	send_out(f);
}

static uint16_t fake_recv(struct fake *f, uint64_t deadline)
{
	while (!f->gone) {
		struct lmt__wait wt = {.deadline_ns = deadline};
		struct lmt__net_error e;
		uint8_t raw[LMT_PROTO_HEADER_SIZE];
		struct lmt_msg_header h;
		struct lmt_error err;
		int rc = lmt__net_recv_all(f->fd, raw, sizeof(raw), &wt, &e);
		if (rc == -LMT_ETIMEDOUT)
			return 0;
		if (rc || lmt__dec_header(raw, sizeof(raw), &h, &err) ||
		    lmt__net_recv_all(f->fd, f->payload, h.length, &wt, &e)) {
			f->gone = true;
			return 0;
		}
		if (h.type == LMT_MSG_PING) {
			lmt__enc_empty(&f->out, LMT_MSG_PONG);
			send_out(f);
			continue;
		}
		if (h.type == LMT_MSG_HELLO &&
		    !lmt__dec_hello(f->payload, h.length, f->hello, &err)) {
			memcpy(f->source_nonce, f->hello->nonce, LMT_PROTO_NONCE);
			f->have_hello = true;
		}
		if (h.type == LMT_MSG_REG_REQ &&
		    lmt__dec_regs(f->payload, h.length, LMT_MSG_REG_REQ, f->last_req, &err))
			f->last_req->count = 0;
		if (h.type == LMT_MSG_ZERO)
			seen_zero(f, h.length);
		seen_postcopy(f, h.type, h.length);
		return h.type;
	}
	return 0;
}

static void op_expect(struct fake *f)
{
	uint16_t want = take8(&f->in) % 32;
	uint64_t start = lmt__now_ns();
	if (f->expect_spent >= EXPECT_BUDGET_NS)
		return;
	uint64_t deadline = start + EXPECT_WAIT_NS;
	uint16_t got;
	while ((got = fake_recv(f, deadline)) && want && got != want)
		;
	f->expect_spent += lmt__now_ns() - start;
}

static void op_hello_reply(struct fake *f)
{
	unsigned flags = take8(&f->in);
	if (!f->have_hello) {
		uint64_t deadline = lmt__now_ns() + EXPECT_WAIT_NS;
		while (!f->have_hello && fake_recv(f, deadline))
			;
	}
	struct lmt_msg_status st = {.version = LMT_PROTO_VERSION};
	snprintf(st.text, sizeof(st.text), "ok");
	if (flags & 1)
		st.version = (uint16_t)take(&f->in, 2);
	if (flags & 2)
		st.code = -(int32_t)take8(&f->in);
	bool keyed = f->flags & SRC_F_AUTH;
	st.auth = keyed ^ !!(flags & 4);
	if (st.auth) {
		memset(st.nonce, 0x3c, sizeof(st.nonce));
		struct lmt_auth_key key = {.bytes = (uint8_t *)KEY, .len = strlen(KEY)};
		if (lmt__auth_proof(&key, LMT_AUTH_LABEL_DESTINATION, f->source_nonce, st.nonce,
		                    st.proof))
			abort();
		if (flags & 8)
			st.proof[0] ^= 1;
	}
	if (lmt__enc_status(&f->out, LMT_MSG_HELLO_REPLY, &st))
		abort();
	send_out(f);
}

static void op_addrs(struct fake *f)
{
	struct lmt_msg_addrs *a = calloc(1, sizeof(*a));
	if (!a)
		abort();
	unsigned count = take8(&f->in);
	a->count = count ? count % 8 : f->w->channels;
	for (uint32_t i = 0; i < a->count; i++) {
		struct lmt_blob *b = &a->addrs[i];
		unsigned kind = take8(&f->in) % 4;
		struct tcp_dst_addr d = {.family = TCP_FAMILY_IPV4, .port = 1, .channel = i};
		if (kind == 3)
			d.channel = take8(&f->in);
		uint8_t pos = 0, flip = 0;
		if (kind == 1) {
			pos = take8(&f->in) % TCP_DST_ADDR_LEN;
			flip = take8(&f->in);
		}
		if (kind == 2) {
			size_t len = take8(&f->in);
			const uint8_t *p = take_bytes(&f->in, &len);
			b->len = len ? (uint32_t)len : 1;
			memset(b->data, 0, b->len);
			memcpy(b->data, p, len);
		} else {
			d.token = take(&f->in, 8);
			tcp_dst_addr_encode(&d, b);
			b->data[pos] ^= flip;
		}
		aim_blob(f->w, b);
	}
	if (lmt__enc_addrs(&f->out, a))
		abort();
	free(a);
	send_out(f);
}

/* A tcp key standing for (block, offset, len), recorded. */
static void give_key(struct fake *f, struct lmt_msg_reg *g, uint64_t key_len, uint64_t *next_id)
{
	uint64_t region = ++*next_id;
	tcp_key_encode(&(struct tcp_key){.region = region, .len = key_len}, &g->key);
	note_key(f->w, region, key_len, g->block, g->offset);
}

static void op_keys(struct fake *f)
{
	static uint64_t next_id = 0x5000;
	unsigned mutation = take8(&f->in) % 8;
	struct lmt_msg_regs *r = calloc(1, sizeof(*r));
	if (!r)
		abort();
	if (f->last_req->count) {
		r->count = f->last_req->count;
		memcpy(r->regs, f->last_req->regs, r->count * sizeof(r->regs[0]));
		f->last_req->count = 0;
	} else {
		for (uint32_t b = 0; b < NBLOCKS; b++)
			r->regs[r->count++] =
			        (struct lmt_msg_reg){.block = b, .length = block_len[b]};
	}
	for (uint32_t i = 0; i < r->count; i++) {
		struct lmt_msg_reg *g = &r->regs[i];
		bool last = i + 1 == r->count;
		if (last && mutation == 3)
			g->offset += PAGE;
		if (last && mutation == 4)
			g->block++;
		uint64_t key_len = g->length;
		if (last && mutation == 1)
			key_len--;
		if (last && mutation == 2)
			key_len = PAGE;
		give_key(f, g, key_len ? key_len : 1, &next_id);
		if (last && mutation == 5) {
			size_t len = take8(&f->in);
			const uint8_t *p = take_bytes(&f->in, &len);
			g->key.len = len ? (uint32_t)len : 1;
			memset(g->key.data, 0, g->key.len);
			memcpy(g->key.data, p, len);
			f->w->keys_unknown = true;
		}
	}
	if (mutation == 6 && r->count < LMT_PROTO_MAX_REG) {
		r->regs[r->count] = r->regs[r->count - 1];
		r->count++;
	}
	if (mutation == 7)
		r->count--;
	if (lmt__enc_regs(&f->out, LMT_MSG_REG_REPLY, r))
		abort();
	free(r);
	send_out(f);
}

static void op_msg(struct fake *f)
{
	uint16_t type = take8(&f->in);
	size_t len = (size_t)take(&f->in, 2);
	const uint8_t *p = take_bytes(&f->in, &len);
	struct lmt_msg_addrs *a = malloc(sizeof(*a));
	struct lmt_error err;
	if (!a)
		abort();
	if (type == LMT_MSG_EP_ADDRS && !lmt__dec_addrs(p, len, a, &err)) {
		for (uint32_t i = 0; i < a->count; i++)
			aim_blob(f->w, &a->addrs[i]);
		if (lmt__enc_addrs(&f->out, a))
			abort();
		send_out(f);
	} else {
		if (type == LMT_MSG_REG_REPLY || type == LMT_MSG_POSTCOPY_ACK)
			f->w->keys_unknown = true;
		if (type == LMT_MSG_POSTCOPY_ACK && !f->w->staging_given)
			f->w->staging_raw = true;
		send_framed(f, type, p, (uint32_t)len);
	}
	free(a);
}

static void op_ack(struct fake *f)
{
	struct world *w = f->w;
	unsigned channel = take8(&f->in) % w->channels;
	unsigned kind = take8(&f->in) % 4;
	uint8_t sel = take8(&f->in);
	uint64_t raw = sel & 0x80 ? take(&f->in, 8) : 0;
	int32_t code = take8(&f->in);
	uint32_t magic = kind == 0   ? TCP_MAGIC_ACK
	                 : kind == 1 ? TCP_MAGIC_BYE
	                 : kind == 2 ? TCP_MAGIC_ERROR
	                             : (uint32_t)take(&f->in, 4);
	pthread_mutex_lock(&w->lock);
	int i = w->conn_of[channel];
	if (i >= 0) {
		uint64_t count = raw;
		if (!(sel & 0x80)) {
			int64_t delta = (int64_t)(sel & 7) - 2;
			count = (int64_t)w->received[channel] + delta < 0
			                ? 0
			                : (uint64_t)((int64_t)w->received[channel] + delta);
		}
		uint8_t rec[TCP_ACK_LEN];
		tcp_ack_encode(&(struct tcp_ack){.magic = magic, .code = code, .count = count},
		               rec);
		send_record(&w->conn[i], rec);
		if ((magic == TCP_MAGIC_ACK || magic == TCP_MAGIC_BYE) &&
		    count > w->acked_max[channel])
			w->acked_max[channel] = count;
		if (count > w->received[channel])
			w->early_ack = true;
	}
	pthread_mutex_unlock(&w->lock);
}

/* ---- postcopy's operations ---- */

static void op_pc_ack(struct fake *f)
{
	struct world *w = f->w;
	uint8_t status = take8(&f->in), slots = take8(&f->in), size = take8(&f->in);
	unsigned key = take8(&f->in) % 3;
	if (!w->switched) {
		uint64_t deadline = lmt__now_ns() + EXPECT_WAIT_NS;
		while (!w->switched && fake_recv(f, deadline))
			;
	}
	struct lmt_msg_pc_ack *m = calloc(1, sizeof(*m));
	if (!m)
		abort();
	m->code = -(int32_t)status;
	snprintf(m->text, sizeof(m->text), "%s", status ? "no" : "ok");
	m->slots = slots ? 2 + slots % 255u : 256;
	m->slot_size = (4096u << (2 * (size % 3))); /* 4, 16 or 64 KiB */
	uint64_t len = (uint64_t)m->slots * m->slot_size;
	if (key == 2) {
		size_t n = take8(&f->in);
		const uint8_t *p = take_bytes(&f->in, &n);
		m->key.len = n ? (uint32_t)n : 1;
		memcpy(m->key.data, p, n);
		w->keys_unknown = true;
	} else {
		tcp_key_encode(&(struct tcp_key){.region = STAGING_REGION, .len = len - (key == 1)},
		               &m->key);
	}
	if (!status && !w->staging_given && !w->staging_raw) {
		pthread_mutex_lock(&w->lock);
		w->slot_size = m->slot_size;
		w->slots = m->slots;
		w->staging = len <= STAGING_MAX ? calloc(1, len) : NULL;
		w->slot_len = calloc(m->slots, sizeof(*w->slot_len));
		w->slot_held = calloc(m->slots, sizeof(*w->slot_held));
		w->to_free = calloc(m->slots, sizeof(*w->to_free));
		if (!w->slot_len || !w->slot_held || !w->to_free)
			abort();
		w->staging_given = true;
		pthread_mutex_unlock(&w->lock);
		if (key != 2)
			note_key(w, STAGING_REGION, len - (key == 1), STAGING_BLOCK, 0);
	}
	if (lmt__enc_pc_ack(&f->out, m))
		abort();
	free(m);
	send_out(f);
}

static void op_page_req(struct fake *f)
{
	struct lmt_msg_page_req m = {.count = 1};
	m.pages[0].block = take8(&f->in) % 4;
	m.pages[0].page = take(&f->in, 2);
	m.pages[0].npages = take8(&f->in);
	if (lmt__enc_page_req(&f->out, &m))
		abort();
	send_out(f);
}

static void op_slots_free(struct fake *f)
{
	struct world *w = f->w;
	unsigned mode = take8(&f->in) % 3;
	uint32_t raw = (uint32_t)take(&f->in, mode == 2 ? 2 : 0);
	struct lmt_msg_slots *m = calloc(1, sizeof(*m));
	if (!m)
		abort();
	pthread_mutex_lock(&w->lock);
	if (mode == 2) {
		m->slots[m->count++] = raw;
		bool held = w->staging_given && raw < w->slots && w->slot_held[raw];
		for (uint32_t i = 0; held && i < w->nto_free; i++)
			if (w->to_free[i] == raw)
				w->to_free[i] = w->to_free[--w->nto_free];
		if (held)
			w->slot_held[raw] = false;
		else
			w->freed_blindly = true;
	} else {
		for (uint32_t i = 0; i < w->nto_free; i++) {
			m->slots[m->count++] = w->to_free[i];
			w->slot_held[w->to_free[i]] = false;
		}
		w->nto_free = 0;
		if (mode == 1 && m->count)
			m->slots[m->count++] = m->slots[0];
	}
	pthread_mutex_unlock(&w->lock);
	if (m->count) {
		if (lmt__enc_slots(&f->out, m))
			abort();
		send_out(f);
	}
	free(m);
}

/* Everything the source sends until it closes the connection (its
 * session ends soon after it reads the end of the stream). */
static void drain(struct fake *f)
{
	struct lmt__wait wt = {.deadline_ns = lmt__now_ns() + INPUT_LIMIT_NS};
	struct lmt__net_error e;
	struct lmt_msg_header h;
	struct lmt_error err;
	uint8_t raw[LMT_PROTO_HEADER_SIZE];
	while (!lmt__net_recv_all(f->fd, raw, sizeof(raw), &wt, &e) &&
	       !lmt__dec_header(raw, sizeof(raw), &h, &err) &&
	       !lmt__net_recv_all(f->fd, f->payload, h.length, &wt, &e))
		seen_postcopy(f, h.type, h.length);
}

static void *play_destination(void *arg)
{
	struct fake *f = arg;
	while (f->in.n && !f->gone) {
		switch (take8(&f->in) % SRC_OP_COUNT) {
		case SRC_OP_EXPECT:
			op_expect(f);
			break;
		case SRC_OP_HELLO_REPLY:
			op_hello_reply(f);
			break;
		case SRC_OP_ADDRS:
			op_addrs(f);
			break;
		case SRC_OP_KEYS:
			op_keys(f);
			break;
		case SRC_OP_READY:
			lmt__enc_empty(&f->out, LMT_MSG_READY);
			send_out(f);
			break;
		case SRC_OP_COMPLETE_ACK: {
			struct lmt_msg_status st = {.code = -(int32_t)take8(&f->in)};
			snprintf(st.text, sizeof(st.text), "%s", st.code ? "no" : "ok");
			if (lmt__enc_status(&f->out, LMT_MSG_COMPLETE_ACK, &st))
				abort();
			send_out(f);
			f->w->sent_complete_ack = true;
			break;
		}
		case SRC_OP_MSG:
			op_msg(f);
			break;
		case SRC_OP_RAW: {
			size_t len = take8(&f->in);
			const uint8_t *p = take_bytes(&f->in, &len);
			f->w->sent_raw = true;
			fake_send(f, p, len);
			break;
		}
		case SRC_OP_ACK:
			op_ack(f);
			break;
		case SRC_OP_ERROR: {
			struct lmt_msg_status st = {.code = -(int32_t)(1 + take8(&f->in) % 40)};
			size_t len = take8(&f->in);
			const uint8_t *p = take_bytes(&f->in, &len);
			for (size_t i = 0; i < len && i < LMT_PROTO_MAX_TEXT; i++)
				st.text[i] = p[i] >= 32 && p[i] < 127 ? (char)p[i] : '.';
			if (lmt__enc_status(&f->out, LMT_MSG_ERROR, &st))
				abort();
			send_out(f);
			break;
		}
		case SRC_OP_PC_ACK:
			op_pc_ack(f);
			break;
		case SRC_OP_PAGE_REQ:
			op_page_req(f);
			break;
		case SRC_OP_SLOTS_FREE:
			op_slots_free(f);
			break;
		default: { /* SRC_OP_PAUSE */
			unsigned ms = take8(&f->in) % 20;
			if (f->pause_spent + ms <= PAUSE_BUDGET_MS) {
				f->pause_spent += ms;
				usleep(ms * 1000);
			}
			break;
		}
		}
	}
	/* The script is over: hang up, as a destination that is done does,
	 * but read what the source still sends until it closes, so that the
	 * postcopy checks see every PAGES and POSTCOPY_DONE it sent. */
	shutdown(f->fd, SHUT_WR);
	drain(f);
	return NULL;
}

/* ---- the source ---- */

static int dirty_sync(void *opaque, uint32_t block, uint64_t *bitmap, uint64_t npages)
{
	unsigned *calls = opaque;
	uint64_t p = (++*calls * 7u) % npages;
	bitmap[p / 64] |= 1ull << (p % 64);
	return 0;
}

static void check_failure(lmt_session *s, int rc, const char *call)
{
	const struct lmt_error *e = lmt_session_error(s);
	if (rc >= 0 || rc <= -LMT_ERRC_COUNT)
		fail("%s returned %d, not a negative LMT_E* code", call, rc);
	if (!e || e->code != rc || !e->message[0])
		fail("%s returned %d (%s) but the session's error is %d '%s'", call, rc,
		     lmt_err_name(rc), e ? e->code : 0, e ? e->message : "(none)");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1 || size > (64u << 10))
		return 0;
	uint64_t t0 = now_ns();
	fuzz_baseline();
	/* Connections a previous input left in the listener's queue. */
	int stale;
	while ((stale = accept4(data_listener, NULL, NULL, SOCK_CLOEXEC)) >= 0)
		close(stale);

	unsigned flags = data[0];
	bool postcopy = flags & SRC_F_POSTCOPY;
	struct world *w = calloc(1, sizeof(*w));
	struct fake *f = calloc(1, sizeof(*f));
	if (!w || !f || pthread_mutex_init(&w->lock, NULL))
		abort();
	unsigned channels = flags & SRC_F_CHANNELS ? 2 : 1;
	w->channels = channels + postcopy; /* the tcp plugin has many channels */
	w->auto_ack = !(flags & SRC_F_NO_ACK);
	for (unsigned c = 0; c < MAX_CHANNELS; c++)
		w->conn_of[c] = -1;
	f->w = w;
	f->flags = flags;
	f->in = (struct cursor){data + 1, size - 1};
	f->payload = malloc(LMT_PROTO_MAX_PAYLOAD);
	f->hello = malloc(sizeof(*f->hello));
	f->last_req = calloc(1, sizeof(*f->last_req));
	f->zero = malloc(sizeof(*f->zero));
	if (!f->payload || !f->hello || !f->last_req || !f->zero)
		abort();

	int fds[2];
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds))
		abort();
	f->fd = fds[0];
	pthread_t control, data_side;
	if (pthread_create(&data_side, NULL, play_data, w) ||
	    pthread_create(&control, NULL, play_destination, f))
		abort();

	/* postcopy=on needs verify=off: SRC_F_VERIFY then makes
	 * lmt_save_complete the switch (postcopy-after=1). */
	bool switch_in_complete = postcopy && (flags & SRC_F_VERIFY);
	char opts[360];
	snprintf(opts, sizeof(opts),
	         "chunk-size=64K,pin-all=%s,verify=%s,channels=%u,connect-timeout=200ms,"
	         "idle-timeout=100ms,switchover-timeout=200ms,max-iterate-ms=5ms,"
	         "downtime-limit=50ms,queue-depth=8%s%s%s",
	         flags & SRC_F_PIN_ALL ? "on" : "off",
	         flags & SRC_F_VERIFY && !postcopy ? "on" : "off", channels,
	         flags & SRC_F_AUTH ? ",auth-key=" KEY : "", postcopy ? ",postcopy=on" : "",
	         switch_in_complete ? ",postcopy-after=1" : "");
	struct lmt_error err;
	lmt_session *s = NULL;
	unsigned calls = 0;
	if (lmt_session_new(&s, LMT_ROLE_SOURCE, FUZZ_TCP_PLUGIN, opts, &err))
		fail("session: %s", err.message);
	for (unsigned b = 0; b < NBLOCKS; b++)
		if (lmt_session_add_block(s, block_name[b], ram[b], block_len[b], PAGE))
			abort();
	if (lmt_session_set_dirty_sync(s, dirty_sync, &calls))
		abort();
	int rc = lmt__save_connected(s, fds[1]);
	if (rc)
		check_failure(s, rc, "setup");
	unsigned iterations = (flags >> SRC_F_ITERATE_SHIFT) & SRC_F_ITERATE_MASK;
	for (unsigned i = 0; i < iterations && !rc; i++) {
		struct lmt_iterate_result res;
		if ((rc = lmt_save_iterate(s, &res)))
			check_failure(s, rc, "iterate");
		else if (res.ready || res.postcopy)
			break;
	}
	static const char state[] = "device state of the fuzzed source";
	if (!rc && postcopy && !switch_in_complete &&
	    (rc = lmt_save_postcopy(s, state, sizeof(state))))
		check_failure(s, rc, "postcopy");
	else if (!rc && !(postcopy && !switch_in_complete) &&
	         (rc = lmt_save_complete(s, state, sizeof(state))))
		check_failure(s, rc, "complete");
	/* After the switch the rest goes in lmt_save_finish (0 at once after
	 * a migration that completed in lmt_save_complete). */
	if (!rc && postcopy && (rc = lmt_save_finish(s)))
		check_failure(s, rc, "finish");
	char why[sizeof(err.message)];
	snprintf(why, sizeof(why), "%s", rc ? lmt_session_error(s)->message : "completed");
	struct lmt_stats st;
	if (lmt_session_stats(s, &st))
		abort();
	lmt_session_free(s);

	pthread_join(control, NULL);
	atomic_store(&w->stop, true);
	pthread_join(data_side, NULL);
	close(fds[0]);
	if (!rc) {
		if (!w->sent_complete_ack && !w->sent_raw)
			fail("the migration completed without a COMPLETE_ACK");
		for (uint32_t b = 0; w->switched && !w->sent_raw && b < NBLOCKS; b++)
			if (w->sent[b] != w->announced[b])
				fail("postcopy completed, block %u: pages 0x%llx of 0x%llx sent", b,
				     (unsigned long long)w->sent[b],
				     (unsigned long long)w->announced[b]);
		for (unsigned c = 0; c < w->channels; c++)
			if (w->received[c] > w->acked_max[c])
				fail("the migration completed with channel %u's writes %llu "
				     "acknowledged "
				     "up to %llu",
				     c, (unsigned long long)w->received[c],
				     (unsigned long long)w->acked_max[c]);
	}
	if (getenv("FUZZ_SOURCE_VERBOSE"))
		fprintf(stderr,
		        "fuzz_source: %s (status %s); %llu+%llu+%llu writes received%s, %llu "
		        "pages after the switch, after %llu ms\n",
		        why, lmt_status_name(st.status), (unsigned long long)w->received[0], (unsigned long long)w->received[1],
		        (unsigned long long)w->received[2], w->switched ? ", switched" : "",
		        (unsigned long long)w->sent_pages,
		        (unsigned long long)((now_ns() - t0) / 1000000));
	for (unsigned i = 0; i < w->nconn; i++) {
		close(w->conn[i].fd);
		free(w->conn[i].payload);
	}
	pthread_mutex_destroy(&w->lock);
	free(w->staging);
	free(w->slot_len);
	free(w->slot_held);
	free(w->to_free);
	free(w);
	lmt__buf_free(&f->out);
	free(f->payload);
	free(f->hello);
	free(f->last_req);
	free(f->zero);
	free(f);

	fuzz_input_end(t0, INPUT_LIMIT_NS);
	return 0;
}
