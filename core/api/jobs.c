/* Migrations on a thread of the session's (lmt_load_start, lmt_save_start,
 * lmt_save_switchover, lmt_session_wait): the same engines as the blocking
 * calls, driven by lmt, for VMMs that only poll an event descriptor.
 * Room: api; may use: every room. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "session.h"
#include "sync.h"
#include "api.h"

struct lmt__job {
	pthread_t thread;
	pthread_t self; /* the same, as the thread itself sees it first */
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool done;
	int rc;
	char *uri;       /* source: where to connect */
	bool switchover; /* source: lmt_save_switchover was called */
	void *state;     /* its device state, copied */
	size_t state_len;
	uint64_t pause_ns; /* source: between passes once ready */
};

/* Whether a job runs this session and the caller is not its thread (for
 * lmt__job_owns, through the session's upcalls). */
bool lmt__job_runs_elsewhere(struct lmt_session *s)
{
	struct lmt__job *j = s->job;
	return j && !pthread_equal(pthread_self(), j->self);
}

static void job_end(struct lmt__job *j, int rc)
{
	pthread_mutex_lock(&j->lock);
	j->rc = rc;
	j->done = true;
	pthread_cond_broadcast(&j->cond);
	pthread_mutex_unlock(&j->lock);
}

static void *load_job(void *arg)
{
	struct lmt_session *s = arg;
	s->job->self = pthread_self();
	int rc = lmt_load_run(s);
	/* Postcopy: the guest may run (the POSTCOPY event went out); the job
	 * waits for the rest. A lazy restore's is the VMM's to wait for. */
	if (!rc && s->postcopy)
		rc = lmt_load_finish(s);
	job_end(s->job, rc);
	return NULL;
}

/* Whether the VMM asked to switch over; waits up to `ns` for it. */
static bool switchover_due(struct lmt__job *j, uint64_t ns)
{
	uint64_t deadline = lmt__deadline(ns);
	pthread_mutex_lock(&j->lock);
	while (!j->switchover && ns && lmt__now_ns() < deadline)
		lmt__cond_wait_slice(&j->cond, &j->lock, deadline);
	bool due = j->switchover;
	pthread_mutex_unlock(&j->lock);
	return due;
}

static void *save_job(void *arg)
{
	struct lmt_session *s = arg;
	struct lmt__job *j = s->job;
	j->self = pthread_self();
	int rc = lmt_save_setup(s, j->uri);
	struct lmt_iterate_result it = {0};
	while (!rc && !switchover_due(j, 0)) {
		rc = lmt_save_iterate(s, &it);
		/* Ready: what is dirty fits in the downtime limit. Look again
		 * after a pause of one iteration budget rather than spin. */
		if (!rc && it.ready && switchover_due(j, j->pause_ns))
			break;
	}
	if (!rc)
		rc = lmt_save_complete(s, j->state, j->state_len);
	/* Switched to postcopy (the POSTCOPY event went out): the rest. */
	if (!rc)
		rc = lmt_save_finish(s);
	job_end(j, rc);
	return NULL;
}

static int job_start(struct lmt_session *s, void *(*fn)(void *), const char *uri, const char *what)
{
	if (s->job)
		return lmt__usage(s, LMT_ESTATE, "%s: a job already runs this session", what);
	struct lmt__job *j = calloc(1, sizeof(*j));
	if (!j || (uri && !(j->uri = strdup(uri)))) {
		free(j);
		return lmt__usage(s, LMT_ENOMEM, "%s: out of memory", what);
	}
	j->pause_ns = (uint64_t)lmt__opt_int(s->opts, "max-iterate-ms");
	if (pthread_mutex_init(&j->lock, NULL) == 0) {
		if (lmt__cond_init(&j->cond) == 0) {
			s->job = j;
			if (lmt__thread_start(&j->thread, fn, s) == 0)
				return 0;
			s->job = NULL;
			pthread_cond_destroy(&j->cond);
		}
		pthread_mutex_destroy(&j->lock);
	}
	free(j->uri);
	free(j);
	return lmt__usage(s, LMT_ENOMEM, "%s: cannot start lmt's thread", what);
}

int lmt_load_start(lmt_session *s)
{
	if (!s)
		return -LMT_EINVAL;
	if (s->role != LMT_ROLE_DESTINATION)
		return lmt__usage(s, LMT_ESTATE, "load start: this session is a source");
	if (atomic_load(&s->state) != LMT_STATE_LISTENING)
		return lmt__usage(s, LMT_ESTATE, "load start: call lmt_load_listen first");
	return job_start(s, load_job, NULL, "load start");
}

int lmt_save_start(lmt_session *s, const char *uri)
{
	if (!s)
		return -LMT_EINVAL;
	int rc = lmt__save_check(s, uri, "save start");
	if (rc)
		return rc;
	if (atomic_load(&s->state) != LMT_STATE_NEW)
		return lmt__usage(s, LMT_ESTATE, "save start: the session was set up already");
	return job_start(s, save_job, uri, "save start");
}

int lmt_save_switchover(lmt_session *s, const void *device_state, size_t length)
{
	if (!s)
		return -LMT_EINVAL;
	struct lmt__job *j = s->job;
	if (!j || s->role != LMT_ROLE_SOURCE)
		return lmt__usage(s, LMT_ESTATE, "save switchover: no lmt_save_start job runs");
	if (length && !device_state)
		return lmt__usage(s, LMT_EINVAL,
		                  "save switchover: %zu bytes of device state at NULL", length);
	void *copy = length ? malloc(length) : NULL;
	if (length && !copy)
		return lmt__usage(s, LMT_ENOMEM,
		                  "save switchover: no memory for %zu bytes of "
		                  "device state",
		                  length);
	if (length)
		memcpy(copy, device_state, length);
	/* Before READY too: the job stops its passes at once and completes
	 * with what is left (the guest is paused either way). */
	pthread_mutex_lock(&j->lock);
	bool again = j->switchover, ended = j->done;
	if (!again && !ended) {
		j->state = copy;
		j->state_len = length;
		j->switchover = true;
		pthread_cond_broadcast(&j->cond);
	}
	pthread_mutex_unlock(&j->lock);
	if (again || ended) {
		free(copy);
		return lmt__usage(s, LMT_ESTATE, "save switchover: %s",
		                  ended ? "the job has ended (lmt_session_wait gives its result)"
		                        : "called twice");
	}
	return 0;
}

int lmt_session_wait(lmt_session *s, int timeout_ms)
{
	if (!s)
		return -LMT_EINVAL;
	struct lmt__job *j = s->job;
	if (!j)
		return lmt__usage(s, LMT_ESTATE,
		                  "session wait: no job runs this session (lmt_save_start or "
		                  "lmt_load_start starts one)");
	uint64_t deadline =
	        timeout_ms < 0 ? UINT64_MAX : lmt__deadline((uint64_t)timeout_ms * 1000000ull);
	/* Once the migration ended (its COMPLETED or FAILED event is posted)
	 * the job's thread is only returning, after at most the teardown:
	 * wait for it whatever the timeout, so the result agrees with the
	 * event. */
	pthread_mutex_lock(&s->lock);
	enum lmt_status status = s->stats.status;
	pthread_mutex_unlock(&s->lock);
	if (status == LMT_STATUS_COMPLETED || status == LMT_STATUS_FAILED ||
	    status == LMT_STATUS_CANCELLED)
		deadline = UINT64_MAX;
	pthread_mutex_lock(&j->lock);
	while (!j->done && lmt__now_ns() < deadline)
		lmt__cond_wait_slice(&j->cond, &j->lock, deadline);
	int rc = j->done ? j->rc : -LMT_EAGAIN;
	pthread_mutex_unlock(&j->lock);
	return rc;
}

void lmt__job_free(struct lmt_session *s)
{
	struct lmt__job *j = s->job;
	if (!j)
		return;
	pthread_join(j->thread, NULL);
	s->job = NULL;
	pthread_cond_destroy(&j->cond);
	pthread_mutex_destroy(&j->lock);
	free(j->uri);
	free(j->state);
	free(j);
}
