# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The job subnet pool's defaults: the range every job network is cut from.

Policy, not mechanism: the destination guard refuses the pool, the endpoints include and the host
firewall name it, and ``_jobnets/pool.py`` picks a free subnet from it. Both are parameters
everywhere; these are the defaults.
"""

from __future__ import annotations

# Dedicated pool for job networks. 10.47.0.0/16 sits outside Docker's default
# address pools (172.17.0.0/16-172.31.0.0/16 and 192.168.0.0/16), Podman's
# (10.88.0.0/16, 10.89.0.0/16 onward), the Kubernetes defaults (10.96.0.0/12
# services, 10.244.0.0/16 flannel pods) and the GCP auto-mode range
# (10.128.0.0/9). Overlap with whatever THIS host uses is checked on every
# allocation regardless, so the choice only has to be unlikely, not safe.
DEFAULT_POOL = '10.47.0.0/16'
# A job network holds two endpoints (job + proxy) plus the bridge gateway: a
# /29 has 5 usable addresses (a /30 has 2, too few).
DEFAULT_PREFIX = 29
