"""Make ``ansible_collections.pi_dispatch.egress`` importable from this checkout.

Unit and integration tests import the collection's module_utils directly
(no Ansible process). The checkout is exposed under a temporary
``ansible_collections/pi_dispatch/egress`` symlink so the same import paths
that modules use work here, whatever the checkout's directory is called.
"""

import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _expose_collection():
    parts = ROOT.split(os.sep)
    if len(parts) >= 3 and parts[-3:-1] == ['ansible_collections', 'pi_dispatch'] and parts[-1] == 'egress':
        base = os.sep.join(parts[:-3])
    else:
        base = tempfile.mkdtemp(prefix='pi-egress-unit-')
        ns = os.path.join(base, 'ansible_collections', 'pi_dispatch')
        os.makedirs(ns)
        os.symlink(ROOT, os.path.join(ns, 'egress'))
    if base not in sys.path:
        sys.path.insert(0, base)


_expose_collection()
