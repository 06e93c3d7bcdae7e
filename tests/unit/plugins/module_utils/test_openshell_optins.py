"""A project's opt-ins on the openshell venue (_openshell/translate.py ``_optin``): what is a rule, what is refused.

The opt-ins are seed 001's ``.pi-container/config.yaml`` (``egress.allow``), read by the same
``_policy/optins.py`` a transparent job network reads. Every rendered policy is parsed by OpenShell's own
``SandboxPolicy`` message; the module and the doctor read the file through ``project_policy``.
"""

import os

import pytest


from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import doctor as _doctor
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import openshell as _openshell
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.context import DoctorContext
from ansible_collections.pi_dispatch.egress.plugins.module_utils._openshell import apply as _apply
from ansible_collections.pi_dispatch.egress.plugins.module_utils._openshell import readback as _readback
from ansible_collections.pi_dispatch.egress.plugins.module_utils._openshell import schema as _schema
from ansible_collections.pi_dispatch.egress.plugins.module_utils._openshell import translate as _translate
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import allowlist as _allowlist
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import deployment as _deployment
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import optins as _optins
from ansible_collections.pi_dispatch.egress.plugins.modules import egress_openshell_policy as _module

needs_schema = pytest.mark.skipif(not _schema.available(), reason='the openshell package (%s) is not installed'
                                  % _schema.REQUIREMENT)

POLICY = '/p/.pi-container/config.yaml'
SEED = 'api.anthropic.com\n.github.com\n'


def _allow(**allow):
    return _optins.validate({'egress': {'allow': allow}}, POLICY)


def _render(optins, repository=None, provider=None):
    translation = _translate.translate(_allowlist.parse(SEED, '/d/egress-allowlist.conf'), optins=optins,
                                       github_repository=repository, credential_provider=provider)
    return translation, _schema.parse(translation.policy, 'the rendered policy')


def _optin_endpoints(message):
    """{rule key: [(host, port, protocol)]} of the opt-in rules, read from the parsed message."""
    return dict((key, sorted((e.host, e.port, e.protocol) for e in rule.endpoints))
                for key, rule in message.network_policies.items() if key.startswith('optin_'))


# (case, egress.allow, the opt-in rules the policy carries)
TABLE = [
    ('the seed: every opt-in closed', dict(ssh=False, smtp=False, git=False, ntp=False, tcp_ports=[], udp_ports=[]),
     {}),
    ('ssh towards one forge', dict(ssh=['gitlab.example.com']), {'optin_tcp_22': [('gitlab.example.com', 22, '')]}),
    ('git:// towards two names', dict(git=['git.example.com', 'mirror.example.com']),
     {'optin_tcp_9418': [('git.example.com', 9418, ''), ('mirror.example.com', 9418, '')]}),
    ('smtp: its three ports', dict(smtp=['mail.example.com']),
     {'optin_tcp_25': [('mail.example.com', 25, '')], 'optin_tcp_465': [('mail.example.com', 465, '')],
      'optin_tcp_587': [('mail.example.com', 587, '')]}),
    ('a port with its hosts', dict(tcp_ports=[{'port': 2222, 'hosts': ['ssh.example.com']}]),
     {'optin_tcp_2222': [('ssh.example.com', 2222, '')]}),
    ('ssh on github.com when the job is not a GitHub job', dict(ssh=['github.com']),
     {'optin_tcp_22': [('github.com', 22, '')]}),
]


@needs_schema
@pytest.mark.parametrize('case, allow, expected', TABLE, ids=[c[0] for c in TABLE])
def test_an_opt_in_towards_names_is_a_passthrough_rule(case, allow, expected):
    translation, message = _render(_allow(**allow))
    assert _optin_endpoints(message) == expected, case
    assert (_translate.LIMIT_OPTIN in translation.limits) is bool(expected)
    for origin in translation.origins():
        if origin['source'] == 'project-policy':
            assert origin['where'] == POLICY and origin['entry'].startswith('tcp/')


# (case, egress.allow, repository, the entry refused, words of the reason)
REFUSED = [
    ('ssh towards every name', dict(ssh=True), None, 'tcp/22 towards any name', 'towards every name'),
    ('a tcp port towards every name', dict(tcp_ports=[2222]), None, 'tcp/2222 towards any name',
     'towards every name'),
    ('ntp', dict(ntp=['pool.ntp.example.com']), None, 'udp/123 towards pool.ntp.example.com', 'UDP'),
    ('a udp port', dict(udp_ports=[{'port': 51820, 'hosts': ['vpn.example.com']}]), None,
     'udp/51820 towards vpn.example.com', 'UDP'),
    ('ssh on github.com on a GitHub job', dict(ssh=['github.com', 'gitlab.example.com']), 'pi-dispatch/egress',
     'tcp/22 towards github.com, gitlab.example.com', 'push to any repository'),
]


@needs_schema
@pytest.mark.parametrize('case, allow, repository, entry, words', REFUSED, ids=[r[0] for r in REFUSED])
def test_what_cannot_be_expressed_without_widening_is_refused(case, allow, repository, entry, words):
    with pytest.raises(_translate.Untranslatable) as err:
        _render(_allow(**allow), repository=repository)
    [refusal] = err.value.refusals
    assert (refusal.source, refusal.where, refusal.entry) == ('project-policy', POLICY, entry), case
    assert words in refusal.reason and refusal.fix
    assert str(err.value).startswith(_translate.UNTRANSLATABLE)


@needs_schema
def test_every_refused_port_is_named_at_once():
    with pytest.raises(_translate.Untranslatable) as err:
        _render(_allow(ssh=True, ntp=True, tcp_ports=[{'port': 2222, 'hosts': ['ok.example.com']}]))
    assert [r.entry for r in err.value.refusals] == ['tcp/22 towards any name', 'udp/123 towards any name']


@needs_schema
def test_a_passthrough_opt_in_is_never_bound_to_the_provider():
    _translation, message = _render(_allow(ssh=['gitlab.example.com']), provider='job-1')
    for key, rule in message.network_policies.items():
        for endpoint in rule.endpoints:
            assert endpoint.credential_binding.provider == ('' if key.startswith('optin_') else 'job-1'), key


@needs_schema
def test_a_policy_that_lost_an_opt_in_is_named():
    _t, with_optin = _render(_allow(ssh=['gitlab.example.com']))
    _t, without = _render(_allow())
    assert [(d.host, d.port, d.kind) for d in _readback.compare(with_optin, without)] == [
        ('gitlab.example.com', 22, 'missing')]
    assert [(d.host, d.port, d.kind) for d in _readback.compare(without, with_optin)] == [
        ('gitlab.example.com', 22, 'added')]


# --- the module ----------------------------------------------------------------------------------------------


@pytest.fixture
def project(tmp_path):
    folder = tmp_path / 'egress'
    folder.mkdir()
    (folder / 'egress-allowlist.conf').write_text(SEED)
    (tmp_path / 'project' / '.pi-container').mkdir(parents=True)
    return folder, tmp_path / 'project' / '.pi-container' / 'config.yaml'


def approve(policy, folder):
    """What the operator does after reading the refusal: review (check mode), then approve that digest."""
    review = _optins.approve(str(policy), str(folder), None, check_mode=True)
    _optins.approve(str(policy), str(folder), review['digest'])


@needs_schema
def test_an_unapproved_project_policy_is_refused_and_nothing_is_written(project, tmp_path, run_module):
    """A job of the project can write the file: on the OpenShell venue too, what it opens takes effect only as
    the operator approved it (issue 42, item 10)."""
    folder, policy = project
    dest = tmp_path / 'out.yaml'
    policy.write_text('egress:\n  allow:\n    ssh: [gitlab.example.com]\n')
    kind, result = run_module(_module.main, dict(deploy_dir=str(folder), project_policy=str(policy), dest=str(dest)))
    assert kind == 'fail' and 'approve-optins' in result['msg'] and str(policy) in result['msg'], result['msg']
    assert 'nothing was' in result['msg'].lower() and not dest.exists()
    approve(policy, folder)
    policy.write_text('egress:\n  allow:\n    ssh: [gitlab.example.com, attacker.example.com]\n')
    kind, result = run_module(_module.main, dict(deploy_dir=str(folder), project_policy=str(policy), dest=str(dest)))
    assert kind == 'fail' and 'attacker.example.com' in result['msg'] and not dest.exists(), result['msg']


@needs_schema
def test_the_module_renders_the_projects_opt_ins(project, run_module):
    folder, policy = project
    policy.write_text('egress:\n  allow:\n    ssh: [gitlab.example.com]\n    ntp: false\n')
    approve(policy, folder)
    kind, result = run_module(_module.main, dict(deploy_dir=str(folder), project_policy=str(policy)))
    assert kind == 'exit', result
    assert result['policy']['network_policies']['optin_tcp_22']['endpoints'] == [
        {'host': 'gitlab.example.com', 'port': 22}]
    assert [r['where'] for r in result['rules'] if r['source'] == 'project-policy'] == [str(policy)]


@needs_schema
def test_a_missing_project_policy_opts_in_nothing_and_is_not_created(project, run_module):
    folder, policy = project
    kind, result = run_module(_module.main, dict(deploy_dir=str(folder), project_policy=str(policy)))
    assert kind == 'exit', result
    assert not policy.exists()
    assert not [k for k in result['policy']['network_policies'] if k.startswith('optin_')]
    assert any(str(policy) in w and 'was not created' in w for w in result.get('warnings', []))


@needs_schema
@pytest.mark.parametrize('setup, words', [
    ('relative', "project_policy 'config.yaml' is not an absolute path"),
    ('symlink', 'is a symlink, not a regular file'),
    ('not yaml', 'config.yaml'),
    ('udp', 'openshell-egress-untranslatable'),
])
def test_a_bad_project_policy_is_refused_naming_it_and_nothing_is_written(project, tmp_path, setup,
                                                                          words, run_module):
    folder, policy = project
    dest = tmp_path / 'out.yaml'
    path = str(policy)
    if setup == 'relative':
        path = 'config.yaml'
    elif setup == 'symlink':
        (tmp_path / 'elsewhere.yaml').write_text('egress:\n  allow:\n    ssh: false\n')
        os.symlink(str(tmp_path / 'elsewhere.yaml'), path)
    elif setup == 'not yaml':
        policy.write_text('egress: [unclosed\n')
    else:
        policy.write_text('egress:\n  allow:\n    udp_ports: [51820]\n')
        approve(policy, folder)
    kind, result = run_module(_module.main, dict(deploy_dir=str(folder), project_policy=path, dest=str(dest)))
    assert kind == 'fail' and words in result['msg'], result['msg']
    assert 'nothing was' in result['msg'].lower() and 'written' in result['msg'] and not dest.exists()


# --- the doctor ----------------------------------------------------------------------------------------------

@needs_schema
@pytest.mark.parametrize('deployed_with_optins, status', [(True, 'ok'), (False, 'fail')])
def test_the_doctor_renders_the_projects_opt_ins(project, deployed_with_optins, status):
    folder, policy = project
    policy.write_text('egress:\n  allow:\n    ssh: [gitlab.example.com]\n')
    approve(policy, folder)
    params = _openshell.render_params(None, None, str(policy) if deployed_with_optins else None)
    params.update(dest=str(folder / 'openshell-policy.yaml'))
    _apply.PolicyRun(params, _deployment.Layout(str(folder))).run()
    ctx = DoctorContext(client=None, proxy='p', deploy_dir=str(folder), probe_image='i', pid=1, environ={},
                        openshell_policy=str(folder / 'openshell-policy.yaml'), openshell_project_policy=str(policy))
    lines = _openshell.OpenShellCheck().lines(ctx)
    assert [line.status for line in lines] == [status], lines
    if status == 'fail':
        assert 'gitlab.example.com:22: missing' in lines[0].message


def test_the_doctor_option_is_checked_and_passed_on():
    params = dict(proxy_name='p', probe_image='i', provider_host='a.test', deny_host='b.test', listed_host=None,
                  probe_timeout=10, probe_start_grace=20, docker_host=None, endpoint_timeout=15, models_json=None,
                  isolation=True, job_network_pool='10.0.0.0/8', job_network_prefix=28, sweep=True, firewall=True,
                  firewall_chain_prefix='PI-EGRESS', firewall_probe=True, fallback_probe_image=None,
                  decision_log_dir=None, openshell_project_policy='/p/.pi-container/config.yaml')
    _doctor.check_canary_options(params)
    options = _doctor.canary_options(params, '/d')
    assert DoctorContext.build(None, options).openshell_project_policy == '/p/.pi-container/config.yaml'
    with pytest.raises(ValueError) as err:
        _doctor.check_canary_options(dict(params, openshell_project_policy='config.yaml'))
    assert str(err.value).startswith("openshell_project_policy 'config.yaml' is not an absolute path")
