/* What a plugin file exports: its ELF dynamic symbol table, read directly, so
 * that anything beyond the entry point (a missing -fvisibility=hidden) shows. */
#define _GNU_SOURCE
#include "plugin-check.h"

#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Symbols every linker defines in a shared object. */
static bool expected(const char *name)
{
	static const char *const names[] = {LMT_PLUGIN_ENTRY_SYMBOL, "_init",  "_fini",
	                                    "__bss_start",           "_edata", "_end"};
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (strcmp(name, names[i]) == 0)
			return true;
	return false;
}

static bool inside(size_t size, uint64_t offset, uint64_t len)
{
	return offset <= size && len <= size - offset;
}

static int scan(const uint8_t *file, size_t size, char *extra, size_t room)
{
	const Elf64_Ehdr *eh = (const void *)file;
	if (size < sizeof(*eh) || memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0 ||
	    eh->e_ident[EI_CLASS] != ELFCLASS64 || eh->e_shentsize != sizeof(Elf64_Shdr) ||
	    !inside(size, eh->e_shoff, (uint64_t)eh->e_shnum * sizeof(Elf64_Shdr))) {
		snprintf(extra, room, "not a 64-bit ELF file this check can read");
		return -1;
	}
	const Elf64_Shdr *sh = (const void *)(file + eh->e_shoff);
	int count = 0;
	size_t used = 0;
	extra[0] = 0;
	for (unsigned i = 0; i < eh->e_shnum; i++) {
		if (sh[i].sh_type != SHT_DYNSYM)
			continue;
		if (sh[i].sh_link >= eh->e_shnum || !inside(size, sh[i].sh_offset, sh[i].sh_size))
			break;
		const Elf64_Shdr *strs = &sh[sh[i].sh_link];
		if (!inside(size, strs->sh_offset, strs->sh_size))
			break;
		const Elf64_Sym *syms = (const void *)(file + sh[i].sh_offset);
		const char *names = (const char *)file + strs->sh_offset;
		size_t nsyms = sh[i].sh_size / sizeof(Elf64_Sym);
		for (size_t k = 1; k < nsyms; k++) {
			const Elf64_Sym *sym = &syms[k];
			unsigned bind = ELF64_ST_BIND(sym->st_info);
			unsigned type = ELF64_ST_TYPE(sym->st_info);
			if (sym->st_shndx == SHN_UNDEF || sym->st_name >= strs->sh_size ||
			    (bind != STB_GLOBAL && bind != STB_WEAK && bind != STB_GNU_UNIQUE) ||
			    type == STT_SECTION || type == STT_FILE ||
			    ELF64_ST_VISIBILITY(sym->st_other) == STV_HIDDEN ||
			    ELF64_ST_VISIBILITY(sym->st_other) == STV_INTERNAL)
				continue;
			const char *name = names + sym->st_name;
			if (!memchr(name, 0, strs->sh_size - sym->st_name) || expected(name))
				continue;
			if (count++ < 8 && used < room)
				used += (size_t)snprintf(extra + used, room - used, "%s%s",
				                         used ? ", " : "", name);
		}
	}
	if (count > 8 && used < room)
		snprintf(extra + used, room - used, ", ...");
	return count;
}

int pc_exports(const char *path, char *extra, size_t size)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	struct stat st;
	if (fd < 0 || fstat(fd, &st) != 0) {
		snprintf(extra, size, "%s: %s", path, strerror(errno));
		if (fd >= 0)
			close(fd);
		return -1;
	}
	void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	close(fd);
	if (map == MAP_FAILED) {
		snprintf(extra, size, "%s: mmap: %s", path, strerror(errno));
		return -1;
	}
	int n = scan(map, (size_t)st.st_size, extra, size);
	munmap(map, (size_t)st.st_size);
	return n;
}
