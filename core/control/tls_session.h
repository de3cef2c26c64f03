/* The session's TLS (tls=on): options to an OpenSSL context, the control
 * connection wrapped in TLS 1.3 on either side, the channel secret handed
 * to plugins, and what each side says when the other does not speak TLS.
 * Room: control; may use: base, wire, session. */
#ifndef LMT_CORE_TLS_SESSION_H
#define LMT_CORE_TLS_SESSION_H

#include <stdint.h>

#include "tls.h"

struct lmt_session;

/* Labels and identities on the wire (docs/protocol.md, "TLS"). */
#define LMT_TLS_PSK_SALT "lmt tls psk v1"
#define LMT_TLS_PSK_INFO "lmt v1 control connection psk"
#define LMT_TLS_PSK_IDENTITY "lmt-control-v1"
#define LMT_TLS_EXPORTER_LABEL "EXPORTER-lmt v1 channel secret"

/* Read tls, tls-cert, tls-key and tls-ca (after the auth key is loaded),
 * check which mode applies and build the context; warns when the plugin
 * leaves its channels in clear. */
int lmt__tls_session_prepare(struct lmt_session *s);
/* Source: the handshake on s->ctrl_fd, within `deadline`. */
int lmt__tls_session_connect(struct lmt_session *s, uint64_t deadline);
/* Destination: take the lobby's finished connection as the control
 * connection's TLS. */
int lmt__tls_session_adopt(struct lmt_session *s, lmt__tls *t);
/* "certificates" or "pre-shared key from the auth key". */
const char *lmt__tls_session_mode(const struct lmt_session *s);
/* Free the context and wipe the secret; the connection is freed with the
 * control connection. */
void lmt__tls_session_free(struct lmt_session *s);

/* What a side says when the peer's first bytes show the other tls value. */
#define LMT_TLS_MISMATCH_DESTINATION_OFF                                                           \
	"tls: the source speaks TLS (tls=on) and this destination has tls=off: set tls the "       \
	"same on both sides"
#define LMT_TLS_MISMATCH_DESTINATION_ON                                                            \
	"tls: this destination requires TLS (tls=on) and the source sent a plaintext HELLO "       \
	"(tls=off): set tls the same on both sides"

#endif
