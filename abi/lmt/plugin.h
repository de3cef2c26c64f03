/* lmt plugin ABI: the only header a transport plugin includes.
 * A plugin built against it needs neither liblmt nor any other lmt header. */
#ifndef LMT_PLUGIN_H
#define LMT_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ABI versions. The core offers the newest it knows; a plugin answers with
 * the newest it speaks that is not newer than the offer. */
#define LMT_PLUGIN_ABI_VERSION 1u

/* The one symbol a plugin exports. Its type is lmt_plugin_entry_fn. */
#define LMT_PLUGIN_ENTRY_SYMBOL "lmt_plugin_entry"

#if defined(__GNUC__)
#define LMT_PLUGIN_EXPORT __attribute__((visibility("default")))
#define LMT_PRINTF(fmt, args) __attribute__((format(printf, fmt, args)))
#else
#define LMT_PLUGIN_EXPORT
#define LMT_PRINTF(fmt, args)
#endif

/* Error codes: 0 is success, failures are these negated values. Shared by
 * the core API and plugins. */
enum lmt_errc {
	LMT_OK = 0,
	LMT_EINVAL = 1,     /* a bad argument or option value */
	LMT_ENOMEM = 2,     /* out of memory */
	LMT_EAGAIN = 3,     /* queue full or nothing ready yet: try again */
	LMT_ETIMEDOUT = 4,  /* a deadline passed */
	LMT_ECANCELED = 5,  /* lmt_cancel() was called on this side */
	LMT_ECONN = 6,      /* the peer went away or a connection failed */
	LMT_EPROTO = 7,     /* a malformed or unexpected message */
	LMT_ENOTFOUND = 8,  /* no such plugin, device, option or block */
	LMT_EABI = 9,       /* a plugin ABI the core cannot use */
	LMT_ENOTSUP = 10,   /* not supported by this plugin or device */
	LMT_EIO = 11,       /* a transport operation failed */
	LMT_ESTATE = 12,    /* called in the wrong session state */
	LMT_EMISMATCH = 13, /* source and destination disagree */
	LMT_EVERIFY = 14,   /* digests differ after migration */
	LMT_EAUTH = 15,     /* authentication failed */
	LMT_EOVERFLOW = 16, /* a value or a message is too large */
	/* Added within v1: the peer ended the migration and said why (its
	 * cancel, or a failure of its own). The core's alone: a plugin never
	 * returns it, and it is never sent on the wire. */
	LMT_EPEER = 17,
	LMT_ERRC_COUNT
};

enum lmt_log_level {
	LMT_LOG_ERROR = 0,
	LMT_LOG_WARN = 1,
	LMT_LOG_INFO = 2,
	LMT_LOG_DEBUG = 3,
};

/* ---- Option schema, shared by the core and every plugin -------------- */

enum lmt_option_type {
	LMT_OPT_BOOL = 0,     /* on/off, true/false, yes/no, 1/0 */
	LMT_OPT_INT = 1,      /* signed decimal integer */
	LMT_OPT_SIZE = 2,     /* bytes: 4096, 64K, 1M, 2GiB, 1TB (binary units) */
	LMT_OPT_DURATION = 3, /* 300ms, 2s, 1m, 500us; a bare number is ms */
	LMT_OPT_ENUM = 4,     /* one of enum_values */
	LMT_OPT_STRING = 5,   /* any text without ',' */
};

enum lmt_option_flags {
	LMT_OPTF_POW2 = 1u << 0,   /* integer or size must be a power of two */
	LMT_OPTF_MATCH = 1u << 1,  /* both sides must agree; checked at handshake */
	LMT_OPTF_SECRET = 1u << 2, /* value never printed or sent */
};

/* One option. Plugins give the short name ("nodelay"); users and lookups
 * use it qualified by the plugin name ("tcp.nodelay"). Defaults are given
 * as text and go through the same parser as user input. Ranges apply to
 * INT (as int64), SIZE (bytes) and DURATION (nanoseconds); min == max == 0
 * means unbounded. */
struct lmt_option_desc {
	const char *name;
	enum lmt_option_type type;
	const char *default_value;
	int64_t min;
	int64_t max;
	uint32_t flags;
	const char *const *enum_values; /* NULL-terminated, for LMT_OPT_ENUM */
	const char *doc;                /* one line */
};

/* A parsed option value. INT, SIZE and DURATION use `integer` (DURATION in
 * nanoseconds); BOOL uses `boolean`; ENUM gives the index in `integer` and
 * the text in `text`; STRING uses `text`. `text` lives as long as the
 * session that owns the option. */
struct lmt_option_value {
	enum lmt_option_type type;
	int boolean;
	int64_t integer;
	const char *text;
};

/* ---- Services the core lends to a plugin ----------------------------- */

/* Faults a decorator may ask the core to simulate (host->inject). */
enum lmt_fault {
	LMT_FAULT_DROP_CONTROL = 1, /* drop the control connection */
};

/* Every service takes the `host_ctx` given to instance_open. All are safe
 * to call from any thread the plugin runs. */
struct lmt_host {
	uint32_t abi_version;
	uint32_t struct_size;
	/* Log a message through the session's logger. */
	void (*log)(void *host_ctx, enum lmt_log_level level, const char *fmt, ...)
	        LMT_PRINTF(3, 4);
	/* Record the reason for a failure in the session's error object and
	 * return -code, so that `return host->error(ctx, LMT_EIO, "...")` reads
	 * naturally. The first error recorded wins. */
	int (*error)(void *host_ctx, int code, const char *fmt, ...) LMT_PRINTF(3, 4);
	/* Monotonic clock in nanoseconds. */
	uint64_t (*now_ns)(void *host_ctx);
	/* Look up an option by qualified name ("tcp.nodelay", "chunk-size").
	 * Returns 0, or -LMT_ENOTFOUND for a name no schema declares. */
	int (*option)(void *host_ctx, const char *name, struct lmt_option_value *out);
	/* Non-zero once the session was cancelled, is failing, or its peer has
	 * left; blocking plugin calls poll it at least every 100 ms and return
	 * -LMT_ECANCELED (which the core reports as the connection's failure
	 * unless this side was cancelled). */
	int (*cancelled)(void *host_ctx);
	/* For decorators (LMT_CAP_DECORATOR): the plugin this one wraps, as in
	 * "chaos:tcp", or NULL. The decorator drives it through its ops with
	 * the same host services. */
	const struct lmt_plugin *(*inner)(void *host_ctx);
	/* For fault-injection decorators: act as if the peer had vanished. */
	void (*inject)(void *host_ctx, enum lmt_fault fault);
};

/* ---- The data path --------------------------------------------------- */

enum lmt_role {
	LMT_ROLE_SOURCE = 0,
	LMT_ROLE_DESTINATION = 1,
};

/* Capability flags in lmt_plugin.caps. */
enum lmt_plugin_caps {
	LMT_CAP_ONE_SIDED = 1u << 0,       /* writes land without target CPU work */
	LMT_CAP_LOCAL_MR = 1u << 1,        /* the source must register what it writes
	                                    from; without it, local_mr is NULL */
	LMT_CAP_PIN = 1u << 2,             /* registration pins memory (pin-all
	                                    matters) */
	LMT_CAP_MULTI_CHANNEL = 1u << 3,   /* more than one channel per instance */
	LMT_CAP_TARGET_PROGRESS = 1u << 4, /* the destination must call progress
	                                      for writes to land */
	LMT_CAP_DECORATOR = 1u << 5,       /* wraps another plugin */
	LMT_CAP_MERGES_RUNS = 1u << 6,     /* merges writes that follow each other
	                                      on one channel: the core then gives a
	                                      channel runs of consecutive chunks */
	LMT_CAP_ENCRYPTS = 1u << 7,        /* added within v1: given a channel
	                                      secret (lmt_instance_params), the
	                                      plugin encrypts and authenticates
	                                      its channels with it */
	LMT_CAP_STORAGE = 1u << 8,         /* the peer is a file the core lays out
	                                      itself ("file:PATH"), not a process:
	                                      address and key blobs are the core's
	                                      (below), and the plugin reads too */
};

/* Access wanted from a registration. */
enum lmt_mr_access {
	LMT_MR_LOCAL_READ = 1u << 0,   /* source: memory written from */
	LMT_MR_REMOTE_WRITE = 1u << 1, /* destination: memory the peer writes */
};

/* Largest address blob (per endpoint) and key blob (per registration). */
#define LMT_BLOB_MAX 512u

struct lmt_blob {
	uint32_t len;
	uint8_t data[LMT_BLOB_MAX];
};

/* A completion handed back by progress: the cookie of a write and its
 * status (0, or a negative LMT_E* code). */
struct lmt_completion {
	uint64_t cookie;
	int32_t status;
	uint32_t channel;
};

/* Parameters of a plugin instance (one per migration session). */
struct lmt_instance_params {
	uint32_t struct_size;
	enum lmt_role role;
	uint32_t channels;   /* endpoints the core will open: 0 .. channels-1 */
	uint64_t timeout_ns; /* bound for any single blocking call */
	/* Numeric IP addresses of the control connection's two ends, for
	 * transports that address peers by IP ("127.0.0.1", "::1"). */
	char local_host[64];
	char peer_host[64];
	/* Added within v1, read only when struct_size covers them
	 * (LMT_PARAMS_CHANNEL_SECRET). With tls=on: a secret of this session
	 * that both sides derived from the control connection's TLS, for a
	 * plugin with LMT_CAP_ENCRYPTS to key its channels from; NULL and 0
	 * without TLS. Valid until instance_close returns. */
	const uint8_t *channel_secret;
	uint32_t channel_secret_len;
	uint32_t reserved; /* 0 */
};

/* p->channel_secret, or NULL where the parameters are too short to hold it
 * or carry none. */
#define LMT_PARAMS_CHANNEL_SECRET(p)                                                               \
	((p)->struct_size >= offsetof(struct lmt_instance_params, channel_secret_len) +            \
	                                 sizeof(uint32_t) &&                                       \
	                 (p)->channel_secret_len                                                   \
	         ? (p)->channel_secret                                                             \
	         : NULL)

typedef struct lmt_instance lmt_instance; /* plugin-defined */
typedef struct lmt_endpoint lmt_endpoint; /* plugin-defined */
typedef struct lmt_mr lmt_mr;             /* plugin-defined */
typedef struct lmt_rkey lmt_rkey;         /* plugin-defined */

/*
 * Threading: the core calls every op of one instance from one thread at a
 * time (the session's thread), except that `progress` on the destination
 * may run while the control thread handles registration. A plugin may run
 * threads of its own; they must end in instance_close.
 *
 * Ordering contract: a write is complete (progress reports its cookie with
 * status 0) only once its bytes are visible in the target's memory. The core
 * never has two overlapping writes in flight, so a plugin may reorder
 * completions freely.
 */
struct lmt_plugin_ops {
	/* Create an instance. `host_ctx` is passed back to every host service. */
	int (*instance_open)(const struct lmt_host *host, void *host_ctx,
	                     const struct lmt_instance_params *params, lmt_instance **out);
	/* Release everything the instance owns, whatever state it is in:
	 * endpoints, registrations and threads that the core did not free. */
	void (*instance_close)(lmt_instance *inst);

	/* Open channel `channel`'s endpoint and describe it in `addr`, which the
	 * core carries to the peer. Must not block on the peer. */
	int (*ep_open)(lmt_instance *inst, uint32_t channel, lmt_endpoint **ep,
	               struct lmt_blob *addr);
	/* Connect to the peer's endpoint of the same channel. The destination
	 * is called after it has sent its blobs; it may block (up to the
	 * instance timeout) until the source connects. */
	int (*ep_connect)(lmt_endpoint *ep, const struct lmt_blob *peer_addr);
	/* Close an endpoint; its writes in flight get no completion. Returns
	 * promptly even when the peer is gone, and leaves no thread or request
	 * touching memory. The channel may then be opened again on the same
	 * instance, registrations and destination key blobs unchanged; the
	 * source imports the keys again (docs/writing-a-plugin.md,
	 * "Reopening a channel"). */
	void (*ep_close)(lmt_endpoint *ep);

	/* Register [addr, addr+len) for `access`. On the destination, `key`
	 * receives what the peer needs to write there (offset 0 is addr). */
	int (*mr_register)(lmt_instance *inst, void *addr, size_t len, uint32_t access, lmt_mr **mr,
	                   struct lmt_blob *key);
	void (*mr_deregister)(lmt_instance *inst, lmt_mr *mr);

	/* Turn a peer's key blob into something writes can use on `ep`'s
	 * instance. Blobs come from the network: validate every field. */
	int (*rkey_import)(lmt_instance *inst, const struct lmt_blob *key, lmt_rkey **rkey);
	void (*rkey_release)(lmt_instance *inst, lmt_rkey *rkey);

	/* Post a write of [local, local+len) to `offset` in the peer region of
	 * `rkey`. Returns 0 (posted; one completion with `cookie` will follow),
	 * -LMT_EAGAIN (queue full: call progress, then again) or an error. The
	 * source memory must stay mapped until the completion. */
	int (*write)(lmt_endpoint *ep, const void *local, size_t len, lmt_mr *local_mr,
	             lmt_rkey *rkey, uint64_t offset, uint64_t cookie);

	/* Harvest up to `max` completions from all endpoints, waiting at most
	 * `timeout_ns` for the first. Returns the number harvested (>= 0) or an
	 * error (a broken channel, a dead peer), again on every call until the
	 * endpoints that failed are closed. The destination calls it too. */
	int (*progress)(lmt_instance *inst, struct lmt_completion *out, uint32_t max,
	                uint64_t timeout_ns);

	/* Return once every write posted before the call is visible in the
	 * peer's memory and its completion has been or can be harvested. */
	int (*flush)(lmt_instance *inst, uint64_t timeout_ns);
};

/* Storage plugins (LMT_CAP_STORAGE). There is no peer to describe its
 * endpoints and keys, so the core writes both blobs itself, in these
 * formats (little-endian), and a storage plugin validates them as it would
 * a peer's:
 * - the address given to ep_connect: u16 version (1), u16 mode (below),
 *   u32 path length (1..LMT_STORAGE_PATH_MAX), u64 size, then the path
 *   (no NUL). CREATE makes the file anew (mode 0600), cut to `size` bytes;
 *   WRITE opens it to write and READ to read (size 0 for both).
 * - a key given to rkey_import: u16 version (1), u16 0, u32 0, u64 offset,
 *   u64 length: that range of the file. A reader refuses a range that
 *   runs past the file's end.
 * A write or read at `offset` in a key's region reaches the file at the
 * key's offset plus `offset`. The file's layout is the core's
 * (docs/file-format.md). */
#define LMT_STORAGE_BLOB_VERSION 1u
#define LMT_STORAGE_ADDR_HEADER 16u
#define LMT_STORAGE_KEY_SIZE 24u
#define LMT_STORAGE_PATH_MAX (LMT_BLOB_MAX - LMT_STORAGE_ADDR_HEADER)
enum lmt_storage_mode {
	LMT_STORAGE_CREATE = 1,
	LMT_STORAGE_WRITE = 2,
	LMT_STORAGE_READ = 3,
};

/* Post a read of `len` bytes at `offset` in the region of `rkey` into
 * [local, local+len): the mirror of `write`, with the same cookies,
 * completions (complete means the bytes are in `local`), -LMT_EAGAIN and
 * limits. Only storage plugins have it. */
typedef int (*lmt_plugin_read_fn)(lmt_endpoint *ep, void *local, size_t len, lmt_rkey *rkey,
                                  uint64_t offset, uint64_t cookie);

/* The descriptor a plugin returns. Fields after `struct_size` exist as of
 * the ABI version in `abi_version`. */
struct lmt_plugin {
	uint32_t abi_version;
	uint32_t struct_size;
	const char *name;        /* [a-z0-9_-]+, also the option namespace */
	const char *version;     /* the plugin's own version string */
	const char *description; /* one line */
	uint64_t caps;           /* lmt_plugin_caps */
	const struct lmt_option_desc *options;
	uint32_t option_count;
	struct lmt_plugin_ops ops;
	/* Added within v1, read only when struct_size covers it. One
	 * paragraph of plain text for lmt-info: what a remote writer must hold
	 * to write the destination's registered memory, how strong that is
	 * (per transport or provider where it varies), and what is left to an
	 * attacker who reaches the data path. NULL: not declared. */
	const char *write_access;
	/* Added within v1, read only when struct_size covers it: the read
	 * operation of a storage plugin (LMT_CAP_STORAGE), which the core
	 * requires of one, or of a decorator, which hands it to the plugin it
	 * wraps; NULL for every other plugin. */
	lmt_plugin_read_fn read;
};

/* The smallest descriptor of ABI v1: one that ends with `ops`, as the
 * first releases of v1 built them. */
#define LMT_PLUGIN_V1_MIN_SIZE                                                                     \
	(offsetof(struct lmt_plugin, ops) + sizeof(struct lmt_plugin_ops))
/* d->write_access, or NULL where the descriptor is too short to hold it. */
#define LMT_PLUGIN_WRITE_ACCESS(d)                                                                 \
	((d)->struct_size >= offsetof(struct lmt_plugin, write_access) + sizeof(const char *)      \
	         ? (d)->write_access                                                               \
	         : NULL)

/* d->read, or NULL where the descriptor is too short to hold it. */
#define LMT_PLUGIN_READ(d)                                                                         \
	((d)->struct_size >= offsetof(struct lmt_plugin, read) + sizeof(lmt_plugin_read_fn)        \
	         ? (d)->read                                                                       \
	         : NULL)

/* The entry point. `core_abi` is the newest ABI version the core speaks.
 * The plugin stores a descriptor of a version <= core_abi in *out and
 * returns 0, or returns -LMT_EABI (and may still set *out so the core can
 * name the version it wanted). The descriptor must outlive the dlopen. */
typedef int (*lmt_plugin_entry_fn)(uint32_t core_abi, const struct lmt_plugin **out);

#define LMT_DECLARE_PLUGIN(descriptor)                                                             \
	LMT_PLUGIN_EXPORT int lmt_plugin_entry(uint32_t core_abi, const struct lmt_plugin **out);  \
	LMT_PLUGIN_EXPORT int lmt_plugin_entry(uint32_t core_abi, const struct lmt_plugin **out)   \
	{                                                                                          \
		*out = &(descriptor);                                                              \
		return core_abi >= (descriptor).abi_version ? 0 : -LMT_EABI;                       \
	}

#ifdef __cplusplus
}
#endif

#endif /* LMT_PLUGIN_H */
