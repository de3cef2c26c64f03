/* Over shm, a source and a destination in one process: the endpoints of
 * this process and the gate a source posts through (shmlocal.c). */
#ifndef LMT_LFI_SHMLOCAL_H
#define LMT_LFI_SHMLOCAL_H

#include "instance.h"

/* Note an endpoint of this process, once named, and forget it at close;
 * a destination's close first shuts its sources in this process out. */
void lfi_shmlocal_add(lmt_endpoint *ep);
void lfi_shmlocal_remove(lmt_endpoint *ep);
/* Around a source's post: false (and nothing held) once its destination,
 * in this process, closed. */
bool lfi_shmlocal_enter(lmt_endpoint *ep);
void lfi_shmlocal_leave(lmt_endpoint *ep);

#endif
