"""A GitHub job on the openshell venue: github.com carries the git transport with a push to the job's repository only.

Seed 000: "on a GitHub job, github.com carries the git transport with a push admitted to the job's own
repository only; a push anywhere else is refused by the layer, which squid could not express". The render
(_openshell/translate.py ``restrict_github``), parsed by OpenShell's own ``SandboxPolicy`` message; what the
rendered rules admit, judged by OpenShell's documented REST path globs (``*`` and ``**`` match any characters,
``/`` included, ``?`` one, bracket classes: Python's ``fnmatchcase`` has exactly these); the read back, the
module and the doctor.
"""

import fnmatch

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
from ansible_collections.pi_dispatch.egress.plugins.modules import egress_openshell_policy as _module

needs_schema = pytest.mark.skipif(not _schema.available(), reason='the openshell package (%s) is not installed'
                                  % _schema.REQUIREMENT)

SEED = ('api.anthropic.com          # the provider: every turn of every job\n'
        '.github.com                # your forge: the push and the pull request\n'
        "registry.npmjs.org         # only when a job installs the serviced repo's own dependencies\n")
REPO = 'pi-dispatch/egress'


def _message(text=SEED, repository=REPO, provider=None):
    translation = _translate.translate(_allowlist.parse(text, '/d/egress-allowlist.conf'),
                                       github_repository=repository, credential_provider=provider)
    return translation, _schema.parse(translation.policy, 'the rendered policy')


def _endpoints(message):
    return [e for rule in message.network_policies.values() for e in rule.endpoints]


def admitted(endpoint, method, path):
    """Whether ``endpoint`` (a parsed NetworkEndpoint) admits ``method path``, as OpenShell documents REST rules."""
    access = type(endpoint).DESCRIPTOR.fields_by_name['access'].enum_type.values_by_number[endpoint.access].name
    if access == 'NETWORK_ACCESS_PRESET_FULL':
        return True
    assert access == 'NETWORK_ACCESS_PRESET_UNSPECIFIED', access  # no other preset is rendered
    for rule in endpoint.rules:
        allow = rule.allow
        if allow.method in ('*', method) and fnmatch.fnmatchcase(path, allow.path):
            return True
    return False


# --- the render ----------------------------------------------------------------------------------------------

@needs_schema
def test_github_com_gets_rules_and_every_other_host_keeps_full_access():
    translation, message = _message()
    github = [e for e in _endpoints(message) if e.host == 'github.com']
    assert sorted(e.port for e in github) == [80, 443]
    for endpoint in github:
        assert not endpoint.access and len(endpoint.rules) == 5
    others = [e for e in _endpoints(message) if e.host != 'github.com']
    assert {e.host for e in others} == {'api.anthropic.com', '**.github.com', 'registry.npmjs.org'}
    assert all(e.access and not e.rules for e in others)
    assert translation.limits[-1] == _translate.LIMIT_GITHUB % REPO
    assert translation.github_repository == REPO


# (method, path, admitted on github.com for a job of pi-dispatch/egress)
REQUESTS = [
    # a push to the job's own repository, with and without .git
    ('POST', '/pi-dispatch/egress.git/git-receive-pack', True),
    ('POST', '/pi-dispatch/egress/git-receive-pack', True),
    # a push anywhere else
    ('POST', '/someone/else.git/git-receive-pack', False),
    ('POST', '/pi-dispatch/egress-fork.git/git-receive-pack', False),
    ('POST', '/pi-dispatch/egress.git.evil/git-receive-pack', False),
    ('POST', '/x/pi-dispatch/egress.git/git-receive-pack', False),
    ('POST', '/pi-dispatch/egress.git/git-receive-pack/x', False),
    ('POST', '/PI-DISPATCH/egress.git/git-receive-pack', False),  # GitHub's names are case-blind; this is refused
    ('POST', '/pi-dispatch/other.git/git-receive-pack', False),
    ('POST', '/git-receive-pack', False),
    # a fetch from any repository: the ref advertisement and upload-pack
    ('GET', '/someone/else.git/info/refs', True),
    ('GET', '/pi-dispatch/egress.git/info/refs', True),
    ('POST', '/someone/else.git/git-upload-pack', True),
    ('POST', '/pi-dispatch/egress.git/git-upload-pack', True),
    ('HEAD', '/pi-dispatch/egress', True),
    ('GET', '/', True),
    # every other write on github.com
    ('POST', '/session', False),
    ('POST', '/pi-dispatch/egress.git/info/lfs/objects/batch', False),
    ('PUT', '/pi-dispatch/egress.git/git-receive-pack', False),
    ('PATCH', '/pi-dispatch/egress', False),
    ('DELETE', '/pi-dispatch/egress', False),
    ('OPTIONS', '/pi-dispatch/egress.git/info/refs', False),
]


@needs_schema
@pytest.mark.parametrize('method, path, expected', REQUESTS, ids=['%s %s' % r[:2] for r in REQUESTS])
def test_what_github_com_admits_on_a_github_job(method, path, expected):
    _translation, message = _message()
    for endpoint in [e for e in _endpoints(message) if e.host == 'github.com']:
        assert admitted(endpoint, method, path) is expected, (endpoint.port, method, path)


@needs_schema
def test_without_a_repository_github_com_is_rendered_as_listed():
    _translation, message = _message(repository=None)
    github = [e for e in _endpoints(message) if e.host == 'github.com']
    assert github and all(e.access and not e.rules for e in github)
    assert admitted(github[0], 'POST', '/someone/else.git/git-receive-pack')


@needs_schema
def test_a_repository_with_no_github_rule_is_said():
    translation, message = _message(text='api.anthropic.com\n')
    assert all(not e.rules for e in _endpoints(message))
    assert translation.limits[-1] == _translate.LIMIT_GITHUB_UNLISTED % REPO


@needs_schema
def test_an_exact_github_com_line_is_restricted_too():
    _translation, message = _message(text='github.com\n')
    assert [len(e.rules) for e in _endpoints(message)] == [5, 5]


@pytest.mark.parametrize('value', ['pi-dispatch/egress', 'a/b', 'Owner1/repo.name_x-y', 'o/.github', 'o/' + 'r' * 100])
def test_a_repository_is_owner_slash_name(value):
    assert _translate.check_github_repository(value) == value


@pytest.mark.parametrize('value', ['pi-dispatch', 'a/b/c', '/a/b', 'a/', '/b', '-x/y', 'a/b.git', 'a/..', 'a/.',
                                   'a/*', 'a/b?', 'a/[b]', 'a b/c', 'a/b c', 'o' * 40 + '/r', 'o/' + 'r' * 101, '', 7,
                                   ['a/b']])
def test_anything_else_is_refused_naming_the_option(value):
    with pytest.raises(ValueError) as err:
        _translate.check_github_repository(value)
    assert str(err.value).startswith('github_repository: ') and 'owner/name' in str(err.value)
    with pytest.raises(ValueError) as err:
        _translate.check_github_repository(value, 'openshell_github_repository')
    assert str(err.value).startswith('openshell_github_repository: ')


def test_no_repository_is_no_restriction():
    assert _translate.check_github_repository(None) is None


# --- the read back -------------------------------------------------------------------------------------------

@needs_schema
@pytest.mark.parametrize('read_back_repository', [None, 'someone/else'])
def test_a_policy_that_admits_a_push_elsewhere_differs_at_github_com(read_back_repository):
    _t, rendered = _message(provider='p')
    _t, read_back = _message(repository=read_back_repository, provider='p')
    differences = _readback.compare(rendered, read_back)
    found = [(d.host, d.port, d.kind) for d in differences]
    assert found == [('github.com', 80, 'changed'), ('github.com', 443, 'changed')]


# --- the module and the doctor ------------------------------------------------------------------------------

def _folder(tmp_path):
    folder = tmp_path / 'egress'
    folder.mkdir()
    (folder / 'egress-allowlist.conf').write_text(SEED)
    return folder


@needs_schema
def test_the_module_restricts_and_refuses_a_read_back_that_pushes_anywhere(tmp_path, run_module):
    folder = _folder(tmp_path)
    listed = tmp_path / 'listed.yaml'
    kind, result = run_module(_module.main, dict(deploy_dir=str(folder), dest=str(listed)))
    assert kind == 'exit', result
    kind, result = run_module(_module.main, dict(deploy_dir=str(folder), github_repository=REPO))
    assert kind == 'exit', result
    github = [e for r in result['policy']['network_policies'].values() for e in r['endpoints']
              if e['host'] == 'github.com']
    assert all(e['rules'] == _translate.github_rules(REPO) and 'access' not in e for e in github)
    assert _translate.LIMIT_GITHUB % REPO in result['limits']
    kind, result = run_module(_module.main,
                              dict(deploy_dir=str(folder), github_repository=REPO, compare_with=str(listed)))
    assert kind == 'fail' and _readback.READBACK_DIFFERS in result['msg']
    assert [(d['host'], d['port']) for d in result['differences']] == [('github.com', 80), ('github.com', 443)]


@needs_schema
def test_the_module_refuses_a_bad_repository_and_writes_nothing(tmp_path, run_module):
    folder = _folder(tmp_path)
    dest = tmp_path / 'p.yaml'
    kind, result = run_module(_module.main, dict(deploy_dir=str(folder), github_repository='a/*', dest=str(dest)))
    assert kind == 'fail' and result['msg'].startswith('github_repository: ') and not dest.exists()


@needs_schema
@pytest.mark.parametrize('deployed, expected, status', [
    (REPO, REPO, 'ok'),
    (None, REPO, 'fail'),            # the deployed policy admits a push anywhere
    ('someone/else', REPO, 'fail'),  # ... or to another repository
    (REPO, None, 'fail'),
])
def test_the_doctor_renders_github_com_for_the_job(tmp_path, deployed, expected, status):
    folder = _folder(tmp_path)
    params = _openshell.render_params(None, deployed)
    params.update(dest=str(folder / 'openshell-policy.yaml'))
    _apply.PolicyRun(params, _deployment.Layout(str(folder))).run()
    ctx = DoctorContext(client=None, proxy='p', deploy_dir=str(folder), probe_image='i', pid=1, environ={},
                        openshell_policy=str(folder / 'openshell-policy.yaml'), openshell_github_repository=expected)
    lines = _openshell.OpenShellCheck().lines(ctx)
    assert [line.status for line in lines] == [status], lines
    if status == 'fail':
        assert 'github.com:443: changed' in lines[0].message and 'github.com:80: changed' in lines[0].message
        assert 'in 2 endpoints' in lines[0].message


def test_the_doctor_option_is_checked_and_passed_on():
    params = dict(proxy_name='p', probe_image='i', provider_host='a.test', deny_host='b.test', listed_host=None,
                  probe_timeout=10, probe_start_grace=20, docker_host=None, endpoint_timeout=15, models_json=None,
                  isolation=True, job_network_pool='10.0.0.0/8', job_network_prefix=28, sweep=True, firewall=True,
                  firewall_chain_prefix='PI-EGRESS', firewall_probe=True, fallback_probe_image=None,
                  decision_log_dir=None, openshell_github_repository=REPO)
    _doctor.check_canary_options(params)
    options = _doctor.canary_options(params, '/d')
    assert DoctorContext.build(None, options).openshell_github_repository == REPO
    with pytest.raises(ValueError) as err:
        _doctor.check_canary_options(dict(params, openshell_github_repository='no-slash'))
    assert str(err.value).startswith('openshell_github_repository: ')
