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
# the TLS name check: a spliced tunnel is two records on one connection from the proxy's squid; its records
# end with the local address and port the client dialled (3129 from the proxy's squid, 3130 the interceptor's
# way out)
SPLICE_1 = 'v1 tls 1796504404.412 127.0.0.1 54596 CONNECT api.test 443 API.test. sni_ok - 200 NONE_NONE 177 0 3 - ' \
           'splice 192.0.2.8 127.0.0.1 3129'
SPLICE_2 = 'v1 tls 1796504404.417 127.0.0.1 54596 CONNECT api.test 443 API.test. - - 200 TCP_TUNNEL 1705 3271 4 - ' \
           'splice - 127.0.0.1 3129'
MISMATCH = 'v1 tls 1796504405.000 127.0.0.1 54606 CONNECT api.test 443 evil.test sni_mismatch - 200 NONE_NONE ' \
           '177 0 3 - terminate 192.0.2.8 127.0.0.1 3129'
NO_SNI = 'v1 tls 1796504406.000 127.0.0.1 54618 CONNECT api.test 443 - no_sni - 200 NONE_NONE 177 0 3 - terminate ' \
         '192.0.2.8 127.0.0.1 3129'
NOT_TLS = 'v1 tls 1796504407.000 127.0.0.1 54620 CONNECT api.test 443 - - - 200 NONE_NONE 177 0 0 ' \
          'ERR_PROTOCOL_UNKNOWN peek 192.0.2.8 127.0.0.1 3129'
PROBE = 'v1 tls 1796504408.000 127.0.0.1 54592 - - - - - - 0 NONE_NONE 0 0 0 ERR_CLIENT_GONE - - 127.0.0.1 3129'
WEIRD = 'v1 tls 1796504409.000 127.0.0.1 54700 CONNECT api.test 443 a%22b%5C%0A%C3%A9 sni_mismatch - 200 ' \
        'NONE_NONE 1 0 0 - terminate 192.0.2.9 127.0.0.1 3129'
# the interceptor's way out (3130), as squid 6.13 logs it on the real engine: a refused CONNECT (no reason note,
# no X-Pi-Client: the proxy's squid did not send it), a connection closed before any request, one squid could
# not parse, and the interceptor's own spliced tunnel (two records; a job's tunnel has a line already)
WAY_OUT_DENIED = 'v1 tls 1796504410.000 192.0.2.20 50000 CONNECT api.test 443 - - - 200 TCP_DENIED 0 0 10 ' \
                 'ERR_ACCESS_DENIED - - 192.0.2.1 3130'
WAY_OUT_NOTHING = 'v1 tls 1796504410.100 192.0.2.20 50001 - - - - - - 0 NONE_NONE 0 0 0 - - - 192.0.2.1 3130'
WAY_OUT_GARBAGE = 'v1 tls 1796504410.200 192.0.2.20 50002 - - - - - - 400 NONE_NONE_ABORTED 11 344 0 ' \
                  'ERR_INVALID_REQ - - 192.0.2.1 3130'
WAY_OUT_SPLICE_1 = 'v1 tls 1796504410.300 198.51.100.2 54596 CONNECT api.test 443 api.test sni_ok - 200 NONE_NONE ' \
                   '177 0 1 - splice - 198.51.100.3 3130'
WAY_OUT_SPLICE_2 = 'v1 tls 1796504410.310 198.51.100.2 54596 CONNECT api.test 443 api.test - - 200 TCP_TUNNEL ' \
                   '999999 999999 9 - splice - 198.51.100.3 3130'


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


def test_refusals_on_the_interceptors_way_out_are_written_with_the_client_that_dialled(tmp_path):
    """Issue 42 item 14: without X-Pi-Client they were taken for tunnels closing and never written."""
    run(str(tmp_path), [WAY_OUT_DENIED, WAY_OUT_NOTHING, WAY_OUT_GARBAGE, WAY_OUT_SPLICE_1, WAY_OUT_SPLICE_2, PROBE],
        base='tls-decisions.jsonl')
    got = lines(str(tmp_path / 'proxy-x.tls-decisions.jsonl'))
    assert [(r['client'], r['method'], r['host'], r['verdict'], r['reason'], r['squid_status']) for r in got] == [
        ('192.0.2.20', 'CONNECT', 'api.test', 'refused', 'way_out', 'TCP_DENIED'),
        ('192.0.2.20', None, None, 'refused', 'other', 'NONE_NONE'),
        ('192.0.2.20', None, None, 'refused', 'invalid', 'NONE_NONE_ABORTED')]


def test_a_job_dialling_the_way_out_cannot_name_another_client_in_x_pi_client(tmp_path):
    forged = WAY_OUT_DENIED.replace(' - 192.0.2.1 3130', ' 192.0.2.99 192.0.2.1 3130')
    mismatch = MISMATCH.replace('127.0.0.1 54606', '192.0.2.20 54606').replace('127.0.0.1 3129', '192.0.2.1 3130')
    assert forged != WAY_OUT_DENIED and mismatch != MISMATCH
    run(str(tmp_path), [forged, mismatch], base='tls-decisions.jsonl')
    got = lines(str(tmp_path / 'proxy-x.tls-decisions.jsonl'))
    assert [(r['client'], r['reason']) for r in got] == [('192.0.2.20', 'way_out'), ('192.0.2.20', 'sni_mismatch')]


def _splice(client, cport, lport, orig, when, first=True, out=0):
    """One record of a spliced tunnel: the judged CONNECT (first) or its close with ``out`` bytes to the client."""
    if first:
        return 'v1 tls %s %s %d CONNECT api.test 443 api.test sni_ok - 200 NONE_NONE 177 0 1 - splice %s 127.0.0.1 %d' \
            % (when, client, cport, orig, lport)
    return 'v1 tls %s %s %d CONNECT api.test 443 api.test - - 200 TCP_TUNNEL 100 %d 1 - splice - 127.0.0.1 %d' \
        % (when, client, cport, out, lport)


@pytest.mark.parametrize('case, records, expect', [
    # the same client port on two addresses: a refusal on the way out is not the close of a job's held tunnel,
    # and the interceptor's tunnel closing does not complete it with its bytes
    ('same port, two addresses',
     [_splice('127.0.0.1', 50000, 3129, '192.0.2.8', '1796504411.000'),
      WAY_OUT_DENIED.replace('192.0.2.20 50000', '192.0.2.21 50000'),
      WAY_OUT_SPLICE_1.replace('54596', '50000'), WAY_OUT_SPLICE_2.replace('54596', '50000'),
      _splice('127.0.0.1', 50000, 3129, '192.0.2.8', '1796504411.500', first=False, out=4242)],
     [('192.0.2.21', 'way_out', None), ('192.0.2.8', 'sni_ok', 4242)]),
    # two jobs' tunnels open at once on the same client port of two listening ports: each closes its own
    ('same address and port, two local ports',
     [_splice('127.0.0.1', 50000, 3129, '192.0.2.8', '1796504412.000'),
      _splice('127.0.0.1', 50000, 3131, '192.0.2.9', '1796504412.100'),
      _splice('127.0.0.1', 50000, 3131, '192.0.2.9', '1796504412.200', first=False, out=9),
      _splice('127.0.0.1', 50000, 3129, '192.0.2.8', '1796504412.300', first=False, out=8)],
     [('192.0.2.9', 'sni_ok', 9), ('192.0.2.8', 'sni_ok', 8)]),
    # the port reused after a close: the next tunnel is a line of its own
    ('port reused',
     [_splice('127.0.0.1', 50000, 3129, '192.0.2.8', '1796504413.000'),
      _splice('127.0.0.1', 50000, 3129, '192.0.2.8', '1796504413.100', first=False, out=1),
      _splice('127.0.0.1', 50000, 3129, '192.0.2.9', '1796504413.200'),
      _splice('127.0.0.1', 50000, 3129, '192.0.2.9', '1796504413.300', first=False, out=2)],
     [('192.0.2.8', 'sni_ok', 1), ('192.0.2.9', 'sni_ok', 2)]),
])
def test_held_tunnels_are_keyed_by_the_connection_so_two_clients_never_share_one(tmp_path, case, records, expect):
    run(str(tmp_path), records, base='tls-decisions.jsonl')
    got = lines(str(tmp_path / 'proxy-x.tls-decisions.jsonl'))
    assert [(r['client'], r['reason'], r['bytes_to_client'] if r['reason'] == 'sni_ok' else None) for r in got] \
        == expect, case


def test_records_without_the_local_address_still_join_by_client_address_and_port(tmp_path):
    """A proxy image from before the change logs 19 fields (the writer and peek.conf ship together; this is a bound)."""
    old = [r.rsplit(' ', 2)[0] for r in (SPLICE_1, SPLICE_2)]
    run(str(tmp_path), old, base='tls-decisions.jsonl')
    got = lines(str(tmp_path / 'proxy-x.tls-decisions.jsonl'))
    assert [(r['client'], r['reason'], r['bytes_to_client']) for r in got] == [('192.0.2.8', 'sni_ok', 3271)]
