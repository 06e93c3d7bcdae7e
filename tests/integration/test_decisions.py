"""The decision log on the real engine (issue 25): every decision, allowed and refused, as one JSON line.

A real job network made by the job-network API (``pi-job-<id>-net``, the session proxy attached) holds a
job container named as a dispatcher names it; every request below is sent from it, and the line the proxy
wrote into the deployment folder's ``decisions`` folder is asserted: verdict, reason and the job id the
proxy read from the client's address. Then the log is read back through ``egress_decisions`` and replayed
against a staged allowlist, by the module and by ``site.yml --check --diff``. Every loop is bounded.
"""

import json
import os
import subprocess
import time

import pytest

docker = pytest.importorskip('docker')

from conftest import ROOT, SUFFIX, TOOLS_IMAGE, ansible_env, listed_entry, run_playbook, tls_attempt  # noqa: E402
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import decisions as _decisions  # noqa: E402
from ansible_collections.pi_dispatch.egress.plugins.module_utils import jobnet as jn  # noqa: E402

pytestmark = pytest.mark.integration

JOB = 'it25log' + SUFFIX.replace('-', '_')
SECRET_QUERY = 'it25-query-secret-9f3c'
SECRET_HEADER = 'it25-header-secret-71ab'


@pytest.fixture(scope='module')
def job(egress_env):
    """A job network from the API and a job container on it; removed after the module."""
    client = egress_env.client
    name = jn.container_name(JOB)
    try:
        client.api.remove_container(name, force=True)
    except docker.errors.NotFound:
        pass
    jn.teardown_job_network(client, JOB, proxy_name=egress_env.proxy)
    net = jn.create_job_network(client, JOB, proxy_name=egress_env.proxy)
    client.containers.run(TOOLS_IMAGE, ['sleep', 'infinity'], name=name, detach=True, network=net.network,
                          labels={'io.pi-dispatch.egress.test': 'decision-log-job'})
    try:
        yield name
    finally:
        try:
            client.api.remove_container(name, force=True)
        except docker.errors.NotFound:
            pass
        jn.teardown_job_network(client, JOB, proxy_name=egress_env.proxy)


def _folder(env):
    return os.path.join(env.deploy_dir, _decisions.DEFAULT_FOLDER)


def _lines(env):
    records, problems, _warnings = _decisions.read_records(_folder(env))
    assert not problems, problems
    return records


def _wait_for(env, since, match, timeout=15):
    """The first record made at ``since`` (epoch seconds) or later that ``match`` accepts (bounded wait).

    By time, not by position: the folder holds a file per writer and a tunnel's line is written when it
    closes, so a new line need not be the last one read.
    """
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        seen = [r for r in _lines(env) if r['epoch'] >= since]
        found = [r for r in seen if match(r)]
        if found:
            return found[0]
        time.sleep(0.3)
    raise AssertionError('no decision line matched; lines since: %s' % json.dumps(seen, indent=1)[-3000:])


def _tunnel(env, job, target, sni, mode='tls'):
    before = time.time() - 0.005  # squid stamps a request when it reads it (to the ms), after this
    result, _reached = tls_attempt(env, job, target, sni, mode=mode)
    host = target.rsplit(':', 1)[0]
    record = _wait_for(env, before, lambda r: r.get('host') == host.lower() and r.get('method') == 'CONNECT')
    return result, record


def _assert_line(record, verdict, reason, job=JOB):
    assert (record['verdict'], record['reason'], record['job']) == (verdict, reason, job), record
    assert record['network'] == jn.network_name(JOB), record


@pytest.mark.parametrize('sni,verdict,reason', [
    ('denied.test', 'refused', 'sni_mismatch'),
    ('-', 'refused', 'no_sni'),
    ('API.PROVIDER.TEST', 'allowed', 'sni_ok'),
])
def test_each_tunnel_decision_is_one_line_with_its_job(egress_env, job, sni, verdict, reason):
    result, record = _tunnel(egress_env, job, 'api.provider.test:443', sni)
    _assert_line(record, verdict, reason)
    assert record['check'] == 'tls' and record['port'] == 443, record
    assert record['sni'] == (None if sni == '-' else sni), record
    if verdict == 'allowed':
        assert result['answer'] == 'HTTP/1.0 401 Unauthorized', result
        # the line is written when the tunnel closes, with the bytes it carried each way
        assert record['bytes_to_client'] > 0 and record['bytes_from_client'] > 0, record


def test_a_listed_ip_literal_without_sni_is_logged_as_such(egress_env, job):
    with listed_entry(egress_env, egress_env.fake_ip()) as address:
        result, record = _tunnel(egress_env, job, '%s:443' % address, '-')
    assert result['answer'] == 'HTTP/1.0 401 Unauthorized', result
    _assert_line(record, 'allowed', 'ip_literal')


def test_plain_bytes_in_a_tunnel_to_443_are_logged_not_tls(egress_env, job):
    _result, record = _tunnel(egress_env, job, 'www.forge.test:443', '-', mode='plain')
    _assert_line(record, 'refused', 'not_tls')


def _curl(env, job, args):
    argv = ['curl', '-s', '-o', '/dev/null', '-w', '%{http_code}', '--max-time', '10', '--proxy',
            'http://%s:3128' % env.proxy] + args
    rc, out = env.client.containers.get(job).exec_run(['timeout', '15'] + argv)
    return (out or b'').decode('utf-8', 'replace')


@pytest.mark.parametrize('args,host,port,verdict,reason', [
    (['http://denied.test/path?token=' + SECRET_QUERY, '-H', 'Authorization: Bearer ' + SECRET_HEADER],
     'denied.test', 80, 'refused', 'unlisted'),
    (['http://api.provider.test/v1/models?key=' + SECRET_QUERY], 'api.provider.test', 80, 'allowed', 'listed'),
    (['http://api.provider.test:443/v1/models'], 'api.provider.test', 443, 'refused', 'plain_https'),
    (['-p', 'https://api.provider.test:8443/v1/models', '-k'], 'api.provider.test', 8443, 'refused', 'port'),
])
def test_the_proxys_own_decisions_carry_their_reason_and_no_query_or_header(
        egress_env, job, args, host, port, verdict, reason):
    before = time.time() - 0.005  # squid stamps a request when it reads it (to the ms), after this
    _curl(egress_env, job, args)
    # by host AND port: the case before this one asked the same host on 80, and a loaded machine can write
    # its line within this one's window (CI saw the 80 line matched for the 443 case)
    record = _wait_for(egress_env, before, lambda r: (r.get('host'), r.get('port'), r.get('check')) == (
        host, port, 'proxy'))
    _assert_line(record, verdict, reason)
    # squid's own 403 for a refusal; the upstream's answer for what passed
    assert (record['status'] == 403) == (verdict == 'refused') and record['status'], record
    # never a query string, a header value or a credential, in any file of the folder
    for path in _decisions.log_files(_folder(egress_env))[0]:
        with open(path) as handle:
            text = handle.read()
        assert SECRET_QUERY not in text and SECRET_HEADER not in text and '?' not in text, path


def test_a_model_endpoints_plain_tunnel_is_logged_as_endpoint(egress_env, job):
    extra = {'egress_deploy_dir': egress_env.deploy_dir, 'egress_proxy_name': egress_env.proxy,
             'egress_model_endpoints': [{'id': 'log-models', 'host': 'models.test', 'port': 8443, 'slots': 1,
                                         'keyless': True}]}
    rc, out, _recap = run_playbook('playbooks/endpoints.yml', extra)
    assert rc == 0, out[-4000:]
    try:
        before = time.time() - 0.005  # squid stamps a request when it reads it (to the ms), after this
        code = _curl(egress_env, job, ['-k', 'https://models.test:8443/v1/models'])
        assert code == '200', code
        record = _wait_for(egress_env, before, lambda r: r.get('host') == 'models.test')
        _assert_line(record, 'allowed', 'endpoint')
        assert record['check'] == 'proxy' and record['port'] == 8443, record
    finally:
        extra['egress_model_endpoints'] = []
        rc, out, _recap = run_playbook('playbooks/endpoints.yml', extra)
        assert rc == 0, out[-4000:]


def _module(args, timeout=300):
    """egress_decisions run by ansible ad hoc (one line: "localhost | SUCCESS => {...}"): its result dict."""
    cmd = ['ansible', 'localhost', '-i', 'localhost,', '-c', 'local', '-o', '-m',
           'pi_dispatch.egress.egress_decisions', '-a', json.dumps(args)]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ansible_env(), cwd=ROOT,
                          timeout=timeout, check=False)
    out = proc.stdout.decode('utf-8', 'replace')
    assert proc.returncode == 0 and '=>' in out, out + proc.stderr.decode('utf-8', 'replace')
    return json.loads(out.split('=>', 1)[1])


def test_reading_by_job_and_verdict_and_replaying_a_staged_allowlist(egress_env, job):
    # traffic this job made through a listed host (a tunnel and a plain request)
    tls_attempt(egress_env, job, 'api.provider.test:443', 'api.provider.test')
    _curl(egress_env, job, ['http://api.provider.test/v1/models'])
    time.sleep(1)
    result = _module(dict(deploy_dir=egress_env.deploy_dir, job=JOB, verdict='refused', since='1h'))
    assert result['count'] >= 3 and all(r['job'] == JOB and r['verdict'] == 'refused' for r in result['records'])
    assert result['summary']['refused'] == result['count'], result['summary']
    assert {'name': JOB, 'count': result['count']} in result['summary']['refused_jobs'], result['summary']

    # a staged allowlist without api.provider.test: the job's requests to it are newly refused
    with open(os.path.join(egress_env.deploy_dir, 'egress-allowlist.conf')) as handle:
        current = handle.read()
    assert 'api.provider.test' in current
    staged = os.path.join(egress_env.deploy_dir, 'egress-allowlist.conf.staged')
    with open(staged, 'w') as handle:
        handle.write(''.join(line + '\n' for line in current.splitlines()
                             if line.split()[:1] != ['api.provider.test']) + 'denied.test\n')
    try:
        result = _module(dict(deploy_dir=egress_env.deploy_dir, replay_allowlist=staged, since='1h'))
    finally:
        os.unlink(staged)
    replay = result['replay']
    refused = dict(((row['kind'], row['host'], row['port']), row) for row in replay['newly_refused'])
    assert JOB in refused[('CONNECT', 'api.provider.test', 443)]['jobs'], replay
    assert JOB in refused[('HTTP', 'api.provider.test', 80)]['jobs'], replay
    allowed = dict(((row['kind'], row['host'], row['port']), row) for row in replay['newly_allowed'])
    assert JOB in allowed[('HTTP', 'denied.test', 80)]['jobs'], replay
    assert any('api.provider.test:443 would be refused' in line and JOB in line for line in replay['lines']), replay


def test_site_check_diff_shows_what_an_allowlist_edit_would_refuse(egress_env, job):
    tls_attempt(egress_env, job, 'www.forge.test:443', 'www.forge.test')
    path = os.path.join(egress_env.deploy_dir, 'egress-allowlist.conf')
    with open(path) as handle:
        before = handle.read()
    try:
        with open(path, 'w') as handle:
            handle.write(''.join(line + '\n' for line in before.splitlines() if line.split()[:1] != ['.forge.test']))
        rc, out, _recap = egress_env.site(check=True)
    finally:
        with open(path, 'w') as handle:
            handle.write(before)
    assert rc == 0, out[-6000:]
    flat = ' '.join(out.split())
    assert '- CONNECT www.forge.test:443 would be refused' in flat and JOB in flat, out[-6000:]
    # --diff: the recorded request before and after
    assert "'- was CONNECT www.forge.test:443 (jobs: %s) allowed'" % JOB in flat, out[-6000:]
    assert "'+ now CONNECT www.forge.test:443 (jobs: %s) refused'" % JOB in flat, out[-6000:]


def test_the_log_survives_a_proxy_replace(egress_env, job):
    tls_attempt(egress_env, job, 'api.provider.test:443', 'api.provider.test')
    time.sleep(0.5)
    count = len(_lines(egress_env))
    old_id = egress_env.client.api.inspect_container(egress_env.proxy)['Id']
    rc, out, _recap = egress_env.site(egress_proxy_allow_cut_jobs=True, egress_proxy_pids_limit=300)
    assert rc == 0, out[-6000:]
    assert egress_env.client.api.inspect_container(egress_env.proxy)['Id'] != old_id
    rc, out, _recap = egress_env.site(egress_proxy_allow_cut_jobs=True)
    assert rc == 0, out[-6000:]
    # the job's network is attached again after each replace; the old lines are still there, new ones follow
    result, record = _tunnel(egress_env, job, 'api.provider.test:443', 'api.provider.test')
    assert len(_lines(egress_env)) > count
    _assert_line(record, 'allowed', 'sni_ok')
    info = os.stat(_folder(egress_env))
    assert info.st_uid == 13 and oct(info.st_mode & 0o777) == '0o750', info


def test_a_job_on_an_address_the_last_job_just_left_is_logged_as_itself(egress_env, job):
    """The next job gets the same subnet and, often, the same address: its line names it, not the last one."""
    client = egress_env.client
    addresses = {}
    for name in ('it25reuse_a', 'it25reuse_b'):
        jn.teardown_job_network(client, name, proxy_name=egress_env.proxy)
        net = jn.create_job_network(client, name, proxy_name=egress_env.proxy)
        container = client.containers.run(TOOLS_IMAGE, ['sleep', 'infinity'], name=net.container, detach=True,
                                          network=net.network, labels={'io.pi-dispatch.egress.test': 'reuse'})
        try:
            container.reload()
            addresses[name] = container.attrs['NetworkSettings']['Networks'][net.network]['IPAddress']
            before = time.time() - 0.005  # squid stamps a request when it reads it (to the ms), after this
            tls_attempt(egress_env, net.container, 'api.provider.test:443', 'denied.test')
            record = _wait_for(egress_env, before, lambda r: r.get('client') == addresses[name]
                               and r.get('reason') == 'sni_mismatch')
            assert record['job'] == name, (addresses, record)
        finally:
            container.remove(force=True)
            jn.teardown_job_network(client, name, proxy_name=egress_env.proxy)


def test_a_fifo_or_a_link_planted_in_the_folder_is_refused_never_waited_on(egress_env, job):
    """Issue 42 item 15: the folder is the proxy user's; a FIFO there held the reader (root) forever, a link was
    followed. Planted beside the proxy's real files, both are named with the fix and the real lines are read."""
    folder = _folder(egress_env)
    fifo = os.path.join(folder, 'planted.tls-decisions.jsonl')
    link = os.path.join(folder, 'planted.decisions.jsonl')
    os.mkfifo(fifo)
    os.symlink('/etc/shadow', link)
    try:
        # bounded: the module returns in seconds; a reader waiting on the FIFO would end in TimeoutExpired
        result = _module(dict(deploy_dir=egress_env.deploy_dir, since='1h', limit=1), timeout=90)
    finally:
        os.unlink(fifo)
        os.unlink(link)
    assert fifo not in result['files'] and link not in result['files'] and result['files'], result['files']
    refused = result['refused_files']
    assert len(refused) == 2, refused
    assert any(r.startswith('%s is a FIFO' % fifo) and 'rm %s' % fifo in r for r in refused), refused
    assert any(r.startswith('%s is a symlink' % link) and 'rm %s' % link in r for r in refused), refused
    assert result['count'] > 0, result
