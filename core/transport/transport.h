/* The transport room (core/transport/): plugin loading (loader.c), the
 * host services lent to plugins (host.c), the plugin instance and
 * endpoints of a session (transport.c). May use: base, wire, session,
 * control. */
#ifndef LMT_CORE_TRANSPORT_H
#define LMT_CORE_TRANSPORT_H

#include "session.h"

/* ---- host.c: the services lent to the plugin, with the session as host_ctx ---- */

extern const struct lmt_host lmt__host_services;

/* ---- transport.c: the plugin instance and endpoints, shared by both roles ---- */

/* Open the instance and the endpoints; send their addresses (EP_ADDRS). */
int lmt__endpoints_open(struct lmt_session *s);
/* The same without a peer to send them to (a file: target). */
int lmt__endpoints_open_local(struct lmt_session *s);
/* Release every key, registration and endpoint, then the instance. */
void lmt__transport_close(struct lmt_session *s);

#endif
