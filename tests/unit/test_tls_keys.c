/* The keys TLS derives are part of the wire contract (docs/protocol.md,
 * docs/tcp.md): HKDF-SHA-256 as RFC 5869 defines it, and the control
 * connection's and a tcp channel's pre-shared keys for known inputs, so
 * that a change to a label or a layout fails here before it splits two
 * versions of lmt. And the PSK server's reading of a ClientHello's
 * pre_shared_key extension, which comes from the network. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tls_session.h"
#include "channel_tls.h"
#include "bytes.h"
#include "tls.h"

static void from_hex(const char *hex, uint8_t *out, size_t len)
{
	for (size_t i = 0; i < len; i++) {
		unsigned v;
		assert_int_equal(sscanf(hex + 2 * i, "%2x", &v), 1);
		out[i] = (uint8_t)v;
	}
}

static void test_hkdf_matches_rfc_5869_with_empty_salt_and_info(void **state)
{
	uint8_t ikm[22], okm[42], want[42];
	memset(ikm, 0x0b, sizeof(ikm));
	from_hex("8da4e775a563c18f715f802a063c5a31b8a11f5c5ee1879ec3454e5f3c738d2d9d201395faa4b6"
	         "1a96c8",
	         want, sizeof(want));
	struct lmt__net_error e;
	assert_int_equal(lmt__tls_hkdf(ikm, sizeof(ikm), "", "", 0, okm, sizeof(okm), &e), 0);
	assert_memory_equal(okm, want, sizeof(want));
}

static void test_control_psk_of_a_known_key_is_fixed(void **state)
{
	uint8_t psk[LMT_TLS_PSK_LEN], want[LMT_TLS_PSK_LEN];
	from_hex("a2cf41649f4d9ce23b0160076174825d76f1662f52984d69eb59e095b0fe8533", want,
	         sizeof(want));
	struct lmt__net_error e;
	assert_int_equal(lmt__tls_hkdf("k3y", 3, LMT_TLS_PSK_SALT, LMT_TLS_PSK_INFO,
	                               strlen(LMT_TLS_PSK_INFO), psk, sizeof(psk), &e),
	                 0);
	assert_memory_equal(psk, want, sizeof(want));
}

static void test_tcp_channel_psk_of_a_known_secret_is_fixed(void **state)
{
	uint8_t secret[LMT_TLS_SECRET_LEN], psk[LMT_TLS_PSK_LEN], want[LMT_TLS_PSK_LEN];
	memset(secret, 0x5a, sizeof(secret));
	uint8_t info[11] = "channel";
	lmt__put32(info + 7, 1);
	from_hex("1e7b8b6cfc87043818f2b6ad1ea32680ba732b5126ccd9cedc833f598b495b63", want,
	         sizeof(want));
	struct lmt__net_error e;
	assert_int_equal(lmt__tls_hkdf(secret, sizeof(secret), TCP_TLS_PSK_SALT, info, sizeof(info),
	                               psk, sizeof(psk), &e),
	                 0);
	assert_memory_equal(psk, want, sizeof(want));
}

/* A pre_shared_key extension: the identities (each with a 4-byte age),
 * then a binders list of one 32-byte binder. */
static size_t psk_extension(uint8_t *out, const char *const *ids, unsigned count)
{
	size_t at = 2;
	for (unsigned i = 0; i < count; i++) {
		size_t n = strlen(ids[i]);
		out[at] = (uint8_t)(n >> 8);
		out[at + 1] = (uint8_t)n;
		memcpy(out + at + 2, ids[i], n);
		memset(out + at + 2 + n, 0, 4);
		at += 2 + n + 4;
	}
	out[0] = (uint8_t)((at - 2) >> 8);
	out[1] = (uint8_t)(at - 2);
	out[at] = 0;
	out[at + 1] = 33;
	out[at + 2] = 32;
	memset(out + at + 3, 0xb1, 32);
	return at + 35;
}

static void test_a_psk_offer_is_found_among_the_identities(void **state)
{
	uint8_t ext[256];
	const char *const ids[] = {"lmt-impostor", LMT_TLS_PSK_IDENTITY};
	size_t len = psk_extension(ext, ids, 2);
	assert_true(lmt__tls_psk_offers_identity(ext, len, LMT_TLS_PSK_IDENTITY));
	assert_false(lmt__tls_psk_offers_identity(ext, len, "lmt-control-v2"));
	len = psk_extension(ext, ids, 1);
	assert_false(lmt__tls_psk_offers_identity(ext, len, LMT_TLS_PSK_IDENTITY));
	assert_false(lmt__tls_psk_offers_identity(ext, len, "lmt-impostor-and-more"));
	assert_false(lmt__tls_psk_offers_identity(ext, len, "lmt-impost"));
}

static void test_a_malformed_psk_offer_names_no_identity(void **state)
{
	uint8_t ext[256];
	const char *const ids[] = {LMT_TLS_PSK_IDENTITY};
	size_t len = psk_extension(ext, ids, 1);
	assert_true(lmt__tls_psk_offers_identity(ext, len, LMT_TLS_PSK_IDENTITY));
	/* Cut anywhere inside the identities: never read past the cut. */
	size_t identities = 2 + ((size_t)ext[0] << 8 | ext[1]);
	for (size_t cut = 0; cut < identities; cut++) {
		uint8_t *copy = malloc(cut ? cut : 1);
		assert_non_null(copy);
		memcpy(copy, ext, cut);
		assert_false(lmt__tls_psk_offers_identity(copy, cut, LMT_TLS_PSK_IDENTITY));
		free(copy);
	}
	/* An identity longer than the list that holds it. */
	ext[3] = 200;
	assert_false(lmt__tls_psk_offers_identity(ext, len, LMT_TLS_PSK_IDENTITY));
	/* A list longer than the extension. */
	len = psk_extension(ext, ids, 1);
	ext[0] = 0xff;
	assert_false(lmt__tls_psk_offers_identity(ext, len, LMT_TLS_PSK_IDENTITY));
	/* An empty list. */
	const uint8_t empty[2] = {0, 0};
	assert_false(lmt__tls_psk_offers_identity(empty, sizeof(empty), ""));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_hkdf_matches_rfc_5869_with_empty_salt_and_info),
	        cmocka_unit_test(test_control_psk_of_a_known_key_is_fixed),
	        cmocka_unit_test(test_tcp_channel_psk_of_a_known_secret_is_fixed),
	        cmocka_unit_test(test_a_psk_offer_is_found_among_the_identities),
	        cmocka_unit_test(test_a_malformed_psk_offer_names_no_identity),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
