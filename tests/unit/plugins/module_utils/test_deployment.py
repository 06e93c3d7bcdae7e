"""The deployment folder: create-only, adopt what exists, refuse symlinks."""

import json
import os

import pytest

from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import allowlist as _allowlist
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import deployment as _deployment
from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import files as _files
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import rules as _rules

FILES = ['egress-allowlist.conf', 'deploy/egress-proxy.conf', 'model-endpoints.json', 'model-endpoints.conf',
         'egress-guard.conf']


def _snapshot(root):
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            data = open(path, 'rb').read() if os.path.isfile(path) and not os.path.islink(path) else None
            out[os.path.relpath(path, root)] = (st.st_mode, st.st_ino, st.st_mtime_ns, data)
    return out


def test_fresh_folder_gets_the_seed_layout(tmp_path):
    root = str(tmp_path / 'egress')
    result = _deployment.apply(root)
    assert result['changed']
    assert sorted(os.path.relpath(p, root) for p in result['created']) == sorted(FILES)
    assert result['kept'] == []
    with open(os.path.join(root, 'egress-allowlist.conf')) as handle:
        allow = _allowlist.parse(handle.read())
    assert allow.ok and allow.hosts() == ['api.anthropic.com', '.github.com', 'registry.npmjs.org']
    with open(os.path.join(root, 'deploy/egress-proxy.conf')) as handle:
        assert handle.read() == _rules.packaged_rules()
    with open(os.path.join(root, 'model-endpoints.json')) as handle:
        assert json.load(handle) == {'version': 1, 'endpoints': []}
    with open(os.path.join(root, 'model-endpoints.conf')) as handle:
        include = handle.read()
    assert include.startswith('#')
    assert not [ln for ln in include.splitlines() if ln.strip() and not ln.startswith('#')]
    assert not [n for n in os.listdir(root) + os.listdir(os.path.join(root, 'deploy')) if n.endswith('.tmp')]


def test_second_apply_changes_nothing(tmp_path):
    root = str(tmp_path / 'egress')
    _deployment.apply(root)
    before = _snapshot(root)
    result = _deployment.apply(root)
    assert not result['changed'] and result['created'] == []
    assert sorted(os.path.relpath(p, root) for p in result['kept']) == sorted(FILES)
    assert _snapshot(root) == before


@pytest.mark.parametrize('missing', FILES)
def test_only_the_missing_file_is_created(tmp_path, missing):
    root = str(tmp_path / 'egress')
    _deployment.apply(root)
    for rel in FILES:
        if rel != missing:
            with open(os.path.join(root, rel), 'w') as handle:
                handle.write('operator content of %s\n' % rel)
    os.unlink(os.path.join(root, missing))
    result = _deployment.apply(root)
    assert [os.path.relpath(p, root) for p in result['created']] == [missing]
    for rel in FILES:
        if rel != missing:
            with open(os.path.join(root, rel)) as handle:
                assert handle.read() == 'operator content of %s\n' % rel


def test_existing_pi_dispatch_folder_is_adopted_as_is(tmp_path):
    root = tmp_path / 'egress'
    (root / 'deploy').mkdir(parents=True)
    (root / 'egress-allowlist.conf').write_text('api.anthropic.com\n')
    (root / 'deploy' / 'egress-proxy.conf').write_text('# an older rules file\nhttp_port 3128\n')
    before = _snapshot(str(root))
    result = _deployment.apply(str(root))
    created = sorted(os.path.relpath(p, str(root)) for p in result['created'])
    assert created == ['egress-guard.conf', 'model-endpoints.conf', 'model-endpoints.json']
    after = _snapshot(str(root))
    for key, value in before.items():
        if key != '.' and key != 'deploy':
            assert after[key] == value, key


def test_check_mode_writes_nothing(tmp_path):
    root = str(tmp_path / 'egress')
    result = _deployment.apply(root, check_mode=True)
    assert result['changed'] and len(result['created']) == 5
    assert not os.path.exists(root)


@pytest.mark.parametrize('what', ['deploy_dir', 'deploy', 'egress-allowlist.conf', 'deploy/egress-proxy.conf',
                                  'model-endpoints.json', 'model-endpoints.conf'])
def test_symlinks_are_refused_and_nothing_is_written(tmp_path, what):
    real = tmp_path / 'real'
    real.mkdir()
    target = tmp_path / 'target'
    target.mkdir()
    (target / 'f').write_text('x\n')
    if what == 'deploy_dir':
        root = tmp_path / 'link'
        os.symlink(str(real), str(root))
    else:
        root = real
        if what != 'deploy':
            (root / 'deploy').mkdir()
        link = root / what
        os.symlink(str(target / 'f') if what != 'deploy' else str(target), str(link))
    before = _snapshot(str(tmp_path))
    with pytest.raises(_deployment.DeploymentError) as info:
        _deployment.apply(str(root))
    assert 'symlink' in str(info.value)
    assert str(root) in str(info.value)
    assert _snapshot(str(tmp_path)) == before


@pytest.mark.parametrize('rel, make', [
    ('egress-allowlist.conf', 'dir'),
    ('model-endpoints.conf', 'dir'),
    ('deploy', 'file'),
])
def test_wrong_type_is_refused(tmp_path, rel, make):
    root = tmp_path / 'egress'
    root.mkdir()
    path = root / rel
    if make == 'dir':
        path.mkdir()
    else:
        path.write_text('x')
    with pytest.raises(_deployment.DeploymentError) as info:
        _deployment.apply(str(root))
    assert str(path) in str(info.value) and 'move it away' in str(info.value)
    assert sorted(os.listdir(str(root))) == [rel]


def test_relative_deploy_dir_is_refused(tmp_path):
    with pytest.raises(_deployment.DeploymentError) as info:
        _deployment.apply('relative/egress')
    assert 'absolute' in str(info.value)


def test_create_exclusive_never_overwrites(tmp_path):
    path = str(tmp_path / 'f')
    assert _files.create_exclusive(path, 'one\n') is True
    assert _files.create_exclusive(path, 'two\n') is False
    assert open(path).read() == 'one\n'
    assert os.listdir(str(tmp_path)) == ['f']


def test_custom_seed_entries(tmp_path):
    root = str(tmp_path / 'egress')
    _deployment.apply(root, [{'host': 'api.provider.test', 'comment': 'fake'}])
    with open(os.path.join(root, 'egress-allowlist.conf')) as handle:
        assert _allowlist.parse(handle.read()).hosts() == ['api.provider.test']


def test_missing_parents_are_created(tmp_path):
    root = str(tmp_path / 'opt' / 'pi-dispatch' / 'egress')
    result = _deployment.apply(root)
    assert len(result['created']) == 5 and os.path.isdir(os.path.join(root, 'deploy'))


@pytest.mark.parametrize('given, wanted', [
    ('/opt/pi-dispatch/egress', '/opt/pi-dispatch/egress'),
    ('/opt/pi-dispatch/egress/', '/opt/pi-dispatch/egress'),
    ('/opt//pi-dispatch/./egress', '/opt/pi-dispatch/egress'),
    ('/opt/pi-dispatch/x/../egress', '/opt/pi-dispatch/egress'),
    ('relative/egress', None),
    ('./egress', None),
    ('~/egress', None),
    ('', None),
    (None, None),
])
def test_one_validation_of_deploy_dir(given, wanted):
    if wanted is None:
        with pytest.raises(_deployment.DeploymentError) as caught:
            _deployment.Layout(given, key='egress_deploy_dir')
        assert 'egress_deploy_dir %r is not an absolute path; give the full path.' % (given,) == str(caught.value)
    else:
        layout = _deployment.Layout(given)
        assert layout.deploy_dir == wanted
        assert layout.paths == _deployment.paths(wanted)
        assert layout.guard_conf == os.path.join(wanted, 'egress-guard.conf')
        assert layout.rules_dir == os.path.join(wanted, 'deploy')


def test_no_module_spells_the_default_folder_itself():
    """The default lives in _deployment.DEFAULT_DEPLOY_DIR only: argument specs refer to it."""
    import glob
    import re
    modules = os.path.join(os.path.dirname(_deployment.__file__), '..', 'modules', '*.py')
    offenders = []
    for path in sorted(glob.glob(modules)):
        with open(path) as handle:
            for lineno, line in enumerate(handle, 1):
                if re.search(r"deploy_dir=dict\(.*default='", line):
                    offenders.append('%s:%d' % (os.path.basename(path), lineno))
    assert offenders == []
    assert _deployment.DEFAULT_DEPLOY_DIR == '/opt/pi-dispatch/egress'


def test_layout_refuses_a_symlinked_folder(tmp_path):
    real = tmp_path / 'real'
    real.mkdir()
    link = tmp_path / 'link'
    link.symlink_to(real)
    with pytest.raises(_deployment.DeploymentError) as caught:
        _deployment.Layout(str(link)).check_folders()
    assert 'is a symlink' in str(caught.value)
    _deployment.Layout(str(real)).check_folders()


def test_module_layout_fails_naming_the_option_and_changes_nothing(fake_module):
    module = fake_module(dict(deploy_dir='egress'))
    with pytest.raises(SystemExit):
        _deployment.module_layout(module, result=dict(changed=False))
    assert module.failed['msg'] == ("deploy_dir 'egress' is not an absolute path; give the full path. "
                                    "Nothing was changed.")
    assert module.failed['changed'] is False
