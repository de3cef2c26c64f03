/* Certificates for the security suite's TLS cases, made with OpenSSL at
 * run time in a temporary directory: a CA, and a source and a destination
 * certificate it signed (P-256, valid for a day). */
#ifndef LMT_TESTS_CERTS_H
#define LMT_TESTS_CERTS_H

#include <stddef.h>

struct cert_files {
	char cert[96], key[96];
};

struct cert_set {
	char dir[48];
	struct cert_files ca, source, destination;
};

/* 0, or -1 after printing why. */
int certs_make(struct cert_set *set);
void certs_remove(struct cert_set *set);
/* "tls=on,tls-cert=...,tls-key=...,tls-ca=..." for `id`, in buf. */
const char *certs_options(char *buf, size_t size, const struct cert_set *set,
                          const struct cert_files *id);

#endif
