/* What both ends of a UCX channel do with their UCP worker (see channel.c),
 * for the files above: source.c, destination.c, region.c and ucx.c. */
#ifndef LMT_UCX_CHANNEL_H
#define LMT_UCX_CHANNEL_H

#include <stdbool.h>
#include <stdint.h>

#include "instance.h"

#define UCX_CLOSE_NS 500000000ull /* longest orderly goodbye per channel */

/* The LMT_E* code (positive) of a UCS status. */
int ucx_status_code(ucs_status_t status);
/* When an orderly close stops waiting: sooner once cancelled. */
uint64_t ucx_close_deadline(const struct lmt_instance *inst);

/* ep_open: the channel's worker (and for a destination a second one, which
 * its endpoint uses), the active-message handlers with `ep` as their
 * argument (`on_write` only on the destination), and the worker's address
 * as the channel's blob. 0, or the error recorded; the caller closes. */
int ucx_channel_open(lmt_endpoint *ep, ucp_am_recv_callback_t on_write,
                     ucp_am_recv_callback_t on_note, struct lmt_blob *addr);
/* ep_close, once nothing drives them: destroy the workers. */
void ucx_worker_close(lmt_endpoint *ep);
/* ep_connect: check the peer's address blob, create the endpoint to its
 * worker (`failed` hears of a peer UCX saw fail) and start the channel's
 * thread. 0, or the error recorded. */
int ucx_channel_connect(lmt_endpoint *ep, const struct lmt_blob *peer_addr,
                        ucp_err_handler_cb_t failed, void *(*thread)(void *));
/* ep_close: stop the channel's thread and join it; false when none ran. */
bool ucx_channel_stop(lmt_endpoint *ep);

/* Wake the channel thread if it sleeps. Safe from any thread. */
void ucx_wake(lmt_endpoint *ep);
/* Wait for the workers' descriptors, at most `timeout_ms`. */
void ucx_wait_events(lmt_endpoint *ep, int timeout_ms);
/* After a round of the channel thread: poll on, or sleep once idle long
 * enough (longer when `pending`: the peer owes an answer), unless the
 * endpoint is stopping or `ready` says there is work already. */
void ucx_pace(lmt_endpoint *ep, bool busy, bool pending, bool (*ready)(lmt_endpoint *));
/* Drive the worker; true when something happened. */
bool ucx_drive(lmt_endpoint *ep);

/* A message without this channel's token came in (`what`: "a write", "a
 * notice"): count it, and warn on the first and then on every power of two,
 * so that a flood cannot fill the log. It changes nothing else. */
void ucx_foreign(lmt_endpoint *ep, const char *what, size_t header_len, size_t len);

/* Send a notice (with `count` acknowledgement entries); a UCS status. */
ucs_status_t ucx_send_notice(lmt_endpoint *ep, uint16_t kind, int code, const uint8_t *entries,
                             uint32_t count);
ucs_status_t ucx_send_note(lmt_endpoint *ep, uint16_t kind, int code);
/* The peer said BYE: answer once. */
void ucx_peer_bye(lmt_endpoint *ep);
/* Close `ep->ep` (after a goodbye when `drive`, unless the transport
 * failed): flushing when the peer answered and nothing is outstanding, by
 * force otherwise; when `drive`, drive the worker until UCX is done with
 * the endpoint and has let go of every request of the channel, for a
 * bounded time. */
void ucx_ep_close_now(lmt_endpoint *ep, bool drive);
/* Force-close the endpoint UCX made for the peer's connection (a reply
 * endpoint), purging what it still tracks. */
void ucx_ep_close_peer(lmt_endpoint *ep, ucp_ep_h uep);

#endif
