/* The destination engine: listen, admit the source (lobby.c), run the
 * load loop that hands each message to what serves it
 * (destination_serve.c), end the load, and lmt_load_*: a file: target's
 * restore (restore.c), postcopy's switch (core/paging/), the device state.
 * Room: engines; may use: every room below it. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "admit.h"
#include "bitmap.h"
#include "error.h"
#include "file.h"
#include "lobby.h"
#include "net.h"
#include "postcopy.h"
#include "uffd.h"
#include "session.h"
#include "control.h"
#include "engines.h"
#include "handover.h"
#include "lazy.h"
#include "restore.h"
#include "transport.h"
#include "destination_engine.h"
#include "verify.h"
#include "tls_session.h"

#define TARGET_SLICE_NS 1000000ull
#define CONTROL_SLICE_MS 50


int lmt__destination_new(struct lmt_destination_engine **out)
{
	*out = calloc(1, sizeof(**out));
	if (!*out)
		return -LMT_ENOMEM;
	(*out)->listen_fd = -1;
	return 0;
}

static void close_listener(struct lmt_destination_engine *d)
{
	if (d->listen_fd >= 0)
		close(d->listen_fd);
	d->listen_fd = -1;
	if (d->unix_path)
		unlink(d->unix_path);
	free(d->unix_path);
	d->unix_path = NULL;
}

void lmt__destination_free(struct lmt_destination_engine *d)
{
	if (!d)
		return;
	close_listener(d);
	if (d->state_buf)
		explicit_bzero(d->state_buf, d->state_cap); /* the guest's device state */
	free(d->state_buf);
	free(d->landed);
	free(d->zero);
	free(d);
}

int lmt_load_listen(lmt_session *s, const char *uri, uint16_t *port)
{
	if (!s)
		return -LMT_EINVAL;
	struct lmt_destination_engine *d = s->destination;
	if (s->role != LMT_ROLE_DESTINATION)
		return lmt__usage(s, LMT_ESTATE, "load listen: this session is a source");
	if (!uri)
		return lmt__usage(s, LMT_EINVAL, "load listen: uri is NULL, expected host:port");
	if (s->nblocks == 0)
		return lmt__usage(s, LMT_EINVAL,
		                  "load listen: no RAM blocks: add them before listening");
	int rc = lmt__file_check_uri(s, uri, "load listen");
	if (rc)
		return rc;
	int expected = LMT_STATE_NEW;
	if (!atomic_compare_exchange_strong(&s->state, &expected, LMT_STATE_LISTENING))
		return lmt__usage(s, LMT_ESTATE, "load listen: called twice");
	if (lmt__is_file_uri(uri)) {
		/* Nothing to bind: lmt_load_run reads the file. */
		if ((rc = lmt__file_set_path(s, uri)))
			atomic_store(&s->state, LMT_STATE_NEW);
		else if (port)
			*port = 0;
		return rc;
	}
	struct sockaddr_storage addr;
	socklen_t len;
	struct lmt__net_error e;
	rc = lmt__net_parse(uri, &addr, &len, &e);
	if (!rc)
		rc = lmt__net_listen((struct sockaddr *)&addr, len, LMT_ADMIT_BACKLOG,
		                     &d->listen_fd, &e);
	if (rc) {
		/* Nothing started: the caller may listen again, elsewhere. */
		atomic_store(&s->state, LMT_STATE_NEW);
		return lmt__usage(s, rc, "load listen: %s", e.msg);
	}
	if (port)
		*port = lmt__net_local_port(d->listen_fd);
	s->ctrl_unix = addr.ss_family == AF_UNIX;
	if (s->ctrl_unix && !(d->unix_path = strdup(uri + 5))) {
		close(d->listen_fd);
		d->listen_fd = -1;
		atomic_store(&s->state, LMT_STATE_NEW);
		return lmt__usage(s, LMT_ENOMEM, "load listen: out of memory");
	}
	return 0;
}

static int handle(struct lmt_session *s, const struct lmt_msg_header *h)
{
	switch (h->type) {
	case LMT_MSG_REG_REQ:
		return lmt__destination_handle_reg_req(s, h->length);
	case LMT_MSG_DEVICE_STATE:
		return lmt__destination_handle_state(s, h->length);
	case LMT_MSG_COMPLETE:
		return lmt__destination_handle_complete(s, h->length);
	case LMT_MSG_LANDED:
		return lmt__destination_handle_landed(s, h->length);
	case LMT_MSG_DIGESTS:
		return lmt__verify_receive(s, h->length);
	case LMT_MSG_ZERO:
		return lmt__destination_handle_zero(s, h->length);
	case LMT_MSG_FD_HANDOVER:
		return lmt__handover_receive(s, h->length);
	case LMT_MSG_POSTCOPY_PAGES:
		return lmt__postcopy_pages(s, h->length);
	case LMT_MSG_POSTCOPY:
		if (s->destination->state_received != s->destination->state_len)
			return lmt__fail(s, LMT_EPROTO,
			                 "POSTCOPY with %llu of %llu bytes of device state",
			                 (unsigned long long)s->destination->state_received,
			                 (unsigned long long)s->destination->state_len);
		return lmt__postcopy_switch(s, h->length, s->destination->state_received);
	default:
		return lmt__fail(s, LMT_EPROTO,
		                 "unexpected %s from the source during the migration",
		                 lmt__msg_name(h->type));
	}
}

/* Drive the plugin and the control connection until COMPLETE. A source
 * whose keep-alives are all that arrives for idle-timeout fails the load:
 * it stalled, or only holds the destination. */
static int load(struct lmt_session *s)
{
	struct lmt_destination_engine *d = s->destination;
	bool target = s->caps & LMT_CAP_TARGET_PROGRESS;
	struct lmt_completion comps[16];
	d->progress_ns = lmt__now();
	for (;;) {
		if (lmt__is_cancelled(s))
			return lmt__fail(s, LMT_ECANCELED, "migration cancelled");
		/* Messages waiting are progress not taken yet. */
		if (lmt__now() - d->progress_ns > s->idle_timeout_ns && !lmt__ctrl_queued(s))
			return lmt__destination_no_progress(s);
		int n = s->desc->ops.progress(s->inst, comps, 16, target ? TARGET_SLICE_NS : 0);
		if (n < 0)
			return lmt__fail(s, n, "plugin %s: progress failed (%s)", s->desc->name,
			                 lmt_err_name(n));
		/* Without target progress to drive, the wait is for the source. */
		uint64_t wait = target ? 0 : CONTROL_SLICE_MS * 1000000ull;
		if (lmt__ctrl_wait(s, lmt__now() + wait)) {
			struct lmt_msg_header h;
			int rc = lmt__ctrl_recv(s, &h, lmt__now() + s->idle_timeout_ns);
			if (rc == 0) {
				d->progress_ns = lmt__now();
				rc = handle(s, &h);
			}
			if (rc)
				return rc;
		}
	}
}

/* Find the source among whoever connects (lobby.c), then
 * start the control connection on it. `fd` is an already connected
 * source (lmt__load_connected), or -1 to accept on the listening socket. */
static int accept_source(struct lmt_session *s, int fd)
{
	struct lmt_destination_engine *d = s->destination;
	uint64_t accepted_ns = lmt__now();
	d->state_max = (uint64_t)lmt__opt_int(s->opts, "max-device-state");
	lmt__tls *tls = NULL;
	int rc = lmt__lobby_find_source(s, d->listen_fd, fd >= 0 ? 0 : s->idle_timeout_ns, &fd,
	                                &tls, &accepted_ns);
	close_listener(d);
	if (rc)
		return rc;
	s->ctrl_fd = fd;
	lmt__net_tune(s->ctrl_fd, 1, 0);
	if (s->ctrl_unix && (rc = lmt__handover_check_peer(s)))
		return rc;
	pthread_mutex_lock(&s->lock);
	s->start_ns = accepted_ns;
	pthread_mutex_unlock(&s->lock);
	if (tls && (rc = lmt__tls_session_adopt(s, tls)))
		return rc;
	return lmt__ctrl_start(s);
}

/* Everything after the source was accepted: its HELLO passed (and its
 * proof of the key); setup keeps to connect-timeout from its accept. */
static int serve(struct lmt_session *s)
{
	int rc;
	uint64_t deadline = s->start_ns + s->connect_timeout_ns;
	if ((rc = lmt__destination_check_blocks(s, deadline)))
		return rc;
	if (s->ctrl_unix && (rc = lmt__handover_negotiate_destination(s, deadline)))
		return rc;
	if ((rc = lmt__destination_open_channels(s, deadline)))
		return rc;
	if (s->pin_all && (rc = lmt__destination_register_all(s)))
		return rc;
	if ((rc = lmt__ctrl_send_empty(s, LMT_MSG_READY)))
		return rc;
	atomic_store(&s->state, LMT_STATE_ACTIVE);
	pthread_mutex_lock(&s->lock);
	s->stats.status = LMT_STATUS_ACTIVE;
	s->stats.setup_ns = lmt__now() - s->start_ns;
	pthread_mutex_unlock(&s->lock);
	lmt__event_simple(s, LMT_EVENT_SETUP_DONE, 0);
	rc = load(s);
	return rc == 1 ? 0 : rc;
}

static int begin_load(struct lmt_session *s, int from_state)
{
	if (s->role != LMT_ROLE_DESTINATION)
		return lmt__usage(s, LMT_ESTATE, "load run: this session is a source");
	if (!atomic_compare_exchange_strong(&s->state, &from_state, LMT_STATE_SETUP))
		return lmt__usage(s, LMT_ESTATE, "load run: call lmt_load_listen first, once");
	pthread_mutex_lock(&s->lock);
	s->stats.status = LMT_STATUS_SETUP;
	pthread_mutex_unlock(&s->lock);
	return 0;
}

static int end_load(struct lmt_session *s, int rc)
{
	if (rc) {
		lmt__postcopy_free(s); /* its thread first: it drives the plugin */
		lmt__handover_undo(s);
		return lmt__abort(s, rc);
	}
	pthread_mutex_lock(&s->lock);
	if (!s->stats.resume_ns)
		s->stats.resume_ns = lmt__now() - s->start_ns;
	bool lazy = s->lazy || s->postcopy;
	pthread_mutex_unlock(&s->lock);
	/* restore=lazy or postcopy: the guest may run; the pages come in
	 * until lmt_load_finish. */
	if (lazy)
		return 0;
	lmt__file_free(s);
	lmt__transport_close(s);
	lmt__ctrl_close(s);
	pthread_mutex_lock(&s->lock);
	lmt__stats_end(s, LMT_STATUS_COMPLETED);
	pthread_mutex_unlock(&s->lock);
	atomic_store(&s->state, LMT_STATE_DONE);
	lmt__event_simple(s, LMT_EVENT_COMPLETED, 0);
	return 0;
}

/* restore=lazy is for a file: restore; a migration's load is whole when
 * it returns (postcopy is not there yet). */
/* The device state restored from a file, `buf` (malloc'd) now the
 * session's. */
static void take_state(struct lmt_session *s, uint8_t *buf, uint64_t length)
{
	struct lmt_destination_engine *d = s->destination;
	if (d->state_buf)
		explicit_bzero(d->state_buf, d->state_cap);
	free(d->state_buf);
	d->state_buf = buf;
	d->state_cap = length;
	d->state_len = length;
	d->state_received = length;
}

/* A file: target: the blocks and the device state, from the file. */
static int restore_file(struct lmt_session *s)
{
	uint8_t *state = NULL;
	uint64_t length = 0;
	int rc = lmt__file_restore(s, &state, &length);
	if (!rc)
		take_state(s, state, length);
	return rc;
}

static int check_restore_mode(struct lmt_session *s)
{
	pthread_mutex_lock(&s->opts_lock);
	bool lazy = strcmp(lmt__opt_text(s->opts, "restore"), "lazy") == 0;
	bool postcopy = lmt__opt_bool(s->opts, "postcopy");
	bool allowed = lmt__opt_bool(s->opts, "userfaultfd");
	pthread_mutex_unlock(&s->opts_lock);
	/* Postcopy needs userfaultfd here: say so before any source comes. */
	struct lmt__uffd *u = NULL;
	struct lmt_error err = {0};
	if (postcopy && !s->file_path && lmt__uffd_open(&u, 0, allowed, &err))
		return lmt__usage(s, err.code, "load run: postcopy=on: %s", err.message);
	lmt__uffd_close(u);
	if (lazy && !s->file_path)
		return lmt__usage(s, LMT_EINVAL,
		                  "load run: restore=lazy applies to a file: restore only; this "
		                  "session listens for a source");
	return 0;
}

static int load_run(lmt_session *s)
{
	int rc = check_restore_mode(s);
	if (!rc)
		rc = begin_load(s, LMT_STATE_LISTENING);
	if (rc)
		return rc;
	rc = lmt__session_prepare(s);
	if (!rc && s->file_path)
		return end_load(s, restore_file(s));
	if (!rc)
		rc = accept_source(s, -1);
	if (!rc)
		rc = serve(s);
	return end_load(s, rc);
}

int lmt_load_run(lmt_session *s)
{
	if (!s)
		return -LMT_EINVAL;
	if (lmt__job_owns(s))
		return lmt__usage(s, LMT_ESTATE,
		                  "load run: a job started with lmt_load_start runs this session");
	lmt__call_enter(s);
	int rc = load_run(s);
	lmt__call_leave(s);
	return rc;
}

int lmt_load_finish(lmt_session *s)
{
	if (!s)
		return -LMT_EINVAL;
	if (s->role != LMT_ROLE_DESTINATION)
		return lmt__usage(s, LMT_ESTATE, "load finish: this session is a source");
	int state = atomic_load(&s->state);
	if (state == LMT_STATE_DONE)
		return 0;
	if (state == LMT_STATE_FAILED)
		return lmt__usage(s, LMT_ESTATE, "load finish: the load failed: %s",
		                  lmt_session_error(s)->message);
	pthread_mutex_lock(&s->lock);
	bool lazy = (s->lazy || s->postcopy) && !s->finishing;
	s->finishing = lazy;
	pthread_mutex_unlock(&s->lock);
	if (!lazy)
		return lmt__usage(s, LMT_ESTATE,
		                  "load finish: no load to finish (lmt_load_run must return 0 "
		                  "first, and only one call waits)");
	lmt__call_enter(s);
	int rc = end_load(s, s->lazy ? lmt__lazy_finish(s) : lmt__postcopy_finish(s));
	lmt__call_leave(s);
	return rc;
}

int lmt__load_connected(struct lmt_session *s, int fd)
{
	int rc = begin_load(s, LMT_STATE_NEW);
	if (rc)
		return rc;
	rc = lmt__session_prepare(s);
	if (!rc)
		rc = accept_source(s, fd);
	else
		close(fd);
	if (!rc)
		rc = serve(s);
	return end_load(s, rc);
}


int lmt_load_device_state(lmt_session *s, const void **data, size_t *length)
{
	if (!s)
		return -LMT_EINVAL;
	if (!data || !length)
		return lmt__usage(s, LMT_EINVAL, "device state: data and length are required");
	struct lmt_destination_engine *d = s->destination;
	pthread_mutex_lock(&s->lock);
	bool resumed = s->lazy != NULL || s->postcopy != NULL;
	pthread_mutex_unlock(&s->lock);
	if (s->role != LMT_ROLE_DESTINATION ||
	    (atomic_load(&s->state) != LMT_STATE_DONE && !resumed))
		return lmt__usage(s, LMT_ESTATE,
		                  "device state: only after a completed load (or, with "
		                  "restore=lazy, once lmt_load_run returned 0)");
	*data = d->state_buf;
	*length = d->state_len;
	return 0;
}

