/* TLS on the tcp plugin's channels (see channel_tls.h). */
#define _GNU_SOURCE
#include "channel_tls.h"

#include <string.h>

#include "bytes.h"

void tcp_tls_init(struct lmt_instance *inst, const struct lmt_instance_params *params)
{
	const uint8_t *secret = LMT_PARAMS_CHANNEL_SECRET(params);
	if (!secret || params->channel_secret_len != sizeof(inst->tls_secret))
		return;
	memcpy(inst->tls_secret, secret, sizeof(inst->tls_secret));
	inst->tls = true;
}

int tcp_tls_open(lmt_endpoint *ep)
{
	struct lmt_instance *inst = ep->inst;
	if (!inst->tls)
		return 0;
	bool server = inst->base.role == LMT_ROLE_DESTINATION;
	/* Each channel its own key: info is "channel" and its number. */
	uint8_t info[11] = "channel";
	lmt__put32(info + 7, ep->channel);
	uint8_t psk[LMT_TLS_PSK_LEN];
	struct lmt__net_error e = {{0}};
	int rc = lmt__tls_hkdf(inst->tls_secret, sizeof(inst->tls_secret), TCP_TLS_PSK_SALT, info,
	                       sizeof(info), psk, sizeof(psk), &e);
	if (!rc)
		rc = lmt__tls_ctx_psk(server, psk, TCP_TLS_PSK_IDENTITY,
		                      server ? "the source" : "the destination", &ep->tls_ctx, &e);
	explicit_bzero(psk, sizeof(psk));
	if (rc)
		return putil_error(&inst->base, -rc, "tcp channel %u: tls: %s", ep->channel, e.msg);
	return 0;
}

int tcp_tls_connect(lmt_endpoint *ep, const struct lmt__wait *w, struct lmt__net_error *e)
{
	int rc = lmt__tls_new(ep->tls_ctx, ep->fd, &ep->tls, e);
	if (!rc)
		rc = lmt__tls_handshake(ep->tls, w, e);
	if (rc)
		return rc;
	char how[160];
	lmt__tls_describe(ep->tls, how, sizeof(how));
	putil_log(&ep->inst->base, LMT_LOG_INFO, "tcp channel %u: %s", ep->channel, how);
	return 0;
}

void tcp_tls_close(lmt_endpoint *ep)
{
	lmt__tls_free(ep->tls);
	ep->tls = NULL;
	lmt__tls_ctx_free(ep->tls_ctx);
	ep->tls_ctx = NULL;
}
