/* UCX's own log messages, routed to the host's logger of a live instance:
 * left alone, UCX prints them to stdout, which a plugin never does. Each
 * place in UCX that logs is heard on its first message and then at each
 * power of two: a peer can make UCX log once per message it sends (an
 * active message id without a handler, for one), and a flood of them must
 * not fill the host's log. */
#define _GNU_SOURCE
#include "log_relay.h"

#include <stdarg.h>
#include <stdio.h>

#include <ucs/debug/log_def.h>

#define UCX_LOG_SITES 64u /* places in UCX counted at once */

static pthread_mutex_t ucx_log_lock = PTHREAD_MUTEX_INITIALIZER;
static struct lmt_instance *ucx_log_instances; /* under ucx_log_lock */
static bool ucx_log_pushed;

/* How often each place in UCX logged (under ucx_log_lock); when the table
 * is full, the oldest entry makes room. */
static struct {
	const char *file;
	unsigned line;
	uint64_t count;
} ucx_log_sites[UCX_LOG_SITES];
static unsigned ucx_log_next_site;

/* How many times the place at file:line has logged, this time included. */
static uint64_t count_site(const char *file, unsigned line)
{
	for (unsigned i = 0; i < UCX_LOG_SITES; i++)
		if (ucx_log_sites[i].file == file && ucx_log_sites[i].line == line)
			return ++ucx_log_sites[i].count;
	unsigned i = ucx_log_next_site++ % UCX_LOG_SITES;
	ucx_log_sites[i].file = file;
	ucx_log_sites[i].line = line;
	ucx_log_sites[i].count = 1;
	return 1;
}

static enum lmt_log_level host_level(ucs_log_level_t level)
{
	switch (level) {
	case UCS_LOG_LEVEL_FATAL:
		return LMT_LOG_ERROR;
	case UCS_LOG_LEVEL_ERROR: /* mostly a peer that went away: we report those */
	case UCS_LOG_LEVEL_WARN:
		return LMT_LOG_WARN;
	case UCS_LOG_LEVEL_DIAG:
	case UCS_LOG_LEVEL_INFO:
	case UCS_LOG_LEVEL_PRINT:
		return LMT_LOG_INFO;
	default:
		return LMT_LOG_DEBUG;
	}
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
static ucs_log_func_rc_t ucx_log_handler(const char *file, unsigned line, const char *function,
                                         ucs_log_level_t level,
                                         const ucs_log_component_config_t *comp_conf,
                                         const char *message, va_list ap)
{
	(void)function;
	(void)comp_conf;
	char text[512];
	va_list copy;
	va_copy(copy, ap);
	vsnprintf(text, sizeof(text), message, copy);
	va_end(copy);
	pthread_mutex_lock(&ucx_log_lock);
	struct lmt_instance *inst = ucx_log_instances;
	uint64_t n = count_site(file, line);
	char times[48] = "";
	if (n > 1)
		snprintf(times, sizeof(times), " (%llu times so far)", (unsigned long long)n);
	if (inst && !(n & (n - 1)))
		putil_log(&inst->base, host_level(level), "ucx: UCX says: %s%s", text, times);
	pthread_mutex_unlock(&ucx_log_lock);
	return UCS_LOG_FUNC_RC_STOP;
}
#pragma GCC diagnostic pop

void ucx_log_attach(struct lmt_instance *inst)
{
	pthread_mutex_lock(&ucx_log_lock);
	if (!ucx_log_pushed) {
		ucs_log_push_handler(ucx_log_handler);
		ucx_log_pushed = true;
	}
	inst->log_next = ucx_log_instances;
	ucx_log_instances = inst;
	pthread_mutex_unlock(&ucx_log_lock);
}

void ucx_log_detach(struct lmt_instance *inst)
{
	pthread_mutex_lock(&ucx_log_lock);
	for (struct lmt_instance **at = &ucx_log_instances; *at; at = &(*at)->log_next) {
		if (*at == inst) {
			*at = inst->log_next;
			break;
		}
	}
	pthread_mutex_unlock(&ucx_log_lock);
}

/* UCX may outlive this file (a VMM that links it too): take the handler
 * back when the plugin is unloaded. */
__attribute__((destructor)) static void ucx_log_unload(void)
{
	pthread_mutex_lock(&ucx_log_lock);
	if (ucx_log_pushed)
		ucs_log_pop_handler();
	ucx_log_pushed = false;
	pthread_mutex_unlock(&ucx_log_lock);
}
