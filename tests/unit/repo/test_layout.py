"""docs/layout.md is true to the tree: every file under plugins/ has its line, and every line a file."""

import os
import re

import pytest

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


PREFIX = 'ansible_collections.pi_dispatch.egress.plugins.module_utils'


def imported_targets(source, package):
    """What a file of ``package`` (``_proxy``) imports from module_utils: the first part after it of every import
    (``_common``, ``jobnet``), in every spelling: ``from <prefix>._x.y import z``, ``from <prefix> import jobnet``,
    ``from <prefix>._x import y``, ``import <prefix>._x.y``, and relative (``from .. import jobnet``,
    ``from ..jobnet import z``, ``from ._x import y`` inside module_utils). Parsed (AST), never matched as text."""
    import ast
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name[len(PREFIX) + 1:].split('.')[0] for a in node.names if a.name.startswith(PREFIX + '.')]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                # the file is module_utils/<package>/<name>.py: level 1 is its package, level 2 module_utils
                if node.level == 1:
                    base = [package]
                elif node.level == 2:
                    base = []
                else:
                    found.append('<above-module_utils>')
                    continue
                parts = base + (node.module.split('.') if node.module else [])
            elif node.module == PREFIX:
                parts = []
            elif node.module and node.module.startswith(PREFIX + '.'):
                parts = node.module[len(PREFIX) + 1:].split('.')
            else:
                continue
            if parts:
                found.append(parts[0])
            else:
                found += [a.name for a in node.names]
    return found


def layer_problems(package, name, source, order):
    """Why a file of ``package`` breaks the package order (a package imports only those listed above it, and never
    the public ``jobnet``), as ``<package>/<name> imports <target>`` lines."""
    index = order.index(package)
    wrong = []
    for target in imported_targets(source, package):
        if target == package:
            continue
        if target == 'jobnet' or target not in order[:index]:
            if target in order or target == 'jobnet' or target.startswith('<'):
                wrong.append('%s/%s imports %s' % (package, name, target))
    return wrong


def test_every_package_has_a_line_and_imports_only_the_packages_above_it():
    """The package table is the import order: a package imports only those listed above it."""
    base = os.path.join(ROOT, 'plugins', 'module_utils')
    order = _packages()
    present = sorted(n for n in os.listdir(base) if os.path.isdir(os.path.join(base, n)) and n.startswith('_')
                     and n != '__pycache__')
    assert sorted(order) == present, 'docs/layout.md package table %s, tree %s' % (order, present)
    wrong = []
    for package in order:
        for name in sorted(os.listdir(os.path.join(base, package))):
            if name.endswith('.py'):
                with open(os.path.join(base, package, name)) as handle:
                    wrong += layer_problems(package, name, handle.read(), order)
    assert not wrong, wrong


ORDER = ['_common', '_policy', '_proxy']


@pytest.mark.parametrize('source, wrong', [
    # planted: every spelling of an import the order forbids is found
    ('from %s.jobnet import create_job_network' % PREFIX, ['jobnet']),
    ('from %s import jobnet' % PREFIX, ['jobnet']),
    ('from %s import jobnet as jn, _common' % PREFIX, ['jobnet']),
    ('import %s.jobnet' % PREFIX, ['jobnet']),
    ('import %s._proxy.spec as spec' % PREFIX, ['_proxy']),
    ('from %s._proxy import spec' % PREFIX, ['_proxy']),
    ('from .. import jobnet', ['jobnet']),
    ('from ..jobnet import teardown_job_network', ['jobnet']),
    ('from .._proxy.spec import PROXY_UID', ['_proxy']),
    ('from ... import something', ['<above-module_utils>']),
    ('def f():\n    from %s import jobnet\n    return jobnet' % PREFIX, ['jobnet']),   # inside a function too
    # allowed: a package above, its own package, the standard library, the SDK
    ('from %s._common import venue' % PREFIX, []),
    ('from %s import _common' % PREFIX, []),
    ('from . import spec\nfrom .spec import X', []),
    ('from .. import _common', []),
    ('import os\nimport docker\nfrom typing import Any', []),
])
def test_the_layer_rule_finds_every_spelling_of_a_forbidden_import(source, wrong):
    """Planted imports in a file of ``_policy`` (above it: ``_common`` only)."""
    assert [line.rsplit(' ', 1)[1] for line in layer_problems('_policy', 'planted.py', source, ORDER)] == wrong


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


def quiet_removes(source):
    """Lines of ``try: <x>.remove_container(..., force=True)`` whose only handler is ``except Exception: pass``:
    the quiet forced remove ``_common/docker_client.py`` ``remove_quietly`` is the one place of."""
    import ast
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Try) or len(node.body) != 1 or len(node.handlers) != 1:
            continue
        call = node.body[0].value if isinstance(node.body[0], ast.Expr) else None
        handler = node.handlers[0]
        if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                and call.func.attr == 'remove_container'
                and any(k.arg == 'force' for k in call.keywords)
                and isinstance(handler.type, ast.Name) and handler.type.id == 'Exception'
                and len(handler.body) == 1 and isinstance(handler.body[0], ast.Pass)):
            found.append(node.lineno)
    return found


def test_no_package_swallows_a_forced_remove_of_its_own():
    base = os.path.join(ROOT, 'plugins', 'module_utils')
    found = []
    for folder, _dirs, files in os.walk(base):
        for name in files:
            path = os.path.join(folder, name)
            if name.endswith('.py') and not path.endswith(os.path.join('_common', 'docker_client.py')):
                with open(path) as handle:
                    found += ['%s:%d' % (os.path.relpath(path, ROOT), line) for line in quiet_removes(handle.read())]
    assert not found, 'use docker_client.remove_quietly: %s' % found


@pytest.mark.parametrize('source, lines', [
    ('try:\n    api.remove_container(n, force=True)\nexcept Exception:\n    pass\n', [1]),   # planted
    ('def f(c):\n    try:\n        c.api.remove_container(n, force=True)\n    except Exception:  # x\n'
     '        pass\n', [2]),
    ('try:\n    api.remove_container(n, force=True)\nexcept Exception as exc:\n    log(exc)\n', []),   # reported
    ('try:\n    api.remove_container(n)\nexcept Exception:\n    pass\n', []),   # not forced: not this pattern
])
def test_the_quiet_remove_rule_finds_a_planted_one(source, lines):
    assert quiet_removes(source) == lines
