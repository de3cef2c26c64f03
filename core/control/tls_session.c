/* The session's TLS (see tls_session.h and docs/protocol.md, "TLS").
 * Room: control; may use: base, wire, session. */
#define _GNU_SOURCE
#include "tls_session.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "bytes.h"
#include "session.h"
#include "control.h"

const char *lmt__tls_session_mode(const struct lmt_session *s)
{
	return s->tls_cert_mode ? "certificates" : "pre-shared key from the auth key";
}

static int make_context(struct lmt_session *s, const char *cert, const char *key, const char *ca)
{
	bool server = s->role == LMT_ROLE_DESTINATION;
	struct lmt__net_error e = {{0}};
	int rc;
	if (*cert || *key || *ca) {
		char missing[64] = "";
		const char *names[] = {"tls-cert", "tls-key", "tls-ca"};
		const char *values[] = {cert, key, ca};
		for (int i = 0; i < 3; i++)
			if (!*values[i])
				snprintf(missing + strlen(missing),
				         sizeof(missing) - strlen(missing), "%s%s",
				         *missing ? ", " : "", names[i]);
		if (*missing)
			return lmt__fail(s, LMT_EINVAL,
			                 "tls=on with certificates needs tls-cert, tls-key and "
			                 "tls-ca; not set: %s",
			                 missing);
		s->tls_cert_mode = true;
		rc = lmt__tls_ctx_cert(server, cert, key, ca, &s->tls_ctx, &e);
		return rc ? lmt__fail(s, -rc, "%s", e.msg) : 0;
	}
	if (!s->auth.bytes)
		return lmt__fail(s, LMT_EINVAL,
		                 "tls=on needs tls-cert, tls-key and tls-ca (certificate mode) or "
		                 "auth-key or auth-key-file (pre-shared-key mode); none is set");
	uint8_t psk[LMT_TLS_PSK_LEN];
	rc = lmt__tls_hkdf(s->auth.bytes, s->auth.len, LMT_TLS_PSK_SALT, LMT_TLS_PSK_INFO,
	                   strlen(LMT_TLS_PSK_INFO), psk, sizeof(psk), &e);
	if (!rc)
		rc = lmt__tls_ctx_psk(server, psk, LMT_TLS_PSK_IDENTITY,
		                      server ? "the source" : "the destination", &s->tls_ctx, &e);
	explicit_bzero(psk, sizeof(psk));
	return rc ? lmt__fail(s, -rc, "tls: %s", e.msg) : 0;
}

int lmt__tls_session_prepare(struct lmt_session *s)
{
	char cert[PATH_MAX], key[PATH_MAX], ca[PATH_MAX];
	pthread_mutex_lock(&s->opts_lock);
	s->tls = lmt__opt_bool(s->opts, "tls");
	snprintf(cert, sizeof(cert), "%s", lmt__opt_text(s->opts, "tls-cert"));
	snprintf(key, sizeof(key), "%s", lmt__opt_text(s->opts, "tls-key"));
	snprintf(ca, sizeof(ca), "%s", lmt__opt_text(s->opts, "tls-ca"));
	pthread_mutex_unlock(&s->opts_lock);
	lmt__tls_ctx_free(s->tls_ctx);
	s->tls_ctx = NULL;
	s->tls_cert_mode = false;
	if (!s->tls) {
		const char *set = *cert ? "tls-cert" : *key ? "tls-key" : *ca ? "tls-ca" : NULL;
		if (set)
			return lmt__fail(s, LMT_EINVAL,
			                 "%s is set but tls=off: set tls=on to use it", set);
		return 0;
	}
	int rc = make_context(s, cert, key, ca);
	if (rc)
		return rc;
	if (!(s->caps & LMT_CAP_ENCRYPTS))
		lmt__session_log(
		        s, LMT_LOG_WARN,
		        "tls: the %s plugin does not encrypt its data channels: guest memory "
		        "crosses them in clear; only the control connection is TLS",
		        s->wire_name);
	return 0;
}

/* Both ends: the secret for the plugin, and a line on what protects the
 * connection. */
static int established(struct lmt_session *s)
{
	struct lmt__net_error e = {{0}};
	int rc = lmt__tls_export(s->ctrl_tls, LMT_TLS_EXPORTER_LABEL, s->channel_secret,
	                         sizeof(s->channel_secret), &e);
	if (rc)
		return lmt__fail(s, -rc, "tls: %s", e.msg);
	char how[160];
	lmt__tls_describe(s->ctrl_tls, how, sizeof(how));
	lmt__session_log(s, LMT_LOG_INFO, "control connection: %s (%s)", how,
	                 lmt__tls_session_mode(s));
	return 0;
}

/* The destination answered without TLS: its reason, when its first bytes
 * are a whole plaintext HELLO_REPLY. */
static int plaintext_answer(struct lmt_session *s)
{
	const uint8_t *head;
	size_t len = lmt__tls_first_bytes(s->ctrl_tls, &head);
	struct lmt_msg_header h;
	struct lmt_msg_status st;
	struct lmt_error err = {0};
	bool said = len >= LMT_PROTO_HEADER_SIZE &&
	            lmt__dec_header(head, LMT_PROTO_HEADER_SIZE, &h, &err) == 0 &&
	            h.type == LMT_MSG_HELLO_REPLY && h.length <= len - LMT_PROTO_HEADER_SIZE &&
	            lmt__dec_status(head + LMT_PROTO_HEADER_SIZE, h.length, LMT_MSG_HELLO_REPLY,
	                            &st, &err) == 0;
	return lmt__fail(s, LMT_EMISMATCH,
	                 "tls: this source has tls=on and the destination answered without TLS "
	                 "(tls=off there?): set tls the same on both sides%s%s%s",
	                 said ? " (the destination said: " : "", said ? st.text : "",
	                 said ? ")" : "");
}

int lmt__tls_session_connect(struct lmt_session *s, uint64_t deadline)
{
	if (!s->tls)
		return 0;
	struct lmt__net_error e = {{0}};
	int rc = lmt__tls_new(s->tls_ctx, s->ctrl_fd, &s->ctrl_tls, &e);
	if (rc)
		return lmt__fail(s, -rc, "tls: %s", e.msg);
	struct lmt__wait w = lmt__wait_until(s, deadline);
	rc = lmt__tls_handshake(s->ctrl_tls, &w, &e);
	if (rc == -LMT_EMISMATCH)
		return plaintext_answer(s);
	if (rc == -LMT_ETIMEDOUT)
		return lmt__fail(s, LMT_ETIMEDOUT,
		                 "tls: no TLS handshake with the destination within "
		                 "connect-timeout (%llu ms)",
		                 (unsigned long long)(s->connect_timeout_ns / 1000000));
	if (rc == -LMT_ECANCELED)
		return lmt__fail(s, LMT_ECANCELED,
		                 "tls: handshake with the destination: cancelled");
	if (rc == -LMT_EAUTH && !s->tls_cert_mode) /* "the destination did not prove ..." */
		return lmt__fail(s, LMT_EAUTH, "tls: %s", e.msg);
	if (rc)
		return lmt__fail(s, rc == -LMT_EAUTH ? LMT_EAUTH : -rc,
		                 "tls (%s): handshake with the destination failed: %s",
		                 lmt__tls_session_mode(s), e.msg);
	return established(s);
}

int lmt__tls_session_adopt(struct lmt_session *s, lmt__tls *t)
{
	s->ctrl_tls = t;
	return established(s);
}

void lmt__tls_session_free(struct lmt_session *s)
{
	lmt__tls_ctx_free(s->tls_ctx);
	s->tls_ctx = NULL;
	explicit_bzero(s->channel_secret, sizeof(s->channel_secret));
}
