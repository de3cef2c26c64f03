/* null: a transport that carries no data, for tests that need a real
 * plugin on the destination without any network (the fuzzer drives the
 * destination's control protocol through it). */
#include <stdlib.h>
#include <string.h>

#include <lmt/plugin.h>

#define NULL_ADDR "null-ep"

struct lmt_instance {
	const struct lmt_host *host;
	void *ctx;
	uint32_t next_key;
};

struct lmt_endpoint {
	struct lmt_instance *inst;
	uint32_t channel;
};

struct lmt_mr {
	uint32_t key;
};

struct lmt_rkey {
	uint32_t key;
};

static int null_open(const struct lmt_host *host, void *ctx,
                     const struct lmt_instance_params *params, struct lmt_instance **out)
{
	struct lmt_instance *i = calloc(1, sizeof(*i));
	if (!i)
		return host->error(ctx, LMT_ENOMEM, "null: out of memory");
	i->host = host;
	i->ctx = ctx;
	*out = i;
	return 0;
}

static void null_close(struct lmt_instance *i)
{
	free(i);
}

static int null_ep_open(struct lmt_instance *i, uint32_t channel, struct lmt_endpoint **ep,
                        struct lmt_blob *addr)
{
	struct lmt_endpoint *e = calloc(1, sizeof(*e));
	if (!e)
		return i->host->error(i->ctx, LMT_ENOMEM, "null: out of memory");
	e->inst = i;
	e->channel = channel;
	addr->len = sizeof(NULL_ADDR);
	memcpy(addr->data, NULL_ADDR, sizeof(NULL_ADDR));
	*ep = e;
	return 0;
}

static int null_ep_connect(struct lmt_endpoint *ep, const struct lmt_blob *peer)
{
	if (peer->len != sizeof(NULL_ADDR) || memcmp(peer->data, NULL_ADDR, sizeof(NULL_ADDR)))
		return ep->inst->host->error(ep->inst->ctx, LMT_EPROTO,
		                             "null: channel %u: not a null address", ep->channel);
	return 0;
}

static void null_ep_close(struct lmt_endpoint *ep)
{
	free(ep);
}

static int null_mr_register(struct lmt_instance *i, void *addr, size_t len, uint32_t access,
                            lmt_mr **mr, struct lmt_blob *key)
{
	struct lmt_mr *m = calloc(1, sizeof(*m));
	if (!m)
		return i->host->error(i->ctx, LMT_ENOMEM, "null: out of memory");
	m->key = ++i->next_key;
	key->len = sizeof(m->key);
	memcpy(key->data, &m->key, sizeof(m->key));
	*mr = m;
	return 0;
}

static void null_mr_deregister(struct lmt_instance *i, lmt_mr *mr)
{
	free(mr);
}

static int null_rkey_import(struct lmt_instance *i, const struct lmt_blob *key, lmt_rkey **rkey)
{
	if (key->len != sizeof(uint32_t))
		return i->host->error(i->ctx, LMT_EPROTO, "null: a key is 4 bytes, got %u",
		                      key->len);
	struct lmt_rkey *r = calloc(1, sizeof(*r));
	if (!r)
		return i->host->error(i->ctx, LMT_ENOMEM, "null: out of memory");
	memcpy(&r->key, key->data, sizeof(r->key));
	*rkey = r;
	return 0;
}

static void null_rkey_release(struct lmt_instance *i, lmt_rkey *rkey)
{
	free(rkey);
}

static int null_write(struct lmt_endpoint *ep, const void *local, size_t len, lmt_mr *mr,
                      lmt_rkey *rkey, uint64_t offset, uint64_t cookie)
{
	return ep->inst->host->error(ep->inst->ctx, LMT_ENOTSUP, "null: carries no data");
}

static int null_progress(struct lmt_instance *i, struct lmt_completion *out, uint32_t max,
                         uint64_t timeout_ns)
{
	return 0;
}

static int null_flush(struct lmt_instance *i, uint64_t timeout_ns)
{
	return 0;
}

static const struct lmt_plugin null_plugin = {
        .abi_version = LMT_PLUGIN_ABI_VERSION,
        .struct_size = sizeof(struct lmt_plugin),
        .name = "null",
        .version = "0",
        .description = "test transport that carries no data",
        .caps = LMT_CAP_MULTI_CHANNEL,
        .ops =
                {
                        .instance_open = null_open,
                        .instance_close = null_close,
                        .ep_open = null_ep_open,
                        .ep_connect = null_ep_connect,
                        .ep_close = null_ep_close,
                        .mr_register = null_mr_register,
                        .mr_deregister = null_mr_deregister,
                        .rkey_import = null_rkey_import,
                        .rkey_release = null_rkey_release,
                        .write = null_write,
                        .progress = null_progress,
                        .flush = null_flush,
                },
};

LMT_DECLARE_PLUGIN(null_plugin)
