"""Each user's points ledger summed by kind straight from its entries, beside the
ledger_totals rows the ledger's trigger keeps (migration creation 0013): what the tests
compare. The sums are the ones the balance reads made before 0013."""

LEDGER_SUMS = """
SELECT user_id,
       CAST(coalesce(sum(amount) FILTER (WHERE kind = 'grant'), 0) AS bigint),
       CAST(coalesce(sum(amount) FILTER (WHERE kind = 'reserve'), 0) AS bigint),
       CAST(coalesce(sum(amount) FILTER (WHERE kind = 'capture'), 0) AS bigint),
       CAST(coalesce(sum(amount) FILTER (WHERE kind = 'release'), 0) AS bigint),
       coalesce(bool_or(grant_key = 'welcome'), false)
FROM creation.points_ledger
GROUP BY user_id
ORDER BY user_id
"""

LEDGER_TOTALS = """
SELECT user_id, granted, reserved, captured, released, welcomed
FROM creation.ledger_totals
ORDER BY user_id
"""
