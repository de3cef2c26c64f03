/* What may change once a side has started. Options, blocks and the
 * dirty-sync callback are fixed once the source's migration has begun or
 * the destination listens; but a source keeps taking, from any thread,
 * the options QEMU's migrate-set-parameters changes on the fly:
 * downtime-limit, max-bandwidth and switchover-bandwidth (QEMU's
 * avail-switchover-bandwidth). The engine reads them at the start of each
 * lmt_save_iterate call (source.c). Every other option shaped setup (or
 * must match the peer's) and is refused with its name.
 * Room: session; may use: base, wire. */
#include <string.h>

#include "error.h"
#include "session.h"

static const char *const runtime_options[] = {"downtime-limit", "max-bandwidth",
                                              "switchover-bandwidth"};

static bool is_runtime(const char *name)
{
	for (size_t i = 0; i < sizeof(runtime_options) / sizeof(runtime_options[0]); i++)
		if (strcmp(name, runtime_options[i]) == 0)
			return true;
	return false;
}

const char *lmt__config_fixed(const struct lmt_session *s)
{
	int st = atomic_load(&s->state);
	if (s->role == LMT_ROLE_DESTINATION)
		return st != LMT_STATE_NEW
		               ? "once lmt_load_listen is called (a source may connect from "
		                 "then on, and the handshake checks them against its own)"
		               : NULL;
	/* A job (lmt_save_start) runs setup on its own thread at any moment. */
	return st != LMT_STATE_NEW || s->job ? "once the migration has begun" : NULL;
}

int lmt__option_settable(void *opaque, const char *name, struct lmt_error *err)
{
	const struct lmt_session *s = opaque;
	const char *why = lmt__config_fixed(s);
	if (!why || (s->role == LMT_ROLE_SOURCE && is_runtime(name)))
		return 0;
	if (s->role == LMT_ROLE_DESTINATION)
		return lmt__error(err, LMT_ESTATE, "%s: options are fixed %s", name, why);
	return lmt__error(
	        err, LMT_ESTATE,
	        "%s: fixed %s; only downtime-limit, max-bandwidth and switchover-bandwidth "
	        "can change during a migration",
	        name, why);
}
