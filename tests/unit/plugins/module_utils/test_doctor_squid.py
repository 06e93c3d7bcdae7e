"""Doctor: the squid package inside the proxy against the mirror, redaction, public-suffix entries."""

import json

import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import doctor as _doctor
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import lines as _doctor_lines
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import overlay as _doctor_overlay
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import probes as _doctor_probes
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import squid as _doctor_squid

# --- apt-cache policy and the throwaway container's output ------------------------------------------------

POLICY_FETCHED = """squid:
  Installed: 6.13-2+deb13u4
  Candidate: 6.13-2+deb13u5
  Version table:
     6.13-2+deb13u5 500
        500 http://deb.debian.org/debian-security trixie-security/main amd64 Packages
 *** 6.13-2+deb13u4 500
        500 http://deb.debian.org/debian trixie/main amd64 Packages
        100 /var/lib/dpkg/status
"""

# apt-get update fetched nothing: apt only knows dpkg's status, so its "candidate" is the installed one.
POLICY_STATUS_ONLY = """squid:
  Installed: 6.13-2+deb13u4
  Candidate: 6.13-2+deb13u4
  Version table:
 *** 6.13-2+deb13u4 100
        100 /var/lib/dpkg/status
"""

UPDATE_FAILED = """Ign:1 http://deb.debian.org/debian trixie InRelease
Err:1 http://deb.debian.org/debian trixie InRelease
  Temporary failure resolving 'deb.debian.org'
W: Failed to fetch http://deb.debian.org/debian/dists/trixie/InRelease  Temporary failure resolving 'deb.debian.org'
W: Some index files failed to download. They have been ignored, or old ones used instead.
"""

UPDATE_OK = """Get:1 http://deb.debian.org/debian trixie InRelease [140 kB]
Get:2 http://deb.debian.org/debian-security trixie-security InRelease [43 kB]
Reading package lists...
"""


def output(rc, update, policy):
    return '%s-apt-rc %s\n%s%s-policy\n%s' % (_doctor_probes.PROBE_MARK, rc, update, _doctor_probes.PROBE_MARK, policy)


def test_parse_apt_policy():
    got = _doctor_squid.parse_apt_policy(POLICY_FETCHED)
    assert got == dict(installed='6.13-2+deb13u4', candidate='6.13-2+deb13u5', candidate_from_mirror=True)
    got = _doctor_squid.parse_apt_policy(POLICY_STATUS_ONLY)
    assert got['candidate'] == '6.13-2+deb13u4' and got['candidate_from_mirror'] is False
    assert _doctor_squid.parse_apt_policy('') is None
    assert _doctor_squid.parse_apt_policy('N: Unable to locate package squid\n') is None
    none = _doctor_squid.parse_apt_policy('squid:\n  Installed: 6.13-2\n  Candidate: (none)\n  Version table:\n')
    assert none['candidate'] is None


@pytest.mark.parametrize('case, text, candidate, why', [
    ('fetched', output(0, UPDATE_OK, POLICY_FETCHED), '6.13-2+deb13u5', None),
    ('resolving failed', output(0, UPDATE_FAILED, POLICY_STATUS_ONLY), None, "Temporary failure resolving"),
    ('update timed out', output(124, 'Ign:1 http://deb.debian.org/debian trixie InRelease\n', POLICY_STATUS_ONLY),
     None, 'did not finish within'),
    ('update exited 100', output(100, 'E: Could not open lock file\n', ''), None, 'exited 100'),
    ('fetched nothing and said nothing', output(0, '', POLICY_STATUS_ONLY), None, 'only knows the installed'),
    ('no squid on the mirror', output(0, UPDATE_OK, 'squid:\n  Installed: 6.13-2\n  Candidate: (none)\n'), None,
     'offers no squid'),
    ('no trailer at all', 'sh: apt-get: not found\n', None, 'printed no result'),
    ('empty', '', None, 'printed no result'),
])
def test_parse_candidate_output(case, text, candidate, why):
    got, reason = _doctor_squid.parse_candidate_output(text)
    assert got == candidate, case
    if why is None:
        assert reason is None, case
    else:
        assert why in reason, (case, reason)


# --- the lines ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize('case, installed, installed_why, candidate, candidate_why, expect', [
    ('current', '6.13-2+deb13u4', None, '6.13-2+deb13u4', None,
     [('proxy.squid', 'ok'), ('proxy.squid_current', 'ok')]),
    ('newer than the mirror', '6.13-2+deb13u5', None, '6.13-2+deb13u4', None,
     [('proxy.squid', 'ok'), ('proxy.squid_current', 'ok')]),
    ('outdated', '6.13-2+deb13u4', None, '6.13-2+deb13u5', None,
     [('proxy.squid', 'ok'), ('proxy.squid_outdated', 'warn')]),
    ('outdated by epoch', '6.13-2', None, '1:6.13-1', None, [('proxy.squid', 'ok'), ('proxy.squid_outdated', 'warn')]),
    ('tilde release is older', '6.14~rc1-1', None, '6.14-1', None,
     [('proxy.squid', 'ok'), ('proxy.squid_outdated', 'warn')]),
    ('mirror unreachable (the tests)', '6.13-2+deb13u4', None, None, 'apt-get update could not fetch: no route',
     [('proxy.squid', 'ok'), ('proxy.squid_mirror_unread', 'notrun')]),
    ('installed unreadable', None, 'dpkg-query exited 1', '6.13-2+deb13u5', None,
     [('proxy.squid_unread', 'warn'), ('proxy.squid_mirror_unread', 'notrun')]),
    ('candidate is garbage', '6.13-2', None, 'not a version', None,
     [('proxy.squid', 'ok'), ('proxy.squid_mirror_unread', 'notrun')]),
    ('installed is garbage', 'garbage version', None, '6.13-2', None,
     [('proxy.squid_unread', 'warn'), ('proxy.squid_mirror_unread', 'notrun')]),
])
def test_squid_lines(case, installed, installed_why, candidate, candidate_why, expect):
    lines = _doctor_squid.squid_lines('p', installed, installed_why, candidate, candidate_why)
    assert [(line.id, line.status) for line in lines] == expect, case
    assert not [line for line in lines if line.status in ('warn', 'fail') and not line.fix], case
    if installed and expect[0][0] == 'proxy.squid':
        assert installed in lines[0].message
    if expect[-1][0] == 'proxy.squid_outdated':
        assert candidate in lines[-1].message and 'egress_proxy_image_refresh=true' in lines[-1].fix


def test_mirror_unread_is_never_a_pass():
    lines = _doctor_squid.squid_lines('p', '6.13-2', None, None, 'no route to the mirror')
    assert lines[-1].status == 'notrun' and 'no route to the mirror' in lines[-1].message


def test_candidate_script_is_bounded():
    script = _doctor_squid.candidate_script()
    assert 'timeout %d apt-get update' % _doctor_squid.SQUID_CANDIDATE_TIMEOUT in script
    assert 'Acquire::Retries=0' in script
    assert 'apt-cache policy squid-common' in script


@pytest.mark.parametrize('networks, labelled, want', [
    (['pi-dispatch-egress-out'], [], 'pi-dispatch-egress-out'),
    (['pi-job-a-net', 'pi-dispatch-egress-out-it', 'pi-dispatch-egress-doctor-12'], [], 'pi-dispatch-egress-out-it'),
    (['aaa', 'zzz-out'], ['zzz-out'], 'zzz-out'),  # the upstream label wins
    (['pi-job-a-net', 'pi-job-doctor-3-a-net'], [], None),
    ([], [], None),
])
def test_upstream_network(networks, labelled, want):
    assert _doctor_squid.upstream_network(networks, lambda name: name in labelled) == want


# --- redaction at every formatting point ----------------------------------------------------------------------

SECRET = 'hunter2-secret'


def test_line_redacts_message_and_fix_and_report_and_json():
    line = _doctor_lines.Line('overlay.loopback', 'warn', 'has baseUrl http://user:%s@127.0.0.1:1/v1?api_key=%s'
                              % (SECRET, SECRET), fix='curl http://u:%s@h.test/' % SECRET)
    line.fix = line.fix + ' http://x:%s@late.test/' % SECRET  # set after construction, as the endpoint fixes are
    for text in (line.message, _doctor.render_report([line]), _doctor.json_lines([line]),
                 json.dumps(line.as_dict())):
        assert SECRET not in text, text
    assert 'http://***@127.0.0.1:1/v1?api_key=***' in line.message


OVERLAY = """{
  "providers": {
    "keyed": {"baseUrl": "http://user:%(s)s@models.test:8080/v1", "api": "openai-completions",
              "apiKey": "$PI_DISPATCH_KEYLESS", "models": [{"id": "a"}]},
    "local": {"baseUrl": "http://user:%(s)s@127.0.0.1:11434/v1?token=%(s)s", "api": "openai-completions",
              "apiKey": "K", "models": [{"id": "b"}]},
    "odd": {"baseUrl": "http://user:%(s)s@models.test:9999/v1", "api": "openai-completions", "apiKey": "K",
            "models": [{"id": "c", "name": 5}]}
  }
}
""" % {'s': SECRET}


def test_overlay_with_credentials_leaks_nothing(tmp_path):
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import endpoints as _endpoints
    endpoints = [_endpoints.Endpoint('m1', 'models.test', 8080, 1, keyless=True)]
    good = OVERLAY.replace(', "name": 5', '')
    for text in (good, OVERLAY):  # a clean read, and a refused one whose message quotes the file
        lines = _doctor_overlay.overlay_lines(str(tmp_path / 'models.json'), text, None, endpoints,
                                              ['api.provider.test'])
        assert lines
        report = _doctor.render_report(lines) + _doctor.json_lines(lines)
        assert SECRET not in report, report
        assert SECRET not in json.dumps([line.as_dict() for line in lines])
    lines = _doctor_overlay.overlay_lines('/m.json', good, None, endpoints, ['api.provider.test'])
    loopback = [line for line in lines if line.id == 'overlay.loopback'][0]
    assert 'http://***@127.0.0.1:11434/v1?token=***' in loopback.message


# --- public-suffix entries in an allowlist written before that rule --------------------------------------------------

ALLOWLIST = """# an old allowlist
api.provider.test
.com            # every .com site
.co.uk
github.io
user.github.io
.forge.test
10.0.0.1
"""


def test_public_suffix_lines_with_the_list():
    lines = _doctor_overlay.public_suffix_lines('/d/egress-allowlist.conf', ALLOWLIST,
                                                _doctor_overlay.public_suffix_checker())
    flagged = [line for line in lines if line.id == 'overlay.public_suffix']
    assert [line.status for line in flagged] == ['warn'] * 3
    assert [line.message.split()[0] for line in flagged] == ['.com', '.co.uk', 'github.io']
    assert all(line.fix for line in flagged)


def test_public_suffix_lines_with_a_checker_that_fails():
    def broken(entry):
        raise RuntimeError('cannot be checked against the Public Suffix List: pip install publicsuffixlist')
    lines = _doctor_overlay.public_suffix_lines('/d/egress-allowlist.conf', ALLOWLIST, broken)
    assert [(line.id, line.status) for line in lines] == [('overlay.allowlist_unread', 'warn')]
    assert 'publicsuffixlist' in lines[0].message and lines[0].fix


def test_public_suffix_lines_clean_file_says_nothing():
    checker = _doctor_overlay.public_suffix_checker()
    assert _doctor_overlay.public_suffix_lines('/a', 'api.provider.test\n.forge.test\n', checker) == []


def test_public_suffix_checker_is_the_allowlist_rule():
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import allowlist as _allowlist
    assert _doctor_overlay.public_suffix_checker() is _allowlist.public_suffix_covered


@pytest.mark.parametrize('entry, want', [
    ('.com', 'com'), ('com', 'com'), ('.CO.UK', 'co.uk'), ('github.io', 'github.io'), ('localhost', 'localhost'),
    ('user.github.io', None), ('api.anthropic.com', None), ('.forge.test', None), ('10.0.0.1', None), ('.', '.'),
])
def test_checker(entry, want):
    assert _doctor_overlay.public_suffix_checker()(entry) == want


# --- the daemon side with a fake daemon ---------------------------------------------------------------------

class _Exec(object):
    def __init__(self, rc, out):
        self.exit_code, self.output = rc, out


class _Proxy(object):
    name = 'p'

    def exec_run(self, cmd, **kwargs):
        assert cmd == ['dpkg-query', '-W', '-f=${Version}', 'squid-common']  # an exec, no shell
        return _Exec(0, b'6.13-2+deb13u4')


class _SquidAPI(object):
    def __init__(self, logs_error=None, logs=b''):
        self.calls = []
        self.logs_error = logs_error
        self._logs = logs

    def inspect_network(self, name):
        return {'Labels': {'io.pi-dispatch.egress.network': 'upstream'} if name == 'up' else {}}

    def create_host_config(self, **kwargs):
        self.calls.append(('host_config', kwargs))
        return kwargs

    def create_container(self, image, cmd, **kwargs):
        self.calls.append(('create', image, kwargs))
        return {'Id': 'c1'}

    def start(self, cid):
        self.calls.append(('start', cid))

    def wait(self, cid, timeout=None):
        self.calls.append(('wait', timeout))

    def logs(self, cid, **kwargs):
        if self.logs_error:
            raise self.logs_error
        return self._logs

    def remove_container(self, name, force=False):
        self.calls.append(('rm', name))


class _SquidClient(object):
    def __init__(self, api):
        self.api = api
        self.containers = self

    def get(self, name):
        return _Proxy()


ATTRS = {'Image': 'sha256:img', 'NetworkSettings': {'Networks': {'pi-job-x-net': {}, 'other': {}, 'up': {}}}}


def squid_check(doc):
    doc.ctx.attrs = ATTRS
    return doc.checks['squid'].lines(doc.ctx)


def test_candidate_from_a_throwaway_container_on_the_upstream_network():
    api = _SquidAPI(logs=output(0, UPDATE_OK, POLICY_FETCHED).encode())
    doc = _doctor.Doctor(_SquidClient(api), _doctor.DoctorOptions('p', '/nonexistent', 'img', environ={}, pid=4242))
    lines = squid_check(doc)
    assert [(line.id, line.status) for line in lines] == [('proxy.squid', 'ok'), ('proxy.squid_outdated', 'warn')]
    create = [call for call in api.calls if call[0] == 'create'][0]
    assert create[1] == 'sha256:img' and create[2]['user'] == 'root'
    assert create[2]['name'] == 'pi-dispatch-egress-probe-squid-4242'
    host = [call for call in api.calls if call[0] == 'host_config'][0][1]
    assert host['network_mode'] == 'up' and host['cap_drop'] == ['ALL']
    assert ('rm', 'pi-dispatch-egress-probe-squid-4242') in api.calls
    assert 'pi-dispatch-egress-probe-squid-4242' not in doc.ctx.launched  # the canary teardown leaves it alone


def test_candidate_container_gone_before_its_logs_is_a_not_run_line():
    api = _SquidAPI(logs_error=Exception('No such container: c1'))
    doc = _doctor.Doctor(_SquidClient(api), _doctor.DoctorOptions('p', '/nonexistent', 'img', environ={}, pid=4242))
    lines = squid_check(doc)
    assert [(line.id, line.status) for line in lines] == [('proxy.squid', 'ok'), ('proxy.squid_mirror_unread',
                                                                                  'notrun')]
    assert 'No such container' in lines[1].message


def test_candidate_check_that_raises_is_a_line(monkeypatch):
    doc = _doctor.Doctor(_SquidClient(_SquidAPI()),
                         _doctor.DoctorOptions('p', '/nonexistent', 'img', environ={}, pid=1))
    monkeypatch.setattr(_doctor_squid, 'squid_candidate_version', lambda ctx: 1 / 0)
    lines = squid_check(doc)
    assert lines[-1].id == 'proxy.squid_mirror_unread' and 'division by zero' in lines[-1].message
