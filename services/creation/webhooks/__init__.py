"""Webhooks: creation delivers job changes to the endpoints operators register (and to a
trusted caller's per-job endpoint), signed per Standard Webhooks, retried, at least once
(docs/webhooks.md).

- settings.py: ATELIER_WEBHOOK_*, validated at start;
- body.py: a delivery's JSON (the v1 Job as GetJob prints it, with the event's type and
  time);
- signing.py: secrets and the webhook-* headers;
- schedule.py: what an answer means (succeeded, retried when, failed, gone);
- deliverer.py: the component that claims, sends and records (store/webhook_deliveries.py
  holds its SQL; kit/outbound.py the SSRF-guarded HTTP client).
"""

# What other packages import from here (tests/unit/test_package_surfaces.py).
__all__ = ["deliverer", "settings", "signing"]
