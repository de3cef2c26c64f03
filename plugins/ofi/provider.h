/* The provider of a libfabric plugin instance, and libfabric helpers, for
 * the files above provider.c. */
#ifndef LMT_LFI_PROVIDER_H
#define LMT_LFI_PROVIDER_H

#include <stdbool.h>
#include <stdint.h>

#include "instance.h"

/* The FI_MR_* modes this plugin knows how to honour. */
#define LFI_MR_MODES                                                                               \
	(FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT |       \
	 FI_MR_RAW)

/* The values of ofi.completion and ofi.coalesce, by index. */
enum lfi_completion_option {
	LFI_COMPLETION_AUTO = 0,
	LFI_COMPLETION_DELIVERY = 1,
	LFI_COMPLETION_FENCE = 2,
};

enum lfi_coalesce_option {
	LFI_COALESCE_AUTO = 0,
	LFI_COALESCE_ON = 1,
	LFI_COALESCE_OFF = 2,
};

/* What the options ask of the provider. */
struct lfi_choice {
	const char *provider;
	const char *domain;
	int completion; /* enum lfi_completion_option */
	int coalesce;   /* enum lfi_coalesce_option */
	uint64_t offer; /* FI_MR_* modes offered */
	bool force_local;
	uint64_t caps; /* asked for beyond FI_RMA */
};

/* Choose the provider, open its fabric, domain and address vector, and
 * set what the instance learns from it (modes, visibility, queue depth,
 * limits). 0, or the error recorded. */
int lfi_provider_open(struct lmt_instance *inst, const struct lfi_choice *c);
/* Close whatever lfi_provider_open opened. */
void lfi_provider_close(struct lmt_instance *inst);

/* An lmt code for a libfabric error number (positive FI_E* or errno). */
int lfi_code(int fi_err);
/* Close a fid, logging a failure; returns nothing since teardown goes on. */
void lfi_close_fid(struct lmt_instance *inst, struct fid *fid, const char *what);

#endif
