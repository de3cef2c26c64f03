/* libFuzzer harness: the tcp plugin's data path, fed a peer's stream over a
 * real loopback connection. Byte 0 picks the side (tcp_wire_script.h):
 *
 * - the destination's receiver: a tcp destination endpoint with three
 *   regions registered in one arena (the third deregistered again), and
 *   the input turned into what a source sends on the data port — hellos,
 *   write headers naming the live, the stale or made-up regions, payloads,
 *   BYEs, raw bytes, split across sends;
 * - the source's acknowledgement reader: a tcp source endpoint connected
 *   to this harness, a few writes posted, and the input turned into the
 *   destination's answers — ACK, BYE, ERROR records, other magics, raw
 *   bytes.
 *
 * The plugin is the real one, loaded as lmt loads it, driven through its
 * ABI with the test harness's host (tests/support/plugin_harness.h).
 * Invariants:
 * - receiver: no byte of the arena changes outside what a write header
 *   sent for a live region's id covered (guard pages around the arena
 *   fault on a write past it); nothing is placed unless the first thing
 *   sent was the right hello, and then ep_connect fails with an error;
 *   the records sent back are ACKs, a BYE or an ERROR with an LMT_E* code,
 *   their counts never go back nor past the writes sent; a connection the
 *   receiver closed, and an ERROR record, mean progress reports the error,
 *   and every error the plugin reports has a message;
 * - source: the hello carries the channel and the token of the address
 *   blob; every posted write completes exactly once, those completed
 *   without error are the first ones and no more than the highest count
 *   acknowledged, and progress reports an error only once every write was;
 *   flush returns;
 * - both: descriptors and threads are back to what they were, and no input
 *   takes longer than INPUT_LIMIT_NS (LeakSanitizer checks memory). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../../plugins/tcp/wire.h"
#include "bytes.h"
#include "plugin_harness.h"
#include "tcp_wire_script.h"
#define FUZZ_NAME "fuzz_tcp_wire"
#include "script.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

#define PAGE 4096u
#define NREGIONS 3u
#define PAYLOAD_MAX (64u << 10)
#define STREAM_MAX (2u << 20)
#define MAX_SPLITS 64u
#define SILENCE_MS 30
#define INPUT_LIMIT_NS 8000000000ull
#define MAX_WRITES 32u

/* The arena: guard page, then per region a pad page and the region, a
 * last pad page, guard page. Region 1 has an odd length. */
static const size_t region_len[NREGIONS] = {16u << 10, 12345, 8u << 10};
static size_t region_off[NREGIONS];
static size_t arena_len;
static uint8_t *arena, *expected, *may_change;
static uint8_t source_mem[MAX_WRITES * PAGE];

static struct ph_config cfg;
static int ack_listener = -1;
static uint16_t ack_port;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	setenv("LMT_LOG", "error", 0);
	struct lmt_error err;
	if (ph_load(&cfg, FUZZ_TCP_PLUGIN, "tcp.buffer-size=1M", &err)) {
		fprintf(stderr, "fuzz_tcp_wire: %s\n", err.message);
		abort();
	}
	size_t at = PAGE;
	for (unsigned r = 0; r < NREGIONS; r++) {
		at += PAGE;
		region_off[r] = at;
		at += (region_len[r] + PAGE - 1) / PAGE * PAGE;
	}
	arena_len = at + PAGE + PAGE;
	uint8_t *map = mmap(NULL, arena_len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (map == MAP_FAILED || mprotect(map + PAGE, arena_len - 2 * PAGE, PROT_READ | PROT_WRITE))
		abort();
	arena = map;
	expected = malloc(arena_len);
	may_change = malloc(arena_len);
	if (!expected || !may_change)
		abort();
	for (size_t i = 0; i < sizeof(source_mem); i++)
		source_mem[i] = (uint8_t)(i * 7 + 3);
	struct sockaddr_in in = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof(in);
	ack_listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (ack_listener < 0 || bind(ack_listener, (struct sockaddr *)&in, len) ||
	    listen(ack_listener, 8) || getsockname(ack_listener, (struct sockaddr *)&in, &len))
		abort();
	ack_port = ntohs(in.sin_port);
	return 0;
}

/* ---- the input, and the stream made of it ---- */

/* What the fake peer sends, and where its sends end. */
struct stream {
	uint8_t *data;
	size_t len;
	size_t splits[MAX_SPLITS];
	unsigned nsplits;
};

static void put(struct stream *s, const void *p, size_t n)
{
	if (n > STREAM_MAX - s->len)
		n = STREAM_MAX - s->len;
	memcpy(s->data + s->len, p, n);
	s->len += n;
}

static void split(struct stream *s)
{
	if (s->nsplits < MAX_SPLITS)
		s->splits[s->nsplits++] = s->len;
}

/* The peer's end of the connection: sends the stream, half-closes, and
 * reads what comes back until the other end closes or falls silent. */
struct peer {
	int fd;
	const struct stream *stream;
	uint8_t *back; /* what came back */
	size_t back_len;
	bool eof;                 /* the plugin closed (or reset) the connection */
	bool send_only;           /* another thread reads */
	_Atomic uint64_t done_ns; /* when it was done */
};

/* Send it all, unless the other end stops reading for 200 ms. */
static bool send_some(int fd, const uint8_t *p, size_t len)
{
	while (len) {
		struct pollfd pf = {.fd = fd, .events = POLLOUT};
		if (poll(&pf, 1, 200) <= 0)
			return false;
		ssize_t n = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (n <= 0)
			return false;
		p += n;
		len -= (size_t)n;
	}
	return true;
}

static void *run_peer(void *arg)
{
	struct peer *p = arg;
	const struct stream *s = p->stream;
	size_t from = 0;
	for (unsigned i = 0; i <= s->nsplits; i++) {
		size_t to = i < s->nsplits ? s->splits[i] : s->len;
		if (!send_some(p->fd, s->data + from, to - from))
			break;
		from = to;
		if (i < s->nsplits)
			usleep(1000);
	}
	shutdown(p->fd, SHUT_WR);
	while (!p->send_only) {
		struct pollfd pf = {.fd = p->fd, .events = POLLIN};
		if (poll(&pf, 1, SILENCE_MS) <= 0)
			break;
		ssize_t n = recv(p->fd, p->back + p->back_len, STREAM_MAX - p->back_len, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0 || p->back_len + (size_t)n == STREAM_MAX) {
			p->eof = n <= 0;
			break;
		}
		p->back_len += (size_t)n;
	}
	atomic_store(&p->done_ns, ph_now());
	return NULL;
}

/* ---- the destination's receiver ---- */

struct rx_script {
	uint64_t ids[NREGIONS];
	uint64_t token;
	uint64_t headers; /* write headers sent */
	bool hello_first; /* the stream opens with the right hello */
	bool bye;         /* a BYE header was sent */
};

static void allow(unsigned region, uint64_t offset, uint64_t len)
{
	if (region >= 2 || offset >= region_len[region])
		return;
	uint64_t end = len > region_len[region] - offset ? region_len[region] : offset + len;
	memset(may_change + region_off[region] + offset, 1, (size_t)(end - offset));
}

static void rx_write(struct cursor *in, struct stream *s, struct rx_script *x)
{
	unsigned flags = take8(in);
	unsigned which = take8(in) % 5;
	struct tcp_header h = {.magic = TCP_MAGIC_WRITE, .seq = x->headers};
	h.region = which < 3 ? x->ids[which] : which == 3 ? take(in, 8) : x->ids[0] + 1;
	h.offset = take(in, flags & 2 ? 8 : 2);
	h.len = take(in, flags & 4 ? 8 : 2);
	if (flags & 8)
		h.seq = take(in, 8);
	if (flags & 32)
		h.magic = (uint32_t)take(in, 4);
	uint8_t seed = take8(in);
	uint64_t payload = h.len < PAYLOAD_MAX ? h.len : PAYLOAD_MAX;
	if (flags & 16) {
		uint64_t n = take(in, 2);
		payload = n < payload ? n : payload;
	}
	uint8_t raw[TCP_HEADER_LEN];
	tcp_header_encode(&h, raw);
	put(s, raw, sizeof(raw));
	static uint8_t bytes[PAYLOAD_MAX];
	for (uint64_t i = 0; i < payload; i++)
		bytes[i] = (uint8_t)(seed + i * 29 + 0x80);
	put(s, bytes, (size_t)payload);
	x->headers++;
	if (which < 2)
		allow(which, h.offset, h.len);
}

static void rx_build(struct cursor *in, struct stream *s, struct rx_script *x)
{
	while (in->n && s->len < STREAM_MAX) {
		uint8_t raw[TCP_HELLO_LEN];
		unsigned op = take8(in) % WIRE_RX_COUNT;
		switch (op) {
		case WIRE_RX_HELLO:
			tcp_hello_encode(0, x->token, raw);
			put(s, raw, sizeof(raw));
			break;
		case WIRE_RX_BAD_HELLO: {
			unsigned kind = take8(in) % 4;
			tcp_hello_encode(kind == 1 ? 1 + take8(in) : 0,
			                 kind == 0 ? x->token ^ (take8(in) | 1) : x->token, raw);
			if (kind == 2) {
				uint16_t v = (uint16_t)take(in, 2);
				raw[4] = (uint8_t)(v == TCP_WIRE_VERSION ? v + 1 : v);
				raw[5] = (uint8_t)(v >> 8);
			}
			for (unsigned i = 0; kind == 3 && i < sizeof(raw); i++)
				raw[i] = take8(in);
			put(s, raw, sizeof(raw));
			break;
		}
		case WIRE_RX_WRITE:
			rx_write(in, s, x);
			break;
		case WIRE_RX_BYE: {
			struct tcp_header h = {.magic = TCP_MAGIC_BYE, .seq = x->headers};
			if (take8(in))
				h.seq = take(in, 8);
			uint8_t hdr[TCP_HEADER_LEN];
			tcp_header_encode(&h, hdr);
			put(s, hdr, sizeof(hdr));
			x->bye = true;
			break;
		}
		case WIRE_RX_RAW: {
			size_t n = take8(in);
			for (size_t i = 0; i < n; i++) {
				uint8_t b = take8(in);
				put(s, &b, 1);
			}
			break;
		}
		default:
			split(s);
			break;
		}
	}
	/* What docs/tcp.md says a connection must open with to be kept:
	 * magic, version, the channel and its token. */
	const uint8_t *h = s->data;
	x->hello_first = s->len >= TCP_HELLO_LEN && lmt__get32(h) == TCP_MAGIC_HELLO &&
	                 lmt__get16(h + 4) == TCP_WIRE_VERSION && lmt__get32(h + 8) == 0 &&
	                 lmt__get64(h + 16) == x->token;
}

static int connect_loopback(uint16_t port)
{
	struct sockaddr_in in = {.sin_family = AF_INET,
	                         .sin_port = htons(port),
	                         .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&in, sizeof(in)))
		abort();
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &(int){1}, sizeof(int));
	return fd;
}

/* The records the receiver sent back. */
static void check_records(const struct peer *p, const struct rx_script *x, int *error_code)
{
	uint64_t last = 0;
	*error_code = 0;
	for (size_t off = 0; off + TCP_ACK_LEN <= p->back_len; off += TCP_ACK_LEN) {
		struct tcp_ack a;
		tcp_ack_decode(p->back + off, &a);
		if (*error_code)
			fail("a record after the ERROR record");
		if (a.magic == TCP_MAGIC_ERROR) {
			if (a.code <= 0 || a.code >= LMT_ERRC_COUNT)
				fail("an ERROR record with code %d", a.code);
			*error_code = a.code;
		} else if (a.magic != TCP_MAGIC_ACK && a.magic != TCP_MAGIC_BYE) {
			fail("a record with magic 0x%08x", a.magic);
		}
		if (a.count < last || a.count > x->headers)
			fail("acknowledged %llu writes after %llu, of %llu sent",
			     (unsigned long long)a.count, (unsigned long long)last,
			     (unsigned long long)x->headers);
		last = a.count;
	}
	if (p->back_len % TCP_ACK_LEN)
		fail("%zu bytes came back, not whole records", p->back_len);
}

static void fuzz_receiver(struct cursor *in)
{
	struct ph_run run = {.cfg = &cfg};
	struct ph_side side = {0};
	ph_host_init(&side.host, &cfg, "destination");
	if (!ph_instance_open(&run, &side, LMT_ROLE_DESTINATION, 1, 50000000ull))
		fail("%s", run.why);
	const struct lmt_plugin *pl = cfg.plugin;
	lmt_endpoint *ep = NULL;
	struct lmt_blob addr = {0};
	if (pl->ops.ep_open(side.inst, 0, &ep, &addr))
		fail("ep_open failed");
	struct tcp_dst_addr a;
	if (tcp_dst_addr_decode(&addr, &a))
		fail("the endpoint's own address does not decode");

	for (size_t i = PAGE; i < arena_len - PAGE; i++)
		arena[i] = (uint8_t)(i * 13 + 1);
	memcpy(expected + PAGE, arena + PAGE, arena_len - 2 * PAGE);
	memset(may_change, 0, arena_len);
	struct rx_script x = {.token = a.token};
	lmt_mr *mr[NREGIONS];
	for (unsigned r = 0; r < NREGIONS; r++) {
		struct lmt_blob key = {0};
		struct tcp_key k;
		if (pl->ops.mr_register(side.inst, arena + region_off[r], region_len[r],
		                        LMT_MR_REMOTE_WRITE, &mr[r], &key) ||
		    tcp_key_decode(&key, &k))
			fail("registering region %u failed", r);
		x.ids[r] = k.region;
	}
	pl->ops.mr_deregister(side.inst, mr[2]); /* its id is stale from here */

	struct stream s = {.data = malloc(STREAM_MAX)};
	struct peer p = {.stream = &s, .back = malloc(STREAM_MAX)};
	if (!s.data || !p.back)
		abort();
	rx_build(in, &s, &x);
	p.fd = connect_loopback(a.port);
	pthread_t peer;
	if (pthread_create(&peer, NULL, run_peer, &p))
		abort();
	struct lmt_blob src;
	tcp_src_addr_encode(0, &src);
	int crc = pl->ops.ep_connect(ep, &src);
	char why[512];
	if (crc && (ph_host_last_error(&side.host, why, sizeof(why)) == 0 || !why[0]))
		fail("ep_connect returned %d without an error message", crc);
	if (!crc && !x.hello_first)
		fail("the endpoint accepted a connection that did not open with its hello");
	pthread_join(peer, NULL);
	int error_code;
	check_records(&p, &x, &error_code);
	/* Before ep_close: once every failed endpoint is closed, progress no
	 * longer repeats the failure (docs/writing-a-plugin.md, "Reopening a
	 * channel"). */
	/* The channel's thread records the failure it answered with ERROR or
	 * a close: progress waits for it (and returns at once once it is). */
	bool failure_due = !crc && (error_code || (p.eof && !x.bye));
	struct lmt_completion comps[4];
	int prc = pl->ops.progress(side.inst, comps, 4, failure_due ? 2000000000ull : 0);
	pl->ops.ep_close(ep);
	if (prc > 0)
		fail("the destination's progress reported %d completions", prc);
	if (prc < 0 && (ph_host_last_error(&side.host, why, sizeof(why)) == 0 || !why[0]))
		fail("progress returned %d without an error message", prc);
	if (!crc && error_code && prc != -error_code)
		fail("the receiver sent ERROR %d, progress returned %d", error_code, prc);
	if (!crc && p.eof && !x.bye && prc >= 0)
		fail("the receiver closed the connection, progress reported no error");
	for (size_t i = PAGE; i < arena_len - PAGE; i++)
		if (arena[i] != expected[i] && !may_change[i])
			fail("byte %zu of the arena changed (region offsets %zu %zu %zu)", i,
			     region_off[0], region_off[1], region_off[2]);
	if (crc)
		for (size_t i = PAGE; i < arena_len - PAGE; i++)
			if (arena[i] != expected[i])
				fail("a write was placed though ep_connect failed");
	if (getenv("FUZZ_TCP_WIRE_VERBOSE")) {
		size_t changed = 0;
		for (size_t i = PAGE; i < arena_len - PAGE; i++)
			changed += arena[i] != expected[i];
		ph_host_last_error(&side.host, why, sizeof(why));
		fprintf(stderr,
		        "fuzz_tcp_wire: receiver: ep_connect %d, %llu headers sent, %zu records "
		        "back, "
		        "%s, progress %d, %zu bytes changed; %s\n",
		        crc, (unsigned long long)x.headers, p.back_len / TCP_ACK_LEN,
		        p.eof ? "closed" : "left open", prc, changed, why);
	}
	pl->ops.mr_deregister(side.inst, mr[0]);
	pl->ops.mr_deregister(side.inst, mr[1]);
	pl->ops.instance_close(side.inst);
	ph_host_fini(&side.host);
	close(p.fd);
	free(s.data);
	free(p.back);
}

/* ---- the source's acknowledgement reader ---- */

struct tx_script {
	unsigned writes;
	uint64_t acked; /* the highest count of an ACK or BYE sent */
};

static void tx_build(struct cursor *in, struct stream *s, struct tx_script *x)
{
	while (in->n && s->len < STREAM_MAX) {
		unsigned op = take8(in) % WIRE_TX_COUNT;
		struct tcp_ack a = {.magic = op == WIRE_TX_BYE ? TCP_MAGIC_BYE : TCP_MAGIC_ACK};
		uint8_t rec[TCP_ACK_LEN];
		switch (op) {
		case WIRE_TX_ACK:
		case WIRE_TX_BYE: {
			uint8_t sel = take8(in);
			a.count = sel & 0x80 ? take(in, 8) : sel % (x->writes + 3);
			if (a.count > x->acked)
				x->acked = a.count;
			break;
		}
		case WIRE_TX_ERROR:
			a.magic = TCP_MAGIC_ERROR;
			a.code = (int32_t)take(in, 4);
			break;
		case WIRE_TX_MAGIC:
			a.magic = (uint32_t)take(in, 4);
			a.count = take(in, 8);
			if ((a.magic == TCP_MAGIC_ACK || a.magic == TCP_MAGIC_BYE) &&
			    a.count > x->acked)
				x->acked = a.count;
			break;
		case WIRE_TX_RAW: {
			size_t n = take8(in);
			for (size_t i = 0; i < n; i++) {
				uint8_t b = take8(in);
				put(s, &b, 1);
			}
			/* Raw bytes can make a record of any count. */
			x->acked = UINT64_MAX;
			continue;
		}
		default:
			split(s);
			continue;
		}
		tcp_ack_encode(&a, rec);
		put(s, rec, sizeof(rec));
	}
}

/* The fake destination's end: drain what the source sends while the
 * peer thread answers. */
struct drain {
	int fd;
	uint8_t hello[TCP_HELLO_LEN];
	size_t got;
};

static void *run_drain(void *arg)
{
	struct drain *d = arg;
	uint8_t buf[16384];
	for (;;) {
		struct pollfd pf = {.fd = d->fd, .events = POLLIN};
		if (poll(&pf, 1, 1000) <= 0)
			break;
		ssize_t n = recv(d->fd, buf, sizeof(buf), 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		for (ssize_t i = 0; i < n && d->got < TCP_HELLO_LEN; i++)
			d->hello[d->got++] = buf[i];
	}
	return NULL;
}

static void fuzz_acks(struct cursor *in)
{
	struct ph_run run = {.cfg = &cfg};
	struct ph_side side = {0};
	ph_host_init(&side.host, &cfg, "source");
	if (!ph_instance_open(&run, &side, LMT_ROLE_SOURCE, 1, 200000000ull))
		fail("%s", run.why);
	const struct lmt_plugin *pl = cfg.plugin;
	lmt_endpoint *ep = NULL;
	struct lmt_blob addr = {0};
	if (pl->ops.ep_open(side.inst, 0, &ep, &addr))
		fail("ep_open failed");
	uint64_t token = 0x1234567890abcdefull ^ take(in, 2);
	struct tcp_dst_addr d = {.family = TCP_FAMILY_IPV4, .port = ack_port, .token = token};
	memcpy(d.ip, (uint8_t[]){127, 0, 0, 1}, 4);
	struct lmt_blob blob;
	tcp_dst_addr_encode(&d, &blob);
	if (pl->ops.ep_connect(ep, &blob))
		fail("the source could not connect to the harness");
	struct drain dr = {.fd = accept4(ack_listener, NULL, NULL, SOCK_CLOEXEC)};
	if (dr.fd < 0)
		abort();
	setsockopt(dr.fd, IPPROTO_TCP, TCP_NODELAY, &(int){1}, sizeof(int));

	struct tx_script x = {.writes = 1 + take8(in) % MAX_WRITES};
	struct lmt_blob key;
	tcp_key_encode(&(struct tcp_key){.region = 0x77, .len = MAX_WRITES * PAGE}, &key);
	lmt_rkey *rkey = NULL;
	if (pl->ops.rkey_import(side.inst, &key, &rkey))
		fail("importing a valid key failed");
	for (unsigned i = 0; i < x.writes; i++) {
		size_t len = 1 + take(in, 2) % PAGE;
		int rc = pl->ops.write(ep, source_mem + i * PAGE, len, NULL, rkey, i * PAGE,
		                       100 + i);
		if (rc)
			fail("posting write %u failed (%d)", i, rc);
	}
	struct stream s = {.data = malloc(STREAM_MAX)};
	struct peer p = {.fd = dr.fd, .stream = &s, .send_only = true};
	if (!s.data)
		abort();
	tx_build(in, &s, &x);
	pthread_t peer, drain;
	/* The peer only sends; what comes back is the drain's. */
	if (pthread_create(&drain, NULL, run_drain, &dr))
		abort();
	if (pthread_create(&peer, NULL, run_peer, &p))
		abort();

	uint8_t seen[MAX_WRITES] = {0};
	unsigned done = 0, ok = 0;
	int prc = 0;
	uint64_t until = ph_now() + 3 * PH_SECOND;
	/* Until progress fails, or the peer is done and every write completed
	 * without error a while ago (a BYE after the last ACK closes in
	 * order). A write that failed must be followed by progress's error. */
	while (prc >= 0 && ph_now() < until) {
		uint64_t peer_done = atomic_load(&p.done_ns);
		if (ok == x.writes && peer_done && ph_now() - peer_done > 100000000ull)
			break;
		struct lmt_completion comps[8];
		prc = pl->ops.progress(side.inst, comps, 8, 10000000ull);
		for (int i = 0; i < prc; i++) {
			uint64_t k = comps[i].cookie - 100;
			if (comps[i].cookie < 100 || k >= x.writes || seen[k]++)
				fail("completion of cookie %llu: never posted or reported twice",
				     (unsigned long long)comps[i].cookie);
			done++;
			if (comps[i].status == 0) {
				if (k != ok)
					fail("write %llu completed before write %u",
					     (unsigned long long)k, ok);
				ok++;
			}
		}
	}
	if (done != x.writes)
		fail("progress returned %d with %u of %u writes completed", prc, done, x.writes);
	if (prc >= 0 && ok != x.writes)
		fail("%u of %u writes failed, and progress reported no error within 3 s",
		     x.writes - ok, x.writes);
	char why[512] = "";
	if (prc < 0 && (ph_host_last_error(&side.host, why, sizeof(why)) == 0 || !why[0]))
		fail("progress returned %d without an error message", prc);
	if (ok > x.acked)
		fail("%u writes completed, %llu acknowledged", ok, (unsigned long long)x.acked);
	if (getenv("FUZZ_TCP_WIRE_VERBOSE")) {
		ph_host_last_error(&side.host, why, sizeof(why));
		fprintf(stderr,
		        "fuzz_tcp_wire: acks: %u writes, %u completed, %u of them ok, %llu "
		        "acknowledged, progress %d: %s\n",
		        x.writes, done, ok, (unsigned long long)x.acked, prc, why);
	}
	uint64_t t = ph_now();
	int frc = pl->ops.flush(side.inst, 50000000ull);
	if (frc > 0 || ph_now() - t > PH_SECOND)
		fail("flush returned %d after %llu ms", frc,
		     (unsigned long long)((ph_now() - t) / 1000000));
	pthread_join(peer, NULL);
	pl->ops.ep_close(ep);
	pl->ops.rkey_release(side.inst, rkey);
	pl->ops.instance_close(side.inst);
	pthread_join(drain, NULL);
	if (dr.got != TCP_HELLO_LEN || tcp_hello_check(dr.hello, 0, token))
		fail("the source's hello does not carry its channel and token");
	ph_host_fini(&side.host);
	close(dr.fd);
	free(s.data);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1 || size > (256u << 10))
		return 0;
	fuzz_baseline();
	uint64_t t0 = now_ns();
	struct cursor in = {data + 1, size - 1};
	if (data[0] & 1)
		fuzz_acks(&in);
	else
		fuzz_receiver(&in);
	fuzz_input_end(t0, INPUT_LIMIT_NS);
	return 0;
}
