"""The proxy image's security suite, its refresh, the squid version in the report and the doctor (issue 17).

Everything here runs on objects of this file's own, never on the shared ones:
the image ``pi-dispatch-egress-proxy:sec-test`` (built on the shared base, removed
at the end), the proxy ``pi-egress-sec<suffix>`` on its own ``--internal`` upstream
network. The image build reaches the Debian mirror the host's apt uses, as every
image build of the tests does; nothing else leaves the machine: the doctor's
throwaway apt container sits on the internal upstream network, so it must say it
could not read the mirror's version (never a pass).
"""

import json
import os
import re
import time

import pytest

from conftest import SUFFIX, TOOLS_IMAGE, _remove_container, _remove_network, doctor_objects_left, run_playbook

docker = pytest.importorskip('docker')

IMAGE = 'pi-dispatch-egress-proxy:sec-test'
SCRATCH = 'pi-dispatch-egress-proxy:sec-test-pi-egress-refresh'
BASE = 'pi-dispatch-egress-base:trixie'
PROXY = 'pi-egress-sec' + SUFFIX
NET = 'pi-egress-sec-out' + SUFFIX
SECRET = 'hunter2-secret'
ALLOWLIST = [{'host': 'api.provider.test', 'comment': 'the provider (fake)'}]


def _rm_image(client, name):
    try:
        client.api.remove_image(name, force=True)
    except docker.errors.NotFound:
        pass


def _in_image(client, argv):
    # The daemon copies a short-lived container's output to its log asynchronously: the log can still be
    # empty when wait() returns, so read it again a few times (bounded) before taking an empty answer.
    container = client.containers.create(IMAGE, argv, network_mode='none', entrypoint=[])
    try:
        container.start()
        container.wait(timeout=60)
        out = b''
        for _attempt in range(10):
            out = container.logs(stdout=True, stderr=False)
            if out:
                break
            time.sleep(0.2)
        return out.decode('utf-8', 'replace')
    finally:
        container.remove(force=True)


@pytest.fixture(scope='module')
def sec_world(tmp_path_factory):
    client = docker.from_env()
    try:
        client.ping()
        client.images.get(BASE)
        client.images.get(TOOLS_IMAGE)
    except Exception as exc:
        pytest.fail('needs the daemon, %s and %s (./run test builds them): %s' % (BASE, TOOLS_IMAGE, exc))
    deploy_dir = str(tmp_path_factory.mktemp('secdeploy') / 'egress')
    _remove_container(client, PROXY)
    _remove_network(client, NET)
    _rm_image(client, IMAGE)
    variables = {
        'egress_deploy_dir': deploy_dir,
        'egress_proxy_name': PROXY,
        'egress_proxy_image': IMAGE,
        'egress_proxy_upstream_network': NET,
        'egress_proxy_network_internal': True,
        'egress_allowlist_seed': ALLOWLIST,
        'egress_proxy_install_debootstrap': False,
        'egress_proxy_gc_at_start': False,
    }
    rc, out, _recap = run_playbook('playbooks/site.yml', variables, timeout=1500)
    try:
        assert rc == 0, out[-5000:]
        yield dict(client=client, deploy_dir=deploy_dir, site_out=out, variables=variables)
    finally:
        _remove_container(client, PROXY)
        _remove_network(client, NET)
        _rm_image(client, IMAGE)
        _rm_image(client, SCRATCH)


def test_image_has_the_security_suite_and_the_report_names_the_package(sec_world):
    client = sec_world['client']
    sources = _in_image(client, ['cat', '/etc/apt/sources.list.d/pi-egress-security.list'])
    # This host's apt sources carry http://deb.debian.org/debian-security (bookworm-security): the image asks it
    # for its own suite.
    assert re.match(r'^deb \S+/debian-security trixie-security main$', sources.strip()), sources
    package = _in_image(client, ['dpkg-query', '-W', '-f=${Version}', 'squid-common']).strip()
    labels = client.images.get(IMAGE).labels
    assert labels['io.pi-dispatch.egress.squid-package'] == package
    assert labels['io.pi-dispatch.egress.squid-version'].startswith('6.')
    assert len(labels['io.pi-dispatch.egress.packages']) == 32
    out = sec_world['site_out']
    assert 'package %s' % package in out, out[-3000:]
    assert re.search(r"Security updates: from \S+/debian-security \(the host'+s apt sources\)", out), out[-3000:]


def test_upgrade_refreshes_the_image_and_keeps_it_when_nothing_changed(sec_world):
    client = sec_world['client']
    before = client.images.get(IMAGE).id
    started = client.api.inspect_container(PROXY)['State']['StartedAt']
    since = int(time.time()) - 1
    rc, out, _recap = run_playbook('playbooks/upgrade.yml', dict(sec_world['variables'],
                                                                 egress_upgrade_refresh_image=True), timeout=1500)
    assert rc == 0, out[-5000:]
    assert "Build the proxy image when this collection's Containerfile changed" in out
    # The refresh built under the scratch tag (no layer cache), never under the live one first.
    events = list(client.events(since=since, until=int(time.time()) + 1, decode=True,
                                filters={'type': 'image', 'event': 'tag'}))
    tagged = [(e.get('Actor') or {}).get('Attributes', {}).get('name') for e in events]
    assert SCRATCH in tagged, (tagged, out[-3000:])
    with pytest.raises(docker.errors.ImageNotFound):
        client.images.get(SCRATCH)
    if client.images.get(IMAGE).id == before:
        # Minutes after the first build the mirror serves the same packages: image kept, proxy untouched.
        assert client.api.inspect_container(PROXY)['State']['StartedAt'] == started
    else:
        labels = client.images.get(IMAGE).labels
        assert labels['io.pi-dispatch.egress.packages'] != client.images.get(before).labels.get(
            'io.pi-dispatch.egress.packages')


MODELS_JSON = """{
  "providers": {
    "keyed": {"baseUrl": "http://user:%(s)s@models.test:8080/v1", "api": "openai-completions",
              "apiKey": "K", "models": [{"id": "a"}]},
    "local": {"baseUrl": "http://user:%(s)s@127.0.0.1:11434/v1?api_key=%(s)s", "api": "openai-completions",
              "apiKey": "K", "models": [{"id": "b"}]}
  }
}
""" % {'s': SECRET}


def test_doctor_squid_version_public_suffix_and_no_secret(sec_world, tmp_path):
    client = sec_world['client']
    # An allowlist written before the public-suffix rule: appended in place, as an old file would hold it.
    allowlist = os.path.join(sec_world['deploy_dir'], 'egress-allowlist.conf')
    with open(allowlist, 'a') as handle:
        handle.write('.co.uk\n')
    overlay = tmp_path / 'models.json'
    overlay.write_text(MODELS_JSON)
    json_path = tmp_path / 'doctor.jsonl'
    rc, out, _recap = run_playbook('playbooks/doctor.yml', {
        'egress_proxy_name': PROXY,
        'egress_deploy_dir': sec_world['deploy_dir'],
        'doctor_probe_image': TOOLS_IMAGE,
        'doctor_provider_host': 'api.provider.test',
        'doctor_deny_host': 'denied.test',
        'doctor_listed_host': 'api.provider.test',
        'doctor_probe_timeout': 5,
        'doctor_probe_start_grace': 20,
        'doctor_models_json': str(overlay),
        'doctor_isolation': False,
        'doctor_fail_on_fail': False,
        'doctor_json_path': str(json_path),
    }, timeout=400)
    assert rc == 0, out[-5000:]
    text = json_path.read_text()
    lines = [json.loads(row) for row in text.splitlines() if row.strip()]
    by_id = dict((line['id'], line) for line in lines)
    # The squid package inside the running proxy, named.
    package = _in_image(client, ['dpkg-query', '-W', '-f=${Version}', 'squid-common']).strip()
    assert 'proxy.squid' in by_id, [line for line in lines if line['id'].startswith('proxy')]
    assert by_id['proxy.squid']['status'] == 'ok', lines
    assert package in by_id['proxy.squid']['message'] and PROXY in by_id['proxy.squid']['message']
    # The upstream network is --internal: the mirror cannot be read, which is said, never a pass.
    unread = by_id['proxy.squid_mirror_unread']
    assert unread['status'] == 'notrun', lines
    assert NET in unread['message'], unread
    assert 'proxy.squid_current' not in by_id and 'proxy.squid_outdated' not in by_id
    assert not [c for c in doctor_objects_left(client) if 'pi-dispatch-egress-probe-squid-' in c]
    # The public-suffix entry is warned about, with a fix.
    suffix = by_id['overlay.public_suffix']
    assert suffix['status'] == 'warn' and suffix['message'].startswith('.co.uk ') and suffix['fix'], lines
    # Credentials appear nowhere: not in the lines, the JSON, or the play's output.
    assert SECRET not in text
    assert SECRET not in out
    assert 'http://***@127.0.0.1:11434/v1?api_key=***' in by_id['overlay.loopback']['message']
