/* A pool of lmt's own threads that compress page runs into frames (the
 * source) or expand frames into page runs (the destination): a bounded
 * set of jobs, harvested by polling without blocking, a descriptor and a
 * deadline wait for when there is nothing to harvest, a shutdown after
 * which no job touches memory, and what each thread measured for the
 * model (model.h). See docs/compression.md.
 * Room: compress; may use: base. */
#ifndef LMT_CORE_COMPRESS_POOL_H
#define LMT_CORE_COMPRESS_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <lmt/lmt.h>

#include "codec.h"

/* Threads a pool may have, and the number documented as the default. */
#define LMT_COMPRESS_MAX_THREADS 64u
#define LMT_COMPRESS_DEFAULT_THREADS 2u
/* Jobs a pool may hold at once (queued, running and done unharvested). */
#define LMT_COMPRESS_MAX_JOBS 65536u

enum lmt_compress_op {
	LMT_COMPRESS_OP_COMPRESS, /* in[0, in_len) -> a frame in out[0, out_cap) */
	LMT_COMPRESS_OP_EXPAND,   /* the frame at in -> out[0, out_cap), exactly */
	LMT_COMPRESS_OPS
};

/* One job. The caller owns it and keeps it, and the memory it names,
 * untouched from submit until it is harvested. */
struct lmt_compress_job {
	/* Set by the caller: */
	enum lmt_compress_op op;
	enum lmt_codec codec; /* lz4 or zstd; expand: as announced, the frame's must match */
	int level;            /* compress: as lmt__codec_level (0: the default) */
	const void *in;
	size_t in_len;    /* compress: the run; expand: its slot's size */
	size_t frame_len; /* expand: the frame's announced length */
	void *out;
	size_t out_cap;  /* compress: room for the frame; expand: the run */
	uint64_t cookie; /* the caller's, untouched */
	/* Set by the pool once done: */
	/* 0; -LMT_EOVERFLOW: does not fit, send the run raw; -LMT_ECANCELED:
	 * stopped before it ran; or the failure, with err. */
	int status;
	size_t out_len;   /* compress: the frame's length; expand: out_cap */
	uint64_t busy_ns; /* the time the codec took */
	unsigned thread;  /* which ran it */
	struct lmt_error err;
	struct lmt_compress_job *next; /* the pool's */
};

/* What one thread did for one op with one codec, since the pool started. */
struct lmt_compress_rates {
	uint64_t jobs;
	uint64_t bytes_in; /* compress: raw bytes; expand: frame bytes */
	/* compress: frame bytes (0 when it did not fit); expand: raw bytes */
	uint64_t bytes_out;
	uint64_t busy_ns;
	uint64_t unfit;  /* compress: jobs that did not fit */
	uint64_t failed; /* any other failure */
};

struct lmt_compress_thread_stats {
	struct lmt_compress_rates rates[LMT_COMPRESS_OPS][LMT_CODEC_COUNT];
};

/* Submit, harvest, wait, fd, held and stats may be called from any
 * thread; stop and free only by the pool's owner, never at once. */
struct lmt_compress_pool;

/* Start `threads` (1 .. LMT_COMPRESS_MAX_THREADS) threads named
 * "<name>/<i>" ("lmt-compress/0"; name at most 12 characters) that may
 * hold `capacity` (1 .. LMT_COMPRESS_MAX_JOBS) jobs at once. 0, or
 * -LMT_EINVAL / -LMT_ENOMEM with err; nothing is left on a failure. */
int lmt__compress_pool_new(struct lmt_compress_pool **out, unsigned threads, unsigned capacity,
                           const char *name, struct lmt_error *err);

/* Hand a job over: 0; -LMT_EAGAIN when the pool holds `capacity` jobs
 * (harvest first); -LMT_ESTATE once stopped; -LMT_EINVAL with err for a
 * job that could never run (codec, level, lengths, NULL buffers). The job
 * is the pool's until harvested only when 0 is returned. */
int lmt__compress_pool_submit(struct lmt_compress_pool *pool, struct lmt_compress_job *job,
                              struct lmt_error *err);

/* Take up to `max` done jobs, in the order they were done, without
 * blocking: how many were taken. */
unsigned lmt__compress_pool_harvest(struct lmt_compress_pool *pool, struct lmt_compress_job **jobs,
                                    unsigned max);

/* Wait until a done job is there to harvest (0) or `deadline_ns`
 * (lmt__now_ns time) passes (-LMT_ETIMEDOUT); 0 at once when one is. */
int lmt__compress_pool_wait(struct lmt_compress_pool *pool, uint64_t deadline_ns);

/* A descriptor (eventfd) that polls readable while done jobs wait to be
 * harvested, for an engine's poll set. The pool's: never close it. */
int lmt__compress_pool_fd(const struct lmt_compress_pool *pool);

/* Jobs the pool holds: queued, running, and done but not harvested. */
unsigned lmt__compress_pool_held(struct lmt_compress_pool *pool);

/* Stop: refuse new jobs, let the running ones finish, mark the queued
 * ones -LMT_ECANCELED without running them, and join every thread. When
 * it returns no thread of the pool runs, so none touches the memory of
 * any job again; done and cancelled jobs stay to be harvested. */
void lmt__compress_pool_stop(struct lmt_compress_pool *pool);

/* Stop (if not yet) and free the pool; jobs not harvested are the
 * caller's again. NULL is fine. */
void lmt__compress_pool_free(struct lmt_compress_pool *pool);

/* Copy each thread's figures into out[0, min(n, threads)): how many. */
unsigned lmt__compress_pool_stats(struct lmt_compress_pool *pool,
                                  struct lmt_compress_thread_stats *out, unsigned n);

#endif
