"""The job-network command line from a plain shell, against the real engine and the real proxy.

A dispatcher that is not Python runs ``python3 -m ...jobnet_cli``: this test does exactly that from
``bash`` with a bare environment (PATH, PYTHONPATH, DOCKER_HOST), no Ansible, and asserts what each
call printed and its exit code, and what the daemon then holds.
"""

import json
import os
import subprocess
import sys

import pytest

from conftest import SUFFIX, _remove_container, _remove_network

docker = pytest.importorskip('docker')

from ansible_collections.pi_dispatch.egress.plugins.module_utils import jobnet as jn  # noqa: E402

MODULE = 'ansible_collections.pi_dispatch.egress.plugins.module_utils.jobnet_cli'

# One bash script, one call per line: "<label> <exit code> <the JSON it printed>".
SCRIPT = r'''
set -u
call() {
    label=$1; shift
    out=$("$PY" -m "$MODULE" --proxy "$PROXY" "$@" 2>/dev/null); code=$?
    echo "$label $code $out"
}
call preflight preflight
call create create "$JOB"
created=$out
call again create "$JOB"
call bad-id create 'Not A Job!'
call missing --proxy "$PROXY-missing" preflight
# The job container, started with the run_args create printed (docker CLI or not: the SDK here).
"$PY" -c '
import json, sys, docker
args = json.loads(sys.argv[1])["result"]["run_args"]
print("run-args", " ".join(args))
docker.from_env().containers.run(sys.argv[2], ["sleep", "60"], name=args[1], network=args[3], detach=True)
' "$created" "$TOOLS"
call busy teardown "$JOB"
"$PY" -c 'import sys, docker; docker.from_env().containers.get(sys.argv[1]).remove(force=True)' "$JOB_CONTAINER"
call teardown teardown "$JOB"
call gone teardown "$JOB"
"$PY" -c "
import sys, importlib
importlib.import_module('$MODULE')
print('ansible-imported', any(m == 'ansible' or m.startswith('ansible.') for m in sys.modules))"
'''


def _collections_base():
    path = os.path.abspath(jn.__file__)
    for _level in range(6):  # .../ansible_collections/pi_dispatch/egress/plugins/module_utils/jobnet.py
        path = os.path.dirname(path)
    return path


@pytest.fixture
def cli_job(egress_env):
    job = 'cli%s-%d' % (SUFFIX.replace('-', ''), os.getpid())
    client = egress_env.client
    try:
        yield job
    finally:
        _remove_container(client, jn.container_name(job))
        _remove_network(client, jn.network_name(job))


def test_the_command_line_from_a_plain_shell(egress_env, cli_job):
    env = {'PATH': '/usr/local/bin:/usr/bin:/bin', 'PYTHONPATH': _collections_base(), 'PY': sys.executable,
           'MODULE': MODULE, 'PROXY': egress_env.proxy, 'JOB': cli_job, 'JOB_CONTAINER': jn.container_name(cli_job),
           'TOOLS': egress_env.tools_image}
    if os.environ.get('DOCKER_HOST'):
        env['DOCKER_HOST'] = os.environ['DOCKER_HOST']
    run = subprocess.run(['bash', '-c', SCRIPT], env=env, capture_output=True, text=True, timeout=240, check=False)
    calls = {}
    for line in run.stdout.splitlines():
        label, rest = (line.split(' ', 1) + [''])[:2]
        if label in ('ansible-imported', 'run-args'):
            calls[label] = rest
            continue
        code, text = rest.split(' ', 1)
        calls[label] = (int(code), json.loads(text))
    print(run.stdout)  # the JSON each call printed, in the test's output (-s / on failure)

    code, doc = calls['preflight']
    assert code == 0 and doc['ok'] and doc['result']['verdict'] == jn.ADMIT, doc

    code, doc = calls['create']
    assert code == 0 and doc['ok'] and doc['result']['changed'] is True, doc
    assert doc['result']['network'] == jn.network_name(cli_job) and doc['result']['proxy'] == egress_env.proxy
    code, doc = calls['again']
    assert code == 0 and doc['result']['changed'] is False, doc  # idempotent

    code, doc = calls['bad-id']
    assert code == 3 and doc['error']['type'] == 'JobNetError', doc
    code, doc = calls['missing']
    assert code == 8 and doc['result']['verdict'] == jn.PROXY_MISSING, doc

    # The job container started from the printed run_args sat on the network: teardown refused it.
    want = '--name %s --network %s' % (jn.container_name(cli_job), jn.network_name(cli_job))
    assert calls['run-args'].startswith(want), calls['run-args']
    code, doc = calls['busy']
    assert code == 6 and doc['error']['type'] == 'EngineError' and doc['error']['retryable'] is False, doc

    code, doc = calls['teardown']
    assert code == 0 and doc['result']['changed'] is True, doc
    code, doc = calls['gone']
    assert code == 0 and doc['result']['changed'] is False, doc
    with pytest.raises(docker.errors.NotFound):
        egress_env.client.networks.get(jn.network_name(cli_job))

    assert calls['ansible-imported'] == 'False'  # the command line needs no Ansible
