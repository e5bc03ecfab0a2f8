"""The rules the services check that no proto annotation carries, written into the
document so a generator (and schemathesis) sees them: which string fields are UUIDs,
ranges of numbers, lengths of strings. Each figure comes from the service's own constant
where one exists, so the document cannot drift from the check."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from atelier.creation.v1 import job_pb2
from services.creation.domain import MAX_OUTPUTS
from services.creation.parameters import MAX_PARAMETERS, MAX_STRING
from services.creation.submission import (
    CATALOG_ID,
    CONTROL,
    MAX_INPUT_URL,
    MAX_NEGATIVE_PROMPT,
    MAX_PROMPT,
)
from services.creation.waits import MAX_WAIT_SECONDS
from services.kit.idempotency import MAX_KEY_LENGTH
from services.kit.pagination import MAX_TOKEN_LENGTH
from services.media.domain import CONTENT_TYPES
from services.notify.pushes import tokens

Schema = dict[str, Any]

# The hyphenated UUID the services read (services/kit/ids.py), either case.
UUID: Schema = {"format": "uuid"}
_C, _M, _N = "atelier.creation.v1.", "atelier.media.v1.", "atelier.notify.v1."


def _whole(pattern: str) -> str:
    """A Python pattern the service uses with fullmatch, anchored for JSON Schema (whose
    `pattern` matches anywhere in the string)."""
    return f"^(?:{pattern.removeprefix('^').removesuffix('$')})$"


# An APNs token (tokens.token_problem): an even number of hex digits, 64 to 200.
_TOKEN = f"(?:[0-9a-fA-F]{{2}}){{{tokens.MIN_TOKEN_DIGITS // 2},{tokens.MAX_TOKEN_DIGITS // 2}}}"
# Text the services store: no control characters but tab and newlines.
_NO_CONTROL = "^[^" + CONTROL.pattern.removeprefix("[").removesuffix("]") + "]*$"
# WaitJob's timeout: 0s to MAX_WAIT_SECONDS (a whole number of seconds below 100).
_WAIT = int(MAX_WAIT_SECONDS)
if _WAIT != 60:
    raise ValueError("the timeout pattern below spells 0s to 60s: write it anew")
_WAIT_TIMEOUT = "^(?:[0-5]?[0-9](?:\\.[0-9]{1,9})?|60(?:\\.0{1,9})?)s$"


def _only(*values: str) -> Schema:
    """An enum field that takes only some of its enum's values (inline, since the enum's
    component also serves answers, which may hold every value)."""
    return {"type": "string", "enum": list(values)}


# Full field name -> what its schema gains. A rule with `enum` replaces an enum field's
# reference.
FIELD_RULES: dict[str, Schema] = {
    # Ids a request names (path variables and body fields): UUIDs.
    **dict.fromkeys(
        (
            f"{_C}GetJobRequest.job_id",
            f"{_C}CancelJobRequest.job_id",
            f"{_C}DeleteJobRequest.job_id",
            f"{_C}WaitJobRequest.job_id",
            f"{_C}SubmitJobRequest.input_asset_id",
            f"{_M}CompleteUploadRequest.asset_id",
            f"{_M}GetAssetRequest.asset_id",
            f"{_N}WatchJobRequest.job_id",
            f"{_N}DeleteDeviceRequest.device_id",
            f"{_N}RegisterLiveActivityRequest.job_id",
            f"{_N}RegisterLiveActivityRequest.device_id",
            f"{_N}DeleteLiveActivityRequest.job_id",
            # Ids every answer carries.
            f"{_C}Job.job_id",
            f"{_C}JobOutput.asset_id",
            f"{_M}Asset.asset_id",
            f"{_N}Device.device_id",
        ),
        UUID,
    ),
    f"{_C}SubmitJobRequest.num_outputs": {"minimum": 0, "maximum": MAX_OUTPUTS},
    f"{_C}SubmitJobRequest.model_id": {"pattern": _whole(CATALOG_ID.pattern)},
    f"{_C}SubmitJobRequest.style_id": {"pattern": _whole(CATALOG_ID.pattern)},
    # Each model's own size range (the catalog's sizeRange) is checked once it is known.
    f"{_C}SubmitJobRequest.width": {"minimum": 1},
    f"{_C}SubmitJobRequest.height": {"minimum": 1},
    f"{_C}SubmitJobRequest.prompt": {"maxLength": MAX_PROMPT, "pattern": _NO_CONTROL},
    f"{_C}SubmitJobRequest.input_url": {
        "maxLength": MAX_INPUT_URL,
        "pattern": "^[^\\s\\x00-\\x1f\\x7f]*$",
    },
    f"{_C}SubmitJobRequest.negative_prompt": {
        "maxLength": MAX_NEGATIVE_PROMPT,
        "pattern": _NO_CONTROL,
    },
    f"{_C}WaitJobRequest.timeout": {"pattern": _WAIT_TIMEOUT},
    **{
        name: {"minimum": 0}
        for name in (
            f"{_C}ListJobsRequest.page_size",
            f"{_C}ListLedgerEntriesRequest.page_size",
            f"{_N}ListDevicesRequest.page_size",
        )
    },
    # A filter names real statuses (INVALID_JOB_FILTER otherwise).
    f"{_C}ListJobsRequest.statuses": _only(
        *(job_pb2.JobStatus.Name(value) for value in job_pb2.JobStatus.values() if value)
    ),
    f"{_M}CreateUploadRequest.purpose": _only("ASSET_PURPOSE_AI_INPUT"),
    # Read case-insensitively, spaces around ignored; these are the canonical spellings.
    f"{_M}CreateUploadRequest.content_type": {"enum": list(CONTENT_TYPES)},
    # The upper bound is the deployment's (media's MAX_UPLOAD_BYTES): UPLOAD_TOO_LARGE.
    f"{_M}CreateUploadRequest.size_bytes": {"minimum": 1},
    f"{_M}CreateUploadRequest.sha256": {"pattern": "^(?:[0-9a-fA-F]{64})?$"},
    f"{_N}RegisterDeviceRequest.device_token": {"pattern": f"^{_TOKEN}$"},
    f"{_N}RegisterDeviceRequest.push_to_start_token": {"pattern": f"^(?:{_TOKEN})?$"},
    f"{_N}RegisterDeviceRequest.environment": _only(
        "APNS_ENVIRONMENT_PRODUCTION", "APNS_ENVIRONMENT_SANDBOX"
    ),
    f"{_N}RegisterDeviceRequest.bundle_id": {
        "maxLength": tokens.MAX_BUNDLE_ID_LENGTH,
        "pattern": _whole(tokens.BUNDLE_ID.pattern),
    },
    f"{_N}RegisterDeviceRequest.locale": {
        "maxLength": tokens.MAX_LOCALE_LENGTH,
        "pattern": f"^(?:{tokens.LOCALE.pattern})?$",
    },
    f"{_N}RegisterLiveActivityRequest.push_token": {"pattern": f"^{_TOKEN}$"},
    **{
        f"{_N}{message}.activity_id": {
            "maxLength": tokens.MAX_ACTIVITY_ID_LENGTH,
            "pattern": _whole(tokens.ACTIVITY_ID.pattern),
        }
        for message in ("RegisterLiveActivityRequest", "DeleteLiveActivityRequest")
    },
    # Which names and values a model takes is catalog data (Model.parameter_specs); only
    # what no model takes is a rule of the document.
    f"{_C}SubmitJobRequest.parameters": {"maxProperties": MAX_PARAMETERS},
    f"{_C}ParameterValue.string_value": {"maxLength": MAX_STRING},
    f"{_C}SubmitJobRequest.request_id": {
        "maxLength": MAX_KEY_LENGTH,
        "pattern": "^[A-Za-z0-9._:\\-]*$",
    },
    f"{_M}CreateUploadRequest.request_id": {
        "maxLength": MAX_KEY_LENGTH,
        "pattern": "^[A-Za-z0-9._:\\-]*$",
    },
    **{
        name: {"maxLength": MAX_TOKEN_LENGTH}
        for name in (
            f"{_C}ListJobsRequest.page_token",
            f"{_C}ListLedgerEntriesRequest.page_token",
            f"{_N}ListDevicesRequest.page_token",
        )
    },
}

# Message name -> what its schema gains beside its fields' rules (rules between fields).
MESSAGE_RULES: dict[str, Schema] = {
    # Its four fields are its oneof: exactly one is set (SubmitJob refuses an empty one).
    f"{_C}ParameterValue": {"minProperties": 1, "maxProperties": 1},
    # A photo by id or by address, not both (an empty string is not given).
    f"{_C}SubmitJobRequest": {
        "not": {
            "required": ["inputAssetId", "inputUrl"],
            "properties": {"inputAssetId": {"minLength": 1}, "inputUrl": {"minLength": 1}},
        }
    },
}


@dataclass(frozen=True)
class Refusal:
    """A 400 the server may answer to a request its schema allows: the verdict rests on
    data (a catalog id that names nothing, a page token this server did not hand out, a
    deployment's limit) or on a comparison between fields that JSON Schema cannot state.
    ``fields`` are the field violations it may name (proto paths; a name covers its
    subfields); empty when it names none."""

    reason: str
    fields: tuple[str, ...]
    why: str


_PAGE_TOKEN = Refusal(
    "INVALID_PAGE_TOKEN", ("page_token",), "the token is not one a previous call handed out"
)
_PHOTO = "the input photo"
# Operation id -> its refusals. The document lists them in the operation's 400 answer
# (its `x-schema-valid-refusals`); the fuzz test holds the edge to exactly those.
REFUSALS: dict[str, tuple[Refusal, ...]] = {
    "CreationService_ListJobs": (
        _PAGE_TOKEN,
        Refusal(
            "INVALID_JOB_FILTER",
            ("create_time_after", "create_time_before"),
            "createTimeBefore is not later than createTimeAfter, or a time is outside "
            "years 1 to 9999 once in UTC",
        ),
    ),
    "CreationService_ListLedgerEntries": (_PAGE_TOKEN,),
    "NotifyService_ListDevices": (_PAGE_TOKEN,),
    "CreationService_SubmitJob": (
        Refusal("MODEL_NOT_AVAILABLE", ("model_id",), "no enabled catalog model has this id"),
        Refusal("STYLE_NOT_AVAILABLE", ("style_id",), "no enabled catalog style has this id"),
        Refusal("STYLE_MODEL_MISMATCH", ("style_id",), "the style is not for this model"),
        Refusal(
            "MEDIA_KIND_NOT_SUPPORTED", ("model_id",), "no worker makes the model's media kind"
        ),
        Refusal(
            "INVALID_JOB_REQUEST",
            ("width", "height", "parameters", "request_id"),
            "the size is outside the model's sizeRange, a parameter outside its "
            "parameterSpecs, or requestId differs from the Idempotency-Key header",
        ),
        Refusal("INPUT_IMAGE_REQUIRED", ("input_asset_id",), f"the model restyles {_PHOTO}"),
        Refusal(
            "INPUT_IMAGE_REFUSED",
            ("input_asset_id", "input_url"),
            f"the model makes pictures from the prompt alone: no {_PHOTO}",
        ),
        Refusal("INPUT_ASSET_NOT_READY", ("input_asset_id",), "the upload is not complete"),
        Refusal("INPUT_ASSET_WRONG_PURPOSE", ("input_asset_id",), "the asset is not an input"),
        Refusal("INPUT_URL_REFUSED", ("input_url",), "media would not import the address"),
        Refusal("INSUFFICIENT_POINTS", (), "the user's points do not cover the price"),
    ),
    "MediaService_CreateUpload": (
        Refusal("UPLOAD_TOO_LARGE", ("size_bytes",), "past the deployment's MAX_UPLOAD_BYTES"),
        Refusal(
            "INVALID_IDEMPOTENCY_KEY",
            ("request_id",),
            "requestId differs from the Idempotency-Key header",
        ),
    ),
}
