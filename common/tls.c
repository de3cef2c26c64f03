/* TLS 1.3 with OpenSSL for the control connection and tcp channels (see
 * tls.h). Sockets are non-blocking under TLS; a mutex serialises every
 * call on one SSL object, since a sender and a reader thread share it. */
#define _GNU_SOURCE
#include "tls.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include <openssl/core_names.h>
#include <openssl/err.h>
#include <openssl/kdf.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

/* Records up to 16 KiB go out per SSL_write step; reads take many at once. */
#define READ_BUFFER_LEN (256u << 10)
#define CIPHERSUITES "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256"

struct lmt__tls_ctx {
	SSL_CTX *ssl_ctx;
	bool server, psk_mode;
	uint8_t psk[LMT_TLS_PSK_LEN];
	char identity[64];
	char peer[48]; /* PSK mode: who the other end is, for messages */
};

/* The first bytes a client receives, kept until its handshake ends: when
 * they are not TLS, they are the server's plaintext answer. */
#define HEAD_MAX 1024u

struct lmt__tls {
	SSL *ssl;
	int fd;
	bool server;
	pthread_mutex_t lock;
	uint8_t head[HEAD_MAX];
	size_t head_len;
	char fatal[256]; /* the first failure OpenSSL gave a reason for */
	bool psk_mode;
	char peer[48];
	const char *unproven; /* PSK mode: why the peer has not proved the key */
};

static int fail(struct lmt__net_error *e, int code, const char *fmt, ...) LMT_PRINTF(3, 4);

/* OpenSSL writes to the socket with write(2): a peer that has gone would
 * raise SIGPIPE in the caller's thread, which may be the VMM's. Around
 * every call, SIGPIPE is blocked and one it raised is taken back. */
struct sigpipe_guard {
	sigset_t old;
	bool pending_before;
};

static void sigpipe_block(struct sigpipe_guard *g)
{
	sigset_t pipe, pending;
	sigemptyset(&pipe);
	sigaddset(&pipe, SIGPIPE);
	sigpending(&pending);
	g->pending_before = sigismember(&pending, SIGPIPE) == 1;
	pthread_sigmask(SIG_BLOCK, &pipe, &g->old);
}

static void sigpipe_restore(struct sigpipe_guard *g)
{
	if (!g->pending_before) {
		sigset_t pipe, pending;
		sigemptyset(&pipe);
		sigaddset(&pipe, SIGPIPE);
		sigpending(&pending);
		if (sigismember(&pending, SIGPIPE) == 1) {
			const struct timespec now = {0, 0};
			int saved = errno;
			while (sigtimedwait(&pipe, NULL, &now) < 0 && errno == EINTR) {
			}
			errno = saved;
		}
	}
	pthread_sigmask(SIG_SETMASK, &g->old, NULL);
}

/* Take the lock and guard against SIGPIPE; unlock undoes both. */
static void ssl_lock(lmt__tls *t, struct sigpipe_guard *g)
{
	pthread_mutex_lock(&t->lock);
	sigpipe_block(g);
	ERR_clear_error();
}

static void ssl_unlock(lmt__tls *t, struct sigpipe_guard *g)
{
	sigpipe_restore(g);
	pthread_mutex_unlock(&t->lock);
}

static int fail(struct lmt__net_error *e, int code, const char *fmt, ...)
{
	if (e) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
		va_end(ap);
	}
	return -code;
}

/* OpenSSL's reasons for the last failure on this thread, oldest first
 * ("error:0A000086:SSL routines::certificate verify failed"); drains the
 * queue. */
static void ssl_reasons(char *buf, size_t size)
{
	size_t used = 0;
	unsigned long code;
	buf[0] = '\0';
	while ((code = ERR_get_error()) != 0) {
		if (used + 8 >= size)
			continue;
		if (used)
			used += (size_t)snprintf(buf + used, size - used, "; ");
		ERR_error_string_n(code, buf + used, size - used);
		used += strlen(buf + used);
	}
}

static int ssl_fail(struct lmt__net_error *e, int code, const char *what)
{
	char why[200];
	ssl_reasons(why, sizeof(why));
	return fail(e, code, "%s: %s", what, why[0] ? why : "unknown OpenSSL error");
}

int lmt__tls_hkdf(const void *ikm, size_t ikm_len, const char *salt, const void *info,
                  size_t info_len, uint8_t *out, size_t len, struct lmt__net_error *e)
{
	EVP_KDF *kdf = EVP_KDF_fetch(NULL, OSSL_KDF_NAME_HKDF, NULL);
	EVP_KDF_CTX *kctx = kdf ? EVP_KDF_CTX_new(kdf) : NULL;
	EVP_KDF_free(kdf);
	if (!kctx)
		return ssl_fail(e, LMT_EIO, "HKDF is not available");
	OSSL_PARAM params[] = {
	        OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, "SHA256", 0),
	        OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, (void *)ikm, ikm_len),
	        OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_SALT, (void *)salt, strlen(salt)),
	        OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, (void *)info, info_len),
	        OSSL_PARAM_construct_end(),
	};
	int ok = EVP_KDF_derive(kctx, out, len, params);
	EVP_KDF_CTX_free(kctx);
	return ok == 1 ? 0 : ssl_fail(e, LMT_EIO, "HKDF");
}

static SSL_CTX *new_ssl_ctx(bool server, struct lmt__net_error *e)
{
	SSL_CTX *c = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
	if (!c) {
		ssl_fail(e, LMT_ENOMEM, "SSL_CTX_new");
		return NULL;
	}
	if (!SSL_CTX_set_min_proto_version(c, TLS1_3_VERSION) ||
	    !SSL_CTX_set_max_proto_version(c, TLS1_3_VERSION) ||
	    !SSL_CTX_set_ciphersuites(c, CIPHERSUITES)) {
		ssl_fail(e, LMT_EIO, "configuring TLS 1.3");
		SSL_CTX_free(c);
		return NULL;
	}
	/* The kernel's tls ULP where it exists; user-space AES-GCM otherwise. */
	SSL_CTX_set_options(c, SSL_OP_ENABLE_KTLS);
	SSL_CTX_set_mode(c, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
	SSL_CTX_set_session_cache_mode(c, SSL_SESS_CACHE_OFF);
	SSL_CTX_set_read_ahead(c, 1);
	SSL_CTX_set_default_read_buffer_len(c, READ_BUFFER_LEN);
	if (server)
		SSL_CTX_set_num_tickets(c, 0); /* nothing is resumed */
	return c;
}

static lmt__tls_ctx *wrap_ctx(SSL_CTX *ssl_ctx, bool server, struct lmt__net_error *e)
{
	lmt__tls_ctx *ctx = calloc(1, sizeof(*ctx));
	if (!ctx) {
		SSL_CTX_free(ssl_ctx);
		fail(e, LMT_ENOMEM, "out of memory");
		return NULL;
	}
	ctx->ssl_ctx = ssl_ctx;
	ctx->server = server;
	SSL_CTX_set_app_data(ssl_ctx, ctx);
	return ctx;
}

int lmt__tls_ctx_cert(bool server, const char *cert, const char *key, const char *ca,
                      lmt__tls_ctx **out, struct lmt__net_error *e)
{
	*out = NULL;
	ERR_clear_error();
	SSL_CTX *c = new_ssl_ctx(server, e);
	if (!c)
		return -LMT_EIO;
	char what[300];
	int rc = 0;
	if (SSL_CTX_use_certificate_chain_file(c, cert) != 1) {
		snprintf(what, sizeof(what), "tls-cert '%s'", cert);
		rc = ssl_fail(e, LMT_EINVAL, what);
	} else if (SSL_CTX_use_PrivateKey_file(c, key, SSL_FILETYPE_PEM) != 1) {
		snprintf(what, sizeof(what), "tls-key '%s'", key);
		rc = ssl_fail(e, LMT_EINVAL, what);
	} else if (SSL_CTX_check_private_key(c) != 1) {
		snprintf(what, sizeof(what), "tls-key '%s' does not belong to tls-cert '%s'", key,
		         cert);
		rc = ssl_fail(e, LMT_EINVAL, what);
	} else if (SSL_CTX_load_verify_locations(c, ca, NULL) != 1) {
		snprintf(what, sizeof(what), "tls-ca '%s'", ca);
		rc = ssl_fail(e, LMT_EINVAL, what);
	}
	if (rc) {
		SSL_CTX_free(c);
		return rc;
	}
	/* Mutual: each side requires the other's certificate, from tls-ca. */
	SSL_CTX_set_verify(c, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
	*out = wrap_ctx(c, server, e);
	return *out ? 0 : -LMT_ENOMEM;
}

static const unsigned char AES128GCM_SHA256[2] = {0x13, 0x01};

static SSL_SESSION *psk_session(SSL *ssl, const lmt__tls_ctx *ctx)
{
	const SSL_CIPHER *cipher = SSL_CIPHER_find(ssl, AES128GCM_SHA256);
	SSL_SESSION *sess = cipher ? SSL_SESSION_new() : NULL;
	if (!sess)
		return NULL;
	if (!SSL_SESSION_set1_master_key(sess, ctx->psk, sizeof(ctx->psk)) ||
	    !SSL_SESSION_set_cipher(sess, cipher) ||
	    !SSL_SESSION_set_protocol_version(sess, TLS1_3_VERSION)) {
		SSL_SESSION_free(sess);
		return NULL;
	}
	return sess;
}

static int psk_use(SSL *ssl, const EVP_MD *md, const unsigned char **id, size_t *idlen,
                   SSL_SESSION **sess)
{
	const lmt__tls_ctx *ctx = SSL_CTX_get_app_data(SSL_get_SSL_CTX(ssl));
	const SSL_CIPHER *cipher = SSL_CIPHER_find(ssl, AES128GCM_SHA256);
	*sess = NULL;
	*id = NULL;
	*idlen = 0;
	if (!cipher)
		return 0;
	/* A second call after a HelloRetryRequest names the hash the server
	 * chose; the PSK is bound to SHA-256. */
	if (md && EVP_MD_get_type(md) != EVP_MD_get_type(SSL_CIPHER_get_handshake_digest(cipher)))
		return 1;
	*sess = psk_session(ssl, ctx);
	if (!*sess)
		return 0;
	*id = (const unsigned char *)ctx->identity;
	*idlen = strlen(ctx->identity);
	return 1;
}

/* PSK mode's callbacks find their connection through the SSL object. */
static lmt__tls *tls_of(SSL *ssl)
{
	return ssl ? SSL_get_app_data(ssl) : NULL;
}

/* The first reason a peer failed to prove the key is the one reported. */
static void unproven(SSL *ssl, const char *why)
{
	lmt__tls *t = tls_of(ssl);
	if (t && !t->unproven)
		t->unproven = why;
}

static int psk_find(SSL *ssl, const unsigned char *identity, size_t len, SSL_SESSION **sess)
{
	const lmt__tls_ctx *ctx = SSL_CTX_get_app_data(SSL_get_SSL_CTX(ssl));
	*sess = NULL;
	/* Not ours: OpenSSL tries the client's next identity (one of them is
	 * ours, or psk_server_hello would have refused the ClientHello). */
	if (len != strlen(ctx->identity) || memcmp(identity, ctx->identity, len) != 0)
		return 1;
	*sess = psk_session(ssl, ctx);
	return *sess ? 1 : 0;
}

/* Every length is checked against the one around it before it is used. */
bool lmt__tls_psk_offers_identity(const uint8_t *ext, size_t len, const char *identity)
{
	size_t want = strlen(identity), end, at = 2;
	if (len < 2)
		return false;
	end = 2 + ((size_t)ext[0] << 8 | ext[1]);
	if (end > len)
		return false;
	while (at + 2 <= end) {
		size_t n = (size_t)ext[at] << 8 | ext[at + 1];
		if (at + 2 + n + 4 > end)
			return false;
		if (n == want && memcmp(ext + at + 2, identity, n) == 0)
			return true;
		at += 2 + n + 4;
	}
	return false;
}

/* Server: a ClientHello that does not offer this PSK with (EC)DHE (a
 * certificate handshake, or another identity) ends here, with a
 * handshake_failure alert. OpenSSL then checks the binder. */
static int psk_server_hello(SSL *ssl, int *alert, void *arg)
{
	const lmt__tls_ctx *ctx = SSL_CTX_get_app_data(SSL_get_SSL_CTX(ssl));
	const unsigned char *psk, *modes;
	size_t psk_len, modes_len;
	if (SSL_client_hello_get0_ext(ssl, TLSEXT_TYPE_psk, &psk, &psk_len) != 1 ||
	    SSL_client_hello_get0_ext(ssl, TLSEXT_TYPE_psk_kex_modes, &modes, &modes_len) != 1)
		unproven(ssl, "it offered none: a certificate handshake");
	else if (!lmt__tls_psk_offers_identity(psk, psk_len, ctx->identity))
		unproven(ssl, "it offered another PSK identity");
	else
		return SSL_CLIENT_HELLO_SUCCESS;
	*alert = SSL_AD_HANDSHAKE_FAILURE;
	return SSL_CLIENT_HELLO_ERROR;
}

/* Server: OpenSSL asks for a certificate only when no PSK was accepted
 * after psk_server_hello let the ClientHello pass (it offered only psk_ke,
 * without (EC)DHE, say); PSK mode has none to give. */
static int psk_server_no_certificate(SSL *ssl, void *arg)
{
	unproven(ssl, "it offered no PSK this side accepts");
	return 0;
}

/* Both sides: in PSK mode no certificate stands in for the key. A client
 * verifies (SSL_VERIFY_PEER), so a server that answers with a certificate
 * ends the handshake here, before the client's Finished. */
static int psk_refuse_certificate(X509_STORE_CTX *store, void *arg)
{
	unproven(X509_STORE_CTX_get_ex_data(store, SSL_get_ex_data_X509_STORE_CTX_idx()),
	         "it presented a certificate instead");
	X509_STORE_CTX_set_error(store, X509_V_ERR_APPLICATION_VERIFICATION);
	return 0;
}

int lmt__tls_ctx_psk(bool server, const uint8_t psk[LMT_TLS_PSK_LEN], const char *identity,
                     const char *peer, lmt__tls_ctx **out, struct lmt__net_error *e)
{
	*out = NULL;
	ERR_clear_error();
	if (strlen(identity) >= sizeof((*out)->identity) || strlen(peer) >= sizeof((*out)->peer))
		return fail(e, LMT_EINVAL, "PSK identity or peer name too long");
	SSL_CTX *c = new_ssl_ctx(server, e);
	if (!c)
		return -LMT_EIO;
	SSL_CTX_set_cert_verify_callback(c, psk_refuse_certificate, NULL);
	if (server) {
		SSL_CTX_set_client_hello_cb(c, psk_server_hello, NULL);
		SSL_CTX_set_psk_find_session_callback(c, psk_find);
		SSL_CTX_set_cert_cb(c, psk_server_no_certificate, NULL);
	} else {
		SSL_CTX_set_psk_use_session_callback(c, psk_use);
		SSL_CTX_set_verify(c, SSL_VERIFY_PEER, NULL);
	}
	lmt__tls_ctx *ctx = wrap_ctx(c, server, e);
	if (!ctx)
		return -LMT_ENOMEM;
	ctx->psk_mode = true;
	memcpy(ctx->psk, psk, LMT_TLS_PSK_LEN);
	snprintf(ctx->identity, sizeof(ctx->identity), "%s", identity);
	snprintf(ctx->peer, sizeof(ctx->peer), "%s", peer);
	*out = ctx;
	return 0;
}

void lmt__tls_ctx_free(lmt__tls_ctx *ctx)
{
	if (!ctx)
		return;
	SSL_CTX_free(ctx->ssl_ctx);
	OPENSSL_cleanse(ctx->psk, sizeof(ctx->psk));
	free(ctx);
}

/* Keeps what the socket BIO reads while the client's handshake runs. */
static long capture_head(BIO *b, int oper, const char *argp, size_t len, int argi, long argl,
                         int ret, size_t *processed)
{
	lmt__tls *t = (lmt__tls *)BIO_get_callback_arg(b);
	if (oper == (BIO_CB_READ | BIO_CB_RETURN) && ret > 0 && processed &&
	    t->head_len < HEAD_MAX) {
		size_t n =
		        *processed < HEAD_MAX - t->head_len ? *processed : HEAD_MAX - t->head_len;
		memcpy(t->head + t->head_len, argp, n);
		t->head_len += n;
	}
	return ret;
}

int lmt__tls_new(lmt__tls_ctx *ctx, int fd, lmt__tls **out, struct lmt__net_error *e)
{
	*out = NULL;
	ERR_clear_error();
	lmt__tls *t = calloc(1, sizeof(*t));
	if (!t)
		return fail(e, LMT_ENOMEM, "out of memory");
	if (pthread_mutex_init(&t->lock, NULL) != 0) {
		free(t);
		return fail(e, LMT_ENOMEM, "cannot create a lock");
	}
	t->fd = fd;
	t->server = ctx->server;
	t->psk_mode = ctx->psk_mode;
	snprintf(t->peer, sizeof(t->peer), "%s", ctx->peer);
	t->ssl = SSL_new(ctx->ssl_ctx);
	if (!t->ssl || SSL_set_fd(t->ssl, fd) != 1) {
		int rc = ssl_fail(e, LMT_ENOMEM, "SSL_new");
		lmt__tls_free(t);
		return rc;
	}
	SSL_set_app_data(t->ssl, t);
	if (ctx->server) {
		SSL_set_accept_state(t->ssl);
	} else {
		SSL_set_connect_state(t->ssl);
		BIO *rbio = SSL_get_rbio(t->ssl);
		BIO_set_callback_arg(rbio, (char *)t);
		BIO_set_callback_ex(rbio, capture_head);
	}
	lmt__net_set_nonblock(fd, 1);
	*out = t;
	return 0;
}

void lmt__tls_free(lmt__tls *t)
{
	if (!t)
		return;
	SSL_free(t->ssl);
	pthread_mutex_destroy(&t->lock);
	free(t);
}

/* PSK mode: the handshake failed, or ended, without the peer proving the
 * key; -LMT_EAUTH with a message that says how, or 0 when it failed for
 * another reason (OpenSSL's then). Before its handshake is done, a peer
 * that ends it with an alert has not proved the key either: that is how a
 * client learns that the server found its binder wrong (another key). */
static int psk_refusal(lmt__tls *t, const char *why, struct lmt__net_error *e)
{
	unsigned long code = ERR_peek_error();
	const char *alert = NULL;
	if (!why)
		why = t->unproven;
	if (!why && ERR_GET_LIB(code) == ERR_LIB_SSL) {
		if (ERR_GET_REASON(code) == SSL_R_BINDER_DOES_NOT_VERIFY)
			why = "its PSK binder does not verify: it holds another key";
		else if (ERR_GET_REASON(code) >= SSL_AD_REASON_OFFSET &&
		         (alert = ERR_reason_error_string(code)) != NULL)
			why = "it refused the handshake with an alert: ";
	}
	if (!why)
		return 0;
	ERR_clear_error();
	return fail(e, LMT_EAUTH, "%s did not prove the pre-shared key (%s%s): %s", t->peer, why,
	            alert ? alert : "",
	            t->server ? "refused before reading anything from it"
	                      : "refusing to send it anything");
}

/* PSK mode, after a handshake OpenSSL calls complete: the key, not a
 * certificate, authenticated the peer. The callbacks make anything else
 * fail during the handshake; this says it once more where it counts. */
static int psk_proved(lmt__tls *t, struct lmt__net_error *e)
{
	if (!t->psk_mode || (SSL_session_reused(t->ssl) == 1 && !SSL_get0_peer_certificate(t->ssl)))
		return 0;
	int rc = psk_refusal(t, "the handshake did not use it", e);
	if (e && !t->fatal[0])
		snprintf(t->fatal, sizeof(t->fatal), "%s", e->msg);
	return rc;
}

/* classify's first part: the error of a failed call, in its own words. */
static int classify_error(lmt__tls *t, int ret, short *events, const char *what,
                          struct lmt__net_error *e, bool *reasoned)
{
	int err = SSL_get_error(t->ssl, ret);
	int saved = errno;
	*reasoned = err == SSL_ERROR_SSL || (err == SSL_ERROR_SYSCALL && ERR_peek_error());
	switch (err) {
	case SSL_ERROR_WANT_READ:
		*events = POLLIN;
		return -LMT_EAGAIN;
	case SSL_ERROR_WANT_WRITE:
		*events = POLLOUT;
		return -LMT_EAGAIN;
	case SSL_ERROR_ZERO_RETURN:
		return fail(e, LMT_ECONN, "connection closed by peer");
	case SSL_ERROR_SYSCALL:
		if (ERR_peek_error())
			return ssl_fail(e, LMT_ECONN, what);
		if (saved == EAGAIN || saved == EWOULDBLOCK || saved == EINTR) {
			*events = POLLIN;
			return -LMT_EAGAIN;
		}
		return fail(e, LMT_ECONN, "%s: %s", what,
		            saved ? strerror(saved) : "connection closed by peer");
	default:
		break;
	}
	int refused = t->psk_mode && !SSL_is_init_finished(t->ssl) ? psk_refusal(t, NULL, e) : 0;
	if (refused)
		return refused;
	long verify = SSL_get_verify_result(t->ssl);
	if (verify != X509_V_OK) {
		char reason[200];
		ssl_reasons(reason, sizeof(reason));
		return fail(e, LMT_EAUTH, "%s: the peer's certificate: %s (%s)", what,
		            X509_verify_cert_error_string(verify), reason);
	}
	return ssl_fail(e, LMT_EIO, what);
}

/* What a failed call means: -LMT_EAGAIN with the poll events to wait for,
 * or an error. The first failure with OpenSSL's reasons (an alert, a
 * certificate refused) is kept: the other thread's call on the same
 * connection, failing after it, reports it rather than a bare "closed".
 * Called with t->lock held, right after the call. */
static int classify(lmt__tls *t, int ret, short *events, const char *what, struct lmt__net_error *e)
{
	bool reasoned = false;
	int rc = classify_error(t, ret, events, what, e, &reasoned);
	if (rc == -LMT_EAGAIN || !e)
		return rc;
	if (reasoned && !t->fatal[0])
		snprintf(t->fatal, sizeof(t->fatal), "%s", e->msg);
	else if (!reasoned && t->fatal[0])
		snprintf(e->msg, sizeof(e->msg), "%s", t->fatal);
	return rc;
}

/* A server that does not speak TLS answers with something other than a
 * handshake record or an alert: an lmt message starts with a type from 1
 * to 15. */
static bool answered_without_tls(const lmt__tls *t)
{
	return !t->server && t->head_len && t->head[0] != LMT_TLS_RECORD_HANDSHAKE &&
	       t->head[0] != 0x15;
}

int lmt__tls_handshake_step(lmt__tls *t, short *events, struct lmt__net_error *e)
{
	struct sigpipe_guard g;
	ssl_lock(t, &g);
	int ret = SSL_do_handshake(t->ssl);
	int rc = ret == 1 ? psk_proved(t, e) : classify(t, ret, events, "TLS handshake", e);
	if (!t->server && rc != -LMT_EAGAIN)
		BIO_set_callback_ex(SSL_get_rbio(t->ssl), NULL);
	ssl_unlock(t, &g);
	if (rc && rc != -LMT_EAGAIN && answered_without_tls(t))
		return fail(e, LMT_EMISMATCH, "the peer answered without TLS");
	return rc;
}

size_t lmt__tls_first_bytes(lmt__tls *t, const uint8_t **bytes)
{
	*bytes = t->head;
	return t->head_len;
}

int lmt__tls_handshake(lmt__tls *t, const struct lmt__wait *w, struct lmt__net_error *e)
{
	for (;;) {
		short events = 0;
		int rc = lmt__tls_handshake_step(t, &events, e);
		if (rc != -LMT_EAGAIN)
			return rc;
		rc = lmt__net_wait(t->fd, events, w, e);
		if (rc == -LMT_ETIMEDOUT)
			return fail(e, LMT_ETIMEDOUT, "TLS handshake: timed out");
		if (rc == -LMT_ECONN)
			continue; /* the next step reads why */
		if (rc)
			return rc;
	}
}

/* A send failed because the peer closed: it may have said why in an
 * alert that is still to be read (a refused certificate ends a TLS 1.3
 * client's first write). Called with the lock held. */
static int explain_with_alert(lmt__tls *t, int rc, struct lmt__net_error *e)
{
	uint8_t scratch[512];
	size_t got = 0;
	ERR_clear_error();
	int ret = SSL_read_ex(t->ssl, scratch, sizeof(scratch), &got);
	if (ret != 1 && SSL_get_error(t->ssl, ret) == SSL_ERROR_SSL && ERR_peek_error()) {
		rc = ssl_fail(e, LMT_ECONN, "TLS send: the peer ended the connection");
		if (e && !t->fatal[0])
			snprintf(t->fatal, sizeof(t->fatal), "%s", e->msg);
	}
	return rc;
}

int lmt__tls_send_all(lmt__tls *t, const void *buf, size_t len, const struct lmt__wait *w,
                      struct lmt__net_error *e)
{
	const uint8_t *p = buf;
	while (len) {
		size_t done = 0;
		short events = 0;
		struct sigpipe_guard g;
		ssl_lock(t, &g);
		int ret = SSL_write_ex(t->ssl, p, len, &done);
		int rc = ret == 1 ? 0 : classify(t, ret, &events, "TLS send", e);
		if (rc == -LMT_ECONN)
			rc = explain_with_alert(t, rc, e);
		ssl_unlock(t, &g);
		if (!rc) {
			p += done;
			len -= done;
			continue;
		}
		if (rc != -LMT_EAGAIN)
			return rc;
		rc = lmt__net_wait(t->fd, events, w, e);
		if (rc && rc != -LMT_ECONN)
			return rc;
	}
	return 0;
}

ssize_t lmt__tls_recv_some(lmt__tls *t, void *buf, size_t len, struct lmt__net_error *e)
{
	size_t got = 0;
	short events = 0;
	struct sigpipe_guard g;
	ssl_lock(t, &g);
	int ret = SSL_read_ex(t->ssl, buf, len, &got);
	int rc = ret == 1 ? 0 : classify(t, ret, &events, "TLS receive", e);
	ssl_unlock(t, &g);
	if (!rc)
		return (ssize_t)got;
	if (rc == -LMT_EAGAIN && events == POLLOUT)
		fail(e, LMT_EAGAIN, "waiting to send");
	return rc;
}

int lmt__tls_recv_all(lmt__tls *t, void *buf, size_t len, const struct lmt__wait *w,
                      struct lmt__net_error *e)
{
	uint8_t *p = buf;
	while (len) {
		short events = 0;
		size_t got = 0;
		struct sigpipe_guard g;
		ssl_lock(t, &g);
		int ret = SSL_read_ex(t->ssl, p, len, &got);
		int rc = ret == 1 ? 0 : classify(t, ret, &events, "TLS receive", e);
		ssl_unlock(t, &g);
		if (!rc) {
			p += got;
			len -= got;
			continue;
		}
		if (rc != -LMT_EAGAIN)
			return rc;
		rc = lmt__net_wait(t->fd, events, w, e);
		if (rc && rc != -LMT_ECONN)
			return rc;
	}
	return 0;
}

ssize_t lmt__tls_recv_wait(lmt__tls *t, void *buf, size_t len, const struct lmt__wait *w,
                           struct lmt__net_error *e)
{
	for (;;) {
		ssize_t n = lmt__tls_recv_some(t, buf, len, e);
		if (n != -LMT_EAGAIN)
			return n;
		int rc = lmt__net_wait(t->fd, POLLIN, w, e);
		if (rc && rc != -LMT_ECONN)
			return rc;
	}
}

bool lmt__tls_pending(lmt__tls *t)
{
	pthread_mutex_lock(&t->lock);
	bool pending = SSL_has_pending(t->ssl) == 1;
	pthread_mutex_unlock(&t->lock);
	return pending;
}

int lmt__tls_export(lmt__tls *t, const char *label, uint8_t *out, size_t len,
                    struct lmt__net_error *e)
{
	pthread_mutex_lock(&t->lock);
	ERR_clear_error();
	int ok = SSL_export_keying_material(t->ssl, out, len, label, strlen(label), NULL, 0, 0);
	int rc = ok == 1 ? 0 : ssl_fail(e, LMT_EIO, "TLS exporter");
	pthread_mutex_unlock(&t->lock);
	return rc;
}

void lmt__tls_describe(lmt__tls *t, char *buf, size_t size)
{
	pthread_mutex_lock(&t->lock);
	const SSL_CIPHER *c = SSL_get_current_cipher(t->ssl);
	int ksend = BIO_get_ktls_send(SSL_get_wbio(t->ssl));
	int krecv = BIO_get_ktls_recv(SSL_get_rbio(t->ssl));
	snprintf(buf, size, "%s %s, kTLS send %s, receive %s", SSL_get_version(t->ssl),
	         c ? SSL_CIPHER_get_name(c) : "?", ksend ? "on" : "off (user-space crypto)",
	         krecv ? "on" : "off (user-space crypto)");
	pthread_mutex_unlock(&t->lock);
}
