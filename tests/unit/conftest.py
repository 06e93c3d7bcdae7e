"""Fixtures every unit test may use."""

import json
import os

import pytest

try:
    from hypothesis import settings as _hypothesis_settings
except ImportError:   # a venv without the test requirements: the property tests are skipped by importorskip
    _hypothesis_settings = None

if _hypothesis_settings is not None:
    # The property tests of the parsers that see untrusted bytes (issue 42): a bounded run in every test run
    # ("ci", seconds), a long one from benchmarks/fuzz.py ("fuzz", PI_EGRESS_FUZZ_EXAMPLES examples per test).
    # No example database is written into the checkout.
    _hypothesis_settings.register_profile('ci', max_examples=150, deadline=None, database=None)
    _hypothesis_settings.register_profile('fuzz', max_examples=int(os.environ.get('PI_EGRESS_FUZZ_EXAMPLES', '20000')),
                                          deadline=None, database=None)
    _hypothesis_settings.load_profile(os.environ.get('PI_EGRESS_HYPOTHESIS_PROFILE', 'ci'))


class ModuleExit(Exception):
    """A module's exit_json or fail_json, caught: ``kind`` is 'exit' or 'fail', ``result`` what it returned."""

    def __init__(self, kind, result):
        super(ModuleExit, self).__init__(kind)
        self.kind = kind
        self.result = result


@pytest.fixture
def run_module(monkeypatch):
    """Run a module's ``main()`` on ``args``: returns (kind, result), the warnings it gave in result['warnings'].

    ``check_mode`` and ``diff`` as Ansible passes them. Nothing leaves the process: exit_json and fail_json raise
    :class:`ModuleExit` instead of printing and exiting.
    """
    from ansible.module_utils import basic
    from ansible.module_utils.common.text.converters import to_bytes

    def run(main, args, check_mode=False, diff=False):
        module_args = dict(args)
        if check_mode:
            module_args['_ansible_check_mode'] = True
        if diff:
            module_args['_ansible_diff'] = True
        monkeypatch.setattr(basic, '_ANSIBLE_ARGS', to_bytes(json.dumps({'ANSIBLE_MODULE_ARGS': module_args})))
        monkeypatch.setattr(basic, '_ANSIBLE_PROFILE', 'legacy', raising=False)
        warnings = []

        def leave(kind):
            def done(self, **kwargs):
                raise ModuleExit(kind, dict(kwargs, warnings=warnings))
            return done

        monkeypatch.setattr(basic.AnsibleModule, 'exit_json', leave('exit'))
        monkeypatch.setattr(basic.AnsibleModule, 'fail_json', leave('fail'))
        monkeypatch.setattr(basic.AnsibleModule, 'warn', lambda self, text: warnings.append(text))
        with pytest.raises(ModuleExit) as done:
            main()
        return done.value.kind, done.value.result

    return run
