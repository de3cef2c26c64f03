/* shm peers in one process. libfabric 1.17's shm reaches a peer endpoint
 * of the same process through that endpoint's own mapping of its region,
 * not a mapping of its own, and unmaps it when that endpoint closes. A
 * source whose destination, in this process, closed first (lmt-plugin-
 * check, a VMM migrating to itself) would then post into unmapped memory
 * and fault. So the shm endpoints of the process are listed here, a
 * source posts through a shared gate, and a destination's close takes the
 * gate exclusively and marks its sources shut out before its region goes:
 * their posts fail (FI_ENOTCONN) instead, which fails their session.
 * Between processes each side maps the other's region itself and none of
 * this applies. */
#define _GNU_SOURCE
#include "shmlocal.h"

#include <string.h>

static pthread_rwlock_t gate = PTHREAD_RWLOCK_INITIALIZER;
static lmt_endpoint *listed; /* through shm_next, under the gate held exclusively */

void lfi_shmlocal_add(lmt_endpoint *ep)
{
	if (!ep->inst->shm || ep->shm_listed)
		return;
	pthread_rwlock_wrlock(&gate);
	ep->shm_next = listed;
	listed = ep;
	ep->shm_listed = true;
	pthread_rwlock_unlock(&gate);
}

void lfi_shmlocal_remove(lmt_endpoint *ep)
{
	if (!ep->shm_listed)
		return;
	pthread_rwlock_wrlock(&gate);
	for (lmt_endpoint **p = &listed; *p; p = &(*p)->shm_next)
		if (*p == ep) {
			*p = ep->shm_next;
			break;
		}
	ep->shm_listed = false;
	if (ep->inst->base.role == LMT_ROLE_DESTINATION && ep->shm_name[0])
		for (lmt_endpoint *s = listed; s; s = s->shm_next)
			if (s->inst->base.role == LMT_ROLE_SOURCE &&
			    strcmp(s->shm_peer_addr, ep->shm_name) == 0 &&
			    !atomic_load(&s->shm_shut)) {
				atomic_store(&s->shm_shut, true);
				putil_log(&s->inst->base, LMT_LOG_DEBUG,
				          "ofi channel %u: the destination, in this process, closed "
				          "its endpoint: its writes fail from now on",
				          s->channel);
			}
	pthread_rwlock_unlock(&gate);
}

bool lfi_shmlocal_enter(lmt_endpoint *ep)
{
	if (!ep->shm_listed)
		return true;
	pthread_rwlock_rdlock(&gate);
	if (!atomic_load(&ep->shm_shut))
		return true;
	pthread_rwlock_unlock(&gate);
	return false;
}

void lfi_shmlocal_leave(lmt_endpoint *ep)
{
	if (ep->shm_listed)
		pthread_rwlock_unlock(&gate);
}
