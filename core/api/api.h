/* The API room (core/api/), the top of the core: the public entry points
 * that need the engines, the session's lifecycle (creating and freeing
 * engines and targets), the statistics snapshot, jobs. May use: every
 * room. */
#ifndef LMT_CORE_API_H
#define LMT_CORE_API_H

#include "engines.h"

/* ---- jobs.c: migrations on the session's own thread ---- */

/* Whether a job runs this session and the caller is not its thread (the
 * engines ask through lmt__job_owns). */
bool lmt__job_runs_elsewhere(struct lmt_session *s);
/* Wait for the job's thread to end (after a cancel) and free it. */
void lmt__job_free(struct lmt_session *s);

#endif
