/* Handshake authentication: a mutual HMAC-SHA-256 challenge-response over
 * both sides' nonces with a shared key, computed by OpenSSL's libcrypto.
 * Room: wire; may use: base. */
#ifndef LMT_CORE_AUTH_H
#define LMT_CORE_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <lmt/lmt.h>

#define LMT_AUTH_NONCE 32u
#define LMT_AUTH_PROOF 32u
#define LMT_AUTH_KEY_MAX 4096u

struct lmt_auth_key {
	uint8_t *bytes; /* NULL when no key is set */
	size_t len;
};

/* Read auth-key or auth-key-file (not both); no key is fine. */
int lmt__auth_key_load(const char *key, const char *path, struct lmt_auth_key *out,
                       struct lmt_error *err);
/* Wipe and free; NULL-safe. */
void lmt__auth_key_free(struct lmt_auth_key *key);

int lmt__auth_nonce(uint8_t out[LMT_AUTH_NONCE]);

/* HMAC-SHA-256(key, label || first || second). The labels keep a
 * destination's proof from ever passing as a source's. */
int lmt__auth_proof(const struct lmt_auth_key *key, const char *label,
                    const uint8_t first[LMT_AUTH_NONCE], const uint8_t second[LMT_AUTH_NONCE],
                    uint8_t out[LMT_AUTH_PROOF]);

/* Constant-time comparison of two proofs. */
bool lmt__auth_equal(const uint8_t a[LMT_AUTH_PROOF], const uint8_t b[LMT_AUTH_PROOF]);

#define LMT_AUTH_LABEL_SOURCE "lmt v1 source proof"
#define LMT_AUTH_LABEL_DESTINATION "lmt v1 destination proof"

#endif
