/* The ucx plugin against a peer in another process that fails while writes
 * are in flight, through lmt's API, over the transport that
 * LMT_TEST_OPTIONS names (ucx.tls=tcp, posix or sm): the destination or
 * the source stopped (SIGSTOP) mid-pass or during complete and later
 * resumed, or killed. In every case:
 *
 * - the side in this process fails within idle-timeout and a margin, and
 *   leaves no descriptor or thread behind;
 * - once its call has returned, the guest RAM it gave lmt is made
 *   inaccessible (PROT_NONE), as a VMM that unmaps it would, and only then
 *   is the peer resumed: any access to that RAM from this process, by lmt
 *   or UCX, would now kill it;
 * - the resumed peer ends its own session with an error, not with an
 *   abort or a crash (UCX 1.13's assertions end a process with SIGABRT);
 * - a fresh migration follows.
 *
 * Mid-pass, the peer is stopped or killed during the first pass over the
 * guest's 256 MiB, so that writes are in flight; in complete, a stopped
 * or killed destination as the source starts it (its flush held back a
 * second), a source that stops itself at its flush. LMT_TEST_REPEATS runs each case that many
 * times (3). */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#define RAM_BYTES (256ull << 20)
#define MS 1000000ull
/* idle-timeout also bounds how long the destination waits for a source
 * child that is slow to start, and switchover-timeout how long a source's
 * final pass may take before it reaches the flush where it stops itself
 * (a sanitized build filling and sending 256 MiB on a loaded host). */
#define OPTIONS                                                                                    \
	"connect-timeout=5s,idle-timeout=4s,switchover-timeout=6s,downtime-limit=1ms,channels=2,"  \
	"chunk-size=1M"
/* idle-timeout, and a margin for a loaded host. */
#define FAIL_WITHIN_NS (8000 * MS)
/* How long the source iterates before it completes, in the cases that
 * stop or kill the peer during complete. */
#define COMPLETE_AFTER_NS (400 * MS)
/* Mid-pass, the peer is stopped or killed once this much of the first pass
 * has been sent. */
#define FAULT_AFTER_BYTES (16ull << 20)

enum side { SOURCE, DESTINATION };
enum fault { STOP, KILL };

struct scenario {
	enum side child; /* the side in the child process */
	enum fault fault;
	bool in_complete; /* during complete, not mid-pass */
};

/* The source's guest: lmt reads it through `view`, a second mapping of the
 * memory that the workload writes through `rw`, so that the view can be
 * made inaccessible while the workload is stopped. */
struct guest {
	int fd;
	struct guest_ram rw, view;
	struct guest_workload *workload;
};

static void guest_open(struct guest *g)
{
	g->fd = memfd_create("lmt-test-guest", MFD_CLOEXEC);
	assert_true(g->fd >= 0);
	assert_int_equal(ftruncate(g->fd, RAM_BYTES), 0);
	uint8_t *rw = mmap(NULL, RAM_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, g->fd, 0);
	uint8_t *view = mmap(NULL, RAM_BYTES, PROT_READ, MAP_SHARED, g->fd, 0);
	assert_true(rw != MAP_FAILED && view != MAP_FAILED);
	guest_ram_layout(&g->rw, rw, RAM_BYTES);
	guest_ram_fill(&g->rw, 0.1, 11);
	assert_int_equal(guest_ram_alloc_dirty(&g->rw), 0);
	guest_ram_layout(&g->view, view, RAM_BYTES);
	assert_int_equal(guest_workload_start(&g->workload, &g->rw, 32u << 20, 256u << 20, 3), 0);
}

static void guest_close(struct guest *g)
{
	guest_workload_stop(g->workload);
	guest_ram_free_dirty(&g->rw);
	munmap(g->rw.base, RAM_BYTES);
	munmap(g->view.base, RAM_BYTES);
	close(g->fd);
}

/* Run a source on `g` to 127.0.0.1:port: iterate (and complete after
 * COMPLETE_AFTER_NS when `complete`) until it fails or completes. */
static int run_source(lmt_session *s, struct guest *g, uint16_t port, bool complete)
{
	assert_int_equal(lmt_session_set_dirty_sync(s, guest_dirty_sync, &g->rw), 0);
	char uri[64];
	snprintf(uri, sizeof(uri), "127.0.0.1:%u", port);
	uint64_t t0 = guest_now_ns();
	int rc = lmt_save_setup(s, uri);
	struct lmt_iterate_result it = {0};
	while (rc == 0 && !it.ready && !(complete && guest_now_ns() - t0 >= COMPLETE_AFTER_NS))
		rc = lmt_save_iterate(s, &it);
	if (rc == 0) {
		guest_workload_pause(g->workload);
		rc = lmt_save_complete(s, "cpu", 3);
	}
	return rc;
}

static lmt_session *listening_destination(struct guest_ram *ram, uint16_t *port)
{
	lmt_session *s = session_on(LMT_ROLE_DESTINATION, ram, test_plugin(), OPTIONS);
	assert_int_equal(lmt_load_listen(s, "127.0.0.1:0", port), 0);
	return s;
}

/* ---- The child: this program run afresh ------------------------------------ */

#define CHILD_FLAG "--child"

/* A destination (reports its port on `out`) or a source to `port`. Exits
 * 0 when its session completed, 1 when it failed. */
static _Noreturn void child_main(enum side side, bool complete, int out, uint16_t port)
{
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	int rc;
	if (side == DESTINATION) {
		struct guest_ram ram;
		guest_ram_layout(&ram, ram_map(RAM_BYTES), RAM_BYTES);
		lmt_session *s = listening_destination(&ram, &port);
		if (write(out, &port, sizeof(port)) != sizeof(port))
			_exit(2);
		rc = lmt_load_run(s);
		lmt_session_free(s);
		munmap(ram.base, RAM_BYTES);
	} else {
		/* Stopped in complete by the chaos decorator, as its final
		 * writes are flushed. */
		struct guest g;
		guest_open(&g);
		char plugin[64];
		snprintf(plugin, sizeof(plugin), complete ? "chaos:%s" : "%s", test_plugin());
		lmt_session *s =
		        session_on(LMT_ROLE_SOURCE, &g.view, plugin,
		                   complete ? OPTIONS ",chaos.fault=stop,chaos.at=flush" : OPTIONS);
		rc = run_source(s, &g, port, complete);
		lmt_session_free(s);
		guest_close(&g);
	}
	close(out);
	/* exit(), not _exit(): a sanitized build checks this side for leaks. */
	exit(rc == 0 ? 0 : 1);
}

static pid_t spawn(enum side side, bool complete, uint16_t *port)
{
	int fds[2];
	assert_int_equal(pipe(fds), 0);
	char side_arg[8], complete_arg[8], out_arg[16], port_arg[16];
	snprintf(side_arg, sizeof(side_arg), "%d", (int)side);
	snprintf(complete_arg, sizeof(complete_arg), "%d", (int)complete);
	snprintf(out_arg, sizeof(out_arg), "%d", fds[1]);
	snprintf(port_arg, sizeof(port_arg), "%u", (unsigned)*port);
	char *argv[] = {(char *)"test_ucx_peer_faults",
	                (char *)CHILD_FLAG,
	                side_arg,
	                complete_arg,
	                out_arg,
	                port_arg,
	                NULL};
	fflush(NULL);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		close(fds[0]);
		execv("/proc/self/exe", argv);
		_exit(127);
	}
	close(fds[1]);
	if (side == DESTINATION)
		assert_int_equal(read(fds[0], port, sizeof(*port)), sizeof(*port));
	close(fds[0]);
	return pid;
}

/* The child's end: its exit status, or 128 + the signal that ended it,
 * waiting at most `within_ns`; a child still running then is killed and
 * reported as 128 + SIGKILL. */
static int child_end(pid_t pid, uint64_t within_ns)
{
	uint64_t deadline = guest_now_ns() + within_ns;
	int status = 0;
	while (waitpid(pid, &status, WNOHANG) != pid) {
		if (guest_now_ns() > deadline) {
			kill(pid, SIGKILL);
			waitpid(pid, &status, 0);
			break;
		}
		struct timespec ts = {0, 5 * MS};
		nanosleep(&ts, NULL);
	}
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* ---- The fault ---------------------------------------------------------------- */

struct actor {
	const struct scenario *sc;
	lmt_session *mine;
	pid_t child;
	volatile int done;
	volatile uint64_t acted_ns;
};

/* Whether the child is stopped, leaving its state for child_end. */
static bool child_stopped(pid_t pid)
{
	siginfo_t info = {0};
	return waitid(P_PID, (id_t)pid, &info, WSTOPPED | WNOHANG | WNOWAIT) == 0 &&
	       info.si_pid == pid && info.si_code == CLD_STOPPED;
}

/* Stops or kills the child mid-pass (FAULT_AFTER_BYTES into the first
 * pass) or,
 * seen from a source in this process, once it is completing. A source
 * child stops itself in complete (chaos.fault=stop at its flush): then
 * this only notes when. */
static void *act(void *arg)
{
	struct actor *a = arg;
	while (!a->done && !a->acted_ns) {
		bool due;
		struct lmt_stats st = {0};
		lmt_session_stats(a->mine, &st);
		if (!a->sc->in_complete) {
			due = (a->sc->child == DESTINATION ? st.bytes_sent : st.bytes_received) >=
			      FAULT_AFTER_BYTES;
		} else if (a->sc->child == DESTINATION) {
			due = st.status == LMT_STATUS_COMPLETING;
		} else if (child_stopped(a->child)) {
			a->acted_ns = guest_now_ns();
			break;
		} else {
			due = false;
		}
		if (due) {
			kill(a->child, a->sc->fault == STOP ? SIGSTOP : SIGKILL);
			a->acted_ns = guest_now_ns();
		}
		struct timespec ts = {0, MS};
		nanosleep(&ts, NULL);
	}
	return NULL;
}

static void fresh_migration(struct guest *g)
{
	uint16_t port;
	struct dest_spec spec = {.ram_bytes = RAM_BYTES, .options = ""};
	pid_t pid = dest_spawn(&spec, &port);
	guest_workload_pause(g->workload);
	uint64_t none = 0;
	struct source_run r =
	        source_migrate_view(&g->view, &g->rw, "", port, "cpu", 3, 0, 0, &none);
	if (r.rc)
		fail_msg("a fresh migration after the fault failed: %s", r.error);
	assert_int_equal(dest_wait(pid), 0);
}

static void run_once(const struct scenario *sc, const char *name)
{
	struct guest g;
	guest_open(&g);
	struct census before = census_take();
	struct guest_ram dram = {0};
	uint16_t port = 0;
	struct actor a = {.sc = sc};
	if (sc->child == DESTINATION && sc->in_complete) {
		/* The flush of complete held back a second (chaos), so that
		 * the migration cannot end before the fault comes. */
		char plugin[64];
		snprintf(plugin, sizeof(plugin), "chaos:%s", test_plugin());
		a.child = spawn(DESTINATION, true, &port);
		a.mine = session_on(LMT_ROLE_SOURCE, &g.view, plugin,
		                    OPTIONS ",chaos.fault=stall,chaos.at=flush,chaos.stall=1s");
	} else if (sc->child == DESTINATION) {
		a.child = spawn(DESTINATION, false, &port);
		a.mine = session_on(LMT_ROLE_SOURCE, &g.view, test_plugin(), OPTIONS);
	} else {
		guest_ram_layout(&dram, ram_map(RAM_BYTES), RAM_BYTES);
		a.mine = listening_destination(&dram, &port);
		a.child = spawn(SOURCE, sc->in_complete, &port);
	}
	pthread_t t;
	assert_int_equal(pthread_create(&t, NULL, act, &a), 0);
	uint64_t t0 = guest_now_ns();
	int rc = sc->child == DESTINATION ? run_source(a.mine, &g, port, sc->in_complete)
	                                  : lmt_load_run(a.mine);
	uint64_t ended = guest_now_ns();
	a.done = 1;
	pthread_join(t, NULL);
	char error[600];
	snprintf(error, sizeof(error), "%s", lmt_session_error(a.mine)->message);
	lmt_session_free(a.mine);
	/* The call returned: from now on nothing may touch the RAM lmt had. */
	guest_workload_pause(g.workload);
	uint8_t *given = sc->child == DESTINATION ? g.view.base : dram.base;
	assert_int_equal(mprotect(given, RAM_BYTES, PROT_NONE), 0);
	if (!a.acted_ns)
		fail_msg("%s: the migration ended (%d: %s) before the peer was stopped or killed",
		         name, rc, error);
	if (rc >= 0)
		fail_msg("%s: the side in this process did not fail", name);
	if (ended - t0 > FAIL_WITHIN_NS + 2000 * MS)
		fail_msg("%s: took %llu ms to fail", name, (unsigned long long)((ended - t0) / MS));
	if (sc->fault == STOP)
		kill(a.child, SIGCONT);
	/* A resumed peer meets a broken session: it must fail, not abort. */
	int child = child_end(a.child, FAIL_WITHIN_NS);
	int expected = sc->fault == KILL ? 128 + SIGKILL : 1;
	if (child != expected)
		fail_msg("%s: the %s in the child ended with %d, expected %d", name,
		         sc->child == DESTINATION ? "destination" : "source", child, expected);
	/* Whatever this process still ran would meet the protected RAM now. */
	struct timespec ts = {0, 300 * MS};
	nanosleep(&ts, NULL);
	print_message("    %-52s failed in %llu ms, %llu ms after the %s: %s %s\n", name,
	              (unsigned long long)((ended - t0) / MS),
	              (unsigned long long)((ended - a.acted_ns) / MS),
	              sc->fault == STOP ? "SIGSTOP" : "SIGKILL", lmt_err_name(rc), error);
	census_check(before);
	if (sc->child == SOURCE)
		munmap(dram.base, RAM_BYTES);
	else
		assert_int_equal(mprotect(given, RAM_BYTES, PROT_READ), 0);
	fresh_migration(&g);
	guest_close(&g);
}

static void run(const struct scenario *sc, const char *name)
{
	const char *env = getenv("LMT_TEST_REPEATS");
	int repeats = env && atoi(env) > 0 ? atoi(env) : 3;
	for (int i = 0; i < repeats; i++)
		run_once(sc, name);
}

#define SCENARIO(test, child, fault, in_complete, name)                                            \
	static void test(void **state)                                                             \
	{                                                                                          \
		(void)state;                                                                       \
		static const struct scenario sc = {child, fault, in_complete};                     \
		run(&sc, name);                                                                    \
	}

SCENARIO(test_destination_stopped_mid_pass_then_resumed, DESTINATION, STOP, false,
         "destination stopped mid-pass, then resumed")
SCENARIO(test_destination_stopped_in_complete_then_resumed, DESTINATION, STOP, true,
         "destination stopped in complete, then resumed")
SCENARIO(test_destination_killed_mid_pass, DESTINATION, KILL, false, "destination killed mid-pass")
SCENARIO(test_destination_killed_in_complete, DESTINATION, KILL, true,
         "destination killed in complete")
SCENARIO(test_source_stopped_mid_pass_then_resumed, SOURCE, STOP, false,
         "source stopped mid-pass, then resumed")
SCENARIO(test_source_stopped_in_complete_then_resumed, SOURCE, STOP, true,
         "source stopped in complete, then resumed")
SCENARIO(test_source_killed_mid_pass, SOURCE, KILL, false, "source killed mid-pass")

int main(int argc, char **argv)
{
	/* The other side, started by spawn: CHILD_FLAG side complete fd port. */
	if (argc == 6 && strcmp(argv[1], CHILD_FLAG) == 0)
		child_main((enum side)atoi(argv[2]), atoi(argv[3]) != 0, atoi(argv[4]),
		           (uint16_t)atoi(argv[5]));
	if (getenv("LMT_TEST_FILTER"))
		cmocka_set_test_filter(getenv("LMT_TEST_FILTER"));
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_destination_stopped_mid_pass_then_resumed),
	        cmocka_unit_test(test_destination_stopped_in_complete_then_resumed),
	        cmocka_unit_test(test_destination_killed_mid_pass),
	        cmocka_unit_test(test_destination_killed_in_complete),
	        cmocka_unit_test(test_source_stopped_mid_pass_then_resumed),
	        cmocka_unit_test(test_source_stopped_in_complete_then_resumed),
	        cmocka_unit_test(test_source_killed_mid_pass),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
