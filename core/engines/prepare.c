/* The part of setup both engines share (engines room): the option values
 * both roles read once, the checks between them, TLS and verify=on made
 * ready, and each block's registration windows. */
#include <stdlib.h>

#include "engines.h"
#include "error.h"
#include "postcopy.h"
#include "session.h"
#include "tls_session.h"
#include "verify.h"

static int read_options(struct lmt_session *s)
{
	const struct lmt_optset *o = s->opts;
	pthread_mutex_lock(&s->opts_lock);
	s->channels = (uint32_t)lmt__opt_int(o, "channels");
	s->chunk_size = (uint64_t)lmt__opt_int(o, "chunk-size");
	s->pin_all = lmt__opt_bool(o, "pin-all");
	s->verify = lmt__opt_bool(o, "verify");
	s->postcopy_on = lmt__opt_bool(o, "postcopy");
	s->userfaultfd = lmt__opt_bool(o, "userfaultfd");
	s->postcopy_channel = s->postcopy_on && s->channels < LMT_MAX_CHANNELS &&
	                      (s->caps & LMT_CAP_MULTI_CHANNEL);
	if (s->postcopy_channel)
		s->channels++;
	s->connect_timeout_ns = (uint64_t)lmt__opt_int(o, "connect-timeout");
	s->idle_timeout_ns = (uint64_t)lmt__opt_int(o, "idle-timeout");
	struct lmt_error err = {0};
	lmt__auth_key_free(&s->auth);
	int rc = lmt__auth_key_load(lmt__opt_text(o, "auth-key"), lmt__opt_text(o, "auth-key-file"),
	                            &s->auth, &err);
	pthread_mutex_unlock(&s->opts_lock);
	return rc ? lmt__fail(s, rc, "%s", err.message) : 0;
}

/* One registration per window: chunk-size, or the whole block with pin-all. */
static int size_windows(struct lmt_session *s)
{
	uint64_t ram = 0;
	for (uint32_t i = 0; i < s->nblocks; i++) {
		struct lmt_block *b = &s->blocks[i];
		ram += b->length;
		b->window = s->pin_all ? b->length : s->chunk_size;
		if (b->window < b->page_size)
			b->window = b->page_size;
		b->nwindows = (b->length + b->window - 1) / b->window;
		b->mrs = calloc(b->nwindows, sizeof(*b->mrs));
		if (!b->mrs)
			return lmt__fail(s, LMT_ENOMEM, "out of memory for block '%s'", b->name);
	}
	pthread_mutex_lock(&s->lock);
	s->stats.ram_bytes = ram;
	s->stats.channels = s->channels;
	pthread_mutex_unlock(&s->lock);
	return 0;
}

int lmt__session_prepare(struct lmt_session *s)
{
	int rc = read_options(s);
	if (rc)
		return rc;
	if (s->postcopy_on && s->verify)
		return lmt__fail(s, LMT_EINVAL,
		                 "postcopy=on with verify=on: pages placed after the switch are "
		                 "not covered by the digests yet; choose one");
	for (uint32_t i = 0; s->postcopy_on && i < s->nblocks; i++)
		if (s->blocks[i].page_size > LMT_POSTCOPY_MAX_PAGE)
			return lmt__fail(s, LMT_ENOTSUP,
			                 "postcopy=on: block '%s' has pages of %u bytes; postcopy "
			                 "moves pages of up to %u bytes",
			                 s->blocks[i].name, s->blocks[i].page_size,
			                 LMT_POSTCOPY_MAX_PAGE);
	if (s->postcopy_on && s->file_path)
		return lmt__fail(s, LMT_EINVAL,
		                 "postcopy=on: a file: target has no destination to switch to");
	if (s->channels > 1 && !(s->caps & LMT_CAP_MULTI_CHANNEL))
		return lmt__fail(s, LMT_ENOTSUP, "channels=%u: plugin '%s' supports one channel",
		                 s->channels, s->wire_name);
	if (s->nblocks == 0)
		return lmt__fail(s, LMT_EINVAL, "no RAM blocks: add them before setup");
	if ((rc = lmt__tls_session_prepare(s)))
		return rc;
	rc = size_windows(s);
	return rc ? rc : lmt__verify_prepare(s);
}
