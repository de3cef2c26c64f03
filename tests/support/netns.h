/* Two network namespaces joined by a veth pair, for tests that need a real
 * link to take down and up: each side has its own address, a process or
 * thread enters a side with netns_enter, and netns_link_set cuts the link
 * as a pulled cable would. Needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN) and
 * iproute2's `ip`; a test without them exits 77 with netns_link_create's
 * reason. Test support, not installed. */
#ifndef LMT_TESTS_NETNS_H
#define LMT_TESTS_NETNS_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

enum { NETNS_A = 0, NETNS_B = 1 };

/* The name of the veth pair's end in either namespace. */
#define NETNS_VETH "lmtveth0"

struct netns_link {
	char ns[2][40];   /* the namespaces, as `ip netns` names them */
	char veth[2][16]; /* the ends of the veth pair, one in each (NETNS_VETH) */
	char addr[2][16]; /* each end's IPv4 address (a /24 between them) */
	bool created;
	int guard_fd; /* closing it has the guardian remove the namespaces */
	pid_t guard_pid;
};

/* Create the pair under names unique to this process ("lmt-<tag>-<pid>-a"),
 * after removing whatever an earlier run with this tag left behind (its
 * process is gone). Returns 0; -1 with the reason in `why` when namespaces
 * cannot be made here (not root, no `ip`, not allowed): the test is then
 * skipped; -2 with the reason when making them failed otherwise. Call it
 * while the process has one thread: it forks a guardian that removes the
 * pair when this process ends, however it ends (killed included). */
int netns_link_create(struct netns_link *link, const char *tag, char *why, size_t size);

/* Move the calling process, which must have one thread yet, into `side`'s
 * network namespace, with a mount namespace of its own whose /sys shows
 * that namespace's devices (as `ip netns exec` does); threads it starts
 * later are there too. 0, or -1 with errno. */
int netns_enter(const struct netns_link *link, int side);

/* Take the link down (both ends lose carrier: nothing passes either way,
 * and no reset reaches anyone) or bring it back up. 0, or -1. */
int netns_link_set(const struct netns_link *link, bool up);

/* Remove both namespaces and with them the veth pair. Safe to call twice. */
void netns_link_destroy(struct netns_link *link);

#endif
