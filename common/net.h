/* Socket helpers shared by the core's control connection and the plugins:
 * address parsing, connect/accept with deadlines, whole-buffer I/O that
 * honours cancellation. Internal; not installed. */
#ifndef LMT_COMMON_NET_H
#define LMT_COMMON_NET_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include <lmt/plugin.h>

/* What a blocking helper checks while it waits: a deadline (absolute, in
 * lmt__now_ns() time; 0 = none) and a cancel test polled every slice. */
struct lmt__wait {
	uint64_t deadline_ns;
	int (*cancelled)(void *ctx);
	void *ctx;
};

/* A failure's detail, filled by the helpers next to the returned code. */
struct lmt__net_error {
	char msg[256];
};

uint64_t lmt__now_ns(void);

/* "host:port", "[v6addr]:port" or ":port" (any address). Numeric hosts and
 * names both resolve. "unix:PATH" is a unix stream socket at PATH. */
int lmt__net_parse(const char *uri, struct sockaddr_storage *addr, socklen_t *len,
                   struct lmt__net_error *e);
/* "1.2.3.4:5", "[::1]:5" or "unix:PATH" for an address. */
void lmt__net_format(const struct sockaddr *addr, char *buf, size_t size);

/* A unix address is bound with mode 0600; a socket file left there by a
 * process that is gone (nobody accepts on it) and owned by this user is
 * replaced, anything else at PATH is refused. */
int lmt__net_listen(const struct sockaddr *addr, socklen_t len, int backlog, int *fd,
                    struct lmt__net_error *e);
/* The port a socket is bound to. */
uint16_t lmt__net_local_port(int fd);
int lmt__net_connect(const struct sockaddr *addr, socklen_t len, const struct lmt__wait *w, int *fd,
                     struct lmt__net_error *e);
int lmt__net_accept(int lfd, const struct lmt__wait *w, int *fd, struct lmt__net_error *e);

/* Wait until fd is readable (POLLIN) or writable (POLLOUT). 0, or
 * -LMT_ETIMEDOUT / -LMT_ECANCELED / -LMT_ECONN (hangup without data). */
int lmt__net_wait(int fd, short events, const struct lmt__wait *w, struct lmt__net_error *e);

/* Send or receive exactly len bytes on a blocking or non-blocking socket.
 * A peer that closes mid-buffer is -LMT_ECONN. */
int lmt__net_send_all(int fd, const void *buf, size_t len, const struct lmt__wait *w,
                      struct lmt__net_error *e);
int lmt__net_recv_all(int fd, void *buf, size_t len, const struct lmt__wait *w,
                      struct lmt__net_error *e);

/* Descriptors passed with SCM_RIGHTS, collected as they arrive: up to
 * `cap` are kept in fds[], any beyond are closed and `overflow` set (as
 * for the kernel's own truncation, MSG_CTRUNC). */
#define LMT_NET_MAX_FDS 253u /* the kernel's SCM_MAX_FD: per sendmsg */

struct lmt__fd_sink {
	int *fds;
	unsigned cap;
	unsigned count;
	int overflow;
};

/* lmt__net_recv_all that keeps the descriptors arriving with the bytes
 * (close-on-exec) in `sink` (NULL: as lmt__net_recv_all). */
int lmt__net_recv_fds(int fd, void *buf, size_t len, struct lmt__fd_sink *sink,
                      const struct lmt__wait *w, struct lmt__net_error *e);
/* lmt__net_send_all with fds[0..count) attached to the first bytes. */
int lmt__net_send_fds(int fd, const void *buf, size_t len, const int *fds, unsigned count,
                      const struct lmt__wait *w, struct lmt__net_error *e);

/* TCP_NODELAY, close-on-exec, large buffers: what a data or control
 * connection wants. */
void lmt__net_tune(int fd, int nodelay, int bufsize);
int lmt__net_set_nonblock(int fd, int on);

#endif
