"""egress_credentials without a daemon: the allowlist check, the paths, the interceptor's wanted shape, and
the declaration step (_proxy/credentials_apply.py with inspect_only)."""
import json
import os
import stat

import pytest

docker = pytest.importorskip('docker')

from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import credentials as _credentials
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import credentials_apply as _apply
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import interceptor as _interceptor

SECRET = 'S3cretValue-do-not-leak_42'
ALLOWLIST_PATH = '/d/egress-allowlist.conf'

ALLOWLIST = """\
# pi-dispatch egress allowlist
# comment.example.net is only a comment
api.anthropic.com
.github.com      # the forge and every subdomain

   # an indented comment: ignored.example.net
.Example.ORG
registry.npmjs.org\t# a tab before the comment

"""

# (id, allowlist text, host, listed)
LISTED = [
    ('exact entry', ALLOWLIST, 'api.anthropic.com', True),
    ('exact entry does not cover a subdomain', ALLOWLIST, 'eu.api.anthropic.com', False),
    ('exact entry does not cover its parent', ALLOWLIST, 'anthropic.com', False),
    ('leading dot covers the apex', ALLOWLIST, 'github.com', True),
    ('leading dot covers a subdomain', ALLOWLIST, 'api.github.com', True),
    ('leading dot covers a deep subdomain', ALLOWLIST, 'a.b.c.github.com', True),
    ('suffix without a label boundary', ALLOWLIST, 'evilgithub.com', False),
    ('entry as a prefix of another name', ALLOWLIST, 'github.com.evil.net', False),
    ('shorter name inside the entry', ALLOWLIST, 'hub.com', False),
    ('uppercase entry lowercased, apex', ALLOWLIST, 'example.org', True),
    ('uppercase entry lowercased, subdomain', ALLOWLIST, 'www.example.org', True),
    ('not a label boundary under the uppercase entry', ALLOWLIST, 'badexample.org', False),
    ('entry with a trailing tab comment', ALLOWLIST, 'registry.npmjs.org', True),
    ('name in a whole-line comment', ALLOWLIST, 'comment.example.net', False),
    ('name in an indented comment', ALLOWLIST, 'ignored.example.net', False),
    ('unlisted host', ALLOWLIST, 'api.openai.com', False),
    ('empty allowlist', '', 'github.com', False),
    ('comments and blank lines only', '# github.com\n\n   \n# .github.com\n', 'github.com', False),
    ('refused line is not listed', 'https://api.openai.com/\n.github.com\n', 'api.openai.com', False),
    ('CRLF line ends', 'api.anthropic.com\r\n.github.com\r\n', 'api.github.com', True),
]


@pytest.mark.parametrize('name,text,host,listed', LISTED, ids=[row[0] for row in LISTED])
def test_listed_by(name, text, host, listed):
    assert _apply.listed_by(text, ALLOWLIST_PATH)(host) is listed


def test_listed_by_table_size():
    assert len(LISTED) >= 12


# --- paths() --------------------------------------------------------------------

def test_paths(tmp_path):
    deploy = str(tmp_path)
    got = _apply.paths(deploy)
    assert got == dict(
        declaration=os.path.join(deploy, 'egress-credentials.json'),
        folder=os.path.join(deploy, 'credentials'),
        conf=os.path.join(deploy, 'credentials', 'conf'),
        config=os.path.join(deploy, 'credentials', 'conf', 'credentials.json'),
        upstream_ca=os.path.join(deploy, 'credentials', 'conf', 'upstream-ca.pem'),
        jobs=os.path.join(deploy, 'credentials', 'jobs'),
        ca=os.path.join(deploy, 'credentials', 'ca'),
        ca_cert=os.path.join(deploy, 'credentials', 'ca', 'mitmproxy-ca-cert.pem'),
        include=os.path.join(deploy, 'egress-credentials.conf'),
        allowlist=os.path.join(deploy, 'egress-allowlist.conf'))
    for path in got.values():
        assert path.startswith(deploy + os.sep)
        assert os.path.normpath(path) == path


def test_paths_agree_with_the_job_side(tmp_path):
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets import credentials as _jobcreds
    got = _apply.paths(str(tmp_path))
    assert got['jobs'] == _jobcreds.jobs_dir(str(tmp_path))
    assert got['ca_cert'] == os.path.join(str(tmp_path), _jobcreds.FOLDER, _jobcreds.CA_FILE)


# --- differences() --------------------------------------------------------------

IMAGE = 'pi-dispatch-egress-interceptor:latest'
IMAGE_ID = 'sha256:' + 'a' * 64
UPSTREAM = 'http://pi-dispatch-egress-proxy:%d' % _interceptor.RETURN_PORT
SECRET_FILES = ['/etc/pi-dispatch/secrets/forge', '/etc/pi-dispatch/secrets/anthropic', '/srv/keys/openai']


def wanted(upstream_ca=False):
    return _interceptor.container_kwargs(IMAGE, '/d/credentials/conf', '/d/credentials/jobs', '/d/credentials/ca',
                                         SECRET_FILES, upstream=UPSTREAM, upstream_ca=upstream_ca)


def inspected(kwargs, image_id=IMAGE_ID):
    """What docker inspect says of a container made from ``kwargs`` (plus the image's own variables)."""
    mounts = [{'Type': 'bind', 'Source': src, 'Destination': bind['bind'], 'Mode': bind['mode'],
               'RW': bind['mode'] == 'rw', 'Propagation': 'rprivate'} for src, bind in kwargs['volumes'].items()]
    env = ['%s=%s' % item for item in kwargs['environment'].items()]
    env += ['PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin', 'LANG=C.UTF-8']
    return {'Image': image_id, 'Mounts': mounts,
            'Config': {'Env': env, 'Labels': dict(kwargs['labels'])}, 'State': {'Running': True},
            'HostConfig': {'Memory': kwargs['mem_limit'], 'MemorySwap': kwargs['memswap_limit'],
                           'PidsLimit': kwargs['pids_limit']}}


def _same(attrs):
    return attrs


def _image(attrs):
    attrs['Image'] = 'sha256:' + 'b' * 64
    return attrs


def _drop_mount(destination):
    def change(attrs):
        attrs['Mounts'] = [m for m in attrs['Mounts'] if m['Destination'] != destination]
        return attrs
    return change


def _rw(destination, rw):
    def change(attrs):
        for mount in attrs['Mounts']:
            if mount['Destination'] == destination:
                mount['RW'] = rw
        return attrs
    return change


def _extra_mount(attrs):
    attrs['Mounts'].append({'Source': '/var/lib/docker/volumes/x/_data', 'Destination': '/data', 'RW': True})
    return attrs


def _source(attrs):
    for mount in attrs['Mounts']:
        if mount['Destination'] == _interceptor.JOBS_DIR:
            mount['Source'] = '/elsewhere/jobs'
    return attrs


def _host(**values):
    def change(attrs):
        attrs['HostConfig'].update(values)
        return attrs
    return change


def _env(drop=(), add=()):
    def change(attrs):
        keep = [item for item in attrs['Config']['Env'] if item.split('=', 1)[0] not in drop]
        attrs['Config']['Env'] = keep + list(add)
        return attrs
    return change


FIRST_SECRET_FOLDER = _credentials.secret_folder_in_container('/etc/pi-dispatch/secrets')

# (id, upstream_ca wanted, change of the inspect dict, image id passed, fragment naming the difference or None)
DIFFERENCES = [
    ('same shape', False, _same, IMAGE_ID, None),
    ('same shape with upstream CA', True, _same, IMAGE_ID, None),
    ('no image id known', False, _image, None, None),
    ('env item without =', False, _env(add=['JUNK']), IMAGE_ID, None),
    ('another image', False, _image, IMAGE_ID, 'image %s was rebuilt' % IMAGE),
    ('config mount missing', False, _drop_mount(_interceptor.CONFIG_DIR), IMAGE_ID, _interceptor.CONFIG_DIR),
    ('secret folder mount missing', False, _drop_mount(FIRST_SECRET_FOLDER), IMAGE_ID, FIRST_SECRET_FOLDER),
    ('jobs mount read-write', False, _rw(_interceptor.JOBS_DIR, True), IMAGE_ID, _interceptor.JOBS_DIR + ':rw'),
    ('secret mount read-write', False, _rw(FIRST_SECRET_FOLDER, True), IMAGE_ID, FIRST_SECRET_FOLDER + ':rw'),
    ('CA mount read-only', False, _rw(_interceptor.CA_DIR, False), IMAGE_ID, _interceptor.CA_DIR + ':ro'),
    ('an extra mount', False, _extra_mount, IMAGE_ID, '/data'),
    ('a mount from another folder', False, _source, IMAGE_ID, '/elsewhere/jobs'),
    ('upstream changed', False, _env(drop=['PI_INTERCEPTOR_UPSTREAM'], add=['PI_INTERCEPTOR_UPSTREAM=http://x:1']),
     IMAGE_ID, 'PI_INTERCEPTOR_UPSTREAM=http://x:1, wanted %s' % UPSTREAM),
    ('upstream missing', False, _env(drop=['PI_INTERCEPTOR_UPSTREAM']), IMAGE_ID,
     'PI_INTERCEPTOR_UPSTREAM=None, wanted %s' % UPSTREAM),
    ('upstream CA extra', False, _env(add=['PI_INTERCEPTOR_UPSTREAM_CA=/etc/pi-interceptor/upstream-ca.pem']),
     IMAGE_ID, 'PI_INTERCEPTOR_UPSTREAM_CA set, wanted unset'),
    ('upstream CA missing', True, _env(drop=['PI_INTERCEPTOR_UPSTREAM_CA']), IMAGE_ID,
     'PI_INTERCEPTOR_UPSTREAM_CA=None, wanted /etc/pi-interceptor/upstream-ca.pem'),
    ('no memory limit (made before the bound)', False, _host(Memory=0), IMAGE_ID,
     'memory unbounded, wanted %d' % _interceptor.MEMORY),
    ('another memory limit', False, _host(Memory=512 * 1024 ** 2), IMAGE_ID, 'memory 536870912, wanted'),
    ('no pids limit', False, _host(PidsLimit=None), IMAGE_ID,
     'pids limit unbounded, wanted %d' % _interceptor.PIDS_LIMIT),
    ('upstream CA other path', True,
     _env(drop=['PI_INTERCEPTOR_UPSTREAM_CA'], add=['PI_INTERCEPTOR_UPSTREAM_CA=/tmp/ca.pem']), IMAGE_ID,
     'PI_INTERCEPTOR_UPSTREAM_CA=/tmp/ca.pem'),
]


@pytest.mark.parametrize('name,upstream_ca,change,image_id,fragment', DIFFERENCES, ids=[row[0] for row in DIFFERENCES])
def test_differences(name, upstream_ca, change, image_id, fragment):
    kwargs = wanted(upstream_ca)
    got = _apply.differences(kwargs, change(inspected(kwargs)), image_id)
    if fragment is None:
        assert got == []
    else:
        assert len(got) == 1, got
        assert fragment in got[0]


def test_differences_mount_message_shows_both_sides():
    kwargs = wanted()
    (only,) = _apply.differences(kwargs, _rw(_interceptor.CONFIG_DIR, True)(inspected(kwargs)), IMAGE_ID)
    assert only.startswith('mounts ')
    have, want = only[len('mounts '):].split(', wanted ')
    assert '/d/credentials/conf:%s:rw' % _interceptor.CONFIG_DIR in have
    assert '/d/credentials/conf:%s:ro' % _interceptor.CONFIG_DIR in want


def test_differences_mount_order_does_not_matter():
    kwargs = wanted()
    attrs = inspected(kwargs)
    attrs['Mounts'].reverse()
    assert _apply.differences(kwargs, attrs, IMAGE_ID) == []


def test_differences_several_at_once():
    kwargs = wanted()
    attrs = _env(drop=['PI_INTERCEPTOR_UPSTREAM'])(_drop_mount(_interceptor.CA_DIR)(_image(inspected(kwargs))))
    got = _apply.differences(kwargs, attrs, IMAGE_ID)
    assert len(got) == 3
    assert got[0].startswith('image ') and got[1].startswith('mounts ')
    assert got[2].startswith('PI_INTERCEPTOR_UPSTREAM=None')


def test_differences_empty_inspect():
    kwargs = wanted()
    got = _apply.differences(kwargs, {'Image': IMAGE_ID, 'Mounts': None, 'Config': {'Env': None}}, IMAGE_ID)
    words = [line.split(' ', 1)[0].split('=', 1)[0] for line in got]
    assert words == ['mounts', 'PI_INTERCEPTOR_UPSTREAM', 'memory', 'pids']


def test_differences_never_name_a_secret_file_content(tmp_path):
    secret = tmp_path / 'secrets' / 'forge'
    secret.parent.mkdir()
    secret.write_text(SECRET)
    kwargs = _interceptor.container_kwargs(IMAGE, '/c', '/j', '/a', [str(secret)], upstream=UPSTREAM)
    attrs = _drop_mount(_credentials.secret_folder_in_container(str(secret.parent)))(inspected(kwargs))
    (only,) = _apply.differences(kwargs, attrs, IMAGE_ID)
    assert str(secret.parent) in only and SECRET not in only


# --- CredentialsDeploy (inspect_only, no client) --------------------------------

DEPLOY_ALLOWLIST = 'api.anthropic.com\n.github.com\n'


@pytest.fixture
def deploy(tmp_path):
    folder = tmp_path / 'deploy'
    folder.mkdir()
    (folder / 'egress-allowlist.conf').write_text(DEPLOY_ALLOWLIST)
    return folder


def params(deploy_dir, **kw):
    base = dict(deploy_dir=str(deploy_dir), name=_interceptor.INTERCEPTOR_NAME, image=_interceptor.INTERCEPTOR_IMAGE,
                network=_interceptor.NETWORK, proxy_name='pi-dispatch-egress-proxy', upstream_ca=None,
                inspect_only=True)
    base.update(kw)
    return base


def write_secret(path, content=SECRET + '\n'):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)
    os.chmod(str(path), 0o600)
    return str(path)


def declare(deploy_dir, *items):
    text = json.dumps(dict(version=1, credentials=list(items)))
    (deploy_dir / _credentials.FILE_NAME).write_text(text)
    return text


def forge(deploy_dir, **kw):
    item = dict(name='forge', host='github.com', port=443, env='GH_TOKEN', scheme='basic',
                secret_file=write_secret(deploy_dir / 'secrets' / 'forge'))
    item.update(kw)
    return item


def anthropic(deploy_dir, **kw):
    item = dict(name='anthropic', host='api.anthropic.com', port=443, env='ANTHROPIC_API_KEY', scheme='header',
                header='X-Api-Key', secret_file=write_secret(deploy_dir / 'secrets' / 'anthropic'))
    item.update(kw)
    return item


def test_run_creates_the_empty_declaration(deploy):
    path = deploy / _credentials.FILE_NAME
    result = _apply.CredentialsDeploy(None, params(deploy)).run()
    assert path.read_text() == _credentials.EMPTY_DECLARATION
    assert stat.S_IMODE(os.lstat(str(path)).st_mode) == 0o644
    assert result['changed'] is True
    assert result['actions'] == ['create %s (empty: nothing declared)' % path]
    assert result['declared'] == []
    assert result['include'] is None and result['ca_cert'] is None and result['secret_problems'] == []
    assert sorted(os.listdir(str(deploy))) == ['egress-allowlist.conf', 'egress-credentials.json']


def test_run_check_mode_creates_nothing(deploy):
    path = deploy / _credentials.FILE_NAME
    result = _apply.CredentialsDeploy(None, params(deploy), check_mode=True).run()
    assert not os.path.lexists(str(path))
    assert result['changed'] is True
    assert result['actions'] == ['create %s (empty: nothing declared)' % path]
    assert sorted(os.listdir(str(deploy))) == ['egress-allowlist.conf']


def test_run_again_changes_nothing(deploy):
    _apply.CredentialsDeploy(None, params(deploy)).run()
    result = _apply.CredentialsDeploy(None, params(deploy)).run()
    assert result['changed'] is False and result['actions'] == [] and result['declared'] == []


def test_run_keeps_an_existing_declaration(deploy):
    text = declare(deploy, forge(deploy))
    result = _apply.CredentialsDeploy(None, params(deploy)).run()
    assert (deploy / _credentials.FILE_NAME).read_text() == text
    assert result['changed'] is False and result['actions'] == []


@pytest.mark.parametrize('host', ['api.openai.com', 'evilgithub.com', 'anthropic.com', 'eu.api.anthropic.com'])
def test_run_refuses_an_unlisted_host(deploy, host):
    text = declare(deploy, forge(deploy, host=host))
    with pytest.raises(_credentials.CredentialsError) as info:
        _apply.CredentialsDeploy(None, params(deploy)).run()
    assert host in str(info.value)
    assert 'is not listed in egress-allowlist.conf' in str(info.value)
    assert [(p.key, p.value) for p in info.value.problems] == [('host', host)]
    assert SECRET not in str(info.value)
    assert (deploy / _credentials.FILE_NAME).read_text() == text


def test_run_refuses_without_an_allowlist(tmp_path):
    with pytest.raises(OSError):
        _apply.CredentialsDeploy(None, params(tmp_path)).run()
    assert not os.path.exists(str(tmp_path / _credentials.FILE_NAME))


def test_run_reports_what_is_declared(deploy):
    declare(deploy, forge(deploy, host='api.github.com'), anthropic(deploy))
    result = _apply.CredentialsDeploy(None, params(deploy)).run()
    assert result['declared'] == [
        dict(name='anthropic', host='api.anthropic.com', port=443, env='ANTHROPIC_API_KEY', scheme='header',
             header='x-api-key'),
        dict(name='forge', host='api.github.com', port=443, env='GH_TOKEN', scheme='basic', header='authorization')]
    for item in result['declared']:
        assert sorted(item) == ['env', 'header', 'host', 'name', 'port', 'scheme']
    assert result['changed'] is False and result['actions'] == []
    assert 'secret' not in json.dumps(result['declared'])
    assert SECRET not in repr(result)
    assert not os.path.exists(str(deploy / 'credentials'))


def test_run_inspect_only_does_not_check_secrets(deploy):
    item = forge(deploy)
    os.chmod(item['secret_file'], 0o644)
    declare(deploy, item)
    result = _apply.CredentialsDeploy(None, params(deploy)).run()
    assert [d['name'] for d in result['declared']] == ['forge']
    assert result['secret_problems'] == []


# --- the consent rule and inspect_only's "work" (a fake engine: inspects and a shard listing) -----------------

class _API(object):
    def __init__(self, containers, image_id='sha256:new'):
        self.containers_by_name = containers
        self.image_id = image_id
        self.removed = []

    def inspect_container(self, name):
        if name not in self.containers_by_name:
            raise docker.errors.NotFound('No such container: %s' % name)
        return self.containers_by_name[name]

    def inspect_image(self, name):
        return {'Id': self.image_id}

    def containers(self, **_kwargs):
        return []

    def remove_container(self, name, force=False):
        self.removed.append(name)


class _Client(object):
    def __init__(self, containers, image_id='sha256:new'):
        self.api = _API(containers, image_id)


def _interceptor_attrs(running=True, image='sha256:old', ours=True):
    labels = {_interceptor.LABEL_ROLE: _interceptor.ROLE} if ours else {}
    return {'Name': '/' + _interceptor.INTERCEPTOR_NAME, 'Image': image, 'Mounts': [],
            'Config': {'Labels': labels, 'Env': []},
            'State': {'Running': running, 'Status': 'running' if running else 'exited'}}


def _proxy_attrs(job_networks, running=True):
    nets = dict((n, {}) for n in ['pi-dispatch-egress-out'] + list(job_networks))
    return {'Name': '/pi-dispatch-egress-proxy', 'Config': {'Labels': {}},
            'State': {'Running': running, 'Status': 'running' if running else 'exited'},
            'NetworkSettings': {'Networks': nets}}


CONSENT_CASES = [
    # id, declared, interceptor, proxy job networks, allow, refused?
    ('replace-under-jobs', True, _interceptor_attrs(), ['pi-job-a-net', 'pi-job-b-net'], False, True),
    ('replace-under-jobs-consented', True, _interceptor_attrs(), ['pi-job-a-net'], True, False),
    ('replace-no-jobs', True, _interceptor_attrs(), [], False, False),
    ('replace-stopped-interceptor', True, _interceptor_attrs(running=False), ['pi-job-a-net'], False, False),
    ('no-interceptor', True, None, ['pi-job-a-net'], False, False),
    ('remove-under-jobs', False, _interceptor_attrs(), ['pi-job-a-net'], False, True),
    ('remove-under-jobs-consented', False, _interceptor_attrs(), ['pi-job-a-net'], True, False),
    ('remove-not-ours', False, _interceptor_attrs(ours=False), ['pi-job-a-net'], False, False),
    ('proxy-stopped', True, _interceptor_attrs(), ['pi-job-a-net'], False, False),
]


@pytest.mark.parametrize('name,declared,interceptor,jobs,allow,refused', CONSENT_CASES,
                         ids=[c[0] for c in CONSENT_CASES])
def test_consent_rule(deploy, name, declared, interceptor, jobs, allow, refused):
    if declared:
        declare(deploy, anthropic(deploy))
    else:
        declare(deploy)
    containers = {'pi-dispatch-egress-proxy': _proxy_attrs(jobs, running=name != 'proxy-stopped')}
    if interceptor is not None:
        containers[_interceptor.INTERCEPTOR_NAME] = interceptor
    run = _apply.CredentialsDeploy(_Client(containers), params(deploy, inspect_only=False, allow_cut_jobs=allow))
    before = sorted(os.listdir(str(deploy)))
    if refused:
        with pytest.raises(_apply.CredentialsDeployError) as info:
            run._consent(run._declaration())
        message = str(info.value)
        assert message.startswith('Refused, nothing changed:') and 'egress_proxy_allow_cut_jobs' in message
        assert all(job in message for job in jobs) and 'pi-dispatch-egress-proxy' in message
        assert ('removal of' if not declared else 'replacement of') in message
        assert run.result['refused'] == message
        assert SECRET not in message
    else:
        run._consent(run._declaration())
        assert 'refused' not in run.result
    assert sorted(os.listdir(str(deploy))) == before  # the consent is asked before anything is written


def test_a_refused_run_writes_nothing(deploy):
    declare(deploy, anthropic(deploy))
    containers = {'pi-dispatch-egress-proxy': _proxy_attrs(['pi-job-a-net']),
                  _interceptor.INTERCEPTOR_NAME: _interceptor_attrs()}
    client = _Client(containers)
    with pytest.raises(_apply.CredentialsDeployError):
        _apply.CredentialsDeploy(client, params(deploy, inspect_only=False)).run()
    assert not os.path.exists(str(deploy / 'credentials')) and client.api.removed == []


@pytest.mark.parametrize('declared,config,include,work', [
    (False, False, False, False),
    (True, False, False, True),
    (False, True, False, True),
    (False, False, True, True),
], ids=['nothing', 'declared', 'config-left', 'include-left'])
def test_inspect_only_says_whether_there_is_work(deploy, declared, config, include, work):
    declare(deploy, *([anthropic(deploy)] if declared else []))
    if include:
        (deploy / 'egress-credentials.conf').write_text('# include\n')
    if config:
        (deploy / 'credentials' / 'conf').mkdir(parents=True)
        (deploy / 'credentials' / 'conf' / 'credentials.json').write_text('{}\n')
    result = _apply.CredentialsDeploy(None, params(deploy)).run()  # no daemon asked
    assert result['work'] is work and result['actions'] == []


def test_nothing_declared_removes_the_interceptor_then_its_files(deploy):
    declare(deploy)
    (deploy / 'egress-credentials.conf').write_text('# include\n')
    (deploy / 'credentials' / 'conf').mkdir(parents=True)
    (deploy / 'credentials' / 'conf' / 'credentials.json').write_text('{}\n')
    client = _Client({_interceptor.INTERCEPTOR_NAME: _interceptor_attrs(running=False)})
    result = _apply.CredentialsDeploy(client, params(deploy, inspect_only=False)).run()
    assert result['actions'] == [
        'remove %s (no credential declared)' % _interceptor.INTERCEPTOR_NAME,
        'remove %s (no credential declared)' % (deploy / 'egress-credentials.conf'),
        'remove %s (no credential declared)' % (deploy / 'credentials' / 'conf' / 'credentials.json')]
    assert client.api.removed == [_interceptor.INTERCEPTOR_NAME]
    assert not (deploy / 'egress-credentials.conf').exists()
    assert _apply.CredentialsDeploy(None, params(deploy)).run()['work'] is False
