/* What this side says about its peer (peer.c): its ERROR as this side's
 * failure, and a peer that does not speak lmt.
 * Room: control; may use: base, wire, session. */
#ifndef LMT_CORE_PEER_H
#define LMT_CORE_PEER_H

#include <stddef.h>
#include <stdint.h>

#include "session.h"

/* The peer's ERROR, carrying status `st`, as this side's failure: writes
 * why into `why` and returns the code (negative). Its cancel and its own
 * failures are LMT_EPEER, quoting it ("the destination cancelled the
 * migration: ..."); a connection it saw die, LMT_ECONN; a refusal about
 * both sides (LMT_EAUTH, LMT_EMISMATCH, LMT_EVERIFY, LMT_EPROTO), its code. */
int lmt__peer_ended(const struct lmt_session *s, const struct lmt_msg_status *st, char *why,
                    size_t size);

/* A peer whose first bytes, `head` (n of them), are no lmt message: "the
 * peer at 10.0.0.2:4444 is not an lmt destination (it sent 'HTTP/1.1 400
 * Bad Request...')", quoting its first line safely. What else already
 * waits on `fd` (a plain socket; -1 for none) is read to quote it too. */
void lmt__peer_not_lmt(const struct lmt_session *s, int fd, const uint8_t *head, size_t n,
                       char *why, size_t size);

#endif
