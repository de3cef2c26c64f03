/* Certificates made at run time (see certs.h). */
#define _GNU_SOURCE
#include "certs.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

static int save(const char *path, EVP_PKEY *key, X509 *cert)
{
	FILE *f = fopen(path, "w");
	if (!f)
		return -1;
	int ok = key ? PEM_write_PrivateKey(f, key, NULL, NULL, 0, NULL, NULL)
	             : PEM_write_X509(f, cert);
	return fclose(f) == 0 && ok == 1 ? 0 : -1;
}

static int extend(X509 *cert, X509 *issuer, int nid, const char *value)
{
	X509V3_CTX ctx;
	X509V3_set_ctx_nodb(&ctx);
	X509V3_set_ctx(&ctx, issuer, cert, NULL, NULL, 0);
	X509_EXTENSION *ext = X509V3_EXT_conf_nid(NULL, &ctx, nid, value);
	int ok = ext && X509_add_ext(cert, ext, -1) == 1;
	X509_EXTENSION_free(ext);
	return ok ? 0 : -1;
}

/* `name`.crt and `name`.key in the set's directory, signed by the issuer
 * (self-signed when NULL); the certificate and key come back when asked. */
static int issue(struct cert_set *set, const char *name, X509 *issuer, EVP_PKEY *issuer_key,
                 struct cert_files *out, X509 **cert_out, EVP_PKEY **key_out)
{
	EVP_PKEY *key = EVP_EC_gen("P-256");
	X509 *cert = X509_new();
	uint64_t serial = 0;
	int rc = key && cert && getrandom(&serial, sizeof(serial), 0) == sizeof(serial) ? 0 : -1;
	if (!rc) {
		X509_set_version(cert, 2);
		ASN1_INTEGER_set_uint64(X509_get_serialNumber(cert), serial >> 1);
		X509_gmtime_adj(X509_getm_notBefore(cert), -3600);
		X509_gmtime_adj(X509_getm_notAfter(cert), 24 * 3600);
		X509_NAME_add_entry_by_txt(X509_get_subject_name(cert), "CN", MBSTRING_ASC,
		                           (const unsigned char *)name, -1, -1, 0);
		X509_set_pubkey(cert, key);
		X509 *signer = issuer ? issuer : cert;
		X509_set_issuer_name(cert, X509_get_subject_name(signer));
		rc = extend(cert, signer, NID_basic_constraints,
		            issuer ? "critical,CA:FALSE" : "critical,CA:TRUE");
		if (!rc)
			rc = extend(cert, signer, NID_key_usage,
			            issuer ? "critical,digitalSignature"
			                   : "critical,keyCertSign,cRLSign");
		if (!rc && X509_sign(cert, issuer ? issuer_key : key, EVP_sha256()) <= 0)
			rc = -1;
	}
	snprintf(out->cert, sizeof(out->cert), "%s/%s.crt", set->dir, name);
	snprintf(out->key, sizeof(out->key), "%s/%s.key", set->dir, name);
	if (!rc)
		rc = save(out->cert, NULL, cert) || save(out->key, key, NULL) ? -1 : 0;
	if (!rc && cert_out) {
		*cert_out = cert;
		*key_out = key;
		return 0;
	}
	X509_free(cert);
	EVP_PKEY_free(key);
	return rc;
}

int certs_make(struct cert_set *set)
{
	memset(set, 0, sizeof(*set));
	snprintf(set->dir, sizeof(set->dir), "/tmp/lmt-test-certs-XXXXXX");
	if (!mkdtemp(set->dir)) {
		perror("certs: mkdtemp");
		return -1;
	}
	X509 *ca = NULL;
	EVP_PKEY *ca_key = NULL;
	int rc = issue(set, "ca", NULL, NULL, &set->ca, &ca, &ca_key);
	if (!rc)
		rc = issue(set, "source", ca, ca_key, &set->source, NULL, NULL);
	if (!rc)
		rc = issue(set, "destination", ca, ca_key, &set->destination, NULL, NULL);
	X509_free(ca);
	EVP_PKEY_free(ca_key);
	if (rc)
		fprintf(stderr, "certs: cannot make the certificates in %s\n", set->dir);
	return rc;
}

void certs_remove(struct cert_set *set)
{
	const struct cert_files *all[] = {&set->ca, &set->source, &set->destination};
	for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
		unlink(all[i]->cert);
		unlink(all[i]->key);
	}
	rmdir(set->dir);
}

const char *certs_options(char *buf, size_t size, const struct cert_set *set,
                          const struct cert_files *id)
{
	snprintf(buf, size, "tls=on,tls-cert=%s,tls-key=%s,tls-ca=%s", id->cert, id->key,
	         set->ca.cert);
	return buf;
}
