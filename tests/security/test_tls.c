/* TLS (tls=on): migrations in certificate and pre-shared-key mode over the
 * tcp plugin (control and channels encrypted) and over another plugin
 * (control only); a side with tls=on facing one without, a wrong CA and a
 * wrong key fail on both sides with errors that say so, leaving nothing
 * behind; in pre-shared-key mode an impostor with a certificate instead of
 * the key, as destination, as source or on a diverted tcp channel, is
 * refused in the handshake and reads nothing; and an observer of the
 * loopback interface finds the guest's pages in a plaintext migration but
 * not in an encrypted one. Source and destination run as two sessions of
 * this process; the certificates are made at run time in a temporary
 * directory. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include "harness.h"
#include "hostile.h"
#include "tls_impostor.h"

#define RAM_BYTES (8ull << 20)

/* ---- certificates, made with OpenSSL at run time ---- */

static char dir[] = "/tmp/lmt-test-tls-XXXXXX";

struct pem_pair {
	char cert[96], key[96];
};

static struct pem_pair ca, other_ca, source_id, destination_id, stranger_id;

static EVP_PKEY *new_key(void)
{
	EVP_PKEY *k = EVP_EC_gen("P-256");
	assert_non_null(k);
	return k;
}

static void write_pem(const char *path, EVP_PKEY *key, X509 *cert)
{
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	if (key)
		assert_int_equal(PEM_write_PrivateKey(f, key, NULL, NULL, 0, NULL, NULL), 1);
	else
		assert_int_equal(PEM_write_X509(f, cert), 1);
	fclose(f);
}

static void add_ext(X509 *cert, X509 *issuer, int nid, const char *value)
{
	X509V3_CTX ctx;
	X509V3_set_ctx_nodb(&ctx);
	X509V3_set_ctx(&ctx, issuer, cert, NULL, NULL, 0);
	X509_EXTENSION *ext = X509V3_EXT_conf_nid(NULL, &ctx, nid, value);
	assert_non_null(ext);
	assert_int_equal(X509_add_ext(cert, ext, -1), 1);
	X509_EXTENSION_free(ext);
}

/* A certificate for `name`, signed by issuer (self-signed when NULL);
 * written as name.crt and name.key; returns the cert and key to sign
 * others with (the caller frees them). */
static void make_cert(const char *name, X509 *issuer, EVP_PKEY *issuer_key, struct pem_pair *out,
                      X509 **cert_out, EVP_PKEY **key_out)
{
	EVP_PKEY *key = new_key();
	X509 *cert = X509_new();
	assert_non_null(cert);
	X509_set_version(cert, 2);
	uint64_t serial;
	assert_int_equal(getrandom(&serial, sizeof(serial), 0), (ssize_t)sizeof(serial));
	ASN1_INTEGER_set_uint64(X509_get_serialNumber(cert), serial >> 1);
	X509_gmtime_adj(X509_getm_notBefore(cert), -3600);
	X509_gmtime_adj(X509_getm_notAfter(cert), 24 * 3600);
	X509_NAME *subject = X509_get_subject_name(cert);
	X509_NAME_add_entry_by_txt(subject, "CN", MBSTRING_ASC, (const unsigned char *)name, -1, -1,
	                           0);
	X509_set_pubkey(cert, key);
	X509 *signer = issuer ? issuer : cert;
	X509_set_issuer_name(cert, X509_get_subject_name(signer));
	add_ext(cert, signer, NID_basic_constraints,
	        issuer ? "critical,CA:FALSE" : "critical,CA:TRUE");
	add_ext(cert, signer, NID_key_usage,
	        issuer ? "critical,digitalSignature" : "critical,keyCertSign,cRLSign");
	assert_true(X509_sign(cert, issuer ? issuer_key : key, EVP_sha256()) > 0);
	snprintf(out->cert, sizeof(out->cert), "%s/%s.crt", dir, name);
	snprintf(out->key, sizeof(out->key), "%s/%s.key", dir, name);
	write_pem(out->cert, NULL, cert);
	write_pem(out->key, key, NULL);
	if (cert_out) {
		*cert_out = cert;
		*key_out = key;
	} else {
		X509_free(cert);
		EVP_PKEY_free(key);
	}
}

static int make_certificates(void **state)
{
	assert_non_null(mkdtemp(dir));
	X509 *ca_cert, *other_cert;
	EVP_PKEY *ca_key, *other_key;
	make_cert("ca", NULL, NULL, &ca, &ca_cert, &ca_key);
	make_cert("other-ca", NULL, NULL, &other_ca, &other_cert, &other_key);
	make_cert("source", ca_cert, ca_key, &source_id, NULL, NULL);
	make_cert("destination", ca_cert, ca_key, &destination_id, NULL, NULL);
	make_cert("stranger", other_cert, other_key, &stranger_id, NULL, NULL);
	X509_free(ca_cert);
	X509_free(other_cert);
	EVP_PKEY_free(ca_key);
	EVP_PKEY_free(other_key);
	return 0;
}

static int remove_certificates(void **state)
{
	const struct pem_pair *all[] = {&ca, &other_ca, &source_id, &destination_id, &stranger_id};
	for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
		unlink(all[i]->cert);
		unlink(all[i]->key);
	}
	rmdir(dir);
	return 0;
}

static const char *cert_options(char *buf, size_t size, const struct pem_pair *id,
                                const struct pem_pair *authority, const char *more)
{
	snprintf(buf, size, "tls=on,tls-cert=%s,tls-key=%s,tls-ca=%s%s%s", id->cert, id->key,
	         authority->cert, *more ? "," : "", more);
	return buf;
}

/* ---- a migration between two sessions of this process ---- */

static const uint8_t *marker; /* when set, written into every page of the guest */

static void migrate(const char *src_opts, const char *dst_opts, struct migration_side *src, struct migration_side *dst)
{
	migrate_in_process(src_opts, dst_opts, RAM_BYTES, 21, marker, src, dst);
}

static void expect_contains(const char *have, const char *want)
{
	if (!strstr(have, want))
		fail_msg("expected '%s' in '%s'", want, have);
}

static void expect_success(const struct migration_side *src, const struct migration_side *dst)
{
	if (src->rc || dst->rc)
		fail_msg("source %d (%s), destination %d (%s)", src->rc, src->error, dst->rc,
		         dst->error);
	assert_int_equal(src->stats.bytes_sent >= RAM_BYTES * 8 / 10, 1);
}

static void test_psk_mode_migrates_over_tcp_on_one_channel(void **state)
{
	struct migration_side src, dst;
	migrate("tls=on,auth-key=k3y,channels=1", "tls=on,auth-key=k3y,channels=1", &src, &dst);
	expect_success(&src, &dst);
}

static void test_psk_mode_migrates_over_tcp_on_two_channels(void **state)
{
	struct migration_side src, dst;
	migrate("tls=on,auth-key=k3y,channels=2,verify=on",
	        "tls=on,auth-key=k3y,channels=2,verify=on", &src, &dst);
	expect_success(&src, &dst);
}

static void test_cert_mode_migrates_over_tcp_on_one_channel(void **state)
{
	char s[512], d[512];
	struct migration_side src, dst;
	migrate(cert_options(s, sizeof(s), &source_id, &ca, "channels=1"),
	        cert_options(d, sizeof(d), &destination_id, &ca, "channels=1"), &src, &dst);
	expect_success(&src, &dst);
}

static void test_cert_mode_with_an_auth_key_migrates_over_tcp_on_two_channels(void **state)
{
	char s[512], d[512];
	struct migration_side src, dst;
	migrate(cert_options(s, sizeof(s), &source_id, &ca, "channels=2,auth-key=both"),
	        cert_options(d, sizeof(d), &destination_id, &ca, "channels=2,auth-key=both"), &src,
	        &dst);
	expect_success(&src, &dst);
}

/* The other plugin is named by LMT_TEST_TLS_OTHER ("ucx" or "ofi") with
 * its options in LMT_TEST_TLS_OTHER_OPTIONS: only the control connection is
 * encrypted there, and the migration still works. */
static void test_other_plugin_migrates_with_an_encrypted_control_connection(void **state)
{
	const char *other = getenv("LMT_TEST_TLS_OTHER");
	if (!other || !*other)
		skip();
	const char *other_opts = getenv("LMT_TEST_TLS_OTHER_OPTIONS");
	char *saved = getenv("LMT_TEST_PLUGIN") ? strdup(getenv("LMT_TEST_PLUGIN")) : NULL;
	setenv("LMT_TEST_PLUGIN", other, 1);
	setenv("LMT_TEST_OPTIONS", other_opts ? other_opts : "", 1);
	char s[512], d[512];
	struct migration_side src, dst;
	migrate(cert_options(s, sizeof(s), &source_id, &ca, "channels=2"),
	        cert_options(d, sizeof(d), &destination_id, &ca, "channels=2"), &src, &dst);
	if (saved)
		setenv("LMT_TEST_PLUGIN", saved, 1);
	else
		unsetenv("LMT_TEST_PLUGIN");
	unsetenv("LMT_TEST_OPTIONS");
	free(saved);
	expect_success(&src, &dst);
}

static void test_tls_on_the_source_only_fails_on_both_sides(void **state)
{
	struct migration_side src, dst;
	migrate("tls=on,auth-key=k", "auth-key=k,idle-timeout=1s", &src, &dst);
	assert_int_equal(src.rc, -LMT_EMISMATCH);
	expect_contains(src.error, "tls: this source has tls=on and the destination "
	                           "answered without TLS");
	expect_contains(src.error, "this destination has tls=off");
	assert_int_equal(dst.rc, -LMT_EMISMATCH);
	expect_contains(dst.error, "tls: the source speaks TLS (tls=on) and this "
	                           "destination has tls=off");
}

static void test_tls_on_the_destination_only_fails_on_both_sides(void **state)
{
	struct migration_side src, dst;
	migrate("auth-key=k", "tls=on,auth-key=k,idle-timeout=1s", &src, &dst);
	assert_int_equal(src.rc, -LMT_EMISMATCH);
	expect_contains(src.error, "the destination refused: tls: this destination "
	                           "requires TLS (tls=on)");
	assert_int_equal(dst.rc, -LMT_EMISMATCH);
	expect_contains(dst.error, "the source sent a plaintext HELLO (tls=off)");
}

/* The destination finds the source's PSK binder wrong and ends the
 * handshake with an alert: both sides fail there, before any lmt message. */
static void test_a_different_psk_fails_the_handshake_on_both_sides(void **state)
{
	struct migration_side src, dst;
	migrate("tls=on,auth-key=one", "tls=on,auth-key=two,idle-timeout=1s", &src, &dst);
	assert_int_equal(src.rc, -LMT_EAUTH);
	/* OpenSSL 3.0 says illegal_parameter, later versions decrypt_error. */
	expect_contains(src.error, "tls: the destination did not prove the pre-shared key (it "
	                           "refused the handshake with an alert: ");
	expect_contains(src.error, "): refusing to send it anything");
	assert_int_equal(dst.rc, -LMT_EAUTH);
	expect_contains(dst.error, "tls (pre-shared key from the auth key): handshake with the "
	                           "source failed: the source did not prove the pre-shared key "
	                           "(its PSK binder does not verify: it holds another key): "
	                           "refused before reading anything from it");
}

static void test_a_certificate_from_another_ca_fails_on_both_sides(void **state)
{
	char s[512], d[512];
	struct migration_side src, dst;
	migrate(cert_options(s, sizeof(s), &stranger_id, &ca, ""),
	        cert_options(d, sizeof(d), &destination_id, &ca, "idle-timeout=1s"), &src, &dst);
	/* In TLS 1.3 the client's handshake ends before the server checks its
	 * certificate: the source learns of the refusal from the alert that
	 * comes instead of HELLO_REPLY (or, when its HELLO finds the
	 * connection closed, that is still to be read). */
	assert_true(src.rc < 0);
	expect_contains(src.error, "error:0A000418:SSL routines::tlsv1 alert unknown ca");
	assert_int_equal(dst.rc, -LMT_EAUTH);
	expect_contains(dst.error, "the peer's certificate: unable to get local issuer "
	                           "certificate");
}

static void test_the_source_refuses_a_destination_of_another_ca(void **state)
{
	char s[512], d[512];
	struct migration_side src, dst;
	migrate(cert_options(s, sizeof(s), &source_id, &other_ca, ""),
	        cert_options(d, sizeof(d), &destination_id, &ca, "idle-timeout=1s"), &src, &dst);
	assert_int_equal(src.rc, -LMT_EAUTH);
	expect_contains(src.error, "tls (certificates): handshake with the destination failed: "
	                           "TLS handshake: the peer's certificate: ");
	expect_contains(src.error, "certificate verify failed");
	assert_true(dst.rc < 0);
	expect_contains(dst.error, "handshake with the source failed");
}

/* ---- impostors: a certificate where the pre-shared key is expected ---- */

#define NO_KEY_BUT_A_CERTIFICATE                                                                   \
	"the destination did not prove the pre-shared key (it presented a certificate "            \
	"instead): refusing to send it anything"

/* A source with tls=on and an auth key that finds, at the destination's
 * address, a TLS server with a self-signed certificate. */
static void test_a_psk_source_refuses_a_destination_that_presents_a_certificate(void **state)
{
	struct guest_ram ram;
	ram_fill(&ram, 1 << 20, 24);
	struct census c0 = census_take();
	struct impostor im;
	impostor_server_start(&im);
	lmt_session *s = session_with_blocks(LMT_ROLE_SOURCE, &ram, "tls=on,auth-key=k3y");
	assert_int_equal(lmt_session_set_dirty_sync(s, guest_dirty_sync, &ram), 0);
	char uri[32];
	snprintf(uri, sizeof(uri), "127.0.0.1:%u", im.port);
	int rc = lmt_save_setup(s, uri);
	char error[600];
	snprintf(error, sizeof(error), "%s", lmt_session_error(s)->message);
	lmt_session_free(s);
	impostor_join(&im);
	if (im.handshake_done || im.app_bytes)
		fail_msg("the impostor completed its handshake (%d) and read %llu bytes",
		         im.handshake_done, (unsigned long long)im.app_bytes);
	assert_int_equal(rc, -LMT_EAUTH);
	assert_string_equal(error, "tls: " NO_KEY_BUT_A_CERTIFICATE);
	census_check(c0);
	ram_release(&ram);
}

/* After a real control handshake, the destination's address for channel
 * 0 leads to a TLS server with a certificate (a diverted connection): the
 * source must not send it the channel's hello, which carries the token. */
static void test_a_psk_source_sends_no_token_to_a_diverted_channel(void **state)
{
	struct guest_ram ram;
	ram_fill(&ram, 1 << 20, 25);
	struct census c0 = census_take();
	struct impostor im;
	struct diverting_dest d;
	impostor_server_start(&im);
	diverting_dest_start(&d, "k3y", im.port);
	lmt_session *s =
	        session_with_blocks(LMT_ROLE_SOURCE, &ram, "tls=on,auth-key=k3y,channels=1");
	assert_int_equal(lmt_session_set_dirty_sync(s, guest_dirty_sync, &ram), 0);
	char uri[32];
	snprintf(uri, sizeof(uri), "127.0.0.1:%u", d.port);
	int rc = lmt_save_setup(s, uri);
	char error[600];
	snprintf(error, sizeof(error), "%s", lmt_session_error(s)->message);
	lmt_session_free(s);
	diverting_dest_join(&d);
	impostor_join(&im);
	if (!d.diverted)
		fail_msg("the control handshake did not reach the channels: %s", d.error);
	if (im.handshake_done || im.app_bytes)
		fail_msg("the impostor completed its handshake (%d) and read %llu bytes",
		         im.handshake_done, (unsigned long long)im.app_bytes);
	assert_int_equal(rc, -LMT_EAUTH);
	expect_contains(error, "tcp channel 0: tls: " NO_KEY_BUT_A_CERTIFICATE);
	census_check(c0);
	ram_release(&ram);
}

/* A TLS client at a keyed destination's port that does not prove the key:
 * refused in the handshake, it reads nothing, and the destination goes on
 * waiting for its source (here until idle-timeout). */
static void expect_impostor_source_refused(const char *identity, const char *how)
{
	struct guard_dest *d = guard_dest_start(RAM_BYTES, "tls=on,auth-key=k3y,idle-timeout=1s");
	struct impostor im;
	impostor_client_start(&im, d->port, identity);
	impostor_join(&im);
	guard_dest_join(d);
	if (im.handshake_done || im.app_bytes)
		fail_msg("the impostor completed its handshake (%d) and read %llu bytes",
		         im.handshake_done, (unsigned long long)im.app_bytes);
	/* The client hello callback's alert, not the internal_error of a
	 * handshake that went on to want a certificate. */
	expect_contains(im.reason, "alert handshake failure");
	assert_true(d->rc < 0);
	char want[300];
	snprintf(want, sizeof(want),
	         "the source did not prove the pre-shared key (%s): refused before reading "
	         "anything from it",
	         how);
	expect_contains(d->error, want);
	assert_true(guard_ram_untouched(d));
	guard_dest_free(d);
}

static void test_a_psk_destination_refuses_a_source_that_offers_a_certificate(void **state)
{
	expect_impostor_source_refused(NULL, "it offered none: a certificate handshake");
}

static void test_a_psk_destination_refuses_a_source_with_another_psk_identity(void **state)
{
	expect_impostor_source_refused("lmt-impostor", "it offered another PSK identity");
}

/* One side in certificate mode (with the same auth key), the other in
 * pre-shared-key mode: each refuses the other's certificate handshake. */
static void test_psk_mode_facing_certificate_mode_fails_on_both_sides(void **state)
{
	char opts[512];
	struct migration_side src, dst;
	migrate("tls=on,auth-key=k3y",
	        cert_options(opts, sizeof(opts), &destination_id, &ca,
	                     "auth-key=k3y,idle-timeout=1s"),
	        &src, &dst);
	assert_int_equal(src.rc, -LMT_EAUTH);
	assert_string_equal(src.error, "tls: " NO_KEY_BUT_A_CERTIFICATE);
	assert_true(dst.rc < 0);
	expect_contains(dst.error, "tls (certificates): handshake with the source failed");

	migrate(cert_options(opts, sizeof(opts), &source_id, &ca, "auth-key=k3y"),
	        "tls=on,auth-key=k3y,idle-timeout=1s", &src, &dst);
	assert_true(src.rc < 0);
	expect_contains(src.error, "alert handshake failure");
	assert_int_equal(dst.rc, -LMT_EAUTH);
	expect_contains(dst.error, "the source did not prove the pre-shared key (it offered none: "
	                           "a certificate handshake): refused before reading anything");
}

/* Options refused at setup, each naming what is wrong. */
static void expect_setup_error(const char *opts, int code, const char *message)
{
	struct guest_ram ram;
	ram_fill(&ram, 1 << 20, 22);
	struct census c0 = census_take();
	lmt_session *s = session_with_blocks(LMT_ROLE_SOURCE, &ram, opts);
	assert_int_equal(lmt_session_set_dirty_sync(s, guest_dirty_sync, &ram), 0);
	assert_int_equal(lmt_save_setup(s, "127.0.0.1:9"), -code);
	assert_string_equal(lmt_session_error(s)->message, message);
	lmt_session_free(s);
	census_check(c0);
	ram_release(&ram);
}

static void test_tls_without_certificates_or_key_is_refused(void **state)
{
	expect_setup_error("tls=on", LMT_EINVAL,
	                   "tls=on needs tls-cert, tls-key and tls-ca (certificate mode) or "
	                   "auth-key or auth-key-file (pre-shared-key mode); none is set");
}

static void test_incomplete_certificate_options_name_what_is_missing(void **state)
{
	char opts[256];
	snprintf(opts, sizeof(opts), "tls=on,tls-cert=%s", source_id.cert);
	expect_setup_error(opts, LMT_EINVAL,
	                   "tls=on with certificates needs tls-cert, tls-key and tls-ca; not "
	                   "set: tls-key, tls-ca");
}

static void test_certificate_options_without_tls_are_refused(void **state)
{
	char opts[256];
	snprintf(opts, sizeof(opts), "tls-ca=%s", ca.cert);
	expect_setup_error(opts, LMT_EINVAL, "tls-ca is set but tls=off: set tls=on to use it");
}

static void test_a_key_of_another_certificate_is_named(void **state)
{
	char opts[512], want[512];
	snprintf(opts, sizeof(opts), "tls=on,tls-cert=%s,tls-key=%s,tls-ca=%s", source_id.cert,
	         destination_id.key, ca.cert);
	snprintf(want, sizeof(want),
	         "tls-key '%s': error:05800074:x509 certificate "
	         "routines::key values mismatch",
	         destination_id.key);
	struct guest_ram ram;
	ram_fill(&ram, 1 << 20, 23);
	lmt_session *s = session_with_blocks(LMT_ROLE_SOURCE, &ram, opts);
	assert_int_equal(lmt_session_set_dirty_sync(s, guest_dirty_sync, &ram), 0);
	assert_int_equal(lmt_save_setup(s, "127.0.0.1:9"), -LMT_EINVAL);
	expect_contains(lmt_session_error(s)->message, want);
	lmt_session_free(s);
	ram_release(&ram);
}

/* ---- a passive observer on the loopback interface ---- */

struct observer {
	int fd;
	atomic_bool stop;
	uint8_t marker[32];
	uint64_t bytes;
	unsigned sightings;
	pthread_t thread;
};

static void *observe(void *arg)
{
	struct observer *o = arg;
	static uint8_t frame[1 << 17];
	while (!atomic_load(&o->stop)) {
		struct pollfd p = {.fd = o->fd, .events = POLLIN};
		if (poll(&p, 1, 50) <= 0)
			continue;
		ssize_t n = recv(o->fd, frame, sizeof(frame), MSG_DONTWAIT);
		if (n <= 0)
			continue;
		o->bytes += (uint64_t)n;
		if (memmem(frame, (size_t)n, o->marker, sizeof(o->marker)))
			o->sightings++;
	}
	return NULL;
}

/* Every frame on lo while `opts` migrate a guest whose every page carries
 * a random marker: how often the marker was seen. Skips without the right
 * to open a packet socket. */
static unsigned watch_migration(const char *opts, uint64_t *bytes)
{
	struct observer o = {0};
	o.fd = socket(AF_PACKET, SOCK_RAW | SOCK_CLOEXEC, htons(ETH_P_ALL));
	if (o.fd < 0 && (errno == EPERM || errno == EACCES))
		skip();
	assert_true(o.fd >= 0);
	struct sockaddr_ll ll = {.sll_family = AF_PACKET,
	                         .sll_protocol = htons(ETH_P_ALL),
	                         .sll_ifindex = (int)if_nametoindex("lo")};
	assert_int_equal(bind(o.fd, (struct sockaddr *)&ll, sizeof(ll)), 0);
	int size = 64 << 20;
	setsockopt(o.fd, SOL_SOCKET, SO_RCVBUFFORCE, &size, sizeof(size));
	assert_int_equal(getrandom(o.marker, sizeof(o.marker), 0), (ssize_t)sizeof(o.marker));
	marker = o.marker;
	assert_int_equal(pthread_create(&o.thread, NULL, observe, &o), 0);
	struct migration_side src, dst;
	migrate(opts, opts, &src, &dst);
	usleep(200000);
	atomic_store(&o.stop, true);
	pthread_join(o.thread, NULL);
	close(o.fd);
	marker = NULL;
	expect_success(&src, &dst);
	*bytes = o.bytes;
	return o.sightings;
}

static void test_an_observer_sees_the_guest_pages_of_a_plaintext_migration(void **state)
{
	uint64_t bytes;
	unsigned seen = watch_migration("auth-key=k,channels=2", &bytes);
	assert_true(seen > 0);
}

static void test_an_observer_sees_no_guest_page_of_an_encrypted_migration(void **state)
{
	uint64_t bytes;
	unsigned seen = watch_migration("tls=on,auth-key=k,channels=2", &bytes);
	if (seen)
		fail_msg("the marker was seen in %u frames of %llu bytes", seen,
		         (unsigned long long)bytes);
	assert_true(bytes >= RAM_BYTES);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_psk_mode_migrates_over_tcp_on_one_channel),
	        cmocka_unit_test(test_psk_mode_migrates_over_tcp_on_two_channels),
	        cmocka_unit_test(test_cert_mode_migrates_over_tcp_on_one_channel),
	        cmocka_unit_test(test_cert_mode_with_an_auth_key_migrates_over_tcp_on_two_channels),
	        cmocka_unit_test(test_other_plugin_migrates_with_an_encrypted_control_connection),
	        cmocka_unit_test(test_tls_on_the_source_only_fails_on_both_sides),
	        cmocka_unit_test(test_tls_on_the_destination_only_fails_on_both_sides),
	        cmocka_unit_test(test_a_different_psk_fails_the_handshake_on_both_sides),
	        cmocka_unit_test(test_a_certificate_from_another_ca_fails_on_both_sides),
	        cmocka_unit_test(test_the_source_refuses_a_destination_of_another_ca),
	        cmocka_unit_test(
	                test_a_psk_source_refuses_a_destination_that_presents_a_certificate),
	        cmocka_unit_test(test_a_psk_source_sends_no_token_to_a_diverted_channel),
	        cmocka_unit_test(test_a_psk_destination_refuses_a_source_that_offers_a_certificate),
	        cmocka_unit_test(test_a_psk_destination_refuses_a_source_with_another_psk_identity),
	        cmocka_unit_test(test_psk_mode_facing_certificate_mode_fails_on_both_sides),
	        cmocka_unit_test(test_tls_without_certificates_or_key_is_refused),
	        cmocka_unit_test(test_incomplete_certificate_options_name_what_is_missing),
	        cmocka_unit_test(test_certificate_options_without_tls_are_refused),
	        cmocka_unit_test(test_a_key_of_another_certificate_is_named),
	        cmocka_unit_test(test_an_observer_sees_the_guest_pages_of_a_plaintext_migration),
	        cmocka_unit_test(test_an_observer_sees_no_guest_page_of_an_encrypted_migration),
	};
	return cmocka_run_group_tests(tests, make_certificates, remove_certificates);
}
