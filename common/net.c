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
#include <poll.h>
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

int lmt__net_parse(const char *uri, struct sockaddr_storage *addr, socklen_t *len,
                   struct lmt__net_error *e)
{
	char host[256];
	const char *port;
	if (!uri || !*uri)
		return fail(e, LMT_EINVAL, "address: empty, expected host:port");
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

int lmt__net_listen(const struct sockaddr *addr, socklen_t len, int backlog, int *fd,
                    struct lmt__net_error *e)
{
	char name[80];
	int s, rc = new_socket(addr->sa_family, e, &s);
	if (rc)
		return rc;
	int one = 1;
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
		refused |= err == ECONNREFUSED;
		if (err != ECONNREFUSED || !w || !w->deadline_ns || lmt__now_ns() >= w->deadline_ns)
			return fail(e, err == ECONNREFUSED ? LMT_ECONN : LMT_EIO,
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
	const char *p = buf;
	while (len) {
		ssize_t n = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n > 0) {
			p += n;
			len -= (size_t)n;
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
		return fail(e, LMT_ECONN, "send: %s", strerror(errno));
	}
	return 0;
}

int lmt__net_recv_all(int fd, void *buf, size_t len, const struct lmt__wait *w,
                      struct lmt__net_error *e)
{
	char *p = buf;
	while (len) {
		ssize_t n = recv(fd, p, len, MSG_DONTWAIT);
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
