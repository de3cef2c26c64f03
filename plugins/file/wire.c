/* Decoders of the storage blobs (see wire.h): pure, fuzzed with the other
 * plugins' blobs. */
#include <string.h>

#include "bytes.h"
#include "wire.h"

const char *file_wire_address(const struct lmt_blob *blob, struct file_address *out)
{
	memset(out, 0, sizeof(*out));
	if (blob->len < LMT_STORAGE_ADDR_HEADER || blob->len > LMT_BLOB_MAX)
		return "address blob of a bad length";
	if (lmt__get16(blob->data) != LMT_STORAGE_BLOB_VERSION)
		return "address blob of an unknown version";
	uint16_t mode = lmt__get16(blob->data + 2);
	uint32_t n = lmt__get32(blob->data + 4);
	out->size = lmt__get64(blob->data + 8);
	if (mode < LMT_STORAGE_CREATE || mode > LMT_STORAGE_READ)
		return "address blob with an unknown mode";
	if (n == 0 || n > LMT_STORAGE_PATH_MAX || n != blob->len - LMT_STORAGE_ADDR_HEADER)
		return "address blob whose path length does not match";
	if (mode != LMT_STORAGE_CREATE && out->size)
		return "address blob with a size for a file it does not create";
	if (out->size > (UINT64_MAX >> 2))
		return "address blob with a size out of range";
	if (memchr(blob->data + LMT_STORAGE_ADDR_HEADER, 0, n))
		return "address blob whose path holds a NUL";
	out->mode = (enum lmt_storage_mode)mode;
	memcpy(out->path, blob->data + LMT_STORAGE_ADDR_HEADER, n);
	return NULL;
}

const char *file_wire_key(const struct lmt_blob *blob, struct file_range *out)
{
	memset(out, 0, sizeof(*out));
	if (blob->len != LMT_STORAGE_KEY_SIZE)
		return "key blob of a bad length";
	if (lmt__get16(blob->data) != LMT_STORAGE_BLOB_VERSION || lmt__get16(blob->data + 2) ||
	    lmt__get32(blob->data + 4))
		return "key blob of an unknown version";
	out->offset = lmt__get64(blob->data + 8);
	out->length = lmt__get64(blob->data + 16);
	if (out->length == 0 || out->offset > (UINT64_MAX >> 2) || out->length > (UINT64_MAX >> 2))
		return "key blob with a range out of bounds";
	return NULL;
}
