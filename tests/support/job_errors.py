"""Job errors as a writer stores them in SQL: the internal code beside what the owner is
told (error_reason, error_retryable; migration 0022's ck_jobs_error_answered)."""

AN_ERROR = "error_code = 'X', error_reason = 'PROVIDER_ERROR', error_retryable = false"
UNKNOWN = (
    "error_code = 'OUTCOME_UNKNOWN', error_reason = 'OUTCOME_UNKNOWN', error_retryable = false"
)
NO_ERROR = "error_code = NULL, error_reason = NULL, error_retryable = NULL"
