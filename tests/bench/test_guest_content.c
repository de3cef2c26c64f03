/* The synthetic guest's content and dirty pattern (tests/support/
 * guest_content.h): every content gives the same bytes in another process,
 * the shares are honoured within rounding, a mixed guest's pages are what
 * they claim, a running guest's writes look like its content and can be
 * rebuilt from its log, and a hot pattern puts its share of the writes on
 * its set. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "guest.h"
#include "guest_content.h"
#include "guest_pool.h"

#define PAGE GUEST_PAGE_SIZE
#define WORDS (PAGE / sizeof(uint64_t))

static const char *const contents[] = {"random", "zero", "mixed", "mixed:pool=synthetic",
                                       "mixed:zero=10,code=50,text=40,random=0"};

static void load(struct guest_content *c, const char *text, double zero_fraction)
{
	struct guest_profile profile;
	char err[256] = "";

	if (guest_profile_parse(text, zero_fraction, &profile, err, sizeof(err)) < 0)
		fail_msg("%s: %s", text, err);
	if (guest_content_load(c, &profile, err, sizeof(err)) < 0)
		fail_msg("%s: %s", text, err);
}

static uint8_t *ram_new(struct guest_ram *ram, uint64_t bytes)
{
	uint8_t *base =
	        mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	assert_true(base != MAP_FAILED);
	guest_ram_layout(ram, base, bytes);
	return base;
}

/* The checksum of `text`'s image of `bytes`, loaded and filled here. */
static uint64_t image_checksum(const char *text, uint64_t bytes, uint64_t seed, uint64_t *pools)
{
	struct guest_content c;
	struct guest_ram ram;
	uint8_t *base;
	uint64_t sum;

	load(&c, text, 0.25);
	base = ram_new(&ram, bytes);
	guest_content_fill(&c, &ram, seed, NULL);
	sum = guest_checksum(base, bytes);
	*pools = c.digest;
	munmap(base, bytes);
	guest_content_free(&c);
	return sum;
}

/* Another process reads the machine's files and builds the image anew:
 * both must come to the same bytes. */
static void test_every_content_builds_the_same_image_in_another_process(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(contents) / sizeof(contents[0]); i++) {
		uint64_t mine[2], theirs[2] = {0, 0};
		int fds[2];
		pid_t pid;

		assert_int_equal(pipe(fds), 0);
		pid = fork();
		assert_true(pid >= 0);
		if (pid == 0) {
			uint64_t msg[2];

			msg[0] = image_checksum(contents[i], 4u << 20, 7, &msg[1]);
			_exit(write(fds[1], msg, sizeof(msg)) == sizeof(msg) ? 0 : 1);
		}
		close(fds[1]);
		mine[0] = image_checksum(contents[i], 4u << 20, 7, &mine[1]);
		assert_int_equal(read(fds[0], theirs, sizeof(theirs)), sizeof(theirs));
		close(fds[0]);
		int status;
		assert_int_equal(waitpid(pid, &status, 0), pid);
		assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
		if (mine[0] != theirs[0] || mine[1] != theirs[1])
			fail_msg("%s: image %016llx / %016llx, pools %016llx / %016llx",
			         contents[i], (unsigned long long)mine[0],
			         (unsigned long long)theirs[0], (unsigned long long)mine[1],
			         (unsigned long long)theirs[1]);
	}
}

/* --content-file writes what lmt-bench fills its RAM with. */
static void test_image_file_holds_exactly_the_filled_ram(void **state)
{
	const uint64_t bytes = (3u << 20) + 5 * PAGE; /* not a whole buffer */
	(void)state;
	for (size_t i = 0; i < sizeof(contents) / sizeof(contents[0]); i++) {
		struct guest_content c;
		struct guest_ram ram;
		int fd = memfd_create("image", MFD_CLOEXEC);
		uint8_t *base, *file;

		load(&c, contents[i], 0.1);
		base = ram_new(&ram, bytes);
		guest_content_fill(&c, &ram, 3, NULL);
		assert_true(fd >= 0);
		assert_int_equal(guest_content_write_image(&c, bytes, 3, fd), 0);
		assert_int_equal(lseek(fd, 0, SEEK_END), (off_t)bytes);
		file = mmap(NULL, bytes, PROT_READ, MAP_SHARED, fd, 0);
		assert_true(file != MAP_FAILED);
		if (memcmp(file, base, bytes) != 0)
			fail_msg("%s: the image file differs from the filled RAM", contents[i]);
		munmap(file, bytes);
		munmap(base, bytes);
		close(fd);
		guest_content_free(&c);
	}
}

static bool page_is_zero(const uint8_t *p)
{
	for (size_t i = 0; i < PAGE; i++)
		if (p[i])
			return false;
	return true;
}

/* Each class has round(share * pages) pages, give or take the one that
 * rounding hands to the largest remainder, and the zero pages are exactly
 * those that read as zero. */
static void test_shares_are_honoured_within_rounding(void **state)
{
	static const char *const profiles[] = {"mixed",
	                                       "mixed:zero=33,code=33,text=33,random=1",
	                                       "mixed:zero=12.5,code=0.5",
	                                       "mixed:text=100",
	                                       "random",
	                                       "zero"};
	const uint64_t pages = 1001;
	(void)state;
	for (size_t i = 0; i < sizeof(profiles) / sizeof(profiles[0]); i++) {
		uint64_t made[GUEST_PAGE_CLASSES], total = 0, zero = 0;
		struct guest_content c;
		struct guest_ram ram;
		uint8_t *base;

		load(&c, profiles[i], 0.3333);
		base = ram_new(&ram, pages * PAGE);
		guest_content_fill(&c, &ram, 11, made);
		for (int k = 0; k < GUEST_PAGE_CLASSES; k++) {
			double exact = c.profile.share[k] / 100.0 * (double)pages;

			if (fabs((double)made[k] - exact) >= 1.0)
				fail_msg("%s: %llu %s pages for a share of %.4f", profiles[i],
				         (unsigned long long)made[k], guest_page_class_name(k),
				         exact);
			total += made[k];
		}
		assert_int_equal(total, pages);
		for (uint64_t p = 0; p < pages; p++)
			zero += page_is_zero(base + p * PAGE);
		assert_int_equal(zero, made[GUEST_PAGE_ZERO]);
		munmap(base, pages * PAGE);
		guest_content_free(&c);
	}
	/* The shares not given share the rest in the defaults' proportions. */
	struct guest_profile p;
	char err[256];
	assert_int_equal(guest_profile_parse("mixed:zero=40", 0, &p, err, sizeof(err)), 0);
	assert_true(fabs(p.share[GUEST_PAGE_CODE] - 28) < 1e-9 &&
	            fabs(p.share[GUEST_PAGE_TEXT] - 20) < 1e-9 &&
	            fabs(p.share[GUEST_PAGE_RANDOM] - 12) < 1e-9);
}

static bool is_text(const uint8_t *p, size_t n)
{
	size_t bad = 0;

	for (size_t i = 0; i < n; i++) {
		if (!p[i])
			return false;
		bad += (p[i] < 0x20 && !strchr("\t\n\r\f", p[i])) || p[i] == 0x7f;
	}
	return bad * 100 <= n;
}

static size_t distinct_bytes(const uint8_t *p)
{
	bool seen[256] = {false};
	size_t n = 0;

	for (size_t i = 0; i < PAGE; i++) {
		n += !seen[p[i]];
		seen[p[i]] = true;
	}
	return n;
}

/* `length` bytes of `path` at `offset` equal `want`. */
static void assert_file_holds(const char *path, uint64_t offset, const uint8_t *want, size_t length)
{
	uint8_t got[PAGE];
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		fail_msg("%s: cannot open it", path);
	assert_int_equal(pread(fd, got, length, (off_t)offset), (ssize_t)length);
	close(fd);
	if (memcmp(got, want, length) != 0)
		fail_msg("the page said to come from %s + %llu differs from it", path,
		         (unsigned long long)offset);
}

static void check_mixed_page(const struct guest_content *c, const uint8_t *page, uint64_t recipe)
{
	enum guest_page_class cls = guest_recipe_class(recipe);
	const struct guest_pool *pool = &c->pool[cls];
	uint64_t index;

	switch (cls) {
	case GUEST_PAGE_ZERO:
		assert_true(page_is_zero(page));
		return;
	case GUEST_PAGE_RANDOM:
		assert_true(distinct_bytes(page) > 200);
		return;
	case GUEST_PAGE_CODE:
		index = guest_content_pool_page(c, recipe);
		assert_int_equal(memcmp(page, pool->bytes + index * PAGE, PAGE), 0);
		if (!pool->synthetic)
			assert_file_holds(pool->paths[pool->file[index]], pool->offset[index], page,
			                  PAGE);
		assert_false(page_is_zero(page));
		return;
	case GUEST_PAGE_TEXT:
		index = guest_content_pool_page(c, recipe);
		assert_int_equal(memcmp(page, pool->bytes + index * PAGE, PAGE), 0);
		assert_true(is_text(page, PAGE));
		/* Its first bytes come from the file it names, up to the end of
		 * what the pool took of it. */
		if (!pool->synthetic) {
			const char *path = pool->paths[pool->file[index]];
			struct stat st;
			assert_int_equal(stat(path, &st), 0);
			uint64_t taken = (uint64_t)st.st_size < GUEST_TEXT_BYTES_PER_FILE
			                         ? (uint64_t)st.st_size
			                         : GUEST_TEXT_BYTES_PER_FILE;
			assert_true(pool->offset[index] < taken);
			assert_file_holds(path, pool->offset[index], page,
			                  (size_t)(taken - pool->offset[index]) < PAGE
			                          ? (size_t)(taken - pool->offset[index])
			                          : PAGE);
		}
		return;
	default:
		fail_msg("recipe %016llx has no class", (unsigned long long)recipe);
	}
}

/* Zero pages read zero, code pages are pages of the ELF files they name,
 * text pages are text from the files they name, random pages are not.
 * (On a machine without the files the pools are synthetic: the pages
 * are then checked against the pools alone, and the test says so.) */
static void test_mixed_pages_are_what_they_claim(void **state)
{
	const uint64_t pages = 2048;
	uint64_t seen[GUEST_PAGE_CLASSES] = {0};
	struct guest_content c;
	struct guest_ram ram;
	struct guest_fill fill;
	uint8_t *base;
	(void)state;

	load(&c, "mixed", 0);
	for (int k = GUEST_PAGE_CODE; k <= GUEST_PAGE_TEXT; k++)
		if (c.pool[k].synthetic)
			print_message("%s pool: %s; its pages are checked against it alone\n",
			              guest_page_class_name(k), c.pool[k].source);
	base = ram_new(&ram, pages * PAGE);
	guest_content_fill(&c, &ram, 5, NULL);
	guest_fill_begin(&fill, &c, pages, 5);
	for (uint64_t p = 0; p < pages; p++) {
		uint64_t recipe = guest_fill_next(&fill);

		check_mixed_page(&c, base + p * PAGE, recipe);
		seen[guest_recipe_class(recipe)]++;
	}
	for (int k = 0; k < GUEST_PAGE_CLASSES; k++)
		assert_true(seen[k] > 0);
	munmap(base, pages * PAGE);
	guest_content_free(&c);
}

/* The synthetic pools are text and machine-code-like too, and the same on
 * every machine (a fixed seed): their checksum is pinned here. */
static void test_synthetic_pools_are_text_and_code(void **state)
{
	struct guest_content c;
	(void)state;

	load(&c, "mixed:pool=synthetic", 0);
	const struct guest_pool *text = &c.pool[GUEST_PAGE_TEXT], *code = &c.pool[GUEST_PAGE_CODE];
	assert_true(text->synthetic && code->synthetic);
	for (uint64_t p = 0; p < text->npages; p++)
		assert_true(is_text(text->bytes + p * PAGE, PAGE));
	/* Functions start with endbr64 and end with ret. */
	size_t endbr = 0;
	for (uint64_t i = 0; i + 4 <= code->npages * PAGE; i += 16)
		endbr += memcmp(code->bytes + i, "\xf3\x0f\x1e\xfa", 4) == 0;
	assert_true(endbr > code->npages * 4);
	guest_content_free(&c);
}

static void write_file(const char *dir, const char *name, const void *data, size_t length)
{
	char path[512];
	int fd;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, data, length), (ssize_t)length);
	close(fd);
}

/* A pool reads its directories' files in the byte order of their names,
 * whatever order they were made in; when they hold too little it is
 * synthetic, and its source says how much was found. */
static void test_pools_read_files_in_name_order_or_fall_back_to_synthetic(void **state)
{
	const char *tmp = getenv("TMPDIR");
	char dir[400];
	const char *roots[1] = {dir};
	static char text[3][GUEST_TEXT_BYTES_PER_FILE];
	uint8_t elf[3 * PAGE];
	struct guest_pool pool;
	(void)state;

	snprintf(dir, sizeof(dir), "%s/lmt-guest-pool-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	assert_non_null(mkdtemp(dir));
	for (int i = 2; i >= 0; i--) {
		char name[16];

		memset(text[i], 'a' + i, sizeof(text[i]));
		snprintf(name, sizeof(name), "t%d.txt", i);
		write_file(dir, name, text[i], sizeof(text[i]));
	}
	write_file(dir, "binary.dat", "\0\1\2\3", 4);
	/* Three files of 16 KiB of text fill 48 KiB, in the names' order. */
	assert_int_equal(guest_pool_load_text_from(&pool, 48u << 10, false, roots, 1), 0);
	assert_false(pool.synthetic);
	assert_int_equal(pool.npaths, 3);
	for (int i = 0; i < 3; i++) {
		assert_true(strstr(pool.paths[i], "/t") != NULL);
		assert_int_equal(pool.bytes[(uint64_t)i * sizeof(text[0])], 'a' + i);
	}
	assert_int_equal(pool.file[5], 1);
	assert_int_equal(pool.offset[5], 4096);
	guest_pool_free(&pool);
	/* 64 KiB cannot be had from 48: synthetic, and said. */
	assert_int_equal(guest_pool_load_text_from(&pool, 64u << 10, false, roots, 1), 0);
	assert_true(pool.synthetic && is_text(pool.bytes, 64u << 10));
	if (!strstr(pool.source, "synthetic") || !strstr(pool.source, "only 48 of the 64 KiB"))
		fail_msg("the source says '%s'", pool.source);
	guest_pool_free(&pool);
	/* An ELF file of three pages, the last all zero: two code pages. */
	memset(elf, 0, sizeof(elf));
	memcpy(elf, "\177ELF", 4);
	memset(elf + PAGE, 0x90, PAGE);
	write_file(dir, "prog", elf, sizeof(elf));
	assert_int_equal(guest_pool_load_code_from(&pool, 2 * PAGE, false, roots, 1), 0);
	assert_false(pool.synthetic);
	assert_int_equal(pool.offset[0], 0);
	assert_int_equal(pool.offset[1], PAGE);
	assert_non_null(strstr(pool.paths[pool.file[1]], "/prog"));
	guest_pool_free(&pool);
	assert_int_equal(guest_pool_load_code_from(&pool, 3 * PAGE, false, roots, 1), 0);
	assert_true(pool.synthetic && strstr(pool.source, "only 8 of the 12 KiB"));
	guest_pool_free(&pool);
	static const char *const made[] = {"t0.txt", "t1.txt", "t2.txt", "binary.dat", "prog"};
	for (size_t i = 0; i < sizeof(made) / sizeof(made[0]); i++) {
		char path[512];

		snprintf(path, sizeof(path), "%s/%s", dir, made[i]);
		assert_int_equal(unlink(path), 0);
	}
	assert_int_equal(rmdir(dir), 0);
}

static size_t words_changed(const uint8_t *a, const uint8_t *b)
{
	size_t n = 0;

	for (size_t i = 0; i < WORDS; i++)
		n += memcmp(a + i * 8, b + i * 8, 8) != 0;
	return n;
}

/* A mixed guest's writes draw their class by the shares; a code or text
 * page written is a pool page with at most 8 words changed, and text
 * stays text. Random and zero guests write only their own kind. */
static void test_rewritten_pages_look_like_their_content(void **state)
{
	const unsigned draws = 20000;
	unsigned count[GUEST_PAGE_CLASSES] = {0};
	struct guest_content c;
	uint64_t rng = 99;
	uint8_t page[PAGE];
	(void)state;

	load(&c, "mixed", 0);
	for (unsigned i = 0; i < draws; i++) {
		uint64_t recipe = guest_content_rewrite(&c, &rng);
		enum guest_page_class cls = guest_recipe_class(recipe);

		count[cls]++;
		guest_page_pattern(&c, page, recipe);
		if (cls == GUEST_PAGE_ZERO) {
			assert_true(page_is_zero(page));
		} else if (cls == GUEST_PAGE_CODE || cls == GUEST_PAGE_TEXT) {
			const uint8_t *from =
			        c.pool[cls].bytes + guest_content_pool_page(&c, recipe) * PAGE;
			assert_true(words_changed(page, from) <= 8);
			if (cls == GUEST_PAGE_TEXT)
				assert_true(is_text(page, PAGE));
		}
	}
	for (int k = 0; k < GUEST_PAGE_CLASSES; k++) {
		double share = 100.0 * count[k] / draws;

		if (fabs(share - c.profile.share[k]) > 1.5)
			fail_msg("%.2f%% of the writes are %s, share %.2f%%", share,
			         guest_page_class_name(k), c.profile.share[k]);
	}
	guest_content_free(&c);
	load(&c, "random", 0.5);
	for (unsigned i = 0; i < 1000; i++)
		assert_int_equal(guest_recipe_class(guest_content_rewrite(&c, &rng)),
		                 GUEST_PAGE_RANDOM);
	guest_content_free(&c);
	load(&c, "zero", 0);
	for (unsigned i = 0; i < 1000; i++)
		assert_int_equal(guest_recipe_class(guest_content_rewrite(&c, &rng)),
		                 GUEST_PAGE_ZERO);
	guest_content_free(&c);
}

static void pattern(struct guest_dirty_pattern *p, const char *text)
{
	char err[256];

	if (guest_dirty_pattern_parse(text, p, err, sizeof(err)) < 0)
		fail_msg("%s: %s", text, err);
}

/* hot:set=S,share=W: exactly round(S% of the pages) are hot, W% of the
 * writes land on them, evenly, and the rest spread over the others. */
static void test_hot_pattern_concentrates_writes_as_its_parameters_say(void **state)
{
	static const struct {
		const char *text;
		uint64_t pages, hot;
	} cases[] = {{"hot", 10000, 500},
	             {"hot:set=5,share=90", 10007, 500},
	             {"hot:set=20,share=50", 4096, 819},
	             {"hot:set=100", 300, 300},
	             {"hot:set=1,share=0", 2000, 20},
	             {"hot:set=0.001", 1, 1}};
	const unsigned writes = 200000;
	uint32_t *count = calloc(10007, sizeof(*count));
	(void)state;

	assert_non_null(count);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct guest_dirty_pattern p;
		struct guest_hot_set set;
		uint64_t rng = 17, hot = 0, on_hot = 0, min_hot = UINT64_MAX, max_hot = 0;

		pattern(&p, cases[i].text);
		guest_hot_set_init(&set, &p, cases[i].pages, 3);
		memset(count, 0, 10007 * sizeof(*count));
		for (unsigned w = 0; w < writes; w++) {
			uint64_t page = guest_hot_set_next(&set, &rng);

			assert_true(page < cases[i].pages);
			count[page]++;
		}
		for (uint64_t pg = 0; pg < cases[i].pages; pg++) {
			if (!guest_hot_set_contains(&set, pg))
				continue;
			hot++;
			on_hot += count[pg];
			min_hot = count[pg] < min_hot ? count[pg] : min_hot;
			max_hot = count[pg] > max_hot ? count[pg] : max_hot;
		}
		assert_int_equal(hot, cases[i].hot);
		double share = hot == cases[i].pages ? 100.0 : p.share_percent;
		double got = 100.0 * (double)on_hot / writes;
		if (fabs(got - share) > 0.5)
			fail_msg("%s: %.2f%% of the writes on the hot set, expected %.4g%%",
			         cases[i].text, got, share);
		/* Every hot page is written about as often as the others. */
		double each = share / 100.0 * writes / (double)hot;
		if (share > 0 && (min_hot < each * 0.6 || max_hot > each * 1.4))
			fail_msg("%s: hot pages written %llu to %llu times, expected about %.0f",
			         cases[i].text, (unsigned long long)min_hot,
			         (unsigned long long)max_hot, each);
	}
	free(count);
}

/* The workload thread of a mixed guest with a hot pattern: its log counts
 * every write, rebuilds every page it wrote, and puts most on the set. */
static void test_workload_log_rebuilds_and_counts_every_write(void **state)
{
	const uint64_t bytes = 8u << 20, working_set = 4u << 20, pages = working_set / PAGE;
	struct guest_dirty_pattern p;
	struct guest_content c;
	struct guest_ram ram;
	struct guest_hot_set set;
	struct guest_workload *w;
	struct guest_write_log log = {calloc(pages, 8), calloc(pages, 1), calloc(pages, 4)};
	const struct timespec look = {0, 50 * 1000 * 1000};
	uint64_t counted = 0, on_hot = 0;
	uint8_t page[PAGE];
	(void)state;

	assert_true(log.state && log.written && log.count);
	load(&c, "mixed", 0);
	pattern(&p, "hot:set=10,share=80");
	uint8_t *base = ram_new(&ram, bytes);
	guest_content_fill(&c, &ram, 1, NULL);
	assert_int_equal(guest_ram_alloc_dirty(&ram), 0);
	const struct guest_workload_spec spec = {.working_set = working_set,
	                                         .rate = 32u << 20,
	                                         .seed = 8,
	                                         .content = &c,
	                                         .pattern = &p,
	                                         .log = &log};
	assert_int_equal(guest_workload_start_spec(&w, &ram, &spec), 0);
	/* Until the dirty bitmaps have shown at least 1500 writes (a page
	 * written twice between two looks counts once): however loaded the
	 * machine, the shares below are then measured on enough writes. */
	uint64_t seen = 0, *bitmap = calloc((ram.blocks[0].npages + 63) / 64, 8);
	assert_non_null(bitmap);
	for (int i = 0; i < 600 && seen < 1500; i++) {
		nanosleep(&look, NULL);
		memset(bitmap, 0, (ram.blocks[0].npages + 63) / 64 * 8);
		assert_int_equal(guest_dirty_sync(&ram, 0, bitmap, ram.blocks[0].npages), 0);
		for (uint64_t b = 0; b < (ram.blocks[0].npages + 63) / 64; b++)
			seen += (uint64_t)__builtin_popcountll(bitmap[b]);
	}
	free(bitmap);
	uint64_t written = guest_workload_stop(w) / PAGE;
	assert_true(seen >= 1500);
	guest_hot_set_init(&set, &p, pages, 8);
	for (uint64_t pg = 0; pg < pages; pg++) {
		counted += log.count[pg];
		on_hot += guest_hot_set_contains(&set, pg) ? log.count[pg] : 0;
		assert_int_equal(log.written[pg], log.count[pg] > 0);
		if (!log.written[pg])
			continue;
		guest_page_pattern(&c, page, log.state[pg]);
		if (memcmp(page, base + pg * PAGE, PAGE) != 0)
			fail_msg("page %llu does not match its logged recipe",
			         (unsigned long long)pg);
	}
	assert_int_equal(counted, written);
	assert_true(written >= seen);
	if (on_hot * 100 < counted * 70)
		fail_msg("%llu of %llu writes on a hot set that takes 80%%",
		         (unsigned long long)on_hot, (unsigned long long)counted);
	guest_ram_free_dirty(&ram);
	munmap(base, bytes);
	free(log.state);
	free(log.written);
	free(log.count);
	guest_content_free(&c);
}

static void expect_profile_error(const char *text, const char *needle)
{
	struct guest_profile p;
	char err[256] = "";

	assert_int_equal(guest_profile_parse(text, 0, &p, err, sizeof(err)), -1);
	if (!strstr(err, needle))
		fail_msg("'%s': the message '%s' does not say '%s'", text, err, needle);
}

static void expect_pattern_error(const char *text, const char *needle)
{
	struct guest_dirty_pattern p;
	char err[256] = "";

	assert_int_equal(guest_dirty_pattern_parse(text, &p, err, sizeof(err)), -1);
	if (!strstr(err, needle))
		fail_msg("'%s': the message '%s' does not say '%s'", text, err, needle);
}

static void test_bad_profiles_and_patterns_are_named(void **state)
{
	struct guest_profile p;
	struct guest_dirty_pattern d;
	char err[256], text[256];
	(void)state;

	expect_profile_error("ram", "expected random, zero or mixed");
	expect_profile_error("mixedup", "expected random, zero or mixed");
	expect_profile_error("mixed:", "nothing after ':'");
	expect_profile_error("mixed:zero", "expected KEY=VALUE, got 'zero'");
	expect_profile_error("mixed:zero=101", "zero: expected a percentage from 0 to 100");
	expect_profile_error("mixed:code=-1", "got '-1'");
	expect_profile_error("mixed:text=1e1", "got '1e1'");
	expect_profile_error("mixed:zero=60,code=60", "add up to 120%");
	expect_profile_error("mixed:zero=10,code=10,text=10,random=10", "add up to 40%");
	expect_profile_error("mixed:zero=10,zero=20", "zero is given twice");
	expect_profile_error("mixed:data=10", "unknown key 'data'");
	expect_profile_error("mixed:pool=disk", "pool: expected system or synthetic");
	expect_pattern_error("cold", "expected uniform or hot");
	expect_pattern_error("hot:set=0", "set: expected a percentage from above 0 to 100");
	expect_pattern_error("hot:share=200", "share: expected a percentage from 0 to 100");
	expect_pattern_error("hot:size=5", "unknown key 'size'");
	expect_pattern_error("hot:set=5,set=6", "set is given twice");
	/* What is printed parses back to the same. */
	assert_int_equal(guest_profile_parse("mixed:zero=40,pool=synthetic", 0, &p, err, 256), 0);
	guest_profile_format(&p, text, sizeof(text));
	assert_string_equal(text, "mixed:zero=40,code=28,text=20,random=12,pool=synthetic");
	assert_int_equal(guest_dirty_pattern_parse("hot:share=75", &d, err, sizeof(err)), 0);
	guest_dirty_pattern_format(&d, text, sizeof(text));
	assert_string_equal(text, "hot:set=5,share=75");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_every_content_builds_the_same_image_in_another_process),
	        cmocka_unit_test(test_image_file_holds_exactly_the_filled_ram),
	        cmocka_unit_test(test_shares_are_honoured_within_rounding),
	        cmocka_unit_test(test_mixed_pages_are_what_they_claim),
	        cmocka_unit_test(test_synthetic_pools_are_text_and_code),
	        cmocka_unit_test(test_pools_read_files_in_name_order_or_fall_back_to_synthetic),
	        cmocka_unit_test(test_rewritten_pages_look_like_their_content),
	        cmocka_unit_test(test_hot_pattern_concentrates_writes_as_its_parameters_say),
	        cmocka_unit_test(test_workload_log_rebuilds_and_counts_every_write),
	        cmocka_unit_test(test_bad_profiles_and_patterns_are_named),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
