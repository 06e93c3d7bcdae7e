# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""Building the proxy image locally, with no registry.

* :func:`debian_mirror` reads the host's apt sources (one-line ``.list`` and
  deb822 ``.sources``) and returns the Debian mirror apt already uses, so an
  air-gapped fleet builds its base from the mirror it trusts.
* :func:`build_base` runs ``debootstrap`` and imports the root file system.
* :func:`security_mirror` finds the Debian security archive among the same
  sources, so the image takes security updates from the mirror apt trusts.
* :func:`build_image` builds the Containerfile on that base with the build
  context made in memory, and labels the result with a build hash (for
  idempotence), the squid version, the squid package version and a digest of
  every installed package found inside it. ``refresh`` rebuilds without the
  layer cache, so apt fetches what the mirror serves now; when no package
  changed, the old image is kept.
"""

from __future__ import annotations

import glob
import hashlib
import io
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import docker_client as dc

LABEL_BUILD_HASH = 'io.pi-dispatch.egress.build-hash'
LABEL_SQUID_VERSION = 'io.pi-dispatch.egress.squid-version'
LABEL_BASE = 'io.pi-dispatch.egress.base'
LABEL_SQUID_PACKAGE = 'io.pi-dispatch.egress.squid-package'
LABEL_PACKAGES = 'io.pi-dispatch.egress.packages'

# Used when the host's apt sources carry no security archive (role variable
# egress_proxy_security_mirror; empty turns the security suite off).
DEFAULT_SECURITY_MIRROR = 'http://deb.debian.org/debian-security'

_SKIP_SUITE = re.compile(r'-(security|updates|backports|proposed-updates)$')


class ImageError(Exception):
    pass


def _one_line_sources(text: str) -> Iterator[Tuple[str, List[str]]]:
    for raw in text.splitlines():
        line = raw.split('#', 1)[0].strip()
        if not line.startswith('deb '):
            continue
        words = line.split()[1:]
        if words and words[0].startswith('['):
            while words and not words[0].endswith(']'):
                words = words[1:]
            words = words[1:]
        if len(words) >= 2:
            yield words[0], [words[1]]


def _deb822_sources(text: str) -> Iterator[Tuple[str, List[str]]]:
    for stanza in re.split(r'\n\s*\n', text):
        fields: Dict[str, str] = {}
        for raw in stanza.splitlines():
            if raw.startswith('#') or ':' not in raw or raw[:1].isspace():
                continue
            key, value = raw.split(':', 1)
            fields[key.strip().lower()] = value.strip()
        if 'deb' not in fields.get('types', '').split() or fields.get('enabled', 'yes').lower() == 'no':
            continue
        for uri in fields.get('uris', '').split():
            yield uri, fields.get('suites', '').split()


def debian_mirror(sources: Sequence[Tuple[str, str]]) -> Optional[str]:
    """First Debian mirror URI among ``sources`` [(filename, text)], or None.

    Security, updates and backports archives are skipped: debootstrap needs
    the main archive.
    """
    for name, text in sources:
        parser = _deb822_sources if name.endswith('.sources') else _one_line_sources
        for uri, suites in parser(text):
            if not uri.startswith(('http://', 'https://', 'file:', 'ftp://')):
                continue
            if '/debian-security' in uri:
                continue
            if any(not _SKIP_SUITE.search(s) for s in suites):
                return uri.rstrip('/')
    return None


def _is_security(uri: str, suites: Sequence[str]) -> bool:
    return '/debian-security' in uri or any(s.endswith('-security') for s in suites)


def security_mirror(sources: Sequence[Tuple[str, str]]) -> Optional[str]:
    """First Debian security archive URI among ``sources`` [(filename, text)], or None.

    An entry counts when its URI is a ``/debian-security`` archive or one of
    its suites ends in ``-security`` (the host's own suite, e.g.
    ``bookworm-security``: the image asks the same archive for its own suite).
    """
    for name, text in sources:
        parser = _deb822_sources if name.endswith('.sources') else _one_line_sources
        for uri, suites in parser(text):
            if not uri.startswith(('http://', 'https://', 'file:', 'ftp://')):
                continue
            if _is_security(uri, suites):
                return uri.rstrip('/')
    return None


def choose_security_mirror(option: Optional[str], sources: Sequence[Tuple[str, str]],
                           default: Optional[str] = DEFAULT_SECURITY_MIRROR) -> Tuple[Optional[str], str]:
    """(mirror or None, where it came from) for the image's security suite.

    ``option`` is the module's ``security_mirror``: an empty string turns the
    suite off; None or a URL: the host's own security archive first, then
    ``option`` (or the documented default when it is None).
    """
    if option is not None and not option.strip():
        return None, 'disabled (security_mirror is empty)'
    found = security_mirror(sources)
    if found:
        return found, "the host's apt sources"
    if option:
        return option.strip().rstrip('/'), 'security_mirror (the host\'s apt sources carry no security archive)'
    return default, 'the default (the host\'s apt sources carry no security archive)'


_SECURITY_ARG = re.compile(r'^\s*ARG\s+SECURITY_MIRROR\b', re.MULTILINE)


def wants_security_args(containerfile: Optional[str]) -> bool:
    """Whether the Containerfile declares ``ARG SECURITY_MIRROR`` (other images get no such build argument)."""
    return bool(_SECURITY_ARG.search(containerfile or ''))


def security_buildargs(mirror: Optional[str], suite: str) -> Dict[str, str]:
    """The build arguments that put ``<mirror> <suite>-security main`` into the image's apt sources."""
    return {'SECURITY_MIRROR': mirror or '', 'SECURITY_SUITE': ('%s-security' % suite) if mirror else ''}


def host_sources(root: str = '/etc/apt') -> List[Tuple[str, str]]:
    files = []
    main = os.path.join(root, 'sources.list')
    if os.path.isfile(main):
        files.append(main)
    files += sorted(glob.glob(os.path.join(root, 'sources.list.d', '*.list')))
    files += sorted(glob.glob(os.path.join(root, 'sources.list.d', '*.sources')))
    out = []
    for path in files:
        try:
            with open(path) as handle:
                out.append((path, handle.read()))
        except OSError:
            continue
    return out


def build_hash(containerfile: str, base_id: Optional[str], buildargs: Dict[str, str],
               extra_files: Dict[str, str]) -> str:
    digest = hashlib.sha256()
    digest.update(containerfile.encode('utf-8'))
    digest.update(b'\0' + (base_id or '').encode('utf-8'))
    for key in sorted(buildargs):
        digest.update(('\0%s=%s' % (key, buildargs[key])).encode('utf-8'))
    for name in sorted(extra_files):
        digest.update(('\0%s\0' % name).encode('utf-8') + extra_files[name].encode('utf-8'))
    return digest.hexdigest()[:32]


def context_tar(containerfile: str, extra_files: Dict[str, str]) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode='w') as tar:
        for name, content in [('Containerfile', containerfile)] + sorted(extra_files.items()):
            data = content.encode('utf-8')
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    return buf


def parse_squid_version(text: str) -> Optional[str]:
    match = re.search(r'Squid Cache: Version (\S+)', text)
    return match.group(1) if match else None


PACKAGES_MARK = '--pi-egress-packages--'
# What the build runs in the image it made (no network): squid's own version,
# then every installed package with its version.
INSPECT_SCRIPT = ("squid -v; echo '%s'; dpkg-query -W -f '${Package} ${Version}\\n'" % PACKAGES_MARK)


def parse_inspect(text: Optional[str]) -> Dict[str, Optional[str]]:
    """dict(squid_version, squid_package, packages_digest) from :data:`INSPECT_SCRIPT`'s output."""
    head, _sep, tail = (text or '').partition(PACKAGES_MARK)
    packages = sorted(line.strip() for line in tail.splitlines() if line.strip())
    squid_package = None
    for line in packages:
        words = line.split()
        # squid-common carries squid's version whichever build is installed (squid, or squid-openssl
        # since rules version 3); the plain squid package is read where an older image has no squid-common.
        if len(words) == 2 and (words[0] == 'squid-common' or (words[0] == 'squid' and squid_package is None)):
            squid_package = words[1]
    digest = hashlib.sha256('\n'.join(packages).encode('utf-8')).hexdigest()[:32] if packages else None
    return dict(squid_version=parse_squid_version(head), squid_package=squid_package, packages_digest=digest)


def build_base(client: Any, tag: str, suite: str, mirror: str, workdir: Optional[str] = None,
               variant: str = 'minbase') -> str:
    """debootstrap ``suite`` from ``mirror`` and import it as ``tag``. Returns the image id."""
    if shutil.which('debootstrap') is None:
        raise ImageError('debootstrap is not installed on the target host; install it '
                         '(apt-get install debootstrap) or provide the base image.')
    tmp = tempfile.mkdtemp(prefix='pi-egress-rootfs-', dir=workdir)
    rootfs = os.path.join(tmp, 'rootfs')
    try:
        proc = subprocess.run(['debootstrap', '--variant=%s' % variant, suite, rootfs, mirror],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=1800, check=False)
        if proc.returncode != 0:
            tail = proc.stdout.decode('utf-8', 'replace').strip().splitlines()[-15:]
            raise ImageError('debootstrap %s from %s failed (exit %d):\n%s\nCheck that the mirror serves %s '
                             '(apt-get update uses the same one).'
                             % (suite, mirror, proc.returncode, '\n'.join(tail), suite))
        tar_path = os.path.join(tmp, 'rootfs.tar')
        with tarfile.open(tar_path, 'w') as tar:
            for entry in sorted(os.listdir(rootfs)):
                tar.add(os.path.join(rootfs, entry), arcname=entry)
        repo, tagname = _split_tag(tag)
        try:
            client.api.import_image_from_file(tar_path, repository=repo, tag=tagname,
                                              changes=['LABEL %s=debootstrap:%s' % (LABEL_BASE, suite),
                                                       'CMD ["/bin/bash"]'])
        except Exception as exc:
            raise ImageError('Importing the %s root file system as %s failed: %s' % (suite, tag, dc.api_message(exc)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    image = dc.get_image(client, tag)
    if image is None:
        raise ImageError('The imported base image %s is not on the daemon after import.' % tag)
    return image.id


def _split_tag(tag: str) -> Tuple[str, str]:
    repo, _sep, tagname = tag.rpartition(':')
    if not repo or '/' in tagname:
        repo, tagname = tag, 'latest'
    return repo, tagname


def build_image(client: Any, tag: str, containerfile: str, base_image: str,
                extra_files: Optional[Dict[str, str]] = None, network_mode: str = 'host', timeout: int = 1800,
                squid: bool = True, buildargs: Optional[Dict[str, str]] = None, refresh: bool = False
                ) -> Dict[str, Any]:
    """Build ``tag`` unless an image with the same build hash exists (or ``refresh`` asks for a fresh build).

    ``buildargs`` are added to ``BASE_IMAGE`` and covered by the build hash.
    ``refresh`` builds without the layer cache, so every ``apt-get`` runs
    again against the mirror; when the fresh image installs exactly the same
    packages as the current one, the current image is kept (``changed``
    false) and the fresh one is removed.

    Returns dict(changed, id, squid_version, squid_package, build_hash, refreshed, packages_changed, log).
    """
    extra_files = extra_files or {}
    base = dc.get_image(client, base_image)
    if base is None:
        raise ImageError('Base image %s is not on the daemon. Set egress_proxy_base_build: debootstrap to build '
                         'it from the host\'s Debian mirror, or load it (docker load / docker import).' % base_image)
    args = {'BASE_IMAGE': base_image}
    args.update(buildargs or {})
    wanted = build_hash(containerfile, base.id, args, extra_files)
    current = dc.get_image(client, tag)
    labels_now = (current.labels or {}) if current is not None else {}
    same = current is not None and labels_now.get(LABEL_BUILD_HASH) == wanted
    if same and not refresh:
        return dict(changed=False, id=current.id, build_hash=wanted, refreshed=False, packages_changed=False,
                    squid_version=labels_now.get(LABEL_SQUID_VERSION),
                    squid_package=labels_now.get(LABEL_SQUID_PACKAGE), log='')

    def _build(labels: Dict[str, Any], nocache: bool = False, build_tag: str = tag) -> Tuple[Any, str]:
        try:
            image, logs = client.images.build(
                fileobj=context_tar(containerfile, extra_files), custom_context=True,
                dockerfile='Containerfile', tag=build_tag, buildargs=args, labels=labels,
                network_mode=network_mode, rm=True, forcerm=True, pull=False, timeout=timeout, nocache=nocache)
        except Exception as exc:
            log = getattr(exc, 'build_log', None) or []
            text = ''.join(chunk.get('stream', '') or chunk.get('error', '')
                           for chunk in log if isinstance(chunk, dict))
            raise ImageError('Building %s failed: %s\n%s' % (tag, dc.api_message(exc), text[-3000:]))
        text = ''.join(chunk.get('stream', '') for chunk in logs if isinstance(chunk, dict))
        return image, text

    # A refresh is built under a scratch tag first, so the current image keeps its tag until
    # the fresh one is known to differ.
    scratch = '%s:%s-pi-egress-refresh' % _split_tag(tag) if refresh else tag
    image, log = _build({LABEL_BUILD_HASH: wanted}, nocache=bool(refresh), build_tag=scratch)
    if not squid:
        if scratch != tag:
            _retag(client, image.id, tag, scratch)
        return dict(changed=True, id=image.id, build_hash=wanted, squid_version=None, squid_package=None,
                    refreshed=bool(refresh), packages_changed=None, log=log[-4000:])
    facts = inspect_image(client, image.id, tag)
    before = None
    if refresh and same:
        before = labels_now.get(LABEL_PACKAGES)
        if not before:  # an image built before the packages label: look inside it
            before = inspect_image(client, current.id, tag)['packages_digest']
    if before and before == facts['packages_digest']:
        # Nothing new on the mirror: keep the image the proxy runs, drop the fresh one.
        _untag(client, scratch)
        return dict(changed=False, id=current.id, build_hash=wanted, refreshed=True, packages_changed=False,
                    squid_version=labels_now.get(LABEL_SQUID_VERSION),
                    squid_package=labels_now.get(LABEL_SQUID_PACKAGE), log=log[-4000:])
    # Same context, now with the version labels: every layer comes from the cache.
    labels = {LABEL_BUILD_HASH: wanted, LABEL_SQUID_VERSION: facts['squid_version']}
    if facts['squid_package']:
        labels[LABEL_SQUID_PACKAGE] = facts['squid_package']
    if facts['packages_digest']:
        labels[LABEL_PACKAGES] = facts['packages_digest']
    image, more = _build(labels, build_tag=scratch)
    if scratch != tag:
        _retag(client, image.id, tag, scratch)
    return dict(changed=True, id=image.id, build_hash=wanted, squid_version=facts['squid_version'],
                squid_package=facts['squid_package'], refreshed=bool(refresh),
                packages_changed=bool(refresh) or None, log=(log + more)[-4000:])


def inspect_image(client: Any, image_id: str, tag: str) -> Dict[str, Optional[str]]:
    """Run :data:`INSPECT_SCRIPT` in ``image_id`` (no network); ImageError without a squid that reports a version."""
    try:
        out = client.containers.run(image_id, ['sh', '-c', INSPECT_SCRIPT], remove=True, network_mode='none')
    except Exception as exc:
        raise ImageError('The built image %s does not run squid -v: %s' % (tag, dc.api_message(exc)))
    facts = parse_inspect(out.decode('utf-8', 'replace') if isinstance(out, bytes) else str(out))
    if not facts['squid_version']:
        raise ImageError('The built image %s has no squid that reports its version.' % tag)
    return facts


def _retag(client: Any, image_id: str, tag: str, scratch: str) -> None:
    repo, tagname = _split_tag(tag)
    try:
        client.api.tag(image_id, repo, tagname, force=True)
    except Exception as exc:
        raise ImageError('Tagging the refreshed image %s as %s failed: %s' % (image_id, tag, dc.api_message(exc)))
    _untag(client, scratch)


def _untag(client: Any, scratch: str) -> None:
    try:
        client.api.remove_image(scratch, noprune=False)
    except Exception:  # a scratch tag left behind is harmless; the next refresh overwrites it
        pass


# --- what egress_image does with a client -----------------------------------------------------
def module_security(params: dict[str, Any], result: dict[str, Any]) -> tuple[dict[str, str], str | None]:
    """(the build arguments of the image's security suite, a warning or None); ``result`` gets the mirror
    and where it came from. Only for a Containerfile that declares ``ARG SECURITY_MIRROR``."""
    if not wants_security_args(params['containerfile']):
        return {}, None
    mirror, source = choose_security_mirror(params['security_mirror'], host_sources())
    result.update(security_mirror=mirror, security_source=source)
    if mirror is not None:
        return security_buildargs(mirror, params['base_suite']), None
    return security_buildargs(mirror, params['base_suite']), (
        'The proxy image %s gets no Debian security suite (security_mirror is empty, role variable '
        'egress_proxy_security_mirror): it takes no security updates. Set it to a security archive the build '
        'can reach, e.g. %s.' % (params['name'], DEFAULT_SECURITY_MIRROR))


def ensure_image(client: Any, params: dict[str, Any], buildargs: dict[str, str], result: dict[str, Any],
                 check_mode: bool = False) -> dict[str, Any]:
    """egress_image's run: the base (built by debootstrap when asked), then the image (built only when its
    build hash differs, or refreshed). Fills and returns ``result``; raises ImageError or EngineError."""
    p = params
    files = dict((str(k), str(v)) for k, v in p['files'].items())
    if p['unless_present'] and dc.get_image(client, p['unless_present']) is not None:
        result['present_instead'] = p['unless_present']
        return result
    base = dc.get_image(client, p['base_image'])
    if base is None:
        if p['base_build'] != 'debootstrap':
            raise ImageError('Base image %s is not on this daemon and no registry is used. Set base_build: '
                             'debootstrap (role variable egress_proxy_base_build) to build it from the host\'s '
                             'Debian mirror.' % p['base_image'])
        mirror = p['mirror'] or debian_mirror(host_sources())
        if not mirror:
            raise ImageError('No Debian mirror found in /etc/apt/sources.list*; set mirror '
                             '(egress_proxy_debian_mirror).')
        result.update(mirror=mirror, changed=True, base_built=True)
        if check_mode:
            return result
        build_base(client, p['base_image'], p['base_suite'], mirror)
    if check_mode:
        base = dc.get_image(client, p['base_image'])
        args = {'BASE_IMAGE': p['base_image']}
        args.update(buildargs)
        wanted = build_hash(p['containerfile'], base.id, args, files)
        current = dc.get_image(client, p['name'])
        labels = (current.labels or {}) if current else {}
        result.update(build_hash=wanted, id=current.id if current else None,
                      squid_version=labels.get(LABEL_SQUID_VERSION), squid_package=labels.get(LABEL_SQUID_PACKAGE),
                      changed=labels.get(LABEL_BUILD_HASH) != wanted or p['refresh'], refreshed=p['refresh'])
        return result
    built = build_image(client, p['name'], p['containerfile'], p['base_image'], files,
                        squid=p['squid'], buildargs=buildargs, refresh=p['refresh'])
    result.update(id=built['id'], build_hash=built['build_hash'], squid_version=built['squid_version'],
                  squid_package=built['squid_package'], refreshed=built['refreshed'])
    if p['refresh']:
        result['packages_changed'] = built['packages_changed']
    result['changed'] = result['changed'] or built['changed']
    return result
