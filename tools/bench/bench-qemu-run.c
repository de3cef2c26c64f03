/* lmt-bench --qemu: one QEMU migration. The destination starts with its
 * RAM in tmpfs files (pre-faulted unless --no-prefault) and -incoming
 * defer; the source starts with the image as its RAM and the guest
 * running; both get the row's migration parameters over QMP; the source
 * migrates over loopback TCP while lmt-bench polls query-migrate; then the
 * destination's RAM is checked, and both processes end. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench-qemu.h"
#include "qemu-guest/qemu-guest.h"

#define QUIT_TIMEOUT_NS (UINT64_C(10) * 1000000000u)
#define POLL_NS 20000000u
#define UNLIMITED_BANDWIDTH (UINT64_C(1) << 40)

/* One side: its process, QMP, files. */
struct side {
	const char *name; /* "source", "destination" */
	pid_t pid;
	struct bench_qmp qmp;
	char sock[320], log[320], debugcon[320], trace[320];
	char ram_path[2][320]; /* destination: its RAM files */
	int ram_fd[2];
	uint64_t started_ns; /* spawn to QMP (the destination: its pre-fault too) */
};

struct qrun {
	const struct bench_config *cfg;
	const struct bench_qemu_env *env;
	const struct bench_qemu_spec *spec;
	struct bench_result *out;
	struct bench_qemu_result *q;
	struct side src, dst;
	uint64_t deadline;
};

static void fail(struct qrun *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void fail(struct qrun *r, const char *fmt, ...)
{
	va_list ap;

	if (r->out->error[0])
		return;
	va_start(ap, fmt);
	vsnprintf(r->out->error, sizeof(r->out->error), fmt, ap);
	va_end(ap);
}

/* What went wrong on a side, with QEMU's last word when it ended. */
static void fail_side(struct qrun *r, struct side *s, const char *what)
{
	char tail[256], status_text[64] = "";
	int status;

	if (s->qmp.exited)
		bench_qemu_describe_status(s->qmp.status, status_text, sizeof(status_text));
	else if (s->pid > 0 && bench_qemu_exited(s->pid, &status)) {
		bench_qemu_describe_status(status, status_text, sizeof(status_text));
		s->pid = 0;
	}
	bench_qemu_log_tail(s->log, tail, sizeof(tail));
	if (status_text[0])
		fail(r, "%s QEMU: %s; it %s%s%s", s->name, what, status_text, tail[0] ? ": " : "",
		     tail);
	else
		fail(r, "%s QEMU: %s", s->name, what);
}

static int call(struct qrun *r, struct side *s, const char *command, const char *arguments,
                char **reply)
{
	char err[BENCH_ERROR_MAX], *ignored = NULL;
	int rc = bench_qmp_call(&s->qmp, command, arguments, reply ? reply : &ignored, r->deadline,
	                        err, sizeof(err));

	free(ignored);
	if (rc < 0)
		fail_side(r, s, err);
	return rc;
}

static void sleep_ns(uint64_t ns)
{
	struct timespec ts = {(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)};

	nanosleep(&ts, NULL);
}

/* ---- Starting --------------------------------------------------------------- */

static void side_paths(struct qrun *r, struct side *s, const char *name)
{
	const char *dir = r->env->dir;

	s->name = name;
	s->ram_fd[0] = s->ram_fd[1] = -1;
	snprintf(s->sock, sizeof(s->sock), "%s/%.3s.qmp", dir, name);
	snprintf(s->log, sizeof(s->log), "%s/%.3s.log", dir, name);
	snprintf(s->debugcon, sizeof(s->debugcon), "%s/%.3s.debugcon", dir, name);
	snprintf(s->trace, sizeof(s->trace), "%s/%.3s.trace", dir, name);
}

/* The destination's RAM: two files on tmpfs that QEMU maps shared and
 * lmt-bench reads afterwards. */
static int dest_files(struct qrun *r)
{
	struct side *s = &r->dst;
	const uint64_t bytes[2] = {r->cfg->ram_bytes, r->env->layout.area_bytes};

	for (int i = 0; i < 2; i++) {
		snprintf(s->ram_path[i], sizeof(s->ram_path[i]), "%s/lmt-bench-qemu-ram%d.XXXXXX",
		         r->env->shm_dir, i);
		s->ram_fd[i] = mkostemp(s->ram_path[i], O_CLOEXEC);
		if (s->ram_fd[i] < 0 || ftruncate(s->ram_fd[i], (off_t)bytes[i]) < 0) {
			fail(r, "destination RAM file %s: %s", s->ram_path[i], strerror(errno));
			return -1;
		}
	}
	return 0;
}

static void memory_args(struct qrun *r, struct bench_args *a, bool source)
{
	const struct bench_qemu_env *env = r->env;
	const char *prealloc = source || r->cfg->prefault ? "on" : "off";

	bench_arg(a, "-m");
	bench_arg(a, "%lluK",
	          (unsigned long long)((r->cfg->ram_bytes + env->layout.area_bytes) / 1024));
	bench_arg(a, "-object");
	/* share=off: the guest starts with the image's bytes, and the file
	 * is never written. */
	if (source)
		bench_arg(a,
		          "memory-backend-file,id=lmt-ram0,size=%lluK,mem-path=%s,share=off,"
		          "prealloc=on",
		          (unsigned long long)(r->cfg->ram_bytes / 1024), env->image);
	else
		bench_arg(a,
		          "memory-backend-file,id=lmt-ram0,size=%lluK,mem-path=%s,share=on,"
		          "prealloc=%s",
		          (unsigned long long)(r->cfg->ram_bytes / 1024), r->dst.ram_path[0],
		          prealloc);
	bench_arg(a, "-object");
	if (source)
		bench_arg(a, "memory-backend-ram,id=lmt-ram1,size=%lluK",
		          (unsigned long long)(env->layout.area_bytes / 1024));
	else
		bench_arg(a,
		          "memory-backend-file,id=lmt-ram1,size=%lluK,mem-path=%s,share=on,"
		          "prealloc=%s",
		          (unsigned long long)(env->layout.area_bytes / 1024), r->dst.ram_path[1],
		          prealloc);
	/* Two NUMA nodes lay the image at guest-physical 0 and the guest's
	 * own area right after it. */
	bench_arg(a, "-numa");
	bench_arg(a, "node,nodeid=0,memdev=lmt-ram0");
	bench_arg(a, "-numa");
	bench_arg(a, "node,nodeid=1,memdev=lmt-ram1");
	if (source && env->pools[0]) {
		bench_arg(a, "-device");
		bench_arg(a, "loader,file=%s,addr=%#llx,force-raw=on", env->pools,
		          (unsigned long long)(env->layout.area_base +
		                               env->layout.pool_offset[QG_POOL_CODE]));
	}
}

static int start_side(struct qrun *r, struct side *s, bool source)
{
	struct bench_args a = {0};
	char err[BENCH_ERROR_MAX];
	uint64_t t0;

	unlink(s->sock);
	unlink(s->debugcon);
	bench_qemu_common_args(&a, r->env, r->env->accel, r->env->rom, s->debugcon);
	memory_args(r, &a, source);
	bench_arg(&a, "-qmp");
	bench_arg(&a, "unix:%s,server=on,wait=off", s->sock);
	/* QEMU counts compressed pages at their size before compression:
	 * the trace of each multifd packet gives the size it sent. */
	if (source && r->spec->compression != BENCH_QEMU_NONE) {
		bench_arg(&a, "-trace");
		bench_arg(&a, "multifd_send,file=%s", s->trace);
	}
	if (!source) {
		bench_arg(&a, "-incoming");
		bench_arg(&a, "defer");
		/* Stays paused once the migration is in: its RAM is checked as
		 * the source left it. */
		bench_arg(&a, "-S");
	}
	t0 = guest_now_ns();
	s->pid = bench_qemu_spawn(&a, s->log, err, sizeof(err));
	bench_args_free(&a);
	if (s->pid < 0) {
		s->pid = 0;
		fail(r, "%s QEMU: %s", s->name, err);
		return -1;
	}
	if (bench_qmp_connect(&s->qmp, s->sock, s->pid, r->deadline, err, sizeof(err)) < 0) {
		fail_side(r, s, err);
		if (s->qmp.exited)
			s->pid = 0;
		return -1;
	}
	s->started_ns = guest_now_ns() - t0;
	/* QEMU holds its RAM files now: nothing is left behind if we die. */
	for (int i = 0; i < 2 && !source; i++)
		unlink(s->ram_path[i]);
	return 0;
}

/* The source's guest says on its debug console when it runs. */
static int wait_guest(struct qrun *r, uint64_t t0)
{
	const char *want = r->cfg->dirty_rate ? "lmt-guest: dirtying\n" : "lmt-guest: idle\n";
	char text[512];
	int status;

	for (;;) {
		bench_qemu_read_small(r->src.debugcon, text, sizeof(text));
		if (strstr(text, want)) {
			r->q->source_start_ns = guest_now_ns() - t0;
			return 0;
		}
		if (strstr(text, "lmt-guest: ") && !strstr(text, want)) {
			text[strcspn(text, "\n")] = '\0';
			fail(r, "source QEMU: the guest said '%s'", text);
			return -1;
		}
		if (bench_qemu_exited(r->src.pid, &status)) {
			r->src.pid = 0;
			fail_side(r, &r->src, "it ended before its guest ran");
			return -1;
		}
		if (guest_now_ns() >= r->deadline) {
			fail(r, "source QEMU: its guest did not start before the timeout");
			return -1;
		}
		sleep_ns(POLL_NS / 4);
	}
}

/* ---- Migrating -------------------------------------------------------------- */

static int set_parameters(struct qrun *r, struct side *s, bool source)
{
	const struct bench_qemu_spec *spec = r->spec;
	char text[512];
	size_t n;

	if (spec->multifd) {
		if (call(r, s, "migrate-set-capabilities",
		         "{\"capabilities\":[{\"capability\":\"multifd\",\"state\":true}]}",
		         NULL) < 0)
			return -1;
		n = (size_t)snprintf(text, sizeof(text),
		                     "{\"multifd-channels\":%u,\"multifd-compression\":\"%s\"",
		                     spec->channels,
		                     spec->compression == BENCH_QEMU_ZSTD   ? "zstd"
		                     : spec->compression == BENCH_QEMU_ZLIB ? "zlib"
		                                                            : "none");
		if (spec->level >= 0)
			n += (size_t)snprintf(
			        text + n, sizeof(text) - n, ",\"multifd-%s-level\":%d",
			        spec->compression == BENCH_QEMU_ZSTD ? "zstd" : "zlib",
			        spec->level);
	} else {
		n = (size_t)snprintf(text, sizeof(text), "{");
	}
	if (source) {
		n += (size_t)snprintf(text + n, sizeof(text) - n, "%s\"max-bandwidth\":%llu",
		                      spec->multifd ? "," : "",
		                      (unsigned long long)(r->env->max_bandwidth
		                                                   ? r->env->max_bandwidth
		                                                   : UNLIMITED_BANDWIDTH));
		if (r->env->downtime_ms)
			n += (size_t)snprintf(text + n, sizeof(text) - n,
			                      ",\"downtime-limit\":%llu",
			                      (unsigned long long)r->env->downtime_ms);
	}
	snprintf(text + n, sizeof(text) - n, "}");
	if (strcmp(text, "{}") == 0)
		return 0;
	return call(r, s, "migrate-set-parameters", text, NULL);
}

static int listen_incoming(struct qrun *r, char *port, size_t size)
{
	char *reply = NULL, text[128];

	snprintf(text, sizeof(text), "{\"uri\":\"tcp:127.0.0.1:%u\"}", (unsigned)r->cfg->port);
	if (call(r, &r->dst, "migrate-incoming", text, NULL) < 0 ||
	    call(r, &r->dst, "query-migrate", NULL, &reply) < 0)
		return -1;
	int rc = bench_json_string(reply, "return.socket-address.port", port, size);
	free(reply);
	if (rc < 0 || strspn(port, "0123456789") != strlen(port) || !port[0]) {
		fail(r, "destination QEMU: query-migrate named no port it listens on");
		return -1;
	}
	return 0;
}

/* Polls the source until the migration ends; *reply: its last answer. */
static int migrate(struct qrun *r, const char *port, char **reply)
{
	char text[128], status[32], desc[512];

	snprintf(text, sizeof(text), "{\"uri\":\"tcp:127.0.0.1:%s\"}", port);
	if (call(r, &r->src, "migrate", text, NULL) < 0)
		return -1;
	for (;;) {
		if (call(r, &r->src, "query-migrate", NULL, reply) < 0)
			return -1;
		if (bench_json_string(*reply, "return.status", status, sizeof(status)) < 0) {
			fail(r, "source QEMU: query-migrate gave no status");
			return -1;
		}
		if (strcmp(status, "completed") == 0)
			return 0;
		if (strcmp(status, "failed") == 0 || strcmp(status, "cancelled") == 0) {
			if (bench_json_string(*reply, "return.error-desc", desc, sizeof(desc)) < 0)
				snprintf(desc, sizeof(desc), "no reason given");
			fail(r, "source QEMU: migration %s: %s", status, desc);
			return -1;
		}
		free(*reply);
		*reply = NULL;
		if (guest_now_ns() + POLL_NS >= r->deadline) {
			char timeout[32], *ignored = NULL, err[256];

			bench_format(LMT_OPT_DURATION, r->cfg->timeout_ns, timeout,
			             sizeof(timeout));
			bench_qmp_call(&r->src.qmp, "migrate_cancel", NULL, &ignored,
			               guest_now_ns() + QUIT_TIMEOUT_NS, err, sizeof(err));
			free(ignored);
			fail(r, "timed out after %s, still migrating (%s); cancelled", timeout,
			     status);
			return -1;
		}
		sleep_ns(POLL_NS);
	}
}

/* The destination has loaded everything once its side says completed. */
static int wait_destination(struct qrun *r)
{
	char *reply = NULL, status[32];

	for (;;) {
		if (call(r, &r->dst, "query-migrate", NULL, &reply) < 0)
			return -1;
		int rc = bench_json_string(reply, "return.status", status, sizeof(status));
		free(reply);
		reply = NULL;
		if (rc == 0 && strcmp(status, "completed") == 0)
			return 0;
		if (rc == 0 && strcmp(status, "failed") == 0) {
			fail_side(r, &r->dst, "the incoming migration failed");
			return -1;
		}
		if (guest_now_ns() >= r->deadline) {
			fail(r, "destination QEMU: still loading at the timeout (%s)",
			     rc == 0 ? status : "no status");
			return -1;
		}
		sleep_ns(POLL_NS / 4);
	}
}

static void take_figures(struct qrun *r, const char *reply)
{
	struct bench_result *out = r->out;
	struct bench_qemu_result *q = r->q;
	uint64_t setup = 0, total = 0, downtime = 0;

	bench_json_uint(reply, "return.setup-time", &setup);
	bench_json_uint(reply, "return.total-time", &total);
	bench_json_uint(reply, "return.downtime", &downtime);
	bench_json_uint(reply, "return.ram.transferred", &q->transferred);
	bench_json_uint(reply, "return.ram.multifd-bytes", &q->multifd_bytes);
	bench_json_uint(reply, "return.ram.total", &q->ram_total);
	bench_json_uint(reply, "return.ram.duplicate", &q->duplicate);
	bench_json_uint(reply, "return.ram.normal", &q->normal);
	bench_json_uint(reply, "return.ram.dirty-sync-count", &q->dirty_sync_count);
	/* QEMU counts in milliseconds; ram.transferred includes the multifd
	 * channels' bytes. */
	out->stats.setup_ns = setup * 1000000u;
	out->stats.total_ns = total * 1000000u;
	out->stats.downtime_ns = downtime * 1000000u;
	out->stats.bytes_sent = q->transferred;
	out->stats.zero_pages = q->duplicate;
	out->stats.normal_pages = q->normal;
	out->stats.ram_bytes = q->ram_total;
	out->stats.status = LMT_STATUS_COMPLETED;
	out->have_stats = true;
	out->stats_json = bench_json_dup(reply, "return");
	out->prefaulted = r->cfg->prefault;
	out->prefault_ns = r->cfg->prefault ? r->dst.started_ns : 0;
}

/* The bytes on the wire: ram.transferred, with each multifd packet's
 * pages counted at the size QEMU sent (its multifd_send trace, read once
 * the source has ended and flushed it) rather than 4 KiB each. */
static void count_wire(struct qrun *r)
{
	struct bench_qemu_result *q = r->q;
	uint64_t pages = 0, sent = 0, packets = 0;
	char line[512];
	FILE *f;

	if (r->spec->compression == BENCH_QEMU_NONE) {
		q->wire_bytes = q->transferred;
		q->wire_known = true;
		return;
	}
	f = fopen(r->src.trace, "re");
	if (!f)
		return;
	while (fgets(line, sizeof(line), f)) {
		const char *at = strstr(line, "multifd_send ");
		unsigned long long normal, size;

		if (at && sscanf(at,
		                 "multifd_send channel %*u packet_num %*u normal pages %llu "
		                 "flags %*x next packet size %llu",
		                 &normal, &size) == 2) {
			pages += normal;
			sent += size;
			packets++;
		}
	}
	fclose(f);
	if (packets == 0 || pages * GUEST_PAGE_SIZE > q->transferred)
		return;
	q->wire_bytes = q->transferred - pages * GUEST_PAGE_SIZE + sent;
	q->wire_known = true;
}

/* ---- Checking ----------------------------------------------------------------- */

static void corrupt(struct qrun *r)
{
	uint8_t byte;
	off_t at = (off_t)(r->cfg->ram_bytes / 2);

	if (pread(r->dst.ram_fd[0], &byte, 1, at) == 1) {
		byte ^= 0x55;
		if (pwrite(r->dst.ram_fd[0], &byte, 1, at) != 1)
			fail(r, "--test-corrupt: %s", strerror(errno));
	}
}

/* A page of the paused source's guest-physical memory, with QMP's
 * pmemsave into a file of the temporary directory. */
static int source_read(void *opaque, uint64_t gpa, void *buf, size_t len)
{
	struct qrun *r = opaque;
	char path[320], args[512], *reply = NULL, err[256];
	int fd, rc;

	if (r->src.pid <= 0 || r->src.qmp.fd < 0)
		return -1;
	snprintf(path, sizeof(path), "%s/source-page.bin", r->env->dir);
	snprintf(args, sizeof(args), "{\"val\":%llu,\"size\":%zu,\"filename\":\"%s\"}",
	         (unsigned long long)gpa, len, path);
	rc = bench_qmp_call(&r->src.qmp, "pmemsave", args, &reply, guest_now_ns() + QUIT_TIMEOUT_NS,
	                    err, sizeof(err));
	free(reply);
	fd = rc == 0 ? open(path, O_RDONLY | O_CLOEXEC) : -1;
	rc = fd >= 0 && read(fd, buf, len) == (ssize_t)len ? 0 : -1;
	if (fd >= 0)
		close(fd);
	unlink(path);
	return rc;
}

static void check(struct qrun *r)
{
	const struct bench_qemu_source source = {.read = source_read, .opaque = r};
	const struct bench_config *cfg = r->cfg;
	const uint64_t area = r->env->layout.area_bytes;
	const uint8_t *image = NULL, *ram = NULL, *own = NULL;
	struct bench_qemu_guest guest;
	char err[BENCH_ERROR_MAX];
	int fd = open(r->env->image, O_RDONLY | O_CLOEXEC);

	if (cfg->test_corrupt)
		corrupt(r);
	if (fd < 0) {
		fail(r, "%s: %s", r->env->image, strerror(errno));
		return;
	}
	if (bench_qemu_map(r->env->image, fd, cfg->ram_bytes, &image, err, sizeof(err)) < 0 ||
	    bench_qemu_map(r->dst.ram_path[0], r->dst.ram_fd[0], cfg->ram_bytes, &ram, err,
	                   sizeof(err)) < 0 ||
	    bench_qemu_map(r->dst.ram_path[1], r->dst.ram_fd[1], area, &own, err, sizeof(err)) <
	            0) {
		fail(r, "%s", err);
	} else if (bench_qemu_check(cfg, &r->env->layout, image, ram, own, &source, &guest, err,
	                            sizeof(err)) < 0) {
		fail(r, "%s", err);
	} else {
		r->q->pages_written = guest.pages_written;
		r->q->pages_skipped = guest.pages_skipped;
		r->q->pages_rewritten = guest.pages_rewritten;
		r->q->unchecked_pages = guest.unchecked_pages;
		if (guest.last_tsc > guest.start_tsc)
			r->q->guest_ns = (uint64_t)((double)(guest.last_tsc - guest.start_tsc) *
			                            1e9 / (double)r->env->tsc_hz);
		r->out->dirtied_bytes = guest.pages_written * GUEST_PAGE_SIZE;
		r->out->workload_ns = r->q->guest_ns;
		r->out->verified = true;
	}
	if (image)
		munmap((void *)image, cfg->ram_bytes);
	if (ram)
		munmap((void *)ram, cfg->ram_bytes);
	if (own)
		munmap((void *)own, area);
	close(fd);
}

/* ---- The run ------------------------------------------------------------------- */

static void stop_side_keep_trace(struct side *s);

static void stop_side(struct side *s)
{
	stop_side_keep_trace(s);
	unlink(s->trace);
}

static void stop_side_keep_trace(struct side *s)
{
	char *ignored = NULL, err[256];

	if (s->pid > 0 && s->qmp.fd >= 0 && !s->qmp.exited)
		bench_qmp_call(&s->qmp, "quit", NULL, &ignored, guest_now_ns() + QUIT_TIMEOUT_NS,
		               err, sizeof(err));
	free(ignored);
	bench_qmp_close(&s->qmp);
	if (s->pid > 0)
		bench_qemu_reap(s->pid, QUIT_TIMEOUT_NS);
	s->pid = 0;
	for (int i = 0; i < 2; i++) {
		if (s->ram_fd[i] >= 0) {
			close(s->ram_fd[i]);
			unlink(s->ram_path[i]);
		}
		s->ram_fd[i] = -1;
	}
	unlink(s->sock);
	unlink(s->debugcon);
	unlink(s->log);
}

static void run(struct qrun *r)
{
	char port[16], *reply = NULL;
	uint64_t t0;

	if (dest_files(r) < 0 || start_side(r, &r->dst, false) < 0)
		return;
	t0 = guest_now_ns();
	if (start_side(r, &r->src, true) < 0 || wait_guest(r, t0) < 0 ||
	    set_parameters(r, &r->dst, false) < 0 || set_parameters(r, &r->src, true) < 0 ||
	    listen_incoming(r, port, sizeof(port)) < 0)
		return;
	if (migrate(r, port, &reply) < 0) {
		free(reply);
		return;
	}
	take_figures(r, reply);
	free(reply);
	if (wait_destination(r) < 0)
		return;
	/* The source stays, paused since the switch-over, to tell a lost
	 * write from a wrong one; then it ends, flushing its trace. */
	check(r);
	stop_side_keep_trace(&r->src);
	count_wire(r);
}

void bench_qemu_run(const struct bench_config *cfg, const struct bench_qemu_env *env,
                    const struct bench_qemu_spec *spec, struct bench_result *out)
{
	struct qrun r = {.cfg = cfg, .env = env, .spec = spec, .out = out};

	memset(out, 0, sizeof(*out));
	out->qemu = calloc(1, sizeof(*out->qemu));
	if (!out->qemu) {
		snprintf(out->error, sizeof(out->error), "out of memory");
		return;
	}
	r.q = out->qemu;
	out->qemu_ran = true;
	r.deadline = guest_now_ns() + cfg->timeout_ns;
	side_paths(&r, &r.src, "source");
	side_paths(&r, &r.dst, "destination");
	r.src.qmp.fd = r.dst.qmp.fd = -1;
	if (cfg->progress) {
		fprintf(cfg->progress, "\r%s: migrating with QEMU\033[K", cfg->label);
		fflush(cfg->progress);
	}
	run(&r);
	stop_side(&r.src);
	stop_side(&r.dst);
	if (cfg->progress) {
		fprintf(cfg->progress, "\r\033[K");
		fflush(cfg->progress);
	}
	out->ok = out->verified && !out->error[0];
	if (!out->ok && !out->error[0])
		snprintf(out->error, sizeof(out->error), "failed");
}
