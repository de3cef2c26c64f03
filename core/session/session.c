/* The session's shared state (session room): cancel, the calls that run
 * an engine, the RAM blocks a VMM adds. Creating and freeing a session is
 * the API room's (core/api/session.c); how it fails is failure.c's; the
 * setup both engines share is core/engines/prepare.c's. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "error.h"
#include "session.h"

void lmt_cancel(lmt_session *s)
{
	if (s)
		atomic_store(&s->cancelled, 1);
}

bool lmt__job_owns(struct lmt_session *s)
{
	return s->up->job_owns(s);
}

void lmt__call_enter(struct lmt_session *s)
{
	atomic_fetch_add(&s->in_call, 1);
}

void lmt__call_leave(struct lmt_session *s)
{
	atomic_fetch_sub(&s->in_call, 1);
}

/* ---- RAM blocks ---- */

static bool valid_block_name(const char *name)
{
	size_t n = name ? strlen(name) : 0;
	if (n == 0 || n > LMT_BLOCK_NAME_MAX)
		return false;
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)name[i] <= 0x20 || name[i] == 0x7f)
			return false;
	return true;
}

/* A block's memory must be real, whole pages, aligned, and must not run
 * past the end of the address space. */
static int check_range(struct lmt_session *s, const char *name, void *host, uint64_t length,
                       uint32_t page_size)
{
	uintptr_t start = (uintptr_t)host;
	if (!host)
		return lmt__usage(s, LMT_EINVAL, "block '%s': no memory given (host is NULL)",
		                  name);
	if (length == 0)
		return lmt__usage(s, LMT_EINVAL, "block '%s': length is 0", name);
	if (length % page_size)
		return lmt__usage(s, LMT_EINVAL,
		                  "block '%s': length %llu is not a multiple of the page size %u",
		                  name, (unsigned long long)length, page_size);
	if (start % page_size)
		return lmt__usage(s, LMT_EINVAL,
		                  "block '%s': host address %p is not aligned to the page size %u",
		                  name, host, page_size);
	if (length - 1 > UINTPTR_MAX - start)
		return lmt__usage(s, LMT_EINVAL,
		                  "block '%s': %p + %llu bytes wraps around the end of the address "
		                  "space",
		                  name, host, (unsigned long long)length);
	return 0;
}

static int check_block(struct lmt_session *s, const char *name, void *host, uint64_t length,
                       uint32_t page_size)
{
	if (!valid_block_name(name))
		return lmt__usage(
		        s, LMT_EINVAL,
		        "block name '%s': expected 1 to %u printable characters, no spaces",
		        name ? name : "(null)", LMT_BLOCK_NAME_MAX);
	if (page_size < 4096 || (page_size & (page_size - 1)))
		return lmt__usage(s, LMT_EINVAL,
		                  "block '%s': page size %u is not a power of two >= 4096", name,
		                  page_size);
	int rc = check_range(s, name, host, length, page_size);
	if (rc)
		return rc;
	if (s->nblocks == LMT_PROTO_MAX_BLOCKS)
		return lmt__usage(s, LMT_EOVERFLOW, "block '%s': at most %u blocks", name,
		                  LMT_PROTO_MAX_BLOCKS);
	for (uint32_t i = 0; i < s->nblocks; i++)
		if (strcmp(s->blocks[i].name, name) == 0)
			return lmt__usage(s, LMT_EINVAL, "block '%s': added twice", name);
	return 0;
}

int lmt_session_add_block(lmt_session *s, const char *name, void *host, uint64_t length,
                          uint32_t page_size)
{
	if (!s)
		return -LMT_EINVAL;
	const char *fixed = lmt__config_fixed(s);
	if (fixed)
		return lmt__usage(s, LMT_ESTATE, "block '%s': blocks are fixed %s",
		                  name ? name : "(null)", fixed);
	int rc = check_block(s, name, host, length, page_size);
	if (rc)
		return rc;
	struct lmt_block *nb = realloc(s->blocks, (s->nblocks + 1) * sizeof(*nb));
	if (!nb)
		return lmt__usage(s, LMT_ENOMEM, "out of memory adding block '%s'", name);
	s->blocks = nb;
	struct lmt_block *b = &nb[s->nblocks++];
	memset(b, 0, sizeof(*b));
	snprintf(b->name, sizeof(b->name), "%s", name);
	b->host = host;
	b->length = length;
	b->page_size = page_size;
	b->page_shift = (uint32_t)__builtin_ctz(page_size);
	b->npages = length >> b->page_shift;
	b->words = (b->npages + 63) / 64;
	b->fd = b->received_fd = -1;
	return 0;
}

/* ---- the shared part of setup ---- */
