/* The file restore engine (engines room, restore.c): a file: target's
 * blocks and device state read back, at once or lazily (lazy.h). May
 * use: every room below engines. */
#ifndef LMT_CORE_RESTORE_H
#define LMT_CORE_RESTORE_H

#include <stdint.h>

#include "session.h"

/* Destination: restore the blocks from the file; the device state read
 * (malloc'd, now the caller's) in *state and *length. */
int lmt__file_restore(struct lmt_session *s, uint8_t **state, uint64_t *length);

#endif
