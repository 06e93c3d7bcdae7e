# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The doctor's line catalogue: every line doctor can print, and the :class:`Line` model.

:data:`LINES` has one row per line id: (id, group, usual status, shape), the shape being the line's wording with
``<placeholders>``. ``docs/doctor.md`` has one row per id, and a unit test rebuilds that table from this one. A
:class:`Line` refuses an id that is not in the catalogue, and redacts credentials from its message and fix.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import redact as _redact

STATUSES = ('ok', 'warn', 'fail', 'notrun')
SYMBOLS = {'ok': u'\u2713', 'warn': u'\u26a0', 'fail': u'\u2717', 'notrun': u'\u25cb'}
GROUPS = (
    ('egress', 'Egress layer'),
    ('proxy', 'Egress proxy'),
    ('canary', 'Egress canary'),
    ('endpoints', 'Model endpoints'),
    ('overlay', 'Overlay models.json and allowlist'),
    ('decisions', 'Decision log'),
    ('isolation', 'Job networks'),
    ('firewall', 'Host firewall layer'),
    ('transparent', 'Transparent job networks'),
    ('credentials', 'Credential placeholders'),
    ('openshell', 'OpenShell policy'),
    ('forge', 'Forges'),
    ('leftovers', 'Leftovers of earlier doctor runs'),
)


# --- a line through a proxy shard: the proxy's line, renamed ------------------------------------------

def shard_line_id(line_id: str) -> str:
    """The id of ``line_id``'s variant through a shard (``canary.deny`` -> ``canary.shard_deny``)."""
    group, _dot, rest = line_id.partition('.')
    return '%s.shard_%s' % (group, rest)


def via_shard(text: str, shard: str) -> str:
    """``text`` (a canary or endpoint line, or its shape) said of the probe through ``shard``. Pure.

    The shard goes into the head, before the first `` (``: "... through the proxy" becomes
    "... through <shard>", a head ending in "through" gets the shard, any other head
    " through <shard>".
    """
    head, sep, tail = text.partition(' (')
    if head.endswith(' through the proxy'):
        head = head[:-len('the proxy')] + shard
    elif head.endswith(' through'):
        head = '%s %s' % (head, shard)
    else:
        head = '%s through %s' % (head, shard)
    return head + sep + tail


def through_shards(rows: List[Tuple[str, str, str, str]], line_ids: Sequence[str]) -> List[Tuple[str, str, str, str]]:
    """The catalogue rows of ``line_ids``' variants through a shard: same group and status, via_shard() wording."""
    by_id = dict((row[0], row) for row in rows)
    return [(shard_line_id(line_id), by_id[line_id][1], by_id[line_id][2], via_shard(by_id[line_id][3], '<shard>'))
            for line_id in line_ids]


# Every line doctor can print: id -> (group, status, shape), the shape with <placeholders> (docs/doctor.md has a row
# per id, rebuilt by a unit test). A line's status may differ from the shape's only where the docs note it.
LINES: List[Tuple[str, str, str, str]] = [
    # The egress layer switched off (egress_enabled: false; _doctor/off.py): the only line of such a run.
    ('egress.off', 'egress', 'warn',
     'Egress layer off (egress_enabled: false): jobs run on the default network with the whole network in front '
     'of them, and nothing else was checked'),
    ('egress.off_openshell', 'egress', 'fail',
     'Egress layer off (egress_enabled: false) while the OpenShell venue is configured (<what>): its sandbox '
     'policy is that venue\'s egress control and the only path its credentials resolve through, so off has no '
     'meaning there'),
    ('proxy.running', 'proxy', 'ok', 'Egress proxy running (<proxy>)'),
    ('proxy.missing', 'proxy', 'fail',
     'Egress proxy missing: there is no container <proxy>, so every new job is refused'),
    ('proxy.stopped', 'proxy', 'fail', 'Egress proxy stopped (<proxy> is <state>), so every new job is refused'),
    ('proxy.health', 'proxy', 'ok', 'Egress proxy health: <health>'),
    ('proxy.limits_unenforced', 'proxy', 'warn', 'Egress proxy limits not enforced: <engine> on a cgroup v<version> '
     'host applies no memory or pids limit to <proxy> (it reports Memory=<memory>, PidsLimit=<pids>); a job that '
     'floods the proxy can take the host\'s memory and processes'),  # rootless on cgroup v1, with the consent
    # Proxy shards (_doctor/shards.py): only when the proxy has shards.
    ('proxy.shards', 'proxy', 'ok', 'Egress proxy family of <count>, with state, health and job networks: <members>'),
    ('proxy.shard_stopped', 'proxy', 'fail', 'Egress proxy shard stopped (<shard> is <state>): <what>'),
    ('proxy.shard_health', 'proxy', 'warn', 'Egress proxy shard health: <shard> is <health>'),
    ('proxy.shards_serving', 'proxy', 'warn',
     'Egress proxy down, shards serving: <count> job networks on <shards> still have egress through them; new jobs '
     'are refused until <proxy> runs again, and the checks below ran through the shards'),
    ('proxy.shards_unread', 'proxy', 'warn',
     'Egress proxy shards could not be listed (<why>), so the canary ran through the proxy only'),
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
    ('canary.probe_image', 'canary', 'ok',
     "Egress canary probes ran from <fallback>, the collection's probe image, because <image> is not on this daemon: "
     "they prove the proxy, not the job image's own client stack"),
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
    ('canary.sni', 'canary', 'ok',
     'Egress policy cuts a tunnel whose TLS name is not its CONNECT host (CONNECT <provider>:443 carrying '
     'a hello for <deny>: the TLS name check cut it, nothing was answered)'),
    ('canary.sni_leaks', 'canary', 'fail',
     "Egress policy lets a listed host's tunnel carry TLS for another name (CONNECT <provider>:443 with "
     'the hello for <deny> got HTTP <code>: domain fronting passes)'),
    ('canary.tunnel_plain', 'canary', 'ok',
     'Egress policy cuts plain bytes in a tunnel to 443 (a plain GET inside CONNECT <provider>:443: the '
     'TLS name check cut it, nothing was answered)'),
    ('canary.tunnel_plain_leaks', 'canary', 'fail',
     'Egress policy lets plain bytes through a tunnel to 443 (a plain GET inside CONNECT <provider>:443 '
     'got HTTP <code>: any protocol passes on 443)'),
    ('canary.notrun', 'canary', 'notrun', 'Egress canary probe <probe> did not run (<why>)'),
    ('canary.setup', 'canary', 'notrun', 'Egress canary could not be set up (<why>), so no probe ran'),
    ('canary.cleanup_kept', 'canary', 'warn',
     'Egress canary: <net> is kept, because the probe <probe> could not be removed and the network is the only '
     'way left to find it: docker rm -f <probe>'),
    ('canary.cleanup_keeper', 'canary', 'warn',
     'Egress canary: <net> is kept with <proxy> on it, because <engine> runs rootless and <proxy> is the only '
     'running container on its rootless network: ... The keeper that holds it through the detach could not '
     'start: <why>. Nothing was detached.'),
    ('canary.cleanup_rm', 'canary', 'warn',
     'Egress canary: the network <net> could not be removed: docker network rm <net>'),
]
# The canary and the model endpoint probes through each running proxy shard: the proxy's lines, renamed.
LINES += through_shards(LINES, ('canary.provider', 'canary.provider_unreached', 'canary.deny', 'canary.deny_leaks',
                                'canary.plain', 'canary.plain_leaks', 'canary.sni', 'canary.sni_leaks',
                                'canary.tunnel_plain', 'canary.tunnel_plain_leaks', 'canary.notrun', 'canary.setup'))
LINES += [
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
    ('endpoint.tunnel', 'endpoints', 'ok',
     'Model endpoint <id> answers through the proxy (GET http://<address>/v1/models through a CONNECT tunnel: <code>)'),
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
    # An endpoint only an enabled MCP server of the overlay's mcp.json uses (_doctor/mcp.py; all its lines say so).
    ('endpoint.mcp_tunnel', 'endpoints', 'ok',
     'MCP server endpoint <id> answers through the proxy (GET http://<address>/v1/models through a CONNECT tunnel: '
     '<what>); an MCP server does not serve that path, so any answer proves the route'),
    ('endpoint.mcp_tunnel_fails', 'endpoints', 'warn',
     'MCP server endpoint <id> does not answer through the proxy (GET http://<address>/v1/models through a CONNECT '
     'tunnel: <what>)'),
    # The route to a model server on the host (_doctor/route.py): endpoints named by a host alias, measured table.
    ('endpoint.route', 'endpoints', 'ok', 'Model endpoint <id>: <host> reaches the host on <runtime>: <how>'),
    ('endpoint.route_none', 'endpoints', 'fail',
     'Model endpoint <id>: <host> does not reach the host on <runtime>: <why>'),
    ('endpoint.route_unmeasured', 'endpoints', 'notrun',
     'Model endpoint <id>: whether <host> reaches the host on <runtime> was not measured (measured: <measured>)'),
    ('endpoint.route_unread', 'endpoints', 'notrun',
     'Model endpoint <id>: the route to <host> was not judged, because the engine did not say what it is (<why>)'),
]
LINES += through_shards(LINES, ('endpoint.tunnel', 'endpoint.tunnel_fails', 'endpoint.mcp_tunnel',
                                'endpoint.mcp_tunnel_fails', 'endpoint.port_exact', 'endpoint.port_leaks',
                                'endpoint.plain', 'endpoint.plain_leaks', 'endpoint.notrun'))
LINES += [
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
    # The overlay's mcp.json (_doctor/mcp.py; doctor_mcp_json): the preflight's judgement of each enabled server.
    ('overlay.mcp_ok', 'overlay', 'ok',
     'Overlay mcp.json <path>: every enabled MCP server is one the proxy carries (<servers>)'),
    ('overlay.mcp_refused', 'overlay', 'fail',
     'Overlay mcp.json <path>: MCP server <name> (<url>): <why>; a job naming it is refused before it starts'),
    ('overlay.mcp_runner', 'overlay', 'warn',
     'Overlay mcp.json <path>: MCP server <name> runs <runner>, which fetches its package from <registries>: <what> '
     'not listed, so the server cannot start in the job'),
    ('overlay.mcp_unread', 'overlay', 'fail', 'Overlay mcp.json <path> could not be judged: <why>'),
    # The decision log (_doctor_decisions): the last hour's refusals, the doctor's own probes left out.
    ('decisions.quiet', 'decisions', 'ok',
     'Decision log: no job was refused in the last <window> (<count> decisions read from <files> files in <folder>)'),
    ('decisions.refusals', 'decisions', 'warn',
     'Decision log: <count> requests refused in the last <window>; top hosts: <hosts>; jobs: <jobs>; reasons: '
     '<reasons>'),
    ('decisions.missing', 'decisions', 'warn',
     'Decision log: <folder> does not exist, so no decision of this proxy is recorded'),
    ('decisions.unreadable', 'decisions', 'warn', 'Decision log: <folder> could not be read (<why>)'),
    ('isolation.peers', 'isolation', 'ok',
     'Job-to-job isolation: <peer a> on <net a> and <peer b> on <net b> each reach the proxy and not each other '
     '(by name, by address, nor through the proxy\'s address on the other network)'),
    ('isolation.leaks', 'isolation', 'fail', 'Job-to-job isolation is broken: <what>'),
    ('isolation.proxy_unreached', 'isolation', 'fail',
     'Job-to-job isolation: <peer> on <net> does not reach the proxy (<what>), so a job there gets no egress'),
    ('isolation.notrun', 'isolation', 'notrun', 'Job-to-job isolation was not checked (<why>)'),
    ('isolation.cleanup', 'isolation', 'warn', 'Job-to-job isolation: <net> could not be torn down (<why>)'),
    # The host firewall layer (_doctor/firewall.py).
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
     'Job network gateway answered although the host firewall layer is installed (<gateway>:<port> on <net>: <how>)'),
    ('firewall.probe_notrun', 'firewall', 'notrun', 'Job network gateway probe did not run (<why>)'),
    ('firewall.leftover', 'firewall', 'ok',
     'Firewall probe: removed <net> (and <probe>), left by an EARLIER doctor run'),
    ('firewall.cleanup', 'firewall', 'warn', 'Firewall probe: <what> could not be removed (<why>)'),
    # Transparent job networks (_doctor/transparent.py): only when the run names a gateway.
    ('transparent.gateway', 'transparent', 'ok',
     'Egress gateway running (<gateway>), serving <count> transparent job networks; <dropped> packets dropped so far'),
    ('transparent.gateway_missing', 'transparent', 'fail',
     'Egress gateway missing: there is no container <gateway>, so every transparent job is refused'),
    ('transparent.gateway_stopped', 'transparent', 'fail',
     'Egress gateway stopped (<gateway> is <state>), so every transparent job is refused'),
    ('transparent.gateway_unread', 'transparent', 'warn',
     'Egress gateway <gateway> could not be inspected or read (<why>)'),
    ('transparent.wide', 'transparent', 'warn',
     'Transparent job network <network> opens <ports> towards every name its resolver answers (<policy>)'),
    ('transparent.https', 'transparent', 'ok',
     'Transparent job reaches https://<provider>/ with no proxy variable (HTTP <code>, through the '
     'gateway and the proxy)'),
    ('transparent.https_unreached', 'transparent', 'warn',
     'Transparent job does not reach https://<provider>/ (curl exit <code>)'),
    ('transparent.http', 'transparent', 'ok',
     'Transparent job reaches http://<provider>/ with no proxy variable (HTTP <code>, through the gateway '
     'and the proxy)'),
    ('transparent.http_unreached', 'transparent', 'warn',
     'Transparent job does not reach http://<provider>/ (curl exit <code>)'),
    ('transparent.deny', 'transparent', 'ok',
     'Transparent job cannot resolve the unlisted <deny>, so it reaches nothing there'),
    ('transparent.deny_leaks', 'transparent', 'fail',
     'Transparent job resolves or reaches the unlisted <deny> (curl exit <code>, HTTP <http>)'),
    ('transparent.dns', 'transparent', 'ok',
     'Transparent job gets NXDOMAIN for <unique>.<deny> from the gateway itself, which sends no uncovered '
     'name anywhere (<count> answered so)'),
    ('transparent.dns_leaks', 'transparent', 'fail',
     "Transparent job's lookup of <unique>.<deny> was not answered NXDOMAIN by the gateway (curl exit "
     "<code>; gateway NXDOMAIN count <count>): a DNS label may leave"),
    ('transparent.drop', 'transparent', 'ok',
     "Transparent job's TCP <port> and UDP 123, not opted in, go nowhere: the gateway dropped <count> packets "
     "of its network"),
    ('transparent.drop_leaks', 'transparent', 'fail',
     "Transparent job's ports that are not opted in are not dropped (TCP <port> connected: <yes/no>; gateway "
     "drops <count>)"),
    ('transparent.port', 'transparent', 'ok',
     'Transparent job reaches the opted-in <host:port> through the gateway'),
    ('transparent.port_unreached', 'transparent', 'warn',
     'Transparent job does not reach the opted-in <host:port> (curl exit <code>)'),
    ('transparent.notrun', 'transparent', 'notrun',
     'Transparent canary probe <probe> did not run (the probe printed no result for it)'),
    ('transparent.setup', 'transparent', 'notrun',
     'Transparent canary could not be set up (<why>), so no probe ran'),
    # Credential placeholders (_doctor/credentials.py): only when egress-credentials.json declares one.
    ('credentials.declaration_refused', 'credentials', 'fail',
     'Credential declaration refused, so every job is refused before it starts: <why>'),
    ('credentials.interceptor', 'credentials', 'ok',
     'Credential interceptor running (<interceptor>), <count> credentials bound: <name> on <host>, ...'),
    ('credentials.interceptor_missing', 'credentials', 'fail',
     'Credential interceptor missing: there is no container <interceptor>, so every request to a bound host is cut'),
    ('credentials.interceptor_stopped', 'credentials', 'fail',
     'Credential interceptor stopped (<interceptor> is <state>), so every request to a bound host is cut'),
    ('credentials.interceptor_unread', 'credentials', 'warn',
     'Credential interceptor <interceptor> could not be inspected (<why>)'),
    ('credentials.secret_unusable', 'credentials', 'fail',
     'Credential <name> cannot be used, so every job is refused before it starts: <problem>'),
    ('credentials.swap', 'credentials', 'ok',
     'Credential <name> swapped on <host>: the canary job sent only its placeholder and https://<host><path> '
     'answered HTTP <code> (a key the provider refuses gets 401)'),
    ('credentials.swap_rejected', 'credentials', 'fail',
     'Credential <name>: https://<host><path> answered HTTP <code> to the request the interceptor completed with '
     'the secret from <file>, so the provider does not take that secret'),
    ('credentials.swap_refused', 'credentials', 'fail',
     'Credential <name>: the interceptor refused the canary job\'s placeholder on https://<host><path> (<reason>), '
     'so no job gets the secret through'),
    ('credentials.swap_unreached', 'credentials', 'warn',
     'Credential <name>: the canary job did not reach https://<host><path> through the proxy and the interceptor '
     '(curl exit <n>, CONNECT answered <code>)'),
    ('credentials.swap_unproven', 'credentials', 'warn',
     'Credential <name>: https://<host><path> answered HTTP <code> to the canary job\'s request, which proves the '
     'chain but not that the provider takes the secret'),
    ('credentials.elsewhere', 'credentials', 'ok',
     'Credential <name>\'s placeholder sent in the header of <other bound host> (or, with one bound host, in the '
     'URL of its own) is refused by the interceptor (placeholder-elsewhere, HTTP 403) and reaches nothing'),
    ('credentials.elsewhere_passed', 'credentials', 'fail',
     'Credential <name>: the placeholder sent in the header (or URL) of <host> was not refused as misplaced '
     '(HTTP <code>, <what answered>)'),
    ('credentials.elsewhere_unreached', 'credentials', 'warn',
     'Credential <name>: the placeholder sent in the header (or URL) of <host> got no answer (curl exit <n>, '
     'CONNECT answered <code>), so its refusal is not proven'),
    ('credentials.secret_unseen', 'credentials', 'ok',
     'The canary job never saw a real secret: its environment held placeholders only, and what <hosts> answered '
     'reached it without one (<count> secrets searched for, on the host)'),
    ('credentials.secret_seen', 'credentials', 'fail',
     'The canary job saw the real secret of <name> (in its environment or an answer it got), so a job can read it '
     'and send it anywhere its allowlist reaches'),
    ('credentials.notrun', 'credentials', 'notrun',
     'Credential canary probe for <name> did not run (the probe printed no result for it)'),
    ('credentials.setup', 'credentials', 'notrun',
     'Credential canary could not be set up (<why>), so no probe ran'),
    # OpenShell policy (_doctor/openshell.py): only when openshell_policy names the deployed policy file.
    ('openshell.policy', 'openshell', 'ok',
     'OpenShell policy <path> reads back as the current sources in <deploy_dir> render (<n> endpoints, <n> rules)'),
    ('openshell.policy_differs', 'openshell', 'fail',
     'OpenShell policy <path> differs from what the current sources in <deploy_dir> render in <n> endpoints: '
     '<host:port>: <missing, added or changed>; ...'),
    ('openshell.policy_missing', 'openshell', 'fail',
     'OpenShell policy file <path> cannot be used (<why>), so the openshell venue has no policy the current '
     'sources render'),
    ('openshell.untranslatable', 'openshell', 'fail',
     'OpenShell policy cannot be rendered from the current sources in <deploy_dir>, so <path> cannot be checked '
     'and the openshell venue refuses every job: <where>: <entry>: <reason>; ...'),
    ('openshell.package_missing', 'openshell', 'warn',
     'OpenShell policy <path> not compared: the Python package openshell (pinned <version>) cannot be imported on '
     'this host, and it carries the schema the comparison parses both policies with'),
    ('openshell.unchecked', 'openshell', 'warn',
     'OpenShell policy <path> could not be compared with the sources (<why>)'),
    # ... and when openshell_gateway names a gateway and a sandbox: the policy it enforces, fetched.
    ('openshell.gateway_policy', 'openshell', 'ok',
     'OpenShell policy of <gateway, sandbox, workspace> reads back as the current sources in <deploy_dir> render '
     '(<n> endpoints, <n> rules)'),
    ('openshell.gateway_differs', 'openshell', 'fail',
     'OpenShell policy of <gateway, sandbox, workspace> differs from what the current sources in <deploy_dir> '
     'render in <n> endpoints: <host:port>: <missing, added or changed>; ...'),
    ('openshell.gateway_unread', 'openshell', 'fail',
     'OpenShell policy of <gateway, sandbox, workspace> could not be fetched (<why>), so no job there runs under a '
     'policy read back'),
    # Forges (_doctor/forge.py): one line per configured forge URL (doctor_forge_urls, GITLAB_URL, FORGEJO_URL).
    ('forge.ok', 'forge', 'ok',
     'Forge <name> <url> is https:// on 443 and its host is <listed>, so a job\'s git and the forge\'s API go '
     'through the proxy'),
    ('forge.http', 'forge', 'warn',
     'Forge <name> <url> is http://: git ignores HTTP_PROXY for an http:// remote, so a job\'s push and fetch never '
     'go through the proxy and fail from behind the job network, on any port'),
    ('forge.port', 'forge', 'warn',
     'Forge <name> <url> is https:// on port <port>: the proxy refuses a CONNECT to any port but 443, so a job\'s '
     'git and API calls to it fail'),
    ('forge.unlisted', 'forge', 'warn',
     'Forge <name> <url>: <host> is not in the allowlist, so the proxy refuses a job\'s git and API calls to it'),
    ('forge.unparsed', 'forge', 'warn', 'Forge <name> <url> is not an http:// or https:// URL with a host'),
    ('leftovers.unlisted', 'leftovers', 'warn',
     'Egress canary: leftovers from an EARLIER doctor run could not be listed: docker network ls --filter '
     'name=pi-dispatch-egress-doctor-'),
    ('leftovers.remote', 'leftovers', 'warn',
     'Egress canary: <net> may be left over from an EARLIER doctor run, and is not swept because this shell\'s '
     'docker CLI <what it resolved>, so a pid that is dead here may be alive there'),
    ('leftovers.unreadable', 'leftovers', 'warn',
     'Egress canary: the network <net> could not be read: <command>'),
    ('leftovers.kept', 'leftovers', 'warn',
     'Egress canary: <net> is kept, because the probe <probe> could not be removed and the network is the only '
     'way left to find it: docker rm -f <probe>'),
    ('leftovers.removed', 'leftovers', 'ok',
     'Egress canary: removed <net> (after removing <probes> and detaching <endpoints>), left by an EARLIER doctor run'),
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


def shape(line_id: str, **values: str) -> str:
    """The catalogue's wording of ``line_id``, each ``<key>`` of ``values`` filled in."""
    text = _BY_ID[line_id][3]
    for key, value in values.items():
        text = text.replace('<%s>' % key, value)
    return text


class Line(object):
    """One doctor line: id, status (ok/warn/fail/notrun), message, fix command."""

    def __init__(self, line_id: str, status: str, message: str, fix: Optional[str] = None) -> None:
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
    def group(self) -> str:
        return _BY_ID[self.id][1]

    def as_dict(self) -> Dict[str, Any]:
        return dict(id=self.id, status=self.status, message=_redact.redact(self.message),
                    fix=_redact.redact(self.fix) or None)

    def __repr__(self) -> str:
        return 'Line(%r, %r, %r, %r)' % (self.id, self.status, self.message, self.fix)
