/* What this side says about its peer: the peer's ERROR turned into this
 * side's failure by the one rule of docs/embedding.md ("Error codes"), and
 * a peer that does not speak lmt at all, named with what it sent.
 * Room: control; may use: base, wire, session. */
#define _GNU_SOURCE
#include "peer.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "net.h"

#define QUOTE_MAX 48 /* bytes of a stranger's first line quoted */
#define PEEK_MAX 64  /* bytes of it looked at */

static const char *peer_name(const struct lmt_session *s)
{
	return s->role == LMT_ROLE_SOURCE ? "destination" : "source";
}

int lmt__peer_ended(const struct lmt_session *s, const struct lmt_msg_status *st, char *why,
                    size_t size)
{
	const char *peer = peer_name(s);
	switch (-st->code) {
	case LMT_OK:
		snprintf(why, size, "the %s sent ERROR without a code: %s", peer, st->text);
		return -LMT_EPROTO;
	case LMT_ECANCELED:
		snprintf(why, size, "the %s cancelled the migration: %s", peer, st->text);
		return -LMT_EPEER;
	case LMT_ECONN:
		/* The connection between the two died: both saw the same. */
		snprintf(why, size, "the %s saw a connection fail: %s", peer, st->text);
		return -LMT_ECONN;
	case LMT_EAUTH:
	case LMT_EMISMATCH:
	case LMT_EVERIFY:
	case LMT_EPROTO:
		/* About both sides: they disagree, or this one's message was
		 * refused. */
		snprintf(why, size, "the %s refused: %s", peer, st->text);
		return st->code;
	default:
		snprintf(why, size, "the %s failed (%s there): %s", peer, lmt_err_name(st->code),
		         st->text);
		return -LMT_EPEER;
	}
}

/* The first line of `bytes`, printable, in quotes: what a stranger
 * speaking a text protocol sent; anything else as \xNN. */
static void quote(const uint8_t *bytes, size_t n, char *out, size_t size)
{
	size_t used = 0, i = 0;
	for (; i < n && used + 5 < size && i < QUOTE_MAX; i++) {
		uint8_t b = bytes[i];
		if ((b == '\r' || b == '\n') && i > 0)
			break;
		if (b >= 0x20 && b < 0x7f && b != '\'' && b != '\\')
			out[used++] = (char)b;
		else
			used += (size_t)snprintf(out + used, size - used, "\\x%02x", b);
	}
	out[used] = '\0';
	if (i < n && used + 4 < size)
		snprintf(out + used, size - used, "...");
}

void lmt__peer_not_lmt(const struct lmt_session *s, int fd, const uint8_t *head, size_t n,
                       char *why, size_t size)
{
	uint8_t bytes[PEEK_MAX];
	size_t have = n < sizeof(bytes) ? n : sizeof(bytes);
	memcpy(bytes, head, have);
	/* What else already waits on a plain socket, without waiting. */
	if (fd >= 0 && have < sizeof(bytes)) {
		ssize_t more;
		do
			more = recv(fd, bytes + have, sizeof(bytes) - have, MSG_DONTWAIT);
		while (more < 0 && errno == EINTR);
		if (more > 0)
			have += (size_t)more;
	}
	char where[160] = "";
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);
	if (s->ctrl_fd >= 0 && getpeername(s->ctrl_fd, (struct sockaddr *)&ss, &len) == 0) {
		char name[140];
		lmt__net_format((struct sockaddr *)&ss, name, sizeof(name));
		snprintf(where, sizeof(where), " at %s", name);
	}
	char text[QUOTE_MAX * 4 + 8];
	quote(bytes, have, text, sizeof(text));
	snprintf(why, size, "the peer%s is not an lmt %s (it sent '%s')", where, peer_name(s),
	         text);
}
