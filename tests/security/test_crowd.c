/* A crowd of strangers on a destination's ports (docs/security.md,
 * "Strangers on the network"). While threads of this process open 10 000
 * connections a second or more to the control port, on loopback, that say
 * nothing, dribble the first bytes of a HELLO or a ClientHello, or close at
 * once, a real source migrates to the destination (a child process): it
 * must complete bit for bit every time, with tls=off and tls=on (a
 * pre-shared key, certificates), with and without auth-key, and the rate
 * the port really took is checked and printed. Then the destination's
 * memory: its RSS must grow by less than the bound docs/security.md gives
 * while it is flooded, on the control port and on the tcp plugin's data
 * port, and come back down afterwards. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <openssl/bio.h>
#include <openssl/ssl.h>

#include "certs.h"
#include "flood.h"
#include "harness.h"
#include "hostile.h"
#include "net.h"

#define RAM_BYTES (8ull << 20)
#define KEY "crowd-shared-secret"
#define MS 1000000ull
#define FLOOD_RATE 12500u  /* connections a second asked of the crowd */
#define FLOOD_FLOOR 10000u /* and what must really be made to the port */
/* Connections the destination may hold unclosed: its table (256) and its
 * accept queue (512). */
#define HELD_MAX (256u + 512u)
#define WARM_MS 300    /* the crowd runs at least this long before the source starts */
#define QUALIFY_MS 150 /* ... the last of it at FLOOD_FLOOR at least */
#define WAVE_MS 600    /* each kind of crowd in the memory tests, at full strength */
#define WARM_RATE 50u  /* connections a second of the warm-up before it */

/* What the destination may hold for strangers (docs/security.md): nothing
 * that grows with them but their OpenSSL connections, at most 17 at once
 * (16 handshakes under way and a newcomer) of at most 320 KiB each; 1 MiB
 * where none gets one. KiB. */
/* Under AddressSanitizer the RSS also holds what the sanitizer keeps for
 * itself: its quarantine of freed blocks (1 MiB, set in meson.build), the
 * shadow of that (1/8) and of the allocator's own chunks; that is added to
 * each bound, not lmt's. The heap check (LeakSanitizer at exit) stays. */
#if defined(__SANITIZE_ADDRESS__)
#define SANITIZER_KIB (1024 + 1024 / 8 + 512)
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SANITIZER_KIB (1024 + 1024 / 8 + 512)
#endif
#endif
#ifndef SANITIZER_KIB
#define SANITIZER_KIB 0
#endif
#define BOUND_PLAIN_KIB (1024 + SANITIZER_KIB)
#define BOUND_TLS_KIB (17 * 320 + SANITIZER_KIB)
/* Afterwards: back to within this of where it started. KiB. */
#define AFTER_SLACK_KIB (1024 + SANITIZER_KIB)

static struct cert_set certs;
static char key_file[64];
static char src_cert[512], dst_cert[512];
static uint8_t hello_bytes[2048], client_hello[2048];
static size_t hello_len, client_hello_len;

/* A ClientHello as OpenSSL's client sends it for TLS 1.3. */
static size_t make_client_hello(uint8_t *out, size_t cap)
{
	SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
	assert_non_null(ctx);
	SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
	SSL *ssl = SSL_new(ctx);
	BIO *rb = BIO_new(BIO_s_mem()), *wb = BIO_new(BIO_s_mem());
	SSL_set_bio(ssl, rb, wb);
	SSL_set_connect_state(ssl);
	assert_int_equal(SSL_do_handshake(ssl), -1); /* it waits for the server */
	char *data = NULL;
	long n = BIO_get_mem_data(wb, &data);
	assert_true(n > 0 && (size_t)n <= cap);
	memcpy(out, data, (size_t)n);
	SSL_free(ssl);
	SSL_CTX_free(ctx);
	return (size_t)n;
}

static int setup(void **state)
{
	if (certs_make(&certs))
		return -1;
	snprintf(key_file, sizeof(key_file), "%s", guard_key_file(KEY));
	certs_options(src_cert, sizeof(src_cert), &certs, &certs.source);
	certs_options(dst_cert, sizeof(dst_cert), &certs, &certs.destination);
	struct lmt_msg_hello *m = hostile_hello(true);
	struct lmt_buf b = {0};
	assert_int_equal(lmt__enc_hello(&b, m), 0);
	assert_true(b.len <= sizeof(hello_bytes));
	memcpy(hello_bytes, b.data, b.len);
	hello_len = b.len;
	lmt__buf_free(&b);
	free(m);
	client_hello_len = make_client_hello(client_hello, sizeof(client_hello));
	return 0;
}

static int teardown(void **state)
{
	certs_remove(&certs);
	unlink(key_file);
	return 0;
}

/* ---- the destination, a child process ---- */

struct child {
	pid_t pid;
	uint16_t port;
	int result_fd;
};

struct child_result {
	int rc;
	uint64_t sum; /* of its guest RAM after the load */
	unsigned logged;
	char error[512];
};

/* What the destination child's allocator holds (mallinfo2: bytes in use),
 * sampled by a thread of the child, and when its lobby accepted the source
 * (its log says so), in memory both processes share. */
struct child_watch {
	_Atomic uint64_t in_use;
	_Atomic uint64_t accepted_ns; /* CLOCK_MONOTONIC, 0 until then */
	atomic_bool stop;
};
static struct child_watch *watch;

/* The first two lines a session logs (and every retry of the source's) go
 * to stderr; the rest are counted. */
struct quiet_log {
	const char *who;
	unsigned lines, shown, retries;
};

static void quiet_log(void *opaque, enum lmt_log_level level, const char *msg)
{
	struct quiet_log *q = opaque;
	if (watch && strstr(msg, "another source was accepted"))
		atomic_store(&watch->accepted_ns, lmt__now_ns());
	if (level > LMT_LOG_WARN)
		return;
	q->lines++;
	if (strstr(msg, "connecting again"))
		q->retries++;
	if (q->shown < 2 || strstr(msg, "connecting again")) {
		q->shown++;
		fprintf(stderr, "    %s: %s\n", q->who, msg);
	}
}

static pid_t running_child; /* killed by the teardown of a test that failed */

/* LeakSanitizer's, when the test is built with it. */
int __lsan_do_recoverable_leak_check(void) __attribute__((weak));

static void *watch_heap(void *arg)
{
	while (!atomic_load(&watch->stop)) {
		struct mallinfo2 mi = mallinfo2();
		atomic_store(&watch->in_use, mi.uordblks + mi.hblkhd);
		usleep(20000);
	}
	return NULL;
}

static struct flood *running_flood;       /* stopped by the same teardown */
static struct hostile_source data_source; /* the data port test's, closed by it */
static bool data_source_open;
static struct guest_ram test_ram; /* the source's guest, released by it */
static bool ram_held;

static struct guest_ram *source_ram(uint64_t seed)
{
	ram_fill(&test_ram, RAM_BYTES, seed);
	ram_held = true;
	return &test_ram;
}

static void release_ram(void)
{
	if (ram_held)
		ram_release(&test_ram);
	ram_held = false;
}

static struct flood *crowd_start(const struct flood_spec *spec)
{
	running_flood = flood_start(spec);
	assert_non_null(running_flood);
	return running_flood;
}

static struct flood_count crowd_stop(struct flood *f)
{
	running_flood = NULL;
	return flood_stop(f);
}

/* After each test, and what a failed one left. */
static long sample_stop(void);

static int clean_up(void **state)
{
	if (running_flood)
		flood_stop(running_flood);
	running_flood = NULL;
	sample_stop();
	if (data_source_open)
		hostile_source_close(&data_source);
	data_source_open = false;
	release_ram();
	if (running_child > 0) {
		kill(running_child, SIGKILL);
		waitpid(running_child, NULL, 0);
	}
	running_child = 0;
	return 0;
}

static struct child child_start(const char *opts)
{
	int port_pipe[2], result_pipe[2];
	assert_int_equal(pipe(port_pipe), 0);
	assert_int_equal(pipe(result_pipe), 0);
	if (!watch) {
		watch = mmap(NULL, sizeof(*watch), PROT_READ | PROT_WRITE,
		             MAP_SHARED | MAP_ANONYMOUS, -1, 0);
		assert_true(watch != MAP_FAILED);
	}
	atomic_store(&watch->in_use, 0);
	atomic_store(&watch->accepted_ns, 0);
	atomic_store(&watch->stop, false);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		close(port_pipe[0]);
		close(result_pipe[0]);
		pthread_t watcher;
		if (pthread_create(&watcher, NULL, watch_heap, NULL) != 0)
			_exit(4);
		struct guest_ram ram;
		guest_ram_layout(&ram, ram_map(RAM_BYTES), RAM_BYTES);
		lmt_session *s = session_on(LMT_ROLE_DESTINATION, &ram, "tcp", opts);
		struct quiet_log q = {.who = "destination"};
		lmt_session_set_log_handler(s, quiet_log, &q);
		uint16_t port = 0;
		if (lmt_load_listen(s, "127.0.0.1:0", &port) != 0 ||
		    write(port_pipe[1], &port, sizeof(port)) != sizeof(port))
			_exit(2);
		struct child_result r = {.rc = lmt_load_run(s)};
		snprintf(r.error, sizeof(r.error), "%s", lmt_session_error(s)->message);
		r.sum = guest_checksum(ram.base, RAM_BYTES);
		r.logged = q.lines;
		lmt_session_free(s);
		atomic_store(&watch->stop, true);
		pthread_join(watcher, NULL);
		/* Under LeakSanitizer (which _exit skips), what the crowd left. */
		if (__lsan_do_recoverable_leak_check && __lsan_do_recoverable_leak_check()) {
			r.rc = r.rc ? r.rc : -LMT_ENOMEM;
			snprintf(r.error, sizeof(r.error), "LeakSanitizer found leaks (above)");
		}
		_exit(write(result_pipe[1], &r, sizeof(r)) == sizeof(r) ? 0 : 3);
	}
	close(port_pipe[1]);
	close(result_pipe[1]);
	running_child = pid;
	struct child c = {.pid = pid, .result_fd = result_pipe[0]};
	assert_int_equal(read(port_pipe[0], &c.port, sizeof(c.port)), sizeof(c.port));
	close(port_pipe[0]);
	return c;
}

static struct child_result child_wait(struct child *c)
{
	struct child_result r = {.rc = 1};
	if (read(c->result_fd, &r, sizeof(r)) != sizeof(r))
		snprintf(r.error, sizeof(r.error), "the destination child said nothing");
	close(c->result_fd);
	int status = 0;
	assert_int_equal(waitpid(c->pid, &status, 0), c->pid);
	running_child = 0;
	if (!WIFEXITED(status) || WEXITSTATUS(status))
		fail_msg("the destination child ended with status 0x%x", status);
	return r;
}

/* CPU time a process used, user and system, in microseconds. */
static uint64_t cpu_us(pid_t pid)
{
	char path[64], buf[1024];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	FILE *f = fopen(path, "r");
	size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
	if (f)
		fclose(f);
	buf[n] = 0;
	char *p = strrchr(buf, ')');
	unsigned long long utime = 0, stime = 0;
	/* after the name: state ppid pgrp session tty tpgid flags minflt cminflt
	 * majflt cmajflt utime stime */
	if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &utime,
	                 &stime) != 2)
		return 0;
	return (utime + stime) * 1000000ull / (uint64_t)sysconf(_SC_CLK_TCK);
}

/* VmRSS of pid in KiB, or -1 once it is gone. */
static long rss_of(pid_t pid)
{
	char path[64], line[256];
	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	FILE *f = fopen(path, "r");
	long kib = -1;
	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "VmRSS: %ld kB", &kib) == 1)
			break;
	if (f)
		fclose(f);
	return kib;
}

static long rss_kib(pid_t pid)
{
	long kib = rss_of(pid);
	assert_true(kib > 0);
	return kib;
}

/* ---- the real source ---- */

struct source_result {
	int rc;
	char error[600];
	uint64_t setup_ns;
	unsigned retries;
	struct flood_count at_setup; /* what the crowd had done when setup returned */
};

/* The crowd must be at full strength when the real source comes: wait
 * (up to 10 s) until FLOOD_FLOOR connections a second have been made to
 * the destination over the last QUALIFY_MS; that window's first count
 * comes back, for the rate to be measured from it to the moment the source
 * was accepted. A machine too busy to give the crowd and the destination
 * that much CPU (others' work on it at a load of ten or more, on two
 * cores) fails here, saying so. */
static struct flood_count full_strength(struct flood *f)
{
	struct flood_count ring[64];
	unsigned n = 0, step_ms = 10, span = QUALIFY_MS / step_ms;
	double best = 0;
	for (uint64_t t0 = lmt__now_ns(); lmt__now_ns() - t0 < 10000 * MS; n++) {
		usleep(step_ms * 1000);
		ring[n % 64] = flood_count(f);
		if (n < span)
			continue;
		const struct flood_count *from = &ring[(n - span) % 64];
		double rate = flood_rate(from, &ring[n % 64]);
		if (rate >= FLOOD_FLOOR && ring[n % 64].ns >= WARM_MS * MS)
			return *from;
		best = rate > best ? rate : best;
	}
	char load[64] = "?";
	FILE *l = fopen("/proc/loadavg", "r");
	if (l && !fgets(load, sizeof(load), l))
		snprintf(load, sizeof(load), "?");
	if (l)
		fclose(l);
	fail_msg("the crowd never made %u connections a second in 10 s (at most %.0f); "
	         "load average %s",
	         FLOOD_FLOOR, best, load);
	return ring[0];
}

struct source_job {
	lmt_session *s;
	const char *uri;
	struct flood *flood;
	struct source_result *r;
};

/* Setup, the passes and complete. With a crowd, on a thread of its own
 * whose nice value (and that of the threads lmt starts from it) is 5: the
 * real source runs here beside the crowd, on the same cores, and must not
 * take the CPU the crowd needs for its rate (where they are apart, the
 * source has its own); the crowd winning the CPU makes the test harder
 * for the source, not easier. */
static void *migrate_source(void *arg)
{
	struct source_job *j = arg;
	struct source_result *r = j->r;
	if (j->flood)
		setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 5);
	uint64_t t0 = lmt__now_ns();
	r->rc = lmt_save_setup(j->s, j->uri);
	r->setup_ns = lmt__now_ns() - t0;
	if (j->flood)
		r->at_setup = flood_count(j->flood);
	struct lmt_iterate_result it = {0};
	while (r->rc == 0 && !it.ready)
		r->rc = lmt_save_iterate(j->s, &it);
	if (r->rc == 0)
		r->rc = lmt_save_complete(j->s, "state", 5);
	return NULL;
}

static struct source_result source_run(struct flood *f, struct guest_ram *ram, const char *opts,
                                       uint16_t port)
{
	struct source_result r = {0};
	char uri[64];
	snprintf(uri, sizeof(uri), "127.0.0.1:%u", port);
	lmt_session *s = session_on(LMT_ROLE_SOURCE, ram, "tcp", opts);
	struct quiet_log q = {.who = "source"};
	lmt_session_set_log_handler(s, quiet_log, &q);
	assert_int_equal(lmt_session_set_dirty_sync(s, guest_dirty_sync, ram), 0);
	struct source_job job = {.s = s, .uri = uri, .flood = f, .r = &r};
	pthread_t t;
	if (f) {
		assert_int_equal(pthread_create(&t, NULL, migrate_source, &job), 0);
		pthread_join(t, NULL);
	} else {
		migrate_source(&job);
	}
	snprintf(r.error, sizeof(r.error), "%s", lmt_session_error(s)->message);
	r.retries = q.retries;
	lmt_session_free(s);
	return r;
}

/* ---- the destination's RSS, sampled every 5 ms ---- */

#define SAMPLES 4096 /* 20 s */

struct sampler {
	pid_t pid;
	struct flood *flood; /* its counts too, when set */
	atomic_bool stop;
	atomic_bool rss_done; /* the largest RSS is kept until then */
	long max;
	unsigned n;
	struct flood_count counts[SAMPLES];
	pthread_t thread;
};

static void *sample(void *arg)
{
	struct sampler *sm = arg;
	while (!atomic_load(&sm->stop)) {
		long kib = rss_of(sm->pid); /* -1 once the destination ended */
		if (kib > sm->max && !atomic_load(&sm->rss_done))
			sm->max = kib;
		if (sm->flood && sm->n < SAMPLES)
			sm->counts[sm->n++] = flood_count(sm->flood);
		usleep(5000);
	}
	return NULL;
}

/* One at a time, kept here for the teardown of a test that failed. */
static struct sampler sampler;
static bool sampling;

static void sample_start(pid_t pid, struct flood *f)
{
	memset(&sampler, 0, sizeof(sampler));
	sampler.pid = pid;
	sampler.flood = f;
	assert_int_equal(pthread_create(&sampler.thread, NULL, sample, &sampler), 0);
	sampling = true;
}

/* For a crowd that fell short: its rate every 25 ms over [from, to], which
 * tells a destination that could not keep up from one that got no CPU (a
 * run of zeros: on a host others load heavily, a process can wait that
 * long for a core). */
static void print_rates(const struct flood_count *from, const struct flood_count *to)
{
	print_message("    connections a second, every 25 ms from %llu ms to %llu ms:",
	              (unsigned long long)(from->ns / MS), (unsigned long long)(to->ns / MS));
	for (unsigned i = 0; i + 5 < sampler.n; i += 5)
		if (sampler.counts[i + 5].ns > from->ns && sampler.counts[i].ns < to->ns)
			print_message(" %.0f",
			              flood_rate(&sampler.counts[i], &sampler.counts[i + 5]));
	print_message("\n");
}

/* The last count of the crowd taken by `at_ns`. */
static struct flood_count count_at(uint64_t at_ns, const struct flood_count *otherwise)
{
	struct flood_count c = *otherwise;
	for (unsigned i = 0; i < sampler.n && sampler.counts[i].at_ns <= at_ns; i++)
		c = sampler.counts[i];
	return c;
}

static long sample_stop(void)
{
	if (sampling) {
		atomic_store(&sampler.stop, true);
		pthread_join(sampler.thread, NULL);
	}
	sampling = false;
	return sampler.max;
}

/* ---- a migration through a crowd ---- */

static void crowd(const char *dest_opts, const char *src_opts, enum flood_kind kind, bool tls)
{
	struct guest_ram *ram = source_ram(4242);
	struct child d = child_start(dest_opts);
	struct flood_spec spec = {.port = d.port, .kind = kind, .rate = FLOOD_RATE};
	/* The first bytes of what the real source sends, never all of it. */
	spec.bytes = tls ? client_hello : hello_bytes;
	spec.len = 64;
	usleep(100 * 1000); /* its load has started, and waits */
	long before = rss_kib(d.pid), bound = tls ? BOUND_TLS_KIB : BOUND_PLAIN_KIB;
	struct flood *f = crowd_start(&spec);
	sample_start(d.pid, f);
	struct flood_count from = full_strength(f);
	atomic_store(&sampler.rss_done, true); /* the source's own setup is not the crowd's */
	struct source_result r = source_run(f, ram, src_opts, d.port);
	long most = sample_stop();
	crowd_stop(f);
	/* The rate up to when the destination accepted the source (then it
	 * stops listening), from the counts taken every 5 ms. */
	uint64_t accepted = atomic_load(&watch->accepted_ns);
	struct flood_count to = accepted ? count_at(accepted, &r.at_setup) : r.at_setup;
	struct child_result cr = child_wait(&d);
	double rate = flood_rate(&from, &to);
	uint64_t made = to.established - from.established, closed = to.dropped - from.dropped;
	print_message("    crowd: %.0f connections a second made to the destination over the %llu "
	              "ms until it accepted the source (%llu made, %llu closed by it; %llu refused "
	              "or unanswered since the crowd began); setup took %llu ms with %u retries; "
	              "the destination's RSS grew by %ld KiB under the crowd (bound %ld)\n",
	              rate, (unsigned long long)((to.ns - from.ns) / MS), (unsigned long long)made,
	              (unsigned long long)closed, (unsigned long long)r.at_setup.failed,
	              (unsigned long long)(r.setup_ns / MS), r.retries, most - before, bound);
	if (to.ns - from.ns < QUALIFY_MS * MS)
		fail_msg("the crowd's rate was measured over %llu ms only",
		         (unsigned long long)((to.ns - from.ns) / MS));
	if (r.rc || cr.rc)
		fail_msg("source %d '%s'; destination %d '%s'", r.rc, r.error, cr.rc, cr.error);
	if (cr.sum != guest_checksum(ram->base, RAM_BYTES))
		fail_msg("the destination's RAM differs from the source's");
	if (rate < FLOOD_FLOOR) {
		print_rates(&from, &to);
		fail_msg("the crowd reached %.0f connections a second, not %u", rate, FLOOD_FLOOR);
	}
	/* And the destination took them: it closed all but what its table and
	 * its accept queue can hold (it closes every stranger it accepted,
	 * when a newcomer needs the place or the source is accepted). */
	if (kind != FLOOD_OPEN_CLOSE && closed + HELD_MAX < made)
		fail_msg("the destination closed %llu of the %llu connections made to it",
		         (unsigned long long)closed, (unsigned long long)made);
	if (most - before >= bound)
		fail_msg("the destination's RSS grew by %ld KiB under the crowd, bound %ld KiB",
		         most - before, bound);
	release_ram();
}

static char dst_opts[1024], src_opts[1024];

static void options(const char *dest, const char *source)
{
	snprintf(dst_opts, sizeof(dst_opts), "%s", dest);
	snprintf(src_opts, sizeof(src_opts), "%s", source);
}

static void plain(bool keyed)
{
	char d[128];
	snprintf(d, sizeof(d), "auth-key-file=%s", key_file);
	options(keyed ? d : "", keyed ? "auth-key=" KEY : "");
}

static void psk(void)
{
	char d[128];
	snprintf(d, sizeof(d), "tls=on,auth-key-file=%s", key_file);
	options(d, "tls=on,auth-key=" KEY);
}

static void certificates(bool keyed)
{
	char d[800], s[800];
	snprintf(d, sizeof(d), "%s%s%s", dst_cert, keyed ? ",auth-key-file=" : "",
	         keyed ? key_file : "");
	snprintf(s, sizeof(s), "%s%s", src_cert, keyed ? ",auth-key=" KEY : "");
	options(d, s);
}

static void test_silent_crowd_plain(void **state)
{
	plain(false);
	crowd(dst_opts, src_opts, FLOOD_SILENT, false);
}

static void test_silent_crowd_plain_keyed(void **state)
{
	plain(true);
	crowd(dst_opts, src_opts, FLOOD_SILENT, false);
}

static void test_silent_crowd_tls_psk(void **state)
{
	psk();
	crowd(dst_opts, src_opts, FLOOD_SILENT, true);
}

static void test_silent_crowd_tls_certificates(void **state)
{
	certificates(false);
	crowd(dst_opts, src_opts, FLOOD_SILENT, true);
}

static void test_silent_crowd_tls_certificates_keyed(void **state)
{
	certificates(true);
	crowd(dst_opts, src_opts, FLOOD_SILENT, true);
}

static void test_dribbling_crowd_plain(void **state)
{
	plain(false);
	crowd(dst_opts, src_opts, FLOOD_DRIBBLE, false);
}

static void test_dribbling_crowd_plain_keyed(void **state)
{
	plain(true);
	crowd(dst_opts, src_opts, FLOOD_DRIBBLE, false);
}

static void test_dribbling_crowd_tls_psk(void **state)
{
	psk();
	crowd(dst_opts, src_opts, FLOOD_DRIBBLE, true);
}

static void test_dribbling_crowd_tls_certificates(void **state)
{
	certificates(false);
	crowd(dst_opts, src_opts, FLOOD_DRIBBLE, true);
}

static void test_dribbling_crowd_tls_certificates_keyed(void **state)
{
	certificates(true);
	crowd(dst_opts, src_opts, FLOOD_DRIBBLE, true);
}

static void test_closing_crowd_plain_keyed(void **state)
{
	plain(true);
	crowd(dst_opts, src_opts, FLOOD_OPEN_CLOSE, false);
}

static void test_closing_crowd_tls_psk(void **state)
{
	psk();
	crowd(dst_opts, src_opts, FLOOD_OPEN_CLOSE, true);
}

/* ---- what the crowd costs the destination ---- */

struct wave {
	const char *name;
	enum flood_kind kind;
	const uint8_t *bytes;
	size_t len, part;
	/* It reaches FLOOD_FLOOR before the wave is sampled: a crowd that
	 * costs the destination as little as it costs the crowd. One whose
	 * every connection makes the destination work (a whole ClientHello,
	 * a HELLO it answers with a proof) runs at the rate the destination's
	 * CPU allows. */
	bool at_rate;
};

/* Each wave (one that counts reaching the floor rate first) for `ms`; the
 * destination's largest RSS. One that does not count is a warm-up: a few
 * connections of each kind, for what the first ones make once (OpenSSL's
 * caches), not what a crowd makes the destination hold. */
static long flood_waves(pid_t pid, uint16_t port, const struct wave *w, int n, int ms, bool counts)
{
	long most = 0;
	for (int i = 0; i < n; i++) {
		sample_start(pid, NULL);
		struct flood_spec spec = {.port = port,
		                          .kind = w[i].kind,
		                          .rate = counts ? FLOOD_RATE : WARM_RATE,
		                          .bytes = w[i].bytes,
		                          .len = w[i].len,
		                          .part = w[i].part};
		struct flood *f = crowd_start(&spec);
		/* The rate is measured from when the crowd is at full strength
		 * (and the destination's table full). */
		struct flood_count from;
		if (counts && w[i].at_rate) {
			from = full_strength(f);
		} else {
			usleep((useconds_t)ms * 1000 / 4);
			from = flood_count(f);
		}
		struct flood_count at = flood_count(f);
		uint64_t cpu0 = cpu_us(pid);
		usleep((useconds_t)ms * 1000);
		struct flood_count c = flood_count(f);
		uint64_t cpu = cpu_us(pid) - cpu0;
		crowd_stop(f);
		long max = sample_stop();
		if (!counts)
			continue;
		double peak = flood_rate(&from, &at), rate = flood_rate(&at, &c);
		uint64_t taken = (uint64_t)(rate * (double)(c.ns - at.ns) / 1e9);
		print_message(
		        "    %-28s %6.0f connections a second (%s%.0f), destination RSS up to "
		        "%ld KiB, its CPU %.1f us a connection\n",
		        w[i].name, rate, w[i].at_rate ? "after reaching " : "",
		        w[i].at_rate ? peak : rate, max, taken ? (double)cpu / (double)taken : 0.0);
		if (max > most)
			most = max;
	}
	return most;
}

/* The heap the child's allocator holds for lmt is back where it was (a
 * sanitizer's allocator does not say: LeakSanitizer checks at exit). */
static void heap_returned(uint64_t before, uint64_t after)
{
	if (!before) {
		print_message("    heap in use: not measurable under this allocator\n");
		return;
	}
	print_message("    heap in use: %llu KiB before, %llu KiB after\n",
	              (unsigned long long)(before >> 10), (unsigned long long)(after >> 10));
	if (after > before + (64u << 10))
		fail_msg("the destination's heap holds %llu KiB more after the crowd",
		         (unsigned long long)((after - before) >> 10));
}

/* Every wave twice, at the full rate: the destination's RSS must stay
 * within bound_kib of where it started throughout (so the second round,
 * reusing what the first freed, adds nothing), its heap must come back,
 * and, where no stranger gets as far as an OpenSSL connection, its RSS
 * too. Then the real source still migrates. */
static void memory_on_the_control_port(const char *dest, const char *source, bool tls,
                                       bool strangers_handshake, long bound_kib)
{
	char d[1100];
	snprintf(d, sizeof(d), "%s,connect-timeout=1s,idle-timeout=600s", dest);
	struct guest_ram *ram = source_ram(77);
	struct child c = child_start(d);
	const uint8_t *first = tls ? client_hello : hello_bytes;
	size_t len = tls ? client_hello_len : hello_len;
	const struct wave waves[] = {
	        {"silent", FLOOD_SILENT, NULL, 0, 0, true},
	        {"dribbling", FLOOD_DRIBBLE, first, len, 0, true},
	        {"half a first message", FLOOD_PART, first, len, len / 2, true},
	        {"a whole first message", FLOOD_PART, first, len, len, false},
	        {"connect and close", FLOOD_OPEN_CLOSE, NULL, 0, 0, true},
	};
	int n = sizeof(waves) / sizeof(waves[0]);
	/* Warm up what the first connections of each kind make once. */
	flood_waves(c.pid, c.port, waves, n, 100, false);
	usleep(1500 * 1000);
	long before = rss_kib(c.pid);
	uint64_t heap_before = atomic_load(&watch->in_use);
	long most = 0;
	for (int round = 0; round < 2; round++) {
		long m = flood_waves(c.pid, c.port, waves, n, WAVE_MS, true);
		most = m > most ? m : most;
	}
	usleep(1500 * 1000); /* connect-timeout: every stranger is gone */
	long after = rss_kib(c.pid);
	uint64_t heap_after = atomic_load(&watch->in_use);
	print_message("    destination RSS: %ld KiB before, at most %ld during (+%ld, bound %ld), "
	              "%ld after (+%ld)\n",
	              before, most, most - before, bound_kib, after, after - before);
	struct source_result r = source_run(NULL, ram, source, c.port);
	struct child_result cr = child_wait(&c);
	if (r.rc || cr.rc)
		fail_msg("source %d '%s'; destination %d '%s'", r.rc, r.error, cr.rc, cr.error);
	assert_true(cr.sum == guest_checksum(ram->base, RAM_BYTES));
	if (most - before >= bound_kib)
		fail_msg("the destination's RSS grew by %ld KiB under the crowd, bound %ld KiB",
		         most - before, bound_kib);
	heap_returned(heap_before, heap_after);
	if (!strangers_handshake && after - before >= AFTER_SLACK_KIB)
		fail_msg("the destination's RSS stayed %ld KiB up after the crowd", after - before);
	release_ram();
}

static void test_memory_on_the_control_port_plain(void **state)
{
	plain(true);
	memory_on_the_control_port(dst_opts, src_opts, false, false, BOUND_PLAIN_KIB);
}

/* A stranger's whole ClientHello gets an OpenSSL connection and the
 * server's first flight (certificate and signature) here. */
static void test_memory_on_the_control_port_tls_certificates(void **state)
{
	certificates(true);
	memory_on_the_control_port(dst_opts, src_opts, true, true, BOUND_TLS_KIB);
}

/* Here it fails at once: it offers no key of this destination. */
static void test_memory_on_the_control_port_tls_psk(void **state)
{
	psk();
	memory_on_the_control_port(dst_opts, src_opts, true, false, BOUND_TLS_KIB);
}

/* The tcp plugin's data port, found as the source learns it: squatters,
 * dribblers, half hellos and garbage while the destination waits for the
 * source's data connection. */
static void test_memory_on_the_data_port(void **state)
{
	char d[200];
	snprintf(d, sizeof(d), "auth-key-file=%s,connect-timeout=120s,idle-timeout=600s", key_file);
	struct guest_ram *ram = source_ram(99);
	struct child c = child_start(d);
	struct hostile_source *h = &data_source;
	hostile_source_open(h, c.port, KEY, ram);
	data_source_open = true;
	uint8_t hello[24] = {'L', 'M', 'T', 'H', 1, 0};
	uint8_t garbage[24];
	for (unsigned i = 0; i < sizeof(garbage); i++)
		garbage[i] = (uint8_t)(i * 53 + 7);
	const struct wave waves[] = {
	        {"silent", FLOOD_SILENT, NULL, 0, 0, true},
	        {"dribbling a hello", FLOOD_DRIBBLE, hello, sizeof(hello), 0, true},
	        {"half a hello", FLOOD_PART, hello, sizeof(hello), 10, true},
	        {"a hello with a guessed token", FLOOD_PART, hello, sizeof(hello), sizeof(hello),
	         true},
	        {"garbage", FLOOD_PART, garbage, sizeof(garbage), sizeof(garbage), true},
	};
	int n = sizeof(waves) / sizeof(waves[0]);
	flood_waves(c.pid, h->data_port, waves, n, 60, false);
	usleep(100 * 1000);
	long before = rss_kib(c.pid);
	uint64_t heap_before = atomic_load(&watch->in_use);
	long most = flood_waves(c.pid, h->data_port, waves, n, WAVE_MS, true);
	usleep(100 * 1000);
	long after = rss_kib(c.pid);
	uint64_t heap_after = atomic_load(&watch->in_use);
	uint64_t t0 = lmt__now_ns();
	assert_int_equal(hostile_source_connect(h), 0);
	uint64_t took = lmt__now_ns() - t0;
	assert_int_equal(hostile_source_write_all(h, ram), 0);
	struct lmt_msg_complete *m = calloc(1, sizeof(*m));
	assert_int_equal(lmt__enc_complete(&h->out, m), 0);
	free(m);
	hostile_send_buf(h->fd, &h->out);
	assert_int_equal(hostile_recv(h->fd, h->in, &h->in_len, 5000), LMT_MSG_COMPLETE_ACK);
	hostile_source_close(h);
	data_source_open = false;
	struct child_result cr = child_wait(&c);
	print_message("    data port: destination RSS %ld KiB before, at most %ld during (+%ld, "
	              "bound %d), %ld after; the source connected in %llu ms\n",
	              before, most, most - before, BOUND_PLAIN_KIB, after,
	              (unsigned long long)(took / MS));
	if (cr.rc)
		fail_msg("destination %d '%s'", cr.rc, cr.error);
	assert_true(cr.sum == guest_checksum(ram->base, RAM_BYTES));
	assert_true(took < 1000 * MS);
	if (most - before >= BOUND_PLAIN_KIB)
		fail_msg("the destination's RSS grew by %ld KiB under the crowd, bound %d KiB",
		         most - before, BOUND_PLAIN_KIB);
	heap_returned(heap_before, heap_after);
	if (after - before >= AFTER_SLACK_KIB)
		fail_msg("the destination's RSS stayed %ld KiB up after the crowd", after - before);
	release_ram();
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test_teardown(test_silent_crowd_plain, clean_up),
	        cmocka_unit_test_teardown(test_silent_crowd_plain_keyed, clean_up),
	        cmocka_unit_test_teardown(test_silent_crowd_tls_psk, clean_up),
	        cmocka_unit_test_teardown(test_silent_crowd_tls_certificates, clean_up),
	        cmocka_unit_test_teardown(test_silent_crowd_tls_certificates_keyed, clean_up),
	        cmocka_unit_test_teardown(test_dribbling_crowd_plain, clean_up),
	        cmocka_unit_test_teardown(test_dribbling_crowd_plain_keyed, clean_up),
	        cmocka_unit_test_teardown(test_dribbling_crowd_tls_psk, clean_up),
	        cmocka_unit_test_teardown(test_dribbling_crowd_tls_certificates, clean_up),
	        cmocka_unit_test_teardown(test_dribbling_crowd_tls_certificates_keyed, clean_up),
	        cmocka_unit_test_teardown(test_closing_crowd_plain_keyed, clean_up),
	        cmocka_unit_test_teardown(test_closing_crowd_tls_psk, clean_up),
	        cmocka_unit_test_teardown(test_memory_on_the_control_port_plain, clean_up),
	        cmocka_unit_test_teardown(test_memory_on_the_control_port_tls_psk, clean_up),
	        cmocka_unit_test_teardown(test_memory_on_the_control_port_tls_certificates,
	                                  clean_up),
	        cmocka_unit_test_teardown(test_memory_on_the_data_port, clean_up),
	};
	if (getenv("LMT_TEST_FILTER"))
		cmocka_set_test_filter(getenv("LMT_TEST_FILTER"));
	/* The source's retries are warnings, the line that says a destination
	 * accepted its source is at info: every session here logs to a handler
	 * of its own, which prints only the first few. (The level comes from
	 * the environment: this program also links the core's internals, whose
	 * lmt_set_log_level is not the library's.) */
	setenv("LMT_LOG", "info", 1);
	return cmocka_run_group_tests(tests, setup, teardown);
}
