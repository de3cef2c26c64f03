/* lmt-plugin-check: loads a transport plugin and checks, through the plugin ABI
 * alone, that it keeps the contract of docs/abi.md. One line per check. */
#define _GNU_SOURCE
#include "plugin-check.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define DEFAULT_CYCLES 1000u
#define DEFAULT_CYCLE_TIME_S 60u
#define DEFAULT_LIMIT_S 300u
#define MAX_FILTERS 32

struct args {
	const char *target;
	char *options; /* the -o values joined with ',' */
	uint32_t channels;
	unsigned cycles;
	unsigned cycle_time_s;
	unsigned limit_s;
	const char *filters[MAX_FILTERS];
	int nfilters;
	const char *expected_failure; /* a check known to fail here, or NULL */
	bool fork;
	bool verbose;
	bool unload_probe; /* internal: the "unload" check's fresh process */
};

/* The plugin under test (and the one it wraps), loaded until exit and
 * reachable for LeakSanitizer until then: unloading is the "unload" check's
 * job, in a process of its own, so that what a transport library leaves
 * behind is reported there and not as this run's leak. */
static struct ph_config under_test;

struct outcome {
	bool passed;
	char text[1400];
};

static void usage(FILE *f)
{
	fprintf(f,
	        "usage: lmt-plugin-check [options] NAME|PATH|DECORATOR:NAME\n"
	        "\n"
	        "Loads the lmt transport plugin NAME (found as lmt finds plugins:\n"
	        "LMT_PLUGIN_PATH, then the plugin directory) or the file PATH, and checks\n"
	        "through the plugin ABI alone that it keeps the contract of docs/abi.md:\n"
	        "version negotiation, options, endpoints, registration, writes of many\n"
	        "sizes, completions, flush, error paths and teardown without leaks. A\n"
	        "source and a destination instance run in this process; each check runs\n"
	        "in a child process of its own. Prints one line per check, PASS or FAIL,\n"
	        "then 'N passed, M failed'. A decorator is checked around the plugin it\n"
	        "wraps, as in 'chaos:tcp'.\n"
	        "\n"
	        "  -o, --options LIST   options for the plugin (and the core), key=value,...,\n"
	        "                       e.g. -o ucx.tls=tcp; may be given more than once\n"
	        "  -c, --channels N     endpoints per instance (default: 2 when the plugin has\n"
	        "                       LMT_CAP_MULTI_CHANNEL, else 1; at most %u)\n"
	        "      --cycles N       open/close cycles of the leak checks (default %u; the\n"
	        "                       connected cycles are a tenth of it)\n"
	        "      --cycle-time S   let a leak check stop after S seconds, once it has\n"
	        "                       done 100 cycles (default %u)\n"
	        "      --limit SECONDS  time allowed for one check (default %u)\n"
	        "      --check TEXT     run only the checks whose name contains TEXT; may be\n"
	        "                       given more than once\n"
	        "      --expect-fail NAME=WHY\n"
	        "                       the check named NAME is known to fail with this\n"
	        "                       plugin, for the reason WHY: it still runs, and its\n"
	        "                       failure prints as XFAIL with WHY; its passing fails\n"
	        "                       the run (XPASS), so that the mark is dropped\n"
	        "      --list           list the checks and exit\n"
	        "      --no-fork        run the checks in this process (for a debugger); a\n"
	        "                       crash then ends the run\n"
	        "  -v, --verbose        show what the plugin logs and records as errors\n"
	        "  -h, --help           this help\n"
	        "\n"
	        "Exit status: 0 when every check passed, 1 when one failed, 2 for bad\n"
	        "arguments.\n",
	        PH_MAX_CHANNELS, DEFAULT_CYCLES, DEFAULT_CYCLE_TIME_S, DEFAULT_LIMIT_S);
}

static void bad_arg(const char *flag, const char *expected, const char *got)
{
	fprintf(stderr, "lmt-plugin-check: %s: expected %s, got '%s'\n", flag, expected, got);
	exit(2);
}

static unsigned arg_number(const char *flag, const char *text, unsigned min, unsigned max)
{
	char *end;
	errno = 0;
	unsigned long v = strtoul(text, &end, 10);
	if (errno || end == text || *end || text[0] == '-' || v < min || v > max) {
		char expected[64];
		snprintf(expected, sizeof(expected), "a number from %u to %u", min, max);
		bad_arg(flag, expected, text);
	}
	return (unsigned)v;
}

static void add_options(struct args *a, const char *text)
{
	size_t old = a->options ? strlen(a->options) + 1 : 0;
	char *joined = realloc(a->options, old + strlen(text) + 1);
	if (!joined) {
		fprintf(stderr, "lmt-plugin-check: out of memory\n");
		exit(1);
	}
	if (old)
		joined[old - 1] = ',';
	strcpy(joined + old, text);
	a->options = joined;
}

static bool selected(const struct args *a, const char *name)
{
	for (int i = 0; i < a->nfilters; i++)
		if (strstr(name, a->filters[i]))
			return true;
	return a->nfilters == 0;
}

static void parse_args(int argc, char **argv, struct args *a)
{
	enum {
		OPT_CYCLES = 256,
		OPT_CYCLE_TIME,
		OPT_LIMIT,
		OPT_CHECK,
		OPT_EXPECT_FAIL,
		OPT_LIST,
		OPT_NO_FORK,
		OPT_UNLOAD_PROBE
	};
	static const struct option longs[] = {
	        {"options", required_argument, NULL, 'o'},
	        {"channels", required_argument, NULL, 'c'},
	        {"cycles", required_argument, NULL, OPT_CYCLES},
	        {"cycle-time", required_argument, NULL, OPT_CYCLE_TIME},
	        {"limit", required_argument, NULL, OPT_LIMIT},
	        {"check", required_argument, NULL, OPT_CHECK},
	        {"expect-fail", required_argument, NULL, OPT_EXPECT_FAIL},
	        {"list", no_argument, NULL, OPT_LIST},
	        {"no-fork", no_argument, NULL, OPT_NO_FORK},
	        {"unload-probe", no_argument, NULL, OPT_UNLOAD_PROBE},
	        {"verbose", no_argument, NULL, 'v'},
	        {"help", no_argument, NULL, 'h'},
	        {NULL, 0, NULL, 0},
	};
	*a = (struct args){.cycles = DEFAULT_CYCLES,
	                   .cycle_time_s = DEFAULT_CYCLE_TIME_S,
	                   .limit_s = DEFAULT_LIMIT_S,
	                   .fork = true};
	int c;
	while ((c = getopt_long(argc, argv, "o:c:vh", longs, NULL)) != -1) {
		switch (c) {
		case 'o':
			add_options(a, optarg);
			break;
		case 'c':
			a->channels = arg_number("--channels", optarg, 1, PH_MAX_CHANNELS);
			break;
		case OPT_CYCLES:
			a->cycles = arg_number("--cycles", optarg, 1, 1000000);
			break;
		case OPT_CYCLE_TIME:
			a->cycle_time_s = arg_number("--cycle-time", optarg, 1, 86400);
			break;
		case OPT_LIMIT:
			a->limit_s = arg_number("--limit", optarg, 1, 86400);
			break;
		case OPT_CHECK:
			if (a->nfilters == MAX_FILTERS)
				bad_arg("--check", "fewer filters", optarg);
			a->filters[a->nfilters++] = optarg;
			break;
		case OPT_EXPECT_FAIL:
			if (!strchr(optarg, '=') || strchr(optarg, '=') == optarg ||
			    !strchr(optarg, '=')[1])
				bad_arg("--expect-fail", "NAME=WHY", optarg);
			a->expected_failure = optarg;
			break;
		case OPT_LIST:
			for (size_t i = 0; i < pc_check_count; i++)
				printf("%s\n", pc_checks[i].name);
			exit(0);
		case OPT_NO_FORK:
			a->fork = false;
			break;
		case OPT_UNLOAD_PROBE:
			a->unload_probe = true;
			break;
		case 'v':
			a->verbose = true;
			break;
		case 'h':
			usage(stdout);
			exit(0);
		default:
			usage(stderr);
			exit(2);
		}
	}
	if (optind != argc - 1) {
		usage(stderr);
		exit(2);
	}
	a->target = argv[optind];
	bool any = false;
	for (size_t i = 0; i < pc_check_count; i++)
		any = any || selected(a, pc_checks[i].name);
	if (!any)
		bad_arg("--check", "part of a check's name (see --list)", a->filters[0]);
}

/* ---- Running one check ----------------------------------------------------- */

static void report(const char *name, const struct outcome *o)
{
	printf("%s  %s%s%s\n", o->passed ? "PASS" : "FAIL", name, o->text[0] ? ": " : "", o->text);
	fflush(stdout);
}

static void run_inline(const struct ph_config *cfg, const struct pc_check *check,
                       struct outcome *out)
{
	struct ph_run run = {.cfg = cfg};
	check->fn(&run);
	out->passed = !run.failed;
	snprintf(out->text, sizeof(out->text), "%s", run.failed ? run.why : run.note);
}

/* In the child: run the check with stdout caught, since a plugin must never
 * print there, and send the outcome up the pipe. */
static void run_child(const struct ph_config *cfg, const struct pc_check *check, int fd)
{
	int caught = memfd_create("plugin-stdout", MFD_CLOEXEC);
	if (caught >= 0 && caught != STDOUT_FILENO) {
		dup2(caught, STDOUT_FILENO);
		close(caught);
	}
	struct ph_run run = {.cfg = cfg};
	check->fn(&run);
	fflush(stdout);
	off_t printed = caught >= 0 ? lseek(STDOUT_FILENO, 0, SEEK_END) : 0;
	if (printed > 0) {
		char first[81] = {0};
		ssize_t n = pread(STDOUT_FILENO, first, sizeof(first) - 1, 0);
		first[n > 0 ? n : 0] = 0;
		first[strcspn(first, "\n")] = 0;
		ph_fail(&run,
		        "the plugin printed %lld bytes to stdout, which a plugin never "
		        "does: \"%s\"",
		        (long long)printed, first);
	}
	char msg[sizeof(run.why) + 2];
	int len = snprintf(msg, sizeof(msg), "%c%s", run.failed ? 'F' : 'P',
	                   run.failed ? run.why : run.note);
	for (char *p = msg; len > 0;) {
		ssize_t n = write(fd, p, (size_t)len);
		if (n <= 0 && errno != EINTR)
			break;
		if (n > 0) {
			p += n;
			len -= (int)n;
		}
	}
	close(fd);
	exit(0); /* not _exit: LeakSanitizer, when built in, checks at exit */
}

/* Read the child's outcome until it closes the pipe or the limit passes. */
static size_t read_outcome(int fd, char *buf, size_t size, uint64_t limit_ns, bool *late)
{
	uint64_t deadline = ph_now() + limit_ns;
	size_t have = 0;
	*late = false;
	for (;;) {
		uint64_t now = ph_now();
		if (now >= deadline) {
			*late = true;
			return have;
		}
		struct pollfd p = {.fd = fd, .events = POLLIN};
		int ms = (int)((deadline - now) / 1000000u) + 1;
		if (poll(&p, 1, ms > 1000 ? 1000 : ms) <= 0)
			continue;
		ssize_t n = read(fd, buf + have, size - 1 - have);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0 || (have += (size_t)n) == size - 1)
			return have;
	}
}

static void run_forked(const struct ph_config *cfg, const struct pc_check *check, unsigned limit_s,
                       struct outcome *out)
{
	int p[2];
	if (pipe2(p, O_CLOEXEC) != 0) {
		*out = (struct outcome){.passed = false};
		snprintf(out->text, sizeof(out->text), "pipe: %s", strerror(errno));
		return;
	}
	fflush(stdout);
	fflush(stderr);
	pid_t pid = fork();
	if (pid == 0) {
		close(p[0]);
		run_child(cfg, check, p[1]);
	}
	close(p[1]);
	char buf[sizeof(out->text) + 1];
	bool late = false;
	size_t have =
	        pid > 0 ? read_outcome(p[0], buf, sizeof(buf), limit_s * PH_SECOND, &late) : 0;
	close(p[0]);
	buf[have] = 0;
	int status = 0;
	if (pid > 0) {
		if (late)
			kill(pid, SIGKILL);
		while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
			;
	}
	out->passed =
	        have > 0 && buf[0] == 'P' && !late && WIFEXITED(status) && WEXITSTATUS(status) == 0;
	const char *text = have > 0 ? buf + 1 : "";
	if (pid < 0)
		snprintf(out->text, sizeof(out->text), "fork: %s", strerror(errno));
	else if (late)
		snprintf(out->text, sizeof(out->text), "did not finish in %u s%s%.*s", limit_s,
		         have ? ": " : "", 1000, text);
	else if (have == 0 && WIFSIGNALED(status))
		snprintf(out->text, sizeof(out->text), "crashed: %s", strsignal(WTERMSIG(status)));
	else if (have == 0)
		snprintf(out->text, sizeof(out->text), "exited with status %d without a result",
		         WEXITSTATUS(status));
	else if (!out->passed && buf[0] == 'P')
		snprintf(out->text, sizeof(out->text),
		         "%.*s; then, at exit, %s %d (a sanitizer "
		         "report on stderr?)",
		         1000, text, WIFSIGNALED(status) ? "signal" : "status",
		         WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
	else
		snprintf(out->text, sizeof(out->text), "%s", text);
}

/* ---- Setup ------------------------------------------------------------------- */

/* The option values the plugin reads: defaults and LMT_* variables, writes
 * of up to 8M unless -o says otherwise, then -o. 0, or 2 for a bad -o. */
static int set_options(struct ph_config *cfg, const struct args *a)
{
	struct lmt_error err = {0};
	if (ph_options_set(cfg->options, a->options, &err) != 0) {
		fprintf(stderr, "lmt-plugin-check: -o: %s\n", err.message);
		return 2;
	}
	struct lmt_option_value v;
	cfg->chunk_size = 8u << 20;
	if (ph_option_get(cfg->options, "chunk-size", &v) == 0 && v.integer >= PH_PAGE)
		cfg->chunk_size = (uint64_t)v.integer;
	cfg->op_timeout_ns = 10 * PH_SECOND;
	if (ph_option_get(cfg->options, "connect-timeout", &v) == 0 && v.integer > 0)
		cfg->op_timeout_ns = (uint64_t)v.integer;
	return 0;
}

int main(int argc, char **argv)
{
	struct args a;
	parse_args(argc, argv, &a);
	if (a.unload_probe) {
		int rc = pc_unload_probe(a.target, a.options, a.verbose);
		free(a.options);
		return rc;
	}
	under_test = (struct ph_config){.option_text = a.options, .verbose = a.verbose};
	struct outcome load = {.passed = false};
	struct lmt_error err = {0};
	unsigned passed = 0, failed = 0;

	if (ph_load(&under_test, a.target, "chunk-size=8M", &err) != 0) {
		snprintf(load.text, sizeof(load.text), "%s", err.message);
	} else {
		if (set_options(&under_test, &a))
			return 2;
		under_test.cycles = a.cycles;
		under_test.cycle_budget_ns = a.cycle_time_s * PH_SECOND;
		load.passed = true;
		snprintf(load.text, sizeof(load.text), "%s%s%s", under_test.path,
		         under_test.inner ? " around " : "",
		         under_test.inner ? under_test.inner->name : "");
	}
	if (load.passed && (under_test.caps & LMT_CAP_STORAGE)) {
		fprintf(stderr,
		        "lmt-plugin-check: %s is a storage plugin (LMT_CAP_STORAGE): its peer is a "
		        "file the core lays out, not a process, so the transport contract does not "
		        "apply; save and restore through lmt (tests/integration/test_file.c)\n",
		        under_test.plugin->name);
		ph_options_free(under_test.options);
		free(a.options);
		return 2;
	}
	if (load.passed) {
		bool multi = under_test.caps & LMT_CAP_MULTI_CHANNEL;
		under_test.channels = a.channels ? a.channels : multi ? 2 : 1;
		if (under_test.channels > 1 && !multi) {
			fprintf(stderr,
			        "lmt-plugin-check: --channels: %s has no "
			        "LMT_CAP_MULTI_CHANNEL, so 1 channel only\n",
			        under_test.plugin->name);
			return 2;
		}
	}
	report("load", &load);
	load.passed ? passed++ : failed++;
	unsigned expected_failures = 0;
	size_t expected_len = a.expected_failure ? strcspn(a.expected_failure, "=") : 0;

	for (size_t i = 0; i < pc_check_count && load.passed; i++) {
		if (!selected(&a, pc_checks[i].name))
			continue;
		struct outcome o = {.passed = false};
		if (a.fork)
			run_forked(&under_test, &pc_checks[i], a.limit_s, &o);
		else
			run_inline(&under_test, &pc_checks[i], &o);
		if (expected_len && strlen(pc_checks[i].name) == expected_len &&
		    strncmp(pc_checks[i].name, a.expected_failure, expected_len) == 0) {
			const char *why = a.expected_failure + expected_len + 1;
			if (o.passed)
				printf("XPASS %s: passes now, though marked as failing (%s): drop "
				       "--expect-fail\n",
				       pc_checks[i].name, why);
			else
				printf("XFAIL %s: %s (known: %s)\n", pc_checks[i].name, o.text,
				       why);
			o.passed ? failed++ : expected_failures++;
			continue;
		}
		report(pc_checks[i].name, &o);
		o.passed ? passed++ : failed++;
	}
	if (expected_failures)
		printf("%u passed, %u failed, %u failing as known\n", passed, failed,
		       expected_failures);
	else
		printf("%u passed, %u failed\n", passed, failed);
	ph_options_free(under_test.options);
	under_test.options = NULL;
	free(a.options);
	return failed ? 1 : 0;
}
