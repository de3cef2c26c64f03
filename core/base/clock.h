/* The core's clock (base room): monotonic nanoseconds, the one time
 * every deadline and statistic of the core is counted in. May use: common (net.h). */
#ifndef LMT_CORE_CLOCK_H
#define LMT_CORE_CLOCK_H

#include <stdint.h>

#include "net.h"

static inline uint64_t lmt__now(void)
{
	return lmt__now_ns();
}

#endif
