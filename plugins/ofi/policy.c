/* Which libfabric providers the plugin takes. An RDM endpoint accepts
 * connections and messages from any peer that reaches it, and lmt posts no
 * receive: what a provider does with a message nobody asked for decides
 * how much memory a stranger can make this process hold. Taken: providers
 * that cannot receive messages at all, and those measured to keep a
 * bounded amount (net and libfabric's later native tcp stop reading a
 * connection whose message has no receive; shm's queues have fixed sizes).
 * Refused: the ofi_rxm and ofi_rxd layerings, which queue every unmatched
 * message in buffers allocated without limit, and any other provider that
 * takes messages, until measured (docs/ofi.md, "What a peer can make it
 * hold"). */
#define _GNU_SOURCE
#include "policy.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

#include <rdma/fi_domain.h>
#include <rdma/fi_errno.h>

/* Measured bounded here: a connection's unmatched message stalls that
 * connection (net, and the native tcp of libfabric 1.18 on, which is
 * net); fixed queues in the sender's and the receiver's regions (shm). */
static const char *const bounded[] = {"net", "tcp", "shm"};

static const char *const why_layering =
        "it keeps every message a peer sends that no receive matches, in buffers it "
        "allocates without limit (a 16 KiB buffer for a message of a few bytes), and "
        "drains a closing connection's backlog in one call, so a stranger who reaches "
        "the endpoint grows this process for as long as it sends";
static const char *const why_unverified =
        "it takes messages from any peer that reaches the endpoint, and lmt has not "
        "measured that what it keeps of them is bounded (only net, tcp and shm are)";

static bool is_bounded(const char *name)
{
	for (size_t i = 0; i < sizeof(bounded) / sizeof(bounded[0]); i++)
		if (strcmp(name, bounded[i]) == 0)
			return true;
	return false;
}

static bool is_layering(const char *name)
{
	return strstr(name, "ofi_rxm") || strstr(name, "ofi_rxd");
}

/* Whether provider `name` offers RDM endpoints that receive messages
 * (FI_MSG or FI_TAGGED), whatever modes it asks for. */
static bool takes_messages(const char *name, uint32_t version)
{
	static const uint64_t caps[] = {FI_MSG, FI_TAGGED};
	for (size_t i = 0; i < sizeof(caps) / sizeof(caps[0]); i++) {
		struct fi_info *hints = fi_allocinfo(), *list = NULL;
		if (!hints)
			return true; /* cannot tell: treat as taking them */
		hints->ep_attr->type = FI_EP_RDM;
		hints->caps = caps[i];
		hints->mode = ~0ull;
		hints->domain_attr->mr_mode = ~0;
		hints->fabric_attr->prov_name = strdup(name);
		int rc = hints->fabric_attr->prov_name
		                 ? fi_getinfo(version, NULL, NULL, 0, hints, &list)
		                 : -FI_ENOMEM;
		fi_freeinfo(hints);
		fi_freeinfo(list);
		if (rc != -FI_ENODATA)
			return true;
	}
	return false;
}

/* Why provider `name` is refused, or NULL when it is taken. */
static const char *refusal(const char *name, uint32_t version)
{
	if (is_layering(name))
		return why_layering;
	if (is_bounded(name) || !takes_messages(name, version))
		return NULL;
	return why_unverified;
}

unsigned lfi_policy_filter(struct fi_info **list, uint32_t version, struct lfi_refusal *refused)
{
	/* One verdict per provider name: a list repeats names per domain. */
	struct {
		char name[64];
		const char *why;
	} seen[16];
	unsigned nseen = 0, kept = 0;
	refused->provider[0] = 0;
	refused->why = NULL;
	struct fi_info **link = list;
	while (*link) {
		struct fi_info *i = *link;
		const char *name = i->fabric_attr->prov_name ? i->fabric_attr->prov_name : "";
		const char *why = NULL;
		unsigned k = 0;
		while (k < nseen && strcmp(seen[k].name, name) != 0)
			k++;
		if (k < nseen) {
			why = seen[k].why;
		} else {
			why = refusal(name, version);
			if (nseen < sizeof(seen) / sizeof(seen[0])) {
				snprintf(seen[nseen].name, sizeof(seen[nseen].name), "%s", name);
				seen[nseen++].why = why;
			}
		}
		if (!why) {
			kept++;
			link = &i->next;
			continue;
		}
		if (!refused->why) {
			snprintf(refused->provider, sizeof(refused->provider), "%s", name);
			refused->why = why;
		}
		*link = i->next;
		i->next = NULL;
		fi_freeinfo(i);
	}
	return kept;
}

bool lfi_policy_sinks(const char *name)
{
	return strcmp(name, "net") == 0 || strcmp(name, "tcp") == 0;
}

const char *lfi_policy_alternative(const char *asked)
{
	return strcasecmp(asked, "tcp") == 0 ? "net" : NULL;
}
