/* Attack tests: a writer outside the session against a real destination.
 *
 * A destination (an lmt session in a child process, with auth-key-file and
 * pin-all, so that all its guest RAM is registered at setup) waits after
 * setup while the source holds back. A separate program that holds nothing
 * the control connection carried then attacks its data path:
 *
 * - ofi over tcp;ofi_rxm: ofi_attacker finds the destination's listening
 *   ports as a port scan would (here: the child's listening sockets, the
 *   control port left out) and tries fi_write with keys 0 to 1000, each at
 *   one of the offsets 0, 64 and 4096, against each;
 *   and, flooding both sides' data ports with messages lmt never asks for
 *   and with connections it never finishes, may not grow the destination's
 *   or the source's memory beyond a bound (docs/security.md);
 * - ucx over tcp: ucx_attacker connects to the destination's UCP worker (its
 *   address from the destination's debug log, which carries no token) and
 *   sends write messages with guessed region ids and tokens, goodbyes, and
 *   puts at the guest RAM's very address.
 *
 * The destination's guest RAM lives in a shared mapping made before the
 * fork, so this process sees it: it must be byte for byte as it was after
 * the attack, and the migration must then complete bit for bit. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <lmt/lmt.h>

#include "guest.h"

#define RAM_BYTES (32ull << 20)
#define SECOND 1000000000ull

static char key_path[64];
static char log_path[64];

/* ---- Helpers ------------------------------------------------------------- */

static const char *env_or(const char *name, const char *fallback)
{
	const char *v = getenv(name);
	return v && *v ? v : fallback;
}

static lmt_session *session(enum lmt_role role, struct guest_ram *ram, const char *plugin,
                            const char *opts)
{
	struct lmt_error err = {0};
	lmt_session *s = NULL;
	if (lmt_session_new(&s, role, plugin, opts, &err))
		fail_msg("session over %s with '%s': %s", plugin, opts, err.message);
	for (uint32_t i = 0; i < ram->nblocks; i++)
		assert_int_equal(lmt_session_add_block(s, ram->blocks[i].name, ram->blocks[i].host,
		                                       ram->blocks[i].length, GUEST_PAGE_SIZE),
		                 0);
	return s;
}

/* The destination child's log, line by line, to a file the test reads. */
static void log_to_file(void *opaque, enum lmt_log_level level, const char *msg)
{
	FILE *f = opaque;
	(void)level;
	fprintf(f, "%s\n", msg);
	fflush(f);
}

struct destination {
	pid_t pid;
	uint16_t port;
	struct guest_ram ram; /* shared with the child */
	uint8_t *before;      /* what it held before the attack */
};

static void destination_child(struct destination *d, const char *plugin, const char *opts,
                              int out)
{
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	FILE *log = fopen(log_path, "w");
	if (!log)
		_exit(2);
	lmt_set_log_handler(log_to_file, log);
	lmt_set_log_level(LMT_LOG_DEBUG);
	lmt_session *s = session(LMT_ROLE_DESTINATION, &d->ram, plugin, opts);
	uint16_t port = 0;
	if (lmt_load_listen(s, "127.0.0.1:0", &port) != 0 ||
	    write(out, &port, sizeof(port)) != sizeof(port))
		_exit(2);
	int rc = lmt_load_run(s);
	if (rc)
		fprintf(log, "load failed: %s\n", lmt_session_error(s)->message);
	lmt_session_free(s);
	fclose(log);
	_exit(rc == 0 ? 0 : 1);
}

static void destination_start(struct destination *d, const char *plugin, const char *opts)
{
	uint8_t *base = mmap(NULL, RAM_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
	                     -1, 0);
	assert_true(base != MAP_FAILED);
	/* Zero, as fresh guest RAM is: the source sends no zero pages. */
	guest_ram_layout(&d->ram, base, RAM_BYTES);
	d->before = malloc(RAM_BYTES);
	assert_non_null(d->before);
	memcpy(d->before, base, RAM_BYTES);
	int fds[2];
	assert_int_equal(pipe(fds), 0);
	d->pid = fork();
	assert_true(d->pid >= 0);
	if (d->pid == 0) {
		close(fds[0]);
		destination_child(d, plugin, opts, fds[1]);
	}
	close(fds[1]);
	assert_int_equal(read(fds[0], &d->port, sizeof(d->port)), sizeof(d->port));
	close(fds[0]);
}

static int destination_wait(struct destination *d)
{
	int status = 0;
	assert_int_equal(waitpid(d->pid, &status, 0), d->pid);
	munmap(d->ram.base, RAM_BYTES);
	free(d->before);
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* The destination's log so far, as one string (malloc'ed). */
static char *read_log(void)
{
	FILE *f = fopen(log_path, "r");
	assert_non_null(f);
	char *text = NULL;
	size_t size = 0;
	FILE *m = open_memstream(&text, &size);
	char buf[4096];
	size_t n;
	while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
		fwrite(buf, 1, n, m);
	fclose(f);
	fclose(m);
	return text;
}

/* Run a program, its standard output into `out` (at most size - 1 bytes),
 * killed after `timeout_ns`. Its exit status, or 128 + signal. */
static int run(char *const argv[], char *out, size_t size, uint64_t timeout_ns)
{
	int fds[2];
	assert_int_equal(pipe(fds), 0);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		dup2(fds[1], 1);
		close(fds[0]);
		close(fds[1]);
		execv(argv[0], argv);
		_exit(127);
	}
	close(fds[1]);
	size_t used = 0;
	uint64_t deadline = guest_now_ns() + timeout_ns;
	for (;;) {
		ssize_t n = read(fds[0], out + used, size - 1 - used);
		if (n > 0) {
			used += (size_t)n;
			if (used < size - 1)
				continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		break;
	}
	out[used] = 0;
	close(fds[0]);
	int status = 0;
	while (waitpid(pid, &status, WNOHANG) == 0) {
		if (guest_now_ns() > deadline) {
			kill(pid, SIGKILL);
			waitpid(pid, &status, 0);
			break;
		}
		struct timespec ts = {0, 10000000};
		nanosleep(&ts, NULL);
	}
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* The TCP ports a process listens on (IPv4 and IPv6), as a scan of the host
 * would find them: its sockets' inodes matched against /proc/net/tcp*. */
static int listening_ports(pid_t pid, uint16_t *ports, int max)
{
	char path[64];
	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	unsigned long inodes[256];
	int ninodes = 0;
	DIR *dir = opendir(path);
	assert_non_null(dir);
	struct dirent *e;
	while ((e = readdir(dir)) && ninodes < 256) {
		char link[600], target[64];
		snprintf(link, sizeof(link), "%s/%s", path, e->d_name);
		ssize_t n = readlink(link, target, sizeof(target) - 1);
		if (n <= 0)
			continue;
		target[n] = 0;
		unsigned long inode;
		if (sscanf(target, "socket:[%lu]", &inode) == 1)
			inodes[ninodes++] = inode;
	}
	closedir(dir);
	int found = 0;
	const char *tables[] = {"/proc/net/tcp", "/proc/net/tcp6"};
	for (int t = 0; t < 2; t++) {
		FILE *f = fopen(tables[t], "r");
		if (!f)
			continue;
		char line[512];
		while (fgets(line, sizeof(line), f)) {
			char local[128];
			unsigned state;
			unsigned long inode;
			if (sscanf(line, " %*d: %127s %*s %x %*s %*s %*s %*s %*s %lu", local, &state,
			           &inode) != 3 ||
			    state != 0x0a) /* TCP_LISTEN */
				continue;
			for (int i = 0; i < ninodes; i++) {
				const char *colon = strrchr(local, ':');
				if (inodes[i] == inode && colon && found < max)
					ports[found++] = (uint16_t)strtoul(colon + 1, NULL, 16);
			}
		}
		fclose(f);
	}
	return found;
}

/* The source's guest: random pages, with dirty bitmaps. */
static void ram_fill_private(struct guest_ram *ram)
{
	uint8_t *base = mmap(NULL, RAM_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
	                     -1, 0);
	assert_true(base != MAP_FAILED);
	guest_ram_layout(ram, base, RAM_BYTES);
	guest_ram_fill(ram, 0.1, 42);
	assert_int_equal(guest_ram_alloc_dirty(ram), 0);
}

static void ram_free_private(struct guest_ram *ram)
{
	guest_ram_free_dirty(ram);
	munmap(ram->base, RAM_BYTES);
}

/* Source: set up (the destination then holds all its RAM registered and
 * waits), and hand the session back. */
static lmt_session *source_setup(struct guest_ram *src, const char *plugin, const char *opts,
                                 uint16_t port)
{
	ram_fill_private(src);
	lmt_session *s = session(LMT_ROLE_SOURCE, src, plugin, opts);
	assert_int_equal(lmt_session_set_dirty_sync(s, guest_dirty_sync, src), 0);
	char uri[64];
	snprintf(uri, sizeof(uri), "127.0.0.1:%u", port);
	if (lmt_save_setup(s, uri))
		fail_msg("setup: %s", lmt_session_error(s)->message);
	return s;
}

static void source_finish(lmt_session *s)
{
	struct lmt_iterate_result it = {0};
	int rc = 0;
	while (rc == 0 && !it.ready)
		rc = lmt_save_iterate(s, &it);
	if (rc == 0)
		rc = lmt_save_complete(s, NULL, 0);
	if (rc)
		fail_msg("migration after the attack: %s", lmt_session_error(s)->message);
	lmt_session_free(s);
}

/* After the attack: not one byte of the destination's guest RAM changed. */
static void assert_untouched(const struct destination *d)
{
	/* Anything in flight lands meanwhile. */
	struct timespec ts = {0, 200000000};
	nanosleep(&ts, NULL);
	const uint8_t *now = d->ram.base;
	for (size_t i = 0; i < RAM_BYTES; i++)
		if (now[i] != d->before[i])
			fail_msg("the attack changed the destination's guest RAM at byte %zu "
			         "(0x%02x, was 0x%02x)",
			         i, now[i], d->before[i]);
}

/* The migration completed and the destination holds the source's RAM. */
static void assert_migrated(struct destination *d, struct guest_ram *src, lmt_session *s)
{
	source_finish(s);
	/* Compared before the child's exit unmaps nothing of ours. */
	int differ = memcmp(d->ram.base, src->base, RAM_BYTES);
	char *log = read_log();
	int status = destination_wait(d);
	if (status != 0 || differ)
		fail_msg("destination exit %d, RAM %s; its log:\n%s", status,
		         differ ? "differs from the source's" : "bit for bit", log);
	free(log);
	ram_free_private(src);
}

static char *options(const char *base)
{
	static char opts[512];
	/* The source says nothing but keep-alives while the attack runs, and
	 * a destination gives up on such a source after idle-timeout. */
	snprintf(opts, sizeof(opts),
	         "%s,auth-key-file=%s,pin-all=on,channels=2,chunk-size=1M,idle-timeout=10m", base,
	         key_path);
	return opts;
}

/* ---- ofi ------------------------------------------------------------------ */

/* The attacker itself: against a target of its own that registers under
 * key 3, as lmt once did, the same guesses land. */
static void test_ofi_attacker_lands_on_a_guessable_key(void **state)
{
	(void)state;
	char out[4096];
	char *argv[] = {(char *)env_or("LMT_TEST_OFI_ATTACKER", "ofi_attacker"), "--self-test",
	                "8", NULL};
	int rc = run(argv, out, sizeof(out), 120 * SECOND);
	print_message("%s", out);
	assert_int_equal(rc, 0);
	assert_non_null(strstr(out, "self-test: "));
}

static void test_ofi_outsider_cannot_write_guest_ram(void **state)
{
	(void)state;
	const char *plugin = "ofi";
	const char *opts = options("ofi.provider=tcp");
	struct destination d;
	destination_start(&d, plugin, opts);
	struct guest_ram src;
	lmt_session *s = source_setup(&src, plugin, opts, d.port);

	uint16_t ports[32];
	int n = listening_ports(d.pid, ports, 32);
	int attacked = 0;
	for (int i = 0; i < n; i++) {
		if (ports[i] == d.port)
			continue; /* the control connection's listener */
		char port[16], out[8192];
		snprintf(port, sizeof(port), "%u", ports[i]);
		char *argv[] = {(char *)env_or("LMT_TEST_OFI_ATTACKER", "ofi_attacker"),
		                "127.0.0.1", port, "1000", NULL};
		int rc = run(argv, out, sizeof(out), 300 * SECOND);
		print_message("port %s: %s", port, out);
		assert_int_equal(rc, 0);
		unsigned writes = 1, completed = 0, refused = 0, unanswered = 1;
		assert_int_equal(sscanf(out, "attack: %u writes, %u completed, %u refused by the target, "
		                             "%u unanswered",
		                        &writes, &completed, &refused, &unanswered),
		                 4);
		/* Set up, with its guest RAM registered, the destination's
		 * endpoints take no connection: not one guess reaches them. */
		assert_non_null(strstr(out, "then the target took no connection"));
		assert_true(writes == 0);
		attacked++;
	}
	assert_true(attacked >= 2); /* one data endpoint per channel */
	assert_untouched(&d);
	assert_migrated(&d, &src, s);
}

/* ---- ofi: what a stranger can make either side hold ------------------------- */

#define FLOOD_SECONDS "4"
#define FLOOD_STALL "15s" /* longer than the floods of both sides */
/* Resident memory either side may gain from a flood, during it and after
 * (docs/security.md): a fixed part (connections held, receive buffers) and,
 * for each connection the strangers made, what libfabric's net keeps of it
 * (about 1 KiB measured; 2 allowed, for the allocator's and ASan's own). */
#define FLOOD_FIXED_KIB (16l * 1024)
#define FLOOD_PER_CONNECTION_KIB 2l

static long rss_kib(pid_t pid)
{
	char path[64], line[256];
	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	FILE *f = fopen(path, "r");
	long kib = -1;
	while (f && fgets(line, sizeof(line), f))
		if (strncmp(line, "VmRSS:", 6) == 0)
			kib = atol(line + 6);
	if (f)
		fclose(f);
	return kib;
}

/* The resident memory of the destination and the source (this process),
 * sampled every 20 ms while a flood runs. */
struct rss_watch {
	pid_t pid[2];
	long base[2], peak[2];
	atomic_bool stop;
	pthread_t thread;
};

static void *rss_sample(void *arg)
{
	struct rss_watch *w = arg;
	while (!atomic_load(&w->stop)) {
		for (int i = 0; i < 2; i++) {
			long kib = rss_kib(w->pid[i]);
			if (kib > w->peak[i])
				w->peak[i] = kib;
		}
		struct timespec ts = {0, 20000000};
		nanosleep(&ts, NULL);
	}
	return NULL;
}

/* The source, set up on a thread of its own: over the chaos decorator, it
 * stalls after connecting its first channel, so that the destination's
 * second endpoint takes connections (from strangers too) meanwhile. */
struct stalled_source {
	struct guest_ram ram;
	const char *opts;
	uint16_t port;
	lmt_session *session;
	pthread_t thread;
};

static void *stalled_source_setup(void *arg)
{
	struct stalled_source *ss = arg;
	char opts[600];
	snprintf(opts, sizeof(opts), "%s,chaos.fault=stall,chaos.at=connect,chaos.stall=%s",
	         ss->opts, FLOOD_STALL);
	ss->session = source_setup(&ss->ram, "chaos:ofi", opts, ss->port);
	return NULL;
}

/* How many connections the attacker made, or tried to. */
static unsigned long flood_port(uint16_t port, const char *seconds, const char *side)
{
	char text[16], out[4096];
	snprintf(text, sizeof(text), "%u", port);
	char *argv[] = {(char *)env_or("LMT_TEST_OFI_ATTACKER", "ofi_attacker"),
	                "--flood",
	                "127.0.0.1",
	                text,
	                (char *)seconds,
	                NULL};
	int rc = run(argv, out, sizeof(out), 120 * SECOND);
	print_message("port %s (%s): %s", text, side, out);
	assert_int_equal(rc, 0);
	unsigned long posted = 0, mib = 0, connections = 0;
	unsigned unfinished = 0;
	assert_int_equal(sscanf(out,
	                        "flood: %lu messages posted (%lu MiB), %lu connections, %u left "
	                        "unfinished",
	                        &posted, &mib, &connections, &unfinished),
	                 4);
	return connections + unfinished;
}

static void test_ofi_strangers_flooding_both_sides_stay_within_the_bound(void **state)
{
	(void)state;
	const char *plugin = "ofi";
	const char *opts = options("ofi.provider=tcp,connect-timeout=60s");
	struct destination d;
	destination_start(&d, plugin, opts);
	struct stalled_source ss = {.opts = opts, .port = d.port};
	assert_int_equal(pthread_create(&ss.thread, NULL, stalled_source_setup, &ss), 0);

	/* Both sides' data endpoints, as a scan of the host finds them
	 * (the destination's control port no longer listens once the source
	 * is in): two a side. */
	uint16_t dst_ports[32], src_ports[32];
	int nd = 0, ns = 0;
	for (uint64_t until = guest_now_ns() + 20 * SECOND;
	     (nd < 2 || ns < 2) && guest_now_ns() < until;) {
		uint16_t found[32];
		int n = listening_ports(d.pid, found, 32);
		nd = 0;
		for (int i = 0; i < n; i++)
			if (found[i] != d.port)
				dst_ports[nd++] = found[i];
		ns = listening_ports(getpid(), src_ports, 32);
		struct timespec ts = {0, 10000000};
		nanosleep(&ts, NULL);
	}
	assert_true(nd == 2 && ns == 2);

	struct rss_watch w = {.pid = {d.pid, getpid()}};
	for (int i = 0; i < 2; i++)
		w.base[i] = w.peak[i] = rss_kib(w.pid[i]);
	assert_int_equal(pthread_create(&w.thread, NULL, rss_sample, &w), 0);
	/* While the source stalls: the destination's endpoint still waiting
	 * for it takes connections; the source's take none. */
	unsigned long made[2] = {0, 0};
	for (int i = 0; i < nd; i++)
		made[0] += flood_port(dst_ports[i], FLOOD_SECONDS, "destination");
	for (int i = 0; i < ns; i++)
		made[1] += flood_port(src_ports[i], "1", "source");
	pthread_join(ss.thread, NULL);
	atomic_store(&w.stop, true);
	pthread_join(w.thread, NULL);
	/* After: what the strangers left behind them. */
	struct timespec ts = {1, 0};
	nanosleep(&ts, NULL);
	static const char *const side[] = {"destination", "source"};
	for (int i = 0; i < 2; i++) {
		long after = rss_kib(w.pid[i]);
		long bound = FLOOD_FIXED_KIB + FLOOD_PER_CONNECTION_KIB * (long)made[i];
		print_message("%s: %ld KiB resident before, %ld at most during the flood, %ld after "
		              "(%lu connections tried; bound %ld KiB more)\n",
		              side[i], w.base[i], w.peak[i], after, made[i], bound);
		if (w.peak[i] - w.base[i] > bound || after - w.base[i] > bound)
			fail_msg("the %s grew by %ld KiB during the flood and %ld after (bound %ld)",
			         side[i], w.peak[i] - w.base[i], after - w.base[i], bound);
	}
	assert_untouched(&d);
	assert_migrated(&d, &ss.ram, ss.session);
}

/* ---- ucx ------------------------------------------------------------------ */

static void test_ucx_outsider_cannot_write_guest_ram(void **state)
{
	(void)state;
	const char *plugin = "ucx";
	const char *opts = options("ucx.tls=tcp");
	struct destination d;
	destination_start(&d, plugin, opts);
	struct guest_ram src;
	lmt_session *s = source_setup(&src, plugin, opts, d.port);

	char *log = read_log();
	int attacked = 0;
	for (const char *at = log; (at = strstr(at, "worker address ")) != NULL;) {
		at += strlen("worker address ");
		char hex[1024];
		size_t len = strspn(at, "0123456789abcdef");
		assert_true(len > 0 && len < sizeof(hex));
		memcpy(hex, at, len);
		hex[len] = 0;
		char ram[32], out[4096];
		snprintf(ram, sizeof(ram), "0x%llx", (unsigned long long)(uintptr_t)d.ram.base);
		char *argv[] = {(char *)env_or("LMT_TEST_UCX_ATTACKER", "ucx_attacker"),
		                "tcp",
		                hex,
		                "1000",
		                "--ram",
		                ram,
		                NULL};
		int rc = run(argv, out, sizeof(out), 300 * SECOND);
		print_message("%s", out);
		assert_int_equal(rc, 0);
		/* The rendezvous writes reached the handler, which turned them
		 * down itself. */
		assert_non_null(strstr(out, "3 rendezvous: 3 refused"));
		attacked++;
	}
	free(log);
	assert_int_equal(attacked, 2);
	log = read_log();
	assert_non_null(strstr(log, "without this session's token"));
	free(log);
	assert_untouched(&d);
	assert_migrated(&d, &src, s);
}

/* ---- ucx: a flood ----------------------------------------------------------- */

/* What a stranger's flood may make a ucx process hold at its peak, over
 * what it held before (docs/security.md): the largest eager message UCX
 * assembles for it (64 MiB here), and 16 MiB for UCX's receive buffers
 * and the allocator's own growth. */
#define FLOOD_BOUND ((64ull + 16) << 20)

/* A process's VmRSS or VmHWM, in bytes. */
static uint64_t proc_memory(pid_t pid, const char *field)
{
	char path[64], line[256];
	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	FILE *f = fopen(path, "r");
	assert_non_null(f);
	uint64_t kib = 0;
	size_t n = strlen(field);
	while (fgets(line, sizeof(line), f))
		if (strncmp(line, field, n) == 0 && line[n] == ':')
			kib = strtoull(line + n + 1, NULL, 10);
	fclose(f);
	return kib << 10;
}

/* Start counting a process's peak RSS (VmHWM) from now. */
static void reset_peak(pid_t pid)
{
	char path[64];
	snprintf(path, sizeof(path), "/proc/%d/clear_refs", (int)pid);
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	fputs("5", f);
	fclose(f);
}

static char source_log[1 << 16];
static size_t source_log_used;

static void log_to_buffer(void *opaque, enum lmt_log_level level, const char *msg)
{
	(void)opaque;
	(void)level;
	int n = snprintf(source_log + source_log_used, sizeof(source_log) - source_log_used, "%s\n",
	                 msg);
	if (n > 0 && source_log_used + (size_t)n < sizeof(source_log))
		source_log_used += (size_t)n;
}

/* Flood every worker whose address `log` gives, `die` on the last one
 * (its connection then breaks without a goodbye); the number flooded. */
static int flood_workers(const char *log, bool die)
{
	int flooded = 0;
	for (const char *at = log; (at = strstr(at, "worker address ")) != NULL;) {
		at += strlen("worker address ");
		char hex[1024];
		size_t len = strspn(at, "0123456789abcdef");
		assert_true(len > 0 && len < sizeof(hex));
		memcpy(hex, at, len);
		hex[len] = 0;
		bool last = !strstr(at, "worker address ");
		char out[4096];
		char *argv[] = {(char *)env_or("LMT_TEST_UCX_ATTACKER", "ucx_attacker"),
		                "tcp",
		                hex,
		                "--flood",
		                die && last ? "--die" : NULL,
		                NULL};
		int rc = run(argv, out, sizeof(out), 300 * SECOND);
		print_message("    %s", out);
		assert_int_equal(rc, die && last ? 128 + SIGKILL : 0);
		assert_non_null(strstr(
		        out,
		        "flood: 20000 eager, 256 eager of 1048576, 1 of 67108864, 256 rendezvous"));
		flooded++;
	}
	return flooded;
}

/* A stranger floods the destination's and the source's workers with
 * messages without the token, eager and by rendezvous, and the last one
 * dies mid-burst: neither process grows by more than FLOOD_BOUND at its
 * peak, the guest RAM is untouched and the migration completes bit for
 * bit. */
static void test_ucx_flood_by_a_stranger_holds_bounded_memory(void **state)
{
	(void)state;
	const char *opts = options("ucx.tls=tcp");
	struct destination d;
	destination_start(&d, "ucx", opts);
	struct guest_ram src;
	lmt_set_log_handler(log_to_buffer, NULL);
	lmt_set_log_level(LMT_LOG_DEBUG);
	lmt_session *s = source_setup(&src, "ucx", opts, d.port);
	lmt_set_log_level(LMT_LOG_ERROR);

	pid_t self = getpid();
	uint64_t dst_before = proc_memory(d.pid, "VmRSS"), src_before = proc_memory(self, "VmRSS");
	reset_peak(d.pid);
	reset_peak(self);
	char *log = read_log();
	assert_int_equal(flood_workers(log, true), 2);
	free(log);
	assert_int_equal(flood_workers(source_log, false), 2);
	uint64_t dst_peak = proc_memory(d.pid, "VmHWM"), src_peak = proc_memory(self, "VmHWM");
	print_message("    destination: %llu KiB before, peak %llu KiB (+%llu KiB); source: %llu "
	              "KiB before, peak %llu KiB (+%llu KiB); bound +%llu KiB\n",
	              (unsigned long long)(dst_before >> 10), (unsigned long long)(dst_peak >> 10),
	              (unsigned long long)((dst_peak - dst_before) >> 10),
	              (unsigned long long)(src_before >> 10), (unsigned long long)(src_peak >> 10),
	              (unsigned long long)((src_peak - src_before) >> 10),
	              (unsigned long long)(FLOOD_BOUND >> 10));
	assert_true(dst_peak - dst_before <= FLOOD_BOUND);
	assert_true(src_peak - src_before <= FLOOD_BOUND);
	log = read_log();
	assert_non_null(strstr(log, "without this session's token"));
	free(log);
	assert_untouched(&d);
	assert_migrated(&d, &src, s);
	lmt_set_log_handler(NULL, NULL);
}

/* ---- Main ----------------------------------------------------------------- */

int main(void)
{
	snprintf(key_path, sizeof(key_path), "/tmp/lmt-security-key.XXXXXX");
	int fd = mkstemp(key_path);
	if (fd < 0 || write(fd, "a key for the security tests\n", 29) != 29)
		return 1;
	close(fd);
	snprintf(log_path, sizeof(log_path), "/tmp/lmt-security-log.XXXXXX");
	fd = mkstemp(log_path);
	if (fd < 0)
		return 1;
	close(fd);
	const struct CMUnitTest ofi[] = {
	        cmocka_unit_test(test_ofi_attacker_lands_on_a_guessable_key),
	        cmocka_unit_test(test_ofi_outsider_cannot_write_guest_ram),
	        cmocka_unit_test(test_ofi_strangers_flooding_both_sides_stay_within_the_bound),
	};
	const struct CMUnitTest ucx[] = {
	        cmocka_unit_test(test_ucx_outsider_cannot_write_guest_ram),
	        cmocka_unit_test(test_ucx_flood_by_a_stranger_holds_bounded_memory),
	};
	const char *which = env_or("LMT_TEST_SECURITY", "ofi");
	int rc = strcmp(which, "ucx") == 0 ? cmocka_run_group_tests(ucx, NULL, NULL)
	                                   : cmocka_run_group_tests(ofi, NULL, NULL);
	unlink(key_path);
	unlink(log_path);
	return rc;
}
