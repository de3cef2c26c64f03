/* The engines room (core/engines/): what the rooms above it (the API's
 * lifecycle, core/api/) call of the engines: each role's engine made and
 * freed, the source's checks, the end of a failed migration
 * (lmt__abort). May use: every room below it. */
#ifndef LMT_CORE_ENGINES_H
#define LMT_CORE_ENGINES_H

#include "session.h"

/* Mark the session failed with the recorded error, tell the peer, release
 * the transport; returns the error code (abort.c). */
int lmt__abort(struct lmt_session *s, int code);

/* What lmt_save_setup refuses before it starts (a destination, no uri,
 * no blocks, no dirty-sync callback), so that lmt_save_start refuses the
 * same at once rather than on its thread. */
int lmt__save_check(struct lmt_session *s, const char *uri, const char *what);

int lmt__source_new(struct lmt_source_engine **out);
void lmt__source_free(struct lmt_source_engine *engine);
/* auto-converge: the VMM's vCPUs run freely again (once; see converge.h). */
void lmt__source_release_throttle(struct lmt_session *s);
int lmt__destination_new(struct lmt_destination_engine **out);
void lmt__destination_free(struct lmt_destination_engine *engine);

/* Destination: take a migration in over an already connected control
 * socket (the session owns fd from now on). For the fuzzer. */
int lmt__load_connected(struct lmt_session *s, int fd);
/* Source: lmt_save_setup over an already connected control socket (the
 * session owns fd from now on, even when it refuses). For the fuzzer. */
int lmt__save_connected(struct lmt_session *s, int fd);

/* Read the shared option values and size the blocks' windows once setup
 * starts (prepare.c), for either role. */
int lmt__session_prepare(struct lmt_session *s);

#endif
