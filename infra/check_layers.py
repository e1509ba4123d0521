#!/usr/bin/env python3
"""Check the library's import graph against the layers in docs/ARCHITECTURE.md.

The layers are the fenced block after the line `<!-- layers -->` in docs/ARCHITECTURE.md,
one layer per line, lowest first: `name: module module ...`. A module is a top-level item of
shared/src (a file `x.rs` or a directory `x/`); its imports are every `crate::x` path in its
non-test code (`use crate::{...}` groups included; comments and `#[cfg(test)]` items skipped).

Rules (exit 1 with every violation listed):
  * every module in the tree is in exactly one layer, and every layer module exists;
  * a module imports only modules of its own layer or a lower one (no upward import);
  * the import graph has no cycle (also none inside a layer).

Usage: python3 infra/check_layers.py [repo root]   (--graph prints the edges)
"""
import re
import sys
from pathlib import Path


def strip_comments(text):
    out, i, n = [], 0, len(text)
    while i < n:
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
        elif text[i] == '"':
            # skip string literals (they may contain `crate::` or braces)
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""')
            i = j + 1
        elif text.startswith("r#\"", i):
            j = text.find('"#', i + 3)
            out.append('""')
            i = n if j < 0 else j + 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def strip_test_items(text):
    """Drop every item annotated `#[cfg(test)]` (a block item up to its matching brace, or a
    single `...;` item)."""
    while True:
        m = re.search(r"#\[cfg\(test\)\]", text)
        if not m:
            return text
        i = m.end()
        brace, semi = text.find("{", i), text.find(";", i)
        if semi >= 0 and (brace < 0 or semi < brace):
            text = text[: m.start()] + text[semi + 1 :]
            continue
        depth, j = 0, brace
        while j < len(text):
            if text[j] == "{":
                depth += 1
            elif text[j] == "}":
                depth -= 1
                if depth == 0:
                    break
            j += 1
        text = text[: m.start()] + text[j + 1 :]


def group_heads(body):
    """Top-level names of a `{a::b, c, d::{e, f}}` use-group body."""
    heads, depth, cur = [], 0, ""
    for ch in body:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if depth == 0 and ch == ",":
            heads.append(cur)
            cur = ""
        else:
            cur += ch
    heads.append(cur)
    names = []
    for h in heads:
        m = re.match(r"\s*([A-Za-z_][A-Za-z0-9_]*)", h)
        if m:
            names.append(m.group(1))
    return names


def imports_of(text):
    found = set()
    i = 0
    for m in re.finditer(r"crate\s*::\s*(\{|[A-Za-z_][A-Za-z0-9_]*)", text):
        if m.group(1) == "{":
            start, depth, j = m.end(), 1, m.end()
            while j < len(text) and depth:
                depth += {"{": 1, "}": -1}.get(text[j], 0)
                j += 1
            found.update(group_heads(text[start : j - 1]))
        else:
            found.add(m.group(1))
    del i
    return found


def modules(src):
    mods = {}
    for p in sorted(src.iterdir()):
        if p.name in ("lib.rs", "main.rs", "bin"):
            continue
        if p.is_dir():
            mods[p.name] = sorted(p.rglob("*.rs"))
        elif p.suffix == ".rs":
            mods.setdefault(p.stem, []).append(p)
    return mods


def layers_from_doc(doc):
    text = doc.read_text()
    m = re.search(r"<!-- layers -->\s*```[a-z]*\n(.*?)```", text, re.S)
    if not m:
        sys.exit(f"{doc}: no `<!-- layers -->` block")
    layers = []
    for line in m.group(1).splitlines():
        if ":" not in line:
            continue
        name, mods = line.split(":", 1)
        layers.append((name.strip(), mods.split()))
    return layers


def cycles(graph):
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    root = Path(args[0] if args else ".")
    src = root / "shared" / "src"
    mods = modules(src)
    layers = layers_from_doc(root / "docs" / "ARCHITECTURE.md")
    level = {}
    errors = []
    for n, (_, names) in enumerate(layers):
        for name in names:
            if name in level:
                errors.append(f"{name} is in two layers")
            level[name] = n
    for name in mods:
        if name not in level:
            errors.append(f"module {name} is in no layer of docs/ARCHITECTURE.md")
    for name in level:
        if name not in mods:
            errors.append(f"layer module {name} does not exist in shared/src")
    graph = {}
    for name, files in mods.items():
        deps = set()
        for f in files:
            deps |= imports_of(strip_test_items(strip_comments(f.read_text())))
        deps.discard(name)
        deps = {d for d in deps if d in mods}
        graph[name] = deps
        for d in sorted(deps):
            if name in level and d in level and level[d] > level[name]:
                errors.append(
                    f"upward import: {name} ({layers[level[name]][0]}) imports "
                    f"{d} ({layers[level[d]][0]})"
                )
    for comp in cycles(graph):
        errors.append("import cycle: " + " ↔ ".join(comp))
    if "--graph" in sys.argv:
        for name in sorted(graph, key=lambda m: (level.get(m, 99), m)):
            print(f"{name:>10} → {' '.join(sorted(graph[name]))}")
    if errors:
        print("\n".join(errors))
        sys.exit(1)
    print(f"layers ok: {len(mods)} modules in {len(layers)} layers, no upward import, no cycle")


if __name__ == "__main__":
    main()
