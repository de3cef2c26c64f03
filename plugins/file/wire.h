/* The blobs a storage plugin takes from the core (lmt/plugin.h): the
 * file's address and a key for a range of it, checked field by field. */
#ifndef LMT_FILE_WIRE_H
#define LMT_FILE_WIRE_H

#include <stdint.h>

#include <lmt/plugin.h>

struct file_address {
	enum lmt_storage_mode mode;
	uint64_t size;
	char path[LMT_STORAGE_PATH_MAX + 1];
};

struct file_range {
	uint64_t offset;
	uint64_t length;
};

/* NULL, or why the blob is malformed. */
const char *file_wire_address(const struct lmt_blob *blob, struct file_address *out);
const char *file_wire_key(const struct lmt_blob *blob, struct file_range *out);

#endif
