/* The end of a failed migration (engines room), which both engines
 * call: the failure recorded for good, the peer told, the target, the
 * transport and the control connection released, the FAILED event. Over
 * failure recording (core/session/failure.c). */
#include <string.h>

#include "control.h"
#include "engines.h"
#include "error.h"
#include "file.h"
#include "session.h"
#include "transport.h"

/* Tell the peer (best effort, briefly), release the transport. */
int lmt__abort(struct lmt_session *s, int code)
{
	lmt__fail_settle(s);
	pthread_mutex_lock(&s->lock);
	if (s->error.code == 0 || s->error_is_usage) {
		lmt__error(&s->error, code ? code : LMT_EIO, "%s", lmt_strerror(code));
		s->error_is_usage = s->error_is_transport = false;
	}
	code = s->error.code;
	struct lmt_msg_status st = {.code = code};
	lmt__copy(st.text, sizeof(st.text), s->error.message);
	lmt__stats_end(s, lmt__failed_status(s));
	pthread_mutex_unlock(&s->lock);
	atomic_store(&s->state, LMT_STATE_FAILED);
	lmt__fail_tell_peer(s, &st);
	/* From here a plugin's waits in teardown end soon (host cancelled). */
	atomic_store(&s->aborting, 1);
	lmt__file_free(s);
	lmt__transport_close(s);
	lmt__ctrl_close(s);
	lmt__session_log(s, LMT_LOG_INFO, "migration failed: %s", s->error.message);
	lmt__fail_post(s);
	return code;
}
