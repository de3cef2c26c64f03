/* Deadlines, monotonic condition variables and threads, shared by the core
 * and the plugins. Internal; not installed. */
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

/* Start a thread of lmt's with every signal blocked: the embedding VMM's
 * signals belong to its own threads. 0 or -LMT_ENOMEM. */
int lmt__thread_start(pthread_t *thread, void *(*fn)(void *), void *arg);

/* Wait on `cond` until signalled, `deadline_ns`, or one slice. */
void lmt__cond_wait_slice(pthread_cond_t *cond, pthread_mutex_t *lock, uint64_t deadline_ns);

#endif
