#!/usr/bin/env python3
"""Runs clang-tidy over files of a build, skipping those whose exact input was found clean before.

  scripts/lint_files.py BUILD_DIR FILE...     (scripts/lint calls it)

A file's input is what clang-tidy sees: the .clang-tidy file, clang-tidy's version, the file's
compile command (paths under the checkout made relative, so a fresh clone elsewhere matches) and
its preprocessed text (every header it includes, our own among them). A file found clean is
remembered under $STASH_LINT_CACHE (default ~/.cache/stashd-lint, outside the checkout); a file
with findings never is, so it is checked again every run until it is clean. STASH_LINT_CACHE=0
checks every file.

Prints clang-tidy's findings and exits 1 when there are any; exits 0 otherwise.
"""
import concurrent.futures
import hashlib
import json
import os
import shlex
import subprocess
import sys


def repo_root():
    return os.path.abspath(os.path.join(os.path.dirname(__file__), '..'))


def compile_args(entry):
    if 'arguments' in entry:
        return list(entry['arguments'])
    return shlex.split(entry['command'])


def preprocess_command(args, source):
    """The compile command turned into `-E` to stdout."""
    out = []
    skip = False
    for a in args:
        if skip:
            skip = False
            continue
        if a in ('-o', '-MF', '-MT', '-MQ'):
            skip = True
            continue
        if a in ('-c', '-MD', '-MMD'):
            continue
        out.append(a)
    return out + ['-E', '-P']


def key_of(entry, root, tidy_id, config):
    args = compile_args(entry)
    source = entry['file']
    pre = subprocess.run(preprocess_command(args, source), cwd=entry['directory'],
                         capture_output=True)
    if pre.returncode != 0:
        return None  # let clang-tidy say what is wrong
    h = hashlib.sha256()
    h.update(tidy_id)
    h.update(config)
    h.update(' '.join(args).replace(root, '.').encode())
    h.update(pre.stdout.replace(root.encode(), b'.'))
    return h.hexdigest()


def main():
    build, files = sys.argv[1], sys.argv[2:]
    root = repo_root()
    with open(os.path.join(build, 'compile_commands.json')) as f:
        entries = {os.path.relpath(e['file'], root): e for e in json.load(f)}
    cache = os.environ.get('STASH_LINT_CACHE',
                           os.path.join(os.environ.get('XDG_CACHE_HOME',
                                                       os.path.expanduser('~/.cache')),
                                        'stashd-lint'))
    use_cache = cache != '0'
    if use_cache:
        os.makedirs(cache, exist_ok=True)
    tidy_id = subprocess.run(['clang-tidy', '--version'], capture_output=True).stdout
    with open(os.path.join(root, '.clang-tidy'), 'rb') as f:
        config = f.read()

    def check(path):
        entry = entries[path]
        key = key_of(entry, root, tidy_id, config) if use_cache else None
        marker = os.path.join(cache, key) if key else None
        if marker and os.path.exists(marker):
            return path, True, ''
        run = subprocess.run(['clang-tidy', '-p', build, '--quiet', path], cwd=root,
                             capture_output=True, text=True)
        lines = [l for l in (run.stdout + run.stderr).splitlines()
                 if l and 'warnings generated' not in l and not l.startswith('Suppressed')
                 and not l.startswith('Use -header-filter')]
        text = '\n'.join(lines)
        clean = run.returncode == 0 and 'error:' not in text and 'warning:' not in text
        if clean and marker:
            open(marker, 'w').close()
        return path, False, '' if clean else text

    findings = []
    cached = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        for path, hit, text in pool.map(check, files):
            cached += hit
            if text:
                findings.append(text)
    print(f'lint: {len(files) - cached} files checked, {cached} unchanged since found clean')
    if findings:
        print('\n'.join(findings), file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
