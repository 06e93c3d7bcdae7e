"""Job networks: the credential placeholders a job gets (_jobnets/credentials.py)."""
import json
import os
import stat

import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets import credentials as _jobcreds
from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets.names import JobNetError
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import credentials as _credentials

SECRET = 'S3cretValue-do-not-leak_42'
OTHER_SECRET = 'AnotherSecret-never-shown_7'
CA_TEXT = '-----BEGIN CERTIFICATE-----\nMIIBdeploymentCA\n-----END CERTIFICATE-----\n'
PUBLIC_TEXT = '-----BEGIN CERTIFICATE-----\nMIIBpublicCA\n-----END CERTIFICATE-----\n'
SUBNET = '10.89.3.0/24'
CA_ENV_BUNDLE = ('SSL_CERT_FILE', 'REQUESTS_CA_BUNDLE', 'GIT_SSL_CAINFO')


def mode_of(path):
    return stat.S_IMODE(os.lstat(str(path)).st_mode)


def write_secret(path, content=SECRET + '\n', mode=0o600):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)
    os.chmod(str(path), mode)
    return str(path)


def forge(deploy, **kw):
    item = dict(name='forge', host='github.com', port=443, env='GH_TOKEN', scheme='basic',
                secret_file=str(deploy / 'secrets' / 'forge'))
    item.update(kw)
    return item


def anthropic(deploy, **kw):
    item = dict(name='anthropic', host='api.anthropic.com', port=443, env='ANTHROPIC_API_KEY', scheme='header',
                header='x-api-key', secret_file=str(deploy / 'secrets' / 'anthropic'))
    item.update(kw)
    return item


def declare(deploy, *items):
    (deploy / _credentials.FILE_NAME).write_text(json.dumps(dict(version=1, credentials=list(items))))


def write_ca(deploy, text=CA_TEXT):
    path = deploy / _jobcreds.FOLDER / _jobcreds.CA_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


@pytest.fixture
def deploy(tmp_path):
    """A deployment folder declaring forge and anthropic, both secrets root-only, and the interceptor's CA."""
    folder = tmp_path / 'deploy'
    folder.mkdir()
    write_secret(folder / 'secrets' / 'forge')
    write_secret(folder / 'secrets' / 'anthropic', OTHER_SECRET)
    declare(folder, forge(folder), anthropic(folder))
    write_ca(folder)
    return folder


@pytest.fixture
def host_bundle(tmp_path):
    path = tmp_path / 'host-ca-certificates.crt'
    path.write_text(PUBLIC_TEXT)
    return str(path)


# --- declared() -----------------------------------------------------------------

# (id, declaration text or None for no file, with CA file)
NOTHING_DECLARED = [
    ('no declaration, no CA', None, False),
    ('no declaration, CA made', None, True),
    ('empty declaration constant, no CA', _credentials.EMPTY_DECLARATION, False),
    ('empty declaration constant, CA made', _credentials.EMPTY_DECLARATION, True),
    ('compact empty list', '{"version": 1, "credentials": []}', False),
]


@pytest.mark.parametrize('name,text,with_ca', NOTHING_DECLARED, ids=[row[0] for row in NOTHING_DECLARED])
def test_declared_nothing(tmp_path, name, text, with_ca):
    if text is not None:
        (tmp_path / _credentials.FILE_NAME).write_text(text)
    if with_ca:
        write_ca(tmp_path)
    assert _jobcreds.declared(str(tmp_path)) == []
    assert not os.path.exists(_jobcreds.jobs_dir(str(tmp_path)))


def test_declared_returns_the_credentials_sorted(deploy):
    creds = _jobcreds.declared(str(deploy))
    assert [(c.name, c.host, c.env, c.scheme, c.header) for c in creds] == [
        ('anthropic', 'api.anthropic.com', 'ANTHROPIC_API_KEY', 'header', 'x-api-key'),
        ('forge', 'github.com', 'GH_TOKEN', 'basic', 'authorization')]
    assert not os.path.exists(_jobcreds.jobs_dir(str(deploy)))


def _missing(path):
    os.unlink(str(path))


def _chmod(mode):
    def make(path):
        os.chmod(str(path), mode)
    return make


def _content(text):
    def make(path):
        path.write_text(text)
    return make


def _symlink(path):
    target = path.parent / 'real-forge'
    write_secret(target)
    os.unlink(str(path))
    os.symlink(str(target), str(path))


def _dangling_symlink(path):
    os.unlink(str(path))
    os.symlink(str(path.parent / 'gone'), str(path))


def _directory(path):
    os.unlink(str(path))
    path.mkdir()


def _chown(path):
    os.chown(str(path), 1000, 0)


# (id, how the forge secret file is spoiled, a fragment of the rule)
SECRET_REFUSED = [
    ('missing', _missing, 'does not exist'),
    ('mode 0644', _chmod(0o644), 'mode 0644'),
    ('mode 0640', _chmod(0o640), 'mode 0640'),
    ('mode 0604', _chmod(0o604), 'mode 0604'),
    ('empty file', _content(''), 'is 0 bytes'),
    ('newline only', _content('\n'), 'is empty'),
    ('symlink to a good secret', _symlink, 'is a symlink'),
    ('dangling symlink', _dangling_symlink, 'is a symlink'),
    ('a directory', _directory, 'is not a regular file'),
    ('owned by another uid', _chown, 'is owned by uid 1000'),
    ('holds a placeholder', _content(_credentials.placeholder('forge') + '\n'), 'holds a placeholder'),
    ('space inside', _content(SECRET + ' ' + SECRET + '\n'), 'contains a space'),
    ('two lines', _content(SECRET + '\n' + SECRET + '\n'), 'control character'),
    ('too large', _content(SECRET * 400), 'not 1 to 8192'),
]


@pytest.mark.parametrize('name,spoil,rule', SECRET_REFUSED, ids=[row[0] for row in SECRET_REFUSED])
def test_declared_refuses_an_unusable_secret(deploy, name, spoil, rule):
    secret = deploy / 'secrets' / 'forge'
    spoil(secret)
    with pytest.raises(JobNetError) as info:
        _jobcreds.declared(str(deploy))
    message = str(info.value)
    assert 'credential "forge"' in message
    assert str(secret) in message
    assert rule in message
    assert 'Nothing was created' in message
    assert 'anthropic' not in message  # the good one is not named
    assert SECRET not in message and OTHER_SECRET not in message
    assert not os.path.exists(_jobcreds.jobs_dir(str(deploy)))


def test_declared_names_every_unusable_secret(deploy):
    os.chmod(str(deploy / 'secrets' / 'forge'), 0o644)
    os.unlink(str(deploy / 'secrets' / 'anthropic'))
    with pytest.raises(JobNetError) as info:
        _jobcreds.declared(str(deploy))
    message = str(info.value)
    assert 'credential "forge"' in message and 'credential "anthropic"' in message
    assert SECRET not in message


def test_declared_secret_checked_before_the_ca(deploy):
    os.unlink(str(deploy / _jobcreds.FOLDER / _jobcreds.CA_FILE))
    os.chmod(str(deploy / 'secrets' / 'forge'), 0o644)
    with pytest.raises(JobNetError, match='credential "forge"'):
        _jobcreds.declared(str(deploy))


@pytest.mark.parametrize('spoil', ['missing file', 'ca folder missing', 'ca is a directory'])
def test_declared_refuses_without_the_ca(deploy, spoil):
    ca = deploy / _jobcreds.FOLDER / _jobcreds.CA_FILE
    os.unlink(str(ca))
    if spoil == 'ca folder missing':
        os.rmdir(str(ca.parent))
    elif spoil == 'ca is a directory':
        ca.mkdir()
    with pytest.raises(JobNetError) as info:
        _jobcreds.declared(str(deploy))
    message = str(info.value)
    assert str(ca) in message
    assert str(deploy / _credentials.FILE_NAME) in message
    assert 'no CA yet' in message and 'Nothing was created' in message
    assert SECRET not in message


# (id, declaration text, a fragment of the message)
REFUSED_DECLARATION = [
    ('bad JSON', '{"version": 1, "credentials": [', 'is refused'),
    ('not an object', '[]', 'the top level must be an object'),
    ('unknown top key', '{"version": 1, "credentials": [], "secrets": []}', '"secrets"'),
    ('unknown credential key', json.dumps(dict(version=1, credentials=[dict(
        name='forge', host='github.com', port=443, env='GH_TOKEN', scheme='basic', secret_file='/s/forge',
        token='x')])), '"token"'),
    ('version 2', '{"version": 2, "credentials": []}', 'key "version" = 2'),
    ('credentials missing', '{"version": 1}', '"credentials"'),
    ('port 8443', json.dumps(dict(version=1, credentials=[dict(
        name='forge', host='github.com', port=8443, env='GH_TOKEN', scheme='basic', secret_file='/s/forge')])),
     '"port"'),
]


@pytest.mark.parametrize('name,text,fragment', REFUSED_DECLARATION, ids=[row[0] for row in REFUSED_DECLARATION])
def test_declared_refused_declaration(tmp_path, name, text, fragment):
    (tmp_path / _credentials.FILE_NAME).write_text(text)
    write_ca(tmp_path)
    with pytest.raises(JobNetError) as info:
        _jobcreds.declared(str(tmp_path))
    message = str(info.value)
    assert str(tmp_path / _credentials.FILE_NAME) in message
    assert fragment in message
    assert not os.path.exists(_jobcreds.jobs_dir(str(tmp_path)))


def test_declared_refuses_a_symlinked_declaration(deploy, tmp_path):
    real = tmp_path / 'elsewhere.json'
    os.rename(str(deploy / _credentials.FILE_NAME), str(real))
    os.symlink(str(real), str(deploy / _credentials.FILE_NAME))
    with pytest.raises(JobNetError, match='is a symlink'):
        _jobcreds.declared(str(deploy))


# --- issue() --------------------------------------------------------------------

def test_issue_writes_the_record(deploy):
    creds = _jobcreds.declared(str(deploy))
    env, _mounts = _jobcreds.issue(str(deploy), creds, 'job-1', SUBNET)
    path = _jobcreds.record_path(str(deploy), 'job-1')
    assert path == str(deploy / 'credentials' / 'jobs' / 'job-1.json')
    assert mode_of(path) == 0o600
    assert mode_of(_jobcreds.jobs_dir(str(deploy))) == 0o700
    with open(path) as handle:
        text = handle.read()
    record = json.loads(text)
    assert sorted(record) == ['job', 'placeholders', 'subnets']
    assert record['job'] == 'job-1'
    assert record['subnets'] == [SUBNET]
    assert sorted(record['placeholders']) == ['anthropic', 'forge']
    assert record['placeholders']['forge'] == env['GH_TOKEN']
    assert record['placeholders']['anthropic'] == env['ANTHROPIC_API_KEY']
    assert SECRET not in text and OTHER_SECRET not in text
    assert not [entry for entry in os.listdir(_jobcreds.jobs_dir(str(deploy))) if entry != 'job-1.json']


def test_issue_env(deploy):
    creds = _jobcreds.declared(str(deploy))
    env, _mounts = _jobcreds.issue(str(deploy), creds, 'job-1', SUBNET)
    assert sorted(env) == sorted(['GH_TOKEN', 'ANTHROPIC_API_KEY', 'NODE_EXTRA_CA_CERTS'] + list(CA_ENV_BUNDLE))
    for var, name in (('GH_TOKEN', 'forge'), ('ANTHROPIC_API_KEY', 'anthropic')):
        assert _credentials.is_placeholder_shaped(env[var])
        assert env[var].startswith(_credentials.PLACEHOLDER_PREFIX + name + '-')
        assert 'job-1' not in env[var]
    assert env['GH_TOKEN'] != env['ANTHROPIC_API_KEY']
    assert env['NODE_EXTRA_CA_CERTS'] == _jobcreds.CA_IN_JOB
    for var in CA_ENV_BUNDLE:
        assert env[var] == _jobcreds.BUNDLE_IN_JOB
    assert set(env) >= set(_credentials.CA_ENV)
    for value in env.values():
        assert SECRET not in value and OTHER_SECRET not in value


def test_issue_mounts(deploy):
    creds = _jobcreds.declared(str(deploy))
    _env, mounts = _jobcreds.issue(str(deploy), creds, 'job-1', SUBNET)
    ca = str(deploy / 'credentials' / 'ca' / 'mitmproxy-ca-cert.pem')
    bundle_path = str(deploy / 'credentials' / _jobcreds.BUNDLE_FILE)
    assert mounts == {ca: _jobcreds.CA_IN_JOB, bundle_path: _jobcreds.BUNDLE_IN_JOB}
    for host_path in mounts:
        assert os.path.isfile(host_path)
    with open(bundle_path) as handle:
        assert handle.read().endswith(CA_TEXT)


def test_issue_again_keeps_the_placeholders(deploy):
    creds = _jobcreds.declared(str(deploy))
    first, _mounts = _jobcreds.issue(str(deploy), creds, 'job-1', SUBNET)
    again, _mounts = _jobcreds.issue(str(deploy), creds, 'job-1', SUBNET)
    assert again == first
    with open(_jobcreds.record_path(str(deploy), 'job-1')) as handle:
        assert json.load(handle)['placeholders'] == {'forge': first['GH_TOKEN'],
                                                     'anthropic': first['ANTHROPIC_API_KEY']}
    assert mode_of(_jobcreds.record_path(str(deploy), 'job-1')) == 0o600


def test_issue_another_job_gets_other_placeholders(deploy):
    creds = _jobcreds.declared(str(deploy))
    first, _mounts = _jobcreds.issue(str(deploy), creds, 'job-1', SUBNET)
    other, _mounts = _jobcreds.issue(str(deploy), creds, 'job-2', '10.89.4.0/24')
    assert other['GH_TOKEN'] != first['GH_TOKEN']
    assert other['ANTHROPIC_API_KEY'] != first['ANTHROPIC_API_KEY']
    with open(_jobcreds.record_path(str(deploy), 'job-1')) as handle:
        assert json.load(handle)['placeholders']['forge'] == first['GH_TOKEN']  # job-1's record untouched
    with open(_jobcreds.record_path(str(deploy), 'job-2')) as handle:
        record = json.load(handle)
    assert record['job'] == 'job-2' and record['subnets'] == ['10.89.4.0/24']


def test_issue_new_credential_keeps_the_old_placeholder(deploy):
    creds = _jobcreds.declared(str(deploy))
    forge_only = [c for c in creds if c.name == 'forge']
    first, _mounts = _jobcreds.issue(str(deploy), forge_only, 'job-1', SUBNET)
    assert 'ANTHROPIC_API_KEY' not in first
    both, _mounts = _jobcreds.issue(str(deploy), creds, 'job-1', SUBNET)
    assert both['GH_TOKEN'] == first['GH_TOKEN']
    assert _credentials.is_placeholder_shaped(both['ANTHROPIC_API_KEY'])


# (id, the record found before the issue)
DAMAGED_RECORDS = [
    ('not JSON', '{"placeholders": '),
    ('a JSON list', '[1, 2]'),
    ('a JSON string', '"job-1"'),
    ('placeholders null', '{"placeholders": null}'),
    ('placeholder not shaped', '{"placeholders": {"forge": "pi-placeholder-forge-xyz"}}'),
    ('placeholder a number', '{"placeholders": {"forge": 5}}'),
    ('placeholder is the secret', '{"placeholders": {"forge": "%s"}}' % SECRET),
]


@pytest.mark.parametrize('name,text', DAMAGED_RECORDS, ids=[row[0] for row in DAMAGED_RECORDS])
def test_issue_replaces_a_damaged_record(deploy, name, text):
    creds = _jobcreds.declared(str(deploy))
    os.makedirs(_jobcreds.jobs_dir(str(deploy)), mode=0o700)
    with open(_jobcreds.record_path(str(deploy), 'job-1'), 'w') as handle:
        handle.write(text)
    env, _mounts = _jobcreds.issue(str(deploy), creds, 'job-1', SUBNET)
    assert _credentials.is_placeholder_shaped(env['GH_TOKEN'])
    with open(_jobcreds.record_path(str(deploy), 'job-1')) as handle:
        assert json.load(handle)['placeholders']['forge'] == env['GH_TOKEN']


@pytest.mark.parametrize('text', ['{"placeholders": ["x"]}', '{"placeholders": "pi-placeholder-forge-"}'])
def test_issue_replaces_a_record_whose_placeholders_is_no_object(deploy, text):
    creds = _jobcreds.declared(str(deploy))
    os.makedirs(_jobcreds.jobs_dir(str(deploy)), mode=0o700)
    with open(_jobcreds.record_path(str(deploy), 'job-1'), 'w') as handle:
        handle.write(text)
    env, _mounts = _jobcreds.issue(str(deploy), creds, 'job-1', SUBNET)
    assert _credentials.is_placeholder_shaped(env['GH_TOKEN'])


def test_issue_nothing_declared(tmp_path):
    write_ca(tmp_path)
    env, mounts = _jobcreds.issue(str(tmp_path), [], 'job-1', SUBNET)
    assert env == dict([('NODE_EXTRA_CA_CERTS', _jobcreds.CA_IN_JOB)]
                       + [(var, _jobcreds.BUNDLE_IN_JOB) for var in CA_ENV_BUNDLE])
    assert sorted(mounts.values()) == sorted([_jobcreds.CA_IN_JOB, _jobcreds.BUNDLE_IN_JOB])
    with open(_jobcreds.record_path(str(tmp_path), 'job-1')) as handle:
        assert json.load(handle) == dict(job='job-1', subnets=[SUBNET], placeholders={})


# --- bundle() -------------------------------------------------------------------

# (id, host bundle content or None for no file, wanted bundle)
BUNDLES = [
    ('public then CA', PUBLIC_TEXT, PUBLIC_TEXT + CA_TEXT),
    ('no trailing newline', PUBLIC_TEXT.rstrip('\n'), PUBLIC_TEXT + CA_TEXT),
    ('trailing blank lines', PUBLIC_TEXT + '\n\n\n', PUBLIC_TEXT + CA_TEXT),
    ('missing host bundle', None, CA_TEXT),
    ('empty host bundle', '', CA_TEXT),
]


@pytest.mark.parametrize('name,public,want', BUNDLES, ids=[row[0] for row in BUNDLES])
def test_bundle_content(tmp_path, name, public, want):
    deploy = tmp_path / 'deploy'
    write_ca(deploy)
    host = tmp_path / 'host.crt'
    if public is not None:
        host.write_text(public)
    path = _jobcreds.bundle(str(deploy), host_bundle=str(host))
    assert path == str(deploy / 'credentials' / _jobcreds.BUNDLE_FILE)
    with open(path) as handle:
        assert handle.read() == want
    assert mode_of(path) == 0o644


def test_bundle_host_bundle_a_directory(tmp_path):
    write_ca(tmp_path)
    path = _jobcreds.bundle(str(tmp_path), host_bundle=str(tmp_path))
    with open(path) as handle:
        assert handle.read() == CA_TEXT


def test_bundle_unchanged_is_not_rewritten(deploy, host_bundle):
    path = _jobcreds.bundle(str(deploy), host_bundle=host_bundle)
    os.utime(path, ns=(1000000000, 1000000000))
    before = os.stat(path)
    assert _jobcreds.bundle(str(deploy), host_bundle=host_bundle) == path
    after = os.stat(path)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_bundle_rewritten_when_the_ca_changes(deploy, host_bundle):
    path = _jobcreds.bundle(str(deploy), host_bundle=host_bundle)
    os.utime(path, ns=(1000000000, 1000000000))
    new_ca = CA_TEXT.replace('deploymentCA', 'renewedCA')
    write_ca(deploy, new_ca)
    _jobcreds.bundle(str(deploy), host_bundle=host_bundle)
    with open(path) as handle:
        assert handle.read() == PUBLIC_TEXT + new_ca
    assert os.stat(path).st_mtime_ns != 1000000000
    assert mode_of(path) == 0o644


def test_bundle_rewritten_when_the_host_bundle_goes(deploy, host_bundle):
    path = _jobcreds.bundle(str(deploy), host_bundle=host_bundle)
    os.unlink(host_bundle)
    _jobcreds.bundle(str(deploy), host_bundle=host_bundle)
    with open(path) as handle:
        assert handle.read() == CA_TEXT


def test_bundle_without_the_ca_raises(tmp_path, host_bundle):
    with pytest.raises(OSError):
        _jobcreds.bundle(str(tmp_path), host_bundle=host_bundle)


# --- forget() -------------------------------------------------------------------

def test_forget_removes_the_record(deploy):
    creds = _jobcreds.declared(str(deploy))
    _jobcreds.issue(str(deploy), creds, 'job-1', SUBNET)
    _jobcreds.issue(str(deploy), creds, 'job-2', SUBNET)
    assert _jobcreds.forget(str(deploy), 'job-1') == ['forget the placeholders of job-1']
    assert not os.path.exists(_jobcreds.record_path(str(deploy), 'job-1'))
    assert os.path.exists(_jobcreds.record_path(str(deploy), 'job-2'))
    assert _jobcreds.forget(str(deploy), 'job-1') == []


def test_forget_check_mode_leaves_the_record(deploy):
    creds = _jobcreds.declared(str(deploy))
    _jobcreds.issue(str(deploy), creds, 'job-1', SUBNET)
    assert _jobcreds.forget(str(deploy), 'job-1', check_mode=True) == ['forget the placeholders of job-1']
    assert os.path.exists(_jobcreds.record_path(str(deploy), 'job-1'))


# (id, credentials_dir (a callable of tmp_path), check_mode)
FORGET_NOTHING = [
    ('credentials_dir None', lambda tmp: None, False),
    ('credentials_dir empty', lambda tmp: '', False),
    ('nothing recorded, no folder', str, False),
    ('nothing recorded, check mode', str, True),
    ('credentials_dir None, check mode', lambda tmp: None, True),
]


@pytest.mark.parametrize('name,folder,check_mode', FORGET_NOTHING, ids=[row[0] for row in FORGET_NOTHING])
def test_forget_nothing(tmp_path, name, folder, check_mode):
    assert _jobcreds.forget(folder(tmp_path), 'job-1', check_mode=check_mode) == []


def test_forget_other_job_only(deploy):
    creds = _jobcreds.declared(str(deploy))
    _jobcreds.issue(str(deploy), creds, 'job-1', SUBNET)
    assert _jobcreds.forget(str(deploy), 'job-3') == []
    assert os.path.exists(_jobcreds.record_path(str(deploy), 'job-1'))


def test_table_sizes():
    assert len(NOTHING_DECLARED) + len(SECRET_REFUSED) + len(REFUSED_DECLARATION) + len(BUNDLES) >= 20


# --- the sweep forgets the records of jobs whose network is gone --------------------------------------------

@pytest.mark.parametrize('job_id, network_there, age, check_mode, forgotten', [
    ('gone-old', False, 1000, False, True),
    ('gone-young', False, 10, False, False),
    ('there-old', True, 1000, False, False),
    ('gone-old-check', False, 1000, True, True),
])
def test_the_sweep_forgets_old_records_whose_network_is_gone(tmp_path, job_id, network_there, age, check_mode,
                                                             forgotten):
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets import gc as _gc
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets.names import network_name
    folder = tmp_path / 'credentials' / 'jobs'
    folder.mkdir(parents=True)
    record = folder / ('%s.json' % job_id)
    record.write_text('{"job": "%s", "subnets": [], "placeholders": {}}\n' % job_id)
    os.utime(str(record), (1000000 - age, 1000000 - age))
    (folder / '.tmp-half-written.json.tmp').write_text('x')
    networks = {network_name(job_id)} if network_there else {'pi-job-other-net'}
    result = dict(forgotten=[], changed=False)
    _gc._forget_orphans(str(tmp_path), networks, 300, result, check_mode, now=1000000)
    assert result['forgotten'] == ([job_id] if forgotten else [])
    assert result['changed'] is forgotten
    assert record.exists() is (not forgotten or check_mode)
    assert (folder / '.tmp-half-written.json.tmp').exists()


def test_the_sweep_without_a_jobs_folder_forgets_nothing(tmp_path):
    from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets import gc as _gc
    result = dict(forgotten=[], changed=False)
    _gc._forget_orphans(str(tmp_path), set(), 0, result, False, now=None)
    assert result == dict(forgotten=[], changed=False)
