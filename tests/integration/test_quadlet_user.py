"""The proxy as Quadlet **user** units of a service account's rootless Podman 5, under systemd (issue 44).

The host is the Podman 5 test host of test_quadlet.py (Debian 13's Podman with Quadlet, systemd as PID 1,
``--network none``), started under a name of its own. This machine is cgroup v1, so the account's rootless
Podman applies no memory or pids limits: the play carries the consent (``egress_proxy_limits_unenforced_ok``).

Test-host settings, not collection defaults (docs/testing.md): logind runs (the image masks it; linger and the
user manager need it), and a boot unit opens ``/dev/net/tun`` and ``/dev/fuse`` to the account (pasta and
fuse-overlayfs open them; Docker gives a container 0600 device nodes, where a real host has 0666) and pulls in
``network-online.target``, as a real host's network service does (Podman 5's user units wait up to 90 s for it,
``podman-user-wait-network-online.service``; nothing in this host with ``--network none`` pulls it in).

site.yml deploys with ``egress_podman_account`` (the role: subids, linger, the account's ``podman.socket``) and
``egress_proxy_units_scope=user``: the units are written under the account's home and run by its user manager
(``systemctl --user -M <account>@``). The test asks what an operator would: refused without the consent,
nothing written; the unit active, the proxy healthy and answering a job, the decision log written; a second
play changes nothing; back after ``systemctl restart user@<uid>.service`` and after a restart of the host.
"""

import json
import subprocess

import pytest

import fleet
from conftest import PROXY_IMAGE, SUFFIX, TOOLS_IMAGE, docker
from test_quadlet import HOST_IMAGE, RUN_ARGS, SITE_VARS, Ansible, flat, sh, wait_for
import test_quadlet
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import spec as _spec

HOST = 'pi-egress-podmanhost-user' + SUFFIX
ACCOUNT = 'pi-egress-ru'
PROXY = _spec.PROXY_NAME
SERVICE = PROXY + '.service'
USER_VARS = dict(SITE_VARS, egress_podman_account=ACCOUNT, egress_proxy_units_scope='user')
CONSENT = dict(egress_proxy_limits_unenforced_ok=True)
DECISIONS = test_quadlet.DEPLOY_DIR + '/decisions'
JOB_NET = 'pi-job-quadlet-user-net'
# Test-host settings: the devices rootless networking and storage open, opened at every boot.
DEVICES_UNIT = ('[Unit]\nDescription=test host: rootless Podman opens /dev/net/tun and /dev/fuse\n'
                'DefaultDependencies=no\nBefore=sysinit.target\nWants=network-online.target\n\n'
                '[Service]\nType=oneshot\n'
                'ExecStart=/bin/chmod 0666 /dev/net/tun /dev/fuse\n\n[Install]\nWantedBy=sysinit.target\n')


def in_host(command, timeout=120):
    return test_quadlet.in_host(command, timeout=timeout, host=HOST)


class UserHost(object):
    def __init__(self):
        self.uid = None

    def boot(self):
        wait_for('%s booted' % HOST, booted_here)

    def as_account(self, command, timeout=120):
        """A command as the account, in its runtime dir (podman's CLI reads the same storage as its units)."""
        return sh(['docker', 'exec', '-u', ACCOUNT, '-w', '/home/' + ACCOUNT, '-e',
                   'XDG_RUNTIME_DIR=/run/user/%d' % self.uid, HOST, 'sh', '-c', command], timeout=timeout)

    def systemctl(self, *args):
        return in_host('systemctl --user -M %s@ %s' % (ACCOUNT, ' '.join(args)))

    def inspect(self):
        rc, out = self.as_account('podman container inspect %s' % PROXY)
        return json.loads(out)[0] if rc == 0 else None

    def healthy_proxy(self):
        def probe():
            attrs = self.inspect()
            if attrs is None:
                return 'no container'
            return (attrs['State'].get('Health') or {}).get('Status') == 'healthy' or attrs['State'].get('Status')
        wait_for('%s healthy (the account\'s Podman)' % PROXY, probe, deadline_s=120)
        return self.inspect()['Id']

    def journal(self):
        return '\n--- journal\n' + in_host('journalctl --no-pager _UID=%d | tail -n 30' % self.uid)[1]


def booted_here():
    rc, out = in_host('systemctl is-system-running', timeout=30)
    return out.strip() in ('running', 'degraded') or out.strip()


@pytest.fixture(scope='module')
def user_host(engine):
    try:
        engine.images.get(HOST_IMAGE)
    except docker.errors.ImageNotFound:
        pytest.fail('Image %s is missing. Build it with: ansible-playbook tests/images/build.yml (./run test does).'
                    % HOST_IMAGE)
    sh(['docker', 'rm', '-f', '-v', HOST])
    rc, out = sh(['docker', 'run', '-d', '--name', HOST] + RUN_ARGS + [HOST_IMAGE])
    assert rc == 0, out
    try:
        host = UserHost()
        host.boot()
        rc, out = in_host("systemctl unmask systemd-logind && systemctl start systemd-logind && "
                          "printf '%s' > /etc/systemd/system/pi-test-devices.service && "
                          "systemctl enable --now pi-test-devices.service && "
                          "useradd --create-home --shell /usr/sbin/nologin %s && id -u %s"
                          % (DEVICES_UNIT, ACCOUNT, ACCOUNT))
        assert rc == 0, out
        host.uid = int(out.split()[-1])
        # The account's Podman loads the images (nothing is pulled) before the role lingers it: a runtime dir of
        # the test's own for the load, then removed with what ran in it, as a reboot would leave it.
        rc, out = in_host('install -d -m 0700 -o {a} -g {a} /run/user/{u}'.format(a=ACCOUNT, u=host.uid))
        assert rc == 0, out
        for image in (fleet.BASE_IMAGE, PROXY_IMAGE, TOOLS_IMAGE):
            save = subprocess.Popen(['docker', 'save', image], stdout=subprocess.PIPE)
            load = subprocess.run(['docker', 'exec', '-i', '-u', ACCOUNT, '-w', '/home/' + ACCOUNT, '-e',
                                   'XDG_RUNTIME_DIR=/run/user/%d' % host.uid, HOST, 'podman', 'load', '-q'],
                                  stdin=save.stdout, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300,
                                  check=False)
            save.stdout.close()
            assert save.wait(timeout=60) == 0 and load.returncode == 0, load.stdout[-2000:]
        rc, out = in_host('pkill -u {a}; sleep 1; pkill -9 -u {a}; rm -rf /run/user/{u}; true'.format(
            a=ACCOUNT, u=host.uid))
        yield host
    finally:
        sh(['docker', 'rm', '-f', '-v', HOST])


@pytest.fixture(scope='module')
def ansible(user_host, tmp_path_factory):
    return Ansible(tmp_path_factory.mktemp('podmanhost-user-ansible'), host=HOST, site_vars=USER_VARS)


def unit_path():
    return '/home/%s/.config/containers/systemd/%s.container' % (ACCOUNT, PROXY)


def squid_answers_a_job(host):
    """A rootless job container of the account on an --internal network with the proxy on it."""
    host.as_account('podman network rm -f {n}; podman network create --internal {n} && '
                    'podman network connect {n} {p}'.format(n=JOB_NET, p=PROXY))
    try:
        rc, out = host.as_account('podman run --rm --network %s %s curl -sS -m 10 -o /dev/null -D - -x http://%s:3128 '
                                  'https://denied.test/' % (JOB_NET, TOOLS_IMAGE, PROXY), timeout=120)
        return out
    finally:
        host.as_account('podman network disconnect -f {n} {p}; podman network rm -f {n}'.format(n=JOB_NET, p=PROXY))


def test_site_runs_the_proxy_as_the_accounts_quadlet_units(user_host, ansible):
    # Without the consent the play is refused in host_check, after the account's Podman is ready and before the
    # deployment is laid out: no unit under the account's home, no folder, no container.
    rc, out, recap = ansible.site()
    assert rc != 0 and 'limits_unenforced_ok' in flat(out), out[-6000:]
    assert in_host('test -e %s || test -e %s' % (unit_path(), test_quadlet.DEPLOY_DIR))[0] != 0
    assert user_host.inspect() is None
    # With it: the role readies the account (linger, its podman.socket), the units run under its user manager.
    rc, out, recap = ansible.site(**CONSENT)
    assert rc == 0 and recap.get('failed') == 0, out[-6000:] + user_host.journal()
    assert 'write units' in flat(out), out[-6000:]
    rc, text = in_host('stat -c %%U %s && cat %s' % (unit_path(), unit_path()))
    assert rc == 0 and text.splitlines()[0] == ACCOUNT, text
    # Quadlet's --cgroups=split cannot hold under a user manager on cgroup v1: the unit overrides it.
    assert '--cgroups=no-conmon' in text and '%s:/var/log/pi-dispatch:rw' % DECISIONS in text, text
    assert 'WantedBy=default.target' in text, text
    rc, out = user_host.systemctl('is-active', SERVICE)
    assert out.strip() == 'active', out + user_host.journal()
    attrs = user_host.inspect()
    assert attrs['Config']['Labels'].get('PODMAN_SYSTEMD_UNIT') == SERVICE, attrs['Config']['Labels']
    user_host.healthy_proxy()
    rc, out = in_host('ls /var/lib/systemd/linger/')
    assert ACCOUNT in out.split(), out
    answer = squid_answers_a_job(user_host)
    assert ' 403 ' in answer and 'ERR_ACCESS_DENIED' in answer, answer
    wait_for('the refusal in the decision log', lambda: (
        '"host":"denied.test"' in in_host('cat %s/*' % DECISIONS)[1] or 'not yet'))
    # The same play again changes nothing: the units as written, the container as wanted.
    rc, out, recap = ansible.site(**CONSENT)
    assert rc == 0 and recap.get('changed') == 0, out[-6000:]


def test_units_of_the_wrong_manager_are_refused_and_nothing_is_written(user_host, ansible):
    before = in_host('cat %s' % unit_path())[1]
    rc, out, recap = ansible.site(egress_proxy_units_scope='system', **CONSENT)
    assert rc != 0 and 'units_scope system' in flat(out) and 'Nothing was changed' in flat(out), out[-6000:]
    assert in_host('test -e /etc/containers/systemd/%s.container' % PROXY)[0] != 0
    assert in_host('cat %s' % unit_path())[1] == before


def test_an_upgrade_reaches_the_accounts_podman_and_never_roots(user_host, ansible):
    """upgrade.yml runs the podman_account role too: every engine step asks the account's socket (before 0.19.0
    only host_check did; over SSH the proxy role asked the default socket, root's Podman here)."""
    first = user_host.healthy_proxy()
    rc, out, recap = ansible.upgrade(**CONSENT)
    assert rc == 0 and recap.get('failed') == 0, out[-6000:]
    assert user_host.healthy_proxy() == first  # the packaged rules are the deployed ones: nothing to restart
    rc, out = in_host('podman ps -a --format "{{.Names}}"; podman network ls --format "{{.Name}}"')
    assert rc == 0 and PROXY not in out and _spec.UPSTREAM_NETWORK not in out, out


def test_the_proxy_comes_back_after_a_user_manager_restart_and_a_host_restart(user_host):
    first = user_host.healthy_proxy()
    rc, out = in_host('systemctl restart user@%d.service' % user_host.uid, timeout=180)
    assert rc == 0, out
    wait_for('the user manager back', lambda: user_host.systemctl('is-system-running')[1].strip() in
             ('running', 'degraded') or 'not yet')
    again = user_host.healthy_proxy()
    assert again != first, 'the user manager restart left the old container running'
    rc, out = sh(['docker', 'restart', '-t', '30', HOST], timeout=180)
    assert rc == 0, out
    user_host.boot()
    # linger: logind starts the account's manager at boot, and its default.target wants the unit
    booted_again = user_host.healthy_proxy()
    assert booted_again != again
    rc, out = user_host.systemctl('is-active', SERVICE)
    assert out.strip() == 'active', out + user_host.journal()
    answer = squid_answers_a_job(user_host)
    assert ' 403 ' in answer and 'ERR_ACCESS_DENIED' in answer, answer
