"""Inputs by URL: media fetches an https URL a user names, behind an SSRF guard, and
stores what it answers with the checks of an upload (ImportAsset).

- services/kit/addresses.py (shared with creation's webhooks): which addresses a fetch
  may connect to (public ones only);
- fetch.py: the fetch itself (resolve, check, connect to the checked address, TLS for
  the host name, bounded redirects, size, type and time limits);
- importer.py: the fetch stored as the owner's input asset, repeatable under a key.
"""

from services.kit.addresses import AddressPolicy
from services.media.imports.fetch import FetchLimits, UrlFetcher, import_tls
from services.media.imports.importer import Importer

__all__ = ["AddressPolicy", "FetchLimits", "Importer", "UrlFetcher", "import_tls"]
