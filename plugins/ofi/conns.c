/* The TCP connections on an endpoint's listening address, for providers
 * that move data on sockets of their own (net). What libfabric 1.17
 * leaves to lmt:
 *
 * - It accepts every connection to an endpoint, for as long as it lives,
 *   and keeps about 1 KiB of each (its connection request) for the life of
 *   the process: a stranger who connects again and again grows it without
 *   end. So an endpoint stops taking connections as soon as it needs none:
 *   at once on a source, once its source is in on a destination. A socket
 *   filter on the listening socket drops what arrives for it (closing or
 *   shutting the provider's socket would make it spin on a listener it
 *   still polls).
 * - Each connection it holds costs a descriptor and some 20 KiB: a
 *   stranger could hold thousands. The channel's thread keeps at most
 *   LFI_CONNS_MAX, the newest, shutting the older down; the provider then
 *   sees the connection broken and closes it itself (a shutdown, never a
 *   close, while the provider owns it).
 * - It accepts a connection, then waits for its connection request on it;
 *   if the endpoint closes before the request was taken, the socket is
 *   lost, open, for the life of the process (a peer that stops or dies
 *   while connecting leaves one; a stranger who connects and says nothing,
 *   one per connection). So each endpoint notes, as it closes, the
 *   connections on its address (by socket inode, which no later socket
 *   shares), and once the provider is closed the instance closes those
 *   still open. */
#define _GNU_SOURCE
#include "conns.h"

#include <dirent.h>
#include <errno.h>
#include <linux/filter.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#define LFI_TRIM_NS 100000000ull /* how often a channel's thread trims */

/* Whether `sa` (a socket's own address) is on `bound` (an endpoint's
 * listening address; a wildcard address matches any of its family). */
static bool on_address(const struct sockaddr_storage *sa, const struct sockaddr_storage *bound)
{
	if (sa->ss_family != bound->ss_family)
		return false;
	if (sa->ss_family == AF_INET) {
		const struct sockaddr_in *a = (const void *)sa, *b = (const void *)bound;
		return a->sin_port == b->sin_port && (b->sin_addr.s_addr == htonl(INADDR_ANY) ||
		                                      a->sin_addr.s_addr == b->sin_addr.s_addr);
	}
	if (sa->ss_family == AF_INET6) {
		const struct sockaddr_in6 *a = (const void *)sa, *b = (const void *)bound;
		return a->sin6_port == b->sin6_port &&
		       (IN6_IS_ADDR_UNSPECIFIED(&b->sin6_addr) ||
		        memcmp(&a->sin6_addr, &b->sin6_addr, sizeof(a->sin6_addr)) == 0);
	}
	return false;
}

/* The inode of `fd` when it is a TCP socket on `bound`, listening or
 * connected as `listener` says, else 0. */
static ino_t socket_on(int fd, const struct sockaddr_storage *bound, bool listener)
{
	struct stat st;
	if (fstat(fd, &st) || !S_ISSOCK(st.st_mode))
		return 0;
	int type = 0, listening = 1;
	socklen_t len = sizeof(type);
	if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) || type != SOCK_STREAM)
		return 0;
	len = sizeof(listening);
	if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) || !listening != !listener)
		return 0;
	struct sockaddr_storage sa;
	len = sizeof(sa);
	if (getsockname(fd, (struct sockaddr *)&sa, &len) || !on_address(&sa, bound))
		return 0;
	return st.st_ino;
}

struct conn {
	int fd;
	ino_t ino;
};

/* The connections (or the listeners) on `ep`'s address, in *out
 * (malloc'ed); how many, or -1 when they cannot be listed. */
static int list_sockets(lmt_endpoint *ep, bool listeners, struct conn **out)
{
	*out = NULL;
	DIR *dir = opendir("/proc/self/fd");
	if (!dir)
		return -1;
	int count = 0, size = 0;
	struct dirent *e;
	while ((e = readdir(dir))) {
		int fd = atoi(e->d_name);
		ino_t ino = e->d_name[0] == '.' || fd == dirfd(dir)
		                    ? 0
		                    : socket_on(fd, &ep->bound, listeners);
		if (!ino)
			continue;
		if (count == size) {
			size = size ? 2 * size : 32;
			struct conn *grown = realloc(*out, (size_t)size * sizeof(**out));
			if (!grown)
				break;
			*out = grown;
		}
		(*out)[count++] = (struct conn){fd, ino};
	}
	closedir(dir);
	return count;
}

/* A duplicate of c->fd when it is still the socket listed (the provider
 * may have closed it and its number gone to another), else -1. */
static int same_socket(const struct conn *c)
{
	int fd = dup(c->fd);
	struct stat st;
	if (fd >= 0 && (fstat(fd, &st) || st.st_ino != c->ino)) {
		close(fd);
		fd = -1;
	}
	return fd;
}

void lfi_conns_seal(lmt_endpoint *ep)
{
	struct lmt_instance *inst = ep->inst;
	if (!inst->sockets || !ep->bound_len || ep->sealed)
		return;
	ep->sealed = true;
	static struct sock_filter drop[] = {{BPF_RET | BPF_K, 0, 0, 0}};
	static const struct sock_fprog program = {.len = 1, .filter = drop};
	struct conn *c;
	int n = list_sockets(ep, true, &c);
	for (int i = 0; i < n; i++) {
		int fd = same_socket(&c[i]);
		if (fd < 0)
			continue;
		if (setsockopt(fd, SOL_SOCKET, SO_ATTACH_FILTER, &program, sizeof(program))) {
			int err = errno;
			putil_log(&inst->base, LMT_LOG_WARN,
			          "ofi channel %u: cannot stop the endpoint taking connections: %s",
			          ep->channel, strerror(err));
		}
		close(fd);
	}
	free(c);
}

static int by_inode(const void *a, const void *b)
{
	ino_t x = ((const struct conn *)a)->ino, y = ((const struct conn *)b)->ino;
	return x < y ? -1 : x > y;
}

void lfi_conns_trim(lmt_endpoint *ep)
{
	struct lmt_instance *inst = ep->inst;
	uint64_t now = lmt__now_ns();
	if (!inst->sockets || !ep->bound_len || now - ep->trimmed_ns < LFI_TRIM_NS)
		return;
	ep->trimmed_ns = now;
	struct conn *c;
	int n = list_sockets(ep, false, &c);
	if (n > LFI_CONNS_MAX) {
		/* Inodes grow with time: the newest stay. The source's, made
		 * last before the endpoint stops taking connections, is among
		 * them; strangers who connected first cannot crowd it out. */
		qsort(c, (size_t)n, sizeof(*c), by_inode);
		for (int i = 0; i < n - LFI_CONNS_MAX; i++) {
			int fd = same_socket(&c[i]);
			if (fd >= 0) {
				shutdown(fd, SHUT_RDWR);
				close(fd);
			}
		}
		/* Said once per endpoint; the count comes at close. */
		if (!ep->trims)
			putil_log(&inst->base, LMT_LOG_WARN,
			          "ofi channel %u: %d connections to this endpoint: the oldest shut "
			          "down, %d kept (a stranger is connecting?)",
			          ep->channel, n, LFI_CONNS_MAX);
		ep->trims += (unsigned)(n - LFI_CONNS_MAX);
	}
	free(c);
}

static bool noted(const struct lmt_instance *inst, ino_t ino)
{
	for (size_t i = 0; i < inst->conns.count; i++)
		if (inst->conns.inode[i] == ino)
			return true;
	return false;
}

void lfi_conns_note(lmt_endpoint *ep)
{
	struct lmt_instance *inst = ep->inst;
	if (!inst->sockets || !ep->bound_len)
		return;
	struct conn *c;
	int n = list_sockets(ep, false, &c);
	for (int i = 0; i < n; i++) {
		if (noted(inst, c[i].ino))
			continue;
		if (inst->conns.count == inst->conns.size) {
			size_t size = inst->conns.size ? 2 * inst->conns.size : 16;
			ino_t *grown = realloc(inst->conns.inode, size * sizeof(*grown));
			if (!grown)
				break; /* at worst a socket stays open, as without this */
			inst->conns.inode = grown;
			inst->conns.size = size;
		}
		inst->conns.inode[inst->conns.count++] = c[i].ino;
	}
	free(c);
}

void lfi_conns_close(struct lmt_instance *inst)
{
	unsigned closed = 0;
	DIR *dir = inst->conns.count ? opendir("/proc/self/fd") : NULL;
	struct dirent *e;
	while (dir && (e = readdir(dir))) {
		int fd = atoi(e->d_name);
		struct stat st;
		if (e->d_name[0] == '.' || fd == dirfd(dir) || fstat(fd, &st) || !S_ISSOCK(st.st_mode) ||
		    !noted(inst, st.st_ino))
			continue;
		close(fd);
		closed++;
	}
	if (dir)
		closedir(dir);
	if (closed)
		putil_log(&inst->base, LMT_LOG_DEBUG,
		          "ofi: closed %u connection%s the provider accepted and left open", closed,
		          closed == 1 ? "" : "s");
	free(inst->conns.inode);
	inst->conns.inode = NULL;
	inst->conns.count = inst->conns.size = 0;
}
