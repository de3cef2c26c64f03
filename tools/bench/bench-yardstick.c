/* lmt-bench's yardsticks, run in the same invocation: a single-thread memcpy
 * over the guest's size, and with --yardsticks each transport's own
 * benchmark over loopback — iperf3 for tcp and for ofi over its tcp
 * provider, ucx_perftest for ucx. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"

#define RUNS 3
#define ATTEMPTS 50 /* client starts while the server comes up */
#define RETRY_NS 100000000u
#define TOOL_TIMEOUT_NS UINT64_C(60000000000)
#define OUTPUT_MAX 65536
/* 256 MiB messages, so that neither side's buffer stays in the cache (a
 * guest's RAM does not); 10 of them after 2 for warm-up. */
#define UCX_MESSAGE "268435456"
#define UCX_ITERATIONS "10"
#define UCX_WARMUP "2"

extern char **environ;

struct tool {
	const char *plugin;
	/* Whether the tool measures this entry's wire (NULL: always). */
	bool (*applies)(const struct bench_plugin *plugin);
	const char *program;
	const char *what;
	/* argv of the server and the client for `port`; `test` may pick a
	 * variant of the benchmark. */
	void (*args)(char *server[], char *client[], const char *port, const char *test);
	double (*parse)(const char *output); /* Gb/s, or 0 */
};

/* ---- iperf3 ------------------------------------------------------------- */

static void iperf3_args(char *server[], char *client[], const char *port, const char *test)
{
	char *s[] = {"iperf3", "-s", "-1", "-B", "127.0.0.1", "-p", (char *)port, NULL};
	char *c[] = {"iperf3", "-c", "127.0.0.1", "-p", (char *)port, "-t", "2", "-J", NULL};

	memcpy(server, s, sizeof(s));
	memcpy(client, c, sizeof(c));
}

static double iperf3_parse(const char *output)
{
	const char *sum = strstr(output, "\"sum_received\"");
	const char *bits = sum ? strstr(sum, "\"bits_per_second\":") : NULL;

	return bits ? strtod(bits + strlen("\"bits_per_second\":"), NULL) / 1e9 : 0;
}

/* ---- ucx_perftest ------------------------------------------------------- */

static void ucx_args(char *server[], char *client[], const char *port, const char *test)
{
	char *s[] = {"ucx_perftest", "-p", (char *)port, NULL};
	char *c[] = {"ucx_perftest", "127.0.0.1", "-p",        (char *)port, "-t",
	             (char *)test,   "-s",        UCX_MESSAGE, "-n",         UCX_ITERATIONS,
	             "-w",           UCX_WARMUP,  NULL};

	memcpy(server, s, sizeof(s));
	memcpy(client, c, sizeof(c));
}

/* "Final: iterations, latency 50%ile, average, overall (us), bandwidth
 * average, overall (MB/s, MB being 2^20 bytes), message rate...". */
static double ucx_parse(const char *output)
{
	const char *final = strstr(output, "Final:");
	double values[6];
	char *end;

	if (!final)
		return 0;
	final += strlen("Final:");
	for (int i = 0; i < 6; i++) {
		values[i] = strtod(final, &end);
		if (end == final)
			return 0;
		final = end;
	}
	return values[5] * 1048576.0 * 8 / 1e9;
}

static char *option_value(const char *options, const char *key);

/* ofi moves data over loopback TCP with its tcp provider (alone, under
 * ofi_rxm, or the newer "net"); over shm its yardstick is memcpy. */
static bool ofi_over_tcp(const struct bench_plugin *plugin)
{
	char *provider = option_value(plugin->options, "ofi.provider");
	size_t len = provider ? strcspn(provider, ";") : 0;
	bool tcp = provider && ((len == 3 && strncmp(provider, "tcp", 3) == 0) ||
	                        (len == 3 && strncmp(provider, "net", 3) == 0));

	free(provider);
	return tcp;
}

static const struct tool tools[] = {
        {"tcp", NULL, "iperf3", "iperf3, one TCP stream over loopback for 2 s", iperf3_args,
         iperf3_parse},
        {"ofi", ofi_over_tcp, "iperf3", "iperf3, one TCP stream over loopback for 2 s", iperf3_args,
         iperf3_parse},
        {"ucx", NULL, "ucx_perftest", "ucx_perftest, 256 MiB messages, two processes", ucx_args,
         ucx_parse},
};

#define NTOOLS (sizeof(tools) / sizeof(tools[0]))

/* ---- Processes ---------------------------------------------------------- */

/* A port free now; the server binds it a moment later. */
static int free_port(char *buf, size_t size)
{
	struct sockaddr_in addr = {.sin_family = AF_INET};
	socklen_t len = sizeof(addr);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd < 0 || bind(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0 ||
	    getsockname(fd, (struct sockaddr *)&addr, &len) < 0) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	close(fd);
	snprintf(buf, size, "%u", (unsigned)ntohs(addr.sin_port));
	return 0;
}

/* stdout to `out_fd` (or /dev/null when negative), stderr to /dev/null. */
static pid_t start(char *argv[], char *envp[], int out_fd)
{
	posix_spawn_file_actions_t actions;
	pid_t pid;
	int rc;

	posix_spawn_file_actions_init(&actions);
	posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
	if (out_fd >= 0)
		posix_spawn_file_actions_adddup2(&actions, out_fd, STDOUT_FILENO);
	else
		posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
	posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
	rc = posix_spawnp(&pid, argv[0], &actions, NULL, argv, envp);
	posix_spawn_file_actions_destroy(&actions);
	return rc == 0 ? pid : -1;
}

/* Waits for `pid` until `deadline_ns`, then kills it. Its exit status. */
static int finish(pid_t pid, uint64_t deadline_ns)
{
	const struct timespec tick = {0, 5000000};
	int status = 0;

	while (waitpid(pid, &status, WNOHANG) == 0) {
		if (guest_now_ns() >= deadline_ns) {
			kill(pid, SIGKILL);
			waitpid(pid, &status, 0);
			return -1;
		}
		nanosleep(&tick, NULL);
	}
	return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* The client's whole stdout into `out`; its exit status, or -1. */
static int run_client(char *argv[], char *envp[], char *out, size_t size)
{
	uint64_t deadline = guest_now_ns() + TOOL_TIMEOUT_NS;
	size_t got = 0;
	int fds[2];
	pid_t pid;

	if (pipe2(fds, O_CLOEXEC) < 0)
		return -1;
	pid = start(argv, envp, fds[1]);
	close(fds[1]);
	while (pid > 0 && guest_now_ns() < deadline) {
		struct pollfd pfd = {.fd = fds[0], .events = POLLIN};
		ssize_t n;

		if (poll(&pfd, 1, 100) <= 0)
			continue;
		n = read(fds[0], out + got, size - 1 - got);
		if (n <= 0 && !(n < 0 && errno == EINTR))
			break;
		got += n > 0 ? (size_t)n : 0;
		if (got == size - 1)
			break;
	}
	out[got] = '\0';
	close(fds[0]);
	return pid > 0 ? finish(pid, deadline) : -1;
}

/* One server and one client; the client is retried while the server is
 * still coming up. The measurement in Gb/s, or 0. */
static double measure_once(const struct tool *tool, const char *test, char *envp[], char *out)
{
	char port[16], *server[16] = {0}, *client[16] = {0};
	double gbps = 0;
	pid_t pid;

	if (free_port(port, sizeof(port)) < 0)
		return 0;
	tool->args(server, client, port, test);
	pid = start(server, envp, -1);
	if (pid < 0)
		return 0;
	for (int attempt = 0; attempt < ATTEMPTS && gbps <= 0; attempt++) {
		const struct timespec pause = {0, RETRY_NS};

		if (run_client(client, envp, out, OUTPUT_MAX) == 0)
			gbps = tool->parse(out);
		/* A server that gave up will not answer a retry. */
		if (gbps <= 0 && waitpid(pid, NULL, WNOHANG) == pid)
			return 0;
		if (gbps <= 0)
			nanosleep(&pause, NULL);
	}
	kill(pid, SIGTERM);
	finish(pid, guest_now_ns() + 2000000000u);
	return gbps;
}

/* ---- Environment -------------------------------------------------------- */

/* The plugin's option `key` from "k=v,...", or NULL. */
static char *option_value(const char *options, const char *key)
{
	size_t key_len = strlen(key);

	for (const char *item = options; item && *item;) {
		size_t len = strcspn(item, ",");

		if (len > key_len && item[key_len] == '=' && strncmp(item, key, key_len) == 0)
			return strndup(item + key_len + 1, len - key_len - 1);
		item += len + (item[len] == ',');
	}
	return NULL;
}

/* environ with UCX_TLS and UCX_NET_DEVICES first, as the ucx plugin sets
 * them from ucx.tls and ucx.devices. Free with free_env. */
static char **tool_env(const struct bench_plugin *plugin, char *extra[2])
{
	size_t n = 0, k = 0;
	char **envp;
	char *tls = option_value(plugin->options, "ucx.tls");
	char *devices = option_value(plugin->options, "ucx.devices");

	extra[0] = extra[1] = NULL;
	if (tls && tls[0] && asprintf(&extra[0], "UCX_TLS=%s", tls) < 0)
		extra[0] = NULL;
	if (devices && devices[0] && asprintf(&extra[1], "UCX_NET_DEVICES=%s", devices) < 0)
		extra[1] = NULL;
	free(tls);
	free(devices);
	while (environ[n])
		n++;
	envp = calloc(n + 3, sizeof(*envp));
	if (!envp)
		return NULL;
	for (int i = 0; i < 2; i++) {
		if (extra[i])
			envp[k++] = extra[i];
	}
	for (size_t i = 0; i < n; i++)
		envp[k++] = environ[i];
	return envp;
}

static void free_env(char **envp, char *extra[2])
{
	free(extra[0]);
	free(extra[1]);
	free(envp);
}

/* ---- Entry point -------------------------------------------------------- */

/* The plugin moves data with UCP puts unless told to use active messages. */
static const char *ucx_test(const struct bench_plugin *plugin)
{
	char *transfer = option_value(plugin->options, "ucx.transfer");
	bool am = transfer && strcmp(transfer, "am") == 0;

	free(transfer);
	return am ? "ucp_am_bw" : "ucp_put_bw";
}

static void measure(const struct tool *tool, struct bench_plugin *plugin, char *out)
{
	const char *test = strcmp(tool->plugin, "ucx") == 0 ? ucx_test(plugin) : "";
	double runs[RUNS];
	char *extra[2];
	char **envp = tool_env(plugin, extra);
	int ok = 0;

	for (int i = 0; envp && i < RUNS; i++) {
		runs[ok] = measure_once(tool, test, envp, out);
		ok += runs[ok] > 0;
	}
	snprintf(plugin->yardstick, sizeof(plugin->yardstick), "%s%s%s%s%s%s%s", tool->what,
	         test[0] ? ", " : "", test, extra[0] ? ", " : "", extra[0] ? extra[0] : "",
	         extra[1] ? ", " : "", extra[1] ? extra[1] : "");
	free_env(envp, extra);
	if (ok == 0) {
		fprintf(stderr, "lmt-bench: --yardsticks: %s for %s gave no figure\n",
		        tool->program, plugin->label);
		plugin->yardstick[0] = '\0';
		return;
	}
	plugin->yardstick_gbps = bench_median(runs, (size_t)ok);
}

void bench_yardsticks(struct bench_plugin *plugins, size_t nplugins)
{
	char *out = malloc(OUTPUT_MAX);

	for (size_t i = 0; out && i < nplugins; i++) {
		const struct tool *tool = NULL;

		for (size_t t = 0; t < NTOOLS; t++) {
			if (strcmp(tools[t].plugin, plugins[i].name) == 0 &&
			    (!tools[t].applies || tools[t].applies(&plugins[i])))
				tool = &tools[t];
		}
		if (!tool || plugins[i].unavailable)
			continue;
		if (!bench_on_path(tool->program)) {
			fprintf(stderr,
			        "lmt-bench: --yardsticks: %s is not on PATH; no yardstick "
			        "for %s\n",
			        tool->program, plugins[i].label);
			continue;
		}
		measure(tool, &plugins[i], out);
	}
	free(out);
}

/* ---- memcpy ------------------------------------------------------------- */

static int compare_doubles(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

double bench_median(double *values, size_t n)
{
	qsort(values, n, sizeof(*values), compare_doubles);
	return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

void bench_advise_thp(void *addr, uint64_t len, bool thp)
{
	/* Advice only: a kernel without THP, or with it set to "never", keeps
	 * 4 KiB pages, and the run goes on. */
	if (thp)
		(void)madvise(addr, len, MADV_HUGEPAGE);
}

double bench_memcpy_gibps(uint64_t bytes, bool thp)
{
	uint8_t *src =
	        mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	uint8_t *dst =
	        mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	double gibps[3] = {0};

	if (src != MAP_FAILED && dst != MAP_FAILED) {
		bench_advise_thp(src, bytes, thp);
		bench_advise_thp(dst, bytes, thp);
		/* Touch both first: the yardstick is the copy, not page faults. */
		memset(src, 0x5a, bytes);
		memset(dst, 0, bytes);
		for (int i = 0; i < 3; i++) {
			uint64_t start = guest_now_ns(), ns;

			memcpy(dst, src, bytes);
			__asm__ volatile("" : : "r"(dst) : "memory");
			ns = guest_now_ns() - start;
			gibps[i] = (double)bytes / (double)(ns ? ns : 1) * 1e9 / 1073741824.0;
		}
	}
	if (src != MAP_FAILED)
		munmap(src, bytes);
	if (dst != MAP_FAILED)
		munmap(dst, bytes);
	return bench_median(gibps, 3);
}
