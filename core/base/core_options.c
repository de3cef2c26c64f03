/* The core's option schema: what every session has, whatever the plugin.
 * Room: base; may use: ABI, common. */
#include <lmt/lmt.h>

#define KIB INT64_C(1024)
#define GIB (KIB * KIB * KIB)
#define NS_PER_MS INT64_C(1000000)
#define NS_PER_S (1000 * NS_PER_MS)
#define NS_PER_HOUR (3600 * NS_PER_S)

static const char *const restore_modes[] = {"eager", "lazy", NULL};

static const struct lmt_option_desc core_options[] = {
        {
                .name = "chunk-size",
                .type = LMT_OPT_SIZE,
                .default_value = "1M",
                .min = 4 * KIB,
                .max = GIB,
                .flags = LMT_OPTF_POW2 | LMT_OPTF_MATCH,
                .doc = "largest write: dirty runs merge up to it, and without pin-all "
                       "memory is registered one chunk at a time",
        },
        {
                .name = "pin-all",
                .type = LMT_OPT_BOOL,
                .default_value = "off",
                .flags = LMT_OPTF_MATCH,
                .doc = "register every RAM block at setup instead of chunk by chunk",
        },
        {
                .name = "channels",
                .type = LMT_OPT_INT,
                .default_value = "1",
                .min = 1,
                .max = LMT_MAX_CHANNELS,
                .flags = LMT_OPTF_MATCH,
                .doc = "parallel data channels (connections or queue pairs) per session",
        },
        {
                .name = "max-bandwidth",
                .type = LMT_OPT_SIZE,
                .default_value = "0",
                .doc = "bytes per second the source may send, held across iterate calls "
                       "(a burst of at most one max-iterate-ms or one chunk); 0 is "
                       "unlimited; a source may change it during the migration, from any "
                       "thread, for its next iterate call",
        },
        {
                .name = "switchover-bandwidth",
                .type = LMT_OPT_SIZE,
                .default_value = "0",
                .doc = "bytes per second the pause is expected to send at, for the expected "
                       "downtime; 0 measures it: each pass's rate, or under max-bandwidth the "
                       "rate while writes were in flight, since the pause sends unthrottled; a "
                       "source may change it during the migration, from any thread, for its "
                       "next iterate call",
        },
        {
                .name = "downtime-limit",
                .type = LMT_OPT_DURATION,
                .default_value = "300ms",
                .min = NS_PER_MS,
                .max = NS_PER_HOUR,
                .doc = "longest expected pause of the guest at which the source is ready "
                       "to complete (RAM left, announced device state, verify's hashing); a "
                       "source may change it during the migration, from any thread, for its "
                       "next iterate call",
        },
        {
                .name = "auto-converge",
                .type = LMT_OPT_BOOL,
                .default_value = "off",
                .doc = "source: when passes do not converge, ask the VMM (its throttle "
                       "callback, lmt_session_set_throttle) to hold the guest's vCPUs for a "
                       "share of the time, more with each pass that still does not",
        },
        {
                .name = "throttle-initial",
                .type = LMT_OPT_INT,
                .default_value = "20",
                .min = 1,
                .max = 99,
                .doc = "auto-converge: the percentage of the time vCPUs are held once "
                       "throttling begins",
        },
        {
                .name = "throttle-increment",
                .type = LMT_OPT_INT,
                .default_value = "10",
                .min = 1,
                .max = 99,
                .doc = "auto-converge: percentage points added after each further pass that "
                       "does not converge",
        },
        {
                .name = "throttle-max",
                .type = LMT_OPT_INT,
                .default_value = "99",
                .min = 1,
                .max = 99,
                .doc = "auto-converge: the most the throttle reaches",
        },
        {
                .name = "max-iterate-ms",
                .type = LMT_OPT_DURATION,
                .default_value = "50ms",
                .min = NS_PER_MS,
                .max = 60 * NS_PER_S,
                .doc = "time budget of one lmt_save_iterate call",
        },
        {
                .name = "zero-page-detection",
                .type = LMT_OPT_BOOL,
                .default_value = "on",
                .doc = "skip all-zero pages in the bulk pass, and send those of later "
                       "passes as zero runs instead of data",
        },
        {
                .name = "verify",
                .type = LMT_OPT_BOOL,
                .default_value = "off",
                .flags = LMT_OPTF_MATCH,
                .doc = "end-to-end check: at completion the destination hashes all of its "
                       "RAM and compares it with the source's XXH3 digests of 64K stripes "
                       "(which the source keeps during the passes), naming the first stripe "
                       "that differs; the pause reads all of the destination's RAM once",
        },
        {
                .name = "connect-timeout",
                .type = LMT_OPT_DURATION,
                .default_value = "10s",
                .min = NS_PER_MS,
                .max = NS_PER_HOUR,
                .doc = "how long to wait for the control connection and each channel",
        },
        {
                .name = "idle-timeout",
                .type = LMT_OPT_DURATION,
                .default_value = "30s",
                .min = NS_PER_MS,
                .max = NS_PER_HOUR,
                .doc = "a peer that says nothing for this long fails the migration; a "
                       "destination also fails when the source sends nothing but "
                       "keep-alives for this long",
        },
        {
                .name = "switchover-timeout",
                .type = LMT_OPT_DURATION,
                .default_value = "10s",
                .min = NS_PER_MS,
                .max = NS_PER_HOUR,
                .doc = "longest lmt_save_complete may take with the guest paused; past it "
                       "the migration fails and the source guest may resume",
        },
        {
                .name = "queue-depth",
                .type = LMT_OPT_INT,
                .default_value = "64",
                .min = 1,
                .max = 4096,
                .doc = "writes in flight per channel",
        },
        {
                .name = "max-device-state",
                .type = LMT_OPT_SIZE,
                .default_value = "1G",
                .min = 0,
                .max = GIB,
                .doc = "destination: largest device state a source may announce; memory "
                       "for it grows with the pieces that arrive, never ahead of them",
        },
        {
                .name = "auth-key",
                .type = LMT_OPT_STRING,
                .default_value = "",
                .flags = LMT_OPTF_SECRET,
                .doc = "shared secret: both sides prove they hold it (HMAC-SHA-256 "
                       "challenge-response) before any block, address or key is sent",
        },
        {
                .name = "auth-key-file",
                .type = LMT_OPT_STRING,
                .default_value = "",
                .doc = "file whose contents are the shared secret (a trailing newline "
                       "is ignored); instead of auth-key",
        },
        {
                .name = "tls",
                .type = LMT_OPT_BOOL,
                .default_value = "off",
                .doc = "TLS 1.3 on the control connection and on the channels of plugins "
                       "that encrypt (tcp); with tls-cert, tls-key and tls-ca it uses "
                       "certificates, else a pre-shared key derived from auth-key; both "
                       "sides must set it alike",
        },
        {
                .name = "tls-cert",
                .type = LMT_OPT_STRING,
                .default_value = "",
                .doc = "PEM file: this side's certificate (and chain) for tls=on, which the "
                       "peer checks against its tls-ca",
        },
        {
                .name = "tls-key",
                .type = LMT_OPT_STRING,
                .default_value = "",
                .doc = "PEM file: the private key of tls-cert",
        },
        {
                .name = "tls-ca",
                .type = LMT_OPT_STRING,
                .default_value = "",
                .doc = "PEM file: the certificate authorities the peer's certificate must "
                       "chain to (each side verifies the other)",
        },
        {
                .name = "restore",
                .type = LMT_OPT_ENUM,
                .default_value = "eager",
                .enum_values = restore_modes,
                .doc = "file: restore: eager reads every page before lmt_load_run returns; "
                       "lazy returns once the file is checked and loads the pages behind "
                       "the running guest (userfaultfd), lmt_load_finish waiting for the last",
        },
        {
                .name = "postcopy",
                .type = LMT_OPT_BOOL,
                .default_value = "off",
                .flags = LMT_OPTF_MATCH,
                .doc = "allow the switch to postcopy (lmt_save_postcopy): the destination "
                       "runs the guest at once and the pages it lacks follow, those it "
                       "faults on first (userfaultfd on the destination; one more channel "
                       "carries the faulted pages)",
        },
        {
                .name = "postcopy-after",
                .type = LMT_OPT_INT,
                .default_value = "0",
                .min = 0,
                .max = 1000,
                .doc = "source, postcopy=on: after this many passes without converging, "
                       "lmt_save_iterate says to switch (result->postcopy) and "
                       "lmt_save_complete switches to postcopy; 0: only when the VMM calls "
                       "lmt_save_postcopy",
        },
        {
                .name = "userfaultfd",
                .type = LMT_OPT_BOOL,
                .default_value = "on",
                .doc = "off: this side never opens a userfaultfd, and restore=lazy and a "
                       "postcopy destination are refused before anything is touched, as on a "
                       "host without it (a host's policy; lmt's tests check those refusals "
                       "with it)",
        },
        {
                .name = "direct-io",
                .type = LMT_OPT_BOOL,
                .default_value = "off",
                .doc = "file: targets: read and write the file with O_DIRECT, past the "
                       "page cache; refused where the file system does not support it",
        },
};

const struct lmt_option_desc *lmt_core_options(uint32_t *count)
{
	if (!count)
		return NULL;
	*count = sizeof(core_options) / sizeof(core_options[0]);
	return core_options;
}
