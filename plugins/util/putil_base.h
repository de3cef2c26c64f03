/* The plugin utility layer's base: what every in-tree plugin instance
 * holds (host services, role, channels, timeout), the checks of
 * instance_open's arguments, logging and errors through the host, option
 * lookups, deadlines and threads. Static and hidden in each plugin; never
 * part of the ABI, which an out-of-tree plugin uses alone. */
#ifndef LMT_PUTIL_BASE_H
#define LMT_PUTIL_BASE_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <lmt/plugin.h>

#include "net.h"
#include "sync.h"

struct putil_instance {
	const struct lmt_host *host;
	void *host_ctx;
	const char *name; /* the plugin's name, which starts its messages */
	enum lmt_role role;
	uint32_t channels;
	uint64_t timeout_ns; /* bound for one blocking call; 0 = none */
	char local_host[sizeof(((struct lmt_instance_params *)0)->local_host) + 1];
	char peer_host[sizeof(((struct lmt_instance_params *)0)->peer_host) + 1];
};

/* Check instance_open's arguments before anything is allocated: the host
 * table has every service the plugin calls, the parameters are of a known
 * size, the role is known and there are 1 to max_channels channels.
 * Returns 0, or the error recorded through the host. */
int putil_instance_check(const char *name, const struct lmt_host *host, void *host_ctx,
                         const struct lmt_instance_params *params, uint32_t max_channels);

/* Fill a base from checked arguments. */
void putil_instance_init(struct putil_instance *base, const char *name, const struct lmt_host *host,
                         void *host_ctx, const struct lmt_instance_params *params);

#define putil_log(base, level, ...) (base)->host->log((base)->host_ctx, level, __VA_ARGS__)

/* Record an error in the session and return -code, whatever the host
 * returns: `return putil_error(base, LMT_EIO, "tcp channel %u: ...", c);` */
int putil_error(const struct putil_instance *base, int code, const char *fmt, ...) LMT_PRINTF(3, 4);

bool putil_cancelled(const struct putil_instance *base);

/* Options by qualified name ("tcp.nodelay"). The core parsed and checked
 * them against the plugin's schema; `fallback` is for a host that does
 * not know the name or gives another type. */
bool putil_option_bool(const struct putil_instance *base, const char *name, bool fallback);
int64_t putil_option_int(const struct putil_instance *base, const char *name, int64_t fallback);
/* ENUM options: the index of the value among enum_values. */
int putil_option_enum(const struct putil_instance *base, const char *name, int fallback);
/* STRING options: the text (owned by the session), or fallback. */
const char *putil_option_text(const struct putil_instance *base, const char *name,
                              const char *fallback);

/* The deadline of one blocking call from now: the instance timeout, or
 * UINT64_MAX without one. */
uint64_t putil_call_deadline(const struct putil_instance *base);
/* What the socket helpers check while they wait: that deadline and the
 * session's cancel flag. */
struct lmt__wait putil_wait(const struct putil_instance *base, uint64_t deadline_ns);
/* Why a wait bounded by `timeout_ns` from its start must stop:
 * -LMT_ECANCELED or -LMT_ETIMEDOUT, recorded as "<what>: cancelled" or
 * "<what>: timed out after N ms"; 0 to go on. */
int putil_wait_check(const struct putil_instance *base, uint64_t deadline_ns, uint64_t timeout_ns,
                     const char *what);

/* `len` bytes from the kernel's CSPRNG (getrandom(2)): 0, or -LMT_EIO
 * recorded. For every secret a plugin hands out: tokens, keys, region ids. */
int putil_random(const struct putil_instance *base, void *buf, size_t len);
/* A value drawn uniformly from [1, max] (max > 0) with putil_random: 0, or
 * the error recorded. Never 0, so that 0 can mean "none". */
int putil_random_id(const struct putil_instance *base, uint64_t max, uint64_t *out);

/* Sleep `ns` nanoseconds (less than a second), for a thread that polls
 * something it cannot wait on. */
void putil_nap(uint64_t ns);

/* How often a plugin thread that keeps a core busy gives it up. */
#define PUTIL_SHARE_NS 250000ull
/* For a thread that may run for milliseconds without sleeping (moving
 * bulk data, driving a library's progress): sched_yield() when `*last`
 * (0 at first, then kept by this function) is PUTIL_SHARE_NS or more ago.
 * Some kernels hand a busy core to a thread they wake on it (the VMM's,
 * waiting in lmt_save_iterate) only at the next scheduler tick, 4 ms away
 * at 250 Hz. */
void putil_share_core(uint64_t *last);

#endif
