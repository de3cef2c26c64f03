/* Deadlines, monotonic condition variables and threads (see sync.h). */
#include "sync.h"

#include <signal.h>
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

int lmt__thread_start(pthread_t *thread, void *(*fn)(void *), void *arg)
{
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	int rc = pthread_create(thread, NULL, fn, arg);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return rc ? -LMT_ENOMEM : 0;
}
