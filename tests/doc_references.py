"""Every document the project's files point to is in the project: a reference to a .md file that
the repository does not hold (tried as written, next to the referring file, and under docs/) fails,
naming the file and line. Usage: doc_references.py SOURCE_ROOT"""
import os
import re
import sys

SOURCES = ('.h', '.cpp', '.cu', '.cuh', '.py', '.sh', '.build', '.md', '.txt', '.json')
SKIPPED = {'.git', 'node_modules', 'gpu-bundle'}  # gpu-bundle: tools/gpu-bundle.sh's copy
REFERENCE = re.compile(r'(?<![\w/.-])([\w./-]*[A-Za-z0-9_-]\.md)\b')


def project_files(root):
    for folder, subfolders, files in os.walk(root):
        # Build folders (build/, build-*/) and the GPU bundle hold generated files, not the project's.
        subfolders[:] = [d for d in subfolders if d not in SKIPPED and not d.startswith('build')]
        for name in files:
            if name.endswith(SOURCES):
                yield os.path.relpath(os.path.join(folder, name), root)


def missing(root):
    for path in sorted(project_files(root)):
        with open(os.path.join(root, path), encoding='utf-8', errors='replace') as f:
            text = f.read()
        for match in REFERENCE.finditer(text):
            ref = match.group(1)
            if ref.startswith('//'):  # a web address (https://...), not a file of the project
                continue
            tries = [ref, os.path.join(os.path.dirname(path), ref), os.path.join('docs', ref)]
            if not any(os.path.isfile(os.path.join(root, os.path.normpath(t))) for t in tries):
                line = text.count('\n', 0, match.start()) + 1
                yield f'{path}:{line}: {ref} is not in the project; point to a page in docs/'


if __name__ == '__main__':
    problems = list(missing(sys.argv[1]))
    print('\n'.join(problems) if problems else 'every referenced document is in the project')
    sys.exit(1 if problems else 0)
