/* The source's way in (dial.c): connect, TLS, HELLO and proofs, tried
 * again while the destination drops the connection before authentication.
 * Room: engines; may use: every room below it. */
#ifndef LMT_CORE_DIAL_H
#define LMT_CORE_DIAL_H

#include <stdint.h>

struct lmt_session;

/* Connect to `uri` (or, with fd >= 0, take that connected socket over:
 * the session owns it from here, and it is not connected again) and
 * authenticate, by `deadline`. On success the control connection runs and
 * the source's proof (with a key) is sent. */
int lmt__source_dial(struct lmt_session *s, const char *uri, int fd, uint64_t deadline);

#endif
