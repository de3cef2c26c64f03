/* The UCX settings the plugin makes in its own UCP configuration (not the
 * environment), for the plugin's top file; see config.c. */
#ifndef LMT_UCX_CONFIG_H
#define LMT_UCX_CONFIG_H

#include "instance.h"

/* Apply them to `config` for the transport list `tls` (UCX_TLS syntax,
 * with ',' between transports; empty is UCX's own choice). 0, or the
 * error recorded. */
int ucx_config_tune(struct lmt_instance *inst, ucp_config_t *config, const char *tls);

#endif
