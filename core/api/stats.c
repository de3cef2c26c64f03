/* The statistics snapshot (API room): the session's figures with those of
 * a lazy restore and of postcopy, read under the session's lock. */
#include "error.h"
#include "lazy.h"
#include "postcopy.h"
#include "session.h"

int lmt_session_stats(lmt_session *s, struct lmt_stats *out)
{
	if (!s)
		return -LMT_EINVAL;
	if (!out)
		return lmt__usage(s, LMT_EINVAL, "stats: no place for them (out is NULL)");
	pthread_mutex_lock(&s->lock);
	*out = s->stats;
	lmt__lazy_stats(s, out);
	lmt__postcopy_stats(s, out);
	if (!lmt__status_ended(out->status) && s->start_ns)
		out->total_ns = lmt__now() - s->start_ns;
	pthread_mutex_unlock(&s->lock);
	uint64_t bytes = out->bytes_sent + out->bytes_received;
	out->throughput_bps =
	        out->total_ns ? (uint64_t)((double)bytes * 1e9 / (double)out->total_ns) : 0;
	return 0;
}
