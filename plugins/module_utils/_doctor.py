# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The doctor: canary probes, the leftover sweep, and the report.

Three layers, kept apart so the decisions are unit-tested without a daemon:

* the line model (:class:`Line`, :data:`LINES`, :func:`render_report`,
  :func:`json_lines`): every line doctor can print has an id and a shape in
  :data:`LINES`, and ``docs/doctor.md`` is checked against that table;
* pure decisions: :func:`parse_doctor_network`, :func:`daemon_locality`,
  :func:`plan_leftover`, :func:`split_attached`, :func:`sweep_line`,
  :func:`parse_probe_output` and the ``classify_*`` functions;
* :class:`Doctor`, which makes the daemon calls (Docker SDK) and turns their
  results into lines with the functions above.

The canary's own objects are ``pi-dispatch-egress-doctor-<pid>`` (an
``--internal`` network with the proxy attached) and the probe containers
``pi-dispatch-egress-probe-<probe>-<pid>``. Every one of them is removed at the
end of the run that made it, or reported in that same run, so what a later
run finds was left by a killed run (the sweep).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import re
import threading
import time

from ansible_collections.pi_dispatch.egress.plugins.module_utils import _docker_client as dc
from ansible_collections.pi_dispatch.egress.plugins.module_utils import _deployment
from ansible_collections.pi_dispatch.egress.plugins.module_utils import _rules
from ansible_collections.pi_dispatch.egress.plugins.module_utils import _jobnet
from ansible_collections.pi_dispatch.egress.plugins.module_utils import _debversion
from ansible_collections.pi_dispatch.egress.plugins.module_utils import _redact
from ansible_collections.pi_dispatch.egress.plugins.module_utils import _guard
from ansible_collections.pi_dispatch.egress.plugins.module_utils import _proxy

NETWORK_PREFIX = 'pi-dispatch-egress-doctor-'
PROBE_PREFIX = 'pi-dispatch-egress-probe-'
NETWORK_RE = re.compile(r'^pi-dispatch-egress-doctor-(\d+)$')
PROBE_RE = re.compile(r'^pi-dispatch-egress-probe-([a-z0-9]+(?:-[a-z0-9]+)*?)-(\d+)$')
LABEL = 'io.pi-dispatch.egress.doctor'

PROBES = ('provider', 'deny', 'plain')
ENDPOINT_PROBES = ('tunnel', 'port', 'plain')
ENDPOINT_PROBE_LABELS = {'tunnel': 'tunnel', 'port': 'port-exact', 'plain': 'plain-request'}
PEERS = ('a', 'b')
# The isolation check's two job networks: real job networks (the job pool, our
# labels), named for the doctor's pid so the sweep finds them after a kill.
ISOLATION_NET_RE = re.compile(r'^pi-job-doctor-(\d+)-([ab])-net$')
ISOLATION_NET_PREFIX = 'pi-job-doctor-'

DEFAULT_PROVIDER_HOST = 'api.anthropic.com'
DEFAULT_DENY_HOST = 'example.com'
DEFAULT_PROBE_TIMEOUT = 10
DEFAULT_PROBE_START_GRACE = 20
DEFAULT_ENDPOINT_TIMEOUT = 15  # the seed: no answer within 15 s means the server is stuck or busy
ISOLATION_CONNECT_TIMEOUT = 3  # a dropped packet is a timeout; 3 s is plenty on one host

STATUSES = ('ok', 'warn', 'fail', 'notrun')
SYMBOLS = {'ok': u'\u2713', 'warn': u'\u26a0', 'fail': u'\u2717', 'notrun': u'\u25cb'}
GROUPS = (
    ('proxy', 'Egress proxy'),
    ('canary', 'Egress canary'),
    ('endpoints', 'Model endpoints'),
    ('overlay', 'Overlay models.json and allowlist'),
    ('isolation', 'Job networks'),
    ('firewall', 'Host firewall layer'),
    ('leftovers', 'Leftovers of earlier doctor runs'),
)

NOT_CHECKED = 'not checked yet'

# Every line doctor can print: id -> (group, status, shape). The shape is the
# line's wording with <placeholders>; docs/doctor.md has one row per id and a
# unit test rebuilds that table's first column from this one. A line's status
# may differ from the shape's usual one only where noted in the docs.
LINES = [
    ('proxy.running', 'proxy', 'ok', 'Egress proxy running (<proxy>)'),
    ('proxy.missing', 'proxy', 'fail', 'Egress proxy missing: there is no container <proxy>, so every job is refused'),
    ('proxy.stopped', 'proxy', 'fail', 'Egress proxy stopped (<proxy> is <state>), so every job is refused'),
    ('proxy.health', 'proxy', 'ok', 'Egress proxy health: <health>'),
    ('proxy.rules', 'proxy', 'ok', "Egress proxy rules: <rules> matches the collection's copy (<packaged>)"),
    ('proxy.rules_differ', 'proxy', 'warn',
     "Egress proxy rules: <rules> differs from the collection's copy (<packaged>)"),
    ('proxy.rules_unreadable', 'proxy', 'warn', 'Egress proxy rules: <rules> could not be read (<error>)'),
    ('proxy.guard', 'proxy', 'ok',
     'Destination guard in force in <proxy>: a listed name that resolves to <refused> is refused (<count> ranges; '
     'opened: <opened>)'),
    ('proxy.guard_missing', 'proxy', 'fail',
     'Destination guard missing: the rules <proxy> runs do not include egress-guard.conf, so a listed name can lead '
     'a job to another job, the host or a private range'),
    ('proxy.guard_unmounted', 'proxy', 'fail',
     'Destination guard not mounted: <proxy> does not mount egress-guard.conf, so squid cannot read it'),
    ('proxy.guard_empty', 'proxy', 'fail',
     'Destination guard empty: egress-guard.conf inside <proxy> defines no pi_guard addresses'),
    ('proxy.guard_gap', 'proxy', 'fail',
     'Destination guard gap: egress-guard.conf inside <proxy> does not refuse <what>'),
    ('proxy.guard_unchecked', 'proxy', 'warn',
     'Destination guard could not be checked (<why>)'),
    ('proxy.mounts', 'proxy', 'ok',
     'Egress proxy mounts: each of the <n> files inside <proxy> has the content of the file on disk'),
    ('proxy.mounts_stale', 'proxy', 'fail',
     'Egress proxy mounts: <files> inside <proxy> differ from the file on disk: it was saved by rename (sed -i, an '
     'editor, lineinfile, template) and the proxy still reads the old one'),
    ('proxy.mounts_unchecked', 'proxy', 'notrun',
     'Egress proxy mounts were not compared with the files on disk (<why>)'),
    ('proxy.squid', 'proxy', 'ok', 'Egress proxy squid: package <version> inside <proxy>'),
    ('proxy.squid_unread', 'proxy', 'warn',
     'Egress proxy squid: the package version inside <proxy> could not be read (<why>)'),
    ('proxy.squid_current', 'proxy', 'ok',
     "Egress proxy squid is current: <version> is not older than the mirror's candidate <candidate>"),
    ('proxy.squid_outdated', 'proxy', 'warn',
     "Egress proxy squid is out of date: <version> is older than the mirror's candidate <candidate>, so the "
     "proxy lacks the mirror's fixes"),
    ('proxy.squid_mirror_unread', 'proxy', 'notrun',
     "Egress proxy squid: could not read the mirror's version (<why>), so whether <version> is current was not "
     "checked"),
    ('canary.provider', 'canary', 'ok',
     'Egress policy reaches the provider (<provider> answered <code>, so the whole path works and no key was spent)'),
    ('canary.provider_unreached', 'canary', 'warn', 'Egress policy does not reach the provider (<provider>: <what>)'),
    ('canary.deny', 'canary', 'ok',
     'Egress policy denies an unlisted host (<deny>: the proxy refused the tunnel with 403; the deny direction is '
     'the half an allowlist can silently lose)'),
    ('canary.deny_leaks', 'canary', 'fail', 'Egress policy lets an unlisted host through (<deny>: <what>)'),
    ('canary.plain', 'canary', 'ok',
     'Egress policy refuses plain HTTP to a listed host off port 80 (<listed>:443 without a tunnel got squid\'s '
     '403 <error>; only a CONNECT reaches 443)'),
    ('canary.plain_leaks', 'canary', 'fail',
     'Egress policy lets plain HTTP through to <listed> on port 443 (<what>)'),
    ('canary.notrun', 'canary', 'notrun', 'Egress canary probe <probe> did not run (<why>)'),
    ('canary.setup', 'canary', 'notrun', 'Egress canary could not be set up (<why>), so no probe ran'),
    ('canary.cleanup_kept', 'canary', 'warn',
     'Egress canary: <net> is kept, because the probe <probe> could not be removed and the network is the only '
     'way left to find it: docker rm -f <probe>'),
    ('canary.cleanup_rm', 'canary', 'warn',
     'Egress canary: the network <net> could not be removed: docker network rm <net>'),
    ('endpoints.include', 'endpoints', 'ok',
     'Model endpoints: the include inside the running proxy matches model-endpoints.json (<ids>)'),
    ('endpoints.rules_without_include', 'endpoints', 'fail',
     'Model endpoints: the rules <proxy> runs do not include model-endpoints.conf, so the declared endpoints (<ids>) '
     'stay unreachable until the rules are refreshed'),
    ('endpoints.include_replaced', 'endpoints', 'fail',
     'Model endpoints: the include inside the running proxy differs from the file it mounts (<file>): the file '
     'was replaced (a rename, an editor\'s save) instead of written in place, and the proxy still reads the old one'),
    ('endpoints.include_stale', 'endpoints', 'fail',
     'Model endpoints: the include inside the running proxy is not the render of <declaration> (<what>)'),
    ('endpoints.include_unmounted', 'endpoints', 'fail',
     'Model endpoints: the proxy does not mount the include, so the declared endpoints (<ids>) stay unreachable '
     'until it is recreated'),
    ('endpoints.include_unchecked', 'endpoints', 'warn',
     'Model endpoints: the include could not be checked (<why>)'),
    ('endpoints.include_notchecked', 'endpoints', 'notrun',
     'Model endpoints: the include inside the running proxy is ' + NOT_CHECKED),
    ('endpoint.tunnel', 'endpoints', 'ok',
     'Model endpoint <id> answers through the proxy (GET http://<address>/v1/models through a CONNECT tunnel: '
     '<code>)'),
    ('endpoint.tunnel_fails', 'endpoints', 'warn',
     'Model endpoint <id> does not answer through the proxy (GET http://<address>/v1/models through a CONNECT '
     'tunnel: <what>)'),
    ('endpoint.port_exact', 'endpoints', 'ok',
     "Model endpoint <id>'s rule is port-exact (a CONNECT to <host>:<port>, a port nobody declared, got the "
     "proxy's 403)"),
    ('endpoint.port_leaks', 'endpoints', 'warn',
     "Model endpoint <id>'s rule is not port-exact (a CONNECT to <host>:<port>, a port nobody declared, <what>): "
     "the rules allow more than you declared"),
    ('endpoint.plain', 'endpoints', 'ok',
     "Model endpoint <id> admits no plain forward request (GET http://<address>/v1/models without a tunnel got "
     "the proxy's 403 <error>)"),
    ('endpoint.plain_leaks', 'endpoints', 'warn',
     'Model endpoint <id> admits a plain forward request (GET http://<address>/v1/models without a tunnel '
     '<what>): the rules allow more than a tunnel'),
    ('endpoint.notrun', 'endpoints', 'notrun', 'Model endpoint <id>: the <probe> probe did not run (<why>)'),
    ('overlay.allowlist', 'overlay', 'warn',
     "<entry> in egress-allowlist.conf opens the host's port 443 and port 80 to every job, and no model server "
     "port"),
    ('overlay.allowlist_ok', 'overlay', 'ok',
     'Allowlist: no entry opens this host (host.docker.internal, host.containers.internal, or an entry that covers '
     'them)'),
    ('overlay.allowlist_unread', 'overlay', 'warn', 'Allowlist: <file> could not be checked (<why>)'),
    ('overlay.public_suffix', 'overlay', 'warn',
     '<entry> in egress-allowlist.conf covers the whole public suffix <suffix>: every site anyone registers under '
     'it is open to every job'),
    ('overlay.none', 'overlay', 'notrun',
     'Overlay models.json: no file given (doctor_models_json), so which models use which endpoint and which '
     'providers are keyless was not checked'),
    ('overlay.missing', 'overlay', 'warn', 'Overlay models.json: <file> does not exist'),
    ('overlay.read', 'overlay', 'fail', 'Overlay models.json: <file> <what>'),
    ('overlay.parse', 'overlay', 'fail',
     'Overlay <file> is refused<where>: <what>. pi drops the whole file over this, so no model in it loads and no '
     'provider in it is keyless'),
    ('overlay.uses', 'overlay', 'ok', 'Overlay model <provider>/<model> uses declared endpoint <id> (<address>)'),
    ('overlay.port_mismatch', 'overlay', 'warn',
     'Overlay model <provider>/<model> points at <host> port <port>, but the endpoint declared for that host uses '
     'port <declared>: host alone does not match, so it uses no endpoint and the proxy refuses its tunnel'),
    ('overlay.loopback', 'overlay', 'warn',
     "Overlay model <provider>/<model> has baseUrl <url>, a loopback address: inside a job that is the job's own "
     "container, so no job ever reaches that server"),
    ('overlay.max_tokens', 'overlay', 'warn',
     'Overlay models.json sends the output cap of <provider>/<model> as max_completion_tokens to a declared model '
     'endpoint, which a local server may ignore (Ollama does), so under a dollar cap every call to it is refused '
     'as unboundable'),
    ('overlay.keyless', 'overlay', 'ok', 'Provider key: none needed (<provider> is keyless: served by declared '
     'endpoint <ids>)'),
    ('overlay.needs_key', 'overlay', 'ok', 'Provider <provider> needs a key (not keyless: <reasons>)'),
    ('overlay.keyless_refused', 'overlay', 'fail',
     'Provider <provider> names <variable> but is not keyless: <reasons>. Every job on it is refused before '
     'anything is spent'),
    ('isolation.peers', 'isolation', 'ok',
     'Job-to-job isolation: <peer a> on <net a> and <peer b> on <net b> each reach the proxy and not each other '
     '(by name, by address, nor through the proxy\'s address on the other network)'),
    ('isolation.leaks', 'isolation', 'fail', 'Job-to-job isolation is broken: <what>'),
    ('isolation.proxy_unreached', 'isolation', 'fail',
     'Job-to-job isolation: <peer> on <net> does not reach the proxy (<what>), so a job there gets no egress'),
    ('isolation.notrun', 'isolation', 'notrun', 'Job-to-job isolation was not checked (<why>)'),
    ('isolation.cleanup', 'isolation', 'warn', 'Job-to-job isolation: <net> could not be torn down (<why>)'),
    # The host firewall layer (_doctor_firewall.py).
    ('firewall.current', 'firewall', 'ok',
     'Host firewall layer present and current (<prefix> chains and their jumps from INPUT and DOCKER-USER match '
     'what egress_firewall would write; <families>)'),
    ('firewall.jump_missing', 'firewall', 'fail',
     'Host firewall layer: the jump <hook> -> <chain> is missing, so its chain is there and nothing reaches it (a '
     'dockerd restart re-creates DOCKER-USER; a firewall reload flushes INPUT)'),
    ('firewall.stale', 'firewall', 'warn', 'Host firewall layer is not current (<what>)'),
    ('firewall.off', 'firewall', 'notrun',
     'Host firewall layer is not installed (no <prefix> chains; egress_firewall_enabled is false or was never '
     'applied)'),
    ('firewall.unchecked', 'firewall', 'notrun', 'Host firewall layer could not be checked (<why>)'),
    ('firewall.probe_silent', 'firewall', 'ok',
     'Job network gateway answers nothing (<gateway>:<port> on <net>, where the doctor listened: no answer within '
     '<timeout>s)'),
    ('firewall.probe_answered', 'firewall', 'warn',
     'Job network gateway answered (<gateway>:<port> on <net>: <how>): every service on 0.0.0.0 of this host '
     'answers every job; the host firewall layer is off (egress_firewall_enabled)'),
    ('firewall.probe_leaks', 'firewall', 'fail',
     'Job network gateway answered although the host firewall layer is installed (<gateway>:<port> on <net>: '
     '<how>)'),
    ('firewall.probe_notrun', 'firewall', 'notrun', 'Job network gateway probe did not run (<why>)'),
    ('firewall.leftover', 'firewall', 'ok',
     'Firewall probe: removed <net> (and <probe>), left by an EARLIER doctor run'),
    ('firewall.cleanup', 'firewall', 'warn', 'Firewall probe: <what> could not be removed (<why>)'),
    ('leftovers.unlisted', 'leftovers', 'warn',
     'Egress canary: leftovers from an EARLIER doctor run could not be listed: docker network ls --filter '
     'name=pi-dispatch-egress-doctor-'),
    ('leftovers.remote', 'leftovers', 'warn',
     'Egress canary: <net> may be left over from an EARLIER doctor run, and is not swept because this shell\'s '
     'docker CLI <what it resolved>, so a pid that is dead here may be alive there'),
    ('leftovers.unreadable', 'leftovers', 'warn',
     'Egress canary: the network <net> could not be read: docker network inspect <net>'),
    ('leftovers.kept', 'leftovers', 'warn',
     'Egress canary: <net> is kept, because the probe <probe> could not be removed and the network is the only '
     'way left to find it: docker rm -f <probe>'),
    ('leftovers.removed', 'leftovers', 'ok',
     'Egress canary: removed <net> (after removing <probes> and detaching <endpoints>), left by an EARLIER '
     'doctor run'),
    ('leftovers.gone', 'leftovers', 'ok',
     'Egress canary: removed <probes> and detached <endpoints> on <net>, left by an EARLIER doctor run; the '
     'network itself is gone'),
    ('leftovers.rm_failed', 'leftovers', 'warn',
     'Egress canary: the network <net> could not be removed: docker network rm <net>'),
    ('leftovers.would_sweep', 'leftovers', 'warn',
     'Egress canary: <net> would be removed (with <probes>, detaching <endpoints>), left by an EARLIER doctor '
     'run; check mode sweeps nothing'),
]
LINE_IDS = [item[0] for item in LINES]
_BY_ID = dict((item[0], item) for item in LINES)


class Line(object):
    """One doctor line: id, status (ok/warn/fail/notrun), message, fix command."""

    def __init__(self, line_id, status, message, fix=None):
        if line_id not in _BY_ID:
            raise ValueError('unknown doctor line id %r' % line_id)
        if status not in STATUSES:
            raise ValueError('unknown status %r' % status)
        self.id = line_id
        self.status = status
        # Credentials never leave the doctor (a baseUrl with user:password@, ?api_key=...): redacted here
        # and again where lines are formatted, since a fix may be completed after construction.
        self.message = _redact.redact(message)
        self.fix = _redact.redact(fix) or None

    @property
    def group(self):
        return _BY_ID[self.id][1]

    def as_dict(self):
        return dict(id=self.id, status=self.status, message=_redact.redact(self.message),
                    fix=_redact.redact(self.fix) or None)

    def __repr__(self):
        return 'Line(%r, %r, %r, %r)' % (self.id, self.status, self.message, self.fix)


def summary(lines):
    counts = dict((status, 0) for status in STATUSES)
    for line in lines:
        counts[line.status] += 1
    return counts


def render_report(lines):
    """The human report: lines grouped, each with its symbol, fixes under them, a summary."""
    out = []
    for group, title in GROUPS:
        members = [line for line in lines if line.group == group]
        if not members:
            continue
        out.append('%s:' % title)
        for line in members:
            shown = line.as_dict()  # redacted
            out.append(u'  %s %s' % (SYMBOLS[line.status], shown['message']))
            if shown['fix'] and line.status in ('warn', 'fail'):
                out.append(u'      fix: %s' % shown['fix'])
        out.append('')
    counts = summary(lines)
    out.append(u'%d checks: %d \u2713, %d \u26a0, %d \u2717, %d not run' % (
        len(lines), counts['ok'], counts['warn'], counts['fail'], counts['notrun']))
    return u'\n'.join(out) + u'\n'


def json_lines(lines):
    """The same results, one JSON object per line (id, status, message, fix)."""
    return u''.join(json.dumps(line.as_dict(), sort_keys=True, ensure_ascii=False) + u'\n' for line in lines)


# --- the leftover sweep: pure decisions ---------------------------------------------------

def network_name(pid):
    return '%s%d' % (NETWORK_PREFIX, int(pid))


def probe_name(probe, pid):
    return '%s%s-%d' % (PROBE_PREFIX, probe, int(pid))


def parse_doctor_network(name):
    """The pid in a doctor network's name, or None when the name is not exactly one.

    Two shapes: the canary's ``pi-dispatch-egress-doctor-<pid>`` and the
    isolation check's job networks ``pi-job-doctor-<pid>-<a|b>-net``.
    """
    match = NETWORK_RE.fullmatch(name or '') or ISOLATION_NET_RE.fullmatch(name or '')
    return int(match.group(1)) if match else None


def probe_pid(name):
    """The pid in a probe container's name, or None."""
    match = PROBE_RE.fullmatch((name or '').lstrip('/'))
    return int(match.group(2)) if match else None


def daemon_locality(docker_host, environ=None):
    """(local, what_it_resolved) for the daemon the doctor talks to.

    Local only when the connection is a unix socket on this host: the default
    (no docker_host and no DOCKER_HOST) or an explicit ``unix://`` path. A
    tcp://, ssh:// or npipe:// daemon may be shared or remote, and a pid that is
    dead here may be alive there.
    """
    environ = os.environ if environ is None else environ
    host = docker_host or environ.get('DOCKER_HOST') or ''
    if not host:
        return True, 'resolved the default unix socket /var/run/docker.sock on this host'
    if host.startswith('unix://') or host.startswith('/'):
        return True, 'resolved %s on this host' % host
    return False, 'resolved %s, which is not a unix socket on this host' % host


def pid_alive(pid):
    """Whether ``pid`` is a live process on this host (signal 0)."""
    if pid <= 0:
        return True  # never claim a nonsense pid is dead
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return True
    return True


def plan_leftover(name, own_pid, alive, local):
    """What to do with a network found under the canary's prefix.

    Returns one of: ``ignore`` (not exactly a canary name, or this run's own),
    ``live`` (its pid is alive: another doctor is running; leave it alone),
    ``remote`` (the daemon is not on this host: report, never sweep),
    ``sweep``.
    """
    pid = parse_doctor_network(name)
    if pid is None or pid == own_pid:
        return 'ignore'
    if not local:
        return 'remote'
    if alive:
        return 'live'
    return 'sweep'


def probe_of_network(probe, net, pid):
    """Whether a (possibly stopped) probe container named for ``pid`` belongs on ``net``.

    An isolation network holds only its own peer; the canary network holds
    every other probe of that pid.
    """
    if probe_pid(probe) != pid:
        return False
    match = ISOLATION_NET_RE.fullmatch(net or '')
    if match:
        return probe.lstrip('/') == peer_name(match.group(2), pid)
    return probe.lstrip('/') not in set(peer_name(peer, pid) for peer in PEERS)


def split_attached(attached, pid):
    """Split the names attached to ``pi-dispatch-egress-doctor-<pid>`` into (probes, others)."""
    probes, others = [], []
    for name in attached:
        name = name.lstrip('/')
        (probes if probe_pid(name) == pid else others).append(name)
    return sorted(probes), sorted(others)


def _names(items):
    return ', '.join(items) if items else 'nothing'


def sweep_line(net, removed=(), detached=(), stuck=None, rm_error=None, net_gone=False):
    """The one line a sweep of ``net`` produces (None when nothing happened to report).

    ``stuck``: a probe that could not be removed (the network is then kept and
    must not have been removed). ``rm_error``: the network removal failed.
    ``net_gone``: the daemon said the network was not there at removal time.
    """
    removed, detached = list(removed), list(detached)
    if stuck:
        return Line('leftovers.kept', 'warn',
                    'Egress canary: %s is kept, because the probe %s could not be removed and the network is the '
                    'only way left to find it: docker rm -f %s' % (net, stuck, stuck),
                    fix='docker rm -f %s, then re-run doctor' % stuck)
    if rm_error:
        return Line('leftovers.rm_failed', 'warn',
                    'Egress canary: the network %s could not be removed: docker network rm %s (%s)'
                    % (net, net, rm_error),
                    fix='docker network rm %s; if it has active endpoints, docker network inspect %s first and '
                        'remove what is on it' % (net, net))
    if net_gone:
        if not removed and not detached:
            return None
        parts = []
        if removed:
            parts.append('removed %s' % ', '.join(removed))
        if detached:
            parts.append('detached %s' % ', '.join(detached))
        return Line('leftovers.gone', 'ok',
                    'Egress canary: %s on %s, left by an EARLIER doctor run; the network itself is gone'
                    % (' and '.join(parts), net),
                    fix=('reattach %s to the network it belongs to' % ', '.join(detached)) if detached else None)
    return Line('leftovers.removed', 'ok',
                'Egress canary: removed %s (after removing %s and detaching %s), left by an EARLIER doctor run'
                % (net, _names(removed), _names(detached)))


def remote_line(net, resolved):
    return Line('leftovers.remote', 'warn',
                "Egress canary: %s may be left over from an EARLIER doctor run, and is not swept because this "
                "shell's docker CLI %s, so a pid that is dead here may be alive there" % (net, resolved),
                fix='check on the host that daemon belongs to, then docker network rm %s there' % net)


def unlisted_line(error):
    return Line('leftovers.unlisted', 'warn',
                'Egress canary: leftovers from an EARLIER doctor run could not be listed: docker network ls '
                '--filter name=%s (%s)' % (NETWORK_PREFIX, error),
                fix='docker network ls --filter name=%s; a daemon that cannot list is usually the real problem'
                    % NETWORK_PREFIX)


def unreadable_line(net, error):
    return Line('leftovers.unreadable', 'warn',
                'Egress canary: the network %s could not be read: docker network inspect %s (%s)' % (net, net, error),
                fix='docker network inspect %s (do not skip to network rm: what is attached is exactly what is '
                    'unknown)' % net)


def would_sweep_line(net, probes, others):
    return Line('leftovers.would_sweep', 'warn',
                'Egress canary: %s would be removed (with %s, detaching %s), left by an EARLIER doctor run; check '
                'mode sweeps nothing' % (net, _names(probes), _names(others)),
                fix='run doctor without --check')


# --- probe results: pure classification ------------------------------------------------------

PROBE_MARK = 'PIDOCTOR'  # never starting with @: curl -w would read a file


def probe_script(url, proxy_url, timeout, tunnel=False):
    """The shell the probe container runs: one curl, bounded, with a parseable trailer.

    ``-k``: no credential is sent, so the certificate is not what is proved;
    reaching the host through the tunnel is.
    """
    curl = ['curl', '-sS', '-k', '--max-time', str(int(timeout)), '--connect-timeout', str(int(timeout)),
            '-o', '/dev/null', '-D', '/tmp/h', '-w', "'%s %%{http_code} %%{http_connect}\\n'" % PROBE_MARK,
            '--proxy', proxy_url]
    # An http:// URL through --proxy is a plain forward request (GET http://host:port/), unless -p
    # (--proxytunnel) asks for a CONNECT tunnel first, as a job's client does for a model server.
    if tunnel:
        curl.append('-p')
    curl.append("'%s'" % url)
    return ('%s 2>/tmp/e; rc=$?; echo "%s-rc $rc"; echo "%s-headers"; cat /tmp/h 2>/dev/null; '
            'echo "%s-stderr"; cat /tmp/e 2>/dev/null' % (' '.join(curl), PROBE_MARK, PROBE_MARK, PROBE_MARK))


def parse_probe_output(text):
    """dict(rc, code, connect, squid_error, headers, error) from the probe's output (None: no trailer)."""
    result = dict(rc=None, code=0, connect=0, squid_error=None, error='')
    section = None
    found = False
    for raw in (text or '').splitlines():
        line = raw.rstrip('\r')
        if line.startswith(PROBE_MARK + ' '):
            found = True
            words = line.split()
            if len(words) > 1 and words[1].isdigit():
                result['code'] = int(words[1])
            if len(words) > 2 and words[2].isdigit():
                result['connect'] = int(words[2])
            continue
        if line.startswith(PROBE_MARK + '-rc '):
            value = line.split()[-1]
            result['rc'] = int(value) if value.lstrip('-').isdigit() else None
            continue
        if line == PROBE_MARK + '-headers':
            section = 'headers'
            continue
        if line == PROBE_MARK + '-stderr':
            section = 'stderr'
            continue
        if section == 'headers' and line.lower().startswith('x-squid-error:'):
            result['squid_error'] = line.split(':', 1)[1].strip()
        elif section == 'stderr' and line.strip():
            result['error'] = (result['error'] + ' ' + line.strip()).strip()
    return result if found else None


def _no_answer(result):
    return 'no answer (curl exit %s%s)' % (result.get('rc'), ': ' + result['error'] if result.get('error') else '')


def classify_provider(provider, result, why_not=None):
    if result is None:
        return notrun_line('provider', why_not or 'the probe printed no result')
    connect, code = result['connect'], result['code']
    if connect == 200 and code:
        return Line('canary.provider', 'ok',
                    'Egress policy reaches the provider (%s answered %d, so the whole path works and no key was '
                    'spent)' % (provider, code))
    if connect and connect != 200:
        what = 'the proxy answered the tunnel with %d%s' % (connect, ' (refused by the rules)' if connect == 403 else
                                                            ' (it let the tunnel through and nothing answered)'
                                                            if connect == 503 else '')
    elif connect == 200:
        what = 'the tunnel opened but the provider did not answer (%s)' % _no_answer(result)
    else:
        return notrun_line('provider', 'the proxy gave no answer: %s' % _no_answer(result))
    return Line('canary.provider_unreached', 'warn', 'Egress policy does not reach the provider (%s: %s)'
                % (provider, what),
                fix='list %s in egress-allowlist.conf, then reload the proxy (ansible-playbook '
                    'pi_dispatch.egress.site -e egress_proxy_state=reloaded)' % provider)


def classify_deny(deny, result, why_not=None):
    if result is None:
        return notrun_line('deny', why_not or 'the probe printed no result')
    connect, code = result['connect'], result['code']
    if connect == 403:
        return Line('canary.deny', 'ok',
                    'Egress policy denies an unlisted host (%s: the proxy refused the tunnel with 403; the deny '
                    'direction is the half an allowlist can silently lose)' % deny)
    if connect == 200 or code:
        what = 'the proxy opened the tunnel%s' % (' and the host answered %d' % code if code else '')
    elif connect:
        what = 'the proxy answered the tunnel with %d, so it tried to connect' % connect
    else:
        return notrun_line('deny', 'the proxy gave no answer: %s' % _no_answer(result))
    return Line('canary.deny_leaks', 'fail', 'Egress policy lets an unlisted host through (%s: %s)' % (deny, what),
                fix='remove %s (or the rule that admits it) from the proxy rules or the allowlist, then restart '
                    'the proxy (ansible-playbook pi_dispatch.egress.site -e egress_proxy_state=restarted)' % deny)


def classify_plain(listed, result, why_not=None):
    if result is None:
        return notrun_line('plain', why_not or 'the probe printed no result')
    code, error = result['code'], result.get('squid_error') or ''
    if code == 403 and error.startswith('ERR_ACCESS_DENIED'):
        return Line('canary.plain', 'ok',
                    "Egress policy refuses plain HTTP to a listed host off port 80 (%s:443 without a tunnel got "
                    "squid's 403 %s; only a CONNECT reaches 443)" % (listed, error.split()[0]))
    if not code:
        return notrun_line('plain', 'the proxy gave no answer: %s' % _no_answer(result))
    detail = ' X-Squid-Error: %s' % error if error else ' from upstream'
    what = 'GET http://%s:443/ without a tunnel got %d%s' % (listed, code, detail)
    return Line('canary.plain_leaks', 'fail', 'Egress policy lets plain HTTP through to %s on port 443 (%s)'
                % (listed, what),
                fix='refresh deploy/egress-proxy.conf to the packaged rules (they allow a plain request only to '
                    'port 80), then restart the proxy (ansible-playbook pi_dispatch.egress.site '
                    '-e egress_proxy_state=restarted)')


def notrun_line(probe, why):
    return Line('canary.notrun', 'notrun', 'Egress canary probe %s did not run (%s)' % (probe, why))


# --- model endpoint probes: pure ------------------------------------------------------------

def endpoint_probe_name(kind, endpoint_id, pid):
    """``pi-dispatch-egress-probe-endpoint-<kind>-<id>-<pid>`` (the seed's name; the sweep's PROBE_RE covers it)."""
    return probe_name('endpoint-%s-%s' % (kind, endpoint_id), pid)


def next_undeclared_port(port, declared_ports):
    """The nearest port above ``port`` that nobody declared for that host, never 80 or 443.

    Below ``port`` only when nothing above is free; None when no port is left.
    """
    taken = set(declared_ports) | set((80, 443))
    for candidate in range(port + 1, 65536):
        if candidate not in taken:
            return candidate
    for candidate in range(port - 1, 0, -1):
        if candidate not in taken:
            return candidate
    return None


def endpoint_targets(endpoint, endpoints):
    """(kind, url, tunnel) for the three probes of ``endpoint``; the port probe is None without a free port."""
    host = _endpoint_host(endpoint)
    same_host = [e.port for e in endpoints if e.host == endpoint.host]
    other = next_undeclared_port(endpoint.port, same_host)
    return [
        ('tunnel', 'http://%s/v1/models' % endpoint.address, True),
        ('port', ('http://%s:%d/' % (host, other)) if other else None, True),
        ('plain', 'http://%s/v1/models' % endpoint.address, False),
    ]


def _endpoint_host(endpoint):
    return '[%s]' % endpoint.host if endpoint.kind == 'ipv6' else endpoint.host


def _endpoint_fix():
    return ('ansible-playbook pi_dispatch.egress.endpoints (render and reload); if that changes nothing, compare '
            'deploy/egress-proxy.conf with the packaged rules')


def classify_endpoint_tunnel(endpoint, result, timeout, why_not=None):
    if result is None:
        return endpoint_notrun_line(endpoint, 'tunnel', why_not or 'the probe printed no result')
    connect, code, rc = result['connect'], result['code'], result.get('rc')
    head = 'GET http://%s/v1/models through a CONNECT tunnel' % endpoint.address
    if connect == 200 and code:
        if 200 <= code < 300:
            return Line('endpoint.tunnel', 'ok', 'Model endpoint %s answers through the proxy (%s: %d)'
                        % (endpoint.id, head, code))
        if code in (401, 403):
            return Line('endpoint.tunnel', 'ok', 'Model endpoint %s answers through the proxy (%s: %d from the '
                        'server: the route works and the server wants a key)' % (endpoint.id, head, code))
        what = ('the server answered %d; Ollama, llama-server, vLLM and LM Studio all serve that path, so check '
                'that %s is the model server' % (code, endpoint.address))
        fix = 'curl the server on its own host: curl http://%s/v1/models' % endpoint.address
    elif connect == 200:
        if rc == 28:
            what = ('the tunnel opened and no answer came within %ds: the server took the connection and is '
                    'stuck or busy' % timeout)
        else:
            what = ('the tunnel opened and the server closed the plain request (%s); a TLS server does that, '
                    'and a model server behind https:// is not what the overlay\'s http:// baseUrl reaches'
                    % _no_answer(result))
        fix = 'check the server at %s (its logs, its load)' % endpoint.address
    elif connect == 503:
        what = ('the proxy answered 503: it let the tunnel through and nothing answered, so the server is down or '
                'listens where the proxy cannot reach it')
        fix = ('start the server, listening on an address the proxy reaches (not 127.0.0.1 of its host), then '
               're-run doctor')
    elif connect == 403:
        what = "the proxy answered 403: its rules do not allow it"
        fix = _endpoint_fix()
    elif connect:
        what = 'the proxy answered %d' % connect
        fix = 'docker logs --tail 50 <proxy>'
    else:
        return endpoint_notrun_line(endpoint, 'tunnel', 'the proxy gave no answer: %s' % _no_answer(result))
    return Line('endpoint.tunnel_fails', 'warn', 'Model endpoint %s does not answer through the proxy (%s: %s)'
                % (endpoint.id, head, what), fix=fix)


def classify_endpoint_port(endpoint, url, result, why_not=None):
    if url is None:
        return endpoint_notrun_line(endpoint, 'port-exact', 'every other port of %s is declared' % endpoint.host)
    if result is None:
        return endpoint_notrun_line(endpoint, 'port-exact', why_not or 'the probe printed no result')
    target = url[len('http://'):].rstrip('/')
    connect, code = result['connect'], result['code']
    if connect == 403:
        return Line('endpoint.port_exact', 'ok',
                    "Model endpoint %s's rule is port-exact (a CONNECT to %s, a port nobody declared, got the "
                    "proxy's 403)" % (endpoint.id, target))
    if connect == 200:
        what = 'opened a tunnel%s' % (' and a server answered %d' % code if code else '')
    elif connect == 503:
        what = 'got 503: the proxy tried to connect'
    elif connect:
        what = 'got %d from the proxy' % connect
    else:
        return endpoint_notrun_line(endpoint, 'port-exact', 'the proxy gave no answer: %s' % _no_answer(result))
    return Line('endpoint.port_leaks', 'warn',
                "Model endpoint %s's rule is not port-exact (a CONNECT to %s, a port nobody declared, %s): the "
                "rules allow more than you declared" % (endpoint.id, target, what), fix=_endpoint_fix())


def classify_endpoint_plain(endpoint, result, why_not=None):
    if result is None:
        return endpoint_notrun_line(endpoint, 'plain-request', why_not or 'the probe printed no result')
    code, error = result['code'], result.get('squid_error') or ''
    head = 'GET http://%s/v1/models without a tunnel' % endpoint.address
    if code == 403 and error.startswith('ERR_ACCESS_DENIED'):
        return Line('endpoint.plain', 'ok', "Model endpoint %s admits no plain forward request (%s got the proxy's "
                    "403 %s)" % (endpoint.id, head, error.split()[0]))
    if not code:
        return endpoint_notrun_line(endpoint, 'plain-request', 'the proxy gave no answer: %s' % _no_answer(result))
    what = 'got %d%s' % (code, ' X-Squid-Error: %s' % error if error else ' from the server')
    return Line('endpoint.plain_leaks', 'warn', 'Model endpoint %s admits a plain forward request (%s %s): the '
                'rules allow more than a tunnel' % (endpoint.id, head, what), fix=_endpoint_fix())


def endpoint_notrun_line(endpoint, probe, why):
    return Line('endpoint.notrun', 'notrun', 'Model endpoint %s: the %s probe did not run (%s)'
                % (endpoint.id, probe, why))


# --- the overlay models.json and the allowlist: pure ------------------------------------------------

_OVERLAY_KINDS = {
    'allowlist': 'overlay.allowlist',
    'parse': 'overlay.parse',
    'uses': 'overlay.uses',
    'port-mismatch': 'overlay.port_mismatch',
    'loopback': 'overlay.loopback',
    'max-tokens': 'overlay.max_tokens',
}


def _overlay_line(check_line, path):
    """A doctor Line from a ``_models_json.Line``."""
    kind, status = check_line.kind, check_line.status
    if kind == 'keyless':
        if status == 'fail':
            line_id = 'overlay.keyless_refused'
        elif check_line.text.startswith('Provider key'):
            line_id = 'overlay.keyless'
        else:
            line_id = 'overlay.needs_key'
    elif kind == 'read':
        return Line('overlay.read', status, 'Overlay models.json: %s %s' % (path, check_line.text),
                    fix=check_line.fix or None)
    else:
        line_id = _OVERLAY_KINDS.get(kind, 'overlay.parse')
    fix = check_line.fix or None
    if status == 'ok' and line_id != 'overlay.needs_key':
        fix = None
    return Line(line_id, status, check_line.text, fix=fix)


def overlay_lines(models_path, models_text, read_problem, endpoints, allowlist_entries, allowlist_problem=None):
    """The overlay and allowlist lines.

    ``models_path``: the overlay models.json doctor was given (None: none given);
    ``models_text``: its content (None: missing or unreadable, see ``read_problem``,
    a ``_models_json.Line``); ``allowlist_entries``: the allowlist's entries, or
    None when ``allowlist_problem`` (a sentence) says why it could not be read.
    """
    from ansible_collections.pi_dispatch.egress.plugins.module_utils import _models_json
    lines = []
    if allowlist_entries is None:
        lines.append(Line('overlay.allowlist_unread', 'warn', 'Allowlist: %s' % allowlist_problem,
                          fix='ansible-playbook pi_dispatch.egress.site (validates the allowlist and names the '
                              'line to fix)'))
        entries = ()
    else:
        entries = list(allowlist_entries)
    # The allowlist warnings come first and do not need an overlay.
    for check_line in _models_json.check(None, endpoints, allowlist_hosts=entries):
        lines.append(_overlay_line(check_line, models_path))
    if allowlist_entries is not None and not lines:
        lines.append(Line('overlay.allowlist_ok', 'ok', _BY_ID['overlay.allowlist_ok'][3]))
    if models_path is None:
        lines.append(Line('overlay.none', 'notrun', _BY_ID['overlay.none'][3]))
        return lines
    if read_problem is not None:
        lines.append(_overlay_line(read_problem, models_path))
        return lines
    if models_text is None:
        lines.append(Line('overlay.missing', 'warn', 'Overlay models.json: %s does not exist' % models_path,
                          fix='set doctor_models_json to the overlay\'s models.json (in PI_GLOBAL_PI_DIR), or leave '
                              'it empty'))
        return lines
    for check_line in _models_json.check(models_text, endpoints, allowlist_hosts=(), path=models_path):
        lines.append(_overlay_line(check_line, models_path))
    return lines


# --- job-to-job isolation: pure ----------------------------------------------------------------------

def isolation_job_id(pid, peer):
    return 'doctor-%d-%s' % (int(pid), peer)


def isolation_network_name(pid, peer):
    return _jobnet.network_name(isolation_job_id(pid, peer))


def peer_name(peer, pid):
    return probe_name('peer-%s' % peer, pid)


def peer_address(subnet, peer='a'):
    """The fixed address a peer takes on its job network: the subnet's last usable one for a, the one before for b.

    Distinct per peer, so that two peers that end up on one network (the
    failure this check exists to catch) still both start and can be told apart.
    """
    import ipaddress
    hosts = list(ipaddress.ip_network(subnet, strict=False).hosts())
    return str(hosts[-1 - PEERS.index(peer)])


ISOLATION_CHECKS = ('proxy', 'peer_name', 'peer_address', 'proxy_other')


def isolation_script(targets, timeout=ISOLATION_CONNECT_TIMEOUT, settle=1):
    """Shell for one peer: the checks of ``targets`` (key -> URL) at once, each bounded, then a parseable trailer.

    Direct (``--noproxy '*'``): a job that ignores its proxy variables is what
    isolation must hold against. ``settle`` seconds first, so the other peer is
    up, and as long again at the end, so it stays up while the other probes it.
    """
    parts = ['sleep %d' % int(settle)]
    for key in ISOLATION_CHECKS:
        url = targets[key]
        parts.append("(curl -sS --noproxy '*' --connect-timeout %d --max-time %d -o /dev/null -w '%%{http_code}' "
                     "'%s' >/tmp/o-%s 2>/tmp/e-%s; echo $? >/tmp/r-%s) &"
                     % (int(timeout), int(timeout) + 2, url, key, key, key))
    parts.append('wait')
    for key in ISOLATION_CHECKS:
        parts.append('echo "%s-ISO %s $(cat /tmp/o-%s 2>/dev/null) $(cat /tmp/r-%s 2>/dev/null) '
                     '$(head -c 200 /tmp/e-%s 2>/dev/null | tr \'\\n\' \' \')"' % (PROBE_MARK, key, key, key, key))
    parts.append('sleep %d' % int(settle))
    return '\n'.join(parts) + '\n'


def parse_isolation_output(text):
    """key -> dict(code, rc, error) from a peer's output; None when a check's trailer is missing."""
    found = {}
    for raw in (text or '').splitlines():
        if not raw.startswith(PROBE_MARK + '-ISO '):
            continue
        words = raw.split(None, 4)
        if len(words) < 4 or words[1] not in ISOLATION_CHECKS:
            continue
        code = int(words[2]) if words[2].isdigit() else 0
        rc = int(words[3]) if words[3].lstrip('-').isdigit() else None
        found[words[1]] = dict(code=code, rc=rc, error=(words[4].strip() if len(words) > 4 else ''))
    return found if all(key in found for key in ISOLATION_CHECKS) else None


def reached(check):
    """Whether a direct connection got anything back: an HTTP answer, or a refused connection (curl exit 7).

    Docker drops traffic between networks, which is a timeout (exit 28) or a
    name that does not resolve (exit 6); a refusal means packets got there.
    """
    return bool(check['code']) or check['rc'] == 7


def _check_text(check):
    if check['code']:
        return 'HTTP %d' % check['code']
    return 'curl exit %s%s' % (check['rc'], ': ' + check['error'] if check['error'] else '')


def classify_isolation(peers):
    """One line from both peers' results.

    ``peers``: list of dict(peer, net, other, targets, result, why), ``result``
    from :func:`parse_isolation_output` (None: the peer gave no reading).
    """
    for peer in peers:
        if peer['result'] is None:
            return Line('isolation.notrun', 'notrun', 'Job-to-job isolation was not checked (%s on %s: %s)'
                        % (peer['peer'], peer['net'], peer['why'] or 'it printed no result'))
    leaks = []
    for peer in peers:
        result = peer['result']
        for key, what in (('peer_name', "%s's name"), ('peer_address', "%s's address"),
                          ('proxy_other', "the proxy's address on %s's network")):
            if reached(result[key]):
                leaks.append('%s on %s reached %s (%s: %s)' % (
                    peer['peer'], peer['net'], what % peer['other'], peer['targets'][key], _check_text(result[key])))
    if leaks:
        return Line('isolation.leaks', 'fail', 'Job-to-job isolation is broken: %s' % '; '.join(leaks),
                    fix='job networks must be created --internal, one per job (pi_dispatch.egress.job_network); '
                        'docker network inspect <net> shows Internal and what is attached')
    for peer in peers:
        check = peer['result']['proxy']
        if not check['code']:
            return Line('isolation.proxy_unreached', 'fail',
                        'Job-to-job isolation: %s on %s does not reach the proxy (%s: %s), so a job there gets no '
                        'egress' % (peer['peer'], peer['net'], peer['targets']['proxy'], _check_text(check)),
                        fix='docker network connect %s <proxy>; pi_dispatch.egress.job_network attaches it'
                            % peer['net'])
    a, b = peers
    return Line('isolation.peers', 'ok',
                "Job-to-job isolation: %s on %s and %s on %s each reach the proxy and not each other (by name, by "
                "address, nor through the proxy's address on the other network)"
                % (a['peer'], a['net'], b['peer'], b['net']))


# --- the model-endpoints include: pure -------------------------------------------------------

def include_line(proxy, declared_ids, render, running, mounted, mounted_path, declaration_path, mounts_include):
    """The include line, or None when nothing is declared and all agrees (doctor then says nothing).

    ``running``: the include as the running proxy reads it (None: unknown);
    ``mounted``: the host file the proxy mounts (None: not readable here, e.g. a remote daemon);
    ``render``: what the declaration renders.
    """
    ids = ', '.join(declared_ids) if declared_ids else 'nothing declared'
    if not mounts_include:
        if not declared_ids:
            return None
        return Line('endpoints.include_unmounted', 'fail',
                    'Model endpoints: the proxy does not mount the include, so the declared endpoints (%s) stay '
                    'unreachable until it is recreated' % ids,
                    fix='ansible-playbook pi_dispatch.egress.site (recreates the proxy with the third mount)')
    if running is None:
        return Line('endpoints.include_unchecked', 'warn',
                    'Model endpoints: the include could not be checked (reading it inside %s failed)' % proxy,
                    fix='docker exec %s cat %s' % (proxy, _rules.CONTAINER_ENDPOINTS))
    if mounted is not None and mounted != running:
        return Line('endpoints.include_replaced', 'fail',
                    "Model endpoints: the include inside the running proxy differs from the file it mounts (%s): "
                    "the file was replaced (a rename, an editor's save) instead of written in place, and the proxy "
                    "still reads the old one" % mounted_path,
                    fix='recreate the proxy: docker rm -f %s, then ansible-playbook pi_dispatch.egress.site' % proxy)
    if running != render:
        return Line('endpoints.include_stale', 'fail',
                    'Model endpoints: the include inside the running proxy is not the render of %s (%s)'
                    % (declaration_path, ids),
                    fix='ansible-playbook pi_dispatch.egress.endpoints (renders and reloads the proxy)')
    if not declared_ids:
        return None
    return Line('endpoints.include', 'ok',
                'Model endpoints: the include inside the running proxy matches model-endpoints.json (%s)' % ids)


# --- the destination guard and the mounts: pure ---------------------------------------------------

GUARD_REFRESH_FIX = ('ansible-playbook pi_dispatch.egress.upgrade -e egress_upgrade_refresh_rules=true (takes the '
                     'packaged rules with a backup, lays out egress-guard.conf and renders it)')


def _guard_comment(text, label):
    prefix = '# %s: ' % label
    for line in text.splitlines():
        if line.startswith(prefix):
            return line[len(prefix):].strip()
    return None


def attrs_gateways(attrs):
    """{gateway: network name} of every network in a container inspect."""
    found = {}
    for name, settings in sorted(((attrs.get('NetworkSettings') or {}).get('Networks') or {}).items()):
        for key in ('Gateway', 'IPv6Gateway'):
            if (settings or {}).get(key):
                found.setdefault(settings[key], name)
    return found


def guard_line(proxy, running_rules, running_guard, mounts_guard, gateways=None, host_gateway=None, why=None):
    """The guard line from what the running proxy reads.

    ``running_rules``/``running_guard``: the rules and the guard include as read inside the proxy
    (None: not readable, ``why`` says why); ``gateways``: {address: network} of the proxy's networks now;
    ``host_gateway``: what host.docker.internal is inside the proxy.
    """
    if running_rules is None:
        return Line('proxy.guard_unchecked', 'warn', 'Destination guard could not be checked (%s)'
                    % (why or 'the rules inside %s could not be read' % proxy),
                    fix='docker exec %s cat %s' % (proxy, _rules.CONTAINER_RULES))
    if not _rules.includes_guard(running_rules):
        return Line('proxy.guard_missing', 'fail',
                    'Destination guard missing: the rules %s runs do not include egress-guard.conf, so a listed '
                    'name can lead a job to another job, the host or a private range' % proxy, fix=GUARD_REFRESH_FIX)
    if not mounts_guard:
        return Line('proxy.guard_unmounted', 'fail',
                    'Destination guard not mounted: %s does not mount egress-guard.conf, so squid cannot read it'
                    % proxy, fix='ansible-playbook pi_dispatch.egress.site -e egress_proxy_allow_cut_jobs=true '
                                 '(recreates the proxy with the guard mount)')
    if running_guard is None:
        return Line('proxy.guard_unchecked', 'warn', 'Destination guard could not be checked (%s)'
                    % (why or '%s could not be read inside %s' % (_rules.CONTAINER_GUARD, proxy)),
                    fix='docker exec %s cat %s' % (proxy, _rules.CONTAINER_GUARD))
    nets = _guard.acl_networks(running_guard)
    if not nets:
        return Line('proxy.guard_empty', 'fail',
                    'Destination guard empty: egress-guard.conf inside %s defines no pi_guard addresses' % proxy,
                    fix='ansible-playbook pi_dispatch.egress.site (renders the guard and reloads squid)')
    pool = _guard_comment(running_guard, 'Job-network pool')
    gaps = []
    try:
        pool_net = _guard.ipaddress.ip_network(pool, strict=False) if pool else None
    except ValueError:
        pool_net = None
    ends = (pool_net.network_address, pool_net.broadcast_address) if pool_net is not None else ()
    if pool_net is None or not all(_guard.covers(nets, a) for a in ends):
        gaps.append('the job-network pool %s' % (pool or '(not named)'))
    for address, network in sorted((gateways or {}).items()):
        if not _guard.covers(nets, address):
            gaps.append('the gateway %s of %s' % (address, network))
    if host_gateway and not _guard.covers(nets, host_gateway):
        gaps.append('the host-gateway address %s' % host_gateway)
    if gaps:
        return Line('proxy.guard_gap', 'fail', 'Destination guard gap: egress-guard.conf inside %s does not refuse %s'
                    % (proxy, ', '.join(gaps)),
                    fix='ansible-playbook pi_dispatch.egress.site (renders the guard from the daemon\'s gateways '
                        'and reloads squid; no job is cut)')
    refused = ['the job pool %s' % pool_net]
    outside = _guard_comment(running_guard, 'Network gateways outside the pool (this host)')
    if outside and outside != 'none known':
        refused.append('the gateways %s' % outside)
    if host_gateway:
        refused.append('the host %s' % host_gateway)
    refused.append('every other non-public range')
    opened = _guard_comment(running_guard, 'Opened private ranges') or 'none'
    return Line('proxy.guard', 'ok',
                'Destination guard in force in %s: a listed name that resolves to %s is refused (%d ranges; '
                'opened: %s)' % (proxy, ', '.join(refused), len(nets), opened))


def endpoints_rules_line(proxy, running_rules, declared_ids):
    """A fail line when endpoints are declared and the running rules cannot load them, else None."""
    if running_rules is None or not declared_ids or _rules.includes_endpoints(running_rules):
        return None
    return Line('endpoints.rules_without_include', 'fail',
                'Model endpoints: the rules %s runs do not include model-endpoints.conf, so the declared endpoints '
                '(%s) stay unreachable until the rules are refreshed' % (proxy, ', '.join(declared_ids)),
                fix=GUARD_REFRESH_FIX)


def mounts_line(proxy, stale, count, why=None):
    """``stale``: host paths whose content inside the proxy differs; ``why``: why nothing was compared."""
    if why:
        return Line('proxy.mounts_unchecked', 'notrun',
                    'Egress proxy mounts were not compared with the files on disk (%s)' % why)
    if stale:
        return Line('proxy.mounts_stale', 'fail',
                    'Egress proxy mounts: %s inside %s differ from the file on disk: it was saved by rename (sed -i, '
                    'an editor, lineinfile, template) and the proxy still reads the old one'
                    % (', '.join(stale), proxy),
                    fix='ansible-playbook pi_dispatch.egress.site -e egress_proxy_allow_cut_jobs=true (recreates the '
                        'proxy on the current files), and write these files in place from now on')
    return Line('proxy.mounts', 'ok', 'Egress proxy mounts: each of the %d files inside %s has the content of the '
                                      'file on disk' % (count, proxy))


# --- proxy lines: pure ---------------------------------------------------------------------------

def proxy_lines(proxy, attrs):
    """Running and health lines from the proxy's inspect (None: no such container)."""
    if attrs is None:
        return [Line('proxy.missing', 'fail',
                     'Egress proxy missing: there is no container %s, so every job is refused' % proxy,
                     fix='ansible-playbook pi_dispatch.egress.site')]
    state = attrs.get('State') or {}
    if not state.get('Running') or state.get('Paused'):
        status = 'paused' if state.get('Paused') else (state.get('Status') or 'not running')
        return [Line('proxy.stopped', 'fail',
                     'Egress proxy stopped (%s is %s), so every job is refused' % (proxy, status),
                     fix=('docker unpause %s' if state.get('Paused') else 'docker start %s') % proxy)]
    lines = [Line('proxy.running', 'ok', 'Egress proxy running (%s)' % proxy)]
    health = (state.get('Health') or {}).get('Status')
    if health == 'healthy':
        lines.append(Line('proxy.health', 'ok', 'Egress proxy health: healthy'))
    elif health == 'unhealthy':
        lines.append(Line('proxy.health', 'fail', 'Egress proxy health: unhealthy (squid does not answer its own '
                                                  'health check)',
                          fix='docker logs --tail 50 %s, then docker restart %s' % (proxy, proxy)))
    elif health == 'starting':
        lines.append(Line('proxy.health', 'warn', 'Egress proxy health: starting',
                          fix='wait a few seconds and re-run doctor; docker inspect %s shows the health log' % proxy))
    else:
        lines.append(Line('proxy.health', 'warn', 'Egress proxy health: no health check is configured',
                          fix='ansible-playbook pi_dispatch.egress.site (recreates the proxy with its health check)'))
    return lines


PACKAGED_FILE = 'plugins/module_utils/_rules.py'


def first_difference(text, packaged):
    """(line number, folder's line, packaged line) of the first differing line, 1-based."""
    ours, theirs = text.splitlines(), packaged.splitlines()
    for number in range(max(len(ours), len(theirs))):
        left = ours[number] if number < len(ours) else '<end of file>'
        right = theirs[number] if number < len(theirs) else '<end of file>'
        if left != right:
            return number + 1, left, right
    return None


def rules_line(rules_path, text, error=None):
    packaged = "%s in the pi_dispatch.egress collection, rules version %d" % (PACKAGED_FILE, _rules.RULES_VERSION)
    if error is not None:
        return Line('proxy.rules_unreadable', 'warn', 'Egress proxy rules: %s could not be read (%s)'
                    % (rules_path, error), fix='ls -l %s; ansible-playbook pi_dispatch.egress.site lays it out '
                                               'when missing' % rules_path)
    if text == _rules.packaged_rules():
        return Line('proxy.rules', 'ok', "Egress proxy rules: %s matches the collection's copy (%s)"
                    % (rules_path, packaged))
    where = first_difference(text, _rules.packaged_rules())
    detail = ''
    if where:
        detail = '; first difference at line %d: %r, packaged %r' % where
    return Line('proxy.rules_differ', 'warn', "Egress proxy rules: %s differs from the collection's copy (%s%s)"
                % (rules_path, packaged, detail),
                fix='review the difference; to go back to the packaged rules keep a backup '
                    '(cp -p %s %s.bak-$(date -u +%%Y%%m%%dT%%H%%M%%SZ)), write the packaged copy in place, then '
                    'restart the proxy (ansible-playbook pi_dispatch.egress.site -e egress_proxy_state=restarted)'
                % (rules_path, rules_path))


# --- squid inside the proxy against the mirror: pure ------------------------------------------------

SQUID_CANDIDATE_TIMEOUT = 60  # seconds apt-get update may take in the throwaway container
SQUID_IMAGE_REFRESH_FIX = ('ansible-playbook pi_dispatch.egress.site -e egress_proxy_image_refresh=true (rebuilds the '
                           'proxy image with the mirror\'s current packages; the proxy then moves onto it)')


def candidate_script(timeout=SQUID_CANDIDATE_TIMEOUT):
    """Shell for the throwaway container: a bounded apt-get update, then apt-cache policy squid."""
    update = ('timeout %d apt-get update -o Acquire::Retries=0 -o Acquire::http::Timeout=10 '
              '-o Acquire::https::Timeout=10 -o Acquire::ftp::Timeout=10 -o APT::Sandbox::User=root' % int(timeout))
    return ('%s >/tmp/u 2>&1; echo "%s-apt-rc $?"; cat /tmp/u; echo "%s-policy"; apt-cache policy squid 2>&1'
            % (update, PROBE_MARK, PROBE_MARK))


def parse_apt_policy(text):
    """dict(installed, candidate, candidate_from_mirror) from ``apt-cache policy squid``; None when absent.

    ``candidate_from_mirror`` is true only when the version table lists the
    candidate with a source other than dpkg's status file: after an update
    that fetched nothing, apt's "candidate" is just the installed version.
    """
    installed = candidate = None
    found = False
    table, current = {}, None
    for raw in (text or '').splitlines():
        line = raw.strip()
        if line.startswith('Installed:'):
            found = True
            installed = line.split(':', 1)[1].strip()
        elif line.startswith('Candidate:'):
            candidate = line.split(':', 1)[1].strip()
        elif raw.startswith('     ') or raw.startswith(' *** '):
            words = line.replace('***', '').split()
            if len(words) == 2 and words[1].isdigit() and not raw.startswith('        '):
                current = words[0]
                table.setdefault(current, [])
            elif current is not None and len(words) >= 2 and words[0].isdigit():
                table[current].append(words[1])
    if not found:
        return None
    none = ('(none)', '')
    installed = None if installed in none else installed
    candidate = None if candidate in none else candidate
    sources = table.get(candidate, []) if candidate else []
    return dict(installed=installed, candidate=candidate,
                candidate_from_mirror=any(src != '/var/lib/dpkg/status' for src in sources))


def parse_candidate_output(text):
    """(candidate version, None) or (None, why) from :func:`candidate_script`'s output. Never a guess."""
    text = text or ''
    rc_mark, policy_mark = PROBE_MARK + '-apt-rc ', PROBE_MARK + '-policy'
    if rc_mark not in text or policy_mark not in text:
        tail = ' '.join(text.split())[-200:]
        return None, 'the throwaway container printed no result%s' % ((' (%s)' % tail) if tail else '')
    head, _sep, policy = text.partition(policy_mark)
    rc_text, _sep, update = head.partition(rc_mark)[2].partition('\n')
    rc = int(rc_text.strip()) if rc_text.strip().lstrip('-').isdigit() else None
    problems = [line.strip() for line in update.splitlines()
                if line.startswith(('Err:', 'E: ', 'W: Failed to fetch')) or line.startswith('  ') and 'fail' in line]
    detail = ('; '.join(problems))[:300]
    if rc == 124:
        return None, 'apt-get update did not finish within %ds%s' % (SQUID_CANDIDATE_TIMEOUT,
                                                                     (': ' + detail) if detail else '')
    if rc != 0:
        return None, 'apt-get update exited %s%s' % (rc, (': ' + detail) if detail else '')
    if problems:
        return None, 'apt-get update could not fetch every source: %s' % detail
    parsed = parse_apt_policy(policy)
    if parsed is None or parsed['candidate'] is None:
        return None, 'the mirror offers no squid package (apt-cache policy squid names no candidate)'
    if not parsed['candidate_from_mirror']:
        return None, ('apt-get update fetched no package list, so apt only knows the installed version (%s)'
                      % parsed['candidate'])
    return parsed['candidate'], None


def squid_lines(proxy, installed, installed_why, candidate, candidate_why):
    """The squid lines: the package inside the proxy, then how it compares with the mirror's candidate."""
    lines = []
    if installed is not None:
        try:
            _debversion.parse(installed)
        except ValueError as exc:
            installed_why, installed = 'dpkg-query printed %s' % exc, None
    if installed is None:
        lines.append(Line('proxy.squid_unread', 'warn',
                          'Egress proxy squid: the package version inside %s could not be read (%s)'
                          % (proxy, installed_why or 'no answer'),
                          fix="docker exec %s dpkg-query -W squid" % proxy))
        lines.append(Line('proxy.squid_mirror_unread', 'notrun',
                          "Egress proxy squid: could not read the mirror's version (the installed version is "
                          "unknown), so whether the package is current was not checked"))
        return lines
    lines.append(Line('proxy.squid', 'ok', 'Egress proxy squid: package %s inside %s' % (installed, proxy)))
    order = None
    if candidate is not None:
        try:
            order = _debversion.compare(installed, candidate)
        except ValueError as exc:
            candidate_why = 'apt-cache policy printed %s' % exc
    if order is None:
        lines.append(Line('proxy.squid_mirror_unread', 'notrun',
                          "Egress proxy squid: could not read the mirror's version (%s), so whether %s is current "
                          "was not checked" % (candidate_why or 'no answer', installed)))
    elif order < 0:
        lines.append(Line('proxy.squid_outdated', 'warn',
                          "Egress proxy squid is out of date: %s is older than the mirror's candidate %s, so the "
                          "proxy lacks the mirror's fixes" % (installed, candidate),
                          fix=SQUID_IMAGE_REFRESH_FIX))
    else:
        lines.append(Line('proxy.squid_current', 'ok',
                          "Egress proxy squid is current: %s is not older than the mirror's candidate %s"
                          % (installed, candidate)))
    return lines


def upstream_network(names, labelled_upstream):
    """The network the proxy reaches the mirror through: one labelled upstream, else the first that is
    neither a job network nor a doctor network; None when there is none."""
    candidates = sorted(name for name in names
                        if not _jobnet.looks_like_job_network(name) and parse_doctor_network(name) is None)
    for name in candidates:
        if labelled_upstream(name):
            return name
    return candidates[0] if candidates else None


# --- public-suffix entries in the allowlist: pure ---------------------------------------------------------

_ENTRY_RE = re.compile(r'^\.?[a-z0-9_.\-]+$')


def public_suffix_checker():
    """The allowlist's own rule (the Public Suffix List): one source for the validator and the doctor."""
    from ansible_collections.pi_dispatch.egress.plugins.module_utils import _allowlist
    return _allowlist.public_suffix_covered


def public_suffix_lines(path, text, covered):
    """A warning per allowlist entry that is a whole public suffix (files written before that rule).

    Reads the entries itself, so an entry today's validator refuses is still named.
    """
    lines, seen = [], set()
    for raw in (text or '').lstrip(u'\ufeff').splitlines():
        words = raw.split('#', 1)[0].split()
        if not words or not _ENTRY_RE.match(words[0].lower()) or words[0].lower() in seen:
            continue
        entry = words[0].lower()
        seen.add(entry)
        try:
            suffix = covered(entry)
        except Exception as exc:  # e.g. PublicSuffixListMissing: names the package to install
            return [Line('overlay.allowlist_unread', 'warn', 'Allowlist: %s could not be checked (for public '
                                                             'suffixes: %s)' % (path, ' '.join(str(exc).split())),
                         fix='pip install publicsuffixlist where the doctor runs, then re-run doctor')]
        if suffix:
            lines.append(Line('overlay.public_suffix', 'warn',
                              '%s in egress-allowlist.conf covers the whole public suffix %s: every site anyone '
                              'registers under it is open to every job' % (entry, suffix),
                              fix='replace %s in %s with the exact hosts (api.example.com) or your own domain '
                                  '(.yourdomain.tld), then ansible-playbook pi_dispatch.egress.site '
                                  '-e egress_proxy_state=reloaded' % (entry, path)))
    return lines


# --- the daemon side -------------------------------------------------------------------------------

class Doctor(object):
    """Runs the sweep and the canary against a daemon; collects lines and actions."""

    def __init__(self, client, proxy, deploy_dir, probe_image, provider_host=DEFAULT_PROVIDER_HOST,
                 deny_host=DEFAULT_DENY_HOST, listed_host=None, probe_timeout=DEFAULT_PROBE_TIMEOUT,
                 start_grace=DEFAULT_PROBE_START_GRACE, docker_host=None, check_mode=False, pid=None,
                 environ=None, endpoint_timeout=DEFAULT_ENDPOINT_TIMEOUT, models_json=None, isolation=True,
                 job_pool=_jobnet.DEFAULT_POOL, job_prefix=_jobnet.DEFAULT_PREFIX, squid_candidate=True):
        self.client = client
        self.proxy = proxy
        self.deploy_dir = deploy_dir
        self.probe_image = probe_image
        self.provider_host = provider_host
        self.deny_host = deny_host
        self.listed_host = listed_host or provider_host
        self.probe_timeout = int(probe_timeout)
        self.start_grace = int(start_grace)
        self.docker_host = docker_host
        self.check_mode = check_mode
        self.pid = os.getpid() if pid is None else int(pid)
        self.environ = os.environ if environ is None else environ
        self.endpoint_timeout = int(endpoint_timeout)
        self.models_json = models_json or None
        self.isolation_enabled = bool(isolation)
        self.job_pool = job_pool
        self.job_prefix = int(job_prefix)
        self.squid_candidate = bool(squid_candidate)
        self.actions = []
        self.timings = {}
        self._launched = []
        self._lock = threading.Lock()
        self._endpoints = None   # the declared endpoints, once loaded
        self._endpoints_error = None

    # --- sweep --------------------------------------------------------------------------------
    def sweep(self, alive=pid_alive):
        local, resolved = daemon_locality(self.docker_host, self.environ)
        lines = []
        try:
            nets = self.client.api.networks(filters={'name': NETWORK_PREFIX})
            nets += self.client.api.networks(filters={'name': ISOLATION_NET_PREFIX})
        except Exception as exc:
            return [unlisted_line(dc.api_message(exc))]
        try:
            all_probes = [c['Names'][0].lstrip('/') for c in
                          self.client.api.containers(all=True, filters={'name': PROBE_PREFIX})]
        except Exception:
            all_probes = []
        for net in sorted(nets, key=lambda n: n.get('Name') or ''):
            name = net.get('Name') or ''
            pid = parse_doctor_network(name)
            decision = plan_leftover(name, self.pid, alive(pid) if pid is not None else True, local)
            if decision in ('ignore', 'live'):
                continue
            if decision == 'remote':
                lines.append(remote_line(name, resolved))
                continue
            line = self._sweep_one(name, pid, all_probes)
            if line is not None:
                lines.append(line)
        return lines

    def _sweep_one(self, name, pid, all_probes):
        try:
            attrs = self.client.api.inspect_network(name)
        except Exception as exc:
            if dc.is_not_found(exc):
                return None
            return unreadable_line(name, dc.api_message(exc))
        attached = [(c.get('Name') or cid) for cid, c in (attrs.get('Containers') or {}).items()]
        probes, others = split_attached(attached, pid)
        # Stopped probes are not listed as endpoints; their names still say whose they are.
        probes = sorted(set(probes) | set(p for p in all_probes if probe_of_network(p, name, pid)))
        if self.check_mode:
            return would_sweep_line(name, probes, others)
        removed, stuck = [], []
        for probe in probes:
            try:
                self.client.api.remove_container(probe, force=True)
                removed.append(probe)
                self.actions.append('removed leftover probe %s' % probe)
            except Exception as exc:
                if not dc.is_not_found(exc):
                    stuck.append(probe)
        if stuck:
            # The network is the only handle on that probe: keep it, detach nothing.
            return sweep_line(name, removed=removed, stuck=stuck[0])
        detached = []
        for other in others:
            try:
                self.client.api.disconnect_container_from_network(other, name, force=True)
                detached.append(other)
                self.actions.append('detached %s from leftover %s' % (other, name))
            except Exception as exc:
                if not dc.is_not_found(exc):
                    self.actions.append('detaching %s from %s failed: %s' % (other, name, dc.api_message(exc)))
        try:
            self.client.api.remove_network(name)
            self.actions.append('removed leftover network %s' % name)
        except Exception as exc:
            if dc.is_not_found(exc):
                return sweep_line(name, removed=removed, detached=detached, net_gone=True)
            return sweep_line(name, removed=removed, detached=detached, rm_error=dc.api_message(exc))
        return sweep_line(name, removed=removed, detached=detached)

    # --- proxy ---------------------------------------------------------------------------------
    def proxy_attrs(self):
        try:
            return self.client.api.inspect_container(self.proxy)
        except Exception as exc:
            if dc.is_not_found(exc):
                return None
            raise dc.EngineError('Inspecting container %s failed: %s' % (self.proxy, dc.api_message(exc)))

    def rules_line(self):
        path = _deployment.paths(self.deploy_dir)['rules']
        try:
            with open(path, 'r') as handle:
                return rules_line(path, handle.read())
        except (IOError, OSError) as exc:
            return rules_line(path, None, error=exc.strerror or str(exc))

    def include_lines(self, attrs):
        """The include check (needs the model endpoints piece; says so when it is missing)."""
        try:
            from ansible_collections.pi_dispatch.egress.plugins.module_utils import _endpoints
        except ImportError:
            return [Line('endpoints.include_notchecked', 'notrun', _BY_ID['endpoints.include_notchecked'][3])]
        declaration = _endpoints.default_path(self.deploy_dir)
        try:
            endpoints, declaration, _exists = _endpoints.load(self.deploy_dir)
            render = _endpoints.render_include(endpoints)
        except Exception as exc:  # EndpointsError names the file, the key and the fix
            return [Line('endpoints.include_unchecked', 'warn',
                         'Model endpoints: the include could not be checked (%s)' % ' '.join(str(exc).split()),
                         fix='fix %s as the message says, then ansible-playbook pi_dispatch.egress.endpoints'
                             % declaration)]
        mount = [m for m in attrs.get('Mounts') or [] if m.get('Destination') == _rules.CONTAINER_ENDPOINTS]
        running = mounted = None
        mounted_path = mount[0].get('Source') if mount else None
        if mount:
            try:
                rc, out = dc.exec_in(self.client.containers.get(self.proxy), ['cat', _rules.CONTAINER_ENDPOINTS])
                running = out if rc == 0 else None
            except Exception:
                running = None
            if daemon_locality(self.docker_host, self.environ)[0] and mounted_path:
                try:
                    with open(mounted_path, 'r') as handle:
                        mounted = handle.read()
                except (IOError, OSError):
                    mounted = None
        line = include_line(self.proxy, [e.id for e in endpoints], render, running, mounted, mounted_path,
                            declaration, bool(mount))
        return [line] if line else []

    # --- the destination guard and the mounts ------------------------------------------------------
    def guard_lines(self, attrs):
        """The guard line, the rules-without-endpoints line and the stale-mount line (running proxy)."""
        lines = []
        mounts = [(m.get('Source'), m.get('Destination')) for m in attrs.get('Mounts') or []
                  if m.get('Type') == 'bind' and m.get('Source') and m.get('Destination')]
        mounts_guard = any(dst == _rules.CONTAINER_GUARD for _src, dst in mounts)
        running_rules = running_guard = host_gateway = why = None
        try:
            container = self.client.containers.get(self.proxy)
            rc, out = dc.exec_in(container, ['cat', _rules.CONTAINER_RULES])
            running_rules = out if rc == 0 else None
            if mounts_guard:
                rc, out = dc.exec_in(container, ['cat', _rules.CONTAINER_GUARD])
                running_guard = out if rc == 0 else None
            rc, out = dc.exec_in(container, ['cat', '/etc/hosts'])
            host_gateway = _proxy.hosts_address(out) if rc == 0 else None
        except Exception as exc:
            why = ' '.join((dc.api_message(exc) if not isinstance(exc, dc.EngineError) else str(exc)).split())
            container = None
        lines.append(guard_line(self.proxy, running_rules, running_guard, mounts_guard, attrs_gateways(attrs),
                                host_gateway, why=why))
        line = endpoints_rules_line(self.proxy, running_rules, sorted(e.id for e in self._endpoints or []))
        if line:
            lines.append(line)
        if not daemon_locality(self.docker_host, self.environ)[0]:
            lines.append(mounts_line(self.proxy, [], len(mounts), why='the daemon is on another host, so its files '
                                                                      'are not readable here'))
        elif container is None or not mounts:
            lines.append(mounts_line(self.proxy, [], 0, why=why or 'the proxy mounts no file'))
        else:
            try:
                rc, out = dc.exec_in(container, _proxy.mounted_digests_cmd([dst for _src, dst in mounts]))
                inside = _proxy.parse_digests(out)
                stale = [src for src, _dst in _proxy.stale_mounts(dict(mounts=mounts), inside)]
                lines.append(mounts_line(self.proxy, stale, len(mounts)))
            except Exception as exc:
                lines.append(mounts_line(self.proxy, [], len(mounts), why=' '.join(str(exc).split())))
        return lines

    # --- squid inside the proxy ----------------------------------------------------------------
    def squid_installed(self):
        """(version, None) or (None, why): dpkg's squid version inside the running proxy (an exec, no shell)."""
        try:
            rc, out = dc.exec_in(self.client.containers.get(self.proxy),
                                 ['dpkg-query', '-W', '-f=${Version}', 'squid'])
        except dc.EngineError as exc:
            return None, ' '.join(str(exc).split())
        except Exception as exc:
            return None, ' '.join(dc.api_message(exc).split())
        if rc != 0 or not out.strip():
            return None, 'dpkg-query -W squid exited %s%s' % (rc, (': ' + ' '.join(out.split())[:200]) if out else '')
        return out.strip(), None

    def _labelled_upstream(self, name):
        try:
            labels = (self.client.api.inspect_network(name) or {}).get('Labels') or {}
        except Exception:
            return False
        return labels.get('io.pi-dispatch.egress.network') == 'upstream'

    def squid_candidate_version(self, attrs):
        """(candidate, None) or (None, why): apt's candidate in a throwaway container of the proxy's image.

        The container runs as root (apt-get update writes its lists) with every
        capability dropped, on the proxy's upstream network, so it asks the
        mirror the way the proxy's own traffic leaves; bounded by
        SQUID_CANDIDATE_TIMEOUT, then removed. On an ``--internal`` upstream (the
        tests) nothing answers and the why says so.
        """
        if not self.squid_candidate:
            return None, 'the mirror check is switched off'
        networks = list(((attrs.get('NetworkSettings') or {}).get('Networks') or {}).keys())
        net = upstream_network(networks, self._labelled_upstream)
        if net is None:
            return None, 'the proxy is on no upstream network'
        image = attrs.get('Image') or (attrs.get('Config') or {}).get('Image')
        # Not in self._launched: the canary's teardown must not remove it while it runs. This method
        # removes it; a killed run's is swept with that run's canary network (its name carries the pid).
        name = probe_name('squid', self.pid)
        api = self.client.api
        started = time.monotonic()
        try:
            try:
                created = api.create_container(
                    image, ['sh', '-c', candidate_script()], name=name, detach=True, user='root',
                    labels={LABEL: str(self.pid)}, entrypoint=[],
                    host_config=api.create_host_config(network_mode=net, security_opt=['no-new-privileges:true'],
                                                       cap_drop=['ALL']))
                api.start(created['Id'])
            except Exception as exc:
                return None, 'the throwaway container could not start on %s: %s' % (net, dc.api_message(exc))
            wait = SQUID_CANDIDATE_TIMEOUT + self.start_grace + 10
            try:
                api.wait(created['Id'], timeout=wait)
            except Exception:
                return None, 'the throwaway container did not finish within %ss' % wait
            try:
                logs = api.logs(created['Id'], stdout=True, stderr=True)
            except Exception as exc:
                return None, 'the throwaway container\'s output could not be read: %s' % dc.api_message(exc)
            text = logs.decode('utf-8', 'replace') if isinstance(logs, bytes) else str(logs)
            candidate, why = parse_candidate_output(text)
            return candidate, (None if why is None else '%s, from a throwaway container on %s' % (why, net))
        finally:
            self.timings['squid'] = time.monotonic() - started
            try:
                api.remove_container(name, force=True)
            except Exception:  # not found, or the teardown/sweep reports it
                pass

    def squid_lines(self, attrs):
        installed, installed_why = self.squid_installed()
        candidate, candidate_why = (None, 'the installed version is unknown')
        if installed is not None:
            try:
                candidate, candidate_why = self.squid_candidate_version(attrs)
            except Exception as exc:  # a daemon surprise is a line, never a dead thread
                candidate, candidate_why = None, 'the mirror check failed: %s' % ' '.join(str(exc).split())
        return squid_lines(self.proxy, installed, installed_why, candidate, candidate_why)

    # --- canary --------------------------------------------------------------------------------
    def _targets(self):
        return dict(
            provider='https://%s/' % self.provider_host,
            deny='https://%s/' % self.deny_host,
            plain='http://%s:443/' % self.listed_host,
        )

    def _probe_env(self):
        proxy_url = 'http://%s:%d' % (self.proxy, _rules.PROXY_PORT)
        # What a job gets (docs/job-networks.md): uppercase proxy variables only.
        return proxy_url, {'HTTPS_PROXY': proxy_url, 'HTTP_PROXY': proxy_url, 'NO_PROXY': 'localhost,127.0.0.1,::1',
                           'NODE_USE_ENV_PROXY': '1', 'HOME': '/tmp'}

    def _run_container(self, key, name, script, net, results, wait, address=None):
        """Run one probe container to its end; results[key] = (output text, None) or (None, why)."""
        _proxy_url, env = self._probe_env()
        api = self.client.api
        started = time.monotonic()
        with self._lock:
            self._launched.append(name)
        try:
            try:
                endpoint = api.create_endpoint_config(ipv4_address=address) if address else \
                    api.create_endpoint_config()
                created = api.create_container(
                    self.probe_image, ['sh', '-c', script], name=name, detach=True, environment=env,
                    labels={LABEL: str(self.pid)},
                    host_config=api.create_host_config(network_mode=net, security_opt=['no-new-privileges:true'],
                                                       cap_drop=['ALL']),
                    networking_config=api.create_networking_config({net: endpoint}))
                api.start(created['Id'])
            except Exception as exc:
                results[key] = (None, 'the container could not start: %s' % dc.api_message(exc))
                return
            try:
                api.wait(created['Id'], timeout=wait)
            except Exception:
                results[key] = (None, 'it did not finish within %ss' % wait)
                return
            logs = api.logs(created['Id'], stdout=True, stderr=True)
            text = logs.decode('utf-8', 'replace') if isinstance(logs, bytes) else str(logs)
            results[key] = (text, None)
        finally:
            self.timings[key] = time.monotonic() - started

    def _run_probe(self, probe, url, net, results, timeout=None, tunnel=False, name=None):
        timeout = self.probe_timeout if timeout is None else timeout
        proxy_url, _env = self._probe_env()
        raw = {}
        self._run_container(probe, name or probe_name(probe, self.pid),
                            probe_script(url, proxy_url, timeout, tunnel=tunnel), net, raw,
                            timeout + self.start_grace)
        text, why = raw.get(probe, (None, 'it did not finish'))
        if text is None:
            results[probe] = (None, why)
            return
        parsed = parse_probe_output(text)
        results[probe] = (parsed, None if parsed else 'the probe image printed no curl result (%s)'
                          % (' '.join(text.split())[-200:] or 'no output; does it have sh and curl?'))

    def _classify(self, results):
        lines = []
        for probe, fn, host in (('provider', classify_provider, self.provider_host),
                                ('deny', classify_deny, self.deny_host),
                                ('plain', classify_plain, self.listed_host)):
            parsed, why = results.get(probe, (None, 'it did not finish within %ss' % (
                self.probe_timeout + self.start_grace + 15)))
            lines.append(fn(host, parsed, why_not=why))
        return lines

    def load_endpoints(self):
        """The declared endpoints (cached); None with ``_endpoints_error`` set when the declaration is refused."""
        if self._endpoints is not None or self._endpoints_error is not None:
            return self._endpoints
        from ansible_collections.pi_dispatch.egress.plugins.module_utils import _endpoints
        try:
            self._endpoints = list(_endpoints.load(self.deploy_dir)[0])
        except Exception as exc:  # EndpointsError names the file, the key and the fix
            self._endpoints_error = ' '.join(str(exc).split())
        return self._endpoints

    def _endpoint_jobs(self):
        """(key, endpoint, kind, url, tunnel) for every endpoint probe to run."""
        jobs = []
        for endpoint in sorted(self.load_endpoints() or [], key=lambda e: e.id):
            for kind, url, tunnel in endpoint_targets(endpoint, self._endpoints):
                jobs.append(('endpoint-%s-%s' % (kind, endpoint.id), endpoint, kind, url, tunnel))
        return jobs

    def _classify_endpoints(self, jobs, results):
        lines = []
        wait = self.endpoint_timeout + self.start_grace + 15
        for key, endpoint, kind, url, _tunnel in jobs:
            parsed, why = results.get(key, (None, 'it did not finish within %ss' % wait))
            if kind == 'tunnel':
                lines.append(classify_endpoint_tunnel(endpoint, parsed, self.endpoint_timeout, why_not=why))
            elif kind == 'port':
                lines.append(classify_endpoint_port(endpoint, url, parsed, why_not=why))
            else:
                lines.append(classify_endpoint_plain(endpoint, parsed, why_not=why))
        for line in lines:
            if line.fix and '<proxy>' in line.fix:
                line.fix = line.fix.replace('<proxy>', self.proxy)
        return lines

    def canary(self):
        """Create the throwaway network, run every probe concurrently, tear down (always).

        Returns (canary lines, endpoint lines, isolation lines).
        """
        net = network_name(self.pid)
        jobs = self._endpoint_jobs()

        def unprobed(why):
            return [endpoint_notrun_line(endpoint, ENDPOINT_PROBE_LABELS[kind], why)
                    for _key, endpoint, kind, _url, _t in jobs]

        try:
            if dc.get_image(self.client, self.probe_image) is None:
                why = 'the probe image %s is not on this daemon' % self.probe_image
                return ([Line('canary.setup', 'notrun',
                              'Egress canary could not be set up (%s), so no probe ran' % why,
                              fix='build the probe image like a job image (it needs sh and curl) and set '
                                  'doctor_probe_image')],
                        unprobed(why), self._isolation_skipped(why))
        except dc.EngineError as exc:
            return ([Line('canary.setup', 'notrun', 'Egress canary could not be set up (%s), so no probe ran' % exc)],
                    unprobed(str(exc)), self._isolation_skipped(str(exc)))
        results = {}
        lines, endpoint_lines, isolation_lines = [], [], []
        created = False
        iso_thread = None
        iso_out = []
        try:
            if self.isolation_enabled:
                iso_thread = threading.Thread(target=lambda: iso_out.extend(self.isolation()))
                iso_thread.daemon = True
                iso_thread.start()
            try:
                self.client.api.create_network(net, driver='bridge', internal=True, labels={LABEL: str(self.pid)})
                created = True
                self.client.api.connect_container_to_network(self.proxy, net)
            except Exception as exc:
                why = '%s %s: %s' % ('attaching the proxy to' if created else 'creating', net, dc.api_message(exc))
                lines.append(Line('canary.setup', 'notrun', 'Egress canary could not be set up (%s), so no '
                                                            'probe ran' % why,
                                  fix='docker network ls --filter name=%s; docker inspect %s'
                                      % (NETWORK_PREFIX, self.proxy)))
                endpoint_lines = unprobed(why)
                jobs = None
            threads = []
            for probe, url in (sorted(self._targets().items()) if jobs is not None else ()):
                threads.append(threading.Thread(target=self._run_probe, args=(probe, url, net, results)))
            for key, endpoint, kind, url, tunnel in (jobs or ()):
                if url is None:
                    continue
                name = endpoint_probe_name(kind, endpoint.id, self.pid)
                threads.append(threading.Thread(target=self._run_probe, args=(key, url, net, results),
                                                kwargs=dict(timeout=self.endpoint_timeout, tunnel=tunnel,
                                                            name=name)))
            for thread in threads:
                thread.daemon = True
                thread.start()
            longest = max([self.probe_timeout] + ([self.endpoint_timeout] if jobs else []))
            deadline = time.monotonic() + longest + self.start_grace + 15
            for thread in threads:
                thread.join(max(0.0, deadline - time.monotonic()))
            if jobs is not None:
                lines.extend(self._classify(results))
                endpoint_lines = self._classify_endpoints(jobs, results)
        finally:
            if iso_thread is not None:
                iso_thread.join(ISOLATION_CONNECT_TIMEOUT * 2 + self.start_grace + 60)
                isolation_lines = list(iso_out) or [Line('isolation.notrun', 'notrun',
                                                         'Job-to-job isolation was not checked (it did not finish)')]
            elif not self.isolation_enabled:
                isolation_lines = self._isolation_skipped('doctor_isolation is false')
            lines.extend(self.teardown(net, created))
        return lines, endpoint_lines, isolation_lines

    def _isolation_skipped(self, why):
        return [Line('isolation.notrun', 'notrun', 'Job-to-job isolation was not checked (%s)' % why)]

    def isolation(self):
        """Two peers on two real job networks: each must reach the proxy and not the other."""
        made, lines = [], []
        local = daemon_locality(self.docker_host, self.environ)[0]
        try:
            nets = {}
            try:
                for peer in PEERS:
                    nets[peer] = _jobnet.create_job_network(
                        self.client, isolation_job_id(self.pid, peer), proxy_name=self.proxy, pool=self.job_pool,
                        prefix=self.job_prefix, routes=None if local else [])
                    made.append(peer)
                proxy_ips = {}
                for peer in PEERS:
                    attrs = self.client.api.inspect_network(nets[peer].network)
                    ours = [c for c in (attrs.get('Containers') or {}).values() if c.get('Name') == self.proxy]
                    proxy_ips[peer] = (ours[0].get('IPv4Address') or '').split('/')[0] if ours else ''
                    if not proxy_ips[peer]:
                        raise dc.EngineError('the proxy has no address on %s' % nets[peer].network)
            except Exception as exc:
                return [Line('isolation.notrun', 'notrun', 'Job-to-job isolation was not checked (setting up the '
                             'job networks failed: %s)' % ' '.join(str(exc).split()),
                             fix='ansible-playbook pi_dispatch.egress.gc, then re-run doctor')]
            addresses = dict((peer, peer_address(nets[peer].subnet, peer)) for peer in PEERS)
            port = _rules.PROXY_PORT
            specs = []
            for peer, other in (('a', 'b'), ('b', 'a')):
                targets = dict(proxy='http://%s:%d/' % (self.proxy, port),
                               peer_name='http://%s:%d/' % (peer_name(other, self.pid), port),
                               peer_address='http://%s:%d/' % (addresses[other], port),
                               proxy_other='http://%s:%d/' % (proxy_ips[other], port))
                specs.append(dict(peer=peer_name(peer, self.pid), net=nets[peer].network,
                                  other=peer_name(other, self.pid), targets=targets, address=addresses[peer],
                                  key='peer-%s' % peer))
            raw = {}
            wait = ISOLATION_CONNECT_TIMEOUT + 2 + 2 + self.start_grace
            threads = [threading.Thread(target=self._run_container,
                                        args=(spec['key'], spec['peer'], isolation_script(spec['targets']),
                                              spec['net'], raw, wait),
                                        kwargs=dict(address=spec['address'])) for spec in specs]
            for thread in threads:
                thread.daemon = True
                thread.start()
            for thread in threads:
                thread.join(wait + 15)
            for spec in specs:
                text, why = raw.get(spec['key'], (None, 'it did not finish within %ss' % wait))
                spec['result'] = parse_isolation_output(text) if text is not None else None
                spec['why'] = why if text is None else (None if spec['result'] else
                                                        'it printed no result (%s)' % ' '.join(text.split())[-200:])
            lines.append(classify_isolation(specs))
            return lines
        finally:
            lines.extend(self._isolation_teardown(made))

    def _isolation_teardown(self, made):
        """Every peer first (a peer may sit on either network), then the job networks."""
        lines = []
        stuck = {}
        for peer in PEERS:
            name = peer_name(peer, self.pid)
            try:
                self.client.api.remove_container(name, force=True)
            except Exception as exc:
                if not dc.is_not_found(exc):
                    stuck[peer] = (name, dc.api_message(exc))
        for peer in made:
            net = isolation_network_name(self.pid, peer)
            if peer in stuck:
                name, why = stuck[peer]
                lines.append(Line('isolation.cleanup', 'warn', 'Job-to-job isolation: %s could not be torn down '
                                  '(the peer %s would not go: %s)' % (net, name, why),
                                  fix='docker rm -f %s; the next doctor run sweeps %s' % (name, net)))
                continue
            try:
                _jobnet.teardown_job_network(self.client, isolation_job_id(self.pid, peer), proxy_name=self.proxy)
            except Exception as exc:
                lines.append(Line('isolation.cleanup', 'warn', 'Job-to-job isolation: %s could not be torn down (%s)'
                                  % (net, ' '.join(str(exc).split())),
                                  fix='docker network inspect %s, then docker network rm %s' % (net, net)))
        return lines

    def overlay(self):
        """The overlay models.json and allowlist lines (files only, no daemon)."""
        from ansible_collections.pi_dispatch.egress.plugins.module_utils import _allowlist
        from ansible_collections.pi_dispatch.egress.plugins.module_utils import _models_json
        path = _deployment.paths(self.deploy_dir)['allowlist']
        entries, problem = None, None
        try:
            with open(path, 'r') as handle:
                parsed = _allowlist.parse(handle.read(), path)
            if parsed.errors:
                problem = '%s could not be checked (%s)' % (path, ' '.join(str(parsed.errors[0]).split()))
            else:
                entries = [entry for _lineno, entry in parsed.entries]
        except (IOError, OSError, UnicodeDecodeError) as exc:
            problem = '%s could not be checked (%s)' % (path, getattr(exc, 'strerror', None) or exc)
        suffix_lines = []
        try:
            with open(path, 'r') as handle:
                suffix_lines = public_suffix_lines(path, handle.read(), public_suffix_checker())
        except (IOError, OSError, UnicodeDecodeError):
            pass  # the line above already says the allowlist could not be read
        text, read_problem = (None, None)
        if self.models_json:
            text, read_problem = _models_json.read_text(self.models_json)
        lines = overlay_lines(self.models_json, text, read_problem, self.load_endpoints() or [], entries, problem)
        at = len([line for line in lines if line.id.startswith('overlay.allowlist')])
        return lines[:at] + suffix_lines + lines[at:]

    def teardown(self, net, created):
        """Remove this run's probes and network; a line for anything that would not go."""
        lines = []
        stuck = None
        peers = set(peer_name(peer, self.pid) for peer in PEERS)  # the isolation check removes its own
        with self._lock:
            names = [probe_name(probe, self.pid) for probe in PROBES] + \
                [name for name in self._launched if name not in peers]
        for name in sorted(set(names)):
            try:
                self.client.api.remove_container(name, force=True)
            except Exception as exc:
                if not dc.is_not_found(exc):
                    stuck = stuck or name
        if not created:
            return lines
        if stuck:
            lines.append(Line('canary.cleanup_kept', 'warn',
                              'Egress canary: %s is kept, because the probe %s could not be removed and the network '
                              'is the only way left to find it: docker rm -f %s' % (net, stuck, stuck),
                              fix='docker rm -f %s, then re-run doctor' % stuck))
            return lines
        try:
            self.client.api.disconnect_container_from_network(self.proxy, net, force=True)
        except Exception:  # the removal below reports what matters
            pass
        try:
            self.client.api.remove_network(net)
        except Exception as exc:
            if not dc.is_not_found(exc):
                lines.append(Line('canary.cleanup_rm', 'warn',
                                  'Egress canary: the network %s could not be removed: docker network rm %s (%s)'
                                  % (net, net, dc.api_message(exc)),
                                  fix='docker network inspect %s, remove what is on it, then docker network rm %s'
                                      % (net, net)))
        return lines

    # --- everything ------------------------------------------------------------------------------
    def run(self):
        started = time.monotonic()
        lines = []
        attrs = self.proxy_attrs()
        lines.extend(proxy_lines(self.proxy, attrs))
        lines.append(self.rules_line())
        leftovers = self.sweep()
        running = attrs is not None and (attrs.get('State') or {}).get('Running') and \
            not (attrs.get('State') or {}).get('Paused')
        self.load_endpoints()
        if running:
            squid_out = []
            squid_thread = threading.Thread(target=lambda: squid_out.extend(self.squid_lines(attrs)))
            squid_thread.daemon = True
            squid_thread.start()
            lines.extend(self.guard_lines(attrs))
            lines.extend(self.include_lines(attrs))
            canary, endpoint_lines, isolation_lines = self.canary()
            squid_thread.join(SQUID_CANDIDATE_TIMEOUT + self.start_grace + 30)
            lines.extend(squid_out or [Line('proxy.squid_unread', 'warn',
                                            'Egress proxy squid: the package version inside %s could not be read '
                                            '(the check did not finish)' % self.proxy,
                                            fix='docker exec %s dpkg-query -W squid' % self.proxy)])
            lines.extend(canary)
            lines.extend(endpoint_lines)
        else:
            for probe in PROBES:
                lines.append(notrun_line(probe, 'the proxy is not running'))
            for endpoint in sorted(self._endpoints or [], key=lambda e: e.id):
                for kind in ENDPOINT_PROBES:
                    lines.append(endpoint_notrun_line(endpoint, ENDPOINT_PROBE_LABELS[kind],
                                                      'the proxy is not running'))
            isolation_lines = self._isolation_skipped('the proxy is not running')
        lines.extend(self.overlay())
        lines.extend(isolation_lines)
        from ansible_collections.pi_dispatch.egress.plugins.module_utils import _doctor_firewall
        lines.extend(_doctor_firewall.lines_for(self, getattr(self, 'firewall', None)))
        lines.extend(leftovers)
        self.timings['total'] = time.monotonic() - started
        return lines
