"""Make ``ansible_collections.pi_dispatch.egress`` importable from this checkout, for the benchmarks.

    import _collection
    _collection.expose()

When the checkout already sits at ``.../ansible_collections/pi_dispatch/egress``, its grandparent's
parent goes on ``sys.path``; otherwise a temporary folder gets an ``ansible_collections/pi_dispatch/egress``
symlink to the checkout (the way tests/conftest.py exposes it to the tests).
"""

import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def expose():
    parts = ROOT.split(os.sep)
    if parts[-3:-1] == ['ansible_collections', 'pi_dispatch']:
        base = os.sep.join(parts[:-3])
    else:
        base = tempfile.mkdtemp(prefix='pi-egress-bench-')
        os.makedirs(os.path.join(base, 'ansible_collections', 'pi_dispatch'))
        os.symlink(ROOT, os.path.join(base, 'ansible_collections', 'pi_dispatch', 'egress'))
    if base not in sys.path:
        sys.path.insert(0, base)
    return base
