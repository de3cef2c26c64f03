/* What a VMM embedding lmt may count on between and around its calls: the
 * session keeps the peer's keep-alives going while the VMM is away; it
 * reports setup, passes, readiness, completion and failure as events on a
 * descriptor an event loop can poll, or through a callback that may be set,
 * changed or removed while a job runs; a switchover asked before READY;
 * and no call outlasts its bound when a channel stalls (idle-timeout) or
 * the switchover drags on with the guest paused (switchover-timeout). */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#define RAM_BYTES (8ull << 20)
#define MS 1000000ull
#define QUICK "idle-timeout=1s,connect-timeout=5s"

static void sleep_ms(uint64_t ms)
{
	struct timespec ts = {.tv_sec = (time_t)(ms / 1000),
	                      .tv_nsec = (long)(ms % 1000) * 1000000};
	while (nanosleep(&ts, &ts) != 0)
		;
}

static void iterate_until_ready(lmt_session *s)
{
	struct lmt_iterate_result it = {0};
	while (!it.ready)
		if (lmt_save_iterate(s, &it))
			fail_msg("iterate: %s", lmt_session_error(s)->message);
}

static bool readable(int fd, int timeout_ms)
{
	struct pollfd p = {.fd = fd, .events = POLLIN};
	return poll(&p, 1, timeout_ms) == 1 && (p.revents & POLLIN);
}

/* Away for most of an idle-timeout between calls, twice. Longer, and the
 * destination gives up on a source that only sends keep-alives (see
 * tests/security: test_source_that_only_pings_is_cut_off). */
static void test_a_vmm_away_between_calls_within_idle_timeout_loses_nothing(void **state)
{
	struct guest_ram ram;
	ram_fill(&ram, RAM_BYTES, 11);
	uint16_t port;
	struct dest_spec spec = {.ram_bytes = RAM_BYTES, .options = QUICK};
	pid_t pid = dest_spawn(&spec, &port);
	lmt_session *s = source_set_up(&ram, QUICK, port);
	sleep_ms(700); /* after setup, before the first pass */
	iterate_until_ready(s);
	sleep_ms(700); /* ready, while the VMM quiesces its devices */
	if (lmt_save_complete(s, "cpu", 3))
		fail_msg("complete after idle gaps: %s", lmt_session_error(s)->message);
	lmt_session_free(s);
	assert_int_equal(dest_wait(pid), 0);
	ram_release(&ram);
}

static void test_source_events_come_in_order_and_the_descriptor_follows_the_queue(void **state)
{
	struct guest_ram ram;
	ram_fill(&ram, RAM_BYTES, 12);
	uint16_t port;
	struct dest_spec spec = {.ram_bytes = RAM_BYTES, .options = ""};
	pid_t pid = dest_spawn(&spec, &port);
	lmt_session *s = source_set_up(&ram, "", port);
	int fd = lmt_session_event_fd(s);
	assert_true(fd >= 0);
	assert_true(readable(fd, 0)); /* setup done is waiting */
	iterate_until_ready(s);
	assert_int_equal(lmt_save_complete(s, "cpu", 3), 0);
	struct lmt_event ev;
	enum lmt_event_type seen[64];
	int n = 0;
	while (n < 64 && lmt_session_next_event(s, &ev) == 1)
		seen[n++] = ev.type;
	assert_false(readable(fd, 0));
	assert_int_equal(lmt_session_next_event(s, &ev), 0);
	assert_true(n >= 4);
	assert_int_equal(seen[0], LMT_EVENT_SETUP_DONE);
	assert_int_equal(seen[n - 1], LMT_EVENT_COMPLETED);
	int passes = 0, ready_at = -1;
	for (int i = 1; i < n - 1; i++) {
		if (seen[i] == LMT_EVENT_PASS_END)
			passes++;
		else if (seen[i] == LMT_EVENT_READY)
			ready_at = i;
		else
			fail_msg("event %d is of type %d", i, (int)seen[i]);
	}
	/* Every pass ends with an event, the final one included. */
	assert_int_equal(passes, lmt_session_passes(s, NULL, 0));
	assert_true(ready_at > 1);
	lmt_session_free(s);
	assert_int_equal(dest_wait(pid), 0);
	ram_release(&ram);
}

struct loader {
	lmt_session *s;
	int rc;
};

static void *run_load(void *arg)
{
	struct loader *l = arg;
	l->rc = lmt_load_run(l->s);
	return NULL;
}

/* The source of a child process, to completion. */
static pid_t source_child(uint16_t port, uint64_t seed)
{
	fflush(NULL);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid)
		return pid;
	struct guest_ram ram;
	ram_fill(&ram, RAM_BYTES, seed);
	uint64_t none = 0;
	struct source_run r = source_migrate(&ram, "", port, "cpu", 3, 0, 0, &none);
	_exit(r.rc ? 1 : 0);
}

static void test_destination_loop_learns_setup_and_completion_from_the_descriptor(void **state)
{
	struct guest_ram ram;
	guest_ram_layout(&ram, ram_map(RAM_BYTES), RAM_BYTES);
	lmt_session *s = session_with_blocks(LMT_ROLE_DESTINATION, &ram, "");
	uint16_t port = 0;
	assert_int_equal(lmt_load_listen(s, "127.0.0.1:0", &port), 0);
	int fd = lmt_session_event_fd(s);
	struct loader l = {.s = s};
	pthread_t t;
	assert_int_equal(pthread_create(&t, NULL, run_load, &l), 0);
	pid_t pid = source_child(port, 13);
	enum lmt_event_type got[2];
	int n = 0;
	while (n < 2 && readable(fd, 20000)) {
		struct lmt_event ev;
		while (n < 2 && lmt_session_next_event(s, &ev) == 1)
			got[n++] = ev.type;
	}
	assert_int_equal(n, 2);
	assert_int_equal(got[0], LMT_EVENT_SETUP_DONE);
	assert_int_equal(got[1], LMT_EVENT_COMPLETED);
	pthread_join(t, NULL);
	assert_int_equal(l.rc, 0);
	assert_int_equal(dest_wait(pid), 0);
	lmt_session_free(s);
	munmap(ram.base, RAM_BYTES);
}

static void test_a_peer_dying_between_calls_is_an_event_without_any_call(void **state)
{
	struct guest_ram ram;
	ram_fill(&ram, RAM_BYTES, 14);
	uint16_t port;
	struct dest_spec spec = {.ram_bytes = RAM_BYTES, .options = QUICK};
	pid_t pid = dest_spawn(&spec, &port);
	lmt_session *s = source_set_up(&ram, QUICK, port);
	struct lmt_event ev;
	while (lmt_session_next_event(s, &ev) == 1)
		;
	kill(pid, SIGKILL);
	assert_int_equal(dest_wait(pid), 128 + SIGKILL);
	/* No lmt call from here until the event. */
	uint64_t t0 = guest_now_ns();
	assert_true(readable(lmt_session_event_fd(s), 5000));
	assert_int_equal(lmt_session_next_event(s, &ev), 1);
	assert_int_equal(ev.type, LMT_EVENT_FAILED);
	assert_int_equal(ev.code, -LMT_ECONN);
	assert_int_equal(lmt_session_error(s)->code, -LMT_ECONN);
	assert_true(guest_now_ns() - t0 < 3000 * MS);
	struct lmt_stats st;
	assert_int_equal(lmt_session_stats(s, &st), 0);
	assert_int_equal(st.status, LMT_STATUS_FAILED);
	/* The next call reports it and releases the session's resources. */
	struct lmt_iterate_result it;
	assert_int_equal(lmt_save_iterate(s, &it), -LMT_ECONN);
	/* Whichever noticed first: the control connection or a data channel. */
	assert_non_null(strstr(lmt_session_error(s)->message, "closed by peer"));
	lmt_session_free(s);
	ram_release(&ram);
}

struct tally {
	pthread_mutex_t lock;
	int count[LMT_EVENT_FAILED + 1];
};

static void count_event(void *opaque, const struct lmt_event *ev)
{
	struct tally *t = opaque;
	pthread_mutex_lock(&t->lock);
	if (ev->type >= LMT_EVENT_SETUP_DONE && ev->type <= LMT_EVENT_FAILED)
		t->count[ev->type]++;
	pthread_mutex_unlock(&t->lock);
}

static void test_the_callback_sees_what_the_queue_holds(void **state)
{
	struct guest_ram ram;
	ram_fill(&ram, RAM_BYTES, 15);
	uint16_t port;
	struct dest_spec spec = {.ram_bytes = RAM_BYTES, .options = ""};
	pid_t pid = dest_spawn(&spec, &port);
	struct tally t = {.lock = PTHREAD_MUTEX_INITIALIZER};
	lmt_session *s = session_with_blocks(LMT_ROLE_SOURCE, &ram, "");
	assert_int_equal(lmt_session_set_event_callback(s, count_event, &t), 0);
	assert_int_equal(lmt_session_set_dirty_sync(s, guest_dirty_sync, &ram), 0);
	char uri[64];
	snprintf(uri, sizeof(uri), "127.0.0.1:%u", port);
	assert_int_equal(lmt_save_setup(s, uri), 0);
	iterate_until_ready(s);
	assert_int_equal(lmt_save_complete(s, "cpu", 3), 0);
	int queued[LMT_EVENT_FAILED + 1] = {0};
	struct lmt_event ev;
	while (lmt_session_next_event(s, &ev) == 1)
		queued[ev.type]++;
	for (int i = LMT_EVENT_SETUP_DONE; i <= LMT_EVENT_FAILED; i++)
		assert_int_equal(t.count[i], queued[i]);
	assert_int_equal(t.count[LMT_EVENT_COMPLETED], 1);
	assert_int_equal(t.count[LMT_EVENT_FAILED], 0);
	lmt_session_free(s);
	assert_int_equal(dest_wait(pid), 0);
	ram_release(&ram);
}

/* A source over chaos:tcp, with the chaos options given. */
static lmt_session *chaotic_source(struct guest_ram *ram, const char *opts, uint16_t port)
{
	return source_set_up_on(ram, "chaos:tcp", opts, port);
}

static void test_a_channel_stalled_mid_pass_fails_iterate_within_idle_timeout(void **state)
{
	struct guest_ram ram;
	ram_fill(&ram, RAM_BYTES, 16);
	uint16_t port;
	struct dest_spec spec = {.ram_bytes = RAM_BYTES, .options = "idle-timeout=30s"};
	pid_t pid = dest_spawn(&spec, &port);
	lmt_session *s = chaotic_source(
	        &ram, "idle-timeout=1s,chaos.fault=stall,chaos.at=write:8,chaos.stall=60s", port);
	uint64_t t0 = guest_now_ns();
	struct lmt_iterate_result it = {0};
	int rc = 0;
	while (rc == 0 && guest_now_ns() - t0 < 10000 * MS)
		rc = lmt_save_iterate(s, &it);
	uint64_t took = guest_now_ns() - t0;
	assert_int_equal(rc, -LMT_ETIMEDOUT);
	const char *why = lmt_session_error(s)->message;
	if (!strstr(why, "channel 0: ") || !strstr(why, "none completed for 1000 ms"))
		fail_msg("the error does not name the stalled channel: %s", why);
	assert_true(took < 2500 * MS);
	lmt_session_free(s);
	assert_int_equal(dest_wait(pid), 1);
	ram_release(&ram);
}

static void test_a_stalled_flush_fails_complete_at_the_switchover_timeout(void **state)
{
	struct guest_ram ram;
	ram_fill(&ram, RAM_BYTES, 17);
	uint16_t port;
	struct dest_spec spec = {.ram_bytes = RAM_BYTES, .options = ""};
	pid_t pid = dest_spawn(&spec, &port);
	lmt_session *s = chaotic_source(
	        &ram, "switchover-timeout=400ms,chaos.fault=stall,chaos.at=flush,chaos.stall=60s",
	        port);
	iterate_until_ready(s);
	uint64_t t0 = guest_now_ns();
	int rc = lmt_save_complete(s, "cpu", 3);
	uint64_t took = guest_now_ns() - t0;
	assert_int_equal(rc, -LMT_ETIMEDOUT);
	const char *why = lmt_session_error(s)->message;
	if (!strstr(why, "switchover-timeout (400 ms)"))
		fail_msg("the error does not name the switchover timeout: %s", why);
	assert_true(took >= 400 * MS && took < 1400 * MS);
	struct lmt_stats st;
	assert_int_equal(lmt_session_stats(s, &st), 0);
	assert_int_equal(st.status, LMT_STATUS_FAILED);
	lmt_session_free(s);
	assert_int_equal(dest_wait(pid), 1);
	ram_release(&ram);
}

/* Both sides on lmt's threads; this loop only polls their descriptors,
 * switches over on READY with the guest "paused" (its workload stopped). */
static void test_jobs_migrate_while_the_vmm_only_polls_descriptors(void **state)
{
	struct guest_ram src, dst;
	ram_fill(&src, RAM_BYTES, 18);
	guest_ram_layout(&dst, ram_map(RAM_BYTES), RAM_BYTES);
	struct guest_workload *w = NULL;
	assert_int_equal(guest_workload_start(&w, &src, 1u << 20, 4u << 20, 3), 0);
	lmt_session *d = session_with_blocks(LMT_ROLE_DESTINATION, &dst, "");
	uint16_t port = 0;
	assert_int_equal(lmt_load_listen(d, "127.0.0.1:0", &port), 0);
	assert_int_equal(lmt_load_start(d), 0);
	lmt_session *s = session_with_blocks(LMT_ROLE_SOURCE, &src, "");
	assert_int_equal(lmt_session_set_dirty_sync(s, guest_dirty_sync, &src), 0);
	char uri[64];
	snprintf(uri, sizeof(uri), "127.0.0.1:%u", port);
	assert_int_equal(lmt_save_start(s, uri), 0);
	/* The blocking calls belong to the job now. */
	struct lmt_iterate_result it;
	assert_int_equal(lmt_save_iterate(s, &it), -LMT_ESTATE);
	bool switched = false, src_done = false, dst_done = false;
	uint64_t t0 = guest_now_ns();
	while ((!src_done || !dst_done) && guest_now_ns() - t0 < 30000 * MS) {
		struct pollfd p[2] = {{.fd = lmt_session_event_fd(s), .events = POLLIN},
		                      {.fd = lmt_session_event_fd(d), .events = POLLIN}};
		poll(p, 2, 100);
		struct lmt_event ev;
		while (lmt_session_next_event(s, &ev) == 1) {
			assert_int_not_equal(ev.type, LMT_EVENT_FAILED);
			if (ev.type == LMT_EVENT_READY && !switched) {
				guest_workload_pause(w);
				assert_int_equal(lmt_save_switchover(s, "cpu-state", 9), 0);
				switched = true;
			}
			src_done |= ev.type == LMT_EVENT_COMPLETED;
		}
		while (lmt_session_next_event(d, &ev) == 1) {
			assert_int_not_equal(ev.type, LMT_EVENT_FAILED);
			dst_done |= ev.type == LMT_EVENT_COMPLETED;
		}
	}
	assert_true(src_done && dst_done);
	assert_int_equal(lmt_session_wait(s, 0), 0);
	assert_int_equal(lmt_session_wait(d, 0), 0);
	const void *got;
	size_t len;
	assert_int_equal(lmt_load_device_state(d, &got, &len), 0);
	assert_int_equal(len, 9);
	assert_memory_equal(got, "cpu-state", 9);
	assert_memory_equal(src.base, dst.base, RAM_BYTES);
	lmt_session_free(s);
	lmt_session_free(d);
	guest_workload_stop(w);
	ram_release(&src);
	munmap(dst.base, RAM_BYTES);
}

static void test_a_cancelled_job_ends_with_a_failure_event(void **state)
{
	struct guest_ram dst;
	guest_ram_layout(&dst, ram_map(RAM_BYTES), RAM_BYTES);
	lmt_session *d = session_with_blocks(LMT_ROLE_DESTINATION, &dst, "");
	assert_int_equal(lmt_load_listen(d, "127.0.0.1:0", NULL), 0);
	assert_int_equal(lmt_load_start(d), 0);
	assert_int_equal(lmt_session_wait(d, 50), -LMT_EAGAIN);
	lmt_cancel(d);
	assert_int_equal(lmt_session_wait(d, 5000), -LMT_ECANCELED);
	struct lmt_event ev;
	assert_int_equal(lmt_session_next_event(d, &ev), 1);
	assert_int_equal(ev.type, LMT_EVENT_FAILED);
	assert_int_equal(ev.code, -LMT_ECANCELED);
	lmt_session_free(d);
	munmap(dst.base, RAM_BYTES);
}

/* A source and a destination job in this process, over `src` into `dst`. */
static void jobs_start(lmt_session **s, lmt_session **d, struct guest_ram *src,
                       struct guest_ram *dst)
{
	*d = session_with_blocks(LMT_ROLE_DESTINATION, dst, "");
	uint16_t port = 0;
	assert_int_equal(lmt_load_listen(*d, "127.0.0.1:0", &port), 0);
	assert_int_equal(lmt_load_start(*d), 0);
	*s = session_with_blocks(LMT_ROLE_SOURCE, src, "");
	assert_int_equal(lmt_session_set_dirty_sync(*s, guest_dirty_sync, src), 0);
	char uri[64];
	snprintf(uri, sizeof(uri), "127.0.0.1:%u", port);
	assert_int_equal(lmt_save_start(*s, uri), 0);
}

/* The events queued on `s`, counted by type; whether READY came before
 * COMPLETED. */
static void drain_events(lmt_session *s, int count[LMT_EVENT_POSTCOPY + 1])
{
	struct lmt_event ev;
	while (lmt_session_next_event(s, &ev) == 1)
		if (ev.type >= LMT_EVENT_SETUP_DONE && ev.type <= LMT_EVENT_POSTCOPY)
			count[ev.type]++;
}

/* The guest "paused" from the start: the switchover is asked before the
 * migration could be ready, and the job completes at once with all that
 * is left, without iterating (no READY). Once the job ended, a switchover
 * is refused, saying so. */
static void test_a_switchover_asked_before_ready_completes_at_once(void **state)
{
	struct guest_ram src, dst;
	ram_fill(&src, RAM_BYTES, 19);
	guest_ram_layout(&dst, ram_map(RAM_BYTES), RAM_BYTES);
	lmt_session *s, *d;
	jobs_start(&s, &d, &src, &dst);
	assert_int_equal(lmt_save_switchover(s, "early", 5), 0);
	assert_int_equal(lmt_session_wait(s, 20000), 0);
	assert_int_equal(lmt_session_wait(d, 20000), 0);
	int count[LMT_EVENT_POSTCOPY + 1] = {0};
	drain_events(s, count);
	assert_int_equal(count[LMT_EVENT_READY], 0);
	assert_int_equal(count[LMT_EVENT_COMPLETED], 1);
	assert_memory_equal(src.base, dst.base, RAM_BYTES);
	const void *got;
	size_t len;
	assert_int_equal(lmt_load_device_state(d, &got, &len), 0);
	assert_int_equal(len, 5);
	assert_int_equal(lmt_save_switchover(s, "late", 4), -LMT_ESTATE);
	assert_string_equal(lmt_session_error(s)->message,
	                    "save switchover: the job has ended (lmt_session_wait gives its "
	                    "result)");
	lmt_session_free(s);
	lmt_session_free(d);
	ram_release(&src);
	munmap(dst.base, RAM_BYTES);
}

struct counted {
	pthread_mutex_t lock;
	int count[LMT_EVENT_POSTCOPY + 1];
	lmt_session *s;
	struct counted *next; /* set as the callback from inside, at a pass end */
};

static void count_into(void *opaque, const struct lmt_event *ev)
{
	struct counted *c = opaque;
	pthread_mutex_lock(&c->lock);
	if (ev->type >= LMT_EVENT_SETUP_DONE && ev->type <= LMT_EVENT_POSTCOPY)
		c->count[ev->type]++;
	pthread_mutex_unlock(&c->lock);
	/* Replaced from inside: applies from the next event, no deadlock. */
	if (c->next && ev->type == LMT_EVENT_PASS_END)
		assert_int_equal(lmt_session_set_event_callback(c->s, count_into, c->next), 0);
}

static int counted_total(struct counted *c)
{
	pthread_mutex_lock(&c->lock);
	int n = 0;
	for (int i = 0; i <= LMT_EVENT_POSTCOPY; i++)
		n += c->count[i];
	pthread_mutex_unlock(&c->lock);
	return n;
}

/* The callback is set while the jobs run: on the source it replaces
 * itself from inside at its first pass end, and the second one sees the
 * end; on the destination it is removed once setup is done, and from the
 * moment that call returns it is called no more. */
static void test_the_event_callback_may_change_while_a_job_runs(void **state)
{
	struct guest_ram src, dst;
	ram_fill(&src, RAM_BYTES, 20);
	guest_ram_layout(&dst, ram_map(RAM_BYTES), RAM_BYTES);
	lmt_session *s, *d;
	struct counted second = {.lock = PTHREAD_MUTEX_INITIALIZER};
	struct counted first = {.lock = PTHREAD_MUTEX_INITIALIZER, .next = &second};
	struct counted dest = {.lock = PTHREAD_MUTEX_INITIALIZER};
	jobs_start(&s, &d, &src, &dst);
	first.s = s;
	assert_int_equal(lmt_session_set_event_callback(s, count_into, &first), 0);
	assert_int_equal(lmt_session_set_event_callback(d, count_into, &dest), 0);
	int dq[LMT_EVENT_POSTCOPY + 1] = {0}, sq[LMT_EVENT_POSTCOPY + 1] = {0};
	int removed_at = -1;
	uint64_t t0 = guest_now_ns();
	while (!sq[LMT_EVENT_COMPLETED] && !sq[LMT_EVENT_FAILED] &&
	       guest_now_ns() - t0 < 30000 * MS) {
		if (removed_at < 0) {
			drain_events(d, dq);
			if (dq[LMT_EVENT_SETUP_DONE]) {
				assert_int_equal(lmt_session_set_event_callback(d, NULL, NULL), 0);
				removed_at = counted_total(&dest);
			}
		}
		int before = sq[LMT_EVENT_READY];
		drain_events(s, sq);
		if (!before && sq[LMT_EVENT_READY])
			assert_int_equal(lmt_save_switchover(s, "cpu", 3), 0);
		usleep(1000);
	}
	assert_int_equal(lmt_session_wait(s, 20000), 0);
	assert_int_equal(lmt_session_wait(d, 20000), 0);
	assert_true(removed_at >= 0);
	assert_int_equal(counted_total(&dest), removed_at);
	assert_int_equal(dest.count[LMT_EVENT_COMPLETED], 0);
	assert_true(first.count[LMT_EVENT_PASS_END] >= 1);
	assert_int_equal(first.count[LMT_EVENT_COMPLETED], 0);
	assert_int_equal(second.count[LMT_EVENT_COMPLETED], 1);
	assert_memory_equal(src.base, dst.base, RAM_BYTES);
	lmt_session_free(s);
	lmt_session_free(d);
	ram_release(&src);
	munmap(dst.base, RAM_BYTES);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_a_vmm_away_between_calls_within_idle_timeout_loses_nothing),
	        cmocka_unit_test(
	                test_source_events_come_in_order_and_the_descriptor_follows_the_queue),
	        cmocka_unit_test(
	                test_destination_loop_learns_setup_and_completion_from_the_descriptor),
	        cmocka_unit_test(test_a_peer_dying_between_calls_is_an_event_without_any_call),
	        cmocka_unit_test(test_the_callback_sees_what_the_queue_holds),
	        cmocka_unit_test(test_a_channel_stalled_mid_pass_fails_iterate_within_idle_timeout),
	        cmocka_unit_test(test_a_stalled_flush_fails_complete_at_the_switchover_timeout),
	        cmocka_unit_test(test_jobs_migrate_while_the_vmm_only_polls_descriptors),
	        cmocka_unit_test(test_a_cancelled_job_ends_with_a_failure_event),
	        cmocka_unit_test(test_a_switchover_asked_before_ready_completes_at_once),
	        cmocka_unit_test(test_the_event_callback_may_change_while_a_job_runs),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
