/* lmt-bench --qemu: QEMU's own live migration as a yardstick, on a guest
 * that holds the same bytes as lmt-bench's and dirties its RAM as
 * lmt-bench's workload does (qemu-guest/). Two QEMU processes per run, the
 * destination started with -incoming defer, both driven over QMP; the
 * destination's RAM is then checked page by page (bench-qemu-guest.c). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/kvm.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "bench-qemu.h"
#include "qemu-guest/qemu-guest.h"

#define QEMU_DEFAULT_BINARY "qemu-system-x86_64"
#define KVM_NATIVE_MIBPS 512.0 /* KVM runs the guest natively above this */
#define PROBE_PAGES 8u
#define PROBE_TIMEOUT_NS (UINT64_C(20) * 1000000000u)
#define UNLIMITED_BANDWIDTH (UINT64_C(1) << 40) /* bytes per second: 8.8 Tb/s */
#define MIB 1048576.0

/* ---- The spec ---------------------------------------------------------------- */

static const char *const compression_names[] = {"none", "zstd", "zlib"};

static int spec_fail(char *err, size_t size, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));

static int spec_fail(char *err, size_t size, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err, size, fmt, ap);
	va_end(ap);
	return -1;
}

static int parse_small(const char *value, long min, long max, long *out)
{
	char *end;

	if (!*value || strspn(value, "0123456789") != strlen(value))
		return -1;
	*out = strtol(value, &end, 10);
	return *end || *out < min || *out > max ? -1 : 0;
}

static int spec_item(struct bench_qemu_spec *s, const char *whole, const char *key,
                     const char *value, char *err, size_t size)
{
	long n;

	if (strcmp(key, "multifd") == 0) {
		if (strcmp(value, "on") && strcmp(value, "off"))
			return spec_fail(err, size, "'%s': multifd: expected on or off, got '%s'",
			                 whole, value);
		s->multifd = strcmp(value, "on") == 0;
	} else if (strcmp(key, "channels") == 0) {
		if (parse_small(value, 1, 255, &n) < 0)
			return spec_fail(
			        err, size,
			        "'%s': channels: expected an integer from 1 to 255, got '%s'",
			        whole, value);
		s->channels = (unsigned)n;
	} else if (strcmp(key, "compression") == 0) {
		for (n = 0; n < 3 && strcmp(value, compression_names[n]); n++)
			;
		if (n == 3)
			return spec_fail(err, size,
			                 "'%s': compression: expected none, zstd or zlib, got '%s'",
			                 whole, value);
		s->compression = (enum bench_qemu_compression)n;
	} else if (strcmp(key, "level") == 0) {
		if (parse_small(value, 0, 20, &n) < 0)
			return spec_fail(err, size,
			                 "'%s': level: expected an integer from 0 to 20, got '%s'",
			                 whole, value);
		s->level = (int)n;
	} else {
		return spec_fail(err, size,
		                 "'%s': unknown key '%s' (expected multifd, channels, "
		                 "compression or level)",
		                 whole, key);
	}
	return 0;
}

int bench_qemu_spec_parse(const char *text, struct bench_qemu_spec *out, char *err, size_t size)
{
	char *copy = strdup(text), *save = NULL;
	bool channels = false;
	int rc = 0;

	*out = (struct bench_qemu_spec){.multifd = true, .channels = 4, .level = -1};
	if (!copy)
		return spec_fail(err, size, "out of memory");
	for (char *item = strtok_r(copy, ",", &save); item && rc == 0;
	     item = strtok_r(NULL, ",", &save)) {
		char *eq = strchr(item, '=');

		if (!eq || eq == item) {
			rc = spec_fail(err, size, "'%s': expected KEY=VALUE, got '%s'", text, item);
			break;
		}
		*eq = '\0';
		channels = channels || strcmp(item, "channels") == 0;
		rc = spec_item(out, text, item, eq + 1, err, size);
	}
	free(copy);
	if (rc == 0 && !out->multifd && (channels || out->compression != BENCH_QEMU_NONE))
		rc = spec_fail(err, size,
		               "'%s': channels and compression are multifd's: not with multifd=off",
		               text);
	if (rc == 0 && out->level >= 0 && out->compression == BENCH_QEMU_NONE)
		rc = spec_fail(err, size, "'%s': level needs compression=zstd or zlib", text);
	if (rc == 0 && out->compression == BENCH_QEMU_ZLIB && out->level > 9)
		rc = spec_fail(err, size, "'%s': level: zlib's go from 0 to 9", text);
	return rc;
}

int bench_qemu_plugin_parse(const char *text, struct bench_plugin *out, char *err, size_t size)
{
	char label[128];

	memset(out, 0, sizeof(*out));
	out->qemu = true;
	if (bench_qemu_spec_parse(text ? text : "", &out->qemu_spec, err, size) < 0)
		return -1;
	bench_qemu_spec_label(&out->qemu_spec, label, sizeof(label));
	out->name = strdup("qemu");
	out->label = strdup(label);
	out->options = text && *text ? strdup(text) : NULL;
	if (!out->name || !out->label || (text && *text && !out->options)) {
		bench_plugin_clear(out);
		return spec_fail(err, size, "out of memory");
	}
	return 0;
}

void bench_qemu_spec_label(const struct bench_qemu_spec *s, char *buf, size_t size)
{
	if (!s->multifd)
		snprintf(buf, size, "qemu one stream");
	else if (s->level >= 0)
		snprintf(buf, size, "qemu multifd-%u %s-%d", s->channels,
		         compression_names[s->compression], s->level);
	else
		snprintf(buf, size, "qemu multifd-%u %s", s->channels,
		         compression_names[s->compression]);
}

void bench_qemu_spec_options(const struct bench_qemu_spec *s, const struct bench_qemu_env *env,
                             char *buf, size_t size)
{
	size_t n = 0;

	if (s->multifd) {
		n = (size_t)snprintf(buf, size,
		                     "multifd=on,multifd-channels=%u,multifd-compression=%s",
		                     s->channels, compression_names[s->compression]);
		if (s->level >= 0 && n < size)
			n += (size_t)snprintf(buf + n, size - n, ",multifd-%s-level=%d",
			                      compression_names[s->compression], s->level);
	} else {
		n = (size_t)snprintf(buf, size, "multifd=off");
	}
	if (n < size)
		n += (size_t)snprintf(buf + n, size - n, ",max-bandwidth=%llu",
		                      (unsigned long long)(env->max_bandwidth
		                                                   ? env->max_bandwidth
		                                                   : UNLIMITED_BANDWIDTH));
	if (n < size)
		snprintf(buf + n, size - n, ",downtime-limit=%llu",
		         (unsigned long long)(env->downtime_ms ? env->downtime_ms
		                                               : env->default_downtime_ms));
}

int bench_qemu_accel_parse(const char *text, enum bench_qemu_accel *out)
{
	static const enum bench_qemu_accel all[] = {BENCH_QEMU_AUTO, BENCH_QEMU_KVM,
	                                            BENCH_QEMU_TCG};

	for (size_t i = 0; i < 3; i++) {
		if (strcmp(text, bench_qemu_accel_name(all[i])) == 0) {
			*out = all[i];
			return 0;
		}
	}
	return -1;
}

int bench_qemu_check_config(const struct bench_config *cfg, const struct bench_sweep *sweeps,
                            size_t nsweeps, char *err, size_t size)
{
	if (cfg->target_dir || cfg->local || cfg->postcopy)
		return spec_fail(err, size,
		                 "--qemu migrates between two QEMU processes: not with --target "
		                 "or --postcopy");
	for (size_t i = 0; i < nsweeps; i++)
		if (strcmp(sweeps[i].key, "max-bandwidth") == 0 ||
		    strcmp(sweeps[i].key, "downtime-limit") == 0)
			return spec_fail(err, size,
			                 "--qemu takes max-bandwidth and downtime-limit from -o: "
			                 "sweep them over separate invocations");
	return 0;
}

const char *bench_qemu_accel_name(enum bench_qemu_accel accel)
{
	return accel == BENCH_QEMU_KVM ? "kvm" : accel == BENCH_QEMU_TCG ? "tcg" : "auto";
}

/* ---- The environment ----------------------------------------------------------- */

static uint64_t rdtsc(void)
{
#if defined(__x86_64__) || defined(__i386__)
	uint32_t lo, hi;

	__asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
	return (uint64_t)hi << 32 | lo;
#else
	return 0;
#endif
}

/* The TSC's rate, against the monotonic clock over 200 ms: the guest's
 * TSC runs at the host's under KVM and under TCG. */
static uint64_t measure_tsc_hz(void)
{
	uint64_t t0 = guest_now_ns(), c0 = rdtsc();
	struct timespec ts = {0, 200000000};

	nanosleep(&ts, NULL);
	uint64_t c1 = rdtsc(), t1 = guest_now_ns();
	return t1 > t0 ? (uint64_t)((double)(c1 - c0) * 1e9 / (double)(t1 - t0)) : 0;
}

static bool kvm_usable(char *why, size_t size)
{
	int fd = open("/dev/kvm", O_RDWR | O_CLOEXEC);
	int version;

	if (fd < 0) {
		snprintf(why, size, "/dev/kvm: %s", strerror(errno));
		return false;
	}
	version = ioctl(fd, KVM_GET_API_VERSION, 0);
	close(fd);
	if (version != KVM_API_VERSION) {
		snprintf(why, size, "/dev/kvm answers API version %d, not %d", version,
		         KVM_API_VERSION);
		return false;
	}
	return true;
}

/* Runs the guest's probe under `accel`: how fast it builds random pages,
 * in MiB/s; 0 with `why` when it did not answer. */
static double probe(const struct bench_qemu_env *env, enum bench_qemu_accel accel, char *why,
                    size_t size)
{
	char rom[320], debugcon[320], log[320], text[256], tail[256], status_text[64];
	struct bench_args a = {0};
	double mibps = 0;
	int status;

	snprintf(rom, sizeof(rom), "%s/probe.rom", env->dir);
	snprintf(debugcon, sizeof(debugcon), "%s/probe.debugcon", env->dir);
	snprintf(log, sizeof(log), "%s/probe.log", env->dir);
	if (bench_qemu_write_probe_rom(rom, PROBE_PAGES, env->tsc_hz, why, size) < 0)
		return 0;
	unlink(debugcon);
	bench_qemu_common_args(&a, env, accel, rom, debugcon);
	bench_arg(&a, "-m");
	bench_arg(&a, "%lluK", (unsigned long long)(BENCH_QEMU_PROBE_RAM / 1024));
	pid_t pid = bench_qemu_spawn(&a, log, why, size);
	bench_args_free(&a);
	if (pid < 0)
		return 0;
	uint64_t deadline = guest_now_ns() + PROBE_TIMEOUT_NS;
	for (;;) {
		unsigned long long pages, cycles;
		char *line;

		bench_qemu_read_small(debugcon, text, sizeof(text));
		line = strstr(text, "lmt-guest: probe ");
		if (line && sscanf(line, "lmt-guest: probe %llx pages in %llx cycles", &pages,
		                   &cycles) == 2) {
			mibps = cycles ? (double)pages * GUEST_PAGE_SIZE / MIB *
			                         (double)env->tsc_hz / (double)cycles
			               : 0;
			break;
		}
		if (bench_qemu_exited(pid, &status)) {
			bench_qemu_describe_status(status, status_text, sizeof(status_text));
			bench_qemu_log_tail(log, tail, sizeof(tail));
			snprintf(why, size, "QEMU %s: %.160s", status_text, tail);
			pid = 0;
			break;
		}
		if (guest_now_ns() >= deadline) {
			snprintf(why, size, "the guest's probe did not finish in %llu s",
			         (unsigned long long)(PROBE_TIMEOUT_NS / 1000000000u));
			break;
		}
		struct timespec ts = {0, 10000000};
		nanosleep(&ts, NULL);
	}
	if (pid > 0) {
		kill(pid, SIGKILL);
		waitpid(pid, &status, 0);
	}
	unlink(rom);
	unlink(debugcon);
	unlink(log);
	return mibps;
}

static int choose_accel(struct bench_qemu_env *env, enum bench_qemu_accel asked, char *err,
                        size_t size)
{
	char why[256] = "";
	double kvm = 0;

	if (asked == BENCH_QEMU_TCG) {
		env->accel = BENCH_QEMU_TCG;
		snprintf(env->accel_why, sizeof(env->accel_why), "asked for");
	} else if (!kvm_usable(why, sizeof(why))) {
		if (asked == BENCH_QEMU_KVM)
			return spec_fail(err, size, "--qemu-accel kvm: %s", why);
		env->accel = BENCH_QEMU_TCG;
		snprintf(env->accel_why, sizeof(env->accel_why), "no usable KVM: %s", why);
	} else {
		kvm = probe(env, BENCH_QEMU_KVM, why, sizeof(why));
		if (asked == BENCH_QEMU_KVM || kvm >= KVM_NATIVE_MIBPS) {
			env->accel = BENCH_QEMU_KVM;
			snprintf(env->accel_why, sizeof(env->accel_why), "%s",
			         asked == BENCH_QEMU_KVM ? "asked for" : "/dev/kvm runs the guest");
			env->probe_mibps = kvm;
			if (kvm > 0)
				return 0;
			return spec_fail(err, size, "--qemu-accel kvm: %s", why);
		}
		env->accel = BENCH_QEMU_TCG;
		if (kvm > 0)
			snprintf(env->accel_why, sizeof(env->accel_why),
			         "/dev/kvm opens, but it ran the guest's probe at %.1f MiB/s: it "
			         "emulates this guest instead of running it",
			         kvm);
		else
			snprintf(env->accel_why, sizeof(env->accel_why),
			         "/dev/kvm opens, but the guest's probe failed under it: %s", why);
	}
	env->probe_mibps = probe(env, BENCH_QEMU_TCG, why, sizeof(why));
	if (env->probe_mibps <= 0)
		return spec_fail(err, size, "QEMU under TCG: %s", why);
	return 0;
}

/* The first line of `qemu --version`, which also shows that it runs. */
static int qemu_version(struct bench_qemu_env *env, char *err, size_t size)
{
	char log[320], text[512], status_text[64];
	struct bench_args a = {0};
	int status;

	snprintf(log, sizeof(log), "%s/version.log", env->dir);
	bench_arg(&a, "%s", env->binary);
	bench_arg(&a, "--version");
	pid_t pid = bench_qemu_spawn(&a, log, err, size);
	bench_args_free(&a);
	if (pid < 0)
		return -1;
	waitpid(pid, &status, 0);
	bench_qemu_read_small(log, text, sizeof(text));
	unlink(log);
	text[strcspn(text, "\n")] = '\0';
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		bench_qemu_describe_status(status, status_text, sizeof(status_text));
		return spec_fail(err, size, "%s --version %s: %s", env->binary, status_text, text);
	}
	snprintf(env->version, sizeof(env->version), "%.127s", text);
	return 0;
}

/* max-bandwidth and downtime-limit from -o, parsed as lmt parses them. */
int bench_qemu_env_limits(struct bench_qemu_env *env, const char *options, char *err, size_t size)
{
	static const struct lmt_option_desc bandwidth = {.name = "max-bandwidth",
	                                                 .type = LMT_OPT_SIZE};
	static const struct lmt_option_desc downtime = {.name = "downtime-limit",
	                                                .type = LMT_OPT_DURATION};
	char *copy = options ? strdup(options) : NULL, *save = NULL;
	int rc = 0;

	if (options && !copy)
		return spec_fail(err, size, "out of memory");
	for (char *item = copy ? strtok_r(copy, ",", &save) : NULL; item && rc == 0;
	     item = strtok_r(NULL, ",", &save)) {
		char *eq = strchr(item, '=');
		const struct lmt_option_desc *desc;
		struct lmt_option_value value;
		struct lmt_error lerr = {0};

		if (!eq)
			continue;
		*eq = '\0';
		desc = strcmp(item, bandwidth.name) == 0  ? &bandwidth
		       : strcmp(item, downtime.name) == 0 ? &downtime
		                                          : NULL;
		if (!desc)
			continue;
		if (lmt_option_parse(desc, eq + 1, &value, &lerr) != 0) {
			rc = spec_fail(err, size, "%s", lerr.message);
			break;
		}
		if (desc == &bandwidth) {
			env->max_bandwidth = (uint64_t)value.integer;
		} else {
			env->downtime_ms = (uint64_t)value.integer / 1000000u;
			if (env->downtime_ms == 0)
				rc = spec_fail(err, size,
				               "--qemu: QEMU's downtime-limit is in "
				               "milliseconds, at least 1ms");
		}
	}
	free(copy);
	return rc;
}

static int find_binary(struct bench_qemu_env *env, const char *binary, char *err, size_t size)
{
	const char *name = binary ? binary : QEMU_DEFAULT_BINARY;

	if (strchr(name, '/') ? access(name, X_OK) != 0 : !bench_on_path(name))
		return spec_fail(err, size,
		                 "--qemu: %s not found%s (Debian: apt-get install qemu-system-x86)",
		                 name, strchr(name, '/') ? "" : " on PATH");
	snprintf(env->binary, sizeof(env->binary), "%s", name);
	return 0;
}

static int write_image(struct bench_qemu_env *env, const struct bench_config *cfg, char *err,
                       size_t size)
{
	snprintf(env->image, sizeof(env->image), "%s/guest.img", env->dir);
	snprintf(env->rom, sizeof(env->rom), "%s/guest.rom", env->dir);
	if (bench_content_file(env->image, cfg, err, size) < 0 ||
	    bench_qemu_write_rom(env->rom, cfg, &env->layout, env->tsc_hz, err, size) < 0)
		return -1;
	if (env->layout.pool_pages[0] + env->layout.pool_pages[1] == 0)
		return 0;
	snprintf(env->pools, sizeof(env->pools), "%s/pools.bin", env->dir);
	return bench_qemu_write_pools(env->pools, cfg, &env->layout, err, size);
}

/* Interrupted (^C, a kill), lmt-bench leaves no image behind: the files
 * the runs may have in the directory, named in advance, are removed from
 * the signal handler; the QEMU processes die with lmt-bench. */
#define CLEANUP_FILES 16
static const char *const cleanup_names[CLEANUP_FILES] = {
        "guest.img",   "guest.rom",    "pools.bin", "probe.rom",      "probe.debugcon", "probe.log",
        "version.log", "sou.qmp",      "sou.log",   "sou.debugcon",   "sou.trace",      "des.qmp",
        "des.log",     "des.debugcon", "des.trace", "source-page.bin"};
static char cleanup_paths[CLEANUP_FILES][320];
static char cleanup_dir[256];
static const int cleanup_signals[] = {SIGINT, SIGTERM, SIGHUP};

static void cleanup_on_signal(int sig)
{
	for (int i = 0; i < CLEANUP_FILES; i++)
		unlink(cleanup_paths[i]);
	rmdir(cleanup_dir);
	signal(sig, SIG_DFL);
	raise(sig);
}

static void cleanup_arm(const struct bench_qemu_env *env, bool on)
{
	for (int i = 0; on && i < CLEANUP_FILES; i++)
		snprintf(cleanup_paths[i], sizeof(cleanup_paths[i]), "%s/%s", env->dir,
		         cleanup_names[i]);
	snprintf(cleanup_dir, sizeof(cleanup_dir), "%s", env->dir);
	for (size_t i = 0; i < sizeof(cleanup_signals) / sizeof(cleanup_signals[0]); i++)
		signal(cleanup_signals[i], on ? cleanup_on_signal : SIG_DFL);
}

/* Whether /dev/shm is a directory with room for `bytes` (a container's
 * is often 64 MiB). */
static bool shm_fits(uint64_t bytes)
{
	struct statvfs vfs;
	struct stat st;

	return stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) &&
	       statvfs("/dev/shm", &vfs) == 0 && (uint64_t)vfs.f_bavail * vfs.f_frsize >= bytes;
}

int bench_qemu_env_init(struct bench_qemu_env *env, const struct bench_config *cfg,
                        const char *binary, enum bench_qemu_accel accel, const char *options,
                        char *err, size_t size)
{
	const char *tmp = getenv("TMPDIR");

	memset(env, 0, sizeof(*env));
	env->default_downtime_ms = 300;
#if !defined(__x86_64__)
	(void)cfg, (void)binary, (void)accel, (void)options;
	return spec_fail(err, size, "--qemu runs its x86 guest on an x86-64 host only");
#else
	bench_qemu_plan_layout(cfg, &env->layout);
	/* Flat 32-bit mode without paging, and QEMU's pc machine keeps RAM
	 * below 3.5 GiB in one piece only up to there. */
	if (env->layout.area_base + env->layout.area_bytes > (UINT64_C(3) << 30))
		return spec_fail(err, size,
		                 "--qemu: the guest runs in 32-bit mode without paging: --ram up "
		                 "to 3G less its own area (%llu MiB here)",
		                 (unsigned long long)(env->layout.area_bytes >> 20));
	if (find_binary(env, binary, err, size) < 0 ||
	    bench_qemu_env_limits(env, options, err, size) < 0)
		return -1;
	snprintf(env->dir, sizeof(env->dir), "%s/lmt-bench-qemu.XXXXXX",
	         tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(env->dir)) {
		int e = errno;
		env->dir[0] = '\0';
		return spec_fail(err, size, "--qemu: a temporary directory: %s", strerror(e));
	}
	cleanup_arm(env, true);
	/* The destination's RAM lives in files we read afterwards: on tmpfs,
	 * as lmt's destination's memfd. */
	snprintf(env->shm_dir, sizeof(env->shm_dir), "%s",
	         shm_fits(cfg->ram_bytes + env->layout.area_bytes) ? "/dev/shm" : env->dir);
	env->tsc_hz = measure_tsc_hz();
	if (env->tsc_hz == 0)
		return spec_fail(err, size, "--qemu: could not measure the TSC's rate");
	if (qemu_version(env, err, size) < 0 || write_image(env, cfg, err, size) < 0 ||
	    choose_accel(env, accel, err, size) < 0)
		return -1;
	return 0;
#endif
}

void bench_qemu_env_free(struct bench_qemu_env *env)
{
	if (!env->dir[0])
		return;
	if (env->image[0])
		unlink(env->image);
	if (env->rom[0])
		unlink(env->rom);
	if (env->pools[0])
		unlink(env->pools);
	rmdir(env->dir);
	cleanup_arm(env, false);
	env->dir[0] = '\0';
}

/* ---- Rows ---------------------------------------------------------------------- */

int bench_qemu_rows_add(struct bench_plugin *qemu, size_t nqemu, const char *options,
                        const struct bench_qemu_env *env, struct bench_row **rows, size_t *nrows,
                        char *err, size_t size)
{
	struct bench_qemu_env limits = {.default_downtime_ms = 300};
	struct bench_row *grown;
	char text[512];

	if (!nqemu)
		return 0;
	/* Without the environment (a dry run), the limits alone. */
	if (!env && bench_qemu_env_limits(&limits, options, err, size) < 0)
		return -1;
	grown = realloc(*rows, (*nrows + nqemu) * sizeof(*grown));
	if (!grown)
		return spec_fail(err, size, "out of memory");
	*rows = grown;
	for (size_t i = 0; i < nqemu; i++) {
		struct bench_row *row = &grown[*nrows];

		memset(row, 0, sizeof(*row));
		row->index = (unsigned)*nrows + 1;
		row->plugin = &qemu[i];
		bench_qemu_spec_options(&qemu[i].qemu_spec, env ? env : &limits, text,
		                        sizeof(text));
		row->options = strdup(text);
		row->config = strdup("");
		row->label = strdup(qemu[i].label);
		(*nrows)++;
		if (!row->options || !row->config || !row->label)
			return spec_fail(err, size, "out of memory");
	}
	return 0;
}

/* ---- Output ---------------------------------------------------------------------- */

void bench_qemu_preamble(FILE *f, const struct bench_qemu_env *env, const struct bench_config *cfg)
{
	char bandwidth[32], downtime[32];

	if (env->max_bandwidth)
		bench_format(LMT_OPT_SIZE, env->max_bandwidth, bandwidth, sizeof(bandwidth));
	bench_format(LMT_OPT_DURATION,
	             (env->downtime_ms ? env->downtime_ms : env->default_downtime_ms) * 1000000u,
	             downtime, sizeof(downtime));
	fprintf(f, "qemu: %s (%s), accel %s (%s)\n", env->version, env->binary,
	        bench_qemu_accel_name(env->accel), env->accel_why);
	fprintf(f,
	        "qemu guest: the image of lmt's guest at guest-physical 0 (source: share=off, "
	        "pre-faulted; destination: tmpfs, %s), its own area of %llu MiB after it (status, "
	        "stack, log%s), migrated too; it builds random pages at %.0f MiB/s here%s\n",
	        cfg->prefault ? "pre-faulted (-mem-prealloc), timed apart" : "not pre-faulted",
	        (unsigned long long)(env->layout.area_bytes >> 20),
	        env->pools[0] ? ", the pools it copies" : "", env->probe_mibps,
	        cfg->dirty_rate ? ", lmt's workload paced by its TSC" : ", idle (hlt)");
	fprintf(f, "qemu migration: loopback TCP, max-bandwidth %s, downtime-limit %s%s\n",
	        env->max_bandwidth ? bandwidth : "unlimited (1T)", downtime,
	        env->downtime_ms ? "" : " (QEMU's default)");
}

void bench_qemu_json_row(FILE *f, const struct bench_qemu_env *env)
{
	fprintf(f, ",\"qemu\":{\"version\":");
	bench_json_write_string(f, env->version);
	fprintf(f, ",\"binary\":");
	bench_json_write_string(f, env->binary);
	fprintf(f, ",\"accel\":\"%s\",\"accel_reason\":", bench_qemu_accel_name(env->accel));
	bench_json_write_string(f, env->accel_why);
	fprintf(f,
	        ",\"guest_random_pages_mibps\":%.1f,\"guest_area_bytes\":%llu,\"tsc_hz\":%llu,"
	        "\"max_bandwidth\":%llu,\"downtime_limit_ms\":%llu,\"downtime_limit_default\":%s}",
	        env->probe_mibps, (unsigned long long)env->layout.area_bytes,
	        (unsigned long long)env->tsc_hz,
	        (unsigned long long)(env->max_bandwidth ? env->max_bandwidth : UNLIMITED_BANDWIDTH),
	        (unsigned long long)(env->downtime_ms ? env->downtime_ms
	                                              : env->default_downtime_ms),
	        env->downtime_ms ? "false" : "true");
}

void bench_qemu_json_run(FILE *f, const struct bench_result *r)
{
	const struct bench_qemu_result *q = r->qemu;
	char wire[32] = "null";

	if (q->wire_known)
		snprintf(wire, sizeof(wire), "%llu", (unsigned long long)q->wire_bytes);
	fprintf(f,
	        ",\"qemu\":{\"ram_transferred\":%llu,\"multifd_bytes\":%llu,\"wire_bytes\":%s,"
	        "\"ram_total\":%llu,\"duplicate_pages\":%llu,\"normal_pages\":%llu,"
	        "\"dirty_sync_count\":%llu,\"source_start_ms\":%.3f,\"guest_pages_written\":%llu,"
	        "\"guest_pages_skipped\":%llu,\"guest_ms\":%.3f,\"pages_rewritten_checked\":%llu,"
	        "\"pages_unchecked\":%llu}",
	        (unsigned long long)q->transferred, (unsigned long long)q->multifd_bytes, wire,
	        (unsigned long long)q->ram_total, (unsigned long long)q->duplicate,
	        (unsigned long long)q->normal, (unsigned long long)q->dirty_sync_count,
	        (double)q->source_start_ns / 1e6, (unsigned long long)q->pages_written,
	        (unsigned long long)q->pages_skipped, (double)q->guest_ns / 1e6,
	        (unsigned long long)q->pages_rewritten, (unsigned long long)q->unchecked_pages);
}
