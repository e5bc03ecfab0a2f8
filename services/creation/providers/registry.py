"""Which adapter runs a model: chosen by the catalog's ``provider_code``.

Checked when the worker starts: an enabled model whose code has no adapter, or whose
adapter lacks its credential (a hosted vendor without its key), would fail every job for
it, so the worker refuses to start and names the models instead. A vendor whose key is
missing is fine while no enabled model uses it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence

from sqlalchemy.ext.asyncio import AsyncEngine

from services.creation.providers.base import Provider
from services.creation.providers.fal import FalProvider
from services.creation.providers.replicate import ReplicateProvider
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


def unconfigured_adapters(
    enabled: Mapping[str, Sequence[str]], unconfigured: Mapping[str, str]
) -> list[str]:
    """One problem per provider code of ``enabled`` whose adapter is not configured
    (``unconfigured``: code -> what is missing, e.g. the setting to set)."""
    problems = []
    for code, model_ids in sorted(enabled.items()):
        if code in unconfigured:
            problems.append(
                f"enabled model{'s' if len(model_ids) > 1 else ''} {', '.join(model_ids)}"
                f" need{'' if len(model_ids) > 1 else 's'} provider {code!r}, but"
                f" {unconfigured[code]}"
            )
    return problems


class ProviderRegistry(Mapping[str, Provider]):
    """The adapters by provider code: a read-only mapping, so the worker may take it
    wherever it takes ``Mapping[str, Provider]``."""

    def __init__(
        self, providers: Iterable[Provider], unconfigured: Mapping[str, str] | None = None
    ) -> None:
        # Adapters present but unusable until configured: code -> what is missing.
        self._unconfigured = dict(unconfigured or {})
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
        return missing_adapters(enabled, self._providers) + unconfigured_adapters(
            enabled, self._unconfigured
        )

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
    """Every adapter this build has, configured from the settings. A hosted vendor
    without its key is still registered (its models may be disabled); the catalog check
    refuses to start only when an enabled model needs it."""
    vendors = settings.providers
    unconfigured = {
        code: f"{setting} is not set"
        for code, setting, configured in (
            ("replicate", "ATELIER_REPLICATE_API_TOKEN", vendors.replicate.configured),
            ("fal", "ATELIER_FAL_KEY", vendors.fal.configured),
        )
        if not configured
    }
    return ProviderRegistry(
        [
            StubProvider.from_settings(settings),
            ReplicateProvider.from_settings(settings),
            FalProvider.from_settings(settings),
        ],
        unconfigured,
    )
