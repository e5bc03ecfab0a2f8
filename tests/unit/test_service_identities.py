"""ATELIER_SERVICE_IDENTITIES: how it is read (a bad value stops the process, naming the
variable, never echoing a credential) and what each identity may call."""

import hashlib
import json
from typing import Any

import grpc
import pytest

from services.creation.settings import CreationSettings
from services.kit.auth import RoutedAuthenticator, ServiceAuthenticator, authenticator_for
from services.kit.errors import ApiError
from services.kit.identities import WATCH_ALL_JOBS, ServiceIdentity, entry, read_identities
from services.kit.settings import EnvReader, SettingsError
from services.media.settings import MediaSettings
from services.notify.settings import NotifySettings

CREATION = "c" * 40
CREATION_NEXT = "C" * 40
OPERATOR = "o" * 40
SHARED = "s" * 40
PUT_ASSET = "/atelier.media.v1.MediaInternalService/PutAsset"
READ_ASSET = "/atelier.media.v1.MediaInternalService/ReadAsset"
DELIVER = "/atelier.notify.v1.NotifyIngestService/Deliver"
RESOLVE = "/atelier.creation.v1.AdminService/ResolveJob"
STANDINGS = "/atelier.creation.v1.QueueStandingService/GetQueueStandings"
GET_URLS = "/atelier.media.v1.MediaInternalService/GetAssetUrls"


def bearer(token: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")]


def identities_value(*entries: dict[str, Any]) -> str:
    return json.dumps(list(entries))


def read(value: str) -> tuple[ServiceIdentity, ...]:
    reader = EnvReader({"ATELIER_SERVICE_IDENTITIES": value})
    found = read_identities(reader)
    reader.finish()
    return found


DEFAULT = identities_value(
    entry("creation", "creation", (CREATION, CREATION_NEXT)),
    entry("notify", "notify", ("n" * 40,)),
    entry("alice", "operator", (OPERATOR,)),
    entry(
        "shop",
        "backend",
        ("b" * 40,),
        allow=("/atelier.media.v1.MediaInternalService/ImportAsset",),
    ),
    entry("billing", "backend", ("f" * 40,), allow=(WATCH_ALL_JOBS,)),
)
AUTH = ServiceAuthenticator(SHARED, read(DEFAULT))


def call(method: str, credential: str) -> str:
    """The identity the call runs as, or the refusal's code and reason."""
    try:
        principal = authenticator_for(AUTH, method).authenticate(bearer(credential))
    except ApiError as refused:
        return f"{refused.code.name} {refused.reason}"
    return principal.identity or "shared"


@pytest.mark.parametrize(
    ("method", "credential", "answer"),
    [
        (PUT_ASSET, CREATION, "creation"),
        (READ_ASSET, CREATION, "creation"),
        (DELIVER, CREATION, "creation"),
        (PUT_ASSET, OPERATOR, "PERMISSION_DENIED RPC_NOT_PERMITTED"),
        (DELIVER, OPERATOR, "PERMISSION_DENIED RPC_NOT_PERMITTED"),
        (RESOLVE, OPERATOR, "alice"),
        (RESOLVE, CREATION, "PERMISSION_DENIED RPC_NOT_PERMITTED"),
        (STANDINGS, "n" * 40, "notify"),
        (GET_URLS, "n" * 40, "notify"),
        (PUT_ASSET, "n" * 40, "PERMISSION_DENIED RPC_NOT_PERMITTED"),
        (DELIVER, "n" * 40, "PERMISSION_DENIED RPC_NOT_PERMITTED"),
        ("/atelier.media.v1.MediaInternalService/ImportAsset", "b" * 40, "shop"),
        (PUT_ASSET, "b" * 40, "PERMISSION_DENIED RPC_NOT_PERMITTED"),
        # The job feed shows every user's jobs: only an identity named for it reads it.
        (WATCH_ALL_JOBS, "f" * 40, "billing"),
        (WATCH_ALL_JOBS, "b" * 40, "PERMISSION_DENIED RPC_NOT_PERMITTED"),
        (WATCH_ALL_JOBS, CREATION, "PERMISSION_DENIED RPC_NOT_PERMITTED"),
        (WATCH_ALL_JOBS, "n" * 40, "PERMISSION_DENIED RPC_NOT_PERMITTED"),
        (WATCH_ALL_JOBS, OPERATOR, "PERMISSION_DENIED RPC_NOT_PERMITTED"),
        (DELIVER, "f" * 40, "PERMISSION_DENIED RPC_NOT_PERMITTED"),
        # The shared token stays what it was: every internal RPC.
        (PUT_ASSET, SHARED, "shared"),
        (RESOLVE, SHARED, "shared"),
        (PUT_ASSET, "x" * 40, "UNAUTHENTICATED SERVICE_CREDENTIAL_INVALID"),
    ],
)
def test_each_identity_calls_what_its_policy_grants(
    method: str, credential: str, answer: str
) -> None:
    assert call(method, credential) == answer


def test_both_credentials_of_a_rotation_work() -> None:
    assert call(PUT_ASSET, CREATION) == call(PUT_ASSET, CREATION_NEXT) == "creation"


def test_a_refusal_names_the_identity_and_method_never_the_credential() -> None:
    with pytest.raises(ApiError) as refused:
        authenticator_for(AUTH, PUT_ASSET).authenticate(bearer(OPERATOR))
    error = refused.value
    assert error.code == grpc.StatusCode.PERMISSION_DENIED
    assert dict(error.metadata) == {"identity": "alice", "method": PUT_ASSET}
    assert OPERATOR not in str(error) and OPERATOR not in str(error.to_status())


def test_without_a_method_only_the_shared_token_passes() -> None:
    assert AUTH.authenticate(bearer(SHARED)).is_service
    with pytest.raises(ApiError, match="RPC_NOT_PERMITTED"):
        AUTH.authenticate(bearer(CREATION))


def test_the_shared_token_can_be_off() -> None:
    off = ServiceAuthenticator("", AUTH.identities)
    with pytest.raises(ApiError, match="SERVICE_CREDENTIAL_INVALID"):
        authenticator_for(off, PUT_ASSET).authenticate(bearer(SHARED))
    with pytest.raises(ApiError, match="SERVICE_CREDENTIAL_INVALID"):
        authenticator_for(off, PUT_ASSET).authenticate([("authorization", "Bearer ")])


def test_routing_keeps_the_policy_of_the_default() -> None:
    routed = RoutedAuthenticator(AUTH, {"/atelier.creation.v1.WorkerService/": AUTH})
    assert authenticator_for(routed, RESOLVE).authenticate(bearer(OPERATOR)).identity == "alice"
    with pytest.raises(ApiError, match="RPC_NOT_PERMITTED"):
        authenticator_for(routed, RESOLVE).authenticate(bearer(CREATION))


def test_a_whole_service_can_be_allowed_and_patterns_need_no_slash() -> None:
    [reader] = read(
        identities_value(
            entry("ops-bot", "", ("q" * 40,), allow=("atelier.creation.v1.AdminService/*",))
        )
    )
    assert reader.may_call(RESOLVE)
    assert not reader.may_call(PUT_ASSET)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("not json", "must be a JSON list of identity objects"),
        ("[]", "must be a non-empty JSON list"),
        ('[{"name": "x"}]', "[0] credential_sha256 must be 1 to 2 SHA-256 hashes"),
        (
            json.dumps([{"name": "Bad Name", "credential_sha256": ["a" * 64]}]),
            "[0] name must be 1-63 characters",
        ),
        (
            json.dumps([{"name": "x", "role": "root", "credential_sha256": ["a" * 64]}]),
            "[0] role must be one of creation, notify, operator, backend",
        ),
        (
            json.dumps([{"name": "x", "credential_sha256": ["a" * 64, "b" * 64, "c" * 64]}]),
            "[0] credential_sha256 must be 1 to 2",
        ),
        (
            json.dumps([{"name": "x", "credential_sha256": ["a" * 64], "allow": ["*"]}]),
            "[0] allow must be a list of full method names",
        ),
        (
            json.dumps([{"name": "x", "credential_sha256": ["a" * 64], "powers": 1}]),
            "[0] has unknown fields powers",
        ),
        (
            json.dumps([{"name": "x", "credential_sha256": ["a" * 64], "act_for_users": "yes"}]),
            "[0] act_for_users must be true or false",
        ),
        (
            json.dumps([{"name": "x", "credential_sha256": ["a" * 64], "per_job_webhooks": "yes"}]),
            "[0] per_job_webhooks must be true or false",
        ),
        (
            json.dumps(
                [
                    {"name": "x", "credential_sha256": ["a" * 64]},
                    {"name": "x", "credential_sha256": ["b" * 64]},
                ]
            ),
            "must name each identity once",
        ),
        (
            json.dumps(
                [
                    {"name": "x", "credential_sha256": ["a" * 64]},
                    {"name": "y", "credential_sha256": ["A" * 64]},
                ]
            ),
            "must list each credential hash once",
        ),
    ],
)
def test_a_bad_value_stops_the_process_naming_the_variable(value: str, message: str) -> None:
    with pytest.raises(SettingsError) as refused:
        MediaSettings.from_env({"ATELIER_SERVICE_IDENTITIES": value})
    assert f"ATELIER_SERVICE_IDENTITIES {message}" in str(refused.value)


def test_a_pasted_credential_is_never_echoed() -> None:
    pasted = "my-real-credential-" + "z" * 30
    value = json.dumps([{"name": "x", "credential_sha256": [pasted]}])
    with pytest.raises(SettingsError) as refused:
        MediaSettings.from_env({"ATELIER_SERVICE_IDENTITIES": value})
    assert pasted not in str(refused.value)
    assert "ATELIER_SERVICE_IDENTITIES [0] credential_sha256" in str(refused.value)


def test_a_process_whose_own_credential_no_identity_holds_is_refused() -> None:
    with pytest.raises(SettingsError) as refused:
        CreationSettings.from_env(
            {"ATELIER_SERVICE_IDENTITIES": DEFAULT, "ATELIER_SERVICE_CREDENTIAL": "w" * 40}
        )
    message = str(refused.value)
    assert "ATELIER_SERVICE_CREDENTIAL matches no identity of ATELIER_SERVICE_IDENTITIES" in message
    assert "w" * 40 not in message


def test_prod_with_identities_needs_no_shared_token() -> None:
    prod = {
        "ATELIER_ENV": "prod",
        "ATELIER_JWT_SECRET": "j" * 40,
        "ATELIER_SERVICE_IDENTITIES": DEFAULT,
    }
    media = MediaSettings.from_env({**prod, "ATELIER_MEDIA_URL_SECRET": "u" * 40})
    assert media.common.service_token == ""  # the shared token is off
    creation = CreationSettings.from_env({**prod, "ATELIER_SERVICE_CREDENTIAL": CREATION})
    assert creation.common.service_credential == CREATION
    assert creation.common.service_identities[0].credential_hashes[0] == (
        hashlib.sha256(CREATION.encode()).hexdigest()
    )


def test_prod_refuses_a_caller_without_its_credential() -> None:
    with pytest.raises(SettingsError) as refused:
        NotifySettings.from_env(
            {
                "ATELIER_ENV": "prod",
                "ATELIER_JWT_SECRET": "j" * 40,
                "ATELIER_SERVICE_IDENTITIES": DEFAULT,
            }
        )
    assert "ATELIER_SERVICE_CREDENTIAL must be set: this service calls media and creation" in str(
        refused.value
    )


def test_without_identities_the_credential_sent_is_the_shared_token() -> None:
    settings = NotifySettings.from_env({"ATELIER_SERVICE_TOKEN": SHARED})
    assert settings.common.service_credential == SHARED
    assert settings.common.service_identities == ()


def test_with_identities_the_shared_token_is_on_only_when_set() -> None:
    own = {"ATELIER_SERVICE_IDENTITIES": DEFAULT, "ATELIER_SERVICE_CREDENTIAL": CREATION}
    assert CreationSettings.from_env(own).common.service_token == ""
    kept = CreationSettings.from_env({**own, "ATELIER_SERVICE_TOKEN": SHARED})
    assert kept.common.service_token == SHARED
    assert kept.common.service_credential == CREATION


def test_per_job_webhooks_is_read_and_off_by_default() -> None:
    value = json.dumps(
        [
            {"name": "shop", "credential_sha256": ["a" * 64], "per_job_webhooks": True},
            {"name": "feed", "credential_sha256": ["b" * 64]},
        ]
    )
    read = MediaSettings.from_env({"ATELIER_SERVICE_IDENTITIES": value})
    found = {i.name: i.per_job_webhooks for i in read.common.service_identities}
    assert found == {"shop": True, "feed": False}
