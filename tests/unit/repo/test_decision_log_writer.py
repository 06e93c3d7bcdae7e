"""The proxy image's decision-log program (roles/proxy/files/decision-log), run by the host's perl.

squid's logfile-daemon protocol is fed on stdin ("L<record>" per line) exactly as the proxy's squid and the
TLS name check write it (the pi_decision logformats of the rules and peek.conf); the JSON lines it writes,
its size rotation and its fallback are asserted. The job lookup reads the engine's DNS; here the addresses
are documentation ranges, which the program never looks up (only private ranges, where job networks
live, are), so job and network are null and no query leaves the host.
"""

import json
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
PROGRAM = os.path.join(ROOT, 'roles', 'proxy', 'files', 'decision-log')

pytestmark = pytest.mark.skipif(shutil.which('perl') is None, reason='perl is not on this host')


def run(folder, records, name='proxy-x', max_bytes=None, keep=None, base='decisions.jsonl'):
    env = {'PATH': os.environ.get('PATH', '/usr/bin:/bin'), 'PI_EGRESS_DECISION_LOG_NAME': name}
    if max_bytes is not None:
        env['PI_EGRESS_DECISION_LOG_MAX_BYTES'] = str(max_bytes)
    if keep is not None:
        env['PI_EGRESS_DECISION_LOG_KEEP'] = str(keep)
    stdin = ''.join('L%s\n' % r for r in records).encode()
    proc = subprocess.run(['perl', PROGRAM, os.path.join(folder, base)], input=stdin, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60, check=True)
    return proc.stderr.decode()


def lines(path):
    with open(path) as handle:
        return [json.loads(line) for line in handle]


# v1 <source> <time> <client> <cport> <method> <host> <port> <sni> <reason> <stage> <status> <squid status>
#    <bytes in> <bytes out> <ms> <err_code> <bump mode> <job's address>
DENIED = 'v1 proxy 1796504400.123 192.0.2.7 40000 CONNECT evil.test 443 - unlisted - 403 TCP_DENIED 59 3379 0 ' \
         'ERR_ACCESS_DENIED - -'
LISTED = 'v1 proxy 1796504401.000 192.0.2.7 40001 GET api.test 80 - listed - 200 TCP_MISS 146 369 1 - - -'
CHECK_GONE = 'v1 proxy 1796504402.000 192.0.2.7 40002 CONNECT api.test 443 - listed checked 503 TCP_TUNNEL 80 0 1 - - -'
BAD_REQUEST = 'v1 proxy 1796504403.000 192.0.2.7 40003 - - - - - - 400 NONE_NONE 10 300 0 ERR_INVALID_REQ - -'
# the TLS name check: a spliced tunnel is two records on one connection from the proxy's squid
SPLICE_1 = 'v1 tls 1796504404.412 127.0.0.1 54596 CONNECT api.test 443 API.test. sni_ok - 200 NONE_NONE 177 0 3 - ' \
           'splice 192.0.2.8'
SPLICE_2 = 'v1 tls 1796504404.417 127.0.0.1 54596 CONNECT api.test 443 API.test. - - 200 TCP_TUNNEL 1705 3271 4 - ' \
           'splice -'
MISMATCH = 'v1 tls 1796504405.000 127.0.0.1 54606 CONNECT api.test 443 evil.test sni_mismatch - 200 NONE_NONE ' \
           '177 0 3 - terminate 192.0.2.8'
NO_SNI = 'v1 tls 1796504406.000 127.0.0.1 54618 CONNECT api.test 443 - no_sni - 200 NONE_NONE 177 0 3 - terminate ' \
         '192.0.2.8'
NOT_TLS = 'v1 tls 1796504407.000 127.0.0.1 54620 CONNECT api.test 443 - - - 200 NONE_NONE 177 0 0 ' \
          'ERR_PROTOCOL_UNKNOWN peek 192.0.2.8'
PROBE = 'v1 tls 1796504408.000 127.0.0.1 54592 - - - - - - 0 NONE_NONE 0 0 0 ERR_CLIENT_GONE - -'
WEIRD = 'v1 tls 1796504409.000 127.0.0.1 54700 CONNECT api.test 443 a%22b%5C%0A%C3%A9 sni_mismatch - 200 ' \
        'NONE_NONE 1 0 0 - terminate 192.0.2.9'


def test_each_record_is_one_json_line_with_its_verdict_and_reason(tmp_path):
    run(str(tmp_path), [DENIED, LISTED, CHECK_GONE, BAD_REQUEST])
    got = lines(str(tmp_path / 'proxy-x.decisions.jsonl'))
    assert [(r['host'], r['port'], r['verdict'], r['reason'], r['status']) for r in got] == [
        ('evil.test', 443, 'refused', 'unlisted', 403),
        ('api.test', 80, 'allowed', 'listed', 200),
        ('api.test', 443, 'refused', 'tls_check_unavailable', 503),
        (None, None, 'refused', 'invalid', 400)]
    first = got[0]
    assert first['time'] == '2026-12-05T21:00:00.123Z' and first['proxy'] == 'proxy-x' and first['check'] == 'proxy'
    assert (first['client'], first['method'], first['sni']) == ('192.0.2.7', 'CONNECT', None)
    assert (first['bytes_from_client'], first['bytes_to_client'], first['duration_ms']) == (59, 3379, 0)
    assert (first['job'], first['network']) == (None, None)   # not on a job network
    assert sorted(first) == sorted(['time', 'proxy', 'check', 'job', 'network', 'client', 'method', 'host', 'port',
                                    'sni', 'verdict', 'reason', 'status', 'squid_status', 'bytes_from_client',
                                    'bytes_to_client', 'duration_ms'])


def test_the_tls_checks_records_one_line_per_tunnel_with_the_jobs_address(tmp_path):
    run(str(tmp_path), [PROBE, SPLICE_1, MISMATCH, SPLICE_2, NO_SNI, NOT_TLS, WEIRD], base='tls-decisions.jsonl')
    got = lines(str(tmp_path / 'proxy-x.tls-decisions.jsonl'))
    assert [(r['client'], r['sni'], r['verdict'], r['reason']) for r in got] == [
        ('192.0.2.8', 'evil.test', 'refused', 'sni_mismatch'),
        # written when the tunnel closed: the hello's name, the bytes of the tunnel, both durations
        ('192.0.2.8', 'API.test', 'allowed', 'sni_ok'),
        ('192.0.2.8', None, 'refused', 'no_sni'),
        ('192.0.2.8', None, 'refused', 'not_tls'),
        ('192.0.2.9', 'a"b\\\n\u00c3\u00a9', 'refused', 'sni_mismatch')]
    spliced = got[1]
    assert (spliced['bytes_from_client'], spliced['bytes_to_client'], spliced['duration_ms']) == (1705, 3271, 7)
    assert spliced['time'] == '2026-12-05T21:00:04.412Z' and spliced['squid_status'] == 'TCP_TUNNEL'


def test_a_forged_or_joined_address_header_is_not_taken(tmp_path):
    forged = MISMATCH.replace(' 192.0.2.8', ' 192.0.2.8%2C%206.6.6.6')
    run(str(tmp_path), [forged], base='tls-decisions.jsonl')
    assert lines(str(tmp_path / 'proxy-x.tls-decisions.jsonl'))[0]['client'] == '127.0.0.1'


def test_rotation_by_size_keeps_the_newest_files(tmp_path):
    run(str(tmp_path), [DENIED] * 200, max_bytes=4096, keep=2)
    names = sorted(os.listdir(str(tmp_path)))
    assert names == ['proxy-x.decisions.jsonl', 'proxy-x.decisions.jsonl.1', 'proxy-x.decisions.jsonl.2']
    for name in names[1:]:
        size = os.path.getsize(str(tmp_path / name))
        assert 4096 <= size < 4096 + 400, (name, size)
    total = sum(len(lines(str(tmp_path / n))) for n in names)
    assert 0 < total < 200   # the oldest were rotated away


def test_keep_zero_truncates_in_place(tmp_path):
    run(str(tmp_path), [DENIED] * 100, max_bytes=4096, keep=0)
    assert os.listdir(str(tmp_path)) == ['proxy-x.decisions.jsonl']
    assert os.path.getsize(str(tmp_path / 'proxy-x.decisions.jsonl')) < 4096


def test_an_unwritable_folder_sends_the_lines_to_the_container_log_with_one_warning(tmp_path):
    err = run(str(tmp_path / 'missing'), [DENIED, LISTED])
    warning, first, second = err.splitlines()
    missing = tmp_path / 'missing'
    assert warning.startswith('pi-dispatch decision log: cannot write %s/proxy-x.decisions.jsonl' % missing)
    assert 'egress_decision_log_dir' in warning
    assert json.loads(first)['reason'] == 'unlisted' and json.loads(second)['reason'] == 'listed'


@pytest.mark.parametrize('name, expect', [('pi-dispatch-egress-proxy-shard-2', 'pi-dispatch-egress-proxy-shard-2'),
                                          ('../etc/evil', 'proxy'), ('', 'proxy')])
def test_the_file_is_named_for_its_container_and_a_bad_name_is_not_a_path(tmp_path, name, expect):
    run(str(tmp_path), [DENIED], name=name)
    assert os.listdir(str(tmp_path)) == ['%s.decisions.jsonl' % expect]
