"""The host-firewall layer as one namespace for the tests (unit and integration).

Importing conftest exposes the collection under ansible_collections/ (tests/conftest.py).
"""

import conftest  # noqa: F401 pylint: disable=unused-import


def firewall_namespace():
    """The host-firewall layer's four files as one namespace (``fw.X``) for the tests.

    The layer has no facade: each caller imports the file that defines a name. The tests read many
    names, so they get them through this view; a name two files both define is an error here.
    """
    import types
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._firewall import host, params, rules, table
    names = {}
    for module in (params, rules, table, host):
        for name, value in vars(module).items():
            if name.startswith('_') or getattr(value, '__module__', module.__name__) != module.__name__:
                continue
            if isinstance(value, types.ModuleType):
                continue
            if name in names and names[name] is not value:
                raise AssertionError('%s is defined by two firewall files' % name)
            names[name] = value
    return types.SimpleNamespace(**names)
