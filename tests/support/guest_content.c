/* The synthetic guest's content (see guest_content.h): profiles and dirty
 * patterns parsed and printed, pages built from recipes, the initial image
 * placed page by page, and the hot set. The pools are guest_pool.c's. */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "guest_content.h"
#include "guest_pool.h"

#define WORDS_PER_PAGE (GUEST_PAGE_SIZE / sizeof(uint64_t))
#define VARIATION_MASK ((UINT64_C(1) << 61) - 1)
#define REWRITE_BIT (UINT64_C(1) << 61)
#define MAX_EDITS 8u
#define IMAGE_BUFFER_PAGES 256u
#define TWO_TO_32 (UINT64_C(1) << 32)

static const char *const class_names[GUEST_PAGE_CLASSES] = {
        [GUEST_PAGE_ZERO] = "zero",
        [GUEST_PAGE_RANDOM] = "random",
        [GUEST_PAGE_CODE] = "code",
        [GUEST_PAGE_TEXT] = "text",
};

/* The order shares are written in: mixed:zero=..,code=..,text=..,random=.. */
static const enum guest_page_class print_order[GUEST_PAGE_CLASSES] = {
        GUEST_PAGE_ZERO, GUEST_PAGE_CODE, GUEST_PAGE_TEXT, GUEST_PAGE_RANDOM};

const char *guest_page_class_name(enum guest_page_class cls)
{
	return cls < GUEST_PAGE_CLASSES ? class_names[cls] : "?";
}

/* ---- Parsing ------------------------------------------------------------ */

static int fail(char *err, size_t size, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int fail(char *err, size_t size, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err, size, fmt, ap);
	va_end(ap);
	return -1;
}

/* A percentage: digits with at most one '.', from 0 to 100. strtod would
 * also take signs, spaces, hex and "nan". */
static int parse_percent(const char *text, size_t len, double *out)
{
	char buf[32];
	char *end;

	if (len == 0 || len >= sizeof(buf) || strspn(text, "0123456789.") < len)
		return -1;
	memcpy(buf, text, len);
	buf[len] = '\0';
	if (strchr(buf, '.') != strrchr(buf, '.') || buf[0] == '.' || buf[len - 1] == '.')
		return -1;
	*out = strtod(buf, &end);
	return *end == '\0' && *out >= 0.0 && *out <= 100.0 ? 0 : -1;
}

/* Calls `visit` for each KEY=VALUE of a comma-separated list; stops at the
 * first that fails. */
typedef int (*visit_fn)(void *opaque, const char *key, size_t key_len, const char *value,
                        size_t value_len, char *err, size_t size);

static int parse_list(const char *whole, const char *list, visit_fn visit, void *opaque, char *err,
                      size_t size)
{
	if (!*list)
		return fail(err, size, "'%s': nothing after ':'", whole);
	for (const char *item = list; item;) {
		const char *comma = strchr(item, ',');
		size_t len = comma ? (size_t)(comma - item) : strlen(item);
		const char *eq = memchr(item, '=', len);

		if (!eq || eq == item)
			return fail(err, size, "'%s': expected KEY=VALUE, got '%.*s'", whole,
			            (int)len, item);
		if (visit(opaque, item, (size_t)(eq - item), eq + 1, len - (size_t)(eq - item) - 1,
		          err, size) < 0)
			return -1;
		item = comma ? comma + 1 : NULL;
	}
	return 0;
}

struct profile_parse {
	const char *whole;
	struct guest_profile *profile;
	bool given[GUEST_PAGE_CLASSES];
	bool pool_given;
};

static bool key_is(const char *key, size_t len, const char *name)
{
	return strlen(name) == len && memcmp(key, name, len) == 0;
}

static int visit_share(void *opaque, const char *key, size_t key_len, const char *value,
                       size_t value_len, char *err, size_t size)
{
	struct profile_parse *pp = opaque;

	if (key_is(key, key_len, "pool")) {
		if (pp->pool_given)
			return fail(err, size, "'%s': pool is given twice", pp->whole);
		pp->pool_given = true;
		pp->profile->synthetic = key_is(value, value_len, "synthetic");
		if (pp->profile->synthetic || key_is(value, value_len, "system"))
			return 0;
		return fail(err, size, "'%s': pool: expected system or synthetic, got '%.*s'",
		            pp->whole, (int)value_len, value);
	}
	for (int k = 0; k < GUEST_PAGE_CLASSES; k++) {
		if (!key_is(key, key_len, class_names[k]))
			continue;
		if (pp->given[k])
			return fail(err, size, "'%s': %s is given twice", pp->whole,
			            class_names[k]);
		if (parse_percent(value, value_len, &pp->profile->share[k]) < 0)
			return fail(err, size,
			            "'%s': %s: expected a percentage from 0 to 100, got '%.*s'",
			            pp->whole, class_names[k], (int)value_len, value);
		pp->given[k] = true;
		return 0;
	}
	return fail(err, size,
	            "'%s': unknown key '%.*s' (expected zero, code, text, random or pool)",
	            pp->whole, (int)key_len, key);
}

/* The shares not given take what is left, in the defaults' proportions. */
static int complete_shares(struct profile_parse *pp, char *err, size_t size)
{
	static const double defaults[GUEST_PAGE_CLASSES] = {
	        [GUEST_PAGE_ZERO] = GUEST_MIXED_ZERO,
	        [GUEST_PAGE_RANDOM] = GUEST_MIXED_RANDOM,
	        [GUEST_PAGE_CODE] = GUEST_MIXED_CODE,
	        [GUEST_PAGE_TEXT] = GUEST_MIXED_TEXT,
	};
	double *share = pp->profile->share;
	double given = 0, open = 0;
	bool all = true;

	for (int k = 0; k < GUEST_PAGE_CLASSES; k++) {
		if (pp->given[k])
			given += share[k];
		else
			open += defaults[k];
		all = all && pp->given[k];
	}
	if (given > 100.0 + 1e-9 || (all && fabs(given - 100.0) > 1e-9))
		return fail(err, size, "'%s': the shares add up to %g%%, expected 100", pp->whole,
		            given);
	for (int k = 0; k < GUEST_PAGE_CLASSES; k++)
		if (!pp->given[k])
			share[k] = (100.0 - given) * defaults[k] / open;
	return 0;
}

int guest_profile_parse(const char *text, double zero_fraction, struct guest_profile *out,
                        char *err, size_t err_size)
{
	struct profile_parse pp = {.whole = text, .profile = out};

	memset(out, 0, sizeof(*out));
	if (strcmp(text, "random") == 0) {
		out->kind = GUEST_CONTENT_RANDOM;
		out->share[GUEST_PAGE_ZERO] = zero_fraction * 100.0;
		out->share[GUEST_PAGE_RANDOM] = 100.0 - out->share[GUEST_PAGE_ZERO];
		return 0;
	}
	if (strcmp(text, "zero") == 0) {
		out->kind = GUEST_CONTENT_ZERO;
		out->share[GUEST_PAGE_ZERO] = 100.0;
		return 0;
	}
	if (strncmp(text, "mixed", 5) != 0 || (text[5] != '\0' && text[5] != ':'))
		return fail(err, err_size,
		            "expected random, zero or mixed[:zero=Z,code=C,text=T,random=R,"
		            "pool=system|synthetic], got '%s'",
		            text);
	out->kind = GUEST_CONTENT_MIXED;
	if (text[5] == ':' && parse_list(text, text + 6, visit_share, &pp, err, err_size) < 0)
		return -1;
	return complete_shares(&pp, err, err_size);
}

void guest_profile_format(const struct guest_profile *p, char *buf, size_t size)
{
	size_t len;

	if (p->kind == GUEST_CONTENT_ZERO) {
		snprintf(buf, size, "zero");
		return;
	}
	if (p->kind == GUEST_CONTENT_RANDOM) {
		snprintf(buf, size, "random:zero=%.4g", p->share[GUEST_PAGE_ZERO]);
		return;
	}
	len = (size_t)snprintf(buf, size, "mixed");
	for (int i = 0; i < GUEST_PAGE_CLASSES && len < size; i++) {
		enum guest_page_class k = print_order[i];

		len += (size_t)snprintf(buf + len, size - len, "%s%s=%.4g", i ? "," : ":",
		                        class_names[k], p->share[k]);
	}
	if (p->synthetic && len < size)
		snprintf(buf + len, size - len, ",pool=synthetic");
}

struct pattern_parse {
	const char *whole;
	struct guest_dirty_pattern *pattern;
	bool set_given, share_given;
};

static int visit_pattern(void *opaque, const char *key, size_t key_len, const char *value,
                         size_t value_len, char *err, size_t size)
{
	struct pattern_parse *pp = opaque;
	bool set = key_is(key, key_len, "set");
	bool *given = set ? &pp->set_given : &pp->share_given;
	double *target = set ? &pp->pattern->set_percent : &pp->pattern->share_percent;

	if (!set && !key_is(key, key_len, "share"))
		return fail(err, size, "'%s': unknown key '%.*s' (expected set or share)",
		            pp->whole, (int)key_len, key);
	if (*given)
		return fail(err, size, "'%s': %s is given twice", pp->whole, set ? "set" : "share");
	*given = true;
	if (parse_percent(value, value_len, target) < 0 || (set && *target <= 0.0))
		return fail(err, size, "'%s': %s: expected a percentage from %s to 100, got '%.*s'",
		            pp->whole, set ? "set" : "share", set ? "above 0" : "0", (int)value_len,
		            value);
	return 0;
}

int guest_dirty_pattern_parse(const char *text, struct guest_dirty_pattern *out, char *err,
                              size_t err_size)
{
	struct pattern_parse pp = {.whole = text, .pattern = out};

	memset(out, 0, sizeof(*out));
	if (strcmp(text, "uniform") == 0)
		return 0;
	if (strncmp(text, "hot", 3) != 0 || (text[3] != '\0' && text[3] != ':'))
		return fail(err, err_size, "expected uniform or hot[:set=S,share=W], got '%s'",
		            text);
	out->hot = true;
	out->set_percent = GUEST_HOT_SET;
	out->share_percent = GUEST_HOT_SHARE;
	if (text[3] == ':')
		return parse_list(text, text + 4, visit_pattern, &pp, err, err_size);
	return 0;
}

void guest_dirty_pattern_format(const struct guest_dirty_pattern *p, char *buf, size_t size)
{
	if (!p || !p->hot)
		snprintf(buf, size, "uniform");
	else
		snprintf(buf, size, "hot:set=%.4g,share=%.4g", p->set_percent, p->share_percent);
}

/* ---- Content ------------------------------------------------------------ */

/* A running guest's writes: random and zero guests write their one kind
 * of page; a mixed guest draws each write's class by the shares, so that
 * its RAM keeps the mix it started with. */
static void set_write_cuts(struct guest_content *c)
{
	double cumulative = 0;
	int last = -1;

	for (int k = 0; k < GUEST_PAGE_CLASSES; k++) {
		double share = c->profile.share[k];

		if (c->profile.kind == GUEST_CONTENT_RANDOM)
			share = k == GUEST_PAGE_RANDOM ? 100.0 : 0.0;
		cumulative += share;
		c->write_cut[k] = (uint64_t)llround(cumulative / 100.0 * (double)TWO_TO_32);
		if (share > 0)
			last = k;
	}
	for (int k = last < 0 ? 0 : last; k < GUEST_PAGE_CLASSES; k++)
		c->write_cut[k] = TWO_TO_32;
}

void guest_content_random(struct guest_content *c, double zero_fraction)
{
	memset(c, 0, sizeof(*c));
	c->profile.kind = GUEST_CONTENT_RANDOM;
	c->profile.share[GUEST_PAGE_ZERO] = zero_fraction * 100.0;
	c->profile.share[GUEST_PAGE_RANDOM] = 100.0 - c->profile.share[GUEST_PAGE_ZERO];
	set_write_cuts(c);
}

int guest_content_load(struct guest_content *c, const struct guest_profile *profile, char *err,
                       size_t err_size)
{
	memset(c, 0, sizeof(*c));
	c->profile = *profile;
	set_write_cuts(c);
	if (profile->kind != GUEST_CONTENT_MIXED)
		return 0;
	if ((profile->share[GUEST_PAGE_CODE] > 0 &&
	     guest_pool_load_code(&c->pool[GUEST_PAGE_CODE], GUEST_CODE_POOL_BYTES,
	                          profile->synthetic) < 0) ||
	    (profile->share[GUEST_PAGE_TEXT] > 0 &&
	     guest_pool_load_text(&c->pool[GUEST_PAGE_TEXT], GUEST_TEXT_POOL_BYTES,
	                          profile->synthetic) < 0)) {
		guest_content_free(c);
		return fail(err, err_size, "loading the content's pools: %s", strerror(ENOMEM));
	}
	c->digest = UINT64_C(0xcbf29ce484222325);
	for (int k = 0; k < GUEST_PAGE_CLASSES; k++) {
		const struct guest_pool *pool = &c->pool[k];

		c->digest ^= guest_checksum(pool->bytes, pool->npages * GUEST_PAGE_SIZE);
		c->digest *= UINT64_C(0x100000001b3);
	}
	return 0;
}

void guest_content_free(struct guest_content *c)
{
	if (!c)
		return;
	for (int k = 0; k < GUEST_PAGE_CLASSES; k++)
		guest_pool_free(&c->pool[k]);
}

/* ---- Pages -------------------------------------------------------------- */

uint64_t guest_recipe(enum guest_page_class cls, bool rewrite, uint64_t variation)
{
	return (uint64_t)cls << 62 | (rewrite ? REWRITE_BIT : 0) | (variation & VARIATION_MASK);
}

enum guest_page_class guest_recipe_class(uint64_t recipe)
{
	return (enum guest_page_class)(recipe >> 62);
}

uint64_t guest_content_pool_page(const struct guest_content *c, uint64_t recipe)
{
	const struct guest_pool *pool = &c->pool[guest_recipe_class(recipe)];

	return (uint64_t)(((unsigned __int128)((recipe & VARIATION_MASK) << 3) * pool->npages) >>
	                  64);
}

static void random_page(uint64_t *words, uint64_t state)
{
	for (size_t i = 0; i < WORDS_PER_PAGE; i++)
		words[i] = guest_random(&state);
}

void guest_content_page(const struct guest_content *c, void *page, uint64_t recipe)
{
	enum guest_page_class cls = guest_recipe_class(recipe);
	const struct guest_pool *pool;
	uint64_t rng = recipe;

	/* Without a content, every state is a random page (the tests' guest). */
	if (!c || cls == GUEST_PAGE_RANDOM ||
	    (c->profile.kind != GUEST_CONTENT_MIXED && cls != GUEST_PAGE_ZERO)) {
		random_page(page, recipe);
		return;
	}
	pool = &c->pool[cls];
	if (cls == GUEST_PAGE_ZERO || !pool->npages) {
		memset(page, 0, GUEST_PAGE_SIZE);
		return;
	}
	memcpy(page, pool->bytes + guest_content_pool_page(c, recipe) * GUEST_PAGE_SIZE,
	       GUEST_PAGE_SIZE);
	if (!(recipe & REWRITE_BIT))
		return;
	/* A few words changed, each to a word from elsewhere in the pool:
	 * what a running guest does to a page of data or text. */
	uint64_t edits = 1 + guest_random(&rng) % MAX_EDITS;
	uint64_t pool_words = pool->npages * WORDS_PER_PAGE;
	for (uint64_t i = 0; i < edits; i++) {
		uint64_t at = guest_random_below(&rng, WORDS_PER_PAGE);
		uint64_t from = guest_random_below(&rng, pool_words);

		memcpy((uint8_t *)page + at * sizeof(uint64_t),
		       pool->bytes + from * sizeof(uint64_t), sizeof(uint64_t));
	}
}

void guest_page_pattern(const struct guest_content *c, void *page, uint64_t state)
{
	guest_content_page(c, page, state);
}

uint64_t guest_content_rewrite(const struct guest_content *c, uint64_t *rng)
{
	uint64_t draw, variation;
	int k = 0;

	if (!c)
		return guest_random(rng);
	draw = guest_random(rng) >> 32;
	variation = guest_random(rng);
	while (k < GUEST_PAGE_CLASSES - 1 && draw >= c->write_cut[k])
		k++;
	return guest_recipe((enum guest_page_class)k, true, variation);
}

/* ---- The initial image -------------------------------------------------- */

void guest_fill_begin(struct guest_fill *f, const struct guest_content *c, uint64_t pages,
                      uint64_t seed)
{
	double rest[GUEST_PAGE_CLASSES];
	uint64_t placed = 0;

	memset(f, 0, sizeof(*f));
	f->pages_left = pages;
	f->place_rng = seed;
	f->page_rng = seed ^ UINT64_C(0x6a09e667f3bcc909);
	/* Largest remainder: each class gets its share rounded, and the
	 * counts add up to the pages; ties go to the class listed first. */
	for (int k = 0; k < GUEST_PAGE_CLASSES; k++) {
		double exact = c->profile.share[k] / 100.0 * (double)pages;

		f->left[k] = (uint64_t)floor(exact);
		if (f->left[k] > pages - placed)
			f->left[k] = pages - placed;
		rest[k] = exact - (double)f->left[k];
		placed += f->left[k];
	}
	while (placed < pages) {
		int best = 0;

		for (int k = 1; k < GUEST_PAGE_CLASSES; k++)
			if (rest[k] > rest[best])
				best = k;
		f->left[best]++;
		rest[best] = -1.0;
		placed++;
	}
}

uint64_t guest_fill_next(struct guest_fill *f)
{
	/* Selection sampling: the page gets class k with probability
	 * left[k] / pages_left, which places exactly left[k] of each. */
	uint64_t draw = guest_random_below(&f->place_rng, f->pages_left);
	uint64_t variation = guest_random(&f->page_rng);
	int k = 0;

	while (k < GUEST_PAGE_CLASSES - 1 && draw >= f->left[k])
		draw -= f->left[k++];
	f->left[k]--;
	f->made[k]++;
	f->pages_left--;
	return guest_recipe((enum guest_page_class)k, false, variation);
}

void guest_content_fill(const struct guest_content *c, struct guest_ram *ram, uint64_t seed,
                        uint64_t made[GUEST_PAGE_CLASSES])
{
	uint64_t pages = ram->bytes / GUEST_PAGE_SIZE;
	struct guest_fill f;

	guest_fill_begin(&f, c, pages, seed);
	for (uint64_t p = 0; p < pages; p++) {
		uint64_t recipe = guest_fill_next(&f);

		/* The RAM starts zeroed: a zero page is left untouched. */
		if (guest_recipe_class(recipe) != GUEST_PAGE_ZERO)
			guest_content_page(c, ram->base + p * GUEST_PAGE_SIZE, recipe);
	}
	if (made)
		memcpy(made, f.made, sizeof(f.made));
}

static int write_all(int fd, const uint8_t *data, size_t length)
{
	while (length > 0) {
		ssize_t n = write(fd, data, length);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return n < 0 ? -errno : -EIO;
		data += n;
		length -= (size_t)n;
	}
	return 0;
}

int guest_content_write_image(const struct guest_content *c, uint64_t bytes, uint64_t seed, int fd)
{
	uint64_t pages = bytes / GUEST_PAGE_SIZE, done = 0;
	uint8_t *buf = malloc((size_t)IMAGE_BUFFER_PAGES * GUEST_PAGE_SIZE);
	struct guest_fill f;
	int rc = 0;

	if (!buf)
		return -ENOMEM;
	guest_fill_begin(&f, c, pages, seed);
	while (rc == 0 && done < pages) {
		uint64_t n = pages - done < IMAGE_BUFFER_PAGES ? pages - done : IMAGE_BUFFER_PAGES;

		for (uint64_t i = 0; i < n; i++)
			guest_content_page(c, buf + i * GUEST_PAGE_SIZE, guest_fill_next(&f));
		rc = write_all(fd, buf, (size_t)(n * GUEST_PAGE_SIZE));
		done += n;
	}
	free(buf);
	return rc;
}

/* ---- The hot set -------------------------------------------------------- */

static uint64_t gcd(uint64_t a, uint64_t b)
{
	while (b) {
		uint64_t t = a % b;
		a = b;
		b = t;
	}
	return a;
}

/* The inverse of a mod m (gcd(a, m) = 1), by the extended Euclid. */
static uint64_t inverse_mod(uint64_t a, uint64_t m)
{
	__int128 t = 0, new_t = 1, r = m, new_r = a % m;

	while (new_r != 0) {
		__int128 q = r / new_r, tmp;

		tmp = t - q * new_t;
		t = new_t;
		new_t = tmp;
		tmp = r - q * new_r;
		r = new_r;
		new_r = tmp;
	}
	return (uint64_t)(t < 0 ? t + m : t) % m;
}

void guest_hot_set_init(struct guest_hot_set *h, const struct guest_dirty_pattern *p,
                        uint64_t pages, uint64_t seed)
{
	uint64_t rng = seed ^ UINT64_C(0x3c6ef372fe94f82b);

	memset(h, 0, sizeof(*h));
	h->pages = pages;
	if (!p || !p->hot || pages == 0)
		return;
	h->hot = (uint64_t)llround(p->set_percent / 100.0 * (double)pages);
	h->hot = h->hot < 1 ? 1 : h->hot > pages ? pages : h->hot;
	h->share = (uint64_t)llround(p->share_percent / 100.0 * (double)TWO_TO_32);
	/* A stride near the golden section of the set, prime to its size:
	 * consecutive pages of the order land far apart, evenly. */
	h->stride = ((uint64_t)((double)pages * 0.6180339887498949) | 1) % pages;
	while (pages > 1 && (h->stride == 0 || gcd(h->stride, pages) != 1))
		h->stride = (h->stride + 1) % pages;
	h->inverse = inverse_mod(h->stride, pages);
	h->offset = guest_random(&rng) % pages;
}

static uint64_t hot_order(const struct guest_hot_set *h, uint64_t i)
{
	return (uint64_t)(((unsigned __int128)i * h->stride + h->offset) % h->pages);
}

bool guest_hot_set_contains(const struct guest_hot_set *h, uint64_t page)
{
	uint64_t shifted = (page + h->pages - h->offset % h->pages) % h->pages;

	return (uint64_t)(((unsigned __int128)shifted * h->inverse) % h->pages) < h->hot;
}

uint64_t guest_hot_set_next(const struct guest_hot_set *h, uint64_t *rng)
{
	bool hot = h->hot == h->pages || (guest_random(rng) >> 32) < h->share;

	if (hot)
		return hot_order(h, guest_random_below(rng, h->hot));
	return hot_order(h, h->hot + guest_random_below(rng, h->pages - h->hot));
}
