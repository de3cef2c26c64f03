/* Unit tests of the TCP plugin: a destination and a source instance in one
 * process over 127.0.0.1, driven through the plugin ABI and a fake host. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <lmt/plugin.h>
#include <lmt/version.h>

#include "wire.h"

/* Under ThreadSanitizer every byte through recv and memcmp is checked,
 * which makes a 1 GiB transfer take half a minute. */
#if defined(__SANITIZE_THREAD__)
#define SLOW_MEMORY_CHECKS 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SLOW_MEMORY_CHECKS 1
#endif
#endif

#define MAX_CHANNELS 4
#define GUARD 4096
#define SECOND 1000000000ull

static const char *module_path;
static void *module;
static const struct lmt_plugin *plugin;

/* ---- Fake host ----------------------------------------------------------- */

struct fake_host {
	pthread_mutex_t lock;
	char log[16384];
	size_t log_len;
	int errors;     /* how many were recorded */
	int error_code; /* the first */
	char error[512];
	atomic_int cancelled;
	const char *address;
	int64_t buffer_size;
};

static void fake_log(void *ctx, enum lmt_log_level level, const char *fmt, ...) LMT_PRINTF(3, 4);
static int fake_error(void *ctx, int code, const char *fmt, ...) LMT_PRINTF(3, 4);

static void fake_log(void *ctx, enum lmt_log_level level, const char *fmt, ...)
{
	struct fake_host *h = ctx;
	va_list ap;
	pthread_mutex_lock(&h->lock);
	size_t room = sizeof(h->log) - h->log_len;
	if (room > 1) {
		va_start(ap, fmt);
		int n = vsnprintf(h->log + h->log_len, room - 1, fmt, ap);
		va_end(ap);
		if (n > 0)
			h->log_len += (size_t)n < room - 1 ? (size_t)n : room - 2;
		h->log[h->log_len++] = '\n';
		h->log[h->log_len] = 0;
	}
	pthread_mutex_unlock(&h->lock);
	(void)level;
}

static int fake_error(void *ctx, int code, const char *fmt, ...)
{
	struct fake_host *h = ctx;
	pthread_mutex_lock(&h->lock);
	if (h->errors++ == 0) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(h->error, sizeof(h->error), fmt, ap);
		va_end(ap);
		h->error_code = code;
	}
	pthread_mutex_unlock(&h->lock);
	return -code;
}

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * SECOND + (uint64_t)ts.tv_nsec;
}

static uint64_t fake_now(void *ctx)
{
	(void)ctx;
	return now_ns();
}

static int fake_option(void *ctx, const char *name, struct lmt_option_value *out)
{
	struct fake_host *h = ctx;
	memset(out, 0, sizeof(*out));
	if (strcmp(name, "tcp.nodelay") == 0) {
		out->type = LMT_OPT_BOOL;
		out->boolean = 1;
	} else if (strcmp(name, "tcp.buffer-size") == 0) {
		out->type = LMT_OPT_SIZE;
		out->integer = h->buffer_size;
	} else if (strcmp(name, "tcp.address") == 0) {
		out->type = LMT_OPT_STRING;
		out->text = h->address;
	} else {
		return -LMT_ENOTFOUND;
	}
	return 0;
}

static int fake_cancelled(void *ctx)
{
	struct fake_host *h = ctx;
	return atomic_load(&h->cancelled);
}

static const struct lmt_host host_services = {
        .abi_version = LMT_PLUGIN_ABI_VERSION,
        .struct_size = sizeof(struct lmt_host),
        .log = fake_log,
        .error = fake_error,
        .now_ns = fake_now,
        .option = fake_option,
        .cancelled = fake_cancelled,
};

static void fake_host_init(struct fake_host *h)
{
	memset(h, 0, sizeof(*h));
	pthread_mutex_init(&h->lock, NULL);
	h->address = "";
	h->buffer_size = 4 << 20;
}

static int error_count(struct fake_host *h)
{
	pthread_mutex_lock(&h->lock);
	int n = h->errors;
	pthread_mutex_unlock(&h->lock);
	return n;
}

/* ---- Instances, endpoints, regions --------------------------------------- */

static int open_instance_at(struct fake_host *h, enum lmt_role role, uint32_t channels,
                            uint64_t timeout_ns, const char *local_host, lmt_instance **inst)
{
	struct lmt_instance_params params = {.struct_size = sizeof(params),
	                                     .role = role,
	                                     .channels = channels,
	                                     .timeout_ns = timeout_ns};
	snprintf(params.local_host, sizeof(params.local_host), "%s", local_host);
	snprintf(params.peer_host, sizeof(params.peer_host), "%s", local_host);
	*inst = NULL;
	return plugin->ops.instance_open(&host_services, h, &params, inst);
}

static lmt_instance *open_instance(struct fake_host *h, enum lmt_role role, uint32_t channels,
                                   uint64_t timeout_ns)
{
	lmt_instance *inst;
	assert_int_equal(open_instance_at(h, role, channels, timeout_ns, "127.0.0.1", &inst), 0);
	assert_non_null(inst);
	return inst;
}

struct pair {
	struct fake_host dst_host, src_host;
	lmt_instance *dst, *src;
	uint32_t channels;
	lmt_endpoint *dst_ep[MAX_CHANNELS], *src_ep[MAX_CHANNELS];
	struct lmt_blob dst_addr[MAX_CHANNELS], src_addr[MAX_CHANNELS];
	int accept_rc;
};

static void *accept_all(void *arg)
{
	struct pair *p = arg;
	for (uint32_t c = 0; c < p->channels && !p->accept_rc; c++)
		p->accept_rc = plugin->ops.ep_connect(p->dst_ep[c], &p->src_addr[c]);
	return NULL;
}

/* Both instances with every channel connected, as the core would do it. */
static struct pair *pair_open(uint32_t channels)
{
	struct pair *p = calloc(1, sizeof(*p));
	assert_non_null(p);
	p->channels = channels;
	fake_host_init(&p->dst_host);
	fake_host_init(&p->src_host);
	p->dst = open_instance(&p->dst_host, LMT_ROLE_DESTINATION, channels, 5 * SECOND);
	p->src = open_instance(&p->src_host, LMT_ROLE_SOURCE, channels, 5 * SECOND);
	for (uint32_t c = 0; c < channels; c++) {
		int rc = plugin->ops.ep_open(p->src, c, &p->src_ep[c], &p->src_addr[c]);
		assert_int_equal(rc, 0);
	}
	for (uint32_t c = 0; c < channels; c++) {
		int rc = plugin->ops.ep_open(p->dst, c, &p->dst_ep[c], &p->dst_addr[c]);
		assert_int_equal(rc, 0);
	}
	pthread_t acceptor;
	assert_int_equal(pthread_create(&acceptor, NULL, accept_all, p), 0);
	for (uint32_t c = 0; c < channels; c++)
		assert_int_equal(plugin->ops.ep_connect(p->src_ep[c], &p->dst_addr[c]), 0);
	pthread_join(acceptor, NULL);
	assert_int_equal(p->accept_rc, 0);
	return p;
}

static void pair_close(struct pair *p)
{
	plugin->ops.instance_close(p->src);
	plugin->ops.instance_close(p->dst);
	pthread_mutex_destroy(&p->src_host.lock);
	pthread_mutex_destroy(&p->dst_host.lock);
	free(p);
}

/* A destination region with guard bytes on both sides, and its key
 * imported on the source. */
struct region {
	uint8_t *block;
	uint8_t *mem;
	size_t len;
	lmt_mr *mr;
	struct lmt_blob key;
	lmt_rkey *rkey;
};

static void region_open(struct region *r, lmt_instance *dst, lmt_instance *src, size_t len)
{
	r->len = len;
	r->block = mmap(NULL, len + 2 * GUARD, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
	                -1, 0);
	assert_true(r->block != MAP_FAILED);
	memset(r->block, 0xa5, GUARD);
	memset(r->block + GUARD + len, 0xa5, GUARD);
	r->mem = r->block + GUARD;
	assert_int_equal(
	        plugin->ops.mr_register(dst, r->mem, len, LMT_MR_REMOTE_WRITE, &r->mr, &r->key), 0);
	r->rkey = NULL;
	if (src)
		assert_int_equal(plugin->ops.rkey_import(src, &r->key, &r->rkey), 0);
}

static void region_close(struct region *r, lmt_instance *dst, lmt_instance *src)
{
	if (src && r->rkey)
		plugin->ops.rkey_release(src, r->rkey);
	if (dst)
		plugin->ops.mr_deregister(dst, r->mr);
	munmap(r->block, r->len + 2 * GUARD);
}

static int guards_intact(const struct region *r)
{
	for (size_t i = 0; i < GUARD; i++)
		if (r->block[i] != 0xa5 || r->block[GUARD + r->len + i] != 0xa5)
			return 0;
	return 1;
}

static uint8_t *pattern(size_t len, uint64_t seed)
{
	uint8_t *buf = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	assert_true(buf != MAP_FAILED);
	uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
	for (size_t i = 0; i < len; i += 8) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		memcpy(buf + i, &x, len - i < 8 ? len - i : 8);
	}
	return buf;
}

/* ---- Writes and completions ---------------------------------------------- */

struct tally {
	uint8_t *seen; /* completions per cookie */
	uint64_t cookies;
	uint64_t done;
	uint64_t failed;
};

static void tally_init(struct tally *t, uint64_t cookies)
{
	t->seen = calloc(cookies, 1);
	assert_non_null(t->seen);
	t->cookies = cookies;
	t->done = t->failed = 0;
}

static int harvest(lmt_instance *src, struct tally *t, uint64_t timeout_ns)
{
	struct lmt_completion c[64];
	int n = plugin->ops.progress(src, c, 64, timeout_ns);
	for (int i = 0; i < n; i++) {
		assert_true(c[i].cookie < t->cookies);
		t->seen[c[i].cookie]++;
		t->done++;
		if (c[i].status)
			t->failed++;
	}
	return n;
}

/* Post a write, harvesting completions while the channel's queue is full. */
static void post(struct pair *p, uint32_t channel, const void *buf, size_t len, lmt_rkey *rkey,
                 uint64_t offset, uint64_t cookie, struct tally *t)
{
	uint64_t deadline = now_ns() + 10 * SECOND;
	for (;;) {
		int rc =
		        plugin->ops.write(p->src_ep[channel], buf, len, NULL, rkey, offset, cookie);
		if (rc != -LMT_EAGAIN) {
			assert_int_equal(rc, 0);
			return;
		}
		assert_true(harvest(p->src, t, SECOND / 10) >= 0);
		assert_true(now_ns() < deadline);
	}
}

static void harvest_all(lmt_instance *src, struct tally *t, uint64_t expected)
{
	uint64_t deadline = now_ns() + 10 * SECOND;
	while (t->done < expected) {
		assert_true(harvest(src, t, SECOND / 10) >= 0);
		assert_true(now_ns() < deadline);
	}
}

/* Sizes that cross every interesting boundary: tiny, page, ack batch,
 * socket buffer, several MiB. */
static const size_t piece_sizes[] = {
        1,       7,     0,          512,     4096,          4099,
        65536,   65537, 262144 + 3, 1 << 20, (1 << 20) + 1, 3 << 20,
        8 << 20, 100,   4095,       2 << 20,
};
#define PIECES (sizeof(piece_sizes) / sizeof(piece_sizes[0]))

/* Write the region piece by piece from a pattern, over `channels`
 * channels, flush, and compare. The pieces never overlap. */
static void write_pieces_and_verify(uint32_t channels, unsigned rounds)
{
	struct pair *p = pair_open(channels);
	size_t total = 0;
	for (size_t i = 0; i < PIECES; i++)
		total += piece_sizes[i];
	struct region r;
	region_open(&r, p->dst, p->src, total * rounds + 13);
	uint8_t *src = pattern(r.len, channels);
	struct tally t;
	tally_init(&t, PIECES * rounds);

	uint64_t offset = 13, cookie = 0;
	for (unsigned round = 0; round < rounds; round++) {
		for (size_t i = 0; i < PIECES; i++, cookie++) {
			size_t len = piece_sizes[(i + round) % PIECES];
			post(p, (uint32_t)(cookie % channels), src + offset, len, r.rkey, offset,
			     cookie, &t);
			offset += len;
		}
	}
	assert_int_equal(plugin->ops.flush(p->src, 10 * SECOND), 0);
	/* Flush means placed: compare before harvesting anything else. */
	assert_memory_equal(r.mem + 13, src + 13, offset - 13);
	for (size_t i = 0; i < 13; i++)
		assert_int_equal(r.mem[i], 0);
	assert_true(guards_intact(&r));
	harvest_all(p->src, &t, cookie);
	assert_int_equal(t.failed, 0);
	assert_int_equal(error_count(&p->src_host), 0);
	assert_int_equal(error_count(&p->dst_host), 0);

	munmap(src, r.len);
	region_close(&r, p->dst, p->src);
	free(t.seen);
	pair_close(p);
}

/* ---- Tests --------------------------------------------------------------- */

static void test_entry_gives_descriptor_with_multi_channel_only(void **state)
{
	(void)state;
	assert_string_equal(plugin->name, "tcp");
	assert_string_equal(plugin->version, LMT_VERSION);
	assert_int_equal(plugin->abi_version, LMT_PLUGIN_ABI_VERSION);
	assert_true(plugin->struct_size >= sizeof(struct lmt_plugin));
	assert_int_equal(plugin->caps, LMT_CAP_MULTI_CHANNEL);
	assert_int_equal(plugin->option_count, 3);
	assert_string_equal(plugin->options[0].name, "nodelay");
	assert_string_equal(plugin->options[1].name, "buffer-size");
	assert_string_equal(plugin->options[2].name, "address");
}

static void test_entry_refuses_an_older_core(void **state)
{
	(void)state;
	lmt_plugin_entry_fn entry = (lmt_plugin_entry_fn)dlsym(module, LMT_PLUGIN_ENTRY_SYMBOL);
	const struct lmt_plugin *d = NULL;
	assert_int_equal(entry(0, &d), -LMT_EABI);
	assert_non_null(d);
}

static void test_one_channel_places_writes_bit_for_bit(void **state)
{
	(void)state;
	write_pieces_and_verify(1, 2);
}

static void test_two_channels_place_writes_bit_for_bit(void **state)
{
	(void)state;
	write_pieces_and_verify(2, 2);
}

static void test_every_cookie_completes_exactly_once(void **state)
{
	(void)state;
	enum { WRITES = 5000, SIZE = 512 };
	struct pair *p = pair_open(2);
	struct region r;
	region_open(&r, p->dst, p->src, (size_t)WRITES * SIZE);
	uint8_t *src = pattern(r.len, 7);
	struct tally t;
	tally_init(&t, WRITES);
	for (uint64_t i = 0; i < WRITES; i++)
		post(p, (uint32_t)(i & 1), src + i * SIZE, SIZE, r.rkey, i * SIZE, i, &t);
	harvest_all(p->src, &t, WRITES);
	/* Nothing more may arrive. */
	assert_int_equal(harvest(p->src, &t, SECOND / 5), 0);
	for (uint64_t i = 0; i < WRITES; i++)
		assert_int_equal(t.seen[i], 1);
	assert_int_equal(t.failed, 0);
	assert_memory_equal(r.mem, src, r.len);

	munmap(src, r.len);
	region_close(&r, p->dst, p->src);
	free(t.seen);
	pair_close(p);
}

static void test_full_queue_answers_eagain(void **state)
{
	(void)state;
	struct pair *p = pair_open(1);
	struct region r;
	region_open(&r, p->dst, p->src, 4096);
	static const uint8_t data[8] = {1, 2, 3, 4, 5, 6, 7, 8};
	uint64_t posted = 0;
	int rc;
	while ((rc = plugin->ops.write(p->src_ep[0], data, 8, NULL, r.rkey, 0, posted)) == 0)
		assert_true(++posted <= 100000);
	assert_int_equal(rc, -LMT_EAGAIN);
	assert_true(posted >= 16);
	struct tally t;
	tally_init(&t, posted + 1);
	assert_true(harvest(p->src, &t, SECOND) > 0);
	assert_int_equal(plugin->ops.write(p->src_ep[0], data, 8, NULL, r.rkey, 0, posted), 0);
	assert_int_equal(plugin->ops.flush(p->src, 5 * SECOND), 0);
	harvest_all(p->src, &t, posted + 1);
	assert_int_equal(error_count(&p->src_host), 0);

	region_close(&r, p->dst, p->src);
	free(t.seen);
	pair_close(p);
}

static void test_gigabyte_write_lands_whole(void **state)
{
	(void)state;
#ifdef SLOW_MEMORY_CHECKS
	skip();
#endif
	size_t len = (1ul << 30) + 4097;
	struct pair *p = pair_open(1);
	struct region r;
	region_open(&r, p->dst, p->src, len);
	uint8_t *src = pattern(len, 3);
	struct tally t;
	tally_init(&t, 1);
	post(p, 0, src, len, r.rkey, 0, 0, &t);
	assert_int_equal(plugin->ops.flush(p->src, 60 * SECOND), 0);
	assert_int_equal(memcmp(r.mem, src, len), 0);
	assert_true(guards_intact(&r));
	harvest_all(p->src, &t, 1);
	assert_int_equal(t.failed, 0);

	munmap(src, len);
	region_close(&r, p->dst, p->src);
	free(t.seen);
	pair_close(p);
}

static void test_write_past_key_length_is_rejected(void **state)
{
	(void)state;
	struct pair *p = pair_open(1);
	struct region r;
	region_open(&r, p->dst, p->src, 8192);
	uint8_t buf[16] = {0};
	const struct {
		size_t len;
		uint64_t offset;
	} bad[] = {{1, 8192}, {16, 8180}, {8193, 0}, {16, UINT64_MAX - 7}, {SIZE_MAX, 1}};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		assert_int_equal(plugin->ops.write(p->src_ep[0], buf, bad[i].len, NULL, r.rkey,
		                                   bad[i].offset, i),
		                 -LMT_EINVAL);
	assert_int_equal(p->src_host.error_code, LMT_EINVAL);
	/* The last byte is still writable. */
	assert_int_equal(plugin->ops.write(p->src_ep[0], buf, 1, NULL, r.rkey, 8191, 99), 0);
	assert_int_equal(plugin->ops.flush(p->src, 5 * SECOND), 0);

	region_close(&r, p->dst, p->src);
	pair_close(p);
}

static void test_malformed_key_blob_is_rejected(void **state)
{
	(void)state;
	struct fake_host dh, sh;
	fake_host_init(&dh);
	fake_host_init(&sh);
	lmt_instance *dst = open_instance(&dh, LMT_ROLE_DESTINATION, 1, SECOND);
	lmt_instance *src = open_instance(&sh, LMT_ROLE_SOURCE, 1, SECOND);
	struct region r;
	region_open(&r, dst, NULL, 4096);

	struct lmt_blob bad[7];
	for (int i = 0; i < 7; i++)
		bad[i] = r.key;
	bad[0].len--;                   /* short */
	bad[1].data[0] ^= 1;            /* magic */
	bad[2].data[4] = 9;             /* version */
	bad[3].data[8] = 0;             /* region id 0 (ids start at 1) */
	memset(bad[4].data + 16, 0, 8); /* zero length */
	bad[5].len = LMT_BLOB_MAX;      /* long */
	bad[6].data[13] = 1;            /* reserved */
	for (int i = 0; i < 7; i++) {
		lmt_rkey *rkey = NULL;
		assert_int_equal(plugin->ops.rkey_import(src, &bad[i], &rkey), -LMT_EPROTO);
		assert_null(rkey);
	}
	assert_int_equal(sh.error_code, LMT_EPROTO);
	assert_non_null(strstr(sh.error, "key blob"));
	lmt_rkey *good = NULL;
	assert_int_equal(plugin->ops.rkey_import(src, &r.key, &good), 0);
	/* Not released on purpose: instance_close frees it. */

	region_close(&r, dst, NULL);
	plugin->ops.instance_close(src);
	plugin->ops.instance_close(dst);
}

static void test_malformed_address_blob_is_rejected(void **state)
{
	(void)state;
	struct fake_host dh, sh;
	fake_host_init(&dh);
	fake_host_init(&sh);
	lmt_instance *dst = open_instance(&dh, LMT_ROLE_DESTINATION, 2, SECOND);
	lmt_instance *src = open_instance(&sh, LMT_ROLE_SOURCE, 2, SECOND);
	lmt_endpoint *dep, *sep;
	struct lmt_blob daddr, saddr;
	assert_int_equal(plugin->ops.ep_open(src, 0, &sep, &saddr), 0);
	assert_int_equal(plugin->ops.ep_open(dst, 0, &dep, &daddr), 0);

	struct lmt_blob bad[6];
	for (int i = 0; i < 6; i++)
		bad[i] = daddr;
	bad[0].len = 3;                /* short */
	bad[1].data[3] ^= 0x80;        /* magic */
	bad[2].data[5] = 1;            /* version */
	bad[3].data[6] = 5;            /* family */
	bad[4].data[36] = 1;           /* channel 1, for endpoint 0 */
	memset(bad[5].data + 8, 0, 2); /* port 0 */
	for (int i = 0; i < 6; i++)
		assert_int_equal(plugin->ops.ep_connect(sep, &bad[i]), -LMT_EPROTO);
	assert_int_equal(sh.error_code, LMT_EPROTO);
	assert_non_null(strstr(sh.error, "address blob"));

	struct lmt_blob bad_src = saddr;
	bad_src.data[0] = 0;
	assert_int_equal(plugin->ops.ep_connect(dep, &bad_src), -LMT_EPROTO);
	bad_src = daddr; /* a destination's blob is not a source's */
	assert_int_equal(plugin->ops.ep_connect(dep, &bad_src), -LMT_EPROTO);
	assert_int_equal(dh.error_code, LMT_EPROTO);

	plugin->ops.instance_close(src);
	plugin->ops.instance_close(dst);
}

/* A raw connection to a destination endpoint that says hello with the
 * blob's token xor'ed by `token_xor`, as `channel`. */
static int raw_connect(const struct lmt_blob *addr, uint64_t token_xor, uint32_t channel)
{
	struct tcp_dst_addr a;
	assert_null(tcp_dst_addr_decode(addr, &a));
	assert_int_equal(a.family, TCP_FAMILY_IPV4);
	struct sockaddr_in in = {.sin_family = AF_INET, .sin_port = htons(a.port)};
	memcpy(&in.sin_addr, a.ip, 4);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_true(fd >= 0);
	assert_int_equal(connect(fd, (struct sockaddr *)&in, sizeof(in)), 0);
	uint8_t hello[TCP_HELLO_LEN];
	tcp_hello_encode(channel, a.token ^ token_xor, hello);
	assert_int_equal(send(fd, hello, sizeof(hello), MSG_NOSIGNAL), sizeof(hello));
	return fd;
}

/* Read from a raw socket until EOF; returns the bytes read (up to size). */
static size_t read_to_eof(int fd, uint8_t *buf, size_t size)
{
	struct timeval tv = {.tv_sec = 5};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	size_t got = 0;
	for (;;) {
		uint8_t scratch[64];
		ssize_t n = recv(fd, got < size ? buf + got : scratch,
		                 got < size ? size - got : sizeof(scratch), 0);
		assert_true(n >= 0); /* no timeout: the peer must close */
		if (n == 0)
			return got;
		got += got < size ? (size_t)n : 0;
	}
}

static void test_unknown_token_connection_is_ignored(void **state)
{
	(void)state;
	struct fake_host dh, sh;
	fake_host_init(&dh);
	fake_host_init(&sh);
	lmt_instance *dst = open_instance(&dh, LMT_ROLE_DESTINATION, 1, 5 * SECOND);
	lmt_instance *src = open_instance(&sh, LMT_ROLE_SOURCE, 1, 5 * SECOND);
	struct pair p = {.channels = 1, .dst = dst, .src = src};
	assert_int_equal(plugin->ops.ep_open(src, 0, &p.src_ep[0], &p.src_addr[0]), 0);
	assert_int_equal(plugin->ops.ep_open(dst, 0, &p.dst_ep[0], &p.dst_addr[0]), 0);

	/* Two impostors queue up before the real source. */
	int wrong_token = raw_connect(&p.dst_addr[0], 0x5a5a, 0);
	int wrong_channel = raw_connect(&p.dst_addr[0], 0, 7);
	pthread_t acceptor;
	assert_int_equal(pthread_create(&acceptor, NULL, accept_all, &p), 0);
	usleep(100000);
	assert_int_equal(plugin->ops.ep_connect(p.src_ep[0], &p.dst_addr[0]), 0);
	pthread_join(acceptor, NULL);
	assert_int_equal(p.accept_rc, 0);
	uint8_t buf[16];
	assert_int_equal(read_to_eof(wrong_token, buf, sizeof(buf)), 0);
	assert_int_equal(read_to_eof(wrong_channel, buf, sizeof(buf)), 0);
	close(wrong_token);
	close(wrong_channel);
	assert_non_null(strstr(dh.log, "wrong token"));
	assert_non_null(strstr(dh.log, "another channel"));
	assert_int_equal(error_count(&dh), 0);

	/* The real source's writes land. */
	struct region r;
	region_open(&r, dst, src, 4096);
	uint8_t *data = pattern(4096, 5);
	assert_int_equal(plugin->ops.write(p.src_ep[0], data, 4096, NULL, r.rkey, 0, 0), 0);
	assert_int_equal(plugin->ops.flush(src, 5 * SECOND), 0);
	assert_memory_equal(r.mem, data, 4096);

	munmap(data, 4096);
	region_close(&r, dst, src);
	plugin->ops.instance_close(src);
	plugin->ops.instance_close(dst);
}

/* Connect a raw socket as the source of a one-channel destination with a
 * guarded 4096-byte region, and send one forged header with `payload`
 * bytes after it. The destination must fail the channel with LMT_EPROTO,
 * record a message containing `expect`, and leave memory alone. */
static void forge_write(uint32_t magic, uint32_t region_delta, uint64_t offset, uint64_t len,
                        size_t payload, const char *expect)
{
	struct fake_host dh;
	fake_host_init(&dh);
	lmt_instance *dst = open_instance(&dh, LMT_ROLE_DESTINATION, 1, 5 * SECOND);
	lmt_endpoint *ep;
	struct lmt_blob addr, src_addr;
	assert_int_equal(plugin->ops.ep_open(dst, 0, &ep, &addr), 0);
	struct region r;
	region_open(&r, dst, NULL, 4096);
	struct tcp_key key;
	assert_null(tcp_key_decode(&r.key, &key));

	int fd = raw_connect(&addr, 0, 0);
	tcp_src_addr_encode(0, &src_addr);
	assert_int_equal(plugin->ops.ep_connect(ep, &src_addr), 0);
	uint8_t msg[TCP_HEADER_LEN + 256];
	memset(msg, 0x5a, sizeof(msg));
	struct tcp_header h = {.magic = magic,
	                       .region = key.region + region_delta,
	                       .offset = offset,
	                       .len = len,
	                       .seq = 0};
	tcp_header_encode(&h, msg);
	assert_true(payload <= 256);
	assert_int_equal(send(fd, msg, TCP_HEADER_LEN + payload, MSG_NOSIGNAL),
	                 TCP_HEADER_LEN + payload);

	/* The core learns of it through progress. */
	struct lmt_completion c[4];
	assert_int_equal(plugin->ops.progress(dst, c, 4, 5 * SECOND), -LMT_EPROTO);
	assert_int_equal(dh.error_code, LMT_EPROTO);
	assert_non_null(strstr(dh.error, expect));
	/* The source side hears why, then the stream ends. */
	uint8_t reply[TCP_ACK_LEN];
	assert_int_equal(read_to_eof(fd, reply, sizeof(reply)), TCP_ACK_LEN);
	struct tcp_ack ack;
	tcp_ack_decode(reply, &ack);
	assert_int_equal(ack.magic, TCP_MAGIC_ERROR);
	assert_int_equal(ack.code, LMT_EPROTO);
	assert_true(guards_intact(&r));
	for (size_t i = 0; i < r.len; i++)
		assert_int_equal(r.mem[i], 0);

	close(fd);
	region_close(&r, dst, NULL);
	plugin->ops.instance_close(dst);
	pthread_mutex_destroy(&dh.lock);
}

static void test_forged_header_past_region_end_is_rejected(void **state)
{
	(void)state;
	forge_write(TCP_MAGIC_WRITE, 0, 4000, 200, 200,
	            "tcp channel 0: write of 200 bytes at offset 4000 outside region 1 "
	            "(4096 bytes)");
}

static void test_forged_header_with_wrapping_offset_is_rejected(void **state)
{
	(void)state;
	forge_write(TCP_MAGIC_WRITE, 0, UINT64_MAX - 99, 200, 200, "outside region 1");
}

static void test_forged_header_for_unknown_region_is_rejected(void **state)
{
	(void)state;
	forge_write(TCP_MAGIC_WRITE, 1, 0, 100, 100, "unknown region 2");
}

static void test_forged_header_with_bad_magic_is_rejected(void **state)
{
	(void)state;
	forge_write(0xdeadbeef, 0, 0, 16, 16, "bad header magic 0xdeadbeef");
}

static void test_destination_close_mid_stream_gives_source_econn(void **state)
{
	(void)state;
	enum { WRITES = 4000, SIZE = 1 << 20, SLOTS = 64 };
	struct pair *p = pair_open(2);
	struct region r;
	region_open(&r, p->dst, p->src, (size_t)SLOTS * SIZE);
	uint8_t *src = pattern(r.len, 9);
	struct tally t;
	tally_init(&t, WRITES);
	uint64_t posted = 0;
	for (; posted < SLOTS; posted++)
		post(p, (uint32_t)(posted & 1), src + posted * SIZE, SIZE, r.rkey, posted * SIZE,
		     posted, &t);
	plugin->ops.instance_close(p->dst);
	p->dst = NULL;

	/* Keep the source busy until it notices. */
	uint64_t deadline = now_ns() + 10 * SECOND;
	int rc = 0;
	while (rc >= 0 && posted < WRITES) {
		assert_true(now_ns() < deadline);
		uint64_t at = posted % SLOTS * SIZE;
		lmt_endpoint *ep = p->src_ep[posted & 1];
		int wrc = plugin->ops.write(ep, src + at, SIZE, NULL, r.rkey, at, posted);
		if (wrc == 0)
			posted++;
		else if (wrc != -LMT_EAGAIN)
			assert_int_equal(wrc, -LMT_ECONN);
		rc = harvest(p->src, &t, wrc ? SECOND / 100 : 0);
	}
	while (rc >= 0) {
		assert_true(now_ns() < deadline);
		rc = harvest(p->src, &t, SECOND / 10);
	}
	assert_int_equal(rc, -LMT_ECONN);
	assert_int_equal(p->src_host.error_code, LMT_ECONN);
	assert_non_null(strstr(p->src_host.error, "tcp channel"));
	/* Every posted write was accounted for exactly once. */
	assert_int_equal(t.done, posted);
	for (uint64_t i = 0; i < posted; i++)
		assert_int_equal(t.seen[i], 1);
	assert_int_equal(plugin->ops.progress(p->src, NULL, 0, 0), -LMT_ECONN);

	munmap(src, r.len);
	munmap(r.block, r.len + 2 * GUARD);
	free(t.seen);
	plugin->ops.instance_close(p->src);
	free(p);
}

static void close_in_order(int source_first)
{
	struct pair *p = pair_open(2);
	struct region r;
	region_open(&r, p->dst, p->src, 1 << 20);
	uint8_t *src = pattern(r.len, 11);
	struct tally t;
	tally_init(&t, 2);
	post(p, 0, src, 1 << 19, r.rkey, 0, 0, &t);
	post(p, 1, src + (1 << 19), 1 << 19, r.rkey, 1 << 19, 1, &t);
	assert_int_equal(plugin->ops.flush(p->src, 5 * SECOND), 0);
	harvest_all(p->src, &t, 2);
	lmt_instance *other = source_first ? p->dst : p->src;
	lmt_endpoint **eps = source_first ? p->src_ep : p->dst_ep;
	for (uint32_t c = 0; c < 2; c++)
		plugin->ops.ep_close(eps[c]);
	usleep(200000); /* let the other side see the close */
	struct lmt_completion c[4];
	assert_int_equal(plugin->ops.progress(other, c, 4, SECOND / 10), 0);
	assert_int_equal(error_count(&p->src_host), 0);
	assert_int_equal(error_count(&p->dst_host), 0);

	munmap(src, r.len);
	region_close(&r, p->dst, p->src);
	free(t.seen);
	pair_close(p);
}

static void test_orderly_close_by_source_is_no_error(void **state)
{
	(void)state;
	close_in_order(1);
}

static void test_orderly_close_by_destination_is_no_error(void **state)
{
	(void)state;
	close_in_order(0);
}

static void test_accept_honours_cancel(void **state)
{
	(void)state;
	struct fake_host dh;
	fake_host_init(&dh);
	lmt_instance *dst = open_instance(&dh, LMT_ROLE_DESTINATION, 1, 30 * SECOND);
	lmt_endpoint *ep;
	struct lmt_blob addr, src_addr;
	assert_int_equal(plugin->ops.ep_open(dst, 0, &ep, &addr), 0);
	tcp_src_addr_encode(0, &src_addr);
	atomic_store(&dh.cancelled, 1);
	uint64_t start = now_ns();
	assert_int_equal(plugin->ops.ep_connect(ep, &src_addr), -LMT_ECANCELED);
	assert_true(now_ns() - start < SECOND);
	struct lmt_completion c[1];
	assert_int_equal(plugin->ops.progress(dst, c, 1, 30 * SECOND), -LMT_ECANCELED);
	plugin->ops.instance_close(dst);
}

static void test_accept_times_out_without_source(void **state)
{
	(void)state;
	struct fake_host dh;
	fake_host_init(&dh);
	lmt_instance *dst = open_instance(&dh, LMT_ROLE_DESTINATION, 1, SECOND / 5);
	lmt_endpoint *ep;
	struct lmt_blob addr, src_addr;
	assert_int_equal(plugin->ops.ep_open(dst, 0, &ep, &addr), 0);
	tcp_src_addr_encode(0, &src_addr);
	assert_int_equal(plugin->ops.ep_connect(ep, &src_addr), -LMT_ETIMEDOUT);
	assert_int_equal(dh.error_code, LMT_ETIMEDOUT);
	plugin->ops.instance_close(dst);
}

static void test_destination_progress_waits_and_reports_nothing(void **state)
{
	(void)state;
	struct pair *p = pair_open(1);
	struct lmt_completion c[4];
	uint64_t start = now_ns();
	assert_int_equal(plugin->ops.progress(p->dst, c, 4, SECOND / 5), 0);
	assert_true(now_ns() - start >= SECOND / 5);
	assert_int_equal(plugin->ops.flush(p->dst, SECOND), 0);
	pair_close(p);
}

/* One write over a pair whose destination listens where `local_host` and
 * tcp.address say, and advertises an address of `family`. */
static void one_write_over(const char *local_host, const char *address, int family)
{
	struct fake_host dh, sh;
	fake_host_init(&dh);
	fake_host_init(&sh);
	dh.address = address;
	struct pair p = {.channels = 1};
	assert_int_equal(
	        open_instance_at(&dh, LMT_ROLE_DESTINATION, 1, 5 * SECOND, local_host, &p.dst), 0);
	p.src = open_instance(&sh, LMT_ROLE_SOURCE, 1, 5 * SECOND);
	assert_int_equal(plugin->ops.ep_open(p.src, 0, &p.src_ep[0], &p.src_addr[0]), 0);
	assert_int_equal(plugin->ops.ep_open(p.dst, 0, &p.dst_ep[0], &p.dst_addr[0]), 0);
	struct tcp_dst_addr a;
	assert_null(tcp_dst_addr_decode(&p.dst_addr[0], &a));
	assert_int_equal(a.family, family);
	pthread_t acceptor;
	assert_int_equal(pthread_create(&acceptor, NULL, accept_all, &p), 0);
	assert_int_equal(plugin->ops.ep_connect(p.src_ep[0], &p.dst_addr[0]), 0);
	pthread_join(acceptor, NULL);
	assert_int_equal(p.accept_rc, 0);
	struct region r;
	region_open(&r, p.dst, p.src, 4096);
	uint8_t *data = pattern(4096, 13);
	assert_int_equal(plugin->ops.write(p.src_ep[0], data, 4096, NULL, r.rkey, 0, 0), 0);
	assert_int_equal(plugin->ops.flush(p.src, 5 * SECOND), 0);
	assert_memory_equal(r.mem, data, 4096);
	munmap(data, 4096);
	region_close(&r, p.dst, p.src);
	plugin->ops.instance_close(p.src);
	plugin->ops.instance_close(p.dst);
}

static void test_address_option_overrides_local_host(void **state)
{
	(void)state;
	one_write_over("", "127.0.0.1", TCP_FAMILY_IPV4);
}

static void test_destination_without_any_address_is_refused(void **state)
{
	(void)state;
	struct fake_host dh;
	fake_host_init(&dh);
	lmt_instance *inst;
	assert_int_equal(open_instance_at(&dh, LMT_ROLE_DESTINATION, 1, SECOND, "", &inst),
	                 -LMT_EINVAL);
	assert_null(inst);
	assert_non_null(strstr(dh.error, "tcp.address"));
}

static void test_ipv6_loopback_works(void **state)
{
	(void)state;
	int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in6 in6 = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
	int usable = fd >= 0 && bind(fd, (struct sockaddr *)&in6, sizeof(in6)) == 0;
	if (fd >= 0)
		close(fd);
	if (!usable)
		skip();
	one_write_over("::1", "", TCP_FAMILY_IPV6);
}

static void test_deregister_cuts_off_a_stalled_write(void **state)
{
	(void)state;
	struct fake_host dh;
	fake_host_init(&dh);
	lmt_instance *dst = open_instance(&dh, LMT_ROLE_DESTINATION, 1, SECOND / 2);
	lmt_endpoint *ep;
	struct lmt_blob addr, src_addr;
	assert_int_equal(plugin->ops.ep_open(dst, 0, &ep, &addr), 0);
	struct region r;
	region_open(&r, dst, NULL, 4096);
	struct tcp_key key;
	assert_null(tcp_key_decode(&r.key, &key));
	int fd = raw_connect(&addr, 0, 0);
	tcp_src_addr_encode(0, &src_addr);
	assert_int_equal(plugin->ops.ep_connect(ep, &src_addr), 0);

	/* Announce 4096 bytes, send 100, then stall. */
	uint8_t msg[TCP_HEADER_LEN + 100];
	memset(msg, 0x5a, sizeof(msg));
	struct tcp_header h = {.magic = TCP_MAGIC_WRITE, .region = key.region, .len = 4096};
	tcp_header_encode(&h, msg);
	assert_int_equal(send(fd, msg, sizeof(msg), MSG_NOSIGNAL), sizeof(msg));
	usleep(200000); /* the receiver is now placing into the region */

	uint64_t start = now_ns();
	plugin->ops.mr_deregister(dst, r.mr);
	uint64_t took = now_ns() - start;
	assert_true(took >= SECOND / 2 && took < 3 * SECOND);
	assert_int_equal(dh.error_code, LMT_ETIMEDOUT);
	/* Nothing lands after deregistration returned. */
	memset(r.mem, 0, r.len);
	send(fd, msg, sizeof(msg), MSG_NOSIGNAL);
	usleep(100000);
	for (size_t i = 0; i < r.len; i++)
		assert_int_equal(r.mem[i], 0);
	struct lmt_completion c[1];
	assert_int_equal(plugin->ops.progress(dst, c, 1, SECOND), -LMT_ECONN);

	close(fd);
	region_close(&r, NULL, NULL);
	plugin->ops.instance_close(dst);
}

static int count_entries(const char *dir)
{
	DIR *d = opendir(dir);
	assert_non_null(d);
	int n = 0;
	while (readdir(d))
		n++;
	closedir(d);
	return n;
}

static void test_open_close_cycles_leave_no_fds_or_threads(void **state)
{
	(void)state;
	static const uint8_t payload[1 << 20];
	int fds = count_entries("/proc/self/fd");
	int threads = count_entries("/proc/self/task");
	for (int i = 0; i < 10; i++) {
		/* Connected, with a write in flight at close. */
		struct pair *p = pair_open(2);
		struct region r;
		region_open(&r, p->dst, p->src, 1 << 20);
		assert_int_equal(plugin->ops.write(p->src_ep[1], payload, sizeof(payload), NULL,
		                                   r.rkey, 0, 1),
		                 0);
		plugin->ops.instance_close(p->src);
		plugin->ops.instance_close(p->dst);
		munmap(r.block, r.len + 2 * GUARD);
		p->src = p->dst = NULL;
		free(p);

		/* Half open: endpoints opened, never connected. */
		struct fake_host dh, sh;
		fake_host_init(&dh);
		fake_host_init(&sh);
		lmt_instance *dst = open_instance(&dh, LMT_ROLE_DESTINATION, 3, SECOND);
		lmt_instance *src = open_instance(&sh, LMT_ROLE_SOURCE, 3, SECOND);
		lmt_endpoint *ep;
		struct lmt_blob addr;
		for (uint32_t c = 0; c < 2; c++) {
			assert_int_equal(plugin->ops.ep_open(dst, c, &ep, &addr), 0);
			assert_int_equal(plugin->ops.ep_open(src, c, &ep, &addr), 0);
		}
		plugin->ops.ep_close(ep);
		plugin->ops.instance_close(src);
		plugin->ops.instance_close(dst);
	}
	assert_int_equal(count_entries("/proc/self/fd"), fds);
	/* Joined threads leave /proc/self/task at once. */
	assert_int_equal(count_entries("/proc/self/task"), threads);
}

/* ---- Main ---------------------------------------------------------------- */

static int load_plugin(void **state)
{
	(void)state;
	module = dlopen(module_path, RTLD_NOW | RTLD_LOCAL);
	if (!module) {
		fprintf(stderr, "cannot load %s: %s\n", module_path, dlerror());
		return -1;
	}
	lmt_plugin_entry_fn entry = (lmt_plugin_entry_fn)dlsym(module, LMT_PLUGIN_ENTRY_SYMBOL);
	if (!entry || entry(LMT_PLUGIN_ABI_VERSION, &plugin) != 0 || !plugin) {
		fprintf(stderr, "%s: no usable %s\n", module_path, LMT_PLUGIN_ENTRY_SYMBOL);
		return -1;
	}
	return 0;
}

static int unload_plugin(void **state)
{
	(void)state;
	if (module)
		dlclose(module);
	return 0;
}

int main(int argc, char **argv)
{
	module_path = getenv("LMT_TEST_TCP_PLUGIN");
	if (argc > 1)
		module_path = argv[1];
	if (!module_path) {
		fprintf(stderr, "usage: %s tcp.so (or set LMT_TEST_TCP_PLUGIN)\n", argv[0]);
		return 2;
	}
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_entry_gives_descriptor_with_multi_channel_only),
	        cmocka_unit_test(test_entry_refuses_an_older_core),
	        cmocka_unit_test(test_one_channel_places_writes_bit_for_bit),
	        cmocka_unit_test(test_two_channels_place_writes_bit_for_bit),
	        cmocka_unit_test(test_every_cookie_completes_exactly_once),
	        cmocka_unit_test(test_full_queue_answers_eagain),
	        cmocka_unit_test(test_gigabyte_write_lands_whole),
	        cmocka_unit_test(test_write_past_key_length_is_rejected),
	        cmocka_unit_test(test_malformed_key_blob_is_rejected),
	        cmocka_unit_test(test_malformed_address_blob_is_rejected),
	        cmocka_unit_test(test_unknown_token_connection_is_ignored),
	        cmocka_unit_test(test_forged_header_past_region_end_is_rejected),
	        cmocka_unit_test(test_forged_header_with_wrapping_offset_is_rejected),
	        cmocka_unit_test(test_forged_header_for_unknown_region_is_rejected),
	        cmocka_unit_test(test_forged_header_with_bad_magic_is_rejected),
	        cmocka_unit_test(test_destination_close_mid_stream_gives_source_econn),
	        cmocka_unit_test(test_orderly_close_by_source_is_no_error),
	        cmocka_unit_test(test_orderly_close_by_destination_is_no_error),
	        cmocka_unit_test(test_accept_honours_cancel),
	        cmocka_unit_test(test_accept_times_out_without_source),
	        cmocka_unit_test(test_destination_progress_waits_and_reports_nothing),
	        cmocka_unit_test(test_address_option_overrides_local_host),
	        cmocka_unit_test(test_destination_without_any_address_is_refused),
	        cmocka_unit_test(test_ipv6_loopback_works),
	        cmocka_unit_test(test_deregister_cuts_off_a_stalled_write),
	        cmocka_unit_test(test_open_close_cycles_leave_no_fds_or_threads),
	};
	return cmocka_run_group_tests(tests, load_plugin, unload_plugin);
}
