/* TLS 1.3 over a connected socket, with OpenSSL: contexts for certificate
 * and external pre-shared-key modes, a handshake bounded by a deadline, and
 * whole-buffer I/O that two threads may share (one sending, one reading).
 * Used by the core's control connection and the tcp plugin's channels.
 * Internal; not installed. */
#ifndef LMT_COMMON_TLS_H
#define LMT_COMMON_TLS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "net.h"

/* The first byte of a TLS handshake record (content type 22). An lmt
 * control message or tcp hello starts with something else, which is how
 * either side tells a peer that speaks TLS from one that does not. */
#define LMT_TLS_RECORD_HANDSHAKE 0x16u

#define LMT_TLS_PSK_LEN 32u
#define LMT_TLS_SECRET_LEN 32u

typedef struct lmt__tls_ctx lmt__tls_ctx;
typedef struct lmt__tls lmt__tls;

/* HKDF-SHA-256 (RFC 5869) of `ikm` with `salt` and `info` into out[len]. */
int lmt__tls_hkdf(const void *ikm, size_t ikm_len, const char *salt, const void *info,
                  size_t info_len, uint8_t *out, size_t len, struct lmt__net_error *e);

/* A context for one side. Certificate mode: this side presents cert/key and
 * requires the peer to present one that chains to `ca`. PSK mode: both sides
 * hold the same psk[LMT_TLS_PSK_LEN] under `identity` (TLS 1.3 external PSK
 * with (EC)DHE), and the PSK alone authenticates both ends: a handshake
 * completes only when the peer proved it, and no certificate is accepted
 * in its place on either side (a client refuses a server that answers with
 * one, a server a client that offers no PSK, another identity or another
 * key). The handshake then fails with -LMT_EAUTH and "<peer> did not prove
 * the pre-shared key (how): ...", `peer` naming the other end ("the
 * destination"). Free with lmt__tls_ctx_free (NULL-safe); it must outlive
 * the handshakes of its connections. */
int lmt__tls_ctx_cert(bool server, const char *cert, const char *key, const char *ca,
                      lmt__tls_ctx **out, struct lmt__net_error *e);
int lmt__tls_ctx_psk(bool server, const uint8_t psk[LMT_TLS_PSK_LEN], const char *identity,
                     const char *peer, lmt__tls_ctx **out, struct lmt__net_error *e);
void lmt__tls_ctx_free(lmt__tls_ctx *ctx);

/* Whether a ClientHello's pre_shared_key extension (RFC 8446 4.2.11:
 * identities<7..2^16-1> of {identity<1..2^16-1>, uint32 age}, then the
 * binders) names `identity`; false for one that is malformed. The PSK
 * server's check, on bytes from the network. */
bool lmt__tls_psk_offers_identity(const uint8_t *ext, size_t len, const char *identity);

/* A connection over `fd`, which it makes non-blocking; the caller still
 * owns and closes fd. Free with lmt__tls_free (NULL-safe). */
int lmt__tls_new(lmt__tls_ctx *ctx, int fd, lmt__tls **out, struct lmt__net_error *e);
void lmt__tls_free(lmt__tls *t);

/* One step of the handshake without waiting: 0 when it is done,
 * -LMT_EAGAIN with *events set (POLLIN or POLLOUT) to wait for, or an error
 * with OpenSSL's reason in e. -LMT_EMISMATCH: the client got something
 * that is not TLS as the server's first bytes. */
int lmt__tls_handshake_step(lmt__tls *t, short *events, struct lmt__net_error *e);
/* After -LMT_EMISMATCH: the first bytes the server sent (at most 1 KiB). */
size_t lmt__tls_first_bytes(lmt__tls *t, const uint8_t **bytes);
/* The whole handshake, waiting as `w` allows. */
int lmt__tls_handshake(lmt__tls *t, const struct lmt__wait *w, struct lmt__net_error *e);

/* Send or receive exactly len bytes. Safe while another thread uses the
 * other direction. A peer that closes is -LMT_ECONN. */
int lmt__tls_send_all(lmt__tls *t, const void *buf, size_t len, const struct lmt__wait *w,
                      struct lmt__net_error *e);
int lmt__tls_recv_all(lmt__tls *t, void *buf, size_t len, const struct lmt__wait *w,
                      struct lmt__net_error *e);
/* Without waiting: bytes received (> 0), -LMT_EAGAIN when none is ready,
 * -LMT_ECONN when the peer closed, or another error. */
ssize_t lmt__tls_recv_some(lmt__tls *t, void *buf, size_t len, struct lmt__net_error *e);
/* Waiting as `w` allows for at least one byte: bytes received, or an
 * error (-LMT_ECONN when the peer closed). */
ssize_t lmt__tls_recv_wait(lmt__tls *t, void *buf, size_t len, const struct lmt__wait *w,
                           struct lmt__net_error *e);
/* Decrypted bytes waiting inside OpenSSL, which poll(2) does not see. */
bool lmt__tls_pending(lmt__tls *t);

/* A secret both ends derive from this connection (RFC 8446 exporter). */
int lmt__tls_export(lmt__tls *t, const char *label, uint8_t *out, size_t len,
                    struct lmt__net_error *e);
/* "TLSv1.3 TLS_AES_128_GCM_SHA256, kTLS send off, receive off". */
void lmt__tls_describe(lmt__tls *t, char *buf, size_t size);

#endif
