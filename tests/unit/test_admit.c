/* The admission of connections that have yet to show who they are
 * (common/admit.c), on real loopback connections and a small table: who a
 * newcomer pushes out, what is never pushed out, deadlines, the first TLS
 * record, and a listener that cannot accept for want of descriptors. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "admit.h"

#define CAP 4
#define MS 1000000ull

struct dropped {
	unsigned n;
	unsigned id[64];
	enum lmt__admit_why why[64];
};

static bool on_drop(void *ctx, unsigned id, enum lmt__admit_why why)
{
	struct dropped *d = ctx;
	if (d->n < 64) {
		d->id[d->n] = id;
		d->why[d->n] = why;
	}
	d->n++;
	return false;
}

struct rig {
	int listen_fd;
	uint16_t port;
	struct lmt__admit *a;
	struct dropped dropped;
	int client[64]; /* the peers' ends, by the order they connected */
	unsigned nclients;
	unsigned id_of[64]; /* the admission id of each, once accepted */
};

static void rig_open(struct rig *r, uint64_t timeout_ns)
{
	memset(r, 0, sizeof(*r));
	r->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	assert_int_equal(bind(r->listen_fd, (struct sockaddr *)&a, sizeof(a)), 0);
	assert_int_equal(listen(r->listen_fd, 64), 0);
	socklen_t len = sizeof(a);
	getsockname(r->listen_fd, (struct sockaddr *)&a, &len);
	r->port = ntohs(a.sin_port);
	struct lmt__admit_limits lim = {.max = CAP,
	                                .opened_max = 2,
	                                .proven_max = 2,
	                                .timeout_ns = timeout_ns,
	                                .drop = on_drop,
	                                .ctx = &r->dropped};
	struct lmt__net_error e;
	assert_int_equal(lmt__admit_new(&r->a, r->listen_fd, &lim, &e), 0);
}

static void rig_close(struct rig *r)
{
	lmt__admit_free(r->a);
	for (unsigned i = 0; i < r->nclients; i++)
		close(r->client[i]);
	close(r->listen_fd);
}

/* A peer connects; the admission accepts it. Its id in r->id_of[]. */
static unsigned connect_one(struct rig *r)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(r->port)};
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	unsigned k = r->nclients++;
	r->client[k] = fd;
	unsigned ids[4];
	int n = 0;
	for (int tries = 0; tries < 100 && n == 0; tries++) {
		struct lmt__net_error e;
		n = lmt__admit_accept(r->a, ids, 1, &e);
		if (n == 0)
			usleep(1000);
	}
	assert_int_equal(n, 1);
	r->id_of[k] = ids[0];
	return k;
}

/* Whether the peer's end was closed by the admission. */
static bool closed(struct rig *r, unsigned k)
{
	struct pollfd p = {.fd = r->client[k], .events = POLLIN};
	if (poll(&p, 1, 200) != 1)
		return false;
	char b;
	return recv(r->client[k], &b, 1, MSG_DONTWAIT | MSG_PEEK) <= 0;
}

static void test_a_newcomer_pushes_out_the_oldest_silent_connection(void **state)
{
	struct rig r;
	rig_open(&r, 10000 * MS);
	for (int i = 0; i < CAP; i++)
		connect_one(&r);
	assert_int_equal(lmt__admit_count(r.a), CAP);
	connect_one(&r);
	assert_int_equal(r.dropped.n, 1);
	assert_int_equal(r.dropped.id[0], r.id_of[0]);
	assert_int_equal(r.dropped.why[0], LMT_ADMIT_CROWDED);
	assert_true(closed(&r, 0));
	assert_false(closed(&r, 1));
	assert_int_equal(lmt__admit_count(r.a), CAP);
	rig_close(&r);
}

/* Its owner has not read it yet, but it is not silent: the next oldest
 * goes instead. */
static void test_a_connection_with_bytes_waiting_is_moved_up_not_pushed_out(void **state)
{
	struct rig r;
	rig_open(&r, 10000 * MS);
	for (int i = 0; i < CAP; i++)
		connect_one(&r);
	assert_int_equal(send(r.client[0], "H", 1, 0), 1);
	usleep(10 * 1000);
	connect_one(&r);
	assert_int_equal(r.dropped.n, 1);
	assert_int_equal(r.dropped.id[0], r.id_of[1]);
	assert_int_equal(lmt__admit_level(r.a, r.id_of[0]), LMT_ADMIT_PARTIAL);
	rig_close(&r);
}

/* Partial ones go once no silent one is left; opened and proven ones are
 * never pushed out by a newcomer, which is refused instead. */
static void test_least_progress_goes_first_and_a_whole_first_message_never(void **state)
{
	struct rig r;
	rig_open(&r, 10000 * MS);
	for (int i = 0; i < CAP; i++)
		connect_one(&r);
	lmt__admit_promote(r.a, r.id_of[0], LMT_ADMIT_OPENED);
	lmt__admit_promote(r.a, r.id_of[1], LMT_ADMIT_PROVEN);
	lmt__admit_promote(r.a, r.id_of[2], LMT_ADMIT_PARTIAL);
	connect_one(&r); /* pushes out 3, the only silent one */
	assert_int_equal(r.dropped.id[0], r.id_of[3]);
	lmt__admit_promote(r.a, r.id_of[4], LMT_ADMIT_PARTIAL);
	connect_one(&r); /* pushes out 2, the oldest partial one */
	assert_int_equal(r.dropped.n, 2);
	assert_int_equal(r.dropped.id[1], r.id_of[2]);
	lmt__admit_promote(r.a, r.id_of[4], LMT_ADMIT_OPENED);
	lmt__admit_promote(r.a, r.id_of[5], LMT_ADMIT_PROVEN);
	/* Every place has a whole first message: the newcomer is refused. */
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(r.port)};
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	unsigned ids[1];
	struct lmt__net_error e;
	int n = 0;
	for (int tries = 0; tries < 50 && lmt__admit_counts(r.a).refused == 0; tries++) {
		n = lmt__admit_accept(r.a, ids, 1, &e);
		usleep(1000);
	}
	assert_int_equal(n, 0);
	assert_int_equal(lmt__admit_counts(r.a).refused, 1);
	assert_int_equal(r.dropped.n, 2);
	assert_int_equal(lmt__admit_count(r.a), CAP);
	close(fd);
	rig_close(&r);
}

/* A level that is full makes room among its own: the oldest goes. */
static void test_a_full_level_pushes_out_its_own_oldest(void **state)
{
	struct rig r;
	rig_open(&r, 10000 * MS);
	for (int i = 0; i < 3; i++)
		connect_one(&r);
	lmt__admit_promote(r.a, r.id_of[0], LMT_ADMIT_OPENED);
	lmt__admit_promote(r.a, r.id_of[1], LMT_ADMIT_OPENED);
	lmt__admit_promote(r.a, r.id_of[2], LMT_ADMIT_OPENED);
	assert_int_equal(r.dropped.n, 1);
	assert_int_equal(r.dropped.id[0], r.id_of[0]);
	assert_int_equal(lmt__admit_level(r.a, r.id_of[2]), LMT_ADMIT_OPENED);
	/* Promotion only moves up. */
	lmt__admit_promote(r.a, r.id_of[2], LMT_ADMIT_PARTIAL);
	assert_int_equal(lmt__admit_level(r.a, r.id_of[2]), LMT_ADMIT_OPENED);
	rig_close(&r);
}

static void test_a_connection_past_its_deadline_is_closed_through_drop(void **state)
{
	struct rig r;
	rig_open(&r, 50 * MS);
	connect_one(&r);
	lmt__admit_promote(r.a, r.id_of[0], LMT_ADMIT_PROVEN);
	lmt__admit_expire(r.a, lmt__now_ns());
	assert_int_equal(r.dropped.n, 0);
	usleep(80 * 1000);
	lmt__admit_expire(r.a, lmt__now_ns());
	assert_int_equal(r.dropped.n, 1);
	assert_int_equal(r.dropped.why[0], LMT_ADMIT_TIMED_OUT);
	assert_int_equal(lmt__admit_count(r.a), 0);
	assert_true(closed(&r, 0));
	rig_close(&r);
}

/* What arrives is reported, and a peer that closes is seen as such. */
static void test_wait_reports_bytes_and_a_hang_up(void **state)
{
	struct rig r;
	rig_open(&r, 10000 * MS);
	connect_one(&r);
	connect_one(&r);
	assert_int_equal(send(r.client[1], "xy", 2, 0), 2);
	unsigned ready[4];
	bool listener;
	int n = lmt__admit_wait(r.a, 500, ready, 4, &listener);
	assert_int_equal(n, 1);
	assert_int_equal(ready[0], r.id_of[1]);
	char buf[4];
	assert_int_equal(lmt__admit_peek(lmt__admit_fd(r.a, ready[0]), buf, sizeof(buf)), 2);
	assert_int_equal(lmt__admit_pending(r.a, ready[0], 2), 0);
	assert_int_equal(lmt__admit_level(r.a, ready[0]), LMT_ADMIT_PARTIAL);
	close(r.client[1]);
	r.client[1] = -1;
	n = lmt__admit_wait(r.a, 500, ready, 4, &listener);
	assert_int_equal(n, 1);
	/* Two bytes of a message, then the end: it will never be whole. */
	assert_int_equal(lmt__admit_pending(r.a, ready[0], 2), -1);
	assert_int_equal(errno, 0);
	rig_close(&r);
}

static void test_a_client_hello_record_is_recognized(void **state)
{
	const uint8_t hello[6] = {0x16, 3, 1, 0x01, 0x20, 1};
	const uint8_t alert[6] = {0x15, 3, 3, 0, 2, 2};
	const uint8_t server_hello[6] = {0x16, 3, 3, 0, 0x7a, 2};
	const uint8_t huge[6] = {0x16, 3, 1, 0x40, 0x01, 1};
	const uint8_t plain[6] = {1, 0, 0, 0, 0x20, 0};
	assert_int_equal(lmt__admit_client_hello(hello), 5 + 0x120);
	assert_int_equal(lmt__admit_client_hello(alert), 0);
	assert_int_equal(lmt__admit_client_hello(server_hello), 0);
	assert_int_equal(lmt__admit_client_hello(huge), 0);
	assert_int_equal(lmt__admit_client_hello(plain), 0);
}

/* Out of descriptors with nothing to close: the listener is left alone
 * for a while rather than reported ready again at once. */
static void test_accept_out_of_descriptors_with_nothing_to_close_pauses(void **state)
{
	struct rig r;
	rig_open(&r, 10000 * MS);
	struct rlimit old;
	getrlimit(RLIMIT_NOFILE, &old);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(r.port)};
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	/* Every descriptor the limit allows is taken. */
	int probe = dup(0);
	struct rlimit low = {.rlim_cur = (rlim_t)probe + 16, .rlim_max = old.rlim_max};
	close(probe);
	assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0);
	int spare[64];
	unsigned nspare = 0;
	while (nspare < 64 && (spare[nspare] = dup(0)) >= 0)
		nspare++;
	assert_true(nspare < 64);
	unsigned ids[1], ready[4];
	bool listener = false;
	struct lmt__net_error e;
	assert_int_equal(lmt__admit_wait(r.a, 200, ready, 4, &listener), 0);
	assert_true(listener);
	assert_int_equal(lmt__admit_accept(r.a, ids, 1, &e), -LMT_EIO);
	assert_non_null(strstr(e.msg, "accept: "));
	uint64_t t0 = lmt__now_ns();
	assert_int_equal(lmt__admit_wait(r.a, 200, ready, 4, &listener), 0);
	assert_false(listener);
	assert_true(lmt__now_ns() - t0 >= 5 * MS);
	assert_int_equal(setrlimit(RLIMIT_NOFILE, &old), 0);
	for (unsigned i = 0; i < nspare; i++)
		close(spare[i]);
	/* Back in the epoll set: the connection is taken. */
	int n = 0;
	for (int tries = 0; tries < 20 && n == 0; tries++) {
		lmt__admit_wait(r.a, 50, ready, 4, &listener);
		n = lmt__admit_accept(r.a, ids, 1, &e);
	}
	assert_int_equal(n, 1);
	close(fd);
	rig_close(&r);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_a_newcomer_pushes_out_the_oldest_silent_connection),
	        cmocka_unit_test(test_a_connection_with_bytes_waiting_is_moved_up_not_pushed_out),
	        cmocka_unit_test(test_least_progress_goes_first_and_a_whole_first_message_never),
	        cmocka_unit_test(test_a_full_level_pushes_out_its_own_oldest),
	        cmocka_unit_test(test_a_connection_past_its_deadline_is_closed_through_drop),
	        cmocka_unit_test(test_wait_reports_bytes_and_a_hang_up),
	        cmocka_unit_test(test_a_client_hello_record_is_recognized),
	        cmocka_unit_test(test_accept_out_of_descriptors_with_nothing_to_close_pauses),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
