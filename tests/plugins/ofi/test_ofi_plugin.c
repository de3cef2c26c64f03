/* The ofi plugin's own tests, through the plugin ABI on the plugin test
 * harness: provider, domain and mode selection; writes under each
 * registration mode, fence completion, polled completion queues and
 * coalescing, over tcp, shm and lmtfake, a test provider (fake_provider.c)
 * that demands each FI_MR_* mode and can withhold delivery completion, hold
 * writes or refuse the first keys requested; random keys; an environment
 * left alone; the fields of its key and address blobs; failures the
 * provider reports; the destination's wait for the source's greeting at
 * close. What every plugin must do is lmt-plugin-check's (check-ofi-tcp,
 * check-ofi-shm). */
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
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <lmt/plugin.h>
#include <rdma/fabric.h>

#include "plugin_test.h"
#include "wire.h"

#define MR_ALL                                                                                     \
	(FI_MR_LOCAL | FI_MR_RAW | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY |            \
	 FI_MR_ENDPOINT)

static struct ph_config cfg;

/* ---- Variants: a provider and what it is asked for -------------------------- */

struct variant {
	const char *provider;
	const char *completion; /* ofi.completion; NULL = the default */
	const char *mr_mode;    /* ofi.mr-mode; NULL = the default */
	const char *coalesce;   /* ofi.coalesce; NULL = the default */
	unsigned fake_mr_mode;  /* lmtfake: the modes it requires */
	int fake_no_delivery;   /* lmtfake: no FI_DELIVERY_COMPLETE */
	int fake_no_wait;       /* lmtfake: no CQ wait objects */
	int fake_hold;          /* lmtfake: successful writes never complete */
	int fake_taken;         /* lmtfake: requested keys refused (FI_ENOKEY) first */
	int fake_messages;      /* lmtfake: claims FI_MSG */
};

static const struct variant tcp = {.provider = "tcp"};
static const struct variant tcp_fence = {.provider = "tcp", .completion = "fence"};
static const struct variant tcp_local = {.provider = "tcp", .mr_mode = "local"};
static const struct variant shm = {.provider = "shm"};
static const struct variant shm_offsets = {.provider = "shm", .mr_mode = "local+prov_key"};
static const struct variant shm_apart = {.provider = "shm", .coalesce = "off"};
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
static const struct variant fake_held_coalesced = {
        .provider = "lmtfake", .fake_hold = 1, .coalesce = "on"};
static const struct variant fake_taken = {.provider = "lmtfake", .fake_taken = 3};
static const struct variant fake_fence_coalesced = {
        .provider = "lmtfake", .fake_no_delivery = 1, .coalesce = "on"};

/* What lmtfake is to require; it reads this when libfabric asks it. */
static void use_variant(const struct variant *v)
{
	char mode[32];
	snprintf(mode, sizeof(mode), "0x%x", v->fake_mr_mode);
	setenv("LMT_FAKE_MR_MODE", mode, 1);
	setenv("LMT_FAKE_NO_DELIVERY", v->fake_no_delivery ? "1" : "0", 1);
	setenv("LMT_FAKE_NO_WAIT", v->fake_no_wait ? "1" : "0", 1);
	setenv("LMT_FAKE_HOLD", v->fake_hold ? "1" : "0", 1);
	snprintf(mode, sizeof(mode), "%d", v->fake_taken);
	setenv("LMT_FAKE_TAKEN_KEYS", mode, 1);
	setenv("LMT_FAKE_MESSAGES", v->fake_messages ? "1" : "0", 1);
}

/* Give `host` the variant's option values, and `more` ("key=value,...")
 * over them. */
static void host_variant(struct ph_host *host, const struct variant *v, const char *more)
{
	char list[512];
	int n = snprintf(list, sizeof(list), "ofi.provider=%s", v->provider);
	if (v->completion)
		n += snprintf(list + n, sizeof(list) - (size_t)n, ",ofi.completion=%s",
		              v->completion);
	if (v->mr_mode)
		n += snprintf(list + n, sizeof(list) - (size_t)n, ",ofi.mr-mode=%s", v->mr_mode);
	if (v->coalesce)
		n += snprintf(list + n, sizeof(list) - (size_t)n, ",ofi.coalesce=%s", v->coalesce);
	if (more)
		snprintf(list + n, sizeof(list) - (size_t)n, ",%s", more);
	struct lmt_error err = {0};
	if (ph_host_set_options(host, list, &err))
		fail_msg("%s: %s", list, err.message);
}

/* One instance on its own under `v` (and `more`): instance_open's result.
 * The host stays readable until side_close. */
static int side_open(struct ph_side *side, const struct variant *v, const char *more,
                     enum lmt_role role, uint32_t channels)
{
	memset(side, 0, sizeof(*side));
	ph_host_init(&side->host, &cfg, role == LMT_ROLE_SOURCE ? "source" : "destination");
	use_variant(v);
	host_variant(&side->host, v, more);
	struct lmt_instance_params params = {.struct_size = sizeof(params),
	                                     .role = role,
	                                     .channels = channels,
	                                     .timeout_ns = 5 * PH_SECOND};
	snprintf(params.local_host, sizeof(params.local_host), "127.0.0.1");
	snprintf(params.peer_host, sizeof(params.peer_host), "127.0.0.1");
	int rc = cfg.plugin->ops.instance_open(&ph_host_services, &side->host, &params, &side->inst);
	if (rc)
		assert_null(side->inst);
	else
		assert_non_null(side->inst);
	return rc;
}

static void side_close(struct ph_side *side)
{
	if (side->inst)
		cfg.plugin->ops.instance_close(side->inst);
	side->inst = NULL;
	ph_host_fini(&side->host);
}

/* Both instances of a pair under `v`, `channels` channels, nothing open. */
static void pair_open(struct ph_run *run, struct ph_pair *p, const struct variant *v,
                      uint32_t channels)
{
	*run = (struct ph_run){.cfg = &cfg};
	ph_pair_init(p, &cfg);
	p->channels = channels;
	use_variant(v);
	host_variant(&p->src.host, v, NULL);
	host_variant(&p->dst.host, v, NULL);
	PH_REQUIRE(run, ph_pair_open_instances(run, p, 5 * PH_SECOND));
}

/* A pair under `v` with every channel connected (the source's greeting
 * landed) and the destination progressing, as the core runs it. */
static void pair_up(struct ph_run *run, struct ph_pair *p, const struct variant *v,
                    uint32_t channels)
{
	*run = (struct ph_run){.cfg = &cfg};
	ph_pair_init(p, &cfg);
	p->channels = channels;
	use_variant(v);
	host_variant(&p->src.host, v, NULL);
	host_variant(&p->dst.host, v, NULL);
	PH_REQUIRE(run, ph_pair_bring_up(run, p));
}

/* The first error `host` recorded contains `text`. */
static void first_error_has(struct ph_host *host, const char *text)
{
	char said[512];
	ph_host_first_error(host, said, sizeof(said));
	if (!strstr(said, text))
		fail_msg("the %s's first error '%s' lacks '%s'", host->role, said, text);
}

/* ---- Tests: what ofi claims, and choosing provider, domain and modes --------- */

static void test_descriptor_claims_registration_pinning_channels_and_merged_runs(void **state)
{
	(void)state;
	assert_string_equal(cfg.plugin->name, "ofi");
	assert_int_equal(cfg.plugin->caps, LMT_CAP_LOCAL_MR | LMT_CAP_PIN | LMT_CAP_MULTI_CHANNEL |
	                                           LMT_CAP_TARGET_PROGRESS | LMT_CAP_MERGES_RUNS);
}

static void test_unknown_provider_error_lists_those_available(void **state)
{
	(void)state;
	struct ph_side s;
	assert_int_equal(side_open(&s, &(struct variant){.provider = "nosuch"}, NULL,
	                           LMT_ROLE_SOURCE, 1),
	                 -LMT_ENOTFOUND);
	PH_ASSERT_FIRST_ERROR(&s.host, LMT_ENOTFOUND,
	                      "ofi.provider=nosuch: not available; providers: ");
	first_error_has(&s.host, "net");
	first_error_has(&s.host, "shm");
	first_error_has(&s.host, "lmtfake");
	side_close(&s);
}

/* libfabric 1.17's tcp offers RDM only layered under ofi_rxm, which the
 * plugin refuses: ofi.provider=tcp takes net, its native RDM over TCP. */
static void test_tcp_is_taken_as_its_native_rdm_provider(void **state)
{
	(void)state;
	struct ph_side s;
	assert_int_equal(side_open(&s, &tcp, NULL, LMT_ROLE_DESTINATION, 1), 0);
	assert_int_equal(cfg.plugin->ops.ep_open(s.inst, 0, &s.ep[0], &s.addr[0]), 0);
	struct lfi_addr a;
	assert_null(lfi_addr_decode(&s.addr[0], &a));
	assert_string_equal(a.prov_name, "net");
	side_close(&s);
}

/* ofi_rxm keeps every message nobody asked for, without bound: a stranger
 * who reaches the endpoint would grow the process as long as it sends. */
static void test_an_ofi_rxm_layering_is_refused_with_the_reason(void **state)
{
	(void)state;
	struct ph_side s;
	assert_int_equal(side_open(&s, &(struct variant){.provider = "tcp;ofi_rxm"}, NULL,
	                           LMT_ROLE_DESTINATION, 1),
	                 -LMT_ENOTSUP);
	PH_ASSERT_FIRST_ERROR(&s.host, LMT_ENOTSUP,
	                      "ofi.provider=tcp;ofi_rxm: provider tcp;ofi_rxm refused: it keeps "
	                      "every message a peer sends that no receive matches");
	side_close(&s);
}

/* A provider that takes messages, and whose handling of them lmt has not
 * measured, is refused; the same one without messages is taken. */
static void test_a_provider_taking_messages_unmeasured_is_refused(void **state)
{
	(void)state;
	struct ph_side s;
	assert_int_equal(side_open(&s, &(struct variant){.provider = "lmtfake", .fake_messages = 1},
	                           NULL, LMT_ROLE_SOURCE, 1),
	                 -LMT_ENOTSUP);
	PH_ASSERT_FIRST_ERROR(&s.host, LMT_ENOTSUP,
	                      "ofi.provider=lmtfake: provider lmtfake refused: it takes messages "
	                      "from any peer");
	side_close(&s);
	assert_int_equal(side_open(&s, &fake, NULL, LMT_ROLE_SOURCE, 1), 0);
	side_close(&s);
}

/* The environment is the VMM's: the plugin sets nothing there, not even
 * a libfabric parameter the VMM left unset. Run alone, in a process where
 * the libfabric parameters the tests set are unset (see main). */
static void test_plugin_leaves_the_environment_alone(void **state)
{
	(void)state;
	struct ph_side s;
	assert_int_equal(side_open(&s, &tcp, NULL, LMT_ROLE_SOURCE, 1), 0);
	assert_null(getenv("FI_OFI_RXM_MSG_RX_SIZE"));
	assert_null(getenv("FI_OFI_RXM_BUFFER_SIZE"));
	side_close(&s);
}

static void test_unknown_domain_error_lists_domains(void **state)
{
	(void)state;
	struct ph_side s;
	assert_int_equal(side_open(&s, &tcp, "ofi.domain=nosuch0", LMT_ROLE_DESTINATION, 1),
	                 -LMT_ENOTFOUND);
	PH_ASSERT_FIRST_ERROR(&s.host, LMT_ENOTFOUND,
	                      "ofi.domain=nosuch0: not available with provider tcp; domains: ");
	first_error_has(&s.host, "lo");
	side_close(&s);
}

static void test_domain_option_picks_the_domain(void **state)
{
	(void)state;
	struct ph_side s;
	assert_int_equal(side_open(&s, &tcp, "ofi.domain=lo", LMT_ROLE_SOURCE, 1), 0);
	assert_int_equal(ph_host_errors(&s.host), 0);
	side_close(&s);
}

static void test_bad_mr_mode_option_is_rejected(void **state)
{
	(void)state;
	struct ph_side s;
	assert_int_equal(side_open(&s, &(struct variant){.provider = "tcp", .mr_mode = "local+bogus"},
	                           NULL, LMT_ROLE_SOURCE, 1),
	                 -LMT_EINVAL);
	PH_ASSERT_FIRST_ERROR(&s.host, LMT_EINVAL, "ofi.mr-mode: unknown mode 'bogus'");
	side_close(&s);
}

static void test_delivery_completion_demanded_but_missing_is_refused(void **state)
{
	(void)state;
	struct ph_side s;
	assert_int_equal(side_open(&s,
	                           &(struct variant){.provider = "lmtfake",
	                                             .completion = "delivery",
	                                             .fake_no_delivery = 1},
	                           NULL, LMT_ROLE_SOURCE, 1),
	                 -LMT_ENOTSUP);
	PH_ASSERT_FIRST_ERROR(&s.host, LMT_ENOTSUP, "no FI_DELIVERY_COMPLETE");
	side_close(&s);
}

static void test_required_mode_not_offered_is_refused(void **state)
{
	(void)state;
	struct ph_side s;
	/* The provider needs FI_MR_RAW; the option offers everything else. */
	assert_int_equal(side_open(&s,
	                           &(struct variant){.provider = "lmtfake",
	                                             .fake_mr_mode = FI_MR_RAW,
	                                             .mr_mode = "local+virt_addr+prov_key+endpoint"},
	                           NULL, LMT_ROLE_SOURCE, 1),
	                 -LMT_ENOTSUP);
	first_error_has(&s.host, "lmtfake");
	side_close(&s);
}

static void test_coalescing_without_delivery_completion_is_refused(void **state)
{
	(void)state;
	struct ph_side s;
	assert_int_equal(side_open(&s, &fake_fence_coalesced, NULL, LMT_ROLE_SOURCE, 1),
	                 -LMT_EINVAL);
	PH_ASSERT_FIRST_ERROR(&s.host, LMT_EINVAL, "ofi.coalesce=on needs delivery completion");
	side_close(&s);
}

/* ---- Tests: writes under each mode -------------------------------------------- */

/* Sizes across the providers' protocol switches, 0 included. */
static const size_t piece_sizes[] = {
        1,       7,     0,          512,     4096,          4099,
        65536,   65537, 262144 + 3, 1 << 20, (1 << 20) + 1, 3 << 20,
        8 << 20, 100,   4095,       2 << 20,
};
#define PIECES (sizeof(piece_sizes) / sizeof(piece_sizes[0]))
#define BURST 2048u

/* The registration mode, completion mode (fences without delivery
 * completion), coalescing and completion queue the variant makes the plugin
 * use carry writes of every size over two channels: after a flush and
 * before any harvest the region holds them and nothing else is touched;
 * then a burst of small writes, harvested only when the queue is full. Each
 * write completes once, visible when reported (the harness's tally). */
static void test_writes_land_under_the_mode(void **state)
{
	struct ph_run run;
	struct ph_pair p;
	struct ph_region region = {0};
	struct ph_source source = {0};
	struct ph_tally tally = {0};
	size_t total = 13;
	for (size_t i = 0; i < PIECES; i++)
		total += piece_sizes[i];
	pair_up(&run, &p, *state, 2);
	PH_REQUIRE(&run, ph_region_open(&run, &p, &region, total) &&
	                         ph_source_open(&run, &p, &source, total, 2) &&
	                         ph_tally_init(&run, &tally, PIECES + BURST));
	uint64_t offset = 13;
	for (size_t i = 0; i < PIECES; i++) {
		PH_REQUIRE(&run, ph_post(&run, &p, &tally, (uint32_t)(i % 2), &source,
		                         source.mem + offset, &region, offset, piece_sizes[i]));
		offset += piece_sizes[i];
	}
	char d[640];
	int rc = cfg.plugin->ops.flush(p.src.inst, 20 * PH_SECOND);
	if (rc)
		fail_msg("flush: %s", ph_describe(&p.src.host, rc, d, sizeof(d)));
	PH_REQUIRE(&run, ph_same(&run, "after flush", region.mem + 13, source.mem + 13, total - 13,
	                         13) &&
	                         ph_all_zero(&run, "before the first write", region.mem, 13, 0) &&
	                         ph_region_guards_intact(&run, &region) &&
	                         ph_harvest_all(&run, &p, &tally));
	ph_fill(source.mem, (size_t)BURST * 512, 3);
	for (uint64_t i = 0; i < BURST; i++)
		PH_REQUIRE(&run, ph_post(&run, &p, &tally, (uint32_t)(i % 2), &source,
		                         source.mem + i * 512, &region, i * 512, 512));
	PH_REQUIRE(&run, ph_harvest_all(&run, &p, &tally) && ph_pair_stop_progress(&run, &p) &&
	                         ph_pair_quiet(&run, &p));
	ph_tally_fini(&tally);
	ph_source_close(&p, &source);
	ph_region_close(&p, &region);
	ph_pair_close(&p);
}

/* Writes that follow each other on one channel are merged while the
 * channel has 1 MiB in flight (ofi.coalesce): each is still reported once,
 * and lands. */
static void test_contiguous_writes_merge_and_complete_once(void **state)
{
	enum { WRITES = 1024, SIZE = 64 << 10 };
	struct ph_run run;
	struct ph_pair p;
	struct ph_region region = {0};
	struct ph_source source = {0};
	struct ph_tally tally = {0};
	pair_up(&run, &p, *state, 1);
	PH_REQUIRE(&run, ph_region_open(&run, &p, &region, (size_t)WRITES * SIZE) &&
	                         ph_source_open(&run, &p, &source, region.len, 7) &&
	                         ph_tally_init(&run, &tally, WRITES));
	for (uint64_t i = 0; i < WRITES; i++)
		PH_REQUIRE(&run, ph_post(&run, &p, &tally, 0, &source, source.mem + i * SIZE,
		                         &region, i * SIZE, SIZE));
	PH_REQUIRE(&run, ph_harvest_all(&run, &p, &tally) &&
	                         ph_same(&run, "the region", region.mem, source.mem, region.len, 0) &&
	                         ph_pair_stop_progress(&run, &p) && ph_pair_quiet(&run, &p));
	/* The channel says, as it closes, how many transfers carried them. */
	cfg.plugin->ops.ep_close(p.src.ep[0]);
	p.src.ep[0] = NULL;
	static char log[1 << 16];
	ph_host_log(&p.src.host, log, sizeof(log));
	unsigned long long writes = 0, transfers = 0;
	const char *said = strstr(log, "ofi channel 0: ");
	while (said && sscanf(said, "ofi channel 0: %llu writes coalesced into %llu transfers",
	                      &writes, &transfers) != 2)
		said = strstr(said + 1, "ofi channel 0: ");
	assert_int_equal(writes, WRITES);
	assert_true(transfers >= 1 && transfers < WRITES / 4);
	ph_tally_fini(&tally);
	ph_source_close(&p, &source);
	ph_region_close(&p, &region);
	ph_pair_close(&p);
}

static void test_unregistered_source_is_refused_when_the_provider_needs_it(void **state)
{
	struct ph_run run;
	struct ph_pair p;
	struct ph_region region = {0};
	struct ph_source source = {0};
	pair_up(&run, &p, *state, 1);
	PH_REQUIRE(&run, ph_region_open(&run, &p, &region, 8192) &&
	                         ph_source_open(&run, &p, &source, 8192, 4));
	assert_non_null(source.mr);
	assert_int_equal(cfg.plugin->ops.write(p.src.ep[0], source.mem, 64, NULL, region.rkey, 0, 1),
	                 -LMT_EINVAL);
	PH_ASSERT_ERROR(&p.src.host, LMT_EINVAL, "FI_MR_LOCAL");
	/* Inside the registration, but running past its end. */
	assert_int_equal(cfg.plugin->ops.write(p.src.ep[0], source.mem + 8000, 193, source.mr,
	                                       region.rkey, 0, 2),
	                 -LMT_EINVAL);
	PH_REQUIRE(&run, ph_pair_stop_progress(&run, &p));
	ph_source_close(&p, &source);
	ph_region_close(&p, &region);
	ph_pair_close(&p);
}

static void test_registration_needs_open_channels_with_endpoint_mode(void **state)
{
	(void)state;
	struct ph_side s;
	assert_int_equal(side_open(&s, &fake_endpoint, NULL, LMT_ROLE_DESTINATION, 2), 0);
	uint8_t *mem = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	assert_true(mem != MAP_FAILED);
	lmt_mr *mr = NULL;
	struct lmt_blob key;
	assert_int_equal(cfg.plugin->ops.mr_register(s.inst, mem, 4096, LMT_MR_REMOTE_WRITE, &mr,
	                                             &key),
	                 -LMT_ESTATE);
	PH_ASSERT_ERROR(&s.host, LMT_ESTATE, "FI_MR_ENDPOINT");
	side_close(&s);
	munmap(mem, 4096);
}

/* ---- Tests: blobs with a bad field (see check-ofi-* for malformed ones) ----- */

static void expect_bad_key(struct ph_pair *p, const struct lmt_blob *b)
{
	lmt_rkey *rkey = NULL;
	assert_int_equal(cfg.plugin->ops.rkey_import(p->src.inst, b, &rkey), -LMT_EPROTO);
	assert_null(rkey);
	PH_ASSERT_ERROR(&p->src.host, LMT_EPROTO, "key blob");
}

static void test_key_blob_with_a_bad_field_is_refused(void **state)
{
	struct ph_run run;
	struct ph_pair p;
	struct ph_region region = {0};
	pair_up(&run, &p, *state, 1);
	PH_REQUIRE(&run, ph_pair_stop_progress(&run, &p) &&
	                         ph_region_open(&run, &p, &region, 4096));
	struct lmt_blob b;
#define BAD_KEY(edit)                                                                              \
	do {                                                                                       \
		b = region.key;                                                                    \
		edit;                                                                              \
		expect_bad_key(&p, &b);                                                            \
	} while (0)
	BAD_KEY(b.data[0] ^= 1);              /* magic */
	BAD_KEY(b.data[4] = 9);               /* version */
	BAD_KEY(b.data[6] |= 0x80);           /* unknown flag */
	BAD_KEY(b.data[6] ^= LFI_KEY_VIRT);   /* other addressing than ours */
	BAD_KEY(b.data[7] = 0);               /* no key */
	BAD_KEY(b.data[7] = 2);               /* two keys without FI_MR_ENDPOINT */
	BAD_KEY(memset(b.data + 16, 0, 8));   /* empty region */
	BAD_KEY(memset(b.data + 8, 0xff, 8)); /* base that wraps (or without VIRT) */
#undef BAD_KEY
	ph_region_close(&p, &region);
	ph_pair_close(&p);
}

/* Without FI_MR_PROV_KEY the keys are lmt's: drawn from getrandom over the
 * provider's 8-byte key size, distinct, and never the 1, 2, 3 ... an
 * attacker tries first. The fence regions' keys in the address blobs too. */
static void test_requested_keys_are_random(void **state)
{
	enum { COUNT = 12 };
	struct ph_run run;
	struct ph_pair p;
	struct ph_region r[COUNT] = {{0}};
	uint64_t keys[COUNT + 2];
	bool high = false;
	pair_up(&run, &p, *state, 2);
	PH_REQUIRE(&run, ph_pair_stop_progress(&run, &p));
	for (int i = 0; i < COUNT; i++) {
		PH_REQUIRE(&run, ph_region_open(&run, &p, &r[i], 4096));
		struct lfi_key_blob k;
		assert_null(lfi_key_decode(&r[i].key, &k));
		assert_int_equal(k.count, 1);
		keys[i] = k.keys[0].key;
	}
	for (int c = 0; c < 2; c++) {
		struct lfi_addr a;
		assert_null(lfi_addr_decode(&p.dst.addr[c], &a));
		keys[COUNT + c] = a.fence_key.key;
	}
	for (int i = 0; i < COUNT + 2; i++) {
		assert_true(keys[i] > (1u << 20));
		high |= keys[i] >> 48 != 0;
		for (int j = 0; j < i; j++)
			assert_true(keys[i] != keys[j]);
	}
	assert_true(high);
	for (int i = 0; i < COUNT; i++)
		ph_region_close(&p, &r[i]);
	ph_pair_close(&p);
}

static void test_forged_raw_key_is_refused(void **state)
{
	(void)state;
	struct ph_run run;
	struct ph_pair p;
	struct ph_region region = {0};
	pair_up(&run, &p, &fake_raw, 1);
	PH_REQUIRE(&run, ph_pair_stop_progress(&run, &p) &&
	                         ph_region_open(&run, &p, &region, 4096));
	struct lmt_blob b = region.key;
	struct lfi_key_blob k;
	assert_null(lfi_key_decode(&b, &k));
	assert_int_equal(k.flags, LFI_KEY_RAW);
	assert_int_equal(k.keys[0].raw_len, 24);
	b.data[LFI_KEY_HEADER_LEN + 10 + 3] ^= 0x10; /* a bit of the raw key */
	expect_bad_key(&p, &b);
	first_error_has(&p.src.host, "fi_mr_map_raw");
	b = region.key;
	b.data[LFI_KEY_HEADER_LEN] = 0; /* raw length 0 */
	b.data[LFI_KEY_HEADER_LEN + 1] = 0;
	expect_bad_key(&p, &b);
	ph_region_close(&p, &region);
	ph_pair_close(&p);
}

static void test_address_blob_with_a_bad_field_is_refused(void **state)
{
	struct ph_run run;
	struct ph_pair p;
	pair_open(&run, &p, *state, 2);
	PH_REQUIRE(&run, ph_pair_open_endpoints(&run, &p));
	const struct lmt_blob *daddr = &p.dst.addr[0];
	struct lfi_addr a;
	assert_null(lfi_addr_decode(daddr, &a));
	size_t name_at = LFI_ADDR_HEADER_LEN + strlen(a.prov_name);
	struct lmt_blob b;
#define BAD_ADDR(edit)                                                                             \
	do {                                                                                       \
		b = *daddr;                                                                        \
		edit;                                                                              \
		assert_int_equal(cfg.plugin->ops.ep_connect(p.src.ep[0], &b), -LMT_EPROTO);        \
		PH_ASSERT_ERROR(&p.src.host, LMT_EPROTO, "address blob");                          \
	} while (0)
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
	/* The destination names the side a blob of the wrong one came from. */
	assert_int_equal(cfg.plugin->ops.ep_connect(p.dst.ep[0], daddr), -LMT_EPROTO);
	PH_ASSERT_ERROR(&p.dst.host, LMT_EPROTO, "bad address blob from the source");
	ph_pair_close(&p);
}

static void test_another_provider_on_the_peer_is_a_mismatch(void **state)
{
	(void)state;
	struct ph_side dst, src;
	assert_int_equal(side_open(&dst, &tcp, NULL, LMT_ROLE_DESTINATION, 1), 0);
	assert_int_equal(side_open(&src, &fake, NULL, LMT_ROLE_SOURCE, 1), 0);
	assert_int_equal(cfg.plugin->ops.ep_open(src.inst, 0, &src.ep[0], &src.addr[0]), 0);
	assert_int_equal(cfg.plugin->ops.ep_open(dst.inst, 0, &dst.ep[0], &dst.addr[0]), 0);
	struct lfi_addr a;
	assert_null(lfi_addr_decode(&dst.addr[0], &a));
	/* Same format as lmtfake's, so that only the provider differs. */
	struct lmt_blob b;
	a.addr_format = FI_FORMAT_UNSPEC;
	a.name_len = 16;
	assert_int_equal(lfi_addr_encode(&a, &b), 0);
	assert_int_equal(cfg.plugin->ops.ep_connect(src.ep[0], &b), -LMT_EMISMATCH);
	PH_ASSERT_ERROR(&src.host, LMT_EMISMATCH,
	                "the destination uses provider net, this side lmtfake");
	side_close(&dst);
	side_close(&src);
}

/* ---- Tests: failures the provider reports ----------------------------------- */

static void test_remote_error_carries_the_provider_text(void **state)
{
	(void)state;
	struct ph_run run;
	struct ph_pair p;
	struct ph_region region = {0};
	struct ph_source source = {0};
	struct ph_tally tally = {0};
	pair_up(&run, &p, &fake, 2);
	PH_REQUIRE(&run, ph_pair_stop_progress(&run, &p) &&
	                         ph_region_open(&run, &p, &region, 4096) &&
	                         ph_source_open(&run, &p, &source, 4096, 8) &&
	                         ph_tally_init(&run, &tally, 2) &&
	                         ph_post(&run, &p, &tally, 0, &source, source.mem, &region, 0, 64));
	assert_int_equal(cfg.plugin->ops.flush(p.src.inst, PH_SECOND), 0);
	/* The destination deregisters; the next write meets a dead key. */
	cfg.plugin->ops.mr_deregister(p.dst.inst, region.mr);
	region.mr = NULL;
	tally.allow_failures = true;
	PH_REQUIRE(&run, ph_post(&run, &p, &tally, 1, &source, source.mem + 64, &region, 64, 64) &&
	                         ph_harvest_all(&run, &p, &tally));
	assert_int_equal(tally.failed, 1);
	assert_int_equal(cfg.plugin->ops.progress(p.src.inst, NULL, 0, 0), -LMT_EIO);
	PH_ASSERT_FIRST_ERROR(&p.src.host, LMT_EIO, "ofi channel 1: write failed: ");
	first_error_has(&p.src.host, "lmtfake: key 0x");
	first_error_has(&p.src.host, "is not registered at the target");
	/* The session is over: no more writes. */
	assert_int_equal(cfg.plugin->ops.write(p.src.ep[0], source.mem, 8, source.mr, region.rkey,
	                                       0, 2),
	                 -LMT_EIO);
	assert_int_equal(cfg.plugin->ops.flush(p.src.inst, PH_SECOND), -LMT_EIO);
	ph_tally_fini(&tally);
	ph_source_close(&p, &source);
	ph_region_close(&p, &region);
	ph_pair_close(&p);
}

/* lmtfake holds successful writes; one that fails ends the session, and
 * the held ones must be reported failed too, each once (the tally). Of
 * `channels` channels, write i, of `size` bytes, goes to channel
 * i % writers, at offset i * stride; the failing one to the last channel.
 * Nothing here depends on when a channel's thread runs. */
static void held_writes_fail_once(const struct variant *v, uint32_t channels, uint32_t writers,
                                  size_t size, size_t stride)
{
	enum { HELD = 200 };
	struct ph_run run;
	struct ph_pair p;
	struct ph_region region = {0}, bad = {0};
	struct ph_source source = {0};
	struct ph_tally tally = {0};
	size_t len = HELD * stride + size < 4096 ? 4096 : HELD * stride + size;
	pair_up(&run, &p, v, channels);
	PH_REQUIRE(&run, ph_pair_stop_progress(&run, &p) &&
	                         ph_region_open(&run, &p, &region, len) &&
	                         ph_source_open(&run, &p, &source, len, 9) &&
	                         ph_tally_init(&run, &tally, HELD + 1));
	tally.allow_failures = true;
	for (uint64_t i = 0; i < HELD; i++)
		assert_int_equal(ph_post_once(&run, &p, &tally, (uint32_t)(i % writers), &source,
		                              source.mem + i * stride, &region, i * stride, size),
		                 0);
	/* The failing write goes to a region of its own, under another key;
	 * with coalescing, to a channel with nothing in flight, which posts
	 * it at once. */
	PH_REQUIRE(&run, ph_region_open(&run, &p, &bad, 4096));
	cfg.plugin->ops.mr_deregister(p.dst.inst, region.mr);
	cfg.plugin->ops.mr_deregister(p.dst.inst, bad.mr);
	region.mr = bad.mr = NULL;
	assert_int_equal(
	        ph_post_once(&run, &p, &tally, channels - 1, &source, source.mem, &bad, 0, 16), 0);
	assert_int_equal(ph_harvest_until_error(&run, &p, &tally, 5 * PH_SECOND), -LMT_EIO);
	PH_REQUIRE(&run, !run.failed);
	assert_int_equal(tally.done, HELD + 1);
	assert_int_equal(tally.failed, HELD + 1);
	first_error_has(&p.src.host, "is not registered at the target");
	ph_tally_fini(&tally);
	ph_source_close(&p, &source);
	ph_region_close(&p, &bad);
	ph_region_close(&p, &region);
	ph_pair_close(&p);
}

static void test_failure_reports_every_outstanding_write(void **state)
{
	(void)state;
	held_writes_fail_once(&fake_held, 2, 2, 16, 0);
}

/* With coalescing, once 1 MiB is held in flight the writes behind it wait
 * in the plugin and never reach the provider: each is still reported
 * once. The 200 writes of 64 KiB go to channel 0 with gaps between them,
 * so none merge: 16 are held and 184 wait, whenever its thread posts; the
 * failing write goes to channel 1. */
static void test_failure_reports_queued_writes(void **state)
{
	(void)state;
	held_writes_fail_once(&fake_held_coalesced, 2, 1, 64 << 10, 128 << 10);
}

/* A write the provider holds keeps progress and flush waiting: a cancel
 * ends both at once (check-ofi-* cancels them with nothing outstanding). */
static void test_waiting_on_a_held_write_honours_cancel(void **state)
{
	(void)state;
	struct ph_run run;
	struct ph_pair p;
	struct ph_region region = {0};
	struct ph_source source = {0};
	struct ph_tally tally = {0};
	pair_up(&run, &p, &fake_held, 1);
	PH_REQUIRE(&run, ph_pair_stop_progress(&run, &p) &&
	                         ph_region_open(&run, &p, &region, 4096) &&
	                         ph_source_open(&run, &p, &source, 4096, 12) &&
	                         ph_tally_init(&run, &tally, 1));
	assert_int_equal(ph_post_once(&run, &p, &tally, 0, &source, source.mem, &region, 0, 16), 0);
	atomic_store(&p.src.host.cancelled, 1);
	struct lmt_completion c[4];
	uint64_t start = ph_now();
	assert_int_equal(cfg.plugin->ops.progress(p.src.inst, c, 4, 30 * PH_SECOND),
	                 -LMT_ECANCELED);
	assert_int_equal(cfg.plugin->ops.flush(p.src.inst, 30 * PH_SECOND), -LMT_ECANCELED);
	assert_true(ph_now() - start < PH_SECOND);
	ph_tally_fini(&tally);
	ph_source_close(&p, &source);
	ph_region_close(&p, &region);
	ph_pair_close(&p);
}

/* ---- Tests: the greeting and closing ------------------------------------------ */

/* The sockets of this process that are connections (not the listener) on
 * the TCP address an endpoint's address blob names. */
static int connections_on(const struct lmt_blob *blob)
{
	struct lfi_addr a;
	assert_null(lfi_addr_decode(blob, &a));
	assert_int_equal(a.addr_format, FI_SOCKADDR_IN);
	struct sockaddr_in ep;
	memcpy(&ep, a.name, sizeof(ep));
	int n = 0;
	for (int fd = 0; fd < 4096; fd++) {
		struct sockaddr_in sa;
		socklen_t len = sizeof(sa);
		int listening = 0;
		socklen_t llen = sizeof(listening);
		if (getsockname(fd, (struct sockaddr *)&sa, &len) == 0 && sa.sin_family == AF_INET &&
		    sa.sin_port == ep.sin_port &&
		    getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &llen) == 0 && !listening)
			n++;
	}
	return n;
}

/* A destination that closes channels without the source's greeting closes
 * at once, however many channels. */
static void test_closing_without_the_greeting_does_not_wait(void **state)
{
	(void)state;
	struct ph_run run;
	struct ph_pair p;
	pair_open(&run, &p, &tcp, 3);
	PH_REQUIRE(&run, ph_pair_open_endpoints(&run, &p));
	atomic_store(&p.dst.host.cancelled, 1);
	assert_int_equal(cfg.plugin->ops.ep_connect(p.dst.ep[0], &p.src.addr[0]), -LMT_ECANCELED);
	uint64_t start = ph_now();
	cfg.plugin->ops.instance_close(p.dst.inst);
	uint64_t took = ph_now() - start;
	p.dst.inst = NULL;
	if (took >= PH_SECOND / 4)
		fail_msg("closing 3 ungreeted channels took %.2f s", (double)took / PH_SECOND);
	ph_pair_close(&p);
}

/* Connections a stranger opens to a destination's endpoint and never
 * finishes (no connection request) are accepted by the provider and would
 * stay open in this process after the close; instance_close closes them. */
static void test_connections_left_unfinished_are_closed_with_the_instance(void **state)
{
	(void)state;
	struct ph_run run;
	struct ph_pair p;
	pair_open(&run, &p, &tcp, 1);
	PH_REQUIRE(&run, ph_pair_open_endpoints(&run, &p));
	struct lfi_addr a;
	assert_null(lfi_addr_decode(&p.dst.addr[0], &a));
	int strangers[3];
	for (int i = 0; i < 3; i++) {
		strangers[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		assert_true(strangers[i] >= 0);
		assert_int_equal(connect(strangers[i], (const struct sockaddr *)a.name,
		                         sizeof(struct sockaddr_in)),
		                 0);
	}
	/* The destination's thread, started by ep_connect, drives the
	 * provider, which accepts them and waits for their requests. */
	atomic_store(&p.dst.host.cancelled, 1);
	assert_int_equal(cfg.plugin->ops.ep_connect(p.dst.ep[0], &p.src.addr[0]), -LMT_ECANCELED);
	uint64_t deadline = ph_now() + 5 * PH_SECOND;
	while (connections_on(&p.dst.addr[0]) < 3 && ph_now() < deadline)
		usleep(1000);
	assert_int_equal(connections_on(&p.dst.addr[0]), 3);
	struct lmt_blob blob = p.dst.addr[0];
	cfg.plugin->ops.instance_close(p.dst.inst);
	p.dst.inst = NULL;
	assert_int_equal(connections_on(&blob), 0);
	PH_ASSERT_LOGGED(&p.dst.host, "closed 3 connections the provider accepted and left open");
	for (int i = 0; i < 3; i++)
		close(strangers[i]);
	ph_pair_close(&p);
}

/* Every state the core may close from, under lmtfake with every
 * registration mode (keys per endpoint among them): opened only; endpoints
 * never connected, one closed; connected with writes in flight and nothing
 * released; released in the core's order, the destination first. */
static void teardown_cycle(void)
{
	struct ph_side s;
	assert_int_equal(side_open(&s, &fake_all, NULL, LMT_ROLE_SOURCE, 2), 0);
	side_close(&s);

	struct ph_run run;
	struct ph_pair p;
	pair_open(&run, &p, &fake_all, 3);
	PH_REQUIRE(&run, ph_pair_open_endpoints(&run, &p));
	cfg.plugin->ops.ep_close(p.src.ep[1]);
	p.src.ep[1] = NULL;
	ph_pair_close(&p);

	struct ph_region region = {0};
	struct ph_source source = {0};
	struct ph_tally tally = {0};
	pair_up(&run, &p, &fake_all, 2);
	PH_REQUIRE(&run, ph_region_open(&run, &p, &region, 1 << 20) &&
	                         ph_source_open(&run, &p, &source, 1 << 20, 10) &&
	                         ph_tally_init(&run, &tally, 8));
	for (uint64_t i = 0; i < 8; i++)
		PH_REQUIRE(&run, ph_post(&run, &p, &tally, (uint32_t)(i & 1), &source,
		                         source.mem + (i << 17), &region, i << 17, 1 << 17));
	ph_pair_close(&p);
	/* instance_close released the plugin's objects; only memory is left. */
	region.mr = source.mr = NULL;
	region.rkey = NULL;
	ph_region_close(&p, &region);
	ph_source_close(&p, &source);
	ph_tally_fini(&tally);

	pair_up(&run, &p, &fake_all, 2);
	PH_REQUIRE(&run, ph_pair_stop_progress(&run, &p) &&
	                         ph_region_open(&run, &p, &region, 1 << 20) &&
	                         ph_source_open(&run, &p, &source, 1 << 20, 11));
	ph_source_close(&p, &source);
	ph_region_close(&p, &region);
	for (uint32_t c = 0; c < 2; c++) {
		cfg.plugin->ops.ep_close(p.dst.ep[c]);
		cfg.plugin->ops.ep_close(p.src.ep[c]);
	}
	ph_pair_close(&p);
}

static void test_teardown_from_every_state_under_every_mode_leaves_nothing(void **state)
{
	(void)state;
	teardown_cycle(); /* providers set up what they keep for the process */
	struct ph_census before = ph_census_take(), after;
	for (int i = 0; i < 3; i++)
		teardown_cycle();
	if (!ph_census_same(before, &after))
		fail_msg("%d file descriptors and %d threads after, %d and %d before", after.fds,
		         after.threads, before.fds, before.threads);
}

/* ---- Stale shared memory ------------------------------------------------------ */

#define STALE_REGIONS 1024

/* Plant what a process that died with this process's id would have left in
 * /dev/shm: the regions libfabric's shm names "<pid>:<uid>:<n>" by default. */
static void plant_stale_regions(bool plant)
{
	char path[96];
	for (int n = 0; n < STALE_REGIONS; n++) {
		snprintf(path, sizeof(path), "/dev/shm/%d:%u:%d", (int)getpid(), (unsigned)getuid(),
		         n);
		if (!plant) {
			unlink(path);
			continue;
		}
		int fd = open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
		if (fd < 0)
			fail_msg("planting %s: %s", path, strerror(errno));
		close(fd);
	}
}

/* A dead process's regions under this process's id (pids wrap) do not stop
 * a pair from opening, connecting and carrying writes over shm. A region
 * already there under this id is stale too: no live process shares it. */
static void test_stale_shm_regions_under_our_pid_are_no_obstacle(void **state)
{
	(void)state;
	struct ph_run run;
	struct ph_pair p;
	struct ph_region region = {0};
	struct ph_source source = {0};
	struct ph_tally tally = {0};
	plant_stale_regions(true);
	pair_up(&run, &p, &shm, 2);
	PH_REQUIRE(&run, ph_region_open(&run, &p, &region, 1 << 20) &&
	                         ph_source_open(&run, &p, &source, 1 << 20, 2) &&
	                         ph_tally_init(&run, &tally, 2));
	PH_REQUIRE(&run, ph_post(&run, &p, &tally, 0, &source, source.mem, &region, 0, 4096) &&
	                         ph_post(&run, &p, &tally, 1, &source, source.mem + 4096, &region,
	                                 4096, 4096) &&
	                         ph_harvest_all(&run, &p, &tally) &&
	                         ph_same(&run, "after the writes", region.mem, source.mem, 8192, 0) &&
	                         ph_pair_stop_progress(&run, &p) && ph_pair_quiet(&run, &p));
	ph_tally_fini(&tally);
	ph_source_close(&p, &source);
	ph_region_close(&p, &region);
	ph_pair_close(&p);
	plant_stale_regions(false);
}

/* ---- Main ---------------------------------------------------------------- */

#define ON(test, variant) cmocka_unit_test_prestate(test, (void *)&(variant))

int main(int argc, char **argv)
{
	const char *fake_dir = argc > 2 ? argv[2] : getenv("LMT_TEST_OFI_FAKE_DIR");
	if (!fake_dir) {
		fprintf(stderr,
		        "usage: %s ofi.so lmtfake-dir (or set LMT_TEST_OFI_PLUGIN and "
		        "LMT_TEST_OFI_FAKE_DIR)\n",
		        argv[0]);
		return 2;
	}
	/* Before libfabric first looks for providers. */
	setenv("FI_PROVIDER_PATH", fake_dir, 1);
	if (ph_test_load(&cfg, "LMT_TEST_OFI_PLUGIN", argc, argv, ""))
		return 2;
	/* Elsewhere the test environment sets FI_OFI_RXM_MSG_RX_SIZE and
	 * FI_OFI_RXM_BUFFER_SIZE as a VMM would (docs/ofi.md), which a
	 * setenv(..., 0) would not disturb. */
	if (getenv("LMT_TEST_OFI_ENVIRONMENT")) {
		unsetenv("FI_OFI_RXM_MSG_RX_SIZE");
		unsetenv("FI_OFI_RXM_BUFFER_SIZE");
		const struct CMUnitTest alone[] = {
		        cmocka_unit_test(test_plugin_leaves_the_environment_alone),
		};
		int failed = cmocka_run_group_tests(alone, NULL, NULL);
		ph_unload(&cfg);
		return failed;
	}
	if (getenv("LMT_TEST_FILTER"))
		cmocka_set_test_filter(getenv("LMT_TEST_FILTER"));
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(
	                test_descriptor_claims_registration_pinning_channels_and_merged_runs),
	        cmocka_unit_test(test_unknown_provider_error_lists_those_available),
	        cmocka_unit_test(test_tcp_is_taken_as_its_native_rdm_provider),
	        cmocka_unit_test(test_an_ofi_rxm_layering_is_refused_with_the_reason),
	        cmocka_unit_test(test_a_provider_taking_messages_unmeasured_is_refused),
	        cmocka_unit_test(test_unknown_domain_error_lists_domains),
	        cmocka_unit_test(test_domain_option_picks_the_domain),
	        cmocka_unit_test(test_bad_mr_mode_option_is_rejected),
	        cmocka_unit_test(test_delivery_completion_demanded_but_missing_is_refused),
	        cmocka_unit_test(test_required_mode_not_offered_is_refused),
	        cmocka_unit_test(test_coalescing_without_delivery_completion_is_refused),

	        ON(test_writes_land_under_the_mode, tcp_fence),
	        ON(test_writes_land_under_the_mode, tcp_local),
	        ON(test_writes_land_under_the_mode, shm_offsets),
	        ON(test_writes_land_under_the_mode, shm_apart),
	        ON(test_writes_land_under_the_mode, fake),
	        ON(test_writes_land_under_the_mode, fake_local),
	        ON(test_writes_land_under_the_mode, fake_virt),
	        ON(test_writes_land_under_the_mode, fake_prov_key),
	        ON(test_writes_land_under_the_mode, fake_endpoint),
	        ON(test_writes_land_under_the_mode, fake_raw),
	        ON(test_writes_land_under_the_mode, fake_raw_virt),
	        ON(test_writes_land_under_the_mode, fake_all),
	        ON(test_writes_land_under_the_mode, fake_fence),
	        ON(test_writes_land_under_the_mode, fake_fence_all),
	        ON(test_writes_land_under_the_mode, fake_polled),
	        ON(test_contiguous_writes_merge_and_complete_once, shm),
	        /* By default (ofi.coalesce=auto) over both. */
	        ON(test_contiguous_writes_merge_and_complete_once, tcp),
	        ON(test_unregistered_source_is_refused_when_the_provider_needs_it, fake_local),
	        ON(test_unregistered_source_is_refused_when_the_provider_needs_it, shm_offsets),
	        cmocka_unit_test(test_registration_needs_open_channels_with_endpoint_mode),

	        ON(test_key_blob_with_a_bad_field_is_refused, tcp),
	        ON(test_key_blob_with_a_bad_field_is_refused, shm),
	        cmocka_unit_test(test_forged_raw_key_is_refused),
	        ON(test_requested_keys_are_random, tcp),
	        ON(test_requested_keys_are_random, shm),
	        /* Its first registrations meet keys the domain holds: drawn again. */
	        ON(test_writes_land_under_the_mode, fake_taken),
	        ON(test_address_blob_with_a_bad_field_is_refused, tcp),
	        ON(test_address_blob_with_a_bad_field_is_refused, shm),
	        ON(test_address_blob_with_a_bad_field_is_refused, fake_all),
	        cmocka_unit_test(test_another_provider_on_the_peer_is_a_mismatch),
	        cmocka_unit_test(test_stale_shm_regions_under_our_pid_are_no_obstacle),

	        cmocka_unit_test(test_remote_error_carries_the_provider_text),
	        cmocka_unit_test(test_failure_reports_every_outstanding_write),
	        cmocka_unit_test(test_failure_reports_queued_writes),
	        cmocka_unit_test(test_waiting_on_a_held_write_honours_cancel),

	        cmocka_unit_test(test_closing_without_the_greeting_does_not_wait),
	        cmocka_unit_test(test_connections_left_unfinished_are_closed_with_the_instance),
	        cmocka_unit_test(test_teardown_from_every_state_under_every_mode_leaves_nothing),
	};
	int failed = cmocka_run_group_tests(tests, NULL, NULL);
	ph_unload(&cfg);
	return failed;
}
