/* Deadlines, monotonic condition variables and the completion ring (see
 * sync.h). */
#include "sync.h"

#include <stdlib.h>
#include <time.h>

#include "net.h"

uint64_t lmt__deadline(uint64_t timeout_ns)
{
	uint64_t now = lmt__now_ns();
	return timeout_ns > UINT64_MAX - now ? UINT64_MAX : now + timeout_ns;
}

int lmt__cond_init(pthread_cond_t *cond)
{
	pthread_condattr_t attr;
	if (pthread_condattr_init(&attr))
		return -LMT_ENOMEM;
	pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
	int rc = pthread_cond_init(cond, &attr);
	pthread_condattr_destroy(&attr);
	return rc ? -LMT_ENOMEM : 0;
}

void lmt__cond_wait_slice(pthread_cond_t *cond, pthread_mutex_t *lock, uint64_t deadline_ns)
{
	uint64_t until = lmt__deadline(LMT__SLICE_NS);
	if (deadline_ns < until)
		until = deadline_ns;
	struct timespec ts = {.tv_sec = (time_t)(until / 1000000000u),
	                      .tv_nsec = (long)(until % 1000000000u)};
	pthread_cond_timedwait(cond, lock, &ts);
}

int lmt__cq_init(struct lmt__cq_ring *q, uint32_t cap)
{
	q->first = q->count = 0;
	q->cap = cap;
	q->ring = calloc(cap, sizeof(*q->ring));
	return q->ring ? 0 : -LMT_ENOMEM;
}

void lmt__cq_free(struct lmt__cq_ring *q)
{
	free(q->ring);
	q->ring = NULL;
	q->cap = q->first = q->count = 0;
}

bool lmt__cq_push(struct lmt__cq_ring *q, uint64_t cookie, int status, uint32_t channel)
{
	if (q->count >= q->cap)
		return false;
	q->ring[(q->first + q->count++) % q->cap] =
	        (struct lmt_completion){.cookie = cookie, .status = status, .channel = channel};
	return true;
}

uint32_t lmt__cq_drain(struct lmt__cq_ring *q, struct lmt_completion *out, uint32_t max,
                       atomic_uint *outstanding)
{
	uint32_t n = 0;
	while (q->count && n < max) {
		out[n] = q->ring[q->first];
		atomic_fetch_sub(&outstanding[out[n].channel], 1);
		q->first = (q->first + 1) % q->cap;
		q->count--;
		n++;
	}
	return n;
}
