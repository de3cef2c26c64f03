/* The verdict on a source's HELLO before anything else is exchanged: the
 * protocol version, the plugin, the options both sides must agree on
 * (each exactly once, with the same canonical value) and, on a keyed
 * destination, that the source holds a key.
 * Room: engines; may use: every room below it. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lobby.h"
#include "session.h"

/* The destination's must-match options, each to be sent exactly once. */
struct wanted_option {
	const char *name;
	const struct lmt_option_desc *desc;
	const struct lmt_option_value *value;
	bool seen;
};

struct wanted {
	struct wanted_option *v;
	uint32_t n, cap;
	int rc;
};

static int collect_wanted(void *opaque, const char *name, const struct lmt_option_desc *d,
                          const struct lmt_option_value *v, const char *text,
                          enum lmt_opt_source src)
{
	struct wanted *w = opaque;
	if (!(d->flags & LMT_OPTF_MATCH) || (d->flags & LMT_OPTF_SECRET))
		return 0;
	if (w->n == w->cap) {
		uint32_t cap = w->cap ? 2 * w->cap : 16;
		struct wanted_option *nv = realloc(w->v, cap * sizeof(*nv));
		if (!nv)
			return w->rc = LMT_ENOMEM;
		w->v = nv;
		w->cap = cap;
	}
	w->v[w->n++] = (struct wanted_option){.name = name, .desc = d, .value = v};
	return 0;
}

/* The source's options against the destination's must-match set: every
 * one present exactly once, with the same canonical value, and nothing
 * else. 0, or an LMT_E* code with the reason in `why`. */
static int check_options(struct lmt_session *s, const struct lmt_msg_hello *m, char *why,
                         size_t size)
{
	struct wanted w = {0};
	lmt__optset_foreach(s->opts, collect_wanted, &w);
	int rc = w.rc;
	if (rc)
		snprintf(why, size, "out of memory");
	for (uint32_t i = 0; i < m->option_count && !rc; i++) {
		const struct lmt_msg_option *o = &m->options[i];
		struct wanted_option *mine = NULL;
		for (uint32_t j = 0; j < w.n && !mine; j++)
			if (strcmp(w.v[j].name, o->name) == 0)
				mine = &w.v[j];
		struct lmt_option_value v;
		char text[256];
		if (!mine && lmt__optset_get(s->opts, o->name, &v)) {
			rc = LMT_EMISMATCH;
			snprintf(why, size,
			         "%s: the source sets an option this destination does not know",
			         o->name);
		} else if (!mine) {
			rc = LMT_EPROTO;
			snprintf(why, size, "%s: not an option both sides must agree on", o->name);
		} else if (mine->seen) {
			rc = LMT_EPROTO;
			snprintf(why, size, "%s: the source sent it twice", o->name);
		} else {
			mine->seen = true;
			lmt_option_format(mine->desc, mine->value, text, sizeof(text));
			if (strcmp(text, o->value) != 0) {
				rc = LMT_EMISMATCH;
				snprintf(why, size, "%s: the source has %s, the destination has %s",
				         o->name, o->value, text);
			}
		}
	}
	for (uint32_t j = 0; j < w.n && !rc; j++)
		if (!w.v[j].seen) {
			rc = LMT_EMISMATCH;
			snprintf(why, size,
			         "%s: the source did not send it (both sides must agree on it)",
			         w.v[j].name);
		}
	free(w.v);
	return rc;
}

/* Whether a decoded HELLO may go on: 0, or an LMT_E* code and why not. */
int lmt__hello_verdict(struct lmt_session *s, const struct lmt_msg_hello *m, char *why, size_t size)
{
	if (m->version != LMT_PROTO_VERSION) {
		snprintf(why, size,
		         "protocol version %u is not supported; this destination speaks %u",
		         m->version, LMT_PROTO_VERSION);
		return LMT_EPROTO;
	}
	if (strcmp(m->plugin, s->wire_name) != 0) {
		snprintf(why, size, "plugin: the source uses '%s', the destination '%s'", m->plugin,
		         s->wire_name);
		return LMT_EMISMATCH;
	}
	int rc = check_options(s, m, why, size);
	if (!rc && s->auth.bytes && !m->auth) {
		snprintf(why, size,
		         "authentication required: the source holds no key (set auth-key or "
		         "auth-key-file on the source)");
		rc = LMT_EAUTH;
	}
	return rc;
}
