/* Deadlines, monotonic condition variables and the completion ring that
 * the plugins with channel threads share. Internal; not installed. */
#ifndef LMT_COMMON_SYNC_H
#define LMT_COMMON_SYNC_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <lmt/plugin.h>

/* How long a blocking wait sleeps before it looks at cancellation again. */
#define LMT__SLICE_NS 100000000ull

/* now + timeout_ns, saturating. */
uint64_t lmt__deadline(uint64_t timeout_ns);

/* A condition variable on CLOCK_MONOTONIC: 0 or -LMT_ENOMEM. */
int lmt__cond_init(pthread_cond_t *cond);

/* Wait on `cond` until signalled, `deadline_ns`, or one slice. */
void lmt__cond_wait_slice(pthread_cond_t *cond, pthread_mutex_t *lock, uint64_t deadline_ns);

/* Completions queued by channel threads for the host's progress, under the
 * owner's lock. Sized so that it never fills: a channel holds at most its
 * queue depth of writes not harvested. */
struct lmt__cq_ring {
	struct lmt_completion *ring;
	uint32_t cap, first, count;
};

/* 0, or -LMT_ENOMEM. */
int lmt__cq_init(struct lmt__cq_ring *q, uint32_t cap);
void lmt__cq_free(struct lmt__cq_ring *q);

/* Queue one; false (and nothing queued) when full. */
bool lmt__cq_push(struct lmt__cq_ring *q, uint64_t cookie, int status, uint32_t channel);

/* Move up to `max` into `out`, counting each off its channel's
 * `outstanding`; how many. */
uint32_t lmt__cq_drain(struct lmt__cq_ring *q, struct lmt_completion *out, uint32_t max,
                       atomic_uint *outstanding);

#endif
