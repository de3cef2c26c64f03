/* Auto-converge: when passes do not converge, the source asks the VMM to
 * slow the guest's vCPUs, more with each pass that still does not. The
 * rule is in docs/engine.md ("Auto-converge").
 * Room: engines; may use: every room below it. */
#ifndef LMT_CONVERGE_H
#define LMT_CONVERGE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <lmt/lmt.h>

struct lmt_optset;

struct lmt_converge {
	lmt_throttle_fn fn;
	void *opaque;
	bool on;
	uint32_t initial;
	uint32_t increment;
	uint32_t max;
	uint32_t slow_passes;     /* passes in a row that did not converge */
	_Atomic uint32_t percent; /* asked of the VMM; 0: none */
};

/* auto-converge and its throttle-* options, as setup reads them. */
void lmt__converge_configure(struct lmt_converge *c, const struct lmt_optset *o);
/* What is wrong with the options and callback for a migration, or NULL:
 * writes the reason into `why`. */
const char *lmt__converge_check(const struct lmt_converge *c, const struct lmt_optset *o,
                                char *why, size_t size);
/* A pass that is not the last ended, having sent `sent` bytes while
 * `dirtied` bytes became dirty and left the source short of ready: the
 * throttle, raised when the rule says so. */
uint32_t lmt__converge_pass(struct lmt_converge *c, uint64_t sent, uint64_t dirtied);
/* The migration is over: the VMM is told to run its vCPUs freely, once. */
void lmt__converge_release(struct lmt_converge *c);

#endif
