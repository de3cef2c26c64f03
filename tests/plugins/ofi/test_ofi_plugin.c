/* Unit tests of the libfabric plugin through the plugin ABI and a fake host:
 * a destination and a source instance in one process, over the tcp and shm
 * providers and over lmtfake, a test provider that demands each FI_MR_* mode
 * and can withhold delivery completion. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dirent.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <lmt/plugin.h>
#include <rdma/fabric.h>

#include "wire.h"

#define MAX_CHANNELS 4
#define GUARD 4096
#define SECOND 1000000000ull

#define MR_ALL                                                                                     \
	(FI_MR_LOCAL | FI_MR_RAW | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY |            \
	 FI_MR_ENDPOINT)

static const char *module_path;
static void *module;
static const struct lmt_plugin *plugin;

/* ---- Variants: a provider and what it is asked for -------------------------- */

struct variant {
	const char *provider;
	const char *completion; /* NULL = the default */
	const char *mr_mode;    /* ofi.mr-mode */
	const char *coalesce;   /* ofi.coalesce; NULL = the default */
	unsigned fake_mr_mode;  /* lmtfake: the modes it requires */
	int fake_no_delivery;   /* lmtfake: no FI_DELIVERY_COMPLETE */
	int fake_no_wait;       /* lmtfake: no CQ wait objects */
	int fake_hold;          /* lmtfake: successful writes never complete */
};

static const struct variant tcp = {.provider = "tcp"};
static const struct variant tcp_fence = {.provider = "tcp", .completion = "fence"};
static const struct variant tcp_local = {.provider = "tcp", .mr_mode = "local"};
static const struct variant shm = {.provider = "shm"};
static const struct variant shm_offsets = {.provider = "shm", .mr_mode = "local+prov_key"};
static const struct variant fake = {.provider = "lmtfake"};
static const struct variant fake_local = {.provider = "lmtfake", .fake_mr_mode = FI_MR_LOCAL};
static const struct variant fake_virt = {.provider = "lmtfake", .fake_mr_mode = FI_MR_VIRT_ADDR};
static const struct variant fake_prov_key = {.provider = "lmtfake", .fake_mr_mode = FI_MR_PROV_KEY};
static const struct variant fake_endpoint = {.provider = "lmtfake",
                                             .fake_mr_mode = FI_MR_ENDPOINT | FI_MR_LOCAL};
static const struct variant fake_raw = {.provider = "lmtfake", .fake_mr_mode = FI_MR_RAW};
static const struct variant fake_raw_virt = {.provider = "lmtfake",
                                             .fake_mr_mode = FI_MR_RAW | FI_MR_VIRT_ADDR};
static const struct variant fake_all = {.provider = "lmtfake", .fake_mr_mode = MR_ALL};
static const struct variant fake_fence = {.provider = "lmtfake", .fake_no_delivery = 1};
static const struct variant fake_fence_all = {
        .provider = "lmtfake", .fake_mr_mode = MR_ALL, .fake_no_delivery = 1};
static const struct variant fake_polled = {
        .provider = "lmtfake", .fake_mr_mode = MR_ALL, .fake_no_wait = 1};
static const struct variant fake_held = {.provider = "lmtfake", .fake_hold = 1};
static const struct variant shm_apart = {.provider = "shm", .coalesce = "off"};
static const struct variant tcp_coalesced = {.provider = "tcp", .coalesce = "on"};
static const struct variant fake_held_coalesced = {
        .provider = "lmtfake", .fake_hold = 1, .coalesce = "on"};
static const struct variant fake_fence_coalesced = {
        .provider = "lmtfake", .fake_no_delivery = 1, .coalesce = "on"};

static void use_variant(const struct variant *v)
{
	char mode[32];
	snprintf(mode, sizeof(mode), "0x%x", v->fake_mr_mode);
	setenv("LMT_FAKE_MR_MODE", mode, 1);
	setenv("LMT_FAKE_NO_DELIVERY", v->fake_no_delivery ? "1" : "0", 1);
	setenv("LMT_FAKE_NO_WAIT", v->fake_no_wait ? "1" : "0", 1);
	setenv("LMT_FAKE_HOLD", v->fake_hold ? "1" : "0", 1);
}

/* ---- Fake host ----------------------------------------------------------- */

struct fake_host {
	pthread_mutex_t lock;
	char log[16384];
	size_t log_len;
	int errors;
	int error_code;
	char error[1024];
	atomic_int cancelled;
	const char *provider, *domain, *completion, *mr_mode, *coalesce;
};

static void fake_log(void *ctx, enum lmt_log_level level, const char *fmt, ...) LMT_PRINTF(3, 4);
static int fake_error(void *ctx, int code, const char *fmt, ...) LMT_PRINTF(3, 4);

static void fake_log(void *ctx, enum lmt_log_level level, const char *fmt, ...)
{
	struct fake_host *h = ctx;
	va_list ap;
	pthread_mutex_lock(&h->lock);
	size_t room = sizeof(h->log) - h->log_len;
	if (room > 2) {
		va_start(ap, fmt);
		int n = vsnprintf(h->log + h->log_len, room - 1, fmt, ap);
		va_end(ap);
		if (n > 0)
			h->log_len += (size_t)n < room - 2 ? (size_t)n : room - 2;
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
	static const char *const completions[] = {"auto", "delivery", "fence"};
	static const char *const coalesces[] = {"auto", "on", "off"};
	struct fake_host *h = ctx;
	memset(out, 0, sizeof(*out));
	out->type = LMT_OPT_STRING;
	if (strcmp(name, "ofi.provider") == 0) {
		out->text = h->provider;
	} else if (strcmp(name, "ofi.domain") == 0) {
		out->text = h->domain;
	} else if (strcmp(name, "ofi.mr-mode") == 0) {
		out->text = h->mr_mode;
	} else if (strcmp(name, "ofi.completion") == 0) {
		out->type = LMT_OPT_ENUM;
		out->text = h->completion;
		for (int i = 0; i < 3; i++)
			if (strcmp(completions[i], h->completion) == 0)
				out->integer = i;
	} else if (strcmp(name, "ofi.coalesce") == 0) {
		out->type = LMT_OPT_ENUM;
		out->text = h->coalesce;
		for (int i = 0; i < 3; i++)
			if (strcmp(coalesces[i], h->coalesce) == 0)
				out->integer = i;
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

static void fake_host_init(struct fake_host *h, const struct variant *v)
{
	memset(h, 0, sizeof(*h));
	pthread_mutex_init(&h->lock, NULL);
	h->provider = v->provider;
	h->domain = "";
	h->completion = v->completion ? v->completion : "auto";
	h->mr_mode = v->mr_mode ? v->mr_mode : "";
	h->coalesce = v->coalesce ? v->coalesce : "auto";
	use_variant(v);
}

static int error_count(struct fake_host *h)
{
	pthread_mutex_lock(&h->lock);
	int n = h->errors;
	pthread_mutex_unlock(&h->lock);
	return n;
}

/* ---- Instances, endpoints, regions --------------------------------------- */

static int try_open(struct fake_host *h, enum lmt_role role, uint32_t channels, lmt_instance **inst)
{
	struct lmt_instance_params params = {.struct_size = sizeof(params),
	                                     .role = role,
	                                     .channels = channels,
	                                     .timeout_ns = 5 * SECOND};
	strcpy(params.local_host, "127.0.0.1");
	strcpy(params.peer_host, "127.0.0.1");
	*inst = NULL;
	return plugin->ops.instance_open(&host_services, h, &params, inst);
}

static lmt_instance *open_instance(struct fake_host *h, enum lmt_role role, uint32_t channels)
{
	lmt_instance *inst;
	int rc = try_open(h, role, channels, &inst);
	if (rc)
		fail_msg("instance_open (%s): %d: %s", h->provider, rc, h->error);
	assert_non_null(inst);
	return inst;
}

struct pair {
	struct fake_host dst_host, src_host;
	lmt_instance *dst, *src;
	uint32_t channels;
	lmt_endpoint *dst_ep[MAX_CHANNELS], *src_ep[MAX_CHANNELS];
	struct lmt_blob dst_addr[MAX_CHANNELS], src_addr[MAX_CHANNELS];
};

/* Both instances with every channel connected. */
static struct pair *pair_open(const struct variant *v, uint32_t channels)
{
	struct pair *p = calloc(1, sizeof(*p));
	assert_non_null(p);
	p->channels = channels;
	fake_host_init(&p->dst_host, v);
	fake_host_init(&p->src_host, v);
	p->dst = open_instance(&p->dst_host, LMT_ROLE_DESTINATION, channels);
	p->src = open_instance(&p->src_host, LMT_ROLE_SOURCE, channels);
	for (uint32_t c = 0; c < channels; c++)
		assert_int_equal(plugin->ops.ep_open(p->src, c, &p->src_ep[c], &p->src_addr[c]), 0);
	for (uint32_t c = 0; c < channels; c++)
		assert_int_equal(plugin->ops.ep_open(p->dst, c, &p->dst_ep[c], &p->dst_addr[c]), 0);
	/* The source first: the destination's connect waits for its greeting. */
	for (uint32_t c = 0; c < channels; c++)
		assert_int_equal(plugin->ops.ep_connect(p->src_ep[c], &p->dst_addr[c]), 0);
	for (uint32_t c = 0; c < channels; c++)
		assert_int_equal(plugin->ops.ep_connect(p->dst_ep[c], &p->src_addr[c]), 0);
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

/* A destination region with guard bytes on both sides, its key imported on
 * the source, and the matching source memory registered there. */
struct region {
	uint8_t *block;
	uint8_t *mem;
	size_t len;
	lmt_mr *mr;
	struct lmt_blob key;
	lmt_rkey *rkey;
	uint8_t *src;
	lmt_mr *src_mr;
};

static uint8_t *map(size_t len)
{
	uint8_t *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	assert_true(p != MAP_FAILED);
	return p;
}

static void pattern_fill(uint8_t *buf, size_t len, uint64_t seed)
{
	uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
	for (size_t i = 0; i < len; i += 8) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		memcpy(buf + i, &x, len - i < 8 ? len - i : 8);
	}
}

static void region_open(struct region *r, struct pair *p, size_t len, uint64_t seed)
{
	memset(r, 0, sizeof(*r));
	r->len = len;
	r->block = map(len + 2 * GUARD);
	memset(r->block, 0xa5, GUARD);
	memset(r->block + GUARD + len, 0xa5, GUARD);
	r->mem = r->block + GUARD;
	assert_int_equal(
	        plugin->ops.mr_register(p->dst, r->mem, len, LMT_MR_REMOTE_WRITE, &r->mr, &r->key),
	        0);
	assert_int_equal(plugin->ops.rkey_import(p->src, &r->key, &r->rkey), 0);
	r->src = map(len);
	pattern_fill(r->src, len, seed);
	struct lmt_blob unused;
	assert_int_equal(plugin->ops.mr_register(p->src, r->src, len, LMT_MR_LOCAL_READ, &r->src_mr,
	                                         &unused),
	                 0);
	assert_int_equal(unused.len, 0);
}

static void region_close(struct region *r, struct pair *p)
{
	if (p->src) {
		plugin->ops.rkey_release(p->src, r->rkey);
		plugin->ops.mr_deregister(p->src, r->src_mr);
	}
	if (p->dst)
		plugin->ops.mr_deregister(p->dst, r->mr);
	munmap(r->block, r->len + 2 * GUARD);
	munmap(r->src, r->len);
}

static int guards_intact(const struct region *r)
{
	for (size_t i = 0; i < GUARD; i++)
		if (r->block[i] != 0xa5 || r->block[GUARD + r->len + i] != 0xa5)
			return 0;
	return 1;
}

/* ---- Writes and completions ---------------------------------------------- */

struct tally {
	uint8_t *seen;
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

static void post(struct pair *p, uint32_t channel, struct region *r, size_t len, uint64_t offset,
                 uint64_t cookie, struct tally *t)
{
	uint64_t deadline = now_ns() + 10 * SECOND;
	for (;;) {
		int rc = plugin->ops.write(p->src_ep[channel], r->src + offset, len, r->src_mr,
		                           r->rkey, offset, cookie);
		if (rc != -LMT_EAGAIN) {
			if (rc)
				fail_msg("write: %d: %s", rc, p->src_host.error);
			return;
		}
		assert_true(harvest(p->src, t, SECOND / 10) >= 0);
		assert_true(now_ns() < deadline);
	}
}

static void harvest_all(lmt_instance *src, struct tally *t, uint64_t expected)
{
	uint64_t deadline = now_ns() + 20 * SECOND;
	while (t->done < expected) {
		assert_true(harvest(src, t, SECOND / 10) >= 0);
		assert_true(now_ns() < deadline);
	}
}

static const size_t piece_sizes[] = {
        1,       7,     0,          512,     4096,          4099,
        65536,   65537, 262144 + 3, 1 << 20, (1 << 20) + 1, 3 << 20,
        8 << 20, 100,   4095,       2 << 20,
};
#define PIECES (sizeof(piece_sizes) / sizeof(piece_sizes[0]))

/* Write a region piece by piece over `channels` channels, flush, and
 * compare before harvesting anything: flush means visible. */
static void write_pieces_and_verify(const struct variant *v, uint32_t channels)
{
	struct pair *p = pair_open(v, channels);
	size_t total = 13;
	for (size_t i = 0; i < PIECES; i++)
		total += piece_sizes[i];
	struct region r;
	region_open(&r, p, 2 * total, channels);
	struct tally t;
	tally_init(&t, 2 * PIECES);
	uint64_t offset = 13, cookie = 0;
	for (unsigned round = 0; round < 2; round++)
		for (size_t i = 0; i < PIECES; i++, cookie++) {
			size_t len = piece_sizes[(i + round) % PIECES];
			post(p, (uint32_t)(cookie % channels), &r, len, offset, cookie, &t);
			offset += len;
		}
	if (plugin->ops.flush(p->src, 20 * SECOND))
		fail_msg("flush: %s", p->src_host.error);
	assert_memory_equal(r.mem + 13, r.src + 13, offset - 13);
	for (size_t i = 0; i < 13; i++)
		assert_int_equal(r.mem[i], 0);
	assert_true(guards_intact(&r));
	harvest_all(p->src, &t, cookie);
	assert_int_equal(t.failed, 0);
	for (uint64_t i = 0; i < cookie; i++)
		assert_int_equal(t.seen[i], 1);
	assert_int_equal(error_count(&p->src_host), 0);
	assert_int_equal(error_count(&p->dst_host), 0);
	region_close(&r, p);
	free(t.seen);
	pair_close(p);
}

/* ---- Tests: descriptor and options ----------------------------------------- */

static void test_entry_gives_descriptor(void **state)
{
	(void)state;
	assert_string_equal(plugin->name, "ofi");
	assert_int_equal(plugin->abi_version, LMT_PLUGIN_ABI_VERSION);
	assert_int_equal(plugin->caps, LMT_CAP_LOCAL_MR | LMT_CAP_PIN | LMT_CAP_MULTI_CHANNEL |
	                                       LMT_CAP_TARGET_PROGRESS | LMT_CAP_MERGES_RUNS);
	assert_int_equal(plugin->option_count, 5);
	assert_string_equal(plugin->options[0].name, "provider");
	assert_string_equal(plugin->options[1].name, "domain");
	assert_string_equal(plugin->options[2].name, "completion");
	assert_string_equal(plugin->options[3].name, "coalesce");
	assert_string_equal(plugin->options[4].name, "mr-mode");
}

static void test_entry_refuses_an_older_core(void **state)
{
	(void)state;
	lmt_plugin_entry_fn entry = (lmt_plugin_entry_fn)dlsym(module, LMT_PLUGIN_ENTRY_SYMBOL);
	const struct lmt_plugin *d = NULL;
	assert_int_equal(entry(0, &d), -LMT_EABI);
	assert_non_null(d);
}

static void test_unknown_provider_error_lists_those_available(void **state)
{
	(void)state;
	struct fake_host h;
	fake_host_init(&h, &(struct variant){.provider = "nosuch"});
	lmt_instance *inst;
	assert_int_equal(try_open(&h, LMT_ROLE_SOURCE, 1, &inst), -LMT_ENOTFOUND);
	assert_null(inst);
	assert_non_null(strstr(h.error, "ofi.provider=nosuch: not available; providers: "));
	assert_non_null(strstr(h.error, "tcp;ofi_rxm"));
	assert_non_null(strstr(h.error, "shm"));
	assert_non_null(strstr(h.error, "lmtfake"));
}

/* FI_OFI_RXM_MSG_RX_SIZE as the test started: NULL when unset. */
static char *user_rxm_rx_size;

/* The plugin lowers ofi_rxm's preposted receives unless the user chose. */
static void test_rxm_receive_default_keeps_the_users_value(void **state)
{
	(void)state;
	struct fake_host h;
	fake_host_init(&h, &(struct variant){.provider = "nosuch"});
	lmt_instance *inst;
	assert_int_equal(try_open(&h, LMT_ROLE_SOURCE, 1, &inst), -LMT_ENOTFOUND);
	assert_null(inst);
	const char *now = getenv("FI_OFI_RXM_MSG_RX_SIZE");
	assert_non_null(now);
	assert_string_equal(now, user_rxm_rx_size ? user_rxm_rx_size : "64");
}

static void test_unknown_domain_error_lists_domains(void **state)
{
	(void)state;
	struct fake_host h;
	fake_host_init(&h, &tcp);
	h.domain = "nosuch0";
	lmt_instance *inst;
	assert_int_equal(try_open(&h, LMT_ROLE_DESTINATION, 1, &inst), -LMT_ENOTFOUND);
	assert_non_null(strstr(h.error, "ofi.domain=nosuch0: not available with provider tcp; "
	                                "domains: "));
	assert_non_null(strstr(h.error, "lo"));
}

static void test_domain_option_picks_the_domain(void **state)
{
	(void)state;
	struct fake_host h;
	fake_host_init(&h, &tcp);
	h.domain = "lo";
	lmt_instance *inst = open_instance(&h, LMT_ROLE_SOURCE, 1);
	plugin->ops.instance_close(inst);
}

static void test_bad_mr_mode_option_is_rejected(void **state)
{
	(void)state;
	struct fake_host h;
	fake_host_init(&h, &(struct variant){.provider = "tcp", .mr_mode = "local+bogus"});
	lmt_instance *inst;
	assert_int_equal(try_open(&h, LMT_ROLE_SOURCE, 1, &inst), -LMT_EINVAL);
	assert_non_null(strstr(h.error, "ofi.mr-mode: unknown mode 'bogus'"));
}

static void test_delivery_completion_demanded_but_missing_is_refused(void **state)
{
	(void)state;
	struct fake_host h;
	fake_host_init(&h, &(struct variant){.provider = "lmtfake",
	                                     .completion = "delivery",
	                                     .fake_no_delivery = 1});
	lmt_instance *inst;
	assert_int_equal(try_open(&h, LMT_ROLE_SOURCE, 1, &inst), -LMT_ENOTSUP);
	assert_non_null(strstr(h.error, "no FI_DELIVERY_COMPLETE"));
}

static void test_required_mode_not_offered_is_refused(void **state)
{
	(void)state;
	struct fake_host h;
	/* The provider needs FI_MR_RAW; the option offers everything else. */
	fake_host_init(&h, &(struct variant){.provider = "lmtfake",
	                                     .fake_mr_mode = FI_MR_RAW,
	                                     .mr_mode = "local+virt_addr+prov_key+endpoint"});
	lmt_instance *inst;
	assert_int_equal(try_open(&h, LMT_ROLE_SOURCE, 1, &inst), -LMT_ENOTSUP);
	assert_non_null(strstr(h.error, "lmtfake"));
}

/* ---- Tests: data ------------------------------------------------------------ */

static void test_one_channel_lands_bit_for_bit(void **state)
{
	write_pieces_and_verify(*state, 1);
}

static void test_two_channels_land_bit_for_bit(void **state)
{
	write_pieces_and_verify(*state, 2);
}

/* `writes` writes of `size` bytes, write i at offset i * size on channel
 * i % channels; each must complete once and land. */
static struct pair *write_all_once(const struct variant *v, uint32_t channels, uint64_t writes,
                                   size_t size)
{
	struct pair *p = pair_open(v, channels);
	struct region r;
	region_open(&r, p, (size_t)writes * size, 7);
	struct tally t;
	tally_init(&t, writes);
	for (uint64_t i = 0; i < writes; i++)
		post(p, (uint32_t)(i % channels), &r, size, i * size, i, &t);
	harvest_all(p->src, &t, writes);
	assert_int_equal(harvest(p->src, &t, SECOND / 5), 0);
	for (uint64_t i = 0; i < writes; i++)
		assert_int_equal(t.seen[i], 1);
	assert_int_equal(t.failed, 0);
	assert_memory_equal(r.mem, r.src, r.len);
	region_close(&r, p);
	free(t.seen);
	return p;
}

static void test_every_cookie_completes_exactly_once(void **state)
{
	pair_close(write_all_once(*state, 2, 5000, 512));
}

/* Writes that follow each other on one channel are merged while the
 * channel has 1 MiB in flight (ofi.coalesce): each is still reported once,
 * and lands. */
static void test_contiguous_writes_merge_and_complete_once(void **state)
{
	enum { WRITES = 1024 };
	struct pair *p = write_all_once(*state, 1, WRITES, 64 << 10);
	/* The channel says, as it closes, how many transfers carried them. */
	plugin->ops.ep_close(p->src_ep[0]);
	unsigned long long writes = 0, transfers = 0;
	pthread_mutex_lock(&p->src_host.lock);
	const char *said = strstr(p->src_host.log, "ofi channel 0: ");
	while (said && sscanf(said, "ofi channel 0: %llu writes coalesced into %llu transfers",
	                      &writes, &transfers) != 2)
		said = strstr(said + 1, "ofi channel 0: ");
	pthread_mutex_unlock(&p->src_host.lock);
	assert_int_equal(writes, WRITES);
	assert_true(transfers >= 1 && transfers < WRITES / 4);
	pair_close(p);
}

static void test_full_queue_answers_eagain(void **state)
{
	struct pair *p = pair_open(*state, 1);
	struct region r;
	region_open(&r, p, 4096, 1);
	struct tally t;
	tally_init(&t, 100000);
	/* The first writes may wait for the provider's connection. */
	uint64_t posted = 0;
	for (; posted < 16; posted++)
		post(p, 0, &r, 8, 0, posted, &t);
	int rc;
	while ((rc = plugin->ops.write(p->src_ep[0], r.src, 8, r.src_mr, r.rkey, 0, posted)) == 0)
		assert_true(++posted < 100000);
	assert_int_equal(rc, -LMT_EAGAIN);
	assert_true(harvest(p->src, &t, SECOND) > 0);
	assert_int_equal(plugin->ops.write(p->src_ep[0], r.src, 8, r.src_mr, r.rkey, 0, posted), 0);
	assert_int_equal(plugin->ops.flush(p->src, 5 * SECOND), 0);
	harvest_all(p->src, &t, posted + 1);
	assert_int_equal(t.failed, 0);
	assert_int_equal(error_count(&p->src_host), 0);
	region_close(&r, p);
	free(t.seen);
	pair_close(p);
}

static void test_zero_length_write_completes(void **state)
{
	struct pair *p = pair_open(*state, 1);
	struct region r;
	region_open(&r, p, 4096, 2);
	struct tally t;
	tally_init(&t, 1);
	assert_int_equal(plugin->ops.write(p->src_ep[0], r.src, 0, r.src_mr, r.rkey, 4096, 0), 0);
	assert_int_equal(plugin->ops.flush(p->src, SECOND), 0);
	harvest_all(p->src, &t, 1);
	assert_int_equal(t.failed, 0);
	region_close(&r, p);
	free(t.seen);
	pair_close(p);
}

static void test_write_past_key_length_is_rejected(void **state)
{
	struct pair *p = pair_open(*state, 1);
	struct region r;
	region_open(&r, p, 8192, 3);
	const struct {
		size_t len;
		uint64_t offset;
	} bad[] = {{1, 8192}, {16, 8180}, {8193, 0}, {16, UINT64_MAX - 7}, {SIZE_MAX, 1}};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		assert_int_equal(plugin->ops.write(p->src_ep[0], r.src, bad[i].len, NULL, r.rkey,
		                                   bad[i].offset, i),
		                 -LMT_EINVAL);
	assert_int_equal(p->src_host.error_code, LMT_EINVAL);
	assert_non_null(strstr(p->src_host.error, "past the end"));
	struct tally t;
	tally_init(&t, 1);
	post(p, 0, &r, 1, 8191, 0, &t);
	assert_int_equal(plugin->ops.flush(p->src, 5 * SECOND), 0);
	assert_int_equal(r.mem[8191], r.src[8191]);
	assert_true(guards_intact(&r));
	harvest_all(p->src, &t, 1);
	free(t.seen);
	region_close(&r, p);
	pair_close(p);
}

static void test_unregistered_source_is_refused_when_the_provider_needs_it(void **state)
{
	struct pair *p = pair_open(*state, 1);
	struct region r;
	region_open(&r, p, 8192, 4);
	assert_int_equal(plugin->ops.write(p->src_ep[0], r.src, 64, NULL, r.rkey, 0, 1),
	                 -LMT_EINVAL);
	assert_non_null(strstr(p->src_host.error, "FI_MR_LOCAL"));
	/* Inside the registration, but running past its end. */
	assert_int_equal(plugin->ops.write(p->src_ep[0], r.src + 8000, 193, r.src_mr, r.rkey, 0, 2),
	                 -LMT_EINVAL);
	region_close(&r, p);
	pair_close(p);
}

static void test_registration_needs_open_channels_with_endpoint_mode(void **state)
{
	(void)state;
	struct fake_host h;
	fake_host_init(&h, &fake_endpoint);
	lmt_instance *inst = open_instance(&h, LMT_ROLE_DESTINATION, 2);
	uint8_t *mem = map(4096);
	lmt_mr *mr = NULL;
	struct lmt_blob key;
	assert_int_equal(plugin->ops.mr_register(inst, mem, 4096, LMT_MR_REMOTE_WRITE, &mr, &key),
	                 -LMT_ESTATE);
	assert_non_null(strstr(h.error, "FI_MR_ENDPOINT"));
	plugin->ops.instance_close(inst);
	munmap(mem, 4096);
}

/* ---- Tests: blobs from the network ------------------------------------------ */

static void expect_bad_key(struct pair *p, const struct lmt_blob *b, int code)
{
	lmt_rkey *rkey = NULL;
	assert_int_equal(plugin->ops.rkey_import(p->src, b, &rkey), -code);
	assert_null(rkey);
}

static void test_malformed_key_blob_is_rejected(void **state)
{
	struct pair *p = pair_open(*state, 1);
	struct region r;
	region_open(&r, p, 4096, 5);
	struct lmt_blob b;
#define BAD_KEY(edit)                                                                              \
	do {                                                                                       \
		b = r.key;                                                                         \
		edit;                                                                              \
		expect_bad_key(p, &b, LMT_EPROTO);                                                 \
	} while (0)
	BAD_KEY(b.len--);                     /* short */
	BAD_KEY(b.len = 8);                   /* shorter than a header */
	BAD_KEY(b.len = LMT_BLOB_MAX + 1);    /* longer than a blob */
	BAD_KEY(b.data[b.len++] = 0);         /* trailing byte */
	BAD_KEY(b.data[0] ^= 1);              /* magic */
	BAD_KEY(b.data[4] = 9);               /* version */
	BAD_KEY(b.data[6] |= 0x80);           /* unknown flag */
	BAD_KEY(b.data[6] ^= LFI_KEY_VIRT);   /* other addressing than ours */
	BAD_KEY(b.data[7] = 0);               /* no key */
	BAD_KEY(b.data[7] = 2);               /* two keys without FI_MR_ENDPOINT */
	BAD_KEY(memset(b.data + 16, 0, 8));   /* empty region */
	BAD_KEY(memset(b.data + 8, 0xff, 8)); /* base that wraps (or without VIRT) */
#undef BAD_KEY
	assert_int_equal(p->src_host.error_code, LMT_EPROTO);
	assert_non_null(strstr(p->src_host.error, "key blob"));
	lmt_rkey *good = NULL;
	assert_int_equal(plugin->ops.rkey_import(p->src, &r.key, &good), 0);
	/* Not released on purpose: instance_close frees it. */
	region_close(&r, p);
	pair_close(p);
}

static void test_forged_raw_key_is_rejected(void **state)
{
	(void)state;
	struct pair *p = pair_open(&fake_raw, 1);
	struct region r;
	region_open(&r, p, 4096, 6);
	struct lmt_blob b = r.key;
	struct lfi_key_blob k;
	assert_null(lfi_key_decode(&b, &k));
	assert_int_equal(k.flags, LFI_KEY_RAW);
	assert_int_equal(k.keys[0].raw_len, 24);
	b.data[LFI_KEY_HEADER_LEN + 10 + 3] ^= 0x10; /* a bit of the raw key */
	expect_bad_key(p, &b, LMT_EPROTO);
	assert_non_null(strstr(p->src_host.error, "fi_mr_map_raw"));
	b = r.key;
	b.data[LFI_KEY_HEADER_LEN] = 0; /* raw length 0 */
	b.data[LFI_KEY_HEADER_LEN + 1] = 0;
	expect_bad_key(p, &b, LMT_EPROTO);
	region_close(&r, p);
	pair_close(p);
}

static void test_malformed_address_blob_is_rejected(void **state)
{
	const struct variant *v = *state;
	struct fake_host dh, sh;
	fake_host_init(&dh, v);
	fake_host_init(&sh, v);
	lmt_instance *dst = open_instance(&dh, LMT_ROLE_DESTINATION, 2);
	lmt_instance *src = open_instance(&sh, LMT_ROLE_SOURCE, 2);
	lmt_endpoint *dep, *sep;
	struct lmt_blob daddr, saddr, b;
	assert_int_equal(plugin->ops.ep_open(src, 0, &sep, &saddr), 0);
	assert_int_equal(plugin->ops.ep_open(dst, 0, &dep, &daddr), 0);
	struct lfi_addr a;
	assert_null(lfi_addr_decode(&daddr, &a));
	size_t name_at = LFI_ADDR_HEADER_LEN + strlen(a.prov_name);
#define BAD_ADDR(edit)                                                                             \
	do {                                                                                       \
		b = daddr;                                                                         \
		edit;                                                                              \
		assert_int_equal(plugin->ops.ep_connect(sep, &b), -LMT_EPROTO);                    \
	} while (0)
	BAD_ADDR(b.len--);                           /* short */
	BAD_ADDR(b.len = 12);                        /* shorter than a header */
	BAD_ADDR(b.data[b.len++] = 1);               /* trailing byte */
	BAD_ADDR(b.data[1] ^= 0x40);                 /* magic */
	BAD_ADDR(b.data[4] = 2);                     /* version */
	BAD_ADDR(b.data[6] = LMT_ROLE_SOURCE);       /* a source's blob */
	BAD_ADDR(b.data[6] = 7);                     /* no such role */
	BAD_ADDR(b.data[7] |= 0x10);                 /* unknown flag */
	BAD_ADDR(b.data[8] = 1);                     /* channel 1, for endpoint 0 */
	BAD_ADDR(b.data[12] ^= 0x3);                 /* another address format */
	BAD_ADDR(b.data[16] = 0);                    /* no provider name */
	BAD_ADDR(b.data[16] = 200);                  /* provider name too long */
	BAD_ADDR(b.data[18] = 0; b.data[19] = 0);    /* no endpoint name */
	BAD_ADDR(b.data[18] = 0xff; b.data[19] = 1); /* endpoint name too long */
	BAD_ADDR(b.data[20] = 3);                    /* raw fence key without raw keys */
	BAD_ADDR(b.data[22] = 1);                    /* reserved */
	BAD_ADDR(b.data[LFI_ADDR_HEADER_LEN] = 1);   /* provider name not printable */
	if (a.addr_format == FI_SOCKADDR_IN)
		BAD_ADDR(b.data[name_at] ^= 0x7); /* not AF_INET */
	if (a.addr_format == FI_ADDR_STR)
		BAD_ADDR(b.data[name_at + a.name_len - 1] = 'x'); /* no terminator */
#undef BAD_ADDR
	assert_int_equal(sh.error_code, LMT_EPROTO);
	assert_non_null(strstr(sh.error, "address blob"));
	/* Blobs of the wrong side go both ways. */
	assert_int_equal(plugin->ops.ep_connect(dep, &daddr), -LMT_EPROTO);
	assert_non_null(strstr(dh.error, "bad address blob from the source"));
	plugin->ops.instance_close(dst);
	plugin->ops.instance_close(src);
}

static void test_another_provider_on_the_peer_is_a_mismatch(void **state)
{
	(void)state;
	struct fake_host dh, sh;
	fake_host_init(&dh, &tcp);
	fake_host_init(&sh, &fake);
	lmt_instance *dst = open_instance(&dh, LMT_ROLE_DESTINATION, 1);
	lmt_instance *src = open_instance(&sh, LMT_ROLE_SOURCE, 1);
	lmt_endpoint *dep, *sep;
	struct lmt_blob daddr, saddr;
	assert_int_equal(plugin->ops.ep_open(src, 0, &sep, &saddr), 0);
	assert_int_equal(plugin->ops.ep_open(dst, 0, &dep, &daddr), 0);
	struct lfi_addr a;
	assert_null(lfi_addr_decode(&daddr, &a));
	/* Same format as lmtfake's, so that only the provider differs. */
	struct lmt_blob b;
	a.addr_format = FI_FORMAT_UNSPEC;
	a.name_len = 16;
	assert_int_equal(lfi_addr_encode(&a, &b), 0);
	assert_int_equal(plugin->ops.ep_connect(sep, &b), -LMT_EMISMATCH);
	assert_non_null(strstr(sh.error, "the destination uses provider tcp;ofi_rxm, this side "
	                                 "lmtfake"));
	plugin->ops.instance_close(dst);
	plugin->ops.instance_close(src);
}

/* ---- Tests: failures ----------------------------------------------------- */

static void test_remote_error_carries_the_provider_text(void **state)
{
	(void)state;
	struct pair *p = pair_open(&fake, 2);
	struct region r;
	region_open(&r, p, 4096, 8);
	struct tally t;
	tally_init(&t, 3);
	post(p, 0, &r, 64, 0, 0, &t);
	assert_int_equal(plugin->ops.flush(p->src, SECOND), 0);
	/* The destination deregisters; the next write meets a dead key. */
	plugin->ops.mr_deregister(p->dst, r.mr);
	post(p, 1, &r, 64, 64, 1, &t);
	harvest_all(p->src, &t, 2);
	assert_int_equal(t.failed, 1);
	assert_int_equal(t.seen[1], 1);
	assert_int_equal(plugin->ops.progress(p->src, NULL, 0, 0), -LMT_EIO);
	assert_int_equal(p->src_host.error_code, LMT_EIO);
	assert_non_null(strstr(p->src_host.error, "ofi channel 1: write failed: "));
	assert_non_null(strstr(p->src_host.error, "lmtfake: key 0x"));
	assert_non_null(strstr(p->src_host.error, "is not registered at the target"));
	/* The session is over: no more writes. */
	assert_int_equal(plugin->ops.write(p->src_ep[0], r.src, 8, r.src_mr, r.rkey, 0, 2),
	                 -LMT_EIO);
	assert_int_equal(plugin->ops.flush(p->src, SECOND), -LMT_EIO);
	plugin->ops.rkey_release(p->src, r.rkey);
	plugin->ops.mr_deregister(p->src, r.src_mr);
	munmap(r.block, r.len + 2 * GUARD);
	munmap(r.src, r.len);
	free(t.seen);
	pair_close(p);
}

/* lmtfake holds successful writes; one that fails ends the session, and
 * the held ones must be reported failed too, each once. Write i, of `size`
 * bytes, goes to channel i % channels, at offset i * stride. */
static void held_writes_fail_once(const struct variant *v, uint32_t channels, size_t size,
                                  size_t stride)
{
	enum { HELD = 200 };
	struct pair *p = pair_open(v, channels);
	struct region r;
	region_open(&r, p, HELD * stride + size < 4096 ? 4096 : HELD * stride + size, 9);
	struct tally t;
	tally_init(&t, HELD + 1);
	for (uint64_t i = 0; i < HELD; i++)
		assert_int_equal(plugin->ops.write(p->src_ep[i % channels], r.src + i * stride,
		                                   size, r.src_mr, r.rkey, i * stride, i),
		                 0);
	/* The failing write goes to a region of its own, under another key,
	 * so that coalescing posts it at once. */
	struct region bad;
	region_open(&bad, p, 4096, 11);
	plugin->ops.mr_deregister(p->dst, r.mr);
	plugin->ops.mr_deregister(p->dst, bad.mr);
	assert_int_equal(
	        plugin->ops.write(p->src_ep[0], bad.src, 16, bad.src_mr, bad.rkey, 0, HELD), 0);
	uint64_t deadline = now_ns() + 5 * SECOND;
	int rc;
	while ((rc = harvest(p->src, &t, SECOND / 10)) >= 0)
		assert_true(now_ns() < deadline);
	assert_int_equal(rc, -LMT_EIO);
	assert_int_equal(t.done, HELD + 1);
	assert_int_equal(t.failed, HELD + 1);
	for (uint64_t i = 0; i <= HELD; i++)
		assert_int_equal(t.seen[i], 1);
	assert_non_null(strstr(p->src_host.error, "is not registered at the target"));
	struct region *both[] = {&r, &bad};
	for (int i = 0; i < 2; i++) {
		plugin->ops.rkey_release(p->src, both[i]->rkey);
		plugin->ops.mr_deregister(p->src, both[i]->src_mr);
		munmap(both[i]->block, both[i]->len + 2 * GUARD);
		munmap(both[i]->src, both[i]->len);
	}
	free(t.seen);
	pair_close(p);
}

static void test_failure_reports_every_outstanding_write(void **state)
{
	(void)state;
	held_writes_fail_once(&fake_held, 2, 16, 0);
}

/* With coalescing, once 1 MiB is held in flight the writes behind it wait
 * in the plugin and never reach the provider: each is still reported
 * once. */
static void test_failure_reports_queued_writes(void **state)
{
	(void)state;
	held_writes_fail_once(&fake_held_coalesced, 1, 64 << 10, 64 << 10);
}

static void test_coalescing_without_delivery_completion_is_refused(void **state)
{
	(void)state;
	struct fake_host h;
	fake_host_init(&h, &fake_fence_coalesced);
	lmt_instance *inst;
	assert_int_equal(try_open(&h, LMT_ROLE_SOURCE, 1, &inst), -LMT_EINVAL);
	assert_null(inst);
	assert_non_null(strstr(h.error, "ofi.coalesce=on needs delivery completion"));
	pthread_mutex_destroy(&h.lock);
}

static void test_progress_and_flush_honour_cancel(void **state)
{
	(void)state;
	struct pair *p = pair_open(&fake_held, 1);
	struct region r;
	region_open(&r, p, 4096, 12);
	assert_int_equal(plugin->ops.write(p->src_ep[0], r.src, 16, r.src_mr, r.rkey, 0, 0), 0);
	atomic_store(&p->src_host.cancelled, 1);
	atomic_store(&p->dst_host.cancelled, 1);
	struct lmt_completion c[4];
	uint64_t start = now_ns();
	assert_int_equal(plugin->ops.progress(p->dst, c, 4, 30 * SECOND), -LMT_ECANCELED);
	assert_int_equal(plugin->ops.progress(p->src, c, 4, 30 * SECOND), -LMT_ECANCELED);
	assert_int_equal(plugin->ops.flush(p->src, 30 * SECOND), -LMT_ECANCELED);
	assert_true(now_ns() - start < SECOND);
	region_close(&r, p);
	pair_close(p);
}

static void test_destination_progress_waits_and_reports_nothing(void **state)
{
	struct pair *p = pair_open(*state, 1);
	struct lmt_completion c[4];
	uint64_t start = now_ns();
	assert_int_equal(plugin->ops.progress(p->dst, c, 4, SECOND / 5), 0);
	assert_true(now_ns() - start >= SECOND / 5);
	assert_int_equal(plugin->ops.flush(p->dst, SECOND), 0);
	assert_int_equal(plugin->ops.flush(p->src, SECOND), 0);
	pair_close(p);
}

/* ---- Tests: teardown ---------------------------------------------------- */

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

/* Every state the core may close from, for one variant. */
static void teardown_cycle(const struct variant *v)
{
	/* Opened, nothing more. */
	struct fake_host h;
	fake_host_init(&h, v);
	plugin->ops.instance_close(open_instance(&h, LMT_ROLE_SOURCE, 2));

	/* Endpoints opened, never connected; one closed by the core. */
	struct fake_host dh, sh;
	fake_host_init(&dh, v);
	fake_host_init(&sh, v);
	lmt_instance *dst = open_instance(&dh, LMT_ROLE_DESTINATION, 3);
	lmt_instance *src = open_instance(&sh, LMT_ROLE_SOURCE, 3);
	lmt_endpoint *ep;
	struct lmt_blob addr;
	for (uint32_t c = 0; c < 2; c++) {
		assert_int_equal(plugin->ops.ep_open(dst, c, &ep, &addr), 0);
		assert_int_equal(plugin->ops.ep_open(src, c, &ep, &addr), 0);
	}
	plugin->ops.ep_close(ep);
	plugin->ops.instance_close(dst);
	plugin->ops.instance_close(src);

	/* Connected, registered, writes in flight, nothing released. */
	struct pair *p = pair_open(v, 2);
	struct region r;
	region_open(&r, p, 1 << 20, 10);
	struct tally t;
	tally_init(&t, 8);
	for (uint64_t i = 0; i < 8; i++)
		post(p, i & 1, &r, 1 << 17, i << 17, i, &t);
	free(t.seen);
	pair_close(p);
	munmap(r.block, r.len + 2 * GUARD);
	munmap(r.src, r.len);

	/* Closed by the core in its own order: keys, registrations,
	 * endpoints, and the destination first. */
	p = pair_open(v, 2);
	region_open(&r, p, 1 << 20, 11);
	plugin->ops.rkey_release(p->src, r.rkey);
	plugin->ops.mr_deregister(p->src, r.src_mr);
	plugin->ops.mr_deregister(p->dst, r.mr);
	for (uint32_t c = 0; c < 2; c++) {
		plugin->ops.ep_close(p->dst_ep[c]);
		plugin->ops.ep_close(p->src_ep[c]);
	}
	munmap(r.block, r.len + 2 * GUARD);
	munmap(r.src, r.len);
	pair_close(p);
}

static void test_teardown_from_every_state_leaves_no_fds_or_threads(void **state)
{
	const struct variant *v = *state;
	teardown_cycle(v); /* providers set up what they keep for the process */
	int fds = count_entries("/proc/self/fd");
	int threads = count_entries("/proc/self/task");
	for (int i = 0; i < 3; i++)
		teardown_cycle(v);
	assert_int_equal(count_entries("/proc/self/fd"), fds);
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

#define ON(test, variant) cmocka_unit_test_prestate(test, (void *)&(variant))

int main(int argc, char **argv)
{
	module_path = getenv("LMT_TEST_OFI_PLUGIN");
	const char *fake_dir = getenv("LMT_TEST_OFI_FAKE_DIR");
	if (argc > 2) {
		module_path = argv[1];
		fake_dir = argv[2];
	}
	if (!module_path || !fake_dir) {
		fprintf(stderr,
		        "usage: %s ofi.so lmtfake-dir (or set LMT_TEST_OFI_PLUGIN and "
		        "LMT_TEST_OFI_FAKE_DIR)\n",
		        argv[0]);
		return 2;
	}
	if (getenv("FI_OFI_RXM_MSG_RX_SIZE"))
		user_rxm_rx_size = strdup(getenv("FI_OFI_RXM_MSG_RX_SIZE"));
	/* Before libfabric first looks for providers. */
	setenv("FI_PROVIDER_PATH", fake_dir, 1);
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_entry_gives_descriptor),
	        cmocka_unit_test(test_entry_refuses_an_older_core),
	        cmocka_unit_test(test_unknown_provider_error_lists_those_available),
	        cmocka_unit_test(test_rxm_receive_default_keeps_the_users_value),
	        cmocka_unit_test(test_unknown_domain_error_lists_domains),
	        cmocka_unit_test(test_domain_option_picks_the_domain),
	        cmocka_unit_test(test_bad_mr_mode_option_is_rejected),
	        cmocka_unit_test(test_delivery_completion_demanded_but_missing_is_refused),
	        cmocka_unit_test(test_required_mode_not_offered_is_refused),

	        ON(test_one_channel_lands_bit_for_bit, tcp),
	        ON(test_two_channels_land_bit_for_bit, tcp),
	        ON(test_two_channels_land_bit_for_bit, tcp_fence),
	        ON(test_two_channels_land_bit_for_bit, tcp_local),
	        ON(test_one_channel_lands_bit_for_bit, shm),
	        ON(test_two_channels_land_bit_for_bit, shm),
	        ON(test_two_channels_land_bit_for_bit, shm_offsets),
	        ON(test_two_channels_land_bit_for_bit, fake),
	        ON(test_two_channels_land_bit_for_bit, fake_local),
	        ON(test_two_channels_land_bit_for_bit, fake_virt),
	        ON(test_two_channels_land_bit_for_bit, fake_prov_key),
	        ON(test_two_channels_land_bit_for_bit, fake_endpoint),
	        ON(test_two_channels_land_bit_for_bit, fake_raw),
	        ON(test_two_channels_land_bit_for_bit, fake_raw_virt),
	        ON(test_two_channels_land_bit_for_bit, fake_all),
	        ON(test_two_channels_land_bit_for_bit, fake_fence),
	        ON(test_two_channels_land_bit_for_bit, fake_fence_all),
	        ON(test_two_channels_land_bit_for_bit, fake_polled),

	        ON(test_every_cookie_completes_exactly_once, tcp),
	        ON(test_every_cookie_completes_exactly_once, shm),
	        ON(test_every_cookie_completes_exactly_once, fake_fence_all),
	        ON(test_every_cookie_completes_exactly_once, shm_apart),
	        ON(test_every_cookie_completes_exactly_once, tcp_coalesced),
	        ON(test_contiguous_writes_merge_and_complete_once, shm),
	        ON(test_contiguous_writes_merge_and_complete_once, tcp_coalesced),
	        ON(test_full_queue_answers_eagain, tcp),
	        ON(test_full_queue_answers_eagain, shm),
	        ON(test_zero_length_write_completes, shm),
	        ON(test_write_past_key_length_is_rejected, tcp),
	        ON(test_write_past_key_length_is_rejected, fake_all),
	        ON(test_unregistered_source_is_refused_when_the_provider_needs_it, fake_local),
	        ON(test_unregistered_source_is_refused_when_the_provider_needs_it, shm_offsets),
	        cmocka_unit_test(test_registration_needs_open_channels_with_endpoint_mode),

	        ON(test_malformed_key_blob_is_rejected, tcp),
	        ON(test_malformed_key_blob_is_rejected, shm),
	        cmocka_unit_test(test_forged_raw_key_is_rejected),
	        ON(test_malformed_address_blob_is_rejected, tcp),
	        ON(test_malformed_address_blob_is_rejected, shm),
	        ON(test_malformed_address_blob_is_rejected, fake_all),
	        cmocka_unit_test(test_another_provider_on_the_peer_is_a_mismatch),

	        cmocka_unit_test(test_remote_error_carries_the_provider_text),
	        cmocka_unit_test(test_failure_reports_every_outstanding_write),
	        cmocka_unit_test(test_failure_reports_queued_writes),
	        cmocka_unit_test(test_coalescing_without_delivery_completion_is_refused),
	        cmocka_unit_test(test_progress_and_flush_honour_cancel),
	        ON(test_destination_progress_waits_and_reports_nothing, shm),
	        ON(test_teardown_from_every_state_leaves_no_fds_or_threads, tcp),
	        ON(test_teardown_from_every_state_leaves_no_fds_or_threads, shm),
	        ON(test_teardown_from_every_state_leaves_no_fds_or_threads, fake_all),
	};
	int failed = cmocka_run_group_tests(tests, load_plugin, unload_plugin);
	free(user_rxm_rx_size);
	return failed;
}
