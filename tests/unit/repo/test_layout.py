"""docs/layout.md is true to the tree: every file under plugins/ has its line, and every line a file."""

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _listed():
    with open(os.path.join(ROOT, 'docs', 'layout.md')) as handle:
        return set(re.findall(r'^\| `(plugins/[^`]+)` \|', handle.read(), re.M))


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
