/* The session's events: a bounded queue a VMM takes them from, an eventfd
 * that is readable while the queue is not empty, and an optional callback
 * that may be set or changed at any time (see lmt.h).
 * Room: session; may use: base, wire. */
#define _GNU_SOURCE
#include <stdbool.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "error.h"
#include "session.h"

#define EVENTS_MAX 256u

struct lmt__events {
	pthread_mutex_t lock; /* the queue, and the callback's fields */
	/* Held while the callback runs, so that once a change of callback
	 * returns, the one replaced neither runs nor is called again. */
	pthread_mutex_t callback_lock;
	int fd;
	struct lmt_event ring[EVENTS_MAX];
	uint32_t first, count;
	lmt_event_fn fn;
	void *opaque;
	bool running; /* the callback runs, on `runner` */
	pthread_t runner;
};

int lmt__events_new(struct lmt__events **out)
{
	struct lmt__events *q = calloc(1, sizeof(*q));
	if (!q)
		return -LMT_ENOMEM;
	q->fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (q->fd < 0 || pthread_mutex_init(&q->lock, NULL)) {
		if (q->fd >= 0)
			close(q->fd);
		free(q);
		return -LMT_ENOMEM;
	}
	if (pthread_mutex_init(&q->callback_lock, NULL)) {
		pthread_mutex_destroy(&q->lock);
		close(q->fd);
		free(q);
		return -LMT_ENOMEM;
	}
	*out = q;
	return 0;
}

void lmt__events_free(struct lmt__events *q)
{
	if (!q)
		return;
	close(q->fd);
	pthread_mutex_destroy(&q->callback_lock);
	pthread_mutex_destroy(&q->lock);
	free(q);
}

/* Make room by dropping the oldest pass end, or else the oldest event. */
static void make_room(struct lmt__events *q)
{
	uint32_t drop = 0;
	for (uint32_t i = 0; i < q->count; i++)
		if (q->ring[(q->first + i) % EVENTS_MAX].type == LMT_EVENT_PASS_END) {
			drop = i;
			break;
		}
	for (uint32_t i = drop; i + 1 < q->count; i++)
		q->ring[(q->first + i) % EVENTS_MAX] = q->ring[(q->first + i + 1) % EVENTS_MAX];
	q->count--;
}

void lmt__event_post(struct lmt_session *s, const struct lmt_event *ev)
{
	struct lmt__events *q = s->events;
	struct lmt_event e = *ev;
	e.time_ns = s->start_ns ? lmt__now() - s->start_ns : 0;
	pthread_mutex_lock(&q->lock);
	if (q->count == EVENTS_MAX)
		make_room(q);
	q->ring[(q->first + q->count++) % EVENTS_MAX] = e;
	if (q->count == 1) {
		uint64_t one = 1;
		if (write(q->fd, &one, sizeof(one)) < 0)
			lmt__session_log(s, LMT_LOG_WARN,
			                 "event descriptor: cannot signal an event");
	}
	pthread_mutex_unlock(&q->lock);
	pthread_mutex_lock(&q->callback_lock);
	pthread_mutex_lock(&q->lock);
	lmt_event_fn fn = q->fn;
	void *opaque = q->opaque;
	q->running = fn != NULL;
	q->runner = pthread_self();
	pthread_mutex_unlock(&q->lock);
	if (fn)
		fn(opaque, &e);
	pthread_mutex_lock(&q->lock);
	q->running = false;
	pthread_mutex_unlock(&q->lock);
	pthread_mutex_unlock(&q->callback_lock);
}

void lmt__event_simple(struct lmt_session *s, enum lmt_event_type type, int code)
{
	lmt__event_post(s, &(struct lmt_event){.type = type, .code = code});
}

int lmt_session_event_fd(lmt_session *s)
{
	return s ? s->events->fd : -LMT_EINVAL;
}

int lmt_session_next_event(lmt_session *s, struct lmt_event *ev)
{
	if (!s)
		return -LMT_EINVAL;
	if (!ev)
		return lmt__usage(s, LMT_EINVAL, "next event: no place for it (event is NULL)");
	struct lmt__events *q = s->events;
	pthread_mutex_lock(&q->lock);
	int got = q->count > 0;
	if (got) {
		*ev = q->ring[q->first];
		q->first = (q->first + 1) % EVENTS_MAX;
		q->count--;
	}
	if (q->count == 0) {
		uint64_t value;
		if (read(q->fd, &value, sizeof(value)) < 0) {
			/* Already clear. */
		}
	}
	pthread_mutex_unlock(&q->lock);
	return got;
}

int lmt_session_set_event_callback(lmt_session *s, lmt_event_fn fn, void *opaque)
{
	if (!s)
		return -LMT_EINVAL;
	struct lmt__events *q = s->events;
	/* From inside the callback: the change applies from the next event
	 * (waiting for the callback to return would wait for ever). */
	pthread_mutex_lock(&q->lock);
	bool inside = q->running && pthread_equal(q->runner, pthread_self());
	pthread_mutex_unlock(&q->lock);
	if (!inside)
		pthread_mutex_lock(&q->callback_lock);
	pthread_mutex_lock(&q->lock);
	q->fn = fn;
	q->opaque = opaque;
	pthread_mutex_unlock(&q->lock);
	if (!inside)
		pthread_mutex_unlock(&q->callback_lock);
	return 0;
}
