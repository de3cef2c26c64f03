/* The destination's lobby: every connection to the control port before a
 * source has authenticated, read side by side (lobby.c), and the verdict
 * on a source's HELLO (hello.c).
 * Room: engines; may use: every room below it. */
#ifndef LMT_CORE_LOBBY_H
#define LMT_CORE_LOBBY_H

#include <stddef.h>
#include <stdint.h>

#include "proto.h"
#include "tls.h"

struct lmt_session;

/* Wait for the source among whoever connects: accept on listen_fd (when
 * >= 0) for wait_ns, and give each connection connect-timeout from its
 * accept. *fd, when >= 0, is a connection already made (it joins the
 * lobby). On success the source's descriptor is in *fd (and its TLS in
 * *tls with tls=on), and *accepted_ns says when it was accepted. */
int lmt__lobby_find_source(struct lmt_session *s, int listen_fd, uint64_t wait_ns, int *fd,
                           lmt__tls **tls, uint64_t *accepted_ns);

/* Whether a decoded HELLO may go on: 0, or an LMT_E* code and why not. */
int lmt__hello_verdict(struct lmt_session *s, const struct lmt_msg_hello *m, char *why,
                       size_t size);

#endif
