/* What the synthetic guest's RAM holds (--content of lmt-bench): a profile
 * of page classes (zero, random, code, text) with their shares, the pools
 * that code and text pages are taken from, and every page as a function of
 * a 64-bit recipe, so that two processes that load the same content build
 * the same bytes. Also the dirty pattern (--dirty-pattern): which pages of
 * the working set a running guest rewrites. Test support, not installed. */
#ifndef LMT_TESTS_GUEST_CONTENT_H
#define LMT_TESTS_GUEST_CONTENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "guest.h"

enum guest_page_class {
	GUEST_PAGE_ZERO,
	GUEST_PAGE_RANDOM,
	GUEST_PAGE_CODE,
	GUEST_PAGE_TEXT,
	GUEST_PAGE_CLASSES
};

enum guest_content_kind { GUEST_CONTENT_RANDOM, GUEST_CONTENT_ZERO, GUEST_CONTENT_MIXED };

/* mixed's default shares, in percent: a zstd ratio of about 2-3x, as real
 * guests give (docs/benchmarks.md, "The guest's content"). */
#define GUEST_MIXED_ZERO 25.0
#define GUEST_MIXED_CODE 35.0
#define GUEST_MIXED_TEXT 25.0
#define GUEST_MIXED_RANDOM 15.0

/* The pools code and text pages come from. */
#define GUEST_CODE_POOL_BYTES (UINT64_C(16) << 20)
#define GUEST_TEXT_POOL_BYTES (UINT64_C(8) << 20)
/* A text pool is the first 16 KiB of each text file, one after another. */
#define GUEST_TEXT_BYTES_PER_FILE 16384u

struct guest_profile {
	enum guest_content_kind kind;
	double share[GUEST_PAGE_CLASSES]; /* percent of the pages, adding up to 100 */
	bool synthetic;                   /* mixed: pool=synthetic, never the machine's files */
};

/* "random", "zero", "mixed" or "mixed:zero=Z,code=C,text=T,random=R,pool=system|synthetic"
 * (shares in percent; those not given share what is left in the
 * proportions of the defaults). `zero_fraction` is random's share of zero
 * pages. 0, or -1 with `err` saying what is wrong. */
int guest_profile_parse(const char *text, double zero_fraction, struct guest_profile *out,
                        char *err, size_t err_size);
/* "mixed:zero=25,code=35,text=25,random=15" (random: "random:zero=10"). */
void guest_profile_format(const struct guest_profile *profile, char *buf, size_t size);
const char *guest_page_class_name(enum guest_page_class cls);

/* A pool of whole pages: from the machine's files, or synthetic. */
struct guest_pool {
	uint8_t *bytes;
	uint64_t npages;
	bool synthetic;
	char source[256]; /* where the pages came from, for the output */
	/* From files: per page, its file (an index into paths) and offset.
	 * A text page may run over into the next file: its start is given. */
	uint32_t *file;
	uint64_t *offset;
	char **paths;
	uint32_t npaths;
};

/* A profile with its pools loaded. */
struct guest_content {
	struct guest_profile profile;
	struct guest_pool pool[GUEST_PAGE_CLASSES]; /* code and text only */
	uint64_t write_cut[GUEST_PAGE_CLASSES];     /* a write's class: cumulative, of 2^32 */
	uint64_t digest;                            /* of the pools, to compare two machines */
};

/* Load `profile`'s pools (mixed: from the machine's ELF files under /usr/bin
 * and /usr/lib/<multiarch> and its text files under /usr/share, sorted by
 * name, or synthetic when too few are found or pool=synthetic). 0, or -1
 * with `err` filled (out of memory). Free with guest_content_free. */
int guest_content_load(struct guest_content *content, const struct guest_profile *profile,
                       char *err, size_t err_size);
/* random with `zero_fraction` of zero pages: needs no pools and cannot fail. */
void guest_content_random(struct guest_content *content, double zero_fraction);
void guest_content_free(struct guest_content *content);

/* ---- Pages from recipes ------------------------------------------------- */

/* A recipe: the class in the top two bits, bit 61 set for a rewrite by the
 * running guest, the rest the page's own variation. */
uint64_t guest_recipe(enum guest_page_class cls, bool rewrite, uint64_t variation);
enum guest_page_class guest_recipe_class(uint64_t recipe);
/* The page a recipe stands for: zero; 512 splitmix64 words from the recipe;
 * a pool page (a rewrite: with 1 to 8 of its 8-byte words replaced by
 * words from elsewhere in the same pool). */
void guest_content_page(const struct guest_content *content, void *page, uint64_t recipe);
/* For a code or text recipe, the pool page it starts from. */
uint64_t guest_content_pool_page(const struct guest_content *content, uint64_t recipe);
/* What a running guest writes next: a recipe drawn by the profile's shares
 * (random: always a random page, zero: always a zero page). */
uint64_t guest_content_rewrite(const struct guest_content *content, uint64_t *rng);

/* ---- The initial image -------------------------------------------------- */

/* The recipes of a guest's pages in order: exactly round(share * pages)
 * pages of each class (largest remainder), placed uniformly at random by
 * the seed. */
struct guest_fill {
	uint64_t pages_left;
	uint64_t left[GUEST_PAGE_CLASSES];
	uint64_t made[GUEST_PAGE_CLASSES];
	uint64_t place_rng;
	uint64_t page_rng;
};

void guest_fill_begin(struct guest_fill *fill, const struct guest_content *content, uint64_t pages,
                      uint64_t seed);
/* The next page's recipe; call once per page. */
uint64_t guest_fill_next(struct guest_fill *fill);
/* Fill zero-filled RAM; `made` (may be NULL) gets the pages of each class. */
void guest_content_fill(const struct guest_content *content, struct guest_ram *ram, uint64_t seed,
                        uint64_t made[GUEST_PAGE_CLASSES]);
/* Write the same image to `fd`: 0, or -errno. */
int guest_content_write_image(const struct guest_content *content, uint64_t bytes, uint64_t seed,
                              int fd);

/* ---- Which pages a running guest rewrites ------------------------------- */

struct guest_dirty_pattern {
	bool hot;             /* false: uniform, the working set page after page */
	double set_percent;   /* hot: the hot set, of the working set's pages */
	double share_percent; /* hot: of the writes, those that go to the hot set */
};

#define GUEST_HOT_SET 5.0
#define GUEST_HOT_SHARE 90.0

/* "uniform", "hot" or "hot:set=S,share=W" (percent). 0, or -1 with `err`. */
int guest_dirty_pattern_parse(const char *text, struct guest_dirty_pattern *out, char *err,
                              size_t err_size);
void guest_dirty_pattern_format(const struct guest_dirty_pattern *pattern, char *buf, size_t size);

/* A hot set over a working set of `pages`: `hot` pages spread evenly over
 * it by a bijection, order(i) = (i * stride + offset) mod pages, the first
 * `hot` of that order being the hot set. */
struct guest_hot_set {
	uint64_t pages;
	uint64_t hot;
	uint64_t stride;
	uint64_t offset;
	uint64_t inverse; /* of stride, mod pages */
	uint64_t share;   /* of 2^32 */
};

void guest_hot_set_init(struct guest_hot_set *set, const struct guest_dirty_pattern *pattern,
                        uint64_t pages, uint64_t seed);
bool guest_hot_set_contains(const struct guest_hot_set *set, uint64_t page);
/* The page the next write goes to. */
uint64_t guest_hot_set_next(const struct guest_hot_set *set, uint64_t *rng);

#endif
