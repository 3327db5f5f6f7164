#!/usr/bin/env python3
"""Checks that the tree's layout shows its architecture (docs/design.md, "Layers").

Reads every quoted #include line of the C++ and CUDA sources and every import of the Python
package, and fails (exit 1, one line per finding, each saying what to change) on:
  - a cycle between source folders (a folder is the directory a file sits in: daemon/copy,
    client/mapped/cuda, ...), with one include line for each arrow of the cycle;
  - common/ or kernels/ including daemon/ or client/ (base code never reaches up);
  - daemon/ including client/ or client/ including daemon/ (they meet only in include/stash,
    proto/ and kernels/'s control-block layout);
  - a folder of source files holding more than 20 of them;
  - a non-test source file over 800 lines;
  - a module of the Python package (client/python/stashd) importing one that imports it back,
    directly or through others (imports inside functions count; `if TYPE_CHECKING:` blocks,
    which never run, do not), or the core package importing stashd.torch.

  tests/layout/check_layout.py [repo root]     (default: this checkout)
"""
import ast
import os
import re
import subprocess
import sys

MAX_FILES_PER_FOLDER = 20
MAX_LINES = 800
SOURCE_EXT = ('.h', '.cc', '.cu', '.cuh')
# Folders whose files are held to the 800-line rule: everything but tests.
LINE_RULE_ROOTS = ('daemon/', 'client/', 'common/', 'include/', 'kernels/', 'bench/', 'examples/')
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def tracked_files(root):
    out = subprocess.run(['git', 'ls-files', '-co', '--exclude-standard'], cwd=root,
                         capture_output=True, text=True, check=True).stdout
    return [f for f in out.split('\n') if f and os.path.isfile(os.path.join(root, f))]


def find_cycle(graph):
    """Returns one cycle as a list of nodes [a, b, ..., a], or None."""
    color = {}
    stack = []

    def visit(node):
        color[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if color.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in color:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        color[node] = 2
        return None

    for node in sorted(graph):
        if node not in color:
            found = visit(node)
            if found:
                return found
    return None


def check_sources(root, files, problems):
    sources = [f for f in files if f.endswith(SOURCE_EXT) and not f.startswith('tests/')]
    known = set(files)
    graph = {}
    witness = {}
    for f in sources:
        folder = os.path.dirname(f)
        text = open(os.path.join(root, f), encoding='utf-8', errors='replace').read()
        if f.startswith(LINE_RULE_ROOTS):
            n = text.count('\n')
            if n > MAX_LINES:
                problems.append(f'{f}: {n} lines (at most {MAX_LINES} outside tests): split it at its seam')
        for m in INCLUDE.finditer(text):
            target = m.group(1)
            if target not in known:
                continue  # generated (stash/v1/*.pb.h) or relative to the file itself
            line = text.count('\n', 0, m.start()) + 1
            to = os.path.dirname(target)
            top_from, top_to = f.split('/')[0], target.split('/')[0]
            if top_from in ('common', 'kernels') and top_to in ('daemon', 'client'):
                problems.append(f'{f}:{line} includes {target}: {top_from}/ is base code and may not '
                                f'include {top_to}/; move what it needs down into {top_from}/ or include/stash/')
            if {top_from, top_to} == {'daemon', 'client'}:
                problems.append(f'{f}:{line} includes {target}: daemon/ and client/ meet only in '
                                'include/stash/, proto/ and kernels/')
            if to != folder:
                graph.setdefault(folder, set()).add(to)
                witness.setdefault((folder, to), f'{f}:{line} includes {target}')
    cycle = find_cycle(graph)
    if cycle:
        arrows = '; '.join(witness[(a, b)] for a, b in zip(cycle, cycle[1:]))
        problems.append(f'folder cycle {" -> ".join(cycle)}: {arrows}. '
                        'Break one arrow: move the type it needs into the folder that owns it')
    counts = {}
    for f in sources:
        if f.startswith(('daemon/', 'client/')):
            counts[os.path.dirname(f)] = counts.get(os.path.dirname(f), 0) + 1
    for folder, n in sorted(counts.items()):
        if n > MAX_FILES_PER_FOLDER:
            problems.append(f'{folder}/: {n} source files (at most {MAX_FILES_PER_FOLDER}): '
                            'give it subfolders by concept')


def python_imports(path, module, package_modules):
    """The package modules `module` imports, wherever in the file, TYPE_CHECKING blocks aside."""
    tree = ast.parse(open(path, encoding='utf-8').read(), path)
    found = set()
    parts = module.split('.')
    is_package = os.path.basename(path) == '__init__.py'

    def resolve(level, name):
        base = parts if is_package else parts[:-1]
        if level:
            base = base[:len(base) - (level - 1)]
            return '.'.join(base + ([name] if name else []))
        return name

    def walk(node):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and 'TYPE_CHECKING' in ast.unparse(child.test):
                for sub in child.orelse:
                    walk(sub)
                continue
            if isinstance(child, ast.Import):
                for alias in child.names:
                    found.add(alias.name)
            elif isinstance(child, ast.ImportFrom):
                target = resolve(child.level, child.module)
                found.add(target)
                for alias in child.names:
                    found.add(f'{target}.{alias.name}')
            walk(child)

    walk(tree)
    edges = set()
    for name in found:
        # An import of a.b.c runs a, a.b and a.b.c: each that is a module of ours is an edge.
        bits = name.split('.')
        for i in range(1, len(bits) + 1):
            cand = '.'.join(bits[:i])
            if cand in package_modules and cand != module and not module.startswith(cand + '.') \
                    and not (cand == module.rsplit('.', 1)[0]):
                edges.add(cand)
    return edges


def check_python(root, files, problems):
    base = 'client/python/'
    modules = {}
    for f in files:
        if f.startswith(base + 'stashd/') and f.endswith('.py'):
            rel = f[len(base):-3].replace('/', '.')
            if rel.endswith('.__init__'):
                rel = rel[:-len('.__init__')]
            modules[rel] = os.path.join(root, f)
    if not modules:
        problems.append(f'no Python package found under {base}stashd')
        return
    graph = {m: python_imports(p, m, set(modules)) for m, p in modules.items()}
    cycle = find_cycle(graph)
    if cycle:
        problems.append(f'Python import cycle {" -> ".join(cycle)}: move what the last import '
                        'needs so that imports run one way')
    for m, deps in sorted(graph.items()):
        if not m.startswith('stashd.torch') and any(d.startswith('stashd.torch') for d in deps):
            problems.append(f'{modules[m]}: the core package imports stashd.torch '
                            f'({sorted(d for d in deps if d.startswith("stashd.torch"))}): '
                            'only stashd.torch may import torch')


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), '..', '..')
    root = os.path.abspath(root)
    files = tracked_files(root)
    problems = []
    check_sources(root, files, problems)
    check_python(root, files, problems)
    for p in problems:
        print(f'layout: {p}', file=sys.stderr)
    if problems:
        print(f'layout: {len(problems)} problem(s) (docs/design.md, "Layers")', file=sys.stderr)
        return 1
    print('layout: folders acyclic, base code stays down, folders and files within size, '
          'Python imports one way')
    return 0


if __name__ == '__main__':
    sys.exit(main())
