"""Which adapter runs a model: chosen by the catalog's ``provider_code``.

Checked when the worker starts: an enabled model whose code has no adapter would fail
every job for it, so the worker refuses to start and names the models instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence

from sqlalchemy.ext.asyncio import AsyncEngine

from services.creation.providers.base import Provider
from services.creation.providers.stub import StubProvider
from services.creation.settings import CreationSettings
from services.creation.store.catalog import enabled_provider_codes


class UnknownProvider(KeyError):
    """No adapter has this provider code (a KeyError, so ``registry.get`` answers None)."""

    def __str__(self) -> str:
        return str(self.args[0])


class RegistryError(Exception):
    """The catalog names provider codes no adapter serves; the message lists them."""


def missing_adapters(enabled: Mapping[str, Sequence[str]], codes: Iterable[str]) -> list[str]:
    """One problem per provider code of ``enabled`` (code -> model ids) not in ``codes``."""
    known = set(codes)
    adapters = ", ".join(sorted(known)) or "none"
    problems = []
    for code, model_ids in sorted(enabled.items()):
        if code not in known:
            many = len(model_ids) > 1
            models = f"model{'s' if many else ''} {', '.join(model_ids)} use{'' if many else 's'}"
            problems.append(
                f"enabled {models} provider code {code!r}, which has no adapter"
                f" (adapters: {adapters})"
            )
    return problems


class ProviderRegistry(Mapping[str, Provider]):
    """The adapters by provider code: a read-only mapping, so the worker may take it
    wherever it takes ``Mapping[str, Provider]``."""

    def __init__(self, providers: Iterable[Provider]) -> None:
        self._providers: dict[str, Provider] = {}
        for provider in providers:
            if provider.code in self._providers:
                raise ValueError(f"two adapters have provider code {provider.code!r}")
            self._providers[provider.code] = provider

    def __getitem__(self, code: str) -> Provider:
        try:
            return self._providers[code]
        except KeyError:
            raise UnknownProvider(f"no adapter has provider code {code!r}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._providers)

    def __len__(self) -> int:
        return len(self._providers)

    @property
    def codes(self) -> frozenset[str]:
        return frozenset(self._providers)

    def problems(self, enabled: Mapping[str, Sequence[str]]) -> list[str]:
        return missing_adapters(enabled, self._providers)

    async def check_catalog(self, engine: AsyncEngine) -> None:
        """Raises RegistryError unless every enabled catalog model has an adapter."""
        problems = self.problems(await enabled_provider_codes(engine))
        if problems:
            raise RegistryError(
                "the catalog needs adapters this worker lacks:\n  " + "\n  ".join(problems)
            )

    async def close(self) -> None:
        for provider in self._providers.values():
            await provider.close()


def build_registry(settings: CreationSettings) -> ProviderRegistry:
    """Every adapter this build has, configured from the settings."""
    return ProviderRegistry([StubProvider.from_settings(settings)])
