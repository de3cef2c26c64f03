/* Impostors for the TLS tests (see tls_impostor.h). */
#define _GNU_SOURCE
#include "tls_impostor.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include "hostile.h" /* hostile_connect */
#include "net.h"
#include "proto.h"
#include "tls.h"
#include "tls_session.h"
#include "wire.h"

#define WAIT_MS 20000

/* ---- OpenSSL peers with a self-signed certificate ---- */

static void self_signed(EVP_PKEY **key_out, X509 **cert_out)
{
	EVP_PKEY *key = EVP_EC_gen("P-256");
	X509 *cert = X509_new();
	assert_non_null(key);
	assert_non_null(cert);
	X509_set_version(cert, 2);
	ASN1_INTEGER_set(X509_get_serialNumber(cert), 1);
	X509_gmtime_adj(X509_getm_notBefore(cert), -3600);
	X509_gmtime_adj(X509_getm_notAfter(cert), 24 * 3600);
	X509_NAME *name = X509_get_subject_name(cert);
	X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, (const unsigned char *)"impostor", -1,
	                           -1, 0);
	X509_set_issuer_name(cert, name);
	X509_set_pubkey(cert, key);
	assert_true(X509_sign(cert, key, EVP_sha256()) > 0);
	*key_out = key;
	*cert_out = cert;
}

static const unsigned char AES128GCM_SHA256[2] = {0x13, 0x01};

/* A client impostor's PSK: its identity, a key of its own. */
static int offer_psk(SSL *ssl, const EVP_MD *md, const unsigned char **id, size_t *idlen,
                     SSL_SESSION **sess)
{
	const struct impostor *im = SSL_CTX_get_app_data(SSL_get_SSL_CTX(ssl));
	uint8_t key[32];
	if (getrandom(key, sizeof(key), 0) != (ssize_t)sizeof(key))
		return 0;
	*sess = SSL_SESSION_new();
	if (!*sess)
		return 0;
	SSL_SESSION_set1_master_key(*sess, key, sizeof(key));
	SSL_SESSION_set_cipher(*sess, SSL_CIPHER_find(ssl, AES128GCM_SHA256));
	SSL_SESSION_set_protocol_version(*sess, TLS1_3_VERSION);
	*id = (const unsigned char *)im->identity;
	*idlen = strlen(im->identity);
	return 1;
}

static SSL_CTX *impostor_ctx(struct impostor *im, bool server)
{
	SSL_CTX *c = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
	assert_non_null(c);
	EVP_PKEY *key;
	X509 *cert;
	self_signed(&key, &cert);
	assert_int_equal(SSL_CTX_use_certificate(c, cert), 1);
	assert_int_equal(SSL_CTX_use_PrivateKey(c, key), 1);
	X509_free(cert);
	EVP_PKEY_free(key);
	SSL_CTX_set_verify(c, SSL_VERIFY_NONE, NULL); /* it takes anyone */
	SSL_CTX_set_app_data(c, im);
	if (!server && im->identity)
		SSL_CTX_set_psk_use_session_callback(c, offer_psk);
	return c;
}

static void set_timeouts(int fd)
{
	struct timeval tv = {.tv_sec = WAIT_MS / 1000};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

/* The handshake, then application data until the peer goes. */
static void impostor_run(struct impostor *im, bool server)
{
	SSL *ssl = SSL_new(im->ssl_ctx);
	if (!ssl) {
		snprintf(im->reason, sizeof(im->reason), "SSL_new failed");
		return;
	}
	SSL_set_fd(ssl, im->fd);
	set_timeouts(im->fd);
	ERR_clear_error();
	if ((server ? SSL_accept(ssl) : SSL_connect(ssl)) == 1) {
		im->handshake_done = true;
		uint8_t buf[4096];
		int n;
		while ((n = SSL_read(ssl, buf, sizeof(buf))) > 0)
			im->app_bytes += (uint64_t)n;
	} else {
		ERR_error_string_n(ERR_get_error(), im->reason, sizeof(im->reason));
	}
	SSL_free(ssl);
}

static void *server_thread(void *arg)
{
	struct impostor *im = arg;
	struct pollfd p = {.fd = im->listen_fd, .events = POLLIN};
	if (poll(&p, 1, WAIT_MS) != 1) {
		snprintf(im->reason, sizeof(im->reason), "nobody connected");
		return NULL;
	}
	im->fd = accept4(im->listen_fd, NULL, NULL, SOCK_CLOEXEC);
	if (im->fd >= 0)
		impostor_run(im, true);
	return NULL;
}

static void *client_thread(void *arg)
{
	impostor_run(arg, false);
	return NULL;
}

static int listen_local(uint16_t *port)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in a = {.sin_family = AF_INET};
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	socklen_t len = sizeof(a);
	assert_true(fd >= 0);
	assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	assert_int_equal(listen(fd, 4), 0);
	assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
	*port = ntohs(a.sin_port);
	return fd;
}

static void start(struct impostor *im, void *(*fn)(void *))
{
	im->thread = malloc(sizeof(pthread_t));
	assert_non_null(im->thread);
	assert_int_equal(pthread_create(im->thread, NULL, fn, im), 0);
}

void impostor_server_start(struct impostor *im)
{
	memset(im, 0, sizeof(*im));
	im->fd = -1;
	im->ssl_ctx = impostor_ctx(im, true);
	im->listen_fd = listen_local(&im->port);
	start(im, server_thread);
}

void impostor_client_start(struct impostor *im, uint16_t port, const char *identity)
{
	memset(im, 0, sizeof(*im));
	im->listen_fd = -1;
	im->identity = identity;
	im->ssl_ctx = impostor_ctx(im, false);
	im->fd = hostile_connect(port);
	start(im, client_thread);
}

void impostor_join(struct impostor *im)
{
	pthread_join(*(pthread_t *)im->thread, NULL);
	free(im->thread);
	SSL_CTX_free(im->ssl_ctx);
	if (im->fd >= 0)
		close(im->fd);
	if (im->listen_fd >= 0)
		close(im->listen_fd);
}

/* ---- a destination that diverts a channel ---- */

struct conversation {
	lmt__tls *tls;
	struct lmt__wait w;
	struct lmt_buf out;
	uint8_t *in;
	uint32_t in_len;
	char *error;
};

static bool say(struct conversation *c)
{
	struct lmt__net_error e = {{0}};
	if (lmt__tls_send_all(c->tls, c->out.data, c->out.len, &c->w, &e) == 0)
		return true;
	snprintf(c->error, 256, "sending: %.200s", e.msg);
	return false;
}

static bool hear(struct conversation *c, uint16_t type)
{
	uint8_t raw[LMT_PROTO_HEADER_SIZE];
	struct lmt_msg_header h;
	struct lmt_error err = {0};
	struct lmt__net_error e = {{0}};
	if (lmt__tls_recv_all(c->tls, raw, sizeof(raw), &c->w, &e) ||
	    lmt__dec_header(raw, sizeof(raw), &h, &err) ||
	    lmt__tls_recv_all(c->tls, c->in, h.length, &c->w, &e)) {
		snprintf(c->error, 256, "waiting for message %u: %.100s%.100s", type, e.msg,
		         err.message);
		return false;
	}
	c->in_len = h.length;
	if (h.type == type)
		return true;
	snprintf(c->error, 256, "message %u where %u was expected", h.type, type);
	return false;
}

/* The destination's proof of docs/protocol.md:
 * HMAC-SHA-256(key, "lmt v1 destination proof" || source nonce || its own). */
static bool proof(const char *key, const uint8_t *first, const uint8_t *second, uint8_t *out)
{
	static const char label[] = "lmt v1 destination proof";
	const size_t n = sizeof(label) - 1;
	uint8_t msg[sizeof(label) - 1 + 2 * LMT_PROTO_NONCE];
	unsigned int len = 0;
	memcpy(msg, label, n);
	memcpy(msg + n, first, LMT_PROTO_NONCE);
	memcpy(msg + n + LMT_PROTO_NONCE, second, LMT_PROTO_NONCE);
	return HMAC(EVP_sha256(), key, (int)strlen(key), msg, sizeof(msg), out, &len) &&
	       len == LMT_PROTO_PROOF;
}

/* HELLO, HELLO_REPLY with this side's proof, AUTH, BLOCKS, EP_ADDRS. */
static bool authenticate(struct diverting_dest *d, struct conversation *c)
{
	struct lmt_msg_hello *hello = calloc(1, sizeof(*hello));
	struct lmt_msg_status reply = {.version = LMT_PROTO_VERSION, .auth = 1};
	struct lmt_error err = {0};
	bool ok = hello && hear(c, LMT_MSG_HELLO) &&
	          lmt__dec_hello(c->in, c->in_len, hello, &err) == 0 &&
	          getrandom(reply.nonce, sizeof(reply.nonce), 0) == (ssize_t)sizeof(reply.nonce) &&
	          proof(d->key, hello->nonce, reply.nonce, reply.proof) &&
	          lmt__enc_status(&c->out, LMT_MSG_HELLO_REPLY, &reply) == 0 && say(c) &&
	          hear(c, LMT_MSG_AUTH) && hear(c, LMT_MSG_BLOCKS) && hear(c, LMT_MSG_EP_ADDRS);
	if (!ok && !c->error[0])
		snprintf(c->error, 256, "the handshake went wrong: %.200s", err.message);
	free(hello);
	return ok;
}

/* EP_ADDRS with 127.0.0.1:divert_to for channel 0, then wait for the
 * source to give up on the channel and go. */
static void divert(struct diverting_dest *d, struct conversation *c)
{
	struct lmt_msg_addrs *a = calloc(1, sizeof(*a));
	struct tcp_dst_addr to = {.family = TCP_FAMILY_IPV4, .port = d->divert_to, .channel = 0};
	const uint8_t loopback[4] = {127, 0, 0, 1};
	memcpy(to.ip, loopback, sizeof(loopback));
	if (!a || getrandom(&to.token, sizeof(to.token), 0) != (ssize_t)sizeof(to.token)) {
		snprintf(c->error, 256, "no memory or no random token");
		free(a);
		return;
	}
	a->count = 1;
	tcp_dst_addr_encode(&to, &a->addrs[0]);
	d->diverted = lmt__enc_addrs(&c->out, a) == 0 && say(c);
	free(a);
	struct lmt__net_error e = {{0}};
	while (d->diverted &&
	       lmt__tls_recv_wait(c->tls, c->in, LMT_PROTO_MAX_PAYLOAD, &c->w, &e) > 0) {
	}
}

static void *diverting_thread(void *arg)
{
	struct diverting_dest *d = arg;
	struct conversation c = {.w = {.deadline_ns = lmt__now_ns() + WAIT_MS * 1000000ull},
	                         .in = malloc(LMT_PROTO_MAX_PAYLOAD),
	                         .error = d->error};
	struct lmt__net_error e = {{0}};
	int fd = -1;
	if (!c.in)
		snprintf(d->error, sizeof(d->error), "out of memory");
	else if (lmt__net_accept(d->listen_fd, &c.w, &fd, &e) ||
	         lmt__tls_new(d->tls_ctx, fd, &c.tls, &e) || lmt__tls_handshake(c.tls, &c.w, &e))
		snprintf(d->error, sizeof(d->error), "%s", e.msg);
	else if (authenticate(d, &c))
		divert(d, &c);
	lmt__tls_free(c.tls);
	lmt__buf_free(&c.out);
	free(c.in);
	if (fd >= 0)
		close(fd);
	return NULL;
}

void diverting_dest_start(struct diverting_dest *d, const char *key, uint16_t divert_to)
{
	memset(d, 0, sizeof(*d));
	d->key = key;
	d->divert_to = divert_to;
	/* The control connection's PSK, derived as docs/protocol.md says. */
	uint8_t psk[LMT_TLS_PSK_LEN];
	struct lmt__net_error e = {{0}};
	assert_int_equal(lmt__tls_hkdf(key, strlen(key), LMT_TLS_PSK_SALT, LMT_TLS_PSK_INFO,
	                               strlen(LMT_TLS_PSK_INFO), psk, sizeof(psk), &e),
	                 0);
	lmt__tls_ctx *ctx = NULL;
	assert_int_equal(lmt__tls_ctx_psk(true, psk, LMT_TLS_PSK_IDENTITY, "the source", &ctx, &e),
	                 0);
	d->tls_ctx = ctx;
	d->listen_fd = listen_local(&d->port);
	d->thread = malloc(sizeof(pthread_t));
	assert_non_null(d->thread);
	assert_int_equal(pthread_create(d->thread, NULL, diverting_thread, d), 0);
}

void diverting_dest_join(struct diverting_dest *d)
{
	pthread_join(*(pthread_t *)d->thread, NULL);
	free(d->thread);
	lmt__tls_ctx_free(d->tls_ctx);
	close(d->listen_fd);
}
