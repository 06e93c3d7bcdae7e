"""The opt-ins' trust on the real engine (issue 42, item 10; docs/transparent.md, "Approving a project's opt-ins").

A project's ``.pi-container/config.yaml`` lives in the checkout its jobs can write. A file that opens a
port the operator has not approved (never, or not in this form) must refuse the transparent create
before the daemon is asked: no network, no container, no gateway attachment. The operator's approval
(the exact command the refusal names, run as a command line) is kept in the deployment folder, outside
the project; after it the same create works, and a later change of the file is refused again.

One gateway of its own (no site.yml run), one successful create; job ids start with ``it42t-``.
"""

import os
import shlex
import subprocess
import sys

import pytest

docker = pytest.importorskip('docker')

from conftest import SUFFIX, _remove_container, _remove_network  # noqa: E402
from ansible_collections.pi_dispatch.egress.plugins.module_utils import jobnet as jn  # noqa: E402
from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets import transparent as tp  # noqa: E402
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import gateway as gw  # noqa: E402

pytestmark = pytest.mark.integration

GATEWAY_IMAGE = os.environ.get('PI_EGRESS_IT_GATEWAY_IMAGE', gw.GATEWAY_IMAGE)
JOBS = ('it42t-a', 'it42t-b')
# What a job of the project writes: an uninspected tunnel for the next job (the names are .test
# names: nothing here is resolved or reached).
PLANTED = 'egress:\n  allow:\n    ssh: [git.forge.test]\n    tcp_ports: [{port: 8443, hosts: [attacker.test]}]\n'


def _collections_base():
    path = os.path.abspath(jn.__file__)
    for _level in range(6):  # .../ansible_collections/pi_dispatch/egress/plugins/module_utils/jobnet.py
        path = os.path.dirname(path)
    return path


@pytest.fixture(scope='module')
def trust(egress_env):
    client = egress_env.client
    name = 'pi-egress-gw-trust' + SUFFIX
    try:
        client.images.get(GATEWAY_IMAGE)
    except docker.errors.ImageNotFound:
        pytest.fail('Image %s is missing. Build it with: ansible-playbook tests/images/build.yml' % GATEWAY_IMAGE)
    for job in JOBS:
        _remove_container(client, jn.container_name(job))
        _remove_network(client, jn.network_name(job))
    _remove_container(client, name)
    # Its resolver is the fake upstream on the --internal upstream network: nothing it asks leaves the machine.
    gw.ensure(client, gw.desired(egress_env.deploy_dir, egress_env.upstream_net, egress_env.proxy,
                                 image=GATEWAY_IMAGE, name=name, dns=[egress_env.fake_ip()]))
    try:
        yield name
    finally:
        for job in JOBS:
            _remove_container(client, jn.container_name(job))
            try:
                jn.teardown_job_network(client, job, proxy_name=egress_env.proxy, gateway_name=name)
            except Exception:
                _remove_network(client, jn.network_name(job))
        try:
            gw.remove(client, name)
        except Exception:
            _remove_container(client, name)


def _job_things(client, job):
    """What the daemon has of ``job``: its network, its container, and gateway/proxy attachments named after it."""
    nets = [n['Name'] for n in client.api.networks(filters={'name': jn.network_name(job)})]
    containers = [c.name for c in client.containers.list(all=True, filters={'name': jn.container_name(job)})]
    return nets, containers


def _create(env, gateway, job, policy, deploy_dir):
    return jn.create_job_network(env.client, job, proxy_name=env.proxy, mode=jn.TRANSPARENT, project_policy=policy,
                                 gateway_name=gateway, deploy_dir=deploy_dir)


def test_a_changed_opt_in_file_is_refused_and_creates_nothing_until_approved(egress_env, trust, tmp_path):
    client = egress_env.client
    project = tmp_path / 'project'
    (project / '.pi-container').mkdir(parents=True)
    policy = project / '.pi-container' / 'config.yaml'
    policy.write_text(PLANTED)
    deploy_dir = tmp_path / 'deploy'  # the operator's folder: the job never sees it
    deploy_dir.mkdir()
    nets_before = sorted(n['Name'] for n in client.api.networks(filters={'label': jn.LABEL_JOB_ID}))
    gw_nets_before = sorted(client.api.inspect_container(trust)['NetworkSettings']['Networks'])

    # 1. Never approved, and it opens ports: refused before the daemon is asked.
    try:
        with pytest.raises(jn.JobNetError) as caught:
            _create(egress_env, trust, JOBS[0], str(policy), str(deploy_dir))
    finally:
        if jn.inspect_job_network(client, jn.network_name(JOBS[0])) is not None:  # the finding: it was created
            jn.teardown_job_network(client, JOBS[0], proxy_name=egress_env.proxy, gateway_name=trust)
    message = str(caught.value)
    assert str(policy) in message and 'never approved' in message, message
    assert '+tcp/8443 towards attacker.test' in message and '+tcp/22 towards git.forge.test' in message, message
    assert 'Nothing was created.' in message, message
    assert _job_things(client, JOBS[0]) == ([], []), _job_things(client, JOBS[0])
    assert sorted(n['Name'] for n in client.api.networks(filters={'label': jn.LABEL_JOB_ID})) == nets_before
    assert sorted(client.api.inspect_container(trust)['NetworkSettings']['Networks']) == gw_nets_before
    assert not os.listdir(str(deploy_dir)), 'a refused create approves nothing'

    # 2. The operator runs the exact command the refusal names, from a plain shell.
    command = message.split('approve exactly this policy with: ', 1)[1].split(' ; ', 1)[0]
    argv = shlex.split(command)
    assert argv[:2] == ['python3', '-m'] and 'approve-optins' in argv and '--digest' in argv, argv
    run = subprocess.run([sys.executable] + argv[1:], env={'PATH': '/usr/bin:/bin', 'PYTHONPATH': _collections_base()},
                         capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    assert '"changed": true' in run.stdout and 'attacker.test' in run.stdout, run.stdout

    # 3. The approved policy works: the network is made and the gateway serves its opt-ins.
    net = _create(egress_env, trust, JOBS[0], str(policy), str(deploy_dir))
    assert net.changed and net.optins['ports']['tcp'] == {'22': ['git.forge.test'], '8443': ['attacker.test']}
    served = [n for n in tp.status(client, trust)['networks'] if n['network'] == net.network]
    assert served and served[0]['optins']['tcp'] == {'22': ['git.forge.test'], '8443': ['attacker.test']}, served

    # 4. A job edits the file again: the next job's create is refused, showing the change against the approval.
    policy.write_text(PLANTED.replace('[{port: 8443', '[{port: 2222, hosts: [other.test]}, {port: 8443'))
    with pytest.raises(jn.JobNetError) as caught:
        _create(egress_env, trust, JOBS[1], str(policy), str(deploy_dir))
    message = str(caught.value)
    assert 'changed since' in message and '+tcp/2222 towards other.test' in message, message
    assert ' tcp/8443 towards attacker.test' in message, message
    assert _job_things(client, JOBS[1]) == ([], []), _job_things(client, JOBS[1])
