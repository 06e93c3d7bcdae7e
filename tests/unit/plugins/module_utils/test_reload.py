"""The one reload path: validate the sources, squid -k parse, record + reconfigure (fake exec, no daemon)."""

import os

import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import deployment as _deployment
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import reload as _reload
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import spec as _proxy_spec


class _Result(object):
    def __init__(self, exit_code, output):
        self.exit_code = exit_code
        self.output = output


class _Container(object):
    """Answers exec_run with a scripted exit code per command (first word after squid -k)."""

    name = 'proxy-under-test'

    def __init__(self, parse_rc=0, reconfigure_rc=0):
        self.ran = []
        self.parse_rc = parse_rc
        self.reconfigure_rc = reconfigure_rc

    def exec_run(self, cmd, stdout=True, stderr=True):
        self.ran.append(cmd)
        if cmd == _reload.PARSE_CMD:
            return _Result(self.parse_rc, b'FATAL: Bungled egress-proxy.conf line 7' if self.parse_rc else b'')
        return _Result(self.reconfigure_rc, b'')


@pytest.fixture
def deploy(tmp_path):
    _deployment.apply(str(tmp_path))
    return _deployment.paths(str(tmp_path))


def test_a_good_deployment_reloads_parse_first_and_records_what_squid_read(deploy):
    container = _Container()
    record = _reload.reload(container, deploy)
    assert container.ran == [_reload.PARSE_CMD, _reload.reconfigure_cmd()]
    assert record['parsed'] and record['reconfigured']
    assert set(record['files']) == set([deploy['rules'], deploy['allowlist'], deploy['endpoints_conf'],
                                        deploy['guard_conf']])
    assert all(len(digest) == 64 for digest in record['files'].values())


@pytest.mark.parametrize('breakage, fragment', [
    ('allowlist_line', 'egress-allowlist.conf:'),
    ('allowlist_symlink', 'is a symlink'),
    ('endpoints_symlink', 'is a symlink or not a regular file'),
    ('guard_dir', 'is a symlink or not a regular file'),
])
def test_refused_sources_run_nothing_in_the_proxy(deploy, tmp_path, breakage, fragment):
    if breakage == 'allowlist_line':
        with open(deploy['allowlist'], 'a') as handle:
            handle.write('not a host name!\n')
    elif breakage == 'allowlist_symlink':
        real = str(tmp_path / 'elsewhere.conf')
        os.rename(deploy['allowlist'], real)
        os.symlink(real, deploy['allowlist'])
    elif breakage == 'endpoints_symlink':
        real = str(tmp_path / 'elsewhere-endpoints.conf')
        os.rename(deploy['endpoints_conf'], real)
        os.symlink(real, deploy['endpoints_conf'])
    else:
        os.remove(deploy['guard_conf'])
        os.mkdir(deploy['guard_conf'])
    container = _Container()
    with pytest.raises(_reload.SourcesRefused) as caught:
        _reload.reload(container, deploy)
    assert fragment in str(caught.value)
    assert caught.value.problems and all('message' in problem for problem in caught.value.problems)
    assert container.ran == []
    # A refusal of the sources is a refused parse for every caller (they put the old include back).
    assert isinstance(caught.value, _reload.ParseRefused)


def test_a_missing_include_is_left_to_the_mount_check(deploy):
    os.remove(deploy['guard_conf'])
    _reload.check_sources(deploy)


def test_check_sources_can_skip_the_includes_of_a_two_mount_proxy(deploy, tmp_path):
    real = str(tmp_path / 'elsewhere-endpoints.conf')
    os.rename(deploy['endpoints_conf'], real)
    os.symlink(real, deploy['endpoints_conf'])
    _reload.check_sources(deploy, includes=())
    with pytest.raises(_reload.SourcesRefused):
        _reload.check_sources(deploy)


def test_a_refused_parse_reconfigures_nothing(deploy):
    container = _Container(parse_rc=1)
    with pytest.raises(_reload.ParseRefused) as caught:
        _reload.reload(container, deploy)
    assert container.ran == [_reload.PARSE_CMD]
    assert 'Bungled' in str(caught.value) and 'keeps its last good rules' in str(caught.value)


def test_a_failed_reconfigure_is_a_proxy_error_not_a_refusal(deploy):
    container = _Container(reconfigure_rc=1)
    with pytest.raises(_proxy_spec.ProxyError) as caught:
        _reload.reload(container, deploy)
    assert not isinstance(caught.value, _reload.ParseRefused)
    assert 'squid -k reconfigure exited 1' in str(caught.value)


def test_reload_without_paths_trusts_the_caller_check(deploy):
    container = _Container()
    record = _reload.reload(container)
    assert record['files'] == {} and record['reconfigured']


def _obs_from(spec, **changes):
    obs = dict(image_id='sha256:aaa', mounts=[dict(source=s, destination=d, type='bind', rw=False)
                                              for s, d in spec['mounts']],
               networks=[spec['network']], restart_policy=spec['restart_policy'], extra_hosts=spec['extra_hosts'],
               published_ports=[], healthcheck=spec['healthcheck']['test'],
               health_timing=None,
               labels=dict(spec['labels']), command=spec['command'], security_opt=sorted(spec['security_opt']),
               cap_drop=sorted(spec['cap_drop']), cap_add=sorted(spec['cap_add']), read_only=spec['read_only'],
               tmpfs=spec['tmpfs'], sysctls=spec['sysctls'], memory=spec['memory'], memory_swap=spec['memory'],
               pids_limit=spec['pids_limit'], ulimits=sorted((u['name'], u['soft'], u['hard'])
                                                             for u in spec['ulimits']),
               log_config=spec['log_config'])
    obs.update(changes)
    return obs


def test_shape_diff_shows_the_setting_that_differs_before_and_after(deploy):
    spec = _proxy_spec.desired_spec('pi-dispatch-egress-proxy:latest', deploy['rules'], deploy['allowlist'],
                                    deploy['endpoints_conf'], guard=deploy['guard_conf'])
    obs = _obs_from(spec, health_timing=_proxy_spec._timing(spec))
    assert _proxy_spec.differences(spec, obs, 'sha256:aaa') == []
    same = _proxy_spec.shape_diff(spec, obs, 'sha256:aaa')
    assert same['before'] == same['after']
    changed = dict(obs, cap_drop=[], pids_limit=0)
    diff = _proxy_spec.shape_diff(spec, changed, 'sha256:aaa')
    before = set(diff['before'].splitlines())
    after = set(diff['after'].splitlines())
    assert before - after == set(['capabilities dropped: []', 'pids limit: 0'])
    assert after - before == set(["capabilities dropped: ['ALL']", 'pids limit: %d' % spec['pids_limit']])
    assert len(_proxy_spec.differences(spec, changed, 'sha256:aaa')) == 2


def test_shape_diff_of_a_missing_proxy_says_it_is_created(deploy):
    spec = _proxy_spec.desired_spec('pi-dispatch-egress-proxy:latest', deploy['rules'], deploy['allowlist'],
                                    deploy['endpoints_conf'])
    diff = _proxy_spec.shape_diff(spec, None, None)
    assert diff['before'] == '' and 'created from pi-dispatch-egress-proxy:latest' in diff['after']
