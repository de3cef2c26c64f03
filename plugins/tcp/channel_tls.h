/* TLS on the tcp plugin's channels: with the session's channel secret
 * (tls=on), each channel's connection is TLS 1.3 with a pre-shared key
 * derived from it for that channel (docs/tcp.md). */
#ifndef LMT_TCP_CHANNEL_TLS_H
#define LMT_TCP_CHANNEL_TLS_H

#include "instance.h"

#define TCP_TLS_PSK_SALT "lmt tcp channel psk v1"
#define TCP_TLS_PSK_IDENTITY "lmt-tcp-channel-v1"

/* Keep the secret of `params`, when the core gave one. */
void tcp_tls_init(struct lmt_instance *inst, const struct lmt_instance_params *params);
/* The channel's context (client on the source, server on the destination)
 * in ep->tls_ctx; nothing without a secret. */
int tcp_tls_open(lmt_endpoint *ep);
/* The source's handshake on ep->fd within `w`; the connection in ep->tls.
 * An error comes back with OpenSSL's reason in e, not reported: the
 * caller may try again. */
int tcp_tls_connect(lmt_endpoint *ep, const struct lmt__wait *w, struct lmt__net_error *e);
/* Free the channel's connection and context. */
void tcp_tls_close(lmt_endpoint *ep);

#endif
