/* Admission: the connections a listener accepted that have not yet shown
 * who they are (the core's control port before authentication, the tcp
 * plugin's data port before the channel's token). A bounded table read
 * through one epoll set, where a newcomer takes the place of the
 * connection that has made the least progress, oldest first: a crowd of
 * strangers that connect and say nothing, dribble bytes, or connect and
 * close only ever pushes out its own kind, never a connection that sent a
 * whole first message. What a connection sent stays in the kernel's socket
 * buffer until its owner reads a whole message, so a connection costs this
 * process one table entry and one descriptor until then.
 *
 * The owner keeps its own state per connection, in an array indexed by the
 * connection's id (0 .. lmt__admit_capacity() - 1), and is told through
 * `drop` when the table closes one of them. Not thread-safe: one thread
 * owns an admission (a thread of its own closes the connections it pushes
 * out, which costs more than anything else a stranger does; up to half
 * the table's size wait for it). Internal; not installed. */
#ifndef LMT_COMMON_ADMIT_H
#define LMT_COMMON_ADMIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "net.h"

/* How far a connection got; a newcomer pushes out the lowest level first. */
enum lmt__admit_level {
	LMT_ADMIT_SILENT,  /* nothing received yet */
	LMT_ADMIT_PARTIAL, /* bytes, but not yet a whole first message */
	LMT_ADMIT_OPENED,  /* a whole, well-formed first message (a TLS ClientHello):
	                    * a handshake is under way */
	LMT_ADMIT_PROVEN,  /* past a check a stranger cannot pass for free (a TLS
	                    * handshake done, a HELLO accepted) */
	LMT_ADMIT_LEVELS
};

/* Why the table closed a connection. */
enum lmt__admit_why {
	LMT_ADMIT_CROWDED,   /* pushed out by a newcomer, or by one of its level */
	LMT_ADMIT_TIMED_OUT, /* its deadline (from its accept) passed */
};

struct lmt__admit_limits {
	unsigned max;        /* connections at once (at most LMT_ADMIT_MAX) */
	unsigned opened_max; /* of them at LMT_ADMIT_OPENED at once */
	unsigned proven_max; /* of them at LMT_ADMIT_PROVEN at once */
	uint64_t timeout_ns; /* each connection's time from its accept */
	/* The owner forgets connection `id` (frees what it holds for it); the
	 * table then closes its descriptor: with a reset, or in order (what
	 * the owner sent it goes first) when `drop` returns true. */
	bool (*drop)(void *ctx, unsigned id, enum lmt__admit_why why);
	void *ctx;
};

#define LMT_ADMIT_MAX 1024u

/* The listen backlog for a listener read through an admission: deep
 * enough that a crowd does not fill it between two turns (a full backlog
 * drops the real peer's SYN, which then waits a second for its retry). */
#define LMT_ADMIT_BACKLOG 512

/* `max` connections, or fewer when the process may open few descriptors:
 * at most a quarter of RLIMIT_NOFILE, and at least `floor`. */
unsigned lmt__admit_fit(unsigned max, unsigned floor);

struct lmt__admit;

/* An admission for listen_fd (non-blocking; may be -1: no listener, only
 * connections given with lmt__admit_add). 0, or -LMT_ENOMEM / -LMT_EIO with
 * the reason in e. */
int lmt__admit_new(struct lmt__admit **out, int listen_fd, const struct lmt__admit_limits *lim,
                   struct lmt__net_error *e);
/* Close every connection still in (without `drop`) and free. NULL-safe. */
void lmt__admit_free(struct lmt__admit *a);
unsigned lmt__admit_capacity(const struct lmt__admit *a);
unsigned lmt__admit_count(const struct lmt__admit *a);

/* Take a connected socket in at LMT_ADMIT_SILENT (non-blocking from here);
 * its id in *id. -LMT_EOVERFLOW when no connection could be pushed out. */
int lmt__admit_add(struct lmt__admit *a, int fd, unsigned *id);

/* Wait up to timeout_ms (never past the next deadline) for connections
 * with something new to read or a hang-up: their ids in ready[] (at most
 * max), and *listener set when the listener has connections waiting.
 * Returns the number of ids, or -LMT_EIO. Connections are watched
 * edge-triggered: a connection is reported again only when more arrives,
 * so its owner reads until it would block (or keeps what it has not read
 * in the socket and looks again when more comes). */
int lmt__admit_wait(struct lmt__admit *a, int timeout_ms, unsigned *ready, unsigned max,
                    bool *listener);
/* Accept up to `max` waiting connections at LMT_ADMIT_SILENT, making room
 * as the levels say; their ids in ids[]. Returns how many, or -LMT_EIO for
 * a listener that fails (the reason in e; out of descriptors: a
 * connection was pushed out to make room, try again). */
int lmt__admit_accept(struct lmt__admit *a, unsigned *ids, unsigned max, struct lmt__net_error *e);
/* Accept no more: the listener leaves the epoll set (it stays open). */
void lmt__admit_unlisten(struct lmt__admit *a);
/* Close, through `drop`, every connection whose deadline passed. */
void lmt__admit_expire(struct lmt__admit *a, uint64_t now_ns);

int lmt__admit_fd(const struct lmt__admit *a, unsigned id);
enum lmt__admit_level lmt__admit_level(const struct lmt__admit *a, unsigned id);
uint64_t lmt__admit_accepted_ns(const struct lmt__admit *a, unsigned id);
/* Move connection id to `level` (the newest there). When that level is
 * full, its oldest connection is pushed out first. */
void lmt__admit_promote(struct lmt__admit *a, unsigned id, enum lmt__admit_level level);
/* Also watch for the socket becoming writable (a TLS handshake that
 * waits to send), or stop. */
void lmt__admit_want_write(struct lmt__admit *a, unsigned id, bool on);
/* The owner is done with connection id: close it (without `drop`), in
 * order when the owner told it something (that goes before the FIN),
 * else with a reset, on the admission's thread. */
void lmt__admit_close(struct lmt__admit *a, unsigned id, bool in_order);
/* The owner keeps connection id's descriptor: out of the table, open. */
int lmt__admit_release(struct lmt__admit *a, unsigned id);

/* recv(MSG_PEEK | MSG_DONTWAIT) of up to len bytes: what is waiting,
 * left in the socket. 0 when the peer closed; -1 with errno. */
ssize_t lmt__admit_peek(int fd, void *buf, size_t len);
/* Nothing whole has come from connection id yet; `got` is what a peek
 * (or FIONREAD) found waiting. 0 to wait for more (when it sent anything
 * it moves up to LMT_ADMIT_PARTIAL), or -1 when its peer closed (errno 0:
 * before anything, or in the middle of a message) or the socket failed
 * (errno), for the owner to drop it. */
int lmt__admit_pending(struct lmt__admit *a, unsigned id, ssize_t got);

/* Bytes waiting in a socket's receive queue (0 on error). */
size_t lmt__admit_inq(int fd);

/* tls=on, before a TLS connection exists: the first LMT_ADMIT_TLS_HEAD
 * bytes of what came; the length of the whole first record when they
 * open a handshake record holding a ClientHello, else 0. */
#define LMT_ADMIT_TLS_HEAD 6
size_t lmt__admit_client_hello(const uint8_t head[LMT_ADMIT_TLS_HEAD]);

/* Logging a crowd: whether to log this drop on its own line (the first
 * few each second), else it is counted; and, at most once a second, how
 * many were counted since the last time (0: nothing to say). */
bool lmt__admit_log_this(struct lmt__admit *a, uint64_t now_ns);
uint64_t lmt__admit_unlogged(struct lmt__admit *a, uint64_t now_ns);

/* What the table did since it was made. */
struct lmt__admit_counts {
	uint64_t accepted, crowded, timed_out, refused;
};
struct lmt__admit_counts lmt__admit_counts(const struct lmt__admit *a);

#endif
