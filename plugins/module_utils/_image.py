# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""Building the proxy image locally, with no registry.

* :func:`debian_mirror` reads the host's apt sources (one-line ``.list`` and
  deb822 ``.sources``) and returns the Debian mirror apt already uses, so an
  air-gapped fleet builds its base from the mirror it trusts.
* :func:`build_base` runs ``debootstrap`` and imports the root file system.
* :func:`build_image` builds the Containerfile on that base with the build
  context made in memory, and labels the result with a build hash (for
  idempotence) and the squid version found inside it.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import glob
import hashlib
import io
import os
import re
import shutil
import subprocess
import tarfile
import tempfile

from ansible_collections.pi_dispatch.egress.plugins.module_utils import _docker_client as dc

LABEL_BUILD_HASH = 'io.pi-dispatch.egress.build-hash'
LABEL_SQUID_VERSION = 'io.pi-dispatch.egress.squid-version'
LABEL_BASE = 'io.pi-dispatch.egress.base'

_SKIP_SUITE = re.compile(r'-(security|updates|backports|proposed-updates)$')


class ImageError(Exception):
    pass


def _one_line_sources(text):
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


def _deb822_sources(text):
    for stanza in re.split(r'\n\s*\n', text):
        fields = {}
        for raw in stanza.splitlines():
            if raw.startswith('#') or ':' not in raw or raw[:1].isspace():
                continue
            key, value = raw.split(':', 1)
            fields[key.strip().lower()] = value.strip()
        if 'deb' not in fields.get('types', '').split() or fields.get('enabled', 'yes').lower() == 'no':
            continue
        for uri in fields.get('uris', '').split():
            yield uri, fields.get('suites', '').split()


def debian_mirror(sources):
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


def host_sources(root='/etc/apt'):
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


def build_hash(containerfile, base_id, buildargs, extra_files):
    digest = hashlib.sha256()
    digest.update(containerfile.encode('utf-8'))
    digest.update(b'\0' + (base_id or '').encode('utf-8'))
    for key in sorted(buildargs):
        digest.update(('\0%s=%s' % (key, buildargs[key])).encode('utf-8'))
    for name in sorted(extra_files):
        digest.update(('\0%s\0' % name).encode('utf-8') + extra_files[name].encode('utf-8'))
    return digest.hexdigest()[:32]


def context_tar(containerfile, extra_files):
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


def parse_squid_version(text):
    match = re.search(r'Squid Cache: Version (\S+)', text)
    return match.group(1) if match else None


def build_base(client, tag, suite, mirror, workdir=None, variant='minbase'):
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
        repo, _sep, tagname = tag.rpartition(':')
        if not repo or '/' in tagname:
            repo, tagname = tag, 'latest'
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


def build_image(client, tag, containerfile, base_image, extra_files=None, network_mode='host', timeout=1800,
                squid=True):
    """Build ``tag`` unless an image with the same build hash exists.

    Returns dict(changed, id, squid_version, build_hash, log).
    """
    extra_files = extra_files or {}
    base = dc.get_image(client, base_image)
    if base is None:
        raise ImageError('Base image %s is not on the daemon. Set egress_proxy_base_build: debootstrap to build '
                         'it from the host\'s Debian mirror, or load it (docker load / docker import).' % base_image)
    buildargs = {'BASE_IMAGE': base_image}
    wanted = build_hash(containerfile, base.id, buildargs, extra_files)
    current = dc.get_image(client, tag)
    if current is not None and (current.labels or {}).get(LABEL_BUILD_HASH) == wanted:
        return dict(changed=False, id=current.id, build_hash=wanted,
                    squid_version=(current.labels or {}).get(LABEL_SQUID_VERSION), log='')

    def _build(labels):
        try:
            image, logs = client.images.build(
                fileobj=context_tar(containerfile, extra_files), custom_context=True,
                dockerfile='Containerfile', tag=tag, buildargs=buildargs, labels=labels,
                network_mode=network_mode, rm=True, forcerm=True, pull=False, timeout=timeout)
        except Exception as exc:
            log = getattr(exc, 'build_log', None) or []
            text = ''.join(chunk.get('stream', '') or chunk.get('error', '')
                           for chunk in log if isinstance(chunk, dict))
            raise ImageError('Building %s failed: %s\n%s' % (tag, dc.api_message(exc), text[-3000:]))
        text = ''.join(chunk.get('stream', '') for chunk in logs if isinstance(chunk, dict))
        return image, text

    image, log = _build({LABEL_BUILD_HASH: wanted})
    if not squid:
        return dict(changed=True, id=image.id, build_hash=wanted, squid_version=None, log=log[-4000:])
    try:
        out = client.containers.run(image.id, ['squid', '-v'], remove=True, network_mode='none')
    except Exception as exc:
        raise ImageError('The built image %s does not run squid -v: %s' % (tag, dc.api_message(exc)))
    version = parse_squid_version(out.decode('utf-8', 'replace') if isinstance(out, bytes) else str(out))
    if not version:
        raise ImageError('The built image %s has no squid that reports its version.' % tag)
    # Same context, now with the version label: every layer comes from the cache.
    image, more = _build({LABEL_BUILD_HASH: wanted, LABEL_SQUID_VERSION: version})
    return dict(changed=True, id=image.id, build_hash=wanted, squid_version=version, log=(log + more)[-4000:])
