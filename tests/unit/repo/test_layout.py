"""docs/layout.md is true to the tree: every file under plugins/ has its line, and every line a file."""

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _listed():
    with open(os.path.join(ROOT, 'docs', 'layout.md')) as handle:
        return set(p for p in re.findall(r'^\| `(plugins/[^`]+)` \|', handle.read(), re.M) if not p.endswith('/'))


def _files():
    out = set()
    for folder, _dirs, names in os.walk(os.path.join(ROOT, 'plugins')):
        for name in names:
            if name.endswith('.py') and name != '__init__.py':
                out.add(os.path.relpath(os.path.join(folder, name), ROOT))
    return out


def test_every_plugin_file_has_a_line_in_the_layout():
    missing = sorted(_files() - _listed())
    assert not missing, 'docs/layout.md has no line for %s: add "| `<path>` | <one line> |"' % missing


def test_every_line_of_the_layout_names_a_file_that_exists():
    gone = sorted(_listed() - _files())
    assert not gone, 'docs/layout.md lists files that are not in the tree: %s' % gone


def _packages():
    with open(os.path.join(ROOT, 'docs', 'layout.md')) as handle:
        return re.findall(r'^\| `plugins/module_utils/(_\w+)/` \|', handle.read(), re.M)


def test_every_package_has_a_line_and_imports_only_the_packages_above_it():
    """The package table is the import order: a package imports only those listed above it."""
    import ast
    base = os.path.join(ROOT, 'plugins', 'module_utils')
    prefix = 'ansible_collections.pi_dispatch.egress.plugins.module_utils'
    order = _packages()
    present = sorted(n for n in os.listdir(base) if os.path.isdir(os.path.join(base, n)) and n.startswith('_')
                     and n != '__pycache__')
    assert sorted(order) == present, 'docs/layout.md package table %s, tree %s' % (order, present)
    wrong = []
    for index, package in enumerate(order):
        for name in sorted(os.listdir(os.path.join(base, package))):
            if not name.endswith('.py'):
                continue
            with open(os.path.join(base, package, name)) as handle:
                tree = ast.parse(handle.read())
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(prefix + '.'):
                    target = node.module[len(prefix) + 1:].split('.')[0]
                    if target == 'jobnet' or (target in order and order.index(target) > index):
                        wrong.append('%s/%s imports %s' % (package, name, node.module[len(prefix) + 1:]))
    assert not wrong, wrong


def test_no_file_re_exports_a_name_but_the_public_api():
    """An import kept only to be re-exported (``noqa: F401``) is allowed in jobnet.py and its alias alone."""
    allowed = {'plugins/module_utils/jobnet.py'}
    found = []
    for path in sorted(_files() - allowed):
        with open(os.path.join(ROOT, path)) as handle:
            for lineno, line in enumerate(handle, 1):
                if 'F401' in line and 'import docker' not in line:  # the SDK probe in docker_client
                    found.append('%s:%d' % (path, lineno))
    assert not found, 'import the name from the file that defines it, not through %s' % found
