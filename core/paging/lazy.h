/* restore=lazy (paging room, lazy.c): the pages of a file loaded behind
 * a running guest, over userfaultfd (uffd.h) and the file's mover
 * (file.h). May use: base, wire, session, control, transport, targets. */
#ifndef LMT_CORE_LAZY_H
#define LMT_CORE_LAZY_H

#include <stdint.h>

#include "file.h"

/* restore=lazy (lazy.c). The file is checked and `uffd` open: register
 * the blocks, start the fault and loader threads, and return. The lazy
 * restore takes uffd, the mover (copied) and the bitmaps and digests
 * (per block, malloc'd), even when it fails. */
struct lmt__uffd;
int lmt__lazy_start(struct lmt_session *s, struct lmt__uffd *uffd, struct lmt__mover *m,
                    uint64_t **bitmaps, uint64_t **digests);
/* Wait until every page is in place or the restore failed, then close
 * the descriptor and join the threads: 0 or the failure's code. */
int lmt__lazy_finish(struct lmt_session *s);
/* Cancel a lazy restore still running and release it; none: nothing. */
void lmt__lazy_free(struct lmt_session *s);
/* With s->lock: the faults and pages so far into `out`. */
void lmt__lazy_stats(struct lmt_session *s, struct lmt_stats *out);

#endif
