/* The file plugin's channels: each endpoint owns a descriptor of the file
 * and a thread that carries out its queued transfers with pwrite and
 * pread at their fixed offsets; completions go to one ring for progress.
 * A write is complete once its bytes are on the disk: written back from
 * the page cache (sync_file_range), or written with O_DIRECT; flush makes
 * the file durable with fdatasync, which then has only the metadata and
 * the disk's cache left to do. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include "instance.h"
#include "sync.h"

/* The syncer makes the file durable every FILE_SYNC_EVERY bytes written,
 * and once writes have paused for FILE_SYNC_QUIET_NS. */
#define FILE_SYNC_EVERY (128ull << 20)
#define FILE_SYNC_QUIET_NS 500000000ull

/* The name of the file system holding `path`, for messages. */
static const char *fs_name(const char *path, char *buf, size_t size)
{
	static const struct {
		unsigned long magic;
		const char *name;
	} known[] = {
	        {0x01021994, "tmpfs"}, {0xEF53, "ext2/3/4"},      {0x58465342, "xfs"},
	        {0x9123683E, "btrfs"}, {0x794c7630, "overlayfs"}, {0x6969, "nfs"},
	        {0x65735546, "fuse"},  {0x858458f6, "ramfs"},     {0x2fc12fc1, "zfs"},
	        {0x01021997, "9p"},    {0xFF534D42, "cifs"},      {0x4d44, "vfat"},
	        {0x9fa0, "proc"},      {0x62656572, "sysfs"},
	};
	struct statfs st;
	char dir[LMT_STORAGE_PATH_MAX + 1];
	snprintf(dir, sizeof(dir), "%s", path);
	if (statfs(path, &st) != 0 && statfs(dirname(dir), &st) != 0)
		return "an unknown file system";
	for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++)
		if ((unsigned long)st.f_type == known[i].magic)
			return known[i].name;
	snprintf(buf, size, "file system type 0x%lx", (unsigned long)st.f_type);
	return buf;
}

static int open_file(struct lmt_instance *inst, const struct file_address *a)
{
	const struct putil_instance *base = &inst->base;
	int flags = O_CLOEXEC | (inst->direct ? O_DIRECT : 0);
	if (a->mode == LMT_STORAGE_CREATE)
		flags |= O_WRONLY | O_CREAT | O_TRUNC;
	else
		flags |= a->mode == LMT_STORAGE_WRITE ? O_WRONLY : O_RDONLY;
	int fd = open(a->path, flags, 0600);
	if (fd < 0 && errno == EINVAL && inst->direct) {
		char buf[64];
		return putil_error(
		        base, LMT_ENOTSUP,
		        "direct-io=on: %s refuses O_DIRECT for '%s' (%s); use direct-io=off "
		        "or a directory on a disk file system",
		        fs_name(a->path, buf, sizeof(buf)), a->path, strerror(EINVAL));
	}
	if (fd < 0)
		return putil_error(base, errno == ENOENT ? LMT_ENOTFOUND : LMT_EIO,
		                   "file: cannot open '%s' to %s: %s", a->path,
		                   a->mode == LMT_STORAGE_READ ? "read" : "write", strerror(errno));
	return fd;
}

static void *channel_thread(void *arg);

int file_channel_open(struct lmt_instance *inst, const struct file_address *a,
                      struct lmt_endpoint *ep)
{
	const struct putil_instance *base = &inst->base;
	int fd = open_file(inst, a);
	if (fd < 0)
		return fd;
	if (a->mode == LMT_STORAGE_CREATE && ftruncate(fd, (off_t)a->size) != 0) {
		int e = errno;
		close(fd);
		return putil_error(base, LMT_EIO, "file: cannot size '%s' to %llu bytes: %s",
		                   a->path, (unsigned long long)a->size, strerror(e));
	}
	struct stat st;
	if (a->mode == LMT_STORAGE_READ && (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))) {
		close(fd);
		return putil_error(base, LMT_EINVAL, "file: '%s' is not a regular file", a->path);
	}
	pthread_mutex_lock(&inst->lock);
	/* Channel 0 opens first; the others name the same file. */
	if (ep->channel == 0) {
		inst->size = a->mode == LMT_STORAGE_READ ? (uint64_t)st.st_size : 0;
		snprintf(inst->path, sizeof(inst->path), "%s", a->path);
	}
	ep->fd = fd;
	ep->mode = a->mode;
	pthread_mutex_unlock(&inst->lock);
	if (a->mode == LMT_STORAGE_CREATE && file_syncer_start(inst, fd))
		return putil_error(base, LMT_ENOMEM, "file: cannot start the syncer thread");
	if (lmt__thread_start(&ep->thread, channel_thread, ep))
		return putil_error(base, LMT_ENOMEM, "file channel %u: cannot start its thread",
		                   ep->channel);
	ep->thread_started = true;
	return 0;
}

void file_channel_close(struct lmt_endpoint *ep)
{
	struct lmt_instance *inst = ep->inst;
	pthread_mutex_lock(&inst->lock);
	ep->stop = true;
	pthread_cond_broadcast(&ep->cond);
	pthread_mutex_unlock(&inst->lock);
	if (ep->thread_started)
		pthread_join(ep->thread, NULL);
	ep->thread_started = false;
	if (ep->fd >= 0)
		close(ep->fd);
	ep->fd = -1;
}

/* The whole transfer, or the error recorded. */
static int transfer(struct lmt_endpoint *ep, const struct file_op *op)
{
	const struct putil_instance *base = &ep->inst->base;
	size_t done = 0;
	/* Through the page cache, ask for the whole range at once: channels
	 * that take turns through the file look random to readahead. */
	if (op->read && !ep->inst->direct)
		posix_fadvise(ep->fd, (off_t)op->offset, (off_t)op->len, POSIX_FADV_WILLNEED);
	while (done < op->len) {
		ssize_t n = op->read ? pread(ep->fd, (uint8_t *)op->buf + done, op->len - done,
		                             (off_t)(op->offset + done))
		                     : pwrite(ep->fd, (const uint8_t *)op->buf + done,
		                              op->len - done, (off_t)(op->offset + done));
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return putil_error(base, LMT_EIO,
			                   "file channel %u: %s of %zu bytes at offset "
			                   "%llu of '%s': %s",
			                   ep->channel, op->read ? "pread" : "pwrite",
			                   op->len - done, (unsigned long long)(op->offset + done),
			                   ep->inst->path, strerror(errno));
		if (n == 0)
			return putil_error(
			        base, LMT_EIO,
			        "file channel %u: '%s' ends at offset %llu, inside a read of "
			        "%zu bytes (was it cut short meanwhile?)",
			        ep->channel, ep->inst->path,
			        (unsigned long long)(op->offset + done), op->len);
		done += (size_t)n;
	}
	/* Through the page cache, write the range back before the write
	 * completes, as O_DIRECT would: the rate the engine measures is then
	 * the disk's, which the pause's final pass runs at, not the page
	 * cache's, which would leave the writing back to the flush with the
	 * guest paused and out of the expected downtime. Waiting first for a
	 * write-back under way covers a page written again while an older
	 * copy of it was going out, which a plain SYNC_FILE_RANGE_WRITE
	 * skips. */
	if (!op->read && !ep->inst->direct &&
	    sync_file_range(ep->fd, (off_t)op->offset, (off_t)op->len,
	                    SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
	                            SYNC_FILE_RANGE_WAIT_AFTER) != 0 &&
	    (errno == EIO || errno == ENOSPC))
		return putil_error(base, LMT_EIO,
		                   "file channel %u: writing back %zu bytes at offset %llu of "
		                   "'%s': %s",
		                   ep->channel, op->len, (unsigned long long)op->offset,
		                   ep->inst->path, strerror(errno));
	return 0;
}

static void *channel_thread(void *arg)
{
	struct lmt_endpoint *ep = arg;
	struct lmt_instance *inst = ep->inst;
	pthread_mutex_lock(&inst->lock);
	for (;;) {
		while (!ep->stop && !ep->queue_used)
			pthread_cond_wait(&ep->cond, &inst->lock);
		if (ep->stop)
			break; /* what is still queued is abandoned, as ep_close says */
		struct file_op op = ep->queue[ep->queue_first];
		pthread_mutex_unlock(&inst->lock);
		int status = transfer(ep, &op);
		pthread_mutex_lock(&inst->lock);
		if (!op.read && !status) {
			inst->unsynced += op.len;
			inst->last_write_ns = lmt__now_ns();
			if (inst->unsynced >= FILE_SYNC_EVERY)
				pthread_cond_signal(&inst->sync_cond);
		}
		ep->queue_first = (ep->queue_first + 1) % inst->depth;
		ep->queue_used--;
		ep->done++;
		inst->ring[(inst->ring_first + inst->ring_used++) % inst->ring_cap] =
		        (struct lmt_completion){
		                .cookie = op.cookie, .status = status, .channel = ep->channel};
		pthread_cond_broadcast(&inst->cond);
	}
	pthread_mutex_unlock(&inst->lock);
	return NULL;
}

int file_channel_post(struct lmt_endpoint *ep, bool read, void *buf, size_t len,
                      const struct lmt_rkey *rkey, uint64_t offset, uint64_t cookie)
{
	struct lmt_instance *inst = ep->inst;
	const struct putil_instance *base = &inst->base;
	const char *what = read ? "read" : "write";
	if (ep->fd < 0)
		return putil_error(base, LMT_ESTATE, "file channel %u: %s before the file is open",
		                   ep->channel, what);
	if (read != (ep->mode == LMT_STORAGE_READ))
		return putil_error(base, LMT_ESTATE, "file channel %u: a %s on a file opened to %s",
		                   ep->channel, what, read ? "write" : "read");
	if (!buf || !len || offset > rkey->range.length || len > rkey->range.length - offset)
		return putil_error(
		        base, LMT_EINVAL,
		        "file channel %u: %s of %zu bytes at %llu outside its key's %llu "
		        "bytes",
		        ep->channel, what, len, (unsigned long long)offset,
		        (unsigned long long)rkey->range.length);
	uint64_t at = rkey->range.offset + offset;
	if (inst->direct && (((uintptr_t)buf | len | at) % FILE_DIRECT_ALIGN))
		return putil_error(
		        base, LMT_EINVAL,
		        "direct-io=on: %s of %zu bytes at file offset %llu from %p is not "
		        "aligned to %u",
		        what, len, (unsigned long long)at, buf, FILE_DIRECT_ALIGN);
	pthread_mutex_lock(&inst->lock);
	if (ep->outstanding >= inst->depth) {
		pthread_mutex_unlock(&inst->lock);
		return -LMT_EAGAIN;
	}
	ep->queue[(ep->queue_first + ep->queue_used++) % inst->depth] = (struct file_op){
	        .read = read, .buf = buf, .len = len, .offset = at, .cookie = cookie};
	ep->outstanding++;
	ep->posted++;
	pthread_cond_signal(&ep->cond);
	pthread_mutex_unlock(&inst->lock);
	return 0;
}

int file_channel_progress(struct lmt_instance *inst, struct lmt_completion *out, uint32_t max,
                          uint64_t timeout_ns)
{
	const struct putil_instance *base = &inst->base;
	if (!out && max)
		return -LMT_EINVAL;
	uint64_t deadline = lmt__deadline(timeout_ns);
	uint32_t n = 0;
	pthread_mutex_lock(&inst->lock);
	while (!inst->ring_used && max) {
		if (putil_cancelled(base)) {
			pthread_mutex_unlock(&inst->lock);
			return putil_error(base, LMT_ECANCELED, "file: cancelled");
		}
		if (lmt__now_ns() >= deadline)
			break;
		lmt__cond_wait_slice(&inst->cond, &inst->lock, deadline);
	}
	while (inst->ring_used && n < max) {
		out[n] = inst->ring[inst->ring_first];
		inst->ring_first = (inst->ring_first + 1) % inst->ring_cap;
		inst->ring_used--;
		struct lmt_endpoint *ep = inst->eps[out[n].channel];
		if (ep)
			ep->outstanding--;
		n++;
	}
	pthread_mutex_unlock(&inst->lock);
	return (int)n;
}

static bool all_done(const struct lmt_instance *inst, const uint64_t *target)
{
	for (uint32_t c = 0; c < inst->base.channels; c++)
		if (inst->eps[c] && inst->eps[c]->done < target[c])
			return false;
	return true;
}

int file_channel_flush(struct lmt_instance *inst, uint64_t timeout_ns)
{
	const struct putil_instance *base = &inst->base;
	uint64_t deadline = lmt__deadline(timeout_ns);
	uint64_t target[FILE_MAX_CHANNELS] = {0};
	int fd = -1;
	pthread_mutex_lock(&inst->lock);
	for (uint32_t c = 0; c < inst->base.channels; c++)
		if (inst->eps[c]) {
			target[c] = inst->eps[c]->posted;
			if (fd < 0 && inst->eps[c]->mode != LMT_STORAGE_READ)
				fd = inst->eps[c]->fd;
		}
	while (!all_done(inst, target)) {
		if (putil_cancelled(base) || lmt__now_ns() >= deadline) {
			pthread_mutex_unlock(&inst->lock);
			return putil_cancelled(base)
			               ? putil_error(base, LMT_ECANCELED, "file: flush cancelled")
			               : putil_error(base, LMT_ETIMEDOUT,
			                             "file: flush timed out after %llu ms",
			                             (unsigned long long)(timeout_ns / 1000000));
		}
		lmt__cond_wait_slice(&inst->cond, &inst->lock, deadline);
	}
	int failed = inst->sync_errno;
	pthread_mutex_unlock(&inst->lock);
	if (failed)
		return putil_error(base, LMT_EIO, "file: fdatasync of '%s' while saving: %s",
		                   inst->path, strerror(failed));
	/* Every descriptor shares the file: one fdatasync makes all of it
	 * durable, whichever channel wrote it. */
	if (fd >= 0 && fdatasync(fd) != 0)
		return putil_error(base, LMT_EIO, "file: fdatasync of '%s': %s", inst->path,
		                   strerror(errno));
	return 0;
}

/* ---- the syncer ---- */

static void *syncer_thread(void *arg)
{
	struct lmt_instance *inst = arg;
	pthread_mutex_lock(&inst->lock);
	while (!inst->syncer_stop) {
		uint64_t now = lmt__now_ns();
		bool quiet = inst->unsynced && now - inst->last_write_ns >= FILE_SYNC_QUIET_NS;
		if (inst->unsynced < FILE_SYNC_EVERY && !quiet) {
			lmt__cond_wait_slice(&inst->sync_cond, &inst->lock,
			                     now + FILE_SYNC_QUIET_NS / 4);
			continue;
		}
		inst->unsynced = 0;
		pthread_mutex_unlock(&inst->lock);
		int rc = fdatasync(inst->sync_fd);
		int e = errno;
		pthread_mutex_lock(&inst->lock);
		if (rc && !inst->sync_errno)
			inst->sync_errno = e;
	}
	pthread_mutex_unlock(&inst->lock);
	return NULL;
}

int file_syncer_start(struct lmt_instance *inst, int fd)
{
	if (inst->syncer_started)
		return 0;
	inst->sync_fd = dup(fd);
	if (inst->sync_fd < 0)
		return -LMT_EIO;
	if (lmt__thread_start(&inst->syncer, syncer_thread, inst)) {
		close(inst->sync_fd);
		inst->sync_fd = -1;
		return -LMT_ENOMEM;
	}
	inst->syncer_started = true;
	return 0;
}

void file_syncer_stop(struct lmt_instance *inst)
{
	if (!inst->syncer_started)
		return;
	pthread_mutex_lock(&inst->lock);
	inst->syncer_stop = true;
	pthread_cond_broadcast(&inst->sync_cond);
	pthread_mutex_unlock(&inst->lock);
	pthread_join(inst->syncer, NULL);
	close(inst->sync_fd);
	inst->sync_fd = -1;
	inst->syncer_started = false;
}
