/* A hostile peer for the security suite: raw connections to a destination's
 * control port that speak as much of the protocol as an attack needs, and
 * a tcp source endpoint driven through the plugin ABI (on the plugin test
 * harness's host) for attacks that go past the handshake. Nothing here uses the library's own source engine,
 * so the destination is checked against the wire as docs/protocol.md
 * describes it (the proofs are computed here from the documented inputs). */
#ifndef LMT_TESTS_HOSTILE_H
#define LMT_TESTS_HOSTILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <lmt/lmt.h>

#include "guest.h"
#include "plugin_harness.h"
#include "proto.h"

/* A destination loading in a thread of this process, on guest RAM that
 * starts zero-filled. */
struct guard_dest {
	struct guest_ram ram;
	lmt_session *session;
	uint16_t port;
	int rc;
	char error[600];
	uint64_t started_ns, ended_ns;
	const void *state; /* after a completed load */
	size_t state_len;
	void *thread; /* pthread_t, opaque here */
};

struct guard_dest *guard_dest_start(uint64_t ram_bytes, const char *opts);
void guard_dest_join(struct guard_dest *d);
/* Whether the load has ended (without waiting). */
bool guard_dest_done(struct guard_dest *d);
/* Nothing of the destination's RAM was written. */
bool guard_ram_untouched(const struct guard_dest *d);
void guard_dest_free(struct guard_dest *d);

/* A key file holding `key` and a newline; the path stays valid. */
const char *guard_key_file(const char *key);

/* ---- raw control connections ---- */

int hostile_connect(uint16_t port);
void hostile_send(int fd, const void *data, size_t len);
void hostile_send_buf(int fd, const struct lmt_buf *b);
/* The next message but keep-alives (0 on end of stream or after
 * timeout_ms); its payload in `payload` (LMT_PROTO_MAX_PAYLOAD bytes), its
 * length in *len. */
uint16_t hostile_recv(int fd, uint8_t *payload, uint32_t *len, int timeout_ms);
/* Whether the destination closed the connection within timeout_ms. */
bool hostile_closed_by_peer(int fd, int timeout_ms);

/* A HELLO with the destination's default must-match options (chunk-size
 * 1M, pin-all off, channels 1, verify off, postcopy off) for plugin tcp. */
struct lmt_msg_hello *hostile_hello(bool auth);
/* The HMAC-SHA-256 proof of docs/protocol.md, from the key and the nonces. */
void hostile_proof(const char *key, const char *label, const uint8_t *first,
                   const uint8_t *second, uint8_t out[LMT_PROTO_PROOF]);

/* HELLO (with a key: and AUTH, with the right proof when `good`); returns
 * the HELLO_REPLY's status code (and its text in `text`). */
int hostile_handshake(int fd, const char *key, bool good, char *text, size_t size);

/* ---- past the handshake: a tcp source endpoint through the ABI ---- */

struct hostile_source {
	int fd;               /* control connection */
	struct ph_config cfg; /* tcp.so, loaded as lmt loads it */
	struct ph_side side;  /* its source instance and endpoint, on a ph_ host */
	struct lmt_buf out;
	uint8_t *in;
	uint32_t in_len;
	uint16_t data_port; /* the destination's data listener */
};

/* Authenticate with `key` (NULL: none), send the blocks of `ram`, open a
 * tcp endpoint and exchange addresses. The destination then waits for the
 * data connection; hostile_source_connect makes it and reads READY. */
void hostile_source_open(struct hostile_source *h, uint16_t port, const char *key,
                         const struct guest_ram *ram);
/* 0 once READY came, or -1. */
int hostile_source_connect(struct hostile_source *h);
/* Register every window of every block and write `ram` through them; 0. */
int hostile_source_write_all(struct hostile_source *h, const struct guest_ram *ram);
void hostile_source_close(struct hostile_source *h);

#endif
