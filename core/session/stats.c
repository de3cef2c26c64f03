/* Statistics (session room): the status names, the end of a migration's
 * clock, the pass timeline and the JSON form. The snapshot a VMM takes
 * reads the restore and postcopy figures too, so it is the API room's
 * (core/api/stats.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "session.h"

static const char *const status_names[] = {
        [LMT_STATUS_NEW] = "new",
        [LMT_STATUS_SETUP] = "setup",
        [LMT_STATUS_ACTIVE] = "active",
        [LMT_STATUS_COMPLETING] = "completing",
        [LMT_STATUS_COMPLETED] = "completed",
        [LMT_STATUS_FAILED] = "failed",
        [LMT_STATUS_CANCELLED] = "cancelled",
        [LMT_STATUS_POSTCOPY] = "postcopy",
        [LMT_STATUS_POSTCOPY_FAILED] = "postcopy-failed",
};

const char *lmt_status_name(enum lmt_status status)
{
	if ((unsigned)status <= LMT_STATUS_POSTCOPY_FAILED)
		return status_names[status];
	return "unknown";
}

bool lmt__status_ended(enum lmt_status status)
{
	return status == LMT_STATUS_COMPLETED || status == LMT_STATUS_FAILED ||
	       status == LMT_STATUS_CANCELLED || status == LMT_STATUS_POSTCOPY_FAILED;
}

void lmt__stats_end(struct lmt_session *s, enum lmt_status status)
{
	/* The clock is read under the lock, so that no snapshot taken before
	 * shows a running total beyond the final one. */
	if (!lmt__status_ended(s->stats.status) && s->start_ns)
		s->stats.total_ns = lmt__now() - s->start_ns;
	s->stats.status = status;
}

void lmt__pass_record(struct lmt_session *s, const struct lmt_pass_stats *pass)
{
	pthread_mutex_lock(&s->lock);
	if (s->npasses == s->passes_cap) {
		uint32_t cap = s->passes_cap ? s->passes_cap * 2 : 16;
		struct lmt_pass_stats *p = realloc(s->passes, cap * sizeof(*p));
		if (p) {
			s->passes = p;
			s->passes_cap = cap;
		}
	}
	if (s->npasses < s->passes_cap)
		s->passes[s->npasses++] = *pass;
	pthread_mutex_unlock(&s->lock);
	lmt__event_post(s, &(struct lmt_event){.type = LMT_EVENT_PASS_END, .pass = *pass});
}

int lmt_session_passes(lmt_session *s, struct lmt_pass_stats *out, uint32_t max)
{
	if (!s)
		return -LMT_EINVAL;
	if (!out && max)
		return lmt__usage(s, LMT_EINVAL, "passes: no place for %u of them (out is NULL)",
		                  max);
	pthread_mutex_lock(&s->lock);
	uint32_t n = s->npasses;
	for (uint32_t i = 0; i < n && i < max; i++)
		out[i] = s->passes[i];
	pthread_mutex_unlock(&s->lock);
	return (int)n;
}

static double ms(uint64_t ns)
{
	return (double)ns / 1e6;
}

/* An unknown expected downtime is null: no number stands for "unknown". */
int lmt_stats_json(const struct lmt_stats *st, char *buf, size_t size)
{
	if (!st || (!buf && size))
		return -LMT_EINVAL;
	char channels[LMT_MAX_CHANNELS * 24 + 4] = "";
	size_t used = 0;
	for (uint32_t c = 0; c < st->channels && c < LMT_MAX_CHANNELS; c++)
		used += (size_t)snprintf(channels + used, sizeof(channels) - used, "%s%llu",
		                         c ? "," : "", (unsigned long long)st->channel_bytes[c]);
	char expected[32] = "null";
	if (st->expected_downtime_known)
		snprintf(expected, sizeof(expected), "%.3f", ms(st->expected_downtime_ns));
	int n = snprintf(buf, size,
	                 "{\"status\":\"%s\",\"setup_ms\":%.3f,\"total_ms\":%.3f,"
	                 "\"downtime_ms\":%.3f,\"expected_downtime_ms\":%s,"
	                 "\"ram_bytes\":%llu,\"bytes_sent\":%llu,\"bytes_received\":%llu,"
	                 "\"remaining_bytes\":%llu,"
	                 "\"zero_pages\":%llu,\"normal_pages\":%llu,\"writes\":%llu,"
	                 "\"passes\":%llu,\"dirty_rate_bps\":%llu,\"throughput_bps\":%llu,"
	                 "\"bandwidth_bps\":%llu,\"throttle_percent\":%u,\"channels\":%u,"
	                 "\"channel_bytes\":[%s],\"resume_ms\":%.3f,\"faults\":%llu,"
	                 "\"fault_p50_ms\":%.3f,\"fault_p99_ms\":%.3f,\"fault_max_ms\":%.3f,"
	                 "\"background_pages\":%llu,\"postcopy_pages\":%llu,"
	                 "\"postcopy_requested\":%llu,\"zero_run_bytes\":%llu}",
	                 lmt_status_name(st->status), ms(st->setup_ns), ms(st->total_ns),
	                 ms(st->downtime_ns), expected, (unsigned long long)st->ram_bytes,
	                 (unsigned long long)st->bytes_sent, (unsigned long long)st->bytes_received,
	                 (unsigned long long)st->remaining_bytes,
	                 (unsigned long long)st->zero_pages, (unsigned long long)st->normal_pages,
	                 (unsigned long long)st->writes, (unsigned long long)st->passes,
	                 (unsigned long long)st->dirty_rate_bps,
	                 (unsigned long long)st->throughput_bps,
	                 (unsigned long long)st->bandwidth_bps, st->throttle_percent, st->channels,
	                 channels, ms(st->resume_ns), (unsigned long long)st->faults,
	                 ms(st->fault_p50_ns), ms(st->fault_p99_ns), ms(st->fault_max_ns),
	                 (unsigned long long)st->background_pages,
	                 (unsigned long long)st->postcopy_pages,
	                 (unsigned long long)st->postcopy_requested,
	                 (unsigned long long)st->zero_run_bytes);
	return n < 0 ? -LMT_EIO : n;
}
