"""Rootless Podman 4's network keeper (issue 44; docs/podman.md "The rootless network keeper").

Measured on Podman 4.3.1 rootless: detaching the only running container from one of its networks tears the account's
rootless network down (slirp4netns exits, the netns goes): nothing carries that container out of the host. The last
job's teardown on an idle host detaches the running proxy: a keeper holds the network through it.

This file stops the world's other containers to make the host idle, and its control case lets the proxy lose its
networks, so ``./run gate podman-rootless`` runs it LAST; elsewhere every test here is skipped.
"""

import contextlib
import os
import subprocess

import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils import jobnet as jn
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import rootless as _rootless

from conftest import SUFFIX

pytestmark = pytest.mark.skipif(os.environ.get('PI_EGRESS_IT_ENGINE', '') != 'podman-rootless',
                                reason='not the rootless Podman venue (./run gate podman-rootless runs this file)')


def _alive(pid):
    try:
        with open('/proc/%s/stat' % pid) as handle:
            return handle.read().rsplit(')', 1)[1].split()[0] != 'Z'
    except OSError:
        return False


def _rootless_network(uid):
    """(live slirp4netns pids of the account, its rootless netns files): its bridge networks' route out, Podman 4."""
    pids = [p for p in subprocess.run(['pgrep', '-u', str(uid), '-x', 'slirp4netns'], stdout=subprocess.PIPE,
                                      universal_newlines=True, check=False).stdout.split() if _alive(p)]
    folder = '/run/user/%d/netns' % uid
    files = sorted(n for n in os.listdir(folder) if n.startswith('rootless-netns')) if os.path.isdir(folder) else []
    return pids, files


def _interfaces(env):
    """The proxy's network interfaces as its kernel has them (not as the engine remembers them)."""
    rc, out = env.client.containers.get(env.proxy).exec_run(['ls', '/sys/class/net'])
    assert rc == 0, out
    return sorted(out.decode().split())


@pytest.fixture(scope='module')
def idle_host(egress_env):
    """The world with only the proxy running (the host between jobs); the others started again at the end."""
    env = egress_env
    if not (env.venue.is_podman and env.venue.rootless and _rootless.keeper_needed(env.venue)):
        pytest.fail('PI_EGRESS_IT_ENGINE=podman-rootless but the engine is %s' % env.venue.describe())
    others = [c['Names'][0].lstrip('/') for c in env.client.api.containers(filters={'status': 'running'})
              if c['Names'][0].lstrip('/') != env.proxy]
    for name in others:
        env.client.api.stop(name, timeout=0)
    yield env
    for name in others:
        try:
            env.client.api.start(name)
        except Exception:  # the world's teardown removes it anyway
            pass


def test_the_last_jobs_teardown_keeps_the_proxys_rootless_network(idle_host):
    env = idle_host
    uid = _rootless.engine_ids(env.client).uid
    job = 'rl-keep' + SUFFIX.replace('-', '')
    jn.create_job_network(env.client, job, proxy_name=env.proxy)
    before, interfaces = _rootless_network(uid), _interfaces(env)
    assert before[0] and before[1] and len(interfaces) >= 3, (before, interfaces)   # lo, upstream, the job's
    done = jn.teardown_job_network(env.client, job, proxy_name=env.proxy)
    assert any(a.startswith('keeper ') for a in done['actions']), done['actions']
    assert _rootless_network(uid) == before, 'the rootless network was torn down'
    # the job network's interface went with the detach; the upstream's stays
    assert len(_interfaces(env)) == len(interfaces) - 1, (interfaces, _interfaces(env))
    assert env.client.api.containers(all=True, filters={'label': _rootless.KEEPER_LABEL}) == []


def test_without_the_keeper_the_same_teardown_cuts_the_proxy_off(idle_host, monkeypatch):
    """The control: the same teardown with the keeper rule switched off tears the account's network down: no
    slirp4netns carries the proxy out of the host any more. (It leaves the world broken: the gate's last test.)"""
    env = idle_host
    uid = _rootless.engine_ids(env.client).uid
    job = 'rl-cut' + SUFFIX.replace('-', '')
    jn.create_job_network(env.client, job, proxy_name=env.proxy)
    before = _rootless_network(uid)

    @contextlib.contextmanager
    def no_keeper(*_args, **_kwargs):
        yield None

    monkeypatch.setattr(_rootless, 'network_held', no_keeper)
    jn.teardown_job_network(env.client, job, proxy_name=env.proxy)
    assert before[0] and before[1], before
    assert _rootless_network(uid) == ([], []), (before, _rootless_network(uid))
