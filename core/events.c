/* The session's events: a bounded queue a VMM takes them from, an eventfd
 * that is readable while the queue is not empty, and an optional callback
 * (see lmt.h). */
#define _GNU_SOURCE
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "error.h"
#include "session.h"

#define EVENTS_MAX 256u

struct lmt__events {
	pthread_mutex_t lock;
	int fd;
	struct lmt_event ring[EVENTS_MAX];
	uint32_t first, count;
	lmt_event_fn fn;
	void *opaque;
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
	*out = q;
	return 0;
}

void lmt__events_free(struct lmt__events *q)
{
	if (!q)
		return;
	close(q->fd);
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
	lmt_event_fn fn = q->fn;
	void *opaque = q->opaque;
	pthread_mutex_unlock(&q->lock);
	if (fn)
		fn(opaque, &e);
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
	if (!s || !ev)
		return -LMT_EINVAL;
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
	pthread_mutex_lock(&s->events->lock);
	s->events->fn = fn;
	s->events->opaque = opaque;
	pthread_mutex_unlock(&s->events->lock);
	return 0;
}
