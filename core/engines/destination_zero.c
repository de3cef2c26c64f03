/* The destination's zero runs (engines room): ZERO, the runs of pages the
 * source found all zero in a pass after the bulk one. Every run is checked
 * before any page is touched: a block that exists and is copied, pages
 * inside it, all in one window this destination registered, that is
 * memory it already let the source write. Then each page that is not zero
 * yet is cleared with memset, which is right for any memory a block can be
 * (private or shared, anonymous or a file, huge pages, registered for a
 * plugin), and ZERO_ACK answers. Room: engines; may use: every room below
 * it. */
#include <stdlib.h>
#include <string.h>

#include "control.h"
#include "destination_engine.h"
#include "error.h"
#include "session.h"

/* Run `r` is pages this destination let the source write; or the
 * failure, naming the run and what is wrong with it. */
static int check_run(struct lmt_session *s, const struct lmt_msg_page *r)
{
	if (r->block >= s->nblocks)
		return lmt__fail(s, LMT_EPROTO, "ZERO: block %u does not exist (%u blocks)", r->block,
		                 s->nblocks);
	const struct lmt_block *b = &s->blocks[r->block];
	if (!lmt__block_copied(b))
		return lmt__fail(s, LMT_EPROTO,
		                 "ZERO: block '%s' is handed over by descriptor, not written",
		                 b->name);
	if (r->page >= b->npages || r->npages > b->npages - r->page)
		return lmt__fail(s, LMT_EPROTO,
		                 "ZERO: pages %llu+%u are outside block '%s' (%llu pages)",
		                 (unsigned long long)r->page, r->npages, b->name,
		                 (unsigned long long)b->npages);
	uint64_t w = (r->page << b->page_shift) / b->window;
	uint64_t last = ((r->page + r->npages - 1) << b->page_shift) / b->window;
	if (w != last)
		return lmt__fail(s, LMT_EPROTO,
		                 "ZERO: pages %llu+%u of block '%s' cross a window boundary",
		                 (unsigned long long)r->page, r->npages, b->name);
	if (!b->mrs[w])
		return lmt__fail(s, LMT_EPROTO,
		                 "ZERO: pages %llu+%u of block '%s' are in a window that is not "
		                 "registered",
		                 (unsigned long long)r->page, r->npages, b->name);
	return 0;
}

/* The page at p, of `size` bytes, made zero unless it is already: a page
 * never written stays untouched (and unallocated). */
static void zero_page(uint8_t *p, uint32_t size)
{
	const uint64_t *w = (const uint64_t *)p;
	for (uint32_t i = 0; i < size / 8; i++)
		if (w[i]) {
			memset(p, 0, size);
			return;
		}
}

int lmt__destination_handle_zero(struct lmt_session *s, size_t length)
{
	struct lmt_destination_engine *d = s->destination;
	struct lmt_error err = {0};
	if (!d->zero && !(d->zero = malloc(sizeof(*d->zero))))
		return lmt__fail(s, LMT_ENOMEM, "out of memory");
	struct lmt_msg_zero *m = d->zero;
	int rc = lmt__dec_zero(s->in, length, m, &err);
	if (rc)
		return lmt__fail(s, rc, "%s", err.message);
	uint64_t pages = 0;
	for (uint32_t i = 0; i < m->count; i++) {
		if ((rc = check_run(s, &m->runs[i])))
			return rc;
		pages += m->runs[i].npages;
	}
	lmt__session_log(s, LMT_LOG_DEBUG, "ZERO %llu: %u runs, %llu pages",
	                 (unsigned long long)d->zero_applied + 1, m->count,
	                 (unsigned long long)pages);
	for (uint32_t i = 0; i < m->count; i++) {
		const struct lmt_msg_page *r = &m->runs[i];
		const struct lmt_block *b = &s->blocks[r->block];
		for (uint64_t p = r->page; p < r->page + r->npages; p++)
			zero_page(b->host + (p << b->page_shift), b->page_size);
	}
	pthread_mutex_lock(&s->lock);
	s->stats.zero_pages += pages;
	s->stats.zero_run_bytes += LMT_PROTO_HEADER_SIZE + length;
	pthread_mutex_unlock(&s->lock);
	if ((rc = lmt__enc_zero_ack(&s->out, ++d->zero_applied)))
		return lmt__fail(s, rc, "encoding ZERO_ACK");
	return lmt__ctrl_send(s);
}
