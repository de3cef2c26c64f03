/* Handshake authentication with OpenSSL's HMAC-SHA-256 (see auth.h).
 * Room: wire; may use: base. */
#define _GNU_SOURCE
#include "auth.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/core_names.h>
#include <openssl/params.h>
#include <openssl/rand.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.h"

static int key_from_file(const char *path, struct lmt_auth_key *out, struct lmt_error *err)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return lmt__error(err, LMT_EINVAL, "auth-key-file '%s': %s", path, strerror(errno));
	uint8_t *buf = malloc(LMT_AUTH_KEY_MAX + 1);
	ssize_t n = buf ? read(fd, buf, LMT_AUTH_KEY_MAX + 1) : -1;
	int saved = errno;
	close(fd);
	if (n < 0) {
		free(buf);
		return lmt__error(err, buf ? LMT_EINVAL : LMT_ENOMEM, "auth-key-file '%s': %s",
		                  path, strerror(saved));
	}
	if ((size_t)n > LMT_AUTH_KEY_MAX) {
		OPENSSL_cleanse(buf, LMT_AUTH_KEY_MAX + 1);
		free(buf);
		return lmt__error(err, LMT_EINVAL, "auth-key-file '%s': longer than %u bytes", path,
		                  LMT_AUTH_KEY_MAX);
	}
	ssize_t read_len = n;
	while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
		n--;
	/* Only len bytes are wiped with the key: nothing of the file may
	 * stay beyond them. */
	OPENSSL_cleanse(buf + n, (size_t)(read_len - n));
	if (n == 0) {
		free(buf);
		return lmt__error(err, LMT_EINVAL, "auth-key-file '%s': empty", path);
	}
	out->bytes = buf;
	out->len = (size_t)n;
	return 0;
}

int lmt__auth_key_load(const char *key, const char *path, struct lmt_auth_key *out,
                       struct lmt_error *err)
{
	out->bytes = NULL;
	out->len = 0;
	bool has_key = key && *key, has_path = path && *path;
	if (has_key && has_path)
		return lmt__error(err, LMT_EINVAL, "auth-key and auth-key-file: give only one");
	if (has_path)
		return key_from_file(path, out, err);
	if (!has_key)
		return 0;
	size_t len = strlen(key);
	if (len > LMT_AUTH_KEY_MAX)
		return lmt__error(err, LMT_EINVAL, "auth-key: longer than %u bytes",
		                  LMT_AUTH_KEY_MAX);
	out->bytes = malloc(len);
	if (!out->bytes)
		return lmt__error(err, LMT_ENOMEM, "auth-key: out of memory");
	memcpy(out->bytes, key, len);
	out->len = len;
	return 0;
}

void lmt__auth_key_free(struct lmt_auth_key *key)
{
	if (!key || !key->bytes)
		return;
	OPENSSL_cleanse(key->bytes, key->len);
	free(key->bytes);
	key->bytes = NULL;
	key->len = 0;
}

int lmt__auth_nonce(uint8_t out[LMT_AUTH_NONCE])
{
	return RAND_bytes(out, LMT_AUTH_NONCE) == 1 ? 0 : -LMT_EIO;
}

/* Through an EVP_MAC context, freed (and so cleansed of the key and the
 * hash state) before returning; the message holds no secret. */
int lmt__auth_proof(const struct lmt_auth_key *key, const char *label,
                    const uint8_t first[LMT_AUTH_NONCE], const uint8_t second[LMT_AUTH_NONCE],
                    uint8_t out[LMT_AUTH_PROOF])
{
	size_t llen = strlen(label);
	uint8_t msg[64 + 2 * LMT_AUTH_NONCE];
	if (llen > 64 || !key->bytes)
		return -LMT_EINVAL;
	memcpy(msg, label, llen);
	memcpy(msg + llen, first, LMT_AUTH_NONCE);
	memcpy(msg + llen + LMT_AUTH_NONCE, second, LMT_AUTH_NONCE);
	EVP_MAC *mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
	EVP_MAC_CTX *ctx = mac ? EVP_MAC_CTX_new(mac) : NULL;
	OSSL_PARAM params[] = {
	        OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, (char *)"SHA256", 0),
	        OSSL_PARAM_construct_end(),
	};
	size_t len = 0;
	int ok = ctx && EVP_MAC_init(ctx, key->bytes, key->len, params) == 1 &&
	         EVP_MAC_update(ctx, msg, llen + 2 * LMT_AUTH_NONCE) == 1 &&
	         EVP_MAC_final(ctx, out, &len, LMT_AUTH_PROOF) == 1 && len == LMT_AUTH_PROOF;
	EVP_MAC_CTX_free(ctx);
	EVP_MAC_free(mac);
	return ok ? 0 : -LMT_EIO;
}

bool lmt__auth_equal(const uint8_t a[LMT_AUTH_PROOF], const uint8_t b[LMT_AUTH_PROOF])
{
	return CRYPTO_memcmp(a, b, LMT_AUTH_PROOF) == 0;
}
