/* A crowd of strangers for the security suite: a few threads that open
 * connections to a port at a steady rate and then say nothing, dribble a
 * few bytes, send part of a message or garbage, or close at once; they
 * count how many connections the port really took, so a test can show the
 * rate it was flooded at. Loopback only: every connection ends with a
 * reset, so neither side keeps TIME_WAIT sockets or runs out of ports. */
#ifndef LMT_TESTS_FLOOD_H
#define LMT_TESTS_FLOOD_H

#include <stddef.h>
#include <stdint.h>

enum flood_kind {
	FLOOD_SILENT,     /* connect, say nothing, hold until the peer closes */
	FLOOD_DRIBBLE,    /* one byte of `bytes` at once, then one per dribble_ms */
	FLOOD_PART,       /* the first `part` bytes of `bytes` at once, then nothing */
	FLOOD_OPEN_CLOSE, /* connect and reset at once */
};

struct flood_spec {
	uint16_t port; /* on 127.0.0.1 */
	enum flood_kind kind;
	unsigned rate;        /* connections a second, all threads together */
	unsigned threads;     /* 0: 3 */
	const uint8_t *bytes; /* what DRIBBLE and PART send */
	size_t len;
	size_t part;
	unsigned dribble_ms; /* 0: 50 */
};

struct flood_count {
	uint64_t attempts;    /* connect() called */
	uint64_t established; /* made: the port's kernel completed the handshake */
	uint64_t failed;      /* refused, or never made */
	uint64_t dropped;     /* closed by the port's side after being established */
	uint64_t ns;          /* since the flood started */
	uint64_t at_ns;       /* when counted, on CLOCK_MONOTONIC */
};

struct flood;

/* Start flooding; NULL (after printing why) when the threads cannot start. */
struct flood *flood_start(const struct flood_spec *spec);
/* The counts so far, without stopping. */
struct flood_count flood_count(struct flood *f);
/* Stop every thread, reset every connection still open; the final counts. */
struct flood_count flood_stop(struct flood *f);
/* Connections made per second between two counts of one flood: TCP
 * connections the port's kernel completed, which it does only while its
 * accept queue has room, so over a steady flood no faster than the
 * listening process accepts them (plus what that queue holds). */
double flood_rate(const struct flood_count *from, const struct flood_count *to);

#endif
