"""The words of alert pushes, per language: English, and French for devices whose locale
says so. Anything else gets English."""

from __future__ import annotations

from dataclasses import dataclass

from atelier.creation.v1 import job_pb2


@dataclass(frozen=True)
class Alert:
    title: str
    body: str


# Said when a Live Activity is started by a push (iOS shows it with the activity).
STARTED = "started"

_TEXTS: dict[str, dict[int | str, Alert]] = {
    "en": {
        job_pb2.JOB_STATUS_SUCCEEDED: Alert("Your image is ready", "Tap to see what we made."),
        job_pb2.JOB_STATUS_FAILED: Alert(
            "We couldn't make your image", "Open the app to see what happened."
        ),
        job_pb2.JOB_STATUS_CANCELLED: Alert("Generation cancelled", "Your image won't be made."),
        job_pb2.JOB_STATUS_NEEDS_ATTENTION: Alert(
            "Your image is taking longer", "We're looking into it and will let you know."
        ),
        STARTED: Alert("Creating your image", "Follow it on your Lock Screen."),
    },
    "fr": {
        job_pb2.JOB_STATUS_SUCCEEDED: Alert("Votre image est prête", "Touchez pour la découvrir."),
        job_pb2.JOB_STATUS_FAILED: Alert(
            "Impossible de créer votre image", "Ouvrez l'app pour en savoir plus."
        ),
        job_pb2.JOB_STATUS_CANCELLED: Alert("Création annulée", "Votre image ne sera pas créée."),
        job_pb2.JOB_STATUS_NEEDS_ATTENTION: Alert(
            "Votre image prend plus de temps", "Nous vérifions et vous tiendrons informé."
        ),
        STARTED: Alert("Création de votre image", "Suivez-la sur l'écran verrouillé."),
    },
}
LANGUAGES = frozenset(_TEXTS)


def language(locale: str) -> str:
    """The language we have words for: the locale's primary subtag, else English."""
    primary = locale.replace("_", "-").split("-", 1)[0].lower()
    return primary if primary in _TEXTS else "en"


def alert(locale: str, what: int | str) -> Alert:
    """The alert for a job status (or STARTED) in the locale's language."""
    return _TEXTS[language(locale)][what]
