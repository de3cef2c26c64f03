/* The ucx plugin's own tests, through the plugin ABI on the plugin test
 * harness, over the UCX transport and transfer mode named by
 * LMT_TEST_UCX_TLS and LMT_TEST_UCX_TRANSFER: how transport and device lists
 * reach UCX, blobs with a bad field, random region ids, a forger with a UCP
 * worker of its own playing a hostile source (and an outsider without the
 * channel's token), writes through a key the destination let go, that the
 * source holds posting back over tcp only, and how the source takes its
 * destination closing. What every plugin must do is
 * lmt-plugin-check's (check-ucx-*). */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ucp/api/ucp.h>

#include <lmt/plugin.h>

#include "plugin_test.h"
#include "wire.h"

static struct ph_config cfg;
static const char *tls = "";
static const char *transfer = "auto";

static bool putting(void)
{
	return strcmp(transfer, "put") == 0;
}

/* How many lines the plugin logged through `host` with `text` in them. */
static int logged_count(struct ph_host *host, const char *text)
{
	static char log[1 << 16];
	ph_host_log(host, log, sizeof(log));
	int n = 0;
	for (const char *at = strstr(log, text); at; at = strstr(at + 1, text))
		n++;
	return n;
}

#define DROPPED "without this session's token"

/* An instance of `role` on its own, with option values `options` over the
 * test's: its instance_open's result, the instance closed again. */
static int open_alone(struct ph_host *host, enum lmt_role role, const char *options,
                      bool open_endpoint)
{
	struct lmt_error err = {0};
	ph_host_init(host, &cfg, role == LMT_ROLE_SOURCE ? "source" : "destination");
	if (ph_host_set_options(host, options, &err))
		fail_msg("%s: %s", options, err.message);
	struct lmt_instance_params params = {
	        .struct_size = sizeof(params), .role = role, .channels = 1};
	lmt_instance *inst = NULL;
	int rc = cfg.plugin->ops.instance_open(&ph_host_services, host, &params, &inst);
	if (rc == 0 && open_endpoint) {
		lmt_endpoint *ep = NULL;
		struct lmt_blob addr;
		rc = cfg.plugin->ops.ep_open(inst, 0, &ep, &addr);
		if (rc == 0)
			cfg.plugin->ops.ep_close(ep);
	}
	if (inst)
		cfg.plugin->ops.instance_close(inst);
	else
		assert_int_not_equal(rc, 0);
	return rc;
}

/* ---- A forger: a UCP worker of our own that sends what it likes ----------- */

struct forger {
	ucp_context_h context;
	ucp_worker_h worker;
	ucp_ep_h ep;
	uint64_t token;     /* in its blob: what the destination's notices carry */
	uint64_t dst_token; /* from the destination's blob: what writes must carry */
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
	f->token = 0x5eed5eed5eed5eedull;
	struct ucx_addr a = {.magic = UCX_MAGIC_SRC_ADDR, .channel = channel, .token = f->token};
	assert_null(ucx_addr_encode(&a, address, len, blob));
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
	f->dst_token = a.token;
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
	uint64_t deadline = ph_now() + 10 * PH_SECOND;
	while (ucp_request_check_status(req) == UCS_INPROGRESS && ph_now() < deadline)
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
			uint64_t deadline = ph_now() + PH_SECOND;
			while (ucp_request_check_status(req) == UCS_INPROGRESS &&
			       ph_now() < deadline)
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
	struct ph_forged dst;
	struct ucx_key key;
	struct forger f;
};

static void forged_open(struct forged *s)
{
	ph_forged_open(&s->dst, &cfg, 4096, 5 * PH_SECOND);
	struct ph_side *dst = &s->dst.pair.dst;
	assert_null(ucx_key_decode(&s->dst.region.key, &s->key));
	forger_open(&s->f);
	struct lmt_blob src_addr;
	forger_blob(&s->f, 0, &src_addr);
	assert_int_equal(cfg.plugin->ops.ep_connect(dst->ep[0], &src_addr), 0);
	forger_connect(&s->f, &dst->addr[0]);
}

static void forged_close(struct forged *s)
{
	forger_close(&s->f);
	ph_forged_close(&s->dst);
}

/* The destination refused what the forger sent (ph_forged_refused), and
 * the forger hears ERROR. Waiting for the notice also lets the forger's
 * worker answer the destination's wireup before it is destroyed: UCX 1.13
 * aborts in ucp_worker_destroy (ucp_request.c:684, "got REP message") when
 * that answer is still pending on the tcp transport. */
static void refused(struct forged *s, const char *expect)
{
	ph_forged_refused(&s->dst, expect);
	uint64_t deadline = ph_now() + 5 * PH_SECOND;
	while (!s->f.notes && ph_now() < deadline)
		ucp_worker_progress(s->f.worker);
	assert_int_equal(s->f.notes, 1);
	assert_int_equal(s->f.last.kind, UCX_NOTE_ERROR);
	assert_int_equal(s->f.last.code, LMT_EPROTO);
}

/* Send one forged write and expect the destination to refuse it. */
static void forge_write(uint32_t magic, uint32_t region_delta, uint64_t offset, uint64_t len,
                        size_t payload, const char *expect)
{
	struct forged s;
	forged_open(&s);
	uint8_t header[UCX_WRITE_HEADER_LEN];
	ucx_write_encode(&(struct ucx_write){.token = s.f.dst_token,
	                                     .region = s.key.region + region_delta,
	                                     .offset = offset,
	                                     .len = len},
	                 header);
	if (magic != UCX_MAGIC_WRITE)
		memcpy(header, &magic, 4);
	uint8_t *data = malloc(payload + 1);
	assert_non_null(data);
	memset(data, 0x5a, payload + 1);
	forger_send(&s.f, UCX_AM_WRITE, header, sizeof(header), data, payload);
	refused(&s, expect);
	free(data);
	forged_close(&s);
}

/* ---- Tests: what ucx claims, and its option lists ------------------------- */

/* Active messages over tcp and shared memory: not one-sided. The
 * destination's own channel threads drive UCX, so the core need not call
 * progress in a tight loop (LMT_CAP_TARGET_PROGRESS): a core that did
 * would sleep in it instead of reading its control connection, which is
 * what made postcopy faults over ucx slow. */
static void test_descriptor_claims_channels_only(void **state)
{
	(void)state;
	assert_string_equal(cfg.plugin->name, "ucx");
	assert_int_equal(cfg.plugin->caps, LMT_CAP_MULTI_CHANNEL);
}

static void test_unknown_transport_fails_with_ucx_reason(void **state)
{
	(void)state;
	struct ph_host h;
	/* UCX may accept the name and find nothing to reach. */
	assert_true(open_alone(&h, LMT_ROLE_SOURCE, "ucx.tls=no_such_transport", true) < 0);
	char said[512];
	ph_host_first_error(&h, said, sizeof(said));
	assert_non_null(strstr(said, "ucx"));
	assert_true(strstr(said, "no_such_transport") || strstr(said, "("));
	ph_host_fini(&h);
}

/* "tcp+self" reaches UCX as "tcp,self": UCX knows no transport "tcp+self",
 * so without the translation nothing would open. The shared-memory
 * setting the plugin adds must not be left unused (UCX warns then). */
static void test_plus_separated_transports_reach_ucx(void **state)
{
	(void)state;
	struct ph_host h;
	char list[64];
	snprintf(list, sizeof(list), "ucx.tls=%s+self", tls[0] ? tls : "all");
	assert_int_equal(open_alone(&h, LMT_ROLE_SOURCE, list, true), 0);
	assert_int_equal(ph_host_errors(&h), 0);
	assert_false(ph_host_logged(&h, "invalid configuration"));
	ph_host_fini(&h);
}

static void test_overlong_transport_list_is_refused(void **state)
{
	(void)state;
	struct ph_host h;
	char list[420];
	snprintf(list, sizeof(list), "ucx.tls=");
	memset(list + 8, 'x', 399);
	list[8 + 399] = '\0';
	assert_int_equal(open_alone(&h, LMT_ROLE_SOURCE, list, false), -LMT_EINVAL);
	PH_ASSERT_ERROR(&h, LMT_EINVAL, "ucx.tls: longer than 255 characters");
	ph_host_fini(&h);
}

static void test_unknown_device_fails_with_ucx_reason(void **state)
{
	(void)state;
	if (strcmp(tls, "tcp") != 0)
		skip();
	struct ph_host h;
	assert_true(open_alone(&h, LMT_ROLE_DESTINATION, "ucx.devices=no_such_nic", false) < 0);
	char said[512];
	ph_host_first_error(&h, said, sizeof(said));
	assert_non_null(strstr(said, "devices 'no_such_nic'"));
	ph_host_fini(&h);
}

/* ---- Tests: blobs with a bad field (see check-ucx-* for malformed ones) ---- */

static void test_key_blob_with_a_bad_field_is_refused(void **state)
{
	(void)state;
	struct ph_run run = {.cfg = &cfg};
	struct ph_pair p;
	struct ph_region region = {0};
	PH_REQUIRE(&run,
	           ph_pair_open(&run, &p, PH_SECOND) && ph_region_open(&run, &p, &region, 4096));
	enum { BAD = 8 };
	struct lmt_blob bad[BAD];
	for (int i = 0; i < BAD; i++)
		bad[i] = region.key;
	bad[0].data[0] ^= 1;               /* magic */
	bad[1].data[4] = 9;                /* version */
	bad[2].data[6] = 1;                /* reserved */
	memset(bad[3].data + 16, 0, 8);    /* region id 0 */
	memset(bad[4].data + 32, 0, 8);    /* zero length */
	memset(bad[5].data + 24, 0xff, 8); /* base + length wraps */
	bad[6].data[8] ^= 0x40;            /* rkey length disagrees */
	bad[7].data[13] = 1;               /* reserved */
	for (int i = 0; i < BAD; i++) {
		lmt_rkey *rkey = (lmt_rkey *)(uintptr_t)1; /* must be cleared */
		assert_int_equal(cfg.plugin->ops.rkey_import(p.src.inst, &bad[i], &rkey),
		                 -LMT_EPROTO);
		assert_null(rkey);
		PH_ASSERT_ERROR(&p.src.host, LMT_EPROTO, "key blob");
	}
	ph_region_close(&p, &region);
	ph_pair_close(&p);
}

static void test_address_blob_with_a_bad_field_is_refused(void **state)
{
	(void)state;
	struct ph_run run = {.cfg = &cfg};
	struct ph_pair p;
	PH_REQUIRE(&run, ph_pair_open(&run, &p, PH_SECOND) && ph_pair_open_endpoints(&run, &p));
	enum { BAD = 5 };
	struct lmt_blob bad[BAD];
	for (int i = 0; i < BAD; i++)
		bad[i] = p.dst.addr[0];
	bad[0].data[3] ^= 0x80;         /* magic */
	bad[1].data[4] = 9;             /* version */
	bad[2].data[7] = 1;             /* unknown flag */
	memset(bad[3].data + 12, 0, 4); /* empty address */
	memset(bad[4].data + 16, 0, 8); /* no token */
	for (int i = 0; i < BAD; i++) {
		assert_int_equal(cfg.plugin->ops.ep_connect(p.src.ep[0], &bad[i]), -LMT_EPROTO);
		PH_ASSERT_ERROR(&p.src.host, LMT_EPROTO, "address blob");
	}
	struct lmt_blob bad_src = p.src.addr[0];
	bad_src.data[0] = 0; /* magic */
	assert_int_equal(cfg.plugin->ops.ep_connect(p.dst.ep[0], &bad_src), -LMT_EPROTO);
	PH_ASSERT_ERROR(&p.dst.host, LMT_EPROTO, "address blob");
	ph_pair_close(&p);
}

/* ---- Tests: hostile writes ------------------------------------------------ */

static void test_forged_write_past_region_end_is_refused(void **state)
{
	(void)state;
	forge_write(UCX_MAGIC_WRITE, 0, 4000, 200, 200,
	            "ucx channel 0: write of 200 bytes at offset 4000 outside region ");
}

static void test_forged_rendezvous_write_past_region_end_is_refused(void **state)
{
	(void)state;
	/* Large enough for UCX to send it by rendezvous on every transport. */
	forge_write(UCX_MAGIC_WRITE, 0, 0, 1 << 20, 1 << 20, "(4096 bytes)");
}

static void test_forged_write_with_wrapping_offset_is_refused(void **state)
{
	(void)state;
	forge_write(UCX_MAGIC_WRITE, 0, UINT64_MAX - 99, 200, 200, "outside region ");
}

static void test_forged_write_for_unknown_region_is_refused(void **state)
{
	(void)state;
	forge_write(UCX_MAGIC_WRITE, 1, 0, 100, 100, "to unknown region ");
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

/* A write that does not carry the channel's token, eager or by rendezvous,
 * with a header too short to hold one, or with one guessed wrong: it comes
 * from outside the session. It is dropped, memory stays as it was, the
 * load goes on, and a write of the source's lands after it. */
static void test_write_without_the_token_is_dropped(void **state)
{
	(void)state;
	struct forged s;
	forged_open(&s);
	struct ph_host *dh = &s.dst.pair.dst.host;
	size_t sizes[] = {64, 1 << 20};
	uint8_t *data = malloc(1 << 20);
	assert_non_null(data);
	memset(data, 0x5a, 1 << 20);
	for (int i = 0; i < 2; i++) {
		uint8_t header[UCX_WRITE_HEADER_LEN];
		uint64_t len = sizes[i] < 4096 ? sizes[i] : 4096;
		ucx_write_encode(&(struct ucx_write){.token = s.f.dst_token ^ (1ull << (7 * i)),
		                                     .region = s.key.region,
		                                     .len = len},
		                 header);
		forger_send(&s.f, UCX_AM_WRITE, header, sizeof(header), data, len);
		ucx_write_encode(&(struct ucx_write){.token = s.f.dst_token,
		                                     .region = s.key.region,
		                                     .len = sizes[i]},
		                 header);
		forger_send(&s.f, UCX_AM_WRITE, header, sizeof(header) - 1, data, sizes[i]);
	}
	struct lmt_completion c[1];
	assert_int_equal(cfg.plugin->ops.progress(s.dst.pair.dst.inst, c, 1, PH_SECOND / 5), 0);
	assert_int_equal(ph_host_errors(dh), 0);
	PH_REQUIRE(&s.dst.run,
	           ph_all_zero(&s.dst.run, "the region", s.dst.region.mem, s.dst.region.len, 0) &&
	                   ph_region_guards_intact(&s.dst.run, &s.dst.region));
	assert_true(logged_count(dh, DROPPED) > 0);

	/* The source's own write still lands, and is acknowledged. */
	uint8_t header[UCX_WRITE_HEADER_LEN];
	ucx_write_encode(&(struct ucx_write){.token = s.f.dst_token,
	                                     .region = s.key.region,
	                                     .offset = 100,
	                                     .len = 200,
	                                     .slot = 3,
	                                     .generation = 1},
	                 header);
	assert_int_equal(forger_send(&s.f, UCX_AM_WRITE, header, sizeof(header), data, 200),
	                 UCS_OK);
	uint64_t deadline = ph_now() + 5 * PH_SECOND;
	while (!s.f.notes && ph_now() < deadline) {
		ucp_worker_progress(s.f.worker);
		cfg.plugin->ops.progress(s.dst.pair.dst.inst, c, 1, 0);
	}
	assert_int_equal(s.f.notes, 1);
	assert_int_equal(s.f.last.kind, UCX_NOTE_ACK);
	assert_int_equal(s.f.last.token, s.f.token);
	PH_REQUIRE(&s.dst.run, ph_all_zero(&s.dst.run, "before the write", s.dst.region.mem, 100, 0) &&
	                           ph_all_zero(&s.dst.run, "after the write", s.dst.region.mem + 300,
	                                       s.dst.region.len - 300, 300));
	for (size_t i = 100; i < 300; i++)
		assert_int_equal(s.dst.region.mem[i], 0x5a);
	assert_int_equal(ph_host_errors(dh), 0);
	free(data);
	forged_close(&s);
}

/* Messages with an id the destination does not use (0, and 3, the other
 * slot of UCX's handler table), even carrying the token and a valid
 * write: dropped, nothing placed, the load goes on. UCX 1.13 left those
 * slots unset and called whatever they held. */
static void test_messages_of_unused_ids_are_dropped(void **state)
{
	(void)state;
	struct forged s;
	forged_open(&s);
	uint8_t header[UCX_WRITE_HEADER_LEN];
	ucx_write_encode(&(struct ucx_write){.token = s.f.dst_token,
	                                     .region = s.key.region,
	                                     .len = 64},
	                 header);
	uint8_t data[64];
	memset(data, 0x5a, sizeof(data));
	unsigned ids[] = {0, UCX_AM_IDS - 1};
	for (unsigned i = 0; i < 2; i++)
		assert_int_equal(forger_send(&s.f, ids[i], header, sizeof(header), data, 64),
		                 UCS_OK);
	struct lmt_completion c[1];
	assert_int_equal(cfg.plugin->ops.progress(s.dst.pair.dst.inst, c, 1, PH_SECOND / 5), 0);
	assert_int_equal(ph_host_errors(&s.dst.pair.dst.host), 0);
	assert_int_equal(logged_count(&s.dst.pair.dst.host, DROPPED), 2);
	PH_REQUIRE(&s.dst.run,
	           ph_all_zero(&s.dst.run, "the region", s.dst.region.mem, s.dst.region.len, 0) &&
	                   ph_region_guards_intact(&s.dst.run, &s.dst.region));
	forged_close(&s);
}

/* A goodbye without the token does not close the channel. */
static void test_notice_without_the_token_is_ignored(void **state)
{
	(void)state;
	struct forged s;
	forged_open(&s);
	uint8_t header[UCX_NOTE_HEADER_LEN];
	ucx_note_encode(&(struct ucx_note){.kind = UCX_NOTE_BYE, .token = s.f.dst_token + 1},
	                header);
	forger_send(&s.f, UCX_AM_NOTE, header, sizeof(header), NULL, 0);
	struct lmt_completion c[1];
	assert_int_equal(cfg.plugin->ops.progress(s.dst.pair.dst.inst, c, 1, PH_SECOND / 5), 0);
	assert_int_equal(ph_host_errors(&s.dst.pair.dst.host), 0);
	assert_int_equal(logged_count(&s.dst.pair.dst.host, DROPPED), 1);
	/* Not answered: the channel never heard a goodbye. */
	uint64_t deadline = ph_now() + PH_SECOND / 5;
	while (ph_now() < deadline)
		ucp_worker_progress(s.f.worker);
	assert_int_equal(s.f.notes, 0);
	forged_close(&s);
}

/* Region ids come from the CSPRNG: 64-bit, distinct, never 1, 2, 3 ... */
static void test_region_ids_are_random(void **state)
{
	(void)state;
	enum { COUNT = 16 };
	struct ph_run run = {.cfg = &cfg};
	struct ph_pair p;
	struct ph_region r[COUNT] = {{0}};
	uint64_t ids[COUNT];
	bool high = false;
	ph_pair_init(&p, &cfg);
	p.channels = 1;
	PH_REQUIRE(&run, ph_instance_open(&run, &p.dst, LMT_ROLE_DESTINATION, 1, PH_SECOND));
	for (int i = 0; i < COUNT; i++) {
		PH_REQUIRE(&run, ph_region_open(&run, &p, &r[i], 4096));
		struct ucx_key key;
		assert_null(ucx_key_decode(&r[i].key, &key));
		ids[i] = key.region;
		assert_true(ids[i] > (1u << 20));
		high |= ids[i] >> 48 != 0;
		for (int j = 0; j < i; j++)
			assert_true(ids[j] != ids[i]);
		/* An rkey only where the destination takes puts. */
		assert_int_equal(key.rkey_len != 0, putting());
	}
	assert_true(high);
	for (int i = 0; i < COUNT; i++)
		ph_region_close(&p, &r[i]);
	ph_pair_close(&p);
}

static void test_forged_acknowledgement_to_destination_is_refused(void **state)
{
	(void)state;
	struct forged s;
	forged_open(&s);
	uint8_t header[UCX_NOTE_HEADER_LEN];
	ucx_note_encode(&(struct ucx_note){.kind = UCX_NOTE_ACK, .token = s.f.dst_token}, header);
	forger_send(&s.f, UCX_AM_NOTE, header, sizeof(header), NULL, 0);
	refused(&s, "bad notice from the source");
	forged_close(&s);
}

/* The source writes through a key whose region the destination let go:
 * the destination refuses, and the source's write fails. */
static void test_write_to_a_deregistered_region_fails_both_sides(void **state)
{
	(void)state;
	if (putting())
		skip(); /* a put reaches whatever UCX maps; only messages are checked */
	struct ph_run run = {.cfg = &cfg};
	struct ph_pair p;
	struct ph_region region = {0};
	struct ph_source source = {0};
	struct ph_tally tally = {0};
	ph_pair_init(&p, &cfg);
	p.channels = 1;
	PH_REQUIRE(&run, ph_pair_bring_up(&run, &p) && ph_pair_stop_progress(&run, &p) &&
	                         ph_region_open(&run, &p, &region, 1 << 20) &&
	                         ph_source_open(&run, &p, &source, 1 << 20, 17) &&
	                         ph_tally_init(&run, &tally, 2));
	cfg.plugin->ops.mr_deregister(p.dst.inst, region.mr);
	region.mr = NULL;
	tally.allow_failures = true;
	/* One goes eagerly, one by rendezvous; the second may find the
	 * channel down already. */
	assert_int_equal(ph_post_once(&run, &p, &tally, 0, &source, source.mem, &region, 0, 100),
	                 0);
	int rc = ph_post_once(&run, &p, &tally, 0, &source, source.mem, &region, 0, 1 << 20);
	if (rc)
		assert_int_equal(rc, -LMT_EPROTO);
	struct lmt_completion c[1];
	assert_int_equal(cfg.plugin->ops.progress(p.dst.inst, c, 1, 5 * PH_SECOND), -LMT_EPROTO);
	PH_ASSERT_FIRST_ERROR(&p.dst.host, LMT_EPROTO, "to unknown region ");
	assert_int_equal(ph_harvest_until_error(&run, &p, &tally, 10 * PH_SECOND), -LMT_EPROTO);
	PH_REQUIRE(&run, !run.failed);
	assert_int_equal(tally.done, tally.posted);
	assert_int_equal(tally.failed, tally.posted);
	PH_REQUIRE(&run, ph_all_zero(&run, "the region", region.mem, region.len, 0) &&
	                         ph_region_guards_intact(&run, &region));
	ph_tally_fini(&tally);
	ph_source_close(&p, &source);
	ph_region_close(&p, &region);
	ph_pair_close(&p);
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
	struct ph_run run = {.cfg = &cfg};
	struct ph_pair p;
	struct ph_loss loss;
	ph_pair_init(&p, &cfg);
	p.channels = 2;
	PH_REQUIRE(&run, ph_lose_destination_mid_stream(&run, &p, &loss));
	assert_int_equal(loss.progress_rc, -LMT_ECONN);
	if (loss.write_rc)
		assert_int_equal(loss.write_rc, -LMT_ECONN);
	assert_true(loss.posted >= 64);
	assert_int_equal(loss.first_code, LMT_ECONN);
	assert_non_null(strstr(loss.first_error, "ucx channel"));
}

/* The same, with the destination's channels answering the source's
 * goodbye only after 700 ms (ucx.test-bye-delay), as threads without a
 * core for that long on a loaded host: the source closes its endpoints by
 * force while the destination still runs, and must neither crash nor
 * report anything but LMT_ECONN. */
static void test_a_goodbye_answered_late_is_no_crash(void **state)
{
	(void)state;
	if (putting())
		skip(); /* as above */
	struct ph_run run = {.cfg = &cfg};
	struct ph_pair p;
	struct ph_loss loss;
	ph_pair_init(&p, &cfg);
	p.channels = 2;
	struct lmt_error err = {0};
	if (ph_host_set_options(&p.dst.host, "ucx.test-bye-delay=700ms", &err))
		fail_msg("ucx.test-bye-delay: %s", err.message);
	PH_REQUIRE(&run, ph_lose_destination_mid_stream(&run, &p, &loss));
	assert_int_equal(loss.progress_rc, -LMT_ECONN);
	if (loss.write_rc)
		assert_int_equal(loss.write_rc, -LMT_ECONN);
	assert_int_equal(loss.first_code, LMT_ECONN);
}

/* ---- Tests: pacing --------------------------------------------------------- */

/* Over tcp a source channel hands UCX at most about 1 MiB unsent, so that
 * one progress call does not run for tens of milliseconds (docs/ucx.md,
 * "The iterate budget over tcp"); over shared memory it is not held back.
 * That every write still lands, larger ones too, is lmt-plugin-check's
 * "writes of many sizes" and "a write of chunk-size" (check-ucx-tcp). */
static void test_source_holds_posting_back_over_tcp_only(void **state)
{
	(void)state;
	struct ph_run run = {.cfg = &cfg};
	struct ph_pair p;
	ph_pair_init(&p, &cfg);
	p.channels = 2;
	PH_REQUIRE(&run, ph_pair_bring_up(&run, &p));
	int held = logged_count(&p.src.host, "bulk data over tcp, posting held to 1024 KiB unsent");
	int held_dst = logged_count(&p.dst.host, "posting held");
	ph_pair_close(&p);
	assert_int_equal(held, strcmp(tls, "tcp") == 0 ? 2 : 0);
	assert_int_equal(held_dst, 0);
}

static void test_orderly_close_by_source_is_no_error(void **state)
{
	(void)state;
	struct ph_run run = {.cfg = &cfg};
	struct ph_pair p;
	ph_pair_init(&p, &cfg);
	p.channels = 2;
	PH_REQUIRE(&run, ph_orderly_close(&run, &p, LMT_ROLE_SOURCE));
}

static void test_orderly_close_by_destination_is_no_error(void **state)
{
	(void)state;
	struct ph_run run = {.cfg = &cfg};
	struct ph_pair p;
	ph_pair_init(&p, &cfg);
	p.channels = 2;
	PH_REQUIRE(&run, ph_orderly_close(&run, &p, LMT_ROLE_DESTINATION));
}

/* ---- Main ---------------------------------------------------------------- */

int main(int argc, char **argv)
{
	if (getenv("LMT_TEST_UCX_TLS"))
		tls = getenv("LMT_TEST_UCX_TLS");
	if (getenv("LMT_TEST_UCX_TRANSFER"))
		transfer = getenv("LMT_TEST_UCX_TRANSFER");
	char options[128];
	snprintf(options, sizeof(options), "ucx.tls=%s,ucx.transfer=%s", tls, transfer);
	if (ph_test_load(&cfg, "LMT_TEST_UCX_PLUGIN", argc, argv, options))
		return 2;
	if (getenv("LMT_TEST_FILTER"))
		cmocka_set_test_filter(getenv("LMT_TEST_FILTER"));
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_descriptor_claims_channels_only),
	        cmocka_unit_test(test_unknown_transport_fails_with_ucx_reason),
	        cmocka_unit_test(test_plus_separated_transports_reach_ucx),
	        cmocka_unit_test(test_overlong_transport_list_is_refused),
	        cmocka_unit_test(test_unknown_device_fails_with_ucx_reason),
	        cmocka_unit_test(test_key_blob_with_a_bad_field_is_refused),
	        cmocka_unit_test(test_address_blob_with_a_bad_field_is_refused),
	        cmocka_unit_test(test_forged_write_past_region_end_is_refused),
	        cmocka_unit_test(test_forged_rendezvous_write_past_region_end_is_refused),
	        cmocka_unit_test(test_forged_write_with_wrapping_offset_is_refused),
	        cmocka_unit_test(test_forged_write_for_unknown_region_is_refused),
	        cmocka_unit_test(test_forged_write_with_bad_magic_is_refused),
	        cmocka_unit_test(test_forged_write_longer_than_its_header_says_is_refused),
	        cmocka_unit_test(test_write_without_the_token_is_dropped),
	        cmocka_unit_test(test_notice_without_the_token_is_ignored),
	        cmocka_unit_test(test_messages_of_unused_ids_are_dropped),
	        cmocka_unit_test(test_region_ids_are_random),
	        cmocka_unit_test(test_forged_acknowledgement_to_destination_is_refused),
	        cmocka_unit_test(test_write_to_a_deregistered_region_fails_both_sides),
	        cmocka_unit_test(test_destination_close_mid_stream_gives_source_econn),
	        cmocka_unit_test(test_a_goodbye_answered_late_is_no_crash),
	        cmocka_unit_test(test_source_holds_posting_back_over_tcp_only),
	        cmocka_unit_test(test_orderly_close_by_source_is_no_error),
	        cmocka_unit_test(test_orderly_close_by_destination_is_no_error),
	};
	int failed = cmocka_run_group_tests(tests, NULL, NULL);
	ph_unload(&cfg);
	return failed;
}
