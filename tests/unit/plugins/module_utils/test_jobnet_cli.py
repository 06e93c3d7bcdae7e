"""Unit tables for plugins/module_utils/jobnet_cli.py (no daemon), and the old import path's removal."""

import io
import json

import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils import jobnet as jn
from ansible_collections.pi_dispatch.egress.plugins.module_utils import jobnet_cli as cli


def _run(argv, connect):
    out = io.StringIO()
    code = cli.main(argv, out=out, connect=connect)
    text = out.getvalue()
    assert text.count('\n') == 1, 'exactly one JSON line on stdout: %r' % text
    return code, json.loads(text)


def _raises(exc):
    def connect(args):
        raise exc
    return connect


# Every exception the API documents maps to its own code; the order matters (subclasses first).
@pytest.mark.parametrize('exc, code, kind, retryable', [
    (jn.JobNetError('bad job id'), cli.EXIT_BAD_INPUT, 'JobNetError', False),
    (jn.PoolExhausted('no /29 left in 10.47.0.0/16'), cli.EXIT_POOL_EXHAUSTED, 'PoolExhausted', False),
    (jn.ShardError('cannot make a shard'), cli.EXIT_SHARD, 'ShardError', False),
    (jn.EngineError('a container is still on the network'), cli.EXIT_ENGINE, 'EngineError', False),
    (jn.EngineUnavailable('the daemon does not answer'), cli.EXIT_UNAVAILABLE, 'EngineUnavailable', True),
    (RuntimeError('a bug'), cli.EXIT_INTERNAL, 'RuntimeError', False),
])
@pytest.mark.parametrize('argv', [['create', 'job-1'], ['teardown', 'job-1'], ['sweep']])
def test_every_exception_is_one_json_object_and_its_code(argv, exc, code, kind, retryable):
    got, doc = _run(argv, _raises(exc))
    assert got == code == doc['exit_code']
    assert doc['ok'] is False and doc['command'] == argv[0] and doc['api_version'] == jn.API_VERSION
    assert doc['error'] == dict(type=kind, message=str(exc), retryable=retryable)


def test_codes_are_distinct_and_documented():
    codes = [cli.EXIT_OK, cli.EXIT_INTERNAL, cli.EXIT_USAGE, cli.EXIT_BAD_INPUT, cli.EXIT_POOL_EXHAUSTED,
             cli.EXIT_SHARD, cli.EXIT_ENGINE, cli.EXIT_UNAVAILABLE, cli.EXIT_REFUSED, cli.EXIT_SWEEP_FAILED]
    assert len(set(codes)) == len(codes) and set(codes) == set(cli.EXIT_CODES)
    with open(__file__.split('/tests/', maxsplit=1)[0] + '/docs/job-network-api.md') as handle:
        text = handle.read()
    for code, what in cli.EXIT_CODES.items():
        assert '| %d |' % code in text, 'docs/job-network-api.md has no row for exit code %d (%s)' % (code, what)


def test_a_bad_job_id_is_refused_before_the_daemon_is_asked():
    asked = []
    code, doc = _run(['create', 'Bad Id!'], lambda args: asked.append(1) or object())
    assert code == cli.EXIT_BAD_INPUT and doc['error']['type'] == 'JobNetError'


def test_a_secret_in_a_message_is_redacted():
    code, doc = _run(['teardown', 'job-1'], _raises(jn.EngineUnavailable('tcp://user:s3cret@daemon.test:2376 is down')))
    assert 's3cret' not in json.dumps(doc) and 'tcp://***@daemon.test' in doc['error']['message']


@pytest.mark.parametrize('state, code, verdict', [
    ('running', cli.EXIT_OK, jn.ADMIT),
    ('exited', cli.EXIT_REFUSED, jn.PROXY_STOPPED),
    ('paused', cli.EXIT_REFUSED, jn.PROXY_STOPPED),
    (None, cli.EXIT_REFUSED, jn.PROXY_MISSING),
    ('unavailable', cli.EXIT_UNAVAILABLE, jn.ENGINE_UNAVAILABLE),
])
def test_preflight_verdicts_and_codes(state, code, verdict):
    import docker

    class Containers(object):
        def get(self, name):
            if state is None:
                raise docker.errors.NotFound('no such container')
            if state == 'unavailable':
                raise docker.errors.APIError('connection refused')
            return type('C', (), dict(status=state, attrs={'State': {'Status': state}}))()

    class Api(object):
        def inspect_container(self, name):
            if state is None:
                raise docker.errors.NotFound('no such container')
            if state == 'unavailable':
                raise docker.errors.APIError('connection refused')
            return {'State': {'Status': state}}

    client = type('Client', (), dict(containers=Containers(), api=Api()))()
    got, doc = _run(['preflight'], lambda args: client)
    assert (got, doc['result']['verdict']) == (code, verdict), doc
    assert doc['result']['admitted'] is (code == cli.EXIT_OK)


def test_preflight_with_the_policy_off_admits_without_a_client():
    got, doc = _run(['preflight', '--disabled'], _raises(AssertionError('the daemon was asked')))
    assert got == cli.EXIT_OK and doc['result']['verdict'] == jn.ADMIT


def test_a_sweep_with_failures_has_its_own_code(monkeypatch):
    monkeypatch.setattr(jn, 'sweep', lambda client, **kw: dict(removed=[], kept=[], changed=False,
                                                               failed=[dict(network='pi-job-x-net', step='remove')]))
    got, doc = _run(['sweep'], lambda args: object())
    assert got == cli.EXIT_SWEEP_FAILED and doc['ok'] is False and doc['result']['failed']


def test_create_passes_its_options_and_prints_the_run_arguments(monkeypatch):
    seen = {}

    def create(client, job_id, **kw):
        seen.update(kw, job_id=job_id)
        return jn.JobNetwork(job_id, jn.network_name(job_id), jn.container_name(job_id), '10.47.0.8/29',
                             jn.job_env(), changed=True, actions=['create'], proxy=jn.PROXY_NAME)
    monkeypatch.setattr(jn, 'create_job_network', create)
    got, doc = _run(['--proxy', 'p', 'create', 'job-7', '--pool', '10.50.0.0/16', '--prefix', '28',
                     '--shard-bound', '3', '--remote', '--check'], lambda args: object())
    assert got == cli.EXIT_OK and doc['ok'] is True
    assert seen == dict(job_id='job-7', proxy_name='p', pool='10.50.0.0/16', prefix=28, routes=[],
                        check_mode=True, shard_bound=3, mode='explicit', project_policy=None,
                        gateway_name='pi-dispatch-egress-gateway', deploy_dir=None)
    assert doc['result']['network'] == 'pi-job-job-7-net'
    assert doc['result']['run_args'][:4] == ['--name', 'pi-job-job-7', '--network', 'pi-job-job-7-net']


def test_a_bad_command_line_is_argparse_code_2():
    with pytest.raises(SystemExit) as caught:
        cli.main(['explode'], out=io.StringIO())
    assert caught.value.code == cli.EXIT_USAGE


# --- the old import path, deprecated in 0.4.0, is gone in 0.5.0 as announced ---------------------------------

def test_the_old_import_path_is_removed():
    import importlib
    with pytest.raises(ImportError):
        importlib.import_module('ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnet')


# --- approve-optins: the operator's consent to a project's opt-ins (issue 42, item 10) -------------------------

def _no_daemon(args):
    raise AssertionError('approve-optins asks no daemon')


def test_approve_optins_shows_then_approves_the_digest_the_refusal_names(tmp_path):
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import optins as O
    project = tmp_path / 'project'
    (project / '.pi-container').mkdir(parents=True)
    policy = project / '.pi-container' / 'config.yaml'
    policy.write_text('egress:\n  allow:\n    tcp_ports: [{port: 8443, hosts: [attacker.example]}]\n')
    deploy = tmp_path / 'deploy'
    deploy.mkdir()
    message = O.refusal(O.load(str(policy)), None, str(deploy))
    argv = message.split('approve exactly this policy with: ', 1)[1].split(' ; ', 1)[0].split()
    assert argv[:3] == ['python3', '-m', 'ansible_collections.pi_dispatch.egress.plugins.module_utils.jobnet_cli']
    shown_code, shown = _run(['approve-optins', '--project', str(project), '--deploy-dir', str(deploy), '--check'],
                             _no_daemon)
    assert shown_code == cli.EXIT_OK and shown['result']['changed'] is True
    assert shown['result']['opens'] == ['tcp/8443 towards attacker.example'] and not list(deploy.iterdir())
    code, doc = _run(argv[3:], _no_daemon)
    assert code == cli.EXIT_OK and doc['result']['changed'] is True, doc
    assert doc['result']['digest'] == shown['result']['digest']
    O.check_approved(O.load(str(policy)), str(deploy))
    again_code, again = _run(argv[3:], _no_daemon)
    assert again_code == cli.EXIT_OK and again['result']['changed'] is False


def test_approve_optins_refuses_a_digest_the_file_no_longer_has(tmp_path):
    policy = tmp_path / 'p.yaml'
    policy.write_text('egress:\n  allow:\n    ssh: true\n')
    code, doc = _run(['approve-optins', '--policy', str(policy), '--deploy-dir', str(tmp_path), '--digest',
                      'sha256:' + '0' * 64], _no_daemon)
    assert code == cli.EXIT_BAD_INPUT and doc['error']['type'] == 'JobNetError'
    assert 'changed since it was reviewed' in doc['error']['message']
    assert not (tmp_path / 'optins-approved').exists()


@pytest.mark.parametrize('argv', [
    ['approve-optins', '--project', '/p'],  # neither --digest nor --check
    ['approve-optins', '--digest', 'sha256:00'],  # neither --project nor --policy
    ['approve-optins', '--project', '/p', '--policy', '/p/x.yaml', '--check'],
    ['approve-optins', '--project', '/p', '--digest', 'sha256:00', '--check'],
])
def test_approve_optins_command_line_is_one_of_each(argv):
    with pytest.raises(SystemExit) as caught:
        cli.main(argv, out=io.StringIO())
    assert caught.value.code == cli.EXIT_USAGE
