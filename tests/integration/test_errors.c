/* The one rule of error codes (docs/embedding.md, "Error codes"), case by
 * case: this side's cancel is LMT_ECANCELED and the peer's is LMT_EPEER
 * quoting it, a stalled destination is seen by the source as a timeout,
 * a peer that is silent is told apart from one that only keeps alive, and
 * a server that is not lmt is named with what it sent. In every case one
 * code everywhere: the failing call's, the FAILED event's (exactly one),
 * lmt_session_error's, and the status (cancelled exactly for
 * LMT_ECANCELED). The cases that depend on the transport run over
 * LMT_TEST_PLUGIN (errors-<variant>); the others only over tcp. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define RAM_BYTES (8ull << 20)
#define MS 1000000ull

static bool over_tcp(void)
{
	return strcmp(test_plugin(), "tcp") == 0;
}

#define TCP_ONLY()                                                                                 \
	do {                                                                                       \
		if (!over_tcp()) {                                                                 \
			print_message("    (transport-independent: run by errors-tcp)\n");         \
			return;                                                                    \
		}                                                                                  \
	} while (0)

/* The rule, on one session whose call failed with `rc`. */
static void assert_one_code(lmt_session *s, int rc, int want, const char *says)
{
	const struct lmt_error *e = lmt_session_error(s);
	if (rc != want || e->code != want)
		fail_msg("expected %s, the call gave %s and the error %s: %s", lmt_err_name(want),
		         lmt_err_name(rc), lmt_err_name(e->code), e->message);
	if (says && !strstr(e->message, says))
		fail_msg("the error does not say '%s': %s", says, e->message);
	int failed = 0;
	struct lmt_event ev;
	while (lmt_session_next_event(s, &ev) == 1) {
		if (ev.type != LMT_EVENT_FAILED)
			continue;
		failed++;
		if (ev.code != want)
			fail_msg("the FAILED event has %s, the call %s", lmt_err_name(ev.code),
			         lmt_err_name(want));
	}
	assert_int_equal(failed, 1);
	struct lmt_stats st;
	assert_int_equal(lmt_session_stats(s, &st), 0);
	assert_int_equal(st.status,
	                 want == -LMT_ECANCELED ? LMT_STATUS_CANCELLED : LMT_STATUS_FAILED);
}

/* ---- a destination on a thread of this process ---- */

struct dest {
	lmt_session *s;
	struct guest_ram ram;
	pthread_t thread;
	int rc;
	_Atomic bool done;
	uint64_t ended_ns;
};

static void *dest_run(void *arg)
{
	struct dest *d = arg;
	d->rc = lmt_load_run(d->s);
	d->ended_ns = guest_now_ns();
	atomic_store(&d->done, true);
	return NULL;
}

static uint16_t dest_start(struct dest *d, const char *plugin, const char *opts)
{
	memset(d, 0, sizeof(*d));
	guest_ram_layout(&d->ram, ram_map(RAM_BYTES), RAM_BYTES);
	d->s = session_on(LMT_ROLE_DESTINATION, &d->ram, plugin, opts);
	uint16_t port = 0;
	assert_int_equal(lmt_load_listen(d->s, "127.0.0.1:0", &port), 0);
	assert_int_equal(pthread_create(&d->thread, NULL, dest_run, d), 0);
	return port;
}

static void dest_join(struct dest *d)
{
	assert_int_equal(pthread_join(d->thread, NULL), 0);
}

static void dest_free(struct dest *d)
{
	lmt_session_free(d->s);
	munmap(d->ram.base, RAM_BYTES);
}

/* Iterate, then complete, until a call fails (or 15 s pass); `at`
 * iterations in (0: never), call `hook`. */
static int source_run(lmt_session *s, int at, void (*hook)(void *), void *arg)
{
	struct lmt_iterate_result it = {0};
	uint64_t t0 = guest_now_ns();
	int rc = 0;
	for (int i = 1; rc == 0 && !it.ready && guest_now_ns() - t0 < 15000 * MS; i++) {
		if (i == at)
			hook(arg);
		rc = lmt_save_iterate(s, &it);
	}
	return rc ? rc : lmt_save_complete(s, "cpu", 3);
}

static void cancel_session(void *arg)
{
	lmt_cancel(arg);
}

/* ---- a destination in a child process that cancels itself when told ---- */

/* A destination that tears down first must be in another process: over
 * shared memory (ofi's shm) a peer in the same process is mapped by its
 * own pointers, and the source's progress would touch what it unmapped
 * (docs/ofi.md). */
struct child {
	pid_t pid;
	int tell;   /* a byte here: cancel */
	int answer; /* the child's verdict on the rule, a line of text */
};

static void child_verdict(lmt_session *d, int rc, int fd)
{
	char line[700];
	const struct lmt_error *e = lmt_session_error(d);
	int failed = 0, event = 0;
	struct lmt_event ev;
	while (lmt_session_next_event(d, &ev) == 1)
		if (ev.type == LMT_EVENT_FAILED && ++failed)
			event = ev.code;
	struct lmt_stats st;
	lmt_session_stats(d, &st);
	bool ok = rc == -LMT_ECANCELED && e->code == rc && failed == 1 && event == rc &&
	          st.status == LMT_STATUS_CANCELLED;
	snprintf(line, sizeof(line), "%s call %s, error %s, %d FAILED (%s), status %s: %s",
	         ok ? "ok" : "wrong", lmt_err_name(rc), lmt_err_name(e->code), failed,
	         lmt_err_name(event), lmt_status_name(st.status), e->message);
	if (write(fd, line, strlen(line) + 1) < 0)
		_exit(2);
}

static void *child_canceller(void *arg)
{
	lmt_session *d = ((void **)arg)[0];
	int fd = *(int *)((void **)arg)[1];
	char byte;
	if (read(fd, &byte, 1) == 1)
		lmt_cancel(d);
	return NULL;
}

static uint16_t child_start(struct child *c)
{
	int port_pipe[2], tell[2], answer[2];
	assert_int_equal(pipe(port_pipe), 0);
	assert_int_equal(pipe(tell), 0);
	assert_int_equal(pipe(answer), 0);
	fflush(NULL);
	c->pid = fork();
	assert_true(c->pid >= 0);
	if (c->pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		struct guest_ram ram;
		guest_ram_layout(&ram, ram_map(RAM_BYTES), RAM_BYTES);
		lmt_session *d =
		        session_on(LMT_ROLE_DESTINATION, &ram, test_plugin(), "idle-timeout=5s");
		uint16_t port = 0;
		if (lmt_load_listen(d, "127.0.0.1:0", &port) ||
		    write(port_pipe[1], &port, sizeof(port)) != sizeof(port))
			_exit(2);
		pthread_t t;
		void *args[2] = {d, &tell[0]};
		if (pthread_create(&t, NULL, child_canceller, args))
			_exit(2);
		int rc = lmt_load_run(d);
		child_verdict(d, rc, answer[1]);
		_exit(0); /* the canceller may still wait: the process ends it */
	}
	close(port_pipe[1]);
	close(tell[0]);
	close(answer[1]);
	uint16_t port = 0;
	assert_int_equal(read(port_pipe[0], &port, sizeof(port)), sizeof(port));
	close(port_pipe[0]);
	c->tell = tell[1];
	c->answer = answer[0];
	return port;
}

static void child_cancel(void *arg)
{
	struct child *c = arg;
	assert_int_equal(write(c->tell, "c", 1), 1);
}

/* The child must have failed by the rule: LMT_ECANCELED everywhere. */
static void child_end(struct child *c)
{
	char line[700] = "";
	ssize_t n = read(c->answer, line, sizeof(line) - 1);
	line[n > 0 ? n : 0] = '\0';
	close(c->answer);
	close(c->tell);
	int status = 0;
	assert_int_equal(waitpid(c->pid, &status, 0), c->pid);
	if (strncmp(line, "ok ", 3) != 0)
		fail_msg("the cancelled destination: %s", *line ? line : "no verdict");
}

/* ---- cancels: this side's, and the peer's ---- */

static void cancel_round(bool destination_cancels, uint64_t seed)
{
	struct guest_ram src;
	ram_fill(&src, RAM_BYTES, seed);
	/* 4 MiB/s: a pass takes two seconds, the cancel comes 250 ms in. */
	const char *opts = "max-bandwidth=4M,idle-timeout=5s";
	if (destination_cancels) {
		struct child c;
		lmt_session *s = source_set_up(&src, opts, child_start(&c));
		int rc = source_run(s, 5, child_cancel, &c);
		assert_one_code(s, rc, -LMT_EPEER, "the destination cancelled the migration");
		print_message("    %s\n", lmt_session_error(s)->message);
		child_end(&c);
		lmt_session_free(s);
	} else {
		struct dest d;
		lmt_session *s = source_set_up(&src, opts, dest_start(&d, test_plugin(), opts));
		int rc = source_run(s, 5, cancel_session, s);
		dest_join(&d);
		assert_one_code(s, rc, -LMT_ECANCELED, NULL);
		assert_one_code(d.s, d.rc, -LMT_EPEER, "the source cancelled the migration");
		print_message("    %s\n", lmt_session_error(d.s)->message);
		lmt_session_free(s);
		dest_free(&d);
	}
	ram_release(&src);
}

/* Several rounds: the peer's ERROR and its closed channels race. */
static void test_the_peers_cancel_is_lmt_epeer_and_this_sides_is_lmt_ecanceled(void **state)
{
	for (uint64_t round = 0; round < 4; round++) {
		cancel_round(true, 10 + round);
		cancel_round(false, 20 + round);
	}
}

/* Between the source's calls: the FAILED event comes without a call, and
 * the next call returns the same code. */
static void test_the_peers_cancel_between_calls_is_an_lmt_epeer_event(void **state)
{
	struct guest_ram src;
	ram_fill(&src, RAM_BYTES, 30);
	struct child c;
	lmt_session *s = source_set_up(&src, "max-bandwidth=4M,idle-timeout=5s", child_start(&c));
	struct lmt_iterate_result it;
	for (int i = 0; i < 3; i++)
		assert_int_equal(lmt_save_iterate(s, &it), 0);
	struct lmt_event ev;
	while (lmt_session_next_event(s, &ev) == 1)
		assert_int_not_equal(ev.type, LMT_EVENT_FAILED);
	child_cancel(&c);
	bool failed = false;
	for (int i = 0; i < 500 && !failed; i++) {
		struct lmt_stats st;
		assert_int_equal(lmt_session_stats(s, &st), 0);
		failed = st.status == LMT_STATUS_FAILED;
		if (!failed)
			usleep(10000);
	}
	assert_true(failed);
	int rc = lmt_save_iterate(s, &it);
	assert_one_code(s, rc, -LMT_EPEER, "the destination cancelled the migration");
	child_end(&c);
	lmt_session_free(s);
	ram_release(&src);
}

/* ---- a destination whose engine stalls ---- */

/* The destination (chaos:<plugin>) stops making progress from its first
 * progress call: the source must fail at its bound, naming what it waited
 * for, and the destination must not sit out its 60 s stall. */
static void destination_stalls(const char *pin, const char *waited_for)
{
	char plugin[64], dopts[256], sopts[128];
	snprintf(plugin, sizeof(plugin), "chaos:%s", test_plugin());
	snprintf(sopts, sizeof(sopts), "idle-timeout=1s,switchover-timeout=2s,pin-all=%s", pin);
	snprintf(dopts, sizeof(dopts), "%s,chaos.fault=stall,chaos.at=progress:1,chaos.stall=60s",
	         sopts);
	struct guest_ram src;
	ram_fill(&src, RAM_BYTES, 31);
	struct dest d;
	uint16_t port = dest_start(&d, plugin, dopts);
	lmt_session *s = source_set_up(&src, sopts, port);
	uint64_t t0 = guest_now_ns();
	int rc = source_run(s, 0, NULL, NULL);
	uint64_t took = guest_now_ns() - t0;
	assert_one_code(s, rc, -LMT_ETIMEDOUT, waited_for);
	print_message("    pin-all=%s: the source failed after %llu ms: %s\n", pin,
	              (unsigned long long)(took / MS), lmt_session_error(s)->message);
	assert_true(took < 10000 * MS); /* far short of the 60 s stall */
	lmt_session_free(s);
	dest_join(&d);
	/* Not after its stall: once the source has gone, at once. */
	if (d.ended_ns > t0 + took + 3000 * MS)
		fail_msg("the destination failed %llu ms after the source: %s",
		         (unsigned long long)((d.ended_ns - t0 - took) / MS),
		         lmt_session_error(d.s)->message);
	assert_one_code(d.s, d.rc, -LMT_EPEER, "the source failed (LMT_ETIMEDOUT there)");
	ram_release(&src);
	dest_free(&d);
}

static void test_a_destination_that_stops_making_progress_is_a_stalled_peer(void **state)
{
	/* Without pin-all it answers no key request; with it, its
	 * transport may land every write, but it never acknowledges the
	 * completion. */
	destination_stalls("off", "the destination did not answer a key request for 1000 ms");
	destination_stalls(
	        "on", "waiting for COMPLETE_ACK: the destination sent nothing but keep-alives");
}

/* ---- silence, and keep-alives only ---- */

/* A source in a child process: set up, a few iterate calls, then `end`:
 * stop itself (frozen: nothing more is sent) or sleep (its control thread
 * keeps the connection alive). */
static pid_t source_child(uint16_t port, bool freeze)
{
	fflush(NULL);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid)
		return pid;
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	struct guest_ram ram;
	ram_fill(&ram, RAM_BYTES, 41);
	lmt_session *s = source_set_up(&ram, "max-bandwidth=1M,idle-timeout=1s", port);
	struct lmt_iterate_result it;
	for (int i = 0; i < 3; i++)
		if (lmt_save_iterate(s, &it))
			_exit(3);
	if (freeze)
		raise(SIGSTOP);
	for (;;)
		pause();
}

static void quiet_source(bool freeze, const char *says, const char *never)
{
	struct dest d;
	uint16_t port = dest_start(&d, "tcp", "idle-timeout=1s");
	pid_t child = source_child(port, freeze);
	dest_join(&d);
	kill(child, SIGKILL);
	waitpid(child, NULL, 0);
	assert_one_code(d.s, d.rc, -LMT_ETIMEDOUT, says);
	if (strstr(lmt_session_error(d.s)->message, never))
		fail_msg("the error says '%s': %s", never, lmt_session_error(d.s)->message);
	print_message("    %s\n", lmt_session_error(d.s)->message);
	dest_free(&d);
}

static void test_a_frozen_source_is_silence_not_keep_alives(void **state)
{
	TCP_ONLY();
	quiet_source(true, "the source said nothing for 1000 ms", "keep-alive");
}

static void test_a_source_that_only_keeps_alive_is_told_apart(void **state)
{
	TCP_ONLY();
	quiet_source(false, "nothing but keep-alives (the last ", "said nothing");
}

/* ---- a server that is not lmt ---- */

struct stranger {
	int listen_fd;
	uint16_t port;
	const char *says;
	size_t says_len;
	bool first; /* speaks before it is spoken to (SSH) */
	pthread_t thread;
};

static void *stranger_run(void *arg)
{
	struct stranger *k = arg;
	int fd = accept(k->listen_fd, NULL, NULL);
	if (fd < 0)
		return NULL;
	char buf[512];
	if (!k->first && recv(fd, buf, sizeof(buf), 0) <= 0) {
		close(fd);
		return NULL;
	}
	if (send(fd, k->says, k->says_len, MSG_NOSIGNAL) < 0) {
		/* the source hung up first: its test fails on its own */
	}
	/* Keep the connection until the source closes it. */
	while (recv(fd, buf, sizeof(buf), 0) > 0)
		;
	close(fd);
	return NULL;
}

static void stranger_start(struct stranger *k, const char *says, size_t len, bool first)
{
	*k = (struct stranger){.says = says, .says_len = len, .first = first};
	k->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_true(k->listen_fd >= 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t alen = sizeof(a);
	assert_int_equal(bind(k->listen_fd, (struct sockaddr *)&a, sizeof(a)), 0);
	assert_int_equal(listen(k->listen_fd, 1), 0);
	assert_int_equal(getsockname(k->listen_fd, (struct sockaddr *)&a, &alen), 0);
	k->port = ntohs(a.sin_port);
	assert_int_equal(pthread_create(&k->thread, NULL, stranger_run, k), 0);
}

static void not_lmt(const char *says, size_t len, bool first, const char *quoted)
{
	struct census before = census_take();
	struct stranger k;
	stranger_start(&k, says, len, first);
	struct guest_ram ram;
	ram_fill(&ram, RAM_BYTES, 51);
	lmt_session *s = session_on(LMT_ROLE_SOURCE, &ram, "tcp", "connect-timeout=2s");
	assert_int_equal(lmt_session_set_dirty_sync(s, guest_dirty_sync, &ram), 0);
	char uri[64], want[256];
	snprintf(uri, sizeof(uri), "127.0.0.1:%u", k.port);
	snprintf(want, sizeof(want),
	         "the peer at 127.0.0.1:%u is not an lmt destination (it sent '%s')", k.port,
	         quoted);
	int rc = lmt_save_setup(s, uri);
	assert_one_code(s, rc, -LMT_EPROTO, want);
	print_message("    %s\n", lmt_session_error(s)->message);
	lmt_session_free(s);
	pthread_join(k.thread, NULL);
	close(k.listen_fd);
	ram_release(&ram);
	census_check(before);
}

static void test_a_server_that_is_not_lmt_is_named_with_what_it_sent(void **state)
{
	TCP_ONLY();
	static const char http[] = "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n";
	not_lmt(http, sizeof(http) - 1, false, "HTTP/1.1 400 Bad Request...");
	static const char ssh[] = "SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n";
	not_lmt(ssh, sizeof(ssh) - 1, true, "SSH-2.0-OpenSSH_9.2p1 Debian-2...");
	/* Bytes that are not text are shown as such, never printed raw. */
	static const char tls[] = "\x15\x03\x03\x00\x02\x02\x46'\\x";
	not_lmt(tls, sizeof(tls) - 1, false, "\\x15\\x03\\x03\\x00\\x02\\x02F\\x27\\x5cx");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(
	                test_the_peers_cancel_is_lmt_epeer_and_this_sides_is_lmt_ecanceled),
	        cmocka_unit_test(test_the_peers_cancel_between_calls_is_an_lmt_epeer_event),
	        cmocka_unit_test(test_a_destination_that_stops_making_progress_is_a_stalled_peer),
	        cmocka_unit_test(test_a_frozen_source_is_silence_not_keep_alives),
	        cmocka_unit_test(test_a_source_that_only_keeps_alive_is_told_apart),
	        cmocka_unit_test(test_a_server_that_is_not_lmt_is_named_with_what_it_sent),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
