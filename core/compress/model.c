/* The "does it pay" model (model.h): expected times per choice, the
 * decision with hysteresis, and the probe schedule.
 * Room: compress; may use: base. */
#include "model.h"

#include <math.h>
#include <string.h>

#include "error.h"

int lmt__compress_model_init(struct lmt_compress_model *m,
                             const struct lmt_compress_choice *choices, unsigned n,
                             unsigned threads, struct lmt_error *err)
{
	memset(m, 0, sizeof(*m));
	if (n >= LMT_COMPRESS_MODEL_MAX_CHOICES)
		return lmt__error(err, LMT_EINVAL,
		                  "compression model: %u choices besides raw, at most %u", n,
		                  LMT_COMPRESS_MODEL_MAX_CHOICES - 1);
	if (threads == 0)
		return lmt__error(err, LMT_EINVAL, "compression model: no compression thread");
	m->threads = threads;
	m->est[0].choice = (struct lmt_compress_choice){LMT_CODEC_RAW, 0};
	m->count = 1;
	for (unsigned i = 0; i < n; i++) {
		int level = lmt__codec_level(choices[i].codec, choices[i].level, err);
		if (level < 0)
			return level;
		for (unsigned j = 1; j < m->count; j++)
			if (m->est[j].choice.codec == choices[i].codec &&
			    m->est[j].choice.level == level)
				return lmt__error(err, LMT_EINVAL,
				                  "compression model: %s level %d given twice",
				                  lmt__codec_name(choices[i].codec), level);
		m->est[m->count++].choice = (struct lmt_compress_choice){choices[i].codec, level};
	}
	return 0;
}

void lmt__compress_model_set_link(struct lmt_compress_model *m, double bytes_per_second)
{
	m->link_rate = bytes_per_second > 0 ? bytes_per_second : 0;
}

void lmt__compress_model_set_threads(struct lmt_compress_model *m, unsigned threads)
{
	if (threads)
		m->threads = threads;
}

void lmt__compress_model_set_expand_rate(struct lmt_compress_model *m, enum lmt_codec codec,
                                         double bytes_per_second)
{
	if ((unsigned)codec < LMT_CODEC_COUNT)
		m->expand_rate[codec] = bytes_per_second > 0 ? bytes_per_second : 0;
}

static void average(double *avg, double sample, bool first)
{
	*avg = first ? sample : *avg + LMT_COMPRESS_MODEL_WEIGHT * (sample - *avg);
}

/* The codecs' ratios on the same pages move together: when the current
 * choice's chunks save a share s' of their bytes where they saved s (and
 * frame a share g' where they framed g), every other compressed choice
 * is expected to save s'/s times what it did (and frame g'/g times), until
 * its own next probe says otherwise. Only the current choice's chunks,
 * which follow the guest's content, move the others. A rise is capped at
 * twice what the current choice saves: from a saving near nothing, s'/s
 * would make any stale figure look boundless. */
static void follow_content(struct lmt_compress_model *m, unsigned index, double saved,
                           double framed)
{
	double now = 1 - m->est[index].wire;
	double saving = saved > 0 ? now / saved : 1;
	double framing = framed > 0 ? m->est[index].framed / framed : 1;
	for (unsigned k = 1; k < m->count; k++) {
		struct lmt_compress_estimate *e = &m->est[k];
		if (k == index || !e->observations)
			continue;
		double was = 1 - e->wire, s = was * saving;
		if (saving > 1 && s > 2 * now)
			s = was > 2 * now ? was : 2 * now;
		e->wire = 1 - (s < 0 ? 0 : s > 1 ? 1 : s);
		double g = e->framed * framing;
		e->framed = g < 0 ? 0 : g > 1 ? 1 : g;
	}
}

void lmt__compress_model_observe(struct lmt_compress_model *m, unsigned index, uint64_t raw_bytes,
                                 uint64_t wire_bytes, uint64_t framed_bytes, uint64_t busy_ns)
{
	if (index >= m->count || raw_bytes == 0)
		return;
	struct lmt_compress_estimate *e = &m->est[index];
	bool first = e->observations++ == 0;
	if (index == 0) {
		e->wire = 1;
		return;
	}
	double raw = (double)raw_bytes;
	double saved = 1 - e->wire, framed = e->framed;
	average(&e->wire, (double)wire_bytes / raw, first);
	average(&e->framed, (double)(framed_bytes < raw_bytes ? framed_bytes : raw_bytes) / raw,
	        first);
	if (busy_ns)
		average(&e->rate, raw * 1e9 / (double)busy_ns, first || e->rate <= 0);
	if (!first && index == m->current)
		follow_content(m, index, saved, framed);
}

double lmt__compress_model_seconds(const struct lmt_compress_model *m, unsigned index, double bytes)
{
	if (index >= m->count || m->link_rate <= 0)
		return INFINITY;
	if (index == 0)
		return bytes / m->link_rate;
	const struct lmt_compress_estimate *e = &m->est[index];
	if (e->observations == 0 || e->rate <= 0)
		return INFINITY;
	double t = bytes / (e->rate * m->threads);
	double link = bytes * e->wire / m->link_rate;
	if (link > t)
		t = link;
	double expand = m->expand_rate[e->choice.codec];
	if (expand > 0 && bytes * e->framed / expand > t)
		t = bytes * e->framed / expand;
	return t;
}

/* CPU a choice spends per byte, to break ties: raw none. */
static double cpu_cost(const struct lmt_compress_model *m, unsigned i)
{
	if (i == 0)
		return 0;
	return m->est[i].rate > 0 ? 1 / m->est[i].rate : INFINITY;
}

unsigned lmt__compress_model_best(const struct lmt_compress_model *m)
{
	double fastest = INFINITY;
	for (unsigned i = 0; i < m->count; i++) {
		double t = lmt__compress_model_seconds(m, i, 1);
		if (t < fastest)
			fastest = t;
	}
	if (isinf(fastest))
		return 0;
	unsigned best = 0;
	double best_cpu = INFINITY;
	for (unsigned i = 0; i < m->count; i++)
		if (lmt__compress_model_seconds(m, i, 1) <=
		            fastest * (1 + LMT_COMPRESS_MODEL_TIE) &&
		    cpu_cost(m, i) < best_cpu) {
			best = i;
			best_cpu = cpu_cost(m, i);
		}
	return best;
}

/* Move to the best choice when it spends less CPU (it ties the fastest,
 * so it is no slower), or when it spends more and is clearly faster: a
 * gain within the hysteresis is not worth the CPU. */
static void reconsider(struct lmt_compress_model *m)
{
	unsigned best = lmt__compress_model_best(m);
	if (best == m->current)
		return;
	double tb = lmt__compress_model_seconds(m, best, 1);
	double tc = lmt__compress_model_seconds(m, m->current, 1);
	if (isinf(tc) || cpu_cost(m, best) < cpu_cost(m, m->current) ||
	    tb < tc * (1 - LMT_COMPRESS_MODEL_HYSTERESIS))
		m->current = best;
}

/* f for est[j] (model.h): by how much slower it is predicted to be than
 * the current choice, or how much longer its chunk keeps a thread busy
 * than the current choice takes for it, whichever is more; 1 while that
 * is not known. */
static double probe_factor(const struct lmt_compress_model *m, unsigned j)
{
	double tj = lmt__compress_model_seconds(m, j, 1);
	double tc = lmt__compress_model_seconds(m, m->current, 1);
	if (isinf(tc))
		return 1;
	if (isinf(tj))
		return m->est[j].observations ? LMT_COMPRESS_MODEL_PROBE_FAR : 1;
	double busy = cpu_cost(m, j);
	double f = (busy > tj ? busy : tj) / tc;
	return f < 1 ? 1 : f > LMT_COMPRESS_MODEL_PROBE_FAR ? LMT_COMPRESS_MODEL_PROBE_FAR : f;
}

/* The most overdue other choice, or current when none is due. A choice
 * never tried is due at once; one tried but not yet observed (its chunk
 * still in flight) again after the base period. */
static unsigned probe_due(const struct lmt_compress_model *m)
{
	unsigned pick = m->current;
	double most = 1;
	double others = m->count - 1;
	for (unsigned j = 0; j < m->count; j++) {
		if (j == m->current)
			continue;
		const struct lmt_compress_estimate *e = &m->est[j];
		double period = LMT_COMPRESS_MODEL_PROBE_EVERY;
		if (e->last_chosen && e->observations) {
			double f = probe_factor(m, j);
			period *= others * f * f;
		}
		double urgency =
		        e->last_chosen ? (double)(m->chunks - e->last_chosen) / period : INFINITY;
		if (urgency >= most && (pick == m->current || urgency > most)) {
			pick = j;
			most = urgency;
		}
	}
	return pick;
}

struct lmt_compress_decision lmt__compress_model_next(struct lmt_compress_model *m)
{
	m->chunks++;
	reconsider(m);
	unsigned pick = probe_due(m);
	m->est[pick].last_chosen = m->chunks;
	return (struct lmt_compress_decision){
	        .index = pick, .choice = m->est[pick].choice, .probe = pick != m->current};
}
