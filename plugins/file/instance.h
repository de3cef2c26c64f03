/* The file plugin's instance and endpoints: a file on a local file system
 * as the "peer", one I/O thread per channel. */
#ifndef LMT_FILE_INSTANCE_H
#define LMT_FILE_INSTANCE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <lmt/plugin.h>

#include "putil_base.h"
#include "wire.h"

#define FILE_MAX_CHANNELS 64u
/* With direct-io=on every transfer's buffer, length and file offset are
 * multiples of this. */
#define FILE_DIRECT_ALIGN 4096u

/* One transfer queued for a channel's thread. */
struct file_op {
	bool read;
	void *buf;
	size_t len;
	uint64_t offset; /* in the file */
	uint64_t cookie;
};

struct lmt_endpoint {
	struct lmt_instance *inst;
	uint32_t channel;
	int fd; /* -1 until connected */
	enum lmt_storage_mode mode;
	pthread_t thread;
	bool thread_started;
	pthread_cond_t cond;   /* the thread has work, or must stop */
	struct file_op *queue; /* `depth` entries, a ring */
	uint32_t queue_first, queue_used;
	bool stop;
	uint32_t outstanding; /* posted, not yet harvested */
	uint64_t posted, done;
};

struct lmt_rkey {
	struct lmt_rkey *next;
	struct file_range range;
};

struct lmt_instance {
	struct putil_instance base;
	bool direct;
	uint32_t depth;
	pthread_mutex_t lock; /* everything below and every endpoint's queue */
	pthread_cond_t cond;  /* a completion arrived, or a transfer finished */
	struct lmt_endpoint *eps[FILE_MAX_CHANNELS];
	struct lmt_completion *ring; /* channels * depth */
	uint32_t ring_first, ring_used, ring_cap;
	struct lmt_rkey *rkeys;
	char path[LMT_STORAGE_PATH_MAX + 1];
	uint64_t size; /* reading: the file's length when opened */
	/* Writing: a thread that makes what was written durable as the save
	 * goes (fdatasync on its own descriptor), so that the flush in the
	 * guest's pause has little left to do. */
	pthread_t syncer;
	bool syncer_started;
	bool syncer_stop;
	int sync_fd;
	pthread_cond_t sync_cond;
	uint64_t unsynced;      /* bytes written since the last fdatasync began */
	uint64_t last_write_ns; /* when the last write finished */
	int sync_errno;         /* the first fdatasync that failed, for flush */
};

/* channel.c: the endpoints' threads, transfers, completions, flush. */
int file_channel_open(struct lmt_instance *inst, const struct file_address *a,
                      struct lmt_endpoint *ep);
void file_channel_close(struct lmt_endpoint *ep);
int file_channel_post(struct lmt_endpoint *ep, bool read, void *buf, size_t len,
                      const struct lmt_rkey *rkey, uint64_t offset, uint64_t cookie);
int file_channel_progress(struct lmt_instance *inst, struct lmt_completion *out, uint32_t max,
                          uint64_t timeout_ns);
int file_channel_flush(struct lmt_instance *inst, uint64_t timeout_ns);
/* The syncer: started with the file created, stopped by instance_close. */
int file_syncer_start(struct lmt_instance *inst, int fd);
void file_syncer_stop(struct lmt_instance *inst);

#endif
