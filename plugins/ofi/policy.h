/* Which libfabric providers the plugin takes, judged by what a peer that
 * reaches an endpoint can make them keep, for provider.c. */
#ifndef LMT_LFI_POLICY_H
#define LMT_LFI_POLICY_H

#include <stdbool.h>
#include <stdint.h>

#include <rdma/fabric.h>

/* Why a provider is refused, for the error that names it. */
struct lfi_refusal {
	char provider[64]; /* the first provider refused */
	const char *why;   /* static text */
};

/* Drop from *list every entry whose provider the plugin refuses, noting
 * the first refused in *refused (when one was). Returns how many entries
 * remain. `version` is the API version the plugin asks libfabric for. */
unsigned lfi_policy_filter(struct fi_info **list, uint32_t version, struct lfi_refusal *refused);

/* Whether the plugin posts receives that drop messages on endpoints of
 * provider `name` (sink.c): providers over TCP sockets, which stall a
 * connection whose message has no receive, so that a stranger's idle
 * connection could otherwise never be shut. */
bool lfi_policy_sinks(const char *name);

/* The provider name to ask for instead of `asked`, when libfabric offers
 * the transport `asked` names only through a refused layering (tcp in
 * libfabric 1.17: its native RDM provider is net); NULL when none. */
const char *lfi_policy_alternative(const char *asked);

#endif
