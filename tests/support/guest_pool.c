/* The pools of a mixed guest (see guest_pool.h): code pages from the
 * machine's ELF files, text from its plain-text files, each list sorted by
 * name with strcmp (not the locale) so that every process reads the same
 * pages; when a pool cannot be filled, synthetic code or text instead. */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "guest_pool.h"

#define CODE_PAGES_PER_FILE 32u /* spread over the file */
#define FILES_PER_ROOT 20000u   /* listed at most, before any is read */
#define TEXT_DEPTH 8
#define MAX_ROOTS 4
#define SYNTHETIC_SEED UINT64_C(0x1bd11bdaa9fc1a22) /* the same pool on every machine */

#if defined(__x86_64__)
#define MULTIARCH "/usr/lib/x86_64-linux-gnu"
#elif defined(__aarch64__)
#define MULTIARCH "/usr/lib/aarch64-linux-gnu"
#else
#define MULTIARCH "/usr/lib"
#endif

static const char *const code_roots[] = {"/usr/bin", MULTIARCH};
static const char *const text_roots[] = {"/usr/share/doc", "/usr/share/common-licenses",
                                         "/usr/share/perl5"};
#define NROOTS(a) (sizeof(a) / sizeof((a)[0]))

/* ---- File lists --------------------------------------------------------- */

struct names {
	char **items;
	size_t count;
	size_t cap;
};

static int names_add(struct names *n, char *name)
{
	if (!name)
		return -1;
	if (n->count == n->cap) {
		size_t cap = n->cap ? n->cap * 2 : 64;
		char **items = realloc(n->items, cap * sizeof(*items));

		if (!items) {
			free(name);
			return -1;
		}
		n->items = items;
		n->cap = cap;
	}
	n->items[n->count++] = name;
	return 0;
}

static void names_free(struct names *n)
{
	for (size_t i = 0; i < n->count; i++)
		free(n->items[i]);
	free(n->items);
	memset(n, 0, sizeof(*n));
}

static int by_name(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The entries of `dir` (not . and ..), sorted; an unreadable directory
 * has none. -1 when out of memory. */
static int list_dir(const char *dir, struct names *out)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int rc = 0;

	memset(out, 0, sizeof(*out));
	if (!d)
		return 0;
	while (rc == 0 && (e = readdir(d)) != NULL) {
		if (e->d_name[0] != '.')
			rc = names_add(out, strdup(e->d_name));
	}
	closedir(d);
	if (out->count)
		qsort(out->items, out->count, sizeof(*out->items), by_name);
	return rc;
}

static char *join(const char *dir, const char *name)
{
	char *path;

	return asprintf(&path, "%s/%s", dir, name) < 0 ? NULL : path;
}

/* Regular files under `dir` (symbolic links are not followed), depth
 * first in sorted order, at most `max`. */
static int walk(const char *dir, int depth, bool recurse, struct names *files, size_t max)
{
	struct names entries;
	int rc = list_dir(dir, &entries);

	for (size_t i = 0; rc == 0 && i < entries.count && files->count < max; i++) {
		char *path = join(dir, entries.items[i]);
		struct stat st;

		if (!path) {
			rc = -1;
		} else if (lstat(path, &st) < 0) {
			/* gone since it was listed: not part of the pool */
		} else if (S_ISREG(st.st_mode)) {
			rc = names_add(files, path);
			path = NULL;
		} else if (recurse && depth > 0 && S_ISDIR(st.st_mode)) {
			rc = walk(path, depth - 1, recurse, files, max);
		}
		free(path);
	}
	names_free(&entries);
	return rc;
}

/* Every root's files, taken in turn: the first of each, the second... */
static int interleave(const char *const *roots, size_t nroots, bool recurse, struct names *out)
{
	struct names lists[MAX_ROOTS] = {{0}};
	int rc = 0;

	memset(out, 0, sizeof(*out));
	if (nroots > MAX_ROOTS)
		return -1;
	for (size_t r = 0; r < nroots && rc == 0; r++)
		rc = walk(roots[r], TEXT_DEPTH, recurse, &lists[r], FILES_PER_ROOT);
	for (size_t i = 0; rc == 0; i++) {
		bool any = false;

		for (size_t r = 0; r < nroots && rc == 0; r++) {
			if (i >= lists[r].count)
				continue;
			any = true;
			rc = names_add(out, lists[r].items[i]);
			lists[r].items[i] = NULL;
		}
		if (!any)
			break;
	}
	for (size_t r = 0; r < nroots; r++)
		names_free(&lists[r]);
	return rc;
}

static void describe_roots(char *buf, size_t size, const char *const *roots, size_t nroots)
{
	size_t len = 0;

	buf[0] = '\0';
	for (size_t r = 0; r < nroots && len < size; r++)
		len += (size_t)snprintf(buf + len, size - len, "%s%s", r ? ", " : "", roots[r]);
}

/* ---- The pool ----------------------------------------------------------- */

static int pool_alloc(struct guest_pool *pool, uint64_t bytes, bool provenance)
{
	memset(pool, 0, sizeof(*pool));
	pool->npages = bytes / GUEST_PAGE_SIZE;
	pool->bytes = calloc(pool->npages, GUEST_PAGE_SIZE);
	if (provenance) {
		pool->file = calloc(pool->npages, sizeof(*pool->file));
		pool->offset = calloc(pool->npages, sizeof(*pool->offset));
	}
	if (!pool->bytes || (provenance && (!pool->file || !pool->offset))) {
		guest_pool_free(pool);
		return -1;
	}
	return 0;
}

/* The files that gave pages keep their names, for guest_pool's users. */
static int keep_paths(struct guest_pool *pool, struct names *files, uint32_t used)
{
	pool->paths = files->items;
	pool->npaths = used;
	for (size_t i = used; i < files->count; i++)
		free(files->items[i]);
	memset(files, 0, sizeof(*files));
	return 0;
}

void guest_pool_free(struct guest_pool *pool)
{
	for (uint32_t i = 0; i < pool->npaths; i++)
		free(pool->paths[i]);
	free(pool->paths);
	free(pool->bytes);
	free(pool->file);
	free(pool->offset);
	memset(pool, 0, sizeof(*pool));
}

static bool all_zero(const uint8_t *p, size_t n)
{
	return n == 0 || (p[0] == 0 && memcmp(p, p + 1, n - 1) == 0);
}

/* Up to CODE_PAGES_PER_FILE pages of an ELF file, spread over it, into
 * the pool from page *filled on. Returns whether the file gave any. */
static bool take_code(struct guest_pool *pool, const char *path, uint32_t index, uint64_t *filled)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	unsigned char magic[4];
	struct stat st;
	bool took = false;

	if (fd < 0)
		return false;
	if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && pread(fd, magic, 4, 0) == 4 &&
	    memcmp(magic, "\177ELF", 4) == 0) {
		uint64_t pages = (uint64_t)st.st_size / GUEST_PAGE_SIZE;
		uint64_t take = pages < CODE_PAGES_PER_FILE ? pages : CODE_PAGES_PER_FILE;

		for (uint64_t j = 0; j < take && *filled < pool->npages; j++) {
			uint64_t at = j * pages / take * GUEST_PAGE_SIZE;
			uint8_t *page = pool->bytes + *filled * GUEST_PAGE_SIZE;

			if (pread(fd, page, GUEST_PAGE_SIZE, (off_t)at) != GUEST_PAGE_SIZE ||
			    all_zero(page, GUEST_PAGE_SIZE))
				continue;
			pool->file[*filled] = index;
			pool->offset[*filled] = at;
			(*filled)++;
			took = true;
		}
	}
	close(fd);
	return took;
}

/* Text: no NUL, and at most 1 % control characters besides tab, newline,
 * carriage return and form feed (bytes from 0x80 up are UTF-8). */
static bool is_text(const uint8_t *p, size_t n)
{
	size_t bad = 0;

	for (size_t i = 0; i < n; i++) {
		if (p[i] == 0)
			return false;
		bad += (p[i] < 0x20 && !strchr("\t\n\r\f", p[i])) || p[i] == 0x7f;
	}
	return n > 0 && bad * 100 <= n;
}

/* The first GUEST_TEXT_BYTES_PER_FILE of a text file, appended to the pool's
 * stream at *filled (in bytes). Returns whether the file gave any. */
static bool take_text(struct guest_pool *pool, const char *path, uint32_t index, uint64_t *filled)
{
	uint8_t buf[GUEST_TEXT_BYTES_PER_FILE];
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	uint64_t room = pool->npages * GUEST_PAGE_SIZE - *filled;
	ssize_t n;

	if (fd < 0)
		return false;
	n = pread(fd, buf, sizeof(buf), 0);
	close(fd);
	if (n <= 0 || !is_text(buf, (size_t)n))
		return false;
	if ((uint64_t)n > room)
		n = (ssize_t)room;
	/* Each page that starts in this file notes where. */
	uint64_t first = (*filled + GUEST_PAGE_SIZE - 1) / GUEST_PAGE_SIZE * GUEST_PAGE_SIZE;
	for (uint64_t at = first; at < *filled + (uint64_t)n; at += GUEST_PAGE_SIZE) {
		pool->file[at / GUEST_PAGE_SIZE] = index;
		pool->offset[at / GUEST_PAGE_SIZE] = at - *filled;
	}
	memcpy(pool->bytes + *filled, buf, (size_t)n);
	*filled += (uint64_t)n;
	return true;
}

typedef bool (*take_fn)(struct guest_pool *pool, const char *path, uint32_t index,
                        uint64_t *filled);
typedef int (*synthesize_fn)(uint8_t *out, uint64_t bytes, uint64_t seed);

struct pool_kind {
	const char *what; /* "ELF files", "text files" */
	const char *const *roots;
	size_t nroots;
	bool recurse;
	take_fn take;
	uint64_t unit; /* what `filled` counts: pages or bytes */
	synthesize_fn synthesize;
	const char *synthetic_what;
};

static int load(struct guest_pool *pool, uint64_t bytes, bool synthetic, const struct pool_kind *k)
{
	char roots[160];
	struct names files;
	uint64_t filled = 0, want = bytes / k->unit;
	uint32_t used = 0;

	describe_roots(roots, sizeof(roots), k->roots, k->nroots);
	if (!synthetic) {
		if (pool_alloc(pool, bytes, true) < 0 ||
		    interleave(k->roots, k->nroots, k->recurse, &files) < 0) {
			guest_pool_free(pool);
			return -1;
		}
		/* The names of the files that gave pages move to the front. */
		for (size_t i = 0; i < files.count && filled < want; i++) {
			if (!k->take(pool, files.items[i], used, &filled))
				continue;
			char *name = files.items[i];
			files.items[i] = files.items[used];
			files.items[used++] = name;
		}
		if (filled == want) {
			snprintf(pool->source, sizeof(pool->source), "%llu pages of %u %s under %s",
			         (unsigned long long)pool->npages, (unsigned)used, k->what, roots);
			return keep_paths(pool, &files, used);
		}
		names_free(&files);
		guest_pool_free(pool);
	}
	if (pool_alloc(pool, bytes, false) < 0 ||
	    k->synthesize(pool->bytes, pool->npages * GUEST_PAGE_SIZE, SYNTHETIC_SEED) < 0) {
		guest_pool_free(pool);
		return -1;
	}
	pool->synthetic = true;
	if (synthetic)
		snprintf(pool->source, sizeof(pool->source),
		         "%llu pages of synthetic %s (pool=synthetic)",
		         (unsigned long long)pool->npages, k->synthetic_what);
	else
		snprintf(pool->source, sizeof(pool->source),
		         "%llu pages of synthetic %s: only %llu of the %llu KiB wanted were found "
		         "in %s under %s",
		         (unsigned long long)pool->npages, k->synthetic_what,
		         (unsigned long long)(filled * k->unit / 1024),
		         (unsigned long long)(bytes / 1024), k->what, roots);
	return 0;
}

int guest_pool_load_code_from(struct guest_pool *pool, uint64_t bytes, bool synthetic,
                              const char *const *roots, size_t nroots)
{
	const struct pool_kind code = {.what = "ELF files",
	                               .roots = roots,
	                               .nroots = nroots,
	                               .take = take_code,
	                               .unit = GUEST_PAGE_SIZE,
	                               .synthesize = guest_synthetic_code,
	                               .synthetic_what = "machine code"};

	return load(pool, bytes, synthetic, &code);
}

int guest_pool_load_text_from(struct guest_pool *pool, uint64_t bytes, bool synthetic,
                              const char *const *roots, size_t nroots)
{
	const struct pool_kind text = {.what = "text files",
	                               .roots = roots,
	                               .nroots = nroots,
	                               .recurse = true,
	                               .take = take_text,
	                               .unit = 1,
	                               .synthesize = guest_synthetic_text,
	                               .synthetic_what = "English-like text"};

	return load(pool, bytes, synthetic, &text);
}

int guest_pool_load_code(struct guest_pool *pool, uint64_t bytes, bool synthetic)
{
	return guest_pool_load_code_from(pool, bytes, synthetic, code_roots, NROOTS(code_roots));
}

int guest_pool_load_text(struct guest_pool *pool, uint64_t bytes, bool synthetic)
{
	return guest_pool_load_text_from(pool, bytes, synthetic, text_roots, NROOTS(text_roots));
}
