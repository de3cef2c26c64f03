/* Attacks on a destination by strangers on its network, and by a source
 * that holds the key but misbehaves. Each case checks that the attacker
 * wrote nothing into the destination's guest RAM, and that the real
 * migration that follows completes bit for bit — or, when the attacker is
 * the source itself, that the load fails as docs/protocol.md says, with a
 * clear error, within its deadline. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"
#include "hostile.h"
#include "net.h"

#define RAM_BYTES (4ull << 20)
#define KEY "guard-shared-secret"
#define MS 1000000ull

static uint8_t *in;
static uint32_t in_len;

static int setup(void **state)
{
	in = malloc(LMT_PROTO_MAX_PAYLOAD);
	return in ? 0 : -1;
}

static int teardown(void **state)
{
	free(in);
	return 0;
}

static char dest_opts[256], source_opts[256];

/* Both sides keyed: the destination by file (as deployed), the source
 * inline; `extra` goes to the destination. */
static void keyed(const char *extra)
{
	snprintf(dest_opts, sizeof(dest_opts), "auth-key-file=%s%s%s", guard_key_file(KEY),
	         extra && *extra ? "," : "", extra ? extra : "");
	snprintf(source_opts, sizeof(source_opts), "auth-key=%s", KEY);
}

/* The real source migrates a guest into d: it must complete bit for bit,
 * with the device state. */
static void real_migration(struct guard_dest *d)
{
	struct guest_ram ram;
	ram_fill(&ram, RAM_BYTES, 77);
	static const char state[] = "device state of the real guest";
	uint64_t none = 0;
	struct source_run r = source_migrate(&ram, source_opts, d->port, state, sizeof(state), 0,
	                                     0, &none);
	guard_dest_join(d);
	if (r.rc || d->rc)
		fail_msg("source %d '%s'; destination %d '%s'", r.rc, r.error, d->rc, d->error);
	assert_memory_equal(ram.base, d->ram.base, RAM_BYTES);
	assert_int_equal(d->state_len, sizeof(state));
	assert_memory_equal(d->state, state, sizeof(state));
	ram_release(&ram);
}

static struct lmt_msg_status reply_status(uint16_t type)
{
	struct lmt_msg_status st = {0};
	struct lmt_error err = {0};
	assert_int_equal(lmt__dec_status(in, in_len, type, &st, &err), 0);
	return st;
}

/* ---- port probers ---- */

static void test_probers_before_the_real_source(void **state)
{
	keyed("");
	struct census c0 = census_take();
	struct guard_dest *d = guard_dest_start(RAM_BYTES, dest_opts);

	/* A port scan or a health check: connect, close. */
	for (int i = 0; i < 3; i++)
		close(hostile_connect(d->port));
	/* Garbage, and a web client. */
	int fd = hostile_connect(d->port);
	uint8_t junk[64];
	for (unsigned i = 0; i < sizeof(junk); i++)
		junk[i] = (uint8_t)(i * 37 + 11);
	hostile_send(fd, junk, sizeof(junk));
	assert_true(hostile_closed_by_peer(fd, 2000));
	close(fd);
	fd = hostile_connect(d->port);
	hostile_send(fd, "GET / HTTP/1.0\r\n\r\n", 18);
	assert_true(hostile_closed_by_peer(fd, 2000));
	close(fd);
	/* A HELLO without a key is refused, and says why. */
	fd = hostile_connect(d->port);
	char text[600];
	assert_int_equal(hostile_handshake(fd, NULL, false, text, sizeof(text)), -LMT_EAUTH);
	assert_non_null(strstr(text, "authentication required"));
	assert_true(hostile_closed_by_peer(fd, 2000));
	close(fd);
	/* A wrong proof: an ERROR, and the connection is closed. */
	fd = hostile_connect(d->port);
	assert_int_equal(hostile_handshake(fd, KEY "-not", false, NULL, 0), 0);
	assert_int_equal(hostile_recv(fd, in, &in_len, 2000), LMT_MSG_ERROR);
	assert_non_null(strstr(reply_status(LMT_MSG_ERROR).text, "authentication failed"));
	assert_true(hostile_closed_by_peer(fd, 2000));
	close(fd);
	/* Keep-alives instead of a HELLO. */
	fd = hostile_connect(d->port);
	struct lmt_buf b = {0};
	assert_int_equal(lmt__enc_empty(&b, LMT_MSG_PING), 0);
	for (int i = 0; i < 40; i++)
		send(fd, b.data, b.len, MSG_NOSIGNAL);
	assert_true(hostile_closed_by_peer(fd, 2000));
	close(fd);
	lmt__buf_free(&b);
	/* One that connects and lingers through the real migration. */
	int lingering = hostile_connect(d->port);

	assert_false(guard_dest_done(d));
	assert_true(guard_ram_untouched(d));
	real_migration(d);
	assert_true(hostile_closed_by_peer(lingering, 2000));
	close(lingering);
	guard_dest_free(d);
	census_check(c0);
}

/* Without a key the first acceptable HELLO wins, but strangers that send
 * anything else before it are still dropped. */
static void test_probers_before_an_unkeyed_source(void **state)
{
	struct guard_dest *d = guard_dest_start(RAM_BYTES, "");
	source_opts[0] = '\0';
	close(hostile_connect(d->port));
	int fd = hostile_connect(d->port);
	hostile_send(fd, "\x01\x00\x00\x00\x05\x00\x00\x00garbage", 15);
	struct lmt_msg_status st;
	assert_int_equal(hostile_recv(fd, in, &in_len, 2000), LMT_MSG_HELLO_REPLY);
	st = reply_status(LMT_MSG_HELLO_REPLY);
	assert_int_equal(st.code, -LMT_EPROTO);
	close(fd);
	assert_true(guard_ram_untouched(d));
	real_migration(d);
	guard_dest_free(d);
}

/* ---- slowloris ---- */

/* The connection is made by the test's thread, before the destination
 * can stop listening: a thread may wait that long for a core. */
struct slow {
	int fd;
	int delay_ms;
	atomic_bool stop;
	size_t sent;
};

/* A valid HELLO, one byte at a time. */
static void *slowloris(void *arg)
{
	struct slow *sl = arg;
	struct lmt_msg_hello *m = hostile_hello(true);
	struct lmt_buf b = {0};
	assert_int_equal(lmt__enc_hello(&b, m), 0);
	int fd = sl->fd;
	for (size_t i = 0; i < b.len && !atomic_load(&sl->stop); i++) {
		if (send(fd, b.data + i, 1, MSG_NOSIGNAL) != 1)
			break;
		sl->sent++;
		usleep((useconds_t)sl->delay_ms * 1000);
	}
	close(fd);
	lmt__buf_free(&b);
	free(m);
	return NULL;
}

static void test_slowloris_does_not_delay_the_real_source(void **state)
{
	keyed("");
	struct guard_dest *d = guard_dest_start(RAM_BYTES, dest_opts);
	struct slow sl[3];
	pthread_t t[3];
	for (int i = 0; i < 3; i++) {
		sl[i] = (struct slow){.fd = hostile_connect(d->port), .delay_ms = 50};
		assert_int_equal(pthread_create(&t[i], NULL, slowloris, &sl[i]), 0);
	}
	usleep(100 * 1000);
	uint64_t t0 = lmt__now_ns();
	real_migration(d);
	/* Well before the slow HELLOs (about 6 s each) were through. */
	assert_true(lmt__now_ns() - t0 < 4000 * MS);
	for (int i = 0; i < 3; i++)
		assert_true(sl[i].sent < 100);
	for (int i = 0; i < 3; i++) {
		atomic_store(&sl[i].stop, true);
		pthread_join(t[i], NULL);
	}
	guard_dest_free(d);
}

/* Alone, a slow HELLO is cut off at connect-timeout after its accept,
 * however many bytes keep coming. */
static void test_slowloris_alone_ends_at_connect_timeout(void **state)
{
	keyed("connect-timeout=1s,idle-timeout=300ms");
	struct guard_dest *d = guard_dest_start(RAM_BYTES, dest_opts);
	struct slow sl = {.fd = hostile_connect(d->port), .delay_ms = 100};
	pthread_t t;
	assert_int_equal(pthread_create(&t, NULL, slowloris, &sl), 0);
	guard_dest_join(d);
	atomic_store(&sl.stop, true);
	pthread_join(t, NULL);
	uint64_t took = d->ended_ns - d->started_ns;
	if (d->rc != -LMT_ETIMEDOUT || !strstr(d->error, "no HELLO within connect-timeout"))
		fail_msg("destination %d '%s'", d->rc, d->error);
	assert_true(sl.sent >= 5);
	assert_true(took >= 900 * MS && took < 2500 * MS);
	assert_true(guard_ram_untouched(d));
	guard_dest_free(d);
}

/* A source that authenticated and then only keeps its control thread's
 * keep-alives going (its VMM stopped driving it): the destination gives
 * up after idle-timeout without progress. */
static void test_source_that_only_pings_is_cut_off(void **state)
{
	keyed("idle-timeout=1s");
	struct guard_dest *d = guard_dest_start(RAM_BYTES, dest_opts);
	struct guest_ram ram;
	ram_fill(&ram, RAM_BYTES, 5);
	lmt_session *s = session_on(LMT_ROLE_SOURCE, &ram, "tcp", source_opts);
	assert_int_equal(lmt_session_set_dirty_sync(s, guest_dirty_sync, &ram), 0);
	char uri[64];
	snprintf(uri, sizeof(uri), "127.0.0.1:%u", d->port);
	assert_int_equal(lmt_save_setup(s, uri), 0);
	uint64_t ready = lmt__now_ns();
	while (!guard_dest_done(d) && lmt__now_ns() - ready < 5000 * MS)
		usleep(20 * 1000);
	guard_dest_join(d);
	if (d->rc != -LMT_ETIMEDOUT || !strstr(d->error, "made no progress for 1000 ms"))
		fail_msg("destination %d '%s'", d->rc, d->error);
	uint64_t took = d->ended_ns - ready;
	assert_true(took >= 900 * MS && took < 2500 * MS);
	/* The source learns it at its next call. */
	struct lmt_iterate_result it;
	int rc = 0;
	for (int i = 0; i < 100 && rc == 0; i++) {
		rc = lmt_save_iterate(s, &it);
		usleep(10 * 1000);
	}
	assert_int_not_equal(rc, 0);
	lmt_session_free(s);
	ram_release(&ram);
	guard_dest_free(d);
}

/* ---- HELLO options ---- */

static int send_hello(struct guard_dest *d, struct lmt_msg_hello *m, char *text, size_t size)
{
	struct lmt_buf b = {0};
	int fd = hostile_connect(d->port);
	assert_int_equal(lmt__enc_hello(&b, m), 0);
	hostile_send_buf(fd, &b);
	assert_int_equal(hostile_recv(fd, in, &in_len, 2000), LMT_MSG_HELLO_REPLY);
	struct lmt_msg_status st = reply_status(LMT_MSG_HELLO_REPLY);
	snprintf(text, size, "%s", st.text);
	assert_true(hostile_closed_by_peer(fd, 2000));
	close(fd);
	lmt__buf_free(&b);
	return st.code;
}

static void set_option(struct lmt_msg_option *o, const char *name, const char *value)
{
	snprintf(o->name, sizeof(o->name), "%s", name);
	snprintf(o->value, sizeof(o->value), "%s", value);
}

static void test_duplicated_and_oversized_options_are_refused(void **state)
{
	keyed("");
	struct guard_dest *d = guard_dest_start(RAM_BYTES, dest_opts);
	char text[600];

	/* Four options, as many as the destination wants, but not the set. */
	struct lmt_msg_hello *m = hostile_hello(true);
	set_option(&m->options[2], "chunk-size", "1M");
	set_option(&m->options[3], "pin-all", "off");
	assert_int_equal(send_hello(d, m, text, sizeof(text)), -LMT_EPROTO);
	assert_string_equal(text, "chunk-size: the source sent it twice");
	free(m);

	/* The same option twice with another value each time. */
	m = hostile_hello(true);
	set_option(&m->options[4], "channels", "2");
	m->option_count = 5;
	assert_int_equal(send_hello(d, m, text, sizeof(text)), -LMT_EPROTO);
	assert_string_equal(text, "channels: the source sent it twice");
	free(m);

	/* One missing. */
	m = hostile_hello(true);
	m->option_count = 3;
	assert_int_equal(send_hello(d, m, text, sizeof(text)), -LMT_EMISMATCH);
	assert_string_equal(text, "verify: the source did not send it (both sides must agree on it)");
	free(m);

	/* A secret or local option offered as one to agree on. */
	m = hostile_hello(true);
	set_option(&m->options[4], "auth-key", KEY);
	m->option_count = 5;
	assert_int_equal(send_hello(d, m, text, sizeof(text)), -LMT_EPROTO);
	assert_string_equal(text, "auth-key: not an option both sides must agree on");
	free(m);

	/* As large as a HELLO gets: 64 options of the longest names and
	 * values. */
	m = hostile_hello(true);
	char name[64], value[256];
	memset(value, 'v', sizeof(value) - 1);
	value[sizeof(value) - 1] = 0;
	for (unsigned i = 4; i < LMT_PROTO_MAX_OPTIONS; i++) {
		snprintf(name, sizeof(name), "x%062u", i);
		set_option(&m->options[i], name, value);
	}
	m->option_count = LMT_PROTO_MAX_OPTIONS;
	assert_int_equal(send_hello(d, m, text, sizeof(text)), -LMT_EMISMATCH);
	assert_non_null(strstr(text, "the source sets an option this destination does not know"));
	free(m);

	/* More options than a HELLO may hold, counted in the payload. */
	m = hostile_hello(true);
	struct lmt_buf b = {0};
	assert_int_equal(lmt__enc_hello(&b, m), 0);
	b.data[8 + 4 + 2 + 2 + 3] = 65; /* the u32 count after magic, version, plugin */
	int fd = hostile_connect(d->port);
	hostile_send_buf(fd, &b);
	assert_int_equal(hostile_recv(fd, in, &in_len, 2000), LMT_MSG_HELLO_REPLY);
	assert_non_null(strstr(reply_status(LMT_MSG_HELLO_REPLY).text, "too many options"));
	close(fd);
	free(m);

	/* A header announcing a 2 MiB HELLO: dropped at the header. */
	fd = hostile_connect(d->port);
	uint8_t big[8] = {LMT_MSG_HELLO, 0, 0, 0, 0, 0, 0x20, 0};
	hostile_send(fd, big, sizeof(big));
	assert_true(hostile_closed_by_peer(fd, 2000));
	close(fd);
	lmt__buf_free(&b);

	assert_true(guard_ram_untouched(d));
	real_migration(d);
	guard_dest_free(d);
}

/* ---- the tcp plugin's data port ---- */

static void test_data_port_squatters(void **state)
{
	/* Each silent connection used to cost the source 2 s of a 3 s wait. */
	keyed("connect-timeout=3s");
	struct guard_dest *d = guard_dest_start(RAM_BYTES, dest_opts);
	struct guest_ram ram;
	ram_fill(&ram, RAM_BYTES, 99);
	struct hostile_source h;
	hostile_source_open(&h, d->port, KEY, &ram);
	int squat[8];
	for (int i = 0; i < 8; i++)
		squat[i] = hostile_connect(h.data_port);
	/* Two that say a hello with a guessed token. */
	uint8_t hello[24] = {'L', 'M', 'T', 'H', 1, 0};
	hostile_send(squat[6], hello, sizeof(hello));
	hostile_send(squat[7], hello, 10);
	usleep(100 * 1000);
	uint64_t t0 = lmt__now_ns();
	assert_int_equal(hostile_source_connect(&h), 0);
	assert_true(lmt__now_ns() - t0 < 1000 * MS);
	assert_int_equal(hostile_source_write_all(&h, &ram), 0);
	struct lmt_msg_complete *c = calloc(1, sizeof(*c));
	assert_int_equal(lmt__enc_complete(&h.out, c), 0);
	free(c);
	hostile_send_buf(h.fd, &h.out);
	assert_int_equal(hostile_recv(h.fd, in, &in_len, 5000), LMT_MSG_COMPLETE_ACK);
	assert_int_equal(reply_status(LMT_MSG_COMPLETE_ACK).code, 0);
	guard_dest_join(d);
	if (d->rc)
		fail_msg("destination %d '%s'", d->rc, d->error);
	assert_memory_equal(ram.base, d->ram.base, RAM_BYTES);
	for (int i = 0; i < 8; i++)
		close(squat[i]);
	hostile_source_close(&h);
	ram_release(&ram);
	guard_dest_free(d);
}

/* ---- device-state bombs ---- */

static void send_state(struct hostile_source *h, uint64_t offset, uint64_t total, uint32_t len)
{
	static uint8_t piece[64 << 10];
	memset(piece, 0xd5, sizeof(piece));
	struct lmt_msg_state m = {.offset = offset, .total = total, .length = len, .data = piece};
	assert_int_equal(lmt__enc_state(&h->out, &m), 0);
	/* The destination may already have hung up. */
	if (send(h->fd, h->out.data, h->out.len, MSG_NOSIGNAL) < 0)
		return;
}

/* An authenticated source sends `pieces` pieces of 64 KiB of a state of
 * `total` bytes, then COMPLETE; the destination must fail with `code` and
 * `text` and write nothing. */
static void state_bomb(const char *extra, uint64_t total, int pieces, int code, const char *text)
{
	keyed(extra);
	struct guard_dest *d = guard_dest_start(RAM_BYTES, dest_opts);
	struct guest_ram ram;
	guest_ram_layout(&ram, NULL, RAM_BYTES);
	struct hostile_source h;
	hostile_source_open(&h, d->port, KEY, &ram);
	assert_int_equal(hostile_source_connect(&h), 0);
	struct mallinfo2 before = mallinfo2();
	for (int i = 0; i < pieces; i++)
		send_state(&h, (uint64_t)i << 16, total, 64 << 10);
	struct lmt_msg_complete *c = calloc(1, sizeof(*c));
	c->state_length = total > LMT_PROTO_MAX_STATE ? 0 : total;
	assert_int_equal(lmt__enc_complete(&h.out, c), 0);
	free(c);
	send(h.fd, h.out.data, h.out.len, MSG_NOSIGNAL);
	uint64_t t0 = lmt__now_ns();
	guard_dest_join(d);
	assert_true(lmt__now_ns() - t0 < 5000 * MS);
	if (d->rc != -code || !strstr(d->error, text))
		fail_msg("destination %d '%s'; expected %d '%s'", d->rc, d->error, -code, text);
	/* What the destination holds for the state follows what arrived
	 * (under a sanitizer mallinfo2 says nothing, and this checks little). */
	struct mallinfo2 after = mallinfo2();
	size_t grew = (after.arena + after.hblkhd) - (before.arena + before.hblkhd);
	if (after.arena + after.hblkhd > before.arena + before.hblkhd && grew > (64u << 20))
		fail_msg("the destination's heap grew by %zu bytes", grew);
	assert_true(guard_ram_untouched(d));
	hostile_source_close(&h);
	guard_dest_free(d);
}

static void test_device_state_of_a_terabyte(void **state)
{
	state_bomb("", 1ull << 40, 1, LMT_EPROTO, "device state larger than 1G");
}

static void test_device_state_over_max_device_state(void **state)
{
	state_bomb("max-device-state=64K", 1ull << 20, 2, LMT_EOVERFLOW,
	           "the source announces 1048576 bytes, more than max-device-state (65536)");
}

static void test_device_state_announced_but_not_sent(void **state)
{
	state_bomb("", 1ull << 30, 2, LMT_EPROTO,
	           "device state: 1073741824 bytes announced, 131072 received");
}

/* After the bombs, a real migration with its device state. */
static void test_real_migration_with_device_state(void **state)
{
	keyed("max-device-state=1M");
	struct guard_dest *d = guard_dest_start(RAM_BYTES, dest_opts);
	real_migration(d);
	guard_dest_free(d);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_probers_before_the_real_source),
	        cmocka_unit_test(test_probers_before_an_unkeyed_source),
	        cmocka_unit_test(test_slowloris_does_not_delay_the_real_source),
	        cmocka_unit_test(test_slowloris_alone_ends_at_connect_timeout),
	        cmocka_unit_test(test_source_that_only_pings_is_cut_off),
	        cmocka_unit_test(test_duplicated_and_oversized_options_are_refused),
	        cmocka_unit_test(test_data_port_squatters),
	        cmocka_unit_test(test_device_state_of_a_terabyte),
	        cmocka_unit_test(test_device_state_over_max_device_state),
	        cmocka_unit_test(test_device_state_announced_but_not_sent),
	        cmocka_unit_test(test_real_migration_with_device_state),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
