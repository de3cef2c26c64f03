/* The device, port and GID of a verbs instance, for the plugin's top
 * file. */
#ifndef LMT_VERBS_PORT_H
#define LMT_VERBS_PORT_H

#include "instance.h"

/* Open `device` (empty = the first with an active port) at `port` (0 = its
 * first active one) with GID `gid_index` (-1 = chosen from the control
 * connection's address), and fill the device fields of inst. Closes what
 * it opened on failure. 0 or an error recorded. */
int verbs_port_open(struct lmt_instance *inst, const char *device, int port, int gid_index);

#endif
