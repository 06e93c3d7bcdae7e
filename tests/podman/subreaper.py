"""Run a command as a child subreaper, reaping every orphan it inherits (./run gate podman).

``python3 subreaper.py podman system service ...``. The program is the product's own: ``SUBREAPER_SOURCE`` of
``plugins/module_utils/_podman/supervision.py``, which ``egress_podman_account`` runs (``python3 -c``) for a
supervised ``podman system service``. It is read from that file here (no import: the gate's ``python3`` has no
Ansible) and run as this process, so the gate's service is supervised exactly as the module's is. Why a
subreaper: netavark starts aardvark-dns detached; on a machine whose PID 1 reaps late the exited aardvark-dns
stays a zombie, netavark finds its pid "alive" and name resolution on every Podman network stops
(docs/podman.md, "a PID 1 that reaps late").
"""

import ast
import os
import sys

PRODUCT = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'plugins', 'module_utils', '_podman',
                       'supervision.py')


def source():
    """SUBREAPER_SOURCE, read from the product's file without importing it."""
    with open(PRODUCT) as handle:
        tree = ast.parse(handle.read(), PRODUCT)
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, 'id', None) for t in node.targets] == ['SUBREAPER_SOURCE']:
            return ast.literal_eval(node.value)
    sys.exit('%s has no SUBREAPER_SOURCE' % PRODUCT)


if __name__ == '__main__':
    program = source()
    sys.argv = ['subreaper'] + sys.argv[1:]
    exec(compile(program, PRODUCT + ':SUBREAPER_SOURCE', 'exec'), {'__name__': '__main__'})
