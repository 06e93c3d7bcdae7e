"""egress_host_check asks a play's consent to unenforced proxy limits before any role changes anything (issue 44).

Measured under ``./run gate podman-rootless`` (Podman 4.3.1 rootless, cgroup v1): site.yml without the consent was
refused by egress_proxy only after the deployment role had laid out the deployment folder. The first role of the
play (host_check) now says the same refusal. The engine is a fake that answers what that Podman answered.
"""

from ansible_collections.pi_dispatch.egress.plugins.modules import egress_host_check as _module


def _check(monkeypatch, run_module, client, args):
    monkeypatch.setattr(_module.dc, 'module_client', lambda module, result=None: client)
    monkeypatch.setattr(_module._host_check, 'iptables_variant',
                        lambda runner: dict(variant='nft', version='iptables v1.8.9 (nf_tables)', why=None))
    return run_module(_module.main, args)


def test_a_play_that_deploys_the_proxy_without_the_consent_is_refused(monkeypatch, fake_engine, run_module):
    kind, result = _check(monkeypatch, run_module, fake_engine.podman(), dict(proxy_limits_unenforced_ok=False))
    assert kind == 'fail', result
    assert result['msg'].startswith('Podman 4.3.1 (rootless) runs rootless on a cgroup v1 host'), result['msg']
    assert 'egress_proxy_limits_unenforced_ok: true' in result['msg'] and 'cgroup v2' in result['msg']
    assert result['msg'].endswith('Nothing was changed.') and result['limits']['enforced'] is False


def test_with_the_consent_it_reports_the_limits_and_goes_on(monkeypatch, fake_engine, run_module):
    kind, result = _check(monkeypatch, run_module, fake_engine.podman(), dict(proxy_limits_unenforced_ok=True))
    assert kind == 'exit', result
    assert result['limits']['enforced'] is False and result['limits']['cgroup_version'] == '1'
    assert result['changed'] is False


def test_a_play_without_a_proxy_is_not_asked(monkeypatch, fake_engine, run_module):
    kind, result = _check(monkeypatch, run_module, fake_engine.podman(), {})
    assert kind == 'exit' and 'limits' not in result, result


def test_an_engine_that_holds_the_limits_passes_without_the_consent(monkeypatch, fake_engine, run_module):
    kind, result = _check(monkeypatch, run_module, fake_engine.podman(cgroup_version='v2'),
                          dict(proxy_limits_unenforced_ok=False))
    assert kind == 'exit' and result['limits']['enforced'] is True, result
