/* The control room (core/control/): the control connection and its
 * service thread (control.c), what this side says about its peer
 * (peer.c), TLS on the control connection (tls_session.c). May use: base,
 * wire, session. */
#ifndef LMT_CORE_CONTROL_H
#define LMT_CORE_CONTROL_H

#include <stdbool.h>
#include <stdint.h>

#include "session.h"

/* ---- control.c: the control connection ---- */

/* Whether the peer has hung up the control connection: a peer that died
 * or gave up, once the engine took every message it sent before, or at
 * once when it said why (its ERROR). Cheap enough for plugins' blocking
 * calls to poll (through the host's cancelled service), so that a
 * destination waiting on a data channel notices a source that is gone.
 * Any thread. */
bool lmt__peer_gone(struct lmt_session *s);
/* A wait for the net helpers: until deadline_ns (absolute), or a cancel. */
struct lmt__wait lmt__wait_until(struct lmt_session *s, uint64_t deadline_ns);
/* Once connected: the service thread takes the reading side, answers and
 * sends keep-alives, and queues every other message for the engine. */
int lmt__ctrl_start(struct lmt_session *s);
/* The peer is about to close the connection after a completion: that is
 * no failure. */
void lmt__ctrl_expect_close(struct lmt_session *s);
/* Stop the service thread, drop what it queued, close the socket. */
void lmt__ctrl_close(struct lmt_session *s);
/* Send the message in s->out; encode and send one without a payload. */
int lmt__ctrl_send(struct lmt_session *s);
/* The same, giving up at `deadline` rather than after idle-timeout. */
int lmt__ctrl_send_by(struct lmt_session *s, uint64_t deadline);
int lmt__ctrl_send_empty(struct lmt_session *s, uint16_t type);
/* Send an encoded message of the caller's own from any thread (the fault
 * thread's page requests): no failure is recorded; the engine finds a
 * broken connection on its own. 0 or a negative code. */
int lmt__ctrl_send_raw(struct lmt_session *s, const struct lmt_buf *b, uint64_t deadline);
/* Send s->out with `fds` attached (SCM_RIGHTS); a plain unix: socket only. */
int lmt__ctrl_send_fds(struct lmt_session *s, const int *fds, unsigned count);
/* Close the descriptors that came with the last message, if the engine
 * did not take them (s->in_fds). */
void lmt__ctrl_drop_fds(struct lmt_session *s);
/* Tell the peer this side failed, briefly and on a best-effort basis. */
void lmt__ctrl_send_error(struct lmt_session *s, const struct lmt_msg_status *st);
/* The next queued message (payload in s->in), waiting until `deadline_ns`.
 * The peer's ERROR, a dead or silent peer become the session's error once
 * the messages before them were taken. */
int lmt__ctrl_recv(struct lmt_session *s, struct lmt_msg_header *h, uint64_t deadline_ns);
/* The same for a message of type `want`; any other is a protocol error. */
int lmt__ctrl_expect(struct lmt_session *s, uint16_t want, uint64_t deadline_ns,
                     struct lmt_msg_header *h);
/* Whether a message (or the connection's failure) is waiting; the second
 * waits for one until `deadline_ns` (or a cancel), recording nothing. */
bool lmt__ctrl_pending(struct lmt_session *s);
/* Wait until the control connection has failed, or `deadline_ns`, or
 * `quiet_ns` with nothing unread; when it failed with the peer's ERROR,
 * that becomes the session's failure (lmt__fail_peer). */
void lmt__ctrl_settle(struct lmt_session *s, uint64_t quiet_ns, uint64_t deadline_ns);
/* When the peer was last heard from on the control connection (any
 * message, keep-alives included); 0 without a connection. */
uint64_t lmt__ctrl_last_heard(struct lmt_session *s);
/* Whether a message is queued (not counting a failure). */
bool lmt__ctrl_queued(struct lmt_session *s);
bool lmt__ctrl_wait(struct lmt_session *s, uint64_t deadline_ns);
/* The connection's failure as the session's, once nothing is queued; 0
 * while it is well. */
int lmt__ctrl_check(struct lmt_session *s);
/* The same whatever is still queued: for a wait that ended because the
 * peer is gone, where the messages before its end will not be taken. */
int lmt__ctrl_failure(struct lmt_session *s);

#endif
