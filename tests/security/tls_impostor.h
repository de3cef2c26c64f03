/* Impostors for the TLS tests: OpenSSL peers with a self-signed certificate
 * made here with libcrypto, which do not hold the session's key, and a
 * destination that holds the key but sends a tcp channel to one of them.
 * Each impostor counts the application bytes it received (the tests want
 * none: no HELLO, no channel token). */
#ifndef LMT_TESTS_TLS_IMPOSTOR_H
#define LMT_TESTS_TLS_IMPOSTOR_H

#include <stdbool.h>
#include <stdint.h>

struct impostor {
	uint16_t port;        /* a server's listening port on 127.0.0.1 */
	bool handshake_done;  /* OpenSSL completed its side of the handshake */
	char reason[256];     /* else OpenSSL's reason */
	uint64_t app_bytes;   /* application data received */
	const char *identity; /* client: offer a PSK (of its own) under it */
	int listen_fd, fd;
	void *ssl_ctx; /* SSL_CTX, made before the thread starts */
	void *thread;  /* pthread_t, opaque here */
};

/* A TLS server on 127.0.0.1 (its port in im->port) that accepts one
 * connection, answers with a self-signed certificate, then reads
 * application data until the peer goes. */
void impostor_server_start(struct impostor *im);
/* A TLS client to 127.0.0.1:port with a self-signed certificate that
 * offers no PSK (identity NULL) or one of its own under `identity`, then
 * reads application data until the peer goes. */
void impostor_client_start(struct impostor *im, uint16_t port, const char *identity);
/* Wait for it to end (at most 20 s) and close everything. */
void impostor_join(struct impostor *im);

/* A destination with tls=on and auth-key=key (one channel, plugin tcp):
 * it completes the source's TLS handshake and the authentication as lmt
 * does (docs/protocol.md), takes the block list and the source's
 * addresses, and then gives, as channel 0's address, 127.0.0.1:divert_to,
 * with a token of its own. */
struct diverting_dest {
	uint16_t port; /* its control port */
	uint16_t divert_to;
	const char *key;
	bool diverted;   /* EP_ADDRS sent */
	char error[256]; /* what went wrong before that */
	int listen_fd;
	void *tls_ctx; /* lmt__tls_ctx, made before the thread starts */
	void *thread;
};

void diverting_dest_start(struct diverting_dest *d, const char *key, uint16_t divert_to);
void diverting_dest_join(struct diverting_dest *d);

#endif
