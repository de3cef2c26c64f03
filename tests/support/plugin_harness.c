/* The plugin test harness (see plugin_harness.h): the host lent to a plugin,
 * a source and a destination instance connected through the ABI, guarded
 * regions, the bookkeeping of every write by cookie, and a census of the
 * process's descriptors and threads. */
#define _GNU_SOURCE
#include "plugin_harness.h"
#include "threads_live.h"

#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define GUARD PH_PAGE
#define GUARD_BYTE 0xa5
#define COOKIE_BASE 0xc0ffee0000000000ull /* cookies that need all 64 bits */
#define HARVEST_MAX 256u
#define PATIENCE_NS (60 * PH_SECOND) /* no progress for this long is a hang */
#define LOG_KEEP (256u * 1024u)      /* bytes of the plugin's log a host keeps */

/* ---- Runs ---------------------------------------------------------------- */

bool ph_fail(struct ph_run *run, const char *fmt, ...)
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

void ph_note(struct ph_run *run, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(run->note, sizeof(run->note), fmt, ap);
	va_end(ap);
}

uint64_t ph_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * PH_SECOND + (uint64_t)ts.tv_nsec;
}

/* ---- Loading --------------------------------------------------------------- */

/* Defaults for what lmt-plugin-check's arguments or a test may change. */
static int configure(struct ph_config *cfg, const char *options, struct lmt_error *err)
{
	cfg->caps = cfg->inner ? cfg->inner->caps : cfg->plugin->caps;
	cfg->channels = cfg->caps & LMT_CAP_MULTI_CHANNEL ? 2 : 1;
	cfg->op_timeout_ns = 10 * PH_SECOND;
	cfg->chunk_size = 8u << 20;
	return ph_options_load(&cfg->options, cfg, options, err);
}

int ph_load(struct ph_config *cfg, const char *target, const char *options, struct lmt_error *err)
{
	int rc = lmt_plugin_open_spec(target, &cfg->handle, &cfg->inner_handle, err);
	if (rc)
		return rc;
	cfg->target = target;
	cfg->path = lmt_plugin_path(cfg->handle);
	cfg->plugin = lmt_plugin_descriptor(cfg->handle);
	cfg->inner = cfg->inner_handle ? lmt_plugin_descriptor(cfg->inner_handle) : NULL;
	cfg->spec = cfg->inner ? target : cfg->path;
	return configure(cfg, options, err);
}

int ph_config_init(struct ph_config *cfg, const struct lmt_plugin *plugin, const char *options,
                   struct lmt_error *err)
{
	cfg->target = plugin->name;
	cfg->plugin = plugin;
	return configure(cfg, options, err);
}

void ph_unload(struct ph_config *cfg)
{
	ph_options_free(cfg->options);
	cfg->options = NULL;
	lmt_plugin_close(cfg->handle);
	lmt_plugin_close(cfg->inner_handle);
	cfg->handle = cfg->inner_handle = NULL;
}

/* ---- Host services ------------------------------------------------------- */

static void host_log(void *ctx, enum lmt_log_level level, const char *fmt, ...) LMT_PRINTF(3, 4);
static int host_error(void *ctx, int code, const char *fmt, ...) LMT_PRINTF(3, 4);

/* Append one line, dropping the oldest half of the log when it is full. */
static void keep_line(struct ph_host *host, const char *line)
{
	size_t len = strlen(line);
	if (len > LOG_KEEP / 2)
		len = LOG_KEEP / 2;
	if (!host->log && !(host->log = malloc(LOG_KEEP + 2)))
		return;
	if (host->log_len + len + 1 > LOG_KEEP) {
		size_t drop = host->log_len / 2;
		memmove(host->log, host->log + drop, host->log_len - drop);
		host->log_len -= drop;
	}
	memcpy(host->log + host->log_len, line, len);
	host->log_len += len;
	host->log[host->log_len++] = '\n';
	host->log[host->log_len] = 0;
}

static void host_log(void *ctx, enum lmt_log_level level, const char *fmt, ...)
{
	static const char *const levels[] = {"error", "warn", "info", "debug"};
	struct ph_host *host = ctx;
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	pthread_mutex_lock(&host->lock);
	keep_line(host, msg);
	pthread_mutex_unlock(&host->lock);
	if (host->cfg->verbose)
		fprintf(stderr, "    [%s %s] %s\n", host->role,
		        (unsigned)level <= LMT_LOG_DEBUG ? levels[level] : "?", msg);
}

static int host_error(void *ctx, int code, const char *fmt, ...)
{
	struct ph_host *host = ctx;
	char msg[sizeof(host->last)];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	pthread_mutex_lock(&host->lock);
	if (code <= 0 || code >= LMT_ERRC_COUNT) {
		if (!host->misused) {
			host->misused = true;
			host->bad_code = code;
		}
		code = LMT_EIO;
	}
	if (host->errors++ == 0) {
		host->first_code = code;
		memcpy(host->first, msg, sizeof(msg));
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
	return ph_now();
}

static int host_option(void *ctx, const char *name, struct lmt_option_value *out)
{
	struct ph_host *host = ctx;
	if (!name || !out)
		return -LMT_EINVAL;
	return ph_option_get(host->options ? host->options : host->cfg->options, name, out);
}

static int host_cancelled(void *ctx)
{
	struct ph_host *host = ctx;
	return atomic_load(&host->cancelled);
}

static const struct lmt_plugin *host_inner(void *ctx)
{
	struct ph_host *host = ctx;
	return host->cfg->inner;
}

/* There is no control connection here to drop: count it and go on. */
static void host_inject(void *ctx, enum lmt_fault fault)
{
	struct ph_host *host = ctx;
	atomic_fetch_add(&host->injected, 1);
	if (host->cfg->verbose)
		fprintf(stderr, "    [%s] fault %d injected\n", host->role, (int)fault);
}

const struct lmt_host ph_host_services = {
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

void ph_host_init(struct ph_host *host, const struct ph_config *cfg, const char *role)
{
	memset(host, 0, sizeof(*host));
	host->cfg = cfg;
	host->role = role;
	pthread_mutex_init(&host->lock, NULL);
}

void ph_host_fini(struct ph_host *host)
{
	pthread_mutex_destroy(&host->lock);
	ph_options_free(host->options);
	free(host->log);
	host->options = NULL;
	host->log = NULL;
}

int ph_host_set_options(struct ph_host *host, const char *list, struct lmt_error *err)
{
	if (!host->options && !(host->options = ph_options_copy(host->cfg->options))) {
		snprintf(err->message, sizeof(err->message), "out of memory");
		err->code = -LMT_ENOMEM;
		return -LMT_ENOMEM;
	}
	return ph_options_set(host->options, list, err);
}

int ph_host_errors(struct ph_host *host)
{
	pthread_mutex_lock(&host->lock);
	int n = host->errors;
	pthread_mutex_unlock(&host->lock);
	return n;
}

int ph_host_first_error(struct ph_host *host, char *buf, size_t size)
{
	pthread_mutex_lock(&host->lock);
	int code = host->errors ? host->first_code : 0;
	snprintf(buf, size, "%s", host->errors ? host->first : "");
	pthread_mutex_unlock(&host->lock);
	return code;
}

int ph_host_last_error(struct ph_host *host, char *buf, size_t size)
{
	pthread_mutex_lock(&host->lock);
	int code = host->errors ? host->last_code : 0;
	snprintf(buf, size, "%s", host->errors ? host->last : "");
	pthread_mutex_unlock(&host->lock);
	return code;
}

bool ph_host_logged(struct ph_host *host, const char *text)
{
	pthread_mutex_lock(&host->lock);
	bool found = host->log && strstr(host->log, text);
	pthread_mutex_unlock(&host->lock);
	return found;
}

size_t ph_host_log(struct ph_host *host, char *buf, size_t size)
{
	if (!size)
		return 0;
	pthread_mutex_lock(&host->lock);
	size_t n = host->log_len < size ? host->log_len : size - 1;
	if (n)
		memcpy(buf, host->log + host->log_len - n, n);
	buf[n] = 0;
	pthread_mutex_unlock(&host->lock);
	return n;
}

void ph_host_forget(struct ph_host *host)
{
	pthread_mutex_lock(&host->lock);
	host->errors = host->first_code = host->last_code = 0;
	host->first[0] = host->last[0] = 0;
	host->log_len = 0;
	if (host->log)
		host->log[0] = 0;
	pthread_mutex_unlock(&host->lock);
}

const char *ph_describe(struct ph_host *host, int rc, char *buf, size_t size)
{
	pthread_mutex_lock(&host->lock);
	if (host->errors && host->last_code == -rc)
		snprintf(buf, size, "%s (%s)", lmt_err_name(rc), host->last);
	else
		snprintf(buf, size, "%s", lmt_err_name(rc));
	pthread_mutex_unlock(&host->lock);
	return buf;
}

bool ph_error_recorded(struct ph_run *run, struct ph_host *host, int before, int rc,
                       const char *what)
{
	pthread_mutex_lock(&host->lock);
	int errors = host->errors, code = host->last_code;
	bool misused = host->misused;
	int bad_code = host->bad_code;
	pthread_mutex_unlock(&host->lock);
	if (misused)
		return ph_fail(run,
		               "%s: host->error was given code %d, not a positive LMT_E* "
		               "value",
		               what, bad_code);
	if (errors == before)
		return ph_fail(run, "%s returned %s without a message through host->error", what,
		               lmt_err_name(rc));
	if (code != -rc)
		return ph_fail(run, "%s returned %s but recorded %s through host->error", what,
		               lmt_err_name(rc), lmt_err_name(-code));
	return true;
}

/* ---- Instances and endpoints --------------------------------------------- */

bool ph_instance_open_at(struct ph_run *run, struct ph_side *side, enum lmt_role role,
                         uint32_t channels, uint64_t timeout_ns, const char *host)
{
	const struct lmt_plugin *plugin = run->cfg->plugin;
	struct lmt_instance_params params = {.struct_size = sizeof(params),
	                                     .role = role,
	                                     .channels = channels,
	                                     .timeout_ns = timeout_ns,
	                                     .channel_secret = side->channel_secret,
	                                     .channel_secret_len = side->channel_secret ? 32 : 0};
	snprintf(params.local_host, sizeof(params.local_host), "%s", host);
	snprintf(params.peer_host, sizeof(params.peer_host), "%s", host);
	side->inst = NULL;
	int rc = plugin->ops.instance_open(&ph_host_services, &side->host, &params, &side->inst);
	char d[640];
	if (rc) {
		side->inst = NULL;
		return ph_fail(run, "%s instance_open: %s", side->host.role,
		               ph_describe(&side->host, rc, d, sizeof(d)));
	}
	if (!side->inst)
		return ph_fail(run, "%s instance_open returned 0 without an instance",
		               side->host.role);
	return true;
}

bool ph_instance_open(struct ph_run *run, struct ph_side *side, enum lmt_role role,
                      uint32_t channels, uint64_t timeout_ns)
{
	return ph_instance_open_at(run, side, role, channels, timeout_ns, "127.0.0.1");
}

void ph_pair_init(struct ph_pair *pair, const struct ph_config *cfg)
{
	memset(pair, 0, sizeof(*pair));
	pair->cfg = cfg;
	pair->plugin = cfg->plugin;
	pair->channels = cfg->channels;
	ph_host_init(&pair->src.host, cfg, "source");
	ph_host_init(&pair->dst.host, cfg, "destination");
}

bool ph_pair_open_instances(struct ph_run *run, struct ph_pair *pair, uint64_t timeout_ns)
{
	return ph_instance_open(run, &pair->src, LMT_ROLE_SOURCE, pair->channels, timeout_ns) &&
	       ph_instance_open(run, &pair->dst, LMT_ROLE_DESTINATION, pair->channels, timeout_ns);
}

bool ph_pair_open(struct ph_run *run, struct ph_pair *pair, uint64_t timeout_ns)
{
	ph_pair_init(pair, run->cfg);
	return ph_pair_open_instances(run, pair, timeout_ns);
}

static bool open_side(struct ph_run *run, struct ph_pair *pair, struct ph_side *side)
{
	char d[640];
	for (uint32_t c = 0; c < pair->channels; c++) {
		side->addr[c].len = 0;
		int rc = pair->plugin->ops.ep_open(side->inst, c, &side->ep[c], &side->addr[c]);
		if (rc) {
			side->ep[c] = NULL;
			return ph_fail(run, "%s ep_open channel %u: %s", side->host.role, c,
			               ph_describe(&side->host, rc, d, sizeof(d)));
		}
		if (!side->ep[c])
			return ph_fail(run, "%s ep_open channel %u returned no endpoint",
			               side->host.role, c);
		if (side->addr[c].len == 0 || side->addr[c].len > LMT_BLOB_MAX)
			return ph_fail(run,
			               "%s ep_open channel %u: an address blob of %u bytes, "
			               "expected 1 to %u",
			               side->host.role, c, side->addr[c].len, LMT_BLOB_MAX);
	}
	return true;
}

bool ph_pair_open_endpoints(struct ph_run *run, struct ph_pair *pair)
{
	/* The source opens and sends its blobs first, then the destination. */
	return open_side(run, pair, &pair->src) && open_side(run, pair, &pair->dst);
}

struct connector {
	struct ph_pair *pair;
	uint32_t channel;
	int rc;
};

static void *connect_destination(void *arg)
{
	struct connector *k = arg;
	struct ph_pair *pair = k->pair;
	for (k->channel = 0; k->channel < pair->channels; k->channel++) {
		k->rc = pair->plugin->ops.ep_connect(pair->dst.ep[k->channel],
		                                     &pair->src.addr[k->channel]);
		if (k->rc)
			break;
	}
	return NULL;
}

bool ph_pair_connect(struct ph_run *run, struct ph_pair *pair)
{
	struct connector k = {.pair = pair};
	pthread_t thread;
	if (pthread_create(&thread, NULL, connect_destination, &k))
		return ph_fail(run, "cannot start a thread: %s", strerror(errno));
	char d[640];
	int rc = 0;
	uint32_t c = 0;
	for (; c < pair->channels && !rc; c++)
		rc = pair->plugin->ops.ep_connect(pair->src.ep[c], &pair->dst.addr[c]);
	if (rc) {
		ph_fail(run, "source ep_connect channel %u: %s", c - 1,
		        ph_describe(&pair->src.host, rc, d, sizeof(d)));
		/* The destination may wait for a source that will not come. */
		atomic_store(&pair->dst.host.cancelled, 1);
	}
	pthread_join(thread, NULL);
	atomic_store(&pair->dst.host.cancelled, 0);
	if (k.rc && !rc)
		return ph_fail(run, "destination ep_connect channel %u: %s", k.channel,
		               ph_describe(&pair->dst.host, k.rc, d, sizeof(d)));
	return !rc;
}

static void *progress_destination(void *arg)
{
	struct ph_pair *pair = arg;
	bool target = pair->cfg->caps & LMT_CAP_TARGET_PROGRESS;
	struct lmt_completion c[16];
	/* As the core does it: a tight loop for plugins that need it, an
	 * occasional poll for the others. */
	while (!atomic_load(&pair->stop)) {
		int n = pair->plugin->ops.progress(pair->dst.inst, c, 16,
		                                   target ? PH_SECOND / 1000 : 0);
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

void ph_pair_start_progress(struct ph_pair *pair)
{
	atomic_store(&pair->stop, false);
	pair->progress_rc = 0;
	pair->progressing = pthread_create(&pair->progress, NULL, progress_destination, pair) == 0;
}

static void join_progress(struct ph_pair *pair)
{
	if (!pair->progressing)
		return;
	atomic_store(&pair->stop, true);
	pthread_join(pair->progress, NULL);
	pair->progressing = false;
}

bool ph_pair_stop_progress(struct ph_run *run, struct ph_pair *pair)
{
	join_progress(pair);
	char d[640];
	if (pair->progress_rc)
		return ph_fail(run, "destination progress: %s",
		               ph_describe(&pair->dst.host, pair->progress_rc, d, sizeof(d)));
	if (pair->progress_bogus)
		return ph_fail(run,
		               "destination progress reported %llu completions, but the "
		               "destination posts no writes",
		               (unsigned long long)pair->progress_bogus);
	return true;
}

bool ph_pair_bring_up(struct ph_run *run, struct ph_pair *pair)
{
	if (!ph_pair_open_instances(run, pair, run->cfg->op_timeout_ns) ||
	    !ph_pair_open_endpoints(run, pair) || !ph_pair_connect(run, pair))
		return false;
	ph_pair_start_progress(pair);
	if (!pair->progressing)
		return ph_fail(run, "cannot start a thread: %s", strerror(errno));
	return true;
}

bool ph_pair_ready(struct ph_run *run, struct ph_pair *pair)
{
	ph_pair_init(pair, run->cfg);
	return ph_pair_bring_up(run, pair);
}

void ph_pair_close(struct ph_pair *pair)
{
	join_progress(pair);
	if (pair->src.inst)
		pair->plugin->ops.instance_close(pair->src.inst);
	if (pair->dst.inst)
		pair->plugin->ops.instance_close(pair->dst.inst);
	pair->src.inst = pair->dst.inst = NULL;
	ph_host_fini(&pair->src.host);
	ph_host_fini(&pair->dst.host);
}

static bool side_quiet(struct ph_run *run, struct ph_side *side)
{
	pthread_mutex_lock(&side->host.lock);
	int errors = side->host.errors;
	char last[sizeof(side->host.last)];
	memcpy(last, side->host.last, sizeof(last));
	int code = side->host.last_code;
	pthread_mutex_unlock(&side->host.lock);
	if (!errors)
		return true;
	return ph_fail(run,
	               "the %s recorded %d error%s while every call succeeded, the last "
	               "%s: %s",
	               side->host.role, errors, errors == 1 ? "" : "s", lmt_err_name(-code), last);
}

bool ph_pair_quiet(struct ph_run *run, struct ph_pair *pair)
{
	return side_quiet(run, &pair->src) && side_quiet(run, &pair->dst);
}

/* ---- Memory -------------------------------------------------------------- */

void ph_fill(uint8_t *mem, size_t len, uint64_t seed)
{
	uint64_t x = seed * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull;
	for (size_t i = 0; i < len; i += 8) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		memcpy(mem + i, &x, len - i < 8 ? len - i : 8);
	}
}

bool ph_same(struct ph_run *run, const char *what, const uint8_t *got, const uint8_t *want,
             size_t len, uint64_t base)
{
	if (memcmp(got, want, len) == 0)
		return true;
	size_t first = 0, differ = 0;
	for (size_t i = 0; i < len; i++) {
		if (got[i] != want[i] && differ++ == 0)
			first = i;
	}
	return ph_fail(run, "%s: %zu bytes differ at offset %llu", what, differ,
	               (unsigned long long)(base + first));
}

bool ph_all_zero(struct ph_run *run, const char *what, const uint8_t *mem, size_t len,
                 uint64_t base)
{
	for (size_t i = 0; i < len; i++)
		if (mem[i])
			return ph_fail(run, "%s: byte at offset %llu is 0x%02x, expected 0", what,
			               (unsigned long long)(base + i), mem[i]);
	return true;
}

bool ph_region_open(struct ph_run *run, struct ph_pair *pair, struct ph_region *region, size_t len)
{
	memset(region, 0, sizeof(*region));
	region->map = mmap(NULL, len + 2 * GUARD, PROT_READ | PROT_WRITE,
	                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (region->map == MAP_FAILED) {
		region->map = NULL;
		return ph_fail(run, "mmap of %zu bytes: %s", len + 2 * GUARD, strerror(errno));
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
		return ph_fail(run, "destination mr_register of %zu bytes: %s", len,
		               ph_describe(&pair->dst.host, rc, d, sizeof(d)));
	}
	if (region->key.len == 0 || region->key.len > LMT_BLOB_MAX)
		return ph_fail(run,
		               "destination mr_register of %zu bytes: a key blob of %u "
		               "bytes, expected 1 to %u",
		               len, region->key.len, LMT_BLOB_MAX);
	if (!pair->src.inst)
		return true;
	rc = pair->plugin->ops.rkey_import(pair->src.inst, &region->key, &region->rkey);
	if (rc) {
		region->rkey = NULL;
		return ph_fail(run, "source rkey_import of a %u-byte key: %s", region->key.len,
		               ph_describe(&pair->src.host, rc, d, sizeof(d)));
	}
	return true;
}

void ph_region_close(struct ph_pair *pair, struct ph_region *region)
{
	if (region->rkey && pair->src.inst)
		pair->plugin->ops.rkey_release(pair->src.inst, region->rkey);
	if (region->mr && pair->dst.inst)
		pair->plugin->ops.mr_deregister(pair->dst.inst, region->mr);
	if (region->map)
		munmap(region->map, region->len + 2 * GUARD);
	memset(region, 0, sizeof(*region));
}

bool ph_region_guards_intact(struct ph_run *run, const struct ph_region *region)
{
	for (size_t i = 0; i < GUARD; i++) {
		if (region->map[GUARD - 1 - i] != GUARD_BYTE)
			return ph_fail(run, "a byte %zu before a %zu-byte region was overwritten",
			               i + 1, region->len);
		if (region->mem[region->len + i] != GUARD_BYTE)
			return ph_fail(run,
			               "a byte %zu after the end of a %zu-byte region was "
			               "overwritten",
			               i, region->len);
	}
	return true;
}

bool ph_source_open(struct ph_run *run, struct ph_pair *pair, struct ph_source *source, size_t len,
                    uint64_t seed)
{
	memset(source, 0, sizeof(*source));
	source->mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (source->mem == MAP_FAILED) {
		source->mem = NULL;
		return ph_fail(run, "mmap of %zu bytes: %s", len, strerror(errno));
	}
	source->len = len;
	ph_fill(source->mem, len, seed);
	if (!(pair->cfg->caps & LMT_CAP_LOCAL_MR))
		return true;
	struct lmt_blob unused = {0};
	char d[640];
	int rc = pair->plugin->ops.mr_register(pair->src.inst, source->mem, len, LMT_MR_LOCAL_READ,
	                                       &source->mr, &unused);
	if (rc) {
		source->mr = NULL;
		return ph_fail(run, "source mr_register of %zu bytes: %s", len,
		               ph_describe(&pair->src.host, rc, d, sizeof(d)));
	}
	return true;
}

void ph_source_close(struct ph_pair *pair, struct ph_source *source)
{
	if (source->mr && pair->src.inst)
		pair->plugin->ops.mr_deregister(pair->src.inst, source->mr);
	if (source->mem)
		munmap(source->mem, source->len);
	memset(source, 0, sizeof(*source));
}

/* ---- Writes and completions ---------------------------------------------- */

bool ph_tally_init(struct ph_run *run, struct ph_tally *tally, uint64_t cap)
{
	memset(tally, 0, sizeof(*tally));
	tally->writes = calloc(cap, sizeof(*tally->writes));
	if (!tally->writes)
		return ph_fail(run, "out of memory");
	tally->cap = cap;
	tally->check_visible = true;
	return true;
}

void ph_tally_fini(struct ph_tally *tally)
{
	free(tally->writes);
	memset(tally, 0, sizeof(*tally));
}

int ph_post_once(struct ph_run *run, struct ph_pair *pair, struct ph_tally *tally, uint32_t channel,
                 struct ph_source *source, const uint8_t *local, struct ph_region *region,
                 uint64_t offset, size_t len)
{
	if (tally->posted == tally->cap) {
		ph_fail(run, "internal: more writes than planned");
		return -1;
	}
	int before = ph_host_errors(&pair->src.host);
	int rc = pair->plugin->ops.write(pair->src.ep[channel], local, len,
	                                 source ? source->mr : NULL, region->rkey, offset,
	                                 COOKIE_BASE + tally->posted);
	if (rc == 0) {
		tally->writes[tally->posted++] = (struct ph_write){
		        .local = local, .region = region, .offset = offset, .len = len};
		return 0;
	}
	char d[640];
	if (rc == -LMT_EAGAIN) {
		tally->eagain++;
		if (ph_host_errors(&pair->src.host) == before)
			return -LMT_EAGAIN;
		ph_fail(run, "write answered LMT_EAGAIN and recorded an error: %s",
		        ph_describe(&pair->src.host, rc, d, sizeof(d)));
		return -1;
	}
	if (tally->allow_failures)
		return rc;
	ph_fail(run, "write of %zu bytes at offset %llu of a %zu-byte region, channel %u: %s", len,
	        (unsigned long long)offset, region->len, channel,
	        ph_describe(&pair->src.host, rc, d, sizeof(d)));
	return -1;
}

bool ph_post(struct ph_run *run, struct ph_pair *pair, struct ph_tally *tally, uint32_t channel,
             struct ph_source *source, const uint8_t *local, struct ph_region *region,
             uint64_t offset, size_t len)
{
	uint64_t deadline = ph_now() + PATIENCE_NS;
	for (;;) {
		int rc =
		        ph_post_once(run, pair, tally, channel, source, local, region, offset, len);
		if (rc == 0)
			return true;
		char d[640];
		if (rc != -LMT_EAGAIN) /* failed already, unless failures are allowed */
			return ph_fail(run, "write of %zu bytes at offset %llu, channel %u: %s",
			               len, (unsigned long long)offset, channel,
			               ph_describe(&pair->src.host, rc, d, sizeof(d)));
		if (ph_harvest(run, pair, tally, HARVEST_MAX, PH_SECOND / 100) < 0)
			return false;
		if (ph_now() > deadline)
			return ph_fail(run,
			               "write answered LMT_EAGAIN for %llu s while progress "
			               "harvested what it had (%llu of %llu writes completed)",
			               PATIENCE_NS / PH_SECOND, (unsigned long long)tally->done,
			               (unsigned long long)tally->posted);
	}
}

static bool account(struct ph_run *run, struct ph_pair *pair, struct ph_tally *tally,
                    const struct lmt_completion *c)
{
	uint64_t index = c->cookie - COOKIE_BASE;
	if (c->cookie < COOKIE_BASE || index >= tally->posted)
		return ph_fail(run,
		               "progress reported cookie 0x%llx, which was never posted "
		               "(%llu posted)",
		               (unsigned long long)c->cookie, (unsigned long long)tally->posted);
	struct ph_write *w = &tally->writes[index];
	if (w->seen)
		return ph_fail(run, "write %llu (cookie 0x%llx) completed twice",
		               (unsigned long long)index, (unsigned long long)c->cookie);
	w->seen = 1;
	tally->done++;
	if (c->channel >= pair->channels)
		return ph_fail(run, "write %llu completed on channel %u of %u",
		               (unsigned long long)index, c->channel, pair->channels);
	char d[640];
	if (c->status && tally->allow_failures) {
		tally->failed++;
		return true;
	}
	if (c->status)
		return ph_fail(run, "write %llu (%zu bytes at offset %llu) completed with %s",
		               (unsigned long long)index, w->len, (unsigned long long)w->offset,
		               ph_describe(&pair->src.host, c->status, d, sizeof(d)));
	if (!tally->check_visible)
		return true;
	char what[96];
	snprintf(what, sizeof(what), "write %llu was complete before it was visible",
	         (unsigned long long)index);
	return ph_same(run, what, w->region->mem + w->offset, w->local, w->len, w->offset);
}

/* One progress call: the number harvested, or -1 after failing the run. A
 * progress error goes to *error instead when `error` is given. */
static int harvest(struct ph_run *run, struct ph_pair *pair, struct ph_tally *tally, uint32_t max,
                   uint64_t timeout_ns, int *error)
{
	struct lmt_completion c[HARVEST_MAX];
	if (max > HARVEST_MAX)
		max = HARVEST_MAX;
	/* A canary past `max` catches a plugin that stores more. */
	memset(c, 0xee, sizeof(c));
	char d[640];
	int n = pair->plugin->ops.progress(pair->src.inst, c, max, timeout_ns);
	if (n < 0 && error) {
		*error = n;
		return 0;
	}
	if (n < 0) {
		ph_fail(run, "source progress: %s", ph_describe(&pair->src.host, n, d, sizeof(d)));
		return -1;
	}
	if ((uint32_t)n > max || (max < HARVEST_MAX && c[max].cookie != 0xeeeeeeeeeeeeeeeeull)) {
		ph_fail(run, "progress(max %u) stored %s completions", max,
		        (uint32_t)n > max ? "more" : "past max");
		return -1;
	}
	for (int i = 0; i < n; i++)
		if (!account(run, pair, tally, &c[i]))
			return -1;
	return n;
}

int ph_harvest(struct ph_run *run, struct ph_pair *pair, struct ph_tally *tally, uint32_t max,
               uint64_t timeout_ns)
{
	return harvest(run, pair, tally, max, timeout_ns, NULL);
}

int ph_harvest_or_error(struct ph_run *run, struct ph_pair *pair, struct ph_tally *tally,
                        uint64_t timeout_ns, int *error)
{
	return harvest(run, pair, tally, HARVEST_MAX, timeout_ns, error);
}

int ph_harvest_until_error(struct ph_run *run, struct ph_pair *pair, struct ph_tally *tally,
                           uint64_t limit_ns)
{
	uint64_t deadline = ph_now() + limit_ns;
	int error = 0;
	while (!error) {
		if (harvest(run, pair, tally, HARVEST_MAX, PH_SECOND / 10, &error) < 0)
			return 0;
		if (!error && ph_now() > deadline) {
			ph_fail(run,
			        "progress reported no error in %.1f s (%llu of %llu writes "
			        "completed)",
			        (double)limit_ns / PH_SECOND, (unsigned long long)tally->done,
			        (unsigned long long)tally->posted);
			return 0;
		}
	}
	return error;
}

bool ph_harvest_all(struct ph_run *run, struct ph_pair *pair, struct ph_tally *tally)
{
	uint64_t deadline = ph_now() + PATIENCE_NS;
	while (tally->done < tally->posted) {
		if (ph_harvest(run, pair, tally, HARVEST_MAX, PH_SECOND / 10) < 0)
			return false;
		if (ph_now() > deadline)
			return ph_fail(run, "%llu of %llu writes never completed (waited %llu s)",
			               (unsigned long long)(tally->posted - tally->done),
			               (unsigned long long)tally->posted, PATIENCE_NS / PH_SECOND);
	}
	return true;
}

/* ---- Scenarios ----------------------------------------------------------- */

#define LOSS_WRITE (1u << 20)
#define LOSS_SLOTS 64u    /* writes in flight when the destination goes */
#define LOSS_WRITES 4000u /* at most, until the source notices */
#define LOSS_PATIENCE_NS (20 * PH_SECOND)

/* Post writes over the slots until one fails or progress reports an error. */
static void write_until_failure(struct ph_run *run, struct ph_pair *pair, struct ph_tally *tally,
                                struct ph_source *source, struct ph_region *region,
                                struct ph_loss *loss, int *error)
{
	uint64_t deadline = ph_now() + LOSS_PATIENCE_NS;
	while (!*error && !loss->write_rc && tally->posted < tally->cap) {
		if (ph_now() > deadline) {
			ph_fail(run,
			        "the source noticed nothing for %llu s after its destination "
			        "closed",
			        LOSS_PATIENCE_NS / PH_SECOND);
			return;
		}
		uint64_t at = tally->posted % LOSS_SLOTS * LOSS_WRITE;
		uint32_t channel = (uint32_t)(tally->posted % pair->channels);
		int rc = pair->plugin->ops.write(pair->src.ep[channel], source->mem + at,
		                                 LOSS_WRITE, source->mr, region->rkey, at,
		                                 COOKIE_BASE + tally->posted);
		if (rc == 0)
			tally->writes[tally->posted++] =
			        (struct ph_write){.local = source->mem + at,
			                          .region = region,
			                          .offset = at,
			                          .len = LOSS_WRITE};
		else if (rc != -LMT_EAGAIN)
			loss->write_rc = rc;
		if (harvest(run, pair, tally, HARVEST_MAX, rc ? PH_SECOND / 100 : 0, error) < 0)
			return;
	}
}

bool ph_lose_destination_mid_stream(struct ph_run *run, struct ph_pair *pair, struct ph_loss *loss)
{
	struct ph_region region = {0};
	struct ph_source source = {0};
	struct ph_tally tally = {0};
	*loss = (struct ph_loss){0};
	bool ok = ph_pair_bring_up(run, pair) &&
	          ph_region_open(run, pair, &region, (size_t)LOSS_SLOTS * LOSS_WRITE) &&
	          ph_source_open(run, pair, &source, region.len, 9) &&
	          ph_tally_init(run, &tally, LOSS_WRITES);
	tally.allow_failures = true;
	for (uint64_t i = 0; i < LOSS_SLOTS && ok; i++)
		ok = ph_post(run, pair, &tally, (uint32_t)(i % pair->channels), &source,
		             source.mem + i * LOSS_WRITE, &region, i * LOSS_WRITE, LOSS_WRITE);
	ok = ok && ph_pair_stop_progress(run, pair);
	int error = 0;
	if (ok) {
		pair->plugin->ops.instance_close(pair->dst.inst);
		pair->dst.inst = NULL;
		write_until_failure(run, pair, &tally, &source, &region, loss, &error);
		if (!error && !run->failed)
			error = ph_harvest_until_error(run, pair, &tally, LOSS_PATIENCE_NS);
		ok = error != 0;
	}
	char d[640];
	if (ok && tally.done != tally.posted)
		ok = ph_fail(run, "progress returned %s with %llu of %llu writes never reported",
		             ph_describe(&pair->src.host, error, d, sizeof(d)),
		             (unsigned long long)(tally.posted - tally.done),
		             (unsigned long long)tally.posted);
	int again = ok ? pair->plugin->ops.progress(pair->src.inst, NULL, 0, 0) : error;
	if (again != error)
		ok = ph_fail(run, "progress returned %s, then %s", lmt_err_name(error),
		             lmt_err_name(again));
	loss->progress_rc = error;
	loss->posted = tally.posted;
	loss->failed = tally.failed;
	loss->first_code =
	        ph_host_first_error(&pair->src.host, loss->first_error, sizeof(loss->first_error));
	ph_tally_fini(&tally);
	ph_source_close(pair, &source);
	ph_region_close(pair, &region);
	ph_pair_close(pair);
	return ok;
}

bool ph_orderly_close(struct ph_run *run, struct ph_pair *pair, enum lmt_role closing)
{
	const size_t len = 1u << 20;
	struct ph_region region = {0};
	struct ph_source source = {0};
	struct ph_tally tally = {0};
	char d[640];
	bool ok = ph_pair_bring_up(run, pair) && ph_region_open(run, pair, &region, len) &&
	          ph_source_open(run, pair, &source, len, 11) && ph_tally_init(run, &tally, 2) &&
	          ph_post(run, pair, &tally, 0, &source, source.mem, &region, 0, len / 2) &&
	          ph_post(run, pair, &tally, pair->channels - 1, &source, source.mem + len / 2,
	                  &region, len / 2, len / 2);
	int rc = ok ? pair->plugin->ops.flush(pair->src.inst, 10 * PH_SECOND) : 0;
	if (rc)
		ok = ph_fail(run, "flush: %s", ph_describe(&pair->src.host, rc, d, sizeof(d)));
	ok = ok && ph_harvest_all(run, pair, &tally) && ph_pair_stop_progress(run, pair);
	struct ph_side *closer = closing == LMT_ROLE_SOURCE ? &pair->src : &pair->dst;
	struct ph_side *other = closing == LMT_ROLE_SOURCE ? &pair->dst : &pair->src;
	if (ok) {
		for (uint32_t c = 0; c < pair->channels; c++) {
			pair->plugin->ops.ep_close(closer->ep[c]);
			closer->ep[c] = NULL;
		}
		usleep(200000); /* let the other side see the close */
		struct lmt_completion c[4];
		int n = pair->plugin->ops.progress(other->inst, c, 4, PH_SECOND / 10);
		if (n != 0)
			ok = ph_fail(run, "after the %s closed its endpoints, the %s's progress %s",
			             closer->host.role, other->host.role,
			             n > 0 ? "reported completions"
			                   : ph_describe(&other->host, n, d, sizeof(d)));
		ok = ok && ph_pair_quiet(run, pair);
	}
	ph_tally_fini(&tally);
	ph_source_close(pair, &source);
	ph_region_close(pair, &region);
	/* The side that closed first goes first. */
	if (closer->inst)
		pair->plugin->ops.instance_close(closer->inst);
	closer->inst = NULL;
	ph_pair_close(pair);
	return ok;
}

/* ---- Census --------------------------------------------------------------- */

static int count_entries(const char *dir)
{
	DIR *d = opendir(dir);
	if (!d)
		return -1;
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

struct ph_census ph_census_take(void)
{
	return (struct ph_census){count_entries("/proc/self/fd"), threads_live(0)};
}

bool ph_census_same(struct ph_census before, struct ph_census *after)
{
	*after = ph_census_take();
	return after->fds == before.fds && after->threads == before.threads;
}
