/* The source engine's object (engines room): made and freed, the VMM's
 * callbacks (dirty sync, throttle), and what every phase shares: the
 * switchover's deadline and its expiry, the device state sent. The
 * phases are source_setup.c, source_walk.c and source_passes.c. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bitmap.h"
#include "control.h"
#include "engines.h"
#include "error.h"
#include "file.h"
#include "net.h"
#include "session.h"
#include "source_engine.h"

int lmt__source_new(struct lmt_source_engine **out)
{
	*out = calloc(1, sizeof(**out));
	return *out ? 0 : -LMT_ENOMEM;
}

void lmt__source_free(struct lmt_source_engine *e)
{
	if (e)
		lmt__converge_release(&e->converge);
	if (!e)
		return;
	free(e->slots);
	free(e->free_slots);
	free(e->landed);
	free(e->zero.msgs);
	free(e);
}

int lmt_session_set_dirty_sync(lmt_session *s, lmt_dirty_sync_fn fn, void *opaque)
{
	if (!s)
		return -LMT_EINVAL;
	if (s->role != LMT_ROLE_SOURCE)
		return lmt__usage(s, LMT_ESTATE, "dirty sync: only a source tracks dirty pages");
	if (!fn)
		return lmt__usage(s, LMT_EINVAL, "dirty sync: the callback is NULL");
	const char *fixed = lmt__config_fixed(s);
	if (fixed)
		return lmt__usage(s, LMT_ESTATE, "dirty sync: the callback is fixed %s", fixed);
	s->source->dirty_fn = fn;
	s->source->dirty_opaque = opaque;
	return 0;
}

int lmt_session_set_throttle(lmt_session *s, lmt_throttle_fn fn, void *opaque)
{
	if (!s)
		return -LMT_EINVAL;
	if (s->role != LMT_ROLE_SOURCE)
		return lmt__usage(s, LMT_ESTATE, "throttle: only a source throttles its guest");
	if (!fn)
		return lmt__usage(s, LMT_EINVAL, "throttle: the callback is NULL");
	const char *fixed = lmt__config_fixed(s);
	if (fixed)
		return lmt__usage(s, LMT_ESTATE, "throttle: the callback is fixed %s", fixed);
	s->source->converge.fn = fn;
	s->source->converge.opaque = opaque;
	return 0;
}

void lmt__source_release_throttle(struct lmt_session *s)
{
	lmt__converge_release(&s->source->converge);
	pthread_mutex_lock(&s->lock);
	s->stats.throttle_percent = 0;
	pthread_mutex_unlock(&s->lock);
}

/* Tell the destination the engine is moving, with a LANDED even when
 * nothing new landed, at most every min(1 s, idle-timeout / 4): without
 * one, or another message, for idle-timeout the destination gives up on a
 * source that only sends keep-alives. */
int lmt__source_switchover_expired(struct lmt_session *s, const char *what)
{
	/* Once POSTCOPY went out the destination may be running the guest. */
	bool sent = atomic_load(&s->in_postcopy);
	return lmt__fail_over(s, LMT_ETIMEDOUT,
	                      "switchover-timeout (%llu ms) passed with the guest paused, %s; %s",
	                      (unsigned long long)(s->source->switchover_timeout_ns / 1000000),
	                      what,
	                      sent ? "the switch was sent and the destination may run the guest: "
	                             "do not resume the source guest"
	                           : "the source guest may resume");
}

uint64_t lmt__source_reply_deadline(const struct lmt_session *s)
{
	uint64_t d = lmt__now() + s->idle_timeout_ns;
	return d < s->source->switchover_deadline ? d : s->source->switchover_deadline;
}


/* ---- stop and copy ---- */

int lmt__source_send_state(struct lmt_session *s, const uint8_t *data, size_t length)
{
	size_t off = 0;
	while (off < length) {
		size_t n =
		        length - off < LMT_PROTO_STATE_CHUNK ? length - off : LMT_PROTO_STATE_CHUNK;
		struct lmt_msg_state m = {
		        .offset = off, .total = length, .length = (uint32_t)n, .data = data + off};
		int rc = lmt__enc_state(&s->out, &m);
		if (rc)
			return lmt__fail(s, rc, "encoding DEVICE_STATE");
		if ((rc = lmt__ctrl_send_by(s, lmt__source_reply_deadline(s))))
			return rc == -LMT_ETIMEDOUT && lmt__now() >= s->source->switchover_deadline
			               ? lmt__source_switchover_expired(s, "sending the device state")
			               : rc;
		off += n;
	}
	return 0;
}

/* The guest is paused, a pass under way: nothing left in flight, the last
 * dirty pages synced, and the pass recorded as the switchover cut it
 * short. */
