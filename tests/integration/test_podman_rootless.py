"""Rootless Podman on this cgroup v1 host, with and without the consent (issue 44; docs/podman.md).

``./run gate podman-rootless`` runs this file, with the engine-neutral policy suites, against Debian's Podman 4.3
run by a service account (``DOCKER_HOST`` on the account's socket, ``PI_EGRESS_IT_ENGINE=podman-rootless``).
Elsewhere every test here is skipped; when that variable says rootless and the engine is not, they fail.
The world (conftest.py ``egress_env``) consents to unenforced limits (``run_playbook``); the tests here prove
what the consent gives and what its absence refuses.
"""

import hashlib
import json
import os
import time

import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import rootless as _rootless
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import decisions as _decisions
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import spec as _spec

from conftest import ROOT, SUFFIX, _wait_path_ready, run_playbook

WANTED = os.environ.get('PI_EGRESS_IT_ENGINE', '')
pytestmark = pytest.mark.skipif(WANTED != 'podman-rootless',
                                reason='not the rootless Podman venue (./run gate podman-rootless runs this file)')

CONSENT = 'egress_proxy_limits_unenforced_ok'
# site.yml, then what egress_proxy returned, written where the test reads it.
RECORDING_PLAYBOOK = """
- name: The deployment
  ansible.builtin.import_playbook: %s
- name: What egress_proxy returned (test_podman_rootless.py)
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Write the result
      ansible.builtin.copy:
        content: "{{ egress_proxy_result | to_json }}"
        dest: "{{ rl_result_file }}"
        mode: "0600"
      changed_when: false
""" % os.path.join(ROOT, 'playbooks', 'site.yml')


@pytest.fixture(scope='module')
def rl_env(egress_env):
    venue = egress_env.venue
    assert venue.is_podman and venue.rootless, \
        'PI_EGRESS_IT_ENGINE=podman-rootless but the engine is %s' % venue.describe()
    return egress_env


@pytest.fixture(scope='module')
def cgroup_v1(rl_env):
    if not rl_env.venue.limits_problem():
        pytest.skip('%s applies the limits here (cgroup v%s): nothing to consent to'
                    % (rl_env.venue.describe(), rl_env.venue.cgroup_version))
    return rl_env


def _site_recorded(env, tmp_path, **more):
    """site.yml with the world's variables; (rc, output, recap, egress_proxy's result or None)."""
    playbook, result_file = tmp_path / 'site-recorded.yml', tmp_path / 'result.json'
    playbook.write_text(RECORDING_PLAYBOOK)
    rc, out, recap = run_playbook(str(playbook), env.site_vars(rl_result_file=str(result_file), **more))
    result = json.loads(result_file.read_text()) if result_file.exists() else None
    return rc, out, recap, result


def _engine_objects(client):
    return (sorted((c['Names'][0], c['Id']) for c in client.api.containers(all=True)),
            sorted(n['Name'] for n in client.api.networks()))


def _digests(folder):
    found = {}
    for base, _dirs, files in os.walk(folder):
        for name in files:
            path = os.path.join(base, name)
            with open(path, 'rb') as handle:
                found[os.path.relpath(path, folder)] = hashlib.sha256(handle.read()).hexdigest()
    return found


def _refused_for_limits(out):
    return (CONSENT in out and 'cgroup v2' in out and 'cgroup v1 host' in out and 'Nothing was changed' in out)


def test_the_engine_is_podman_rootless_as_its_account(rl_env):
    ids = _rootless.engine_ids(rl_env.client)
    assert ids is not None and ids.uid != 0, rl_env.venue.describe()
    assert ids.host_uid(_spec.PROXY_UID) not in (None, _spec.PROXY_UID), ids.uidmap


def test_without_the_consent_a_fresh_host_is_refused_and_nothing_changes(cgroup_v1, tmp_path):
    """site.yml on a host that has nothing yet: refused before the first role changes anything, naming the
    consent and the fix; no container, no network, no deployment folder."""
    env = cgroup_v1
    deploy_dir = tmp_path / 'egress'
    before = _engine_objects(env.client)
    rc, out, _recap = run_playbook('playbooks/site.yml', env.site_vars(**{
        CONSENT: False, 'egress_deploy_dir': str(deploy_dir), 'egress_proxy_name': 'pi-egress-rl-none' + SUFFIX,
        'egress_proxy_upstream_network': 'pi-egress-rl-none-out' + SUFFIX}))
    assert rc != 0, out[-3000:]
    assert _refused_for_limits(out), out[-3000:]
    assert _engine_objects(env.client) == before
    assert os.listdir(str(tmp_path)) == [], 'the refused run left %s' % os.listdir(str(tmp_path))


def test_without_the_consent_a_running_proxy_is_left_as_it_is(cgroup_v1):
    """Consent withdrawn on a host that runs a consented proxy: refused, the proxy and every file untouched."""
    env = cgroup_v1
    proxy_id = env.client.api.inspect_container(env.proxy)['Id']
    files = _digests(env.deploy_dir)
    before = _engine_objects(env.client)
    rc, out, _recap = env.site(**{CONSENT: False})
    assert rc != 0 and _refused_for_limits(out), out[-3000:]
    assert env.client.api.inspect_container(env.proxy)['Id'] == proxy_id
    assert _digests(env.deploy_dir) == files and _engine_objects(env.client) == before


def test_a_deployment_folder_the_account_cannot_reach_is_refused_naming_it(rl_env, tmp_path):
    """Under a root-only folder the engine's account cannot mount the files (Podman failed the create halfway,
    after the decision log folder was made): refused before the engine is asked, naming the folder and the fix."""
    env = rl_env
    locked = tmp_path / 'locked'
    locked.mkdir()
    os.chmod(str(locked), 0o700)
    deploy_dir = locked / 'egress'
    before = _engine_objects(env.client)
    rc, out, _recap = run_playbook('playbooks/site.yml', env.site_vars(**{
        'egress_deploy_dir': str(deploy_dir), 'egress_proxy_name': 'pi-egress-rl-locked' + SUFFIX,
        'egress_proxy_upstream_network': 'pi-egress-rl-locked-out' + SUFFIX}))
    assert rc != 0, out[-3000:]
    assert 'cannot search %s (mode 0700' % locked in out and 'chmod o+x %s' % locked in out, out[-3000:]
    assert 'Nothing was changed' in out
    assert _engine_objects(env.client) == before
    assert not (deploy_dir / 'decisions').exists()


def test_with_the_consent_the_limits_are_reported_unenforced_and_a_second_run_changes_nothing(cgroup_v1, tmp_path):
    """The world's deploy ran with the consent: it warned. Again: nothing to do (the limits Podman does not
    report are not compared), limits.enforced false with the reason, the warning again."""
    env = cgroup_v1
    warning = 'the proxy runs without enforced memory and pids limits'
    assert warning in env.first_site_output
    rc, out, recap, result = _site_recorded(env, tmp_path)
    assert rc == 0, out[-3000:]
    assert result['differences'] == [] and result['actions'] == [], (result['differences'], result['actions'])
    assert recap.get('changed') == 0, out[-3000:]
    limits = result['limits']
    assert limits['enforced'] is False and limits['cgroup_version'] == '1', limits
    assert 'rootless' in limits['engine'] and 'cgroup v2' in limits['why'], limits
    assert warning in out
    # Rootless Podman drops the ulimits of an API create: said, warned, and not compared (no replacement above).
    assert limits['ulimits_enforced'] is False, limits
    assert 'drops the ulimits of a container created through its Docker API' in out, out[-3000:]
    assert env.client.api.inspect_container(env.proxy)['HostConfig'].get('Ulimits') in (None, [])


def test_the_proxy_runs_without_limits_as_podman_says(cgroup_v1):
    """What the consent gives up, as the engine reports it: no memory and no pids limit on the proxy."""
    host = cgroup_v1.client.api.inspect_container(cgroup_v1.proxy)['HostConfig']
    assert host['Memory'] == 0 and not host.get('PidsLimit'), (host['Memory'], host.get('PidsLimit'))


def test_the_decision_log_is_written_by_the_proxy_user_the_engine_maps(rl_env):
    """The log folder belongs to the proxy user as the rootless engine maps it (not host uid 13); squid writes a
    line for an allowed and a refused request there, none to its own log."""
    env = rl_env
    folder = os.path.join(env.deploy_dir, 'decisions')
    ids = _rootless.engine_ids(env.client)
    assert os.stat(folder).st_uid == ids.host_uid(_spec.PROXY_UID), os.stat(folder)
    since = time.time() - 1
    assert env.curl(['https://api.provider.test/'])['code'] == 401
    assert env.curl(['https://denied.test/'])['connect'] == 403
    seen = {}
    for _attempt in range(20):   # bounded: the lines are written as squid logs the requests
        records, _problems, _warnings = _decisions.read_records(folder, since=since)
        seen = dict(((r.get('host'), r.get('verdict')), r) for r in records)
        if ('api.provider.test', 'allowed') in seen and ('denied.test', 'refused') in seen:
            break
        time.sleep(0.5)
    assert ('api.provider.test', 'allowed') in seen and ('denied.test', 'refused') in seen, sorted(seen)
    assert seen[('denied.test', 'refused')]['reason'] == 'unlisted'
    squid_log = env.client.api.logs(env.proxy).decode('utf-8', 'replace')
    assert 'cannot write /var/log/pi-dispatch' not in squid_log, squid_log[-2000:]


def test_the_doctor_probes_run_as_a_podman_job_does(rl_env):
    """A doctor probe on this venue starts the way a podman job starts (the account's uid as --user,
    --userns=keep-id, every capability dropped; _doctor/containers.py job_identity), and reaches the listed
    provider through the proxy from a job network that way, so a pass is about what a job gets."""
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import containers as _containers
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import context as _context
    env = rl_env
    ids = _rootless.engine_ids(env.client)
    ctx = _context.DoctorContext(client=env.client, proxy=env.proxy, deploy_dir=env.deploy_dir,
                                 probe_image=env.tools_image, pid=os.getpid(), environ={})
    assert _containers.job_identity(ctx) == ('%d:%d' % (ids.uid, ids.gid), 'keep-id')
    name = 'pi-egress-rl-keepid' + SUFFIX
    script = ('id -u; id -g; cat /proc/self/uid_map; '
              'curl -sS -k -o /dev/null -w "code=%{http_code}\\n" --max-time 20 https://api.provider.test/')
    results = {}
    try:
        _containers.run_container(ctx, 'who', name, script, env.job_net, results, 90)
    finally:
        env.client.api.remove_container(name, force=True)
        # A container leaving a network makes aardvark-dns 1.4 reload, and the job network's names can go
        # unanswered for tens of seconds (docs/podman.md): the world is left as the next test expects it.
        _wait_path_ready(env, tries=45)
    text, why = results['who']
    assert why is None and text is not None, why
    lines = text.split('\n')
    assert lines[0] == str(ids.uid) and lines[1] == str(ids.gid), text
    # keep-id: the account's uid is itself in the probe's user namespace (uid_map "<uid> 0 1")
    assert [str(ids.uid), '0', '1'] in [line.split() for line in lines[2:]], text
    assert 'code=401' in text, text
