"""Credential placeholders on the real engine: the real squid proxy (its TLS name check routing bound hosts
through the interceptor, by the rendered include), the real interceptor (mitmproxy with the pi_interceptor
addon, in its hardened container) and a fake provider that records every header it receives.

The world (module fixture): ``playbooks/site.yml`` (with ``-vvv --diff``) deploys into a temporary folder
whose ``egress-credentials.json`` declares two credentials; the proxy role builds and runs the interceptor,
renders the include and runs the proxy with it. Three ``--internal`` networks:

* the upstream network: the fake provider (``api.provider.test``, ``other.provider.test``,
  ``unbound.provider.test``, ``unlisted.provider.test``) and the proxy;
* the credentials network (made by the role): the interceptor, the proxy and a "direct" client that talks
  to the interceptor itself (the addon's decisions, one by one);
* a job network: the proxy and a job client that goes through squid as a job does (the chain).

Two credentials are bound: ``anthropic`` (x-api-key) to api.provider.test and ``other`` (Bearer) to
other.provider.test; unbound.provider.test is listed with none; unlisted.provider.test is not listed. The
job's placeholders are recorded against the job id, as the job-network API will record them.
"""

import json
import os
import secrets
import uuid

import pytest

docker = pytest.importorskip('docker')

import credentials_world as _world  # noqa: E402  (tests/integration/credentials_world.py)
from credentials_world import (  # noqa: E402
    CLIENT, INTERCEPTOR, INTERCEPTOR_IMAGE, JOB, LABEL, OTHER_JOB, PROXY, PROXY_IMAGE, SUFFIX, TOOLS_IMAGE)

from conftest import doctor_objects_left  # noqa: E402
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import credentials as _credentials  # noqa: E402


@pytest.fixture(scope='module')
def world(tmp_path_factory):
    try:
        client = docker.from_env(timeout=120)
        client.ping()
        for image in (TOOLS_IMAGE, INTERCEPTOR_IMAGE, PROXY_IMAGE):
            client.images.get(image)
    except Exception as exc:
        pytest.fail('The engine or an image is missing (%s); ./run test builds the images '
                    '(ansible-playbook tests/images/build.yml).' % exc)
    w = _world.build(client, str(tmp_path_factory.mktemp('credentials')))
    try:
        yield w
    finally:
        _world.cleanup(client)


def _marker():
    return '/v1/messages?m=' + uuid.uuid4().hex


def test_the_bound_host_gets_the_real_secret_and_the_job_never_sees_it(world):
    path = _marker()
    answer = world.request('api.provider.test', [('x-api-key', world.placeholders['anthropic'])], path=path)
    assert answer['error'] is None and ' 200 ' in answer['status'] + ' ', answer
    assert answer['issuer'] == 'mitmproxy', 'a bound host is terminated with the deployment CA: %s' % answer
    seen = world.saw_marker(path.split('=')[1])
    assert len(seen) == 1
    assert ['x-api-key', world.secret['anthropic']] in [[k.lower(), v] for k, v in seen[0]['headers']]
    # The provider echoes the key back in its body and a header: the job gets it redacted.
    assert world.secret['anthropic'] not in answer['body'] + answer['headers']
    assert '[redacted:anthropic]' in answer['body'] and '[redacted:anthropic]' in answer['headers']
    assert any(r.get('event') == 'swapped' and r.get('job') == JOB and r.get('credential') is None
               and r.get('swapped') == ['anthropic'] for r in world.records())


def test_a_bearer_credential_is_swapped_in_its_scheme(world):
    path = _marker()
    answer = world.request('other.provider.test', [('Authorization', 'Bearer ' + world.placeholders['other'])],
                           path=path)
    assert ' 200 ' in (answer['status'] or '') + ' ', answer
    seen = world.saw_marker(path.split('=')[1])
    assert [['authorization', 'Bearer ' + world.secret['other']]] == [
        [k.lower(), v] for k, v in seen[0]['headers'] if k.lower() == 'authorization']


@pytest.mark.parametrize('case', [
    'header-to-other-bound-host', 'in-the-url', 'in-the-body', 'in-another-header', 'of-another-job',
    'unknown-placeholder', 'real-key', 'real-key-in-body', 'host-differs-from-sni', 'trace'])
def test_refused_requests_reach_nothing(world, case):
    ph = world.placeholders['anthropic']
    marker = uuid.uuid4().hex
    path = '/v1/messages?m=' + marker
    host, headers, method, host_header = 'api.provider.test', [], 'GET', None
    reason = None
    if case == 'header-to-other-bound-host':
        host, headers, reason = 'other.provider.test', [('x-api-key', ph)], 'placeholder-elsewhere'
    elif case == 'in-the-url':
        path, reason = path + '&key=' + ph, 'placeholder-elsewhere'
    elif case == 'in-the-body':
        reason = 'placeholder-elsewhere'
    elif case == 'in-another-header':
        headers, reason = [('x-forwarded-key', ph)], 'placeholder-elsewhere'
    elif case == 'of-another-job':
        headers, reason = [('x-api-key', world.foreign)], 'placeholder-of-another-job'
    elif case == 'unknown-placeholder':
        headers, reason = [('x-api-key', _credentials.placeholder('anthropic'))], 'unknown-placeholder'
    elif case == 'real-key':
        headers, reason = [('x-api-key', world.secret['anthropic'])], 'real-credential'
    elif case == 'real-key-in-body':
        reason = 'real-credential'
    elif case == 'host-differs-from-sni':
        host_header, headers, reason = 'other.provider.test', [('x-api-key', ph)], 'host-sni-mismatch'
    elif case == 'trace':
        method, headers, reason = 'TRACE', [('x-api-key', ph)], 'trace'
    if case == 'in-the-body':
        answer = world.request(host, path=path, method='POST', body='key=' + ph + '&x=yz')
    elif case == 'real-key-in-body':
        answer = world.request(host, path=path, method='POST', body=world.secret['anthropic'])
    else:
        answer = world.request(host, headers, host_header=host_header, method=method, path=path)
    assert answer['error'] is None and ' 403 ' in (answer['status'] or '') + ' ', answer
    assert reason in answer['body'], answer
    assert world.saw_marker(marker) == [], 'a refused request reached the provider'
    assert world.secret['anthropic'] not in json.dumps(answer)
    matching = [r for r in world.records() if r.get('event') == 'refused' and r.get('reason') == reason]
    assert matching, 'no refusal recorded for %s' % reason
    assert all(r.get('job') in (JOB, OTHER_JOB) for r in matching), matching


# --- through squid, as a job goes ------------------------------------------------------------------------

def test_through_squid_the_bound_host_gets_the_secret(world):
    """job -> squid (allowlist, guard) -> TLS name check -> interceptor -> TLS name check -> provider."""
    path = _marker()
    answer = world.request('api.provider.test', [('x-api-key', world.placeholders['anthropic'])], path=path,
                           via='job')
    assert answer['error'] is None and ' 200 ' in (answer['status'] or '') + ' ', answer
    assert answer['issuer'] == 'mitmproxy', answer
    seen = world.saw_marker(path.split('=')[1])
    assert len(seen) == 1, seen
    assert ['x-api-key', world.secret['anthropic']] in [[k.lower(), v] for k, v in seen[0]['headers']]
    assert world.secret['anthropic'] not in answer['body'] + answer['headers']
    assert '[redacted:anthropic]' in answer['body']


def test_an_unbound_listed_host_is_a_plain_tunnel(world):
    """No credential is bound to it: squid splices it, the job sees the provider's own certificate."""
    path = _marker()
    answer = world.request('unbound.provider.test', [('x-api-key', 'not-a-secret')], path=path,
                           ca='/share/provider-ca.pem', via='job')
    assert answer['error'] is None and ' 200 ' in answer['status'] + ' ', (
        answer, world.client.api.logs(PROXY, tail=30).decode('utf-8', 'replace'))
    assert answer['issuer'] == 'fake provider test CA', answer
    assert len(world.saw_marker(path.split('=')[1])) == 1
    # Through the deployment CA the same host fails: its certificate is the provider's own.
    failed = world.request('unbound.provider.test', path=_marker(), via='job')
    assert failed['error'] and 'CERTIFICATE_VERIFY_FAILED' in failed['error'], failed


def test_through_squid_a_placeholder_sent_to_another_bound_host_is_refused(world):
    marker = uuid.uuid4().hex
    answer = world.request('other.provider.test', [('x-api-key', world.placeholders['anthropic'])],
                           path='/v1/messages?m=' + marker, via='job')
    assert ' 403 ' in (answer['status'] or '') + ' ' and 'placeholder-elsewhere' in answer['body'], answer
    assert world.saw_marker(marker) == []


def test_through_squid_an_unlisted_host_is_refused_by_squid(world):
    answer = world.request('unlisted.provider.test', path=_marker(), via='job')
    assert (answer['connect'] or '').startswith('HTTP/1.1 403'), answer


def test_the_interceptors_way_out_is_closed_to_jobs(world):
    """Port 3130 of the TLS name check opens only to the interceptor's network: a job dialling it directly
    (to skip squid's rules and the interceptor) gets no tunnel."""
    marker = uuid.uuid4().hex
    answer = world.request('api.provider.test', [('x-api-key', world.placeholders['anthropic'])],
                           path='/v1/messages?m=' + marker, via='return-port', ca='/share/provider-ca.pem')
    # An ssl-bump port answers a refused CONNECT with 200 and then cuts the tunnel (an error there would
    # have to be served by terminating TLS): what matters is that no TLS session reaches anything.
    assert answer['status'] is None and answer['issuer'] is None and answer['error'], answer
    assert world.saw_marker(marker) == []


def test_through_squid_an_sni_that_is_not_the_connect_host_is_cut(world):
    marker = uuid.uuid4().hex
    answer = world.request('api.provider.test', [('x-api-key', world.placeholders['anthropic'])],
                           sni='unbound.provider.test', path='/v1/messages?m=' + marker, via='job',
                           ca='/share/provider-ca.pem')
    assert answer['status'] is None and answer['issuer'] is None, answer
    assert world.saw_marker(marker) == []


# --- hostile requests inside the bound tunnel (issue 42) -----------------------------------------------------

# Request targets that are not origin-form (RFC 9112 3.2): absolute-form names a host the server routes by,
# ignoring Host, so a front end serving several names would hand the key to the one the line names;
# authority-form and asterisk-form have no place inside the tunnel. (id, method, target)
TARGETS = [
    ('absolute-other-bound-host', 'GET', 'https://other.provider.test/v1/messages?m={m}'),
    ('absolute-unbound-listed-host', 'GET', 'https://unbound.provider.test/v1/messages?m={m}'),
    ('absolute-unlisted-host', 'POST', 'http://unlisted.provider.test/v1/messages?m={m}'),
    ('absolute-the-bound-host-itself', 'GET', 'https://api.provider.test/v1/messages?m={m}'),
    ('absolute-the-bound-host-other-port', 'GET', 'https://api.provider.test:8443/v1/messages?m={m}'),
    ('authority-form', 'CONNECT', 'other.provider.test:443'),
    ('asterisk-form', 'OPTIONS', '*'),
]


@pytest.mark.parametrize('via', ['job', 'interceptor'])
@pytest.mark.parametrize('method, target', [t[1:] for t in TARGETS], ids=[t[0] for t in TARGETS])
def test_a_request_target_that_names_a_host_never_carries_the_key(world, via, method, target):
    """Tried as an attacker would, with the job's own placeholder for the bound host and Host naming it: the
    interceptor refuses the request, and nothing at all reaches the provider (no key, no request)."""
    marker = uuid.uuid4().hex
    before = len(world.provider_saw())
    answer = world.request('api.provider.test', [('x-api-key', world.placeholders['anthropic'])],
                           method=method, path=target.format(m=marker), via=via)
    after = world.provider_saw()
    assert after[before:] == [], 'the provider received %s' % json.dumps(after[before:])[:600]
    assert ' 200 ' not in (answer['status'] or '') + ' ', answer
    if method != 'CONNECT':   # a CONNECT inside the tunnel may be cut by mitmproxy's own parser instead
        assert ' 403 ' in (answer['status'] or '') + ' ' and 'request-target' in answer['body'], answer
    assert world.secret['anthropic'] not in json.dumps(answer)


@pytest.mark.parametrize('host_header', ['api.provider.test:8443', 'api.provider.test:0443', 'api.provider.test:443:1',
                                         'user@api.provider.test'])
def test_a_host_header_that_is_not_the_bound_authority_is_refused(world, host_header):
    marker = uuid.uuid4().hex
    answer = world.request('api.provider.test', [('x-api-key', world.placeholders['anthropic'])],
                           host_header=host_header, path='/v1/messages?m=' + marker, via='job')
    assert ' 403 ' in (answer['status'] or '') + ' ' and 'host-sni-mismatch' in answer['body'], answer
    assert world.saw_marker(marker) == []


# HTTP/2 (curl, ALPN h2 with the interceptor): (id, curl arguments, expected status, reason or None)
H2_CASES = [
    ('h2-origin-form-is-swapped', [], 200, None),
    ('h2-authority-names-another-host', ['-H', 'Host: other.provider.test'], 403, 'host-sni-mismatch'),
    ('h2-authority-other-port', ['-H', 'Host: api.provider.test:8443'], 403, 'host-sni-mismatch'),
    ('h2-absolute-path', ['--request-target', 'https://other.provider.test/v1/messages?m={m}'], 403, None),
]


@pytest.mark.parametrize('extra, status, reason', [c[1:] for c in H2_CASES], ids=[c[0] for c in H2_CASES])
def test_http2_requests_are_judged_by_their_authority(world, extra, status, reason):
    marker = uuid.uuid4().hex
    argv = ['timeout', '30', 'curl', '-sS', '--http2', '-o', '-', '-w', '\n%{http_version} %{http_code}',
            '--cacert', '/share/interceptor-ca.pem', '-x', 'http://%s:3128' % PROXY,
            '-H', 'x-api-key: ' + world.placeholders['anthropic']] + [a.format(m=marker) for a in extra] + [
        'https://api.provider.test/v1/messages?m=' + marker]
    rc, out = world.client.containers.get(_world.JOB_CLIENT).exec_run(argv)
    text = out.decode('utf-8', 'replace')
    assert rc == 0 and text.rstrip().endswith('2 %d' % status), text[-400:]
    assert world.secret['anthropic'] not in text
    if reason:
        assert reason in text, text[-400:]
    assert len(world.saw_marker(marker)) == (1 if status == 200 else 0)


def test_through_squid_the_interceptor_names_the_job_by_its_address(world):
    """The TLS name check carries squid's X-Pi-Client to the interceptor (client-tag): the swap is recorded
    under the job's own address and job, not the proxy's address."""
    job_ip = world.client.api.inspect_container(_world.JOB_CLIENT)['NetworkSettings']['Networks'][_world.JOBNET][
        'IPAddress']
    path = _marker()
    answer = world.request('api.provider.test', [('x-api-key', world.placeholders['anthropic'])], path=path,
                           via='job')
    assert ' 200 ' in (answer['status'] or '') + ' ', answer
    swaps = [r for r in world.records() if r.get('event') == 'swapped']
    assert swaps and swaps[-1]['client'] == job_ip and swaps[-1]['job'] == JOB, swaps[-3:]


def test_through_squid_another_jobs_placeholder_is_refused(world):
    marker = uuid.uuid4().hex
    answer = world.request('api.provider.test', [('x-api-key', world.foreign)], path='/v1/messages?m=' + marker,
                           via='job')
    assert ' 403 ' in (answer['status'] or '') + ' ' and 'placeholder-of-another-job' in answer['body'], answer
    assert world.saw_marker(marker) == []


@pytest.mark.parametrize('forged', [[('X-Pi-Client', '192.0.2.7')],
                                    [('X-Pi-Client', '192.0.2.7'), ('X-Pi-Client', '192.0.2.8')],
                                    [('x-pi-client', '192.0.2.7, 192.0.2.8')]], ids=['one', 'two', 'list'])
def test_a_job_cannot_name_itself_another_job_on_its_connect(world, forged):
    """The job forges X-Pi-Client on its CONNECT with an address of the other job's network and sends that
    job's placeholder: squid drops the forged header and names the job's real address."""
    job_ip = world.client.api.inspect_container(_world.JOB_CLIENT)['NetworkSettings']['Networks'][_world.JOBNET][
        'IPAddress']
    marker = uuid.uuid4().hex
    answer = world.request('api.provider.test', [('x-api-key', world.foreign)], path='/v1/messages?m=' + marker,
                           via='job', connect_headers=forged)
    assert ' 403 ' in (answer['status'] or '') + ' ' and 'placeholder-of-another-job' in answer['body'], answer
    assert world.saw_marker(marker) == []
    refused = [r for r in world.records() if r.get('reason') == 'placeholder-of-another-job']
    assert refused[-1]['client'] == job_ip and refused[-1]['job'] == JOB, refused[-1]


def test_a_placeholder_from_a_client_no_job_names_is_refused(world):
    """The job's network is not in its record (as for a network made without credentials_dir): its own
    placeholder is refused, since nothing says it is the client's."""
    record = dict(world.job_record, subnets=world.job_record['subnets'][:1])   # the direct client's only
    world.write_job(record)
    try:
        marker = uuid.uuid4().hex
        answer = world.request('api.provider.test', [('x-api-key', world.placeholders['anthropic'])],
                               path='/v1/messages?m=' + marker, via='job')
        assert ' 403 ' in (answer['status'] or '') + ' ' and 'job-unknown' in answer['body'], answer
        assert world.saw_marker(marker) == []
        assert any(r.get('reason') == 'job-unknown' and r.get('job') == JOB and r.get('credential') == 'anthropic'
                   for r in world.records())
    finally:
        world.write_job(world.job_record)


def _interceptor_state(world):
    state = world.client.api.inspect_container(INTERCEPTOR)['State']
    return state['Running'], state['OOMKilled'], state['Restarting'], state['StartedAt']


@pytest.mark.parametrize('chunked', [False, True], ids=['content-length-8GiB', 'chunked'])
def test_an_oversized_upload_is_refused_before_it_is_buffered_and_others_are_served(world, chunked):
    """An upload of 8 GiB (declared by Content-Length: refused before a byte of it is read) or a chunked one
    that goes on past 32 MiB (refused by the bytes read): a 413, the interceptor still the same running
    process, and the next request served."""
    host = world.client.api.inspect_container(INTERCEPTOR)['HostConfig']
    assert host['Memory'] == 1024 ** 3 and host['PidsLimit'] == 256, host
    started = _interceptor_state(world)
    answer = world.upload('api.provider.test', [('x-api-key', world.placeholders['anthropic'])], 8 * 1024 ** 3,
                          chunked=chunked, send_at_most=(8 * 1024 ** 3 if not chunked else 256 * 1024 ** 2))
    assert ' 413 ' in (answer['status'] or '') + ' ' or (answer['error'] and 'Reset' in answer['error']), answer
    # By Content-Length nothing need be read; chunked, a little past the bound (socket buffers).
    assert answer['sent'] <= (64 if not chunked else 96) * 1024 ** 2, answer
    assert _interceptor_state(world) == started
    assert any(r.get('reason') == 'body-too-large' and r.get('job') == JOB for r in world.records())
    path = _marker()
    served = world.request('api.provider.test', [('x-api-key', world.placeholders['anthropic'])], path=path,
                           via='job')
    assert ' 200 ' in (served['status'] or '') + ' ', served


# --- the interceptor itself ------------------------------------------------------------------------------

def test_an_sni_that_is_not_the_bound_host_is_cut_without_a_certificate(world):
    answer = world.request('api.provider.test', [('x-api-key', world.placeholders['anthropic'])],
                           sni='unbound.provider.test', path=_marker(), ca='/share/provider-ca.pem')
    assert answer['error'] is not None and answer['status'] is None, answer
    assert answer['issuer'] is None, 'the interceptor showed a certificate for a name the job chose: %s' % answer
    assert any(r.get('reason') == 'sni-not-bound-host' and r.get('job') == JOB for r in world.records())


def test_a_changed_secret_file_takes_effect_on_the_next_request(world):
    old = world.secret['anthropic']
    new = 'sk-ant-ROTATED-' + secrets.token_hex(20)
    world.write_secret('anthropic', new)
    try:
        path = _marker()
        answer = world.request('api.provider.test', [('x-api-key', world.placeholders['anthropic'])], path=path)
        assert ' 200 ' in (answer['status'] or '') + ' ', answer
        seen = world.saw_marker(path.split('=')[1])
        assert ['x-api-key', new] in [[k.lower(), v] for k, v in seen[0]['headers']]
        assert old not in json.dumps(seen)
    finally:
        # Back to the key the fake provider accepts on /v1/models (the doctor's canary asks it); the rotated one is
        # still searched for in every output.
        world.write_secret('anthropic', old)
        world.secret['rotated-away'] = new


def test_no_secret_appears_in_any_output(world):
    """The container's log (every record the interceptor wrote) and what the client got never hold a secret."""
    world.request('api.provider.test', [('x-api-key', world.placeholders['anthropic'])], path=_marker())
    logs = world.client.api.logs(INTERCEPTOR).decode('utf-8', 'replace')
    assert logs.strip(), 'the interceptor wrote no record at all'
    for name, value in world.secret.items():
        assert value not in logs, 'the secret %s appears in the interceptor log' % name
    for value in world.placeholders.values():
        assert value not in logs, 'a placeholder appears in the interceptor log'
    proxy_logs = world.client.api.logs(PROXY).decode('utf-8', 'replace')
    decisions = ''
    for name in sorted(os.listdir(world.log_dir)):
        with open(os.path.join(world.log_dir, name), encoding='utf-8', errors='replace') as handle:
            decisions += handle.read()
    assert 'api.provider.test' in decisions, 'the decision log recorded nothing: %r' % os.listdir(world.log_dir)
    for name, value in world.secret.items():
        assert value not in proxy_logs, 'the secret %s appears in the proxy log' % name
        assert value not in decisions, 'the secret %s appears in the decision log' % name
    for name, value in world.secret.items():
        assert value not in world.site_output, 'the secret %s appears in the site.yml -vvv output' % name
    assert 'egress_credentials' in world.site_output and 'api.provider.test' in world.site_output
    rc, out = world.client.containers.get(CLIENT).exec_run(['sh', '-c', 'env; ls -la /share; cat /share/*'])
    for name, value in world.secret.items():
        assert value not in out.decode('utf-8', 'replace'), name


# --- the job-network API: what a dispatcher does --------------------------------------------------------------

# The job: Python's urllib through the proxy variables, trusting what SSL_CERT_FILE names, sending the key its
# environment holds, as an SDK would. Prints the status and what the provider echoed.
JOB_SCRIPT = r'''
import json, os, sys, urllib.request
request = urllib.request.Request("https://api.provider.test" + sys.argv[1],
                                 headers={"x-api-key": os.environ["ANTHROPIC_API_KEY"]})
try:
    with urllib.request.urlopen(request, timeout=20) as answer:
        print(json.dumps(dict(status=answer.status, body=answer.read().decode())))
except Exception as exc:
    print(json.dumps(dict(status=None, error="%s: %s" % (type(exc).__name__, exc))))
'''


def _job_reaches_the_provider(world, jn):
    """Run JOB_SCRIPT as a job on ``jn`` (its env and CA mounts, nothing else): it must get 200, and the provider
    must have received the real anthropic key; the job's answer (a dict) is returned."""
    marker = uuid.uuid4().hex
    out = world.client.containers.run(
        TOOLS_IMAGE, ['python3', '-c', JOB_SCRIPT, '/v1/messages?m=' + marker], name=jn.container,
        network=jn.network, environment=jn.env, labels=LABEL, remove=True,
        volumes=dict((src, {'bind': dst, 'mode': 'ro'}) for src, dst in jn.ca_mounts.items()))
    answer = json.loads(out.decode().strip().splitlines()[-1])
    assert answer['status'] == 200, answer
    seen = world.saw_marker(marker)
    assert ['x-api-key', world.secret['anthropic']] in [[k.lower(), v] for k, v in seen[0]['headers']]
    return answer


def test_a_job_created_by_the_api_gets_placeholders_and_the_swap_works(world):
    """create_job_network(credentials_dir=...) -> a placeholder in the job's env and the CA mounted; the job,
    knowing nothing of either, reaches the provider with the real key; teardown forgets the placeholder."""
    from ansible_collections.pi_dispatch.egress.plugins.module_utils import jobnet as _jobnet
    client = world.client
    job_id = 'cred-api' + SUFFIX.replace('-', '')
    jn = _jobnet.create_job_network(client, job_id, proxy_name=PROXY, routes=[], credentials_dir=world.deploy_dir,
                                    shard_bound=0)
    try:
        placeholder = jn.env['ANTHROPIC_API_KEY']
        assert _credentials.is_placeholder_shaped(placeholder) and placeholder.startswith('pi-placeholder-anthropic-')
        assert world.secret['anthropic'] not in json.dumps(jn.as_dict()) + ' '.join(jn.run_args())
        assert jn.env['SSL_CERT_FILE'] in jn.ca_mounts.values()
        answer = _job_reaches_the_provider(world, jn)
        assert '[redacted:anthropic]' in answer['body'] and world.secret['anthropic'] not in answer['body']
    finally:
        done = _jobnet.teardown_job_network(client, job_id, proxy_name=PROXY, credentials_dir=world.deploy_dir)
    assert 'forget the placeholders of %s' % job_id in done['actions']
    # Forgotten: the same placeholder is refused from now on.
    refused = world.request('api.provider.test', [('x-api-key', placeholder)], path=_marker())
    assert 'unknown-placeholder' in (refused['body'] or ''), refused


def test_an_unusable_secret_refuses_the_job_before_anything_is_made(world):
    from ansible_collections.pi_dispatch.egress.plugins.module_utils import jobnet as _jobnet
    path = os.path.join(world.secret_dir, 'other')
    os.chmod(path, 0o644)
    try:
        with pytest.raises(_jobnet.JobNetError) as caught:
            _jobnet.create_job_network(world.client, 'cred-refused' + SUFFIX.replace('-', ''), proxy_name=PROXY,
                                       routes=[], credentials_dir=world.deploy_dir, shard_bound=0)
        assert 'other' in str(caught.value) and path in str(caught.value)
        assert world.secret['other'] not in str(caught.value)
        assert _jobnet.inspect_job_network(world.client, _jobnet.network_name('cred-refused'
                                                                              + SUFFIX.replace('-', ''))) is None
    finally:
        os.chmod(path, 0o600)


# --- the doctor: its credential canary through the whole chain -------------------------------------------------

def _doctor_lines(world, tmp_path, name):
    """doctor.yml with -vvv on the world (every probe on .test names); (output, id -> [lines], report text)."""
    import subprocess
    from conftest import ROOT, ansible_env
    json_path = tmp_path / ('%s.jsonl' % name)
    extra = {
        'egress_proxy_name': PROXY, 'egress_deploy_dir': world.deploy_dir, 'egress_decision_log_dir': world.log_dir,
        'egress_credentials_interceptor_name': INTERCEPTOR, 'doctor_probe_image': TOOLS_IMAGE,
        'doctor_provider_host': 'api.provider.test', 'doctor_deny_host': 'unlisted.provider.test',
        'doctor_listed_host': 'api.provider.test', 'doctor_probe_timeout': 5, 'doctor_isolation': False,
        'doctor_firewall': False, 'doctor_squid_mirror': False, 'doctor_fail_on_fail': False,
        'doctor_json_path': str(json_path),
    }
    proc = subprocess.run(['ansible-playbook', '-vvv', '-i', 'localhost,', '-c', 'local',
                           os.path.join(ROOT, 'playbooks', 'doctor.yml'), '-e', json.dumps(extra)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600, env=ansible_env(), cwd=ROOT,
                          check=False)
    out = proc.stdout.decode('utf-8', 'replace')
    assert proc.returncode == 0, out[-5000:]
    assert json_path.exists(), out[-4000:]
    text = json_path.read_text()
    by_id = {}
    for line in (json.loads(t) for t in text.splitlines() if t.strip()):
        by_id.setdefault(line['id'], []).append(line)
    return out, by_id, text


def test_the_doctor_proves_the_swap_and_the_refusal_and_never_holds_a_secret(world, tmp_path):
    """doctor.yml: the interceptor runs; each placeholder is swapped (the provider, which refuses any other key on
    /v1/models, answered 200 and recorded the real key); the anthropic placeholder sent in other.provider.test's
    header is refused; the canary never saw a secret; no output holds one; the canary's objects are gone."""
    before = len(world.provider_saw())
    out, by_id, text = _doctor_lines(world, tmp_path, 'credentials')
    credential_lines = dict((k, v) for k, v in by_id.items() if k.startswith('credentials.'))
    assert sorted(credential_lines) == ['credentials.elsewhere', 'credentials.interceptor',
                                        'credentials.secret_unseen', 'credentials.swap'], credential_lines
    assert all(line['status'] == 'ok' for lines in credential_lines.values() for line in lines), credential_lines
    swaps = by_id['credentials.swap']
    assert len(swaps) == 2 and all('answered HTTP 200' in line['message'] for line in swaps), swaps
    assert 'in the header of other.provider.test' in by_id['credentials.elsewhere'][0]['message']
    assert '2 secrets searched for' in by_id['credentials.secret_unseen'][0]['message']
    # The fake provider received the real secrets from the canary, and nothing from the misplaced placeholder.
    seen = world.provider_saw()[before:]
    models = [r for r in seen if r['path'] == '/v1/models']
    keys = [v for r in models for k, v in r['headers'] if k.lower() in ('x-api-key', 'authorization')]
    assert world.secret['anthropic'] in keys and 'Bearer ' + world.secret['other'] in keys, keys
    assert not [v for v in keys if 'pi-placeholder-' in v], 'a placeholder reached the provider: %r' % keys
    assert len(models) == 2, [(r['host'], r['path']) for r in seen]
    # No secret in the doctor's -vvv output, its JSON lines, the interceptor's or the proxy's log.
    logs = world.client.api.logs(INTERCEPTOR).decode('utf-8', 'replace')
    proxy_logs = world.client.api.logs(PROXY).decode('utf-8', 'replace')
    for name, value in world.secret.items():
        for where, body in (('doctor -vvv output', out), ('doctor JSON lines', text), ('interceptor log', logs),
                            ('proxy log', proxy_logs)):
            assert value not in body, 'the secret %s appears in the %s' % (name, where)
    assert '"reason": "placeholder-elsewhere"' in logs and '"job": "doctor-' in logs
    # Its job network is gone and its placeholders forgotten.
    assert not doctor_objects_left(world.client)
    assert not [n for n in os.listdir(world.jobs_dir) if n.startswith('doctor-')]


def test_the_doctor_says_when_the_provider_refuses_the_secret(world):
    """A wrong key in the secret file: the swap still happens, the provider answers 401, the line is a ✗ naming
    the file (the credential check alone, as doctor.yml runs it, on the same world)."""
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import context as _context
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import credentials as _dcred
    good = world.secret['anthropic']
    wrong = 'sk-ant-WRONG-' + secrets.token_hex(20)
    world.write_secret('anthropic', wrong)
    try:
        ctx = _context.DoctorContext(client=world.client, proxy=PROXY, deploy_dir=world.deploy_dir,
                                     probe_image=TOOLS_IMAGE, pid=os.getpid(), environ={}, probe_timeout=5,
                                     credentials_interceptor=INTERCEPTOR)
        ctx.attrs = world.client.api.inspect_container(PROXY)
        lines = _dcred.CredentialsCheck().lines(ctx)
    finally:
        world.write_secret('anthropic', good)
    by_id = dict((line.id, line) for line in lines if line.id != 'credentials.swap')
    rejected = by_id['credentials.swap_rejected']
    assert rejected.status == 'fail' and 'anthropic' in rejected.message and 'HTTP 401' in rejected.message
    assert os.path.join(world.secret_dir, 'anthropic') in rejected.message
    assert by_id['credentials.secret_unseen'].status == 'ok'
    for line in lines:
        assert wrong not in repr(line) and good not in repr(line)
    assert [line.id for line in lines].count('credentials.swap') == 1  # the other credential still swaps


def test_replacing_the_interceptor_under_a_job_needs_consent(world):
    """A job network on the proxy: a run that would recreate the interceptor (here: its upstream CA dropped) is
    refused before anything is written, naming the job network; with allow_cut_jobs (in check mode) it would go."""
    from ansible_collections.pi_dispatch.egress.plugins.module_utils import jobnet as _jobnet
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import credentials_apply as _apply
    client = world.client
    job_id = 'cred-consent' + SUFFIX.replace('-', '')
    jn = _jobnet.create_job_network(client, job_id, proxy_name=PROXY, routes=[], shard_bound=0)
    started = client.api.inspect_container(INTERCEPTOR)['State']['StartedAt']
    params = dict(deploy_dir=world.deploy_dir, name=INTERCEPTOR, image=INTERCEPTOR_IMAGE, network=_world.NET,
                  proxy_name=PROXY, upstream_ca=None, inspect_only=False, allow_cut_jobs=False)
    config = os.path.join(world.deploy_dir, 'credentials', 'conf')
    before = dict((n, os.stat(os.path.join(config, n)).st_mtime_ns) for n in os.listdir(config))
    try:
        with pytest.raises(_apply.CredentialsDeployError) as refused:
            _apply.CredentialsDeploy(client, params).run()
        message = str(refused.value)
        assert message.startswith('Refused, nothing changed: the replacement of %s' % INTERCEPTOR), message
        assert jn.network in message and 'egress_proxy_allow_cut_jobs' in message
        assert client.api.inspect_container(INTERCEPTOR)['State']['StartedAt'] == started
        assert dict((n, os.stat(os.path.join(config, n)).st_mtime_ns) for n in os.listdir(config)) == before
        consented = _apply.CredentialsDeploy(client, dict(params, allow_cut_jobs=True), check_mode=True).run()
        assert [a for a in consented['actions'] if a.startswith('recreate %s' % INTERCEPTOR)], consented['actions']
        assert client.api.inspect_container(INTERCEPTOR)['State']['StartedAt'] == started  # check mode
    finally:
        _jobnet.teardown_job_network(client, job_id, proxy_name=PROXY)


def test_a_job_on_a_proxy_shard_gets_the_swap(world):
    """Shard bound 1: the second job network goes to a new shard, a clone of the proxy on the credentials network
    with the include mounted; the job there reaches the bound host with its placeholder swapped."""
    from ansible_collections.pi_dispatch.egress.plugins.module_utils import jobnet as _jobnet
    client = world.client
    jobs = ['cred-shard-a' + SUFFIX.replace('-', ''), 'cred-shard-b' + SUFFIX.replace('-', '')]
    made = []
    try:
        for job_id in jobs:
            made.append(_jobnet.create_job_network(client, job_id, proxy_name=PROXY, routes=[],
                                                   credentials_dir=world.deploy_dir, shard_bound=1))
        on_shard = made[1]
        shard = [n for n in client.api.inspect_network(on_shard.network)['Containers'].values()
                 if n['Name'] != PROXY]
        assert shard and shard[0]['Name'].startswith(PROXY + '-shard-'), shard
        _job_reaches_the_provider(world, on_shard)
    finally:
        for job_id in reversed(jobs[:len(made)]):
            _jobnet.teardown_job_network(client, job_id, proxy_name=PROXY, credentials_dir=world.deploy_dir)
    assert not client.api.containers(all=True, filters={'name': PROXY + '-shard-'}), 'the empty shard was not removed'


def test_refusals_on_the_interceptors_way_out_are_in_the_decision_log(world):
    """Issue 42 item 14: a tunnel the TLS name check refuses on its port 3130 (the interceptor's way out)
    carries no X-Pi-Client (squid did not send it); it is still one refused line of the decision log, naming
    the client that dialled: a job dialling it for a bound host, a client on the interceptor's network asking
    for a host no credential is bound to. The job forges X-Pi-Client naming the other client: the line names
    the job's own address (only the proxy's squid is believed)."""
    import time
    from credentials_world import CLIENT_SCRIPT, JOB_CLIENT, JOBNET, NET
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import decisions as _decisions
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import interceptor as _interceptor

    def address(name, net):
        return world.client.api.inspect_container(name)['NetworkSettings']['Networks'][net]['IPAddress']
    job_address, direct_address = address(JOB_CLIENT, JOBNET), address(CLIENT, NET)
    before = time.time() - 0.005  # squid stamps a request when it reads it (to the ms), after this
    marker = uuid.uuid4().hex
    answer = world.request('api.provider.test', [('x-api-key', world.placeholders['anthropic'])],
                           path='/v1/messages?m=' + marker, via='return-port', ca='/share/provider-ca.pem',
                           connect_headers=[('X-Pi-Client', direct_address)])
    assert answer['status'] is None, answer
    argv = ['python3', '-c', CLIENT_SCRIPT, PROXY, str(_interceptor.RETURN_PORT), 'unbound.provider.test',
            'unbound.provider.test', 'unbound.provider.test', 'GET', '/v1/messages?m=' + marker,
            '/share/provider-ca.pem', '[]']
    _rc, out = world.client.containers.get(CLIENT).exec_run(['timeout', '30'] + argv)
    assert json.loads(out.decode('utf-8', 'replace').strip().splitlines()[-1])['status'] is None, out
    assert world.saw_marker(marker) == []
    want = {(job_address, 'api.provider.test'), (direct_address, 'unbound.provider.test')}
    seen = []
    for _attempt in range(50):   # bounded: the lines are written within a second
        seen = [r for r in _decisions.read_records(world.log_dir)[0] if r['epoch'] >= before]
        found = dict(((r.get('client'), r.get('host')), r) for r in seen if r.get('check') == 'tls')
        if want <= set(found):
            break
        time.sleep(0.3)
    else:
        raise AssertionError('no refusal line for %s; lines since: %s' % (sorted(want), json.dumps(seen, indent=1)))
    for key in want:
        record = found[key]
        assert (record['verdict'], record['reason'], record['port'], record['method']) == (
            'refused', 'way_out', 443, 'CONNECT'), record
