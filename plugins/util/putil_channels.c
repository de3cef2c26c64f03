/* The channel table, completion queue and failure settling (see
 * channels.h). */
#include "putil_channels.h"

#include <stdlib.h>

#include "sync.h"

int putil_channels_init(struct putil_channels *c, const struct putil_instance *base, uint32_t depth)
{
	*c = (struct putil_channels){.base = base, .count = base->channels, .depth = depth};
	c->ch = calloc(c->count, sizeof(*c->ch));
	if (base->role == LMT_ROLE_SOURCE)
		c->ring = calloc((size_t)c->count * depth, sizeof(*c->ring));
	const char *what = "out of memory for the channels";
	if (c->ch && (base->role != LMT_ROLE_SOURCE || c->ring)) {
		what = "cannot create locks";
		if (pthread_mutex_init(&c->lock, NULL) == 0) {
			if (lmt__cond_init(&c->cond) == 0)
				return 0;
			pthread_mutex_destroy(&c->lock);
		}
	}
	/* Left empty: putil_channels_fini and lookups see no channels. */
	free(c->ch);
	free(c->ring);
	*c = (struct putil_channels){.base = base};
	return putil_error(base, LMT_ENOMEM, "%s: %s", base->name, what);
}

void putil_channels_fini(struct putil_channels *c)
{
	if (!c->ch)
		return;
	pthread_cond_destroy(&c->cond);
	pthread_mutex_destroy(&c->lock);
	free(c->ch);
	free(c->ring);
	c->ch = NULL;
	c->ring = NULL;
}

int putil_channels_check_open(struct putil_channels *c, uint32_t channel)
{
	const struct putil_instance *base = c->base;
	if (channel >= c->count)
		return putil_error(base, LMT_EINVAL, "%s: channel %u out of range (%u channels)",
		                   base->name, channel, c->count);
	pthread_mutex_lock(&c->lock);
	bool open = c->ch[channel].ep != NULL;
	pthread_mutex_unlock(&c->lock);
	if (open)
		return putil_error(base, LMT_ESTATE, "%s channel %u: already open", base->name,
		                   channel);
	return 0;
}

void putil_channels_attach(struct putil_channels *c, uint32_t channel, void *ep)
{
	pthread_mutex_lock(&c->lock);
	c->ch[channel].ep = ep;
	pthread_cond_broadcast(&c->cond);
	pthread_mutex_unlock(&c->lock);
}

/* Whether every live source channel has settled. Called with the lock. */
static bool all_settled(const struct putil_channels *c)
{
	for (uint32_t i = 0; i < c->count; i++)
		if (c->ch[i].ep && c->ch[i].live && !c->ch[i].final)
			return false;
	return true;
}

/* After a change that may settle the last channel. Called with the lock. */
static void check_settled(struct putil_channels *c)
{
	if (c->failing && !c->fatal && all_settled(c))
		c->fatal = c->failing;
	pthread_cond_broadcast(&c->cond);
}

/* A closed channel's writes are abandoned: completions of them still
 * queued go, and the channel starts afresh if it is opened again. Called
 * with the lock. */
static void forget_channel(struct putil_channels *c, uint32_t channel)
{
	uint32_t cap = c->count * c->depth, kept = 0;
	for (uint32_t k = 0; k < c->ring_used; k++) {
		struct lmt_completion e = c->ring[(c->ring_first + k) % cap];
		if (e.channel != channel)
			c->ring[(c->ring_first + kept++) % cap] = e;
	}
	c->ring_used = kept;
	c->ch[channel] = (struct putil_channel){0};
}

void putil_channels_detach(struct putil_channels *c, uint32_t channel)
{
	pthread_mutex_lock(&c->lock);
	c->ch[channel].ep = NULL;
	check_settled(c);
	pthread_mutex_unlock(&c->lock);
}

void putil_channels_closed(struct putil_channels *c, uint32_t channel)
{
	pthread_mutex_lock(&c->lock);
	forget_channel(c, channel);
	bool any = false;
	for (uint32_t i = 0; i < c->count; i++)
		any |= c->ch[i].ep != NULL;
	if (!any) {
		/* The failure ends with the endpoints it broke: channels opened
		 * again start clean (docs/writing-a-plugin.md, "Reopening a
		 * channel"). */
		c->failing = 0;
		c->fatal = 0;
	}
	pthread_cond_broadcast(&c->cond);
	pthread_mutex_unlock(&c->lock);
}

void *putil_channels_endpoint(const struct putil_channels *c, uint32_t channel)
{
	return channel < c->count ? c->ch[channel].ep : NULL;
}

int putil_channels_admit(struct putil_channels *c, uint32_t channel)
{
	return atomic_load(&c->ch[channel].outstanding) >= c->depth ? -LMT_EAGAIN : 0;
}

void putil_channels_posted(struct putil_channels *c, uint32_t channel)
{
	atomic_fetch_add(&c->ch[channel].outstanding, 1);
	c->ch[channel].posted++;
}

void putil_channels_complete_locked(struct putil_channels *c, uint32_t channel, uint64_t cookie,
                                    int status)
{
	uint32_t cap = c->count * c->depth;
	if (c->ring && c->ring_used < cap) {
		c->ring[(c->ring_first + c->ring_used++) % cap] = (struct lmt_completion){
		        .cookie = cookie, .status = status, .channel = channel};
		c->ch[channel].reported++;
	}
	pthread_cond_broadcast(&c->cond);
}

void putil_channels_complete(struct putil_channels *c, uint32_t channel, uint64_t cookie,
                             int status)
{
	pthread_mutex_lock(&c->lock);
	putil_channels_complete_locked(c, channel, cookie, status);
	pthread_mutex_unlock(&c->lock);
}

void putil_channels_fail(struct putil_channels *c, int status, putil_break_fn break_channel)
{
	pthread_mutex_lock(&c->lock);
	if (!c->failing) {
		c->failing = status;
		for (uint32_t i = 0; i < c->count; i++)
			if (c->ch[i].ep && c->ch[i].live && break_channel)
				break_channel(c->ch[i].ep, status);
	}
	check_settled(c);
	pthread_mutex_unlock(&c->lock);
}

void putil_channels_go_live(struct putil_channels *c, uint32_t channel,
                            putil_break_fn break_channel)
{
	pthread_mutex_lock(&c->lock);
	c->ch[channel].live = true;
	if (c->failing && break_channel)
		break_channel(c->ch[channel].ep, c->failing);
	pthread_mutex_unlock(&c->lock);
}

void putil_channels_settle_locked(struct putil_channels *c, uint32_t channel, int status)
{
	c->ch[channel].final = status;
	check_settled(c);
}

void putil_channels_settle(struct putil_channels *c, uint32_t channel, int status)
{
	pthread_mutex_lock(&c->lock);
	putil_channels_settle_locked(c, channel, status);
	pthread_mutex_unlock(&c->lock);
}

int putil_channels_failing(struct putil_channels *c)
{
	pthread_mutex_lock(&c->lock);
	int failing = c->failing;
	pthread_mutex_unlock(&c->lock);
	return failing;
}

void putil_channels_set_fatal(struct putil_channels *c, int code)
{
	pthread_mutex_lock(&c->lock);
	if (!c->fatal)
		c->fatal = code;
	pthread_cond_broadcast(&c->cond);
	pthread_mutex_unlock(&c->lock);
}

uint32_t putil_channels_drain_locked(struct putil_channels *c, struct lmt_completion *out,
                                     uint32_t max)
{
	uint32_t cap = c->count * c->depth, n = 0;
	while (c->ring_used && n < max) {
		out[n] = c->ring[c->ring_first];
		atomic_fetch_sub(&c->ch[out[n].channel].outstanding, 1);
		c->ring_first = (c->ring_first + 1) % cap;
		c->ring_used--;
		n++;
	}
	return n;
}

int putil_channels_progress(struct putil_channels *c, struct lmt_completion *out, uint32_t max,
                            uint64_t timeout_ns)
{
	if (!out && max)
		return -LMT_EINVAL;
	const struct putil_instance *base = c->base;
	uint64_t deadline = lmt__deadline(timeout_ns);
	int rc = 0;
	pthread_mutex_lock(&c->lock);
	/* Completions come before the failure, so that every cookie is seen. */
	while (!c->ring_used || !max) {
		if (c->fatal || !max) {
			rc = c->fatal;
			goto out;
		}
		if (putil_cancelled(base)) {
			rc = putil_error(base, LMT_ECANCELED, "%s: cancelled", base->name);
			goto out;
		}
		if (lmt__now_ns() >= deadline)
			goto out;
		lmt__cond_wait_slice(&c->cond, &c->lock, deadline);
	}
	rc = (int)putil_channels_drain_locked(c, out, max);
out:
	pthread_mutex_unlock(&c->lock);
	return rc;
}

/* 1 once every write counted in flush_target was reported, 0 if not yet,
 * or the failure. Called with the lock held. */
static int flush_done(const struct putil_channels *c)
{
	if (c->failing)
		return c->failing;
	int done = 1;
	for (uint32_t i = 0; i < c->count; i++) {
		const struct putil_channel *ch = &c->ch[i];
		if (!ch->ep || ch->reported >= ch->flush_target)
			continue;
		if (ch->final)
			return ch->final;
		done = 0;
	}
	return c->fatal ? c->fatal : done;
}

int putil_channels_flush(struct putil_channels *c, uint64_t timeout_ns)
{
	const struct putil_instance *base = c->base;
	if (base->role != LMT_ROLE_SOURCE)
		return 0;
	uint64_t deadline = lmt__deadline(timeout_ns);
	int rc;
	pthread_mutex_lock(&c->lock);
	for (uint32_t i = 0; i < c->count; i++)
		c->ch[i].flush_target = c->ch[i].posted;
	while ((rc = flush_done(c)) == 0) {
		if (putil_cancelled(base)) {
			rc = putil_error(base, LMT_ECANCELED, "%s: flush cancelled", base->name);
			break;
		}
		if (lmt__now_ns() >= deadline) {
			rc = putil_error(base, LMT_ETIMEDOUT,
			                 "%s: flush timed out after %llu ms with writes not yet "
			                 "visible",
			                 base->name, (unsigned long long)(timeout_ns / 1000000));
			break;
		}
		lmt__cond_wait_slice(&c->cond, &c->lock, deadline);
	}
	pthread_mutex_unlock(&c->lock);
	return rc < 0 ? rc : 0;
}
