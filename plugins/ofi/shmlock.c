/* The spin locks of shm's regions that a stopped or dead peer holds.
 * libfabric 1.17's shm guards each endpoint's region with a spin lock in
 * the shared memory: its owner takes it whenever it progresses (polling,
 * so about a fifth of the time here), and every peer takes it to post a
 * write. A peer stopped (SIGSTOP) or killed while it holds one leaves it
 * held, and whoever calls into the provider next spins in it for good,
 * out of reach of any timeout or cancel: a channel's thread, then the
 * close that joins it.
 *
 * So a channel over shm finds both locks it depends on, its own region's
 * and its peer's, in the regions the provider mapped in this process
 * (/dev/shm/<name>, the lock at the offset 1.17's smr_region has, checked
 * against both regions' headers), and: its thread calls nothing of the
 * provider's while a lock is held by a peer that is gone, a zombie or
 * stopped; and at close a lock such a peer kept holding is released, as
 * pthread_spin_unlock does, so that the thread and the close go through.
 * Only a peer that no longer runs is treated so: one that runs releases
 * its lock soon. Nothing is done at all unless everything checks out: the
 * library is 1.17, both headers carry 1.17's region version, the own
 * region's owner and address are this process's and where it is mapped,
 * the peer's name is one lmt gives, and the process the peer's header
 * names maps the peer's region itself (not another process by the same
 * pid, in another pid namespace, say). The peer's state is read afresh
 * before each release. */
#define _GNU_SOURCE
#include "shmlock.h"

#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <rdma/fabric.h>

/* struct smr_region of libfabric 1.17 (prov/shm/src/smr_util.h): its
 * version, the owner's pid, the address the owner maps it at, the lock. */
#define LFI_REGION_VERSION 0
#define LFI_REGION_VERSION_1_17 4
#define LFI_REGION_PID 4
#define LFI_REGION_BASE 16
#define LFI_REGION_LOCK 24
#define LFI_PEER_CHECK_NS 10000000ull /* how often the peer's state is read */
#define LFI_LOOK_NS 100000000ull      /* how often a peer's region not mapped yet is looked for */
#define LFI_SETTLE_NS 500000000ull    /* longest wait at close for a held lock to settle */

/* What an unlocked pthread_spinlock_t holds (1 on x86-64 glibc, 0 elsewhere). */
static int unlocked_word(void)
{
	pthread_spinlock_t lock;
	pthread_spin_init(&lock, PTHREAD_PROCESS_SHARED);
	int word;
	memcpy(&word, (const void *)&lock, sizeof(word));
	pthread_spin_destroy(&lock);
	return word;
}

/* Where /dev/shm/<name> is mapped from its start in the process `pid`
 * ("self" if 0), or NULL. */
static uint8_t *mapping_of(int pid, const char *name)
{
	char want[300], line[600], path[400], maps[64];
	snprintf(want, sizeof(want), "/dev/shm/%s", name);
	if (pid)
		snprintf(maps, sizeof(maps), "/proc/%d/maps", pid);
	else
		snprintf(maps, sizeof(maps), "/proc/self/maps");
	FILE *f = fopen(maps, "r");
	uint8_t *found = NULL;
	while (f && !found && fgets(line, sizeof(line), f)) {
		unsigned long start, offset;
		if (sscanf(line, "%lx-%*x %*s %lx %*s %*s %399s", &start, &offset, path) == 3 &&
		    offset == 0 && strcmp(path, want) == 0)
			found = (uint8_t *)start;
	}
	if (f)
		fclose(f);
	return found;
}

static const char *without_prefix(const char *name)
{
	const char *p = strstr(name, "://");
	return p ? p + 3 : name;
}

/* Whether `name` (`len` bytes, maybe without a NUL) is a name lmt gives
 * its shm endpoints: "fi_shm://lmt-" and 16 hex digits. Copied to `out`. */
static bool lmt_name(const uint8_t *name, size_t len, char out[48])
{
	static const char prefix[] = "fi_shm://lmt-";
	size_t plen = sizeof(prefix) - 1;
	while (len && !name[len - 1])
		len--;
	if (len != plen + 16 || memcmp(name, prefix, plen) != 0)
		return false;
	for (size_t i = plen; i < len; i++)
		if (!isxdigit(name[i]))
			return false;
	memcpy(out, name + 9, len - 9);
	out[len - 9] = 0;
	return true;
}

/* Look for the locks: 1 found, 0 not yet (the provider maps a peer's
 * region once its first message arrives), -1 never (an in-process peer,
 * or a layout not 1.17's). */
static int look(lmt_endpoint *ep)
{
	uint8_t *own = mapping_of(0, without_prefix(ep->shm_name));
	uint8_t *theirs = mapping_of(0, ep->shm_peer_name);
	if (!own)
		return -1;
	int pid, peer_pid = 0, word;
	uintptr_t base;
	memcpy(&pid, own + LFI_REGION_PID, sizeof(pid));
	memcpy(&base, own + LFI_REGION_BASE, sizeof(base));
	memcpy(&word, own + LFI_REGION_LOCK, sizeof(word));
	int unlocked = unlocked_word();
	/* The own region's header says whether the layout is the one known:
	 * its version, its owner, where its owner maps it, and a word at the
	 * lock's place that a spin lock can hold (glibc's x86-64 lock counts
	 * down from its unlocked 1 as threads wait, elsewhere it is 0 or 1). */
	if (own[LFI_REGION_VERSION] != LFI_REGION_VERSION_1_17 || pid != getpid() ||
	    base != (uintptr_t)own || word > (unlocked > 1 ? unlocked : 1)) {
		putil_log(&ep->inst->base, LMT_LOG_DEBUG,
		          "ofi channel %u: shm's region layout is not libfabric 1.17's: a stopped "
		          "or dead peer holding one of its locks would hold this channel too",
		          ep->channel);
		return -1;
	}
	if (!theirs)
		return 0;
	memcpy(&peer_pid, theirs + LFI_REGION_PID, sizeof(peer_pid));
	/* A peer in this process cannot stop or die apart from it, and shm may
	 * map its region by the peer's own pointer, gone once it closes. */
	if (peer_pid <= 0 || peer_pid == getpid())
		return -1;
	if (theirs[LFI_REGION_VERSION] != LFI_REGION_VERSION_1_17) {
		putil_log(&ep->inst->base, LMT_LOG_DEBUG,
		          "ofi channel %u: the peer's shm region is not libfabric 1.17's: a stopped "
		          "or dead peer holding one of its locks would hold this channel too",
		          ep->channel);
		return -1;
	}
	/* The pid is the peer's word: it counts only if that process maps the
	 * peer's region itself. (It may not be visible here, in another pid
	 * namespace, and then another process may have its pid.) */
	if (!mapping_of(peer_pid, ep->shm_peer_name)) {
		putil_log(&ep->inst->base, LMT_LOG_DEBUG,
		          "ofi channel %u: the process the peer's shm region names (pid %d) does "
		          "not map it here: a stopped or dead peer holding one of shm's locks "
		          "would hold this channel too",
		          ep->channel, peer_pid);
		return -1;
	}
	ep->shm_unlocked = unlocked;
	ep->shm_lock[0] = (int *)(void *)(own + LFI_REGION_LOCK);
	ep->shm_lock[1] = (int *)(void *)(theirs + LFI_REGION_LOCK);
	ep->shm_peer_pid = peer_pid;
	return 1;
}

void lfi_shmlock_find(lmt_endpoint *ep, const uint8_t *peer, size_t len)
{
	if (!ep->inst->shm || fi_version() != FI_VERSION(1, 17) ||
	    !lmt_name(peer, len, ep->shm_peer_name))
		return;
	ep->shm_looking = look(ep) == 0;
	ep->shm_looked_ns = lmt__now_ns();
}

/* Look again, now and then, until the peer's region is mapped. */
static void look_again(lmt_endpoint *ep)
{
	uint64_t now = lmt__now_ns();
	if (!ep->shm_looking || now - ep->shm_looked_ns < LFI_LOOK_NS)
		return;
	ep->shm_looked_ns = now;
	ep->shm_looking = look(ep) == 0;
}

/* Whether the peer process no longer runs: gone, a zombie, or stopped
 * (read at most every LFI_PEER_CHECK_NS unless `fresh`). */
static bool peer_state_frozen(lmt_endpoint *ep, bool fresh)
{
	uint64_t now = lmt__now_ns();
	if (!fresh && now - ep->shm_checked_ns < LFI_PEER_CHECK_NS)
		return ep->shm_frozen;
	ep->shm_checked_ns = now;
	char path[64], stat[512];
	snprintf(path, sizeof(path), "/proc/%d/stat", ep->shm_peer_pid);
	FILE *f = fopen(path, "r");
	size_t n = f ? fread(stat, 1, sizeof(stat) - 1, f) : 0;
	if (f)
		fclose(f);
	stat[n] = 0;
	/* "pid (comm) S ...": the state follows the last ')'. */
	const char *paren = strrchr(stat, ')');
	char state = paren && paren[1] == ' ' ? paren[2] : 0;
	ep->shm_frozen = !f || !state || strchr("TtZX", state) != NULL;
	return ep->shm_frozen;
}

static bool peer_frozen(lmt_endpoint *ep)
{
	return peer_state_frozen(ep, false);
}

static bool held(const lmt_endpoint *ep, int i)
{
	return __atomic_load_n(ep->shm_lock[i], __ATOMIC_ACQUIRE) != ep->shm_unlocked;
}

bool lfi_shmlock_peer_frozen(lmt_endpoint *ep)
{
	look_again(ep);
	return ep->shm_lock[0] && peer_frozen(ep);
}

bool lfi_shmlock_peer_died(lmt_endpoint *ep)
{
	look_again(ep);
	if (!ep->shm_lock[0])
		return false;
	uint64_t deadline = lmt__deadline(100000000ull);
	do {
		if (peer_state_frozen(ep, true))
			return true;
		putil_nap(1000000);
	} while (lmt__now_ns() < deadline);
	return false;
}

bool lfi_shmlock_stuck(lmt_endpoint *ep)
{
	look_again(ep);
	if (!ep->shm_lock[0] || (!held(ep, 0) && !held(ep, 1)))
		return false;
	return peer_frozen(ep);
}

void lfi_shmlock_break(lmt_endpoint *ep)
{
	static const char *const whose[] = {"this endpoint's", "the peer's"};
	for (int i = 0; i < 2; i++) {
		/* Read afresh: a peer continued since is left its lock. */
		if (!ep->shm_lock[i] || !held(ep, i) || !peer_state_frozen(ep, true))
			continue;
		pthread_spin_unlock((pthread_spinlock_t *)(void *)ep->shm_lock[i]);
		putil_log(&ep->inst->base, LMT_LOG_WARN,
		          "ofi channel %u: the peer (pid %d) stopped or died holding the lock of "
		          "%s shm region; released it",
		          ep->channel, ep->shm_peer_pid, whose[i]);
	}
}

void lfi_shmlock_settle(lmt_endpoint *ep)
{
	look_again(ep);
	if (!ep->shm_lock[0])
		return;
	uint64_t deadline = lmt__deadline(LFI_SETTLE_NS);
	while ((held(ep, 0) || held(ep, 1)) && !peer_frozen(ep) && lmt__now_ns() < deadline)
		putil_nap(1000000);
	lfi_shmlock_break(ep);
}

void lfi_shmlock_forget_dead_peer(lmt_endpoint *ep)
{
	/* Gone, not stopped: a stopped peer may still close its own. */
	if (!ep->shm_lock[0] || kill(ep->shm_peer_pid, 0) == 0 || errno != ESRCH)
		return;
	if (shm_unlink(ep->shm_peer_name) == 0)
		putil_log(&ep->inst->base, LMT_LOG_DEBUG,
		          "ofi channel %u: removed /dev/shm/%s, the region of the peer that died",
		          ep->channel, ep->shm_peer_name);
}
