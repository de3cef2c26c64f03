/* Socket helpers shared by the core and the plugins (see net.h). */
#define _GNU_SOURCE
#include "net.h"

#include <arpa/inet.h>
#include <stdarg.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <poll.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define WAIT_SLICE_MS 100

static int fail(struct lmt__net_error *e, int code, const char *fmt, ...) LMT_PRINTF(3, 4);

static int fail(struct lmt__net_error *e, int code, const char *fmt, ...)
{
	if (e) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
		va_end(ap);
	}
	return -code;
}

uint64_t lmt__now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int parse_unix(const char *path, struct sockaddr_storage *addr, socklen_t *len,
                      struct lmt__net_error *e)
{
	struct sockaddr_un *un = (struct sockaddr_un *)addr;
	size_t n = strlen(path);
	if (n == 0)
		return fail(e, LMT_EINVAL, "address 'unix:': expected unix:PATH");
	if (n >= sizeof(un->sun_path))
		return fail(e, LMT_EINVAL, "address 'unix:%s': path longer than %zu bytes", path,
		            sizeof(un->sun_path) - 1);
	memset(un, 0, sizeof(*un));
	un->sun_family = AF_UNIX;
	memcpy(un->sun_path, path, n);
	*len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + 1);
	return 0;
}

int lmt__net_parse(const char *uri, struct sockaddr_storage *addr, socklen_t *len,
                   struct lmt__net_error *e)
{
	char host[256];
	const char *port;
	if (!uri || !*uri)
		return fail(e, LMT_EINVAL, "address: empty, expected host:port");
	if (strncmp(uri, "unix:", 5) == 0)
		return parse_unix(uri + 5, addr, len, e);
	if (uri[0] == '[') {
		const char *end = strchr(uri, ']');
		if (!end || end[1] != ':')
			return fail(e, LMT_EINVAL, "address '%s': expected [v6addr]:port", uri);
		if ((size_t)(end - uri - 1) >= sizeof(host))
			return fail(e, LMT_EINVAL, "address '%s': host too long", uri);
		memcpy(host, uri + 1, (size_t)(end - uri - 1));
		host[end - uri - 1] = '\0';
		port = end + 2;
	} else {
		const char *colon = strrchr(uri, ':');
		if (!colon)
			return fail(e, LMT_EINVAL, "address '%s': expected host:port", uri);
		if ((size_t)(colon - uri) >= sizeof(host))
			return fail(e, LMT_EINVAL, "address '%s': host too long", uri);
		memcpy(host, uri, (size_t)(colon - uri));
		host[colon - uri] = '\0';
		port = colon + 1;
	}
	char *endp;
	errno = 0;
	unsigned long p = strtoul(port, &endp, 10);
	if (!*port || *endp || errno || p > 65535 || port[0] == '-' || port[0] == '+')
		return fail(e, LMT_EINVAL,
		            "address '%s': port '%s' is not a number from 0 to 65535", uri, port);

	struct addrinfo hints = {
	        .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
	struct addrinfo *res = NULL;
	if (!host[0])
		hints.ai_flags |= AI_PASSIVE;
	int rc = getaddrinfo(host[0] ? host : NULL, port, &hints, &res);
	if (rc != 0 || !res)
		return fail(e, LMT_EINVAL, "address '%s': cannot resolve '%s': %s", uri, host,
		            gai_strerror(rc));
	memcpy(addr, res->ai_addr, res->ai_addrlen);
	*len = res->ai_addrlen;
	freeaddrinfo(res);
	return 0;
}

void lmt__net_format(const struct sockaddr *addr, char *buf, size_t size)
{
	char host[INET6_ADDRSTRLEN] = "?";
	unsigned port = 0;
	if (addr->sa_family == AF_INET) {
		const struct sockaddr_in *in = (const struct sockaddr_in *)addr;
		inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
		port = ntohs(in->sin_port);
		snprintf(buf, size, "%s:%u", host, port);
	} else if (addr->sa_family == AF_INET6) {
		const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)addr;
		inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
		port = ntohs(in6->sin6_port);
		snprintf(buf, size, "[%s]:%u", host, port);
	} else if (addr->sa_family == AF_UNIX) {
		snprintf(buf, size, "unix:%s", ((const struct sockaddr_un *)addr)->sun_path);
	} else {
		snprintf(buf, size, "(family %d)", addr->sa_family);
	}
}

static int new_socket(int family, struct lmt__net_error *e, int *fd)
{
	*fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (*fd < 0)
		return fail(e, LMT_EIO, "socket: %s", strerror(errno));
	return 0;
}

/* A socket file nobody accepts on any more. */
static bool unix_socket_is_stale(const struct sockaddr *addr, socklen_t len)
{
	int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (probe < 0)
		return false;
	bool stale = connect(probe, addr, len) != 0 && errno == ECONNREFUSED;
	close(probe);
	return stale;
}

/* What may be at a unix socket's path before it is bound: nothing, or a
 * stale socket of this user's, which goes. */
static int unix_clear_path(const struct sockaddr *addr, socklen_t len, struct lmt__net_error *e)
{
	const char *path = ((const struct sockaddr_un *)addr)->sun_path;
	struct stat st;
	if (lstat(path, &st) != 0)
		return errno == ENOENT ? 0 : fail(e, LMT_EIO, "unix:%s: %s", path, strerror(errno));
	if (!S_ISSOCK(st.st_mode))
		return fail(e, LMT_EINVAL,
		            "unix:%s: a file that is not a socket is there: refusing "
		            "to replace it",
		            path);
	if (st.st_uid != geteuid())
		return fail(e, LMT_EINVAL, "unix:%s: a socket of another user (uid %u) is there",
		            path, (unsigned)st.st_uid);
	if (!unix_socket_is_stale(addr, len))
		return fail(e, LMT_EIO, "unix:%s: in use (a process accepts on it)", path);
	if (unlink(path) != 0 && errno != ENOENT)
		return fail(e, LMT_EIO, "unix:%s: cannot remove the stale socket: %s", path,
		            strerror(errno));
	return 0;
}

int lmt__net_listen(const struct sockaddr *addr, socklen_t len, int backlog, int *fd,
                    struct lmt__net_error *e)
{
	char name[80];
	bool unix_path = addr->sa_family == AF_UNIX;
	int s, rc = unix_path ? unix_clear_path(addr, len, e) : 0;
	if (rc || (rc = new_socket(addr->sa_family, e, &s)))
		return rc;
	int one = 1;
	if (unix_path)
		fchmod(s, 0600); /* Linux gives the socket file this mode at bind */
	else
		setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(s, addr, len) != 0 || listen(s, backlog) != 0) {
		int err = errno;
		lmt__net_format(addr, name, sizeof(name));
		close(s);
		return fail(e, LMT_EIO, "listen on %s: %s", name, strerror(err));
	}
	*fd = s;
	return 0;
}

uint16_t lmt__net_local_port(int fd)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);
	if (getsockname(fd, (struct sockaddr *)&ss, &len) != 0)
		return 0;
	if (ss.ss_family == AF_INET)
		return ntohs(((struct sockaddr_in *)&ss)->sin_port);
	if (ss.ss_family == AF_INET6)
		return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
	return 0;
}

int lmt__net_wait(int fd, short events, const struct lmt__wait *w, struct lmt__net_error *e)
{
	for (;;) {
		int slice = WAIT_SLICE_MS;
		if (w && w->cancelled && w->cancelled(w->ctx))
			return fail(e, LMT_ECANCELED, "cancelled");
		if (w && w->deadline_ns) {
			uint64_t now = lmt__now_ns();
			if (now >= w->deadline_ns)
				return fail(e, LMT_ETIMEDOUT, "timed out");
			uint64_t left_ms = (w->deadline_ns - now + 999999) / 1000000;
			if (left_ms < (uint64_t)slice)
				slice = (int)left_ms;
		}
		struct pollfd p = {.fd = fd, .events = events};
		int n = poll(&p, 1, slice);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return fail(e, LMT_EIO, "poll: %s", strerror(errno));
		}
		if (n == 0)
			continue;
		if (p.revents & events)
			return 0;
		if (p.revents & (POLLERR | POLLHUP | POLLNVAL))
			return fail(e, LMT_ECONN, "connection closed by peer");
	}
}

int lmt__net_connect(const struct sockaddr *addr, socklen_t len, const struct lmt__wait *w, int *fd,
                     struct lmt__net_error *e)
{
	char name[80];
	lmt__net_format(addr, name, sizeof(name));
	/* A refused connection is retried until the deadline: the peer may be
	 * about to listen. */
	int refused = 0;
	for (;;) {
		int s, rc = new_socket(addr->sa_family, e, &s);
		if (rc)
			return rc;
		lmt__net_set_nonblock(s, 1);
		int err = 0;
		if (connect(s, addr, len) != 0) {
			err = errno;
			if (err == EINPROGRESS) {
				rc = lmt__net_wait(s, POLLOUT, w, e);
				if (rc == -LMT_ECONN)
					rc = 0; /* the error is read from SO_ERROR below */
				if (rc) {
					close(s);
					if (rc == -LMT_ETIMEDOUT && refused)
						return fail(e, LMT_ECONN, "connect to %s: %s", name,
						            strerror(ECONNREFUSED));
					if (rc == -LMT_ETIMEDOUT)
						return fail(e, LMT_ETIMEDOUT,
						            "connect to %s: timed out", name);
					return rc;
				}
				socklen_t elen = sizeof(err);
				getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &elen);
			}
		}
		if (err == 0) {
			lmt__net_set_nonblock(s, 0);
			*fd = s;
			return 0;
		}
		close(s);
		/* A unix socket not there yet, or with its backlog full, is
		 * refused as well. */
		if (addr->sa_family == AF_UNIX && (err == ENOENT || err == EAGAIN))
			err = ECONNREFUSED;
		refused |= err == ECONNREFUSED;
		/* A reset: the peer took the connection and closed it before
		 * this side saw it made (a crowded listener can). */
		if (err != ECONNREFUSED || !w || !w->deadline_ns || lmt__now_ns() >= w->deadline_ns)
			return fail(e,
			            err == ECONNREFUSED || err == ECONNRESET ? LMT_ECONN : LMT_EIO,
			            "connect to %s: %s", name, strerror(err));
		if (w->cancelled && w->cancelled(w->ctx))
			return fail(e, LMT_ECANCELED, "cancelled");
		struct timespec ts = {0, 20 * 1000000};
		nanosleep(&ts, NULL);
	}
}

int lmt__net_accept(int lfd, const struct lmt__wait *w, int *fd, struct lmt__net_error *e)
{
	for (;;) {
		int rc = lmt__net_wait(lfd, POLLIN, w, e);
		if (rc)
			return rc;
		int s = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
		if (s < 0) {
			if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED)
				continue;
			return fail(e, LMT_EIO, "accept: %s", strerror(errno));
		}
		lmt__net_set_nonblock(s, 0);
		*fd = s;
		return 0;
	}
}

int lmt__net_send_all(int fd, const void *buf, size_t len, const struct lmt__wait *w,
                      struct lmt__net_error *e)
{
	return lmt__net_send_fds(fd, buf, len, NULL, 0, w, e);
}

/* Keep the descriptors of one message's SCM_RIGHTS in the sink. */
static void sink_take(struct lmt__fd_sink *sink, struct msghdr *mh)
{
	if (mh->msg_flags & MSG_CTRUNC)
		sink->overflow = 1;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(mh); c; c = CMSG_NXTHDR(mh, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < n; i++) {
			int fd;
			memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
			if (sink->count < sink->cap) {
				sink->fds[sink->count++] = fd;
			} else {
				close(fd);
				sink->overflow = 1;
			}
		}
	}
}

/* One recv, or with a sink a recvmsg that keeps what was passed. */
static ssize_t recv_some(int fd, void *p, size_t len, struct lmt__fd_sink *sink)
{
	if (!sink)
		return recv(fd, p, len, MSG_DONTWAIT);
	union {
		char buf[CMSG_SPACE(LMT_NET_MAX_FDS * sizeof(int))];
		struct cmsghdr align;
	} control;
	struct iovec iov = {.iov_base = p, .iov_len = len};
	struct msghdr mh = {.msg_iov = &iov,
	                    .msg_iovlen = 1,
	                    .msg_control = control.buf,
	                    .msg_controllen = sizeof(control.buf)};
	ssize_t n = recvmsg(fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
	if (n >= 0)
		sink_take(sink, &mh);
	return n;
}

int lmt__net_recv_all(int fd, void *buf, size_t len, const struct lmt__wait *w,
                      struct lmt__net_error *e)
{
	return lmt__net_recv_fds(fd, buf, len, NULL, w, e);
}

int lmt__net_recv_fds(int fd, void *buf, size_t len, struct lmt__fd_sink *sink,
                      const struct lmt__wait *w, struct lmt__net_error *e)
{
	char *p = buf;
	while (len) {
		ssize_t n = recv_some(fd, p, len, sink);
		if (n > 0) {
			p += n;
			len -= (size_t)n;
			continue;
		}
		if (n == 0)
			return fail(e, LMT_ECONN, "connection closed by peer");
		if (errno == EINTR)
			continue;
		if (errno == EAGAIN || errno == EWOULDBLOCK) {
			int rc = lmt__net_wait(fd, POLLIN, w, e);
			if (rc == -LMT_ECONN)
				continue; /* read the EOF or error itself */
			if (rc)
				return rc;
			continue;
		}
		return fail(e, LMT_ECONN, "recv: %s", strerror(errno));
	}
	return 0;
}

/* One send; with descriptors, a sendmsg that carries them with its bytes
 * (all of them or none, with at least one byte). */
static ssize_t send_some(int fd, const char *p, size_t len, const int *fds, unsigned count)
{
	if (!count)
		return send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
	union {
		char buf[CMSG_SPACE(LMT_NET_MAX_FDS * sizeof(int))];
		struct cmsghdr align;
	} control;
	memset(&control, 0, sizeof(control));
	struct iovec iov = {.iov_base = (void *)p, .iov_len = len};
	struct msghdr mh = {.msg_iov = &iov,
	                    .msg_iovlen = 1,
	                    .msg_control = control.buf,
	                    .msg_controllen = CMSG_SPACE(count * sizeof(int))};
	struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(count * sizeof(int));
	memcpy(CMSG_DATA(c), fds, count * sizeof(int));
	return sendmsg(fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
}

int lmt__net_send_fds(int fd, const void *buf, size_t len, const int *fds, unsigned count,
                      const struct lmt__wait *w, struct lmt__net_error *e)
{
	if (count > LMT_NET_MAX_FDS || (count && !len))
		return fail(e, LMT_EINVAL, "sendmsg: %u descriptors with %zu bytes", count, len);
	const char *p = buf;
	while (len) {
		ssize_t n = send_some(fd, p, len, fds, count);
		if (n > 0) {
			p += n;
			len -= (size_t)n;
			count = 0; /* they went with these bytes */
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			int rc = lmt__net_wait(fd, POLLOUT, w, e);
			if (rc)
				return rc;
			continue;
		}
		return fail(e, LMT_ECONN, "%s: %s", count ? "sendmsg" : "send", strerror(errno));
	}
	return 0;
}

void lmt__net_tune(int fd, int nodelay, int bufsize)
{
	if (nodelay) {
		int one = 1;
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	}
	if (bufsize > 0) {
		setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bufsize, sizeof(bufsize));
		setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bufsize, sizeof(bufsize));
	}
}

int lmt__net_set_nonblock(int fd, int on)
{
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0)
		return -LMT_EIO;
	fl = on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK);
	return fcntl(fd, F_SETFL, fl) < 0 ? -LMT_EIO : 0;
}
