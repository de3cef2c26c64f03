/* The userfaultfd layer on its own (core/uffd.c), without files or
 * sessions: placement once per page and its counts, a fault handed to
 * fetch once and answered from it, failure that keeps placed pages and
 * makes the rest inaccessible, the refusal where userfaultfd cannot be
 * opened (an unprivileged child) or may not be (userfaultfd=off), a memfd written in place with holes in its file, and huge
 * pages (hugetlbfs, shared and private), which have no UFFDIO_ZEROPAGE.
 * Exits 77 where it cannot be opened at all. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "hugepages.h"
#include "uffd.h"

#define PAGE 4096u
#define PAGES 64u

static uint8_t *map_range(void)
{
	uint8_t *p = mmap(NULL, PAGES * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
	                  -1, 0);
	assert_true(p != MAP_FAILED);
	return p;
}

/* What fetch saw, and a page of `fill` it places at once. */
struct fetcher {
	struct lmt__uffd *u;
	_Atomic int calls;
	_Atomic uint64_t last_page;
	uint8_t fill;
};

static void fetch_and_place(void *opaque, uint32_t range, uint64_t page)
{
	struct fetcher *f = opaque;
	uint8_t buf[PAGE];
	memset(buf, f->fill, sizeof(buf));
	atomic_store(&f->last_page, page);
	atomic_fetch_add(&f->calls, 1);
	usleep(2000); /* a latency to measure */
	assert_int_equal(lmt__uffd_copy(f->u, range, page, 1, buf, LMT_UFFD_FAULT, NULL), 0);
}

static struct lmt__uffd *open_on(uint8_t *host, struct fetcher *f)
{
	struct lmt_error err = {0};
	struct lmt__uffd *u = NULL;
	if (lmt__uffd_open(&u, 1, true, &err) ||
	    lmt__uffd_register(u, 0, host, PAGES * PAGE, 12, &err))
		fail_msg("userfaultfd: %s", err.message);
	f->u = u;
	assert_int_equal(lmt__uffd_start(u, fetch_and_place, f, &err), 0);
	return u;
}

static void test_each_page_is_placed_once_and_counted_once(void **unused)
{
	uint8_t *host = map_range();
	struct fetcher f = {.fill = 0x11};
	struct lmt__uffd *u = open_on(host, &f);
	uint8_t *a = malloc(32 * PAGE), *b = malloc(32 * PAGE);
	memset(a, 0xaa, 32 * PAGE);
	memset(b, 0xbb, 32 * PAGE);
	assert_int_equal(lmt__uffd_missing(u), PAGES);
	assert_int_equal(lmt__uffd_copy(u, 0, 0, 32, a, LMT_UFFD_BACKGROUND, NULL), 0);
	/* Pages 16-31 are there already: only 32-47 come from b. */
	assert_int_equal(lmt__uffd_copy(u, 0, 16, 32, b, LMT_UFFD_FAULT, NULL), 0);
	assert_int_equal(lmt__uffd_zero(u, 0, 40, 24, LMT_UFFD_BACKGROUND, NULL), 0);
	assert_int_equal(host[20 * PAGE], 0xaa);
	assert_int_equal(host[40 * PAGE], 0xbb);
	assert_int_equal(host[50 * PAGE], 0);
	struct lmt__uffd_stats st;
	lmt__uffd_stats(u, &st);
	assert_int_equal(st.background_pages, 32 + 16);
	assert_int_equal(st.fault_pages, 16);
	assert_int_equal(st.missing, 0);
	assert_int_equal(st.faults, 0);
	assert_int_equal(atomic_load(&f.calls), 0);
	lmt__uffd_close(u);
	free(a);
	free(b);
	munmap(host, PAGES * PAGE);
}

struct toucher {
	const uint8_t *page;
	uint8_t seen;
};

static void *touch_page(void *arg)
{
	struct toucher *t = arg;
	t->seen = *(const volatile uint8_t *)t->page;
	return NULL;
}

static void test_a_fault_is_fetched_once_and_its_waiter_gets_the_page(void **unused)
{
	uint8_t *host = map_range();
	struct fetcher f = {.fill = 0x5c};
	struct lmt__uffd *u = open_on(host, &f);
	struct toucher t[2] = {{.page = host + 9 * PAGE + 100}, {.page = host + 9 * PAGE + 7}};
	pthread_t threads[2];
	for (int i = 0; i < 2; i++)
		assert_int_equal(pthread_create(&threads[i], NULL, touch_page, &t[i]), 0);
	for (int i = 0; i < 2; i++)
		assert_int_equal(pthread_join(threads[i], NULL), 0);
	assert_int_equal(t[0].seen, 0x5c);
	assert_int_equal(t[1].seen, 0x5c);
	assert_int_equal(atomic_load(&f.calls), 1);
	assert_int_equal(atomic_load(&f.last_page), 9);
	struct lmt__uffd_stats st;
	lmt__uffd_stats(u, &st);
	assert_true(st.faults >= 1);
	assert_int_equal(st.fault_pages, 1);
	assert_int_equal(st.missing, PAGES - 1);
	assert_true(st.fault_p50_ns >= 2000000 && st.fault_max_ns >= st.fault_p99_ns);
	lmt__uffd_close(u);
	munmap(host, PAGES * PAGE);
}

static sigjmp_buf *volatile segv_jump;

static void on_segv(int sig)
{
	(void)sig;
	siglongjmp(*segv_jump, 1);
}

/* Whether reading `p` raises SIGSEGV. */
static bool faults(const uint8_t *p)
{
	sigjmp_buf jump;
	struct sigaction sa = {.sa_handler = on_segv, .sa_flags = SA_NODEFER}, old;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGSEGV, &sa, &old);
	segv_jump = &jump;
	bool hit = sigsetjmp(jump, 1) != 0;
	if (!hit)
		(void)*(const volatile uint8_t *)p;
	sigaction(SIGSEGV, &old, NULL);
	return hit;
}

static void test_failure_keeps_placed_pages_and_makes_the_rest_inaccessible(void **unused)
{
	uint8_t *host = map_range();
	struct fetcher f = {.fill = 1};
	struct lmt__uffd *u = open_on(host, &f);
	uint8_t page[PAGE];
	memset(page, 0x77, sizeof(page));
	assert_int_equal(lmt__uffd_copy(u, 0, 3, 1, page, LMT_UFFD_BACKGROUND, NULL), 0);
	lmt__uffd_fail(u);
	struct lmt_error err = {0};
	assert_int_equal(lmt__uffd_copy(u, 0, 4, 1, page, LMT_UFFD_BACKGROUND, &err),
	                 -LMT_ECANCELED);
	assert_int_equal(host[3 * PAGE], 0x77);
	assert_true(faults(host + 4 * PAGE));
	assert_true(faults(host + 63 * PAGE));
	assert_int_equal(atomic_load(&f.calls), 0);
	lmt__uffd_close(u);
	munmap(host, PAGES * PAGE);
}

/* userfaultfd=off: refused without trying, saying so. */
static void test_open_is_refused_without_trying_where_the_session_forbids_it(void **unused)
{
	struct lmt_error err = {0};
	struct lmt__uffd *u = (struct lmt__uffd *)1;
	assert_int_equal(lmt__uffd_open(&u, 1, false, &err), -LMT_ENOTSUP);
	assert_null(u);
	assert_string_equal(err.message,
	                    "userfaultfd is not available: userfaultfd=off (this side may not use "
	                    "it)");
}

/* The refusal of a process that may not open one: a child of this one
 * (root) that became the unprivileged user nobody. */
static void test_open_is_refused_with_the_reason_where_not_permitted(void **unused)
{
	if (geteuid() != 0) {
		print_message("skipped: only root can run a child as another user here\n");
		skip();
	}
	int p[2];
	assert_int_equal(pipe(p), 0);
	char message[sizeof(((struct lmt_error *)0)->message)] = "";
	fflush(NULL);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		close(p[0]);
		if (setresgid(65534, 65534, 65534) || setresuid(65534, 65534, 65534))
			_exit(2);
		struct lmt_error err = {0};
		struct lmt__uffd *u = (struct lmt__uffd *)1;
		int rc = lmt__uffd_open(&u, 1, true, &err);
		if (rc == 0)
			_exit(3);
		ssize_t n = write(p[1], err.message, strlen(err.message) + 1);
		_exit(rc == -LMT_ENOTSUP && u == NULL && n > 0 ? 0 : 1);
	}
	close(p[1]);
	ssize_t n = read(p[0], message, sizeof(message) - 1);
	message[n > 0 ? n : 0] = '\0';
	close(p[0]);
	int status = 0;
	assert_int_equal(waitpid(pid, &status, 0), pid);
	int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
	if (code == 3) {
		print_message("skipped: every user may open a userfaultfd here "
		              "(vm.unprivileged_userfaultfd=1, or /dev/userfaultfd open to all)\n");
		skip();
	}
	if (code != 0)
		fail_msg("the unprivileged child ended with %d: %s", code, message);
	assert_non_null(strstr(message, "userfaultfd is not available"));
	assert_non_null(strstr(message, "vm.unprivileged_userfaultfd"));
	print_message("    refused: %s\n", message);
}

static void test_shared_memory_is_refused(void **unused)
{
	struct lmt_error err = {0};
	struct lmt__uffd *u = NULL;
	uint8_t *p =
	        mmap(NULL, PAGES * PAGE, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	assert_true(p != MAP_FAILED);
	memset(p, 1, PAGES * PAGE);
	assert_int_equal(lmt__uffd_open(&u, 1, true, &err), 0);
	assert_int_equal(lmt__uffd_register(u, 0, p, PAGES * PAGE, 12, &err), -LMT_EINVAL);
	assert_non_null(strstr(err.message, "private anonymous"));
	lmt__uffd_close(u);
	munmap(p, PAGES * PAGE);
}

/* A memfd block written in place (postcopy): its coming pages are
 * written through a second mapping of the file and mapped with
 * UFFDIO_CONTINUE. Holes in the file among the coming pages and among the
 * guest's own must read right: a coming hole waits for its page (the
 * kernel would otherwise map a zero page of its own), an own hole reads
 * as zero, and neither asks the source for anything. */
#define IN_PLACE_PAGES 1024u /* 4 MiB: two page tables */
#define OWN_HOLE 10u
#define COMING_HOLE 20u
#define COMING_DATA 30u
#define OWN_DATA 40u

struct in_place {
	struct lmt__uffd *u;
	uint8_t *alias;
	_Atomic int calls;
	_Atomic uint64_t asked; /* a bit per page asked for, of the first 64 */
};

static void fetch_in_place(void *opaque, uint32_t range, uint64_t page)
{
	struct in_place *f = opaque;
	atomic_fetch_add(&f->calls, 1);
	if (page < 64)
		atomic_fetch_or(&f->asked, 1ull << page);
	memset(f->alias + page * PAGE, 0xc0 + (int)(page % 16), PAGE);
	assert_int_equal(lmt__uffd_continue(f->u, range, page, 1, LMT_UFFD_FAULT, NULL), 0);
}

static void check_in_place(bool aligned)
{
	const size_t len = (size_t)IN_PLACE_PAGES * PAGE, table = 2u << 20;
	int fd = memfd_create("lmt-test-in-place", MFD_CLOEXEC);
	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, (off_t)len), 0);
	/* The guest's mapping on a 2 MiB boundary (moved aside at once) or
	 * a page off one (the coming pages dropped from it instead). */
	uint8_t *area = mmap(NULL, len + 2 * table, PROT_NONE,
	                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	assert_true(area != MAP_FAILED);
	uint8_t *at = (uint8_t *)(((uintptr_t)area + table - 1) & ~(uintptr_t)(table - 1));
	if (!aligned)
		at += PAGE;
	uint8_t *host = mmap(at, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
	assert_true(host == at);
	for (uint32_t p = 0; p < IN_PLACE_PAGES; p++)
		if (p != OWN_HOLE && p != COMING_HOLE)
			memset(host + (size_t)p * PAGE, 0xd0, PAGE);
	struct in_place f = {.alias = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)};
	assert_true(f.alias != MAP_FAILED);
	uint64_t coming[IN_PLACE_PAGES / 64] = {0};
	coming[0] = 1ull << COMING_HOLE | 1ull << COMING_DATA;

	struct lmt_error err = {0};
	assert_int_equal(lmt__uffd_open(&f.u, 1, true, &err), 0);
	if (!lmt__uffd_can_place_in_place(f.u, false)) {
		lmt__uffd_close(f.u);
		printf("no minor faults on shared memory in this kernel: in-place not checked\n");
		skip();
	}
	if (lmt__uffd_register_moved(f.u, 0, host, len, 12, coming, true, &err))
		fail_msg("userfaultfd: %s", err.message);
	assert_int_equal(lmt__uffd_start(f.u, fetch_in_place, &f, &err), 0);
	/* Moved aside, every page is missing until put back or placed. */
	assert_int_equal(lmt__uffd_missing(f.u), aligned ? IN_PLACE_PAGES : 2);
	assert_int_equal(lmt__uffd_next_coming(f.u, 0, 0), COMING_HOLE);
	assert_int_equal(lmt__uffd_next_coming(f.u, 0, COMING_HOLE + 1), COMING_DATA);
	assert_int_equal(lmt__uffd_next_coming(f.u, 0, COMING_DATA + 1), IN_PLACE_PAGES);

	assert_int_equal(*(volatile uint8_t *)(host + OWN_DATA * PAGE + 5), 0xd0);
	assert_int_equal(*(volatile uint8_t *)(host + OWN_HOLE * PAGE + 5), 0);
	assert_int_equal(*(volatile uint8_t *)(host + COMING_HOLE * PAGE + 5),
	                 0xc0 + COMING_HOLE % 16);
	assert_int_equal(*(volatile uint8_t *)(host + COMING_DATA * PAGE + 5),
	                 0xc0 + COMING_DATA % 16);
	assert_int_equal(atomic_load(&f.calls), 2);
	assert_int_equal(atomic_load(&f.asked), 1ull << COMING_HOLE | 1ull << COMING_DATA);
	assert_int_equal(lmt__uffd_next_coming(f.u, 0, 0), IN_PLACE_PAGES);
	/* Every own page back, the hole still reading as zero and writable. */
	while ((lmt__uffd_settle(f.u, 512, &err)) > 0)
		;
	assert_int_equal(lmt__uffd_missing(f.u), 0);
	host[OWN_HOLE * PAGE] = 0x77;
	assert_int_equal(f.alias[OWN_HOLE * PAGE], 0x77);
	for (uint32_t p = 0; p < IN_PLACE_PAGES; p++) {
		uint8_t want = p == OWN_HOLE || p == COMING_HOLE || p == COMING_DATA
		                       ? host[(size_t)p * PAGE]
		                       : 0xd0;
		assert_int_equal(host[(size_t)p * PAGE + PAGE - 1], p == OWN_HOLE ? 0 : want);
	}
	assert_int_equal(atomic_load(&f.calls), 2);
	lmt__uffd_close(f.u);
	munmap(f.alias, len);
	munmap(area, len + 2 * table);
	close(fd);
}

static void test_a_memfd_written_in_place_with_holes_moved_aside(void **unused)
{
	check_in_place(true);
}

static void test_a_memfd_written_in_place_with_holes_off_boundaries(void **unused)
{
	check_in_place(false);
}

/* ---- huge pages ---- */

#define HUGE HUGE_PAGE_SIZE
#define HUGE_SHIFT 21
#define HUGE_PAGES 4u

/* Huge pages for one test: taken, or the test is skipped saying why. */
static void take_huge_pages(uint64_t pages)
{
	char why[256];
	if (!huge_pages_take(pages, why, sizeof(why))) {
		printf("huge pages not checked: %s\n", why);
		skip();
	}
}

/* Where a huge page is fetched: into the second mapping of a hugetlbfs
 * file (in place), or copied from a buffer (private huge pages). */
struct huge_fetcher {
	struct lmt__uffd *u;
	uint8_t *alias; /* NULL: copied */
	uint8_t *buf;
	_Atomic int calls;
	_Atomic uint64_t asked;
};

static void fetch_huge(void *opaque, uint32_t range, uint64_t page)
{
	struct huge_fetcher *f = opaque;
	atomic_fetch_add(&f->calls, 1);
	atomic_fetch_or(&f->asked, 1ull << page);
	uint8_t fill = (uint8_t)(0xc0 + page);
	if (f->alias) {
		memset(f->alias + page * HUGE, fill, HUGE);
		assert_int_equal(lmt__uffd_continue(f->u, range, page, 1, LMT_UFFD_FAULT, NULL), 0);
	} else {
		memset(f->buf, fill, HUGE);
		assert_int_equal(lmt__uffd_copy(f->u, range, page, 1, f->buf, LMT_UFFD_FAULT, NULL),
		                 0);
	}
}

/* A hugetlbfs file written in place: page 0 the guest's own, 1 an own
 * hole, 2 a coming hole, 3 coming with stale data. The kernel cannot
 * move huge pages aside (mremap refuses), so the coming ones leave the
 * mapping; the own hole is zeroed by a copy, hugetlbfs having no
 * UFFDIO_ZEROPAGE. */
static void test_a_hugetlbfs_file_written_in_place_with_holes(void **unused)
{
	(void)unused;
	take_huge_pages(HUGE_PAGES);
	const size_t len = (size_t)HUGE_PAGES * HUGE;
	int fd = memfd_create("lmt-test-huge", MFD_CLOEXEC | MFD_HUGETLB | MFD_HUGE_2MB);
	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, (off_t)len), 0);
	uint8_t *host = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	assert_true(host != MAP_FAILED);
	memset(host, 0xd0, HUGE);
	memset(host + 3 * HUGE, 0xd3, HUGE);
	struct huge_fetcher f = {.alias = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)};
	assert_true(f.alias != MAP_FAILED);
	uint64_t coming[1] = {1ull << 2 | 1ull << 3};
	struct lmt_error err = {0};
	assert_int_equal(lmt__uffd_open(&f.u, 1, true, &err), 0);
	if (!lmt__uffd_can_place_in_place(f.u, true)) {
		lmt__uffd_close(f.u);
		munmap(f.alias, len);
		munmap(host, len);
		close(fd);
		huge_pages_return();
		printf("no minor faults on hugetlbfs in this kernel: in-place not checked\n");
		skip();
	}
	if (lmt__uffd_register_moved(f.u, 0, host, len, HUGE_SHIFT, coming, true, &err))
		fail_msg("userfaultfd: %s", err.message);
	assert_int_equal(lmt__uffd_start(f.u, fetch_huge, &f, &err), 0);
	assert_int_equal(lmt__uffd_missing(f.u), 2);
	assert_int_equal(lmt__uffd_next_coming(f.u, 0, 0), 2);
	assert_int_equal(*(volatile uint8_t *)(host + 5), 0xd0);
	assert_int_equal(*(volatile uint8_t *)(host + HUGE + 5), 0);
	assert_int_equal(*(volatile uint8_t *)(host + 2 * HUGE + HUGE - 1), 0xc2);
	assert_int_equal(*(volatile uint8_t *)(host + 3 * HUGE + 7), 0xc3);
	assert_int_equal(atomic_load(&f.calls), 2);
	assert_int_equal(atomic_load(&f.asked), 1ull << 2 | 1ull << 3);
	assert_int_equal(lmt__uffd_missing(f.u), 0);
	/* The own hole is a page of the file now, and writable. */
	host[HUGE + 9] = 0x77;
	assert_int_equal(f.alias[HUGE + 9], 0x77);
	assert_int_equal(f.alias[HUGE + HUGE - 1], 0);
	lmt__uffd_close(f.u);
	munmap(f.alias, len);
	munmap(host, len);
	close(fd);
	huge_pages_return();
}

/* Private huge pages (MAP_HUGETLB) placed by copy: page 0 the guest's
 * own, 1 never written (zero on touch), 2 coming (fetched), 3 coming and
 * zeroed from the background; then a failure fences nothing placed. */
static void test_private_huge_pages_are_copied_and_zeroed(void **unused)
{
	(void)unused;
	take_huge_pages(HUGE_PAGES + 1);
	const size_t len = (size_t)HUGE_PAGES * HUGE;
	uint8_t *host = mmap(NULL, len, PROT_READ | PROT_WRITE,
	                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB | MAP_HUGE_2MB, -1, 0);
	assert_true(host != MAP_FAILED);
	/* A lazy restore (lmt__uffd_register) refuses huge pages, saying so
	 * (on a page of its own: closing fences the pages it left missing). */
	struct lmt_error err = {0};
	struct lmt__uffd *lazy = NULL;
	uint8_t *other = mmap(NULL, HUGE, PROT_READ | PROT_WRITE,
	                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB | MAP_HUGE_2MB, -1, 0);
	assert_true(other != MAP_FAILED);
	assert_int_equal(lmt__uffd_open(&lazy, 1, true, &err), 0);
	assert_int_equal(lmt__uffd_register(lazy, 0, other, HUGE, HUGE_SHIFT, &err), -LMT_EINVAL);
	assert_non_null(strstr(err.message, "range 0 is of huge pages (hugetlbfs)"));
	lmt__uffd_close(lazy);
	munmap(other, HUGE);
	memset(host, 0xd0, HUGE);
	memset(host + 2 * HUGE, 0xd2, 2 * HUGE);
	struct huge_fetcher f = {.buf = malloc(HUGE)};
	assert_non_null(f.buf);
	uint64_t coming[1] = {1ull << 2 | 1ull << 3};
	assert_int_equal(lmt__uffd_open(&f.u, 1, true, &err), 0);
	if (lmt__uffd_register_moved(f.u, 0, host, len, HUGE_SHIFT, coming, false, &err))
		fail_msg("userfaultfd: %s", err.message);
	assert_int_equal(lmt__uffd_start(f.u, fetch_huge, &f, &err), 0);
	assert_int_equal(lmt__uffd_missing(f.u), 2);
	assert_int_equal(lmt__uffd_zero(f.u, 0, 3, 1, LMT_UFFD_BACKGROUND, &err), 0);
	assert_int_equal(lmt__uffd_missing(f.u), 1);
	assert_int_equal(*(volatile uint8_t *)(host + 5), 0xd0);
	assert_int_equal(*(volatile uint8_t *)(host + HUGE + HUGE - 1), 0);
	assert_int_equal(*(volatile uint8_t *)(host + 2 * HUGE + 3), 0xc2);
	assert_int_equal(*(volatile uint8_t *)(host + 3 * HUGE + 3), 0);
	assert_int_equal(atomic_load(&f.calls), 1);
	assert_int_equal(atomic_load(&f.asked), 1ull << 2);
	assert_int_equal(lmt__uffd_missing(f.u), 0);
	host[HUGE] = 0x55;
	assert_int_equal(host[HUGE], 0x55);
	struct lmt__uffd_stats st;
	lmt__uffd_stats(f.u, &st);
	assert_int_equal(st.fault_pages, 1);
	assert_int_equal(st.background_pages, 1);
	lmt__uffd_close(f.u);
	free(f.buf);
	munmap(host, len);
	huge_pages_return();
}

int main(void)
{
	int fd = open("/dev/userfaultfd", O_RDWR | O_CLOEXEC);
	if (fd < 0)
		fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC);
	if (fd < 0) {
		printf("SKIP: userfaultfd cannot be opened here (%s)\n", strerror(errno));
		return 77;
	}
	close(fd);
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_each_page_is_placed_once_and_counted_once),
	        cmocka_unit_test(test_a_fault_is_fetched_once_and_its_waiter_gets_the_page),
	        cmocka_unit_test(test_failure_keeps_placed_pages_and_makes_the_rest_inaccessible),
	        cmocka_unit_test(test_open_is_refused_without_trying_where_the_session_forbids_it),
	        cmocka_unit_test(test_open_is_refused_with_the_reason_where_not_permitted),
	        cmocka_unit_test(test_shared_memory_is_refused),
	        cmocka_unit_test(test_a_memfd_written_in_place_with_holes_moved_aside),
	        cmocka_unit_test(test_a_memfd_written_in_place_with_holes_off_boundaries),
	        cmocka_unit_test(test_a_hugetlbfs_file_written_in_place_with_holes),
	        cmocka_unit_test(test_private_huge_pages_are_copied_and_zeroed),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
