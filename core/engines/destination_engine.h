/* The destination engine's state (engines room), private to its files:
 * destination.c (the engine object, listening, admitting the source, the
 * load loop, lmt_load_*) over destination_serve.c (what the source asks
 * once admitted: blocks, channels, registrations, LANDED, device state,
 * COMPLETE) and destination_zero.c (zero runs). Room: engines; may use:
 * every room below it. */
#ifndef LMT_CORE_DESTINATION_ENGINE_H
#define LMT_CORE_DESTINATION_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "session.h"

struct lmt_destination_engine {
	int listen_fd; /* until the source connects */
	char *unix_path; /* a unix: listener's socket file, removed with it */
	/* The device state grows with the pieces that arrived, up to the
	 * total the first piece announced (at most max-device-state). */
	uint8_t *state_buf;
	uint64_t state_cap;
	uint64_t state_len;
	uint64_t state_received;
	uint64_t state_max;
	/* The last sign of the source's progress: a message other than a
	 * keep-alive. idle-timeout without one fails the load. */
	uint64_t progress_ns;
	struct lmt_msg_landed *landed; /* LANDED's, decoded */
	struct lmt_msg_zero *zero;     /* ZERO's, decoded */
	uint64_t zero_applied;         /* ZERO messages applied, for ZERO_ACK */
};


/* ---- destination_serve.c ---- */

int lmt__destination_handle_reg_req(struct lmt_session *s, size_t length);
int lmt__destination_handle_landed(struct lmt_session *s, size_t length);
int lmt__destination_register_all(struct lmt_session *s);
/* A source that made no progress for idle-timeout: it said nothing at all
 * (stopped, frozen, cut off), or nothing but keep-alives (its VMM stopped
 * calling); the message says which. */
int lmt__destination_no_progress(struct lmt_session *s);
int lmt__destination_open_channels(struct lmt_session *s, uint64_t deadline);
int lmt__destination_check_blocks(struct lmt_session *s, uint64_t deadline);
/* Returns 1 when the migration completed. */
int lmt__destination_handle_complete(struct lmt_session *s, size_t length);
int lmt__destination_handle_state(struct lmt_session *s, size_t length);

/* ---- destination_zero.c ---- */

/* ZERO: check every run, then make its pages zero and answer ZERO_ACK. */
int lmt__destination_handle_zero(struct lmt_session *s, size_t length);

#endif
