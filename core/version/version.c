/* The library's version at run time, which a program may compare with the
 * LMT_VERSION it was built against. */
#include <lmt/lmt.h>

const char *lmt_version(void)
{
	return LMT_VERSION;
}
