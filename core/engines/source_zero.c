/* The source engine's zero runs (engines room): in the passes after the
 * bulk one, a run of dirty pages that are all zero goes on the control
 * connection as a ZERO message instead of as data over a channel. Its
 * pages stay in flight (the `inflight` bitmap) until the destination's
 * ZERO_ACK says it made them zero, so the overlap rule orders a zero run
 * and a write of the same page as it orders two writes (docs/engine.md,
 * "Zero pages"). Room: engines; may use: every room below it. */
#include <stdlib.h>
#include <string.h>

#include "bitmap.h"
#include "control.h"
#include "error.h"
#include "session.h"
#include "source_engine.h"

static struct lmt_msg_zero *filling(struct lmt_source_engine *e)
{
	if (e->zero.nsent == ZERO_RING)
		return NULL;
	return &e->zero.msgs[(e->zero.head + e->zero.nsent) % ZERO_RING];
}

int lmt__source_zero_flush(struct lmt_session *s)
{
	struct lmt_source_engine *e = s->source;
	struct lmt_msg_zero *m = e->zero.msgs ? filling(e) : NULL;
	if (!m || !m->count)
		return 0;
	int rc = lmt__enc_zero(&s->out, m);
	if (rc)
		return lmt__fail(s, rc, "encoding ZERO");
	size_t bytes = s->out.len;
	if ((rc = lmt__ctrl_send_by(s, lmt__source_reply_deadline(s))))
		return rc;
	e->zero.nsent++;
	if ((m = filling(e)))
		m->count = 0;
	pthread_mutex_lock(&s->lock);
	s->stats.zero_run_bytes += bytes;
	pthread_mutex_unlock(&s->lock);
	return 0;
}

int lmt__source_zero_post(struct lmt_session *s, const struct chunk *c)
{
	struct lmt_source_engine *e = s->source;
	if (!e->zero.msgs) {
		if (!(e->zero.msgs = calloc(ZERO_RING, sizeof(*e->zero.msgs))))
			return lmt__fail(s, LMT_ENOMEM, "out of memory");
	}
	struct lmt_msg_zero *m = filling(e);
	if (!m)
		return 0; /* every message waits for its answer */
	struct lmt_block *b = &s->blocks[c->block];
	uint32_t n = c->npages < UINT32_MAX ? (uint32_t)c->npages : UINT32_MAX;
	uint64_t wire = LMT_PROTO_ZERO_RUN_SIZE + (m->count ? 0 : LMT_PROTO_ZERO_OVERHEAD);
	m->runs[m->count++] = (struct lmt_msg_page){.block = c->block, .page = c->page, .npages = n};
	lmt__bitmap_range(b->dirty, c->page, n, LMT_BITS_CLEAR);
	lmt__bitmap_range(b->inflight, c->page, n, LMT_BITS_SET);
	e->dirty_bytes -= (uint64_t)n << b->page_shift;
	e->zero.wire_bytes += wire;
	e->bw_allowance -= (double)wire;
	e->pass_zero_pages += n;
	e->cur_page = c->page + n;
	e->call_progressed = true;
	pthread_mutex_lock(&s->lock);
	s->stats.zero_pages += n;
	s->stats.remaining_bytes = lmt__source_left(e);
	pthread_mutex_unlock(&s->lock);
	if (m->count == LMT_PROTO_MAX_ZERO_RUNS) {
		int rc = lmt__source_zero_flush(s);
		if (rc)
			return rc;
	}
	return 1;
}

int lmt__source_zero_acked(struct lmt_session *s, size_t length)
{
	struct lmt_source_engine *e = s->source;
	struct lmt_error err = {0};
	uint64_t applied;
	int rc = lmt__dec_zero_ack(s->in, length, &applied, &err);
	if (rc)
		return lmt__fail(s, rc, "%s", err.message);
	if (!e->zero.nsent || applied != e->zero.acked + 1)
		return lmt__fail(s, LMT_EPROTO,
		                 "ZERO_ACK: the destination says it applied %llu ZERO messages, "
		                 "%llu were sent",
		                 (unsigned long long)applied,
		                 (unsigned long long)(e->zero.acked + e->zero.nsent));
	struct lmt_msg_zero *m = &e->zero.msgs[e->zero.head];
	for (uint32_t i = 0; i < m->count; i++) {
		const struct lmt_msg_page *r = &m->runs[i];
		lmt__bitmap_range(s->blocks[r->block].inflight, r->page, r->npages, LMT_BITS_CLEAR);
	}
	e->zero.wire_bytes -= LMT_PROTO_ZERO_OVERHEAD + (uint64_t)m->count * LMT_PROTO_ZERO_RUN_SIZE;
	m->count = 0;
	e->zero.head = (e->zero.head + 1) % ZERO_RING;
	e->zero.nsent--;
	e->zero.acked = applied;
	pthread_mutex_lock(&s->lock);
	s->stats.remaining_bytes = lmt__source_left(e);
	pthread_mutex_unlock(&s->lock);
	return 0;
}
