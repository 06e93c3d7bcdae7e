"""egress_proxy on an engine that would not hold the proxy's limits: refused before the engine is changed.

Measured with Podman 4.3.1 rootless on this machine (cgroup v1): a container created with memory and pids
limits through the API runs without them, and inspect reports ``Memory=0`` (docs/podman.md). The engine here
is a fake that answers what that Podman answered and fails any call that would change something.
"""

from ansible_collections.pi_dispatch.egress.plugins.modules import egress_proxy as _module


def _run_limits(monkeypatch, run_module, client, args):
    monkeypatch.setattr(_module.dc, 'module_client', lambda module: client)
    return run_module(_module.main, args)


def test_rootless_on_cgroup_v1_is_refused_before_anything_changes(monkeypatch, fake_engine, tmp_path, run_module):
    deploy = tmp_path / 'egress'
    deploy.mkdir()
    (deploy / 'egress-allowlist.conf').write_text('api.anthropic.com\n')
    kind, result = _run_limits(monkeypatch, run_module, fake_engine.podman(), dict(deploy_dir=str(deploy)))
    assert kind == 'fail', result
    assert result['msg'].startswith('Podman 4.3.1 (rootless) runs rootless on a cgroup v1 host')
    assert 'no memory or pids limit' in result['msg'] and result['msg'].endswith('Nothing was changed.')
    assert sorted(p.name for p in deploy.iterdir()) == ['egress-allowlist.conf']


def test_the_refusal_names_the_consent_and_reports_the_limits(monkeypatch, fake_engine, tmp_path, run_module):
    kind, result = _run_limits(monkeypatch, run_module, fake_engine.podman(), dict(deploy_dir=str(tmp_path)))
    assert kind == 'fail' and 'egress_proxy_limits_unenforced_ok: true' in result['msg'], result
    assert result['limits']['enforced'] is False and result['limits']['cgroup_version'] == '1'


def test_with_consent_the_deploy_goes_on_to_the_engine(monkeypatch, fake_engine, tmp_path, run_module):
    deploy = tmp_path / 'egress'
    deploy.mkdir()
    (deploy / 'egress-allowlist.conf').write_text('api.anthropic.com\n')
    kind, result = _run_limits(monkeypatch, run_module, fake_engine.podman(),
                               dict(deploy_dir=str(deploy), limits_unenforced_ok=True))
    # past the limits check, the deploy asks the engine (a fake that fails any call that would change it)
    assert kind == 'fail' and 'the engine was asked to' in result['msg'], result
    assert 'cgroup v1 host' not in result['msg']


def test_consent_changes_nothing_where_the_limits_hold(monkeypatch, fake_engine, tmp_path, run_module):
    kind, result = _run_limits(monkeypatch, run_module, fake_engine.podman(cgroup_version='v2'),
                               dict(deploy_dir=str(tmp_path), limits_unenforced_ok=True))
    assert kind == 'fail' and 'the engine was asked to' in result['msg'], result


def test_removing_the_proxy_is_not_refused_there(monkeypatch, fake_engine, run_module):
    kind, result = _run_limits(monkeypatch, run_module, fake_engine.podman(), dict(state='absent'))
    # state=absent goes past the limits check to the engine (a fake that fails any call that asks it)
    assert kind == 'fail' and 'the engine was asked to' in result['msg'], result
    assert 'cgroup v1' not in result['msg']


def test_a_unit_is_refused_on_the_docker_engine_before_anything_changes(monkeypatch, fake_engine, tmp_path, run_module):
    deploy = tmp_path / 'egress'
    deploy.mkdir()
    (deploy / 'egress-allowlist.conf').write_text('api.anthropic.com\n')
    kind, result = _run_limits(monkeypatch, run_module, fake_engine.docker(),
                               dict(deploy_dir=str(deploy), units='quadlet'))
    assert kind == 'fail', result
    assert result['msg'].startswith('units quadlet: systemd units run the proxy only on the Podman venue, and '
                                    'Docker Engine 20.10.24 is not Podman'), result['msg']
    assert result['msg'].endswith('Nothing was changed.')
    assert sorted(p.name for p in deploy.iterdir()) == ['egress-allowlist.conf']
