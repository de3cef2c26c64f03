/* The fault matrix: for the plugin under test (LMT_TEST_PLUGIN), kill or
 * stop the source, the destination, the control connection or a data
 * channel, during setup, mid-pass and during complete, and cancel from
 * another thread in each phase. In every cell both sides fail within a
 * bound, the side in this process leaves no descriptor or thread behind
 * (and, where its own decorator cut the link, names the cut in its error),
 * the source guest's memory is never written (lmt gets a read-only view of
 * it while a workload keeps dirtying it through another), and a fresh
 * migration afterwards succeeds. Faults come from the chaos decorator. */
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
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#define RAM_BYTES (16ull << 20)
#define MS 1000000ull
/* idle-timeout bounds how long a silent peer goes unnoticed; connect-timeout
 * leaves a busy host seconds to start the peer and open its channels. */
#define BASE "connect-timeout=5s,idle-timeout=2s,max-bandwidth=24M"
/* How long a side may take to fail: idle-timeout and a margin. */
static uint64_t fail_within_ns = 6000 * MS;

enum side { SOURCE, DESTINATION };

enum action {
	ACT_NONE,
	ACT_CANCEL_AFTER,     /* cancel the in-process side `ms` after it starts */
	ACT_KILL_CHILD_AFTER, /* SIGKILL the child `ms` after the start */
	ACT_STOP_CHILD_AFTER, /* SIGSTOP the child `ms` after the start */
};

struct cell {
	const char *name;
	enum side child;       /* which side runs in a child process */
	const char *src_chaos; /* chaos options of the source, or NULL */
	const char *dst_chaos;
	enum action action;
	uint64_t ms;
	int child_exit; /* how the child ends: 1 failed, 128+SIGKILL killed */
};

static const struct cell cells[] = {
        /* a process dies */
        {"source killed in setup", SOURCE, "fault=kill,at=connect", NULL, 0, 0, 128 + SIGKILL},
        {"source killed mid-pass", SOURCE, "fault=kill,at=write:20", NULL, 0, 0, 128 + SIGKILL},
        {"source killed in complete", SOURCE, "fault=kill,at=flush", NULL, 0, 0, 128 + SIGKILL},
        {"destination killed in setup", DESTINATION, NULL, "fault=kill,at=connect", 0, 0,
         128 + SIGKILL},
        {"destination killed mid-pass", DESTINATION, NULL, "fault=kill,at=after-ms:300", 0, 0,
         128 + SIGKILL},
        {"destination killed in complete", DESTINATION, "fault=stall,at=flush,stall=1s", NULL,
         ACT_KILL_CHILD_AFTER, 0, 128 + SIGKILL},
        /* a process stops answering (SIGSTOP): the other side's idle-timeout */
        {"source stopped in setup", SOURCE, "fault=stop,at=connect", NULL, 0, 0, 128 + SIGKILL},
        {"source stopped mid-pass", SOURCE, "fault=stop,at=write:20", NULL, 0, 0, 128 + SIGKILL},
        {"source stopped in complete", SOURCE, "fault=stop,at=flush", NULL, 0, 0, 128 + SIGKILL},
        {"destination stopped in setup", DESTINATION, NULL, "fault=stop,at=connect", 0, 0,
         128 + SIGKILL},
        {"destination stopped mid-pass", DESTINATION, NULL, "fault=stop,at=after-ms:300", 0, 0,
         128 + SIGKILL},
        {"destination stopped in complete", DESTINATION, "fault=stall,at=flush,stall=1s", NULL,
         ACT_STOP_CHILD_AFTER, 0, 128 + SIGKILL},
        /* the control connection drops */
        {"control dropped in setup", DESTINATION, "fault=drop-control,at=connect", NULL, 0, 0, 1},
        {"control dropped mid-pass", DESTINATION, "fault=drop-control,at=write:20", NULL, 0, 0, 1},
        {"control dropped in complete", DESTINATION, "fault=drop-control,at=flush", NULL, 0, 0, 1},
        {"control dropped by the destination", SOURCE, NULL, "fault=drop-control,at=after-ms:300",
         0, 0, 1},
        /* a data channel drops */
        {"channel dropped in setup", DESTINATION, "fault=drop-channel,at=connect", NULL, 0, 0, 1},
        {"channel dropped mid-pass", DESTINATION, "fault=drop-channel,at=write:20", NULL, 0, 0, 1},
        {"channel dropped in complete", DESTINATION, "fault=drop-channel,at=flush", NULL, 0, 0, 1},
        {"channel dropped by the destination", SOURCE, NULL, "fault=drop-channel,at=after-ms:300",
         0, 0, 1},
        /* the link under every channel and the control connection breaks at
         * once (a reset), or goes silent under the channels */
        {"link cut mid-pass", DESTINATION, "fault=cut,at=bytes:4M", NULL, 0, 0, 1},
        {"link cut in complete", DESTINATION, "fault=cut,at=flush", NULL, 0, 0, 1},
        {"link cut by the destination", SOURCE, NULL, "fault=cut,at=after-ms:300", 0, 0, 1},
        {"link black-holed mid-pass", DESTINATION, "fault=blackhole,at=bytes:4M", NULL, 0, 0, 1},
        /* a cancel from another thread */
        {"source cancelled in setup", DESTINATION, "fault=stall,at=connect,stall=5s", NULL,
         ACT_CANCEL_AFTER, 200, 1},
        {"source cancelled mid-pass", DESTINATION, NULL, NULL, ACT_CANCEL_AFTER, 300, 1},
        {"source cancelled in complete", DESTINATION, "fault=stall,at=flush,stall=5s", NULL,
         ACT_CANCEL_AFTER, 0, 1},
        {"destination cancelled in setup", SOURCE, NULL, "fault=stall,at=connect,stall=5s",
         ACT_CANCEL_AFTER, 200, 1},
        {"destination cancelled mid-pass", SOURCE, NULL, NULL, ACT_CANCEL_AFTER, 300, 1},
        {"destination cancelled in complete", SOURCE, "fault=stall,at=flush,stall=5s", NULL,
         ACT_CANCEL_AFTER, 0, 1},
};

/* The error the side in this process must fail with, and what its message
 * must say, in the cells where that is fixed: its own decorator broke the
 * link. */
static const struct {
	const char *cell;
	int rc;
	const char *says;
} errors_expected[] = {
        {"link cut mid-pass", -LMT_ECONN, "link cut at bytes:4M"},
        {"link cut in complete", -LMT_ECONN, "link cut at flush"},
        {"link cut by the destination", -LMT_ECONN, "link cut at after-ms:300"},
        {"link black-holed mid-pass", -LMT_ETIMEDOUT, "none completed"},
};

static void check_error_expected(const struct cell *c, int rc, const char *error)
{
	for (size_t k = 0; k < sizeof(errors_expected) / sizeof(errors_expected[0]); k++) {
		if (strcmp(errors_expected[k].cell, c->name) != 0)
			continue;
		if (rc != errors_expected[k].rc)
			fail_msg("%s: failed with %s, expected %s: %s", c->name, lmt_err_name(rc),
			         lmt_err_name(errors_expected[k].rc), error);
		if (!strstr(error, errors_expected[k].says))
			fail_msg("%s: the error does not say '%s': %s", c->name,
			         errors_expected[k].says, error);
	}
}

/* The workload of the guest open in this process, if any. */
static struct guest_workload *running_workload;

/* The source guest: lmt sees a read-only view; the workload writes
 * through a second, writable mapping of the same memory. Where the
 * transport cannot take a read-only view, LMT_TEST_WRITABLE_VIEW says why
 * and lmt gets a writable one: the check that it never writes the source
 * guest is then not made, and the matrix says so at its end. */
struct guest {
	int fd;
	struct guest_ram rw;
	struct guest_ram ro;
	struct guest_workload *workload;
};

/* Why lmt gets a writable view of the source guest, or NULL. */
static const char *writable_view(void)
{
	const char *why = getenv("LMT_TEST_WRITABLE_VIEW");
	return why && *why ? why : NULL;
}

static void guest_open(struct guest *g, bool dirtying)
{
	g->fd = memfd_create("lmt-test-guest", MFD_CLOEXEC);
	assert_true(g->fd >= 0);
	assert_int_equal(ftruncate(g->fd, RAM_BYTES), 0);
	uint8_t *rw = mmap(NULL, RAM_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, g->fd, 0);
	int view_prot = writable_view() ? PROT_READ | PROT_WRITE : PROT_READ;
	uint8_t *ro = mmap(NULL, RAM_BYTES, view_prot, MAP_SHARED, g->fd, 0);
	assert_true(rw != MAP_FAILED && ro != MAP_FAILED);
	guest_ram_layout(&g->rw, rw, RAM_BYTES);
	guest_ram_fill(&g->rw, 0.1, 77);
	assert_int_equal(guest_ram_alloc_dirty(&g->rw), 0);
	guest_ram_layout(&g->ro, ro, RAM_BYTES);
	g->workload = NULL;
	if (dirtying)
		assert_int_equal(guest_workload_start(&g->workload, &g->rw, 4u << 20, 16u << 20, 5),
		                 0);
	running_workload = g->workload;
}

static void guest_close(struct guest *g)
{
	guest_workload_stop(g->workload);
	running_workload = NULL;
	guest_ram_free_dirty(&g->rw);
	munmap(g->rw.base, RAM_BYTES);
	munmap(g->ro.base, RAM_BYTES);
	close(g->fd);
}

static char *plugin_name(const char *chaos)
{
	char *name = NULL;
	assert_true(asprintf(&name, chaos ? "chaos:%s" : "%s", test_plugin()) > 0);
	return name;
}

static char *options(const char *chaos)
{
	char *opts = NULL;
	char chaos_opts[256] = "";
	if (chaos) {
		/* "fault=kill,at=connect" -> "chaos.fault=kill,chaos.at=connect" */
		char copy[200];
		snprintf(copy, sizeof(copy), "%s", chaos);
		for (char *save = NULL, *kv = strtok_r(copy, ",", &save); kv;
		     kv = strtok_r(NULL, ",", &save)) {
			size_t used = strlen(chaos_opts);
			snprintf(chaos_opts + used, sizeof(chaos_opts) - used, ",chaos.%s", kv);
		}
	}
	/* LMT_TEST_MATRIX_OPTIONS come after BASE and override it, to measure
	 * with other timeouts (docs/testing.md). */
	const char *extra = getenv("LMT_TEST_MATRIX_OPTIONS");
	assert_true(asprintf(&opts, "%s%s%s%s", BASE, extra && *extra ? "," : "",
	                     extra ? extra : "", chaos_opts) > 0);
	return opts;
}

/* One side's run, in whichever process. */
struct run {
	enum side side;
	const struct cell *cell;
	lmt_session *session;
	struct guest *guest;   /* source */
	struct guest_ram *ram; /* destination */
	uint16_t port;
	int rc;
	uint64_t started_ns;
	uint64_t ended_ns;
	char error[600];
};

static lmt_session *source_session(const struct cell *c, struct guest *g)
{
	char *name = plugin_name(c->src_chaos), *opts = options(c->src_chaos);
	lmt_session *s = session_on(LMT_ROLE_SOURCE, &g->ro, name, opts);
	free(name);
	free(opts);
	return s;
}

/* Drive r->session, created beforehand, to the end. */
static void run_source(struct run *r)
{
	assert_int_equal(lmt_session_set_dirty_sync(r->session, guest_dirty_sync, &r->guest->rw),
	                 0);
	char uri[64];
	snprintf(uri, sizeof(uri), "127.0.0.1:%u", r->port);
	r->started_ns = guest_now_ns();
	r->rc = lmt_save_setup(r->session, uri);
	struct lmt_iterate_result it = {0};
	while (r->rc == 0 && !it.ready)
		r->rc = lmt_save_iterate(r->session, &it);
	if (r->rc == 0) {
		guest_workload_pause(r->guest->workload);
		r->rc = lmt_save_complete(r->session, "cpu", 3);
	}
	r->ended_ns = guest_now_ns();
}

static void run_destination(struct run *r)
{
	r->started_ns = guest_now_ns();
	r->rc = lmt_load_run(r->session);
	r->ended_ns = guest_now_ns();
}

static lmt_session *listening_destination(struct guest_ram *ram, const struct cell *c,
                                          uint16_t *port)
{
	char *name = plugin_name(c->dst_chaos), *opts = options(c->dst_chaos);
	lmt_session *s = session_on(LMT_ROLE_DESTINATION, ram, name, opts);
	free(name);
	free(opts);
	assert_int_equal(lmt_load_listen(s, "127.0.0.1:0", port), 0);
	return s;
}

struct actor {
	const struct cell *cell;
	struct run *mine;
	pid_t child;
	volatile int done;
	uint64_t stopped_ns; /* when the child was seen stopped, or 0 */
};

/* Whether the child is stopped, leaving its state for reap() to collect. */
static bool child_stopped(pid_t pid)
{
	siginfo_t info = {0};
	return waitid(P_PID, (id_t)pid, &info, WSTOPPED | WNOHANG | WNOWAIT) == 0 &&
	       info.si_pid == pid && info.si_code == CLD_STOPPED;
}

/* Cancels or signals as the cell says. A cell with ms == 0 acts in the
 * complete phase: when the source says it is completing, or, seen from
 * the destination, once a small guest's bulk pass is surely over. */
static void *act(void *arg)
{
	struct actor *a = arg;
	const struct cell *c = a->cell;
	uint64_t t0 = guest_now_ns();
	bool acted = c->action == ACT_NONE;
	while (!a->done) {
		if (!a->stopped_ns && child_stopped(a->child))
			a->stopped_ns = guest_now_ns();
		if (acted) {
			struct timespec ts = {0, 2 * 1000000};
			nanosleep(&ts, NULL);
			continue;
		}
		struct lmt_stats st = {0};
		lmt_session_stats(a->mine->session, &st);
		bool due;
		if (c->ms)
			due = guest_now_ns() - t0 >= c->ms * MS;
		else if (a->mine->side == SOURCE)
			due = st.status == LMT_STATUS_COMPLETING;
		else
			due = guest_now_ns() - t0 >= 1500 * MS;
		if (due) {
			if (c->action == ACT_CANCEL_AFTER)
				lmt_cancel(a->mine->session);
			else if (c->action == ACT_KILL_CHILD_AFTER)
				kill(a->child, SIGKILL);
			else if (c->action == ACT_STOP_CHILD_AFTER)
				kill(a->child, SIGSTOP);
			acted = true;
			continue;
		}
		struct timespec ts = {0, 2 * 1000000};
		nanosleep(&ts, NULL);
	}
	return NULL;
}

/* The child side: a destination (reports its port first) or a source. */
#define CHILD_FLAG "--child"

static _Noreturn void child_main(const struct cell *c, int out, uint16_t port)
{
	struct run r = {.cell = c, .port = port};
	char child_error[600] = "";
	int rc;
	if (c->child == DESTINATION) {
		struct guest_ram ram;
		guest_ram_layout(&ram, ram_map(RAM_BYTES), RAM_BYTES);
		r.side = DESTINATION;
		r.session = listening_destination(&ram, c, &r.port);
		if (write(out, &r.port, sizeof(r.port)) != sizeof(r.port))
			_exit(2);
		run_destination(&r);
		rc = r.rc;
		snprintf(child_error, sizeof(child_error), "%s",
		         lmt_session_error(r.session)->message);
		lmt_session_free(r.session);
		munmap(ram.base, RAM_BYTES);
	} else {
		struct guest g;
		guest_open(&g, true);
		r.side = SOURCE;
		r.guest = &g;
		r.session = source_session(c, &g);
		/* Ready to connect: the test's destination starts its wait for a
		 * source (idle-timeout) only now, however long this process took
		 * to start (seconds under emulation). */
		if (write(out, "s", 1) != 1)
			_exit(2);
		run_source(&r);
		rc = r.rc;
		snprintf(child_error, sizeof(child_error), "%s",
		         lmt_session_error(r.session)->message);
		lmt_session_free(r.session);
		guest_close(&g);
	}
	if (rc)
		fprintf(stderr, "    (the %s in the child failed: %s)\n",
		        c->child == DESTINATION ? "destination" : "source", child_error);
	close(out);
	/* exit(), not _exit(): a sanitized build checks this side for leaks. */
	exit(rc == 0 ? 0 : 1);
}

/* The child is this program run afresh (see main): a process forked from
 * this one, whose workload, lmt and transport threads hold locks at any
 * moment, may inherit a lock held forever (the sanitizers' allocator lock
 * hung children that way). Between fork and exec only async-signal-safe
 * calls. */
static pid_t spawn(const struct cell *c, uint16_t *port)
{
	int fds[2];
	assert_int_equal(pipe(fds), 0);
	char cell_arg[16], out_arg[16], port_arg[16];
	snprintf(cell_arg, sizeof(cell_arg), "%zu", (size_t)(c - cells));
	snprintf(out_arg, sizeof(out_arg), "%d", fds[1]);
	snprintf(port_arg, sizeof(port_arg), "%u", (unsigned)*port);
	char *argv[] = {(char *)"test_fault_matrix", (char *)CHILD_FLAG, cell_arg, out_arg, port_arg,
	                NULL};
	fflush(NULL);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		close(fds[0]);
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		execv("/proc/self/exe", argv);
		_exit(127);
	}
	close(fds[1]);
	/* A destination child reports its port; a source child says when it is
	 * about to connect. Either within a bound, so that a child that hangs
	 * fails the cell rather than the whole run. */
	struct pollfd p = {.fd = fds[0], .events = POLLIN};
	if (poll(&p, 1, 120 * 1000) != 1)
		fail_msg("the child did not start within 120 s");
	if (c->child == DESTINATION) {
		assert_int_equal(read(fds[0], port, sizeof(*port)), sizeof(*port));
	} else {
		char ready;
		assert_int_equal(read(fds[0], &ready, 1), 1);
	}
	close(fds[0]);
	return pid;
}

/* Reap the child within a bound; a stopped child is killed first. */
static int reap(pid_t pid, int expected)
{
	uint64_t deadline = guest_now_ns() + fail_within_ns;
	int status = 0;
	for (;;) {
		pid_t got = waitpid(pid, &status, WNOHANG | WUNTRACED);
		if (got == pid && WIFSTOPPED(status)) {
			kill(pid, SIGKILL);
			continue;
		}
		if (got == pid)
			break;
		if (guest_now_ns() > deadline) {
			/* A stopped child the test stopped itself is expected to hang. */
			kill(pid, SIGKILL);
			waitpid(pid, &status, 0);
			if (expected != 128 + SIGKILL)
				fail_msg("the child did not end within the bound");
			break;
		}
		struct timespec ts = {0, 5 * 1000000};
		nanosleep(&ts, NULL);
	}
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static void clean_migration(struct guest *g)
{
	uint16_t port;
	struct dest_spec spec = {.ram_bytes = RAM_BYTES, .options = ""};
	pid_t pid = dest_spawn(&spec, &port);
	guest_workload_pause(g->workload);
	uint64_t none = 0;
	struct source_run r = source_migrate_view(&g->ro, &g->rw, "", port, "cpu", 3, 0, 0, &none);
	if (r.rc)
		fail_msg("a fresh migration after the fault failed: %s", r.error);
	assert_int_equal(dest_wait(pid), 0);
}

static void run_cell(const struct cell *c)
{
	struct census before = census_take();
	struct guest g;
	struct guest_ram dram;
	struct run mine = {.cell = c};
	struct actor a = {.cell = c, .mine = &mine};
	uint16_t port = 0;
	guest_open(&g, true);
	if (c->child == DESTINATION) {
		a.child = spawn(c, &port);
		mine.side = SOURCE;
		mine.guest = &g;
		mine.port = port;
	} else {
		guest_ram_layout(&dram, ram_map(RAM_BYTES), RAM_BYTES);
		mine.side = DESTINATION;
		mine.session = listening_destination(&dram, c, &port);
		a.child = spawn(c, &port);
	}
	pthread_t t;
	if (mine.side == SOURCE)
		mine.session = source_session(c, &g); /* before the actor looks at it */
	assert_int_equal(pthread_create(&t, NULL, act, &a), 0);
	if (mine.side == SOURCE)
		run_source(&mine);
	else
		run_destination(&mine);
	a.done = 1;
	pthread_join(t, NULL);
	snprintf(mine.error, sizeof(mine.error), "%s", lmt_session_error(mine.session)->message);
	int child = reap(a.child, c->child_exit);
	lmt_session_free(mine.session);
	if (mine.rc >= 0)
		fail_msg("%s: the %s in this process did not fail", c->name,
		         mine.side == SOURCE ? "source" : "destination");
	if (mine.ended_ns - mine.started_ns > fail_within_ns + 2000 * MS)
		fail_msg("%s: took %llu ms to fail", c->name,
		         (unsigned long long)((mine.ended_ns - mine.started_ns) / MS));
	/* A dead peer is a broken connection on every plugin, not a cancel. */
	if (strstr(c->name, "killed") && mine.rc != -LMT_ECONN)
		fail_msg("%s: failed with %s, expected LMT_ECONN: %s", c->name, lmt_err_name(mine.rc),
		         mine.error);
	check_error_expected(c, mine.rc, mine.error);
	if (child != c->child_exit && !(c->child_exit == 1 && child == 128 + SIGKILL))
		fail_msg("%s: the child ended with %d, expected %d", c->name, child, c->child_exit);
	char after_stop[64] = "";
	if (a.stopped_ns && a.stopped_ns < mine.ended_ns)
		snprintf(after_stop, sizeof(after_stop), ", %llu ms after the SIGSTOP",
		         (unsigned long long)((mine.ended_ns - a.stopped_ns) / MS));
	print_message("    %-36s ok in %llu ms%s: %s %s\n", c->name,
	              (unsigned long long)((mine.ended_ns - mine.started_ns) / MS), after_stop,
	              lmt_err_name(mine.rc), mine.error);
	if (mine.side == DESTINATION)
		munmap(dram.base, RAM_BYTES);
	clean_migration(&g);
	guest_close(&g);
	census_check(before);
}

/* idle-timeout as the cells will have it, from a session made with their
 * options: every side must fail within it and a margin. */
static void set_fail_bound(void)
{
	char *opts = options(NULL);
	struct lmt_error err = {0};
	lmt_session *s = NULL;
	assert_int_equal(lmt_session_new(&s, LMT_ROLE_SOURCE, test_plugin(), opts, &err), 0);
	struct lmt_option_value v = {0};
	assert_int_equal(lmt_session_get_option(s, "idle-timeout", &v), 0);
	fail_within_ns = (uint64_t)v.integer + 4000 * MS;
	lmt_session_free(s);
	free(opts);
}

static void test_every_cell_fails_cleanly_and_a_fresh_migration_follows(void **state)
{
	set_fail_bound();
	const char *only = getenv("LMT_TEST_CELL");
	const char *no_process_faults = getenv("LMT_TEST_SKIP_PROCESS_FAULTS");
	int ran = 0, left_out = 0;
	for (size_t i = 0; i < sizeof(cells) / sizeof(cells[0]); i++) {
		if (only && !strstr(cells[i].name, only))
			continue;
		if (no_process_faults && *no_process_faults &&
		    (strstr(cells[i].name, "killed") || strstr(cells[i].name, "stopped"))) {
			left_out++;
			continue;
		}
		run_cell(&cells[i]);
		ran++;
	}
	print_message("    %d cells passed over %s\n", ran, test_plugin());
	if (writable_view())
		print_message("    not checked that lmt never writes the source guest (it had a "
		              "writable view): %s\n",
		              writable_view());
	if (left_out)
		print_message("    %d cells not run (killed or stopped peers): %s\n", left_out,
		              no_process_faults);
	assert_true(ran > 0);
}

int main(int argc, char **argv)
{
	/* The other side of a cell, started by spawn: CHILD_FLAG cell fd port. */
	if (argc == 5 && strcmp(argv[1], CHILD_FLAG) == 0) {
		size_t cell = strtoul(argv[2], NULL, 10);
		if (cell >= sizeof(cells) / sizeof(cells[0]))
			return 2;
		child_main(&cells[cell], atoi(argv[3]), (uint16_t)atoi(argv[4]));
	}
	const char *skip = getenv("LMT_TEST_SKIP_MATRIX");
	if (skip && *skip) {
		printf("SKIP: %s\n", skip);
		return 77;
	}
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_every_cell_fails_cleanly_and_a_fresh_migration_follows),
	};
	int failed = cmocka_run_group_tests(tests, NULL, NULL);
	/* A failed cell leaves its guest's workload running: stop it before
	 * exit, where a sanitized build's leak check stops every thread. */
	if (running_workload)
		guest_workload_stop(running_workload);
	return failed;
}
