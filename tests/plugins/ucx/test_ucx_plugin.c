/* Unit tests of the UCX plugin: a destination and a source instance in one
 * process, driven through the plugin ABI and a fake host, over the UCX
 * transports named by LMT_TEST_UCX_TLS and LMT_TEST_UCX_TRANSFER. A forger
 * with its own UCP worker plays a hostile source. */
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

#include <ucp/api/ucp.h>

#include <lmt/plugin.h>

#include "wire.h"

#define MAX_CHANNELS 4
#define GUARD 4096
#define SECOND 1000000000ull

static const char *module_path;
static void *module;
static const struct lmt_plugin *plugin;
static const char *tls = "";
static const char *transfer = "auto";

/* ---- Fake host ----------------------------------------------------------- */

struct fake_host {
	pthread_mutex_t lock;
	int errors;     /* how many were recorded */
	int error_code; /* the first */
	char error[512];
	atomic_int cancelled;
	const char *tls;
	const char *devices;
	int64_t transfer;
	atomic_int unused_config; /* UCX logged settings that no transport took */
};

static void fake_log(void *ctx, enum lmt_log_level level, const char *fmt, ...) LMT_PRINTF(3, 4);
static int fake_error(void *ctx, int code, const char *fmt, ...) LMT_PRINTF(3, 4);

static void fake_log(void *ctx, enum lmt_log_level level, const char *fmt, ...)
{
	struct fake_host *h = ctx;
	char line[512];
	va_list ap;
	(void)level;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	if (strstr(line, "invalid configuration"))
		atomic_fetch_add(&h->unused_config, 1);
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
	static const char *const transfers[] = {"auto", "am", "put"};
	struct fake_host *h = ctx;
	memset(out, 0, sizeof(*out));
	if (strcmp(name, "ucx.tls") == 0) {
		out->type = LMT_OPT_STRING;
		out->text = h->tls;
	} else if (strcmp(name, "ucx.devices") == 0) {
		out->type = LMT_OPT_STRING;
		out->text = h->devices;
	} else if (strcmp(name, "ucx.transfer") == 0) {
		out->type = LMT_OPT_ENUM;
		out->integer = h->transfer;
		out->text = transfers[h->transfer];
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
	h->tls = tls;
	h->devices = "";
	h->transfer = strcmp(transfer, "put") == 0 ? 2 : strcmp(transfer, "am") == 0 ? 1 : 0;
}

static int error_count(struct fake_host *h)
{
	pthread_mutex_lock(&h->lock);
	int n = h->errors;
	pthread_mutex_unlock(&h->lock);
	return n;
}

static int putting(void)
{
	return strcmp(transfer, "put") == 0;
}

/* ---- Instances, endpoints, regions --------------------------------------- */

static lmt_instance *open_instance(struct fake_host *h, enum lmt_role role, uint32_t channels,
                                   uint64_t timeout_ns)
{
	struct lmt_instance_params params = {.struct_size = sizeof(params),
	                                     .role = role,
	                                     .channels = channels,
	                                     .timeout_ns = timeout_ns};
	strcpy(params.local_host, "127.0.0.1");
	strcpy(params.peer_host, "127.0.0.1");
	lmt_instance *inst = NULL;
	int rc = plugin->ops.instance_open(&host_services, h, &params, &inst);
	if (rc)
		fail_msg("instance_open: %d (%s)", rc, h->error);
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

/* Both instances with every channel connected, in the core's order. */
static struct pair *pair_open(uint32_t channels)
{
	struct pair *p = calloc(1, sizeof(*p));
	assert_non_null(p);
	p->channels = channels;
	fake_host_init(&p->dst_host);
	fake_host_init(&p->src_host);
	p->dst = open_instance(&p->dst_host, LMT_ROLE_DESTINATION, channels, 5 * SECOND);
	p->src = open_instance(&p->src_host, LMT_ROLE_SOURCE, channels, 5 * SECOND);
	for (uint32_t c = 0; c < channels; c++)
		assert_int_equal(plugin->ops.ep_open(p->src, c, &p->src_ep[c], &p->src_addr[c]), 0);
	for (uint32_t c = 0; c < channels; c++) {
		assert_int_equal(plugin->ops.ep_open(p->dst, c, &p->dst_ep[c], &p->dst_addr[c]), 0);
		assert_true(p->dst_addr[c].len <= LMT_BLOB_MAX);
	}
	for (uint32_t c = 0; c < channels; c++)
		assert_int_equal(plugin->ops.ep_connect(p->dst_ep[c], &p->src_addr[c]), 0);
	for (uint32_t c = 0; c < channels; c++)
		assert_int_equal(plugin->ops.ep_connect(p->src_ep[c], &p->dst_addr[c]), 0);
	return p;
}

static void pair_close(struct pair *p)
{
	if (p->src)
		plugin->ops.instance_close(p->src);
	if (p->dst)
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
	assert_true(r->key.len > 0 && r->key.len <= LMT_BLOB_MAX);
	r->rkey = NULL;
	if (src)
		assert_int_equal(plugin->ops.rkey_import(src, &r->key, &r->rkey), 0);
}

static void region_close(struct region *r, lmt_instance *dst, lmt_instance *src)
{
	if (src && r->rkey)
		plugin->ops.rkey_release(src, r->rkey);
	if (dst && r->mr)
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

static int all_zero(const uint8_t *p, size_t len)
{
	for (size_t i = 0; i < len; i++)
		if (p[i])
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
	uint64_t deadline = now_ns() + 30 * SECOND;
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
	uint64_t deadline = now_ns() + 30 * SECOND;
	while (t->done < expected) {
		assert_true(harvest(src, t, SECOND / 10) >= 0);
		assert_true(now_ns() < deadline);
	}
}

/* Sizes across UCX's protocol switches: short, copy-in, rendezvous, and
 * several MiB; 0 too. */
static const size_t piece_sizes[] = {
        1,       7,    0,     92,      93,         512,     4096,          4099,
        8192,    8257, 65536, 65537,   262144 + 3, 1 << 20, (1 << 20) + 1, 3 << 20,
        8 << 20, 100,  4095,  2 << 20,
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
	assert_int_equal(plugin->ops.flush(p->src, 30 * SECOND), 0);
	/* Flush means visible: compare before harvesting anything else. */
	assert_memory_equal(r.mem + 13, src + 13, offset - 13);
	assert_true(all_zero(r.mem, 13));
	assert_true(guards_intact(&r));
	harvest_all(p->src, &t, cookie);
	assert_int_equal(t.failed, 0);
	for (uint64_t i = 0; i < cookie; i++)
		assert_int_equal(t.seen[i], 1);
	assert_int_equal(error_count(&p->src_host), 0);
	assert_int_equal(error_count(&p->dst_host), 0);

	munmap(src, r.len);
	region_close(&r, p->dst, p->src);
	free(t.seen);
	pair_close(p);
}

/* ---- A forger: a UCP worker of our own that sends what it likes ----------- */

struct forger {
	ucp_context_h context;
	ucp_worker_h worker;
	ucp_ep_h ep;
	int notes;
	struct ucx_note last;
};

static ucs_status_t forger_note(void *arg, const void *header, size_t header_length, void *data,
                                size_t length, const ucp_am_recv_param_t *param)
{
	struct forger *f = arg;
	(void)data;
	(void)length;
	(void)param;
	assert_null(ucx_note_decode(header, header_length, &f->last));
	f->notes++;
	return UCS_OK;
}

static void forger_open(struct forger *f)
{
	memset(f, 0, sizeof(*f));
	ucp_config_t *config;
	assert_int_equal(ucp_config_read(NULL, NULL, &config), UCS_OK);
	if (tls[0])
		assert_int_equal(ucp_config_modify(config, "TLS", tls), UCS_OK);
	ucp_params_t params = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_AM};
	assert_int_equal(ucp_init(&params, config, &f->context), UCS_OK);
	ucp_config_release(config);
	ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
	                          .thread_mode = UCS_THREAD_MODE_SINGLE};
	assert_int_equal(ucp_worker_create(f->context, &wp, &f->worker), UCS_OK);
	ucp_am_handler_param_t handler = {
	        .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
	                      UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG,
	        .id = UCX_AM_NOTE,
	        .flags = UCP_AM_FLAG_WHOLE_MSG,
	        .cb = forger_note,
	        .arg = f,
	};
	assert_int_equal(ucp_worker_set_am_recv_handler(f->worker, &handler), UCS_OK);
}

/* The forger's worker as a source's address blob for `channel`. */
static void forger_blob(struct forger *f, uint32_t channel, struct lmt_blob *blob)
{
	ucp_address_t *address;
	size_t len;
	assert_int_equal(ucp_worker_get_address(f->worker, &address, &len), UCS_OK);
	assert_null(ucx_addr_encode(UCX_MAGIC_SRC_ADDR, channel, address, len, blob));
	ucp_worker_release_address(f->worker, address);
}

static void forger_failed(void *arg, ucp_ep_h ep, ucs_status_t status)
{
	(void)arg;
	(void)ep;
	(void)status;
}

static void forger_connect(struct forger *f, const struct lmt_blob *dst_addr)
{
	struct ucx_addr a;
	assert_null(ucx_addr_decode(dst_addr, UCX_MAGIC_DST_ADDR, &a));
	ucp_ep_params_t params = {
	        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
	                      UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER,
	        .address = (const ucp_address_t *)a.worker,
	        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
	        .err_handler = {.cb = forger_failed},
	};
	/* Shared memory cannot report a failed peer in UCX 1.13. */
	if (strcmp(tls, "tcp") != 0)
		params.err_mode = UCP_ERR_HANDLING_MODE_NONE;
	assert_int_equal(ucp_ep_create(f->worker, &params, &f->ep), UCS_OK);
}

static ucs_status_t forger_wait(struct forger *f, void *req)
{
	if (req == NULL)
		return UCS_OK;
	if (UCS_PTR_IS_ERR(req))
		return UCS_PTR_STATUS(req);
	uint64_t deadline = now_ns() + 10 * SECOND;
	while (ucp_request_check_status(req) == UCS_INPROGRESS && now_ns() < deadline)
		ucp_worker_progress(f->worker);
	ucs_status_t st = ucp_request_check_status(req);
	ucp_request_free(req);
	return st;
}

static ucs_status_t forger_send(struct forger *f, unsigned id, const void *header,
                                size_t header_len, const void *payload, size_t len)
{
	ucp_request_param_t params = {0};
	return forger_wait(f,
	                   ucp_am_send_nbx(f->ep, id, header, header_len, payload, len, &params));
}

static void forger_close(struct forger *f)
{
	if (f->ep) {
		ucp_request_param_t params = {.op_attr_mask = 0};
		void *req = ucp_ep_close_nbx(f->ep, &params);
		if (UCS_PTR_IS_PTR(req)) {
			uint64_t deadline = now_ns() + SECOND;
			while (ucp_request_check_status(req) == UCS_INPROGRESS &&
			       now_ns() < deadline)
				ucp_worker_progress(f->worker);
			ucp_request_free(req);
		}
	}
	ucp_worker_destroy(f->worker);
	ucp_cleanup(f->context);
}

/* A one-channel destination with a guarded 4096-byte region, and a forger
 * connected to it as its source. */
struct forged {
	struct fake_host dh;
	lmt_instance *dst;
	lmt_endpoint *ep;
	struct region r;
	struct ucx_key key;
	struct forger f;
};

static void forged_open(struct forged *s)
{
	fake_host_init(&s->dh);
	s->dst = open_instance(&s->dh, LMT_ROLE_DESTINATION, 1, 5 * SECOND);
	struct lmt_blob addr, src_addr;
	assert_int_equal(plugin->ops.ep_open(s->dst, 0, &s->ep, &addr), 0);
	region_open(&s->r, s->dst, NULL, 4096);
	assert_null(ucx_key_decode(&s->r.key, &s->key));
	forger_open(&s->f);
	forger_blob(&s->f, 0, &src_addr);
	assert_int_equal(plugin->ops.ep_connect(s->ep, &src_addr), 0);
	forger_connect(&s->f, &addr);
}

static void forged_close(struct forged *s)
{
	forger_close(&s->f);
	region_close(&s->r, s->dst, NULL);
	plugin->ops.instance_close(s->dst);
	pthread_mutex_destroy(&s->dh.lock);
}

/* Send one forged write and expect the destination to refuse it: its
 * progress fails with LMT_EPROTO and a message containing `expect`, the
 * forger hears ERROR, and memory stays as it was. */
static void forge_write(uint32_t magic, uint32_t region_delta, uint64_t offset, uint64_t len,
                        size_t payload, const char *expect)
{
	struct forged s;
	forged_open(&s);
	uint8_t header[UCX_WRITE_HEADER_LEN];
	ucx_write_encode(&(struct ucx_write){.region = s.key.region + region_delta,
	                                     .offset = offset,
	                                     .len = len},
	                 header);
	if (magic != UCX_MAGIC_WRITE)
		memcpy(header, &magic, 4);
	uint8_t *data = malloc(payload + 1);
	assert_non_null(data);
	memset(data, 0x5a, payload + 1);
	forger_send(&s.f, UCX_AM_WRITE, header, sizeof(header), data, payload);

	struct lmt_completion c[4];
	assert_int_equal(plugin->ops.progress(s.dst, c, 4, 5 * SECOND), -LMT_EPROTO);
	assert_int_equal(s.dh.error_code, LMT_EPROTO);
	if (!strstr(s.dh.error, expect))
		fail_msg("error '%s' lacks '%s'", s.dh.error, expect);
	uint64_t deadline = now_ns() + 5 * SECOND;
	while (!s.f.notes && now_ns() < deadline)
		ucp_worker_progress(s.f.worker);
	assert_int_equal(s.f.notes, 1);
	assert_int_equal(s.f.last.kind, UCX_NOTE_ERROR);
	assert_int_equal(s.f.last.code, LMT_EPROTO);
	assert_true(guards_intact(&s.r));
	assert_true(all_zero(s.r.mem, s.r.len));
	free(data);
	forged_close(&s);
}

/* ---- Tests: the descriptor ------------------------------------------------ */

static void test_entry_gives_descriptor_with_caps_and_options(void **state)
{
	(void)state;
	assert_string_equal(plugin->name, "ucx");
	assert_int_equal(plugin->abi_version, LMT_PLUGIN_ABI_VERSION);
	assert_true(plugin->struct_size >= sizeof(struct lmt_plugin));
	/* Active messages over tcp and shared memory: not one-sided. */
	assert_int_equal(plugin->caps, LMT_CAP_MULTI_CHANNEL | LMT_CAP_TARGET_PROGRESS);
	assert_int_equal(plugin->option_count, 3);
	assert_string_equal(plugin->options[0].name, "tls");
	assert_string_equal(plugin->options[1].name, "devices");
	assert_string_equal(plugin->options[2].name, "transfer");
}

static void test_entry_refuses_an_older_core(void **state)
{
	(void)state;
	lmt_plugin_entry_fn entry = (lmt_plugin_entry_fn)dlsym(module, LMT_PLUGIN_ENTRY_SYMBOL);
	const struct lmt_plugin *d = NULL;
	assert_int_equal(entry(0, &d), -LMT_EABI);
	assert_non_null(d);
}

static void test_unknown_transport_fails_with_ucx_reason(void **state)
{
	(void)state;
	struct fake_host h;
	fake_host_init(&h);
	h.tls = "no_such_transport";
	struct lmt_instance_params params = {
	        .struct_size = sizeof(params), .role = LMT_ROLE_SOURCE, .channels = 1};
	lmt_instance *inst = NULL;
	int rc = plugin->ops.instance_open(&host_services, &h, &params, &inst);
	if (rc == 0) {
		/* UCX may accept the name and find nothing to reach. */
		lmt_endpoint *ep;
		struct lmt_blob addr;
		rc = plugin->ops.ep_open(inst, 0, &ep, &addr);
		plugin->ops.instance_close(inst);
	}
	assert_true(rc < 0);
	assert_non_null(strstr(h.error, "ucx"));
	assert_true(strstr(h.error, "no_such_transport") || strstr(h.error, "("));
	pthread_mutex_destroy(&h.lock);
}

/* "tcp+self" reaches UCX as "tcp,self": UCX knows no transport "tcp+self",
 * so without the translation nothing would open. The shared-memory
 * setting the plugin adds must not be left unused (UCX warns then). */
static void test_plus_separated_transports_reach_ucx(void **state)
{
	(void)state;
	struct fake_host h;
	fake_host_init(&h);
	char list[64];
	snprintf(list, sizeof(list), "%s+self", tls[0] ? tls : "all");
	h.tls = list;
	struct lmt_instance_params params = {
	        .struct_size = sizeof(params), .role = LMT_ROLE_SOURCE, .channels = 1};
	lmt_instance *inst = NULL;
	assert_int_equal(plugin->ops.instance_open(&host_services, &h, &params, &inst), 0);
	lmt_endpoint *ep = NULL;
	struct lmt_blob addr;
	assert_int_equal(plugin->ops.ep_open(inst, 0, &ep, &addr), 0);
	plugin->ops.ep_close(ep);
	plugin->ops.instance_close(inst);
	assert_int_equal(h.errors, 0);
	assert_int_equal(atomic_load(&h.unused_config), 0);
	pthread_mutex_destroy(&h.lock);
}

static void test_overlong_transport_list_is_refused(void **state)
{
	(void)state;
	struct fake_host h;
	fake_host_init(&h);
	char list[400];
	memset(list, 'x', sizeof(list) - 1);
	list[sizeof(list) - 1] = '\0';
	h.tls = list;
	struct lmt_instance_params params = {
	        .struct_size = sizeof(params), .role = LMT_ROLE_SOURCE, .channels = 1};
	lmt_instance *inst = NULL;
	assert_int_equal(plugin->ops.instance_open(&host_services, &h, &params, &inst),
	                 -LMT_EINVAL);
	assert_null(inst);
	assert_non_null(strstr(h.error, "ucx.tls: longer than 255 characters"));
	pthread_mutex_destroy(&h.lock);
}

static void test_unknown_device_fails_with_ucx_reason(void **state)
{
	(void)state;
	if (strcmp(tls, "tcp") != 0)
		skip();
	struct fake_host h;
	fake_host_init(&h);
	h.devices = "no_such_nic";
	struct lmt_instance_params params = {
	        .struct_size = sizeof(params), .role = LMT_ROLE_DESTINATION, .channels = 1};
	lmt_instance *inst = NULL;
	assert_true(plugin->ops.instance_open(&host_services, &h, &params, &inst) < 0);
	assert_null(inst);
	assert_non_null(strstr(h.error, "devices 'no_such_nic'"));
	pthread_mutex_destroy(&h.lock);
}

/* ---- Tests: data ---------------------------------------------------------- */

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
	/* Completed means visible, even without a flush. */
	assert_memory_equal(r.mem, src, r.len);

	munmap(src, r.len);
	region_close(&r, p->dst, p->src);
	free(t.seen);
	pair_close(p);
}

static void test_completion_means_visible_write_by_write(void **state)
{
	(void)state;
	enum { WRITES = 64, SIZE = 256 << 10 };
	struct pair *p = pair_open(1);
	struct region r;
	region_open(&r, p->dst, p->src, (size_t)WRITES * SIZE);
	uint8_t *src = pattern(r.len, 13);
	struct tally t;
	tally_init(&t, WRITES);
	for (uint64_t i = 0; i < WRITES; i++)
		post(p, 0, src + i * SIZE, SIZE, r.rkey, i * SIZE, i, &t);
	uint64_t deadline = now_ns() + 30 * SECOND;
	while (t.done < WRITES) {
		struct lmt_completion c[8];
		int n = plugin->ops.progress(p->src, c, 8, SECOND / 10);
		assert_true(n >= 0);
		for (int i = 0; i < n; i++) {
			assert_int_equal(c[i].status, 0);
			t.done++;
			/* The instant it completes, its bytes are there. */
			uint64_t at = c[i].cookie * SIZE;
			assert_memory_equal(r.mem + at, src + at, SIZE);
		}
		assert_true(now_ns() < deadline);
	}
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
	uint64_t posted = 0;
	int rc;
	while ((rc = plugin->ops.write(p->src_ep[0], r.mem, 8, NULL, r.rkey, 0, posted)) == 0)
		assert_true(++posted <= 100000);
	assert_int_equal(rc, -LMT_EAGAIN);
	assert_true(posted >= 16);
	struct tally t;
	tally_init(&t, posted + 1);
	assert_true(harvest(p->src, &t, 5 * SECOND) > 0);
	assert_int_equal(plugin->ops.write(p->src_ep[0], r.mem, 8, NULL, r.rkey, 0, posted), 0);
	assert_int_equal(plugin->ops.flush(p->src, 10 * SECOND), 0);
	harvest_all(p->src, &t, posted + 1);
	assert_int_equal(t.failed, 0);
	assert_int_equal(error_count(&p->src_host), 0);

	region_close(&r, p->dst, p->src);
	free(t.seen);
	pair_close(p);
}

static void test_large_write_lands_whole(void **state)
{
	(void)state;
	/* Emulated puts crawl: a smaller one proves the same there. */
	size_t len = (putting() ? (64ul << 20) : (512ul << 20)) + 4097;
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
	buf[0] = 0x77;
	assert_int_equal(plugin->ops.write(p->src_ep[0], buf, 1, NULL, r.rkey, 8191, 99), 0);
	assert_int_equal(plugin->ops.flush(p->src, 10 * SECOND), 0);
	assert_int_equal(r.mem[8191], 0x77);
	assert_true(guards_intact(&r));

	region_close(&r, p->dst, p->src);
	pair_close(p);
}

/* ---- Tests: blobs --------------------------------------------------------- */

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

	enum { BAD = 11 };
	struct lmt_blob bad[BAD];
	for (int i = 0; i < BAD; i++)
		bad[i] = r.key;
	bad[0].len = UCX_KEY_HEADER_LEN - 1; /* shorter than the header */
	bad[1].data[0] ^= 1;                 /* magic */
	bad[2].data[4] = 9;                  /* version */
	bad[3].data[6] = 1;                  /* reserved */
	memset(bad[4].data + 8, 0, 4);       /* region id 0 */
	memset(bad[5].data + 24, 0, 8);      /* zero length */
	memset(bad[6].data + 16, 0xff, 8);   /* base + length wraps */
	bad[7].len--;                        /* rkey shorter than announced */
	bad[8].len = LMT_BLOB_MAX + 1;       /* longer than any blob */
	bad[9].data[12] ^= 0x40;             /* rkey length disagrees */
	memset(bad[10].data + 12, 0, 4);     /* empty rkey */
	for (int i = 0; i < BAD; i++) {
		lmt_rkey *rkey = (lmt_rkey *)(uintptr_t)1; /* must be cleared */
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

	enum { BAD = 9 };
	struct lmt_blob bad[BAD];
	for (int i = 0; i < BAD; i++)
		bad[i] = daddr;
	bad[0].len = 3;                 /* short */
	bad[1].data[3] ^= 0x80;         /* magic */
	bad[2].data[4] = 2;             /* version */
	bad[3].data[7] = 1;             /* reserved */
	bad[4].data[8] = 1;             /* channel 1, for endpoint 0 */
	bad[5].len--;                   /* address shorter than announced */
	memset(bad[6].data + 12, 0, 4); /* empty address */
	bad[7].len = LMT_BLOB_MAX + 1;  /* longer than any blob */
	bad[8] = saddr;                 /* a source's blob is not a destination's */
	for (int i = 0; i < BAD; i++)
		assert_int_equal(plugin->ops.ep_connect(sep, &bad[i]), -LMT_EPROTO);
	assert_int_equal(sh.error_code, LMT_EPROTO);
	assert_non_null(strstr(sh.error, "address blob"));

	struct lmt_blob bad_src = saddr;
	bad_src.data[0] = 0;
	assert_int_equal(plugin->ops.ep_connect(dep, &bad_src), -LMT_EPROTO);
	assert_int_equal(plugin->ops.ep_connect(dep, &daddr), -LMT_EPROTO);
	assert_int_equal(dh.error_code, LMT_EPROTO);

	plugin->ops.instance_close(src);
	plugin->ops.instance_close(dst);
}

/* ---- Tests: hostile writes ------------------------------------------------ */

static void test_forged_write_past_region_end_is_refused(void **state)
{
	(void)state;
	forge_write(UCX_MAGIC_WRITE, 0, 4000, 200, 200,
	            "ucx channel 0: write of 200 bytes at offset 4000 outside region 1 "
	            "(4096 bytes)");
}

static void test_forged_rendezvous_write_past_region_end_is_refused(void **state)
{
	(void)state;
	/* Large enough for UCX to send it by rendezvous on every transport. */
	forge_write(UCX_MAGIC_WRITE, 0, 0, 1 << 20, 1 << 20, "outside region 1 (4096 bytes)");
}

static void test_forged_write_with_wrapping_offset_is_refused(void **state)
{
	(void)state;
	forge_write(UCX_MAGIC_WRITE, 0, UINT64_MAX - 99, 200, 200, "outside region 1");
}

static void test_forged_write_for_unknown_region_is_refused(void **state)
{
	(void)state;
	forge_write(UCX_MAGIC_WRITE, 1, 0, 100, 100, "unknown region 2");
}

static void test_forged_write_with_bad_magic_is_refused(void **state)
{
	(void)state;
	forge_write(0xdeadbeef, 0, 0, 16, 16, "bad write magic");
}

static void test_forged_write_longer_than_its_header_says_is_refused(void **state)
{
	(void)state;
	forge_write(UCX_MAGIC_WRITE, 0, 0, 16, 4000, "write header says 16 bytes, 4000 arrived");
}

static void test_forged_write_with_short_header_is_refused(void **state)
{
	(void)state;
	struct forged s;
	forged_open(&s);
	uint8_t header[UCX_WRITE_HEADER_LEN] = {0};
	uint8_t data[64] = {0};
	forger_send(&s.f, UCX_AM_WRITE, header, sizeof(header) - 1, data, sizeof(data));
	struct lmt_completion c[1];
	assert_int_equal(plugin->ops.progress(s.dst, c, 1, 5 * SECOND), -LMT_EPROTO);
	assert_non_null(strstr(s.dh.error, "write header of the wrong length"));
	assert_true(all_zero(s.r.mem, s.r.len));
	forged_close(&s);
}

static void test_forged_acknowledgement_to_destination_is_refused(void **state)
{
	(void)state;
	struct forged s;
	forged_open(&s);
	uint8_t header[UCX_NOTE_HEADER_LEN];
	ucx_note_encode(&(struct ucx_note){.kind = UCX_NOTE_ACK}, header);
	forger_send(&s.f, UCX_AM_NOTE, header, sizeof(header), NULL, 0);
	struct lmt_completion c[1];
	assert_int_equal(plugin->ops.progress(s.dst, c, 1, 5 * SECOND), -LMT_EPROTO);
	assert_non_null(strstr(s.dh.error, "bad notice from the source"));
	forged_close(&s);
}

/* The source writes through a key whose region the destination let go:
 * the destination refuses, and the source's write fails. */
static void test_write_to_a_deregistered_region_fails_both_sides(void **state)
{
	(void)state;
	if (putting())
		skip(); /* a put reaches whatever UCX maps; only messages are checked */
	struct pair *p = pair_open(1);
	struct region r;
	region_open(&r, p->dst, p->src, 1 << 20);
	plugin->ops.mr_deregister(p->dst, r.mr);
	r.mr = NULL;
	uint8_t *src = pattern(r.len, 17);
	struct tally t;
	tally_init(&t, 2);
	/* One goes eagerly, one by rendezvous; the second may find the
	 * channel down already. */
	assert_int_equal(plugin->ops.write(p->src_ep[0], src, 100, NULL, r.rkey, 0, 0), 0);
	int rc = plugin->ops.write(p->src_ep[0], src, 1 << 20, NULL, r.rkey, 0, 1);
	if (rc)
		assert_int_equal(rc, -LMT_EPROTO);
	uint64_t expected = rc ? 1 : 2;
	struct lmt_completion c[1];
	assert_int_equal(plugin->ops.progress(p->dst, c, 1, 5 * SECOND), -LMT_EPROTO);
	assert_non_null(strstr(p->dst_host.error, "unknown region 1"));
	uint64_t deadline = now_ns() + 10 * SECOND;
	for (rc = 0; rc >= 0;) {
		assert_true(now_ns() < deadline);
		rc = harvest(p->src, &t, SECOND / 10);
	}
	assert_int_equal(rc, -LMT_EPROTO);
	assert_int_equal(t.done, expected);
	assert_int_equal(t.failed, expected);
	assert_true(all_zero(r.mem, r.len));
	assert_true(guards_intact(&r));

	munmap(src, r.len);
	region_close(&r, NULL, p->src);
	free(t.seen);
	pair_close(p);
}

/* ---- Tests: closing --------------------------------------------------------- */

static void test_destination_close_mid_stream_gives_source_econn(void **state)
{
	(void)state;
	/* UCX 1.13 emulates puts here with messages the target answers;
	 * with the target gone, its shared-memory transports crash copying
	 * the rest of a pending put. Puts are chosen only over RDMA. */
	if (putting())
		skip();
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
	uint64_t deadline = now_ns() + 20 * SECOND;
	int rc = 0;
	while (rc >= 0 && posted < WRITES) {
		assert_true(now_ns() < deadline);
		uint64_t at = posted % SLOTS * SIZE;
		int wrc = plugin->ops.write(p->src_ep[posted & 1], src + at, SIZE, NULL, r.rkey, at,
		                            posted);
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
	assert_non_null(strstr(p->src_host.error, "ucx channel"));
	/* Every posted write was accounted for exactly once. */
	assert_int_equal(t.done, posted);
	for (uint64_t i = 0; i < posted; i++)
		assert_int_equal(t.seen[i], 1);
	assert_int_equal(plugin->ops.progress(p->src, NULL, 0, 0), -LMT_ECONN);

	munmap(src, r.len);
	munmap(r.block, r.len + 2 * GUARD);
	plugin->ops.rkey_release(p->src, r.rkey);
	free(t.seen);
	pair_close(p);
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
	assert_int_equal(plugin->ops.flush(p->src, 10 * SECOND), 0);
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
	plugin->ops.rkey_release(p->src, r.rkey);
	plugin->ops.mr_deregister(p->dst, r.mr);
	munmap(r.block, r.len + 2 * GUARD);
	free(t.seen);
	if (source_first) {
		plugin->ops.instance_close(p->src);
		p->src = NULL;
	} else {
		plugin->ops.instance_close(p->dst);
		p->dst = NULL;
	}
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

static void test_progress_honours_cancel(void **state)
{
	(void)state;
	struct pair *p = pair_open(1);
	atomic_store(&p->src_host.cancelled, 1);
	struct lmt_completion c[1];
	uint64_t start = now_ns();
	assert_int_equal(plugin->ops.progress(p->src, c, 1, 30 * SECOND), -LMT_ECANCELED);
	assert_true(now_ns() - start < SECOND);
	pair_close(p);
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

/* Every half-open state the core can leave behind, closed by
 * instance_close alone. */
static void open_and_abandon(int state)
{
	struct fake_host dh, sh;
	fake_host_init(&dh);
	fake_host_init(&sh);
	lmt_instance *dst = open_instance(&dh, LMT_ROLE_DESTINATION, 3, SECOND);
	lmt_instance *src = open_instance(&sh, LMT_ROLE_SOURCE, 3, SECOND);
	lmt_endpoint *dep[2], *sep[2];
	struct lmt_blob daddr[2], saddr[2];
	struct region r = {0};
	for (uint32_t c = 0; c < 2 && state >= 1; c++) {
		assert_int_equal(plugin->ops.ep_open(src, c, &sep[c], &saddr[c]), 0);
		assert_int_equal(plugin->ops.ep_open(dst, c, &dep[c], &daddr[c]), 0);
	}
	if (state >= 2) /* the destination connected, the source never did */
		assert_int_equal(plugin->ops.ep_connect(dep[0], &saddr[0]), 0);
	if (state >= 3) {
		assert_int_equal(plugin->ops.ep_connect(sep[0], &daddr[0]), 0);
		region_open(&r, dst, src, 1 << 20);
		/* Still in flight at close, deliberately never harvested. */
		assert_int_equal(plugin->ops.write(sep[0], r.mem, 1 << 20, NULL, r.rkey, 0, 1), 0);
	}
	if (state == 1)
		plugin->ops.ep_close(sep[1]);
	plugin->ops.instance_close(src);
	plugin->ops.instance_close(dst);
	if (state >= 3)
		munmap(r.block, r.len + 2 * GUARD);
	pthread_mutex_destroy(&dh.lock);
	pthread_mutex_destroy(&sh.lock);
}

static void test_open_close_cycles_leave_no_fds_or_threads(void **state)
{
	(void)state;
	open_and_abandon(3); /* UCX loads its modules once */
	int fds = count_entries("/proc/self/fd");
	int threads = count_entries("/proc/self/task");
	for (int i = 0; i < 3; i++)
		for (int s = 0; s <= 3; s++)
			open_and_abandon(s);
	struct pair *p = pair_open(2);
	pair_close(p);
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
	module_path = getenv("LMT_TEST_UCX_PLUGIN");
	if (argc > 1)
		module_path = argv[1];
	if (getenv("LMT_TEST_UCX_TLS"))
		tls = getenv("LMT_TEST_UCX_TLS");
	if (getenv("LMT_TEST_UCX_TRANSFER"))
		transfer = getenv("LMT_TEST_UCX_TRANSFER");
	if (!module_path) {
		fprintf(stderr, "usage: %s ucx.so (or set LMT_TEST_UCX_PLUGIN)\n", argv[0]);
		return 2;
	}
	if (getenv("LMT_TEST_FILTER"))
		cmocka_set_test_filter(getenv("LMT_TEST_FILTER"));
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_entry_gives_descriptor_with_caps_and_options),
	        cmocka_unit_test(test_entry_refuses_an_older_core),
	        cmocka_unit_test(test_unknown_transport_fails_with_ucx_reason),
	        cmocka_unit_test(test_plus_separated_transports_reach_ucx),
	        cmocka_unit_test(test_overlong_transport_list_is_refused),
	        cmocka_unit_test(test_unknown_device_fails_with_ucx_reason),
	        cmocka_unit_test(test_one_channel_places_writes_bit_for_bit),
	        cmocka_unit_test(test_two_channels_place_writes_bit_for_bit),
	        cmocka_unit_test(test_every_cookie_completes_exactly_once),
	        cmocka_unit_test(test_completion_means_visible_write_by_write),
	        cmocka_unit_test(test_full_queue_answers_eagain),
	        cmocka_unit_test(test_large_write_lands_whole),
	        cmocka_unit_test(test_write_past_key_length_is_rejected),
	        cmocka_unit_test(test_malformed_key_blob_is_rejected),
	        cmocka_unit_test(test_malformed_address_blob_is_rejected),
	        cmocka_unit_test(test_forged_write_past_region_end_is_refused),
	        cmocka_unit_test(test_forged_rendezvous_write_past_region_end_is_refused),
	        cmocka_unit_test(test_forged_write_with_wrapping_offset_is_refused),
	        cmocka_unit_test(test_forged_write_for_unknown_region_is_refused),
	        cmocka_unit_test(test_forged_write_with_bad_magic_is_refused),
	        cmocka_unit_test(test_forged_write_longer_than_its_header_says_is_refused),
	        cmocka_unit_test(test_forged_write_with_short_header_is_refused),
	        cmocka_unit_test(test_forged_acknowledgement_to_destination_is_refused),
	        cmocka_unit_test(test_write_to_a_deregistered_region_fails_both_sides),
	        cmocka_unit_test(test_destination_close_mid_stream_gives_source_econn),
	        cmocka_unit_test(test_orderly_close_by_source_is_no_error),
	        cmocka_unit_test(test_orderly_close_by_destination_is_no_error),
	        cmocka_unit_test(test_destination_progress_waits_and_reports_nothing),
	        cmocka_unit_test(test_progress_honours_cancel),
	        cmocka_unit_test(test_open_close_cycles_leave_no_fds_or_threads),
	};
	return cmocka_run_group_tests(tests, load_plugin, unload_plugin);
}
