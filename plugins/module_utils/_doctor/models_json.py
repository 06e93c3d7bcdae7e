# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The overlay ``models.json`` checks that doctor prints about model endpoints.

Pure logic: :func:`check` takes the file's text, the declared endpoints
(``_endpoints.Endpoint`` objects) and the allowlist's entries, and returns
:class:`Line` results, each with a status (``ok`` / ``warn`` / ``fail``), the
sentence doctor prints and the fix. :func:`read_text` is the only I/O.

The file is read the way pi reads it: ``//`` and ``/* */`` comments, a
byte order mark and trailing commas are fine; a wrong-typed field anywhere
makes pi drop the whole file, so such a file is refused here too, and no
provider in it is keyless.
"""

from __future__ import annotations

import errno
import ipaddress
import json
from typing import Any, Callable, Collection, Dict, List, Optional, Sequence, Tuple
from urllib.parse import urlsplit

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import jsonc as _jsonc
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import allowlist as _allowlist
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import endpoints as _endpoints

KEYLESS_VAR = 'PI_DISPATCH_KEYLESS'
KEYLESS_API_KEY = '$' + KEYLESS_VAR
MAX_TOKENS = 'max_tokens'

# Providers pi knows (built into pi-ai). A provider under one of these names
# still needs its key, even with its baseUrl pointed at your own server.
KNOWN_PROVIDERS = frozenset((
    'anthropic', 'openai', 'google', 'google-vertex', 'google-gemini-cli', 'google-antigravity',
    'amazon-bedrock', 'azure-openai-responses', 'openai-codex', 'github-copilot', 'xai', 'groq',
    'cerebras', 'openrouter', 'vercel-ai-gateway', 'zai', 'mistral', 'minimax', 'minimax-cn',
    'huggingface', 'opencode', 'kimi-coding',
))

OK, WARN, FAIL = 'ok', 'warn', 'fail'
_MARK = {OK: '\u2713', WARN: '\u26a0', FAIL: '\u2717'}


class Line(object):
    """One doctor line: status, what it says, and the fix (empty when nothing to do)."""

    __slots__ = ('status', 'text', 'fix', 'kind')

    def __init__(self, status: str, text: str, fix: str = '', kind: str = '') -> None:
        self.status = status
        self.text = text
        self.fix = fix
        self.kind = kind

    def __str__(self) -> str:
        return '%s %s%s' % (_MARK[self.status], self.text, (' Fix: %s' % self.fix) if self.fix else '')

    def as_dict(self) -> Dict[str, Any]:
        return dict(status=self.status, text=self.text, fix=self.fix, kind=self.kind, line=str(self))

    def __repr__(self) -> str:
        return 'Line(%r, %r)' % (self.status, self.text)


# pi would refuse the file: ``where`` is a line/column or a field path (the reader is _common/jsonc.py).
ModelsJsonError = _jsonc.JsoncError
strip_jsonc = _jsonc.strip_jsonc
loads = _jsonc.loads


# --- the schema pi applies (wrong type anywhere: the whole file is dropped) ---------

def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _nonempty_str(v: Any) -> bool:
    return isinstance(v, str) and len(v) >= 1


def _str_map(v: Any) -> bool:
    return isinstance(v, dict) and all(isinstance(x, str) for x in v.values())


def _input_list(v: Any) -> bool:
    return isinstance(v, list) and all(x in ('text', 'image') for x in v)


def _cost(required: bool) -> Callable[[Any], bool]:
    def check(v: Any) -> bool:
        if not isinstance(v, dict):
            return False
        for key in ('input', 'output', 'cacheRead', 'cacheWrite'):
            if key in v:
                if not _is_num(v[key]):
                    return False
            elif required:
                return False
        return True
    return check


def _compat(v: Any) -> bool:
    if not isinstance(v, dict):
        return False
    field = v.get('maxTokensField', MAX_TOKENS)
    return field in ('max_completion_tokens', MAX_TOKENS)


_TYPE_TEXT = {
    _nonempty_str: 'a non-empty string', _str_map: 'an object of strings',
    _input_list: 'a list of "text" / "image"', _compat: 'an object (maxTokensField "max_tokens" or '
    '"max_completion_tokens")',
}

MODEL_FIELDS = dict(id=_nonempty_str, name=_nonempty_str, api=_nonempty_str, baseUrl=_nonempty_str,
                    reasoning=lambda v: isinstance(v, bool), input=_input_list, cost=_cost(True),
                    contextWindow=_is_num, maxTokens=_is_num, headers=_str_map, compat=_compat)
OVERRIDE_FIELDS = dict(name=_nonempty_str, reasoning=lambda v: isinstance(v, bool), input=_input_list,
                       cost=_cost(False), contextWindow=_is_num, maxTokens=_is_num, headers=_str_map,
                       compat=_compat)
PROVIDER_FIELDS = dict(name=_nonempty_str, baseUrl=_nonempty_str, apiKey=_nonempty_str, api=_nonempty_str,
                       headers=_str_map, compat=_compat, authHeader=lambda v: isinstance(v, bool))


def _describe(check: Callable[[Any], bool], key: str) -> str:
    if check in _TYPE_TEXT:
        return _TYPE_TEXT[check]
    if key == 'cost':
        return 'an object of numbers (input, output, cacheRead, cacheWrite)'
    if key in ('reasoning', 'authHeader'):
        return 'true or false'
    if check is _is_num:
        return 'a number'
    return 'of the right type'


def _check_fields(obj: Dict[str, Any], fields: Dict[str, Callable[[Any], bool]], where: str) -> None:
    for key, check in sorted(fields.items()):
        if key in obj and not check(obj[key]):
            raise ModelsJsonError('%s.%s is %s, which must be %s'
                                  % (where, key, json.dumps(obj[key])[:60], _describe(check, key)),
                                  '%s.%s' % (where, key))


def validate(data: Any) -> Dict[str, Any]:
    """Raise ModelsJsonError where pi would refuse the decoded file."""
    if not isinstance(data, dict):
        raise ModelsJsonError('the top level is not an object', 'root')
    if 'providers' not in data:
        raise ModelsJsonError('has no "providers" object', 'providers')
    providers = data['providers']
    if not isinstance(providers, dict):
        raise ModelsJsonError('providers must be an object', 'providers')
    for pname, prov in providers.items():
        where = 'providers.%s' % pname
        if not isinstance(prov, dict):
            raise ModelsJsonError('%s must be an object' % where, where)
        _check_fields(prov, PROVIDER_FIELDS, where)
        if 'models' in prov:
            if not isinstance(prov['models'], list):
                raise ModelsJsonError('%s.models must be a list' % where, '%s.models' % where)
            for index, model in enumerate(prov['models']):
                mwhere = '%s.models[%d]' % (where, index)
                if not isinstance(model, dict):
                    raise ModelsJsonError('%s must be an object' % mwhere, mwhere)
                if 'id' not in model:
                    raise ModelsJsonError('%s has no id (every model needs a non-empty string id)' % mwhere,
                                          '%s.id' % mwhere)
                _check_fields(model, MODEL_FIELDS, mwhere)
        if 'modelOverrides' in prov:
            overrides = prov['modelOverrides']
            if not isinstance(overrides, dict):
                raise ModelsJsonError('%s.modelOverrides must be an object' % where, '%s.modelOverrides' % where)
            for mid, override in overrides.items():
                owhere = '%s.modelOverrides.%s' % (where, mid)
                if not isinstance(override, dict):
                    raise ModelsJsonError('%s must be an object' % owhere, owhere)
                _check_fields(override, OVERRIDE_FIELDS, owhere)
    return data


# --- URLs --------------------------------------------------------------------------

def url_host_port(url: str) -> Optional[Tuple[str, int, bool]]:
    """(host, port, has_userinfo) of a baseUrl, host canonical; None when unparseable."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
        port = parts.port
    except ValueError:
        return None
    if not host or parts.scheme not in ('http', 'https'):
        return None
    host = host.lower()
    try:
        host = ipaddress.ip_address(host).compressed
    except ValueError:
        pass
    if port is None:
        port = 443 if parts.scheme == 'https' else 80
    return host, port, '@' in (parts.netloc or '')


def is_loopback_host(host: str) -> bool:
    if host == 'localhost' or host.endswith('.localhost'):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(address, 'ipv4_mapped', None)
    if mapped is not None:
        address = mapped
    return address.is_loopback or address.is_unspecified


# --- the checks --------------------------------------------------------------------

def _q(name: Any) -> str:
    return json.dumps(name)


def _max_tokens_field(provider: Dict[str, Any], model: Dict[str, Any]) -> Any:
    for source in (model.get('compat'), provider.get('compat')):
        if isinstance(source, dict) and 'maxTokensField' in source:
            return source['maxTokensField']
    return 'max_completion_tokens'


def _priced(model: Dict[str, Any]) -> bool:
    cost = model.get('cost')
    return isinstance(cost, dict) and any(_is_num(v) and v != 0 for v in cost.values())


def _api_key_problem(provider: Dict[str, Any]) -> Optional[str]:
    if 'apiKey' not in provider:
        return 'it has no apiKey (pi needs some key)'
    key = provider['apiKey']
    if key == KEYLESS_API_KEY:
        return None
    if key.startswith('!'):
        return 'its apiKey is a !command, not %s' % KEYLESS_API_KEY
    if key.startswith('$'):
        return 'its apiKey names another variable (%s), not %s' % (key, KEYLESS_API_KEY)
    return 'its apiKey is a literal key, not %s' % KEYLESS_API_KEY


def _credentials(pname: str, provider: Dict[str, Any]) -> List[str]:
    found = []
    if provider.get('headers'):
        found.append('headers on the provider')
    if 'oauth' in provider:
        found.append('oauth on the provider')
    for model in provider.get('models') or []:
        if model.get('headers'):
            found.append('headers on model %s' % _q(model.get('id')))
        if 'oauth' in model:
            found.append('oauth on model %s' % _q(model.get('id')))
    for mid, override in sorted((provider.get('modelOverrides') or {}).items()):
        if override.get('headers'):
            found.append('headers in modelOverrides.%s' % mid)
    for url, who in [(provider.get('baseUrl'), 'the provider')] + [
            (m.get('baseUrl'), 'model %s' % _q(m.get('id'))) for m in provider.get('models') or []]:
        parsed = url_host_port(url) if isinstance(url, str) else None
        if parsed and parsed[2]:
            found.append('user:password@ in the baseUrl of %s' % who)
    return found


def check(text: Optional[str], endpoints: Sequence[_endpoints.Endpoint], allowlist_hosts: Sequence[str] = (),
          known_providers: Collection[str] = KNOWN_PROVIDERS, path: str = 'models.json') -> List[Line]:
    """Doctor's lines about the overlay models.json against the declared endpoints.

    ``text`` is the file's content (None when there is no overlay file);
    ``endpoints`` the declared ``Endpoint`` objects; ``allowlist_hosts`` the
    allowlist's entries. Returns a list of :class:`Line`.
    """
    lines = []
    for entry in allowlist_hosts or ():
        if _allowlist.host_opening_entry(entry):
            lines.append(Line(WARN, '%s in egress-allowlist.conf opens the host\'s port 443 and port 80 to every '
                                    'job, and no model server port' % entry,
                              'remove it from egress-allowlist.conf and declare the model server in '
                              'model-endpoints.json instead', kind='allowlist'))
    if text is None:
        return lines
    try:
        data = validate(loads(text))
    except ModelsJsonError as exc:
        where = (' at %s' % exc.where) if exc.where else ''
        lines.append(Line(FAIL, 'Overlay %s is refused%s: %s. pi drops the whole file over this, so no model in '
                                'it loads and no provider in it is keyless' % (path, where, exc),
                          'fix that field (comments, a byte order mark and trailing commas are fine; a wrong '
                          'type is not)', kind='parse'))
        return lines

    by_address = dict(((e.host, e.port), e) for e in endpoints)
    by_host = {}
    for e in endpoints:
        by_host.setdefault(e.host, []).append(e)

    for pname in sorted(data['providers']):
        provider = data['providers'][pname]
        models = provider.get('models') or []
        reasons = []
        served = []
        on_endpoint = False
        if pname in known_providers:
            reasons.append('pi knows %s, so it needs its key' % pname)
        if not models:
            reasons.append('it defines no model')
        for model in models:
            mid = model['id']
            label = '%s/%s' % (_q(pname), _q(mid))
            url = model.get('baseUrl', provider.get('baseUrl'))
            parsed = url_host_port(url) if isinstance(url, str) else None
            if parsed is None:
                reasons.append('model %s has no usable http(s) baseUrl' % _q(mid))
                continue
            host, port, _userinfo = parsed
            if is_loopback_host(host):
                lines.append(Line(WARN, 'Overlay model %s has baseUrl %s, a loopback address: inside a job that is '
                                        'the job\'s own container, so no job ever reaches that server' % (label, url),
                                  'serve it where the proxy reaches it, declare it in model-endpoints.json, and '
                                  'point the baseUrl there', kind='loopback'))
            endpoint = by_address.get((host, port))
            if endpoint is None:
                near = by_host.get(host)
                if near:
                    lines.append(Line(WARN, 'Overlay model %s points at %s port %d, but the endpoint%s declared for '
                                            'that host %s port %s: host alone does not match, so it uses no '
                                            'endpoint and the proxy refuses its tunnel'
                                      % (label, host, port, 's' if len(near) > 1 else '',
                                         'use' if len(near) > 1 else 'uses',
                                         ', '.join('%d (%s)' % (e.port, e.id) for e in near)),
                                      'make the baseUrl\'s port the declared one, or declare %s port %d'
                                      % (host, port), kind='port-mismatch'))
                reasons.append('model %s is not served by a declared endpoint' % _q(mid))
                continue
            on_endpoint = True
            lines.append(Line(OK, 'Overlay model %s uses declared endpoint %s (%s)'
                              % (label, endpoint.id, endpoint.address), kind='uses'))
            if _priced(model) and _max_tokens_field(provider, model) != MAX_TOKENS:
                lines.append(Line(WARN, 'Overlay models.json sends the output cap of %s as max_completion_tokens '
                                        'to a declared model endpoint, which a local server may ignore (Ollama '
                                        'does), so under a dollar cap every call to it is refused as unboundable'
                                  % label,
                                  'add "compat": {"maxTokensField": "max_tokens"} to the model (or its provider)',
                                  kind='max-tokens'))
            if not endpoint.keyless:
                reasons.append('model %s is served by endpoint %s, which is not marked "keyless": true'
                               % (_q(mid), endpoint.id))
            elif endpoint.id not in served:
                served.append(endpoint.id)
        key_problem = _api_key_problem(provider)
        if key_problem:
            reasons.append(key_problem)
        creds = _credentials(pname, provider)
        if creds:
            reasons.append('it carries other credentials (%s); keyless means no credentials at all'
                           % ', '.join(creds))
        names_var = provider.get('apiKey') == KEYLESS_API_KEY
        if not reasons:
            lines.append(Line(OK, 'Provider key: none needed (%s is keyless: served by declared endpoint%s %s)'
                              % (pname, 's' if len(served) > 1 else '', ', '.join(served)), kind='keyless'))
        elif names_var:
            lines.append(Line(FAIL, 'Provider %s names %s but is not keyless: %s. Every job on it is refused '
                                    'before anything is spent' % (pname, KEYLESS_API_KEY, '; '.join(reasons)),
                              'give it a key (in .env or pi\'s auth.json), or a keyless endpoint: serve every '
                              'model of it from a declared endpoint marked "keyless": true, with no other '
                              'credential', kind='keyless'))
        elif on_endpoint:
            lines.append(Line(OK, 'Provider %s needs a key (not keyless: %s)' % (pname, '; '.join(reasons)),
                              'to run it with no key, serve every model of it from a declared endpoint marked '
                              '"keyless": true and set "apiKey": "%s", with no other credential'
                              % KEYLESS_API_KEY, kind='keyless'))
    return lines


def read_text(path: str) -> Tuple[Optional[str], Optional[Line]]:
    """(text, None) or (None, Line) for a file doctor cannot read. A missing file is (None, None)."""
    try:
        with open(path, 'rb') as handle:
            data = handle.read()
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        code = errno.errorcode.get(exc.errno, str(exc.errno))
        if exc.errno in (errno.EIO, errno.EMFILE, errno.ENFILE, errno.EAGAIN, errno.EINTR):
            return None, Line(WARN, 'could not read models.json (%s): %s' % (code, exc),
                              'a job meeting this is retried once, then failed; check the disk and the '
                              'open-file limit', kind='read')
        return None, Line(FAIL, 'models.json cannot be read (%s): %s. A job cannot read it either and loads none '
                                'of it, so every job is refused' % (code, exc),
                          'make the file and its folder readable by the worker\'s account', kind='read')
    try:
        return data.decode('utf-8'), None
    except UnicodeDecodeError as exc:
        return None, Line(FAIL, 'Overlay %s is refused: it is not UTF-8 (%s)' % (path, exc),
                          'save it as UTF-8', kind='parse')
