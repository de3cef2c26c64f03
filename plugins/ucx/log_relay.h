/* UCX's own log lines, relayed to the host's logger (see log_relay.c), for
 * the plugin's top file. */
#ifndef LMT_UCX_LOG_RELAY_H
#define LMT_UCX_LOG_RELAY_H

#include "instance.h"

/* UCX's messages go to the host logger of a live instance, from before
 * the instance opens its UCP context to after it closes it. */
void ucx_log_attach(struct lmt_instance *inst);
void ucx_log_detach(struct lmt_instance *inst);

#endif
