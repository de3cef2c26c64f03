/* The option schemas the option tests share: a small plugin schema ("tcp")
 * with every type, and lookups in it and in the core's. Include it after
 * cmocka.h. */
#ifndef LMT_TEST_SCHEMA_H
#define LMT_TEST_SCHEMA_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <lmt/lmt.h>

static const char *const tcp_modes[] = {"stream", "zerocopy", NULL};

/* A small plugin schema with every type. */
static const struct lmt_option_desc tcp_options[] = {
        {.name = "nodelay", .type = LMT_OPT_BOOL, .default_value = "on", .doc = "no Nagle"},
        {.name = "mode",
         .type = LMT_OPT_ENUM,
         .default_value = "stream",
         .enum_values = tcp_modes,
         .doc = "how writes are sent"},
        {.name = "bind-device",
         .type = LMT_OPT_STRING,
         .default_value = "",
         .doc = "interface to bind to"},
        {.name = "token",
         .type = LMT_OPT_STRING,
         .default_value = "hunter2",
         .flags = LMT_OPTF_SECRET,
         .doc = "shared secret"},
        {.name = "key-slot",
         .type = LMT_OPT_INT,
         .default_value = "0",
         .min = 0,
         .max = 7,
         .flags = LMT_OPTF_SECRET,
         .doc = "secret slot"},
        {.name = "retries",
         .type = LMT_OPT_INT,
         .default_value = "3",
         .min = -10,
         .max = 10,
         .doc = "retries; negative counts down"},
        {.name = "batch",
         .type = LMT_OPT_INT,
         .default_value = "8",
         .flags = LMT_OPTF_POW2,
         .doc = "writes per batch"},
        {.name = "offset", .type = LMT_OPT_INT, .default_value = "0", .doc = "unbounded int"},
        {.name = "sndbuf", .type = LMT_OPT_SIZE, .default_value = "0", .doc = "socket buffer"},
        {.name = "linger", .type = LMT_OPT_DURATION, .default_value = "0", .doc = "linger"},
};

#define TCP_OPTION_COUNT (sizeof(tcp_options) / sizeof(tcp_options[0]))

static inline const struct lmt_option_desc *core_desc(const char *name)
{
	uint32_t count;
	const struct lmt_option_desc *core = lmt_core_options(&count);

	for (uint32_t i = 0; i < count; i++)
		if (strcmp(core[i].name, name) == 0)
			return &core[i];
	fail_msg("no core option %s", name);
	return NULL;
}

static inline const struct lmt_option_desc *tcp_desc(const char *name)
{
	for (size_t i = 0; i < TCP_OPTION_COUNT; i++)
		if (strcmp(tcp_options[i].name, name) == 0)
			return &tcp_options[i];
	fail_msg("no tcp option %s", name);
	return NULL;
}

#endif
