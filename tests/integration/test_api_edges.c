/* The edges of the embedding API: NULL arguments, blocks that cannot be
 * guest RAM, configuration fixed once a side starts, the rule of the
 * session's error object, and log messages that carry their session's id
 * to the session's own handler. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "harness.h"

#define RAM_BYTES (4ull << 20)
#define PAGE 4096u

static uint8_t page_mem[4 * PAGE] __attribute__((aligned(4096)));

static lmt_session *bare_session(enum lmt_role role)
{
	struct lmt_error err = {0};
	lmt_session *s = NULL;
	if (lmt_session_new(&s, role, "tcp", NULL, &err))
		fail_msg("session: %s", err.message);
	return s;
}

static void assert_error(const lmt_session *s, int code, const char *message)
{
	const struct lmt_error *e = lmt_session_error(s);
	assert_int_equal(e->code, code);
	assert_string_equal(e->message, message);
}

static void assert_status(lmt_session *s, enum lmt_status status)
{
	struct lmt_stats st;
	assert_int_equal(lmt_session_stats(s, &st), 0);
	assert_int_equal(st.status, status);
}

/* A port where nothing listens: bound once, then closed. */
static uint16_t closed_port(void)
{
	lmt_session *d = bare_session(LMT_ROLE_DESTINATION);
	uint16_t port = 0;
	assert_int_equal(lmt_session_add_block(d, "ram0", page_mem, PAGE, PAGE), 0);
	assert_int_equal(lmt_load_listen(d, "127.0.0.1:0", &port), 0);
	lmt_session_free(d);
	return port;
}

/* ---- NULL ---- */

static void test_every_session_call_refuses_a_null_session(void **state)
{
	struct lmt_option_value v;
	struct lmt_iterate_result it;
	struct lmt_stats st;
	struct lmt_pass_stats pass;
	struct lmt_event ev;
	const void *data;
	size_t len;
	uint16_t port;

	assert_int_equal(lmt_session_set_options(NULL, "verify=on"), -LMT_EINVAL);
	assert_int_equal(lmt_session_set_option(NULL, "verify", "on"), -LMT_EINVAL);
	assert_int_equal(lmt_session_get_option(NULL, "verify", &v), -LMT_EINVAL);
	assert_int_equal(lmt_session_add_block(NULL, "ram0", page_mem, PAGE, PAGE), -LMT_EINVAL);
	assert_int_equal(lmt_session_set_dirty_sync(NULL, guest_dirty_sync, NULL), -LMT_EINVAL);
	assert_int_equal(lmt_session_set_log_handler(NULL, NULL, NULL), -LMT_EINVAL);
	assert_int_equal(lmt_save_setup(NULL, "127.0.0.1:1"), -LMT_EINVAL);
	assert_int_equal(lmt_save_iterate(NULL, &it), -LMT_EINVAL);
	assert_int_equal(lmt_save_complete(NULL, NULL, 0), -LMT_EINVAL);
	assert_int_equal(lmt_load_listen(NULL, "127.0.0.1:0", &port), -LMT_EINVAL);
	assert_int_equal(lmt_load_run(NULL), -LMT_EINVAL);
	assert_int_equal(lmt_load_device_state(NULL, &data, &len), -LMT_EINVAL);
	assert_int_equal(lmt_session_stats(NULL, &st), -LMT_EINVAL);
	assert_int_equal(lmt_session_passes(NULL, &pass, 1), -LMT_EINVAL);
	assert_int_equal(lmt_session_event_fd(NULL), -LMT_EINVAL);
	assert_int_equal(lmt_session_next_event(NULL, &ev), -LMT_EINVAL);
	assert_int_equal(lmt_session_set_event_callback(NULL, NULL, NULL), -LMT_EINVAL);
	assert_int_equal(lmt_load_start(NULL), -LMT_EINVAL);
	assert_int_equal(lmt_save_start(NULL, "127.0.0.1:1"), -LMT_EINVAL);
	assert_int_equal(lmt_save_switchover(NULL, NULL, 0), -LMT_EINVAL);
	assert_int_equal(lmt_session_wait(NULL, 0), -LMT_EINVAL);
	assert_int_equal(lmt_save_set_device_state_size(NULL, 0), -LMT_EINVAL);
	/* Release and cancel do nothing; the getters give fixed values. */
	lmt_session_free(NULL);
	lmt_cancel(NULL);
	assert_int_equal(lmt_session_id(NULL), 0);
	assert_error(NULL, -LMT_EINVAL, "no session (lmt_session_error was given NULL)");
}

static void test_creating_a_session_without_a_place_for_it_is_refused(void **state)
{
	struct lmt_error err = {0};
	assert_int_equal(lmt_session_new(NULL, LMT_ROLE_SOURCE, "tcp", NULL, &err), -LMT_EINVAL);
	assert_int_equal(err.code, -LMT_EINVAL);
	assert_string_equal(err.message, "session: no place for it (out is NULL)");
	/* err itself may be NULL. */
	assert_int_equal(lmt_session_new(NULL, LMT_ROLE_SOURCE, "tcp", NULL, NULL), -LMT_EINVAL);
	lmt_session *s = (lmt_session *)&err;
	assert_int_equal(lmt_session_new(&s, LMT_ROLE_SOURCE, NULL, NULL, &err), -LMT_EINVAL);
	assert_null(s);
	assert_string_equal(err.message, "plugin: no name given");
}

/* The calls without pointers answer anything with a fixed text. */
static void test_calls_without_pointers_answer_any_value(void **state)
{
	assert_non_null(lmt_version());
	assert_string_equal(lmt_err_name(-LMT_EINVAL), "LMT_EINVAL");
	assert_string_equal(lmt_err_name(-1000), "LMT_E?");
	assert_string_equal(lmt_strerror(1000), "unknown error");
	assert_string_equal(lmt_status_name((enum lmt_status)77), "unknown");
}

static void test_plugin_and_option_calls_refuse_null(void **state)
{
	struct lmt_error err = {0};
	lmt_plugin_handle *plugin = NULL, *inner = NULL;
	assert_int_equal(lmt_plugin_open("tcp", NULL, &err), -LMT_EINVAL);
	assert_string_equal(err.message, "plugin: no place for the handle (out is NULL)");
	assert_int_equal(lmt_plugin_open(NULL, &plugin, &err), -LMT_EINVAL);
	assert_null(plugin);
	assert_int_equal(lmt_plugin_open_spec("tcp", NULL, &inner, &err), -LMT_EINVAL);
	assert_int_equal(lmt_plugin_open_spec("tcp", &plugin, NULL, &err), -LMT_EINVAL);
	assert_string_equal(err.message,
	                    "plugin: no place for the handles (plugin or inner is NULL)");
	assert_int_equal(lmt_plugin_open_spec(NULL, &plugin, &inner, NULL), -LMT_EINVAL);
	assert_null(plugin);
	assert_null(inner);
	lmt_plugin_close(NULL);
	assert_null(lmt_plugin_descriptor(NULL));
	assert_null(lmt_plugin_path(NULL));
	assert_int_equal(lmt_plugin_list(NULL, NULL), -LMT_EINVAL);
	assert_int_equal(lmt_plugin_search_path(NULL, 100), -LMT_EINVAL);
	assert_int_equal(lmt_plugin_search_path(NULL, 0), -LMT_EINVAL);
	assert_null(lmt_core_options(NULL));

	uint32_t n = 0;
	const struct lmt_option_desc *desc = lmt_core_options(&n);
	assert_non_null(desc);
	struct lmt_option_value v;
	char buf[32];
	assert_int_equal(lmt_option_parse(NULL, "1M", &v, &err), -LMT_EINVAL);
	assert_int_equal(lmt_option_parse(desc, NULL, &v, &err), -LMT_EINVAL);
	assert_string_equal(err.message, "chunk-size: no value given");
	assert_int_equal(lmt_option_parse(desc, "1M", NULL, NULL), -LMT_EINVAL);
	assert_int_equal(lmt_option_parse(desc, "1M", &v, NULL), 0);
	assert_int_equal(lmt_option_format(NULL, &v, buf, sizeof(buf)), -LMT_EINVAL);
	assert_int_equal(lmt_option_format(desc, NULL, buf, sizeof(buf)), -LMT_EINVAL);
	assert_int_equal(lmt_option_format(desc, &v, NULL, sizeof(buf)), -LMT_EINVAL);
	assert_int_equal(lmt_stats_json(NULL, buf, sizeof(buf)), -LMT_EINVAL);
	struct lmt_stats st = {0};
	assert_int_equal(lmt_stats_json(&st, NULL, 10), -LMT_EINVAL);
	assert_true(lmt_stats_json(&st, NULL, 0) > 0); /* like snprintf */
}

/* A NULL where a session call needs a pointer is a refused call: said in
 * the session's error, the session left as it was. */
static void test_null_arguments_are_refused_with_a_reason(void **state)
{
	lmt_session *s = bare_session(LMT_ROLE_SOURCE);
	struct lmt_option_value v;
	assert_int_equal(lmt_session_set_options(s, NULL), -LMT_EINVAL);
	assert_error(s, -LMT_EINVAL, "options: NULL, expected \"key=value,...\"");
	assert_int_equal(lmt_session_set_option(s, NULL, "on"), -LMT_EINVAL);
	assert_error(s, -LMT_EINVAL, "option (null): name and value required");
	assert_int_equal(lmt_session_set_option(s, "verify", NULL), -LMT_EINVAL);
	assert_error(s, -LMT_EINVAL, "option verify: name and value required");
	assert_int_equal(lmt_session_get_option(s, NULL, &v), -LMT_EINVAL);
	assert_int_equal(lmt_session_get_option(s, "verify", NULL), -LMT_EINVAL);
	assert_error(s, -LMT_EINVAL, "option verify: name and a place for the value required");
	assert_int_equal(lmt_session_get_option(s, "nonsense", &v), -LMT_ENOTFOUND);
	assert_error(s, -LMT_ENOTFOUND, "nonsense: unknown option");
	assert_int_equal(lmt_session_add_block(s, NULL, page_mem, PAGE, PAGE), -LMT_EINVAL);
	assert_error(s, -LMT_EINVAL,
	             "block name '(null)': expected 1 to 63 printable characters, no spaces");
	assert_int_equal(lmt_session_set_dirty_sync(s, NULL, NULL), -LMT_EINVAL);
	assert_error(s, -LMT_EINVAL, "dirty sync: the callback is NULL");
	assert_int_equal(lmt_session_stats(s, NULL), -LMT_EINVAL);
	assert_error(s, -LMT_EINVAL, "stats: no place for them (out is NULL)");
	assert_int_equal(lmt_session_passes(s, NULL, 1), -LMT_EINVAL);
	assert_error(s, -LMT_EINVAL, "passes: no place for 1 of them (out is NULL)");
	assert_int_equal(lmt_session_passes(s, NULL, 0), 0);
	assert_int_equal(lmt_session_next_event(s, NULL), -LMT_EINVAL);
	assert_error(s, -LMT_EINVAL, "next event: no place for it (event is NULL)");
	/* Without a job: every failing call says what was wrong. */
	assert_int_equal(lmt_session_wait(s, 0), -LMT_ESTATE);
	assert_error(s, -LMT_ESTATE,
	             "session wait: no job runs this session (lmt_save_start or lmt_load_start "
	             "starts one)");
	assert_int_equal(lmt_save_switchover(s, NULL, 0), -LMT_ESTATE);
	assert_error(s, -LMT_ESTATE, "save switchover: no lmt_save_start job runs");

	assert_int_equal(lmt_session_add_block(s, "ram0", page_mem, PAGE, PAGE), 0);
	assert_int_equal(lmt_session_set_dirty_sync(s, guest_dirty_sync, NULL), 0);
	assert_int_equal(lmt_save_setup(s, NULL), -LMT_EINVAL);
	assert_error(s, -LMT_EINVAL, "save setup: uri is NULL, expected host:port");
	assert_int_equal(lmt_save_start(s, NULL), -LMT_EINVAL);
	assert_error(s, -LMT_EINVAL, "save start: uri is NULL, expected host:port");
	assert_status(s, LMT_STATUS_NEW);
	lmt_session_free(s);

	lmt_session *d = bare_session(LMT_ROLE_DESTINATION);
	const void *data;
	size_t len;
	assert_int_equal(lmt_session_add_block(d, "ram0", page_mem, PAGE, PAGE), 0);
	assert_int_equal(lmt_load_listen(d, NULL, NULL), -LMT_EINVAL);
	assert_error(d, -LMT_EINVAL, "load listen: uri is NULL, expected host:port");
	assert_int_equal(lmt_load_device_state(d, NULL, &len), -LMT_EINVAL);
	assert_int_equal(lmt_load_device_state(d, &data, NULL), -LMT_EINVAL);
	assert_error(d, -LMT_EINVAL, "device state: data and length are required");
	/* Still as new: it listens now (without a port to report). */
	assert_int_equal(lmt_load_listen(d, "127.0.0.1:0", NULL), 0);
	lmt_session_free(d);
}

/* ---- blocks ---- */

static void assert_block_refused(uintptr_t host, uint64_t length, uint32_t page_size,
                                 const char *message)
{
	lmt_session *s = bare_session(LMT_ROLE_DESTINATION);
	assert_int_equal(lmt_session_add_block(s, "pc.ram", (void *)host, length, page_size),
	                 -LMT_EINVAL);
	assert_error(s, -LMT_EINVAL, message);
	assert_status(s, LMT_STATUS_NEW);
	/* Refused, not failed: a good block still goes in. */
	assert_int_equal(lmt_session_add_block(s, "pc.ram", page_mem, PAGE, PAGE), 0);
	lmt_session_free(s);
}

static void test_a_block_that_wraps_the_address_space_is_refused(void **state)
{
	assert_block_refused(
	        0xfffffffffffff000u, 4u << 20, PAGE,
	        "block 'pc.ram': 0xfffffffffffff000 + 4194304 bytes wraps around the end of the "
	        "address space");
}

static void test_a_block_that_ends_at_the_top_of_the_address_space_is_taken(void **state)
{
	lmt_session *s = bare_session(LMT_ROLE_DESTINATION);
	assert_int_equal(
	        lmt_session_add_block(s, "top", (void *)(uintptr_t)0xfffffffffffff000u, PAGE, PAGE),
	        0);
	assert_int_equal(lmt_session_error(s)->code, 0);
	lmt_session_free(s);
}

static void test_a_block_not_aligned_to_its_page_size_is_refused(void **state)
{
	char text[200];
	uintptr_t host = (uintptr_t)page_mem + 512;
	snprintf(text, sizeof(text),
	         "block 'pc.ram': host address %p is not aligned to the page size 4096",
	         (void *)host);
	assert_block_refused(host, PAGE, PAGE, text);
	/* Aligned to 4K is not enough for 2M pages. */
	snprintf(text, sizeof(text),
	         "block 'pc.ram': host address 0x201000 is not aligned to the page size 2097152");
	assert_block_refused(0x201000, 2u << 20, 2u << 20, text);
}

static void test_a_zero_length_block_is_refused(void **state)
{
	assert_block_refused((uintptr_t)page_mem, 0, PAGE, "block 'pc.ram': length is 0");
}

static void test_a_length_not_a_multiple_of_the_page_size_is_refused(void **state)
{
	assert_block_refused((uintptr_t)page_mem, 6000, PAGE,
	                     "block 'pc.ram': length 6000 is not a multiple of the page size 4096");
}

static void test_a_block_without_memory_is_refused(void **state)
{
	assert_block_refused(0, PAGE, PAGE, "block 'pc.ram': no memory given (host is NULL)");
}

/* ---- configuration fixed once a side starts ---- */

#define FIXED_BY_LISTEN                                                                            \
	"once lmt_load_listen is called (a source may connect from then on, and the handshake "    \
	"checks them against its own)"
#define FIXED_BY_SETUP "once the migration has begun"
#define ONLY_RUNTIME                                                                               \
	"; only downtime-limit, max-bandwidth and switchover-bandwidth can change during a "       \
	"migration"

static void test_listening_fixes_the_destinations_blocks_and_options(void **state)
{
	lmt_session *d = bare_session(LMT_ROLE_DESTINATION);
	assert_int_equal(lmt_session_add_block(d, "ram0", page_mem, PAGE, PAGE), 0);
	assert_int_equal(lmt_session_set_option(d, "chunk-size", "2M"), 0);
	assert_int_equal(lmt_load_listen(d, "127.0.0.1:0", NULL), 0);

	assert_int_equal(lmt_session_add_block(d, "late", page_mem + PAGE, PAGE, PAGE),
	                 -LMT_ESTATE);
	assert_error(d, -LMT_ESTATE, "block 'late': blocks are fixed " FIXED_BY_LISTEN);
	assert_int_equal(lmt_session_set_option(d, "chunk-size", "4M"), -LMT_ESTATE);
	assert_error(d, -LMT_ESTATE, "chunk-size: options are fixed " FIXED_BY_LISTEN);
	assert_int_equal(lmt_session_set_options(d, "verify=on,chunk-size=4M"), -LMT_ESTATE);
	assert_error(d, -LMT_ESTATE, "verify: options are fixed " FIXED_BY_LISTEN);
	struct lmt_option_value v;
	assert_int_equal(lmt_session_get_option(d, "chunk-size", &v), 0);
	assert_int_equal(v.integer, 2 << 20);
	assert_int_equal(lmt_session_get_option(d, "verify", &v), 0);
	assert_false(v.boolean);
	lmt_session_free(d);
}

static void test_a_listen_that_fails_leaves_the_destination_configurable(void **state)
{
	lmt_session *d = bare_session(LMT_ROLE_DESTINATION);
	assert_int_equal(lmt_load_listen(d, "127.0.0.1:0", NULL), -LMT_EINVAL);
	assert_error(d, -LMT_EINVAL, "load listen: no RAM blocks: add them before listening");
	assert_int_equal(lmt_session_add_block(d, "ram0", page_mem, PAGE, PAGE), 0);
	assert_int_equal(lmt_load_listen(d, "nonsense", NULL), -LMT_EINVAL);
	assert_error(d, -LMT_EINVAL, "load listen: address 'nonsense': expected host:port");
	assert_status(d, LMT_STATUS_NEW);
	assert_int_equal(lmt_session_add_block(d, "ram1", page_mem + PAGE, PAGE, PAGE), 0);
	assert_int_equal(lmt_session_set_option(d, "verify", "on"), 0);
	assert_int_equal(lmt_load_listen(d, "127.0.0.1:0", NULL), 0);
	lmt_session_free(d);
}

/* Two sessions in this process migrating to each other over tcp: the
 * destination on lmt's thread, the source driven here. */
struct pair {
	struct guest_ram src, dst;
	lmt_session *s, *d;
};

static void pair_open(struct pair *p)
{
	ram_fill(&p->src, RAM_BYTES, 5);
	guest_ram_layout(&p->dst, ram_map(RAM_BYTES), RAM_BYTES);
	p->d = session_on(LMT_ROLE_DESTINATION, &p->dst, "tcp", "");
	p->s = session_on(LMT_ROLE_SOURCE, &p->src, "tcp", "");
	assert_int_equal(lmt_session_set_dirty_sync(p->s, guest_dirty_sync, &p->src), 0);
}

static void pair_setup(struct pair *p)
{
	uint16_t port = 0;
	char uri[64];
	assert_int_equal(lmt_load_listen(p->d, "127.0.0.1:0", &port), 0);
	assert_int_equal(lmt_load_start(p->d), 0);
	snprintf(uri, sizeof(uri), "127.0.0.1:%u", port);
	if (lmt_save_setup(p->s, uri))
		fail_msg("setup: %s", lmt_session_error(p->s)->message);
}

static void pair_complete(struct pair *p)
{
	struct lmt_iterate_result it = {0};
	while (!it.ready)
		if (lmt_save_iterate(p->s, &it))
			fail_msg("iterate: %s", lmt_session_error(p->s)->message);
	if (lmt_save_complete(p->s, NULL, 0))
		fail_msg("complete: %s", lmt_session_error(p->s)->message);
	assert_int_equal(lmt_session_wait(p->d, 10000), 0);
	assert_memory_equal(p->src.base, p->dst.base, RAM_BYTES);
}

static void pair_close(struct pair *p)
{
	lmt_session_free(p->s);
	lmt_session_free(p->d);
	ram_release(&p->src);
	munmap(p->dst.base, RAM_BYTES);
}

static void test_setup_fixes_the_sources_blocks_options_and_dirty_sync(void **state)
{
	struct pair p;
	pair_open(&p);
	pair_setup(&p);
	assert_int_equal(lmt_session_add_block(p.s, "late", page_mem, PAGE, PAGE), -LMT_ESTATE);
	assert_error(p.s, -LMT_ESTATE, "block 'late': blocks are fixed " FIXED_BY_SETUP);
	assert_int_equal(lmt_session_set_option(p.s, "queue-depth", "8"), -LMT_ESTATE);
	assert_error(p.s, -LMT_ESTATE, "queue-depth: fixed " FIXED_BY_SETUP ONLY_RUNTIME);
	assert_int_equal(lmt_session_set_options(p.s, "zero-page-detection=off"), -LMT_ESTATE);
	assert_error(p.s, -LMT_ESTATE, "zero-page-detection: fixed " FIXED_BY_SETUP ONLY_RUNTIME);
	/* The one exception, decided in the same place: runtime options. */
	assert_int_equal(lmt_session_set_option(p.s, "max-bandwidth", "1G"), 0);
	assert_int_equal(lmt_session_set_dirty_sync(p.s, guest_dirty_sync, &p.dst), -LMT_ESTATE);
	assert_error(p.s, -LMT_ESTATE, "dirty sync: the callback is fixed " FIXED_BY_SETUP);
	/* The same on the destination while it loads. */
	assert_int_equal(lmt_session_set_option(p.d, "downtime-limit", "1s"), -LMT_ESTATE);
	assert_error(p.d, -LMT_ESTATE, "downtime-limit: options are fixed " FIXED_BY_LISTEN);
	/* Refused calls end nothing: the migration completes. */
	pair_complete(&p);
	pair_close(&p);
}

static void test_a_started_job_fixes_the_sources_configuration_at_once(void **state)
{
	struct guest_ram ram;
	ram_fill(&ram, RAM_BYTES, 6);
	lmt_session *s = session_on(LMT_ROLE_SOURCE, &ram, "tcp", "connect-timeout=200ms");
	assert_int_equal(lmt_session_set_dirty_sync(s, guest_dirty_sync, &ram), 0);
	char uri[64];
	snprintf(uri, sizeof(uri), "127.0.0.1:%u", closed_port());
	assert_int_equal(lmt_save_start(s, uri), 0);
	assert_int_equal(lmt_session_set_option(s, "verify", "on"), -LMT_ESTATE);
	assert_int_equal(lmt_session_wait(s, 10000), -LMT_ECONN);
	lmt_session_free(s);
	ram_release(&ram);
}

/* ---- the error object ---- */

static void test_a_refused_call_is_reported_until_the_next_error(void **state)
{
	lmt_session *s = bare_session(LMT_ROLE_SOURCE);
	assert_error(s, 0, "");
	assert_int_equal(lmt_session_set_option(s, "chunk-size", "3M"), -LMT_EINVAL);
	assert_error(s, -LMT_EINVAL, "chunk-size: expected a power of two from 4K to 1G, got '3M'");
	assert_int_equal(lmt_session_set_option(s, "chunk-sise", "2M"), -LMT_ENOTFOUND);
	assert_error(s, -LMT_ENOTFOUND, "chunk-sise: unknown option; did you mean 'chunk-size'?");
	/* A call that succeeds clears nothing. */
	assert_int_equal(lmt_session_set_option(s, "chunk-size", "2M"), 0);
	assert_error(s, -LMT_ENOTFOUND, "chunk-sise: unknown option; did you mean 'chunk-size'?");
	assert_status(s, LMT_STATUS_NEW);
	lmt_session_free(s);
}

static void test_the_first_failure_stays_whatever_follows(void **state)
{
	struct guest_ram ram;
	ram_fill(&ram, RAM_BYTES, 7);
	lmt_session *s = session_on(LMT_ROLE_SOURCE, &ram, "tcp", "connect-timeout=200ms");
	assert_int_equal(lmt_session_set_dirty_sync(s, guest_dirty_sync, &ram), 0);
	/* A refused call first: the failure replaces it. */
	assert_int_equal(lmt_session_set_option(s, "channels", "0"), -LMT_EINVAL);
	char uri[64];
	snprintf(uri, sizeof(uri), "127.0.0.1:%u", closed_port());
	assert_int_equal(lmt_save_setup(s, uri), -LMT_ECONN);
	assert_status(s, LMT_STATUS_FAILED);
	struct lmt_error first = *lmt_session_error(s);
	assert_int_equal(first.code, -LMT_ECONN);
	assert_non_null(strstr(first.message, "refused"));
	/* Refused calls after it are answered, but the failure stays. */
	struct lmt_iterate_result it;
	assert_int_equal(lmt_save_setup(s, uri), -LMT_ESTATE);
	assert_int_equal(lmt_save_iterate(s, &it), -LMT_ESTATE);
	assert_int_equal(lmt_save_complete(s, NULL, 0), -LMT_ESTATE);
	assert_int_equal(lmt_session_set_option(s, "verify", "on"), -LMT_ESTATE);
	assert_int_equal(lmt_session_add_block(s, "late", page_mem, PAGE, PAGE), -LMT_ESTATE);
	assert_int_equal(lmt_session_set_options(s, NULL), -LMT_EINVAL);
	assert_error(s, first.code, first.message);
	lmt_session_free(s);
	ram_release(&ram);
}

static void test_a_completed_session_reports_refused_calls(void **state)
{
	struct pair p;
	pair_open(&p);
	pair_setup(&p);
	pair_complete(&p);
	assert_error(p.s, 0, "");
	assert_int_equal(lmt_save_complete(p.s, NULL, 0), -LMT_ESTATE);
	assert_error(p.s, -LMT_ESTATE, "save complete: the session is not migrating");
	assert_status(p.s, LMT_STATUS_COMPLETED);
	pair_close(&p);
}

/* ---- logging ---- */

struct sink {
	pthread_mutex_t lock;
	char text[256 * 1024];
	size_t used;
	unsigned lines;
};

static void sink_fn(void *opaque, enum lmt_log_level level, const char *msg)
{
	struct sink *k = opaque;
	pthread_mutex_lock(&k->lock);
	int n = snprintf(k->text + k->used, sizeof(k->text) - k->used, "%s\n", msg);
	if (n > 0 && (size_t)n < sizeof(k->text) - k->used)
		k->used += (size_t)n;
	k->lines++;
	pthread_mutex_unlock(&k->lock);
}

static struct sink *sink_new(void)
{
	struct sink *k = calloc(1, sizeof(*k));
	assert_non_null(k);
	pthread_mutex_init(&k->lock, NULL);
	return k;
}

static void sink_free(struct sink *k)
{
	pthread_mutex_destroy(&k->lock);
	free(k);
}

static void id_prefix(uint64_t id, char *buf, size_t size)
{
	snprintf(buf, size, "[s%llu] ", (unsigned long long)id);
}

/* Every line of `k` starts with session `id`'s prefix. */
static void assert_all_from(const struct sink *k, uint64_t id)
{
	char prefix[32];
	id_prefix(id, prefix, sizeof(prefix));
	for (const char *line = k->text; *line; line = strchr(line, '\n') + 1)
		if (strncmp(line, prefix, strlen(prefix)) != 0)
			fail_msg("not from %s: %.*s", prefix, (int)strcspn(line, "\n"), line);
}

static bool has_line_of(const struct sink *k, uint64_t id)
{
	char prefix[32];
	id_prefix(id, prefix, sizeof(prefix));
	return strstr(k->text, prefix) != NULL;
}

static void test_each_session_logs_to_its_own_handler_with_its_id(void **state)
{
	struct sink *global = sink_new(), *to_d = sink_new(), *to_s = sink_new();
	lmt_set_log_handler(sink_fn, global);
	lmt_set_log_level(LMT_LOG_DEBUG);
	struct pair p;
	pair_open(&p);
	uint64_t src_id = lmt_session_id(p.s), dst_id = lmt_session_id(p.d);
	assert_true(src_id > 0 && dst_id > 0 && src_id != dst_id);
	assert_int_equal(lmt_session_set_log_handler(p.d, sink_fn, to_d), 0);
	assert_int_equal(lmt_session_set_log_handler(p.s, sink_fn, to_s), 0);
	pair_setup(&p);
	pair_complete(&p);
	pair_close(&p);
	lmt_set_log_level(LMT_LOG_ERROR);
	lmt_set_log_handler(NULL, NULL);

	/* The plugin's own messages, through the host services, carry it too. */
	assert_all_from(to_d, dst_id);
	assert_non_null(strstr(to_d->text, "tcp: tcp channel 0: listening on"));
	assert_all_from(to_s, src_id);
	assert_non_null(strstr(to_s->text, "tcp: tcp channel 0: connected to"));
	assert_false(has_line_of(global, src_id));
	assert_false(has_line_of(global, dst_id));
	sink_free(global);
	sink_free(to_d);
	sink_free(to_s);
}

static void test_without_its_own_handler_a_session_logs_to_the_process_handler(void **state)
{
	struct sink *global = sink_new(), *own = sink_new();
	struct guest_ram ram;
	ram_fill(&ram, RAM_BYTES, 8);
	lmt_session *s = session_on(LMT_ROLE_SOURCE, &ram, "tcp", "connect-timeout=200ms");
	assert_int_equal(lmt_session_set_dirty_sync(s, guest_dirty_sync, &ram), 0);
	/* Set, then taken away: the process-wide handler takes over again. */
	assert_int_equal(lmt_session_set_log_handler(s, sink_fn, own), 0);
	assert_int_equal(lmt_session_set_log_handler(s, NULL, NULL), 0);
	lmt_set_log_handler(sink_fn, global);
	lmt_set_log_level(LMT_LOG_INFO);
	char uri[64];
	snprintf(uri, sizeof(uri), "127.0.0.1:%u", closed_port());
	assert_int_equal(lmt_save_setup(s, uri), -LMT_ECONN);
	lmt_set_log_level(LMT_LOG_ERROR);
	lmt_set_log_handler(NULL, NULL);

	char expected[700];
	snprintf(expected, sizeof(expected), "[s%llu] migration failed: %s\n",
	         (unsigned long long)lmt_session_id(s), lmt_session_error(s)->message);
	assert_non_null(strstr(global->text, expected));
	assert_int_equal(own->lines, 0);
	lmt_session_free(s);
	ram_release(&ram);
	sink_free(global);
	sink_free(own);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_every_session_call_refuses_a_null_session),
	        cmocka_unit_test(test_creating_a_session_without_a_place_for_it_is_refused),
	        cmocka_unit_test(test_calls_without_pointers_answer_any_value),
	        cmocka_unit_test(test_plugin_and_option_calls_refuse_null),
	        cmocka_unit_test(test_null_arguments_are_refused_with_a_reason),
	        cmocka_unit_test(test_a_block_that_wraps_the_address_space_is_refused),
	        cmocka_unit_test(test_a_block_that_ends_at_the_top_of_the_address_space_is_taken),
	        cmocka_unit_test(test_a_block_not_aligned_to_its_page_size_is_refused),
	        cmocka_unit_test(test_a_zero_length_block_is_refused),
	        cmocka_unit_test(test_a_length_not_a_multiple_of_the_page_size_is_refused),
	        cmocka_unit_test(test_a_block_without_memory_is_refused),
	        cmocka_unit_test(test_listening_fixes_the_destinations_blocks_and_options),
	        cmocka_unit_test(test_a_listen_that_fails_leaves_the_destination_configurable),
	        cmocka_unit_test(test_setup_fixes_the_sources_blocks_options_and_dirty_sync),
	        cmocka_unit_test(test_a_started_job_fixes_the_sources_configuration_at_once),
	        cmocka_unit_test(test_a_refused_call_is_reported_until_the_next_error),
	        cmocka_unit_test(test_the_first_failure_stays_whatever_follows),
	        cmocka_unit_test(test_a_completed_session_reports_refused_calls),
	        cmocka_unit_test(test_each_session_logs_to_its_own_handler_with_its_id),
	        cmocka_unit_test(
	                test_without_its_own_handler_a_session_logs_to_the_process_handler),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
