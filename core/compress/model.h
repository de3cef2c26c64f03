/* "Does it pay": which of raw, lz4 and zstd (at which level) moves the
 * next chunk fastest, from measured link, compressor, ratio and expansion
 * rates, with hysteresis and a few chunks re-probed with another choice to
 * keep the measurements fresh. Pure and deterministic: no clock, no I/O;
 * the caller feeds it measurements. The formulae are in
 * docs/compression.md ("Does it pay"). Not thread-safe: one owner.
 * Room: compress; may use: base. */
#ifndef LMT_CORE_COMPRESS_MODEL_H
#define LMT_CORE_COMPRESS_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include <lmt/lmt.h>

#include "codec.h"

/* Choices a model weighs, raw included. */
#define LMT_COMPRESS_MODEL_MAX_CHOICES 8u
/* Predicted times within this share of the fastest count as a tie, and
 * a tie goes to the choice that spends the least CPU (raw spends none). */
#define LMT_COMPRESS_MODEL_TIE 0.01
/* Hysteresis: a choice that spends more CPU than the current one is
 * taken only when predicted this much faster; one that spends less is
 * taken as soon as it ties the fastest. */
#define LMT_COMPRESS_MODEL_HYSTERESIS 0.05
/* Re-probing: with k other choices, each as fast as the current one,
 * each is probed once every PROBE_EVERY x k chunks (one chunk in
 * PROBE_EVERY is a probe); one f times slower, or whose chunk costs a
 * thread f times the current choice's time, f^2 times less often (f up to
 * _FAR), so that a hopeless choice costs next to nothing to keep fresh. */
#define LMT_COMPRESS_MODEL_PROBE_EVERY 16u
#define LMT_COMPRESS_MODEL_PROBE_FAR 16.0
/* Weight of the newest observation in a choice's running averages. */
#define LMT_COMPRESS_MODEL_WEIGHT 0.25

struct lmt_compress_choice {
	enum lmt_codec codec; /* raw, lz4 or zstd */
	int level;            /* zstd 1..19; lz4 1; raw 0 */
};

/* What the model knows of one choice, from the chunks sent with it. */
struct lmt_compress_estimate {
	struct lmt_compress_choice choice;
	uint64_t observations;
	double rate;          /* raw bytes one compression thread takes per second */
	double wire;          /* bytes on the link per raw byte: frames and raw fallbacks */
	double framed;        /* share of raw bytes that went as frames (expanded later) */
	uint64_t last_chosen; /* the chunk it was last chosen for, 0: never */
};

struct lmt_compress_model {
	struct lmt_compress_estimate est[LMT_COMPRESS_MODEL_MAX_CHOICES]; /* [0]: raw */
	unsigned count;
	unsigned current;
	uint64_t chunks; /* decisions made */
	unsigned threads;
	double link_rate; /* bytes/s; 0: not known yet */
	/* the destination's, raw bytes/s over all its threads; 0: not known */
	double expand_rate[LMT_CODEC_COUNT];
};

struct lmt_compress_decision {
	unsigned index; /* into est[] */
	struct lmt_compress_choice choice;
	bool probe; /* a re-probe, not the model's pick */
};

/* Weigh raw and `n` compressed choices (lz4, or zstd at distinct levels;
 * n < LMT_COMPRESS_MODEL_MAX_CHOICES) compressed by `threads` threads:
 * 0, or -LMT_EINVAL with err. Starts on raw, knowing nothing. */
int lmt__compress_model_init(struct lmt_compress_model *m,
                             const struct lmt_compress_choice *choices, unsigned n,
                             unsigned threads, struct lmt_error *err);

/* The link's rate in bytes/s, as measured from raw writes or as limited
 * by max-bandwidth (the smaller); 0: not known. */
void lmt__compress_model_set_link(struct lmt_compress_model *m, double bytes_per_second);
void lmt__compress_model_set_threads(struct lmt_compress_model *m, unsigned threads);
/* The destination's expansion rate for `codec`, raw bytes/s over all its
 * threads; 0: not known. */
void lmt__compress_model_set_expand_rate(struct lmt_compress_model *m, enum lmt_codec codec,
                                         double bytes_per_second);

/* A chunk sent with est[index]: its raw bytes, the bytes it took on the
 * link (headers and runs sent raw because they did not fit included), the
 * raw bytes that went as frames, and the compression threads' busy time
 * for it (0 for raw). Ignored for an index out of range or no bytes. */
void lmt__compress_model_observe(struct lmt_compress_model *m, unsigned index, uint64_t raw_bytes,
                                 uint64_t wire_bytes, uint64_t framed_bytes, uint64_t busy_ns);

/* The expected seconds to move `bytes` raw bytes with est[index]: the
 * slowest of compressing, the link and expanding, which run at once.
 * INFINITY while it cannot be known (no link rate, never observed). */
double lmt__compress_model_seconds(const struct lmt_compress_model *m, unsigned index,
                                   double bytes);

/* The fastest choice now (of those within the tie, the one that spends
 * the least CPU), without hysteresis or probes. */
unsigned lmt__compress_model_best(const struct lmt_compress_model *m);

/* The choice for the next chunk (call once per chunk). */
struct lmt_compress_decision lmt__compress_model_next(struct lmt_compress_model *m);

#endif
