"""Doctor as a composer: the checks run in report order over one context, and a failing check's line."""

import os
import threading

import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import docker_client as dc
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import canary as _doctor_canary
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import context as _doctor_context
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import doctor as _doctor
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import lines as _doctor_lines
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor import squid as _doctor_squid
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import decisions as _decisions

Line = _doctor_lines.Line
RUNNING = {'State': {'Running': True}}
STOPPED = {'State': {'Running': False, 'Status': 'exited'}}
# The report order of a running proxy, one line per check (the isolation line comes from the canary).
REPORT = ['probe_image', 'proxy', 'shards', 'rules', 'guard', 'include', 'squid', 'canary', 'route', 'overlay',
          'mcp', 'decisions',
          'isolation', 'firewall', 'transparent', 'credentials', 'forge', 'sweep']


class Recorder(object):
    def __init__(self):
        self.calls = []
        self.contexts = set()
        self.lock = threading.Lock()


class Fake(_doctor_context.Check):
    """A check that records its call and returns one line named for it."""

    def __init__(self, name, recorder, effect=None):
        self.name, self.recorder, self.effect = name, recorder, effect

    def lines(self, ctx):
        with self.recorder.lock:
            self.recorder.calls.append(self.name)
            self.recorder.contexts.add(id(ctx))
        if self.effect is not None:
            self.effect(ctx)
        return [Line('canary.notrun', 'notrun', self.name)]


RUNNING_PROXY = object()  # the default of fakes(): a running proxy (None is a missing one)


def fakes(recorder, attrs=RUNNING_PROXY, **effects):
    def set_attrs(ctx):
        ctx.attrs = RUNNING if attrs is RUNNING_PROXY else attrs

    def set_isolation(ctx):
        ctx.isolation_lines = [Line('isolation.notrun', 'notrun', 'isolation')]
    effects.setdefault('proxy', set_attrs)
    effects.setdefault('canary', set_isolation)
    names = ['probe_image', 'proxy', 'shards', 'rules', 'sweep', 'guard', 'include', 'squid', 'canary', 'isolation',
             'overlay', 'decisions', 'firewall', 'transparent', 'credentials', 'forge', 'route', 'mcp']
    return dict((name, Fake(name, recorder, effects.get(name))) for name in names)


def doctor(checks):
    return _doctor.Doctor(object(), _doctor.DoctorOptions('p', '/nonexistent', 'img', pid=7, environ={}),
                          checks=checks)


def test_the_default_checks_are_every_group():
    checks = _doctor.default_checks()
    assert sorted(checks) == sorted(['probe_image', 'proxy', 'shards', 'rules', 'sweep', 'guard', 'include', 'squid',
                                     'canary', 'isolation', 'overlay', 'decisions', 'firewall', 'transparent',
                                     'credentials', 'openshell', 'forge', 'route', 'mcp'])
    assert all(isinstance(check, _doctor_context.Check) for check in checks.values())
    assert checks['canary'].isolation is checks['isolation']  # the canary runs the isolation check beside it


def test_a_running_proxy_runs_every_check_in_order_over_one_context():
    recorder = Recorder()
    doc = doctor(fakes(recorder))
    lines = doc.run()
    assert [line.message for line in lines] == REPORT
    # The sweep runs before anything is made and is reported last; squid runs beside guard, include
    # and the canary (in a thread), so only its place among the others is fixed. The checks of
    # BESIDE_CANARY run while the canary runs (issue 43): their report order is fixed, not their calls.
    calls = [name for name in recorder.calls if name != 'squid']
    assert calls[:6] == ['probe_image', 'proxy', 'shards', 'rules', 'sweep', 'guard']
    assert sorted(calls[6:-2]) == sorted(['include', 'canary', 'route', 'overlay', 'mcp', 'transparent',
                                          'credentials', 'forge'])
    assert calls[-2:] == ['decisions', 'firewall']
    assert 'squid' in recorder.calls and 'isolation' not in recorder.calls  # the canary's to run
    assert recorder.contexts == {id(doc.ctx)}
    assert 'total' in doc.timings and doc.actions == [] and doc.pid == 7


@pytest.mark.parametrize('attrs', [None, STOPPED, {'State': {'Running': True, 'Paused': True}}])
def test_a_proxy_that_does_not_run_skips_the_checks_inside_it(attrs):
    recorder = Recorder()
    lines = doctor(fakes(recorder, attrs=attrs)).run()
    assert [line.message for line in lines] == [name for name in REPORT if name not in ('guard', 'include', 'squid')]
    assert not set(recorder.calls) & {'guard', 'include', 'squid'}


@pytest.mark.filterwarnings('ignore::pytest.PytestUnhandledThreadExceptionWarning')
def test_a_squid_check_that_raises_is_the_line_of_one_that_did_not_finish():
    def boom(ctx):
        raise RuntimeError('daemon surprise')
    lines = doctor(fakes(Recorder(), squid=boom)).run()
    squid = [line for line in lines if line.id.startswith('proxy.squid')]
    assert [(line.id, line.status) for line in squid] == [('proxy.squid_unread', 'warn')]
    assert squid[0].message == ('Egress proxy squid: the package version inside p could not be read (the check did '
                                'not finish)')
    assert squid[0].fix == 'docker exec p dpkg-query -W squid-common'
    assert lines.index(squid[0]) == REPORT.index('squid')  # in the squid check's place


def test_a_proxy_check_that_raises_fails_the_run():
    def boom(ctx):
        raise dc.EngineError('Inspecting container p failed: 500')
    with pytest.raises(dc.EngineError):
        doctor(fakes(Recorder(), proxy=boom)).run()


@pytest.mark.filterwarnings('ignore::pytest.PytestUnhandledThreadExceptionWarning')
def test_an_isolation_check_that_raises_is_the_line_of_one_that_did_not_finish(monkeypatch):
    class Boom(_doctor_context.Check):
        def lines(self, ctx):
            raise RuntimeError('daemon surprise')

    monkeypatch.setattr(dc, 'get_image', lambda client, name: object())
    monkeypatch.setattr(_doctor_canary, 'setup_lanes', lambda ctx, shards: ([], lambda: None))

    class API(object):
        def __getattr__(self, name):
            def call(*args, **kwargs):
                raise RuntimeError('no engine here')
            return call

    class Client(object):
        api = API()

    options = _doctor.DoctorOptions('p', '/nonexistent', 'img', pid=7, environ={}, start_grace=0)
    ctx = _doctor_context.DoctorContext.build(Client(), options)
    ctx.attrs = RUNNING
    lines = _doctor_canary.CanaryCheck(Boom()).lines(ctx)
    assert [line.id for line in lines] == ['canary.setup']  # creating the network failed: no engine
    assert [(line.id, line.status, line.message) for line in ctx.isolation_lines] == [
        ('isolation.notrun', 'notrun', 'Job-to-job isolation was not checked (it did not finish)')]


def test_the_context_takes_the_options_as_the_doctor_did():
    options = _doctor.DoctorOptions('p', '/d', 'img', provider_host='api.x.test', probe_timeout='3', pid='12',
                                    environ={'A': '1'}, models_json='', isolation=0, sweep=0, job_prefix='28')
    ctx = _doctor_context.DoctorContext.build('client', options)
    assert (ctx.client, ctx.proxy, ctx.deploy_dir, ctx.probe_image) == ('client', 'p', '/d', 'img')
    assert ctx.listed_host == 'api.x.test' and ctx.probe_timeout == 3 and ctx.pid == 12
    assert ctx.environ == {'A': '1'} and ctx.models_json is None
    assert (ctx.isolation_enabled, ctx.sweep_enabled, ctx.squid_candidate, ctx.job_prefix) == (False, False, True, 28)
    assert ctx.decision_log_dir == os.path.join('/d', _decisions.DEFAULT_FOLDER)
    assert ctx.attrs is None and ctx.family == [] and ctx.isolation_lines == [] and ctx.launched == []
    default = _doctor_context.DoctorContext.build(None, _doctor.DoctorOptions('p', '/d', 'img'))
    assert default.pid == os.getpid() and default.environ is os.environ


def test_the_declared_endpoints_are_read_once(monkeypatch):
    reads = []
    monkeypatch.setattr(_doctor_context._endpoints, 'load', lambda folder: reads.append(folder) or (['e'], 'p', True))
    ctx = _doctor_context.DoctorContext.build(None, _doctor.DoctorOptions('p', '/d', 'img'))
    assert ctx.declared_endpoints() == ['e'] and ctx.declared_endpoints() == ['e'] and reads == ['/d']


def test_a_refused_declaration_is_remembered(monkeypatch):
    def refuse(folder):
        raise ValueError('model-endpoints.json: bad  key')
    monkeypatch.setattr(_doctor_context._endpoints, 'load', refuse)
    ctx = _doctor_context.DoctorContext.build(None, _doctor.DoctorOptions('p', '/d', 'img'))
    assert ctx.declared_endpoints() is None and ctx.endpoints_error == 'model-endpoints.json: bad key'


def test_the_squid_unfinished_line_is_in_the_catalogue():
    line = _doctor_squid.squid_unfinished_line('p')
    assert line.id in _doctor_lines._BY_ID and line.group == 'proxy'
