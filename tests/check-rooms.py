#!/usr/bin/env python3
"""The core's room rule, checked from the sources (docs/architecture.md,
"The core"): each file in core/<room>/ includes only headers of its own
room, of the rooms it may use (core_room_list in core/meson.build), of
common/ and of the system; and the calls between the core's .c files (a
function of one named in another, called or taken as a pointer) never go
to a room it may not use and never form a cycle.

    check-rooms.py CORE_DIR [COMMON_DIR]

Prints each violation and exits 1; exits 0 when there is none."""
import os
import re
import sys


def rooms_of(meson_build):
    """[(room, [rooms it may use])] in order, bottom first."""
    text = open(meson_build).read()
    block = text[text.index("core_room_list = ["):]
    block = block[: block.index("\n]\n")]
    entry = re.compile(r"\['(\w+)',\s*(?:files\([^)]*\)|\[\]),\s*\[([^\]]*)\]\]", re.S)
    rooms = [(m.group(1), re.findall(r"'(\w+)'", m.group(2))) for m in entry.finditer(block)]
    if not rooms:
        sys.exit("check-rooms: no core_room_list in " + meson_build)
    return rooms


def strip(text):
    """The code without comments and string or character literals."""
    pattern = re.compile(r'/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)
    return pattern.sub(lambda m: "\n" * m.group(0).count("\n") if m.group(0)[0] == "/" else '""', text)


DEFINITION = re.compile(r"^(?!static\b)[A-Za-z_][^;{}()]*?\b(lmt_\w+)\s*\([^;{}]*\)\s*(?:LMT_\w+\([^)]*\)\s*)?\{", re.M)
DATA = re.compile(r"^(?!static\b|extern\b)(?:const\s+)?struct\s+\w+\s+(lmt_\w+)\s*=", re.M)
REFERENCE = re.compile(r"\b(lmt_\w+)\b")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def main():
    core = os.path.abspath(sys.argv[1])
    common = os.path.abspath(sys.argv[2]) if len(sys.argv) > 2 else os.path.join(core, "..", "common")
    rooms = rooms_of(os.path.join(core, "meson.build"))
    order = [name for name, _ in rooms]
    may_use = {name: set(below) | {name} for name, below in rooms}
    problems = []

    headers = {}  # header name -> room
    sources = {}  # path -> (room, text)
    for room in order:
        folder = os.path.join(core, room)
        for name in sorted(os.listdir(folder)):
            path = os.path.join(folder, name)
            if name.endswith(".h"):
                if name in headers:
                    problems.append(f"{room}/{name}: a header of the same name is in {headers[name]}/")
                headers[name] = room
            if name.endswith((".c", ".h")):
                sources[path] = (room, open(path).read())
    common_headers = {n for n in os.listdir(common) if n.endswith(".h")}
    for name in sorted(os.listdir(core)):
        if name.endswith((".c", ".h")):
            problems.append(f"{name}: a file of core/ outside every room")

    for path, (room, text) in sorted(sources.items()):
        rel = os.path.relpath(path, core)
        for header in INCLUDE.findall(text):
            first = header.split("/")[0]
            if "/" in header and first in may_use[room] and os.path.exists(os.path.join(core, header)):
                continue
            owner = headers.get(header)
            if owner is None:
                if header not in common_headers:
                    problems.append(f'{rel}: includes "{header}", found in no room and not in common/')
            elif owner not in may_use[room]:
                problems.append(f'{rel}: includes "{header}" of room {owner}, which {room} may not use')

    # Who defines each function (or table) with external linkage.
    defined = {}
    code = {path: strip(text) for path, (room, text) in sources.items()}
    for path, text in code.items():
        if not path.endswith(".c"):
            continue
        for name in DEFINITION.findall(text) + DATA.findall(text):
            defined[name] = path
    graph = {}
    for path, text in code.items():
        if not path.endswith(".c"):
            continue
        room = sources[path][0]
        for name in set(REFERENCE.findall(text)):
            target = defined.get(name)
            if not target or target == path:
                continue
            graph.setdefault(path, {}).setdefault(target, set()).add(name)
            owner = sources[target][0]
            if owner not in may_use[room]:
                problems.append(f"{os.path.relpath(path, core)}: uses {name} of "
                                f"{os.path.relpath(target, core)}, room {owner}, which {room} may not use")

    # Cycles between files: a depth-first walk that meets a file on its path.
    state = {}
    def walk(node, path):
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, {})):
            if state.get(nxt) == 1:
                loop = path[path.index(nxt):] + [nxt]
                problems.append("a cycle of calls: " + " -> ".join(os.path.relpath(p, core) for p in loop))
            elif not state.get(nxt):
                walk(nxt, path)
        path.pop()
        state[node] = 2
    for node in sorted(graph):
        if not state.get(node):
            walk(node, [])

    for p in problems:
        print(p)
    if problems:
        return 1
    files = sum(1 for p in sources if p.endswith(".c"))
    edges = sum(len(t) for t in graph.values())
    print(f"rooms: {' < '.join(order)}; {files} files, {edges} calls between files, no cycle, "
          "nothing calls or includes up")
    return 0


if __name__ == "__main__":
    sys.exit(main())
