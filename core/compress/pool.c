/* The compression threads (pool.h): one lock, two intrusive lists of
 * jobs (queued, done), a condition variable each way, an eventfd that is
 * readable exactly while the done list is not empty.
 * Room: compress; may use: base. */
#define _GNU_SOURCE
#include "pool.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "error.h"
#include "frame.h"
#include "net.h"
#include "sync.h"

struct job_list {
	struct lmt_compress_job *head, *tail;
};

struct pool_thread {
	struct lmt_compress_pool *pool;
	unsigned index;
	pthread_t id;
	bool started;
	struct lmt_codec_ctx *ctx;
	struct lmt_compress_thread_stats stats; /* under the pool's lock */
};

struct lmt_compress_pool {
	pthread_mutex_t lock;
	pthread_cond_t work; /* a job was queued, or stopping */
	pthread_cond_t done; /* a job was done */
	struct job_list queued, finished;
	unsigned held; /* queued + running + finished */
	unsigned capacity;
	bool stopping, stopped;
	bool conds; /* work and done initialised */
	int event_fd;
	char name[13]; /* with "/63", the 15 characters a thread's name may have */
	unsigned nthreads;
	struct pool_thread *threads;
};

static void list_push(struct job_list *l, struct lmt_compress_job *job)
{
	job->next = NULL;
	if (l->tail)
		l->tail->next = job;
	else
		l->head = job;
	l->tail = job;
}

static struct lmt_compress_job *list_pop(struct job_list *l)
{
	struct lmt_compress_job *job = l->head;
	if (job) {
		l->head = job->next;
		if (!l->head)
			l->tail = NULL;
		job->next = NULL;
	}
	return job;
}

/* With the lock: the eventfd turns readable with the first done job. */
static void finish_locked(struct lmt_compress_pool *pool, struct lmt_compress_job *job)
{
	bool was_empty = pool->finished.head == NULL;
	list_push(&pool->finished, job);
	if (was_empty) {
		uint64_t one = 1;
		/* Cannot fail short of a counter at 2^64 - 1: it is drained
		 * whenever the list empties. */
		if (write(pool->event_fd, &one, sizeof(one)) != sizeof(one))
			lmt__log(LMT_LOG_ERROR, "compression pool: eventfd write: %s",
			         strerror(errno));
	}
	pthread_cond_broadcast(&pool->done);
}

static void run_job(struct lmt_codec_ctx *ctx, struct lmt_compress_job *job)
{
	if (job->op == LMT_COMPRESS_OP_COMPRESS) {
		job->status = lmt__frame_compress(ctx, job->codec, job->level, job->in, job->in_len,
		                                  job->out, job->out_cap, &job->out_len, &job->err);
		return;
	}
	struct lmt_frame_expect x = {.codec = job->codec,
	                             .room = job->in_len,
	                             .length = job->frame_len,
	                             .raw_len = job->out_cap};
	job->status = lmt__frame_expand(ctx, job->in, &x, job->out, &job->err);
	job->out_len = job->status == 0 ? job->out_cap : 0;
}

static void account(struct pool_thread *t, const struct lmt_compress_job *job)
{
	struct lmt_compress_rates *r = &t->stats.rates[job->op][job->codec];
	r->jobs++;
	r->busy_ns += job->busy_ns;
	if (job->op == LMT_COMPRESS_OP_COMPRESS) {
		r->bytes_in += job->in_len;
		r->bytes_out += job->out_len;
	} else {
		r->bytes_in += job->frame_len;
		r->bytes_out += job->out_len;
	}
	if (job->status == -LMT_EOVERFLOW && job->op == LMT_COMPRESS_OP_COMPRESS)
		r->unfit++;
	else if (job->status)
		r->failed++;
}

static void *pool_main(void *arg)
{
	struct pool_thread *t = arg;
	struct lmt_compress_pool *pool = t->pool;
	pthread_mutex_lock(&pool->lock);
	for (;;) {
		while (!pool->stopping && !pool->queued.head)
			pthread_cond_wait(&pool->work, &pool->lock);
		if (pool->stopping)
			break;
		struct lmt_compress_job *job = list_pop(&pool->queued);
		pthread_mutex_unlock(&pool->lock);
		uint64_t start = lmt__now_ns();
		run_job(t->ctx, job);
		job->busy_ns = lmt__now_ns() - start;
		job->thread = t->index;
		pthread_mutex_lock(&pool->lock);
		account(t, job);
		finish_locked(pool, job);
	}
	pthread_mutex_unlock(&pool->lock);
	return NULL;
}

static void join_all(struct lmt_compress_pool *pool)
{
	for (unsigned i = 0; i < pool->nthreads; i++)
		if (pool->threads[i].started) {
			pthread_join(pool->threads[i].id, NULL);
			pool->threads[i].started = false;
		}
}

void lmt__compress_pool_stop(struct lmt_compress_pool *pool)
{
	pthread_mutex_lock(&pool->lock);
	bool already = pool->stopped;
	pool->stopping = true;
	pool->stopped = true;
	pthread_cond_broadcast(&pool->work);
	pthread_mutex_unlock(&pool->lock);
	if (already)
		return;
	join_all(pool);
	pthread_mutex_lock(&pool->lock);
	struct lmt_compress_job *job;
	while ((job = list_pop(&pool->queued))) {
		job->status = lmt__error(&job->err, LMT_ECANCELED,
		                         "compression: stopped before the job ran");
		job->out_len = 0;
		job->busy_ns = 0;
		finish_locked(pool, job);
	}
	pthread_mutex_unlock(&pool->lock);
}

void lmt__compress_pool_free(struct lmt_compress_pool *pool)
{
	if (!pool)
		return;
	if (pool->threads) {
		lmt__compress_pool_stop(pool);
		for (unsigned i = 0; i < pool->nthreads; i++)
			lmt__codec_ctx_free(pool->threads[i].ctx);
		free(pool->threads);
	}
	if (pool->event_fd >= 0)
		close(pool->event_fd);
	if (pool->conds) {
		pthread_cond_destroy(&pool->work);
		pthread_cond_destroy(&pool->done);
	}
	pthread_mutex_destroy(&pool->lock);
	free(pool);
}

static int pool_init(struct lmt_compress_pool *pool, unsigned threads, unsigned capacity,
                     const char *name, struct lmt_error *err)
{
	pool->event_fd = -1;
	pool->capacity = capacity;
	pool->nthreads = threads;
	lmt__copy(pool->name, sizeof(pool->name), name);
	pthread_mutex_init(&pool->lock, NULL);
	if (lmt__cond_init(&pool->work))
		return lmt__error(err, LMT_ENOMEM, "compression pool: no condition variable");
	if (lmt__cond_init(&pool->done)) {
		pthread_cond_destroy(&pool->work);
		return lmt__error(err, LMT_ENOMEM, "compression pool: no condition variable");
	}
	pool->conds = true;
	pool->event_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (pool->event_fd < 0)
		return lmt__error(err, LMT_ENOMEM, "compression pool: eventfd: %s",
		                  strerror(errno));
	pool->threads = calloc(threads, sizeof(*pool->threads));
	if (!pool->threads)
		return lmt__error(err, LMT_ENOMEM, "compression pool: no memory for %u threads",
		                  threads);
	for (unsigned i = 0; i < threads; i++) {
		int rc = lmt__codec_ctx_new(&pool->threads[i].ctx, err);
		if (rc)
			return rc;
	}
	for (unsigned i = 0; i < threads; i++) {
		struct pool_thread *t = &pool->threads[i];
		t->pool = pool;
		t->index = i;
		if (lmt__thread_start(&t->id, pool_main, t))
			return lmt__error(err, LMT_ENOMEM,
			                  "compression pool: cannot start thread %u of %u", i,
			                  threads);
		t->started = true;
		/* Named by its creator, so that it has its name once the pool
		 * is there; a failure leaves the inherited name, nothing worse. */
		char thread_name[16];
		snprintf(thread_name, sizeof(thread_name), "%s/%u", pool->name, i);
		pthread_setname_np(t->id, thread_name);
	}
	return 0;
}

int lmt__compress_pool_new(struct lmt_compress_pool **out, unsigned threads, unsigned capacity,
                           const char *name, struct lmt_error *err)
{
	*out = NULL;
	if (threads == 0 || threads > LMT_COMPRESS_MAX_THREADS)
		return lmt__error(err, LMT_EINVAL,
		                  "compression pool: expected 1 to %u threads, got %u",
		                  LMT_COMPRESS_MAX_THREADS, threads);
	if (capacity == 0 || capacity > LMT_COMPRESS_MAX_JOBS)
		return lmt__error(err, LMT_EINVAL,
		                  "compression pool: expected 1 to %u jobs, got %u",
		                  LMT_COMPRESS_MAX_JOBS, capacity);
	if (!name || !name[0] || strlen(name) > 12)
		return lmt__error(err, LMT_EINVAL,
		                  "compression pool: a thread name of 1 to 12 characters, got '%s'",
		                  name ? name : "(null)");
	struct lmt_compress_pool *pool = calloc(1, sizeof(*pool));
	if (!pool)
		return lmt__error(err, LMT_ENOMEM, "compression pool: no memory");
	int rc = pool_init(pool, threads, capacity, name, err);
	if (rc) {
		lmt__compress_pool_free(pool);
		return rc;
	}
	*out = pool;
	return 0;
}

static int check_job(const struct lmt_compress_job *job, struct lmt_error *err)
{
	if (!job->in || !job->out)
		return lmt__error(err, LMT_EINVAL, "compression job: NULL buffer");
	if (job->op == LMT_COMPRESS_OP_COMPRESS) {
		int level = lmt__codec_level(job->codec, job->level, err);
		if (level < 0)
			return level;
		if (job->in_len == 0 || job->in_len > LMT_CODEC_MAX_INPUT)
			return lmt__error(err, LMT_EINVAL,
			                  "compression job: cannot compress %zu bytes (1 to %u)",
			                  job->in_len, LMT_CODEC_MAX_INPUT);
		return 0;
	}
	if (job->op != LMT_COMPRESS_OP_EXPAND)
		return lmt__error(err, LMT_EINVAL, "compression job: unknown op %d", (int)job->op);
	if (job->codec != LMT_CODEC_LZ4 && job->codec != LMT_CODEC_ZSTD)
		return lmt__error(err, LMT_EINVAL, "expansion job: codec %d: expected lz4 or zstd",
		                  (int)job->codec);
	if (job->out_cap == 0 || job->out_cap > LMT_CODEC_MAX_INPUT)
		return lmt__error(err, LMT_EINVAL,
		                  "expansion job: cannot expand to %zu bytes (1 to %u)",
		                  job->out_cap, LMT_CODEC_MAX_INPUT);
	return 0;
}

int lmt__compress_pool_submit(struct lmt_compress_pool *pool, struct lmt_compress_job *job,
                              struct lmt_error *err)
{
	int rc = check_job(job, err);
	if (rc)
		return rc;
	pthread_mutex_lock(&pool->lock);
	if (pool->stopping)
		rc = lmt__error(err, LMT_ESTATE, "compression pool: stopped");
	else if (pool->held >= pool->capacity)
		rc = -LMT_EAGAIN;
	else {
		/* A refused job is left as it was. */
		job->status = 0;
		job->out_len = 0;
		job->busy_ns = 0;
		job->thread = 0;
		lmt__error_clear(&job->err);
		pool->held++;
		list_push(&pool->queued, job);
		pthread_cond_signal(&pool->work);
	}
	pthread_mutex_unlock(&pool->lock);
	return rc;
}

unsigned lmt__compress_pool_harvest(struct lmt_compress_pool *pool, struct lmt_compress_job **jobs,
                                    unsigned max)
{
	unsigned n = 0;
	pthread_mutex_lock(&pool->lock);
	while (n < max && pool->finished.head)
		jobs[n++] = list_pop(&pool->finished);
	pool->held -= n;
	if (n && !pool->finished.head) {
		uint64_t count;
		/* Drain: readable again only with the next done job. */
		if (read(pool->event_fd, &count, sizeof(count)) < 0 && errno != EAGAIN)
			lmt__log(LMT_LOG_ERROR, "compression pool: eventfd read: %s",
			         strerror(errno));
	}
	pthread_mutex_unlock(&pool->lock);
	return n;
}

int lmt__compress_pool_wait(struct lmt_compress_pool *pool, uint64_t deadline_ns)
{
	pthread_mutex_lock(&pool->lock);
	while (!pool->finished.head && lmt__now_ns() < deadline_ns)
		lmt__cond_wait_slice(&pool->done, &pool->lock, deadline_ns);
	int rc = pool->finished.head ? 0 : -LMT_ETIMEDOUT;
	pthread_mutex_unlock(&pool->lock);
	return rc;
}

int lmt__compress_pool_fd(const struct lmt_compress_pool *pool)
{
	return pool->event_fd;
}

unsigned lmt__compress_pool_held(struct lmt_compress_pool *pool)
{
	pthread_mutex_lock(&pool->lock);
	unsigned held = pool->held;
	pthread_mutex_unlock(&pool->lock);
	return held;
}

unsigned lmt__compress_pool_stats(struct lmt_compress_pool *pool,
                                  struct lmt_compress_thread_stats *out, unsigned n)
{
	if (n > pool->nthreads)
		n = pool->nthreads;
	pthread_mutex_lock(&pool->lock);
	for (unsigned i = 0; i < n; i++)
		out[i] = pool->threads[i].stats;
	pthread_mutex_unlock(&pool->lock);
	return n;
}
