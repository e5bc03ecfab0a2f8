"""The hosted vendors' settings: keys as secrets (never echoed, never in a repr), base URLs
and limits per provider code, and the registry's start-up check that wants a key only
for a vendor an enabled model uses."""

from __future__ import annotations

import pytest

from services.creation.providers.registry import build_registry
from services.creation.settings import CreationSettings, ProviderLimit
from services.kit.settings import SettingsError

TOKEN = "r8_a-secret-token-0123456789abcdef"
KEY = "fal-id:fal-secret-0123456789abcdef"


def test_defaults_point_at_the_vendors_with_no_keys_and_inline_inputs() -> None:
    providers = CreationSettings.from_env({}).providers
    assert providers.replicate.base_url == "https://api.replicate.com"
    assert providers.fal.base_url == "https://queue.fal.run"
    assert not providers.replicate.configured and not providers.fal.configured
    assert providers.input_mode == "inline"
    assert providers.limits["stub"] == ProviderLimit()
    assert providers.limits["replicate"].max_in_flight > 0


def test_keys_urls_and_limits_are_read() -> None:
    providers = CreationSettings.from_env(
        {
            "ATELIER_REPLICATE_API_TOKEN": TOKEN,
            "ATELIER_REPLICATE_BASE_URL": "http://127.0.0.1:9999/",
            "ATELIER_FAL_KEY": KEY,
            "ATELIER_FAL_QUEUE_URL": "http://127.0.0.1:9998",
            "ATELIER_FAL_MAX_IN_FLIGHT": "3",
            "ATELIER_FAL_RATE": "0.5",
            "ATELIER_FAL_BURST": "4",
            "ATELIER_PROVIDER_INPUT": "url",
        }
    ).providers
    assert providers.replicate.api_key == TOKEN and providers.fal.api_key == KEY
    assert providers.replicate.base_url == "http://127.0.0.1:9999"
    assert providers.limits["fal"] == ProviderLimit(3, 0.5, 4)
    assert providers.input_mode == "url"


def test_no_key_shows_in_a_repr_of_the_settings() -> None:
    settings = CreationSettings.from_env(
        {"ATELIER_REPLICATE_API_TOKEN": TOKEN, "ATELIER_FAL_KEY": KEY}
    )
    for text in (repr(settings), str(settings), repr(settings.providers)):
        assert TOKEN not in text and KEY not in text


def test_a_short_key_is_refused_without_being_echoed() -> None:
    with pytest.raises(SettingsError) as raised:
        CreationSettings.from_env({"ATELIER_FAL_KEY": "short-secret"})
    assert "ATELIER_FAL_KEY must be at least 16" in str(raised.value)
    assert "short-secret" not in str(raised.value)


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("ATELIER_REPLICATE_BASE_URL", "ftp://x", "ATELIER_REPLICATE_BASE_URL must be an http"),
        ("ATELIER_PROVIDER_INPUT", "both", "ATELIER_PROVIDER_INPUT must be one of inline, url"),
        ("ATELIER_FAL_MAX_IN_FLIGHT", "-1", "ATELIER_FAL_MAX_IN_FLIGHT must be between 0"),
        ("ATELIER_REPLICATE_BURST", "0", "ATELIER_REPLICATE_BURST must be between 1"),
    ],
)
def test_bad_values_are_refused_by_name(variable: str, value: str, expected: str) -> None:
    with pytest.raises(SettingsError, match=expected):
        CreationSettings.from_env({variable: value})


def test_a_missing_key_matters_only_to_an_enabled_model_that_needs_it() -> None:
    registry = build_registry(CreationSettings.from_env({"ATELIER_FAL_KEY": KEY}))
    assert {"stub", "replicate", "fal"} <= registry.codes
    assert registry.problems({"stub": ["stub-fast"], "fal": ["fal-flux-dev"]}) == []
    problems = registry.problems({"replicate": ["replicate-kontext", "replicate-sdxl"]})
    assert problems == [
        "enabled models replicate-kontext, replicate-sdxl need provider 'replicate', but"
        " ATELIER_REPLICATE_API_TOKEN is not set"
    ]
