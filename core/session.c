/* The session's lifecycle: creation with its plugin and options, RAM
 * blocks, the shared part of setup, and teardown. How it fails is
 * failure.c's. */
#define _GNU_SOURCE
#include "postcopy.h"
#include "session.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "error.h"
#include "file.h"
#include "net.h"

uint64_t lmt__now(void)
{
	return lmt__now_ns();
}

bool lmt__is_cancelled(const struct lmt_session *s)
{
	return atomic_load(&s->cancelled) != 0;
}

/* ---- creation ---- */

/* The plugin, or a decorator and the plugin it wraps. */
static int open_plugins(struct lmt_session *s, const char *spec, struct lmt_error *err)
{
	int rc = lmt_plugin_open_spec(spec, &s->plugin, &s->inner_plugin, err);
	if (rc)
		return rc;
	s->desc = lmt_plugin_descriptor(s->plugin);
	s->inner = s->inner_plugin ? lmt_plugin_descriptor(s->inner_plugin) : NULL;
	const struct lmt_plugin *transport = s->inner ? s->inner : s->desc;
	s->caps = transport->caps;
	s->wire_name = transport->name;
	return 0;
}

/* The core's schema and the plugins', then the environment, then `options`. */
static int load_options(struct lmt_session *s, const char *options, struct lmt_error *err)
{
	uint32_t ncore;
	const struct lmt_option_desc *core = lmt_core_options(&ncore);
	int rc = lmt__optset_new(&s->opts);
	if (rc)
		return lmt__error(err, rc, "out of memory creating a session");
	rc = lmt__optset_add_schema(s->opts, NULL, core, ncore, err);
	if (!rc)
		rc = lmt__optset_add_schema(s->opts, s->desc->name, s->desc->options,
		                            s->desc->option_count, err);
	if (!rc && s->inner)
		rc = lmt__optset_add_schema(s->opts, s->inner->name, s->inner->options,
		                            s->inner->option_count, err);
	if (!rc)
		rc = lmt__optset_load_env(s->opts, err);
	if (!rc)
		rc = lmt__optset_parse(s->opts, options, err);
	return rc;
}

static int alloc_role(struct lmt_session *s, struct lmt_error *err)
{
	s->in = malloc(LMT_PROTO_MAX_PAYLOAD);
	int rc = s->in ? lmt__events_new(&s->events) : -LMT_ENOMEM;
	if (!rc && s->role == LMT_ROLE_SOURCE)
		rc = lmt__source_new(&s->source);
	else if (!rc)
		rc = lmt__destination_new(&s->destination);
	return rc ? lmt__error(err, rc, "out of memory creating a session") : 0;
}

int lmt_session_new(lmt_session **out, enum lmt_role role, const char *plugin, const char *options,
                    struct lmt_error *err)
{
	if (!out)
		return lmt__error(err, LMT_EINVAL, "session: no place for it (out is NULL)");
	*out = NULL;
	if (role != LMT_ROLE_SOURCE && role != LMT_ROLE_DESTINATION)
		return lmt__error(err, LMT_EINVAL, "role: expected source or destination, got %d",
		                  (int)role);
	struct lmt_session *s = calloc(1, sizeof(*s));
	if (!s)
		return lmt__error(err, LMT_ENOMEM, "out of memory creating a session");
	s->role = role;
	s->ctrl_fd = -1;
	s->stats.status = LMT_STATUS_NEW;
	pthread_mutex_init(&s->lock, NULL);
	pthread_mutex_init(&s->opts_lock, NULL);
	lmt__logger_init(&s->log);
	int rc = open_plugins(s, plugin, err);
	if (!rc)
		rc = load_options(s, options, err);
	if (!rc)
		rc = alloc_role(s, err);
	if (rc) {
		lmt_session_free(s);
		return rc;
	}
	*out = s;
	return 0;
}

/* ---- teardown ---- */

static void blocks_free(struct lmt_session *s)
{
	for (uint32_t i = 0; i < s->nblocks; i++) {
		struct lmt_block *b = &s->blocks[i];
		free(b->dirty);
		free(b->inflight);
		free(b->sync);
		free(b->rkeys);
		free(b->mrs);
		free(b->present);
		lmt__verify_free(b);
		lmt__handover_block_free(b);
	}
	free(s->blocks);
	s->blocks = NULL;
	s->nblocks = 0;
}

void lmt_session_free(lmt_session *s)
{
	if (!s)
		return;
	lmt_cancel(s);
	lmt__job_free(s);
	lmt__lazy_free(s);
	lmt__postcopy_free(s);
	lmt__file_free(s);
	lmt__transport_close(s);
	lmt__ctrl_close(s);
	free(s->file_path);
	lmt__source_free(s->source);
	lmt__destination_free(s->destination);
	blocks_free(s);
	free(s->passes);
	lmt__auth_key_free(&s->auth);
	lmt__tls_session_free(s);
	free(s->in);
	lmt__buf_free(&s->out);
	lmt__optset_free(s->opts);
	lmt__events_free(s->events);
	lmt_plugin_close(s->inner_plugin);
	lmt_plugin_close(s->plugin);
	lmt__logger_destroy(&s->log);
	pthread_mutex_destroy(&s->opts_lock);
	pthread_mutex_destroy(&s->lock);
	free(s);
}

void lmt_cancel(lmt_session *s)
{
	if (s)
		atomic_store(&s->cancelled, 1);
}

void lmt__call_enter(struct lmt_session *s)
{
	atomic_fetch_add(&s->in_call, 1);
}

void lmt__call_leave(struct lmt_session *s)
{
	atomic_fetch_sub(&s->in_call, 1);
}

uint64_t lmt_session_id(const lmt_session *s)
{
	return s ? s->log.id : 0;
}

int lmt_session_set_log_handler(lmt_session *s, lmt_log_fn fn, void *opaque)
{
	if (!s)
		return -LMT_EINVAL;
	lmt__logger_set(&s->log, fn, opaque);
	return 0;
}

/* ---- options ---- */

/* Whether each option may still change is tuning.c's to say
 * (lmt__option_settable), whether it comes alone or in a list. */
int lmt_session_set_options(lmt_session *s, const char *options)
{
	if (!s)
		return -LMT_EINVAL;
	if (!options)
		return lmt__usage(s, LMT_EINVAL, "options: NULL, expected \"key=value,...\"");
	struct lmt_error err = {0};
	pthread_mutex_lock(&s->opts_lock);
	int rc = lmt__optset_parse_allowed(s->opts, options, lmt__option_settable, s, &err);
	pthread_mutex_unlock(&s->opts_lock);
	return rc ? lmt__usage(s, rc, "%s", err.message) : 0;
}

int lmt_session_set_option(lmt_session *s, const char *name, const char *value)
{
	if (!s)
		return -LMT_EINVAL;
	if (!name || !value)
		return lmt__usage(s, LMT_EINVAL, "option %s: name and value required",
		                  name ? name : "(null)");
	struct lmt_error err = {0};
	struct lmt_option_value known;
	pthread_mutex_lock(&s->opts_lock);
	/* An unknown name gets lmt__optset_set's message, with its suggestion. */
	int rc = lmt__optset_get(s->opts, name, &known) == 0 ? lmt__option_settable(s, name, &err)
	                                                     : 0;
	if (!rc)
		rc = lmt__optset_set(s->opts, name, value, LMT_OPT_SRC_EXPLICIT, &err);
	pthread_mutex_unlock(&s->opts_lock);
	return rc ? lmt__usage(s, rc, "%s", err.message) : 0;
}

int lmt_session_get_option(lmt_session *s, const char *name, struct lmt_option_value *out)
{
	if (!s)
		return -LMT_EINVAL;
	if (!name || !out)
		return lmt__usage(s, LMT_EINVAL,
		                  "option %s: name and a place for the value required",
		                  name ? name : "(null)");
	pthread_mutex_lock(&s->opts_lock);
	int rc = lmt__optset_get(s->opts, name, out);
	pthread_mutex_unlock(&s->opts_lock);
	return rc ? lmt__usage(s, rc, "%s: unknown option", name) : 0;
}

/* ---- RAM blocks ---- */

static bool valid_block_name(const char *name)
{
	size_t n = name ? strlen(name) : 0;
	if (n == 0 || n > LMT_BLOCK_NAME_MAX)
		return false;
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)name[i] <= 0x20 || name[i] == 0x7f)
			return false;
	return true;
}

/* A block's memory must be real, whole pages, aligned, and must not run
 * past the end of the address space. */
static int check_range(struct lmt_session *s, const char *name, void *host, uint64_t length,
                       uint32_t page_size)
{
	uintptr_t start = (uintptr_t)host;
	if (!host)
		return lmt__usage(s, LMT_EINVAL, "block '%s': no memory given (host is NULL)",
		                  name);
	if (length == 0)
		return lmt__usage(s, LMT_EINVAL, "block '%s': length is 0", name);
	if (length % page_size)
		return lmt__usage(s, LMT_EINVAL,
		                  "block '%s': length %llu is not a multiple of the page size %u",
		                  name, (unsigned long long)length, page_size);
	if (start % page_size)
		return lmt__usage(s, LMT_EINVAL,
		                  "block '%s': host address %p is not aligned to the page size %u",
		                  name, host, page_size);
	if (length - 1 > UINTPTR_MAX - start)
		return lmt__usage(s, LMT_EINVAL,
		                  "block '%s': %p + %llu bytes wraps around the end of the address "
		                  "space",
		                  name, host, (unsigned long long)length);
	return 0;
}

static int check_block(struct lmt_session *s, const char *name, void *host, uint64_t length,
                       uint32_t page_size)
{
	if (!valid_block_name(name))
		return lmt__usage(
		        s, LMT_EINVAL,
		        "block name '%s': expected 1 to %u printable characters, no spaces",
		        name ? name : "(null)", LMT_BLOCK_NAME_MAX);
	if (page_size < 4096 || (page_size & (page_size - 1)))
		return lmt__usage(s, LMT_EINVAL,
		                  "block '%s': page size %u is not a power of two >= 4096", name,
		                  page_size);
	int rc = check_range(s, name, host, length, page_size);
	if (rc)
		return rc;
	if (s->nblocks == LMT_PROTO_MAX_BLOCKS)
		return lmt__usage(s, LMT_EOVERFLOW, "block '%s': at most %u blocks", name,
		                  LMT_PROTO_MAX_BLOCKS);
	for (uint32_t i = 0; i < s->nblocks; i++)
		if (strcmp(s->blocks[i].name, name) == 0)
			return lmt__usage(s, LMT_EINVAL, "block '%s': added twice", name);
	return 0;
}

int lmt_session_add_block(lmt_session *s, const char *name, void *host, uint64_t length,
                          uint32_t page_size)
{
	if (!s)
		return -LMT_EINVAL;
	const char *fixed = lmt__config_fixed(s);
	if (fixed)
		return lmt__usage(s, LMT_ESTATE, "block '%s': blocks are fixed %s",
		                  name ? name : "(null)", fixed);
	int rc = check_block(s, name, host, length, page_size);
	if (rc)
		return rc;
	struct lmt_block *nb = realloc(s->blocks, (s->nblocks + 1) * sizeof(*nb));
	if (!nb)
		return lmt__usage(s, LMT_ENOMEM, "out of memory adding block '%s'", name);
	s->blocks = nb;
	struct lmt_block *b = &nb[s->nblocks++];
	memset(b, 0, sizeof(*b));
	snprintf(b->name, sizeof(b->name), "%s", name);
	b->host = host;
	b->length = length;
	b->page_size = page_size;
	b->page_shift = (uint32_t)__builtin_ctz(page_size);
	b->npages = length >> b->page_shift;
	b->words = (b->npages + 63) / 64;
	b->fd = b->received_fd = -1;
	return 0;
}

/* ---- the shared part of setup ---- */

static int read_options(struct lmt_session *s)
{
	const struct lmt_optset *o = s->opts;
	pthread_mutex_lock(&s->opts_lock);
	s->channels = (uint32_t)lmt__opt_int(o, "channels");
	s->chunk_size = (uint64_t)lmt__opt_int(o, "chunk-size");
	s->pin_all = lmt__opt_bool(o, "pin-all");
	s->verify = lmt__opt_bool(o, "verify");
	s->postcopy_on = lmt__opt_bool(o, "postcopy");
	s->userfaultfd = lmt__opt_bool(o, "userfaultfd");
	s->postcopy_channel = s->postcopy_on && s->channels < LMT_MAX_CHANNELS &&
	                      (s->caps & LMT_CAP_MULTI_CHANNEL);
	if (s->postcopy_channel)
		s->channels++;
	s->connect_timeout_ns = (uint64_t)lmt__opt_int(o, "connect-timeout");
	s->idle_timeout_ns = (uint64_t)lmt__opt_int(o, "idle-timeout");
	struct lmt_error err = {0};
	lmt__auth_key_free(&s->auth);
	int rc = lmt__auth_key_load(lmt__opt_text(o, "auth-key"), lmt__opt_text(o, "auth-key-file"),
	                            &s->auth, &err);
	pthread_mutex_unlock(&s->opts_lock);
	return rc ? lmt__fail(s, rc, "%s", err.message) : 0;
}

/* One registration per window: chunk-size, or the whole block with pin-all. */
static int size_windows(struct lmt_session *s)
{
	uint64_t ram = 0;
	for (uint32_t i = 0; i < s->nblocks; i++) {
		struct lmt_block *b = &s->blocks[i];
		ram += b->length;
		b->window = s->pin_all ? b->length : s->chunk_size;
		if (b->window < b->page_size)
			b->window = b->page_size;
		b->nwindows = (b->length + b->window - 1) / b->window;
		b->mrs = calloc(b->nwindows, sizeof(*b->mrs));
		if (!b->mrs)
			return lmt__fail(s, LMT_ENOMEM, "out of memory for block '%s'", b->name);
	}
	pthread_mutex_lock(&s->lock);
	s->stats.ram_bytes = ram;
	s->stats.channels = s->channels;
	pthread_mutex_unlock(&s->lock);
	return 0;
}

int lmt__session_prepare(struct lmt_session *s)
{
	int rc = read_options(s);
	if (rc)
		return rc;
	if (s->postcopy_on && s->verify)
		return lmt__fail(s, LMT_EINVAL,
		                 "postcopy=on with verify=on: pages placed after the switch are "
		                 "not covered by the digests yet; choose one");
	for (uint32_t i = 0; s->postcopy_on && i < s->nblocks; i++)
		if (s->blocks[i].page_size > LMT_POSTCOPY_MAX_PAGE)
			return lmt__fail(s, LMT_ENOTSUP,
			                 "postcopy=on: block '%s' has pages of %u bytes; postcopy "
			                 "moves pages of up to %u bytes",
			                 s->blocks[i].name, s->blocks[i].page_size,
			                 LMT_POSTCOPY_MAX_PAGE);
	if (s->postcopy_on && s->file_path)
		return lmt__fail(s, LMT_EINVAL,
		                 "postcopy=on: a file: target has no destination to switch to");
	if (s->channels > 1 && !(s->caps & LMT_CAP_MULTI_CHANNEL))
		return lmt__fail(s, LMT_ENOTSUP, "channels=%u: plugin '%s' supports one channel",
		                 s->channels, s->wire_name);
	if (s->nblocks == 0)
		return lmt__fail(s, LMT_EINVAL, "no RAM blocks: add them before setup");
	if ((rc = lmt__tls_session_prepare(s)))
		return rc;
	rc = size_windows(s);
	return rc ? rc : lmt__verify_prepare(s);
}
