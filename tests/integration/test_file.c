/* Saving a running guest to a file and restoring it (file:PATH, the file
 * plugin): bit for bit over 1, 2 and 4 channels with a dirtying guest, the
 * device state, verify, the file's size after many passes, its holes, and
 * the refusal of every damaged, foreign, truncated or unfinished file with
 * a message that says what is wrong. With LMT_TEST_FILE_DIRECT=1 the
 * round trips run with direct-io=on, or the test exits 77 where the test
 * directory's file system refuses O_DIRECT. Offsets into the file are the
 * ones docs/file-format.md documents. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>
#include <xxhash.h>

#include "harness.h"

/* 4106 pages: ram0 has 3079 and ram1 1027, neither a multiple of 64, so
 * each bitmap has bits past its block to forge. */
#define RAM_BYTES ((16ull << 20) + 40 * 1024)
#define ALIGN 4096u
/* docs/file-format.md */
#define H_VERSION 8
#define H_TABLE 40
#define H_TABLE_DIGEST 56
#define H_STATE 64
#define C_AT 4096u
#define C_BITMAPS 56
#define C_DIGESTS 64
#define SUM_AT 4088u
#define E_SIZE 128u
#define E_BITMAP 80
#define E_BITMAP_LEN 88
#define E_PAGES 96
#define E_DIGESTS 104

static char test_dir[512];
static const char *direct_opts = "direct-io=off";

static void path_for(char *buf, size_t size, const char *name)
{
	snprintf(buf, size, "%s/%s", test_dir, name);
}

/* opts for a session: the round trip's own, and direct-io. */
static const char *with_direct(char *buf, size_t size, const char *opts)
{
	snprintf(buf, size, "%s%s%s", direct_opts, opts && *opts ? "," : "", opts ? opts : "");
	return buf;
}

struct save_spec {
	const char *opts;
	uint64_t dirty_rate;
	uint64_t working_set;
	const void *state;
	size_t state_len;
	uint32_t min_passes; /* go on iterating until this many passes began */
};

struct save_result {
	int rc;
	char error[600];
	struct lmt_stats stats;
};

/* Save `ram` to `path` while the workload of `spec` dirties it; the
 * guest is paused (the workload stopped) when lmt_save_complete starts. */
static struct save_result save(struct guest_ram *ram, const char *path,
                               const struct save_spec *spec)
{
	struct save_result r = {0};
	char opts[512], uri[PATH_MAX + 8];
	lmt_session *s = session_on(LMT_ROLE_SOURCE, ram, "file",
	                            with_direct(opts, sizeof(opts), spec->opts));
	assert_int_equal(lmt_session_set_dirty_sync(s, guest_dirty_sync, ram), 0);
	struct guest_workload *w = NULL;
	if (spec->dirty_rate)
		assert_int_equal(
		        guest_workload_start(&w, ram, spec->working_set, spec->dirty_rate, 7), 0);
	snprintf(uri, sizeof(uri), "file:%s", path);
	r.rc = lmt_save_setup(s, uri);
	uint64_t give_up = guest_now_ns() + 60000000000ull;
	while (r.rc == 0) {
		struct lmt_iterate_result it;
		r.rc = lmt_save_iterate(s, &it);
		if (r.rc || (it.ready && it.pass >= spec->min_passes))
			break;
		if (guest_now_ns() > give_up)
			fail_msg("the save did not converge within 60 s");
	}
	guest_workload_pause(w);
	if (r.rc == 0)
		r.rc = lmt_save_complete(s, spec->state, spec->state_len);
	guest_workload_stop(w);
	snprintf(r.error, sizeof(r.error), "%s", lmt_session_error(s)->message);
	lmt_session_stats(s, &r.stats);
	lmt_session_free(s);
	return r;
}

/* A fresh, zeroed guest of `bytes` restored from `path`. */
static int restore(struct guest_ram *out, uint64_t bytes, const char *path, const char *extra,
                   char *error, size_t size, void **state, size_t *state_len)
{
	char opts[512], uri[PATH_MAX + 8];
	guest_ram_layout(out, ram_map(bytes), bytes);
	lmt_session *d = session_on(LMT_ROLE_DESTINATION, out, "file",
	                            with_direct(opts, sizeof(opts), extra));
	snprintf(uri, sizeof(uri), "file:%s", path);
	uint16_t port = 1;
	int rc = lmt_load_listen(d, uri, &port);
	assert_int_equal(rc, 0);
	assert_int_equal(port, 0);
	rc = lmt_load_run(d);
	snprintf(error, size, "%s", lmt_session_error(d)->message);
	if (rc == 0 && state) {
		const void *data;
		assert_int_equal(lmt_load_device_state(d, &data, state_len), 0);
		*state = malloc(*state_len ? *state_len : 1);
		if (*state_len)
			memcpy(*state, data, *state_len);
	}
	lmt_session_free(d);
	return rc;
}

/* The restore of `path` fails with `code` and a message holding `words`. */
static void expect_refused(const char *path, const char *extra, int code, const char *words)
{
	struct guest_ram back;
	char error[600];
	int rc = restore(&back, RAM_BYTES, path, extra, error, sizeof(error), NULL, NULL);
	munmap(back.base, back.bytes);
	if (rc != code || !strstr(error, words))
		fail_msg("restore of %s: %s (%d), expected %s and '%s'", path, error, rc,
		         lmt_err_name(code), words);
	print_message("    refused: %s\n", error);
}

static void assert_same_ram(const struct guest_ram *a, const struct guest_ram *b)
{
	assert_int_equal(a->bytes, b->bytes);
	for (uint64_t off = 0; off < a->bytes; off += GUEST_PAGE_SIZE)
		if (memcmp(a->base + off, b->base + off, GUEST_PAGE_SIZE))
			fail_msg("restored RAM differs at offset %llu", (unsigned long long)off);
}

/* Save a quiet guest of RAM_BYTES to `name` (verify as given). */
static void save_quiet(struct guest_ram *ram, char *path, size_t size, const char *name,
                       const char *opts)
{
	path_for(path, size, name);
	ram_fill(ram, RAM_BYTES, 3);
	static const char state[] = "device state of a quiet guest";
	struct save_spec spec = {.opts = opts, .state = state, .state_len = sizeof(state)};
	struct save_result r = save(ram, path, &spec);
	if (r.rc)
		fail_msg("save: %s", r.error);
}

/* ---- bytes in the file ---- */

static int file_open(const char *path)
{
	int fd = open(path, O_RDWR);
	assert_true(fd >= 0);
	return fd;
}

static uint64_t get64(int fd, uint64_t at)
{
	uint8_t b[8];
	assert_int_equal(pread(fd, b, 8, (off_t)at), 8);
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = v << 8 | b[i];
	return v;
}

static void put64(int fd, uint64_t at, uint64_t v)
{
	uint8_t b[8];
	for (int i = 0; i < 8; i++)
		b[i] = (uint8_t)(v >> (8 * i));
	assert_int_equal(pwrite(fd, b, 8, (off_t)at), 8);
}

static void flip_byte(const char *path, uint64_t at)
{
	int fd = file_open(path);
	uint8_t b;
	assert_int_equal(pread(fd, &b, 1, (off_t)at), 1);
	b ^= 0x5a;
	assert_int_equal(pwrite(fd, &b, 1, (off_t)at), 1);
	close(fd);
}

/* XXH3-64 of [at, at + len) of the file. */
static uint64_t hash_range(int fd, uint64_t at, uint64_t len)
{
	uint8_t *buf = malloc(len);
	assert_int_equal(pread(fd, buf, len, (off_t)at), (ssize_t)len);
	uint64_t h = XXH3_64bits(buf, len);
	free(buf);
	return h;
}

/* Make the header's, the table's and the commit record's checksums right
 * again after an edit, as a forger would. */
static void reseal(int fd)
{
	uint64_t table = get64(fd, H_TABLE);
	uint64_t table_len = get64(fd, H_TABLE + 8);
	put64(fd, H_TABLE_DIGEST, hash_range(fd, table, table_len));
	put64(fd, SUM_AT, hash_range(fd, 0, SUM_AT));
	put64(fd, C_AT + SUM_AT, hash_range(fd, C_AT, SUM_AT));
}

/* The XXH3-64 over every bitmap, in order, as the commit record keeps. */
static uint64_t bitmaps_hash(int fd)
{
	XXH3_state_t *st = XXH3_createState();
	XXH3_64bits_reset(st);
	uint64_t table = get64(fd, H_TABLE), n = get64(fd, H_TABLE + 8) / E_SIZE;
	for (uint64_t i = 0; i < n; i++) {
		uint64_t off = get64(fd, table + i * E_SIZE + E_BITMAP);
		uint64_t len = get64(fd, table + i * E_SIZE + E_BITMAP_LEN);
		uint8_t *buf = malloc(len);
		assert_int_equal(pread(fd, buf, len, (off_t)off), (ssize_t)len);
		XXH3_64bits_update(st, buf, len);
		free(buf);
	}
	uint64_t h = XXH3_64bits_digest(st);
	XXH3_freeState(st);
	return h;
}

/* ---- round trips ---- */

static void round_trip(const char *opts, uint64_t rate, uint64_t working_set, size_t state_len,
                       uint32_t min_passes)
{
	struct census before = census_take();
	struct guest_ram ram, back;
	char path[PATH_MAX], error[600];
	path_for(path, sizeof(path), "round-trip.lmt");
	ram_fill(&ram, RAM_BYTES, 11);
	uint8_t *state = malloc(state_len ? state_len : 1);
	uint64_t seed = 5;
	for (size_t i = 0; i < state_len; i++)
		state[i] = (uint8_t)guest_random(&seed);
	struct save_spec spec = {.opts = opts,
	                         .dirty_rate = rate,
	                         .working_set = working_set,
	                         .state = state,
	                         .state_len = state_len,
	                         .min_passes = min_passes};
	struct save_result r = save(&ram, path, &spec);
	if (r.rc)
		fail_msg("save with '%s': %s", opts, r.error);
	void *got = NULL;
	size_t got_len = 0;
	if (restore(&back, RAM_BYTES, path, opts, error, sizeof(error), &got, &got_len))
		fail_msg("restore with '%s': %s", opts, error);
	assert_same_ram(&ram, &back);
	assert_int_equal(got_len, state_len);
	assert_memory_equal(got, state, state_len);
	print_message("    %s: %llu passes, %llu bytes written\n", opts,
	              (unsigned long long)r.stats.passes, (unsigned long long)r.stats.bytes_sent);
	free(got);
	free(state);
	ram_release(&ram);
	munmap(back.base, back.bytes);
	unlink(path);
	census_check(before);
}

static void test_a_dirtying_guest_restores_bit_for_bit_over_1_2_4_channels(void **unused)
{
	round_trip("channels=1", 64 << 20, 4 << 20, 4096, 2);
	round_trip("channels=2,chunk-size=64K", 64 << 20, 4 << 20, 4096, 2);
	round_trip("channels=4,chunk-size=256K,queue-depth=4", 64 << 20, 4 << 20, 4096, 2);
}

static void test_verify_on_checks_every_stripe_after_a_dirtying_save(void **unused)
{
	round_trip("channels=2,verify=on", 64 << 20, 4 << 20, 4096, 3);
}

static void test_device_state_round_trips_whatever_its_size(void **unused)
{
	round_trip("channels=2", 0, 0, 0, 1);
	round_trip("channels=2", 0, 0, 1, 1);
	round_trip("channels=2,verify=on", 0, 0, (3u << 20) + 5, 1);
}

/* However many passes rewrite the pages, they go to their fixed places:
 * the file is RAM plus metadata, and its allocated bytes no more. */
static void test_file_never_grows_past_ram_and_metadata_over_many_passes(void **unused)
{
	struct guest_ram ram;
	char path[PATH_MAX];
	path_for(path, sizeof(path), "many-passes.lmt");
	ram_fill(&ram, RAM_BYTES, 13);
	char state[100] = "state";
	struct save_spec spec = {.opts = "channels=2,verify=on,downtime-limit=1ms",
	                         .dirty_rate = 256 << 20,
	                         .working_set = 8 << 20,
	                         .state = state,
	                         .state_len = sizeof(state),
	                         .min_passes = 1};
	/* downtime-limit=1ms with 256 MiB/s of dirtying never converges:
	 * iterate through 12 passes, then complete anyway. */
	lmt_session *s = session_on(LMT_ROLE_SOURCE, &ram, "file", spec.opts);
	char uri[PATH_MAX + 8];
	snprintf(uri, sizeof(uri), "file:%s", path);
	struct guest_workload *w;
	assert_int_equal(lmt_session_set_dirty_sync(s, guest_dirty_sync, &ram), 0);
	assert_int_equal(guest_workload_start(&w, &ram, spec.working_set, spec.dirty_rate, 9), 0);
	assert_int_equal(lmt_save_setup(s, uri), 0);
	struct lmt_iterate_result it = {0};
	uint64_t give_up = guest_now_ns() + 60000000000ull;
	while (it.pass < 12 && guest_now_ns() < give_up)
		assert_int_equal(lmt_save_iterate(s, &it), 0);
	guest_workload_pause(w);
	assert_int_equal(lmt_save_complete(s, state, sizeof(state)), 0);
	uint64_t dirtied = guest_workload_stop(w);
	struct lmt_stats st;
	lmt_session_stats(s, &st);
	lmt_session_free(s);
	assert_true(st.passes >= 12);
	assert_true(st.bytes_sent > RAM_BYTES); /* pages were written more than once */
	struct stat sb;
	assert_int_equal(stat(path, &sb), 0);
	/* Metadata: header, commit record, table, two bitmaps, two digest
	 * areas and the state, each rounded to 4K; page areas aligned to 64K. */
	uint64_t metadata = 3 * ALIGN + 4 * ALIGN + ALIGN + 2 * 65536;
	print_message("    %llu passes, %llu bytes written (%llu dirtied), file %llu bytes, "
	              "%llu allocated, RAM %llu\n",
	              (unsigned long long)st.passes, (unsigned long long)st.bytes_sent,
	              (unsigned long long)dirtied, (unsigned long long)sb.st_size,
	              (unsigned long long)sb.st_blocks * 512, (unsigned long long)RAM_BYTES);
	assert_true((uint64_t)sb.st_size <= RAM_BYTES + metadata);
	assert_true((uint64_t)sb.st_blocks * 512 <= RAM_BYTES + metadata);
	struct guest_ram back;
	char error[600];
	if (restore(&back, RAM_BYTES, path, "verify=on", error, sizeof(error), NULL, NULL))
		fail_msg("restore: %s", error);
	assert_same_ram(&ram, &back);
	ram_release(&ram);
	munmap(back.base, back.bytes);
	unlink(path);
}

/* Zero pages of the bulk pass are never written: the file has holes. */
static void test_zero_pages_are_left_as_holes(void **unused)
{
	struct guest_ram ram;
	char path[PATH_MAX];
	path_for(path, sizeof(path), "holes.lmt");
	guest_ram_layout(&ram, ram_map(RAM_BYTES), RAM_BYTES);
	uint64_t zero = guest_ram_fill(&ram, 0.5, 17);
	assert_int_equal(guest_ram_alloc_dirty(&ram), 0);
	struct save_spec spec = {.opts = "channels=2"};
	struct save_result r = save(&ram, path, &spec);
	assert_int_equal(r.rc, 0);
	assert_int_equal(r.stats.zero_pages, zero);
	struct stat sb;
	assert_int_equal(stat(path, &sb), 0);
	uint64_t data = RAM_BYTES - zero * GUEST_PAGE_SIZE;
	print_message("    %llu zero pages; file %llu bytes, %llu allocated, %llu of data\n",
	              (unsigned long long)zero, (unsigned long long)sb.st_size,
	              (unsigned long long)sb.st_blocks * 512, (unsigned long long)data);
	assert_true((uint64_t)sb.st_blocks * 512 < data + (1u << 20));
	struct guest_ram back;
	char error[600];
	if (restore(&back, RAM_BYTES, path, "", error, sizeof(error), NULL, NULL))
		fail_msg("restore: %s", error);
	assert_same_ram(&ram, &back);
	ram_release(&ram);
	munmap(back.base, back.bytes);
	unlink(path);
}

/* A VMM whose main loop never blocks: the same file through jobs and
 * events, on lmt's threads. */
static void test_jobs_save_and_restore_a_file(void **unused)
{
	struct census before = census_take();
	struct guest_ram ram, back;
	char path[PATH_MAX], uri[PATH_MAX + 8], opts[128];
	path_for(path, sizeof(path), "jobs.lmt");
	snprintf(uri, sizeof(uri), "file:%s", path);
	ram_fill(&ram, RAM_BYTES, 41);
	lmt_session *s = session_on(LMT_ROLE_SOURCE, &ram, "file",
	                            with_direct(opts, sizeof(opts), "channels=2,verify=on"));
	assert_int_equal(lmt_session_set_dirty_sync(s, guest_dirty_sync, &ram), 0);
	assert_int_equal(lmt_save_start(s, uri), 0);
	struct lmt_event ev = {0};
	uint64_t give_up = guest_now_ns() + 60000000000ull;
	while (ev.type != LMT_EVENT_READY && guest_now_ns() < give_up)
		if (!lmt_session_next_event(s, &ev))
			usleep(1000);
	assert_int_equal(ev.type, LMT_EVENT_READY);
	static const char state[] = "job state";
	assert_int_equal(lmt_save_switchover(s, state, sizeof(state)), 0);
	assert_int_equal(lmt_session_wait(s, -1), 0);
	lmt_session_free(s);

	guest_ram_layout(&back, ram_map(RAM_BYTES), RAM_BYTES);
	lmt_session *d = session_on(LMT_ROLE_DESTINATION, &back, "file",
	                            with_direct(opts, sizeof(opts), "channels=2,verify=on"));
	assert_int_equal(lmt_load_listen(d, uri, NULL), 0);
	assert_int_equal(lmt_load_start(d), 0);
	if (lmt_session_wait(d, -1))
		fail_msg("restore job: %s", lmt_session_error(d)->message);
	const void *got;
	size_t len;
	assert_int_equal(lmt_load_device_state(d, &got, &len), 0);
	assert_int_equal(len, sizeof(state));
	assert_memory_equal(got, state, len);
	lmt_session_free(d);
	assert_same_ram(&ram, &back);
	ram_release(&ram);
	munmap(back.base, back.bytes);
	unlink(path);
	census_check(before);
}

/* ---- files refused ---- */

static void test_truncated_file_is_refused(void **unused)
{
	struct guest_ram ram;
	char path[PATH_MAX];
	save_quiet(&ram, path, sizeof(path), "truncated.lmt", "");
	struct stat sb;
	assert_int_equal(stat(path, &sb), 0);
	assert_int_equal(truncate(path, sb.st_size - 8192), 0);
	expect_refused(path, "", -LMT_EPROTO, "truncated");
	assert_int_equal(truncate(path, 100), 0);
	expect_refused(path, "", -LMT_EPROTO, "truncated");
	assert_int_equal(truncate(path, 0), 0);
	expect_refused(path, "", -LMT_EPROTO, "truncated");
	ram_release(&ram);
	unlink(path);
}

static void test_corrupt_header_is_refused(void **unused)
{
	struct guest_ram ram;
	char path[PATH_MAX];
	save_quiet(&ram, path, sizeof(path), "header.lmt", "");
	flip_byte(path, H_STATE + 1);
	expect_refused(path, "", -LMT_EPROTO, "header: checksum mismatch");
	ram_release(&ram);
	unlink(path);
}

static void test_corrupt_block_table_is_refused(void **unused)
{
	struct guest_ram ram;
	char path[PATH_MAX];
	save_quiet(&ram, path, sizeof(path), "table.lmt", "");
	int fd = file_open(path);
	uint64_t table = get64(fd, H_TABLE);
	close(fd);
	flip_byte(path, table + 2); /* the first block's name */
	expect_refused(path, "", -LMT_EPROTO, "block table: checksum mismatch");
	ram_release(&ram);
	unlink(path);
}

static void test_table_offsets_outside_the_file_are_refused(void **unused)
{
	struct guest_ram ram;
	char path[PATH_MAX];
	save_quiet(&ram, path, sizeof(path), "offsets.lmt", "");
	int fd = file_open(path);
	uint64_t table = get64(fd, H_TABLE);
	put64(fd, table + E_SIZE + E_PAGES, 1ull << 40); /* ram1's pages far away */
	reseal(fd);
	close(fd);
	expect_refused(path, "", -LMT_EPROTO, "lies outside the file's areas");
	fd = file_open(path);
	put64(fd, table + E_SIZE + E_PAGES, get64(fd, table + E_PAGES)); /* onto ram0's */
	reseal(fd);
	close(fd);
	expect_refused(path, "", -LMT_EPROTO, "overlaps");
	ram_release(&ram);
	unlink(path);
}

static void test_corrupt_bitmap_is_refused(void **unused)
{
	struct guest_ram ram;
	char path[PATH_MAX];
	save_quiet(&ram, path, sizeof(path), "bitmap.lmt", "");
	int fd = file_open(path);
	uint64_t bitmap = get64(fd, get64(fd, H_TABLE) + E_BITMAP);
	close(fd);
	flip_byte(path, bitmap + 3);
	expect_refused(path, "", -LMT_EPROTO, "page bitmaps do not match their checksum");
	ram_release(&ram);
	unlink(path);
}

/* A bitmap resealed by a forger, claiming a page past the end of ram0. */
static void test_bitmap_claiming_pages_beyond_the_block_is_refused(void **unused)
{
	struct guest_ram ram;
	char path[PATH_MAX];
	save_quiet(&ram, path, sizeof(path), "beyond.lmt", "");
	int fd = file_open(path);
	uint64_t table = get64(fd, H_TABLE);
	uint64_t bitmap = get64(fd, table + E_BITMAP), len = get64(fd, table + E_BITMAP_LEN);
	put64(fd, bitmap + len - 8, ~0ull);
	put64(fd, C_AT + C_BITMAPS, bitmaps_hash(fd));
	reseal(fd);
	close(fd);
	expect_refused(path, "", -LMT_EPROTO, "beyond the block's 3079 pages");
	ram_release(&ram);
	unlink(path);
}

static void test_corrupt_page_fails_verify(void **unused)
{
	struct guest_ram ram;
	char path[PATH_MAX];
	save_quiet(&ram, path, sizeof(path), "page.lmt", "verify=on");
	int fd = file_open(path);
	uint64_t pages = get64(fd, get64(fd, H_TABLE) + E_PAGES);
	close(fd);
	/* Page 17 of ram0, in stripe 1; the guest's pages are 90% data. */
	uint64_t at = pages + 17 * GUEST_PAGE_SIZE + 100;
	uint8_t b = 0;
	fd = file_open(path);
	assert_int_equal(pread(fd, &b, 1, (off_t)at), 1);
	close(fd);
	flip_byte(path, at);
	expect_refused(path, "verify=on", -LMT_EVERIFY,
	               "block 'ram0': bytes 65536 to 131071 differ from the digest");
	ram_release(&ram);
	unlink(path);
}

static void test_corrupt_digest_is_refused(void **unused)
{
	struct guest_ram ram;
	char path[PATH_MAX];
	save_quiet(&ram, path, sizeof(path), "digest.lmt", "verify=on");
	int fd = file_open(path);
	uint64_t digests = get64(fd, get64(fd, H_TABLE) + E_DIGESTS);
	close(fd);
	flip_byte(path, digests + 9);
	expect_refused(path, "verify=on", -LMT_EPROTO, "page digests do not match their checksum");
	ram_release(&ram);
	unlink(path);
}

static void test_verify_on_needs_a_file_with_digests(void **unused)
{
	struct guest_ram ram;
	char path[PATH_MAX];
	save_quiet(&ram, path, sizeof(path), "no-digests.lmt", "verify=off");
	expect_refused(path, "verify=on", -LMT_EINVAL, "the file has no digests");
	ram_release(&ram);
	unlink(path);
}

static void write_file(const char *path, const void *data, size_t len)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, data, len), (ssize_t)len);
	close(fd);
}

static void test_foreign_file_is_refused(void **unused)
{
	char path[PATH_MAX];
	path_for(path, sizeof(path), "foreign.lmt");
	uint8_t *junk = calloc(1, 1 << 20);
	uint64_t seed = 1;
	for (size_t i = 0; i < (1 << 20); i++)
		junk[i] = (uint8_t)guest_random(&seed);
	write_file(path, junk, 1 << 20);
	expect_refused(path, "", -LMT_EPROTO, "not an lmt save file");
	memset(junk, 0, 1 << 20);
	write_file(path, junk, 1 << 20);
	expect_refused(path, "", -LMT_EPROTO, "not an lmt save file");
	free(junk);

	/* A file of a newer format, and one of a version that never was. */
	struct guest_ram ram;
	save_quiet(&ram, path, sizeof(path), "foreign.lmt", "");
	int fd = file_open(path);
	put64(fd, H_VERSION, 2);
	close(fd);
	expect_refused(path, "", -LMT_EPROTO, "format version 2 is newer than this lmt reads (1)");
	fd = file_open(path);
	put64(fd, H_VERSION, 0);
	close(fd);
	expect_refused(path, "", -LMT_EPROTO, "format version 0 is unknown");
	expect_refused("/nonexistent/lmt.save", "", -LMT_ENOTFOUND, "cannot open");
	ram_release(&ram);
	unlink(path);
}

static void test_block_table_must_match_the_registered_blocks(void **unused)
{
	struct guest_ram ram, back;
	char path[PATH_MAX], error[600];
	save_quiet(&ram, path, sizeof(path), "mismatch.lmt", "");
	int rc = restore(&back, RAM_BYTES + (64 << 10), path, "", error, sizeof(error), NULL, NULL);
	munmap(back.base, back.bytes);
	assert_int_equal(rc, -LMT_EMISMATCH);
	assert_non_null(strstr(error, "block 0 is 'ram0' of 12611584 bytes"));
	rc = restore(&back, 64 << 10, path, "", error, sizeof(error), NULL, NULL);
	munmap(back.base, back.bytes);
	assert_int_equal(rc, -LMT_EMISMATCH);
	assert_non_null(strstr(error, "2 blocks in the file, 1 registered"));
	ram_release(&ram);
	unlink(path);
}

/* A save that stops before lmt_save_complete leaves a file without its
 * commit record, which a restore refuses, and leaves the guest running. */
static void test_interrupted_save_is_refused(void **unused)
{
	struct census before = census_take();
	struct guest_ram ram;
	char path[PATH_MAX], uri[PATH_MAX + 8];
	path_for(path, sizeof(path), "interrupted.lmt");
	ram_fill(&ram, RAM_BYTES, 19);
	lmt_session *s = session_on(LMT_ROLE_SOURCE, &ram, "file", "channels=2");
	assert_int_equal(lmt_session_set_dirty_sync(s, guest_dirty_sync, &ram), 0);
	snprintf(uri, sizeof(uri), "file:%s", path);
	assert_int_equal(lmt_save_setup(s, uri), 0);
	struct lmt_iterate_result it;
	for (int i = 0; i < 3; i++)
		assert_int_equal(lmt_save_iterate(s, &it), 0);
	lmt_cancel(s);
	assert_int_equal(lmt_save_complete(s, NULL, 0), -LMT_ECANCELED);
	lmt_session_free(s);
	census_check(before);
	expect_refused(path, "", -LMT_EPROTO, "from a save that did not complete");
	ram_release(&ram);
	unlink(path);
}

/* A write that fails mid-save fails the save; the file never looks complete. */
static void test_failed_write_leaves_no_complete_file(void **unused)
{
	struct guest_ram ram;
	char path[PATH_MAX];
	path_for(path, sizeof(path), "failed.lmt");
	ram_fill(&ram, RAM_BYTES, 23);
	char uri[PATH_MAX + 8];
	snprintf(uri, sizeof(uri), "file:%s", path);
	lmt_session *s = session_on(LMT_ROLE_SOURCE, &ram, "chaos:file",
	                            "channels=2,chaos.fault=fail-write,chaos.at=write:5");
	assert_int_equal(lmt_session_set_dirty_sync(s, guest_dirty_sync, &ram), 0);
	int rc = lmt_save_setup(s, uri);
	struct lmt_iterate_result it = {0};
	while (rc == 0 && !it.ready)
		rc = lmt_save_iterate(s, &it);
	if (rc == 0)
		rc = lmt_save_complete(s, NULL, 0);
	assert_int_not_equal(rc, 0);
	print_message("    save failed: %s\n", lmt_session_error(s)->message);
	lmt_session_free(s);
	expect_refused(path, "", -LMT_EPROTO, "from a save that did not complete");
	ram_release(&ram);
	unlink(path);
}

static void test_file_target_needs_the_file_plugin_and_back(void **unused)
{
	struct guest_ram ram;
	ram_fill(&ram, 64 << 10, 29);
	lmt_session *s = session_on(LMT_ROLE_SOURCE, &ram, "tcp", "");
	assert_int_equal(lmt_session_set_dirty_sync(s, guest_dirty_sync, &ram), 0);
	assert_int_equal(lmt_save_setup(s, "file:/tmp/x"), -LMT_EINVAL);
	assert_non_null(
	        strstr(lmt_session_error(s)->message, "create the session with the plugin"));
	lmt_session_free(s);
	s = session_on(LMT_ROLE_SOURCE, &ram, "file", "");
	assert_int_equal(lmt_session_set_dirty_sync(s, guest_dirty_sync, &ram), 0);
	assert_int_equal(lmt_save_setup(s, "127.0.0.1:1"), -LMT_EINVAL);
	assert_non_null(strstr(lmt_session_error(s)->message, "expected file:PATH"));
	assert_int_equal(lmt_save_setup(s, "file:"), -LMT_EINVAL);
	assert_non_null(strstr(lmt_session_error(s)->message, "the path must have 1 to"));
	lmt_session_free(s);
	s = session_on(LMT_ROLE_DESTINATION, &ram, "file", "");
	assert_int_equal(lmt_load_listen(s, "127.0.0.1:0", NULL), -LMT_EINVAL);
	assert_non_null(strstr(lmt_session_error(s)->message, "expected file:PATH"));
	lmt_session_free(s);
	ram_release(&ram);
}

static void test_save_into_a_missing_directory_fails_at_setup(void **unused)
{
	struct census before = census_take();
	struct guest_ram ram;
	ram_fill(&ram, 64 << 10, 31);
	lmt_session *s = session_on(LMT_ROLE_SOURCE, &ram, "file", "channels=2");
	assert_int_equal(lmt_session_set_dirty_sync(s, guest_dirty_sync, &ram), 0);
	assert_int_equal(lmt_save_setup(s, "file:/nonexistent-dir/guest.lmt"), -LMT_ENOTFOUND);
	assert_non_null(strstr(lmt_session_error(s)->message, "cannot open '/nonexistent-dir"));
	lmt_session_free(s);
	census_check(before);
	ram_release(&ram);
}

/* A file system that refuses O_DIRECT: the error names the option and the
 * file system. Older kernels' tmpfs refuses it; this one's (Linux 6.18)
 * accepts it, while procfs refuses it everywhere, so the restore opens a
 * file of /proc to read. */
static void test_direct_io_refused_names_the_option_and_the_file_system(void **unused)
{
	struct census before = census_take();
	struct guest_ram back;
	char error[600];
	int rc = restore(&back, RAM_BYTES, "/proc/version", "direct-io=on,channels=2", error,
	                 sizeof(error), NULL, NULL);
	munmap(back.base, back.bytes);
	print_message("    %s\n", error);
	assert_int_equal(rc, -LMT_ENOTSUP);
	assert_non_null(strstr(error, "direct-io=on: proc refuses O_DIRECT for '/proc/version'"));
	census_check(before);
}

/* ---- the test directory ---- */

static int remove_entry(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
	return remove(path);
}

/* 0, or 77 with the reason when the directory refuses O_DIRECT. */
static int prepare_dir(bool direct)
{
	const char *base = getenv("LMT_TEST_FILE_DIR") ? getenv("LMT_TEST_FILE_DIR") : ".";
	mkdir(base, 0700);
	snprintf(test_dir, sizeof(test_dir), "%s/lmt-file-XXXXXX", base);
	if (!mkdtemp(test_dir)) {
		fprintf(stderr, "cannot create a directory under %s: %s\n", base, strerror(errno));
		return 1;
	}
	if (!direct)
		return 0;
	char probe[PATH_MAX];
	path_for(probe, sizeof(probe), "probe");
	int fd = open(probe, O_WRONLY | O_CREAT | O_DIRECT, 0600);
	int e = errno;
	unlink(probe);
	if (fd < 0) {
		printf("SKIP: %s refuses O_DIRECT (%s); the direct-io=on round trips need a disk "
		       "file system\n",
		       test_dir, strerror(e));
		rmdir(test_dir);
		return 77;
	}
	close(fd);
	direct_opts = "direct-io=on";
	return 0;
}

int main(void)
{
	const char *d = getenv("LMT_TEST_FILE_DIRECT");
	bool direct = d && strcmp(d, "1") == 0;
	int rc = prepare_dir(direct);
	if (rc)
		return rc;
	const struct CMUnitTest round_trips[] = {
	        cmocka_unit_test(test_a_dirtying_guest_restores_bit_for_bit_over_1_2_4_channels),
	        cmocka_unit_test(test_verify_on_checks_every_stripe_after_a_dirtying_save),
	        cmocka_unit_test(test_device_state_round_trips_whatever_its_size),
	        cmocka_unit_test(test_file_never_grows_past_ram_and_metadata_over_many_passes),
	        cmocka_unit_test(test_zero_pages_are_left_as_holes),
	        cmocka_unit_test(test_jobs_save_and_restore_a_file),
	};
	const struct CMUnitTest refusals[] = {
	        cmocka_unit_test(test_truncated_file_is_refused),
	        cmocka_unit_test(test_corrupt_header_is_refused),
	        cmocka_unit_test(test_corrupt_block_table_is_refused),
	        cmocka_unit_test(test_table_offsets_outside_the_file_are_refused),
	        cmocka_unit_test(test_corrupt_bitmap_is_refused),
	        cmocka_unit_test(test_bitmap_claiming_pages_beyond_the_block_is_refused),
	        cmocka_unit_test(test_corrupt_page_fails_verify),
	        cmocka_unit_test(test_corrupt_digest_is_refused),
	        cmocka_unit_test(test_verify_on_needs_a_file_with_digests),
	        cmocka_unit_test(test_foreign_file_is_refused),
	        cmocka_unit_test(test_block_table_must_match_the_registered_blocks),
	        cmocka_unit_test(test_interrupted_save_is_refused),
	        cmocka_unit_test(test_failed_write_leaves_no_complete_file),
	        cmocka_unit_test(test_file_target_needs_the_file_plugin_and_back),
	        cmocka_unit_test(test_save_into_a_missing_directory_fails_at_setup),
	        cmocka_unit_test(test_direct_io_refused_names_the_option_and_the_file_system),
	};
	rc = cmocka_run_group_tests_name(direct ? "file round trips, direct-io=on"
	                                        : "file round trips",
	                                 round_trips, NULL, NULL);
	if (!direct)
		rc |= cmocka_run_group_tests_name("files refused", refusals, NULL, NULL);
	nftw(test_dir, remove_entry, 8, FTW_DEPTH | FTW_PHYS);
	return rc;
}
