/* lmt-bench: one migration run — a forked destination process over a memfd,
 * the source session in this process, then the bit-for-bit check; with
 * --postcopy the guest's workload moves to the destination at the switch;
 * or, for --target local, a handover of a memfd guest over unix:PATH,
 * checked by the destination itself. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdnoreturn.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"

/* How long a failed source waits for the destination's own account, and
 * how long the watchdog waits after a cancel before it kills the peer. */
#define GRACE_NS UINT64_C(2000000000)
#define PROGRESS_EVERY_NS UINT64_C(100000000)
/* The destination guest's writes differ from the source guest's. */
#define DESTINATION_SEED UINT64_C(0x2545f4914f6cdd1d)

enum child_msg_kind {
	CHILD_LISTENING = 1,
	CHILD_DONE = 2,
};

/* From the destination process over the pipe. Smaller than PIPE_BUF, so
 * each message is written atomically. */
struct child_msg {
	uint32_t kind;
	int32_t rc;
	uint16_t port;
	uint64_t prefault_ns;
	uint64_t state_length;
	uint64_t state_checksum;
	int32_t handover_checked; /* --target local: the destination compared */
	uint64_t resumed_at_ns;   /* guest_now_ns() when lmt_load_run returned */
	struct bench_postcopy postcopy;
	char error[BENCH_ERROR_MAX];
};

struct run {
	const struct bench_config *cfg;
	const char *plugin;
	struct bench_result *out;
	uint64_t deadline_ns;
	int memfd;
	int src_memfd; /* --target local: the source guest's RAM, handed over */
	int pipe_fd;
	pid_t child;
	struct guest_ram src;
	struct lmt_iterate_result last;
	bool progress_shown;
	bool have_report;
	struct child_msg report;
	uint8_t device_state[BENCH_DEVICE_STATE_SIZE];
	/* auto-converge: the workload the throttle callback holds back, while
	 * it runs (an lmt thread may call it when the migration fails) */
	pthread_mutex_t workload_lock;
	struct guest_workload *workload;
	/* --postcopy: what the destination guest wrote after resuming, in
	 * memory shared with the destination process */
	struct guest_write_log log;
	uint64_t log_bytes;
	uint64_t pause_ns; /* when the source guest was paused */
};

/* lmt_throttle_fn: the synthetic guest's "vCPU" held that share of the time. */
static void throttle_guest(void *opaque, uint32_t percent)
{
	struct run *run = opaque;
	pthread_mutex_lock(&run->workload_lock);
	guest_workload_throttle(run->workload, percent);
	pthread_mutex_unlock(&run->workload_lock);
}

static void workload_set(struct run *run, struct guest_workload *w)
{
	pthread_mutex_lock(&run->workload_lock);
	run->workload = w;
	pthread_mutex_unlock(&run->workload_lock);
}

static void note(struct bench_result *out, const char *fmt, ...) LMT_PRINTF(2, 3);

/* Record a failure; a later one is appended, so both sides can speak. */
static void note(struct bench_result *out, const char *fmt, ...)
{
	size_t len = strlen(out->error);
	va_list ap;

	if (len > 0 && len + 2 < sizeof(out->error)) {
		memcpy(out->error + len, "; ", 3);
		len += 2;
	}
	va_start(ap, fmt);
	vsnprintf(out->error + len, sizeof(out->error) - len, fmt, ap);
	va_end(ap);
}

static const char *lmt_message(int rc, const struct lmt_error *err)
{
	return err && err->message[0] ? err->message : lmt_strerror(rc);
}

/* With memfd >= 0, each block is that file's, from its offset in RAM. */
static int add_blocks(lmt_session *session, const struct guest_ram *ram, int memfd)
{
	for (uint32_t i = 0; i < ram->nblocks; i++) {
		const struct guest_block *b = &ram->blocks[i];
		uint64_t offset = (uint64_t)(b->host - ram->base);
		int rc = memfd >= 0 ? lmt_session_add_block_fd(session, b->name, b->host, b->length,
		                                               GUEST_PAGE_SIZE, memfd, offset)
		                    : lmt_session_add_block(session, b->name, b->host, b->length,
		                                            GUEST_PAGE_SIZE);

		if (rc < 0)
			return rc;
	}
	return 0;
}

/* ---- Watchdog ----------------------------------------------------------- */

/* At the deadline it cancels the session; if the run still has not ended
 * GRACE_NS later, it kills `victim` (the destination) to break any wait. */
struct watchdog {
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	lmt_session *session;
	pid_t victim;
	uint64_t deadline_ns;
	bool stop;
	bool fired;
};

static bool watchdog_wait(struct watchdog *wd, uint64_t until_ns)
{
	struct timespec ts = {
	        .tv_sec = (time_t)(until_ns / 1000000000u),
	        .tv_nsec = (long)(until_ns % 1000000000u),
	};

	while (!wd->stop && guest_now_ns() < until_ns)
		pthread_cond_timedwait(&wd->cond, &wd->lock, &ts);
	return !wd->stop;
}

static void *watchdog_main(void *arg)
{
	struct watchdog *wd = arg;

	pthread_mutex_lock(&wd->lock);
	if (watchdog_wait(wd, wd->deadline_ns)) {
		wd->fired = true;
		pthread_mutex_unlock(&wd->lock);
		lmt_cancel(wd->session);
		pthread_mutex_lock(&wd->lock);
		if (wd->victim > 0 && watchdog_wait(wd, wd->deadline_ns + GRACE_NS))
			kill(wd->victim, SIGKILL);
	}
	pthread_mutex_unlock(&wd->lock);
	return NULL;
}

static int watchdog_start(struct watchdog *wd, lmt_session *session, pid_t victim,
                          uint64_t deadline_ns)
{
	pthread_condattr_t attr;
	int rc;

	memset(wd, 0, sizeof(*wd));
	wd->session = session;
	wd->victim = victim;
	wd->deadline_ns = deadline_ns;
	pthread_mutex_init(&wd->lock, NULL);
	pthread_condattr_init(&attr);
	pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
	pthread_cond_init(&wd->cond, &attr);
	pthread_condattr_destroy(&attr);
	rc = pthread_create(&wd->thread, NULL, watchdog_main, wd);
	if (rc != 0) {
		pthread_cond_destroy(&wd->cond);
		pthread_mutex_destroy(&wd->lock);
		return -rc;
	}
	return 0;
}

/* Returns whether it fired. */
static bool watchdog_stop(struct watchdog *wd)
{
	pthread_mutex_lock(&wd->lock);
	wd->stop = true;
	pthread_cond_broadcast(&wd->cond);
	pthread_mutex_unlock(&wd->lock);
	pthread_join(wd->thread, NULL);
	pthread_cond_destroy(&wd->cond);
	pthread_mutex_destroy(&wd->lock);
	return wd->fired;
}

static void timeout_text(const struct bench_config *cfg, char *buf, size_t size)
{
	char duration[32];

	bench_format(LMT_OPT_DURATION, cfg->timeout_ns, duration, sizeof(duration));
	snprintf(buf, size, "timed out after %s", duration);
}

/* ---- Destination process ------------------------------------------------ */

static void child_send(int fd, const struct child_msg *msg)
{
	ssize_t n;

	do {
		n = write(fd, msg, sizeof(*msg));
	} while (n < 0 && errno == EINTR);
}

static void child_fail(struct child_msg *msg, int rc, const char *why, const char *detail)
{
	msg->rc = rc;
	snprintf(msg->error, sizeof(msg->error), "%s%s%s", why, why[0] ? ": " : "", detail);
}

static uint64_t prefault(uint8_t *base, uint64_t bytes)
{
	volatile uint8_t *p = base;
	uint64_t start = guest_now_ns();

	for (uint64_t off = 0; off < bytes; off += GUEST_PAGE_SIZE)
		p[off] = 0;
	return guest_now_ns() - start;
}

/* Where a --target local destination listens. */
static void local_uri(pid_t bench, char *buf, size_t size)
{
	const char *dir = getenv("TMPDIR");
	snprintf(buf, size, "unix:%s/lmt-bench-%d.sock", dir && *dir ? dir : "/tmp", (int)bench);
}

/* The destination guest's postcopy figures, once its load is over. */
static void dest_postcopy_stats(const struct bench_config *cfg, lmt_session *session,
                                const struct guest_write_log *log, struct child_msg *msg)
{
	struct bench_postcopy *pc = &msg->postcopy;
	struct lmt_stats st;

	if (lmt_session_stats(session, &st) == 0) {
		pc->resume_ns = st.resume_ns;
		pc->faults = st.faults;
		pc->fault_p50_ns = st.fault_p50_ns;
		pc->fault_p99_ns = st.fault_p99_ns;
		pc->fault_max_ns = st.fault_max_ns;
		pc->background_pages = st.background_pages;
		pc->postcopy_pages = st.postcopy_pages;
	}
	for (uint64_t p = 0; log->written && p < cfg->working_set / GUEST_PAGE_SIZE; p++)
		pc->written_pages += log->written[p];
}

/* A failed postcopy makes the pages that never came inaccessible: the
 * destination guest's workload, touching one, gets SIGSEGV, and the
 * destination reports that rather than dying unexplained. */
static struct {
	int fd;
	struct child_msg msg;
} lost_guest;

static void lost_guest_report(int sig)
{
	ssize_t n = write(lost_guest.fd, &lost_guest.msg, sizeof(lost_guest.msg));

	(void)sig;
	(void)n;
	_exit(1);
}

static void lost_guest_arm(int fd, const struct child_msg *msg)
{
	struct sigaction sa = {.sa_handler = lost_guest_report};

	lost_guest.fd = fd;
	lost_guest.msg = *msg;
	child_fail(&lost_guest.msg, -LMT_EIO, "postcopy failed",
	           "SIGSEGV in the destination after the switch (its guest touching a page "
	           "that never came)");
	sigemptyset(&sa.sa_mask);
	sigaction(SIGSEGV, &sa, NULL);
}

/* After a switch to postcopy the guest runs here at once: with --postcopy
 * its workload, as on the source, rewrites the destination's RAM (and
 * faults on the pages not there yet), noting each page in `log`, until
 * lmt_load_finish says every page arrived. */
static int dest_postcopy(const struct bench_config *cfg, lmt_session *session,
                         struct guest_ram *ram, const struct guest_write_log *log, int fd,
                         struct child_msg *msg)
{
	struct guest_workload *workload = NULL;
	struct lmt_stats st;
	int rc = lmt_session_stats(session, &st);

	if (rc < 0 || st.status != LMT_STATUS_POSTCOPY)
		return rc;
	msg->postcopy.switched = true;
	lost_guest_arm(fd, msg);
	const struct guest_workload_spec spec = {
	        .working_set = cfg->working_set,
	        .rate = cfg->dirty_rate,
	        .seed = cfg->seed ^ DESTINATION_SEED,
	        .content = cfg->content,
	        .pattern = &cfg->pattern,
	        .log = log,
	};
	if (cfg->postcopy && cfg->dirty_rate > 0 &&
	    guest_workload_start_spec(&workload, ram, &spec) < 0) {
		child_fail(msg, -LMT_ENOMEM, "destination workload thread", strerror(ENOMEM));
		return -LMT_ENOMEM;
	}
	rc = lmt_load_finish(session);
	msg->postcopy.dirtied_bytes = guest_workload_stop(workload);
	return rc;
}

static int dest_load(const struct bench_config *cfg, lmt_session *session, int fd,
                     uint64_t deadline_ns, struct guest_ram *ram, const struct guest_write_log *log,
                     struct child_msg *msg, bool *fired)
{
	struct child_msg listening = {.kind = CHILD_LISTENING};
	struct watchdog wd;
	char uri[PATH_MAX];
	int rc;

	if (cfg->local)
		local_uri(getppid(), uri, sizeof(uri));
	else
		snprintf(uri, sizeof(uri), "127.0.0.1:%u", (unsigned)cfg->port);
	rc = lmt_load_listen(session, uri, &listening.port);
	if (rc < 0)
		return rc;
	child_send(fd, &listening);
	if (watchdog_start(&wd, session, 0, deadline_ns) < 0)
		return -LMT_ENOMEM;
	rc = lmt_load_run(session);
	msg->resumed_at_ns = guest_now_ns();
	if (rc == 0)
		rc = dest_postcopy(cfg, session, ram, log, fd, msg);
	if (cfg->postcopy)
		dest_postcopy_stats(cfg, session, log, msg);
	*fired = watchdog_stop(&wd);
	return rc;
}

/* The pages of the source's file that hold data (the rest are holes,
 * which read as zero on both sides, and are not faulted in here). */
static bool same_data(const uint8_t *mine, const uint8_t *theirs, int file, uint64_t offset,
                      uint64_t length)
{
	uint64_t end = offset + length;
	off_t at = (off_t)offset;
	while ((uint64_t)at < end) {
		off_t data = lseek(file, at, SEEK_DATA);
		if (data < 0 || (uint64_t)data >= end)
			return true;
		off_t hole = lseek(file, data, SEEK_HOLE);
		uint64_t stop = hole < 0 || (uint64_t)hole > end ? end : (uint64_t)hole;
		uint64_t from = (uint64_t)data - offset;
		if (memcmp(mine + from, theirs + from, stop - (uint64_t)data) != 0)
			return false;
		at = (off_t)stop;
	}
	return true;
}

/* --target local: every block's memory, as this process's pointer shows
 * it, is the source's file (the descriptor lmt received is that file) and
 * holds what the paused source holds, byte for byte. */
static int dest_check_handover(lmt_session *session, const struct guest_ram *ram, int src_memfd,
                               struct child_msg *msg)
{
	struct stat theirs, got;
	uint8_t *src = mmap(NULL, ram->bytes, PROT_READ, MAP_SHARED, src_memfd, 0);
	if (src == MAP_FAILED || fstat(src_memfd, &theirs) != 0) {
		child_fail(msg, -LMT_EIO, "handover check", strerror(errno));
		return -1;
	}
	int rc = 0;
	for (uint32_t i = 0; i < ram->nblocks && rc == 0; i++) {
		const struct guest_block *b = &ram->blocks[i];
		uint64_t offset = (uint64_t)(b->host - ram->base), at = 0;
		int fd = -1;
		rc = lmt_load_block_fd(session, i, &fd, &at);
		if (rc == 0 &&
		    (fstat(fd, &got) != 0 || got.st_ino != theirs.st_ino || at != offset))
			rc = -LMT_EVERIFY;
		if (rc == 0 && !same_data(b->host, src + offset, src_memfd, offset, b->length))
			rc = -LMT_EVERIFY;
		if (fd >= 0)
			close(fd);
		if (rc)
			child_fail(msg, rc, "handover check",
			           "the block's memory is not the source's file");
	}
	munmap(src, ram->bytes);
	msg->handover_checked = rc == 0;
	return rc;
}

static void dest_migrate(const struct bench_config *cfg, const char *plugin, struct guest_ram *ram,
                         const struct guest_write_log *log, int memfd, int src_memfd, int fd,
                         uint64_t deadline_ns, struct child_msg *msg)
{
	struct lmt_error err = {0};
	lmt_session *session;
	bool fired = false;
	const void *state;
	size_t length;
	char why[64] = "";
	int rc;

	rc = lmt_session_new(&session, LMT_ROLE_DESTINATION, plugin, cfg->options, &err);
	if (rc < 0) {
		child_fail(msg, rc, "", lmt_message(rc, &err));
		return;
	}
	/* By descriptor for a handover, and for postcopy, whose pages then
	 * land in place in the memfd (docs/engine.md, "Postcopy"). */
	rc = add_blocks(session, ram, src_memfd >= 0 || cfg->postcopy ? memfd : -1);
	if (rc == 0)
		rc = dest_load(cfg, session, fd, deadline_ns, ram, log, msg, &fired);
	if (rc == 0)
		rc = lmt_load_device_state(session, &state, &length);
	if (rc == 0) {
		msg->state_length = length;
		msg->state_checksum = guest_checksum(state, length);
		if (src_memfd >= 0 && dest_check_handover(session, ram, src_memfd, msg))
			rc = msg->rc;
	} else if (!msg->error[0]) {
		if (fired)
			timeout_text(cfg, why, sizeof(why));
		child_fail(msg, rc, why, lmt_message(rc, lmt_session_error(session)));
	}
	lmt_session_free(session);
}

/* The destination's RAM at a 2 MiB-aligned address, as a VMM maps guest
 * RAM: lmt's postcopy switch moves such memory aside a page table at a
 * time (docs/engine.md). */
static uint8_t *map_aligned(uint64_t bytes, int memfd)
{
	const uint64_t align = 2ull << 20;
	uint8_t *area = mmap(NULL, bytes + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (area == MAP_FAILED)
		return MAP_FAILED;
	uint8_t *at = (uint8_t *)(((uintptr_t)area + align - 1) & ~(uintptr_t)(align - 1));
	if (at > area)
		munmap(area, (size_t)(at - area));
	munmap(at + bytes, (size_t)(area + bytes + align - (at + bytes)));
	return mmap(at, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, memfd, 0);
}

/* src_memfd: the source guest's file when it is handed over, or -1. */
static noreturn void dest_main(const struct bench_config *cfg, const char *plugin,
                               const struct guest_write_log *log, int memfd, int src_memfd, int fd,
                               pid_t parent, uint64_t deadline_ns)
{
	struct child_msg msg = {.kind = CHILD_DONE};
	struct guest_ram ram;
	uint8_t *base;

	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() != parent)
		_exit(1);
	/* The last resort if a cancel does not end the run. */
	alarm((unsigned)((cfg->timeout_ns + 2 * GRACE_NS) / 1000000000u) + 1);
	base = map_aligned(cfg->ram_bytes, memfd);
	if (base == MAP_FAILED) {
		child_fail(&msg, -LMT_ENOMEM, "mapping the destination RAM", strerror(errno));
	} else {
		/* Handed-over RAM replaces this memory: nothing to fault in. */
		if (cfg->prefault && src_memfd < 0)
			msg.prefault_ns = prefault(base, cfg->ram_bytes);
		guest_ram_layout(&ram, base, cfg->ram_bytes);
		dest_migrate(cfg, plugin, &ram, log, memfd, src_memfd, fd, deadline_ns, &msg);
		munmap(base, cfg->ram_bytes);
	}
	child_send(fd, &msg);
	_exit(msg.rc == 0 ? 0 : 1);
}

/* ---- Source ------------------------------------------------------------- */

static int terminal_width(FILE *f)
{
	struct winsize ws;

	if (ioctl(fileno(f), TIOCGWINSZ, &ws) == 0 && ws.ws_col >= 20)
		return ws.ws_col;
	return 80;
}

/* One line, rewritten in place: cut to the terminal's width, since a line
 * that wraps cannot be rewritten; the label gives way before the figures. */
static void progress_show(struct run *run, uint64_t *last_ns)
{
	const struct lmt_iterate_result *it = &run->last;
	const char *label = run->cfg->label ? run->cfg->label : run->plugin;
	FILE *f = run->cfg->progress;
	uint64_t now = guest_now_ns();
	char rate[32] = "", downtime[48] = "", figures[160];
	int width, room;

	if (!f || now - *last_ns < PROGRESS_EVERY_NS)
		return;
	*last_ns = now;
	run->progress_shown = true;
	if (it->bandwidth_bps > 0)
		snprintf(rate, sizeof(rate), " at %.2f GiB/s",
		         (double)it->bandwidth_bps / 1073741824.0);
	if (it->expected_downtime_known)
		snprintf(downtime, sizeof(downtime), ", expected downtime %.0f ms",
		         (double)it->expected_downtime_ns / 1e6);
	snprintf(figures, sizeof(figures), ": pass %u, %.1f MiB left%s%s", (unsigned)it->pass,
	         (double)it->remaining_bytes / 1048576.0, rate, downtime);
	width = terminal_width(f) - 1;
	room = width - (int)strlen(figures);
	fprintf(f, "\r%.*s%.*s\033[K", room > 8 ? room : 8, label, width, figures);
	fflush(f);
}

/* How long this thread has waited for a CPU, in ns (the second figure of
 * its schedstat), or UINT64_MAX where the kernel does not say. */
static uint64_t runq_wait_ns(int fd)
{
	char text[96];
	unsigned long long running, waiting;
	ssize_t n = fd >= 0 ? pread(fd, text, sizeof(text) - 1, 0) : -1;
	if (n <= 0)
		return UINT64_MAX;
	text[n] = '\0';
	return sscanf(text, "%llu %llu", &running, &waiting) == 2 ? waiting : UINT64_MAX;
}

/* ---- The wake probe (--wake-probe) ---------------------------------------- */

#define WAKE_PROBE_NS 1000000ull

struct wake_probe {
	pthread_t thread;
	atomic_bool stop;
	bool started;
	uint64_t sleeps; /* completed: one at least, unless clock_nanosleep failed */
	uint64_t late_max_ns;
};

/* Sleep 1 ms at a time, each to an absolute instant, until stopped, and
 * note the most a sleep ended after its instant: how late this host wakes
 * a sleeping thread of this process while the migration runs. No call of
 * lmt_save_iterate can be counted on to end sooner after its own budget. */
static void *wake_probe_main(void *arg)
{
	struct wake_probe *p = arg;

	/* At least one sleep, even when the pre-copy ends before the thread
	 * is first scheduled (a small guest's did, and the run measured
	 * nothing): its end then waits for that sleep, 1 ms and how late. */
	do {
		uint64_t due = guest_now_ns() + WAKE_PROBE_NS;
		struct timespec ts = {.tv_sec = (time_t)(due / 1000000000u),
		                      .tv_nsec = (long)(due % 1000000000u)};

		int rc;

		while ((rc = clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL)) == EINTR)
			;
		if (rc != 0)
			break;
		uint64_t now = guest_now_ns();
		uint64_t late = now > due ? now - due : 0;
		if (late > p->late_max_ns)
			p->late_max_ns = late;
		p->sleeps++;
	} while (!atomic_load(&p->stop));
	return NULL;
}

static void wake_probe_start(struct wake_probe *p, bool wanted)
{
	memset(p, 0, sizeof(*p));
	p->started = wanted && pthread_create(&p->thread, NULL, wake_probe_main, p) == 0;
}

/* Into out: what the probe saw, if it ran and slept at least once. */
static void wake_probe_stop(struct wake_probe *p, struct bench_result *out)
{
	if (!p->started)
		return;
	atomic_store(&p->stop, true);
	pthread_join(p->thread, NULL);
	out->wake_probed = p->sleeps > 0;
	out->wake_late_max_ns = p->late_max_ns;
}

static int source_pre_copy(struct run *run, lmt_session *session, const char *uri)
{
	struct wake_probe probe;
	uint64_t last_ns = 0;
	int rc;
	/* The thread that calls iterate: how much of its longest call it
	 * spent waiting for a CPU rather than in lmt (a host with fewer cores
	 * than busy threads). */
	int sched = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);

	rc = lmt_save_setup(session, uri);
	/* A plugin that loads but finds no device says so at setup. */
	if (rc == -LMT_ENOTFOUND)
		run->out->unavailable = true;
	wake_probe_start(&probe, rc == 0 && run->cfg->wake_probe);
	/* --postcopy-after 0: the switch comes before any pass. */
	while (rc == 0 && !(run->cfg->postcopy && run->cfg->postcopy_after == 0)) {
		struct lmt_iterate_result it = {0};
		uint64_t w0 = runq_wait_ns(sched);
		uint64_t t0 = guest_now_ns();
		rc = lmt_save_iterate(session, &it);
		uint64_t took = guest_now_ns() - t0;
		uint64_t w1 = runq_wait_ns(sched);
		if (took > run->out->max_iterate_ns) {
			run->out->max_iterate_ns = took;
			run->out->max_iterate_runq_known = w0 != UINT64_MAX && w1 != UINT64_MAX;
			run->out->max_iterate_runq_ns = w1 > w0 ? w1 - w0 : 0;
		}
		/* A failed call's result is not kept: the message after a
		 * timeout names the last pass that was reported. */
		if (rc < 0)
			break;
		run->last = it;
		if (it.ready)
			break;
		progress_show(run, &last_ns);
	}
	wake_probe_stop(&probe, run->out);
	if (sched >= 0)
		close(sched);
	if (run->progress_shown) {
		fputs("\r\033[K", run->cfg->progress);
		fflush(run->cfg->progress);
	}
	return rc;
}

/* Stop-and-copy, or the switch to postcopy when lmt said so; with
 * --postcopy-after 0 the switch at once. */
static int source_switch(struct run *run, lmt_session *session)
{
	if (run->cfg->postcopy && run->cfg->postcopy_after == 0)
		return lmt_save_postcopy(session, run->device_state, sizeof(run->device_state));
	return lmt_save_complete(session, run->device_state, sizeof(run->device_state));
}

/* In postcopy the destination runs the guest: wait for the last page.
 * The source's RAM stays as it was at the pause until then. */
static int source_finish(lmt_session *session)
{
	struct lmt_stats st;

	if (lmt_session_stats(session, &st) < 0 || st.status != LMT_STATUS_POSTCOPY)
		return 0;
	return lmt_save_finish(session);
}

/* Run the migration with the watchdog and, when asked, the workload. */
static int source_drive(struct run *run, lmt_session *session, const char *uri, bool *fired)
{
	const struct bench_config *cfg = run->cfg;
	struct guest_workload *workload = NULL;
	struct watchdog wd;
	int rc = watchdog_start(&wd, session, run->child, run->deadline_ns);
	uint64_t workload_start = 0;

	if (rc < 0) {
		note(run->out, "source: watchdog thread: %s", strerror(-rc));
		return -LMT_ENOMEM;
	}
	if (cfg->dirty_rate > 0) {
		const struct guest_workload_spec spec = {.working_set = cfg->working_set,
		                                         .rate = cfg->dirty_rate,
		                                         .seed = cfg->seed,
		                                         .content = cfg->content,
		                                         .pattern = &cfg->pattern};
		workload_start = guest_now_ns();
		rc = guest_workload_start_spec(&workload, &run->src, &spec);
		if (rc < 0) {
			note(run->out, "source: workload thread: %s", strerror(-rc));
			rc = -LMT_ENOMEM;
		}
	}
	workload_set(run, workload);
	if (rc == 0)
		rc = source_pre_copy(run, session, uri);
	/* The guest pauses: nothing may write its RAM during complete. */
	run->pause_ns = guest_now_ns();
	guest_workload_pause(workload);
	if (workload)
		run->out->workload_ns = run->pause_ns - workload_start;
	if (rc == 0)
		rc = source_switch(run, session);
	/* After a switch to postcopy it never runs here again. */
	workload_set(run, NULL);
	run->out->dirtied_bytes = guest_workload_stop(workload);
	if (rc == 0)
		rc = source_finish(session);
	*fired = watchdog_stop(&wd);
	return rc;
}

static void source_passes(struct run *run, lmt_session *session)
{
	struct bench_result *out = run->out;
	int n = lmt_session_passes(session, NULL, 0), copied;

	if (n <= 0)
		return;
	out->passes = calloc((size_t)n, sizeof(*out->passes));
	if (!out->passes)
		return;
	copied = lmt_session_passes(session, out->passes, (uint32_t)n);
	out->npasses = copied < 0 ? 0 : copied < n ? (uint32_t)copied : (uint32_t)n;
}

static void source_stats(struct run *run, lmt_session *session)
{
	struct bench_result *out = run->out;
	size_t size = 4096;
	int n;

	source_passes(run, session);
	if (lmt_session_stats(session, &out->stats) < 0)
		return;
	out->have_stats = true;
	for (int attempt = 0; attempt < 2; attempt++) {
		char *json = malloc(size);

		if (!json)
			return;
		n = lmt_stats_json(&out->stats, json, size);
		if (n >= 0 && (size_t)n < size) {
			out->stats_json = json;
			return;
		}
		free(json);
		if (n < 0)
			return;
		size = (size_t)n + 1;
	}
}

static void source_fail(struct run *run, lmt_session *session, int rc, bool fired)
{
	char why[64];

	if (run->out->error[0])
		return;
	if (!fired) {
		note(run->out, "source: %s", lmt_message(rc, lmt_session_error(session)));
		return;
	}
	timeout_text(run->cfg, why, sizeof(why));
	struct lmt_stats st;
	if (lmt_session_stats(session, &st) == 0 && st.status == LMT_STATUS_POSTCOPY_FAILED) {
		note(run->out, "source: %s in postcopy, %llu pages sent after the switch: %s", why,
		     (unsigned long long)st.postcopy_pages,
		     lmt_message(rc, lmt_session_error(session)));
		return;
	}
	if (run->last.pass == 0) {
		note(run->out, "source: %s before the first iteration returned: %s", why,
		     lmt_message(rc, lmt_session_error(session)));
		return;
	}
	note(run->out, "source: %s in pass %u with %.1f MiB left: %s", why,
	     (unsigned)run->last.pass, (double)run->last.remaining_bytes / 1048576.0,
	     lmt_message(rc, lmt_session_error(session)));
}

static int source_migrate(struct run *run, const char *uri)
{
	struct lmt_error err = {0};
	lmt_session *session;
	bool fired = false;
	int rc;

	rc = lmt_session_new(&session, LMT_ROLE_SOURCE, run->plugin, run->cfg->options, &err);
	if (rc < 0) {
		note(run->out, "source: %s", lmt_message(rc, &err));
		return rc;
	}
	rc = add_blocks(session, &run->src, run->src_memfd);
	if (rc == 0)
		rc = lmt_session_set_dirty_sync(session, guest_dirty_sync, &run->src);
	if (rc == 0)
		rc = lmt_session_set_throttle(session, throttle_guest, run);
	if (rc == 0)
		rc = source_drive(run, session, uri, &fired);
	if (rc < 0)
		source_fail(run, session, rc, fired);
	source_stats(run, session);
	lmt_session_free(session);
	return rc;
}

/* ---- The run ------------------------------------------------------------ */

/* Anonymous memory, or for a handover a memfd of the guest's own. */
static uint8_t *source_ram(struct run *run)
{
	const struct bench_config *cfg = run->cfg;
	if (!cfg->local || cfg->local_anonymous)
		return mmap(NULL, cfg->ram_bytes, PROT_READ | PROT_WRITE,
		            MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	run->src_memfd = memfd_create("lmt-bench-guest", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (run->src_memfd < 0 || ftruncate(run->src_memfd, (off_t)cfg->ram_bytes) < 0)
		return MAP_FAILED;
	return mmap(NULL, cfg->ram_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, run->src_memfd, 0);
}

/* --postcopy: the destination guest's write log, shared with the
 * destination process it forks into. */
static int prepare_log(struct run *run)
{
	uint64_t pages = run->cfg->working_set / GUEST_PAGE_SIZE;
	uint8_t *map;

	run->log_bytes = pages * (sizeof(uint64_t) + 1);
	map = mmap(NULL, run->log_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (map == MAP_FAILED) {
		note(run->out, "destination write log: %s", strerror(errno));
		run->log_bytes = 0;
		return -1;
	}
	run->log.state = (uint64_t *)map;
	run->log.written = map + pages * sizeof(uint64_t);
	return 0;
}

static int prepare(struct run *run)
{
	const struct bench_config *cfg = run->cfg;
	uint64_t rng = cfg->seed ^ UINT64_C(0xd1b54a32d192ed03);
	uint8_t *src;

	if (cfg->postcopy && prepare_log(run) < 0)
		return -1;
	run->memfd = memfd_create("lmt-bench-ram", MFD_CLOEXEC);
	if (run->memfd < 0 || ftruncate(run->memfd, (off_t)cfg->ram_bytes) < 0) {
		note(run->out, "destination RAM memfd: %s", strerror(errno));
		return -1;
	}
	src = source_ram(run);
	if (src == MAP_FAILED) {
		note(run->out, "source RAM: %s", strerror(errno));
		return -1;
	}
	/* The destination never reads it: spare the fork its page tables. */
	madvise(src, cfg->ram_bytes, MADV_DONTFORK);
	bench_advise_thp(src, cfg->ram_bytes, cfg->thp);
	guest_ram_layout(&run->src, src, cfg->ram_bytes);
	if (guest_ram_alloc_dirty(&run->src) < 0) {
		note(run->out, "dirty bitmap: %s", strerror(ENOMEM));
		return -1;
	}
	uint64_t made[GUEST_PAGE_CLASSES];
	guest_content_fill(cfg->content, &run->src, cfg->seed, made);
	run->out->zero_pages_made = made[GUEST_PAGE_ZERO];
	for (size_t i = 0; i < sizeof(run->device_state); i += sizeof(uint64_t)) {
		uint64_t word = guest_random(&rng);

		memcpy(run->device_state + i, &word, sizeof(word));
	}
	return 0;
}

static int spawn(struct run *run)
{
	int fds[2];
	pid_t parent = getpid();

	if (pipe2(fds, O_CLOEXEC) < 0) {
		note(run->out, "pipe: %s", strerror(errno));
		return -1;
	}
	fflush(NULL);
	run->child = fork();
	if (run->child == 0) {
		close(fds[0]);
		dest_main(run->cfg, run->plugin, &run->log, run->memfd, run->src_memfd, fds[1],
		          parent, run->deadline_ns);
	}
	close(fds[1]);
	run->pipe_fd = fds[0];
	if (run->child < 0) {
		note(run->out, "fork: %s", strerror(errno));
		return -1;
	}
	return 0;
}

/* 0, -ETIMEDOUT, or -EPIPE when the destination closed the pipe. */
static int read_report(int fd, struct child_msg *msg, uint64_t deadline_ns)
{
	size_t got = 0;

	while (got < sizeof(*msg)) {
		struct pollfd pfd = {.fd = fd, .events = POLLIN};
		uint64_t now = guest_now_ns(), wait_ms;
		ssize_t n;
		int rc;

		if (now >= deadline_ns)
			return -ETIMEDOUT;
		wait_ms = (deadline_ns - now + 999999) / 1000000;
		rc = poll(&pfd, 1, wait_ms > INT_MAX ? INT_MAX : (int)wait_ms);
		if (rc < 0 && errno != EINTR)
			return -errno;
		if (rc <= 0)
			continue;
		n = read(fd, (char *)msg + got, sizeof(*msg) - got);
		if (n == 0)
			return -EPIPE;
		if (n < 0 && errno != EINTR)
			return -errno;
		got += n > 0 ? (size_t)n : 0;
	}
	return 0;
}

static void describe_exit(int status, char *buf, size_t size)
{
	if (WIFSIGNALED(status))
		snprintf(buf, size, "killed by signal %d (%s)", WTERMSIG(status),
		         strsignal(WTERMSIG(status)));
	else
		snprintf(buf, size, "exit status %d", WEXITSTATUS(status));
}

/* Reap the destination, killing it when it outlives `limit_ns`. */
static int reap(struct run *run, uint64_t limit_ns)
{
	const struct timespec tick = {0, 1000000};
	int status = 0;
	pid_t pid;

	while ((pid = waitpid(run->child, &status, WNOHANG)) == 0) {
		if (guest_now_ns() >= limit_ns) {
			kill(run->child, SIGKILL);
			limit_ns = UINT64_MAX;
		}
		nanosleep(&tick, NULL);
	}
	if (pid < 0 && errno == EINTR)
		return reap(run, limit_ns);
	run->child = -1;
	return status;
}

static int wait_listening(struct run *run, uint16_t *port)
{
	struct child_msg *msg = &run->report;
	int rc = read_report(run->pipe_fd, msg, run->deadline_ns);

	if (rc == 0 && msg->kind == CHILD_LISTENING) {
		*port = msg->port;
		return 0;
	}
	/* It failed before listening: collect_child tells why. */
	run->have_report = rc == 0 && msg->kind == CHILD_DONE;
	return -1;
}

static void collect_postcopy(struct run *run)
{
	struct bench_postcopy *pc = &run->out->postcopy;

	if (!run->cfg->postcopy || run->report.rc < 0)
		return;
	*pc = run->report.postcopy;
	/* Both instants are CLOCK_MONOTONIC on this host. */
	if (run->pause_ns && run->report.resumed_at_ns >= run->pause_ns)
		pc->pause_to_resume_ns = run->report.resumed_at_ns - run->pause_ns;
	run->out->postcopy_ran = true;
}

static void collect_child(struct run *run, bool source_ok)
{
	/* After a failure the destination, told by its connection or by its
	 * own watchdog, should have its say within the grace period. */
	uint64_t limit = source_ok ? run->deadline_ns + GRACE_NS : guest_now_ns() + GRACE_NS;
	char how[96];
	int status;

	if (!run->have_report && read_report(run->pipe_fd, &run->report, limit) == 0)
		run->have_report = run->report.kind == CHILD_DONE;
	status = reap(run, run->have_report ? limit + GRACE_NS : 0);
	if (run->have_report) {
		run->out->prefault_ns = run->report.prefault_ns;
		collect_postcopy(run);
		if (run->report.rc < 0)
			note(run->out, "destination: %s", run->report.error);
		return;
	}
	if (guest_now_ns() >= run->deadline_ns)
		timeout_text(run->cfg, how, sizeof(how));
	else
		describe_exit(status, how, sizeof(how));
	note(run->out, "destination: no result (%s)", how);
}

/* `base_offset`: where the block starts in the guest's RAM. */
static bool compare_block(struct bench_result *out, const struct guest_block *b, const uint8_t *dst,
                          uint64_t base_offset)
{
	const uint8_t *src = b->host;
	uint64_t first = UINT64_MAX, pages = 0;

	if (memcmp(src, dst, b->length) == 0)
		return true;
	for (uint64_t off = 0; off < b->length; off += GUEST_PAGE_SIZE) {
		if (memcmp(src + off, dst + off, GUEST_PAGE_SIZE) == 0)
			continue;
		pages++;
		if (first != UINT64_MAX)
			continue;
		for (first = off; src[first] == dst[first];)
			first++;
	}
	note(out,
	     "RAM differs, first at offset %llu (block %s + %llu): source 0x%02x, "
	     "destination 0x%02x; %llu of the block's %llu pages differ",
	     (unsigned long long)(base_offset + first), b->name, (unsigned long long)first,
	     src[first], dst[first], (unsigned long long)pages, (unsigned long long)b->npages);
	return false;
}

/* --postcopy: a page the destination guest wrote after resuming must hold
 * what it last wrote there (rebuilt from its log), every other page what
 * the source held at the pause. */
static bool compare_block_postcopy(struct run *run, const struct guest_block *b, const uint8_t *dst,
                                   uint64_t base_offset)
{
	uint64_t first_page = base_offset / GUEST_PAGE_SIZE;
	uint64_t logged = run->cfg->working_set / GUEST_PAGE_SIZE;
	uint64_t written[GUEST_PAGE_SIZE / sizeof(uint64_t)];
	uint64_t bad = 0;

	for (uint64_t i = 0; i < b->npages; i++) {
		uint64_t p = first_page + i, off = i * GUEST_PAGE_SIZE, at = 0;
		bool by_destination = p < logged && run->log.written[p];
		const uint8_t *want = b->host + off, *got = dst + off;

		if (by_destination) {
			guest_page_pattern(run->cfg->content, written, run->log.state[p]);
			want = (const uint8_t *)written;
		}
		if (memcmp(want, got, GUEST_PAGE_SIZE) == 0 || bad++ > 0)
			continue;
		while (want[at] == got[at])
			at++;
		note(run->out,
		     "RAM differs, first at offset %llu (block %s + %llu): %s 0x%02x, "
		     "destination 0x%02x",
		     (unsigned long long)(base_offset + off + at), b->name,
		     (unsigned long long)(off + at),
		     by_destination ? "written by the destination guest" : "source at the pause",
		     want[at], got[at]);
	}
	if (bad)
		note(run->out, "%llu of the block's %llu pages differ", (unsigned long long)bad,
		     (unsigned long long)b->npages);
	return bad == 0;
}

/* The destination's RAM against the paused source's. */
static bool compare_ram(struct run *run)
{
	const struct bench_config *cfg = run->cfg;
	int prot = cfg->test_corrupt ? PROT_READ | PROT_WRITE : PROT_READ;
	uint8_t *dst = mmap(NULL, cfg->ram_bytes, prot, MAP_SHARED, run->memfd, 0);
	bool same = true;

	if (dst == MAP_FAILED) {
		note(run->out, "verify: mapping the destination RAM: %s", strerror(errno));
		return false;
	}
	/* Proves that the check catches a wrong byte (tests only); with
	 * --postcopy, in a page the destination guest wrote too. */
	if (cfg->test_corrupt) {
		dst[cfg->ram_bytes / 2] ^= 0x01;
		for (uint64_t p = 0; run->log.written && p < cfg->working_set / GUEST_PAGE_SIZE;
		     p++) {
			if (run->log.written[p] && p != cfg->ram_bytes / 2 / GUEST_PAGE_SIZE) {
				dst[p * GUEST_PAGE_SIZE + 1] ^= 0x01;
				break;
			}
		}
	}
	for (uint32_t i = 0; i < run->src.nblocks && same; i++) {
		const struct guest_block *b = &run->src.blocks[i];
		uint64_t offset = (uint64_t)(b->host - run->src.base);

		same = run->log.state ? compare_block_postcopy(run, b, dst + offset, offset)
		                      : compare_block(run->out, b, dst + offset, offset);
	}
	munmap(dst, cfg->ram_bytes);
	return same;
}

/* Handed over, the RAM is one file that only the destination can show
 * it maps: it compared (dest_check_handover). */
static bool handover_checked(struct run *run)
{
	if (run->cfg->test_corrupt)
		note(run->out,
		     "--test-corrupt: a byte flipped in handed-over RAM flips on both sides");
	else if (!run->report.handover_checked)
		note(run->out, "the destination did not check its memory");
	return run->report.handover_checked && !run->cfg->test_corrupt;
}

static void verify(struct run *run)
{
	bool same = run->src_memfd >= 0 ? handover_checked(run) : compare_ram(run);

	if (run->report.state_length != sizeof(run->device_state) ||
	    run->report.state_checksum !=
	            guest_checksum(run->device_state, sizeof(run->device_state))) {
		note(run->out, "device state differs: %llu bytes received, %zu sent",
		     (unsigned long long)run->report.state_length, sizeof(run->device_state));
		same = false;
	}
	run->out->verified = same;
}

static void release(struct run *run)
{
	if (run->child > 0)
		reap(run, 0);
	if (run->pipe_fd >= 0)
		close(run->pipe_fd);
	if (run->memfd >= 0)
		close(run->memfd);
	if (run->src_memfd >= 0)
		close(run->src_memfd);
	if (run->src.base)
		munmap(run->src.base, run->src.bytes);
	if (run->log_bytes)
		munmap(run->log.state, run->log_bytes);
	guest_ram_free_dirty(&run->src);
}

/* ---- A file target ----------------------------------------------------- */

/* Restore `path` into the destination RAM (the memfd, fresh and zeroed),
 * in this process, timed from listen to the end of the load. */
static int file_restore(struct run *run, const char *uri)
{
	const struct bench_config *cfg = run->cfg;
	struct lmt_error err = {0};
	struct guest_ram ram;
	lmt_session *session;
	struct watchdog wd;
	const void *state;
	size_t length;
	int rc;
	uint8_t *base =
	        mmap(NULL, cfg->ram_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, run->memfd, 0);

	if (base == MAP_FAILED) {
		note(run->out, "mapping the destination RAM: %s", strerror(errno));
		return -1;
	}
	if (cfg->prefault)
		run->out->prefault_ns = prefault(base, cfg->ram_bytes);
	guest_ram_layout(&ram, base, cfg->ram_bytes);
	rc = lmt_session_new(&session, LMT_ROLE_DESTINATION, run->plugin, cfg->options, &err);
	if (rc < 0) {
		note(run->out, "restore: %s", lmt_message(rc, &err));
		munmap(base, cfg->ram_bytes);
		return rc;
	}
	rc = add_blocks(session, &ram, -1);
	if (rc == 0)
		rc = watchdog_start(&wd, session, 0, run->deadline_ns) < 0 ? -LMT_ENOMEM : 0;
	if (rc == 0) {
		uint64_t t0 = guest_now_ns();
		rc = lmt_load_listen(session, uri, NULL);
		if (rc == 0)
			rc = lmt_load_run(session);
		run->out->restore_ns = guest_now_ns() - t0;
		if (watchdog_stop(&wd) && rc < 0)
			note(run->out, "restore: timed out");
	}
	if (rc == 0 && lmt_load_device_state(session, &state, &length) == 0) {
		struct lmt_stats st;
		run->report.state_length = length;
		run->report.state_checksum = guest_checksum(state, length);
		if (lmt_session_stats(session, &st) == 0)
			run->out->restored_bytes = st.bytes_received;
	} else if (rc < 0) {
		note(run->out, "restore: %s", lmt_message(rc, lmt_session_error(session)));
	}
	lmt_session_free(session);
	munmap(base, cfg->ram_bytes);
	return rc;
}

/* ---- A lazy restore of the same file ----------------------------------- */

/* The synthetic guest of a lazy restore: from the moment lmt_load_run
 * returns it reads pages in random order, one byte each, until the load
 * is finished, as vCPUs would while the rest arrives behind them. */
struct lazy_guest {
	pthread_t thread;
	const uint8_t *base;
	uint64_t npages;
	atomic_bool stop;
	uint64_t touched;
	uint8_t sum; /* keeps the reads */
};

static void *lazy_guest_run(void *arg)
{
	struct lazy_guest *g = arg;
	uint64_t seed = 77;

	while (!atomic_load(&g->stop) && g->touched < g->npages) {
		uint64_t page = guest_random(&seed) % g->npages;
		g->sum ^= *(const volatile uint8_t *)(g->base + page * GUEST_PAGE_SIZE);
		g->touched++;
	}
	return NULL;
}

/* Run the lazy load on `session` whose blocks are `ram`: the guest starts
 * once lmt_load_run returns; the restore ends with lmt_load_finish. */
static int lazy_load(struct run *run, lmt_session *session, const char *uri,
                     const struct guest_ram *ram)
{
	struct lazy_guest g = {.base = ram->base, .npages = ram->bytes / GUEST_PAGE_SIZE};
	uint64_t t0 = guest_now_ns();
	int rc = lmt_load_listen(session, uri, NULL);

	if (rc == 0)
		rc = lmt_load_run(session);
	run->out->lazy_resume_ns = guest_now_ns() - t0;
	bool started = rc == 0 && pthread_create(&g.thread, NULL, lazy_guest_run, &g) == 0;
	if (rc == 0)
		rc = lmt_load_finish(session);
	run->out->lazy_restore_ns = guest_now_ns() - t0;
	atomic_store(&g.stop, true);
	if (started)
		pthread_join(g.thread, NULL);
	return rc;
}

/* The device state and every block of `ram` against the source's. */
static void lazy_check(struct run *run, lmt_session *session, const struct guest_ram *ram)
{
	const void *state;
	size_t length;
	bool same = lmt_load_device_state(session, &state, &length) == 0 &&
	            length == sizeof(run->device_state) &&
	            memcmp(state, run->device_state, length) == 0;

	if (!same)
		note(run->out, "lazy restore: the device state differs");
	for (uint32_t i = 0; i < run->src.nblocks && same; i++) {
		const struct guest_block *b = &run->src.blocks[i];
		uint64_t offset = (uint64_t)(b->host - run->src.base);
		same = compare_block(run->out, b, ram->base + offset, offset);
	}
	run->out->lazy_verified = same;
}

/* Restore the file again with restore=lazy into fresh private memory
 * (what userfaultfd's missing-page mode serves), the synthetic guest
 * touching it meanwhile, and check it bit for bit. Where userfaultfd is
 * not available the figures stay unmeasured and a line says why. */
static void lazy_file_restore(struct run *run, const char *uri)
{
	const struct bench_config *cfg = run->cfg;
	struct lmt_error err = {0};
	struct guest_ram ram;
	lmt_session *session;
	struct watchdog wd;
	struct lmt_stats st;
	char options[1024];
	uint8_t *base = mmap(NULL, cfg->ram_bytes, PROT_READ | PROT_WRITE,
	                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

	if (base == MAP_FAILED) {
		note(run->out, "lazy restore: mapping its RAM: %s", strerror(errno));
		return;
	}
	guest_ram_layout(&ram, base, cfg->ram_bytes);
	snprintf(options, sizeof(options), "%s%srestore=lazy", cfg->options ? cfg->options : "",
	         cfg->options && *cfg->options ? "," : "");
	int rc = lmt_session_new(&session, LMT_ROLE_DESTINATION, run->plugin, options, &err);
	if (rc < 0) {
		note(run->out, "lazy restore: %s", lmt_message(rc, &err));
		munmap(base, cfg->ram_bytes);
		return;
	}
	rc = add_blocks(session, &ram, -1);
	if (rc == 0)
		rc = watchdog_start(&wd, session, 0, run->deadline_ns) < 0 ? -LMT_ENOMEM : 0;
	if (rc == 0) {
		rc = lazy_load(run, session, uri, &ram);
		if (watchdog_stop(&wd) && rc < 0)
			note(run->out, "lazy restore: timed out");
	}
	if (rc == 0 && lmt_session_stats(session, &st) == 0) {
		run->out->lazy_ran = true;
		run->out->lazy_faults = st.faults;
		run->out->lazy_fault_p99_ns = st.fault_p99_ns;
		lazy_check(run, session, &ram);
	} else if (rc == -LMT_ENOTSUP) {
		fprintf(stderr, "lmt-bench: no lazy restore: %s\n",
		        lmt_session_error(session)->message);
	} else if (rc < 0) {
		note(run->out, "lazy restore: %s", lmt_message(rc, lmt_session_error(session)));
	}
	lmt_session_free(session);
	munmap(base, cfg->ram_bytes);
}

static void drop_cache(const char *path)
{
	int fd = open(path, O_RDONLY);

	if (fd >= 0) {
		posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
		close(fd);
	}
}

/* Save the guest to a file in the target directory, then restore it into
 * a fresh destination and check it as a migration is checked. The file
 * leaves the page cache between the two (posix_fadvise), so that the
 * restore reads the disk, as a restore on another boot would. */
static void file_run(struct run *run)
{
	char path[PATH_MAX], uri[PATH_MAX + 8];
	struct stat st;

	snprintf(path, sizeof(path), "%s/lmt-bench-%d.lmt", run->cfg->target_dir, (int)getpid());
	snprintf(uri, sizeof(uri), "file:%s", path);
	run->out->to_file = true;
	if (source_migrate(run, uri) == 0) {
		if (stat(path, &st) == 0)
			run->out->file_bytes = (uint64_t)st.st_size;
		drop_cache(path);
		if (file_restore(run, uri) == 0)
			verify(run);
		if (run->out->verified) {
			drop_cache(path);
			lazy_file_restore(run, uri);
		}
	}
	unlink(path);
}

void bench_run(const struct bench_config *cfg, const char *plugin, struct bench_result *out)
{
	struct run run = {
	        .cfg = cfg,
	        .plugin = plugin,
	        .out = out,
	        .memfd = -1,
	        .src_memfd = -1,
	        .pipe_fd = -1,
	        .child = -1,
	        .workload_lock = PTHREAD_MUTEX_INITIALIZER,
	};
	uint16_t port = 0;
	bool source_ok = false;

	memset(out, 0, sizeof(*out));
	/* Handed-over RAM replaces the destination's: nothing is faulted in. */
	out->prefaulted = cfg->prefault && !(cfg->local && !cfg->local_anonymous);
	run.deadline_ns = guest_now_ns() + cfg->timeout_ns;
	if (cfg->target_dir) {
		if (prepare(&run) == 0)
			file_run(&run);
		release(&run);
		out->ok = out->verified && (!out->lazy_ran || out->lazy_verified) &&
		          out->error[0] == '\0';
		return;
	}
	if (prepare(&run) == 0 && spawn(&run) == 0) {
		char uri[PATH_MAX];
		if (wait_listening(&run, &port) == 0) {
			if (cfg->local)
				local_uri(getpid(), uri, sizeof(uri));
			else
				snprintf(uri, sizeof(uri), "127.0.0.1:%u", (unsigned)port);
			source_ok = source_migrate(&run, uri) == 0;
		}
		collect_child(&run, source_ok);
		if (source_ok && run.have_report && run.report.rc == 0)
			verify(&run);
	}
	release(&run);
	out->ok = out->verified && out->error[0] == '\0';
}

void bench_result_clear(struct bench_result *result)
{
	free(result->stats_json);
	result->stats_json = NULL;
	free(result->passes);
	result->passes = NULL;
	result->npasses = 0;
	free(result->qemu);
	result->qemu = NULL;
}
