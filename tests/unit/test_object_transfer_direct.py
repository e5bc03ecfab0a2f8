"""The in-process worker's transfers may skip the edge (ATELIER_OBJECT_PUBLIC_BASE_URL and
ATELIER_OBJECT_DIRECT_BASE_URL): a URL under the public base goes to the same path and
query on the direct origin, byte for byte (the signature is over the path's key and the
query, not the host); any other URL (S3's, another edge's) is sent as signed."""

import pytest

from services.creation.object_transfer import ObjectTransfer
from services.creation.settings import WorkerSettings
from services.kit.settings import EnvReader, SettingsError

SIGNED = "/media-objects/ai_output/2026/12/04/x.png?expires=1&size=5&sha256=ab&signature=c%2Bd"


def test_a_url_under_the_public_base_goes_to_the_direct_origin() -> None:
    transfer = ObjectTransfer(direct=("https://edge:8443/", "http://127.0.0.1:50072"))
    assert str(transfer._url("https://edge:8443" + SIGNED)) == "http://127.0.0.1:50072" + SIGNED


@pytest.mark.parametrize(
    "url",
    [
        "https://bucket.s3.amazonaws.com/ai_output/x.png?X-Amz-Signature=ab",
        "https://edge:8444/media-objects/x.png?signature=c",
        "https://edge2:8443" + SIGNED,
        "http://edge:8443" + SIGNED,
    ],
)
def test_any_other_url_is_sent_as_signed(url: str) -> None:
    transfer = ObjectTransfer(direct=("https://edge:8443", "http://127.0.0.1:50072"))
    assert str(transfer._url(url)) == url


def test_without_the_settings_every_url_is_sent_as_signed() -> None:
    assert str(ObjectTransfer()._url("https://edge:8443" + SIGNED)) == "https://edge:8443" + SIGNED


def read(env: dict[str, str]) -> WorkerSettings:
    reader = EnvReader(env)
    settings = WorkerSettings.read(reader)
    reader.finish()
    return settings


def test_the_settings_go_together() -> None:
    settings = read(
        {
            "ATELIER_OBJECT_PUBLIC_BASE_URL": "https://edge:8443/",
            "ATELIER_OBJECT_DIRECT_BASE_URL": "http://media:50072",
        }
    )
    assert settings.object_public_base_url == "https://edge:8443"
    assert settings.object_direct_base_url == "http://media:50072"
    assert read({}).object_direct_base_url == ""
    with pytest.raises(SettingsError, match="set both or neither"):
        read({"ATELIER_OBJECT_DIRECT_BASE_URL": "http://media:50072"})
    with pytest.raises(SettingsError, match="not an http"):
        read(
            {
                "ATELIER_OBJECT_PUBLIC_BASE_URL": "https://edge:8443",
                "ATELIER_OBJECT_DIRECT_BASE_URL": "media:50072",
            }
        )
