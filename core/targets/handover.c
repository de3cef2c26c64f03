/* Same-host handover over a unix: target: RAM blocks mapped from a file
 * (memfd, hugetlbfs) are given to the destination as descriptors at the
 * switchover instead of being copied; the rest migrate as usual. The
 * checks on both ends of a descriptor live here (docs/security.md).
 * Room: targets; may use: base, wire, session, control, transport. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/magic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/vfs.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

#include "bitmap.h"
#include "error.h"
#include "net.h"
#include "session.h"
#include "control.h"
#include "handover.h"

/* ---- lmt_session_add_block_fd ---- */

/* One line of /proc/self/maps, the fields the check needs. */
struct map_line {
	uintptr_t start, end;
	char perms[5];
	uint64_t offset;
	unsigned major, minor;
	uint64_t inode;
};

static bool parse_map_line(const char *line, struct map_line *m)
{
	unsigned long long offset, inode;
	unsigned long start, end;
	if (sscanf(line, "%lx-%lx %4s %llx %x:%x %llu", &start, &end, m->perms, &offset, &m->major,
	           &m->minor, &inode) != 7)
		return false;
	m->start = start;
	m->end = end;
	m->offset = offset;
	m->inode = inode;
	return true;
}

/* What is wrong with one mapping that covers part of the block from
 * address `at` on, or NULL when it maps the file shared at the right
 * offset. */
static const char *line_mismatch(const struct map_line *m, const struct stat *st, uintptr_t host,
                                 uint64_t offset, uintptr_t at)
{
	if (m->perms[3] != 's')
		return "is a private mapping (MAP_PRIVATE), not MAP_SHARED";
	if (m->inode != st->st_ino || m->major != major(st->st_dev) ||
	    m->minor != minor(st->st_dev))
		return "is not mapped from this descriptor's file";
	if (m->offset + (at - m->start) != offset + (at - host))
		return "maps the file at another offset";
	return NULL;
}

/* The block's memory must be this file, shared, from `offset`, all of it:
 * /proc/self/maps names the device, inode and file offset of each
 * mapping, which is what the kernel will give the destination. */
static int check_mapping(struct lmt_session *s, const char *name, int fd, const struct stat *st,
                         uintptr_t host, uint64_t length, uint64_t offset)
{
	FILE *f = fopen("/proc/self/maps", "re");
	if (!f)
		return lmt__usage(s, LMT_EIO, "block '%s': cannot read /proc/self/maps: %s", name,
		                  strerror(errno));
	char line[512];
	uintptr_t covered = host, end = host + length;
	const char *why = NULL;
	struct map_line m;
	while (!why && covered < end && fgets(line, sizeof(line), f)) {
		if (!parse_map_line(line, &m) || m.end <= covered)
			continue;
		if (m.start > covered)
			break; /* a hole */
		why = line_mismatch(&m, st, host, offset, covered);
		covered = m.end;
	}
	fclose(f);
	if (!why && covered < end)
		why = "is not mapped in full";
	if (why)
		return lmt__usage(s, LMT_EINVAL,
		                  "block '%s': the memory at %p (%" PRIu64 " bytes) %s (fd %d, "
		                  "offset %" PRIu64 ")",
		                  name, (void *)host, length, why, fd, offset);
	return 0;
}

static int check_fd(struct lmt_session *s, const char *name, int fd, uint64_t length,
                    uint32_t page_size, uint64_t offset, struct stat *st)
{
	if (fd < 0 || fstat(fd, st) != 0)
		return lmt__usage(s, LMT_EINVAL, "block '%s': fd %d is not an open descriptor",
		                  name, fd);
	if (!S_ISREG(st->st_mode))
		return lmt__usage(s, LMT_EINVAL,
		                  "block '%s': fd %d is not a memory file (memfd, hugetlbfs or "
		                  "regular file)",
		                  name, fd);
	/* A hugetlbfs file is mapped in its huge pages only: lmt moves and
	 * places the block's pages whole (postcopy), so they must be those. */
	struct statfs fs;
	if (fstatfs(fd, &fs) == 0 && (uint64_t)fs.f_type == HUGETLBFS_MAGIC &&
	    page_size != (uint64_t)st->st_blksize)
		return lmt__usage(s, LMT_EINVAL,
		                  "block '%s': fd %d is a hugetlbfs file of %ld-byte pages: give "
		                  "that page size, not %u",
		                  name, fd, (long)st->st_blksize, page_size);
	if (page_size && offset % page_size)
		return lmt__usage(s, LMT_EINVAL,
		                  "block '%s': offset %" PRIu64
		                  " is not aligned to the page size %u",
		                  name, offset, page_size);
	if (offset > UINT64_MAX - length || (uint64_t)st->st_size < offset + length)
		return lmt__usage(s, LMT_EINVAL,
		                  "block '%s': the file of fd %d holds %lld bytes, fewer than "
		                  "offset %" PRIu64 " + length %" PRIu64,
		                  name, fd, (long long)st->st_size, offset, length);
	return 0;
}

/* The checks lmt_session_add_block makes come after these: a block it
 * would refuse for its range is still refused for that. */
static int check_fd_block(struct lmt_session *s, const char *name, void *host, uint64_t length,
                          uint32_t page_size, int fd, uint64_t offset)
{
	struct stat st;
	int rc = check_fd(s, name, fd, length, page_size, offset, &st);
	uintptr_t start = (uintptr_t)host;
	if (rc || !host || !length || length - 1 > UINTPTR_MAX - start)
		return rc;
	return check_mapping(s, name, fd, &st, start, length, offset);
}

int lmt_session_add_block_fd(lmt_session *s, const char *name, void *host, uint64_t length,
                             uint32_t page_size, int fd, uint64_t offset)
{
	if (!s)
		return -LMT_EINVAL;
	if (lmt__config_fixed(s)) /* refused there, with the reason */
		return lmt_session_add_block(s, name, host, length, page_size);
	const char *shown = name ? name : "(null)";
	int rc = check_fd_block(s, shown, host, length, page_size, fd, offset);
	if (rc)
		return rc;
	int copy = fcntl(fd, F_DUPFD_CLOEXEC, 3);
	if (copy < 0)
		return lmt__usage(s, LMT_EIO, "block '%s': cannot duplicate fd %d: %s", shown, fd,
		                  strerror(errno));
	rc = lmt_session_add_block(s, name, host, length, page_size);
	if (rc) {
		close(copy);
		return rc;
	}
	struct lmt_block *b = &s->blocks[s->nblocks - 1];
	b->fd = copy;
	b->fd_offset = offset;
	struct statfs fs;
	b->hugetlbfs = fstatfs(copy, &fs) == 0 && (uint64_t)fs.f_type == HUGETLBFS_MAGIC;
	return 0;
}

void lmt__handover_block_free(struct lmt_block *b)
{
	if (b->fd >= 0)
		close(b->fd);
	if (b->received_fd >= 0)
		close(b->received_fd);
	b->fd = b->received_fd = -1;
}

/* ---- the peer ---- */

int lmt__handover_check_peer(struct lmt_session *s)
{
	struct ucred cred;
	socklen_t len = sizeof(cred);
	const char *peer = s->role == LMT_ROLE_SOURCE ? "destination" : "source";
	if (getsockopt(s->ctrl_fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0)
		return lmt__fail(s, LMT_EIO, "unix: cannot read the %s's credentials: %s", peer,
		                 strerror(errno));
	if (cred.uid != geteuid() && cred.uid != 0)
		return lmt__fail(s, LMT_EAUTH,
		                 "unix: the %s (pid %d) runs as uid %u, this process as uid %u: "
		                 "refused",
		                 peer, (int)cred.pid, (unsigned)cred.uid, (unsigned)geteuid());
	return 0;
}

/* ---- which blocks: FD_OFFER and FD_ACCEPT ---- */

/* Descriptors are passed beside the bytes of the stream, which TLS would
 * not cover: with tls=on nothing is offered or taken. */
static bool can_pass_fds(const struct lmt_session *s)
{
	return s->ctrl_unix && !s->tls;
}

/* A block handed over is never hashed for verify=on: the handover's own
 * digest stands for it (see lmt__handover_send). */
static void mark_handover(struct lmt_block *b)
{
	b->handover = true;
	if (b->stale.bits) {
		lmt__bitmap_range(b->stale.bits, 0, b->nstripes, LMT_BITS_CLEAR);
		b->stale.count = 0;
	}
}

static int send_flags(struct lmt_session *s, uint16_t type, const struct lmt_msg_fd_flags *m)
{
	int rc = lmt__enc_fd_flags(&s->out, type, m);
	return rc ? lmt__fail(s, rc, "encoding %s", lmt__msg_name(type)) : lmt__ctrl_send(s);
}

static int recv_flags(struct lmt_session *s, uint16_t type, uint64_t deadline,
                      struct lmt_msg_fd_flags *m)
{
	struct lmt_msg_header h;
	struct lmt_error err = {0};
	int rc = lmt__ctrl_expect(s, type, deadline, &h);
	if (!rc && (rc = lmt__dec_fd_flags(s->in, h.length, type, m, &err)))
		return lmt__fail(s, rc, "%s", err.message);
	if (!rc && m->count != s->nblocks)
		return lmt__fail(s, LMT_EPROTO, "%s: %u blocks, expected %u", lmt__msg_name(type),
		                 m->count, s->nblocks);
	return rc;
}

int lmt__handover_negotiate_source(struct lmt_session *s, uint64_t deadline)
{
	struct lmt_msg_fd_flags offer = {.count = s->nblocks}, taken;
	uint32_t offered = 0;
	for (uint32_t i = 0; i < s->nblocks; i++) {
		offer.flags[i] =
		        can_pass_fds(s) && s->blocks[i].fd >= 0 && offered < LMT_NET_MAX_FDS;
		offered += offer.flags[i];
	}
	int rc = send_flags(s, LMT_MSG_FD_OFFER, &offer);
	if (!rc)
		rc = recv_flags(s, LMT_MSG_FD_ACCEPT, deadline, &taken);
	for (uint32_t i = 0; i < s->nblocks && !rc; i++) {
		if (taken.flags[i] && !offer.flags[i])
			return lmt__fail(
			        s, LMT_EPROTO,
			        "FD_ACCEPT: the destination takes block '%s' by descriptor, "
			        "which was not offered",
			        s->blocks[i].name);
		if (taken.flags[i])
			mark_handover(&s->blocks[i]);
	}
	return rc;
}

int lmt__handover_negotiate_destination(struct lmt_session *s, uint64_t deadline)
{
	struct lmt_msg_fd_flags offer, taken = {.count = s->nblocks};
	int rc = recv_flags(s, LMT_MSG_FD_OFFER, deadline, &offer);
	uint32_t count = 0;
	for (uint32_t i = 0; i < s->nblocks && !rc; i++) {
		taken.flags[i] = offer.flags[i] && can_pass_fds(s) && s->blocks[i].fd >= 0;
		count += taken.flags[i];
		if (taken.flags[i])
			mark_handover(&s->blocks[i]);
	}
	if (!rc && count > LMT_NET_MAX_FDS)
		return lmt__fail(s, LMT_EPROTO, "FD_OFFER: %u blocks offered, at most %u", count,
		                 LMT_NET_MAX_FDS);
	return rc ? rc : send_flags(s, LMT_MSG_FD_ACCEPT, &taken);
}

/* ---- the switchover: FD_HANDOVER ---- */

/* The pages both sides hash: the first, the middle and the last of the
 * block, as they are in the shared file. A source that sends a file other
 * than the guest's memory would have to match all three. */
static uint64_t sample_digest(const uint8_t *base, uint64_t length, uint32_t page_size)
{
	uint64_t npages = length / page_size;
	uint64_t pages[3] = {0, npages / 2, npages - 1};
	XXH3_state_t st;
	XXH3_64bits_reset(&st);
	for (int i = 0; i < 3; i++)
		XXH3_64bits_update(&st, base + pages[i] * page_size, page_size);
	return XXH3_64bits_digest(&st);
}

int lmt__handover_send(struct lmt_session *s)
{
	struct lmt_msg_fd_handover *m = calloc(1, sizeof(*m));
	int *fds = calloc(LMT_NET_MAX_FDS, sizeof(int));
	int rc = m && fds ? 0 : lmt__fail(s, LMT_ENOMEM, "out of memory");
	for (uint32_t i = 0; i < s->nblocks && !rc; i++) {
		struct lmt_block *b = &s->blocks[i];
		if (!b->handover)
			continue;
		fds[m->count] = b->fd;
		m->entries[m->count++] = (struct lmt_msg_fd_entry){
		        .block = i,
		        .offset = b->fd_offset,
		        .digest = sample_digest(b->host, b->length, b->page_size)};
	}
	if (!rc && m->count && (rc = lmt__enc_fd_handover(&s->out, m)))
		rc = lmt__fail(s, rc, "encoding FD_HANDOVER");
	else if (!rc && m->count)
		rc = lmt__ctrl_send_fds(s, fds, m->count);
	free(m);
	free(fds);
	return rc;
}

/* What the destination makes of one descriptor before mapping it in
 * place: checked, mapped aside, compared. */
struct incoming {
	struct lmt_block *b;
	int fd;
	uint64_t offset;
	void *aside; /* the file mapped where it harms nothing, until moved */
};

/* The file must be memory the destination can map for the whole block,
 * and must not shrink under it afterwards (F_SEAL_SHRINK where the file
 * takes seals: a memfd created with MFD_ALLOW_SEALING). */
static int check_received(struct lmt_session *s, const struct incoming *in)
{
	struct lmt_block *b = in->b;
	struct stat st;
	if (fstat(in->fd, &st) != 0)
		return lmt__fail(s, LMT_EPROTO, "FD_HANDOVER: block '%s': unusable descriptor: %s",
		                 b->name, strerror(errno));
	if (!S_ISREG(st.st_mode))
		return lmt__fail(s, LMT_EPROTO,
		                 "FD_HANDOVER: block '%s': the descriptor is not a memory file "
		                 "(file type 0%o): refused",
		                 b->name, (unsigned)(st.st_mode & S_IFMT));
	if (in->offset % b->page_size || in->offset > UINT64_MAX - b->length)
		return lmt__fail(s, LMT_EPROTO,
		                 "FD_HANDOVER: block '%s': offset %" PRIu64 " is not a page of the "
		                 "file",
		                 b->name, in->offset);
	if ((uint64_t)st.st_size < in->offset + b->length)
		return lmt__fail(s, LMT_EPROTO,
		                 "FD_HANDOVER: block '%s': the file holds %lld bytes, fewer than "
		                 "offset %" PRIu64 " + length %" PRIu64 ": refused",
		                 b->name, (long long)st.st_size, in->offset, b->length);
	if (fcntl(in->fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0 && errno != EINVAL && errno != EPERM)
		return lmt__fail(s, LMT_EIO, "FD_HANDOVER: block '%s': sealing the file: %s",
		                 b->name, strerror(errno));
	return 0;
}

static int map_aside(struct lmt_session *s, struct incoming *in, uint64_t digest)
{
	struct lmt_block *b = in->b;
	void *p = mmap(NULL, b->length, PROT_READ | PROT_WRITE, MAP_SHARED, in->fd,
	               (off_t)in->offset);
	if (p == MAP_FAILED)
		return lmt__fail(s, LMT_EPROTO, "FD_HANDOVER: block '%s': cannot map the file: %s",
		                 b->name, strerror(errno));
	in->aside = p;
	uint64_t mine = sample_digest(p, b->length, b->page_size);
	if (mine != digest)
		return lmt__fail(s, LMT_EVERIFY,
		                 "FD_HANDOVER: block '%s': the file is not the guest's memory the "
		                 "source describes (xxh3 of sampled pages %016" PRIx64
		                 " on the source, %016" PRIx64 " here): refused",
		                 b->name, digest, mine);
	return 0;
}

/* Every entry names a block taken by descriptor, each once, in order. */
static int check_entries(struct lmt_session *s, const struct lmt_msg_fd_handover *m)
{
	uint32_t want = 0;
	for (uint32_t i = 0; i < s->nblocks; i++)
		want += s->blocks[i].handover && s->blocks[i].received_fd < 0;
	if (m->count != want)
		return lmt__fail(s, LMT_EPROTO, "FD_HANDOVER: %u blocks, expected %u", m->count,
		                 want);
	if (s->in_nfds != m->count)
		return lmt__fail(s, LMT_EPROTO,
		                 "FD_HANDOVER: %u descriptors passed for %u blocks: refused",
		                 s->in_nfds, m->count);
	for (uint32_t i = 0; i < m->count; i++) {
		uint32_t k = m->entries[i].block;
		if (k >= s->nblocks || !s->blocks[k].handover)
			return lmt__fail(s, LMT_EPROTO,
			                 "FD_HANDOVER: block %u is not one taken by descriptor", k);
	}
	return 0;
}

/* Into place, over the block's own mapping: the VMM's pointer now shows
 * the source's file. mremap moves the checked mapping whole. It is the
 * system call itself: a library loaded in the process may interpose on
 * mremap, and UCX 1.13's memory hooks pass on no new address, which
 * turned MREMAP_FIXED into EINVAL or a move elsewhere. Neither mapping
 * was registered with a transport (blocks handed over never are). */
static int move_into_place(struct lmt_session *s, struct incoming *in)
{
	struct lmt_block *b = in->b;
	void *p = (void *)syscall(SYS_mremap, in->aside, b->length, b->length,
	                          MREMAP_MAYMOVE | MREMAP_FIXED, b->host);
	if (p != MAP_FAILED && p != b->host)
		in->aside = p; /* unmapped with the rest */
	if (p == MAP_FAILED || p != b->host)
		return lmt__fail(s, LMT_EIO, "FD_HANDOVER: block '%s': cannot map it at %p: %s",
		                 b->name, (void *)b->host, strerror(errno));
	in->aside = NULL;
	b->received_fd = in->fd;
	b->received_offset = in->offset;
	in->fd = -1;
	return 0;
}

static int take_all(struct lmt_session *s, const struct lmt_msg_fd_handover *m, struct incoming *in)
{
	int rc = 0;
	for (uint32_t i = 0; i < m->count && !rc; i++) {
		rc = check_received(s, &in[i]);
		if (!rc)
			rc = map_aside(s, &in[i], m->entries[i].digest);
	}
	for (uint32_t i = 0; i < m->count && !rc; i++)
		rc = move_into_place(s, &in[i]);
	return rc;
}

int lmt__handover_receive(struct lmt_session *s, size_t length)
{
	struct lmt_error err = {0};
	struct lmt_msg_fd_handover *m = malloc(sizeof(*m));
	struct incoming *in = calloc(LMT_NET_MAX_FDS, sizeof(*in));
	int rc = m && in ? 0 : lmt__fail(s, LMT_ENOMEM, "out of memory");
	if (!rc && (rc = lmt__dec_fd_handover(s->in, length, m, &err)))
		lmt__fail(s, rc, "%s", err.message);
	if (!rc)
		rc = check_entries(s, m);
	for (uint32_t i = 0; !rc && i < m->count; i++) {
		in[i] = (struct incoming){.b = &s->blocks[m->entries[i].block],
		                          .fd = s->in_fds[i],
		                          .offset = m->entries[i].offset};
		s->in_fds[i] = -1;
	}
	if (!rc)
		rc = take_all(s, m, in);
	for (uint32_t i = 0; in && i < LMT_NET_MAX_FDS && in[i].b; i++) {
		if (in[i].aside)
			munmap(in[i].aside, in[i].b->length);
		if (in[i].fd >= 0)
			close(in[i].fd);
	}
	lmt__ctrl_drop_fds(s);
	free(m);
	free(in);
	return rc;
}

/* A failed load gives each block its own mapping back, as it was before
 * the handover: the block's own file, untouched since. */
void lmt__handover_undo(struct lmt_session *s)
{
	for (uint32_t i = 0; i < s->nblocks; i++) {
		struct lmt_block *b = &s->blocks[i];
		if (b->received_fd < 0)
			continue;
		void *p = mmap(b->host, b->length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
		               b->fd, (off_t)b->fd_offset);
		if (p == MAP_FAILED)
			lmt__session_log(s, LMT_LOG_ERROR,
			                 "block '%s': cannot map its own memory back at %p: %s",
			                 b->name, (void *)b->host, strerror(errno));
		close(b->received_fd);
		b->received_fd = -1;
	}
}

int lmt_load_block_fd(lmt_session *s, uint32_t block, int *fd, uint64_t *offset)
{
	if (!s)
		return -LMT_EINVAL;
	if (!fd)
		return lmt__usage(s, LMT_EINVAL, "block fd: fd is NULL");
	if (s->role != LMT_ROLE_DESTINATION || atomic_load(&s->state) != LMT_STATE_DONE)
		return lmt__usage(s, LMT_ESTATE, "block fd: only after a completed load");
	if (block >= s->nblocks)
		return lmt__usage(s, LMT_EINVAL, "block fd: no block %u (the session has %u)",
		                  block, s->nblocks);
	struct lmt_block *b = &s->blocks[block];
	if (b->received_fd < 0)
		return lmt__usage(s, LMT_ENOTFOUND,
		                  "block fd: block '%s' was copied, not handed over", b->name);
	int copy = fcntl(b->received_fd, F_DUPFD_CLOEXEC, 3);
	if (copy < 0)
		return lmt__usage(s, LMT_EIO, "block fd: block '%s': cannot duplicate: %s", b->name,
		                  strerror(errno));
	*fd = copy;
	if (offset)
		*offset = b->received_offset;
	return 0;
}
