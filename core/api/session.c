/* The session's lifecycle (API room): creation with its plugin, options
 * and engine, the options a VMM sets and reads, and teardown, which frees
 * every engine and target. The state it creates is the session room's
 * (core/session/). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "api.h"
#include "control.h"
#include "engines.h"
#include "error.h"
#include "file.h"
#include "handover.h"
#include "lazy.h"
#include "net.h"
#include "postcopy.h"
#include "session.h"
#include "tls_session.h"
#include "transport.h"
#include "verify.h"

/* ---- creation ---- */

/* What the session room needs of the rooms above it: failure recording
 * (core/session/failure.c) of the control connection and the source
 * engine, lmt__job_owns of the jobs. */
static const struct lmt__upcalls upcalls = {
        .ctrl_failure = lmt__ctrl_failure,
        .ctrl_queued = lmt__ctrl_queued,
        .ctrl_settle = lmt__ctrl_settle,
        .ctrl_send_error = lmt__ctrl_send_error,
        .release_throttle = lmt__source_release_throttle,
        .job_owns = lmt__job_runs_elsewhere,
};

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
	s->up = &upcalls;
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
