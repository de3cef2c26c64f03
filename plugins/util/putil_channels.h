/* The channel table of a plugin instance: each channel's endpoint, the
 * completion queue that channel threads fill and the core's progress
 * drains, and the state machine that turns a failure into an error only
 * once every write has been reported. Part of the plugin utility layer. */
#ifndef LMT_PUTIL_CHANNELS_H
#define LMT_PUTIL_CHANNELS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <lmt/plugin.h>

#include "putil_base.h"

struct putil_channel {
	void *ep;                /* the plugin's endpoint; NULL when closed */
	atomic_uint outstanding; /* posted, completion not yet harvested */
	uint64_t posted;         /* writes accepted; the core's thread only */
	uint64_t reported;       /* completions queued */
	uint64_t flush_target;   /* posted when the running flush began */
	bool live;               /* source: running, so it will settle */
	int final;               /* source: 0, or the status it settled with */
};

/*
 * Failure on the source: the first channel to fail records `failing` and
 * breaks the others; each live channel then reports every write it still
 * owes with an error status and settles. Once every live channel has
 * settled, `fatal` takes the failure, and progress returns it after the
 * last completion, so that the core sees every cookie exactly once. On the
 * destination, `fatal` is simply the first error of a channel thread.
 */
struct putil_channels {
	const struct putil_instance *base;
	pthread_mutex_t lock; /* everything but `outstanding` and `posted` */
	pthread_cond_t cond;  /* broadcast on every change under `lock` */
	uint32_t count;
	uint32_t depth; /* writes per channel posted and not harvested */
	struct putil_channel *ch;
	struct lmt_completion *ring; /* source: count * depth entries */
	uint32_t ring_first, ring_used;
	int failing; /* -LMT_E*: the source's first failure */
	int fatal;   /* -LMT_E*: what progress reports */
};

/* Called under the lock for each live channel when the source fails. */
typedef void (*putil_break_fn)(void *ep, int status);

/* 0, or an error recorded through the host. */
int putil_channels_init(struct putil_channels *c, const struct putil_instance *base,
                        uint32_t depth);
void putil_channels_fini(struct putil_channels *c);

/* ep_open: `channel` is in range and not open. 0 or a recorded error. */
int putil_channels_check_open(struct putil_channels *c, uint32_t channel);
void putil_channels_attach(struct putil_channels *c, uint32_t channel, void *ep);
/* ep_close: out of the table first, as other channels' threads look there. */
void putil_channels_detach(struct putil_channels *c, uint32_t channel);
/* ep_close, once the channel's threads are gone: its writes are abandoned,
 * so its completions not yet harvested go; once no channel is open, the
 * failure is over and channels opened again start clean. */
void putil_channels_closed(struct putil_channels *c, uint32_t channel);
/* The endpoint of `channel`, or NULL. Call with the lock held when
 * another thread may attach or detach. */
void *putil_channels_endpoint(const struct putil_channels *c, uint32_t channel);

/* write: 0, or -LMT_EAGAIN while `depth` writes of the channel are not
 * harvested. Then, once the write was accepted, putil_channels_posted. */
int putil_channels_admit(struct putil_channels *c, uint32_t channel);
void putil_channels_posted(struct putil_channels *c, uint32_t channel);

/* Queue a completion for the core. The ring never fills: a channel holds
 * at most `depth` writes that were not harvested. */
void putil_channels_complete(struct putil_channels *c, uint32_t channel, uint64_t cookie,
                             int status);
void putil_channels_complete_locked(struct putil_channels *c, uint32_t channel, uint64_t cookie,
                                    int status);

/* Source: record the first failure and break every live channel. */
void putil_channels_fail(struct putil_channels *c, int status, putil_break_fn break_channel);
/* Source: a connected channel starts; broken at once if the source failed. */
void putil_channels_go_live(struct putil_channels *c, uint32_t channel,
                            putil_break_fn break_channel);
/* Source: the channel reported every write it owed; `status` is how the
 * last ones ended (0 when it closed cleanly). */
void putil_channels_settle(struct putil_channels *c, uint32_t channel, int status);
void putil_channels_settle_locked(struct putil_channels *c, uint32_t channel, int status);
/* The source's first failure (0 if none). */
int putil_channels_failing(struct putil_channels *c);
/* Destination: a channel thread's error, returned by progress. */
void putil_channels_set_fatal(struct putil_channels *c, int code);

/* The ABI's progress: up to `max` completions, waiting at most
 * `timeout_ns` for the first; the failure once every cookie is out. */
int putil_channels_progress(struct putil_channels *c, struct lmt_completion *out, uint32_t max,
                            uint64_t timeout_ns);
/* Take up to `max` queued completions; call with the lock held. */
uint32_t putil_channels_drain_locked(struct putil_channels *c, struct lmt_completion *out,
                                     uint32_t max);
/* The ABI's flush for plugins whose completions mean "visible at the
 * target": wait until every write posted before the call was reported. */
int putil_channels_flush(struct putil_channels *c, uint64_t timeout_ns);

#endif
