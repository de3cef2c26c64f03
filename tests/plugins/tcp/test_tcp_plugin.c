/* The tcp plugin's own tests, through the plugin ABI on the plugin test
 * harness: forged traffic on the data stream, connections that are not the
 * source's, the address option and IPv6, deregistration during a stalled
 * write, and how the source takes its destination closing. What every plugin
 * must do is lmt-plugin-check's (check-tcp). */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <lmt/plugin.h>
#include <lmt/version.h>

#include "plugin_test.h"
#include "wire.h"

static struct ph_config cfg;

/* ---- A destination and a raw socket playing its source -------------------- */

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

/* A one-channel destination with a guarded 4096-byte region, and a raw
 * socket connected as its source. */
struct raw_source {
	struct ph_forged forged;
	struct tcp_key key;
	int fd;
};

static void raw_source_open(struct raw_source *s, uint64_t timeout_ns)
{
	ph_forged_open(&s->forged, &cfg, 4096, timeout_ns);
	struct ph_side *dst = &s->forged.pair.dst;
	assert_null(tcp_key_decode(&s->forged.region.key, &s->key));
	s->fd = raw_connect(&dst->addr[0], 0, 0);
	struct lmt_blob src_addr;
	tcp_src_addr_encode(0, &src_addr);
	assert_int_equal(cfg.plugin->ops.ep_connect(dst->ep[0], &src_addr), 0);
}

static void raw_source_close(struct raw_source *s)
{
	close(s->fd);
	ph_forged_close(&s->forged);
}

/* Send one forged header with `payload` bytes after it. The destination
 * must fail the channel with LMT_EPROTO, record a message containing
 * `expect`, tell the raw source why and hang up, and leave memory alone. */
static void forge_write(uint32_t magic, uint32_t region_delta, uint64_t offset, uint64_t len,
                        size_t payload, const char *expect)
{
	struct raw_source s;
	raw_source_open(&s, 5 * PH_SECOND);
	uint8_t msg[TCP_HEADER_LEN + 256];
	memset(msg, 0x5a, sizeof(msg));
	struct tcp_header h = {.magic = magic,
	                       .region = s.key.region + region_delta,
	                       .offset = offset,
	                       .len = len,
	                       .seq = 0};
	tcp_header_encode(&h, msg);
	assert_true(payload <= 256);
	assert_int_equal(send(s.fd, msg, TCP_HEADER_LEN + payload, MSG_NOSIGNAL),
	                 TCP_HEADER_LEN + payload);

	/* The core learns of it through progress. */
	ph_forged_refused(&s.forged, expect);
	/* The source side hears why, then the stream ends. */
	uint8_t reply[TCP_ACK_LEN];
	assert_int_equal(read_to_eof(s.fd, reply, sizeof(reply)), TCP_ACK_LEN);
	struct tcp_ack ack;
	tcp_ack_decode(reply, &ack);
	assert_int_equal(ack.magic, TCP_MAGIC_ERROR);
	assert_int_equal(ack.code, LMT_EPROTO);
	raw_source_close(&s);
}

/* One write over a pair whose destination listens where `local_host` and
 * tcp.address (`address`) say, and advertises an address of `family`. */
static void one_write_over(const char *local_host, const char *address, int family)
{
	struct ph_run run = {.cfg = &cfg};
	struct ph_pair p;
	struct ph_region region = {0};
	struct ph_source source = {0};
	struct ph_tally tally = {0};
	struct lmt_error err = {0};
	char option[128];
	snprintf(option, sizeof(option), "tcp.address=%s", address);
	ph_pair_init(&p, &cfg);
	p.channels = 1;
	if (ph_host_set_options(&p.dst.host, option, &err))
		fail_msg("%s: %s", option, err.message);
	PH_REQUIRE(&run,
	           ph_instance_open_at(&run, &p.dst, LMT_ROLE_DESTINATION, 1, 5 * PH_SECOND,
	                               local_host) &&
	                   ph_instance_open(&run, &p.src, LMT_ROLE_SOURCE, 1, 5 * PH_SECOND) &&
	                   ph_pair_open_endpoints(&run, &p));
	struct tcp_dst_addr a;
	assert_null(tcp_dst_addr_decode(&p.dst.addr[0], &a));
	assert_int_equal(a.family, family);
	PH_REQUIRE(&run,
	           ph_pair_connect(&run, &p) && ph_region_open(&run, &p, &region, 4096) &&
	                   ph_source_open(&run, &p, &source, 4096, 13) &&
	                   ph_tally_init(&run, &tally, 1) &&
	                   ph_post(&run, &p, &tally, 0, &source, source.mem, &region, 0, 4096) &&
	                   ph_harvest_all(&run, &p, &tally) && ph_pair_quiet(&run, &p));
	ph_tally_fini(&tally);
	ph_source_close(&p, &source);
	ph_region_close(&p, &region);
	ph_pair_close(&p);
}

/* ---- Tests: what tcp claims ------------------------------------------------ */

static void
test_descriptor_claims_multi_channel_and_encryption_and_the_project_version(void **state)
{
	(void)state;
	assert_string_equal(cfg.plugin->name, "tcp");
	assert_string_equal(cfg.plugin->version, LMT_VERSION);
	assert_int_equal(cfg.plugin->caps, LMT_CAP_MULTI_CHANNEL | LMT_CAP_ENCRYPTS);
}

/* ---- Tests: TLS on the channels (the core's channel secret) --------------- */

/* Writes over two channels whose ends got these secrets; true when they
 * landed. */
static bool writes_over_tls(struct ph_run *run, const uint8_t *src_secret,
                            const uint8_t *dst_secret)
{
	struct ph_pair p;
	struct ph_region region = {0};
	struct ph_source source = {0};
	struct ph_tally tally = {0};
	ph_pair_init(&p, &cfg);
	p.src.channel_secret = src_secret;
	p.dst.channel_secret = dst_secret;
	const size_t len = 4 << 20;
	bool ok = ph_pair_open_instances(run, &p, 2 * PH_SECOND) &&
	          ph_pair_open_endpoints(run, &p) && ph_pair_connect(run, &p);
	if (ok) {
		ph_pair_start_progress(&p);
		ok = ph_region_open(run, &p, &region, len) &&
		     ph_source_open(run, &p, &source, len, 31) && ph_tally_init(run, &tally, 2) &&
		     ph_post(run, &p, &tally, 0, &source, source.mem, &region, 0, len / 2) &&
		     ph_post(run, &p, &tally, 1, &source, source.mem + len / 2, &region, len / 2,
		             len / 2) &&
		     ph_harvest_all(run, &p, &tally) && ph_pair_stop_progress(run, &p) &&
		     ph_same(run, "the region", region.mem, source.mem, len, 0) &&
		     ph_region_guards_intact(run, &region);
		ph_tally_fini(&tally);
	}
	ph_source_close(&p, &source);
	ph_region_close(&p, &region);
	ph_pair_close(&p);
	return ok;
}

static void test_channels_with_the_same_secret_carry_writes_over_tls(void **state)
{
	(void)state;
	uint8_t secret[32];
	memset(secret, 0x5a, sizeof(secret));
	struct ph_run run = {.cfg = &cfg};
	PH_REQUIRE(&run, writes_over_tls(&run, secret, secret));
}

static void test_a_source_with_another_secret_cannot_connect_a_channel(void **state)
{
	(void)state;
	uint8_t mine[32], theirs[32];
	memset(mine, 0x5a, sizeof(mine));
	memset(theirs, 0x5a, sizeof(theirs));
	theirs[31] ^= 1;
	struct ph_run run = {.cfg = &cfg};
	assert_false(writes_over_tls(&run, theirs, mine));
	if (!strstr(run.why, "source ep_connect channel 0: LMT_EAUTH") ||
	    !strstr(run.why,
	            "tcp channel 0: tls: the destination did not prove the pre-shared key"))
		fail_msg("unexpected failure: %s", run.why);
}

static void test_a_plaintext_source_is_dropped_by_a_tls_channel(void **state)
{
	(void)state;
	uint8_t secret[32];
	memset(secret, 0x5a, sizeof(secret));
	struct ph_run run = {.cfg = &cfg};
	assert_false(writes_over_tls(&run, NULL, secret));
	/* The source's plaintext hello never reaches the receiver: the
	 * destination drops the connection and waits on until its timeout. */
	if (!strstr(run.why, "destination ep_connect channel 0: LMT_ETIMEDOUT"))
		fail_msg("unexpected failure: %s", run.why);
}

/* ---- Tests: blobs with a bad field (see check-tcp for malformed ones) ------ */

static void test_key_blob_with_a_bad_field_is_refused(void **state)
{
	(void)state;
	struct ph_run run = {.cfg = &cfg};
	struct ph_pair p;
	struct ph_region region = {0};
	PH_REQUIRE(&run,
	           ph_pair_open(&run, &p, PH_SECOND) && ph_region_open(&run, &p, &region, 4096));
	struct lmt_blob bad[5];
	for (int i = 0; i < 5; i++)
		bad[i] = region.key;
	bad[0].data[0] ^= 1;            /* magic */
	bad[1].data[4] = 9;             /* version */
	memset(bad[2].data + 8, 0, 8);  /* region id 0 (ids are never 0) */
	memset(bad[3].data + 16, 0, 8); /* zero length */
	bad[4].data[6] = 1;             /* reserved */
	for (int i = 0; i < 5; i++) {
		lmt_rkey *rkey = NULL;
		assert_int_equal(cfg.plugin->ops.rkey_import(p.src.inst, &bad[i], &rkey),
		                 -LMT_EPROTO);
		assert_null(rkey);
		PH_ASSERT_ERROR(&p.src.host, LMT_EPROTO, "key blob");
	}
	ph_region_close(&p, &region);
	ph_pair_close(&p);
}

/* Region ids are drawn from the CSPRNG: 64-bit, distinct, never the
 * 1, 2, 3 ... an attacker would try first. */
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
		struct tcp_key key;
		assert_null(tcp_key_decode(&r[i].key, &key));
		ids[i] = key.region;
		assert_true(ids[i] > (1u << 20));
		high |= ids[i] >> 48 != 0;
		for (int j = 0; j < i; j++)
			assert_true(ids[j] != ids[i]);
	}
	assert_true(high);
	for (int i = 0; i < COUNT; i++)
		ph_region_close(&p, &r[i]);
	ph_pair_close(&p);
}

static void test_address_blob_with_a_bad_field_is_refused(void **state)
{
	(void)state;
	struct ph_run run = {.cfg = &cfg};
	struct ph_pair p;
	PH_REQUIRE(&run, ph_pair_open(&run, &p, PH_SECOND) && ph_pair_open_endpoints(&run, &p));
	struct lmt_blob bad[4];
	for (int i = 0; i < 4; i++)
		bad[i] = p.dst.addr[0];
	bad[0].data[3] ^= 0x80;        /* magic */
	bad[1].data[5] = 1;            /* version */
	bad[2].data[6] = 5;            /* family */
	memset(bad[3].data + 8, 0, 2); /* port 0 */
	for (int i = 0; i < 4; i++) {
		assert_int_equal(cfg.plugin->ops.ep_connect(p.src.ep[0], &bad[i]), -LMT_EPROTO);
		PH_ASSERT_ERROR(&p.src.host, LMT_EPROTO, "address blob");
	}
	struct lmt_blob bad_src = p.src.addr[0];
	bad_src.data[0] = 0; /* magic */
	assert_int_equal(cfg.plugin->ops.ep_connect(p.dst.ep[0], &bad_src), -LMT_EPROTO);
	PH_ASSERT_ERROR(&p.dst.host, LMT_EPROTO, "address blob");
	ph_pair_close(&p);
}

/* ---- Tests: strangers and forgers on the data stream ------------------------ */

static void test_unknown_token_connection_is_ignored(void **state)
{
	(void)state;
	struct ph_run run = {.cfg = &cfg};
	struct ph_pair p;
	ph_pair_init(&p, &cfg);
	p.channels = 1;
	PH_REQUIRE(&run, ph_pair_open_instances(&run, &p, 5 * PH_SECOND) &&
	                         ph_pair_open_endpoints(&run, &p));
	/* Two impostors queue up before the real source. */
	int wrong_token = raw_connect(&p.dst.addr[0], 0x5a5a, 0);
	int wrong_channel = raw_connect(&p.dst.addr[0], 0, 7);
	PH_REQUIRE(&run, ph_pair_connect(&run, &p));
	uint8_t buf[16];
	assert_int_equal(read_to_eof(wrong_token, buf, sizeof(buf)), 0);
	assert_int_equal(read_to_eof(wrong_channel, buf, sizeof(buf)), 0);
	close(wrong_token);
	close(wrong_channel);
	PH_ASSERT_LOGGED(&p.dst.host, "wrong token");
	PH_ASSERT_LOGGED(&p.dst.host, "another channel");
	assert_int_equal(ph_host_errors(&p.dst.host), 0);

	/* The real source's writes land. */
	struct ph_region region = {0};
	struct ph_source source = {0};
	struct ph_tally tally = {0};
	PH_REQUIRE(&run,
	           ph_region_open(&run, &p, &region, 4096) &&
	                   ph_source_open(&run, &p, &source, 4096, 5) &&
	                   ph_tally_init(&run, &tally, 1) &&
	                   ph_post(&run, &p, &tally, 0, &source, source.mem, &region, 0, 4096) &&
	                   ph_harvest_all(&run, &p, &tally));
	ph_tally_fini(&tally);
	ph_source_close(&p, &source);
	ph_region_close(&p, &region);
	ph_pair_close(&p);
}

static void test_forged_header_past_region_end_is_rejected(void **state)
{
	(void)state;
	forge_write(TCP_MAGIC_WRITE, 0, 4000, 200, 200,
	            "tcp channel 0: write of 200 bytes at offset 4000 outside region 0x");
}

static void test_forged_header_with_wrapping_offset_is_rejected(void **state)
{
	(void)state;
	forge_write(TCP_MAGIC_WRITE, 0, UINT64_MAX - 99, 200, 200, "outside region 0x");
}

static void test_forged_header_for_unknown_region_is_rejected(void **state)
{
	(void)state;
	forge_write(TCP_MAGIC_WRITE, 1, 0, 100, 100, "to unknown region 0x");
}

static void test_forged_header_with_bad_magic_is_rejected(void **state)
{
	(void)state;
	forge_write(0xdeadbeef, 0, 0, 16, 16, "bad header magic 0xdeadbeef");
}

static void test_deregister_cuts_off_a_stalled_write(void **state)
{
	(void)state;
	struct raw_source s;
	raw_source_open(&s, PH_SECOND / 2);
	/* Announce 4096 bytes, send 100, then stall. */
	uint8_t msg[TCP_HEADER_LEN + 100];
	memset(msg, 0x5a, sizeof(msg));
	struct tcp_header h = {.magic = TCP_MAGIC_WRITE, .region = s.key.region, .len = 4096};
	tcp_header_encode(&h, msg);
	assert_int_equal(send(s.fd, msg, sizeof(msg), MSG_NOSIGNAL), sizeof(msg));
	usleep(200000); /* the receiver is now placing into the region */

	uint64_t start = ph_now();
	cfg.plugin->ops.mr_deregister(s.forged.pair.dst.inst, s.forged.region.mr);
	s.forged.region.mr = NULL;
	uint64_t took = ph_now() - start;
	assert_true(took >= PH_SECOND / 2 && took < 3 * PH_SECOND);
	PH_ASSERT_FIRST_ERROR(&s.forged.pair.dst.host, LMT_ETIMEDOUT, "");
	/* Nothing lands after deregistration returned. */
	memset(s.forged.region.mem, 0, s.forged.region.len);
	send(s.fd, msg, sizeof(msg), MSG_NOSIGNAL);
	usleep(100000);
	PH_REQUIRE(&s.forged.run, ph_all_zero(&s.forged.run, "the region", s.forged.region.mem,
	                                      s.forged.region.len, 0));
	struct lmt_completion c[1];
	assert_int_equal(cfg.plugin->ops.progress(s.forged.pair.dst.inst, c, 1, PH_SECOND),
	                 -LMT_ECONN);
	raw_source_close(&s);
}

/* ---- Tests: closing ----------------------------------------------------------- */

static void test_destination_close_mid_stream_gives_source_econn(void **state)
{
	(void)state;
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
	assert_non_null(strstr(loss.first_error, "tcp channel"));
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

/* ---- Tests: where the destination listens ------------------------------------- */

static void test_address_option_overrides_local_host(void **state)
{
	(void)state;
	one_write_over("", "127.0.0.1", TCP_FAMILY_IPV4);
}

static void test_destination_without_any_address_is_refused(void **state)
{
	(void)state;
	struct ph_host host;
	ph_host_init(&host, &cfg, "destination");
	struct lmt_instance_params params = {.struct_size = sizeof(params),
	                                     .role = LMT_ROLE_DESTINATION,
	                                     .channels = 1,
	                                     .timeout_ns = PH_SECOND};
	lmt_instance *inst = NULL;
	assert_int_equal(cfg.plugin->ops.instance_open(&ph_host_services, &host, &params, &inst),
	                 -LMT_EINVAL);
	assert_null(inst);
	PH_ASSERT_ERROR(&host, LMT_EINVAL, "tcp.address");
	ph_host_fini(&host);
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

/* ---- Main ---------------------------------------------------------------- */

int main(int argc, char **argv)
{
	if (ph_test_load(&cfg, "LMT_TEST_TCP_PLUGIN", argc, argv, NULL))
		return 2;
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(
	                test_descriptor_claims_multi_channel_and_encryption_and_the_project_version),
	        cmocka_unit_test(test_channels_with_the_same_secret_carry_writes_over_tls),
	        cmocka_unit_test(test_a_source_with_another_secret_cannot_connect_a_channel),
	        cmocka_unit_test(test_a_plaintext_source_is_dropped_by_a_tls_channel),
	        cmocka_unit_test(test_key_blob_with_a_bad_field_is_refused),
	        cmocka_unit_test(test_address_blob_with_a_bad_field_is_refused),
	        cmocka_unit_test(test_unknown_token_connection_is_ignored),
	        cmocka_unit_test(test_region_ids_are_random),
	        cmocka_unit_test(test_forged_header_past_region_end_is_rejected),
	        cmocka_unit_test(test_forged_header_with_wrapping_offset_is_rejected),
	        cmocka_unit_test(test_forged_header_for_unknown_region_is_rejected),
	        cmocka_unit_test(test_forged_header_with_bad_magic_is_rejected),
	        cmocka_unit_test(test_deregister_cuts_off_a_stalled_write),
	        cmocka_unit_test(test_destination_close_mid_stream_gives_source_econn),
	        cmocka_unit_test(test_orderly_close_by_source_is_no_error),
	        cmocka_unit_test(test_orderly_close_by_destination_is_no_error),
	        cmocka_unit_test(test_address_option_overrides_local_host),
	        cmocka_unit_test(test_destination_without_any_address_is_refused),
	        cmocka_unit_test(test_ipv6_loopback_works),
	};
	int failed = cmocka_run_group_tests(tests, NULL, NULL);
	ph_unload(&cfg);
	return failed;
}
