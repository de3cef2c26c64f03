/* The source engine's passes and switchover (engines room): passes,
 * their measurements and convergence, lmt_save_iterate, the stop-and-copy
 * (lmt_save_complete), the postcopy trigger and lmt_save_finish. */
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
#include "handover.h"
#include "net.h"
#include "session.h"
#include "source_engine.h"
#include "postcopy.h"
#include "transport.h"
#include "verify.h"

/* ---- passes ---- */

/* Walk and post until the pass ends or the deadline passes. */
static int send_pass(struct lmt_session *s, uint64_t deadline, bool limited)
{
	struct lmt_source_engine *e = s->source;
	struct chunk c;
	while (!e->pass_done) {
		int rc = lmt__source_harvest(s, 0);
		if (rc < 0 || (rc = lmt__source_service(s)))
			return rc;
		lmt__source_hash_behind(s, deadline);
		uint64_t now = lmt__now();
		if (now >= deadline)
			return 0;
		uint64_t gate = lmt__source_bandwidth_gate(s, limited, now);
		if (now < gate) {
			rc = lmt__source_harvest(s, (gate < deadline ? gate : deadline) - now);
			if (rc < 0)
				return rc;
			continue;
		}
		if (!lmt__source_next_chunk(s, &c)) {
			e->pass_done = true;
			break;
		}
		rc = lmt__source_try_post(s, &c, deadline);
		if (rc < 0)
			return rc;
		if (rc == 2)
			return 0; /* for the next call */
		if (rc == 0 && (rc = lmt__source_wait_some(s, deadline)))
			return rc;
	}
	return 0;
}

/* Wait for every write in flight and every zero run's answer; 1 if the
 * deadline came first. */
static int drain(struct lmt_session *s, uint64_t deadline)
{
	struct lmt_source_engine *e = s->source;
	while (lmt__source_in_flight(e)) {
		if (lmt__now() >= deadline)
			return 1;
		int rc = lmt__source_wait_some(s, deadline);
		if (rc)
			return rc;
	}
	return 0;
}

/* With verify=on, how long the pause will spend hashing
 * (lmt__verify_pause_bytes), at this source's own rate. False while there
 * is some and no rate yet. */
static bool verify_pause_ns(const struct lmt_session *s, double *ns)
{
	const struct lmt_source_engine *e = s->source;
	uint64_t bytes = lmt__verify_pause_bytes(s);
	*ns = 0;
	if (!bytes)
		return true;
	if (!e->hash_bytes)
		return false;
	*ns = (double)bytes * (double)e->hash_ns / (double)e->hash_bytes;
	return true;
}

/* What the pause would take if it began now: the RAM left and the device
 * state announced (lmt_save_set_device_state_size) at the rate the pause
 * will send at, and the hashing left to it (lmt__pause_estimate). */
static void pause_parts(const struct lmt_session *s, struct lmt_pause_parts *p)
{
	const struct lmt_source_engine *e = s->source;
	*p = (struct lmt_pause_parts){
	        .ram_bytes = lmt__source_left(e),
	        .other_bytes = atomic_load(&e->device_state_bytes),
	        .rate_bps = lmt__switchover_bps(&e->switchover),
	};
	p->hash_known = verify_pause_ns(s, &p->hash_ns);
	if (s->file) {
		uint64_t bytes;
		lmt__file_pause_cost(s, &bytes, &p->sync_ns);
		p->other_bytes += bytes;
	}
}

static bool expected_downtime(const struct lmt_session *s, uint64_t *out)
{
	struct lmt_pause_parts p;
	pause_parts(s, &p);
	return lmt__pause_estimate(&p, out);
}

/* Whether what the pause does besides sending RAM (the device state, the
 * hashing, a file's syncs) fits downtime-limit, as far as can be told:
 * when it does not, no pass gets the migration ready. */
static bool rest_fits(const struct lmt_session *s)
{
	struct lmt_pause_parts p;
	uint64_t ns;
	pause_parts(s, &p);
	p.ram_bytes = 0;
	return !lmt__pause_estimate(&p, &ns) || ns <= s->source->downtime_limit_ns;
}

/* verify=on: say once that the pause's hashing alone, which no pass
 * shortens, is over downtime-limit, so that the migration will not be
 * ready until the limit is raised. */
static void warn_verify(struct lmt_session *s)
{
	struct lmt_source_engine *e = s->source;
	double ns;
	if (!s->verify || e->verify_warned || !verify_pause_ns(s, &ns) ||
	    ns <= (double)e->downtime_limit_ns)
		return;
	e->verify_warned = true;
	lmt__session_log(s, LMT_LOG_WARN,
	                 "verify=on: hashing the RAM in the pause takes about %.0f ms here, over "
	                 "downtime-limit (%.0f ms): not ready until the limit allows it",
	                 ns / 1e6, (double)e->downtime_limit_ns / 1e6);
}

/* A pass ended with `dirtied` bytes newly dirty: measure and record it.
 * `interrupted`: lmt_save_complete cut it short. */
static void measure_pass(struct lmt_session *s, uint64_t dirtied, bool final, bool interrupted)
{
	struct lmt_source_engine *e = s->source;
	uint64_t now = lmt__now();
	uint64_t span = now - e->pass_start_ns;
	uint64_t rate = span ? (uint64_t)((double)dirtied * 1e9 / (double)span) : 0;
	uint64_t pass_bps = span ? (uint64_t)((double)e->pass_bytes * 1e9 / (double)span) : 0;
	if (span && !final && (e->pass_bytes >= (1u << 20) || !e->bandwidth_bps))
		e->bandwidth_bps = pass_bps;
	if (!final) {
		lmt__switchover_measure(&e->switchover, pass_bps, 1u << 20, true, now);
		warn_verify(s);
	}
	pthread_mutex_lock(&s->lock);
	if (!final)
		s->stats.dirty_rate_bps = rate;
	s->stats.bandwidth_bps = e->bandwidth_bps;
	pthread_mutex_unlock(&s->lock);
	uint64_t expected = 0;
	bool known = final || expected_downtime(s, &expected);
	struct lmt_pass_stats p = {
	        .pass = e->pass,
	        .final = final,
	        .start_ns = e->pass_start_ns - s->start_ns,
	        .duration_ns = span,
	        .bytes = e->pass_bytes,
	        .dirtied_bytes = dirtied,
	        .dirty_rate_bps = rate,
	        .bandwidth_bps = pass_bps,
	        .expected_downtime_ns = expected,
	        .interrupted = interrupted,
	        .expected_downtime_known = known,
	        .throttle_percent = atomic_load(&e->converge.percent),
	        .zero_pages = e->pass_zero_pages,
	};
	lmt__pass_record(s, &p);
}

/* A pass ended short of ready: auto-converge may ask for more throttle
 * before the next one. */
static void converge(struct lmt_session *s, uint64_t dirtied)
{
	struct lmt_source_engine *e = s->source;
	uint32_t percent = lmt__converge_pass(&e->converge, e->pass_bytes, dirtied);
	pthread_mutex_lock(&s->lock);
	s->stats.throttle_percent = percent;
	pthread_mutex_unlock(&s->lock);
}

static void start_pass(struct lmt_session *s)
{
	struct lmt_source_engine *e = s->source;
	e->pass++;
	e->pass_done = false;
	e->pass_start_ns = lmt__now();
	e->pass_bytes = 0;
	e->pass_zero_pages = 0;
	e->cur_block = 0;
	e->cur_page = 0;
	pthread_mutex_lock(&s->lock);
	s->stats.passes = e->pass;
	pthread_mutex_unlock(&s->lock);
}

/* A pass has walked every block. Far from converging, the next pass
 * starts at once and overlaps the writes still in flight (the overlap
 * rule keeps that safe). Close to it, the writes in flight are drained
 * first, so that "ready" means nothing is left but what is dirty. Returns
 * 1 when the deadline came first. */
/* postcopy-after passes ended and the migration is not ready: say to
 * switch. The pass is recorded; writes in flight are the switch's to
 * drain. */
static bool postcopy_due(const struct lmt_session *s)
{
	const struct lmt_source_engine *e = s->source;
	return s->postcopy_on && e->postcopy_after && e->pass >= e->postcopy_after;
}

/* The pass that ended was measured: say to switch. */
static void postcopy_now(struct lmt_session *s, struct lmt_iterate_result *res)
{
	struct lmt_source_engine *e = s->source;
	/* Said once the writes in flight have landed (iterate). */
	res->ready = res->postcopy = !lmt__source_in_flight(e);
	e->postcopy_due = true;
	e->need_pass = true;
}

/* A file: target, its pass drained: sync ahead of the pause (file.c), if
 * the call has time for it by its last cost; 1: left to the next call. */
static int sync_ahead(struct lmt_session *s, uint64_t deadline)
{
	if (!s->file)
		return 0;
	if (!lmt__source_step_fits(s->source, s->file->sync_ns, deadline))
		return 1;
	return lmt__file_sync_ahead(s);
}

static int end_pass(struct lmt_session *s, uint64_t deadline, struct lmt_iterate_result *res)
{
	struct lmt_source_engine *e = s->source;
	int rc;
	if (!e->draining) {
		uint64_t dirtied;
		if ((rc = lmt__source_sync_dirty(s, &dirtied)))
			return rc;
		e->pass_dirtied = dirtied;
		uint64_t bw = lmt__switchover_bps(&e->switchover);
		if (bw &&
		    (double)e->dirty_bytes * 1e9 / (double)bw > (double)e->downtime_limit_ns) {
			measure_pass(s, dirtied, false, false);
			if (postcopy_due(s)) {
				postcopy_now(s, res);
				return 0;
			}
			converge(s, dirtied);
			start_pass(s);
			return 0;
		}
		e->draining = true;
	}
	if ((rc = drain(s, deadline)) || (rc = sync_ahead(s, deadline)))
		return rc;
	e->draining = false;
	uint64_t more, expected;
	if ((rc = lmt__source_sync_dirty(s, &more)))
		return rc;
	measure_pass(s, e->pass_dirtied + more, false, false);
	if (expected_downtime(s, &expected) && expected <= e->downtime_limit_ns) {
		res->ready = 1;
		e->need_pass = true;
	} else if (postcopy_due(s)) {
		postcopy_now(s, res);
	} else if (!e->dirty_bytes || !rest_fits(s)) {
		/* Not ready with nothing dirty, or with the rest of the pause
		 * over the limit by itself: a pass at once would not get the
		 * migration ready (passes of a few pages each, thousands a
		 * second). A later call starts the next pass. */
		converge(s, e->pass_dirtied + more);
		e->need_pass = true;
		e->next_pass_ns = lmt__now() + IDLE_PASS_GAP_NS;
	} else {
		converge(s, e->pass_dirtied + more);
		start_pass(s);
	}
	return 0;
}

/* One lmt_save_iterate call, which began at `start`. */
static int iterate(struct lmt_session *s, struct lmt_iterate_result *res, uint64_t start)
{
	struct lmt_source_engine *e = s->source;
	lmt__source_tune(s);
	/* The call's own work stops early: by the guard, or by how late
	 * waits have been ending when that is more, but never before a fifth
	 * of the budget, so that every call moves the migration on. The
	 * budget counts from the call's start: a thread kept off a core
	 * before it got here has spent that much of it. */
	uint64_t guard = e->iterate_ns / ITERATE_GUARD_DIV + ITERATE_GUARD_NS;
	if (guard < e->late_ns + ITERATE_GUARD_NS / 2)
		guard = e->late_ns + ITERATE_GUARD_NS / 2;
	uint64_t least = e->iterate_ns / ITERATE_GUARD_DIV;
	uint64_t deadline = start + (e->iterate_ns > guard + least ? e->iterate_ns - guard : least);
	uint64_t now = lmt__now();
	if (deadline < now + least)
		deadline = now + least;
	int rc = 0;
	e->call_progressed = false;
	if (e->pass == 0 && (rc = lmt__source_start_first_pass(s)))
		return rc;
	if (e->postcopy_due) {
		/* Switching is due. The writes still in flight land first,
		 * while the guest runs, so that the pause does not wait for
		 * them; then the call says to switch. */
		if (lmt__source_in_flight(e) && (rc = drain(s, deadline)) < 0)
			return rc;
		res->ready = res->postcopy = !lmt__source_in_flight(e);
		return lmt__source_report_landed(s, false);
	}
	while (e->need_pass && lmt__now() < e->next_pass_ns && lmt__now() < deadline)
		if ((rc = lmt__source_wait_some(s, e->next_pass_ns < deadline ? e->next_pass_ns : deadline)))
			return rc;
	if (e->need_pass && lmt__now() >= e->next_pass_ns) {
		e->need_pass = false;
		e->next_pass_ns = 0;
		start_pass(s);
	}
	while (!res->ready && !e->need_pass && lmt__now() < deadline) {
		if ((rc = send_pass(s, deadline, true)))
			return rc;
		lmt__source_hash_behind(s, deadline);
		if (!e->pass_done || !lmt__source_step_fits(e, e->sync_cost_ns, deadline))
			break;
		if ((rc = end_pass(s, deadline, res)) < 0)
			return rc;
		e->call_progressed = true;
		if (rc)
			break;
	}
	lmt__source_hash_behind(s, deadline); /* the time left in the call */
	/* The zero runs of this call go now, to be answered while the VMM is
	 * away. */
	if ((rc = lmt__source_zero_flush(s)))
		return rc;
	return lmt__source_report_landed(s, false);
}

static void fill_result(struct lmt_session *s, struct lmt_iterate_result *res)
{
	struct lmt_source_engine *e = s->source;
	/* Mid-pass, the pass so far is the best estimate once it means something. */
	uint64_t now = lmt__now(), span = now - e->pass_start_ns;
	if (!e->pass_done && e->pass_bytes >= (4u << 20) && span) {
		e->bandwidth_bps = (uint64_t)((double)e->pass_bytes * 1e9 / (double)span);
		lmt__switchover_measure(&e->switchover, e->bandwidth_bps, 4u << 20, false, now);
	}
	res->pass = e->pass;
	res->remaining_bytes = lmt__source_left(e);
	res->bandwidth_bps = e->bandwidth_bps;
	res->expected_downtime_known = expected_downtime(s, &res->expected_downtime_ns);
	pthread_mutex_lock(&s->lock);
	s->stats.expected_downtime_ns = res->expected_downtime_ns;
	s->stats.expected_downtime_known = res->expected_downtime_known;
	s->stats.bandwidth_bps = e->bandwidth_bps;
	pthread_mutex_unlock(&s->lock);
}

static int save_iterate(lmt_session *s, struct lmt_iterate_result *res)
{
	if (s->role != LMT_ROLE_SOURCE || atomic_load(&s->state) != LMT_STATE_ACTIVE)
		return lmt__usage(s, LMT_ESTATE, "save iterate: the session is not migrating");
	if (!res)
		return lmt__usage(s, LMT_EINVAL, "save iterate: result is NULL");
	if (s->postcopy)
		return lmt__usage(s, LMT_ESTATE,
		                  "save iterate: the migration switched to postcopy (call "
		                  "lmt_save_finish)");
	uint64_t start = lmt__now();
	memset(res, 0, sizeof(*res));
	int rc = lmt__source_report_progress(s);
	if (!rc)
		rc = iterate(s, res, start);
	if (rc)
		return lmt__abort(s, rc);
	fill_result(s, res);
	/* READY when the migration becomes ready, not on every call that
	 * finds it still so. */
	if (res->ready && !s->source->ready_posted)
		lmt__event_simple(s, LMT_EVENT_READY, 0);
	s->source->ready_posted = res->ready;
	return 0;
}

int lmt_save_iterate(lmt_session *s, struct lmt_iterate_result *res)
{
	if (!s)
		return -LMT_EINVAL;
	if (lmt__job_owns(s))
		return lmt__usage(
		        s, LMT_ESTATE,
		        "save iterate: a job started with lmt_save_start runs this session");
	lmt__call_enter(s);
	int rc = save_iterate(s, res);
	lmt__call_leave(s);
	return rc;
}

static int end_cut_pass(struct lmt_session *s)
{
	struct lmt_source_engine *e = s->source;
	uint64_t more;
	int rc;
	if ((rc = drain(s, e->switchover_deadline)))
		return rc < 0 ? rc : lmt__source_switchover_expired(s, "writes still in flight");
	if ((rc = lmt__source_sync_dirty(s, &more)))
		return rc;
	if (!e->need_pass)
		measure_pass(s, (e->draining ? e->pass_dirtied : 0) + more, false, true);
	e->need_pass = false;
	e->draining = false;
	return 0;
}

/* The guest is paused: a last pass over what is dirty, then every write
 * landed and flushed, all before the switchover's end. */
static int send_rest(struct lmt_session *s)
{
	struct lmt_source_engine *e = s->source;
	uint64_t end = e->switchover_deadline;
	int rc;
	if (e->pass == 0) {
		if ((rc = lmt__source_start_first_pass(s)))
			return rc;
	} else {
		if ((rc = end_cut_pass(s)))
			return rc;
		start_pass(s);
	}
	if ((rc = send_pass(s, end, false)))
		return rc;
	if (!e->pass_done)
		return lmt__source_switchover_expired(s, "the final pass unfinished");
	lmt__source_hash_rest(s); /* while the last writes are in flight */
	if ((rc = drain(s, end)))
		return rc < 0 ? rc : lmt__source_switchover_expired(s, "writes of the final pass in flight");
	uint64_t now = lmt__now();
	if (now >= end)
		return lmt__source_switchover_expired(s, "before the flush");
	uint64_t left = end - now;
	/* A file's pages are flushed with its metadata, before the commit
	 * record (lmt__file_save_finish): one fdatasync less in the pause. */
	if (s->file_path)
		rc = 0;
	else
		rc = s->desc->ops.flush(s->inst,
		                        left < s->idle_timeout_ns ? left : s->idle_timeout_ns);
	if (rc == -LMT_ETIMEDOUT && lmt__now() >= end)
		return lmt__source_switchover_expired(s, "in the plugin's flush");
	if (rc)
		return lmt__fail(s, rc, "plugin %s: flush failed (%s)", s->desc->name,
		                 lmt_err_name(rc));
	measure_pass(s, 0, true, false);
	return 0;
}

/* COMPLETE, with a digest per block when verify=on, and the answer. */
static int send_complete(struct lmt_session *s, size_t state_length)
{
	struct lmt_msg_complete *m = calloc(1, sizeof(*m));
	if (!m)
		return lmt__fail(s, LMT_ENOMEM, "out of memory");
	m->passes = s->source->pass;
	m->state_length = state_length;
	m->digest_count = s->verify ? s->nblocks : 0;
	for (uint32_t i = 0; i < m->digest_count; i++)
		m->digests[i] = lmt__verify_digest(&s->blocks[i]);
	int rc = lmt__enc_complete(&s->out, m);
	free(m);
	if (rc)
		return lmt__fail(s, rc, "encoding COMPLETE");
	struct lmt_msg_header h;
	if ((rc = lmt__ctrl_send_by(s, lmt__source_reply_deadline(s))) ||
	    (rc = lmt__ctrl_expect(s, LMT_MSG_COMPLETE_ACK, lmt__source_reply_deadline(s), &h)))
		return rc == -LMT_ETIMEDOUT && lmt__now() >= s->source->switchover_deadline
		               ? lmt__source_switchover_expired(s, "without the destination's acknowledgement")
		               : rc;
	struct lmt_msg_status st;
	struct lmt_error err = {0};
	if ((rc = lmt__dec_status(s->in, h.length, LMT_MSG_COMPLETE_ACK, &st, &err)))
		return lmt__fail(s, rc, "%s", err.message);
	if (st.code)
		return lmt__fail(s, st.code, "the destination refused the migration: %s", st.text);
	return 0;
}

static int finish(struct lmt_session *s, const void *state, size_t length)
{
	int rc;
	if (s->file_path) {
		if ((rc = send_rest(s)))
			return rc;
		return lmt__file_save_finish(s, state, length, s->source->pass,
		                             s->source->switchover_deadline);
	}
	if ((rc = send_rest(s)) || (rc = lmt__source_settle_keys(s)) || (rc = lmt__source_report_landed(s, false)) ||
	    (rc = lmt__source_send_state(s, state, length)))
		return rc;
	if (s->ctrl_unix && (rc = lmt__handover_send(s)))
		return rc;
	if (s->verify && (rc = lmt__verify_send(s, lmt__source_reply_deadline(s))))
		return rc == -LMT_ETIMEDOUT && lmt__now() >= s->source->switchover_deadline
		               ? lmt__source_switchover_expired(s, "sending the digests")
		               : rc;
	return send_complete(s, length);
}

/* Postcopy: the guest is paused. Nothing is left in flight and the last
 * dirty pages are synced: what is dirty now is what the destination
 * lacks, and postcopy.c takes over from here. */
static int postcopy_prepare(struct lmt_session *s)
{
	struct lmt_source_engine *e = s->source;
	uint64_t end = e->switchover_deadline;
	int rc;
	if (e->pass == 0)
		return lmt__source_start_first_pass(s);
	uint64_t t0 = lmt__now();
	if ((rc = end_cut_pass(s)) || (rc = lmt__source_settle_keys(s)))
		return rc;
	uint64_t now = lmt__now();
	if (now >= end)
		return lmt__source_switchover_expired(s, "before the flush");
	rc = s->desc->ops.flush(s->inst, end - now < s->idle_timeout_ns ? end - now
	                                                               : s->idle_timeout_ns);
	if (rc)
		return lmt__fail(s, rc, "plugin %s: flush failed (%s)", s->desc->name,
		                 lmt_err_name(rc));
	uint64_t t2 = lmt__now();
	rc = lmt__source_report_landed(s, false);
	lmt__session_log(s, LMT_LOG_DEBUG,
	                 "postcopy: last pass cut in %.2f ms, flushed in %.2f, landed reported "
	                 "in %.2f",
	                 (double)(now - t0) / 1e6, (double)(t2 - now) / 1e6,
	                 (double)(lmt__now() - t2) / 1e6);
	return rc;
}

static int save_postcopy(lmt_session *s, const void *device_state, size_t length)
{
	struct lmt_source_engine *e = s->source;
	uint64_t t0 = lmt__now();
	e->switchover_deadline = t0 + e->switchover_timeout_ns;
	int rc = postcopy_prepare(s);
	if (!rc)
		rc = lmt__postcopy_source_switch(s, device_state, length, e->pass,
		                                 e->switchover_deadline);
	if (rc == -LMT_ETIMEDOUT && lmt__now() >= e->switchover_deadline)
		rc = lmt__source_switchover_expired(s, "switching to postcopy");
	if (rc)
		return lmt__abort(s, rc);
	pthread_mutex_lock(&s->lock);
	s->stats.downtime_ns = lmt__now() - t0;
	s->stats.expected_downtime_ns = 0;
	s->stats.expected_downtime_known = 1;
	s->stats.status = LMT_STATUS_POSTCOPY;
	pthread_mutex_unlock(&s->lock);
	lmt__source_release_throttle(s);
	lmt__event_simple(s, LMT_EVENT_POSTCOPY, 0);
	return 0;
}

/* What lmt_save_complete and lmt_save_postcopy refuse alike. */
static int check_pause(lmt_session *s, const void *device_state, size_t length,
                       const char *what)
{
	if (s->role != LMT_ROLE_SOURCE || atomic_load(&s->state) != LMT_STATE_ACTIVE ||
	    s->postcopy)
		return lmt__usage(s, LMT_ESTATE, "%s: the session is not migrating", what);
	if (length && !device_state)
		return lmt__usage(s, LMT_EINVAL, "%s: %zu bytes of device state at NULL", what,
		                  length);
	if (length > LMT_PROTO_MAX_STATE)
		return lmt__usage(s, LMT_EOVERFLOW, "%s: device state of %zu bytes over 1G", what,
		                  length);
	return 0;
}

static int save_complete(lmt_session *s, const void *device_state, size_t length)
{
	int refused = check_pause(s, device_state, length, "save complete");
	if (refused)
		return refused;
	if (s->source->postcopy_due)
		return save_postcopy(s, device_state, length);
	uint64_t t0 = lmt__now();
	s->source->switchover_deadline = t0 + s->source->switchover_timeout_ns;
	pthread_mutex_lock(&s->lock);
	s->stats.status = LMT_STATUS_COMPLETING;
	pthread_mutex_unlock(&s->lock);
	int rc = finish(s, device_state, length);
	if (rc)
		return lmt__abort(s, rc);
	uint64_t acked = lmt__now();
	lmt__file_free(s);
	lmt__transport_close(s);
	lmt__ctrl_close(s);
	pthread_mutex_lock(&s->lock);
	s->stats.downtime_ns = acked - t0;
	s->stats.expected_downtime_ns = 0;
	s->stats.expected_downtime_known = 1;
	lmt__stats_end(s, LMT_STATUS_COMPLETED);
	pthread_mutex_unlock(&s->lock);
	lmt__source_release_throttle(s);
	atomic_store(&s->state, LMT_STATE_DONE);
	lmt__event_simple(s, LMT_EVENT_COMPLETED, 0);
	return 0;
}

int lmt_save_complete(lmt_session *s, const void *device_state, size_t length)
{
	if (!s)
		return -LMT_EINVAL;
	if (lmt__job_owns(s))
		return lmt__usage(
		        s, LMT_ESTATE,
		        "save complete: a job started with lmt_save_start runs this session");
	lmt__call_enter(s);
	int rc = save_complete(s, device_state, length);
	lmt__call_leave(s);
	return rc;
}

int lmt_save_postcopy(lmt_session *s, const void *device_state, size_t length)
{
	if (!s)
		return -LMT_EINVAL;
	if (lmt__job_owns(s))
		return lmt__usage(
		        s, LMT_ESTATE,
		        "save postcopy: a job started with lmt_save_start runs this session");
	int rc = check_pause(s, device_state, length, "save postcopy");
	if (!rc && !s->postcopy_on)
		rc = lmt__usage(s, LMT_EINVAL,
		                "save postcopy: postcopy=off (set postcopy=on on both sides "
		                "before setup)");
	if (rc)
		return rc;
	lmt__call_enter(s);
	rc = save_postcopy(s, device_state, length);
	lmt__call_leave(s);
	return rc;
}

/* After the switch: wait for the postcopy thread, then end the migration
 * as lmt_save_complete ends a precopy one. */
static int save_finish(lmt_session *s)
{
	int rc = lmt__postcopy_finish(s);
	if (rc)
		return lmt__abort(s, rc);
	lmt__transport_close(s);
	lmt__ctrl_close(s);
	pthread_mutex_lock(&s->lock);
	lmt__stats_end(s, LMT_STATUS_COMPLETED);
	s->finishing = false;
	pthread_mutex_unlock(&s->lock);
	atomic_store(&s->state, LMT_STATE_DONE);
	lmt__event_simple(s, LMT_EVENT_COMPLETED, 0);
	return 0;
}

int lmt_save_finish(lmt_session *s)
{
	if (!s)
		return -LMT_EINVAL;
	if (s->role != LMT_ROLE_SOURCE)
		return lmt__usage(s, LMT_ESTATE, "save finish: this session is a destination");
	int state = atomic_load(&s->state);
	if (state == LMT_STATE_DONE)
		return 0;
	if (state == LMT_STATE_FAILED)
		return lmt__usage(s, LMT_ESTATE, "save finish: the migration failed: %s",
		                  lmt_session_error(s)->message);
	pthread_mutex_lock(&s->lock);
	bool postcopy = s->postcopy && !s->finishing;
	s->finishing = postcopy;
	pthread_mutex_unlock(&s->lock);
	if (!postcopy)
		return lmt__usage(s, LMT_ESTATE,
		                  "save finish: no postcopy to finish (lmt_save_postcopy or "
		                  "lmt_save_complete must return 0 first, and only one call "
		                  "waits)");
	lmt__call_enter(s);
	int rc = save_finish(s);
	lmt__call_leave(s);
	return rc;
}

int lmt_save_set_device_state_size(lmt_session *s, uint64_t bytes)
{
	if (!s)
		return -LMT_EINVAL;
	if (s->role != LMT_ROLE_SOURCE)
		return lmt__usage(s, LMT_ESTATE,
		                  "device state size: only a source sends a device state");
	if (bytes > LMT_PROTO_MAX_STATE)
		return lmt__usage(s, LMT_EOVERFLOW,
		                  "device state size: %llu bytes is over the limit of 1G",
		                  (unsigned long long)bytes);
	atomic_store(&s->source->device_state_bytes, bytes);
	return 0;
}

