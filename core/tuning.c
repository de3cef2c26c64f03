/* Options once the migration has begun. A source keeps taking the two that
 * QEMU's migrate-set-parameters changes on the fly, downtime-limit and
 * max-bandwidth, from any thread; the engine reads them at the start of
 * each lmt_save_iterate call (source.c). Every other option shaped setup
 * (or must match the peer's) and is refused with its name. */
#include <string.h>

#include "error.h"
#include "session.h"

static const char *const runtime_options[] = {"downtime-limit", "max-bandwidth"};

static bool is_runtime(const char *name)
{
	for (size_t i = 0; i < sizeof(runtime_options) / sizeof(runtime_options[0]); i++)
		if (strcmp(name, runtime_options[i]) == 0)
			return true;
	return false;
}

bool lmt__options_running(struct lmt_session *s)
{
	int st = atomic_load(&s->state);
	if (s->job)
		return true; /* lmt_save_start or lmt_load_start: setup is lmt's */
	return st != LMT_STATE_NEW &&
	       !(st == LMT_STATE_LISTENING && s->role == LMT_ROLE_DESTINATION);
}

static int allow_running(void *opaque, const char *name, struct lmt_error *err)
{
	const struct lmt_session *s = opaque;
	if (s->role != LMT_ROLE_SOURCE)
		return lmt__error(err, LMT_ESTATE,
		                  "%s: fixed once the migration has begun (a destination's options "
		                  "do not change during a migration)",
		                  name);
	if (!is_runtime(name))
		return lmt__error(err, LMT_ESTATE,
		                  "%s: fixed once the migration has begun; only downtime-limit and "
		                  "max-bandwidth can change during a migration",
		                  name);
	return 0;
}

int lmt__options_set_running(struct lmt_session *s, const char *list)
{
	struct lmt_error err = {0};
	pthread_mutex_lock(&s->opts_lock);
	int rc = lmt__optset_parse_allowed(s->opts, list, allow_running, s, &err);
	pthread_mutex_unlock(&s->opts_lock);
	if (rc)
		lmt__usage(s, rc, "%s", err.message);
	return rc;
}

int lmt__option_set_running(struct lmt_session *s, const char *name, const char *value)
{
	struct lmt_error err = {0};
	struct lmt_option_value known;
	if (!name || !value)
		return lmt__usage(s, LMT_EINVAL, "option: name and value required");
	pthread_mutex_lock(&s->opts_lock);
	/* An unknown name gets lmt__optset_set's message, with its suggestion. */
	int rc = lmt__optset_get(s->opts, name, &known) == 0 ? allow_running(s, name, &err) : 0;
	if (!rc)
		rc = lmt__optset_set(s->opts, name, value, LMT_OPT_SRC_EXPLICIT, &err);
	pthread_mutex_unlock(&s->opts_lock);
	if (rc)
		lmt__usage(s, rc, "%s", err.message);
	return rc;
}
