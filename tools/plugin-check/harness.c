/* lmt-plugin-check's harness: the host services lent to the plugin, a source and
 * a destination instance connected through the ABI, guarded regions, and the
 * bookkeeping of every write by cookie. */
#define _GNU_SOURCE
#include "plugin-check.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define GUARD PC_PAGE
#define GUARD_BYTE 0xa5
#define COOKIE_BASE 0xc0ffee0000000000ull /* cookies that need all 64 bits */
#define HARVEST_MAX 256u
#define PATIENCE_NS (60 * PC_SECOND) /* no progress for this long is a hang */

/* ---- Runs ---------------------------------------------------------------- */

bool pc_fail(struct pc_run *run, const char *fmt, ...)
{
	if (!run->failed) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(run->why, sizeof(run->why), fmt, ap);
		va_end(ap);
		run->failed = true;
	}
	return false;
}

void pc_note(struct pc_run *run, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(run->note, sizeof(run->note), fmt, ap);
	va_end(ap);
}

uint64_t pc_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * PC_SECOND + (uint64_t)ts.tv_nsec;
}

/* ---- Loading --------------------------------------------------------------- */

int pc_load(struct pc_config *cfg, const char *target, const char *options,
            lmt_plugin_handle **outer, lmt_plugin_handle **inner, struct lmt_error *err)
{
	int rc = lmt_plugin_open_spec(target, outer, inner, err);
	if (rc)
		return rc;
	cfg->target = target;
	cfg->path = lmt_plugin_path(*outer);
	cfg->plugin = lmt_plugin_descriptor(*outer);
	cfg->inner = *inner ? lmt_plugin_descriptor(*inner) : NULL;
	cfg->caps = cfg->inner ? cfg->inner->caps : cfg->plugin->caps;
	cfg->spec = cfg->inner ? target : cfg->path;
	return pc_options_load(&cfg->options, cfg, options, err);
}

/* ---- Host services ------------------------------------------------------- */

static void host_log(void *ctx, enum lmt_log_level level, const char *fmt, ...) LMT_PRINTF(3, 4);
static int host_error(void *ctx, int code, const char *fmt, ...) LMT_PRINTF(3, 4);

static void host_log(void *ctx, enum lmt_log_level level, const char *fmt, ...)
{
	static const char *const levels[] = {"error", "warn", "info", "debug"};
	struct pc_host *host = ctx;
	if (!host->cfg->verbose)
		return;
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	fprintf(stderr, "    [%s %s] %s\n", host->role,
	        (unsigned)level <= LMT_LOG_DEBUG ? levels[level] : "?", msg);
}

static int host_error(void *ctx, int code, const char *fmt, ...)
{
	struct pc_host *host = ctx;
	char msg[sizeof(host->last)];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	pthread_mutex_lock(&host->lock);
	host->errors++;
	if (code <= 0 || code >= LMT_ERRC_COUNT) {
		if (!host->misused) {
			host->misused = true;
			host->bad_code = code;
		}
		code = LMT_EIO;
	}
	host->last_code = code;
	memcpy(host->last, msg, sizeof(msg));
	pthread_mutex_unlock(&host->lock);
	if (host->cfg->verbose)
		fprintf(stderr, "    [%s error] %s: %s\n", host->role, lmt_err_name(-code), msg);
	return -code;
}

static uint64_t host_now(void *ctx)
{
	(void)ctx;
	return pc_now();
}

static int host_option(void *ctx, const char *name, struct lmt_option_value *out)
{
	struct pc_host *host = ctx;
	if (!name || !out)
		return -LMT_EINVAL;
	return pc_option_get(host->cfg->options, name, out);
}

static int host_cancelled(void *ctx)
{
	struct pc_host *host = ctx;
	return atomic_load(&host->cancelled);
}

static const struct lmt_plugin *host_inner(void *ctx)
{
	struct pc_host *host = ctx;
	return host->cfg->inner;
}

/* There is no control connection here to drop: count it and go on. */
static void host_inject(void *ctx, enum lmt_fault fault)
{
	struct pc_host *host = ctx;
	atomic_fetch_add(&host->injected, 1);
	if (host->cfg->verbose)
		fprintf(stderr, "    [%s] fault %d injected\n", host->role, (int)fault);
}

const struct lmt_host pc_host_services = {
        .abi_version = LMT_PLUGIN_ABI_VERSION,
        .struct_size = sizeof(struct lmt_host),
        .log = host_log,
        .error = host_error,
        .now_ns = host_now,
        .option = host_option,
        .cancelled = host_cancelled,
        .inner = host_inner,
        .inject = host_inject,
};

void pc_host_init(struct pc_host *host, const struct pc_config *cfg, const char *role)
{
	memset(host, 0, sizeof(*host));
	host->cfg = cfg;
	host->role = role;
	pthread_mutex_init(&host->lock, NULL);
}

void pc_host_fini(struct pc_host *host)
{
	pthread_mutex_destroy(&host->lock);
}

int pc_host_errors(struct pc_host *host)
{
	pthread_mutex_lock(&host->lock);
	int n = host->errors;
	pthread_mutex_unlock(&host->lock);
	return n;
}

const char *pc_describe(struct pc_host *host, int rc, char *buf, size_t size)
{
	pthread_mutex_lock(&host->lock);
	if (host->errors && host->last_code == -rc)
		snprintf(buf, size, "%s (%s)", lmt_err_name(rc), host->last);
	else
		snprintf(buf, size, "%s", lmt_err_name(rc));
	pthread_mutex_unlock(&host->lock);
	return buf;
}

bool pc_error_recorded(struct pc_run *run, struct pc_host *host, int before, int rc,
                       const char *what)
{
	pthread_mutex_lock(&host->lock);
	int errors = host->errors, code = host->last_code;
	bool misused = host->misused;
	int bad_code = host->bad_code;
	pthread_mutex_unlock(&host->lock);
	if (misused)
		return pc_fail(run,
		               "%s: host->error was given code %d, not a positive LMT_E* "
		               "value",
		               what, bad_code);
	if (errors == before)
		return pc_fail(run, "%s returned %s without a message through host->error", what,
		               lmt_err_name(rc));
	if (code != -rc)
		return pc_fail(run, "%s returned %s but recorded %s through host->error", what,
		               lmt_err_name(rc), lmt_err_name(-code));
	return true;
}

/* ---- Instances and endpoints --------------------------------------------- */

bool pc_instance_open(struct pc_run *run, struct pc_side *side, enum lmt_role role,
                      uint32_t channels, uint64_t timeout_ns)
{
	const struct lmt_plugin *plugin = run->cfg->plugin;
	struct lmt_instance_params params = {.struct_size = sizeof(params),
	                                     .role = role,
	                                     .channels = channels,
	                                     .timeout_ns = timeout_ns};
	snprintf(params.local_host, sizeof(params.local_host), "127.0.0.1");
	snprintf(params.peer_host, sizeof(params.peer_host), "127.0.0.1");
	side->inst = NULL;
	int rc = plugin->ops.instance_open(&pc_host_services, &side->host, &params, &side->inst);
	char d[640];
	if (rc) {
		side->inst = NULL;
		return pc_fail(run, "%s instance_open: %s", side->host.role,
		               pc_describe(&side->host, rc, d, sizeof(d)));
	}
	if (!side->inst)
		return pc_fail(run, "%s instance_open returned 0 without an instance",
		               side->host.role);
	return true;
}

bool pc_pair_open(struct pc_run *run, struct pc_pair *pair, uint64_t timeout_ns)
{
	memset(pair, 0, sizeof(*pair));
	pair->cfg = run->cfg;
	pair->plugin = run->cfg->plugin;
	pair->channels = run->cfg->channels;
	pc_host_init(&pair->src.host, run->cfg, "source");
	pc_host_init(&pair->dst.host, run->cfg, "destination");
	return pc_instance_open(run, &pair->src, LMT_ROLE_SOURCE, pair->channels, timeout_ns) &&
	       pc_instance_open(run, &pair->dst, LMT_ROLE_DESTINATION, pair->channels, timeout_ns);
}

static bool open_side(struct pc_run *run, struct pc_pair *pair, struct pc_side *side)
{
	char d[640];
	for (uint32_t c = 0; c < pair->channels; c++) {
		side->addr[c].len = 0;
		int rc = pair->plugin->ops.ep_open(side->inst, c, &side->ep[c], &side->addr[c]);
		if (rc) {
			side->ep[c] = NULL;
			return pc_fail(run, "%s ep_open channel %u: %s", side->host.role, c,
			               pc_describe(&side->host, rc, d, sizeof(d)));
		}
		if (!side->ep[c])
			return pc_fail(run, "%s ep_open channel %u returned no endpoint",
			               side->host.role, c);
		if (side->addr[c].len == 0 || side->addr[c].len > LMT_BLOB_MAX)
			return pc_fail(run,
			               "%s ep_open channel %u: an address blob of %u bytes, "
			               "expected 1 to %u",
			               side->host.role, c, side->addr[c].len, LMT_BLOB_MAX);
	}
	return true;
}

bool pc_pair_open_endpoints(struct pc_run *run, struct pc_pair *pair)
{
	/* The source opens and sends its blobs first, then the destination. */
	return open_side(run, pair, &pair->src) && open_side(run, pair, &pair->dst);
}

struct connector {
	struct pc_pair *pair;
	uint32_t channel;
	int rc;
};

static void *connect_destination(void *arg)
{
	struct connector *k = arg;
	struct pc_pair *pair = k->pair;
	for (k->channel = 0; k->channel < pair->channels; k->channel++) {
		k->rc = pair->plugin->ops.ep_connect(pair->dst.ep[k->channel],
		                                     &pair->src.addr[k->channel]);
		if (k->rc)
			break;
	}
	return NULL;
}

bool pc_pair_connect(struct pc_run *run, struct pc_pair *pair)
{
	struct connector k = {.pair = pair};
	pthread_t thread;
	if (pthread_create(&thread, NULL, connect_destination, &k))
		return pc_fail(run, "cannot start a thread: %s", strerror(errno));
	char d[640];
	int rc = 0;
	uint32_t c = 0;
	for (; c < pair->channels && !rc; c++)
		rc = pair->plugin->ops.ep_connect(pair->src.ep[c], &pair->dst.addr[c]);
	if (rc) {
		pc_fail(run, "source ep_connect channel %u: %s", c - 1,
		        pc_describe(&pair->src.host, rc, d, sizeof(d)));
		/* The destination may wait for a source that will not come. */
		atomic_store(&pair->dst.host.cancelled, 1);
	}
	pthread_join(thread, NULL);
	atomic_store(&pair->dst.host.cancelled, 0);
	if (k.rc && !rc)
		return pc_fail(run, "destination ep_connect channel %u: %s", k.channel,
		               pc_describe(&pair->dst.host, k.rc, d, sizeof(d)));
	return !rc;
}

static void *progress_destination(void *arg)
{
	struct pc_pair *pair = arg;
	bool target = pair->cfg->caps & LMT_CAP_TARGET_PROGRESS;
	struct lmt_completion c[16];
	/* As the core does it: a tight loop for plugins that need it, an
	 * occasional poll for the others. */
	while (!atomic_load(&pair->stop)) {
		int n = pair->plugin->ops.progress(pair->dst.inst, c, 16,
		                                   target ? PC_SECOND / 1000 : 0);
		if (n < 0) {
			pair->progress_rc = n;
			break;
		}
		pair->progress_bogus += (uint64_t)n;
		if (!target)
			usleep(10000);
	}
	return NULL;
}

void pc_pair_start_progress(struct pc_pair *pair)
{
	atomic_store(&pair->stop, false);
	pair->progress_rc = 0;
	pair->progressing = pthread_create(&pair->progress, NULL, progress_destination, pair) == 0;
}

static void join_progress(struct pc_pair *pair)
{
	if (!pair->progressing)
		return;
	atomic_store(&pair->stop, true);
	pthread_join(pair->progress, NULL);
	pair->progressing = false;
}

bool pc_pair_stop_progress(struct pc_run *run, struct pc_pair *pair)
{
	join_progress(pair);
	char d[640];
	if (pair->progress_rc)
		return pc_fail(run, "destination progress: %s",
		               pc_describe(&pair->dst.host, pair->progress_rc, d, sizeof(d)));
	if (pair->progress_bogus)
		return pc_fail(run,
		               "destination progress reported %llu completions, but the "
		               "destination posts no writes",
		               (unsigned long long)pair->progress_bogus);
	return true;
}

bool pc_pair_ready(struct pc_run *run, struct pc_pair *pair)
{
	if (!pc_pair_open(run, pair, run->cfg->op_timeout_ns) ||
	    !pc_pair_open_endpoints(run, pair) || !pc_pair_connect(run, pair))
		return false;
	pc_pair_start_progress(pair);
	if (!pair->progressing)
		return pc_fail(run, "cannot start a thread: %s", strerror(errno));
	return true;
}

void pc_pair_close(struct pc_pair *pair)
{
	join_progress(pair);
	if (pair->src.inst)
		pair->plugin->ops.instance_close(pair->src.inst);
	if (pair->dst.inst)
		pair->plugin->ops.instance_close(pair->dst.inst);
	pair->src.inst = pair->dst.inst = NULL;
	pc_host_fini(&pair->src.host);
	pc_host_fini(&pair->dst.host);
}

static bool side_quiet(struct pc_run *run, struct pc_side *side)
{
	pthread_mutex_lock(&side->host.lock);
	int errors = side->host.errors;
	char last[sizeof(side->host.last)];
	memcpy(last, side->host.last, sizeof(last));
	int code = side->host.last_code;
	pthread_mutex_unlock(&side->host.lock);
	if (!errors)
		return true;
	return pc_fail(run,
	               "the %s recorded %d error%s while every call succeeded, the last "
	               "%s: %s",
	               side->host.role, errors, errors == 1 ? "" : "s", lmt_err_name(-code), last);
}

bool pc_pair_quiet(struct pc_run *run, struct pc_pair *pair)
{
	return side_quiet(run, &pair->src) && side_quiet(run, &pair->dst);
}

/* ---- Memory -------------------------------------------------------------- */

void pc_fill(uint8_t *mem, size_t len, uint64_t seed)
{
	uint64_t x = seed * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull;
	for (size_t i = 0; i < len; i += 8) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		memcpy(mem + i, &x, len - i < 8 ? len - i : 8);
	}
}

bool pc_same(struct pc_run *run, const char *what, const uint8_t *got, const uint8_t *want,
             size_t len, uint64_t base)
{
	if (memcmp(got, want, len) == 0)
		return true;
	size_t first = 0, differ = 0;
	for (size_t i = 0; i < len; i++) {
		if (got[i] != want[i] && differ++ == 0)
			first = i;
	}
	return pc_fail(run, "%s: %zu bytes differ at offset %llu", what, differ,
	               (unsigned long long)(base + first));
}

bool pc_region_open(struct pc_run *run, struct pc_pair *pair, struct pc_region *region, size_t len)
{
	memset(region, 0, sizeof(*region));
	region->map = mmap(NULL, len + 2 * GUARD, PROT_READ | PROT_WRITE,
	                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (region->map == MAP_FAILED) {
		region->map = NULL;
		return pc_fail(run, "mmap of %zu bytes: %s", len + 2 * GUARD, strerror(errno));
	}
	region->mem = region->map + GUARD;
	region->len = len;
	memset(region->map, GUARD_BYTE, GUARD);
	memset(region->mem + len, GUARD_BYTE, GUARD);

	char d[640];
	int rc = pair->plugin->ops.mr_register(pair->dst.inst, region->mem, len,
	                                       LMT_MR_REMOTE_WRITE, &region->mr, &region->key);
	if (rc) {
		region->mr = NULL;
		return pc_fail(run, "destination mr_register of %zu bytes: %s", len,
		               pc_describe(&pair->dst.host, rc, d, sizeof(d)));
	}
	if (region->key.len == 0 || region->key.len > LMT_BLOB_MAX)
		return pc_fail(run,
		               "destination mr_register of %zu bytes: a key blob of %u "
		               "bytes, expected 1 to %u",
		               len, region->key.len, LMT_BLOB_MAX);
	rc = pair->plugin->ops.rkey_import(pair->src.inst, &region->key, &region->rkey);
	if (rc) {
		region->rkey = NULL;
		return pc_fail(run, "source rkey_import of a %u-byte key: %s", region->key.len,
		               pc_describe(&pair->src.host, rc, d, sizeof(d)));
	}
	return true;
}

void pc_region_close(struct pc_pair *pair, struct pc_region *region)
{
	if (region->rkey && pair->src.inst)
		pair->plugin->ops.rkey_release(pair->src.inst, region->rkey);
	if (region->mr && pair->dst.inst)
		pair->plugin->ops.mr_deregister(pair->dst.inst, region->mr);
	if (region->map)
		munmap(region->map, region->len + 2 * GUARD);
	memset(region, 0, sizeof(*region));
}

bool pc_region_guards_intact(struct pc_run *run, const struct pc_region *region)
{
	for (size_t i = 0; i < GUARD; i++) {
		if (region->map[GUARD - 1 - i] != GUARD_BYTE)
			return pc_fail(run, "a byte %zu before a %zu-byte region was overwritten",
			               i + 1, region->len);
		if (region->mem[region->len + i] != GUARD_BYTE)
			return pc_fail(run,
			               "a byte %zu after the end of a %zu-byte region was "
			               "overwritten",
			               i, region->len);
	}
	return true;
}

bool pc_source_open(struct pc_run *run, struct pc_pair *pair, struct pc_source *source, size_t len,
                    uint64_t seed)
{
	memset(source, 0, sizeof(*source));
	source->mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (source->mem == MAP_FAILED) {
		source->mem = NULL;
		return pc_fail(run, "mmap of %zu bytes: %s", len, strerror(errno));
	}
	source->len = len;
	pc_fill(source->mem, len, seed);
	if (!(pair->cfg->caps & LMT_CAP_LOCAL_MR))
		return true;
	struct lmt_blob unused = {0};
	char d[640];
	int rc = pair->plugin->ops.mr_register(pair->src.inst, source->mem, len, LMT_MR_LOCAL_READ,
	                                       &source->mr, &unused);
	if (rc) {
		source->mr = NULL;
		return pc_fail(run, "source mr_register of %zu bytes: %s", len,
		               pc_describe(&pair->src.host, rc, d, sizeof(d)));
	}
	return true;
}

void pc_source_close(struct pc_pair *pair, struct pc_source *source)
{
	if (source->mr && pair->src.inst)
		pair->plugin->ops.mr_deregister(pair->src.inst, source->mr);
	if (source->mem)
		munmap(source->mem, source->len);
	memset(source, 0, sizeof(*source));
}

/* ---- Writes and completions ---------------------------------------------- */

bool pc_tally_init(struct pc_run *run, struct pc_tally *tally, uint64_t cap)
{
	memset(tally, 0, sizeof(*tally));
	tally->writes = calloc(cap, sizeof(*tally->writes));
	if (!tally->writes)
		return pc_fail(run, "out of memory");
	tally->cap = cap;
	tally->check_visible = true;
	return true;
}

void pc_tally_fini(struct pc_tally *tally)
{
	free(tally->writes);
	memset(tally, 0, sizeof(*tally));
}

int pc_post_once(struct pc_run *run, struct pc_pair *pair, struct pc_tally *tally, uint32_t channel,
                 struct pc_source *source, const uint8_t *local, struct pc_region *region,
                 uint64_t offset, size_t len)
{
	if (tally->posted == tally->cap) {
		pc_fail(run, "internal: more writes than planned");
		return -1;
	}
	int before = pc_host_errors(&pair->src.host);
	int rc = pair->plugin->ops.write(pair->src.ep[channel], local, len,
	                                 source ? source->mr : NULL, region->rkey, offset,
	                                 COOKIE_BASE + tally->posted);
	if (rc == 0) {
		tally->writes[tally->posted++] = (struct pc_write){
		        .local = local, .region = region, .offset = offset, .len = len};
		return 0;
	}
	char d[640];
	if (rc == -LMT_EAGAIN) {
		tally->eagain++;
		if (pc_host_errors(&pair->src.host) == before)
			return -LMT_EAGAIN;
		pc_fail(run, "write answered LMT_EAGAIN and recorded an error: %s",
		        pc_describe(&pair->src.host, rc, d, sizeof(d)));
		return -1;
	}
	pc_fail(run, "write of %zu bytes at offset %llu of a %zu-byte region, channel %u: %s", len,
	        (unsigned long long)offset, region->len, channel,
	        pc_describe(&pair->src.host, rc, d, sizeof(d)));
	return -1;
}

bool pc_post(struct pc_run *run, struct pc_pair *pair, struct pc_tally *tally, uint32_t channel,
             struct pc_source *source, const uint8_t *local, struct pc_region *region,
             uint64_t offset, size_t len)
{
	uint64_t deadline = pc_now() + PATIENCE_NS;
	for (;;) {
		int rc =
		        pc_post_once(run, pair, tally, channel, source, local, region, offset, len);
		if (rc != -LMT_EAGAIN)
			return rc == 0;
		if (pc_harvest(run, pair, tally, HARVEST_MAX, PC_SECOND / 100) < 0)
			return false;
		if (pc_now() > deadline)
			return pc_fail(run,
			               "write answered LMT_EAGAIN for %llu s while progress "
			               "harvested what it had (%llu of %llu writes completed)",
			               PATIENCE_NS / PC_SECOND, (unsigned long long)tally->done,
			               (unsigned long long)tally->posted);
	}
}

static bool account(struct pc_run *run, struct pc_pair *pair, struct pc_tally *tally,
                    const struct lmt_completion *c)
{
	uint64_t index = c->cookie - COOKIE_BASE;
	if (c->cookie < COOKIE_BASE || index >= tally->posted)
		return pc_fail(run,
		               "progress reported cookie 0x%llx, which was never posted "
		               "(%llu posted)",
		               (unsigned long long)c->cookie, (unsigned long long)tally->posted);
	struct pc_write *w = &tally->writes[index];
	if (w->seen)
		return pc_fail(run, "write %llu (cookie 0x%llx) completed twice",
		               (unsigned long long)index, (unsigned long long)c->cookie);
	w->seen = 1;
	tally->done++;
	char d[640];
	if (c->status)
		return pc_fail(run, "write %llu (%zu bytes at offset %llu) completed with %s",
		               (unsigned long long)index, w->len, (unsigned long long)w->offset,
		               pc_describe(&pair->src.host, c->status, d, sizeof(d)));
	if (c->channel >= pair->channels)
		return pc_fail(run, "write %llu completed on channel %u of %u",
		               (unsigned long long)index, c->channel, pair->channels);
	if (!tally->check_visible)
		return true;
	char what[96];
	snprintf(what, sizeof(what), "write %llu was complete before it was visible",
	         (unsigned long long)index);
	return pc_same(run, what, w->region->mem + w->offset, w->local, w->len, w->offset);
}

int pc_harvest(struct pc_run *run, struct pc_pair *pair, struct pc_tally *tally, uint32_t max,
               uint64_t timeout_ns)
{
	struct lmt_completion c[HARVEST_MAX];
	if (max > HARVEST_MAX)
		max = HARVEST_MAX;
	/* A canary past `max` catches a plugin that stores more. */
	memset(c, 0xee, sizeof(c));
	char d[640];
	int n = pair->plugin->ops.progress(pair->src.inst, c, max, timeout_ns);
	if (n < 0) {
		pc_fail(run, "source progress: %s", pc_describe(&pair->src.host, n, d, sizeof(d)));
		return -1;
	}
	if ((uint32_t)n > max || (max < HARVEST_MAX && c[max].cookie != 0xeeeeeeeeeeeeeeeeull)) {
		pc_fail(run, "progress(max %u) stored %s completions", max,
		        (uint32_t)n > max ? "more" : "past max");
		return -1;
	}
	for (int i = 0; i < n; i++)
		if (!account(run, pair, tally, &c[i]))
			return -1;
	return n;
}

bool pc_harvest_all(struct pc_run *run, struct pc_pair *pair, struct pc_tally *tally)
{
	uint64_t deadline = pc_now() + PATIENCE_NS;
	while (tally->done < tally->posted) {
		if (pc_harvest(run, pair, tally, HARVEST_MAX, PC_SECOND / 10) < 0)
			return false;
		if (pc_now() > deadline)
			return pc_fail(run, "%llu of %llu writes never completed (waited %llu s)",
			               (unsigned long long)(tally->posted - tally->done),
			               (unsigned long long)tally->posted, PATIENCE_NS / PC_SECOND);
	}
	return true;
}
