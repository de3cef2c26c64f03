/* lmt-plugin-check: open/close cycles, and unloading, which must leave no
 * descriptor or thread behind. */
#define _GNU_SOURCE
#include "plugin-check.h"

#include <fcntl.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- Open/close cycles ------------------------------------------------------ */

/* Cycles stop early, after a hundred at least, once the time budget is
 * spent: a leak shows in a hundred as well as in a thousand. */
struct cycles {
	unsigned planned;
	unsigned done;
	uint64_t start_ns;
	uint64_t budget_ns;
};

static struct cycles cycles_plan(const struct ph_run *run, unsigned planned)
{
	return (struct cycles){
	        .planned = planned, .start_ns = ph_now(), .budget_ns = run->cfg->cycle_budget_ns};
}

static bool cycles_left(const struct cycles *c)
{
	if (c->done >= c->planned)
		return false;
	return c->done < 100 || ph_now() - c->start_ns < c->budget_ns;
}

static const char *cycles_text(const struct cycles *c, char *buf, size_t size)
{
	if (c->done == c->planned)
		snprintf(buf, size, "%u cycles", c->done);
	else
		snprintf(buf, size, "%u of %u cycles (%.0f s budget spent)", c->done, c->planned,
		         pc_seconds(c->budget_ns));
	return buf;
}

/* Threads a plugin joined in close may still be leaving /proc for a moment. */
static bool same_usage(struct ph_run *run, struct ph_census before, const struct cycles *c)
{
	struct ph_census after;
	if (ph_census_same(before, &after))
		return true;
	char text[96];
	return ph_fail(run, "after %s: %d file descriptors and %d threads (%d and %d before)",
	               cycles_text(c, text, sizeof(text)), after.fds, after.threads, before.fds,
	               before.threads);
}

static bool instance_cycle(struct ph_run *run)
{
	for (int role = 0; role < 2; role++) {
		struct ph_side side = {0};
		ph_host_init(&side.host, run->cfg, role ? "destination" : "source");
		bool ok =
		        ph_instance_open(run, &side, role ? LMT_ROLE_DESTINATION : LMT_ROLE_SOURCE,
		                         run->cfg->channels, run->cfg->op_timeout_ns);
		if (ok)
			run->cfg->plugin->ops.instance_close(side.inst);
		ph_host_fini(&side.host);
		if (!ok)
			return false;
	}
	return true;
}

void pc_check_instance_cycles(struct ph_run *run)
{
	if (!instance_cycle(run))
		return;
	struct ph_census before = ph_census_take();
	struct cycles c = cycles_plan(run, run->cfg->cycles);
	for (; cycles_left(&c); c.done++)
		if (!instance_cycle(run))
			return;
	char text[96];
	if (same_usage(run, before, &c))
		ph_note(run,
		        "%s of a source and a destination, %d fds and %d thread%s before "
		        "and after",
		        cycles_text(&c, text, sizeof(text)), before.fds, before.threads,
		        before.threads == 1 ? "" : "s");
}

static bool endpoint_cycle(struct ph_run *run, struct ph_pair *pair)
{
	bool ok = ph_pair_open_endpoints(run, pair);
	for (uint32_t c = 0; c < pair->channels; c++) {
		pair->plugin->ops.ep_close(pair->src.ep[c]);
		pair->plugin->ops.ep_close(pair->dst.ep[c]);
		pair->src.ep[c] = pair->dst.ep[c] = NULL;
	}
	return ok;
}

void pc_check_endpoint_cycles(struct ph_run *run)
{
	struct ph_pair pair;
	char text[96];
	if (ph_pair_open(run, &pair, run->cfg->op_timeout_ns) && endpoint_cycle(run, &pair)) {
		struct ph_census before = ph_census_take();
		struct cycles c = cycles_plan(run, run->cfg->cycles);
		bool ok = true;
		for (; ok && cycles_left(&c); c.done++)
			ok = endpoint_cycle(run, &pair);
		if (ok && same_usage(run, before, &c) && ph_pair_quiet(run, &pair))
			ph_note(run, "%s of %u unconnected endpoint%s per side",
			        cycles_text(&c, text, sizeof(text)), pair.channels,
			        pair.channels == 1 ? "" : "s");
	}
	ph_pair_close(&pair);
}

/* Endpoints opened on both sides and never connected, one closed by the
 * core, the destination's ep_connect cancelled (a destination that does not
 * wait is then connected to a source that never connects back); nothing
 * released but the instances. */
static bool half_open_cycle(struct ph_run *run)
{
	struct ph_pair pair;
	char d[640];
	bool ok = ph_pair_open(run, &pair, run->cfg->op_timeout_ns) &&
	          ph_pair_open_endpoints(run, &pair);
	if (ok) {
		uint32_t last = pair.channels - 1;
		pair.plugin->ops.ep_close(pair.src.ep[last]);
		pair.src.ep[last] = NULL;
		atomic_store(&pair.dst.host.cancelled, 1);
		int rc = pair.plugin->ops.ep_connect(pair.dst.ep[0], &pair.src.addr[0]);
		if (rc && rc != -LMT_ECANCELED)
			ok = ph_fail(run, "a cancelled destination's ep_connect: %s",
			             ph_describe(&pair.dst.host, rc, d, sizeof(d)));
	}
	ph_pair_close(&pair);
	return ok;
}

void pc_check_half_open_cycles(struct ph_run *run)
{
	if (!half_open_cycle(run))
		return;
	struct ph_census before = ph_census_take();
	struct cycles c = cycles_plan(run, run->cfg->cycles / 100 ? run->cfg->cycles / 100 : 1);
	for (; cycles_left(&c); c.done++)
		if (!half_open_cycle(run))
			return;
	char text[96];
	if (same_usage(run, before, &c))
		ph_note(run, "%s of endpoints never connected, closed by instance_close",
		        cycles_text(&c, text, sizeof(text)));
}

/* Connect, write, and tear down: in order on even cycles, with the source's
 * endpoints closed first or, every other time, the destination's; on odd
 * ones with 1 MiB of writes maybe in flight and nothing released but the
 * instances. */
static bool connected_cycle(struct ph_run *run, unsigned i)
{
	enum { PIECES = 8, PIECE = 128 * KIB };
	struct ph_pair pair;
	struct ph_region region = {0};
	struct ph_source source = {0};
	struct ph_tally tally = {0};
	bool orderly = i % 2 == 0;
	unsigned writes = orderly ? 1 : PIECES;
	size_t len = orderly ? PH_PAGE : PIECE;
	bool ok = ph_pair_ready(run, &pair) &&
	          ph_region_open(run, &pair, &region, (size_t)PIECES * PIECE) &&
	          ph_source_open(run, &pair, &source, (size_t)PIECES * PIECE, i) &&
	          ph_tally_init(run, &tally, writes);
	for (unsigned k = 0; k < writes && ok; k++)
		ok = ph_post(run, &pair, &tally, (i + k) % pair.channels, &source,
		             source.mem + k * len, &region, k * len, len);
	orderly = orderly || !ok;
	if (ok && orderly) {
		ok = ph_harvest_all(run, &pair, &tally) && ph_pair_stop_progress(run, &pair);
		struct ph_side *first = i % 4 == 2 ? &pair.dst : &pair.src;
		struct ph_side *second = i % 4 == 2 ? &pair.src : &pair.dst;
		for (uint32_t c = 0; c < pair.channels && ok; c++)
			pair.plugin->ops.ep_close(first->ep[c]);
		for (uint32_t c = 0; c < pair.channels && ok; c++)
			pair.plugin->ops.ep_close(second->ep[c]);
		ok = ok && ph_pair_quiet(run, &pair);
	}
	ph_pair_stop_progress(run, &pair);
	if (orderly) {
		ph_source_close(&pair, &source);
		ph_region_close(&pair, &region);
	}
	ph_pair_close(&pair);
	/* Odd cycles: instance_close released the rest; only memory is left. */
	source.mr = NULL;
	region.mr = NULL;
	region.rkey = NULL;
	ph_source_close(&pair, &source);
	ph_region_close(&pair, &region);
	ph_tally_fini(&tally);
	return ok;
}

void pc_check_connected_cycles(struct ph_run *run)
{
	if (!connected_cycle(run, 0))
		return;
	struct ph_census before = ph_census_take();
	struct cycles c = cycles_plan(run, run->cfg->cycles / 10 ? run->cfg->cycles / 10 : 1);
	for (; cycles_left(&c); c.done++)
		if (!connected_cycle(run, c.done))
			return;
	char text[96];
	if (same_usage(run, before, &c))
		ph_note(run,
		        "%s, every other one closed with 1 MiB of writes outstanding, the rest "
		        "endpoints first, either side first",
		        cycles_text(&c, text, sizeof(text)));
}

/* ---- Unloading -------------------------------------------------------------- */

int pc_unload_probe(const char *spec, const char *options, bool verbose)
{
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	struct ph_census before = ph_census_take();
	struct ph_config cfg = {.verbose = verbose};
	struct lmt_error err = {0};
	int rc = ph_load(&cfg, spec, options, &err);
	cfg.channels = 1;
	struct ph_run run = {.cfg = &cfg};
	if (rc)
		ph_fail(&run, "%s", err.message);
	else
		instance_cycle(&run);
	ph_unload(&cfg);
	if (!run.failed)
		same_usage(&run, before, &(struct cycles){.planned = 1, .done = 1});
	if (run.failed) {
		fprintf(stderr, "unload: %s\n", run.why);
		return 3;
	}
	return 0;
}

/* Run the probe in a fresh process, where nothing else holds the plugin
 * loaded, and collect what it says on stderr. */
void pc_check_unload(struct ph_run *run)
{
	int p[2];
	if (pipe2(p, O_CLOEXEC) != 0) {
		ph_fail(run, "pipe: %s", strerror(errno));
		return;
	}
	char *argv[] = {"lmt-plugin-check",
	                "--unload-probe",
	                "-o",
	                (char *)(run->cfg->option_text ? run->cfg->option_text : ""),
	                (char *)run->cfg->spec,
	                NULL};
	posix_spawn_file_actions_t actions;
	posix_spawn_file_actions_init(&actions);
	posix_spawn_file_actions_adddup2(&actions, p[1], STDERR_FILENO);
	pid_t pid;
	int rc = posix_spawn(&pid, "/proc/self/exe", &actions, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&actions);
	close(p[1]);
	static char said[65536];
	size_t have = 0;
	ssize_t n;
	while (rc == 0 && (n = read(p[0], said + have, sizeof(said) - 1 - have)) != 0)
		if (n > 0 && (have += (size_t)n) == sizeof(said) - 1)
			break;
		else if (n < 0 && errno != EINTR)
			break;
	close(p[0]);
	said[have] = 0;
	fputs(said, stderr);
	int status = 0;
	while (rc == 0 && waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	const char *line = strstr(said, "unload: ");
	const char *summary = strstr(said, "SUMMARY: ");
	if (rc)
		ph_fail(run, "cannot run /proc/self/exe: %s", strerror(rc));
	else if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
		ph_note(run, "loaded, used and unloaded in a fresh process, nothing left behind");
	else if (line)
		ph_fail(run, "%.*s", (int)strcspn(line + 8, "\n"), line + 8);
	else if (summary)
		ph_fail(run, "after unloading: %.*s%s", (int)strcspn(summary + 9, "\n"),
		        summary + 9,
		        strstr(said, "call_init") ? " (some by a library's constructor at "
		                                    "dlopen, never freed at dlclose)"
		                                  : "");
	else
		ph_fail(run, "the unload probe ended with %s %d",
		        WIFSIGNALED(status) ? "signal" : "status",
		        WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
}
